"""Signals belong to the script: :func:`stop_on_signals` is the one thing here, and it is opt-in.

The contract:

* Importing expreplay or building any of its objects (a memory, a writer, a stream, a
  population, ``ExpReplay``, a preset) changes no signal handler and no trace function. A
  Ctrl-C is delivered as Python delivers it, wherever the main thread is: into a memory write,
  a draw, a save, a stream's start or close. The library is built so that this is safe: an
  exception at any instant of a memory write leaves the memory consistent (the writes before
  it, never part of one), saves are written aside and renamed (a cut save leaves the previous
  checkpoint), and each part of a stream's close may run again on the next ``close()``.
* :func:`stop_on_signals` is for a training script's body. The first SIGINT or SIGTERM inside
  the block raises ``KeyboardInterrupt`` (so a ``kill`` of a background run, whose SIGINT the
  shell ignores, stops it as Ctrl-C does); the later ones, until the block exits, print a line
  to stderr and are dropped, so that the save the script makes on the way out (a ``finally``,
  a stream's close) is not cut short. The previous handlers are restored when the block exits.
  Main thread only: Python runs signal handlers there and nowhere else.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = ['stop_on_signals']

SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
    The previous handlers come back when the block exits. Call it from the main thread
    (RuntimeError elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("stop_on_signals() needs the main thread (signals are handled there)")
    handler = _StopOnce()
    previous = {}
    try:
        for signum in SIGNALS:
            previous[signum] = signal.signal(signum, handler)
        yield
    finally:
        for signum, old in previous.items():
            # None: a handler installed outside Python, which can not be put back.
            signal.signal(signum, signal.SIG_DFL if old is None else old)
