"""The ring's lock and its write journal: a write that an exception cuts short is finished, and
a hold it cuts short is given back, whatever instant the exception lands at.

Why: an exception can land between any two bytecodes of the main thread (a signal handler's
``KeyboardInterrupt``, a tracer's exception, a ``MemoryError``), also between a ``with`` block's
body and its ``__exit__``, where CPython does not promise the exit. Two things must hold there
without taking over the process (no signal handler, no trace function):

* **No write is half done.** A write that changes several tables prepares every value it stores
  first (reading the tables, changing nothing), then hands the stores to :meth:`WriteGuard.commit`
  as one function and its arguments. The commit records them in the journal (one attribute
  store: the commit point) before it runs them, and clears the journal after. Every store is of
  a value computed before the commit point (never ``x += 1``), so running them again gives the
  same tables: a write cut short after its commit point is run again, whole, by the next entry
  into the lock (:meth:`WriteGuard.__enter__`, :meth:`WriteGuard.settle`), by any thread. A
  write cut short before it has changed nothing. So the tables always hold the writes before
  the interrupted one, and that one too or nothing of it.
* **No hold is left.** The memory's critical sections run through :meth:`WriteGuard.run`,
  which, with the C write kernel built, takes the lock, calls the section and releases the
  lock in one C call (``_write_ext.locked_call``): the release follows in C whatever the
  section raised. The C write kernel's own writes take and release it in C too, and decline
  while the journal holds a write (:attr:`WriteGuard.pending`). On the numpy path (no
  compiler) the section runs in a ``with`` block, whose exit an exception can skip: the lock
  is a re-entrant lock used without re-entry, so a thread that enters while it holds it holds
  it from a call cut short, and takes that hold over instead of waiting for itself; another
  thread waits until the interrupted one calls the memory again, or
  :meth:`WriteGuard.release_abandoned` (which a stream's ``close`` calls first).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _kernels

__all__ = ['WriteGuard']


class WriteGuard:
    """The ring's lock (``with guard:``) and the journal of the one write in progress."""

    __slots__ = ('raw', 'pending', '_redo', 'run')

    #: ``run(fn, *args)``: ``fn(*args)`` called holding the lock (after finishing a write cut
    #: short), the lock released whatever it raised; returns what ``fn`` returns.
    run: Callable[..., Any]

    def __init__(self) -> None:
        #: The lock itself; the C write kernel acquires and releases it.
        self.raw = threading.RLock()
        #: 1 while the journal holds a write (read by the C kernel, which then declines).
        self.pending = np.zeros(1, np.uint8)
        self._redo: tuple[Callable[..., Any], tuple[Any, ...]] | None = None
        # Chosen once, with the ring (expreplay._kernels): the C call, or the with block.
        ext = _kernels.get('_write_ext')
        if ext is not None:
            self.run = functools.partial(ext.locked_call, self.raw, self.pending, self)
        else:
            self.run = self._run_with

    def __enter__(self) -> WriteGuard:
        raw = self.raw
        if raw._is_owned():          # type: ignore[attr-defined]   # a hold cut short: ours
            raw._release_save()      # type: ignore[attr-defined]
        raw.acquire()
        if self.pending[0]:
            self._finish()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.raw.release()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock as ``with`` does (a hold of this thread's that an exception cut short
        is taken over); False when ``timeout`` passed first. Pair with :meth:`release`."""
        raw = self.raw
        if raw._is_owned():          # type: ignore[attr-defined]
            raw._release_save()      # type: ignore[attr-defined]
        if not raw.acquire(blocking, timeout):
            return False
        if self.pending[0]:
            self._finish()
        return True

    def release(self) -> None:
        """Give back a hold of :meth:`acquire`."""
        self.raw.release()

    def _run_with(self, fn: Callable[..., Any], *args: Any) -> Any:
        """:meth:`run` without the C kernel."""
        with self:
            return fn(*args)

    def commit(self, apply: Callable[..., Any], *args: Any) -> None:
        """Run ``apply(*args)``, the stores of one write, as one: if an exception cuts it short,
        the next entry into the lock runs it again. ``apply`` stores values computed before
        (running it twice gives the tables of running it once) and raises nothing of its own.
        Inside a write opened by :meth:`undoable`, this is that write's commit point: its first
        part stays done. Caller holds the lock."""
        self.pending[0] = 1
        self._redo = (apply, args)           # the commit point
        apply(*args)
        self.end()

    def undoable(self) -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
        """Open a write whose first part is undone if it is cut short before its
        :meth:`commit`: returns its undo log, to which each change of that part adds
        ``(restore, args)`` (absolute stores of the values before it) before it changes
        anything; the log is run newest first. Caller holds the lock."""
        log: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.begin(_run_newest_first, log)
        return log

    def note(self, restore: Callable[..., Any], *args: Any) -> None:
        """Add ``restore(*args)`` to the undo log of the write opened by :meth:`undoable`
        (before the change it undoes). Caller holds the lock, inside such a write."""
        assert self._redo is not None and self._redo[0] is _run_newest_first
        self._redo[1][0].append((restore, args))

    def abort(self) -> None:
        """Undo the write opened by :meth:`undoable` now (it failed before its commit).
        Caller holds the lock."""
        self._finish()

    def begin(self, recover: Callable[..., Any], *args: Any) -> None:
        """From here until :meth:`end`, a cut short run leaves ``recover(*args)`` for the next
        entry into the lock to run (a write's stores, or a reset to a state that holds).
        Writes do not nest. Caller holds the lock."""
        if self._redo is not None:
            raise RuntimeError("a ring write began inside another")
        self.pending[0] = 1
        self._redo = (recover, args)           # the commit point

    def end(self) -> None:
        """The write begun by :meth:`begin` is done."""
        self._redo = None
        self.pending[0] = 0

    def settle(self) -> None:
        """Finish a write an exception cut short, if there is one (a writer calls it before it
        reads its own cursors, which such a write may still have to store)."""
        if self.pending[0]:
            self.run(_nothing)

    def release_abandoned(self) -> bool:
        """Give back a hold of this thread's that an exception cut short (finishing its write
        first); True if there was one. For a thread about to stop others that may be waiting
        for the lock."""
        raw = self.raw
        if not raw._is_owned():      # type: ignore[attr-defined]
            return False
        if self.pending[0]:
            self._finish()
        raw._release_save()          # type: ignore[attr-defined]
        return True

    def _finish(self) -> None:
        """Run the journal's write again, whole; clear the journal. Caller holds the lock."""
        redo = self._redo
        if redo is not None:
            apply, args = redo
            apply(*args)
            self._redo = None
        self.pending[0] = 0


def _run_newest_first(log: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
    """An undo log run: the restores, newest first."""
    for restore, args in reversed(log):
        restore(*args)


def _nothing() -> None:
    """The critical section of :meth:`WriteGuard.settle`: entering the lock finishes the write."""
