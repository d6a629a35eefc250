"""EnvRunnerManager's faults and shutdown: env and predictor failures raised from step() or
close(), restarts, the watchdog's call timeouts, and close() under load or with hung calls."""

import threading
import time
import warnings

import numpy as np
import pytest

from expreplay import ManagerSettings, ReplayMemory
from expreplay.acting import CallTimeout, EnvError, EnvRunner, EnvRunnerManager, InferenceThread, ManagerClosed, PredictorError, RunnerError
from acting_helpers import (GUARD, H, MODES, StepPredictor, assert_all_stored, greedy_ok, live_threads,
                            sample_and_check, step_until_raises, settings_for)
from acting_helpers import no_thread_left_behind  # noqa: F401 (fixtures)
from scripted_env import ScriptedEnv, ScriptedEnvError

pytestmark = pytest.mark.timeout(60)


# ----------------------------------------------------------------------------- faults
@pytest.mark.parametrize('threads,where', [('per-runner', r'SimulatorThread-1 \(runner 1\)'),
                                           (None, r'SimulatorThread-0 \(runner 1\)'),
                                           (2, r'SimulatorThread-1 \(runner 1\)')],
                         ids=['thread-per-runner', 'default', 'pipelined-2-threads'])
def test_env_failure_surfaces_from_step_within_a_second(threads, where):
    failed_at = []

    def hook(env, action):
        if env.steps_taken + 1 == env.fail_at_step:
            failed_at.append(time.monotonic())

    envs = {i: ScriptedEnv(i, fail_at_step=(40 if i == 1 else None), step_hook=hook) for i in range(3)}
    mem = ReplayMemory(500, (6,), H)
    pred = StepPredictor()   # shared, as in training
    runners = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(3)]
    mgr = EnvRunnerManager(runners, 3, settings=settings_for(threads, runners))
    with pytest.raises(EnvError, match=where) as info:
        step_until_raises(mgr)
    assert time.monotonic() - failed_at[0] < 1.0
    assert isinstance(info.value.__cause__, ScriptedEnvError)
    with pytest.raises(EnvError):          # a failed manager keeps refusing
        mgr.step(0.5)
    mgr.close()                            # already reported: close does not raise it again
    mgr.close()
    assert_all_stored(envs, mem)           # everything stepped before the failure is stored
    sample_and_check(mem, envs, n_batches=2)


@pytest.mark.parametrize('threads', MODES)
def test_unreported_failure_is_raised_by_close(threads):
    failed = threading.Event()

    def hook(env, action):
        if env.steps_taken + 1 == env.fail_at_step:
            failed.set()

    envs = [ScriptedEnv(i, fail_at_step=5, step_hook=hook) for i in range(2)]
    mem = ReplayMemory(100, (6,), H)
    runners = [EnvRunner(e, None, mem, H, index=i) for i, e in enumerate(envs)]
    mgr = EnvRunnerManager(runners, 20, settings=settings_for(threads, runners))
    for _ in range(12):
        mgr.step(1.0)
    assert failed.wait(GUARD)
    with pytest.raises(EnvError) as info:
        mgr.close()
    assert isinstance(info.value.__cause__, ScriptedEnvError)
    mgr.close()


@pytest.mark.parametrize('n_runners,threads', [(1, None), (3, 'per-runner'), (3, None), (3, 2)],
                         ids=['inline', 'thread-per-runner', 'default', 'pipelined-2-threads'])
def test_predictor_failure_surfaces_from_step(n_runners, threads):
    calls = []

    def predictor(states):
        calls.append(time.monotonic())
        if len(calls) == 10:
            raise ValueError('bad weights')
        return [np.zeros((len(states), 3))]

    mem = ReplayMemory(500, (6,), H)
    runners = [EnvRunner(ScriptedEnv(i), predictor, mem, H, index=i) for i in range(n_runners)]
    with pytest.raises(PredictorError) as info:
        with EnvRunnerManager(runners, 2, settings=settings_for(threads, runners)) as mgr:
            step_until_raises(mgr)
    assert time.monotonic() - calls[9] < 1.0
    assert isinstance(info.value.__cause__, ValueError) and 'bad weights' in str(info.value)


