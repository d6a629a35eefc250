"""What the tests of runners, the manager and the inference thread share: scripted predictors,
checks of what reached the memory, the threading modes, and the fixtures ``kernels`` (both
acting paths: the C kernels and numpy) and ``no_thread_left_behind``.

The scripted envs (tests/scripted_env.py) encode (env, episode, step) in their frames, so every
sampled transition is checked against what the env emitted. Synchronisation is by Events and
Conditions only; timeouts are hang guards.
"""

import threading

import numpy as np
import pytest

from expreplay import ManagerSettings, ReplayMemory
from kernel_paths import kernel_path
from scripted_env import check_batch, decode

GUARD = 10.0   # seconds: only ever a hang guard
H = 3          # history_len of the scripted tests

# EnvRunnerManager's threading modes: the default (None: chosen for the runners; for single
# envs one pipelined thread), a thread per runner ('per-runner', turned into len(runners)
# by settings_for), and fewer threads than runners (pipelined).
DEFAULT = pytest.param(None, id='default')
PER_RUNNER = pytest.param('per-runner', id='thread-per-runner')
PIPELINED_1 = pytest.param(1, id='pipelined-1-thread')
PIPELINED_2 = pytest.param(2, id='pipelined-2-threads')
MODES = [DEFAULT, PER_RUNNER, PIPELINED_2]


def crossed(first, second):
    """Every pair of two parametrizations (values or ``pytest.param`` s with one value each),
    as params ``(a, b)``. The not-slow run keeps each value of either paired with the other's
    first value; the other pairs are marked slow (the full run has them all)."""
    def as_param(v):
        return v if hasattr(v, 'values') else pytest.param(v, id=getattr(v, '__name__', str(v)))
    first, second = [as_param(v) for v in first], [as_param(v) for v in second]
    return [pytest.param(a.values[0], b.values[0], id=f'{a.id}-{b.id}',
                         marks=() if i == 0 or j == 0 else pytest.mark.slow)
            for i, a in enumerate(first) for j, b in enumerate(second)]


def settings_for(threads, runners, **settings):
    """The manager's settings for a mode of the parametrization above, and ``settings``."""
    return ManagerSettings(simulator_threads=len(runners) if threads == 'per-runner' else threads,
                           **settings)


# ----------------------------------------------------------------------------- helpers
class StepPredictor:
    """Q-values that make the greedy action ``step % num_actions`` of the newest frame.

    Also checks every state it is given: channels-last, oldest first, consecutive frames of
    one episode, zeros before its start (what the memory will give the learner). With
    ``life_every`` (scripted lives, life loss terminal) an episode starts at each lost life.
    """

    def __init__(self, num_actions=3, history_len=H, life_every=None):
        self.num_actions = num_actions
        self.history_len = history_len
        self.life_every = life_every
        self.batch_sizes = []
        self.lock = threading.Lock()

    def __call__(self, states):
        with self.lock:
            self.batch_sizes.append(len(states))
        q = np.zeros((len(states), self.num_actions), np.float32)
        for b, s in enumerate(states):
            frames = [decode(s[..., k]) for k in range(self.history_len)]
            env_id, ep, t = frames[-1]
            start = 0 if self.life_every is None else t // self.life_every * self.life_every
            for k, f in enumerate(frames):
                back = self.history_len - 1 - k
                assert f == ((env_id, ep, t - back) if t - back >= start else None), frames
            q[b, t % self.num_actions] = 1.0
        return [q]


def greedy_ok(envs):
    """With exploration 0 every action the envs saw is the greedy one."""
    for env in envs.values():
        for (ep, t), rec in env.transitions.items():
            assert rec[0] == t % 3, (env.env_id, ep, t, rec)


def assert_all_stored(envs, mem):
    """Every step any env took is in the memory (nothing buffered or lost)."""
    assert sum(len(e.transitions) for e in envs.values()) == mem.num_steps_written


def assert_scores(envs, runners_games):
    """Finished-game scores equal the env's summed rewards per episode."""
    want = []
    for env in envs.values():
        per_ep = {}
        ended = set()
        for (ep, t), (a, r, term, trunc, lives) in env.transitions.items():
            per_ep[ep] = per_ep.get(ep, 0.0) + r
            if term or trunc:
                ended.add(ep)
        want += [per_ep[ep] for ep in ended]
    assert sorted(want) == sorted(runners_games)


def sample_and_check(mem, envs, n_batches=10, batch=64, **kw):
    rng = np.random.default_rng(0)
    assert len(mem) >= 16, len(mem)
    batch = min(batch, len(mem))
    return sum(check_batch(mem.sample_batch(batch, rng=rng), envs, H, **kw) for _ in range(n_batches))


def step_until_raises(mgr, n=10_000):
    """Step with exploration 0.5 until the manager raises its fault (AssertionError if none)."""
    for _ in range(n):
        mgr.step(0.5)
    raise AssertionError("no fault surfaced")


def live_threads():
    return [t for t in threading.enumerate()
            if t.name.startswith(('SimulatorThread', 'InferenceThread'))]


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    before = set(live_threads())
    yield
    left = [t for t in live_threads() if t not in before]
    for t in left:
        t.join(GUARD)
    assert not [t.name for t in left if t.is_alive()]


class RecordingBatchWriter:
    """A BatchWriter that logs every call per lane, as the scalar calls a LaneWriter would get."""

    def __init__(self, writer, lanes):
        self.writer, self.lanes = writer, lanes

    def start_episodes(self, lanes, frames, **kw):
        for lane, frame in zip(np.asarray(lanes).tolist(), frames):
            self.lanes[lane].append(('start', np.array(frame)))
        self.writer.start_episodes(lanes, frames, **kw)

    def add_steps(self, lanes, actions, rewards, next_frames, terminated, truncated, **kw):
        for j, lane in enumerate(np.asarray(lanes).tolist()):
            self.lanes[lane].append(('step', int(actions[j]), float(rewards[j]), np.array(next_frames[j]),
                                     bool(terminated[j]), bool(truncated[j])))
        self.writer.add_steps(lanes, actions, rewards, next_frames, terminated, truncated, **kw)

    def try_add_steps(self, *args, **kw):
        return False    # the general path, so that every step is logged

    def close(self):
        self.writer.close()


class RecordingMemory:
    """A ReplayMemory whose writers log every call, per lane (in the order lanes are made)."""

    def __init__(self, *args, **kw):
        self.mem = ReplayMemory(*args, **kw)
        self.state_shape, self.dtype, self.history_len = self.mem.state_shape, self.mem.dtype, self.mem.history_len
        self.lanes = []

    @property
    def num_steps_written(self):
        return self.mem.num_steps_written

    def new_batch_writer(self, k):
        lanes = [[] for _ in range(k)]
        self.lanes.extend(lanes)
        return RecordingBatchWriter(self.mem.new_batch_writer(k), lanes)


# ----------------------------------------------------------------------------- end to end
# The numpy path runs in the full suite (it is what a machine without a compiler runs).
@pytest.fixture(params=['C kernels', pytest.param('numpy', marks=pytest.mark.slow)])
def kernels(request):
    """Run a test with the optional C kernels of the acting path, and with the numpy path
    they are a shortcut for (as on a machine without a compiler)."""
    with kernel_path(request.param, '_acting_ext', '_write_ext', '_gather_ext'):
        yield request.param
