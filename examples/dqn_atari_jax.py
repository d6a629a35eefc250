#!/usr/bin/env python
"""Double DQN on Atari in JAX (flax + optax), fed by this library's replay stream.

    python examples/dqn_atari_jax.py                       # Breakout, CleanRL's set-up (a GPU)
    python examples/dqn_atari_jax.py --game pong --save pong.msgpack
    python examples/dqn_atari_jax.py --buffer-size 100000 --learning-starts 5000 --log-every 10
                                                           # on a CPU: trains within a minute

One file, top to bottom: the flags, the Nature CNN, the Double-DQN loss and its optax update
(jitted), the players' greedy forward (jitted), and the training loop over
:class:`expreplay.ReplayStream`. The players are ale-py's C++ vector env
(``ale_py.vector_env.AtariVectorEnv``, ale-py >= 0.11): its threads step the games without
Python's lock and do the standard preprocessing themselves; the replay memory stores each
84x84 frame once and stacks the history of 4 itself.

On a GPU, ``pip install 'jax[cuda12]'`` is all that changes: the same script then runs the
network on the GPU.

Defaults: CleanRL's ``cleanrl/dqn_atari_jax.py``, value by value (its ``Args``):

- ``learning_rate`` 1e-4, Adam (``optax.adam``, its default betas and eps 1e-8);
- ``buffer_size`` 1,000,000 transitions (here ~7 GB of RAM: each frame is stored once);
- ``gamma`` 0.99; ``tau`` 1.0 and ``target_network_frequency`` 1000: the target network is
  replaced by the online one every 1,000 agent steps (250 updates), once learning started;
- ``batch_size`` 32; ``train_frequency`` 4 (one update per 4 agent steps);
- ``start_e`` 1, ``end_e`` 0.01, ``exploration_fraction`` 0.10: epsilon falls linearly from 1
  to 0.01 over the first 10% of ``total_timesteps``, counted from the first step;
- ``learning_starts`` 80,000 agent steps; ``total_timesteps`` 10,000,000; ``seed`` 1;
- the mean squared TD error (CleanRL's ``mse_loss``, not Huber); rewards clipped to their sign
  (CleanRL's ``ClipRewardEnv``); the Nature CNN (conv 8x8/4 x32, 4x4/2 x64, 3x3/1 x64, dense
  512, ReLU; flax's default initialisation), inputs divided by 255;
- ``env_id`` BreakoutNoFrameskip-v4: Breakout, minimal action set, no sticky actions; its
  wrappers: 30 no-op starts at most, 4-frame skip with a max over the last two frames, a lost
  life ends the training episode, FIRE pressed on reset, 84x84 grayscale, 4 frames per state.

CleanRL's script is plain DQN. This one is Double DQN, and that is the one change to the
algorithm: the next action is the online network's argmax, valued by the target network
(``target = r + gamma * (1 - done) * Q_target(s', argmax_a Q_online(s', a))``).

What the engine and the stream change, beside it:

- ``AtariVectorEnv(game, num_envs, stack_num=1, frameskip=4, maxpool=True, noop_max=30,
  use_fire_reset=True, repeat_action_probability=0, episodic_life=False,
  reward_clipping=False)``, 84x84 grayscale (its defaults): the same preprocessing in C++, one
  frame per observation. A lost life ends the *training* episode through the stream
  (``life_loss_terminal=True``: stored as terminal, the game goes on, as CleanRL's
  ``EpisodicLifeEnv``); ale-py's own ``episodic_life`` would restart the whole game instead.
  FIRE is pressed when a game starts, not after each lost life (CleanRL's ``FireResetEnv``
  also fires then): the network learns when to fire. A game is cut after 108,000 frames
  (27,000 agent steps; ale-py's default).
- The memory stores the game's rewards and the loss takes their sign: the same target as
  clipping in the env for one-step returns, and the scores printed are the game's (CleanRL's
  logged ``episodic_return`` is the game's too).
- ``--num-envs`` 8 games step together (CleanRL: 1): one forward pass for all their greedy
  actions. Agent steps count the steps of all of them, as CleanRL's ``global_step`` counts
  its one env's; the update ratio holds whatever the number (the stream counts inserted steps).
- Epsilon is given once, as CleanRL's schedule of the agent steps stored
  (``Population(exploration=schedule)``): the stream reads it at every step request.

Progress: a ``progress:`` line at the first update (with the time jit took to compile it),
then every ``--log-every`` seconds: agent steps and their rate, updates and their rate, the
games finished since the last line and their mean score (whole games, all lives), the last
loss, epsilon. Ctrl-C, or SIGTERM (``kill``, a batch scheduler ending a job), stops the run
cleanly (the stream closes, its threads are joined, the games are closed; the parameters are
saved if ``--save`` was given); a second signal while it stops only prints a line, so the save
completes. ``--save PATH`` writes the online network's parameters at the end
(``flax.serialization`` msgpack, written whole or not at all; read them with
``flax.serialization.from_bytes(initial_params(QNetwork(n), seed), data)`` or
``msgpack_restore``); an existing file is refused, never overwritten.

Speed on a 2-core CPU without a GPU (such machines vary ~3x; rates over ~60 s of training,
the other work on the machine varying): the CPU command above printed its first progress line
13-18 s after the start and trained at 48 agent steps/s, 12 updates/s (24 and 6 in a run
while other programs took the cores); the defaults filled their 80,000 steps in about a
minute and trained at 56 agent steps/s, 14 updates/s (epsilon ~0.92 then: few greedy
forward passes). The update (Double DQN, batch 32: three forward passes of the Nature CNN and
one backward) takes ~80 ms of both cores, nearly all the time between two updates: 10M steps
would take about 2 days here. That is the part a GPU takes over.
"""