@pytest.mark.parametrize('threads', MODES)
def test_failed_env_is_restarted_and_counted(threads):
    envs = {}

    def factory(env_id, fail):
        def make():
            envs[env_id] = ScriptedEnv(env_id, fail_at_step=fail)
            return envs[env_id]
        return make

    mem = ReplayMemory(500, (6,), H)
    pred = StepPredictor()   # shared, as in training
    runners = [EnvRunner(factory(i, 100 if i == 0 else None)(), pred, mem, H, index=i,
                         player_factory=factory(10 + i, 60))   # replacements fail after 60 steps
               for i in range(2)]
    mgr = EnvRunnerManager(runners, 2, settings=settings_for(threads, runners, max_restarts=1))
    with pytest.raises(EnvError):     # runner 0: restarted once, then its replacement fails
        step_until_raises(mgr)
    stats = mgr.stats()
    mgr.close()
    assert stats.restarts == 1 and runners[0].restarts == 1
    assert 10 in envs and envs[10].steps_taken == 60
    assert_all_stored(envs, mem)
    sample_and_check(mem, envs, n_batches=3)



class FailingReset(ScriptedEnv):
    """A scripted env whose ``fail_at``-th reset raises (a failure in the first half of a step)."""

    def __init__(self, env_id, fail_at=None, **kw):
        super().__init__(env_id, **kw)
        self.fail_at, self.reset_calls = fail_at, 0

    def reset(self, **kw):
        self.reset_calls += 1
        if self.reset_calls == self.fail_at:
            raise ScriptedEnvError("scripted reset failure")
        return super().reset(**kw)


@pytest.mark.parametrize('restarts', [0, 1])
def test_pipelined_reset_failure_books_every_request(restarts):
    envs = {i: FailingReset(i, fail_at=5 if i == 2 else None, episode_lengths=6) for i in range(4)}
    mem = ReplayMemory(500, (6,), H)
    pred = StepPredictor()
    runners = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(4)]
    mgr = EnvRunnerManager(runners, 8,
                           settings=ManagerSettings(simulator_threads=1, max_restarts=restarts))
    if restarts:
        for _ in range(300):
            mgr.step(0.0)
        mgr.wait_idle(GUARD)
        assert mgr.stats().restarts == 1
    else:
        with pytest.raises(EnvError, match=r'\(runner 2\)'):
            for _ in range(10_000):
                mgr.step(0.0)
        (thread,) = mgr.threads
        thread.join(GUARD)                            # the failed thread stops by itself
        assert not thread.is_alive()
    stats = mgr.stats()
    mgr.close()
    # Every request the thread took was booked as finished (queued ones were never taken).
    assert stats.queue_depth - stats.queued == 0
    assert not any(g.in_step for g in mgr.groups)     # no step left half begun
    greedy_ok(envs)
    assert_all_stored(envs, mem)
    sample_and_check(mem, envs, n_batches=3)


@pytest.mark.parametrize('failing', ['InferenceThread', 'SimulatorThread'])
def test_a_thread_whose_context_fails_fails_the_manager(failing):
    class Context:
        def __enter__(self):
            if threading.current_thread().name.startswith(failing):
                raise RuntimeError('no graph here')

        def __exit__(self, *exc):
            pass

    mem = ReplayMemory(100, (6,), H)
    runners = [EnvRunner(ScriptedEnv(i), StepPredictor(), mem, H, index=i) for i in range(3)]
    mgr = EnvRunnerManager(runners, 2,
                           settings=ManagerSettings(simulator_threads=1, thread_context=Context))
    with pytest.raises(RunnerError) as info:      # not a hang once the window is full
        step_until_raises(mgr)
    assert isinstance(info.value.__cause__, RuntimeError) and 'no graph here' in str(info.value)
    mgr.close()


