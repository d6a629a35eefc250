"""Population benchmark: this project's acting layer against tensorpack's original, in one run.

Every figure is env steps per second (counted by the envs themselves, so that the original,
which writes an episode into its memory only when it ends, is counted the same way), measured
while a loop calls ``manager.step(0.1)`` as fast as it is accepted (a learner that takes no
time). Contestants are measured in interleaved rounds (the machine is shared and noisy) and
every figure is the median over rounds; a ratio is the median of the per-round ratios.

Rows:

1. ``pong-cnn``: 8 single-env Pong runners (gymnasium ALE, grayscale, frameskip 4, opencv
   resize to 84x84), a Nature-DQN CNN predictor (TensorFlow on the CPU with its default
   threading, as users run it), ``maximum_staleness=8``; this project with the manager's
   defaults against the original (tensorpack's ``examples/DeepQNetwork/expreplay.py``,
   loaded from the file ``--reference`` names, in the same process).
2. ``machinery-8``: the same with a near-free env (a fixed 84x84 frame, 200-step episodes) and
   a near-free predictor (zeros), ``maximum_staleness=16``: what the machinery itself costs.
   ``machinery-1``: one runner, inline in both.
3. ``vector-64``: one runner over a near-free 64-env vector env, against the copy bound: per
   vector step, plain numpy writing the 64 frames into a ring and gathering the greedy states'
   frames with one ``np.take`` (the bytes any design must move).
4. ``envpool``: EnvPool Pong, 8 envs, one runner, the CNN, against EnvPool's own
   random-action rate (its synchronous ``step`` of all 8); this project is given
   EnvPool in asynchronous mode (``batch_size=4``: the engine steps one half while the
   predictor runs on the other), and in synchronous mode for comparison. Printed with it:
   the CPU ceiling of the row, from the CPU seconds (all threads) that EnvPool spends per
   step and the CNN per state, measured in the same run: on a machine with few cores the
   CNN and EnvPool's threads share them, and no acting layer can beat
   ``cores / (env CPU + 0.9 * CNN CPU)`` steps per second.
5. ``envpool-offcpu``: the same with a predictor whose forward pass takes 1 ms per call
   without the CPU (as a GPU's does, for the host): what the overlap gives when inference
   does not take the envs' cores.

Usage: python benchmarks/bench_population.py [--reference PATH] [--rounds 3] [--seconds 2]
       [--rows pong-cnn ...]
Without ``--reference`` the rows against the original (``pong-cnn``, ``machinery-8``,
``machinery-1``) are skipped, with a message. The full run takes about 6 minutes on 2 cores.
"""

import argparse
import importlib.util
import os
import sys
import time

import numpy as np

HISTORY = 4
FRAME = (84, 84)


# ---------------------------------------------------------------------------- the original
# The rows whose first contestant is the original: they need --reference.
REFERENCE_ROWS = ('pong-cnn', 'machinery-8', 'machinery-1')


def load_reference(path):
    """tensorpack's original expreplay module, loaded from ``path`` (it needs tensorpack)."""
    spec = importlib.util.spec_from_file_location('tensorpack_expreplay', path)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    ref.ShareSessionThread = lambda t: t     # no TF session outside a trainer
    return ref


# ---------------------------------------------------------------------------- environments
class Discrete:
    def __init__(self, n):
        self.n = n


class FreeEnv:
    """A near-free env: a fixed 84x84 frame, 200-step episodes. ``steps`` counts env steps."""

    def __init__(self, episode=200):
        self.action_space = Discrete(6)
        self.obs = np.zeros(FRAME, np.uint8)
        self.episode, self.t, self.steps = episode, 0, 0

    def reset(self, seed=None, options=None):
        self.t = 0
        return self.obs, {}

    def step(self, action):
        self.t += 1
        self.steps += 1
        return self.obs, 0.0, self.t >= self.episode, False, {}


class OldApiFreeEnv(FreeEnv):
    """The same env with the old gym API, which the original needs."""

    def reset(self):
        self.t = 0
        return self.obs

    def step(self, action):
        self.t += 1
        self.steps += 1
        return self.obs, 0.0, self.t >= self.episode, {}


