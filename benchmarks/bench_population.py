"""Population benchmark: steps/s into the replay memory against the raw step rate of the same envs.

Setup (issue 3, item 4): Pong, grayscale 84x84 uint8 frames, frameskip 4, history 4, a
Nature-DQN CNN predictor on the CPU (TensorFlow 2: the concrete function of a ``tf.function`` on
``(n, 84, 84, 4)`` uint8 channels-last, random weights, one intra/inter-op thread by default:
two threads make no call faster here and take the core a simulator thread needs), the runners
writing into one ``ReplayMemory`` of ``--memory-size`` steps (wrapping around during the run).

Environments:

- single envs: ``gymnasium.make('ALE/Pong-v5', frameskip=4, obs_type='grayscale',
  repeat_action_probability=--sticky)`` with an opencv ``INTER_AREA`` resize to 84x84 (an
  ObservationWrapper). This is the lean env (ALE skips the frames in C++); the examples'
  ``make_env`` skips frames in Python and would make the raw rate lower and the ratio easier.
- vector env: ``ale_py.vector_env.AtariVectorEnv('pong', 8)``, grayscale 84x84, ``stack_num=1``,
  frameskip 4, NEXT_STEP autoreset, the settings of the examples' ``make_vector_env``. One
  ``EnvRunner`` drives it (one batched predictor call per step for its 8 sub-envs).

What is measured, per round (rounds are repeated; figures are medians over rounds):

- ``raw``: random actions, no memory, no predictor. For N single envs: the N envs stepped
  round-robin in one thread (a single ALE env holds the GIL, so this is the rate N Python threads
  could reach at best). For the vector env: its own ``step`` with random actions.
- ``managed``: ``EnvRunnerManager(runners, maximum_staleness)`` driven by a loop that calls
  ``step(exploration)`` as fast as it is accepted (a learner that takes no time): steps written
  to the memory (``memory.num_steps_written``) over ``--seconds`` after ``--warmup``.
  One runner (a single env, or the vector env) runs inline, so staleness does not apply to it.

  Two threading modes for the most runners (8 by default): ``per-runner`` (the default:
  one simulator thread per runner, a BatchedPredictor) and ``pipelined``
  (``simulator_threads=1``: one simulator thread steps all runners in two halves, overlapping
  one half's env steps with the other half's forward pass on an InferenceThread).

- ``unbatched`` (one comparison row, the most runners at exploration 0.1): each runner gets its
  own wrapper of the predictor, so each has its own BatchedPredictor: concurrent batch-1 calls,
  as the reference's simulator threads make them.

Ratios are taken within each round: a managed figure is divided by the mean of the raw
measurements of the same envs taken just before and just after its block of configurations
(the machine is shared; the load changes). The load average and the cores this process can get
(two GIL-free busy threads, 0.3 s) are printed with the figures.

CPU accounting: process CPU time (every thread: TF's, ALE's C++ threads) per step written, for
the raw and the managed figures. ``free cores / CPU per managed step`` is the rate the managed
work could reach if it were spread perfectly over the cores: its ratio to the raw rate bounds
what any scheduling of that work can achieve.

Targets (issue 3), at exploration 0.1: 8 single-env runners >= 60% of the raw rate of the same
8 envs (best staleness and threading mode); the vector-env runner >= 50% of that vector env's
raw rate.

Usage: python benchmarks/bench_population.py [--quick] [--repeats 5] [--seconds 2]
       [--runners 1 2 4 8] [--staleness 1 4 8 16] [--exploration 0.1 1.0] [--no-vector]
       [--no-unbatched] [--no-pipelined] [--tf-threads 1] [--max-load 2 --max-wait 600]
The default run takes about 10 minutes on 2 cores (plus any wait for the load); exit status 0
when both targets pass.
"""

import argparse
import os
import sys
import threading
import time

import numpy as np

HISTORY = 4
FRAME = (84, 84)


# ---------------------------------------------------------------------------- environments
def make_single_env(sticky):
    import cv2
    import gymnasium as gym
    import ale_py
    gym.register_envs(ale_py)

    class Resize84(gym.ObservationWrapper):
        def __init__(self, env):
            super().__init__(env)
            self.observation_space = gym.spaces.Box(0, 255, FRAME, np.uint8)

        def observation(self, obs):
            return cv2.resize(obs, FRAME[::-1], interpolation=cv2.INTER_AREA)

    return Resize84(gym.make('ALE/Pong-v5', frameskip=4, obs_type='grayscale',
                             repeat_action_probability=sticky))


