#!/usr/bin/env python
"""A PyTorch DQN on this library's stream against the same learner on stable-baselines3's buffer.

    python benchmarks/bench_torch.py                         # all three parts, 2 rounds
    python benchmarks/bench_torch.py --part learner --rounds 3 --frames 25000
    python benchmarks/bench_torch.py --part memory --steps 50000
    python benchmarks/bench_torch.py --part learning --seeds 0 1   # long: not in all (~11 min)

``learner``: MinAtar Breakout, the paper's DQN (``examples/dqn_minatar_torch.py``'s network,
centred RMSProp and Huber update, one update per frame, batch 32, the target copied every
1,000 updates, epsilon 1 -> 0.1 over 100k frames after the fill) for ``--frames`` frames of
which ``--replay-start`` random first, one torch thread, seeds 0, 1, ... per round:

- ``expreplay``: the example's own ``train`` (the stream steps the env inline, draws the
  batches; the players act with a ``no_grad`` forward of the live network).
- ``sb3``: the same network, optimizer and update in the loop CleanRL's ``dqn.py`` writes: the
  script steps the env, acts epsilon-greedily with a ``no_grad`` forward, ``ReplayBuffer.add``,
  ``ReplayBuffer.sample`` (which returns torch tensors), and the target ``rewards + gamma *
  max Q_target * (1 - dones)``; the buffer without ``optimize_memory_usage`` (CleanRL's).

Each run is a fresh process; the contestants alternate within a round, rounds one after the
other; printed: per run, frames/s and CPU ms per frame (the process's user + system time over
the run's frames, fill included), then the medians and their ratio.

``budget``: where a frame's time goes, for a GPU learner's case: the replay side of a frame
(the env step, the acting with a ``no_grad`` forward at epsilon 0.1, the store, the draw of a
batch of 32 as tensors: ``next(stream)`` and ``torch.from_numpy``, or CleanRL's loop with SB3's
``add`` and ``sample``) and, for the stream's contestant, the update alone on batches drawn
beforehand; ms per frame (wall and CPU), after a 5,000-frame fill and 1,000 frames of warm-up.
On a GPU the update leaves the CPU; the replay side is what stays.

``memory``: resident memory per stored step of an Atari-size memory (84x84 uint8 frames, 4
stacked; ``--steps`` random frames written, episodes of 1,000 steps), each in a fresh process:
expreplay's ``ReplayMemory`` (each frame once), SB3's ``ReplayBuffer`` (each stacked state
twice: observation and next observation) and the same with ``optimize_memory_usage=True``
(next observations read from the next slot). RSS growth over the writes, divided by the steps;
then the median time of ``sample(32)`` as torch tensors (expreplay: ``torch.from_numpy`` of
each field; SB3: its ``sample``, which builds the tensors).

``learning``: learning at equal frames, the two loops side by side. The same learner, flags and
seeds both ways, on the short Breakout run of the example's CI learning bar
(``tests/examples/test_dqn_minatar_torch.py``'s ``CI_ARGS``: 60k frames, a 30k memory learning
from frame 1,000, epsilon 1 -> 0.1 over 5k frames, the target copied every 252 updates, step
size 1e-3, one update per frame; ``--frames`` and ``--replay-start`` override its two), one
fresh process per run, one run at a time, the contestants alternating per seed. After each
run the trained network plays 100 greedy episodes through the example's own ``evaluate`` (the
CI bar's measure, its seeds ``10**6 + seed``), the same function for both; printed: per run and
per contestant's mean over the seeds, the greedy mean, the mean return of the last 100
training episodes, the training's wall seconds and frames/s. The SB3 loop seeds numpy's global
generator, as CleanRL does (``ReplayBuffer.sample`` draws from it): each run, both ways, is the
same from its seed.

Every part prints its command line and the machine first (platform, CPU, load average, Python,
torch and SB3 versions).

Needs the torch extra and ``pip install stable-baselines3`` (not in any extra: a measurement
only). Pause other work on the machine first: the figures are CPU times and rates.
"""

import argparse
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, 'examples')

