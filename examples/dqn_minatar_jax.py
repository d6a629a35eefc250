#!/usr/bin/env python
"""The MinAtar paper's DQN with a JAX learner (flax + optax) on this library's replay stream.

    python examples/dqn_minatar_jax.py --game breakout                     # the paper's 5M frames
    python examples/dqn_minatar_jax.py --game space_invaders --frames 1000000 --returns returns.csv
    python examples/dqn_minatar_jax.py --game breakout --checkpoint-dir runs/breakout  # resumable
    python examples/dqn_minatar_jax.py --game breakout --players 4 --staleness 4       # 4 envs

The agent is ``examples/dqn_minatar.py``'s (the MinAtar authors' ``examples/dqn.py``, value by
value; that file's docstring lists them): a 3x3x16 convolution and a 128-unit layer, PyTorch's
default initialisation, replay memory 100k, batch 32, one update per frame, the target network
copied every 1,000 updates, 5,000 random frames first, epsilon 1 -> 0.1 over the next 100k
frames, centred RMSProp (step 2.5e-4, smoothing 0.95, eps 0.01 added outside the root, no
momentum: PyTorch's ``RMSprop(alpha=0.95, centered=True, eps=0.01)``, which is
``optax.rmsprop(..., centered=True, eps_in_sqrt=False)``), Huber loss, gamma 0.99, sticky
actions, all 6 actions, 5M frames. Here the network, the loss and the optimizer are JAX; the
replay memory, the acting and the sampling are :class:`expreplay.ReplayStream`'s.

How a frame's work hides under the update. JAX dispatches a jitted call and returns: the
update computes in XLA's threads, without the GIL, while this loop steps the env, stores the
transition and draws the next batch; the loop's thread pays the dispatch. The players act with
the weights of the update *before* the one computing (one update older than the paper's loop,
out of millions), through a numpy copy of the network's forward pass (``GreedyPolicy``), so
that a greedy action never queues behind the update on the XLA device; reading those weights
waits for their update, so a frame takes the longer of the update and the loop's own work. The
update is built for the least time per update as the loop sees it (``make_update``). In one
run on a 2-core x86 machine (AVX2, no AVX-512; shared with other work, load average 1.5-4, so
the times are several times an idle machine's: read the ratios), 15 interleaved rounds of 500
updates of batch 32, medians, ms per update as the loop sees it (dispatch, then the previous
weights read): 2.46 on flax's trees with the target passed in and not returned (no copy of it
per update) and the convolution as a product over patches, 2.49 without the patches, 2.74 on
the trees alone, 3.88 on one flat vector (``ravel_pytree``, the earlier form; 0.62x paired by
round). The trees cost the call a little more (0.97 against 0.89 ms, the dispatch alone) and
the compute much less (2.31 against 3.82 ms, dispatches pipelined). In other runs on the same
machine, donating the state (no gain beyond the noise; and the players read the weights it
frees), one vmapped call for the online and target passes (several times slower) and two XLA
CPU flags (``--xla_cpu_multi_thread_eigen=false``, ``--xla_cpu_use_xnnpack=false``: within the
noise) did not help. What did: several updates per call (``--updates-per-call K``, default
4): K minibatches drawn at once for K frames and updated in one compiled call, so that the
dispatch, the draw and the weights' hand-over are paid once per K frames. In
``benchmarks/bench_learner.py`` (idle, 3 rounds, medians) the loop's thread then costs 0.37 ms
of CPU a frame instead of 0.61, and the run makes 1,066 frames/s against 992 (2.17x the numpy
example; docs/minatar.md has the table); the players act with weights up to K updates old and
a minibatch may be drawn K - 1 frames before its update. No prefetch thread (the stream's
default with single-env players): it would compete with this loop for the GIL and the cores.

On a GPU: ``pip install 'jax[cuda12]'``; nothing else changes.

Players and staleness: ``--players N`` steps N envs in the library's simulator threads instead
of the paper's one env stepped inline by the learner's thread (``--players 1``, the default),
and ``--staleness K`` lets up to K step requests be pending while the learner trains (the
stream's ``maximum_staleness``; by default the stream's, twice the frames per update: 2; with
one player nothing is pending). It is still one update per frame: the stream counts the
transitions inserted, whatever the players, and the frames are all players' steps. The price
of the window is request lag: a step may start some updates after the learner asked for it
(``examples/tune_staleness.py``'s ``update_lag``). It does not age the weights that act: a
step reads the players' weights when it starts, whenever it was asked for. What a request
carries is its exploration, so a window of K plays the epsilon schedule up to K frames late
(the initial fill's random requests still pending when training starts included). The window
makes lag only when the players are slower than the learner (a GPU learner's case; here
MinAtar's env is faster than the CPU update, and every request starts at once): ``--env-ms D``
gives each player's env step a D ms sleep, an emulator that slow, so that the window fills.
Such a lag moves with the machine's load; ``--request-lag N`` (the population's
``request_lag``) starts every request exactly N updates after it was made instead, on any
machine (docs/acting.md, "A lag that does not move with load").

The weights' age: ``--weights-every N`` hands the learner's weights to the players every N
updates instead of after each (what a learner whose hand-over costs, a GPU's device-to-host
copy, may want to do less often), so the acting weights are 1 to N updates old. The last line
gives both lags as the stream counts them (``stream.stats().lags``, from the first update on):
the request lag (mean and max) and the age of the weights each greedy action was computed with
(mean and max, in updates: exactly K, the updates per call, when they are handed over after
each call and one player steps inline). ``examples/staleness_learning.py`` and
docs/staleness_learning.md: what each costs learning.

Checkpoints: ``--checkpoint-dir DIR`` saves, every ``--checkpoint-every`` frames and at the end
(also on Ctrl-C, or on ``kill``'s SIGTERM for a run in the background, whose Ctrl-C the
shell ignores; a second signal while it saves only prints a line), the replay memory
(``DIR/memory``, the library's checkpoint) and the learner (``DIR/learner.npz``: online and
target weights, the optimizer's state, the frame and update counters), both at the same
frame: the memory's own count of the steps it stored, read once the players are stopped.
Run the same command again and it continues from the memory's count: the frame count,
epsilon, the returns file (rows after it are dropped) and the memory go on where they were,
also after a stop during the initial fill (the fill then completes first); the envs start
new episodes (those cut by the stop are not counted) and the random draws after a resume are
seeded from the seed and the frame count, so a resumed run is a continuation, not a
bit-exact replay. It may take another ``--updates-per-call``: the target copies and the
hand-overs still come once per ``--target-update`` and ``--weights-every`` updates, and every
run stops at ``--frames`` exactly (the last frames, fewer than K, are stepped without an update).

Progress: a first line naming the game and settings, then a ``progress:`` line every
``--log-every`` seconds (frames and their rate, updates, games and their mean score, epsilon)
and a ``resources:`` line (threads, open files, resident memory) after the first minute and at
the end; the last line gives the frames, the games, the time and the two lags (above).
"""