class FreeVectorEnv:
    """A near-free vector env of ``n`` sub-envs (NEXT_STEP autoreset, staggered 500-step
    episodes): the cost of acting is all in the runner."""
    metadata = {'autoreset_mode': 'NextStep'}

    def __init__(self, n=64, episode=500):
        self.num_envs = n
        self.single_action_space = Discrete(6)
        self.obs = np.zeros((n,) + FRAME, np.uint8)
        self.reward = np.zeros(n)
        self.t = np.arange(n) * (episode // n)
        self.episode, self.steps = episode, 0
        self.no = np.zeros(n, bool)

    def reset(self, seed=None, options=None):
        return self.obs, {}

    def step(self, actions):
        self.t += 1
        self.steps += self.num_envs
        ended = self.t >= self.episode
        if ended.any():
            self.t[ended] = -1      # the next step is the autoreset
        return self.obs, self.reward, ended, self.no, {}


class CountSteps:
    """Counts the env steps of a gymnasium env: ``steps``."""

    def __init__(self, env):
        self.env, self.steps = env, 0
        self.action_space = env.action_space

    def reset(self, **kw):
        return self.env.reset(**kw)

    def step(self, a):
        self.steps += 1
        return self.env.step(a)


class OldApi(CountSteps):
    """A gymnasium env with the old gym API (what the original's runners call)."""

    def reset(self):
        return self.env.reset()[0]

    def step(self, a):
        self.steps += 1
        obs, r, term, trunc, info = self.env.step(a)
        return obs, r, term or trunc, info


def make_pong(sticky=0.0):
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


def make_envpool(batch_size, num_envs=8):
    import envpool
    return envpool.make('Pong-v5', env_type='gymnasium', num_envs=num_envs, batch_size=batch_size,
                        img_height=FRAME[0], img_width=FRAME[1], gray_scale=True, stack_num=1,
                        episodic_life=False, reward_clip=False, repeat_action_probability=0.25)


# ---------------------------------------------------------------------------- predictors
def make_cnn(num_actions=6, seed=0):
    """Nature-DQN CNN (Mnih et al. 2015), random weights, TensorFlow's default threading:
    ``predictor(states) -> [q]`` (tensorpack's convention, which both sides accept)."""
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
    import tensorflow as tf
    g = tf.random.Generator.from_seed(seed)

    def var(*shape):
        return tf.Variable(g.normal(shape) * np.sqrt(2.0 / int(np.prod(shape[:-1]))))

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

    concrete = q_values.get_concrete_function()

    def predictor(states):
        return [concrete(tf.constant(states)).numpy()]

    for n in (1, 2, 4, 8, 16):      # trace and warm up oneDNN for the batch sizes we will see
        predictor(np.zeros((n,) + FRAME + (HISTORY,), np.uint8))
    return predictor


def free_predictor(states):
    return [np.zeros((len(states), 6), np.float32)]


def off_cpu_predictor(seconds=1e-3):
    """A forward pass that takes ``seconds`` of wall time and no CPU (a GPU's, as the host
    sees it: launched, then waited for with the GIL released); zero Q-values."""
    def predictor(states):
        time.sleep(seconds)
        return [np.zeros((len(states), 6), np.float32)]
    return predictor


def cpu_ms(fn, units, seconds=1.0):
    """CPU milliseconds (this process, all threads) per unit of ``fn()``, which does ``units``."""
    fn()
    n, c0, t0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += units
    return (time.process_time() - c0) / n * 1e3


def time_cnn(predictor, batch, reps=20):
    x = np.random.default_rng(0).integers(0, 256, (batch,) + FRAME + (HISTORY,), dtype=np.uint8)
    t = time.perf_counter()
    for _ in range(reps):
        predictor(x)
    return (time.perf_counter() - t) / reps * 1e3


# ---------------------------------------------------------------------------- contestants
def drive(step, count, warmup, seconds):
    """Call ``step(0.1)`` for ``warmup`` then ``seconds``; env steps/s over the latter."""
    deadline = time.perf_counter() + warmup
    while time.perf_counter() < deadline:
        step(0.1)
    s0, t0 = count(), time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        step(0.1)
    return (count() - s0) / (time.perf_counter() - t0)


def ours(players, predictor, staleness, warmup, seconds, memory_size):
    from expreplay import EnvRunner, EnvRunnerManager, ReplayMemory, RunnerSettings
    mem = ReplayMemory(memory_size, FRAME, HISTORY)
    mem.ring.frames.fill(0)     # steady state: a memory that has wrapped has its pages mapped
    keep_players = RunnerSettings(close_player=False)
    runners = [EnvRunner(p, predictor, mem, HISTORY, settings=keep_players, index=i)
               for i, p in enumerate(players)]
    with EnvRunnerManager(runners, staleness) as mgr:
        rate = drive(mgr.step, lambda: sum(p.steps for p in players), warmup, seconds)
    return rate


def original(ref, players, predictor, staleness, warmup, seconds, memory_size):
    mem = ref.ReplayMemory(memory_size, FRAME, HISTORY)
    mem.state.fill(0)       # the same for the original
    runners = [ref.EnvRunner(p, predictor, mem, HISTORY) for p in players]
    mgr = ref.EnvRunnerManager(runners, staleness)
    rate = drive(mgr.step, lambda: sum(p.steps for p in players), warmup, seconds)
    # Its threads are never stopped: let them drain the queue, so that the next contestant
    # does not share the CPU with them (they then block on the empty queue for good).
    queue = getattr(mgr, '_populate_job_queue', None)
    while queue is not None and not queue.empty():
        time.sleep(0.001)
    time.sleep(0.05)
    return rate


def envpool_raw(env, warmup, seconds):
    env.reset()
    actions = np.random.default_rng(0).integers(6, size=(64, env.num_envs))
    k = [0]

    def step(_):
        env.step(actions[k[0] & 63])
        k[0] += 1
    return drive(step, lambda: k[0] * env.num_envs, warmup, seconds)


class EnvPoolCounter:
    """Counts EnvPool's steps (every sub-env row that comes back) without changing its API."""

    def __init__(self, env):
        self._env, self.steps = env, 0

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step(self, actions, env_id=None):
        out = self._env.step(actions, env_id)
        self.steps += len(out[1])
        return out

    def recv(self):
        out = self._env.recv()
        self.steps += len(out[1])
        return out


def copy_bound(n=64, ring_slots=4096, exploration=0.1, warmup=0.3, seconds=2.0):
    """Vector steps of ``n`` frames: write them into a ring, gather the greedy states' frames."""
    ring = np.zeros((ring_slots,) + FRAME, np.uint8)
    frames = np.zeros((n,) + FRAME, np.uint8)
    rng = np.random.default_rng(0)
    k = [0]

    def step(_):
        pos = (k[0] * n) % ring_slots
        ring[pos:pos + n] = frames
        greedy = np.flatnonzero(rng.random(n) >= exploration)
        idx = (pos + greedy[:, None] - np.arange(HISTORY)) % ring_slots
        np.take(ring, idx, axis=0)
        k[0] += 1
    return drive(step, lambda: k[0] * n, warmup, seconds)


# ---------------------------------------------------------------------------- the run
def med(xs):
    return float(np.median(xs)) if len(xs) else float('nan')


def load1():
    return os.getloadavg()[0]


def print_cpu_ceiling(env, cnn, raw_rates, exploration=0.1):
    """The envpool row's ceiling on this machine: CPU per env step + per greedy state."""
    env.reset()
    actions = np.zeros(env.num_envs, np.int64)
    env_cpu = cpu_ms(lambda: env.step(actions), env.num_envs)
    x = np.zeros((8,) + FRAME + (HISTORY,), np.uint8)
    cnn_cpu = {b: cpu_ms(lambda: cnn(x[:b]), b) for b in (4, 8)}
    cores = os.cpu_count()
    print(f"\nenvpool CPU ceiling ({cores} cores): EnvPool {env_cpu:.3f} CPU ms per step; the CNN "
          f"{cnn_cpu[8]:.3f} CPU ms per state at batch 8, {cnn_cpu[4]:.3f} at batch 4")
    for label, b in (('sync', 8), ('async', 4)):
        ceiling = cores / (env_cpu + (1 - exploration) * cnn_cpu[b]) * 1e3
        print(f"  {label}: at most {ceiling:,.0f} steps/s = {ceiling / med(raw_rates):.2f} of the raw rate")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--reference', metavar='PATH',
                    help="tensorpack's examples/DeepQNetwork/expreplay.py, the original to measure "
                         "against; without it the rows " + ', '.join(REFERENCE_ROWS) + " are skipped")
    all_rows = ['pong-cnn', 'machinery-8', 'machinery-1', 'vector-64', 'envpool', 'envpool-offcpu']
    ap.add_argument('--rows', nargs='+', choices=all_rows, default=all_rows,
                    help='rows to measure (default: all)')
    ap.add_argument('--rounds', type=int, default=3, help='interleaved rounds (medians taken)')
    ap.add_argument('--seconds', type=float, default=2.0, help='seconds measured per figure')
    ap.add_argument('--warmup', type=float, default=0.5, help='seconds run before each figure')
    ap.add_argument('--memory-size', type=int, default=50_000, help='replay memory capacity')
    args = ap.parse_args()

    if args.reference is None:
        skipped = [name for name in args.rows if name in REFERENCE_ROWS]
        if skipped:
            print(f"skipping {', '.join(skipped)} (measured against tensorpack's original "
                  "replay): pass its examples/DeepQNetwork/expreplay.py as --reference PATH",
                  flush=True)
        args.rows = [name for name in args.rows if name not in REFERENCE_ROWS]
        ref = None
    else:
        ref = load_reference(args.reference)
    cnn = make_cnn() if {'pong-cnn', 'envpool'} & set(args.rows) else None
    if cnn is not None:
        print("CNN ms per call (TF default threading): " + ", ".join(
            f"batch {b}: {time_cnn(cnn, b):.2f}" for b in (1, 4, 8)), flush=True)
    pongs = [make_pong() for _ in range(8)] if 'pong-cnn' in args.rows else []
    for e in pongs:
        e.reset()
    ep_sync = EnvPoolCounter(make_envpool(8)) if {'envpool', 'envpool-offcpu'} & set(args.rows) else None
    off_cpu = off_cpu_predictor()
    w, s, m = args.warmup, args.seconds, args.memory_size

    # name -> [(label, fn)]: the first is the one the others are divided by.
    rows = {
        'pong-cnn': [('original', lambda: original(ref, [OldApi(e) for e in pongs], cnn, 8, w, s, m)),
                     ('expreplay', lambda: ours([CountSteps(e) for e in pongs], cnn, 8, w, s, m))],
        'machinery-8': [('original', lambda: original(ref, [OldApiFreeEnv() for _ in range(8)],
                                                      free_predictor, 16, w, s, m)),
                        ('expreplay', lambda: ours([FreeEnv() for _ in range(8)], free_predictor,
                                                   16, w, s, m))],
        'machinery-1': [('original', lambda: original(ref, [OldApiFreeEnv()], free_predictor, 1, w, s, m)),
                        ('expreplay', lambda: ours([FreeEnv()], free_predictor, 1, w, s, m))],
        'vector-64': [('copy bound', lambda: copy_bound(64, warmup=w, seconds=s)),
                      ('expreplay', lambda: ours([FreeVectorEnv(64)], free_predictor, 1, w, s, m))],
        'envpool': [('envpool raw', lambda: envpool_raw(ep_sync, w, s)),
                    ('expreplay async', lambda: ours([EnvPoolCounter(make_envpool(4))], cnn, 1, w, s, m)),
                    ('expreplay sync', lambda: ours([ep_sync], cnn, 1, w, s, m))],
        'envpool-offcpu': [('envpool raw', lambda: envpool_raw(ep_sync, w, s)),
                           ('expreplay async', lambda: ours([EnvPoolCounter(make_envpool(4))], off_cpu,
                                                            1, w, s, m)),
                           ('expreplay sync', lambda: ours([ep_sync], off_cpu, 1, w, s, m))],
    }
    results = {name: {label: [] for label, _ in rows[name]} for name in args.rows}
    for r in range(args.rounds):
        for name in args.rows:
            contestants = rows[name] if r % 2 == 0 else rows[name][::-1]   # alternate the order
            for label, fn in contestants:
                results[name][label].append(fn())
            print(f"round {r + 1} {name}: " + ", ".join(
                f"{label} {results[name][label][-1]:,.0f}" for label, _ in rows[name]), flush=True)

    print(f"\nenv steps/s, medians of {args.rounds} interleaved rounds of {s} s "
          f"(load {os.getloadavg()[0]:.2f}):")
    print(f"| row | {'contestant':<16} | steps/s | ratio to the first (median) |")
    print("|---|---|---|---|")
    for name in args.rows:
        base_label = rows[name][0][0]
        base = np.array(results[name][base_label])
        for k, (label, _) in enumerate(rows[name]):
            vals = np.array(results[name][label])
            ratio = '' if k == 0 else f"{med(vals / base):.2f}"
            print(f"| {name} | {label:<16} | {med(vals):,.0f} | {ratio} |")
    if 'envpool' in args.rows:
        print_cpu_ceiling(ep_sync, cnn, np.array(results['envpool']['envpool raw']))
    sys.stdout.flush()
    os._exit(0)     # the original's threads never stop: do not wait for them


if __name__ == '__main__':
    main()
