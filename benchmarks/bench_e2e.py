"""End-to-end benchmark: the updates per second a learner gets from the whole replay pipeline.

A learner loop takes a batch and trains on it; what it gets per second is what the replay can
feed it, envs, acting, inserting, sampling and the hand-over included. Two contestants, in the
same process, their rounds interleaved (the order alternating), medians of the rounds:

* ``expreplay``: ``for batch in ReplayStream(...)``, the stream's defaults (its prefetch
  thread, ``maximum_staleness``, simulator threads) unless an option says otherwise.
* ``original``: tensorpack's ``examples/DeepQNetwork/expreplay.py`` (``--reference PATH``;
  its rows are skipped with a message without it). Its ``ExpReplay`` is built as tensorpack's
  DQN example builds it and run as a tensorpack training runs it: the predictor set where
  ``_setup_graph`` would (``trainer.get_predictor``), ``_before_train()`` (its runners,
  ``EnvRunnerManager(runners, 2 * update_frequency)``, the initial fill), and its
  ``__iter__`` (sample a batch, yield it, make ``update_frequency`` step requests) run by a
  thread that puts the batches into a queue of 50, as ``QueueInput`` (the example's input)
  does with its EnqueueThread; the learner takes them from that queue.

Both: batch 64, ``update_frequency`` 4, history 4, exploration 0.1 after a fill at 1.0,
players as ``examples/dqn_atari.py`` builds them (``examples/atari_wrappers.make_env``: ALE
Pong, frameskip 4 with max-pooling, grayscale 84x84, no-op starts; the original gets the old
gym API it was written for).

Cases:

* ``a8``, ``a16``: the users' GPU machine, simulated on the CPU: 8 or 16 players, a predictor
  taking 0.3 ms + 0.01 ms per state and a learner taking 1 ms per batch, both without the GIL
  (``time.sleep`` releases it, as waiting for a GPU does), random Q-values. Reported: updates/s,
  the fraction of the learner's own speed (1000/s; its measured speed alone, a 1 ms sleep
  loop, is printed beside it) and the ratio to the original.
* ``b8``: the CPU machine: the Nature-DQN CNN (``bench_population.make_cnn``: TensorFlow on
  the CPU, default threading) as the predictor, 8 players, the learner 1 ms per batch.

``--ceiling`` also measures, in the same run, what the machine allows: CPU ms per env step,
the share of it that runs without the GIL (from how two envs in two threads scale over one:
ale-py's ``act`` keeps the GIL, so a gymnasium Atari env holds it for almost all its step),
CPU ms per ``sample_batch(64)``, and the bounds these give for ``update_frequency`` 4:
``cores / (4 env + sample)`` updates/s for the CPU and ``1 / (4 GIL-held env + sample)`` for
one interpreter's GIL.

``--compare vector=K`` adds a contestant whose envs are K players of ale-py's
``AtariVectorEnv`` (the same preprocessing, done by C++ threads outside the GIL): what a
learner gets when the envs do not hold the GIL.

Usage::

    python benchmarks/bench_e2e.py --reference PATH/tensorpack_expreplay.py [--cases a8 a16 b8]
        [--rounds 3] [--seconds 5] [--prefetch N] [--ceiling] [--compare vector=2]

Each case runs in a subprocess of its own (the original's threads never stop; a process that
exits frees them and its memory).
"""

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, os.path.join(ROOT, 'examples'), HERE]
from bench_population import load_reference  # noqa: E402  (the one loader of the original)

HISTORY = 4
FRAME = (84, 84)
BATCH = 64
UPDATE_FREQUENCY = 4
LEARNER_SECONDS = 1e-3
CASES = {'a8': ('offcpu', 8), 'a16': ('offcpu', 16), 'b8': ('cnn', 8)}


# ---------------------------------------------------------------------------- the parts
def learner(batch):
    """A training step that takes 1 ms without the GIL (a GPU's, as the host sees it)."""
    time.sleep(LEARNER_SECONDS)


