"""DaemonThread: a Ctrl-C inside join() leaves the thread known to be running."""

import signal
import sys
import threading

import pytest

from expreplay._threads import DaemonThread


def _joining(frame):
    """Whether ``frame`` is a wait inside a thread's join()."""
    if frame is None or frame.f_code.co_name not in ('wait', '_wait_for_tstate_lock'):
        return False
    while frame is not None:
        if frame.f_code.co_name == 'join':
            return True
        frame = frame.f_back
    return False


def _interrupt_when_joining(main_ident):
    """Send SIGINT to the main thread once it waits inside a join()."""
    def send():
        while True:
            if _joining(sys._current_frames().get(main_ident)):
                signal.pthread_kill(main_ident, signal.SIGINT)
                return
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return sender


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


@pytest.fixture
def ctrl_c_raises():
    previous = signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_join_cut_short_by_ctrl_c_leaves_the_thread_alive_and_joinable(ctrl_c_raises):
    release = threading.Event()
    thread = DaemonThread(release.wait, 'test-daemon')
    thread.start()
    sender = _interrupt_when_joining(threading.main_thread().ident)
    with pytest.raises(KeyboardInterrupt):
        thread.join()
    sender.join()
    assert thread.is_alive()
    assert thread.join(0.05) is False       # still running: a later join does wait
    release.set()
    assert thread.join(10) is True
    assert not thread.is_alive()


def test_join_reports_a_thread_never_started_as_not_ended():
    thread = DaemonThread(lambda: None, 'test-never-started')
    assert not thread.is_alive()
    assert thread.join(0.01) is False


def test_the_target_s_exception_still_ends_the_thread():
    def fail():
        raise RuntimeError('target failed')

    thread = DaemonThread(fail, 'test-failing')
    previous = threading.excepthook
    threading.excepthook = lambda args: None       # the failure is expected: not printed
    try:
        thread.start()
        assert thread.join(10) is True
    finally:
        threading.excepthook = previous
    assert not thread.is_alive()