import argparse
import csv
import os
import threading
import time
import warnings

GAMES = {'asterix': 'Asterix', 'breakout': 'Breakout', 'freeway': 'Freeway',
         'seaquest': 'Seaquest', 'space_invaders': 'SpaceInvaders'}


def positive(text):
    """An int >= 1 (argparse type)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not >= 1")
    return value


def argument_parser():
    """The flags, the paper's values as defaults (documented here once)."""
    class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        pass
    p = argparse.ArgumentParser(description=__doc__, formatter_class=Formatter)
    p.add_argument('--game', choices=sorted(GAMES), default='breakout')
    p.add_argument('--seed', type=int, default=0, help='seeds the network, the sampling and the env')
    p.add_argument('--frames', type=int, default=5_000_000, help='environment steps, the fill included')
    p.add_argument('--memory-size', type=int, default=100_000, help='replay memory capacity')
    p.add_argument('--replay-start', type=int, default=5_000,
                   help='random-policy frames before the first update')
    p.add_argument('--batch-size', type=int, default=32)
    p.add_argument('--target-update', type=int, default=1_000,
                   help='copy the online network into the target network every N updates')
    p.add_argument('--exploration-frames', type=int, default=100_000,
                   help='frames after the replay start over which epsilon falls linearly from 1')
    p.add_argument('--final-exploration', type=float, default=0.1, help='epsilon after the decay')
    p.add_argument('--lr', type=float, default=2.5e-4, help='centred RMSProp step size')
    p.add_argument('--gamma', type=float, default=0.99, help='discount factor')
    p.add_argument('--prioritized', action='store_true',
                   help='proportional prioritized replay (alpha 0.6, beta 0.4 -> 1 over the run)')
    p.add_argument('--n-step', type=int, default=1, help='n-step returns')
    p.add_argument('--updates-per-call', type=positive, default=4,
                   help="updates made by one call of the compiled update, on as many minibatches "
                        "drawn at once for as many frames (still one update per frame; the "
                        "target update must be a multiple of it)")
    p.add_argument('--players', type=positive, default=1,
                   help="envs acting at once, in the simulator threads (see 'Players and "
                        "staleness' above); 1: the paper's one env, stepped inline by the "
                        "learner's thread")
    p.add_argument('--staleness', type=positive, default=None,
                   help="step requests that may be pending while the learner trains (the "
                        "stream's maximum_staleness); None: the stream's default, twice the "
                        "frames per update (2)")
    p.add_argument('--request-lag', type=positive, default=None,
                   help="start every step request exactly N updates after the learner made it "
                        "(the population's request_lag: a window lag that machine load does not "
                        "move, for runs that share a machine; 2 players or more, a multiple of "
                        "--updates-per-call); None: as soon as a player is free")
    p.add_argument('--weights-every', type=positive, default=1,
                   help="updates between the hand-overs of the learner's weights to the players "
                        "(see 'The weights' age' above); 1: after each update")
    p.add_argument('--env-ms', type=float, default=0.0,
                   help="milliseconds each player's env step also sleeps (GIL released): an "
                        "emulator slower than the learner, as a GPU learner's envs are, so that "
                        "the staleness window fills (see 'Players and staleness' above)")
    p.add_argument('--returns', help='append every training episode as a CSV row frames,score here')
    p.add_argument('--eval-episodes', type=int, default=0,
                   help='greedy episodes played by the final network (0: none)')
    p.add_argument('--checkpoint-dir', help='save here, and resume from here (see above)')
    p.add_argument('--checkpoint-every', type=int, default=250_000, help='frames between checkpoints')
    p.add_argument('--log-every', type=float, default=30.0, help='seconds between progress lines')
    return p


