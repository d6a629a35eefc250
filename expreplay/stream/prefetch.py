"""Prefetcher: items made ahead by a thread of its own, handed out from a bounded buffer.

One job: run ``produce()`` in a thread, keep at most ``depth`` of its results ready, hand them
out in order, and stop cleanly. It knows nothing about replay; :class:`expreplay.ReplayStream`
uses it to draw batches (and make the step requests that go with them) while the learner
trains on the previous ones.

Rules:

- The thread calls ``produce()`` only when the buffer has room, so at most ``depth`` results
  exist that were not handed out (none is held back waiting for room). Once the buffer is
  full it waits until it has drained to ``depth // 2``, then fills it again: a thread woken
  costs a switch (tens of microseconds on a busy machine), and this wakes the thread once per
  ``depth - depth // 2`` results instead of once per result. A consumer is woken only when
  it waits for a result.
- An exception raised by ``produce()`` stops the thread; :meth:`get` raises that exception
  object itself at its next call (the results still buffered are dropped), with its
  traceback from the producing thread and a note naming it; its ``__cause__`` stays as
  ``produce`` chained it.
- :meth:`stop` makes every :meth:`get`, also one blocked waiting, return :attr:`END`; the
  thread ends at once if it is waiting for room, else when its current ``produce()`` returns
  (what it produced then is dropped). :meth:`join` waits for it. An exception that
  ``produce()`` raises after :meth:`stop` is a consequence of the shutdown and is not kept.
- The consumer is often the main thread, where a Ctrl-C lands between any two bytecodes. A
  lock it leaves held would hang the next :meth:`get` and the :meth:`stop` of a close, so
  its side never enters the condition (``Condition.__enter__`` and ``Condition.wait`` are
  Python code, with instants where an exception leaves the lock held or released behind the
  ``with``'s back): it takes the plain lock for a few statements only, with the lock's own
  ``__enter__``, and blocks outside it on a lock of its own that the thread or :meth:`stop`
  releases. :meth:`stop` takes the lock with a timeout all the same: held past it (its holds
  last microseconds), it was left held by a holder cut short, and is taken over.
"""

from __future__ import annotations

import _thread
import collections
import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from .._checks import check_int
from .._threads import DaemonThread

if TYPE_CHECKING:
    from ..acting.population import Population

__all__ = ['Prefetcher', 'DEFAULT_PREFETCH', 'default_prefetch']

# Seconds stop() waits for the lock before taking it over from a holder cut short (every hold
# is a few statements; the waits release it).
_LEFT_HELD_AFTER = 1.0


# Batches the prefetch thread keeps ready by default: enough to absorb the players' and the
# sampler's jitter for a learner taking 1 ms per batch (benchmarks/bench_e2e.py measures it).
DEFAULT_PREFETCH = 4


def default_prefetch(population: Population) -> int:
    """The prefetch depth a started population gets by default: :data:`DEFAULT_PREFETCH` when
    its players step outside the GIL (vector envs: C++ threads, worker processes, remote
    actors), else 0.

    A single env steps under the GIL (ale-py's ``act`` holds it, and so does an env written in
    Python), so there the players, not the learner, bound the feed; a prefetch thread only
    adds a contender for the GIL, and drawing in the learner's ``next()`` gave 1.02-1.12x the
    updates per second (``benchmarks/bench_e2e.py --compare prefetch=0``). One player is stepped
    by the drawing thread itself. Vector players leave the GIL free, and drawing ahead overlaps
    the draw with their steps (1.1x against ``prefetch=0`` there).
    """
    if population.num_players == 1 or not any(r.is_vector for r in population.runners):
        return 0
    return DEFAULT_PREFETCH


