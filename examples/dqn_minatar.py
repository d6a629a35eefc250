#!/usr/bin/env python
"""The MinAtar paper's DQN on this library's replay stream, in plain numpy (no TensorFlow).

    python examples/dqn_minatar.py --game breakout                    # the paper's 5M frames
    python examples/dqn_minatar.py --game space_invaders --frames 1000000 --returns returns.csv
    python examples/dqn_minatar.py --game breakout --prioritized --n-step 3   # PER + 3-step

MinAtar (Young & Tian, 2019, "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible
Reinforcement Learning Experiments", arXiv:1903.03176) has Atari-like games on a 10x10 grid with
one boolean channel per kind of object (``10 x 10 x C`` observations). The games, and the paper's
DQN agent, are small enough for a CPU: this script is that agent, with the replay memory, the
acting and the sampling of :class:`expreplay.ReplayStream`, and a Q-network written in numpy
(forward, backward and the optimizer below, ~80 lines), so that it needs nothing but numpy.

The set-up is the paper's, value by value as in the MinAtar repository's ``examples/dqn.py``
(the authors' DQN, PyTorch; "dqn.py" below):

- network: one 3x3 convolution, 16 filters, stride 1, no padding, ReLU; a 128-unit ReLU
  layer; a linear output per action (dqn.py ``QNetwork``); PyTorch's default initialisation
  (uniform in +-1/sqrt(fan_in), weights and biases), as dqn.py gets by not choosing one.
- replay memory 100,000 transitions, batch 32, one update per frame, target network copied
  every 1,000 updates, learning from frame 5,000 on after a uniformly random policy for those
  frames (``REPLAY_BUFFER_SIZE``, ``BATCH_SIZE``, ``TRAINING_FREQ``,
  ``TARGET_NETWORK_UPDATE_FREQ``, ``REPLAY_START_SIZE``).
- epsilon 1.0 -> 0.1 linearly over the 100,000 frames after the replay start, then 0.1
  (``EPSILON``, ``END_EPSILON``, ``FIRST_N_FRAMES``).
- centred RMSProp, step size 2.5e-4, squared-gradient smoothing 0.95, epsilon 0.01 added to the
  root (PyTorch's ``RMSprop(alpha=0.95, centered=True, eps=0.01)``, no momentum:
  ``STEP_SIZE``, ``SQUARED_GRAD_MOMENTUM``, ``MIN_SQUARED_GRAD``); Huber loss
  (``smooth_l1_loss``), gamma 0.99 (``GAMMA``), rewards unclipped, no frame stacking.
- 5M frames per run (``NUM_FRAMES``); the games' defaults: sticky actions with probability
  0.1 and difficulty ramping (``minatar.Environment``), all 6 actions (the ``-v0`` gymnasium
  ids; the repository's README says its results use the full action set).

What the paper reports is the return of the *training* episodes (epsilon-greedy), averaged over
a window of episodes and over 30 seeds (``examples/plot_return.py``); ``--returns`` writes every
training episode's ``frames,score`` for that (``examples/plot_minatar.py`` draws the curves).
``--eval-episodes`` plays greedy episodes at the end (``greedy mean score X``).

Progress: a ``progress:`` line every ``--log-every`` seconds: frames and their rate, updates,
the games finished since the last line and their mean score, epsilon. An update (batch 32:
forward and backward of the online network, forward of the target network, the optimizer)
costs ~2.4 ms of one CPU core in numpy, the env, acting and sampling ~0.3 ms more, so one run
makes ~350 frames/s on an idle core and the paper's 5M frames take ~4 hours; docs/minatar.md
has the curves and what they cost.

``--prioritized`` (proportional PER, alpha 0.6, beta 0.4 -> 1 over the run) and ``--n-step N``
train on the memory's n-step, prioritized batches and hand the |TD errors| back; they are not
the paper's set-up.
"""

import argparse
import csv
import os
import time
import warnings

# The learner's matrices are small: OpenBLAS's threads spin while they wait for each other, and
# on a machine whose other cores are busy a product then takes up to 30x longer. One thread,
# unless you set it; it must be set before numpy loads.
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')

