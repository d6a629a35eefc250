"""A samples-per-insert rate limiter, with the semantics of Reverb's ``SampleToInsertRatio``.

The limiter counts inserted items ``I`` and sampled items ``S`` and keeps the *diff*
``D = I * samples_per_insert - S`` inside a band around its target
``samples_per_insert * min_size_to_sample``:

- an insert of ``n`` items may go ahead while fewer than ``min_size_to_sample`` items were
  inserted, and afterwards when ``D + n * samples_per_insert <= max_diff``;
- a sample of ``n`` items may go ahead once ``min_size_to_sample`` items were inserted and
  ``D - n >= min_diff``;

with ``min_diff = target - error_buffer`` and ``max_diff = target + error_buffer``. So past the
initial fill, the learner samples ``samples_per_insert`` items per inserted one, give or take
``error_buffer``: a learner that gets ahead waits for the actors, actors that get ahead wait for
the learner.

Deadlocks are refused when the limiter is built. From a diff ``D`` no insert (of the largest
declared chunk, ``insert_size``) and no sample (of ``sample_size``) can proceed exactly when
``max_diff - insert_size * samples_per_insert < D < min_diff + sample_size``; that range is empty
for every ``D`` if and only if ``2 * error_buffer >= insert_size * samples_per_insert +
sample_size``, which the constructor requires. (Larger chunks than declared are refused too.)
"""

from __future__ import annotations

import math
import threading
import time

from .._checks import check_int, check_real, check_timeout
from ..stats import RateLimiterStats

__all__ = ['SampleToInsertRatio', 'RateLimiterTimeout', 'RateLimiterClosed']


class RateLimiterTimeout(TimeoutError):
    """An insert or a sample waited longer than its timeout."""


class RateLimiterClosed(RuntimeError):
    """The limiter was closed: no insert or sample is admitted any more."""