def make_vector_env(num_envs, sticky):
    from ale_py.vector_env import AtariVectorEnv
    return AtariVectorEnv('pong', num_envs, repeat_action_probability=sticky, noop_max=30,
                          img_height=FRAME[0], img_width=FRAME[1], grayscale=True, stack_num=1,
                          frameskip=4, maxpool=True, use_fire_reset=True, episodic_life=False,
                          reward_clipping=False, autoreset_mode='NextStep')


# ---------------------------------------------------------------------------- predictor
def make_predictor(num_actions, tf_threads=1, seed=0):
    """Nature-DQN CNN (Mnih et al. 2015), random weights: ``predictor(states) -> [q]``."""
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
    import tensorflow as tf
    if tf_threads:
        tf.config.threading.set_intra_op_parallelism_threads(tf_threads)
        tf.config.threading.set_inter_op_parallelism_threads(tf_threads)
    g = tf.random.Generator.from_seed(seed)

    def var(*shape):
        fan_in = int(np.prod(shape[:-1]))
        return tf.Variable(g.normal(shape) * np.sqrt(2.0 / fan_in))

    w = [var(8, 8, HISTORY, 32), var(4, 4, 32, 64), var(3, 3, 64, 64),
         var(7 * 7 * 64, 512), var(512, num_actions)]
    b = [tf.Variable(tf.zeros(int(x.shape[-1]))) for x in w]

    @tf.function(input_signature=[tf.TensorSpec((None,) + FRAME + (HISTORY,), tf.uint8)])
    def q_values(x):
        h = tf.cast(x, tf.float32) * (1.0 / 255.0)
        for k, stride in enumerate((4, 2, 1)):
            h = tf.nn.relu(tf.nn.conv2d(h, w[k], stride, 'VALID') + b[k])
        h = tf.reshape(h, (-1, 7 * 7 * 64))
        h = tf.nn.relu(h @ w[3] + b[3])
        return h @ w[4] + b[4]

    # The concrete function called on a tensor: half the Python overhead of the tf.function
    # called on numpy (input binding, signature casting), which holds the GIL on every call.
    q_concrete = q_values.get_concrete_function()

    def predictor(states):
        return [q_concrete(tf.constant(states)).numpy()]

    for n in (1, 2, 4, 8, 16):   # trace once and warm up oneDNN for the batch sizes we will see
        predictor(np.zeros((n,) + FRAME + (HISTORY,), np.uint8))
    return predictor


def time_predictor(predictor, batch, reps=20, rounds=5):
    """Median seconds per call, back to back in this thread, and process CPU seconds per call."""
    x = np.random.default_rng(0).integers(0, 256, (batch,) + FRAME + (HISTORY,), dtype=np.uint8)
    walls, cpus = [], []
    for _ in range(rounds):
        c, t = time.process_time(), time.perf_counter()
        for _ in range(reps):
            predictor(x)
        walls.append((time.perf_counter() - t) / reps)
        cpus.append((time.process_time() - c) / reps)
    return med(walls), med(cpus)


# ---------------------------------------------------------------------------- measurements
def raw_single(envs, seconds, rng):
    """Round-robin random-action steps/s of ``envs`` in this thread, and process CPU ms per step."""
    for e in envs:
        e.reset()   # no seed: a seeded ALE reset reloads the ROM
    n_act = envs[0].action_space.n
    actions = rng.integers(n_act, size=4096)
    n, k = 0, 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        for e in envs:
            _, _, term, trunc, _ = e.step(int(actions[k & 4095]))
            k += 1
            if term or trunc:
                e.reset()
        n += len(envs)
        if time.perf_counter() >= deadline:
            break
    return n / (time.perf_counter() - t0), (time.process_time() - c0) / n * 1e3


