"""EnvRunnerManager, EnvRunner and ReplayMemory arguments refused at construction, naming the
argument; a hung reset reported as a reset."""

import threading

import pytest

from expreplay import EnvRunner, EnvRunnerManager, ManagerSettings, ReplayMemory
from expreplay.acting import ActingGroup, CallTimeout
from scripted_env import ScriptedEnv
from acting_helpers import MODES, H, StepPredictor, settings_for


def runners(n=2):
    mem = ReplayMemory(300, (6,), H)
    return [EnvRunner(ScriptedEnv(i), None, mem, H, index=i) for i in range(n)]


@pytest.mark.parametrize('bad', [3, 'nullcontext', object()])
def test_a_thread_context_that_is_not_callable_is_refused_at_construction(bad):
    with pytest.raises(TypeError, match='thread_context must be a callable'):
        ManagerSettings(thread_context=bad)


def test_env_runners_must_be_runners():
    with pytest.raises(TypeError, match=r'env_runners\[0\] must be an EnvRunner, got 1 \(int\)'):
        EnvRunnerManager([1, 2], 2)
    good = runners()
    with pytest.raises(TypeError, match=r'env_runners\[1\] must be an EnvRunner'):
        EnvRunnerManager([good[0], 'runner'], 2)
    for bad in (3, good[0]):
        with pytest.raises(TypeError, match='env_runners must be a list of EnvRunner'):
            EnvRunnerManager(bad, 2)


def test_a_negative_seed_is_refused_at_construction():
    mem = ReplayMemory(100, (6,), H)
    with pytest.raises(ValueError, match=r'seed must be >= 0, got -1'):
        EnvRunner(ScriptedEnv(0), None, mem, H, seed=-1)
    runner = EnvRunner(ScriptedEnv(0), None, mem, H, seed=0)
    group = ActingGroup([runner])
    group.step(1.0)
    runner.close()


def test_a_memory_too_large_for_the_machine_says_how_much_and_what_to_do():
    with pytest.raises(MemoryError, match=r'ReplayMemory\(max_size=10000000000000\) of \(84, 84\) '
                                          r'uint8 frames needs about [\d.]+ TB.*each step takes '
                                          r'7069 bytes: choose a smaller max_size'):
        ReplayMemory(1e13, (84, 84), 4)
    with pytest.raises(MemoryError, match=r'7086 bytes'):      # the priority tree counted too
        ReplayMemory(1e13, (84, 84), 4, prioritized=True)
    assert ReplayMemory(1e6, (84, 84), 4).max_size == 1_000_000      # lazily mapped: accepted


@pytest.mark.parametrize('threads', MODES)
def test_a_hung_reset_is_reported_as_a_reset_of_its_runner(threads):
    gate = threading.Event()
    # Runner 1's second reset (after its first game) hangs until the test releases it.
    envs = {i: ScriptedEnv(i, reset_gate=gate if i == 1 else None, hang_on_reset=2)
            for i in range(3)}
    mem = ReplayMemory(300, (6,), H)
    rs = [EnvRunner(envs[i], StepPredictor(), mem, H, index=i) for i in range(3)]
    # 1 s, not less: on a loaded machine a healthy call can stall for a few tenths of a second,
    # and the watchdog would name it instead of the hung one.
    mgr = EnvRunnerManager(rs, 3, settings=settings_for(threads, rs, call_timeout=1.0))
    try:
        with pytest.raises(CallTimeout) as info:
            for _ in range(10_000):
                mgr.step(0.5)
        assert envs[1].in_reset.is_set()
        message = str(info.value)
        assert 'a reset of runner 1 (player ScriptedEnv)' in message, message
        assert 'env step' not in message and 'call_timeout=1.0' in message
    finally:
        gate.set()
        mgr.close()
    assert not any(t.is_alive() for t in mgr.threads)

