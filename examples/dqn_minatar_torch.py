#!/usr/bin/env python
"""The MinAtar paper's DQN with a PyTorch learner on this library's replay stream, in one file.

    python examples/dqn_minatar_torch.py --game breakout                     # the paper's 5M frames
    python examples/dqn_minatar_torch.py --game space_invaders --frames 1000000 --returns returns.csv
    python examples/dqn_minatar_torch.py --game breakout --checkpoint-dir runs/breakout  # resumable
    python examples/dqn_minatar_torch.py --game breakout --players 4 --weights-every 8   # 4 envs

The agent is ``examples/dqn_minatar_jax.py``'s, the MinAtar authors' ``examples/dqn.py`` value
by value: a 3x3x16 convolution and a 128-unit layer (PyTorch's default initialisation), replay
memory 100k, batch 32, one update per frame, the target network copied every 1,000 updates,
5,000 random frames first, epsilon 1 -> 0.1 over the next 100k frames, centred RMSProp
(``RMSprop(lr=2.5e-4, alpha=0.95, centered=True, eps=0.01)``), Huber loss, gamma 0.99, sticky
actions, all 6 actions, 5M frames. It is written in CleanRL's manner: the flags (the ``Args``
block, documented once), the network, and the update inline in the training loop. What CleanRL's
``dqn.py`` keeps in stable-baselines3's ``ReplayBuffer`` and steps in its own loop (the env, the
epsilon-greedy action, ``rb.add``, ``rb.sample``) is :class:`expreplay.ReplayStream`'s here:
each ``next(stream)`` steps one frame and hands out one batch of numpy arrays.

The batch as tensors: ``torch.from_numpy`` wraps each field without a copy. That is safe to
hold: every batch's arrays are fresh objects that the stream never writes again (the
``SampleBatch`` docstring). ``batch.discount`` already holds ``gamma ** k`` and 0 after a
terminal step, so the target is ``reward + discount * max_a Q_target(next_state, a)``, where
CleanRL writes ``reward + gamma * max_a Q_target * (1 - done)``. A truncated episode (a time
limit) bootstraps: its discount is gamma, not 0. On a GPU (``--device cuda``) each field is
copied from pinned memory with ``non_blocking=True`` (docs/pytorch.md: what that costs and buys).

How the players get the weights (``--weights-every``). The players call ``GreedyPolicy`` with
states ``(n, 10, 10, C, 1)``; it runs a ``torch.no_grad()`` forward and returns the Q-values.
- ``--weights-every 0`` (the default): the forward reads the live ``q_network``, so an action
  uses the newest weights. With one player (the paper's, the default) the stream steps it inline
  in this loop's thread, between two updates: never while ``optimizer.step()`` runs. With
  several players the simulator threads run the forward while this thread may be in
  ``optimizer.step()``, which changes each parameter in place (PyTorch releases the GIL inside
  its ops). That is safe in what matters: no memory is freed or reshaped under the reader, the
  ``no_grad`` forward saves nothing for a backward (so autograd's in-place checks never fire),
  and grad mode is per thread (which is why the ``no_grad`` is inside the predictor, in the
  players' thread, and not around the loop). What it is not: atomic. A forward may read some
  parameters before the step and some after (one tensor even half-way), an action from a blend
  of two consecutive updates' weights: harmless for epsilon-greedy acting, but a run is then
  not reproducible from its seed.
- ``--weights-every N``: the players act with a copy of the network (``copy.deepcopy``, made
  in this thread between updates) that is replaced every N updates by one attribute store, so
  each forward sees one whole set of weights, 1 to N updates old (what a GPU learner, whose
  hand-over is a device-to-host copy, may want; docs/staleness_learning.md: what the age costs).

Threads: ``--threads`` sets PyTorch's intra-op threads (``torch.set_num_threads``; 1 by default
on a CPU: the network is small, and a second thread spins while the env, the acting and the
sampling use the other core). Players and staleness as in the JAX example: ``--players N``
steps N envs in the library's simulator threads, ``--staleness K`` lets K step requests be
pending (the stream's ``maximum_staleness``). That example also measures the two lags.

Checkpoints: ``--checkpoint-dir DIR`` saves, every ``--checkpoint-every`` frames and when the
run stops (Ctrl-C, or ``kill``'s SIGTERM; a second signal while it saves only prints a line),
the replay memory (``DIR/memory``, the library's checkpoint) and the learner (``DIR/learner.pt``:
the online and target networks, the optimizer's state, the frame and update counters), both at
the same frame: the memory's own count of the steps it stored. The same command resumes from
there: frames, epsilon, the returns file (rows after the checkpoint dropped) and the memory go
on; the envs start new episodes and the random draws after a resume are seeded from the seed
and the frame count (a continuation, not a bit-exact replay).

Progress: a first line naming the game and settings, a ``progress:`` line every ``--log-every``
seconds (frames and their rate, updates, games and their mean score, epsilon), a ``resources:``
line after the first minute and at the end, and ``training done: ...``. ``--returns`` appends
every training episode as ``frames,score``; ``--eval-episodes`` plays greedy episodes at the end.
"""

