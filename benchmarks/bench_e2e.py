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

``--profile`` measures where the pipeline's CPU and GIL go instead (case ``a8``'s set-up, no
original): per update, the CPU time of each stage (the env's step, acting bookkeeping, the
predictor hand-off, the write, pacing, the draw, the prefetch hand-over) from counters at the
stage boundaries, and its GIL-held time from ``py-spy record --gil`` (``stage_profile.py``),
for 8 single-env gymnasium players and for 2 ale-py ``AtariVectorEnv`` players of 4 envs; each
round measures each set-up three times, interleaved: plain (the CPU per update), with the
counters, with py-spy. Then the floor in the same run: CPU per env step of one gymnasium env
(and of one ``AtariVectorEnv`` of 4, all its threads) times ``update_frequency``, plus one
``sample_batch(64)``; and ``sample(64)`` once more while two threads step gymnasium envs, as
the pipeline's draw runs (the cores and the GIL shared). The profile's memory holds 6,000
steps unless ``--memory-size`` says otherwise: the ring wraps in the first warm-up, so writes
land on pages already in use, as in a long run past its first fill (on a virtual machine
whose first touch of a page is dear, a first fill costs more per write).

``--compare vector=K`` adds a contestant whose envs are K players of ale-py's
``AtariVectorEnv`` (the same preprocessing, done by C++ threads outside the GIL): what a
learner gets when the envs do not hold the GIL.

Usage::

    python benchmarks/bench_e2e.py --reference PATH/tensorpack_expreplay.py [--cases a8 a16 b8]
        [--rounds 3] [--seconds 5] [--prefetch N] [--ceiling] [--compare vector=2]
    python benchmarks/bench_e2e.py --profile [--rounds 3] [--seconds 3]