class SampleToInsertRatio:
    """Keep ``samples_per_insert`` sampled items per inserted item, within ``error_buffer``.

    Args:
        samples_per_insert (float): target ratio of sampled to inserted items (> 0).
        min_size_to_sample (int): items inserted before the first sample is admitted (>= 1).
        error_buffer (float): how far (in sampled items) the diff may stray from the target.
            Must be at least ``(insert_size * samples_per_insert + sample_size) / 2``.
        insert_size (int): the largest number of items one insert call admits.
        sample_size (int): the largest number of items one sample call admits (a batch).

    Thread-safe: any number of inserting and sampling threads may wait at once.
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, error_buffer: float,
                 *, insert_size: int = 1, sample_size: int = 1) -> None:
        self.samples_per_insert = check_real(samples_per_insert, 'samples_per_insert')
        if self.samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert!r}")
        self.min_size_to_sample = check_int(min_size_to_sample, 'min_size_to_sample', minimum=1)
        self.error_buffer = check_real(error_buffer, 'error_buffer', minimum=0.0)
        self.insert_size = check_int(insert_size, 'insert_size', minimum=1)
        self.sample_size = check_int(sample_size, 'sample_size', minimum=1)
        needed = (self.insert_size * self.samples_per_insert + self.sample_size) / 2
        if self.error_buffer < needed:
            raise ValueError(
                f"error_buffer={self.error_buffer:g} can deadlock: with samples_per_insert="
                f"{self.samples_per_insert:g}, inserts of up to {self.insert_size} and samples "
                f"of up to {self.sample_size}, both sides can be refused at once unless "
                f"error_buffer >= (insert_size * samples_per_insert + sample_size) / 2 = "
                f"{needed:g}")
        target = self.samples_per_insert * self.min_size_to_sample
        self.min_diff = target - self.error_buffer
        self.max_diff = target + self.error_buffer
        self.inserts = 0
        self.samples = 0
        self.insert_wait_time = 0.0     # seconds inserters spent blocked, summed
        self.sample_wait_time = 0.0
        self._closed = False
        self._waiting = 0               # threads blocked in await_insert / await_sample
        self._cond = threading.Condition(threading.Lock())

    # ------------------------------------------------------------------ rules
    def _diff(self):
        return self.inserts * self.samples_per_insert - self.samples

    def _can_insert(self, n):
        return (self.inserts < self.min_size_to_sample
                or self._diff() + n * self.samples_per_insert <= self.max_diff)

    def _can_sample(self, n):
        return self.inserts >= self.min_size_to_sample and self._diff() - n >= self.min_diff

    # ------------------------------------------------------------------ public
    def can_insert(self, n: int = 1) -> bool:
        """Whether an insert of ``n`` items would be admitted now (nothing is counted)."""
        n = self._check_n(n, self.insert_size, 'n')
        with self._cond:
            return self._can_insert(n)

    def can_sample(self, n: int = 1) -> bool:
        """Whether a sample of ``n`` items would be admitted now (nothing is counted)."""
        n = self._check_n(n, self.sample_size, 'n')
        with self._cond:
            return self._can_sample(n)

    def inserts_to_sample(self, n: int = 1) -> int:
        """How many more items must be inserted before a sample of ``n`` is admitted (0: it
        is admitted now). Nothing is counted."""
        n = self._check_n(n, self.sample_size, 'n')
        with self._cond:
            short = self.min_size_to_sample - self.inserts
            # (inserts + x) * samples_per_insert - samples - n >= min_diff
            x = math.ceil((self.samples + n + self.min_diff) / self.samples_per_insert
                          - self.inserts - 1e-9)
            return max(0, short, x)

    def try_insert(self, n: int = 1) -> bool:
        """Count an insert of ``n`` items if it is admitted now; return whether it was."""
        return self._acquire(n, True, 0.0, block=False)

    def try_sample(self, n: int = 1) -> bool:
        """Count a sample of ``n`` items if it is admitted now; return whether it was."""
        return self._acquire(n, False, 0.0, block=False)

    def await_insert(self, n: int = 1, timeout: float | None = None) -> None:
        """Wait until an insert of ``n`` items is admitted, and count it.

        Raises:
            RateLimiterTimeout: not admitted within ``timeout`` seconds (None: no limit).
            RateLimiterClosed: the limiter is closed (also while waiting).
        """
        self._acquire(n, True, timeout, block=True)

    def await_sample(self, n: int = 1, timeout: float | None = None) -> None:
        """Wait until a sample of ``n`` items is admitted, and count it (see
        :meth:`await_insert` for the errors)."""
        self._acquire(n, False, timeout, block=True)

    def close(self) -> None:
        """Refuse every insert and sample from now on; every waiter raises
        :class:`RateLimiterClosed`. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def waiting(self) -> int:
        """Threads blocked in :meth:`await_insert` or :meth:`await_sample` now."""
        return self._waiting

    def stats(self) -> RateLimiterStats:
        """Counts, the diff and the time spent waiting: a
        :class:`~expreplay.stats.RateLimiterStats`."""
        with self._cond:
            return RateLimiterStats(inserts=self.inserts, samples=self.samples,
                                    diff=self._diff(), insert_wait_time=self.insert_wait_time,
                                    sample_wait_time=self.sample_wait_time)

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _check_n(n, largest, name):
        n = check_int(n, name, minimum=1)
        if n > largest:
            raise ValueError(f"{name}={n} is more than the limiter was built for ({largest}); "
                             "a larger chunk could deadlock")
        return n

    def _acquire(self, n, insert, timeout, block):
        n = self._check_n(n, self.insert_size if insert else self.sample_size, 'n')
        timeout = check_timeout(timeout, 'timeout', allow_none=True)
        admitted = self._can_insert if insert else self._can_sample
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            start = time.monotonic()
            try:
                while True:
                    if self._closed:
                        raise RateLimiterClosed("the rate limiter is closed")
                    if admitted(n):
                        break
                    if not block:
                        return False
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        side = 'insert' if insert else 'sample'
                        raise RateLimiterTimeout(
                            f"{side} of {n} not admitted within {timeout:g} s (inserts="
                            f"{self.inserts}, samples={self.samples}, diff={self._diff():g}, "
                            f"allowed diff [{self.min_diff:g}, {self.max_diff:g}])")
                    self._waiting += 1
                    try:
                        self._cond.wait(remaining)
                    finally:
                        self._waiting -= 1
            finally:
                waited = time.monotonic() - start
                if insert:
                    self.insert_wait_time += waited
                else:
                    self.sample_wait_time += waited
            if insert:
                self.inserts += n
            else:
                self.samples += n
            # The other side (and same-side waiters with smaller chunks) may now proceed.
            self._cond.notify_all()
            return True