import argparse
import copy
import csv
import os
import threading
import time
import warnings

GAMES = {'asterix': 'Asterix', 'breakout': 'Breakout', 'freeway': 'Freeway',
         'seaquest': 'Seaquest', 'space_invaders': 'SpaceInvaders'}


def argument_parser():
    """Args: the paper's values as defaults (documented here once)."""
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
    p.add_argument('--players', type=int, default=1,
                   help="envs acting at once, in the simulator threads; 1: the paper's one env, "
                        "stepped inline by the learner's thread")
    p.add_argument('--staleness', type=int, default=None,
                   help="step requests that may be pending while the learner trains (the "
                        "stream's maximum_staleness); None: the stream's default")
    p.add_argument('--weights-every', type=int, default=0,
                   help="0: the players read the live network; N: they act with a copy "
                        "handed over every N updates (see 'How the players get the weights')")
    p.add_argument('--threads', type=int, default=1, help="PyTorch's intra-op threads")
    p.add_argument('--device', default='cpu', help="the learner's device (cpu, cuda, cuda:1, ...)")
    p.add_argument('--returns', help='append every training episode as a CSV row frames,score here')
    p.add_argument('--eval-episodes', type=int, default=0,
                   help='greedy episodes played by the final network (0: none)')
    p.add_argument('--checkpoint-dir', help='save here, and resume from here (see above)')
    p.add_argument('--checkpoint-every', type=int, default=250_000, help='frames between checkpoints')
    p.add_argument('--log-every', type=float, default=30.0, help='seconds between progress lines')
    return p


def parse_args(argv=None):
    """The flags, checked."""
    parser = argument_parser()
    args = parser.parse_args(argv)
    for name in ('players', 'threads', 'batch_size', 'target_update', 'frames'):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.weights_every < 0:
        parser.error(f"--weights-every must be 0 (live weights) or >= 1, got {args.weights_every}")
    return args


if __name__ == '__main__':
    _args = parse_args()   # --help and bad flags answer before PyTorch loads
    print(f"DQN (PyTorch) on MinAtar {GAMES[_args.game]}, {_args.frames} frames, seed "
          f"{_args.seed}: loading PyTorch and MinAtar...", flush=True)
    # Read by PyTorch's OpenMP pool when it loads (set_num_threads below sets it too).
    os.environ.setdefault('OMP_NUM_THREADS', str(_args.threads))

from expreplay import require_extra  # noqa: E402

require_extra('examples/dqn_minatar_torch.py', 'minatar')
require_extra('examples/dqn_minatar_torch.py', 'torch')

import gymnasium as gym  # noqa: E402
import minatar.gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from expreplay import Population, ReplayMemory, ReplayStream, Sampling  # noqa: E402
from expreplay.interrupts import stop_on_signals  # noqa: E402

minatar.gym.register_envs()


def make_env(game):
    # -v0: all 6 actions, as the paper (the -v1 ids have the minimal action sets).
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        return gym.make(f'MinAtar/{GAMES[game]}-v0')


def make_player(game):
    """A player's env (the tests wrap it to inject a defect into what is stored)."""
    return make_env(game)


class QNetwork(nn.Module):
    """Conv 3x3x16 (valid) -> ReLU -> 128 ReLU -> one Q-value per action (the paper's network;
    PyTorch's default initialisation is the paper's). Takes the stream's channels-last states
    ``(n, 10, 10, C)``, any dtype, and puts the channels first itself: the one place the layout
    is handled, for the batches and the players alike."""

    def __init__(self, channels, num_actions):
        super().__init__()
        self.conv = nn.Conv2d(channels, 16, kernel_size=3)
        self.hidden = nn.Linear(8 * 8 * 16, 128)
        self.out = nn.Linear(128, num_actions)

    def forward(self, x):
        x = x.permute(0, 3, 1, 2).float()
        x = F.relu(self.conv(x)).flatten(1)
        return self.out(F.relu(self.hidden(x)))


def to_tensor(array, device):
    """A batch field as a tensor on ``device``: zero-copy on the CPU (the array is the batch's
    own, never written again); for a GPU, pinned and copied without blocking this thread."""
    t = torch.from_numpy(array)
    if device.type == 'cpu':
        return t
    return t.pin_memory().to(device, non_blocking=True)