Each case runs in a subprocess of its own (the original's threads never stop; a process that
exits frees them and its memory).
"""

import argparse
import collections
import json
import os
import queue
import subprocess
import tempfile
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


def counted(make, clock):
    """``make`` whose env's ``step`` and ``reset`` count as the stage 'env step' on ``clock``
    (patched on the instance before the acting layer binds them)."""
    if clock is None:
        return make

    def make_counted():
        env = make()
        clock.patch(env, 'step', 'env step')
        clock.patch(env, 'reset', 'env step')
        return env
    return make_counted


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

    def __init__(self, players, predictor, args, variant=None, clock=None):
        from expreplay import ManagerSettings, Population, ReplayMemory, ReplayStream, Sampling
        settings = dict(prefetch=args.prefetch, maximum_staleness=args.staleness,
                        simulator_threads=args.simulator_threads)
        self.label = 'expreplay'
        get_player = pong
        self.switch_interval = None
        if variant:
            for setting in variant.split(','):      # ``vector=2,prefetch=0``: both changed
                name, value = setting.split('=')
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
        get_player = counted(get_player, clock)
        manager = ManagerSettings(simulator_threads=settings['simulator_threads'])
        prefetch = {} if settings['prefetch'] is None else {'prefetch': settings['prefetch']}
        self.stream = ReplayStream(
            ReplayMemory(args.memory_size, FRAME, HISTORY),
            Population(get_player, players, predictor,
                       maximum_staleness=settings['maximum_staleness'], seed=0,
                       manager=manager),
            Sampling(BATCH, UPDATE_FREQUENCY, seed=0), args.init_memory_size, progress=False,
            **prefetch)
        self.stream.start()
        self.stream.exploration = 0.1
        self.batches = iter(self.stream)

    def next(self):
        return next(self.batches)

    def describe(self):
        s = self.stream.stats()
        s = s.as_dict() if hasattr(s, 'as_dict') else s     # a typed record, or a dict
        return (f"samples_per_insert {s.get('samples_per_insert') or 0:.2f}, learner waited "
                f"{s.get('prefetch_waits') or 0} times, {s.get('prefetch_wait_time') or 0.0:.2f} s")


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


def cpu_ms_per_sample(memory, reps=300, transitions=False):
    """CPU ms of one ``sample_batch(64)`` (rows of history + 1 frames), or with
    ``transitions`` of one ``sample(64)``: the state and the next state as two arrays, the
    draw the stream makes by default."""
    rng = np.random.default_rng(0)
    draw = memory.sample if transitions else memory.sample_batch
    draw(BATCH, rng=rng)
    c0 = time.thread_time()
    for _ in range(reps):
        draw(BATCH, rng=rng)
    return (time.thread_time() - c0) / reps * 1e3


def cpu_ms_per_sample_beside_envs(memory, threads=2):
    """CPU ms (this thread's) of one ``sample(64)`` while ``threads`` threads step gymnasium
    Pong envs: the draw sharing the cores, the caches and the GIL as it does in the pipeline."""
    stop = threading.Event()
    started = threading.Barrier(threads + 1)

    def run(i):
        env = pong()
        env.reset(seed=i)
        rng = np.random.default_rng(i)
        started.wait(timeout=60)         # a worker that fails to start breaks the barrier
        while not stop.is_set():
            _, _, term, trunc, _ = env.step(int(rng.integers(6)))
            if term or trunc:
                env.reset()
        env.close()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    try:
        started.wait(timeout=60)
        return cpu_ms_per_sample(memory, transitions=True)
    finally:
        stop.set()
        for t in workers:
            t.join()


def cpu_ms_per_vector_env_step(num_envs=4, steps=500):
    """CPU ms (all the process's threads: the engine's C++ threads do the work) per env step
    of one ``AtariVectorEnv`` of ``num_envs`` Pong envs, random actions; the process
    otherwise idle."""
    env = vector_pong(num_envs)()
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    c0 = time.process_time()
    for _ in range(steps):
        env.step(rng.integers(6, size=num_envs))
    cpu = time.process_time() - c0
    env.close()
    return cpu / (steps * num_envs) * 1e3


# ---------------------------------------------------------------------------- --profile
PROFILE_SETUPS = [('8 single-env gymnasium Pong', None), ('2 AtariVectorEnv x 4', 'vector=2')]
GIL_RATE = 250          # py-spy samples per second


def instrument(clock):
    """Count the library's stages on ``clock``: its classes' methods wrapped from here (the
    library is not edited); the env's calls are wrapped by :func:`counted`."""
    from expreplay.acting.inference import InferenceThread, Prediction
    from expreplay.acting.lanes import LaneEpisodes
    from expreplay.acting.simulator import SimulatorThread
    from expreplay.acting.window import StalenessWindow
    from expreplay.stream.pacing import Pacer
    from expreplay.stream.prefetch import Prefetcher
    from expreplay.stream.sampling import Sampling
    for owner, name, stage in [
            (SimulatorThread, '_begin', 'acting'), (SimulatorThread, '_finish', 'acting'),
            (StalenessWindow, 'take', 'acting'), (StalenessWindow, 'finish', 'acting'),
            (InferenceThread, 'submit', 'predictor hand-off'),
            (Prediction, 'wait', 'predictor hand-off'),
            (LaneEpisodes, 'store', 'write'), (LaneEpisodes, 'store_fast', 'write'),
            (LaneEpisodes, 'start', 'write'),
            (Pacer, 'before_draw', 'pace'), (Sampling, 'draw', 'draw'),
            (Prefetcher, 'get', 'hand-over')]:
        clock.patch(owner, name, stage)


def thread_switches():
    """``{thread id: (name, voluntary context switches so far)}`` of this process's threads
    (a thread without a Python name, an engine's C++ worker, is named 'engine threads'); every
    wait that blocks (a condition, a lock, a sleep, an engine's barrier) is one."""
    names = {t.native_id: t.name.split('-')[0] for t in threading.enumerate()}
    out = {}
    for tid in os.listdir('/proc/self/task'):
        try:
            with open(f'/proc/self/task/{tid}/status') as f:
                status = f.read()
        except OSError:             # the thread ended meanwhile
            continue
        count = int(status.split('voluntary_ctxt_switches:')[1].split()[0])
        out[int(tid)] = (names.get(int(tid), 'engine threads'), count)
    return out


def measure_profiled(contestant, warmup, seconds, mode, clock, spy_path):
    """One measure of ``contestant`` in ``mode`` ('plain', 'counters' or 'gil'): updates/s,
    CPU ms per update, env steps stored per update, and for 'counters' / 'gil'
    ``{stage: ms per update}`` (CPU / GIL-held)."""
    memory = contestant.stream.memory
    deadline = time.perf_counter() + warmup
    while time.perf_counter() < deadline:
        learner(contestant.next())
    spy = None
    if mode == 'gil':
        from stage_profile import record_gil
        spy = record_gil(seconds, GIL_RATE, spy_path)
        time.sleep(0.3)                  # py-spy attaches (its samples start then)
    elif mode == 'counters':
        clock.start()
    switches = thread_switches() if mode == 'plain' and os.path.isdir('/proc/self/task') else None
    n, w0, t0, c0 = 0, memory.num_steps_written, time.perf_counter(), time.process_time()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        learner(contestant.next())
        n += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = memory.num_steps_written - w0
    out = dict(rate=n / wall, cpu_ms=cpu / n * 1e3, steps_per_update=steps / n)
    if switches is not None:
        # Per thread name; a thread that ended meanwhile is not counted (none does here).
        per_name = collections.Counter()
        for tid, (name, count) in thread_switches().items():
            per_name[name] += count - switches.get(tid, (name, 0))[1]
        out['switches'] = {k: v / n for k, v in per_name.items()}
    if mode == 'counters':
        stages, _ = clock.stop()
        out['stages'] = {k: v / n * 1e3 for k, v in stages.items()}
    elif spy is not None:
        _, err = spy.communicate()
        if spy.returncode != 0 or not os.path.exists(spy_path):
            print(f"py-spy failed: {err.strip()[-300:]}", file=sys.stderr)
        else:
            from stage_profile import gil_functions, gil_stages
            # py-spy samples from its attach to `seconds` later; the loop ran about as long:
            # GIL-held time per update is the GIL-held share of a second times the seconds
            # per update of the loop.
            per_update = wall / seconds / n * 1e3
            held = gil_stages(spy_path, GIL_RATE)
            out['stages'] = {k: v * per_update for k, v in held.items()}
            out['functions'] = {' | '.join(k): v * per_update
                                for k, v in gil_functions(spy_path, GIL_RATE).items()}
    return out


def run_profile(args):
    from stage_profile import StageClock
    clock = StageClock()
    instrument(clock)
    predictor = clock.wrap(off_cpu_predictor(), 'predictor (simulated, off-CPU)')
    contestants = [(label, Ours(8, predictor, args, variant, clock=clock))
                   for label, variant in PROFILE_SETUPS]
    modes = ['plain', 'counters', 'gil']
    out = {'case': 'profile', 'profile': {label: {m: [] for m in modes} for label, _ in contestants}}
    spy_path = os.path.join(tempfile.gettempdir(), f'bench_e2e_gil_{os.getpid()}.txt')
    for r in range(args.rounds):
        order = contestants if r % 2 == 0 else contestants[::-1]
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            for label, c in order:
                res = measure_profiled(c, args.warmup, args.seconds, mode, clock, spy_path)
                out['profile'][label][mode].append(res)
                print(f"  profile round {r + 1} {label} {mode}: {res['rate']:.0f}/s, "
                      f"{res['cpu_ms']:.2f} CPU ms per update; load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr, flush=True)
    memory = contestants[0][1].stream.memory
    sample_ms = cpu_ms_per_sample(memory)
    transitions_ms = cpu_ms_per_sample(memory, transitions=True)
    for _, c in contestants:
        c.stream.close(save=False)       # the floor is measured on an idle process
    out['floor'] = dict(env_ms=cpu_ms_per_env_step(), vector_env_ms=cpu_ms_per_vector_env_step(),
                        gil_free_share=gil_free_share_of_env_step(),
                        sample_ms=min(sample_ms, cpu_ms_per_sample(memory)),
                        transitions_ms=min(transitions_ms, cpu_ms_per_sample(memory, transitions=True)),
                        busy_transitions_ms=cpu_ms_per_sample_beside_envs(memory))
    if os.path.exists(spy_path):
        os.remove(spy_path)
    print(json.dumps(out), flush=True)
    os._exit(0)


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


STAGE_ORDER = ['env step', 'env step: engine threads (C++)', 'acting', 'predictor hand-off',
               'write', 'pace', 'draw', 'hand-over', 'predictor (simulated, off-CPU)',
               'learner loop (benchmark)']
NOT_LIBRARY = ('env step', 'env step: engine threads (C++)', 'predictor (simulated, off-CPU)',
               'learner loop (benchmark)')


def report_profile(res, args):
    prof, floor = res['profile'], res['floor']
    print(f"\nper update (batch {BATCH}, update_frequency {UPDATE_FREQUENCY}; predictor 0.3 ms + "
          f"0.01 ms/state and learner {LEARNER_SECONDS * 1e3:g} ms, both off the CPU): CPU ms of "
          f"each stage from counters, GIL-held ms from py-spy --gil at {GIL_RATE}/s; medians of "
          f"{args.rounds} interleaved rounds of {args.seconds:g} s; load now "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    labels = list(prof)

    def stage_medians(runs):
        keys = {k for run in runs for k in run.get('stages', {})}
        return {k: med([run.get('stages', {}).get(k, 0.0) for run in runs]) for k in keys}

    cpu = {label: stage_medians(prof[label]['counters']) for label in labels}
    gil = {label: stage_medians(prof[label]['gil']) for label in labels}
    stages = STAGE_ORDER + sorted({k for d in list(cpu.values()) + list(gil.values())
                                   for k in d} - set(STAGE_ORDER))
    print("| stage | " + " | ".join(f"{label}: CPU | GIL" for label in labels) + " |")
    print("|---|" + "---|---|" * len(labels))
    for k in stages:
        cells = [f"{cpu[label].get(k, 0.0):.3f} | {gil[label].get(k, 0.0):.3f}" for label in labels]
        print(f"| {k} | " + " | ".join(cells) + " |")
    print("| sum of the stages | " + " | ".join(
        f"{sum(cpu[label].values()):.3f} | {sum(gil[label].values()):.3f}" for label in labels) + " |")
    for label in labels:
        plain = prof[label]['plain']
        steps = med([r['steps_per_update'] for r in plain])
        cpu_plain = med([r['cpu_ms'] for r in plain])
        env_ms = floor['env_ms'] if label.startswith('8 single') else floor['vector_env_ms']
        floor_ms = UPDATE_FREQUENCY * env_ms + floor['sample_ms']
        library_gil = sum(v for k, v in gil[label].items() if k not in NOT_LIBRARY)
        library_cpu = sum(v for k, v in cpu[label].items() if k not in NOT_LIBRARY)
        print(f"  {label}: {med([r['rate'] for r in plain]):.0f} updates/s, {cpu_plain:.2f} CPU ms "
              f"per update without instruments ({med([r['cpu_ms'] for r in prof[label]['counters']]):.2f} "
              f"with the counters, {med([r['rate'] for r in prof[label]['gil']]):.0f} updates/s under "
              f"py-spy), {steps:.2f} env steps stored per update; floor {UPDATE_FREQUENCY} x "
              f"{env_ms:.3f} + {floor['sample_ms']:.3f} = {floor_ms:.2f} CPU ms, CPU / floor "
              f"{cpu_plain / floor_ms:.2f} (with the draw the stream makes, sample(64): "
              f"{floor_ms - floor['sample_ms'] + floor['transitions_ms']:.2f} CPU ms, CPU / floor "
              f"{cpu_plain / (floor_ms - floor['sample_ms'] + floor['transitions_ms']):.2f}); the library's own time (all but the env, the simulated "
              f"predictor and the learner loop) per env step: CPU {library_cpu / steps:.3f} ms, "
              f"GIL-held {library_gil / steps:.3f} ms (without the draw "
              f"{(library_gil - gil[label].get('draw', 0.0)) / steps:.3f} ms)")
        busy_floor = floor_ms - floor['sample_ms'] + floor['busy_transitions_ms']
        print(f"  {label}: floor with the draw measured beside stepping envs {busy_floor:.2f} "
              f"CPU ms, CPU / floor {cpu_plain / busy_floor:.2f}")
    for label in labels:
        runs = [r['switches'] for r in prof[label]['plain'] if 'switches' in r]
        if runs:
            per = {k: med([r.get(k, 0.0) for r in runs]) for k in {k for r in runs for k in r}}
            print(f"  {label}: voluntary context switches per update {sum(per.values()):.1f} ("
                  + ", ".join(f"{k} {v:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])
                              if v >= 0.05) + ")")
    for label in labels:
        runs = prof[label]['gil']
        keys = {k for run in runs for k in run.get('functions', {})
                if k.split(' | ')[0] not in NOT_LIBRARY}
        top = sorted(((med([run.get('functions', {}).get(k, 0.0) for run in runs]), k)
                      for k in keys), reverse=True)[:args.top]
        print(f"  {label}: the library's {args.top} functions holding the GIL longest (ms per "
              "update; stage | the innermost library function of the stack sampled):")
        for ms, k in top:
            print(f"    {ms:.3f}  {k}")
    print(f"  floor: a gymnasium Pong step {floor['env_ms']:.3f} CPU ms ({floor['gil_free_share']:.0%} "
          f"of it without the GIL: two envs in two threads against one), an AtariVectorEnv x 4 "
          f"step {floor['vector_env_ms']:.3f} CPU ms per env (all its threads), sample_batch(64) "
          f"{floor['sample_ms']:.3f} CPU ms, sample(64) {floor['transitions_ms']:.3f} CPU ms "
          f"({floor['busy_transitions_ms']:.3f} while two threads step gymnasium Pong)")


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
    if args.profile:
        out.append('--profile')
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--reference', help="tensorpack's examples/DeepQNetwork/expreplay.py "
                    "(without it the original's rows are skipped)")
    ap.add_argument('--cases', nargs='+', default=list(CASES), choices=list(CASES))
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--seconds', type=float, default=5.0, help="measured seconds per round")
    ap.add_argument('--warmup', type=float, default=1.0, help="seconds before each measure")
    ap.add_argument('--memory-size', type=int, help="replay memory size (default 50,000; "
                    "6,000 with --profile, a ring that wraps in the warm-up)")
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
                    "switch_us=N (sys.setswitchinterval of N microseconds while it is measured); "
                    "several joined by commas change them together (vector=2,prefetch=0)")
    ap.add_argument('--switch-interval', type=float, help="sys.setswitchinterval for both "
                    "contestants (seconds; Python's default is 0.005)")
    ap.add_argument('--ceiling', action='store_true', help="also measure the machine's ceiling")
    ap.add_argument('--profile', action='store_true', help="where the CPU and the GIL go, stage "
                    "by stage, for single-env and vector players (instead of the cases)")
    ap.add_argument('--top', type=int, default=15, help="with --profile: how many of the "
                    "functions holding the GIL longest to list")
    ap.add_argument('--case', choices=list(CASES) + ['profile'], help=argparse.SUPPRESS)   # a worker's case
    args = ap.parse_args()
    if args.memory_size is None:
        args.memory_size = 6_000 if args.profile or args.case == 'profile' else 50_000
    if args.rounds < 3:
        ap.error("--rounds must be >= 3 (medians of at least 3 rounds)")
    if args.case == 'profile':
        return run_profile(args)
    if args.case:
        return run_case(args)
    if args.profile:
        cmd = [sys.executable, os.path.abspath(__file__), '--case', 'profile'] + _worker_args(args)
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
        return report_profile(json.loads(out.stdout.strip().splitlines()[-1]), args)
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