import argparse
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--game', default='breakout',
                   help="an ale-py ROM name in snake_case, e.g. pong, ms_pacman")
    p.add_argument('--seed', type=int, default=1, help='seeds the network, the sampling and the games')
    p.add_argument('--total-timesteps', type=int, default=10_000_000,
                   help='agent steps, the random ones included')
    p.add_argument('--learning-rate', type=float, default=1e-4, help="Adam's step size")
    p.add_argument('--num-envs', type=int, default=8, help='games stepped together by the vector env')
    p.add_argument('--buffer-size', type=int, default=1_000_000,
                   help='replay memory capacity in transitions (~7 KB each: 1M ~7 GB, 100k ~0.7 GB)')
    p.add_argument('--gamma', type=float, default=0.99, help='discount factor')
    p.add_argument('--tau', type=float, default=1.0,
                   help='target network update rate (1: replace it by the online network)')
    p.add_argument('--target-network-frequency', type=int, default=1000,
                   help='agent steps between target network updates')
    p.add_argument('--batch-size', type=int, default=32, help='transitions per update')
    p.add_argument('--start-e', type=float, default=1.0, help='epsilon at the first step')
    p.add_argument('--end-e', type=float, default=0.01, help='epsilon at the end of the decay')
    p.add_argument('--exploration-fraction', type=float, default=0.10,
                   help='share of --total-timesteps over which epsilon falls from --start-e to --end-e')
    p.add_argument('--learning-starts', type=int, default=80_000,
                   help='uniformly random agent steps stored before the first update')
    p.add_argument('--train-frequency', type=int, default=4, help='agent steps per update')
    # 0: the batches are drawn, and the games stepped, in the training loop between updates.
    # On 2 CPU cores a prefetch thread of depth 4 was no faster (4 rounds interleaved at epsilon
    # 0.01: median 10.0 against 10.5 updates/s, rounds 0.79-1.40x): XLA's update already keeps
    # both cores busy. It would also let the players act up to 4 updates behind the network.
    p.add_argument('--prefetch', type=int, default=0,
                   help="batches a thread of the stream draws ahead while the network updates")
    p.add_argument('--log-every', type=float, default=30.0, help='seconds between progress lines')
    p.add_argument('--save', metavar='PATH', help="write the online network's parameters here at the end")
    args = p.parse_args(argv)
    if args.save and os.path.exists(args.save):
        p.error(f"--save {args.save} exists: give a new path (a saved file is never overwritten)")
    if args.save and not os.path.isdir(os.path.dirname(os.path.abspath(args.save))):
        p.error(f"--save {args.save}: its directory does not exist")
    if args.learning_starts < args.batch_size or args.learning_starts > args.buffer_size:
        p.error(f"--learning-starts ({args.learning_starts}) must be between --batch-size "
                f"({args.batch_size}) and --buffer-size ({args.buffer_size})")
    return args


if __name__ == '__main__':
    parse_args()   # --help and bad flags answer before JAX and ale-py load (seconds)

from typing import NamedTuple  # noqa: E402

from expreplay import require_extra  # noqa: E402

require_extra('examples/dqn_atari_jax.py', 'jax')   # names the extra, not 'No module named flax.linen'
require_extra('examples/dqn_atari_jax.py', 'atari')

import flax.linen as nn  # noqa: E402
import flax.serialization  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from ale_py.vector_env import AtariVectorEnv  # noqa: E402