class GreedyPolicy:
    """The players' Q-function: a ``no_grad`` forward of ``network`` (the live one, or the copy
    last handed over by ``load``); states ``(n, 10, 10, C, 1)`` -> Q-values ``(n, A)``, a CPU
    tensor the players take as it is. The module docstring says when each is safe."""

    def __init__(self, network, device):
        self.network, self.device = network, device

    def load(self, network):
        """Act with a copy of ``network`` from now on (one attribute store: atomic for the
        players' threads)."""
        self.network = copy.deepcopy(network)

    def __call__(self, states):
        with torch.no_grad():   # grad mode is per thread: set here, in the players' thread
            q = self.network(torch.from_numpy(states[..., 0]).to(self.device))
        return q.cpu()


def epsilon(frame, args):
    """Uniformly random until the replay start, then 1 -> final over exploration_frames."""
    progress = max(0, frame - args.replay_start) / args.exploration_frames
    return max(args.final_exploration, 1.0 - (1.0 - args.final_exploration) * progress)


class EpisodeLog:
    """Every training episode as (frame at its end, score): the returns file and the progress
    line. A row's frame is the memory's count of the steps stored when the episode's last step
    is in it; with several players episodes end in the simulator threads, hence the lock."""

    def __init__(self, path, memory):
        self.path, self.memory = path, memory
        self.rows, self.shown, self.lock = [], 0, threading.Lock()
        self.file = self.writer = None

    def open(self):
        """Start the returns file, keeping a resumed run's rows up to the memory's count."""
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

    def __call__(self, record):   # the population's on_episode_end, once the episode is stored
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


def resources():
    """Threads, open files and resident memory of this process (Linux; elsewhere -1)."""
    status = {}
    if os.path.exists('/proc/self/status'):
        with open('/proc/self/status') as f:
            status = dict(line.split(':', 1) for line in f if ':' in line)
    rss = int(status.get('VmRSS', '-1024 kB').split()[0]) // 1024
    files = len(os.listdir('/proc/self/fd')) if os.path.isdir('/proc/self/fd') else -1
    return (f"resources: threads {threading.active_count()} Python, "
            f"{int(status.get('Threads', '-1'))} in all, open files {files}, resident {rss} MB")


def save_learner(path, learner, frames, updates):
    """The networks, the optimizer and the counters, replaced atomically: a save cut short (a
    first Ctrl-C arriving in it) leaves the previous file whole."""
    q_network, target_network, optimizer = learner
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    tmp = path + '.tmp'
    torch.save({'online': q_network.state_dict(), 'target': target_network.state_dict(),
                'optimizer': optimizer.state_dict(), 'frames': frames, 'updates': updates}, tmp)
    os.replace(tmp, path)


def saved_frame(path):
    """The frame of the learner saved at ``path`` (None: no file, or no path)."""
    if not path or not os.path.exists(path):
        return None
    return int(torch.load(path, weights_only=True)['frames'])