def parse_args(argv=None):
    """The flags, checked against each other."""
    parser = argument_parser()
    args = parser.parse_args(argv)
    if args.target_update % args.updates_per_call:
        parser.error(f"--target-update ({args.target_update}) must be a multiple of "
                     f"--updates-per-call ({args.updates_per_call}): the target is copied "
                     "between calls")
    if args.weights_every != 1 and args.weights_every % args.updates_per_call:
        parser.error(f"--weights-every ({args.weights_every}) must be 1 or a multiple of "
                     f"--updates-per-call ({args.updates_per_call}): the weights are handed "
                     "over between calls")
    if args.request_lag is not None and (args.players < 2 or args.request_lag % args.updates_per_call):
        parser.error(f"--request-lag ({args.request_lag}) needs --players 2 or more and a multiple "
                     f"of --updates-per-call ({args.updates_per_call}): the stream counts one "
                     "update per call")
    return args


if __name__ == '__main__':
    _args = parse_args()   # --help and bad flags answer before JAX loads
    print(f"DQN (JAX) on MinAtar {GAMES[_args.game]}, {_args.frames} frames, seed {_args.seed}: "
          "loading JAX and MinAtar...", flush=True)

os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')

from expreplay import require_extra  # noqa: E402

require_extra('examples/dqn_minatar_jax.py', 'jax')   # names the extra, not 'No module named flax.linen'
require_extra('examples/dqn_minatar_jax.py', 'minatar')

import flax.linen as nn  # noqa: E402
import gymnasium as gym  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402
import minatar.gym  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from expreplay import Population, ReplayMemory, ReplayStream, Sampling  # noqa: E402
from expreplay.interrupts import stop_on_signals  # noqa: E402

minatar.gym.register_envs()


def make_env(game):
    # -v0: all 6 actions, as the paper (the -v1 ids have the minimal action sets).
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        return gym.make(f'MinAtar/{GAMES[game]}-v0')


