"""The library's threads: daemon threads whose end a KeyboardInterrupt can not misreport.

In CPython 3.11 and before, a KeyboardInterrupt raised inside ``Thread.join()`` while the thread
still runs marks it stopped (python/cpython#90882): every later ``join()`` returns at once and
``is_alive()`` says False while the thread goes on. A Ctrl-C during a close would then let the
next close leave threads running, or close an env under the thread stepping it. So a thread of
the library tells its end by an Event it sets as the last act of its target: ``Event.wait``
leaves the Event as it was when an exception cuts it short.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ['DaemonThread']


class DaemonThread(threading.Thread):
    """A daemon thread running ``target``, whose :meth:`join` and :meth:`is_alive` hold after
    an interrupted join (see the module docstring)."""

    def __init__(self, target: Callable[[], object], name: str) -> None:
        super().__init__(target=target, name=name, daemon=True)
        self._running = threading.Event()      # set when the target is called
        self._finished = threading.Event()     # set when the target has returned or raised

    def run(self) -> None:
        self._running.set()
        try:
            super().run()
        finally:
            self._finished.set()

    def join(self, timeout: float | None = None) -> bool:    # type: ignore[override]
        """Wait up to ``timeout`` seconds (None: for ever) for the target to end; True once it
        has. Also waits for a thread whose ``start()`` an exception cut short (it may be
        starting still; one cut short before it was created never ends: False after
        ``timeout``)."""
        if not self._finished.wait(timeout):
            return False
        super().join()     # what is left after the target: the thread's teardown
        return True

    def is_alive(self) -> bool:
        """Whether the thread has started and its target has not ended."""
        return self._running.is_set() and not self._finished.is_set()
