#!/usr/bin/env python
"""The MinAtar paper's DQN with a JAX learner (flax + optax) on this library's replay stream.

    python examples/dqn_minatar_jax.py --game breakout                     # the paper's 5M frames
    python examples/dqn_minatar_jax.py --game space_invaders --frames 1000000 --returns returns.csv
    python examples/dqn_minatar_jax.py --game breakout --checkpoint-dir runs/breakout  # resumable

The agent is ``examples/dqn_minatar.py``'s (the MinAtar authors' ``examples/dqn.py``, value by
value; that file's docstring lists them): a 3x3x16 convolution and a 128-unit layer, PyTorch's
default initialisation, replay memory 100k, batch 32, one update per frame, the target network
copied every 1,000 updates, 5,000 random frames first, epsilon 1 -> 0.1 over the next 100k
frames, centred RMSProp (step 2.5e-4, smoothing 0.95, eps 0.01 added outside the root, no
momentum: PyTorch's ``RMSprop(alpha=0.95, centered=True, eps=0.01)``, which is
``optax.rmsprop(..., centered=True, eps_in_sqrt=False)``), Huber loss, gamma 0.99, sticky
actions, all 6 actions, 5M frames. Here the network, the loss and the optimizer are JAX; the
replay memory, the acting and the sampling are :class:`expreplay.ReplayStream`'s.

How a frame's work hides under the update. JAX dispatches a jitted call and returns at once:
the update computes in XLA's threads, without the GIL, while this loop steps the env, stores
the transition and draws the next batch. The players act with the weights of the update
*before* the one computing (one update older than the paper's loop, out of millions), through
a numpy copy of the network's forward pass (``GreedyPolicy``), so that a greedy action never
queues behind the update on the XLA device. The weights travel as one flat vector, which
keeps the dispatch cheap (``make_update``). No prefetch thread (the stream's default with one
player): it would compete with this loop for the GIL and the cores.

On a GPU: ``pip install 'jax[cuda12]'``; nothing else changes.

Checkpoints: ``--checkpoint-dir DIR`` saves, every ``--checkpoint-every`` frames and at the end
(also on Ctrl-C, or on ``kill``'s SIGTERM for a run in the background, whose Ctrl-C the
shell ignores), the replay memory (``DIR/memory``, the library's checkpoint) and the learner
(``DIR/learner.npz``: online and target weights, the optimizer's state, the frame and update
counters, the score log's position). Run the same command again and it continues from the
last checkpoint: the frame count, epsilon, the returns file (rows after the checkpoint are
dropped) and the memory go on where they were; the env starts a new episode (the one cut by
the stop is not counted) and the random draws after a resume are seeded from the seed and the
frame count, so a resumed run is a continuation, not a bit-exact replay.

Progress: a first line naming the game and settings, then a ``progress:`` line every
``--log-every`` seconds (frames and their rate, updates, games and their mean score, epsilon)
and a ``resources:`` line (threads, open files, resident memory) after the first minute and at
the end.
"""

import argparse
import csv
import os
import signal
import threading
import time
import warnings

GAMES = {'asterix': 'Asterix', 'breakout': 'Breakout', 'freeway': 'Freeway',
         'seaquest': 'Seaquest', 'space_invaders': 'SpaceInvaders'}


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
    p.add_argument('--returns', help='append every training episode as a CSV row frames,score here')
    p.add_argument('--eval-episodes', type=int, default=0,
                   help='greedy episodes played by the final network (0: none)')
    p.add_argument('--checkpoint-dir', help='save here, and resume from here (see above)')
    p.add_argument('--checkpoint-every', type=int, default=250_000, help='frames between checkpoints')
    p.add_argument('--log-every', type=float, default=30.0, help='seconds between progress lines')
    return p


if __name__ == '__main__':
    _args = argument_parser().parse_args()   # --help and bad flags answer before JAX loads
    print(f"DQN (JAX) on MinAtar {GAMES[_args.game]}, {_args.frames} frames, seed {_args.seed}: "
          "loading JAX and MinAtar...", flush=True)