def torch_default(fan_in):
    """PyTorch's default for Linear and Conv2d, weights and biases: uniform in +-1/sqrt(fan_in)."""
    def init(key, shape, dtype=jnp.float32):
        bound = 1.0 / np.sqrt(fan_in)
        return jax.random.uniform(key, shape, dtype, -bound, bound)
    return init


class QNetwork(nn.Module):
    """Conv 3x3x16 (valid) -> ReLU -> 128 ReLU -> one Q-value per action; states (n, 10, 10, C)."""
    num_actions: int

    @nn.compact
    def __call__(self, x):
        channels = x.shape[-1]
        x = x.astype(jnp.float32)
        x = nn.Conv(16, (3, 3), padding='VALID', kernel_init=torch_default(9 * channels),
                    bias_init=torch_default(9 * channels))(x)
        x = nn.relu(x).reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(128, kernel_init=torch_default(8 * 8 * 16),
                             bias_init=torch_default(8 * 8 * 16))(x))
        return nn.Dense(self.num_actions, kernel_init=torch_default(128),
                        bias_init=torch_default(128))(x)


def q_values(params, states, xp=np):
    """QNetwork's forward pass on its parameters (flax's tree), in numpy (``xp=np``: the
    players') or in JAX (``xp=jnp``: the update's): states ``(n, 10, 10, C)`` -> Q-values
    ``(n, num_actions)``. The 3x3 valid convolution is one product over the 8x8 positions'
    patches, in flax's (row, column, channel) order of the kernel."""
    relu = jax.nn.relu if xp is jnp else (lambda v: np.maximum(v, 0))   # flax's, in JAX
    p, x = params['params'], states.astype(xp.float32)
    n, channels = x.shape[0], x.shape[-1]
    patches = xp.stack([x[:, i:i + 8, j:j + 8, :] for i in range(3) for j in range(3)], axis=3)
    kernel = p['Conv_0']['kernel'].reshape(9 * channels, -1)
    h = relu(patches.reshape(n * 64, 9 * channels) @ kernel + p['Conv_0']['bias'])
    h = relu(h.reshape(n, -1) @ p['Dense_0']['kernel'] + p['Dense_0']['bias'])
    return h @ p['Dense_1']['kernel'] + p['Dense_1']['bias']


def make_update(optimizer, updates_per_call=1):
    """The DQN update: one step on the Huber loss of the TD error against the target network,
    ``reward + discount * max_a Q_target(next_state, a)`` (``discount``: gamma ** k, 0 after a
    terminal step; ``weights``: importance weights, 1 unless prioritized).

    ``update(state, s, a, r, s2, discount, weights)``: the state (online weights, target
    weights, optimizer state: flax's trees) and a batch -> the new state and the |TD errors|.
    With ``updates_per_call`` K > 1 the batch holds K minibatches one after the other and the
    call makes K updates in turn (a ``lax.scan``), the same as K calls on them: one dispatch,
    one draw and one hand-over of the weights for K updates (the module docstring gives the
    figures). The compiled function takes the trees as they are, not one flat vector
    (``ravel_pytree``), the target as an argument it does not return (no copy of it per
    update), and the convolution as a product over patches (``q_values``): the fastest of the
    forms timed.
    """
    def one_update(params, opt_state, target, s, a, r, s2, discount, weights):
        def loss(p):
            q = q_values(p, s, jnp)[jnp.arange(s.shape[0]), a]
            td = q - (r + discount * q_values(target, s2, jnp).max(1))
            return jnp.mean(weights * optax.huber_loss(td, delta=1.0)), td

        (_, td), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, jnp.abs(td)

    @jax.jit
    def learn(params, opt_state, target, *batch):
        if updates_per_call == 1:
            return one_update(params, opt_state, target, *batch)

        def step(carry, minibatch):
            params, opt_state, td = one_update(*carry, target, *minibatch)
            return (params, opt_state), td

        minibatches = [x.reshape((updates_per_call, -1) + x.shape[1:]) for x in batch]
        (params, opt_state), td = jax.lax.scan(step, (params, opt_state), minibatches)
        return params, opt_state, td.reshape(-1)

    def update(state, s, a, r, s2, discount, weights):
        params, target, opt_state = state
        params, opt_state, td = learn(params, opt_state, target, s, a, r, s2, discount, weights)
        return (params, target, opt_state), td
    return update


