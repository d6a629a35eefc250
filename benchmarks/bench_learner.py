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
game, seconds, per_call = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
env = ex.make_env(game); channels, actions = env.observation_space.shape[-1], env.action_space.n; env.close()
memory = ReplayMemory(100_000, (10, 10, channels), 1, 'bool')
with ReplayStream(memory, Population(lambda: ex.make_env(game), 1, seed=0), Sampling(32 * per_call, per_call, seed=0),
                  init_memory_size=5_000, prefetch=0, progress=False) as stream:
    batches = [next(iter(stream)) for _ in range(64)]
args = [(b.state[..., 0], b.action, b.reward, b.next_state[..., 0], b.discount, b.weights) for b in batches]
network, optimizer, state, update = ex.build_learner(actions, channels, 0, 2.5e-4, per_call)
for i in range(200):
    state, td = update(state, *args[i % 64])
jax.block_until_ready(state)
n, start, cpu = 0, time.perf_counter(), time.process_time()
while time.perf_counter() - start < seconds:
    for i in range(500):
        state, td = update(state, *args[i % 64])
    jax.block_until_ready(state)
    n += 500 * per_call
print(json.dumps({'per_sec': n / (time.perf_counter() - start),
                  'cpu_ms': 1e3 * (time.process_time() - cpu) / n}))   # all threads' CPU per update
'''

BREAKDOWN = r'''
import json, sys, time
import dqn_minatar_jax as ex
import jax
from expreplay.acting.population import Population
from expreplay.stream.sampling import Sampling
game, frames, per_call = sys.argv[1], int(sys.argv[2]), sys.argv[3]
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
WARMUP = 500     # calls of the update before the timers start: compilation and the first draws excluded

def make_timed_update(*a):
    update, calls = timed('update dispatch', make_update(*a)), [0]
    def counted(*args):
        calls[0] += 1
        if calls[0] == WARMUP:
            for k in spent: spent[k] = 0.0
            spent['_t0'] = time.perf_counter()
            spent['_thread0'], spent['_process0'] = time.thread_time(), time.process_time()
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
args = ex.parse_args(['--game', game, '--frames', str(5_000 + frames), '--log-every', '1e9',
                      '--updates-per-call', per_call])
ex.train(args)
total = time.perf_counter() - spent.pop('_t0')
spent["CPU of the loop's thread"] = time.thread_time() - spent.pop('_thread0')
spent['CPU of the process (all threads)'] = time.process_time() - spent.pop('_process0')
print(json.dumps({'total': total, **spent}))
'''
WARMUP = 500

# Runs a script (a path, or '-c' and code) with XLA's threads on one CPU and the script's own
# thread (and every thread it starts) on another: Linux's affinity is per thread and a new
# thread inherits its creator's, so the XLA client is created while this thread is on the
# XLA CPU, then this thread moves.
PINNED = r'''
import os, runpy, sys
loop_cpu, xla_cpu = sorted(os.sched_getaffinity(0))[:2]
os.sched_setaffinity(0, {xla_cpu})
import jax, jax.numpy as jnp
jax.block_until_ready(jnp.ones((64, 64)) @ jnp.ones((64, 64)))   # the client and its threads
os.sched_setaffinity(0, {loop_cpu})
if sys.argv[1] == '-c':
    code, sys.argv = sys.argv[2], ['-c'] + sys.argv[3:]
    exec(compile(code, '<string>', 'exec'), {'__name__': '__main__'})
