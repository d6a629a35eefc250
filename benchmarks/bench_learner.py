#!/usr/bin/env python
"""Does the replay keep a fast learner fed? The MinAtar JAX example's set-up, measured whole.

    python benchmarks/bench_learner.py                       # 3 rounds of ~20 s per contestant
    python benchmarks/bench_learner.py --rounds 5 --seconds 30 --game space_invaders

Each round runs, one after the other and each in a fresh process (rounds interleaved, medians
over rounds):

- ``learner``: the JAX example's compiled update, as the example builds it (``build_learner``,
  ``make_update``: the paper's network on flax's parameter trees, Huber loss, centred RMSProp,
  batch 32) on 64 batches drawn in advance from a memory filled by random play, chained as the
  training loop chains them: the learner's own speed, no env, no replay.
- ``jax run``: ``examples/dqn_minatar_jax.py`` as a user runs it (one update per frame,
  ``prefetch=0``), frames/s read from its progress lines after the first (compilation).
- ``numpy run``: ``examples/dqn_minatar.py``, the same set-up with the numpy learner.
- ``breakdown``: the JAX example's own ``train`` with timers around its parts (the env step and
  the acting, the draw, the update's dispatch, the wait for the previous update, the weights'
  hand-over to the players), per frame; what is left of the whole frame is the loop's own
  bookkeeping and the stream's pacing.

Prints the medians, ``jax run / learner`` (1.0: acting, inserting and drawing cost the run
nothing, all hidden under the update) and ``jax run / numpy run``. The two examples run past
their replay start (epsilon then falls from 1, as in a real run's first 100k frames).
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, 'examples')
ENV = dict(os.environ, OPENBLAS_NUM_THREADS=os.environ.get('OPENBLAS_NUM_THREADS', '1'),
           PYTHONPATH=os.pathsep.join([EXAMPLES, os.environ.get('PYTHONPATH', '')]))

LEARNER = r'''
import json, sys, time
import dqn_minatar_jax as ex
import jax
from expreplay import Population, ReplayMemory, ReplayStream, Sampling
game, seconds = sys.argv[1], float(sys.argv[2])
env = ex.make_env(game); channels, actions = env.observation_space.shape[-1], env.action_space.n; env.close()
memory = ReplayMemory(100_000, (10, 10, channels), 1, 'bool')
with ReplayStream(memory, Population(lambda: ex.make_env(game), 1, seed=0), Sampling(32, 1, seed=0),
                  init_memory_size=5_000, prefetch=0, progress=False) as stream:
    batches = [next(iter(stream)) for _ in range(64)]
args = [(b.state[..., 0], b.action, b.reward, b.next_state[..., 0], b.discount, b.weights) for b in batches]
network, optimizer, state, update = ex.build_learner(actions, channels, 0, 2.5e-4)
for i in range(200):
    state, td = update(state, *args[i % 64])
jax.block_until_ready(state)
n, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    for i in range(500):
        state, td = update(state, *args[i % 64])
    jax.block_until_ready(state)
    n += 500
print(json.dumps({'per_sec': n / (time.perf_counter() - start)}))
'''

BREAKDOWN = r'''
import json, sys, time
import dqn_minatar_jax as ex
import jax
from expreplay.acting.population import Population
from expreplay.stream.sampling import Sampling
game, frames = sys.argv[1], int(sys.argv[2])
spent = {'env step and acting (incl. the greedy forward)': 0.0, 'greedy forward': 0.0,
         'draw': 0.0, 'update dispatch': 0.0, 'wait for the previous update': 0.0,
         'weights to the players': 0.0}

def timed(key, fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[key] += time.perf_counter() - t
    return wrapper

Population.step = timed('env step and acting (incl. the greedy forward)', Population.step)
ex.GreedyPolicy.__call__ = timed('greedy forward', ex.GreedyPolicy.__call__)
Sampling.draw = timed('draw', Sampling.draw)
make_update = ex.make_update
WARMUP = 500     # updates before the timers start: compilation and the first draws excluded

def make_timed_update(*a):
    update, calls = timed('update dispatch', make_update(*a)), [0]
    def counted(*args):
        calls[0] += 1
        if calls[0] == WARMUP:
            for k in spent: spent[k] = 0.0
            spent['_t0'] = time.perf_counter()
        return update(*args)
    return counted
ex.make_update = make_timed_update
load = ex.GreedyPolicy.load
def load_waiting(self, params):     # the acting weights: ready only when their update is done
    t = time.perf_counter()
    jax.block_until_ready(params)
    t2 = time.perf_counter()
    spent['wait for the previous update'] += t2 - t
    load(self, params)
    spent['weights to the players'] += time.perf_counter() - t2
ex.GreedyPolicy.load = load_waiting
args = ex.argument_parser().parse_args(['--game', game, '--frames', str(5_000 + frames),
                                        '--log-every', '1e9'])
ex.train(args)
total = time.perf_counter() - spent.pop('_t0')
print(json.dumps({'total': total, **spent}))
'''
WARMUP = 500


def run_example(script, game, seconds, log_every):
    """Frames/s of an example from its progress lines (the first, with compilation, dropped)."""
    cmd = [sys.executable, '-u', os.path.join(EXAMPLES, script), '--game', game,
           '--frames', '100000000', '--log-every', str(log_every)]
    # SIGINT handled by default in the child even when this run inherited it ignored (run in
    # the background of a non-interactive shell), so that the Ctrl-C below stops it cleanly.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=ENV, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    rates, start = [], None
    try:
        for line in proc.stdout:
            m = re.match(r'progress: \d+ frames \((\d+)/s\)', line)
            if m:
                start = start or time.time()
                rates.append(float(m.group(1)))
                if time.time() - start >= seconds:
                    break
    finally:
        proc.send_signal(signal.SIGINT)    # the examples close the stream on Ctrl-C
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if len(rates) < 2:
        raise RuntimeError(f"{script}: too few progress lines in {seconds} s: {rates}")
    return statistics.median(rates[1:])


def run_learner(game, seconds):
    out = subprocess.run([sys.executable, '-c', LEARNER, game, str(seconds)], env=ENV, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])['per_sec']


def run_breakdown(game, frames):
    """Per-frame milliseconds of each part of the JAX example's loop, over ``frames`` frames."""
    out = subprocess.run([sys.executable, '-c', BREAKDOWN, game, str(frames)], env=ENV, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    spent = json.loads(out.stdout.strip().splitlines()[-1])
    return {k: 1e3 * v / (frames - WARMUP) for k, v in spent.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--game', default='breakout')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--seconds', type=float, default=20.0, help='per contestant per round')
    p.add_argument('--breakdown-frames', type=int, default=10_000)
    args = p.parse_args()
    rows = {'learner (updates/s)': [], 'jax run (frames/s)': [], 'numpy run (frames/s)': []}
    for r in range(args.rounds):
        rows['learner (updates/s)'].append(run_learner(args.game, args.seconds))
        rows['jax run (frames/s)'].append(
            run_example('dqn_minatar_jax.py', args.game, args.seconds, args.seconds / 5))
        rows['numpy run (frames/s)'].append(
            run_example('dqn_minatar.py', args.game, args.seconds, args.seconds / 5))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rows.items()),
              flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\nmedians over {args.rounds} rounds ({args.game}):")
    for k, v in med.items():
        print(f"  {k:24s} {v:8.0f}")
    print(f"  jax run / learner        {med['jax run (frames/s)'] / med['learner (updates/s)']:8.2f}")
    print(f"  jax run / numpy run      {med['jax run (frames/s)'] / med['numpy run (frames/s)']:8.2f}")
    print(f"  5M frames at the jax run's rate: {5e6 / med['jax run (frames/s)'] / 60:.0f} min")
    parts = run_breakdown(args.game, args.breakdown_frames)
    total = parts.pop('total')
    print(f"\nwhere a frame's time goes in the jax run ({args.breakdown_frames} frames, ms per frame, "
          f"wall clock of the training loop's thread):")
    for k, v in parts.items():
        print(f"  {k:48s} {v:6.3f}")
    print(f"  {'the whole frame':48s} {total:6.3f}")


if __name__ == '__main__':
    main()
