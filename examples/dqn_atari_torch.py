#!/usr/bin/env python
"""Double DQN on Atari in PyTorch, fed by this library's replay stream, in one file.

    python examples/dqn_atari_torch.py                       # Breakout, CleanRL's set-up (a GPU)
    python examples/dqn_atari_torch.py --game pong --save pong.pt
    python examples/dqn_atari_torch.py --buffer-size 100000 --learning-starts 5000 --log-every 10
                                                             # on a CPU: trains within a minute

``examples/dqn_atari_jax.py`` with a PyTorch learner, flag for flag: CleanRL's ``dqn_atari.py``
set-up (Adam 1e-4, a 1M-transition memory, batch 32, one update per 4 agent steps, the target
replaced every 1,000 agent steps, epsilon 1 -> 0.01 over the first 10% of 10M steps, 80,000
random steps first, the mean squared TD error on sign-clipped rewards, the Nature CNN on 84x84
grayscale frames, 4 per state), with the Double-DQN target ``sign(r) + discount *
Q_target(s', argmax_a Q_online(s', a))``. The players are ale-py's C++ vector env (its threads
step ``--num-envs`` games without Python's lock and preprocess them); the memory stores each
frame once and stacks the 4 itself (a 1M memory: ~7 GB, where stable-baselines3's buffer
holds each stacked state twice: docs/pytorch.md measures both). That docstring says what the
engine and the stream change against CleanRL's wrappers.

PyTorch's part, in CleanRL's manner: the flags, the network (``QNetwork``, PyTorch's default
initialisation), and the update inline in the loop. The batch's fields are wrapped by
``torch.from_numpy`` (no copy; on a GPU, pinned and copied without blocking), the states go
to the device as uint8 and are scaled there; ``discount`` is gamma, or 0 where the training
episode ended (a lost life included), so the target needs no ``(1 - done)``. The players act
through a ``torch.no_grad()`` forward of the live network (``GreedyPolicy``): with one vector
env the stream steps it in the loop's thread, between updates, never while the optimizer
steps (docs/pytorch.md: thread safety with more players). ``--threads`` sets PyTorch's
intra-op threads (on a CPU the update is the work: both cores by default).

Progress, stops and saving as the JAX example: a ``progress:`` line at the first update and
every ``--log-every`` seconds; Ctrl-C or SIGTERM stops the run cleanly (the stream closes, its
threads are joined, the games closed, the network saved if ``--save`` was given; a second signal
while it saves only prints a line); ``--save PATH`` writes the online network's ``state_dict``
(``torch.save``, written whole or not at all; ``QNetwork(n).load_state_dict(torch.load(PATH))``);
an existing file is refused, never overwritten.
"""

import argparse
import os
import sys
import time


def parse_args(argv=None):
    """Args: CleanRL's values as defaults (documented here once)."""
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
    p.add_argument('--target-network-frequency', type=int, default=1000,
                   help='agent steps between copies of the online network into the target')
    p.add_argument('--batch-size', type=int, default=32, help='transitions per update')
    p.add_argument('--start-e', type=float, default=1.0, help='epsilon at the first step')
    p.add_argument('--end-e', type=float, default=0.01, help='epsilon at the end of the decay')
    p.add_argument('--exploration-fraction', type=float, default=0.10,
                   help='share of --total-timesteps over which epsilon falls from --start-e to --end-e')
    p.add_argument('--learning-starts', type=int, default=80_000,
                   help='uniformly random agent steps stored before the first update')
    p.add_argument('--train-frequency', type=int, default=4, help='agent steps per update')
    p.add_argument('--threads', type=int, default=None,
                   help="PyTorch's intra-op threads (None: PyTorch's default, the cores)")
    p.add_argument('--device', default='cpu', help="the learner's device (cpu, cuda, ...)")
    p.add_argument('--log-every', type=float, default=30.0, help='seconds between progress lines')
    p.add_argument('--save', metavar='PATH', help="write the online network's state_dict here at the end")
    args = p.parse_args(argv)
    if args.save and os.path.exists(args.save):
        p.error(f"--save {args.save} exists: give a new path (a saved file is never overwritten)")
    if args.save and not os.path.isdir(os.path.dirname(os.path.abspath(args.save))):
        p.error(f"--save {args.save}: its directory does not exist")
    if args.learning_starts < args.batch_size or args.learning_starts > args.buffer_size:
        p.error(f"--learning-starts ({args.learning_starts}) must be between --batch-size "
                f"({args.batch_size}) and --buffer-size ({args.buffer_size})")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    return args


if __name__ == '__main__':
    parse_args()   # --help and bad flags answer before PyTorch and ale-py load (seconds)

from expreplay import require_extra  # noqa: E402

require_extra('examples/dqn_atari_torch.py', 'atari')
require_extra('examples/dqn_atari_torch.py', 'torch')

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
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
    """The Nature CNN: states ``(n, 84, 84, 4)`` uint8, frames last (the stream's layout, for
    the batches and the players alike) -> Q-values ``(n, actions)``."""

    def __init__(self, num_actions):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(HISTORY, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(),
            nn.Linear(512, num_actions))

    def forward(self, x):
        return self.net(x.permute(0, 3, 1, 2).float() / 255.0)