def off_cpu_predictor(seed=0):
    """0.3 ms + 0.01 ms per state without the GIL, random Q-values: ``[q]``."""
    rng = np.random.default_rng(seed)

    def predictor(states):
        time.sleep(3e-4 + 1e-5 * len(states))
        return [rng.random((len(states), 6), dtype=np.float32)]
    return predictor


def make_predictor(kind):
    if kind == 'offcpu':
        return off_cpu_predictor()
    from bench_population import make_cnn
    return make_cnn()


def pong():
    from atari_wrappers import make_env
    return make_env('ALE/Pong-v5', sticky=0.25, max_episode_steps=None)


def vector_pong(num_envs, batch_size=0):
    """A ``get_player`` for ale-py's ``AtariVectorEnv``: ``num_envs`` Pong envs stepped by C++
    threads with the preprocessing of :func:`pong` (frameskip 4 with max-pooling, grayscale
    84x84, no-op starts, sticky actions) done there too, outside the GIL."""
    from ale_py.vector_env import AtariVectorEnv

    def make():
        return AtariVectorEnv('pong', num_envs=num_envs, batch_size=batch_size,
                              num_threads=min(num_envs, 2),
                              stack_num=1, repeat_action_probability=0.25,
                              reward_clipping=False, use_fire_reset=False)
    return make


class OldGymPong:
    """Pong with the old gym API (``reset() -> obs``, 4-tuple ``step``), for the original."""

    def __init__(self):
        self.env = pong()
        self.action_space = self.env.action_space

    def reset(self):
        return self.env.reset()[0]

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated or truncated, info