# The learning part's run: the short Breakout run of the example's CI learning bar, flag by flag
# (tests/examples/test_dqn_minatar_torch.py: CI_ARGS, and EVAL_EPISODES greedy episodes).
LEARNING_ARGS = ['--game', 'breakout', '--frames', '60000', '--replay-start', '1000',
                 '--memory-size', '30000', '--exploration-frames', '5000', '--target-update', '252',
                 '--lr', '1e-3', '--log-every', '1e9', '--eval-episodes', '100']

LEARNER = r'''
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
contestant, flags = sys.argv[2], sys.argv[3:]   # flags: the example's, the same for both contestants
import numpy as np, torch
import torch.nn.functional as F
import dqn_minatar_torch as ex

args = ex.parse_args(flags)
frames, replay_start, seed = args.frames, args.replay_start, args.seed

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

def sb3_run():
    """The same learner in CleanRL's dqn.py loop, on stable-baselines3's ReplayBuffer; returns
    (the online network, every training episode's score)."""
    from stable_baselines3.common.buffers import ReplayBuffer
    torch.set_num_threads(args.threads)
    torch.manual_seed(seed)
    np.random.seed(seed)   # ReplayBuffer.sample draws from numpy's global generator (CleanRL seeds it)
    env = ex.make_env(args.game)
    channels, num_actions = env.observation_space.shape[-1], env.action_space.n
    q_network = ex.QNetwork(channels, num_actions)
    target_network = ex.QNetwork(channels, num_actions)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.RMSprop(q_network.parameters(), lr=args.lr, alpha=0.95, centered=True, eps=0.01)
    rb = ReplayBuffer(args.memory_size, env.observation_space, env.action_space, device='cpu',
                      handle_timeout_termination=False)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    updates, score, scores = 0, 0.0, []
    for frame in range(frames):
        if rng.random() < ex.epsilon(frame, args):
            action = int(rng.integers(num_actions))
        else:
            with torch.no_grad():
                action = int(q_network(torch.from_numpy(obs[None])).argmax(1)[0])
        next_obs, reward, terminated, truncated, info = env.step(action)
        rb.add(obs[None], next_obs[None], np.array([action]), np.array([reward]),
               np.array([terminated]), [info])
        obs = next_obs
        score += reward
        if terminated or truncated:
            obs, _ = env.reset()
            scores.append(score)
            score = 0.0
        if frame + 1 >= replay_start:
            data = rb.sample(args.batch_size)
            with torch.no_grad():
                target_max = target_network(data.next_observations).max(1).values
                target = data.rewards.flatten() + args.gamma * target_max * (1 - data.dones.flatten())
            q = q_network(data.observations).gather(1, data.actions).squeeze(1)
            loss = F.smooth_l1_loss(q, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            updates += 1
            if updates % args.target_update == 0:
                target_network.load_state_dict(q_network.state_dict())
    env.close()
    return q_network, scores

start, cpu0 = time.perf_counter(), cpu()
if contestant == 'expreplay':
    q_network, episodes = ex.train(args)
    scores = [score for _, score in episodes.rows]
else:
    q_network, scores = sb3_run()
wall, used = time.perf_counter() - start, cpu() - cpu0
result = {'fps': frames / wall, 'cpu_ms': 1000 * used / frames, 'wall': wall, 'games': len(scores),
          'last100': float(np.mean(scores[-100:])) if scores else float('nan')}
if args.eval_episodes:
    # The example's evaluation, as its main (and so the CI bar) runs it: one function for both.
    start = time.perf_counter()
    greedy = ex.evaluate(q_network, args.game, args.eval_episodes, seed=10**6 + seed)
    result.update(greedy=float(greedy.mean()), eval_episodes=len(greedy),
                  eval_wall=time.perf_counter() - start)
print('RESULT ' + json.dumps(result))
'''