def raw_single_beside_cnn(envs, predictor, seconds, rng, batch=4):
    """raw_single while another thread runs the CNN on batches of ``batch`` back to back.

    The forward pass releases the GIL, so this measures what the hardware gives an env step
    while the other core is busy with inference: the ceiling of any design that overlaps the
    two (a busy thread that only hashes does not slow the env; one running the CNN does).
    """
    x = np.random.default_rng(1).integers(0, 256, (batch,) + FRAME + (HISTORY,), dtype=np.uint8)
    stop, started = threading.Event(), threading.Event()

    def infer():
        started.set()
        while not stop.is_set():
            predictor(x)

    t = threading.Thread(target=infer, name='bench-cnn')
    t.start()
    started.wait()
    try:
        return raw_single(envs, seconds, rng)[0]
    finally:
        stop.set()
        t.join()


def raw_vector(venv, seconds, rng):
    """Random-action steps/s of the vector env (all sub-envs), and process CPU ms per step."""
    venv.reset()   # no seed: a seeded reset reloads the ROMs (~1.5 s)
    n_act = venv.single_action_space.n
    actions = rng.integers(n_act, size=(64, venv.num_envs))
    n, k = 0, 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        venv.step(actions[k & 63])
        k += 1
        n += venv.num_envs
    return n / (time.perf_counter() - t0), (time.process_time() - c0) / n * 1e3


def managed(players, predictor, memory, staleness, exploration, warmup, seconds, seed=None,
            mode=''):
    """steps/s written to ``memory`` by an EnvRunnerManager over ``players``; its stats, with
    ``cpu`` (process CPU seconds per second: cores busy) added.

    ``mode``: '' one simulator thread per runner; 'u' (unbatched) the same, but each runner
    gets its own wrapper of the predictor, so the manager makes one BatchedPredictor per runner:
    concurrent batch-1 calls, as the reference's threads do; 'p' pipelined, one simulator thread.
    """
    from expreplay import EnvRunner, EnvRunnerManager
    preds = [(lambda states: predictor(states)) for _ in players] if mode == 'u' else \
        [predictor] * len(players)
    # seed=None: a seeded reset makes ALE reload the ROM (~0.2 s holding the GIL), once per
    # runner; the warm-up also waits until every runner has stepped, so no first reset is timed.
    runners = [EnvRunner(p, pr, memory, HISTORY, seed=seed, index=i, close_player=False)
               for i, (p, pr) in enumerate(zip(players, preds))]
    threads = 1 if mode == 'p' and len(runners) > 1 else None
    with EnvRunnerManager(runners, staleness, simulator_threads=threads) as mgr:
        step = mgr.step
        deadline = time.perf_counter() + warmup
        while time.perf_counter() < deadline or min(r.steps for r in runners) == 0:
            step(exploration)
        mgr.reset_stats()
        w0 = memory.num_steps_written
        c0 = time.process_time()
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            step(exploration)
        w1 = memory.num_steps_written
        t1 = time.perf_counter()
        stats = mgr.stats()
        stats['cpu'] = (time.process_time() - c0) / (t1 - t0)
    return (w1 - w0) / (t1 - t0), stats


# ---------------------------------------------------------------------------- load
def free_cores(seconds=0.3):
    """CPU seconds per second that os.cpu_count() GIL-free busy threads get now: the cores
    this process can have (the machine is shared)."""
    import hashlib
    buf = b'\0' * (1 << 18)

    def spin():
        t = time.perf_counter()
        while time.perf_counter() - t < seconds:
            hashlib.sha256(buf).digest()   # releases the GIL for buffers this large

    threads = [threading.Thread(target=spin) for _ in range(os.cpu_count() or 1)]
    c, t = time.process_time(), time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return (time.process_time() - c) / (time.perf_counter() - t)


def load1():
    return os.getloadavg()[0]


def wait_for_load(max_load, max_wait, every=30.0):
    """Wait (up to ``max_wait`` s, polling every ``every`` s) until the 1-min load <= max_load."""
    t0 = time.monotonic()
    while load1() > max_load and time.monotonic() - t0 < max_wait:
        print(f"  load average {os.getloadavg()[0]:.2f} > {max_load}: waiting "
              f"({time.monotonic() - t0:.0f}/{max_wait:.0f} s)", flush=True)
        time.sleep(every)
    return load1()


# ---------------------------------------------------------------------------- report
MODE_NAMES = {'': '', 'p': ' pipelined', 'u': ' unbatched'}