def to_tensor(array, device):
    """A batch field on ``device``: zero-copy on the CPU; for a GPU, pinned and copied without
    blocking (the stored dtype: uint8 frames are a quarter of float32's bytes)."""
    t = torch.from_numpy(array)
    return t if device.type == 'cpu' else t.pin_memory().to(device, non_blocking=True)


class GreedyPolicy:
    """The players' Q-function: a ``no_grad`` forward of the live network (grad mode is per
    thread: set here, in the thread that acts), Q-values as a CPU tensor."""

    def __init__(self, network, device):
        self.network, self.device = network, device

    def __call__(self, states):
        with torch.no_grad():
            return self.network(torch.from_numpy(states).to(self.device)).cpu()


def save_network(path, network):
    """Write the network's state_dict to ``path`` whole (written aside, then linked in), never
    over a file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        torch.save(network.state_dict(), tmp)
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
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    probe = make_players(args, num_envs=1)
    num_actions = int(probe.single_action_space.n)
    probe.close()
    q_network = QNetwork(num_actions).to(device)
    target_network = QNetwork(num_actions).to(device)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    scores = []   # every finished game's score (appended from the acting thread: list.append is atomic)
    population = Population(
        lambda: make_players(args), 1, GreedyPolicy(q_network, device), seed=args.seed,
        # CleanRL's epsilon, given once as a schedule of the agent steps stored.
        exploration=lambda steps: epsilon(steps, args),
        on_episode_end=lambda record: scores.append(record.score),
        runner=RunnerSettings(life_loss_terminal=True))
    memory = ReplayMemory(args.buffer_size, (84, 84), history_len=HISTORY, dtype='uint8')
    stream = ReplayStream(
        memory, population,
        Sampling(args.batch_size, update_frequency=args.train_frequency, gamma=args.gamma,
                 seed=args.seed),
        init_memory_size=args.learning_starts, prefetch=0, progress=True)
    print(f"{args.game}: {num_actions} actions, {args.num_envs} games, PyTorch {torch.__version__} "
          f"on {device}; {args.learning_starts} steps before the first update, then one per "
          f"{args.train_frequency} steps", flush=True)
    step = updates = 0
    loss = None
    interrupted = False
    start = time.time()
    try:
        with stream:   # closing joins every thread and closes the games, also on Ctrl-C
            stream.start()   # fills the memory with the first learning_starts steps
            step = population.progress()[0]
            synced = step // args.target_network_frequency   # target copies so far
            last_log, last_step, last_updates, shown = time.time(), step, 0, 0
            for batch in stream:
                state, next_state = to_tensor(batch.state, device), to_tensor(batch.next_state, device)
                action = to_tensor(batch.action, device).long()
                reward = to_tensor(batch.reward, device).sign()     # CleanRL's ClipRewardEnv, in the loss
                discount = to_tensor(batch.discount, device)        # gamma, 0 after an episode's end
                with torch.no_grad():   # Double DQN: the online network picks, the target values
                    next_action = q_network(next_state).argmax(1, keepdim=True)
                    target = reward + discount * target_network(next_state).gather(1, next_action)[:, 0]
                q = q_network(state).gather(1, action[:, None])[:, 0]
                loss = F.mse_loss(q, target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                updates += 1
                step = population.progress()[0]      # agent steps stored, all games together
                if step // args.target_network_frequency > synced:   # every 1000 steps (CleanRL)
                    target_network.load_state_dict(q_network.state_dict())
                    synced = step // args.target_network_frequency
                now = time.time()
                if updates == 1 or now - last_log >= args.log_every or step >= args.total_timesteps:
                    recent, shown = scores[shown:], len(scores)
                    seconds = max(now - last_log, 1e-9)
                    line = (f"progress: {step} agent steps ({(step - last_step) / seconds:.0f}/s), "
                            f"{updates} updates ({(updates - last_updates) / seconds:.1f}/s)")
                    line += f", {len(recent)} games"
                    if recent:
                        line += f", mean score {np.mean(recent):.1f} (max {max(recent):.0f})"
                    print(line + f", loss {loss.item():.4f}, epsilon {stream.exploration:.3f}", flush=True)
                    last_log, last_step, last_updates = time.time(), step, updates
                if step >= args.total_timesteps:
                    break
    except KeyboardInterrupt:
        interrupted = True
    step = memory.num_steps_written   # every step stored, read once the games are stopped
    saved = ''
    try:
        if args.save:
            save_network(args.save, q_network)
    except KeyboardInterrupt:   # a first signal now: raised once the file is written, if it was
        interrupted = True
    if args.save and os.path.exists(args.save):   # refused at the start if it existed
        saved = f"; the network after {updates} updates saved to {args.save}"
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
    # the network is saved.
    with stop_on_signals():
        try:
            return train(args)
        except KeyboardInterrupt:   # before the training started, or in its last lines
            saved = args.save and os.path.exists(args.save)
            print(f"Interrupted: {f'the network is saved in {args.save}' if saved else 'nothing saved'}.",
                  flush=True)
            return 130


if __name__ == '__main__':
    sys.exit(main())