MEMORY = r'''
import json, sys, time
import numpy as np, torch
contestant, steps = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
import gymnasium as gym
from expreplay import ReplayMemory
from stable_baselines3.common.buffers import ReplayBuffer   # imported before the RSS is read

def rss():
    with open('/proc/self/status') as f:
        return int(next(l for l in f if l.startswith('VmRSS')).split()[1]) * 1024

rng = np.random.default_rng(0)
frames = rng.integers(0, 256, (64, 84, 84), dtype=np.uint8)   # reused: the writes, not the draws, are measured
before = rss()
if contestant == 'expreplay':
    memory = ReplayMemory(steps, (84, 84), 4, 'uint8')
    w = memory.new_writer()
    for t in range(steps):
        if t % 1000 == 0:
            w.start_episode(frames[t % 64])
        w.add_step(t % 6, 1.0, frames[(t + 1) % 64], terminated=t % 1000 == 999)
    def sample():
        b = memory.sample(32)
        return [torch.from_numpy(x) for x in b[:6]]
else:
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    rb = ReplayBuffer(steps, space, gym.spaces.Discrete(6), device='cpu',
                      optimize_memory_usage=contestant == 'sb3-optimized',
                      handle_timeout_termination=False)
    stack = np.stack([frames[k] for k in range(4)])[None]
    for t in range(steps):
        nxt = np.concatenate([stack[:, 1:], frames[(t + 4) % 64][None, None]], axis=1)
        rb.add(stack, nxt, np.array([t % 6]), np.array([1.0]), np.array([t % 1000 == 999]), [{}])
        stack = nxt
    def sample():
        return rb.sample(32)
after = rss()
for _ in range(50):
    sample()
times = []
for _ in range(500):
    start = time.perf_counter()
    sample()
    times.append(time.perf_counter() - start)
print('RESULT ' + json.dumps({'bytes_per_step': (after - before) / steps,
                              'sample_ms': 1000 * float(np.median(times))}))
'''


BUDGET = r'''
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
contestant, frames = sys.argv[2], int(sys.argv[3])
import numpy as np, torch
import torch.nn.functional as F
import dqn_minatar_torch as ex
from expreplay import Population, ReplayMemory, ReplayStream, Sampling
from stable_baselines3.common.buffers import ReplayBuffer
torch.set_num_threads(1)
torch.manual_seed(0)

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

env = ex.make_env('breakout')
channels, num_actions = env.observation_space.shape[-1], env.action_space.n
net, target = ex.QNetwork(channels, num_actions), ex.QNetwork(channels, num_actions)
optimizer = torch.optim.RMSprop(net.parameters(), lr=2.5e-4, alpha=0.95, centered=True, eps=0.01)
EPSILON = 0.1   # the paper's after its decay: nine frames in ten act greedily

def timed(step, n):
    start, cpu0 = time.perf_counter(), cpu()
    for i in range(n):
        step(i)
    return 1000 * (time.perf_counter() - start) / n, 1000 * (cpu() - cpu0) / n

if contestant == 'expreplay':
    # The replay side of a frame: env step, acting (a no_grad forward), store, draw, as tensors.
    stream = ReplayStream(ReplayMemory(100_000, (10, 10, channels), 1, 'bool'),
                          Population(lambda: ex.make_env('breakout'), 1, ex.GreedyPolicy(net, torch.device('cpu')),
                                     seed=0, exploration=EPSILON),
                          Sampling(32, update_frequency=1, seed=0), init_memory_size=5_000, progress=False)
    with stream:
        batches = iter(stream)
        def replay(i):
            b = next(batches)
            return [torch.from_numpy(x) for x in (b.state[..., 0], b.action, b.reward, b.next_state[..., 0], b.discount)]
        timed(replay, 1000)
        wall, used = timed(replay, frames)
        drawn = [next(batches) for _ in range(64)]
    # The update alone, on batches drawn beforehand.
    data = [[torch.from_numpy(x) for x in (b.state[..., 0], b.action, b.reward, b.next_state[..., 0], b.discount)]
            for b in drawn]
    def update(i):
        s, a, r, s2, d = data[i % 64]
        with torch.no_grad():
            y = r + d * target(s2).max(1).values
        q = net(s).gather(1, a.long()[:, None])[:, 0]
        loss = F.smooth_l1_loss(q, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    timed(update, 200)
    update_wall, update_cpu = timed(update, frames)
    print('RESULT ' + json.dumps({'replay_ms': wall, 'replay_cpu_ms': used, 'update_ms': update_wall,
                                  'update_cpu_ms': update_cpu}))
else:
    # The same replay side in CleanRL's loop on SB3's buffer.
    rb = ReplayBuffer(100_000, env.observation_space, env.action_space, device='cpu',
                      handle_timeout_termination=False)
    rng = np.random.default_rng(0)
    state = {'obs': env.reset(seed=0)[0]}
    def store(i):
        obs = state['obs']
        if rng.random() < EPSILON:
            action = int(rng.integers(num_actions))
        else:
            with torch.no_grad():
                action = int(net(torch.from_numpy(obs[None])).argmax(1)[0])
        next_obs, reward, terminated, truncated, info = env.step(action)
        rb.add(obs[None], next_obs[None], np.array([action]), np.array([reward]), np.array([terminated]), [info])
        state['obs'] = env.reset()[0] if terminated or truncated else next_obs
    def replay(i):
        store(i)
        return rb.sample(32)
    for i in range(5_000):   # the fill, as the stream's
        store(i)
    timed(replay, 1000)
    wall, used = timed(replay, frames)
    print('RESULT ' + json.dumps({'replay_ms': wall, 'replay_cpu_ms': used}))
'''


