"""A stop at any instant, with the signals left to the user: the library changes no signal
handler and no trace function, a Ctrl-C lands at once wherever the main thread is, and what
it interrupts stays consistent (a checkpoint saved at a stop always loads, a second signal
never leaves a half-done close, a dropped stream leaves no thread, a close keeps to its
timeout).

The real-signal runs happen in child processes (``interrupted_runs.py`` and small scripts
here): signals are handled in a process's main thread, and real ones (``os.kill``) are sent
there.
"""

import gc
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from expreplay import ManagerSettings, ReplayMemory
from expreplay.interrupts import stop_on_signals
from expreplay.stream import Population, ReplayStream, Sampling
from scripted_env import ScriptedEnv
from test_presets import MinAtarLike, zeros
from test_stream import EnvFactory, make_stream, take

HERE = os.path.dirname(os.path.abspath(__file__))
STREAM_THREADS = ('SimulatorThread', 'InferenceThread', 'ReplayStream-prefetch',
                  'Population-start')


def child_env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(HERE), HERE, os.environ.get('PYTHONPATH', '')]))


def sigint_at_default():
    """In the child, SIGINT at its default, so that Python installs its own handler there
    even when this run inherited SIGINT ignored (a job started in a shell's background)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_child(*args, timeout):
    """interrupted_runs.py's JSON lines (it fails the test if it dies)."""
    out = subprocess.run([sys.executable, os.path.join(HERE, 'interrupted_runs.py'), *args],
                         capture_output=True, text=True, timeout=timeout, env=child_env(),
                         stdin=subprocess.DEVNULL, preexec_fn=sigint_at_default)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{')]


# ---------------------------------------------------------------------------- nothing taken over
def handlers():
    return signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), sys.gettrace()


def assert_unchanged(before, what):
    after = handlers()
    assert all(a is b for a, b in zip(before, after)), f"{what} changed {before} to {after}"


def test_building_anything_changes_no_signal_handler_and_no_trace_function(tmp_path):
    before = handlers()
    memory = ReplayMemory(600, (6,), 4, prioritized=True)
    assert_unchanged(before, 'ReplayMemory')
    writer = memory.new_writer()
    writer.start_episode(np.zeros(6, np.uint8))
    writer.add_step(0, 1.0, np.ones(6, np.uint8))
    assert_unchanged(before, 'new_writer')
    population = Population(EnvFactory(), 2, exploration=1.0)
    assert_unchanged(before, 'Population')
    for players, prefetch in ((1, 0), (2, 2)):
        stream = make_stream(EnvFactory(), num_parallel_players=players, prefetch=prefetch,
                             checkpoint_dir=tmp_path / f'{players}')
        assert_unchanged(before, 'ReplayStream')
        stream.start()
        take(iter(stream), 3)
        assert_unchanged(before, 'ReplayStream.start and its batches')
        stream.close()
        assert_unchanged(before, 'ReplayStream.close')
    population.close()
    for stream in (ReplayStream.minatar_dqn(MinAtarLike, zeros(6), memory={'max_size': 500},
                                            init_memory_size=50, progress=False),
                   ReplayStream.atari_dqn(lambda: ScriptedEnv(obs_shape=(84, 84)), zeros(3),
                                          memory={'max_size': 2_000}, progress=False)):
        assert_unchanged(before, 'a preset')
        stream.close()


@pytest.mark.slow     # tensorpack imports TensorFlow: tens of seconds
def test_building_expreplay_changes_no_signal_handler_and_no_trace_function():
    script = (
        "import os, signal, sys\n"
        "os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')\n"
        "from scripted_env import ScriptedEnv\n"
        "def handlers():\n"
        "    return signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), "
        "sys.gettrace()\n"
        "before = handlers()\n"
        "from expreplay import ExpReplay\n"
        "replay = ExpReplay(predictor_io_names=(['state'], ['Qvalue']),\n"
        "                   get_player=lambda: ScriptedEnv(0), num_parallel_players=2,\n"
        "                   state_shape=(6,), batch_size=16, memory_size=2000,\n"
        "                   init_memory_size=300, update_frequency=4, history_len=4)\n"
        "print(all(a is b for a, b in zip(before, handlers())))\n")
    out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                         timeout=600, env=child_env(), stdin=subprocess.DEVNULL,
                         preexec_fn=sigint_at_default)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1] == 'True'