os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')

import flax.linen as nn  # noqa: E402
import gymnasium as gym  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402
import minatar.gym  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from expreplay import Population, ReplayMemory, ReplayStream, Sampling  # noqa: E402

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


def make_update(network, unravel, optimizer):
    """The jitted DQN update: one step on the Huber loss of the TD error against the target
    network, ``reward + discount * max_a Q_target(next_state, a)`` (``discount``: gamma ** k,
    0 after a terminal step; ``weights``: importance weights, 1 unless prioritized).

    The weights are one flat vector (``unravel`` rebuilds the network's tree inside the
    compiled function): each array handed to a jitted call costs its dispatch Python time, and
    a vector instead of the tree's leaves (online, target and two optimizer moments: 24 of them)
    cut that from ~0.55 to ~0.15 ms per update here, time the training loop's thread needs for
    the env.
    """
    @jax.jit
    def update(state, s, a, r, s2, discount, weights):
        """(online, target, optimizer state), a batch -> the new state and the |TD errors|."""
        params, target, opt_state = state

        def loss(p):
            q = network.apply(unravel(p), s)[jnp.arange(s.shape[0]), a]
            td = q - (r + discount * network.apply(unravel(target), s2).max(1))
            return jnp.mean(weights * optax.huber_loss(td, delta=1.0)), td

        (_, td), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), target, opt_state), jnp.abs(td)
    return update


def centred_rmsprop(lr):
    """PyTorch's RMSprop(alpha=0.95, centered=True, eps=0.01), the paper's: eps outside the root."""
    return optax.rmsprop(lr, decay=0.95, eps=0.01, centered=True, eps_in_sqrt=False)


def epsilon(frame, args):
    """Uniformly random until the replay start, then 1 -> final over exploration_frames."""
    progress = max(0, frame - args.replay_start) / args.exploration_frames
    return max(args.final_exploration, 1.0 - (1.0 - args.final_exploration) * progress)


class GreedyPolicy:
    """The players' Q-function: the network's forward pass in numpy, on the weights last loaded.

    Why numpy: XLA runs one computation at a time per device, so a jitted greedy action would
    queue behind the update in flight and nothing would overlap; this forward (one state:
    ~0.03 ms) runs beside it. ``load`` takes the flat weight vector (a JAX array: reading it
    waits until the update that makes it is done) and stores a whole new set (an attribute
    store, atomic for the player thread). Give it the learner's weights after each update;
    never bind weights into the predictor once (``lambda s, p=params: ...`` keeps the first).
    """

    def __init__(self, template, flat):
        leaves, self.treedef = jax.tree.flatten(template)
        self.shapes = [leaf.shape for leaf in leaves]
        self.load(flat)

    def load(self, flat):
        flat, leaves, at = np.asarray(flat), [], 0
        for shape in self.shapes:
            size = int(np.prod(shape))
            leaves.append(flat[at:at + size].reshape(shape))
            at += size
        self.params = jax.tree.unflatten(self.treedef, leaves)['params']

    def __call__(self, states):
        """States ``(n, 10, 10, C, 1)`` (one frame each) -> Q-values ``(n, num_actions)``."""
        p, x = self.params, states[..., 0].astype(np.float32)
        n, channels = len(x), x.shape[-1]
        # The 3x3 valid convolution as one product over the 8x8 positions' patches, in flax's
        # (row, column, channel) order of the kernel.
        patches = np.stack([x[:, i:i + 8, j:j + 8, :] for i in range(3) for j in range(3)], axis=3)
        kernel = p['Conv_0']['kernel'].reshape(9 * channels, -1)
        h = np.maximum(patches.reshape(n * 64, 9 * channels) @ kernel + p['Conv_0']['bias'], 0)
        h = np.maximum(h.reshape(n, -1) @ p['Dense_0']['kernel'] + p['Dense_0']['bias'], 0)
        return h @ p['Dense_1']['kernel'] + p['Dense_1']['bias']