def run(code, *argv, timeout=3600):
    out = subprocess.run([sys.executable, '-c', code, *map(str, argv)], capture_output=True,
                         text=True, cwd=ROOT, timeout=timeout,
                         env=dict(os.environ, OMP_NUM_THREADS='1', OPENBLAS_NUM_THREADS='1'))
    if out.returncode:
        raise SystemExit(f"a run failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.split('RESULT ', 1)[1])


def learner(rounds, frames, replay_start):
    results = {'expreplay': [], 'sb3': []}
    for r in range(rounds):
        for contestant in (('expreplay', 'sb3') if r % 2 == 0 else ('sb3', 'expreplay')):
            res = run(LEARNER, EXAMPLES, contestant, '--frames', frames, '--replay-start',
                      replay_start, '--seed', r, '--log-every', '1e9')
            results[contestant].append(res)
            print(f"round {r} (seed {r}) {contestant:9s}: {res['fps']:6.0f} frames/s, "
                  f"{res['cpu_ms']:.3f} CPU ms per frame", flush=True)
    med = {c: {k: statistics.median(x[k] for x in rs) for k in ('fps', 'cpu_ms')}
           for c, rs in results.items()}
    for c, m in med.items():
        print(f"median {c:9s}: {m['fps']:6.0f} frames/s, {m['cpu_ms']:.3f} CPU ms per frame")
    print(f"expreplay / sb3: frames/s {med['expreplay']['fps'] / med['sb3']['fps']:.2f}x, "
          f"CPU per frame {med['expreplay']['cpu_ms'] / med['sb3']['cpu_ms']:.2f}x")


def with_flag(flags, name, value):
    """``flags`` with ``name``'s value replaced (or the flag added)."""
    flags = list(flags)
    if name in flags:
        flags[flags.index(name) + 1] = str(value)
    else:
        flags += [name, str(value)]
    return flags


def learning(seeds, frames, replay_start):
    flags = LEARNING_ARGS
    if frames is not None:
        flags = with_flag(flags, '--frames', frames)
    if replay_start is not None:
        flags = with_flag(flags, '--replay-start', replay_start)
    print(f"flags (both contestants, + --seed S): {shlex.join(flags)}", flush=True)
    rows = []
    for i, seed in enumerate(seeds):
        for contestant in (('expreplay', 'sb3') if i % 2 == 0 else ('sb3', 'expreplay')):
            res = run(LEARNER, EXAMPLES, contestant, *with_flag(flags, '--seed', seed),
                      timeout=max(3600, int(flags[flags.index('--frames') + 1]) // 20))
            rows.append((contestant, seed, res))
            print(f"{contestant:9s} seed {seed}: greedy mean {res['greedy']:.2f} over "
                  f"{res['eval_episodes']} episodes, last-100 training mean {res['last100']:.2f} "
                  f"({res['games']} games), {res['wall']:.0f} s ({res['fps']:.0f} frames/s, "
                  f"{res['cpu_ms']:.3f} CPU ms per frame), evaluation {res['eval_wall']:.0f} s",
                  flush=True)
    print()
    print('| contestant | seed | greedy mean, 100 episodes | last-100 training mean | wall s | frames/s |')
    print('|---|---|---|---|---|---|')
    for contestant, seed, res in sorted(rows, key=lambda x: (x[0], x[1])):
        print(f"| {contestant} | {seed} | {res['greedy']:.2f} | {res['last100']:.2f} | "
              f"{res['wall']:.0f} | {res['fps']:.0f} |")
    for contestant in ('expreplay', 'sb3'):
        rs = [res for c, _, res in rows if c == contestant]
        mean = {k: statistics.fmean(r[k] for r in rs) for k in ('greedy', 'last100', 'wall', 'fps')}
        print(f"| {contestant} | mean of {len(rs)} | {mean['greedy']:.2f} | {mean['last100']:.2f} | "
              f"{mean['wall']:.0f} | {mean['fps']:.0f} |")


def memory(steps):
    for contestant in ('expreplay', 'sb3', 'sb3-optimized'):
        res = run(MEMORY, contestant, steps)
        print(f"{contestant:13s}: {res['bytes_per_step']:8,.0f} B per stored step (RSS, {steps} "
              f"steps of 84x84x4 uint8), sample(32) as torch tensors {res['sample_ms']:.3f} ms",
              flush=True)


def budget(rounds, frames):
    results = {'expreplay': [], 'sb3': []}
    for r in range(rounds):
        for contestant in (('expreplay', 'sb3') if r % 2 == 0 else ('sb3', 'expreplay')):
            res = run(BUDGET, EXAMPLES, contestant, frames)
            results[contestant].append(res)
            line = (f"round {r} {contestant:9s}: replay side {res['replay_ms']:.3f} ms per frame "
                    f"({res['replay_cpu_ms']:.3f} CPU)")
            if 'update_ms' in res:
                line += f", update alone {res['update_ms']:.3f} ms ({res['update_cpu_ms']:.3f} CPU)"
            print(line, flush=True)
    for c, rs in results.items():
        keys = [k for k in rs[0]]
        print(f"median {c:9s}: " + ', '.join(f"{k} {statistics.median(x[k] for x in rs):.3f}"
                                             for k in keys))


def version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return 'not installed'


def machine(argv):
    """The command line and the machine, printed before any part (versions read without
    importing the packages)."""
    cpu = platform.processor() or platform.machine()
    if os.path.exists('/proc/cpuinfo'):
        with open('/proc/cpuinfo') as f:
            cpu = next((line.split(':', 1)[1].strip() for line in f
                        if line.startswith('model name')), cpu)
    load = ', '.join(f'{x:.2f}' for x in os.getloadavg()) if hasattr(os, 'getloadavg') else '?'
    print(f"command: {shlex.join([os.path.basename(sys.executable), sys.argv[0], *argv])}")
    print(f"machine: {platform.platform()}, {cpu}, {os.cpu_count()} CPUs, load average {load}; "
          f"Python {platform.python_version()}, torch {version('torch')}, stable-baselines3 "
          f"{version('stable-baselines3')}, MinAtar {version('MinAtar')}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--part', choices=('learner', 'budget', 'memory', 'learning', 'all'),
                   default='all', help="all: learner, budget and memory (not learning: long)")
    p.add_argument('--rounds', type=int, default=2, help='interleaved rounds of the learner part')
    p.add_argument('--frames', type=int, default=None,
                   help="frames per run: learner 25,000; learning 60,000 (the CI run's)")
    p.add_argument('--replay-start', type=int, default=None,
                   help="random frames before learning: learner 5,000; learning 1,000 (the CI run's)")
    p.add_argument('--seeds', type=int, nargs='+', default=[0, 1], help='seeds of the learning part')
    p.add_argument('--budget-frames', type=int, default=5_000, help='frames timed in the budget part')
    p.add_argument('--steps', type=int, default=50_000, help='steps stored in the memory part')
    args = p.parse_args(argv)
    machine(sys.argv[1:] if argv is None else argv)
    if args.part in ('learner', 'all'):
        learner(args.rounds, 25_000 if args.frames is None else args.frames,
                5_000 if args.replay_start is None else args.replay_start)
    if args.part in ('budget', 'all'):
        budget(args.rounds, args.budget_frames)
    if args.part in ('memory', 'all'):
        memory(args.steps)
    if args.part == 'learning':
        learning(args.seeds, args.frames, args.replay_start)


if __name__ == '__main__':
    main()
