"""DataLags: the learner's update count, and how far behind it the data it trains on is.

A transition reaches an update late for several reasons, each counted here apart, in learner
updates (the figures: :class:`~expreplay.stats.DataLagStats`):

* request lag: a step request waits in the staleness window until a simulator thread starts
  it (the window stamps each request with the update count when it is made);
* the weights' age: the predictor acts with the weights last handed over (assigned as the
  population's predictor), counted per state predicted;
* prefetch delay: a batch drawn ahead waits in the prefetch buffer;
* input-queue delay: a learner that queues batches itself (tensorpack's ``QueueInput``) uses
  a batch some updates after it was handed out.

The clock is the learner's update count. By default a stream counts an update each time the
learner asks for its next batch (it does once its update with the last one is made). A
learner that does not use the batches one by one as it gets them counts its updates itself
(:meth:`count_updates`, e.g. ``ExpReplay`` from tensorpack's steps); the batches handed out
ahead of those updates are then the input queue's delay. Events before the first update (the
initial fill, the first batch) are not counted.
"""

from __future__ import annotations

import threading
from typing import Protocol

from .stats import DataLagStats, LagFigures

__all__ = ['DataLags', 'LagTally', 'UpdateGate']


class LagTally:
    """Count, sum, smallest and largest of lags added one at a time (the caller holds the lock)."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        self.min: int | None = None
        self.max: int | None = None

    def add(self, lag: int, times: int = 1) -> None:
        self.count += times
        self.total += lag * times
        self.min = lag if self.min is None else min(self.min, lag)
        self.max = lag if self.max is None else max(self.max, lag)

    def figures(self) -> LagFigures:
        return LagFigures(count=self.count, mean=self.total / self.count if self.count else None,
                          min=self.min, max=self.max)


class UpdateGate(Protocol):
    """What a fixed request lag needs from the clock: to hold an update until the requests it
    releases have started (:meth:`before_update`), and to hear of it (:meth:`after_update`)."""

    def before_update(self, updates: int) -> None: ...

    def after_update(self, updates: int) -> None: ...


class DataLags:
    """The learner's updates, and each lag of the data measured against them (see the module
    docstring). Thread-safe: the learner, the simulator, inference and prefetch threads tell
    it what they do."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Updates the learner made (the clock); read without the lock (a single int).
        self.updates = 0
        self._counted_by_learner = False
        self._handed_out = 0                 # batches handed out, for the input queue's delay
        self._holding = False                # the learner holds a batch its update is not counted of
        self._weights_version: int | None = None   # the clock at the last hand-over
        self._gate: UpdateGate | None = None
        self._request = LagTally()
        self._age = LagTally()
        self._prefetch = LagTally()
        self._queue = LagTally()

    def set_gate(self, gate: UpdateGate) -> None:
        """Hold every update until ``gate`` lets it pass (a window with a fixed request lag)."""
        self._gate = gate

    # ------------------------------------------------------------------ the learner's side
    def next_asked(self) -> None:
        """The learner asks for its next batch: its update with the last one is made (not
        counted if it counts its own, :meth:`count_updates`)."""
        if not self._counted_by_learner:
            self._holding = False
            self._advance(1)

    def handed_out(self, drawn_at: int) -> None:
        """A batch drawn when the clock read ``drawn_at`` is handed to the learner."""
        with self._lock:
            updates = self.updates
            if updates:
                self._prefetch.add(updates - drawn_at)
            if self._counted_by_learner:
                if updates:
                    # The learner uses the batches in order, one per update: this one with
                    # update `handed out before it + 1`, while `updates` are made.
                    self._queue.add(self._handed_out - updates)
                self._handed_out += 1
            else:
                self._holding = True

    def count_updates(self, n: int = 1) -> None:
        """The learner made ``n`` updates (0: none yet, to say it counts them before its first
        batch); from the first call on, only these calls move the clock."""
        self._counted_by_learner = True
        self._holding = False
        self._advance(n)

    def _advance(self, n: int) -> None:
        gate = self._gate
        for _ in range(n):
            if gate is not None:
                gate.before_update(self.updates)
            with self._lock:
                self.updates += 1
            if gate is not None:
                gate.after_update(self.updates)

    # ------------------------------------------------------------------ what the players tell
    def requests_started(self, stamps: list[int]) -> None:
        """Step requests made when the clock read ``stamps`` start now (one lock for all)."""
        with self._lock:
            updates, tally = self.updates, self._request
            for stamp in stamps:
                if stamp:
                    tally.add(updates - stamp)

    def handed_over(self) -> None:
        """The players act with new weights from now on (a predictor was assigned): those of
        the updates counted, and of the one made with the batch the learner holds, if any."""
        with self._lock:
            version = self.updates + self._holding
            self._weights_version = version if version else None

    def acted(self, states: int) -> None:
        """``states`` greedy actions are computed with the weights handed over last."""
        version = self._weights_version
        if version is not None:
            with self._lock:
                self._age.add(self.updates + self._holding - version, states)

    # ------------------------------------------------------------------ figures
    def figures(self) -> DataLagStats:
        """The lags so far, a :class:`~expreplay.stats.DataLagStats`."""
        with self._lock:
            return DataLagStats(updates=self.updates, request_lag=self._request.figures(),
                                weights_age=self._age.figures(),
                                prefetch_delay=self._prefetch.figures(),
                                input_queue_delay=self._queue.figures())

    def __repr__(self) -> str:
        return f"DataLags(updates={self.updates})"