# ---------------------------------------------------------------------------- contestants
class Ours:
    """The stream with its defaults, or those of ``args`` (and a variant's settings)."""

    def __init__(self, players, predictor, args, variant=None):
        from expreplay import Population, ReplayMemory, ReplayStream, Sampling
        settings = dict(prefetch=args.prefetch, maximum_staleness=args.staleness,
                        simulator_threads=args.simulator_threads)
        self.label = 'expreplay'
        get_player = pong
        self.switch_interval = None
        if variant:
            name, value = variant.split('=')
            settings[name] = int(value)
            self.label = f'expreplay[{variant}]'
        if settings.get('switch_us'):
            # ``switch_us=N``: sys.setswitchinterval(N microseconds) while this one is measured
            self.switch_interval = settings['switch_us'] * 1e-6
        if settings.get('vector'):
            # ``vector=K``: the same number of envs as K vector players (ale-py's AtariVectorEnv)
            k = settings['vector']
            get_player, players = vector_pong(players // k), k
        if settings.get('async'):
            # ``async=K``: one asynchronous AtariVectorEnv of the case's envs, each receive
            # returning the 1/K of them that are ready first
            get_player, players = vector_pong(players, players // settings['async']), 1
        manager = ({} if settings['simulator_threads'] is None
                   else {'simulator_threads': settings['simulator_threads']})
        prefetch = {} if settings['prefetch'] is None else {'prefetch': settings['prefetch']}
        self.stream = ReplayStream(
            ReplayMemory(args.memory_size, FRAME, HISTORY),
            Population(get_player, players, predictor,
                       maximum_staleness=settings['maximum_staleness'], seed=0,
                       manager_kwargs=manager),
            Sampling(BATCH, UPDATE_FREQUENCY, seed=0), args.init_memory_size, progress=False,
            **prefetch)
        self.stream.start()
        self.stream.exploration = 0.1
        self.batches = iter(self.stream)

    def next(self):
        return next(self.batches)

    def describe(self):
        s = self.stream.stats()
        return (f"samples_per_insert {s.get('samples_per_insert') or 0:.2f}, learner waited "
                f"{s.get('prefetch_waits', 0)} times, {s.get('prefetch_wait_time', 0.0):.2f} s")


class Original:
    label = 'original'

    def __init__(self, ref, players, predictor, args):
        exp = ref.ExpReplay(None, OldGymPong, players, FRAME, BATCH, args.memory_size,
                            args.init_memory_size, UPDATE_FREQUENCY, HISTORY)
        exp.predictor = predictor          # what _setup_graph takes from the trainer
        exp._before_train()                # runners, EnvRunnerManager, the initial fill
        exp.exploration = 0.1
        self.queue = queue.Queue(maxsize=50)   # QueueInput's default capacity
        self._thread = threading.Thread(target=self._enqueue, args=(exp,), daemon=True,
                                        name='EnqueueThread')
        self._thread.start()

    def _enqueue(self, exp):
        for batch in exp.__iter__():
            self.queue.put(batch)

    def next(self):
        return self.queue.get()

    def describe(self):
        return f"queue {self.queue.qsize()}/50"


def measure(contestant, warmup, seconds):
    """``(updates/s, CPU ms per update)`` of a learner loop over ``seconds``, after ``warmup``
    seconds of the same. The CPU is the whole process's (every thread; the other
    contestant's threads are idle meanwhile, their queues full): what one update costs the
    machine, less sensitive to other processes' load than the rate."""
    default_interval = sys.getswitchinterval()
    if getattr(contestant, 'switch_interval', None):
        sys.setswitchinterval(contestant.switch_interval)
    try:
        deadline = time.perf_counter() + warmup
        while time.perf_counter() < deadline:
            learner(contestant.next())
        n, t0, c0 = 0, time.perf_counter(), time.process_time()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            learner(contestant.next())
            n += 1
    finally:
        sys.setswitchinterval(default_interval)
    return n / (time.perf_counter() - t0), (time.process_time() - c0) / max(n, 1) * 1e3


def learner_alone(seconds):
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        learner(None)
        n += 1
    return n / (time.perf_counter() - t0)


# ---------------------------------------------------------------------------- the ceiling
def cpu_ms_per_env_step(steps=2000):
    """CPU ms per Pong agent step (four emulator frames and the preprocessing), one env,
    random actions, in this thread."""
    env = pong()
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    c0 = time.thread_time()
    for _ in range(steps):
        _, _, term, trunc, _ = env.step(int(rng.integers(6)))
        if term or trunc:
            env.reset()
    return (time.thread_time() - c0) / steps * 1e3


def gil_free_share_of_env_step(seconds=1.0):
    """The share of a Pong step that runs without the GIL, from how two envs stepped by two
    threads scale over one: if a share f of the step releases the GIL, two threads step
    ``1 / (1 - f)`` times as fast as one (at most the 2 cores' 2x), so f = 1 - rate1 / rate2.
    Measured rather than assumed: ale-py's ``act`` keeps the GIL, opencv's resize drops it."""
    envs = [pong(), pong()]
    for i, env in enumerate(envs):
        env.reset(seed=i)

    def run(env, counts, i, deadline):
        rng = np.random.default_rng(i)
        while time.perf_counter() < deadline:
            _, _, term, trunc, _ = env.step(int(rng.integers(6)))
            if term or trunc:
                env.reset()
            counts[i] += 1

    rates = []
    for n in (1, 2):
        counts, t0 = [0, 0], time.perf_counter()
        threads = [threading.Thread(target=run, args=(envs[i], counts, i, t0 + seconds))
                   for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rates.append(sum(counts) / (time.perf_counter() - t0))
    for env in envs:
        env.close()
    return min(max(1.0 - rates[0] / rates[1], 0.0), 1.0)


def cpu_ms_per_sample(memory, reps=300):
    rng = np.random.default_rng(0)
    memory.sample_batch(BATCH, rng=rng)
    c0 = time.thread_time()
    for _ in range(reps):
        memory.sample_batch(BATCH, rng=rng)
    return (time.thread_time() - c0) / reps * 1e3


# ---------------------------------------------------------------------------- one case
def run_case(args):
    kind, players = CASES[args.case]
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    ref = load_reference(args.reference) if args.reference else None
    predictor = make_predictor(kind)
    contestants = [Ours(players, predictor, args)]
    contestants += [Ours(players, predictor, args, variant) for variant in args.compare]
    if ref is not None:
        contestants.append(Original(ref, players, predictor, args))
    out = {'case': args.case, 'rates': {c.label: [] for c in contestants},
           'cpu_ms': {c.label: [] for c in contestants}, 'learner_alone': []}
    for r in range(args.rounds):
        out['learner_alone'].append(learner_alone(min(1.0, args.seconds)))
        for c in (contestants if r % 2 == 0 else contestants[::-1]):
            rate, cpu = measure(c, args.warmup, args.seconds)
            out['rates'][c.label].append(rate)
            out['cpu_ms'][c.label].append(cpu)
        print(f"  {args.case} round {r + 1}: " + ", ".join(
            f"{c.label} {out['rates'][c.label][-1]:.0f}/s, {out['cpu_ms'][c.label][-1]:.2f} CPU ms "
            f"per update ({c.describe()})" for c in contestants)
            + f"; load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    if args.ceiling:
        contestants[0].stream.close(save=False)      # the ceiling is measured on an idle pipeline
        env_ms = cpu_ms_per_env_step()
        free = gil_free_share_of_env_step()
        sample_ms = cpu_ms_per_sample(contestants[0].stream.memory)
        out['ceiling'] = dict(env_ms=env_ms, gil_free_share=free, sample_ms=sample_ms,
                              cores=os.cpu_count())
    print(json.dumps(out), flush=True)
    for c in contestants[1:]:
        if isinstance(c, Ours):
            c.stream.close(save=False)     # vector players end their engines' threads
    os._exit(0)      # the original's threads never stop


# ---------------------------------------------------------------------------- the report
def med(xs):
    return float(np.median(xs)) if len(xs) else float('nan')


def report(results, args):
    print(f"\nupdates/s a learner gets (batch {BATCH}, update_frequency {UPDATE_FREQUENCY}, "
          f"learner {LEARNER_SECONDS * 1e3:g} ms/batch); medians of {args.rounds} interleaved "
          f"rounds of {args.seconds:g} s; load now {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("| case | players | predictor | expreplay updates/s | of the learner's 1000/s "
          "| of its measured speed alone | original updates/s | ratio (median of rounds) |")
    print("|---|---|---|---|---|---|---|---|")
    for case, res in results.items():
        kind, players = CASES[case]
        ours = np.array(res['rates']['expreplay'])
        alone = med(res['learner_alone'])
        orig = np.array(res['rates'].get('original', []))
        ratio = med(ours / orig) if len(orig) else float('nan')
        print(f"| {case} | {players} | {'off-CPU 0.3+0.01n ms' if kind == 'offcpu' else 'CNN on the CPU'} "
              f"| {med(ours):.0f} | {med(ours) / 1000:.2f} | {med(ours) / alone:.2f} (alone {alone:.0f}/s) "
              f"| {f'{med(orig):.0f}' if len(orig) else 'skipped'} | {ratio:.2f} |")
        for label, rates in res['rates'].items():
            if label.startswith('expreplay['):
                print(f"    {label} ({case}): {med(rates):.0f} updates/s, "
                      f"{med(np.array(rates) / ours):.2f}x the defaults (median of rounds)")
        cpu = {label: med(v) for label, v in res['cpu_ms'].items()}
        print(f"    CPU ms per update ({case}, all threads): " + ", ".join(
            f"{label} {v:.2f} (2-core bound {os.cpu_count() * 1e3 / v:.0f} updates/s)"
            for label, v in cpu.items()))
        ceiling = res.get('ceiling')
        if ceiling:
            env, free, sample, cores = (ceiling['env_ms'], ceiling['gil_free_share'],
                                        ceiling['sample_ms'], ceiling['cores'])
            held = env * (1.0 - free)
            cpu_bound = cores / (UPDATE_FREQUENCY * env + sample) * 1e3
            gil_bound = 1.0 / (UPDATE_FREQUENCY * held + sample) * 1e3
            print(f"    ceiling ({case}, gymnasium players): env step {env:.3f} CPU ms, of which "
                  f"{free:.0%} without the GIL (two envs in two threads vs one), so {held:.3f} ms "
                  f"holding it; sample_batch(64) {sample:.3f} ms: CPU bound {cpu_bound:.0f} "
                  f"updates/s, GIL bound {gil_bound:.0f} updates/s (envs, sampling; acting, "
                  f"inserting and the hand-over not counted)")
    if not args.reference:
        print("\nthe original's rows were skipped: give --reference PATH to tensorpack's "
              "examples/DeepQNetwork/expreplay.py")


def _worker_args(args):
    """The options of this run, for a worker process."""
    out = ['--rounds', str(args.rounds), '--seconds', str(args.seconds), '--warmup',
           str(args.warmup), '--memory-size', str(args.memory_size), '--init-memory-size',
           str(args.init_memory_size)]
    for option in ('reference', 'prefetch', 'staleness', 'simulator_threads', 'switch_interval'):
        value = getattr(args, option)
        if value is not None:
            out += ['--' + option.replace('_', '-'), str(value)]
    if args.compare:
        out += ['--compare'] + args.compare
    if args.ceiling:
        out.append('--ceiling')
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--reference', help="tensorpack's examples/DeepQNetwork/expreplay.py "
                    "(without it the original's rows are skipped)")
    ap.add_argument('--cases', nargs='+', default=list(CASES), choices=list(CASES))
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--seconds', type=float, default=5.0, help="measured seconds per round")
    ap.add_argument('--warmup', type=float, default=1.0, help="seconds before each measure")
    ap.add_argument('--memory-size', type=int, default=50_000)
    ap.add_argument('--init-memory-size', type=int, default=5_000)
    ap.add_argument('--prefetch', type=int, help="expreplay's prefetch depth (default: the stream's)")
    ap.add_argument('--staleness', type=int, help="expreplay's maximum_staleness (default: the stream's)")
    ap.add_argument('--simulator-threads', type=int, help="expreplay's simulator threads")
    ap.add_argument('--compare', nargs='*', default=[], metavar='SETTING=N',
                    help="more expreplay contestants in the same rounds, each with one setting "
                    "changed: prefetch=N, maximum_staleness=N, simulator_threads=N, or vector=K (the "
                    "case's envs as K players of ale-py's AtariVectorEnv, which steps and "
                    "preprocesses them in C++ threads outside the GIL), or async=K (one "
                    "asynchronous AtariVectorEnv of all of them, receiving 1/K at a time), or "
                    "switch_us=N (sys.setswitchinterval of N microseconds while it is measured)")
    ap.add_argument('--switch-interval', type=float, help="sys.setswitchinterval for both "
                    "contestants (seconds; Python's default is 0.005)")
    ap.add_argument('--ceiling', action='store_true', help="also measure the machine's ceiling")
    ap.add_argument('--case', choices=list(CASES), help=argparse.SUPPRESS)   # a worker's case
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds must be >= 3 (medians of at least 3 rounds)")
    if args.case:
        return run_case(args)
    if not args.reference:
        print("no --reference given: the original's rows are skipped", file=sys.stderr)
    results = {}
    for case in args.cases:
        cmd = [sys.executable, os.path.abspath(__file__), '--case', case] + _worker_args(args)
        print(f"case {case} ...", file=sys.stderr, flush=True)
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
        results[case] = json.loads(out.stdout.strip().splitlines()[-1])
    report(results, args)


if __name__ == '__main__':
    main()