GAMES = {'asterix': 'Asterix', 'breakout': 'Breakout', 'freeway': 'Freeway',
         'seaquest': 'Seaquest', 'space_invaders': 'SpaceInvaders'}


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` keeps the description's lines as written and shows every flag's default."""


def argument_parser(description=__doc__):
    """The agent's flags (the paper's values as defaults); dqn_minatar_tensorpack.py adds its own."""
    p = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter)
    p.add_argument('--game', choices=sorted(GAMES), default='breakout', help='the MinAtar game')
    p.add_argument('--seed', type=int, default=0, help='seeds the network, the sampling and the env')
    p.add_argument('--frames', type=int, default=5_000_000, help='environment steps, the fill included')
    p.add_argument('--memory-size', type=int, default=100_000, help='replay memory capacity')
    p.add_argument('--replay-start', type=int, default=5_000,
                   help='random-policy frames before the first update')
    p.add_argument('--batch-size', type=int, default=32, help='transitions per update')
    p.add_argument('--update-frequency', type=int, default=1,
                   help='frames per update (the paper: 1; the replay ratio is batch/this)')
    p.add_argument('--target-update', type=int, default=1_000,
                   help='copy the online network into the target network every N updates')
    p.add_argument('--exploration-frames', type=int, default=100_000,
                   help='frames after the replay start over which epsilon falls linearly from 1')
    p.add_argument('--final-exploration', type=float, default=0.1, help='epsilon after the decay')
    p.add_argument('--lr', type=float, default=2.5e-4, help='centred RMSProp step size')
    p.add_argument('--gamma', type=float, default=0.99, help='discount factor')
    p.add_argument('--prioritized', action='store_true', help='proportional prioritized replay')
    p.add_argument('--alpha', type=float, default=0.6, help='priority exponent (--prioritized)')
    p.add_argument('--beta', type=float, default=0.4,
                   help='importance-weight exponent at the start, annealed to 1 over --frames')
    p.add_argument('--weight-norm', choices=['memory', 'batch'], default='memory',
                   help="divide the importance weights by the memory's largest (the memory's own "
                        "weights, Schaul et al.) or by the batch's largest (--prioritized)")
    p.add_argument('--n-step', type=int, default=1, help='n-step returns')
    p.add_argument('--returns', help='write every training episode as a CSV row frames,score here')
    p.add_argument('--eval-episodes', type=int, default=0,
                   help='greedy episodes played by the final network (0: none)')
    p.add_argument('--log-every', type=float, default=30.0, help='seconds between progress lines')
    return p


def parse_args(argv=None):
    return argument_parser().parse_args(argv)


def describe(args):
    """One line naming the game and the settings, printed before anything else happens."""
    replay = (f"prioritized replay (alpha {args.alpha}, beta {args.beta} -> 1)" if args.prioritized
              else "uniform replay") + (f", {args.n_step}-step returns" if args.n_step > 1 else "")
    return (f"MinAtar {GAMES[args.game]}, seed {args.seed}: {args.frames:,} frames, memory "
            f"{args.memory_size:,}, batch {args.batch_size}, an update every {args.update_frequency} "
            f"frame(s) after {args.replay_start:,} random ones, target copied every "
            f"{args.target_update:,} updates, epsilon 1 -> {args.final_exploration} over "
            f"{args.exploration_frames:,} frames, step size {args.lr}, {replay}")


if __name__ == '__main__':
    # --help and bad arguments answer, and the run says what it does, before MinAtar loads (it
    # imports seaborn and pandas: seconds).
    _args = parse_args()
    print(f"{describe(_args)}; a progress line every {_args.log_every:g} s", flush=True)

import gymnasium as gym  # noqa: E402
import minatar.gym  # noqa: E402
import numpy as np  # noqa: E402

from expreplay import Population, ReplayMemory, ReplayStream, Sampling  # noqa: E402

minatar.gym.register_envs()


def make_env(game):
    # -v0: all 6 actions, as the paper's results (the -v1 ids have the minimal action sets);
    # gymnasium warns that a newer version exists, which is not news here.
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        return gym.make(f'MinAtar/{GAMES[game]}-v0')


def dense_init(rng, fan_in, shape):
    """PyTorch's default for Linear and Conv2d: weights and biases uniform in +-1/sqrt(fan_in)."""
    bound = 1.0 / np.sqrt(fan_in)
    return (rng.uniform(-bound, bound, shape).astype(np.float32),
            rng.uniform(-bound, bound, shape[-1]).astype(np.float32))


class QNetwork:
    """The paper's network: conv 3x3x16 (valid) -> ReLU -> 128 ReLU -> one Q-value per action.

    States are ``(n, 10, 10, C)`` (bool or numbers); the convolution is a matrix product over
    the 8x8 positions' 3x3xC patches (im2col), which is what makes numpy fast enough here.
    """

    def __init__(self, channels, num_actions, rng):
        self.w1, self.b1 = dense_init(rng, 9 * channels, (9 * channels, 16))
        self.w2, self.b2 = dense_init(rng, 8 * 8 * 16, (8 * 8 * 16, 128))
        self.w3, self.b3 = dense_init(rng, 128, (128, num_actions))

    @property
    def params(self):
        return [self.w1, self.b1, self.w2, self.b2, self.w3, self.b3]

    def copy_from(self, other):
        for mine, theirs in zip(self.params, other.params):
            mine[...] = theirs

    @staticmethod
    def patches(states):
        """The ``(n * 64, 9 * C)`` matrix of every position's 3x3xC neighbourhood."""
        x = np.asarray(states, np.float32)
        shifted = [x[:, i:i + 8, j:j + 8, :] for i in range(3) for j in range(3)]
        return np.concatenate(shifted, axis=-1).reshape(len(x) * 64, -1)

    def forward(self, states):
        """Q-values, and what backward() needs."""
        cols = self.patches(states)
        h1 = np.maximum(cols @ self.w1 + self.b1, 0).reshape(len(states), -1)
        h2 = np.maximum(h1 @ self.w2 + self.b2, 0)
        return h2 @ self.w3 + self.b3, (cols, h1, h2)

    def __call__(self, states):
        return self.forward(states)[0]

    def backward(self, dq, cache):
        """Gradients of the parameters, given d loss / d Q-values ``dq``."""
        cols, h1, h2 = cache
        dh2 = (dq @ self.w3.T) * (h2 > 0)
        dh1 = ((dh2 @ self.w2.T) * (h1 > 0)).reshape(len(cols), 16)
        return [cols.T @ dh1, dh1.sum(0), h1.T @ dh2, dh2.sum(0), h2.T @ dq, dq.sum(0)]


class CentredRMSProp:
    """PyTorch's ``RMSprop(centered=True)`` without momentum: eps is added to the root."""

    def __init__(self, params, lr, alpha=0.95, eps=0.01):
        self.params, self.lr, self.alpha, self.eps = params, lr, alpha, eps
        self.sq = [np.zeros_like(p) for p in params]      # running mean of g**2
        self.mean = [np.zeros_like(p) for p in params]    # running mean of g
        self.scratch = [np.zeros_like(p) for p in params]

    def step(self, grads):
        a = self.alpha
        # In place, through one scratch array per parameter: numpy temporaries of the big
        # layer's size would cost more than the arithmetic.
        for p, g, sq, mean, t in zip(self.params, grads, self.sq, self.mean, self.scratch):
            np.multiply(g, g, out=t)
            t *= 1 - a
            sq *= a
            sq += t                                        # sq = a sq + (1 - a) g^2
            mean *= a
            np.multiply(g, 1 - a, out=t)
            mean += t                                      # mean = a mean + (1 - a) g
            np.multiply(mean, mean, out=t)
            np.subtract(sq, t, out=t)
            np.sqrt(t, out=t)
            t += self.eps
            np.divide(g, t, out=t)
            t *= self.lr
            p -= t                                         # p -= lr g / (sqrt(sq - mean^2) + eps)


class DQNLearner:
    """Online and target networks, the Huber TD loss and its update."""

    def __init__(self, channels, num_actions, args, rng):
        self.online = QNetwork(channels, num_actions, rng)
        self.target = QNetwork(channels, num_actions, rng)
        self.target.copy_from(self.online)
        self.optimizer = CentredRMSProp(self.online.params, args.lr)
        self.target_update = args.target_update
        self.updates = 0

    def q_values(self, states):
        """The stream's predictor: states ``(n, 10, 10, C, 1)`` (one frame) -> Q ``(n, A)``."""
        return self.online(states[..., 0])

    def update(self, state, action, reward, next_state, discount, weights):
        """One step on ``reward + discount * max_a Q_target(next_state)``; returns |TD errors|."""
        q, cache = self.online.forward(state)
        target = reward + discount * self.target(next_state).max(1)
        rows = np.arange(len(action))
        td = q[rows, action] - target
        dq = np.zeros_like(q)   # d mean(weights * huber(td)) / dQ, on the taken actions only
        dq[rows, action] = weights * np.clip(td, -1.0, 1.0) / len(action)
        self.optimizer.step(self.online.backward(dq, cache))
        self.updates += 1
        if self.updates % self.target_update == 0:
            self.target.copy_from(self.online)
        return np.abs(td)


def unpack(batch, gamma):
    """(state, action, reward, next_state, discount, weights) from either kind of batch."""
    if hasattr(batch, 'discount'):   # n-step / prioritized SampleBatch
        return (batch.state[..., 0], batch.action, batch.reward, batch.next_state[..., 0],
                batch.discount, batch.weights)
    comb, action, reward, is_over = batch    # tensorpack's 4-list: frames t and t+1
    discount = np.where(is_over, 0.0, gamma).astype(np.float32)
    return comb[..., 0], action, reward, comb[..., 1], discount, np.ones_like(reward)


def epsilon(frame, args):
    """Uniformly random until the replay start, then 1 -> final over exploration_frames."""
    progress = max(0, frame - args.replay_start) / args.exploration_frames
    return max(args.final_exploration, 1.0 - (1.0 - args.final_exploration) * progress)


class EpisodeLog:
    """Every training episode as (frame at its end, score), for the curves and the progress line."""

    def __init__(self, path):
        self.frames, self.rows, self.shown = 0, [], 0
        self.file = open(path, 'w', newline='') if path else None
        self.writer = csv.writer(self.file) if path else None
        if self.writer:
            self.writer.writerow(['frames', 'score'])

    def __call__(self, record):   # the stream's on_episode_end (one player: one env's frames)
        self.frames += record.length
        self.rows.append((self.frames, record.score))
        if self.writer:
            self.writer.writerow([self.frames, record.score])
            self.file.flush()

    def recent(self):
        """The episodes since the last call."""
        rows, self.shown = self.rows[self.shown:], len(self.rows)
        return rows

    def close(self):
        if self.file:
            self.file.close()


def evaluate(q_values, game, episodes, seed, max_frames=10_000):
    """Scores of greedy episodes (argmax Q; the env keeps its sticky actions).

    An episode stops after ``max_frames``: a good Breakout player may never lose the ball.
    """
    env, scores = make_env(game), []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        score = 0.0
        for _ in range(max_frames):
            action = int(np.argmax(q_values(obs[None, ..., None])[0]))
            obs, reward, terminated, truncated, _ = env.step(action)
            score += reward
            if terminated or truncated:
                break
        scores.append(score)
    env.close()
    return np.array(scores)


def train(args):
    """Run the paper's DQN for ``args.frames`` frames; returns the learner and the episode log."""
    rng = np.random.default_rng(args.seed)
    env = make_env(args.game)
    channels, num_actions = env.observation_space.shape[-1], env.action_space.n
    env.close()
    learner = DQNLearner(channels, num_actions, args, rng)
    episodes = EpisodeLog(args.returns)
    stream = ReplayStream(
        ReplayMemory(args.memory_size, (10, 10, channels), 1, 'bool',
                     prioritized=args.prioritized, alpha=args.alpha),
        # The paper's one env, stepped inline between updates.
        Population(lambda: make_env(args.game), 1, learner.q_values, seed=args.seed,
                   on_episode_end=episodes),
        Sampling(args.batch_size, args.update_frequency, n_step=args.n_step, gamma=args.gamma,
                 seed=args.seed, weight_norm=args.weight_norm,
                 # beta: annealed to 1 over the run (batch k comes after k * update_frequency frames).
                 beta=(lambda k: min(1.0, args.beta + (1 - args.beta) * k * args.update_frequency / args.frames))
                 if args.prioritized else None),
        init_memory_size=args.replay_start, progress=False,
        # The paper alternates a frame and an update: drawn ahead, batches would let the env
        # run up to `prefetch` updates ahead of the learner's weights (and of --frames).
        prefetch=0)
    start = last_log = time.time()
    last_frames = 0
    with stream:   # closing joins every thread, also on Ctrl-C or an error
        for batch in stream:
            state, action, reward, next_state, discount, weights = unpack(batch, args.gamma)
            td = learner.update(state, action, reward, next_state, discount, weights)
            if args.prioritized:
                stream.update_priorities(batch.indices, td)
            # Frames in the memory now; the stream steps update_frequency more when the loop
            # asks for the next batch, with this epsilon.
            frames = args.replay_start + (learner.updates - 1) * args.update_frequency
            stream.exploration = epsilon(frames, args)
            now = time.time()
            if now - last_log >= args.log_every or frames >= args.frames:
                recent = [score for _, score in episodes.recent()]
                line = (f"progress: {frames} frames ({(frames - last_frames) / (now - last_log):.0f}/s), "
                        f"{learner.updates} updates, {len(recent)} games")
                if recent:
                    line += f", mean score {np.mean(recent):.2f} (max {max(recent):.0f})"
                print(line + f", epsilon {stream.exploration:.3f}", flush=True)
                last_log, last_frames = now, frames
            if frames >= args.frames:
                break
    episodes.close()
    print(f"training done: {frames} frames, {len(episodes.rows)} games in "
          f"{time.time() - start:.0f} s", flush=True)
    return learner, episodes


def main(argv=None):
    args = parse_args(argv)
    learner, _ = train(args)
    if args.eval_episodes:
        scores = evaluate(learner.q_values, args.game, args.eval_episodes, seed=10**6 + args.seed)
        print(f"greedy mean score {scores.mean():.2f} over {len(scores)} episodes")
        return scores


if __name__ == '__main__':
    main()