class Stopped(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the training once it had started; ``frames``: the frame the
    memory and the learner were saved at, None if they were not (no checkpoint dir)."""

    def __init__(self, frames):
        super().__init__(frames)
        self.frames = frames


def train(args):
    """The run; returns (the online network, the episode log). Raises :class:`Stopped` on
    Ctrl-C or SIGTERM, once the memory and the learner are saved."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    env = make_env(args.game)
    channels, num_actions = env.observation_space.shape[-1], env.action_space.n
    env.close()
    q_network = QNetwork(channels, num_actions).to(device)
    target_network = copy.deepcopy(q_network)
    optimizer = torch.optim.RMSprop(q_network.parameters(), lr=args.lr, alpha=0.95,
                                    centered=True, eps=0.01)

    # Resume: the learner's file and the memory's checkpoint, saved at the same frame.
    learner_frames, updates = None, 0
    learner_file = args.checkpoint_dir and os.path.join(args.checkpoint_dir, 'learner.pt')
    if learner_file and os.path.exists(learner_file):
        saved = torch.load(learner_file, map_location=device, weights_only=True)
        q_network.load_state_dict(saved['online'])
        target_network.load_state_dict(saved['target'])
        optimizer.load_state_dict(saved['optimizer'])
        learner_frames, updates = saved['frames'], saved['updates']
    resumed_updates = updates
    seed = args.seed + (learner_frames or 0)   # the draws after a resume: new, but reproducible

    policy = GreedyPolicy(q_network, device)
    if args.weights_every:
        policy.load(q_network)
    memory = ReplayMemory(args.memory_size, (10, 10, channels), 1, 'bool',
                          prioritized=args.prioritized)
    episodes = EpisodeLog(args.returns, memory)
    stream = ReplayStream(
        memory,
        Population(lambda: make_player(args.game), args.players, policy,
                   maximum_staleness=args.staleness, seed=seed, on_episode_end=episodes),
        # One update per frame: a batch after each frame stored.
        Sampling(args.batch_size, update_frequency=1, n_step=args.n_step, gamma=args.gamma,
                 seed=seed, beta=(lambda k: min(1.0, 0.4 + 0.6 * (resumed_updates + k) / args.frames))
                 if args.prioritized else None),
        init_memory_size=args.replay_start, progress=False,
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

    print(f"DQN (PyTorch {torch.__version__}) on MinAtar {GAMES[args.game]}: {args.frames} frames, "
          f"seed {args.seed}, {args.players} player{'s' if args.players > 1 else ''}, "
          f"{device} learner, {args.threads} thread{'s' if args.threads > 1 else ''}, weights "
          + (f"handed over every {args.weights_every} updates" if args.weights_every else "live")
          + "; " + (f"{len(memory)} transitions in the memory" if stream.resumed else
                    f"filling {args.replay_start} frames at random first"), flush=True)
    start = last_log = time.time()
    last_frames, soak_shown = frames, False
    every = args.checkpoint_every
    next_save = (frames // every + 1) * every
    try:
        try:
            with stream:   # closing stops the players, joins every thread and saves the memory
                for batch in stream:   # one frame stepped (with the weights so far), a batch drawn
                    # The DQN update, inline. discount: gamma ** k, 0 after a terminal step.
                    state = to_tensor(batch.state[..., 0], device)
                    next_state = to_tensor(batch.next_state[..., 0], device)
                    action = to_tensor(batch.action, device).long()
                    reward = to_tensor(batch.reward, device)
                    discount = to_tensor(batch.discount, device)
                    with torch.no_grad():
                        target = reward + discount * target_network(next_state).max(1).values
                    q = q_network(state).gather(1, action[:, None])[:, 0]
                    if args.prioritized:   # importance weights (all 1 when uniform: skipped)
                        loss = (to_tensor(batch.weights, device)
                                * F.smooth_l1_loss(q, target, reduction='none')).mean()
                    else:
                        loss = F.smooth_l1_loss(q, target)   # the mean fused: ~3% of an update
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    updates += 1
                    if args.prioritized:
                        stream.update_priorities(batch.indices, (q - target).abs().detach().cpu().numpy())
                    if updates % args.target_update == 0:
                        target_network.load_state_dict(q_network.state_dict())
                    if args.weights_every and updates % args.weights_every == 0:
                        policy.load(q_network)

                    stored, queued = stream.population.progress()
                    last = resumed_frames + stored + queued >= args.frames   # no step past --frames
                    if last:
                        stream.population.wait_idle()   # the last requests stored
                    frames = memory.num_steps_written
                    now = time.time()
                    if now - last_log >= args.log_every or last:
                        scores = episodes.recent()
                        rate = (frames - last_frames) / max(now - last_log, 1e-9)
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
                        saved_at = memory.num_steps_written
                        save_learner(learner_file, (q_network, target_network, optimizer),
                                     saved_at, updates)
                        next_save = (saved_at // every + 1) * every
                    if last:
                        break
        finally:
            # The stream is closed: the players are stopped and the memory is saved, at its
            # count of steps stored; the learner is saved at that frame too.
            frames = memory.num_steps_written
            episodes.close()
            if learner_file and stream.closed:
                save_learner(learner_file, (q_network, target_network, optimizer), frames, updates)
        print(resources(), flush=True)
        print(f"training done: {frames} frames, {len(episodes.rows)} games in "
              f"{time.time() - start:.0f} s", flush=True)
    except KeyboardInterrupt:
        # Said saved only if the learner's file holds this frame (the memory saved at it).
        raise Stopped(frames if saved_frame(learner_file) == frames else None) from None
    return q_network, episodes


def evaluate(q_network, game, episodes, seed, max_frames=10_000):
    """Scores of greedy episodes (argmax Q; the env keeps its sticky actions)."""
    device = next(q_network.parameters()).device
    env, scores = make_env(game), []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        score = 0.0
        for _ in range(max_frames):
            with torch.no_grad():
                action = int(q_network(torch.from_numpy(obs[None]).to(device)).argmax(1)[0])
            obs, reward, terminated, truncated, _ = env.step(action)
            score += reward
            if terminated or truncated:
                break
        scores.append(score)
    env.close()
    return np.array(scores)


def main(argv=None):
    args = parse_args(argv)
    # The first Ctrl-C or SIGTERM stops the run as Ctrl-C does; the ones after it only print a
    # line until the saves are done.
    with stop_on_signals():
        try:
            q_network, _ = train(args)
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
                scores = evaluate(q_network, args.game, args.eval_episodes, seed=10**6 + args.seed)
            except KeyboardInterrupt:
                print("stopped during the greedy evaluation", flush=True)
                return None
            print(f"greedy mean score {scores.mean():.2f} over {len(scores)} episodes", flush=True)
            return scores


if __name__ == '__main__':
    main()