else:
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name='__main__')
'''


def python(pinned):
    """The command that starts Python: as is, or through PINNED (XLA on one CPU, the rest on
    another)."""
    return [sys.executable, '-u'] + (['-c', PINNED] if pinned else [])


def run_example(script, game, seconds, log_every, extra=(), pinned=False):
    """Frames/s of an example from its progress lines (the first, with compilation, dropped)."""
    cmd = python(pinned) + [os.path.join(EXAMPLES, script), '--game', game,
                            '--frames', '100000000', '--log-every', str(log_every), *extra]
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


def run_learner(game, seconds, per_call, pinned=False):
    """The update alone, ``per_call`` updates a call: ``{'per_sec': updates/s, 'cpu_ms': all
    threads' CPU per update}``."""
    out = subprocess.run(python(pinned) + ['-c', LEARNER, game, str(seconds), str(per_call)],
                         env=ENV, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_breakdown(game, frames, per_call):
    """Per-frame milliseconds of each part of the JAX example's loop, over ``frames`` frames
    (those of the first WARMUP calls excluded)."""
    out = subprocess.run([sys.executable, '-c', BREAKDOWN, game, str(frames), str(per_call)],
                         env=ENV, cwd=ROOT, capture_output=True, text=True, check=True)
    spent = json.loads(out.stdout.strip().splitlines()[-1])
    return {k: 1e3 * v / (frames - WARMUP * per_call) for k, v in spent.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--game', default='breakout')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--seconds', type=float, default=20.0, help='per contestant per round')
    p.add_argument('--updates-per-call', type=int, nargs='+', default=[1, 4], metavar='K',
                   help="the example's --updates-per-call values to measure (learner and run)")
    p.add_argument('--no-pinned', action='store_true',
                   help='skip the contestants with XLA on one CPU and the loop on another')
    p.add_argument('--breakdown-frames', type=int, default=10_000)
    args = p.parse_args()
    pinned = (not args.no_pinned and hasattr(os, 'sched_setaffinity')
              and len(os.sched_getaffinity(0)) >= 2)
    best = max(args.updates_per_call)
    contestants = {}
    for k in args.updates_per_call:
        flags = ['--updates-per-call', str(k)]
        contestants[f'learner, K={k} (updates/s)'] = (
            lambda k=k: run_learner(args.game, args.seconds, k))
        contestants[f'jax run, K={k} (frames/s)'] = (
            lambda flags=flags: run_example('dqn_minatar_jax.py', args.game, args.seconds,
                                            args.seconds / 5, extra=flags))
    contestants['numpy run (frames/s)'] = lambda: run_example(
        'dqn_minatar.py', args.game, args.seconds, args.seconds / 5)
    if pinned:
        contestants[f'learner, K={best}, XLA on 1 CPU'] = (
            lambda: run_learner(args.game, args.seconds, best, pinned=True))
        contestants[f'jax run, K={best}, XLA on 1 CPU'] = lambda: run_example(
            'dqn_minatar_jax.py', args.game, args.seconds, args.seconds / 5,
            extra=['--updates-per-call', str(best)], pinned=True)
    rows = {name: [] for name in contestants}
    cpu_per_update = {k: [] for k in args.updates_per_call}
    for r in range(args.rounds):
        for name, run in contestants.items():
            result = run()
            if isinstance(result, dict):    # the learner: its rate and its CPU per update
                if not name.endswith('CPU'):
                    cpu_per_update[int(name.split('K=')[1].split()[0])].append(result['cpu_ms'])
                result = result['per_sec']
            rows[name].append(result)
        print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:.0f}" for n, v in rows.items()),
              flush=True)

    def ratio(a, b):
        """The ratio of the medians, and its spread over the rounds (paired by round)."""
        paired = [x / y for x, y in zip(rows[a], rows[b])]
        return (f"{statistics.median(rows[a]) / statistics.median(rows[b]):5.2f}"
                f"   (rounds {min(paired):.2f}-{max(paired):.2f})")

    med = {n: statistics.median(v) for n, v in rows.items()}
    print(f"\nmedians over {args.rounds} rounds ({args.game}):")
    for n, v in med.items():
        print(f"  {n:36s} {v:8.0f}")
    for k in args.updates_per_call:
        run, learner = f'jax run, K={k} (frames/s)', f'learner, K={k} (updates/s)'
        print(f"  K={k}: jax run / its learner {ratio(run, learner)};"
              f"  jax run / numpy run {ratio(run, 'numpy run (frames/s)')}")
    if pinned:
        print(f"  K={best}, XLA on one CPU and the loop on another: jax run / its learner "
              f"{ratio(f'jax run, K={best}, XLA on 1 CPU', f'learner, K={best}, XLA on 1 CPU')}")
    fastest = max(med[f'jax run, K={k} (frames/s)'] for k in args.updates_per_call)
    print(f"  5M frames at the fastest jax run's rate: {5e6 / fastest / 60:.0f} min")

    # The CPU ceiling: a frame costs the update's CPU (all XLA's threads, measured alone) and
    # the loop thread's; no schedule of them on these CPUs beats cores / (their sum).
    cores = len(os.sched_getaffinity(0))
    for k in args.updates_per_call:
        parts = run_breakdown(args.game, args.breakdown_frames, k)
        total = parts.pop('total')
        loop_cpu = parts["CPU of the loop's thread"]
        print(f"\nwhere a frame's time goes in the jax run, K={k} ({args.breakdown_frames} frames, "
              f"ms per frame, wall clock of the training loop's thread; the last two rows: CPU):")
        for n, v in parts.items():
            print(f"  {n:48s} {v:6.3f}")
        print(f"  {'the whole frame':48s} {total:6.3f}")
        learner = med[f'learner, K={k} (updates/s)']
        update_cpu = statistics.median(cpu_per_update[k])
        ceiling = min(learner, 1e3 * cores / (update_cpu + loop_cpu))
        print(f"  the CPU ceiling on {cores} CPUs: the update's CPU {update_cpu:.3f} ms (alone, "
              f"all threads) + the loop's {loop_cpu:.3f} ms per frame -> at most {ceiling:.0f} "
              f"frames/s ({ceiling / learner:.2f} of its learner alone); the jax run reaches "
              f"{med[f'jax run, K={k} (frames/s)'] / ceiling:.2f} of it")


if __name__ == '__main__':
    main()