class Prefetcher:
    """Run ``produce()`` ahead in a thread named ``name``, keeping up to ``depth`` results.

    Args:
        produce (callable): called with no arguments from the prefetch thread, over and over.
        depth (int): results kept ready (>= 1).
        name (str): the thread's name.
        thread_context (callable, optional): returns a context manager the thread enters
            before its first ``produce()`` (e.g. a TF1 session's ``as_default``).
        start (bool): start the thread now; False: at :meth:`start` (so that an owner can
            record the prefetcher before its thread exists, and stop whatever it recorded).

    Attributes:
        produced (int): results produced and buffered so far.
        handed_out (int): results :meth:`get` returned so far.
        waits (int): :meth:`get` calls that found the buffer empty and waited.
        wait_time (float): seconds those calls waited, summed.
    """

    END = object()   # what get() returns once stopped

    def __init__(self, produce: Callable[[], Any], depth: int, *, name: str,
                 thread_context: Callable[[], contextlib.AbstractContextManager] | None = None,
                 start: bool = True) -> None:
        if not callable(produce):
            raise TypeError(f"produce must be callable, got {produce!r}")
        self.depth = check_int(depth, 'depth', 1)
        self._produce = produce
        self._thread_context = thread_context or contextlib.nullcontext
        self._items: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)   # the thread's and the watchers' waits
        self._consumer_wakeup: Any = None   # a waiting get()'s own lock, released to wake it
        self._low = self.depth // 2       # a full buffer is refilled from this level on
        self._producer_waiting = False
        self._watchers = 0                # wait_for / wait_full callers: woken at every change
        self._stopped = False
        self._error: BaseException | None = None
        self._error_raised = False
        self.consumers_waiting = 0
        self.produced = 0
        self.handed_out = 0
        self.waits = 0
        self.wait_time = 0.0
        self._thread = DaemonThread(self._run, name)
        if start:
            self._thread.start()

    def start(self) -> None:
        """Start the thread (built with ``start=False``); does nothing once stopped."""
        if not self._stopped:
            self._thread.start()

    @property
    def name(self) -> str:
        return self._thread.name

    def ready(self) -> int:
        """Results buffered now."""
        return len(self._items)

    @property
    def error(self) -> BaseException | None:
        """The exception that stopped the thread (None while it runs or after :meth:`stop`),
        raised by :meth:`get` or not. Read without the lock, so usable in :meth:`wait_for`."""
        return self._error

    def wait_for(self, ready: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until ``ready()``, looked at whenever a result is buffered or handed out, a
        consumer starts waiting, or the thread stops; False after ``timeout`` seconds."""
        with self._cond:
            return self._watched(ready, timeout)

    def _watched(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        """``wait_for`` on the condition, counted as a watcher (lock held)."""
        self._watchers += 1
        try:
            return self._cond.wait_for(ready, timeout)
        finally:
            self._watchers -= 1

    # ------------------------------------------------------------------ the thread
    def _run(self):
        cond = self._cond
        try:
            with self._thread_context():
                while True:
                    with cond:
                        if len(self._items) >= self.depth:
                            self._producer_waiting = True
                            if self._watchers:      # wait_full() waits for this
                                cond.notify_all()
                            while len(self._items) > self._low and not self._stopped:
                                cond.wait()
                            self._producer_waiting = False
                        if self._stopped:
                            return
                    item = self._produce()
                    with cond:
                        if self._stopped:
                            return
                        self._items.append(item)
                        self.produced += 1
                        self._wake_consumer()
                        if self._watchers:
                            cond.notify_all()
        except BaseException as err:
            with cond:
                if not self._stopped:
                    err.add_note(f"(raised in the thread {self.name!r}, which works ahead of the "
                                 "consumer)")
                    self._error = err
                self._wake_consumer()
                cond.notify_all()

    def _wake_consumer(self) -> None:
        """Release the waiting get(), if any (lock held)."""
        wakeup, self._consumer_wakeup = self._consumer_wakeup, None
        if wakeup is not None:
            wakeup.release()

    # ------------------------------------------------------------------ the consumer
    def get(self) -> Any:
        """The next result, waiting for it if none is ready; :attr:`END` once stopped.

        Raises the exception that stopped the thread (see the module docstring). A
        KeyboardInterrupt in the wait leaves nothing held (see the module docstring).
        """
        wakeup = None
        start = 0.0
        try:
            while True:
                with self._lock:        # the lock's own __enter__, not the condition's
                    if self._error is not None and not self._stopped:
                        self._error_raised = True
                        raise self._error
                    if self._stopped:
                        return self.END
                    if self._items:
                        return self._take()
                    if wakeup is None:       # the first time round: this get() waits
                        wakeup = _thread.allocate_lock()
                        wakeup.acquire()
                        self.waits += 1
                        self.consumers_waiting += 1
                        start = time.monotonic()
                        if self._watchers:    # whoever watches consumers_waiting
                            self._cond.notify_all()
                    self._consumer_wakeup = wakeup
                # Outside the lock; released by the thread, a fault or stop(). An interrupted
                # acquire raises holding nothing: the lock is released or never taken.
                wakeup.acquire()
        finally:
            if wakeup is not None:
                with self._lock:
                    if self._consumer_wakeup is wakeup:
                        self._consumer_wakeup = None
                    self.consumers_waiting -= 1
                    self.wait_time += time.monotonic() - start

    def _take(self) -> Any:
        """Hand out the oldest result (lock held)."""
        item = self._items.popleft()
        self.handed_out += 1
        refill = self._producer_waiting and len(self._items) <= self._low
        if refill:
            # The thread is released now, not when it wakes: until it takes the lock
            # back, wait_full() must not see it idle while it is about to produce.
            self._producer_waiting = False
        if refill or self._watchers:
            self._cond.notify_all()     # the thread refills the buffer
        return item

    def wait_full(self, timeout: float | None = None) -> bool:
        """Wait until the thread waits for room, making nothing (the buffer was full and has
        not drained to ``depth // 2`` since), or has stopped; True if it waits for room. For a
        consistent reading of what the thread has done so far."""
        with self._cond:
            self._watched(lambda: self._producer_waiting or self._stopped
                          or self._error is not None or not self._thread.is_alive(),
                          timeout)
            return self._producer_waiting and not self._stopped

    def unraised_error(self) -> BaseException | None:
        """The exception that stopped the thread if :meth:`get` never raised it, else None."""
        with self._cond:
            return None if self._error_raised else self._error

    # ------------------------------------------------------------------ shutdown
    def stop(self) -> None:
        """Release every waiter (see the module docstring); idempotent, waits for nothing but
        the lock (see the module docstring for one left held)."""
        self._stopped = True     # a single store: seen by every thread from now on
        # Not acquired in time: left held by a holder cut short; this call takes its hold
        # over, and releases it below (the thread may be waiting for it).
        self._lock.acquire(timeout=_LEFT_HELD_AFTER)
        try:
            self._items.clear()
            self._wake_consumer()
            self._cond.notify_all()
        finally:
            self._lock.release()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread (after :meth:`stop`); True when it has ended. A call from the
        prefetch thread itself (``produce`` closing its owner) does not wait."""
        if threading.current_thread() is self._thread:
            return False
        if self._thread.ident is None:     # never started (stopped first)
            return True
        return self._thread.join(timeout)
