"""The staleness window: step requests accepted, taken by simulator threads, and finished.

:class:`StalenessWindow` holds the requests of :meth:`EnvRunnerManager.step
<expreplay.acting.manager.EnvRunnerManager.step>`: it accepts request ``k`` only once every request
before ``k - maximum_staleness + 1`` has finished, hands queued requests to the simulator threads,
and counts the steps the finished ones stored (:class:`InsertedSteps`, the one count of inserted
steps, whatever the mode).

Each request is stamped with the learner's update count when it is accepted (a
:class:`~expreplay.lags.DataLags`), and its request lag is counted when a thread takes
it. With a fixed ``request_lag`` of K updates, a request made after the learner's first update
is handed to the threads only once K more updates are made, and the update after those waits
until the threads have taken it: every such request starts exactly K updates after it was
made, however fast or loaded the machine (the learner waits for the players if they are
slower). Requests made before the first update (the initial fill, the first batch's) start at
once, and so do those pending when someone waits for the window to empty (:meth:`wait_idle`):
without updates, none would ever start.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import ManagerClosed
from ..lags import DataLags

__all__ = ['StalenessWindow', 'Request', 'InsertedSteps']


class Request:
    """One accepted step request (one step of one runner)."""
    __slots__ = ('seq', 'exploration', 'stamp', 'done')

    def __init__(self, seq: int, exploration: float, stamp: int) -> None:
        self.seq = seq
        self.exploration = exploration
        self.stamp = stamp            # the learner's updates when the request was accepted
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
    ``lags`` stamps the requests and counts their lag; ``request_lag`` (updates, None: none
    imposed) holds each request back that long (see the module docstring).
    """

    def __init__(self, maximum_staleness: int, check: Callable[[], None],
                 watch: Callable[[float], float | None], lags: DataLags | None = None,
                 request_lag: int | None = None) -> None:
        self.maximum_staleness = maximum_staleness
        self.lags = lags = DataLags() if lags is None else lags
        self.request_lag = request_lag
        if request_lag is not None:
            lags.set_gate(self)
        self._check = check
        self._watch = watch
        # Re-entrant: a watch that fails the manager halts the window from inside a wait.
        self._lock = threading.RLock()
        self._work = threading.Condition(self._lock)    # simulator threads wait for requests
        self._space = threading.Condition(self._lock)   # step() waits for the window
        self._queue: collections.deque[Request] = collections.deque()        # accepted, not started
        self._unfinished: collections.deque[Request] = collections.deque()   # oldest first
        self._next_seq = 0
        self._flushed = 0     # requests before this seq start at once (wait_idle)
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
            req = Request(self._next_seq, exploration, self.lags.updates)
            self._next_seq += 1
            self._queue.append(req)
            self._unfinished.append(req)
            self._pending += 1
            self._work.notify()

    def wait_idle(self, timeout: float | None) -> None:
        """Block until no request is pending; TimeoutError after ``timeout`` seconds. With a
        fixed request lag, the requests accepted so far start now (no update would come while
        the caller waits: their lag is then shorter, and counted as it is)."""
        with self._lock:
            if self._next_seq > self._flushed:
                self._flushed = self._next_seq
                self._work.notify_all()
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
            while not self._takeable() and not self._closed and not self._halted:
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
            reqs = [self._queue.popleft() for _ in range(self._released(n))]
            if reqs:
                self.lags.requests_started([req.stamp for req in reqs])
            if reqs and self.request_lag is not None:
                self._space.notify_all()      # an update may wait for these to start
            return reqs

    # ------------------------------------------------------------------ a fixed request lag
    def _is_released(self, req: Request, updates: int) -> bool:
        lag = self.request_lag
        return (lag is None or not req.stamp or updates >= req.stamp + lag
                or req.seq < self._flushed)

    def _takeable(self) -> bool:
        """A queued request may be started now (lock held)."""
        queue = self._queue
        return bool(queue) and self._is_released(queue[0], self.lags.updates)

    def _released(self, n: int) -> int:
        """How many of the first ``n`` queued requests may start now (lock held)."""
        if self.request_lag is None:
            return min(n, len(self._queue))
        updates, count = self.lags.updates, 0
        for req in self._queue:
            if count == n or not self._is_released(req, updates):
                break
            count += 1
        return count

    def before_update(self, updates: int) -> None:
        """The learner is about to make update ``updates + 1``: wait until every request
        released by now has been taken (each starts exactly ``request_lag`` updates after it
        was made). Raises the manager's fault; returns at a close."""
        with self._lock:
            try:
                self._wait(lambda: not (self._queue and self._is_released(self._queue[0], updates))
                           or self._closed or self._halted, None)
            except ManagerClosed:
                return

    def after_update(self, updates: int) -> None:
        """The learner made an update: requests it releases may start."""
        with self._lock:
            if self._queue:
                self._work.notify_all()

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
