"""EnvRunnerManager end to end through its threads into a real ReplayMemory: every threading
mode, the staleness guarantee, batched inference, pipelining, statistics and thread contexts."""

import threading
import time

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from expreplay import ManagerSettings, ReplayMemory
from expreplay.acting import EnvRunner, EnvRunnerManager, InferenceThread
from expreplay.stats import ManagerStats, ScoreWindow
from acting_helpers import (DEFAULT, GUARD, crossed, H, MODES, PER_RUNNER, PIPELINED_1, StepPredictor,
                            assert_all_stored, assert_scores, greedy_ok, sample_and_check, settings_for)
from acting_helpers import kernels, no_thread_left_behind  # noqa: F401 (fixtures)
from scripted_env import OldApiScriptedEnv, ScriptedEnv, decode

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize('env_cls,threads', crossed([ScriptedEnv, OldApiScriptedEnv], MODES))
def test_threads_end_to_end_every_sampled_transition(env_cls, threads, kernels):
    envs = {i: env_cls(i, episode_lengths=(5, 3, 8, 13), ends=('terminated', 'truncated', 'truncated'))
            for i in range(3)}
    mem = ReplayMemory(120, (6,), H, block_size=8)    # small: the run wraps around many times
    pred = StepPredictor()
    runners = [EnvRunner(envs[i], pred, mem, H, seed=3, index=i) for i in range(3)]
    checked = 0
    with EnvRunnerManager(runners, maximum_staleness=4, settings=settings_for(threads, runners)) as mgr:
        for k in range(1500):
            mgr.step(0.0 if k % 2 else 1.0)
            if k % 300 == 299:   # sample while the threads write
                checked += sample_and_check(mem, envs, n_batches=3)
        mgr.wait_idle(GUARD)
        games = [s for r in runners for s in r.total_scores]
        stats = mgr.stats()
        mean, mx = mgr.reset_stats()
    checked += sample_and_check(mem, envs)
    assert checked >= 1000
    assert mem.num_steps_written > 10 * mem.max_size
    assert_all_stored(envs, mem)
    assert stats.games == len(games) > 100 and stats.queue_depth <= 4
    assert mean == pytest.approx(np.mean(games)) and mx == max(games)
    assert_scores(envs, games)
    assert mgr.reset_stats() == (None, None)
    assert sum(pred.batch_sizes) > 0     # the predictor checked every state it was given


def test_single_runner_runs_inline_without_threads():
    env = ScriptedEnv(0)
    mem = ReplayMemory(500, (6,), H)
    pred = StepPredictor()
    runner = EnvRunner(env, pred, mem, H, seed=1)
    before = threading.active_count()
    with EnvRunnerManager([runner], maximum_staleness=8) as mgr:
        assert threading.active_count() == before
        for _ in range(300):
            mgr.step(0.0)
            assert len(env.transitions) == runner.steps   # executed before step() returned
        stats = mgr.stats()
    greedy_ok({0: env})
    assert stats.inference_calls > 0 and stats.mean_inference_batch == 1.0
    sample_and_check(mem, {0: env})
    assert_all_stored({0: env}, mem)


@pytest.mark.parametrize('mode,threads', crossed(
    [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED],
    [DEFAULT, PER_RUNNER, PIPELINED_1]))
def test_vector_env_runners_end_to_end(mode, threads, kernels):
    envs = {}

    def make(i):
        def fn():
            envs[i] = ScriptedEnv(i, episode_lengths=(4, 7, 2), ends=('truncated', 'terminated'))
            return envs[i]
        return fn

    venvs = [SyncVectorEnv([make(3 * r + j) for j in range(3)], autoreset_mode=mode) for r in range(2)]
    mem = ReplayMemory(200, (6,), H, block_size=8)
    pred = StepPredictor()
    runners = [EnvRunner(v, pred, mem, H, seed=100, index=r) for r, v in enumerate(venvs)]
    assert runners[0].num_envs == 3
    with EnvRunnerManager(runners, maximum_staleness=2, settings=settings_for(threads, runners)) as mgr:
        for _ in range(600):
            mgr.step(0.0)
    games = [s for r in runners for s in r.total_scores]   # after close: no game is in flight
    greedy_ok(envs)                 # also: the autoreset step's ignored action is never stored
    assert_all_stored(envs, mem)
    assert_scores(envs, games)
    sample_and_check(mem, envs)
    assert [envs[i].seeds[0] for i in range(6)] == [100, 101, 102, 103, 104, 105]
    assert max(pred.batch_sizes) >= 3   # one predictor row per sub-env, in one call


