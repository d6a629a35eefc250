"""Envs written in Python: players in worker processes against the same envs in threads.

A Python env holds the GIL for its whole step, so envs stepped by threads take turns at it,
whatever the cores; gymnasium's ``AsyncVectorEnv(shared_memory=True)`` steps them in worker
processes (observations written into shared memory), as one expreplay player per vector env.
Contestants, the same 8 envs each, in one process, rounds interleaved (order alternating),
medians of the rounds:

* ``threads``: 8 single-env players, the population's defaults (one pipelined simulator
  thread, two groups of 4);
* ``processes 2x4``: 2 ``AsyncVectorEnv`` players of 4 worker processes each (a simulator
  thread per player);
* ``processes 1x8``: 1 ``AsyncVectorEnv`` player of 8 worker processes.

A ``ReplayStream`` over each (batch 32, ``update_frequency`` 1: a batch per inserted env step,
so the envs, not the learner, bound the rate; no learner work), exploration 0.1 after the
fill, a predictor taking 0.3 ms + 0.01 ms per state without the GIL (a GPU's forward pass as
the host sees it). Reported: env steps stored per second, and CPU ms per env step of this
process and of the worker processes (``/proc``).

Envs: ``cartpole`` (CartPole-v1: a few microseconds of Python a step), ``breakout`` (MinAtar
Breakout, ``pip install minatar``; skipped with a message without it), ``heavy`` (CartPole
with ``--heavy-ms`` (0.3) ms of pure Python added to each step: an env that costs what an
Atari step does, all of it under the GIL).

Usage: python benchmarks/bench_processes.py [--envs cartpole breakout heavy] [--rounds 3]
           [--seconds 3] [--heavy-ms 0.3]
"""

import argparse
import functools
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import gymnasium as gym  # noqa: E402

NUM_ENVS = 8
SETUPS = [('threads', None), ('processes 2x4', 2), ('processes 1x8', 1)]


class PythonWork(gym.Wrapper):
    """``seconds`` of pure Python (holding the GIL) added to each step."""

    def __init__(self, env, seconds):
        super().__init__(env)
        self.seconds = seconds

    def step(self, action):
        deadline = time.perf_counter() + self.seconds
        while time.perf_counter() < deadline:
            pass
        return self.env.step(action)


def make_env(name, heavy_s=0.0):
    """One env (built in a worker process for the process players: a module-level function,
    picklable)."""
    if name == 'breakout':
        import minatar.gym
        minatar.gym.register_envs()
        return gym.make('MinAtar/Breakout-v1')
    env = gym.make('CartPole-v1')
    return PythonWork(env, heavy_s) if name == 'heavy' else env


def memory_spec(name):
    return ((10, 10, 4), 'bool') if name == 'breakout' else ((4,), 'float32')


def off_cpu_predictor(num_actions, seed=0):
    rng = np.random.default_rng(seed)

    def predictor(states):
        time.sleep(3e-4 + 1e-5 * len(states))
        return rng.random((len(states), num_actions), dtype=np.float32)
    return predictor


class Contestant:
    def __init__(self, env, label, vectors, args):
        from expreplay import Population, ReplayMemory, ReplayStream, Sampling
        self.label = label
        self.made = []
        make = functools.partial(make_env, env, args.heavy_ms * 1e-3)
        num_actions = int(make().action_space.n)
        if vectors is None:
            get_player, players = make, NUM_ENVS
        else:
            def get_player():
                # forkserver: workers start from a clean server process, not a fork of this
                # one with its threads running
                vec = gym.vector.AsyncVectorEnv([make] * (NUM_ENVS // vectors),
                                                shared_memory=True, context='forkserver')
                self.made.append(vec)
                return vec
            players = vectors
        shape, dtype = memory_spec(env)
        self.stream = ReplayStream(
            ReplayMemory(100_000, shape, 1, dtype),
            Population(get_player, players, off_cpu_predictor(num_actions), seed=0),
            Sampling(32, 1, seed=0), init_memory_size=2_000, progress=False)
        self.stream.start()
        self.stream.exploration = 0.1
        self.batches = iter(self.stream)

    def worker_cpu(self):
        """CPU seconds of the worker processes so far (utime + stime from /proc)."""
        ticks = os.sysconf('SC_CLK_TCK')
        total = 0.0
        for vec in self.made:
            for p in vec.processes:
                try:
                    with open(f'/proc/{p.pid}/stat') as f:
                        fields = f.read().rsplit(')', 1)[1].split()
                    total += (int(fields[11]) + int(fields[12])) / ticks
                except (OSError, IndexError):
                    pass
        return total

    def measure(self, warmup, seconds):
        """(env steps stored per second, CPU ms per env step here, CPU ms per env step in
        the workers)."""
        memory = self.stream.memory
        deadline = time.perf_counter() + warmup
        while time.perf_counter() < deadline:
            next(self.batches)
        w0, t0, c0, k0 = memory.num_steps_written, time.perf_counter(), time.process_time(), self.worker_cpu()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            next(self.batches)
        steps = memory.num_steps_written - w0
        wall = time.perf_counter() - t0
        return (steps / wall, (time.process_time() - c0) / steps * 1e3,
                (self.worker_cpu() - k0) / steps * 1e3)

    def close(self):
        self.stream.close(save=False)
        alive = [p.pid for vec in self.made for p in vec.processes if p.is_alive()]
        if alive:
            print(f"  {self.label}: worker processes still alive after close: {alive}",
                  file=sys.stderr)


def run_env(env, args):
    contestants = [Contestant(env, label, vectors, args) for label, vectors in SETUPS]
    out = {c.label: [] for c in contestants}
    try:
        for r in range(args.rounds):
            for c in (contestants if r % 2 == 0 else contestants[::-1]):
                out[c.label].append(c.measure(args.warmup, args.seconds))
            print(f"  {env} round {r + 1}: " + ", ".join(
                f"{label} {v[-1][0]:.0f} steps/s" for label, v in out.items())
                + f"; load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    finally:
        for c in contestants:
            c.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--envs', nargs='+', default=['cartpole', 'breakout', 'heavy'],
                    choices=['cartpole', 'breakout', 'heavy'])
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--seconds', type=float, default=3.0)
    ap.add_argument('--warmup', type=float, default=1.0)
    ap.add_argument('--heavy-ms', type=float, default=0.3, help="pure Python ms added to a "
                    "'heavy' env's step")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds must be >= 3 (medians of at least 3 rounds)")
    results = {}
    for env in args.envs:
        if env == 'breakout':
            try:
                import minatar  # noqa: F401
            except ImportError:
                print("breakout: skipped, minatar is not installed (pip install minatar)")
                continue
        results[env] = run_env(env, args)
    print(f"\nenv steps stored per second, {NUM_ENVS} envs, a ReplayStream (batch 32, "
          f"update_frequency 1, predictor 0.3 ms + 0.01 ms/state off the CPU); medians of "
          f"{args.rounds} interleaved rounds of {args.seconds:g} s; load now "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("| env | players | steps/s | vs threads | CPU ms per step: this process / workers |")
    print("|---|---|---|---|---|")
    for env, out in results.items():
        base = np.array([v[0] for v in out['threads']])
        for label, runs in out.items():
            rates = np.array([v[0] for v in runs])
            print(f"| {env} | {label} | {np.median(rates):,.0f} | {np.median(rates / base):.2f} | "
                  f"{np.median([v[1] for v in runs]):.3f} / {np.median([v[2] for v in runs]):.3f} |")


if __name__ == '__main__':
    main()
