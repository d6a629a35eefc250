"""Signals and the replay memory: an interrupt never lands inside the memory's code.

Why: Python runs a signal's handler (Ctrl-C's ``KeyboardInterrupt``, a script's SIGTERM handler)
in the main thread between two bytecodes, wherever that thread is. With one player the main
thread writes the memory itself (the stream steps the env inline), and a prioritized learner
feeds priorities back from it: an exception raised between two statements of a write (the
slot flags set, the count not yet) leaves tables that disagree, and the memory saved at the
stop would refuse to load. Every write of the tables is in :mod:`expreplay.storage`, and so is
the save; what this module does is keep the handler out of that code:

* :func:`protect_memory` wraps the Python-level handlers of SIGINT and SIGTERM in a
  :class:`DeferredHandler`. When a signal arrives while the main thread runs code of
  :mod:`expreplay.storage` (any frame of its stack), the handler runs when the outermost
  such call returns: right after a write, once the file is written for a save. Elsewhere it
  runs the wrapped handler at once. A few functions outside the memory are marked
  :func:`uninterrupted` too: a population's start (threads started must be recorded to be
  stopped) and a stream's close (a second Ctrl-C must not skip the save). The memory and the
  stream call :func:`protect_memory` (in the main thread; elsewhere it does nothing), so a
  user does nothing; a handler installed later by the user is wrapped at the stream's next
  start or close.
* :func:`stop_on_signals` is for a training script: the first SIGINT or SIGTERM raises
  ``KeyboardInterrupt`` (so a ``kill`` of a background run, whose SIGINT the shell ignores,
  stops it as Ctrl-C does), and the ones after it, until the block ends, are reported and held
  back, so that the save that follows the stop completes.

Only what is installed from Python is wrapped: a SIGTERM left at the system's default ends the
process at once (there is no Python code to run, and nothing half-written to load: saves are
written aside and renamed).
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TypeVar

__all__ = ['DeferredHandler', 'protect_memory', 'stop_on_signals', 'uninterrupted',
           'in_protected_code', 'outermost_protected']

SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Code of these packages runs to its end before a handler does.
PROTECTED = ('expreplay.storage',)
_SUBMODULES = tuple(name + '.' for name in PROTECTED)
RETRY_THREAD = 'expreplay-signal-retry'     # the name of the one-shot timer threads
# Seconds before a deferred signal's handler is asked again (the memory's writes take
# microseconds; a save takes as long as its file).
_RETRY_AFTER = 0.001


# Code objects of the functions marked :func:`uninterrupted`.
_UNINTERRUPTED: set[Any] = set()

F = TypeVar('F', bound=Callable[..., Any])


def uninterrupted(function: F) -> F:
    """Mark ``function`` as one whose whole run a signal's handler waits for (it builds or
    tears down what a half-run would leak: threads started but not yet recorded, a close
    whose save must not be cut short). Only for functions whose run is bounded."""
    _UNINTERRUPTED.add(function.__code__)
    return function


def _protected(frame: FrameType) -> bool:
    name = frame.f_globals.get('__name__', '')
    return name.startswith(_SUBMODULES) or name in PROTECTED or frame.f_code in _UNINTERRUPTED


def outermost_protected(frame: FrameType | None) -> FrameType | None:
    """The outermost frame of ``frame``'s stack that runs code of a :data:`PROTECTED`
    package or of a function marked :func:`uninterrupted` (None: none does)."""
    found = None
    while frame is not None:
        if _protected(frame):
            found = frame
        frame = frame.f_back
    return found


def in_protected_code(frame: FrameType | None) -> bool:
    """Whether ``frame`` or one of its callers is protected code (:func:`outermost_protected`)."""
    return outermost_protected(frame) is not None


def _calls_untraced(frame: FrameType, event: str, arg: Any) -> None:
    """The thread's trace function while a signal waits: traces no frame it is asked about
    (only the frame the handler armed is traced, for its return)."""
    return None


class DeferredHandler:
    """A signal handler that runs ``handler(signum, frame)`` once the main thread is outside
    the memory's code; ``handler`` is a Python handler (a callable) or ``signal.SIG_IGN``.

    Inside it, the handler arms the outermost protected frame of the stack with a trace
    function for that frame's return (``frame.f_trace``, with the thread's tracing on only
    until then: a function called meanwhile costs a no-op trace call), and runs ``handler``
    from there, as the frame returns: the exception it raises (``KeyboardInterrupt``) comes
    out of the memory's call as if raised just after it. Under a debugger or a coverage tool
    (whose trace function must not be replaced) it has itself called again a millisecond
    later instead, from a one-shot timer thread (``_thread.interrupt_main``), until it is
    called outside.
    """

    def __init__(self, handler: Callable[[int, FrameType | None], Any] | int) -> None:
        self.handler = handler
        self._armed: FrameType | None = None   # the frame whose return runs the handler
        self._signum = 0                       # the signal waiting (signals coalesce anyway)
        self._retry_pending = False            # a timer thread will ask again

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        outer = outermost_protected(frame)
        if outer is None:
            return self._run(signum, frame)
        self._signum = signum
        if self._armed is not None or self._retry_pending:
            return None              # already waiting for this stack's protected call
        if sys.gettrace() is None:
            self._armed = outer
            outer.f_trace_lines = False
            outer.f_trace = self._on_trace
            sys.settrace(_calls_untraced)
        else:
            self._retry_pending = True
            timer = threading.Timer(_RETRY_AFTER, self._ask_again)
            timer.name, timer.daemon = RETRY_THREAD, True
            timer.start()
        return None

    def _on_trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != 'return':
            return self._on_trace
        sys.settrace(None)
        frame.f_trace = None
        self._armed = None
        return self._run(self._signum, frame.f_back)

    def _ask_again(self) -> None:
        self._retry_pending = False
        _thread.interrupt_main(signal.Signals(self._signum))

    def _run(self, signum: int, frame: FrameType | None) -> Any:
        if callable(self.handler):
            return self.handler(signum, frame)
        return None


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def protect_memory() -> None:
    """Wrap the current Python handlers of SIGINT and SIGTERM in :class:`DeferredHandler`
    (those already wrapped, and the system's defaults, are left as they are). Idempotent and
    cheap; does nothing outside the main thread, where no handler runs."""
    if not _on_main_thread():
        return
    for signum in SIGNALS:
        current = signal.getsignal(signum)
        if callable(current) and not isinstance(current, DeferredHandler):
            try:
                signal.signal(signum, DeferredHandler(current))
            except (ValueError, OSError):     # not the main interpreter
                return


class _StopOnce:
    """The first signal raises KeyboardInterrupt; later ones are reported and dropped."""

    def __init__(self) -> None:
        self.stopping = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if not self.stopping:
            self.stopping = True
            raise KeyboardInterrupt
        print(f"{signal.Signals(signum).name} received while stopping: finishing the save first "
              "(kill -9 ends the process without it)", file=sys.stderr, flush=True)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """A training script's body: the first SIGINT or SIGTERM inside the block raises
    ``KeyboardInterrupt``; the ones after it (until the block exits) only print a line, so the
    saves the script makes on the way out (``finally``, a stream's close) are not cut short.
    Neither lands inside the memory's code (:class:`DeferredHandler`). The previous handlers
    come back when the block exits. Call it from the main thread."""
    if not _on_main_thread():
        raise RuntimeError("stop_on_signals() needs the main thread (signals are handled there)")
    handler = DeferredHandler(_StopOnce())
    previous = {signum: signal.signal(signum, handler) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