def centred_rmsprop(lr):
    """PyTorch's RMSprop(alpha=0.95, centered=True, eps=0.01), the paper's: eps outside the root."""
    return optax.rmsprop(lr, decay=0.95, eps=0.01, centered=True, eps_in_sqrt=False)


def build_learner(num_actions, channels, seed, lr, updates_per_call=1):
    """The network, its optimizer, the learner's initial state (online weights, target
    weights, optimizer state: flax's trees) and the jitted update (``make_update``)."""
    network = QNetwork(num_actions)
    params = network.init(jax.random.PRNGKey(seed), jnp.zeros((1, 10, 10, channels)))
    optimizer = centred_rmsprop(lr)
    return (network, optimizer, (params, params, optimizer.init(params)),
            make_update(optimizer, updates_per_call))


def crossed(before, after, every):
    """Whether a count going from ``before`` to ``after`` passed a multiple of ``every``: a
    schedule of every N updates then fires once per N updates whatever the updates per call,
    also after a resume whose count is not a multiple of this run's (``count % N == 0`` would
    never hold again)."""
    return after // every > before // every


def epsilon(frame, args):
    """Uniformly random until the replay start, then 1 -> final over exploration_frames."""
    progress = max(0, frame - args.replay_start) / args.exploration_frames
    return max(args.final_exploration, 1.0 - (1.0 - args.final_exploration) * progress)


class GreedyPolicy:
    """The players' Q-function: the network's forward pass in numpy (``q_values``), on the
    weights last loaded.

    Why numpy: XLA runs one computation at a time per device, so a jitted greedy action would
    queue behind the update in flight and nothing would overlap; this forward (one state:
    ~0.03 ms) runs beside it. ``load`` takes flax's parameter tree (JAX arrays: reading them
    waits until the update that makes them is done) and stores a whole new set of numpy arrays
    (one attribute store with their version, atomic for the player threads). Give it the learner's weights after
    each update; never bind weights into the predictor once (``lambda s, p=params: ...`` keeps
    the first).
    """

    def __init__(self, params):
        self.load(params)

    def load(self, params, version=0):
        """Act with ``params`` from now on; ``version``: the updates they are the result of.
        The library counts the weights' age from the predictor's assignment
        (``stream.predictor = policy`` after a load: the hand-over)."""
        self.loaded = (jax.tree.map(np.asarray, params), version)

    def __call__(self, states):
        """States ``(n, 10, 10, C, 1)`` (one frame each) -> Q-values ``(n, num_actions)``."""
        return q_values(self.loaded[0], states[..., 0])


class EpisodeLog:
    """Every training episode as (frame at its end, score): the returns file and the progress line.

    A row's frame is the memory's count of the steps stored (all players') when the episode's
    last step is in it. With several players episodes end in the simulator threads: rows are
    appended under a lock, in the order of those counts.
    """

    def __init__(self, path, memory):
        self.path, self.memory = path, memory
        self.rows, self.shown, self.lock = [], 0, threading.Lock()
        self.file = self.writer = None

    def open(self):
        """Start the returns file, keeping a resumed run's rows up to the memory's count (the
        frame its checkpoint was saved at); call it once the memory is restored."""
        if not self.path:
            return
        frames, kept = self.memory.num_steps_written, []
        if os.path.exists(self.path):
            with open(self.path, newline='') as f:
                kept = [r for r in csv.DictReader(f) if int(r['frames']) <= frames]
        self.file = open(self.path, 'w', newline='')
        self.writer = csv.writer(self.file)
        self.writer.writerow(['frames', 'score'])
        self.writer.writerows([r['frames'], r['score']] for r in kept)
        self.file.flush()

    def __call__(self, record):   # the stream's on_episode_end, after the episode's steps are stored
        with self.lock:
            frame = record.frames        # the frames stored when it ended, the fill's included
            self.rows.append((frame, record.score))
            if self.writer:
                self.writer.writerow([frame, record.score])
                self.file.flush()

    def recent(self):
        with self.lock:
            rows, self.shown = self.rows[self.shown:], len(self.rows)
        return [score for _, score in rows]

    def close(self):
        with self.lock:
            if self.file:
                self.file.close()
                self.file = self.writer = None