from expreplay import Population, ReplayMemory, ReplayStream, RunnerSettings, Sampling  # noqa: E402
from expreplay.interrupts import stop_on_signals  # noqa: E402

HISTORY = 4   # frames per state


def make_players(args, num_envs=None):
    """ale-py's C++ vector env: the standard preprocessing, one 84x84 frame per observation
    (``stack_num=1``: the memory stacks the history itself and stores each frame once)."""
    return AtariVectorEnv(
        args.game, num_envs or args.num_envs, stack_num=1, frameskip=4, maxpool=True, noop_max=30,
        use_fire_reset=True, repeat_action_probability=0.0, episodic_life=False,
        reward_clipping=False)   # the scores stay the game's; the loss clips


class QNetwork(nn.Module):
    """The Nature CNN: states ``(n, 84, 84, 4)`` uint8, frames last -> Q-values ``(n, actions)``."""

    num_actions: int

    @nn.compact
    def __call__(self, x):
        x = x.astype(jnp.float32) / 255.0
        x = nn.relu(nn.Conv(32, kernel_size=(8, 8), strides=(4, 4), padding='VALID')(x))
        x = nn.relu(nn.Conv(64, kernel_size=(4, 4), strides=(2, 2), padding='VALID')(x))
        x = nn.relu(nn.Conv(64, kernel_size=(3, 3), strides=(1, 1), padding='VALID')(x))
        x = nn.relu(nn.Dense(512)(x.reshape(x.shape[0], -1)))
        return nn.Dense(self.num_actions)(x)


def initial_params(network, seed):
    """flax's default initialisation (LeCun normal weights, zero biases), from ``seed``."""
    return network.init(jax.random.PRNGKey(seed), np.zeros((1, 84, 84, HISTORY), np.uint8))


class Learner(NamedTuple):
    params: dict
    target_params: dict
    opt_state: optax.OptState