class EpisodeLog:
    """Every training episode as (frame at its end, score): the returns file and the progress line."""

    def __init__(self, path, frames=0):
        self.frames, self.rows, self.shown = frames, [], 0
        self.file = self.writer = None
        if path:
            kept = []
            if os.path.exists(path):   # a resumed run: keep the rows up to its checkpoint
                with open(path, newline='') as f:
                    kept = [r for r in csv.DictReader(f) if int(r['frames']) <= frames]
            self.file = open(path, 'w', newline='')
            self.writer = csv.writer(self.file)
            self.writer.writerow(['frames', 'score'])
            self.writer.writerows([r['frames'], r['score']] for r in kept)
            self.file.flush()

    def __call__(self, record):   # the stream's on_episode_end (one player, one env's frames)
        self.frames += record.length
        self.rows.append((self.frames, record.score))
        if self.writer:
            self.writer.writerow([self.frames, record.score])
            self.file.flush()

    def recent(self):
        rows, self.shown = self.rows[self.shown:], len(self.rows)
        return [score for _, score in rows]

    def close(self):
        if self.file:
            self.file.close()


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
    """The learner's pytrees as numbered leaves plus its counters, replaced atomically."""
    leaves = {f'leaf{i}': np.asarray(x) for i, x in enumerate(jax.tree.leaves(state))}
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    tmp = path + '.tmp.npz'
    np.savez(tmp, **leaves, **{k: np.asarray(v) for k, v in counters.items()})
    os.replace(tmp, path)


def load_learner(path, like):
    """The state saved by save_learner, shaped as ``like``, and the counters."""
    with np.load(path) as f:
        treedef = jax.tree.structure(like)
        leaves = [jnp.asarray(f[f'leaf{i}']) for i in range(treedef.num_leaves)]
        counters = {k: int(f[k]) for k in f.files if not k.startswith('leaf')}
    return jax.tree.unflatten(treedef, leaves), counters


