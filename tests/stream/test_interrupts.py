"""A stop at any instant: signals never land inside the memory's code, a checkpoint saved at a
stop always loads, a second signal never skips the save, a dropped stream leaves no thread.

The random-instant runs happen in a child process (``interrupted_runs.py``): signals are handled
in a process's main thread, and real ones (``os.kill``) are sent there.
"""

import gc
import json
import os
import signal
import subprocess
import sys
import threading

import gymnasium as gym
import numpy as np
import pytest

from expreplay import interrupts
from expreplay.interrupts import DeferredHandler, stop_on_signals
from test_stream import EnvFactory, make_stream, take

HERE = os.path.dirname(os.path.abspath(__file__))
STREAM_THREADS = ('SimulatorThread', 'InferenceThread', 'ReplayStream-prefetch')


def run_child(tmp_path, *args, timeout):
    """interrupted_runs.py's JSON lines (it fails the test if it dies)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(HERE), os.environ.get('PYTHONPATH', '')]))
    out = subprocess.run([sys.executable, os.path.join(HERE, 'interrupted_runs.py'), *args],
                         capture_output=True, text=True, timeout=timeout, env=env,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{')]


def test_signals_during_the_memorys_own_calls_leave_it_consistent(tmp_path):
    """The main thread in a tight loop of writes, episode starts, prioritized draws and
    priority updates, a SIGINT at a random instant of each of 300 runs, the same writer going on
    after each: every save loads (without the deferral, a run breaks the tables within a few
    dozen runs: "the free and retired lists are not a partition of the blocks")."""
    rows = run_child(tmp_path, '--writes', '300', '0', str(tmp_path), timeout=600)
    assert len(rows) == 300
    assert [r['problems'] for r in rows if r['problems']] == []
    assert all(r['handled'] == 1 for r in rows)     # every signal raised, once


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize('double', [False, True], ids=['one signal', 'two signals'])
def test_streams_stopped_at_random_instants_save_checkpoints_that_load(tmp_path, double):
    """One- and two-player streams, uniform and prioritized, stopped by SIGINT or SIGTERM at
    random instants of the fill and of the training (at least 100 of each with one signal),
    or by two signals 0-5 ms apart: every checkpoint saved at the stop loads and holds what
    the memory holds, and no thread of the stream is left."""
    runs = 300 if not double else 120
    rows = run_child(tmp_path, str(runs), '7' if double else '3', str(tmp_path),
                     *(['--double'] if double else []), timeout=1400)
    assert len(rows) == runs
    assert [r['problems'] for r in rows if r['problems']] == []
    assert [r['alive'] for r in rows if r['alive']] == []
    phases = [r['phase'] for r in rows]
    if not double:
        assert phases.count('fill') >= 100 and phases.count('training') >= 100, phases
    assert {(r['players'], r['prioritized']) for r in rows} == {
        (1, False), (1, True), (2, False), (2, True)}


# ---------------------------------------------------------------------------- the handler
def storage_call(inner):
    """Stands for a memory's method: code of a module under expreplay.storage."""
    namespace = {'__name__': 'expreplay.storage.fake'}
    exec('def call(inner):\n    inner()\n    return "returned"\n', namespace)
    return namespace['call'](inner)


def test_a_handler_runs_at_once_outside_the_memorys_code():
    seen = []
    handler = DeferredHandler(lambda signum, frame: seen.append(signum))
    handler(signal.SIGINT, sys._getframe())
    assert seen == [signal.SIGINT]


def test_inside_the_memorys_code_the_handler_runs_as_its_call_returns():
    """The handler's exception comes out of the memory's call after its last statement."""
    order = []

    def raise_interrupt(signum, frame):
        order.append('handler')
        raise KeyboardInterrupt

    handler = DeferredHandler(raise_interrupt)

    def inner():
        handler(signal.SIGINT, sys._getframe())    # a signal arrives in the memory's code
        order.append('after the signal')
        handler(signal.SIGINT, sys._getframe())    # a second one: still one handler run

    with pytest.raises(KeyboardInterrupt):
        storage_call(inner)
    assert order == ['after the signal', 'handler']
    assert sys.gettrace() is None      # the tracing is off again