ASYNCIO_CHILD = """
import asyncio, sys
if sys.argv[1] == 'memory':
    import numpy as np
    from expreplay import ReplayMemory
    memory = ReplayMemory(100, (4,), 1)
    writer = memory.new_writer()
    writer.start_episode(np.zeros(4, np.uint8))
    writer.add_step(0, 1.0, np.ones(4, np.uint8))

async def main():
    print('ready', flush=True)
    try:
        await asyncio.sleep(120)
    except asyncio.CancelledError:
        print('cancelled', flush=True)
        raise

try:
    asyncio.run(main())
except KeyboardInterrupt:
    print('KeyboardInterrupt', flush=True)
"""


def ctrl_c_into_asyncio(with_memory):
    """The child's output lines after a SIGINT sent once its main task awaits."""
    child = subprocess.Popen([sys.executable, '-c', ASYNCIO_CHILD,
                              'memory' if with_memory else 'plain'],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=child_env(), stdin=subprocess.DEVNULL,
                             preexec_fn=sigint_at_default)
    try:
        readable, _, _ = select.select([child.stdout], [], [], 120)
        assert readable, "the child never got to its await"
        assert child.stdout.readline() == 'ready\n'
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
        child.wait()
    return out.splitlines(), err


def test_ctrl_c_cancels_asyncios_main_task_as_without_the_library():
    """asyncio.run() installs its own SIGINT handler when it finds Python's default, and a
    Ctrl-C cancels the main task (its clean-up runs) before KeyboardInterrupt is raised. A
    memory built first must leave that as it is."""
    plain, _ = ctrl_c_into_asyncio(with_memory=False)
    assert plain == ['cancelled', 'KeyboardInterrupt']     # what asyncio does on its own
    with_memory, err = ctrl_c_into_asyncio(with_memory=True)
    assert with_memory == plain, err[-3000:]


# ---------------------------------------------------------------------------- prompt delivery
@pytest.mark.parametrize('kind', ['sample', 'add_step'])
def test_under_a_tracer_every_ctrl_c_lands_at_once(kind):
    """With a trace function set (coverage, a debugger), SIGINTs at random instants of a loop
    of the memory's draws or writes: 25 of 25 raise KeyboardInterrupt within 0.5 s."""
    rows = run_child('--latency', kind, '25', '1', timeout=300)
    assert len(rows) == 25
    assert [r['latency'] for r in rows if not r['latency'] < 0.5] == []
    assert all(r['traced'] > 0 for r in rows)      # the loops ran under the trace function


def test_ctrl_c_in_a_slow_get_player_during_a_start_lands_at_once_and_leaves_no_thread():
    """A start is not shielded: a Ctrl-C inside the user's get_player() (4 s long) raises
    there within 0.5 s, and no thread of the stream is left, then or after close()."""
    [row] = run_child('--slow-start', timeout=120)
    assert row['latency'] is not None and row['latency'] < 0.5, row
    assert row['alive'] == [] and row['alive_after_close'] == []


# ---------------------------------------------------------------------------- consistent at a stop
@pytest.mark.parametrize('where', ['main thread', 'another thread'])
def test_signals_during_the_memorys_own_calls_leave_it_consistent(tmp_path, where):
    """A memory used alone, the user's SIGINT handler installed after it (the memory built in
    the main thread, or in another): the main thread in a tight loop of writes, episode starts,
    prioritized n-step draws and priority updates, a SIGINT at a random instant of each of 300
    runs, the same writer going on after each; every run's save loads."""
    args = ['--writes', '300', '0', str(tmp_path)]
    rows = run_child(*args, *(['--memory-in-thread'] if where == 'another thread' else []),
                     timeout=600)
    assert [r['problems'] for r in rows if r['problems']] == []
    assert len(rows) == 300
    assert all(r['handled'] == 1 for r in rows)     # every signal raised, once


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize('double', [False, True], ids=['one signal', 'two signals'])
def test_streams_stopped_at_random_instants_save_checkpoints_that_load(tmp_path, double):
    """One- and two-player streams, uniform and prioritized, stopped by SIGINT or SIGTERM at
    random instants of the fill and of the training (at least 100 of each with one signal),
    or by two signals 0-5 ms apart (the second usually inside the close or its save): every
    checkpoint saved at the stop loads and holds what the memory holds, and no thread of the
    stream is left."""
    runs = 300 if not double else 120
    rows = run_child(str(runs), '7' if double else '3', str(tmp_path),
                     *(['--double'] if double else []), timeout=1400)
    assert len(rows) == runs
    assert [r['problems'] for r in rows if r['problems']] == []
    left = [r for r in rows if r['alive']]
    assert [r['alive'] for r in left] == [], [(r['run'], r['where'], r['lock']) for r in left]
    phases = [r['phase'] for r in rows]
    if not double:
        assert phases.count('fill') >= 100 and phases.count('training') >= 100, phases
    assert {(r['players'], r['prioritized']) for r in rows} == {
        (1, False), (1, True), (2, False), (2, True)}