# ----------------------------------------------------------------------------- staleness
def _gated_runners(n_runners, gate, entered, mem):
    """Runners whose every env step waits for one permit of ``gate`` (after releasing one of
    ``entered``): the test decides when each step may complete."""
    def hook(env, action):
        entered.release()
        assert gate.acquire(timeout=GUARD)
    envs = {i: ScriptedEnv(i, step_hook=hook) for i in range(n_runners)}
    return envs, [EnvRunner(envs[i], StepPredictor(), mem, H, index=i) for i in range(n_runners)]


@pytest.mark.parametrize('threads', MODES)
@pytest.mark.parametrize('staleness,n_runners', [(1, 3), (3, 2), (3, 5), (5, 8)])
def test_staleness_guarantee_holds_in_every_mode(staleness, n_runners, threads):
    """A request is executed (its step in the memory) before more than maximum_staleness later
    ones are accepted; refused only while the window is full; no request is lost."""
    n = 60
    gate, entered = threading.Semaphore(0), threading.Semaphore(0)
    mem = ReplayMemory(500, (6,), H)
    envs, runners = _gated_runners(n_runners, gate, entered, mem)
    with EnvRunnerManager(runners, staleness, settings=settings_for(threads, runners)) as mgr:
        for k in range(n):
            while True:
                try:
                    mgr.step(0.5, timeout=0)
                    break
                except TimeoutError:
                    assert k >= staleness, k       # fewer pending than the window: never refused
                    # Let one waiting env step complete, and wait until it is booked.
                    assert entered.acquire(timeout=GUARD)
                    before = mgr.progress()[1]
                    gate.release()
                    assert mgr.wait_for(lambda: mgr.progress()[1] < before, GUARD)
            # Accepted k: requests 0 .. k - staleness are executed, their steps stored.
            assert mem.num_steps_written >= k - staleness + 1, (k, mem.num_steps_written)
        for _ in range(n):
            gate.release()
        mgr.wait_idle(GUARD)
    assert mem.num_steps_written == n == sum(len(e.transitions) for e in envs.values())
    greedy_ok({})


# ----------------------------------------------------------------------------- batching
def test_manager_merges_the_states_of_threads_waiting_at_once():
    """A thread per runner: states submitted while a call runs all go into the next call."""
    envs = {i: ScriptedEnv(i) for i in range(4)}
    inner = StepPredictor()
    first_call = []
    holder = {}

    def predictor(states):
        if not first_call:
            first_call.append(len(states))
            # The call runs unlocked: wait until the other runners have submitted.
            assert holder['it'].wait_queued(4 - len(states), GUARD)
        return inner(states)

    mem = ReplayMemory(500, (6,), H)
    runners = [EnvRunner(envs[i], predictor, mem, H, index=i) for i in range(4)]
    with EnvRunnerManager(runners, maximum_staleness=8,
                          settings=ManagerSettings(simulator_threads=4)) as mgr:
        (holder['it'],) = mgr.inference_threads
        for _ in range(400):
            mgr.step(0.0)
        mgr.wait_idle(GUARD)
        stats = mgr.stats()
    first = first_call[0]
    # All four in the first call, or the ones that waited during it together in the second.
    assert first == 4 or inner.batch_sizes[1] == 4 - first, inner.batch_sizes[:2]
    assert stats.mean_inference_batch > 1.0
    greedy_ok(envs)
    sample_and_check(mem, envs)


@pytest.mark.slow
def test_pipelined_thread_steps_one_group_while_the_other_is_predicted():
    """One simulator thread, four single-env runners (two groups of two): a group's forward
    pass runs while the other group's envs step. Each predictor call waits (up to a second)
    for an env of another group to step during it: a thread that predicted and stepped in
    turn would make every call time out and see no overlap."""
    lock = threading.Lock()
    state = {'calling': frozenset(), 'stepped_during': threading.Event()}
    overlaps = []

    def hook(env, action):
        with lock:
            if state['calling'] and env.env_id not in state['calling']:
                state['stepped_during'].set()

    inner = StepPredictor()

    def predictor(states):
        ids = frozenset(decode(s[..., -1])[0] for s in states)
        with lock:
            state['calling'], state['stepped_during'] = ids, threading.Event()
            stepped = state['stepped_during']
        overlaps.append(stepped.wait(0.5))
        with lock:
            state['calling'] = frozenset()
        return inner(states)

    envs = {i: ScriptedEnv(i, step_hook=hook) for i in range(4)}
    mem = ReplayMemory(500, (6,), H)
    runners = [EnvRunner(envs[i], predictor, mem, H, index=i) for i in range(4)]
    with EnvRunnerManager(runners, 8, settings=ManagerSettings(simulator_threads=1)) as mgr:
        assert mgr.pipelined
        for _ in range(60):
            mgr.step(0.0)
        mgr.wait_idle(GUARD)
    assert max(inner.batch_sizes) == 2                     # one group (half the runners) per call
    # Serial acting would overlap never; a call can miss only while the caller has queued no
    # request for the other group yet.
    assert sum(overlaps) >= len(overlaps) // 2, overlaps
    greedy_ok(envs)
    assert_all_stored(envs, mem)
    sample_and_check(mem, envs)