def med(xs):
    return float(np.median(xs)) if len(xs) else float('nan')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--runners', type=int, nargs='+', default=[1, 2, 4, 8],
                    help='numbers of single-env runners (one simulator thread each)')
    ap.add_argument('--staleness', type=int, nargs='+', default=[1, 4, 8, 16],
                    help='maximum_staleness values')
    ap.add_argument('--exploration', type=float, nargs='+', default=[0.1, 1.0])
    ap.add_argument('--vector-envs', type=int, default=8, help='sub-envs of the vector-env runner')
    ap.add_argument('--no-vector', action='store_true', help='skip the vector-env runner')
    ap.add_argument('--no-unbatched', dest='unbatched', action='store_false',
                    help='skip the comparison row: the most runners at exploration 0.1 with '
                         'concurrent batch-1 predictor calls (reference-style)')
    ap.add_argument('--no-pipelined', dest='pipelined', action='store_false',
                    help='skip the pipelined rows (the most runners on one simulator thread)')
    ap.add_argument('--repeats', type=int, default=5, help='rounds (medians are over rounds)')
    ap.add_argument('--seconds', type=float, default=2.0, help='seconds measured per figure')
    ap.add_argument('--warmup', type=float, default=0.5, help='seconds run before each managed figure')
    ap.add_argument('--memory-size', type=int, default=100_000, help='replay memory capacity (steps)')
    ap.add_argument('--sticky', type=float, default=0.25, help='repeat_action_probability (v5 default)')
    ap.add_argument('--tf-threads', type=int, default=1,
                    help='TensorFlow intra/inter-op threads (0: TF default, one per core). 1: the '
                         'forward pass runs on one core while a simulator thread holds the GIL '
                         'on the other')
    ap.add_argument('--max-load', type=float, default=2.0,
                    help='before measuring, wait while the 1-min load average is above this')
    ap.add_argument('--max-wait', type=float, default=600.0, help='seconds to wait for the load at most')
    ap.add_argument('--quick', action='store_true',
                    help='a smoke run: 2 rounds of 1 s, runners 1 8, staleness 1 8, exploration 0.1')
    ap.add_argument('--seed', type=int, default=0)
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.seconds, args.warmup = 2, 1.0, 0.3
        args.runners, args.staleness, args.exploration = [1, 8], [1, 8], [0.1]
        args.max_wait = 0.0
    runner_counts = sorted(set(args.runners))
    stalenesses = sorted(set(args.staleness))
    explorations = list(dict.fromkeys(args.exploration))

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from expreplay import ReplayMemory

    t_start = time.perf_counter()
    print(f"bench_population: Pong, {FRAME[0]}x{FRAME[1]} grayscale, frameskip 4, history {HISTORY}, "
          f"Nature CNN on the CPU; {os.cpu_count()} cores")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.max_wait > 0 and load1() > args.max_load:
        wait_for_load(args.max_load, args.max_wait)

    rng = np.random.default_rng(args.seed)
    singles = [make_single_env(args.sticky) for _ in range(max(runner_counts))]
    num_actions = singles[0].action_space.n
    venv = None if args.no_vector else make_vector_env(args.vector_envs, args.sticky)
    predictor = make_predictor(num_actions, args.tf_threads, args.seed)
    memory = ReplayMemory(args.memory_size, FRAME, HISTORY)
    fwd = {b: time_predictor(predictor, b) for b in (1, 4, 8)}
    print(f"CNN forward (TF threads: {args.tf_threads or 'default'}), ms per call wall/CPU: " +
          ', '.join(f"batch {b}: {w * 1e3:.2f}/{c * 1e3:.2f}" for b, (w, c) in fwd.items()))

    # Groups of envs, each measured raw before and after its managed configurations:
    # (key, players, [(exploration, staleness or None for inline, mode)]); mode: see managed().
    groups = []
    for n in runner_counts:
        if n == 1:
            cfgs = [(e, None, '') for e in explorations]
        else:
            cfgs = [(e, s, '') for e in explorations for s in stalenesses]
            if n == max(runner_counts) and args.pipelined:
                cfgs += [(e, s, 'p') for e in explorations for s in stalenesses]
            if n == max(runner_counts) and args.unbatched and 0.1 in explorations:
                cfgs.append((0.1, max(s for s in stalenesses if s <= n) if min(stalenesses) <= n
                             else min(stalenesses), 'u'))
        groups.append((f'{n}', singles[:n], cfgs))
    if venv is not None:
        groups.append((f'vec{args.vector_envs}', venv, [(e, None, '') for e in explorations]))

    raw = {g[0]: [] for g in groups}          # per round: mean of the bracketing raw figures
    raw_cpu = {g[0]: [] for g in groups}      # per round: process CPU ms per raw step
    beside = {g[0]: [] for g in groups}       # per round: raw rate beside a busy CNN thread / raw
    res = {}                                  # (group, eps, staleness, mode) -> {what: [per round]}
    loads, cores = [], []
    for rnd in range(args.repeats):
        loads.append(load1())
        cores.append(free_cores())
        print(f"round {rnd + 1}/{args.repeats}  (load {loads[-1]:.2f}, free cores {cores[-1]:.2f}, "
              f"{time.perf_counter() - t_start:.0f} s elapsed)", flush=True)
        for key, players, cfgs in groups:
            is_vec = not isinstance(players, list)

            def measure_raw():
                if is_vec:
                    return raw_vector(players, args.seconds, rng)
                return raw_single(players, args.seconds, rng)

            before, cpu_before = measure_raw()
            figs = []
            for eps, s, mode in cfgs:
                r, st = managed([players] if is_vec else players, predictor, memory, s or 1, eps,
                                args.warmup, args.seconds, mode=mode)
                figs.append(((key, eps, s, mode), r, st))
            after, cpu_after = measure_raw()
            if key == str(max(runner_counts)) and not is_vec:
                beside[key].append(raw_single_beside_cnn(players, predictor, args.seconds, rng) /
                                   ((before + after) / 2))
            raw_rate = (before + after) / 2
            raw[key].append(raw_rate)
            raw_cpu[key].append((cpu_before + cpu_after) / 2)
            for k, r, st in figs:
                d = res.setdefault(k, {'rate': [], 'ratio': [], 'batch': [], 'cpu': [], 'cpu_ms': []})
                d['rate'].append(r)
                d['ratio'].append(r / raw_rate)
                d['batch'].append(st['mean_inference_batch'] or 0.0)
                d['cpu'].append(st['cpu'])
                d['cpu_ms'].append(st['cpu'] / max(r, 1e-9) * 1e3)
            line = '  '.join(f"{'inline' if k[2] is None else 'S' + str(k[2])}{k[3]}"
                             f"@{k[1]:g}: {r:.0f}/{st['cpu']:.1f}" for k, r, st in figs)
            print(f"  {key:>5}: raw {before:.0f}/{after:.0f}  {line}", flush=True)
    loads.append(load1())
    cores.append(free_cores())

    # ------------------------------------------------------------------ table
    print()
    print(f"Figures: medians over {args.repeats} rounds of {args.seconds:g} s. Cells: steps/s written to "
          f"the memory (ratio to the raw rate of the same envs, median of per-round ratios) "
          f"[mean states per predictor call]. raw: random actions, no memory, no predictor "
          f"(single envs: stepped round-robin in one thread).")
    print(f"load average (1 min) at the start of each round and at the end: "
          f"{' '.join(f'{x:.2f}' for x in loads)}  (median {med(loads):.2f}); free cores probed "
          f"at the same moments: {' '.join(f'{x:.2f}' for x in cores)} of {os.cpu_count()}")
    col = 23

    def cell(k):
        d = res[k]
        return f"{med(d['rate']):.0f} ({med(d['ratio']):.2f}) [{med(d['batch']):.1f}]"

    head = f"{'runners':>10} {'raw steps/s':>12}" + ''.join(f"{'S=' + str(s):>{col}}" for s in stalenesses)
    for eps in explorations:
        print(f"\nexploration {eps:g}")
        print(head)
        for key, players, cfgs in groups:
            label = f"vector {args.vector_envs}" if key.startswith('vec') else key
            if any(s is None for _, s, _ in cfgs):
                print(f"{label:>10} {med(raw[key]):>12.0f}{cell((key, eps, None, '')):>{col}}"
                      f"   (one runner: inline, staleness does not apply)")
                continue
            cells = ''.join(f"{cell((key, eps, s, '')):>{col}}" for s in stalenesses)
            print(f"{label:>10} {med(raw[key]):>12.0f}" + cells + "   (a simulator thread per runner)")
            if (key, eps, stalenesses[0], 'p') in res:
                cells = ''.join(f"{cell((key, eps, s, 'p')):>{col}}" for s in stalenesses)
                print(f"{label + ' pip.':>10} {'':>12}" + cells +
                      "   (pipelined: simulator_threads=1)")
            for e2, s2, mode in cfgs:
                if mode == 'u' and e2 == eps:
                    cells = ''.join(f"{cell((key, eps, s, 'u')) if s == s2 else '':>{col}}" for s in stalenesses)
                    print(f"{label + ' unb.':>10} {'':>12}" + cells +
                          "   (unbatched: concurrent batch-1 predictor calls, reference-style)")
    # CPU accounting: process CPU time (all threads, TF's and ALE's C++ threads included) per
    # step written. Raw single envs run on one core (one thread holding the GIL); the managed
    # population and the vector env can use every core. If the managed work were spread
    # perfectly over the free cores, its rate would be free_cores / cpu_per_step: that bounds
    # the ratio no scheduling can beat.
    for key, ratios in beside.items():
        if ratios:
            print(f"\nraw rate of the {key} envs while another thread runs the CNN (batch 4) back "
                  f"to back: {med(ratios):.2f} of their raw rate (median; the ceiling of overlapping "
                  f"env steps with inference on this machine, before any runner overhead)")
    print("\nCPU accounting (medians): process CPU ms per step written, cores busy")
    print(f"{'what':>26} {'CPU ms/step':>12} {'cores busy':>11} {'ratio bound':>12}")
    free = med(cores)
    for key, players, cfgs in groups:
        is_vec = key.startswith('vec')
        raw_cores = min(free, med(raw_cpu[key]) * med(raw[key]) / 1e3)
        print(f"{key + ' raw':>26} {med(raw_cpu[key]):>12.3f} {raw_cores:>11.2f}")
        for k, d in res.items():
            if k[0] != key or k[2] not in (None, 8 if 8 in stalenesses else max(stalenesses)):
                continue
            bound = free * 1e3 / med(d['cpu_ms']) / med(raw[key])
            name = f"{key}{'' if k[2] is None else ' S=' + str(k[2])}{MODE_NAMES[k[3]]} eps {k[1]:g}"
            print(f"{name:>26} {med(d['cpu_ms']):>12.3f} {med(d['cpu']):>11.2f} {bound:>12.2f}")

    # ------------------------------------------------------------------ targets
    print("\ntargets (issue 3), exploration 0.1:")
    def report(label, d, raw_rate, target):
        r = med(d['ratio'])
        print(f"  {label}: {r:.2f} of the raw rate ({med(d['rate']):.0f} vs raw {raw_rate:.0f} "
              f"steps/s)   target >= {target:.2f}   {'PASS' if r >= target else 'FAIL'}")
        return r >= target

    ok_all = True
    big = str(max(runner_counts))
    if 0.1 in explorations and big == '8':
        best = max(((s, m) for s in stalenesses for m in ('', 'p') if (big, 0.1, s, m) in res),
                   key=lambda sm: med(res[(big, 0.1) + sm]['ratio']))
        ok_all &= report(f"8 single-env runners, best: staleness {best[0]}{MODE_NAMES[best[1]]}",
                         res[(big, 0.1) + best], med(raw[big]), 0.60)
    else:
        print("  8 single-env runners: not measured (needs 8 in --runners and 0.1 in --exploration)")
        ok_all = False
    vkey = f'vec{args.vector_envs}'
    if 0.1 in explorations and venv is not None:
        ok_all &= report(f"vector-env runner ({args.vector_envs} envs)", res[(vkey, 0.1, None, '')],
                         med(raw[vkey]), 0.50)
    else:
        print("  vector-env runner: not measured")
        ok_all = False
    print(f"total time {time.perf_counter() - t_start:.0f} s")

    for e in singles:
        e.close()
    if venv is not None:
        venv.close()
    return 0 if ok_all else 1


if __name__ == '__main__':
    sys.exit(main())