def test_pipelined_stats_count_one_call_per_group():
    envs = {i: ScriptedEnv(i) for i in range(4)}
    mem = ReplayMemory(500, (6,), H)
    pred = StepPredictor()
    runners = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(4)]
    with EnvRunnerManager(runners, 8, settings=ManagerSettings(simulator_threads=1)) as mgr:
        for _ in range(200):
            mgr.step(0.0)
        mgr.wait_idle(GUARD)
        s = mgr.stats()
    # Exploration 0: every step is one predicted row; a group holds two runners.
    assert s.steps == 200 and round(s.inference_calls * s.mean_inference_batch) == 200
    assert s.max_inference_batch == 2 == max(pred.batch_sizes)
    assert s.inference_calls == len(pred.batch_sizes)


# ----------------------------------------------------------------------------- shutdown
@pytest.mark.parametrize('threads', MODES)
def test_close_under_load_joins_every_thread(threads):
    envs = {i: ScriptedEnv(i) for i in range(4)}
    mem = ReplayMemory(300, (6,), H)
    pred = StepPredictor()   # shared, as in training
    runners = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(4)]
    mgr = EnvRunnerManager(runners, 16, settings=settings_for(threads, runners))
    started = set(live_threads())
    assert len(started) == {'per-runner': 4, None: 1, 2: 2}[threads] + 1   # + the InferenceThread
    running = threading.Event()
    errors = []

    def trainer():
        try:
            while True:
                mgr.step(0.3)
                if sum(e.steps_taken for e in envs.values()) > 200:
                    running.set()
        except ManagerClosed as err:
            errors.append(err)

    t = threading.Thread(target=trainer)
    t.start()
    assert running.wait(GUARD)
    start = time.monotonic()
    mgr.close()
    assert time.monotonic() - start < 2.0
    t.join(GUARD)
    assert errors and not t.is_alive()
    assert mgr.stuck_threads == [] and not any(t.is_alive() for t in started)
    mgr.close()                                   # idempotent
    with pytest.raises(ManagerClosed):
        mgr.step(0.5)
    assert_all_stored(envs, mem)                  # no step taken was lost
    sample_and_check(mem, envs, n_batches=3)


@pytest.mark.parametrize('threads', MODES)
def test_close_while_envs_hang_in_reset_warns_and_threads_end_when_released(threads):
    gate = threading.Event()
    envs = [ScriptedEnv(i, reset_gate=gate, hang_on_reset=1) for i in range(2)]
    mem = ReplayMemory(100, (6,), H)
    pred = StepPredictor()   # shared, as in training
    runners = [EnvRunner(e, pred, mem, H, index=i) for i, e in enumerate(envs)]
    mgr = EnvRunnerManager(runners, 2, settings=settings_for(threads, runners))
    mgr.step(0.5)
    if threads == 'per-runner':
        mgr.step(0.5)     # one request per thread: both threads reset their env first, and hang
        assert envs[0].in_reset.wait(GUARD) and envs[1].in_reset.wait(GUARD)
        stuck = ['SimulatorThread-0', 'SimulatorThread-1']
    else:                 # the one thread hangs in the first reset
        assert envs[0].in_reset.wait(GUARD) or envs[1].in_reset.wait(GUARD)
        stuck = ['SimulatorThread-0']
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match=', '.join(stuck)):
        mgr.close(timeout=0.3)
    assert time.monotonic() - start < 1.5
    assert mgr.stuck_threads == stuck
    assert all(t.daemon and t.is_alive() for t in mgr.threads if t.name in stuck)
    gate.set()                                  # the resets return: the threads stop
    for t in mgr.threads:
        t.join(GUARD)
        assert not t.is_alive()
    assert all(e.closed for e in envs)         # each closed its own runner (and env) on the way out