class StartProbe(gym.Wrapper):
    """A player's env whose every step also sleeps ``seconds`` (``--env-ms``): an emulator that
    slow, the GIL released."""

    def __init__(self, env, seconds=0.0):
        super().__init__(env)
        self.seconds = seconds

    def step(self, action):
        if self.seconds:
            time.sleep(self.seconds)
        return self.env.step(action)


def lag_summary(lags):
    """The last line's account of the stream's two lags (a DataLagStats), in updates."""
    request, age = lags.request_lag, lags.weights_age
    return (f"mean request lag {request.mean or 0:.2f} updates (max {request.max or 0}), "
            f"acting weights' mean age {age.mean or 0:.2f} updates (max {age.max or 0})")


def resources():
    """Threads, open files and resident memory of this process (the long runs' soak record)."""
    status = {}    # Linux's view of the process; elsewhere -1
    if os.path.exists('/proc/self/status'):
        with open('/proc/self/status') as f:
            status = dict(line.split(':', 1) for line in f if ':' in line)
    rss = int(status.get('VmRSS', '-1024 kB').split()[0]) // 1024
    os_threads = int(status.get('Threads', '-1'))    # XLA's and the BLAS's threads included
    files = len(os.listdir('/proc/self/fd')) if os.path.isdir('/proc/self/fd') else -1
    return (f"resources: threads {threading.active_count()} Python, {os_threads} in all, "
            f"open files {files}, resident {rss} MB")


def save_learner(path, state, counters):
    """The learner's pytrees as numbered leaves plus its counters, replaced atomically: a
    save cut short (a first Ctrl-C arriving in it) leaves the previous file whole."""
    leaves = {f'leaf{i}': np.asarray(x) for i, x in enumerate(jax.tree.leaves(state))}
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    tmp = path + '.tmp.npz'
    np.savez(tmp, **leaves, **{k: np.asarray(v) for k, v in counters.items()})
    os.replace(tmp, path)


def saved_frame(path):
    """The frame of the learner saved at ``path`` (None: no file, or no path)."""
    if not path or not os.path.exists(path):
        return None
    with np.load(path) as f:
        return int(f['frames'])


def load_learner(path, like, optimizer):
    """The state saved by save_learner, shaped as ``like`` (online, target, optimizer state),
    and the counters. A file of this example's earlier layout, one flat vector per tree (its
    four leaves: online, target and the optimizer's two moments), is read too."""
    with np.load(path) as f:
        counters = {k: int(f[k]) for k in f.files if not k.startswith('leaf')}
        leaves = [jnp.asarray(f[f'leaf{i}']) for i in range(sum(k.startswith('leaf') for k in f.files))]
    treedef = jax.tree.structure(like)
    if len(leaves) == treedef.num_leaves:
        return jax.tree.unflatten(treedef, leaves), counters
    flat, unravel = ravel_pytree(like[0])
    flat_def = jax.tree.structure((flat, flat, optimizer.init(flat)))
    if len(leaves) != flat_def.num_leaves or any(x.shape != flat.shape for x in leaves):
        raise ValueError(f"{path}: {len(leaves)} arrays, not this network's learner (another "
                         "game, or another example's file?)")
    return jax.tree.map(unravel, jax.tree.unflatten(flat_def, leaves)), counters