def train(args):
    """The run; returns (online weights, the network, the episode log)."""
    env = make_env(args.game)
    channels, num_actions = env.observation_space.shape[-1], env.action_space.n
    env.close()
    network = QNetwork(num_actions)
    params = network.init(jax.random.PRNGKey(args.seed), jnp.zeros((1, 10, 10, channels)))
    flat, unravel = ravel_pytree(params)
    optimizer = centred_rmsprop(args.lr)
    state = (flat, flat, optimizer.init(flat))   # online, target, optimizer
    update = make_update(network, unravel, optimizer)

    # Resume: the learner's file and the memory's checkpoint, both written at the same frame.
    frames = updates = 0
    learner_file = args.checkpoint_dir and os.path.join(args.checkpoint_dir, 'learner.npz')
    if learner_file and os.path.exists(learner_file):
        state, counters = load_learner(learner_file, state)
        frames, updates = counters['frames'], counters['updates']
        print(f"resuming from {args.checkpoint_dir}: frame {frames}, update {updates}", flush=True)
    resumed_frames, resumed_updates = frames, updates
    seed = args.seed + frames     # the random draws after a resume: new, but reproducible

    policy = GreedyPolicy(params, state[0])
    episodes = EpisodeLog(args.returns, frames)
    stream = ReplayStream(
        ReplayMemory(args.memory_size, (10, 10, channels), 1, 'bool',
                     prioritized=args.prioritized),
        # The paper's one env, stepped inline; epsilon is a schedule of the frames played.
        Population(lambda: make_env(args.game), 1, policy, seed=seed, on_episode_end=episodes,
                   exploration=lambda steps: epsilon(resumed_frames + steps, args)),
        Sampling(args.batch_size, update_frequency=1, n_step=args.n_step, gamma=args.gamma,
                 seed=seed, beta=(lambda k: min(1.0, 0.4 + 0.6 * (resumed_updates + k) / args.frames))
                 if args.prioritized else None),
        init_memory_size=args.replay_start, progress=False,   # one player: no prefetch thread
        checkpoint_dir=args.checkpoint_dir and os.path.join(args.checkpoint_dir, 'memory'))

    print(f"DQN (JAX) on MinAtar {GAMES[args.game]}: {args.frames} frames, seed {args.seed}, "
          f"{jax.default_backend()} learner; " + (
              f"{len(stream.memory)} transitions in the memory" if stream.resumed else
              f"filling {args.replay_start} frames at random first"), flush=True)
    start = last_log = time.time()
    last_frames, soak_shown, pending = frames, False, None
    with stream:   # closing joins every thread and saves the memory, also on Ctrl-C or an error
        first_frames = max(frames, args.replay_start)   # in the memory when the first batch is drawn
        try:
            for batch in stream:   # one frame stepped (the previous weights act), then a batch drawn
                # Dispatch the update: it computes while the loop goes on (JAX's async dispatch).
                new_state, td = update(state, batch.state[..., 0], batch.action, batch.reward,
                                       batch.next_state[..., 0], batch.discount, batch.weights)
                policy.load(state[0])   # the weights before this update act for the next frame
                state = new_state
                updates += 1
                frames = first_frames + updates - resumed_updates - 1   # frames in the memory now
                if updates % args.target_update == 0:
                    state = (state[0], state[0], state[2])
                if args.prioritized:
                    # One batch late: reading this batch's |TD| now would wait for the update.
                    if pending is not None:
                        stream.update_priorities(*pending)
                    pending = (batch.indices, td)

                now = time.time()
                if now - last_log >= args.log_every or frames >= args.frames:
                    scores = episodes.recent()
                    line = (f"progress: {frames} frames ({(frames - last_frames) / (now - last_log):.0f}/s), "
                            f"{updates} updates, {len(scores)} games")
                    if scores:
                        line += f", mean score {np.mean(scores):.2f} (max {max(scores):.0f})"
                    print(line + f", epsilon {stream.exploration:.3f}", flush=True)
                    last_log, last_frames = now, frames
                    if not soak_shown and now - start >= 60:
                        print(resources(), flush=True)
                        soak_shown = True
                if learner_file and frames % args.checkpoint_every == 0:
                    stream.save_memory()
                    save_learner(learner_file, state, {'frames': frames, 'updates': updates})
                if frames >= args.frames:
                    break
        finally:   # also on Ctrl-C: the learner at the frame the memory is saved at (on close)
            if learner_file:
                save_learner(learner_file, state, {'frames': frames, 'updates': updates})

    episodes.close()
    print(resources(), flush=True)
    print(f"training done: {frames} frames, {len(episodes.rows)} games in "
          f"{time.time() - start:.0f} s", flush=True)
    return unravel(state[0]), network, episodes


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


def stop_as_ctrl_c(signum, frame):
    """SIGTERM (``kill``, a batch scheduler ending a job) stops the run as Ctrl-C does."""
    raise KeyboardInterrupt


def main(argv=None):
    args = argument_parser().parse_args(argv)
    try:
        params, network, _ = train(args)
    except KeyboardInterrupt:
        if args.checkpoint_dir and os.path.exists(os.path.join(args.checkpoint_dir, 'learner.npz')):
            print(f"stopped: the memory and the learner are saved in {args.checkpoint_dir}; "
                  "run the same command to go on", flush=True)
        else:
            print("stopped: nothing saved" + ("" if args.checkpoint_dir else
                                              " (no --checkpoint-dir)"), flush=True)
        return None
    if args.eval_episodes:
        scores = evaluate(network, params, args.game, args.eval_episodes, seed=10**6 + args.seed)
        print(f"greedy mean score {scores.mean():.2f} over {len(scores)} episodes", flush=True)
        return scores


if __name__ == '__main__':
    signal.signal(signal.SIGTERM, stop_as_ctrl_c)
    main()