def build(args, num_actions):
    """The network, the optimizer, the jitted update and the jitted greedy forward."""
    network = QNetwork(num_actions)
    optimizer = optax.adam(args.learning_rate)

    @jax.jit
    def update(learner, state, action, reward, next_state, discount):
        """One Adam step on the mean squared Double-DQN TD error of a batch.

        ``discount`` is the stream's: gamma, or 0 where the episode ended (a lost life
        included). The states go to the device as uint8 and are scaled there.
        """
        rows = jnp.arange(action.shape[0])
        next_action = network.apply(learner.params, next_state).argmax(axis=1)   # online picks
        next_q = network.apply(learner.target_params, next_state)[rows, next_action]   # target values
        target = jnp.sign(reward) + discount * next_q

        def loss_fn(params):
            q = network.apply(params, state)[rows, action]
            return jnp.mean((q - target) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(learner.params)
        updates, opt_state = optimizer.update(grads, learner.opt_state, learner.params)
        return learner._replace(params=optax.apply_updates(learner.params, updates),
                                opt_state=opt_state), loss

    @jax.jit
    def soft_update(learner):
        """target <- tau * online + (1 - tau) * target (tau 1: a copy)."""
        return learner._replace(target_params=optax.incremental_update(
            learner.params, learner.target_params, args.tau))

    params = initial_params(network, args.seed)
    learner = Learner(params, params, optimizer.init(params))
    return learner, update, soft_update, jax.jit(network.apply)


class GreedyPolicy:
    """The players' Q-function. It reads ``self.params`` at every call, and the training loop
    stores the newest parameters there after each update, so the players act with the
    learner's current network. (``lambda s, p=params: forward(p, s)`` would bind the initial
    parameters once and for all: the players would never see any learning.)"""

    def __init__(self, forward, params):
        self.forward, self.params = forward, params

    def __call__(self, states):
        # The players pass only their greedy rows, 1 to num_envs of them; jit compiles once per
        # input shape, so the batch is padded to a power of two: a few shapes, compiled once.
        n = len(states)
        padded = np.zeros((1 << (n - 1).bit_length(),) + states.shape[1:], states.dtype)
        padded[:n] = states
        return np.asarray(self.forward(self.params, padded))[:n]


def save_params(path, params):
    """Write ``params`` to ``path`` whole (written aside, then linked in), never over a file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, 'wb') as f:
            f.write(flax.serialization.to_bytes(params))
        os.link(tmp, path)   # FileExistsError if path exists: never overwrites
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def epsilon(step, args):
    """CleanRL's linear schedule: start_e -> end_e over exploration_fraction * total_timesteps."""
    duration = args.exploration_fraction * args.total_timesteps
    return max(args.end_e, args.start_e + (args.end_e - args.start_e) * step / duration)


def train(args):
    """Train for ``args.total_timesteps`` agent steps; returns the exit status (130 if interrupted)."""
    probe = make_players(args, num_envs=1)
    num_actions = int(probe.single_action_space.n)
    probe.close()
    learner, update, soft_update, forward = build(args, num_actions)
    policy = GreedyPolicy(forward, learner.params)
    scores = []   # every finished game's score (appended from the acting thread: list.append is atomic)
    population = Population(
        lambda: make_players(args), 1, policy, seed=args.seed,
        # CleanRL's epsilon, given once as a schedule of the agent steps stored: the stream reads
        # it at every step request, the first learning_starts steps' included.
        exploration=lambda steps: epsilon(steps, args),
        on_episode_end=lambda record: scores.append(record.score),
        runner=RunnerSettings(life_loss_terminal=True))
    memory = ReplayMemory(args.buffer_size, (84, 84), history_len=HISTORY, dtype='uint8')
    stream = ReplayStream(
        memory,
        population,
        Sampling(args.batch_size, update_frequency=args.train_frequency, gamma=args.gamma,
                 seed=args.seed),
        init_memory_size=args.learning_starts, prefetch=args.prefetch, progress=True)
    print(f"{args.game}: {num_actions} actions, {args.num_envs} games; {args.learning_starts} "
          f"steps before the first update, then one per {args.train_frequency} steps", flush=True)
    step = updates = 0
    loss = None
    interrupted = False
    start = time.time()
    try:
        with stream:   # closing joins every thread and closes the games, also on Ctrl-C
            stream.start()   # fills the memory with the first learning_starts steps
            step = population.progress()[0]
            synced = step // args.target_network_frequency   # target updates so far
            last_log, last_step, last_updates, shown = time.time(), step, 0, 0
            for batch in stream:
                learner, loss = update(learner, batch.state, batch.action, batch.reward,
                                       batch.next_state, batch.discount)
                policy.params = learner.params        # the players act with it from now on
                updates += 1
                step = population.progress()[0]      # agent steps stored, all games together
                if step // args.target_network_frequency > synced:   # every 1000 steps (CleanRL)
                    learner = soft_update(learner)
                    synced = step // args.target_network_frequency
                now = time.time()
                if updates == 1 or now - last_log >= args.log_every or step >= args.total_timesteps:
                    recent, shown = scores[shown:], len(scores)
                    if updates == 1:   # jit compiled the update for this one: no rate yet
                        line = f"progress: {step} agent steps, 1 update (compiled in {now - last_log:.1f} s)"
                    else:
                        seconds = now - last_log
                        line = (f"progress: {step} agent steps ({(step - last_step) / seconds:.0f}/s), "
                                f"{updates} updates ({(updates - last_updates) / seconds:.1f}/s)")
                    line += f", {len(recent)} games"
                    if recent:
                        line += f", mean score {np.mean(recent):.1f} (max {max(recent):.0f})"
                    print(line + f", loss {float(loss):.4f}, epsilon {stream.exploration:.3f}", flush=True)
                    last_log, last_step, last_updates = time.time(), step, updates
                if step >= args.total_timesteps:
                    break
    except KeyboardInterrupt:
        interrupted = True
    step = memory.num_steps_written   # every step stored, read once the games are stopped
    saved = ''
    try:
        if args.save:
            save_params(args.save, learner.params)
    except KeyboardInterrupt:   # a first signal now: raised once the file is written, if it was
        interrupted = True
    if args.save and os.path.exists(args.save):   # refused at the start if it existed
        saved = f"; parameters after {updates} updates saved to {args.save}"
    if interrupted:
        print(f"Interrupted: training stopped, environments closed after {step} agent "
              f"steps{saved}.", flush=True)
        return 130
    print(f"training done: {step} agent steps, {updates} updates, {len(scores)} games in "
          f"{time.time() - start:.0f} s{saved}", flush=True)
    return 0


def main(argv=None):
    args = parse_args(argv)
    # The first Ctrl-C or SIGTERM stops the training; the ones after it only print a line until
    # the parameters are saved.
    with stop_on_signals():
        try:
            return train(args)
        except KeyboardInterrupt:   # before the training started, or in its last lines
            saved = args.save and os.path.exists(args.save)   # refused at the start if it existed
            print(f"Interrupted: {f'the parameters are saved in {args.save}' if saved else 'nothing saved'}.",
                  flush=True)
            return 130


if __name__ == '__main__':
    sys.exit(main())