class Stopped(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the training once it had started; ``frames``: the frame the
    memory and the learner were saved at, None if they were not (no checkpoint dir)."""

    def __init__(self, frames):
        super().__init__(frames)
        self.frames = frames


def train(args):
    """The run; returns (online weights, the network, the episode log). Raises :class:`Stopped`
    on Ctrl-C or SIGTERM, once the memory and the learner are saved."""
    env = make_env(args.game)
    channels, num_actions = env.observation_space.shape[-1], env.action_space.n
    env.close()
    per_call = args.updates_per_call
    network, optimizer, state, update = build_learner(num_actions, channels, args.seed, args.lr,
                                                      per_call)

    # Resume: the learner's file and the memory's checkpoint, saved at the same frame.
    learner_frames, updates = None, 0
    learner_file = args.checkpoint_dir and os.path.join(args.checkpoint_dir, 'learner.npz')
    if learner_file and os.path.exists(learner_file):
        state, counters = load_learner(learner_file, state, optimizer)
        learner_frames, updates = counters['frames'], counters['updates']
    resumed_updates = updates
    seed = args.seed + (learner_frames or 0)   # the random draws after a resume: new, but reproducible

    policy = GreedyPolicy(state[0])
    memory = ReplayMemory(args.memory_size, (10, 10, channels), 1, 'bool',
                          prioritized=args.prioritized)
    episodes = EpisodeLog(args.returns, memory)
    stream = ReplayStream(
        memory,
        # One player: the paper's one env, stepped inline by this thread; more: the simulator
        # threads step them, up to --staleness requests pending.
        Population(lambda: StartProbe(make_env(args.game), args.env_ms / 1000), args.players, policy,
                   maximum_staleness=args.staleness, seed=seed,
                   request_lag=args.request_lag and args.request_lag // per_call,
                   on_episode_end=episodes),
        # One update per frame: per_call minibatches drawn at once for per_call frames.
        Sampling(args.batch_size * per_call, update_frequency=per_call, n_step=args.n_step,
                 gamma=args.gamma, seed=seed,
                 beta=(lambda k: min(1.0, 0.4 + 0.6 * (resumed_updates + per_call * k) / args.frames))
                 if args.prioritized else None),
        init_memory_size=args.replay_start, progress=False,   # single-env players: no prefetch thread
        checkpoint_dir=args.checkpoint_dir and os.path.join(args.checkpoint_dir, 'memory'))
    # The frame count is the memory's own (restored from its checkpoint): epsilon (a schedule of
    # the frames), the returns file and the progress lines go on from it.
    resumed_frames = frames = memory.num_steps_written
    stream.exploration = lambda steps: epsilon(resumed_frames + steps, args)
    if learner_frames is not None or frames:
        print(f"resuming from {args.checkpoint_dir}: frame {frames}, update {updates}", flush=True)
    if learner_frames is not None and learner_frames != frames:
        print(f"(the learner was saved at frame {learner_frames}, the memory at frame {frames}: "
              "the frames go on from the memory's)", flush=True)
    episodes.open()

    print(f"DQN (JAX) on MinAtar {GAMES[args.game]}: {args.frames} frames, seed {args.seed}, "
          f"{args.players} player{'s' if args.players > 1 else ''}" + (
              f" (staleness {stream.maximum_staleness}" + (f", env steps + {args.env_ms:g} ms" if args.env_ms else '')
              + (f", request lag {args.request_lag} updates, fixed" if args.request_lag else '')
              + ")" if args.players > 1 else '') + f", {per_call} update{'s' if per_call > 1 else ''} "
          f"per call, {jax.default_backend()} learner; " + (
              f"{len(memory)} transitions in the memory" if stream.resumed else
              f"filling {args.replay_start} frames at random first"), flush=True)
    start = last_log = time.time()
    last_frames, soak_shown, pending = frames, False, None
    every = args.checkpoint_every
    next_save = (frames // every + 1) * every
    try:
        try:
            with stream:   # closing stops the players, joins every thread and saves the memory
                stream.count_updates(0)   # this loop counts its updates (K a call) itself
                for batch in stream:   # frames stepped (the previous weights act), then a batch drawn
                    # Dispatch the update: it computes while the loop goes on (JAX's async dispatch).
                    new_state, td = update(state, batch.state[..., 0], batch.action, batch.reward,
                                           batch.next_state[..., 0], batch.discount, batch.weights)
                    if crossed(updates - per_call, updates, args.weights_every):
                        # The weights before this update act for the next frames; assigning
                        # the predictor is the hand-over the stream counts their age from.
                        policy.load(state[0], updates - resumed_updates)
                        stream.predictor = policy
                    state = new_state
                    updates += per_call
                    stream.count_updates(per_call)   # the lags' clock: updates, not calls
                    if crossed(updates - per_call, updates, args.target_update):
                        state = (state[0], state[0], state[2])
                    stored, queued = stream.population.progress()
                    requested = resumed_frames + stored + queued   # what the next batch adds to
                    last = requested + per_call > args.frames
                    if last:
                        # The next batch would step K frames past --frames (fewer are left when
                        # --frames is not the fill's end plus a multiple of K, or after a resume
                        # with another K): the frames left are stepped here, with no update.
                        for _ in range(args.frames - requested):
                            stream.population.step(stream.population.exploration)
                        stream.population.wait_idle()
                    frames = memory.num_steps_written
                    if args.prioritized:
                        # One batch late: reading this batch's |TD| now would wait for the update.
                        if pending is not None:
                            stream.update_priorities(*pending)
                        pending = (batch.indices, td)

                    now = time.time()
                    if now - last_log >= args.log_every or frames >= args.frames:
                        scores = episodes.recent()
                        rate = (frames - last_frames) / (now - last_log)
                        line = (f"progress: {frames} frames ({rate:.0f}/s), {updates} updates, "
                                f"{len(scores)} games")
                        if scores:
                            line += f", mean score {np.mean(scores):.2f} (max {max(scores):.0f})"
                        print(line + f", epsilon {stream.exploration:.3f}", flush=True)
                        last_log, last_frames = now, frames
                        if not soak_shown and now - start >= 60:
                            print(resources(), flush=True)
                            soak_shown = True
                    if learner_file and frames >= next_save:
                        stream.population.wait_idle()   # nothing being stored while it is saved
                        stream.save_memory()
                        saved = memory.num_steps_written
                        save_learner(learner_file, state, {'frames': saved, 'updates': updates})
                        next_save = (saved // every + 1) * every
                    if last or frames >= args.frames:
                        break
        finally:
            # The stream is closed: the players are stopped and the memory is saved, at its
            # count of steps stored; the learner is saved at that frame too.
            frames = memory.num_steps_written
            episodes.close()
            if learner_file and stream.closed:
                save_learner(learner_file, state, {'frames': frames, 'updates': updates})
        print(resources(), flush=True)
        print(f"training done: {frames} frames, {len(episodes.rows)} games in "
              f"{time.time() - start:.0f} s, {lag_summary(stream.stats().lags)}", flush=True)
    except KeyboardInterrupt:
        # Said saved only if the learner's file holds this frame (the memory saved at it).
        raise Stopped(frames if saved_frame(learner_file) == frames else None) from None
    return state[0], network, episodes


def evaluate(network, params, game, episodes, seed, max_frames=10_000):
    """Scores of greedy episodes (argmax Q; the env keeps its sticky actions)."""
    q = jax.jit(network.apply)
    env, scores = make_env(game), []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        score = 0.0
        for _ in range(max_frames):
            obs, reward, terminated, truncated, _ = env.step(int(jnp.argmax(q(params, obs[None])[0])))
            score += reward
            if terminated or truncated:
                break
        scores.append(score)
    env.close()
    return np.array(scores)


def main(argv=None):
    args = parse_args(argv)
    # The first Ctrl-C or SIGTERM (``kill``, a batch scheduler ending a job) stops the run as
    # Ctrl-C does; the ones after it only print a line until the saves are done.
    with stop_on_signals():
        try:
            params, network, _ = train(args)
        except Stopped as stop:
            if stop.frames is not None:
                print(f"stopped: the memory and the learner are saved in {args.checkpoint_dir} at "
                      f"frame {stop.frames}; run the same command to go on", flush=True)
            elif args.checkpoint_dir:
                print("stopped: the learner is not saved at this frame", flush=True)
            else:
                print("stopped: nothing saved (no --checkpoint-dir)", flush=True)
            return None
        except KeyboardInterrupt:   # before the training started
            print("stopped before the training started: nothing saved", flush=True)
            return None
        if args.eval_episodes:
            try:
                scores = evaluate(network, params, args.game, args.eval_episodes,
                                  seed=10**6 + args.seed)
            except KeyboardInterrupt:
                print("stopped during the greedy evaluation", flush=True)
                return None
            print(f"greedy mean score {scores.mean():.2f} over {len(scores)} episodes", flush=True)
            return scores


if __name__ == '__main__':
    main()