# ---------------------------------------------------------------------------- stop_on_signals
def test_stop_on_signals_raises_once_then_lets_the_save_finish(capsys):
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with stop_on_signals():
            handler = signal.getsignal(signal.SIGTERM)
            assert signal.getsignal(signal.SIGINT) is handler
            try:
                handler(signal.SIGTERM, sys._getframe())
            except KeyboardInterrupt:
                handler(signal.SIGTERM, sys._getframe())    # the second: printed, not raised
                handler(signal.SIGINT, sys._getframe())
                raise
    assert capsys.readouterr().err.count('while stopping') == 2
    assert signal.getsignal(signal.SIGTERM) is previous


def test_stop_on_signals_needs_the_main_thread():
    raised = []

    def enter():
        try:
            with stop_on_signals():
                pass
        except RuntimeError as err:
            raised.append(err)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert len(raised) == 1 and 'main thread' in str(raised[0])


def test_stop_on_signals_with_a_real_second_signal_lets_the_save_finish(tmp_path):
    """The first SIGTERM raises; a second one, sent while the script stops and saves, only
    prints a line, and the save completes."""
    script = (
        "import os, signal, threading\n"
        "import numpy as np\n"
        "from expreplay import ReplayMemory\n"
        "from expreplay.interrupts import stop_on_signals\n"
        "memory = ReplayMemory(1000, (6,), 4)\n"
        "writer = memory.new_writer()\n"
        "writer.start_episode(np.zeros(6, np.uint8))\n"
        "for step in range(500):\n"
        "    writer.add_step(step % 3, 1.0, np.full(6, step % 200, np.uint8))\n"
        "with stop_on_signals():\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        os.getpid()\n"
        "    except KeyboardInterrupt:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        f"        memory.save({str(tmp_path / 'm.npz')!r})\n"
        "print('saved', len(ReplayMemory.load(" f"{str(tmp_path / 'm.npz')!r})))\n")
    out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                         timeout=120, env=child_env(), stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ['saved', '500']
    assert 'SIGTERM received while stopping' in out.stderr


# ---------------------------------------------------------------------------- close
def stream_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith(STREAM_THREADS)]


def vector_player():
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

    def cut_short(self, timeout=None):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        population_close(self, timeout)

    monkeypatch.setattr(type(stream.population), 'close', cut_short)
    with pytest.raises(KeyboardInterrupt):
        stream.close()
    assert not os.path.exists(tmp_path / 'replay_memory.npz')
    stream.close()
    assert os.path.exists(tmp_path / 'replay_memory.npz') and stream_threads() == []
    stream.close()          # done: nothing more
    assert len(calls) == 2
    assert len(ReplayMemory.load(tmp_path / 'replay_memory.npz')) == len(stream.memory) > 0


class HangingEnv(ScriptedEnv):
    """Steps normally until ``hang`` is set; then its next step waits for ``release``."""

    def __init__(self, hang, inside, release):
        super().__init__(0)
        self.hang, self.inside, self.release = hang, inside, release

    def step(self, action):
        if self.hang.is_set():
            self.inside.set()
            self.release.wait(120)
        return super().step(action)


def test_close_keeps_to_close_timeout_with_an_inline_player_and_prefetch():
    """One player stepped by the prefetch thread (inline), prefetch 2, its env stuck in a
    step: close() waits close_timeout in all (one deadline for every wait), reports the
    thread, and returns."""
    hang, inside, release = threading.Event(), threading.Event(), threading.Event()
    close_timeout = 1.0
    memory = ReplayMemory(600, (6,), 4)
    population = Population(lambda: HangingEnv(hang, inside, release), 1,
                            exploration=1.0, manager=ManagerSettings(close_timeout=close_timeout))
    stream = ReplayStream(memory, population, Sampling(16, 4), init_memory_size=100,
                          prefetch=2, progress=False)
    try:
        batches = iter(stream)
        take(batches, 3)
        hang.set()
        assert inside.wait(60)      # the prefetch thread is inside the stuck step
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match='ReplayStream-prefetch'):
            stream.close()
        took = time.monotonic() - start
        assert took < close_timeout + 1.0, took
    finally:
        release.set()
    prefetcher = stream.prefetcher
    assert prefetcher is not None and prefetcher.join(60)
