"""The staleness window: step requests accepted, taken by simulator threads, and finished.

:class:`StalenessWindow` holds the requests of :meth:`EnvRunnerManager.step
<expreplay.acting.manager.EnvRunnerManager.step>`: it accepts request ``k`` only once every request
before ``k - maximum_staleness + 1`` has finished, hands queued requests to the simulator threads,
and counts the steps the finished ones stored (:class:`InsertedSteps`, the one count of inserted
steps, whatever the mode).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ['StalenessWindow', 'Request', 'InsertedSteps']


class Request:
    """One accepted step request (one step of one runner)."""
    __slots__ = ('seq', 'exploration', 'done')

    def __init__(self, seq: int, exploration: float) -> None:
        self.seq = seq
        self.exploration = exploration
        self.done = False


class InsertedSteps:
    """The steps an acting group stored, taken in portions: each :meth:`take` returns what the
    group stored since the last one (its ``inserted`` count; the group is stepped by one
    thread only, the one that takes, so the difference is exactly what the last request(s)
    stored)."""

    def __init__(self, group: Any) -> None:
        self._group = group
        self._seen = group.inserted

    def take(self) -> int:
        steps = self._group.inserted
        inserted, self._seen = steps - self._seen, steps
        return inserted


class StalenessWindow:
    """At most ``maximum_staleness`` requests pending (accepted, not finished) at once.

    The waits (:meth:`accept`, :meth:`wait_idle`) call ``check()`` (which raises to stop the
    wait: a fault, a close) and ``watch(now)`` (seconds until it should look again, None: no
    limit; 0: look again at once) while they wait; both run with the window's lock held.
    After :meth:`halt` (a fault) or :meth:`close` the threads take no further request.
    """

    def __init__(self, maximum_staleness: int, check: Callable[[], None],
                 watch: Callable[[float], float | None]) -> None:
        self.maximum_staleness = maximum_staleness
        self._check = check
        self._watch = watch
        # Re-entrant: a watch that fails the manager halts the window from inside a wait.
        self._lock = threading.RLock()
        self._work = threading.Condition(self._lock)    # simulator threads wait for requests
        self._space = threading.Condition(self._lock)   # step() waits for the window
        self._queue: collections.deque[Request] = collections.deque()        # accepted, not started
        self._unfinished: collections.deque[Request] = collections.deque()   # oldest first
        self._next_seq = 0
        self._pending = 0
        # Waiters that must be woken whatever changed (wake-ups cost a thread switch each, so
        # the others are woken only when what they wait for may have happened):
        self._awaiting_results = 0    # take()s waiting for a request *or* a prediction
        self._watchers = 0            # wait_for()s (their condition is the caller's)
        self._inserted = 0            # steps stored by finished requests (see progress())
        self._closed = False
        self._halted = False

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ the caller's side
    def _is_open(self) -> bool:
        return not self._unfinished or self._next_seq - self._unfinished[0].seq < self.maximum_staleness

    def accept(self, exploration: float, timeout: float | None) -> None:
        """Queue a request once the window has room; TimeoutError after ``timeout`` seconds."""
        with self._lock:
            if self._halted or self._closed or not self._is_open():
                self._wait(self._is_open, timeout)
            if not self._is_open():
                raise TimeoutError(f"step() not accepted within {timeout} s: {self._pending} "
                                   f"requests pending (maximum_staleness={self.maximum_staleness})")
            req = Request(self._next_seq, exploration)
            self._next_seq += 1
            self._queue.append(req)
            self._unfinished.append(req)
            self._pending += 1
            self._work.notify()

    def wait_idle(self, timeout: float | None) -> None:
        """Block until no request is pending; TimeoutError after ``timeout`` seconds."""
        with self._lock:
            self._wait(lambda: self._pending == 0, timeout)
            if self._pending:
                raise TimeoutError(f"{self._pending} requests still pending after {timeout} s")

    def _wait(self, ready: Callable[[], bool], timeout: float | None) -> None:
        """Wait (lock held) until ``ready()``, ``check()`` raises, or ``timeout``; ``watch``
        runs while waiting, since a stuck call is what keeps the caller waiting."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._check()
            if ready():
                return
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            wait = self._watch(now)
            if wait == 0:                    # the watch just failed the manager
                continue
            if deadline is not None:
                wait = deadline - now if wait is None else min(wait, deadline - now)
            self._space.wait(wait)

    def wait_for(self, ready: Callable[[], bool], timeout: float | None = None) -> bool:
        """Wait until ``ready()`` (looked at whenever requests finish, and at a halt or a
        close); False after ``timeout`` seconds."""
        with self._lock:
            self._watchers += 1
            try:
                return self._space.wait_for(ready, timeout)
            finally:
                self._watchers -= 1

    def progress(self) -> tuple[int, int]:
        """``(steps inserted by finished requests, requests pending)`` at one instant."""
        with self._lock:
            return self._inserted, self._pending

    def counts(self) -> tuple[int, int]:
        """``(pending, queued)``: requests accepted and not finished, and not started."""
        with self._lock:
            return self._pending, len(self._queue)

    # ------------------------------------------------------------------ the threads' side
    def take(self, n: int, block: bool, until: Any = None) -> list[Request] | None:
        """Up to ``n`` queued requests; None once closed or halted. ``block``: wait for one;
        else with ``until`` (a Prediction), wait for one only while it is not done."""
        with self._lock:
            while not self._queue and not self._closed and not self._halted:
                if block:
                    self._work.wait()
                elif until is not None and not until.done:
                    # Counted before the wait, under the lock: wake_workers, which takes the
                    # lock, either sees it or ran before ``until.done`` was read.
                    self._awaiting_results += 1
                    try:
                        self._work.wait()
                    finally:
                        self._awaiting_results -= 1
                else:
                    break
            if self._closed or self._halted:
                return None
            return [self._queue.popleft() for _ in range(min(n, len(self._queue)))]

    def finish(self, reqs: list[Request], inserted: int) -> None:
        """Book requests as finished (their ``inserted`` steps are in the memory); wakes the
        waiters of step() and wait_idle() once, when the window moved (a request finished
        out of order opens no room)."""
        if not reqs:
            return
        with self._lock:
            self._inserted += inserted
            for req in reqs:
                req.done = True
            self._pending -= len(reqs)
            unfinished = self._unfinished
            moved = bool(unfinished) and unfinished[0].done
            while unfinished and unfinished[0].done:
                unfinished.popleft()
            if moved or not self._pending or self._watchers:
                self._space.notify_all()

    def add_inserted(self, inserted: int) -> None:
        """Steps stored without a queued request (a runner stepped inline)."""
        with self._lock:
            self._inserted += inserted

    def wake_workers(self) -> None:
        """Q-values were delivered: wake the simulator threads that wait for a request or
        their prediction (the others wait for requests only: waking them would be for
        nothing)."""
        with self._lock:
            if self._awaiting_results:
                self._work.notify_all()

    # ------------------------------------------------------------------ stopping
    def halt(self) -> None:
        """The manager failed: the threads take no further request; waiters look again."""
        with self._lock:
            self._halted = True
            self._space.notify_all()
            self._work.notify_all()

    def close(self) -> bool:
        """Drop the queued requests and release every waiter; True the first time."""
        with self._lock:
            first = not self._closed
            self._closed = True
            self._queue.clear()
            self._work.notify_all()
            self._space.notify_all()
        return first