def test_under_a_tracer_the_handler_waits_all_the_same():
    """With a trace function of someone else's (a debugger, coverage), the handler is asked
    again from a timer thread until it is outside the memory's code."""
    caught = threading.Event()

    def handler(signum, frame):
        assert not interrupts.in_protected_code(frame)
        caught.set()

    deferred = DeferredHandler(handler)
    previous = signal.signal(signal.SIGUSR1, deferred)
    tracer = lambda frame, event, arg: None     # noqa: E731
    sys.settrace(tracer)
    try:
        def inner():
            deferred(signal.SIGUSR1, sys._getframe())
            assert not caught.is_set()
        storage_call(inner)
        caught.wait(10)     # the timer thread asks again; the wait is outside the memory's code
        assert caught.is_set()
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)
        signal.signal(signal.SIGUSR1, previous)


def test_stop_on_signals_raises_once_then_lets_the_save_finish(capsys):
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with stop_on_signals():
            handler = signal.getsignal(signal.SIGTERM)
            try:
                handler(signal.SIGTERM, sys._getframe())
            except KeyboardInterrupt:
                handler(signal.SIGTERM, sys._getframe())    # the second: printed, not raised
                handler(signal.SIGINT, sys._getframe())
                raise
    assert 'while stopping' in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is previous


def test_the_memory_wraps_the_handlers_installed_before_it(tmp_path):
    """A script's own SIGTERM handler, installed before the memory, is wrapped by it."""
    script = (
        "import signal\n"
        "from expreplay import ReplayMemory\n"
        "from expreplay.interrupts import DeferredHandler\n"
        "def stop(signum, frame):\n"
        "    raise KeyboardInterrupt\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "ReplayMemory(100, (4,), 1)\n"
        "for s in (signal.SIGINT, signal.SIGTERM):\n"
        "    h = signal.getsignal(s)\n"
        "    print(type(h).__name__, h.handler.__name__)\n")
    # SIGINT at its default in the child, so that Python installs its own handler there even
    # when this run inherited SIGINT ignored (a job started in a shell's background).
    out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split('\n')[:2] == ['DeferredHandler default_int_handler',
                                          'DeferredHandler stop']


# ---------------------------------------------------------------------------- dropped streams
def stream_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith(STREAM_THREADS)]


def vector_player():
    from scripted_env import ScriptedEnv
    return gym.vector.SyncVectorEnv([lambda i=i: ScriptedEnv(i) for i in range(3)])


@pytest.mark.parametrize('players', ['one env', 'two envs', 'two vector envs'])
@pytest.mark.parametrize('prefetch', [None, 0, 2])
def test_a_stream_dropped_without_close_stops_every_thread(players, prefetch):
    """A notebook cell or an exception path drops the stream: its finalizer stops and joins
    the simulator, inference and prefetch threads (the prefetch thread must not keep the
    stream alive)."""
    assert stream_threads() == []
    factory = vector_player if players == 'two vector envs' else EnvFactory()
    stream = make_stream(factory, num_parallel_players=1 if players == 'one env' else 2,
                         prefetch=prefetch)
    take(iter(stream), 5)
    if prefetch == 2 or (prefetch is None and players == 'two vector envs'):
        assert stream.prefetcher is not None
    assert stream_threads() != [] or players == 'one env' and not stream.prefetch
    del stream
    gc.collect()
    assert stream_threads() == []


def test_a_close_after_a_close_that_was_cut_short_finishes_it(tmp_path, monkeypatch):
    """An exception inside close() (here, while the players are being closed) leaves the work
    to the next close(), which stops the threads and saves the memory."""
    stream = make_stream(EnvFactory(), checkpoint_dir=tmp_path)
    take(iter(stream), 5)
    population_close = type(stream.population).close
    calls = []

    def cut_short(self):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        population_close(self)

    monkeypatch.setattr(type(stream.population), 'close', cut_short)
    with pytest.raises(KeyboardInterrupt):
        stream.close()
    assert not os.path.exists(tmp_path / 'replay_memory.npz')
    stream.close()
    assert os.path.exists(tmp_path / 'replay_memory.npz') and stream_threads() == []
    stream.close()          # done: nothing more
    assert len(calls) == 2
    np.testing.assert_equal(len(stream.memory) > 0, True)