@pytest.mark.parametrize('staleness', [1, 3])
def test_pipelined_runners_take_turns_when_requests_are_fewer_than_runners(staleness):
    envs = {i: ScriptedEnv(i) for i in range(4)}
    mem = ReplayMemory(500, (6,), H)
    runners = [EnvRunner(envs[i], StepPredictor(), mem, H, index=i) for i in range(4)]
    with EnvRunnerManager(runners, staleness, settings=ManagerSettings(simulator_threads=1)) as mgr:
        for _ in range(120):
            mgr.step(0.0)
        mgr.wait_idle(GUARD)
    steps = [r.steps for r in runners]
    assert sum(steps) == 120 and max(steps) - min(steps) <= staleness, steps
    greedy_ok(envs)
    assert_all_stored(envs, mem)


def test_simulator_threads_must_be_between_one_and_the_number_of_runners():
    mem = ReplayMemory(100, (6,), H)
    runners = [EnvRunner(ScriptedEnv(i), None, mem, H, index=i) for i in range(3)]
    for bad in (0, 4, 1.5, True):
        with pytest.raises((ValueError, TypeError), match='simulator_threads'):
            EnvRunnerManager(runners, 2, settings=ManagerSettings(simulator_threads=bad))
    one_each = ManagerSettings(simulator_threads=3)
    with EnvRunnerManager(runners, 2, settings=one_each) as mgr:
        assert not mgr.pipelined and len(mgr.threads) == 3


@pytest.mark.parametrize('threads', MODES)
def test_stats_figures(threads):
    envs = {i: ScriptedEnv(i, episode_lengths=4) for i in range(2)}
    mem = ReplayMemory(300, (6,), H)
    pred = StepPredictor()   # shared, as in training
    runners = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(2)]
    with EnvRunnerManager(runners, 2, settings=settings_for(threads, runners)) as mgr:
        assert mgr.reset_stats() == (None, None)
        for _ in range(100):
            mgr.step(0.0)
        mgr.wait_idle(GUARD)
        s = mgr.stats()
        assert type(s) is ManagerStats
        # Greedy action t % 3 from step t earns 10 * (t % 3) + t: 0 + 11 + 22 + 3 per game.
        assert s.steps == 100 and s.games == sum(r.steps // 4 for r in runners) >= 24
        assert s.mean_episode_length == 4.0 and s.steps_per_sec > 0
        assert s.mean_score == s.max_score == 36.0
        assert s.inference_calls >= 1 and 1.0 <= s.mean_inference_batch <= 2.0
        assert s.queue_depth == 0 and s.queued == 0 and s.restarts == 0
        window = mgr.reset_stats()
        mean, mx = window          # a ScoreWindow unpacks as tensorpack's (mean, max)
        assert type(window) is ScoreWindow and (window.mean, window.max) == (mean, mx)
        assert (mean, mx) == (s.mean_score, s.max_score)
        assert mgr.stats().games == 0 and mgr.stats().steps == 0


@pytest.mark.parametrize('threads,names', [
    ('per-runner', {'SimulatorThread-0', 'SimulatorThread-1', 'SimulatorThread-2', 'InferenceThread'}),
    (None, {'SimulatorThread-0', 'InferenceThread'}),
    (2, {'SimulatorThread-0', 'SimulatorThread-1', 'InferenceThread'})],
    ids=['thread-per-runner', 'default', 'pipelined-2-threads'])
def test_thread_context_is_entered_by_every_thread_the_manager_starts(threads, names):
    entered, lock = set(), threading.Lock()

    class Context:
        def __enter__(self):
            with lock:
                entered.add(threading.current_thread().name)

        def __exit__(self, *exc):
            pass

    mem = ReplayMemory(100, (6,), H)
    pred = StepPredictor()
    runners = [EnvRunner(ScriptedEnv(i), pred, mem, H, index=i) for i in range(3)]
    with EnvRunnerManager(runners, 3,
                          settings=settings_for(threads, runners, thread_context=Context)) as mgr:
        for _ in range(30):
            mgr.step(0.0)
    assert entered == names