@pytest.mark.parametrize('threads', MODES)
def test_close_while_predictor_hangs_releases_a_blocked_step(threads):
    release, entered = threading.Event(), threading.Event()

    leader = []

    def predictor(states):
        leader.append(threading.current_thread().name)
        entered.set()
        assert release.wait(GUARD)
        return [np.zeros((len(states), 3))]

    mem = ReplayMemory(100, (6,), H)
    runners = [EnvRunner(ScriptedEnv(i), predictor, mem, H, index=i) for i in range(3)]
    mgr = EnvRunnerManager(runners, 2, settings=settings_for(threads, runners))
    mgr.step(0.0)
    mgr.step(0.0)
    assert entered.wait(GUARD)
    outcome = []

    def blocked_step():   # the window is full and nothing finishes: this step() blocks
        try:
            mgr.step(0.0)
        except ManagerClosed as err:
            outcome.append(err)

    t = threading.Thread(target=blocked_step)
    t.start()
    with pytest.warns(RuntimeWarning, match=leader[0]):
        mgr.close(timeout=0.3)
    t.join(GUARD)
    assert outcome and not t.is_alive()
    # Only the thread inside the predictor is left; a runner waiting for its result was released.
    assert mgr.stuck_threads == leader
    release.set()                               # the predictor returns: its thread stops
    for th in mgr.threads:
        th.join(GUARD)
        assert not th.is_alive()


@pytest.mark.parametrize('threads', MODES)
def test_a_hung_env_step_is_a_call_timeout_from_step(threads):
    gate = threading.Event()

    def hook(env, action):
        if env.env_id == 1 and env.steps_taken == 20:
            assert gate.wait(GUARD)

    envs = {i: ScriptedEnv(i, step_hook=hook) for i in range(3)}
    mem = ReplayMemory(300, (6,), H)
    runners = [EnvRunner(envs[i], StepPredictor(), mem, H, index=i) for i in range(3)]
    # 1 s, not less: on a loaded machine a healthy call can stall for a few tenths of a second,
    # and the watchdog would name it instead of the hung one.
    mgr = EnvRunnerManager(runners, 3, settings=settings_for(threads, runners, call_timeout=1.0))
    start = None
    try:
        with pytest.raises(CallTimeout, match=r'SimulatorThread-\d.*an env step') as info:
            for _ in range(10_000):
                mgr.step(0.5)
                if start is None and envs[1].steps_taken >= 20:
                    start = time.monotonic()
        assert start is not None and time.monotonic() - start < 1.0 + 2.0
        assert 'call_timeout=1.0' in str(info.value)
    finally:
        gate.set()
        mgr.close()


def test_timeouts_accept_infinity_and_refuse_negative_or_nan():
    mem = ReplayMemory(100, (6,), H)
    runners = [EnvRunner(ScriptedEnv(i), None, mem, H, index=i) for i in range(2)]
    forever = ManagerSettings(close_timeout=float('inf'), call_timeout=float('inf'))
    with EnvRunnerManager(runners, 2, settings=forever) as mgr:
        for _ in range(20):
            mgr.step(1.0, timeout=float('inf'))
        mgr.wait_idle(float('inf'))
    for kw in ({'close_timeout': -1}, {'close_timeout': float('nan')}, {'call_timeout': -0.5},
               {'call_timeout': 0}, {'max_restarts': -1}):
        with pytest.raises((ValueError, TypeError), match=next(iter(kw))):
            ManagerSettings(**kw)


def test_a_second_close_waits_for_the_first():
    gate = threading.Event()
    envs = [ScriptedEnv(i, reset_gate=gate, hang_on_reset=2, episode_lengths=3) for i in range(2)]
    mem = ReplayMemory(100, (6,), H)
    runners = [EnvRunner(e, None, mem, H, index=i) for i, e in enumerate(envs)]
    mgr = EnvRunnerManager(runners, 2)
    deadline = time.monotonic() + GUARD
    while not (envs[0].in_reset.is_set() or envs[1].in_reset.is_set()):   # until a reset hangs
        assert time.monotonic() < deadline
        try:
            mgr.step(1.0, timeout=0.01)
        except TimeoutError:
            pass
    order = []

    def close(tag, timeout):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', RuntimeWarning)
            mgr.close(timeout=timeout)
        order.append(tag)

    first = threading.Thread(target=close, args=('first', 0.5))
    first.start()
    # The first close has begun (it notifies when it marks closed).
    assert mgr.wait_for(lambda: mgr.closed, GUARD)
    second = threading.Thread(target=close, args=('second', GUARD))
    second.start()
    first.join(GUARD)
    second.join(GUARD)
    gate.set()
    assert order == ['first', 'second']
    for t in mgr.threads:
        t.join(GUARD)
