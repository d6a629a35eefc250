"""Pacer: the step requests that keep a stream's ratio of sampled to inserted transitions.

One job: before each batch is drawn, make the step requests that the ratio asks for, counted
in the steps the requests actually stored (the manager reports them: one per request for a
single env, a vector env's sub-env steps without its autoreset rows, an asynchronous engine's
received results), never in requests. :mod:`expreplay.stream` documents the guarantee.

Requests are asynchronous: a pending request will store at most ``per_request`` steps (the
largest ``num_envs`` of the players), so the pacer counts ``inserted + pending * per_request``
as what the requests made so far can deliver, and requests more only while that falls short
of the target. A request that stores fewer (an autoreset row, a partial ``recv``) leaves the
target short, and the next batch's requests make it up: the target is cumulative, so the
shortfall never grows beyond what ``maximum_staleness`` requests can hold.
"""

from __future__ import annotations

from typing import Any, Callable

from .ratelimit import SampleToInsertRatio

__all__ = ['Pacer']


class Pacer:
    """Step requests for a stream: ``update_frequency`` inserted steps per batch, or what a
    :class:`~expreplay.stream.ratelimit.SampleToInsertRatio` admits.

    Args:
        population: has ``step(exploration)``, ``progress() -> (inserted, pending)``,
            ``wait_idle()`` and ``per_request`` (the most steps one request stores).
        batch_size (int): transitions per batch.
        update_frequency (int or None): inserted steps per batch (the fixed schedule).
        limiter (SampleToInsertRatio or None): instead of ``update_frequency``.
        exploration (callable): returns the exploration each request carries (read per request).

    Use from one thread at a time (the one that draws the batches).
    """

    def __init__(self, population: Any, batch_size: int, update_frequency: int | None,
                 limiter: SampleToInsertRatio | None, exploration: Callable[[], float]) -> None:
        if (update_frequency is None) == (limiter is None):
            raise ValueError("give update_frequency or a limiter")
        self.population = population
        self.batch_size = batch_size
        self.update_frequency = update_frequency
        self.limiter = limiter
        self.exploration = exploration
        self.per_request = population.per_request
        inserted, pending = population.progress()
        # What the requests made before (the initial fill's) may still store counts as theirs.
        self.inserted_at_start = inserted + pending * self.per_request
        self.batches = 0                 # batches admitted so far
        self.requests = 0                # step requests made by the pacer
        # Fixed schedule: the steps the requests made so far may store must reach the target.
        self._target = self.inserted_at_start
        self._counted = inserted         # steps the limiter has been told of
        if limiter is not None and limiter.inserts == 0:
            limiter.try_insert(1)        # the initial fill stands for min_size_to_sample

    def before_draw(self) -> None:
        """Make the requests due before the next batch is drawn (blocks while the manager's
        staleness window is full; with a limiter, also until its inserts are stored)."""
        if self.limiter is None:
            if self.batches:
                self._target += self.update_frequency
            self._request_until(self._target)
        else:
            self._admit_sample()
        self.batches += 1

    def inserted(self) -> int:
        """Steps stored by the requests made since the pacer was built (those of the
        requests made before, pending then, counted as up to ``per_request`` each)."""
        return self.population.progress()[0] - self.inserted_at_start

    def measured_samples_per_insert(self) -> float | None:
        """Sampled transitions (batches admitted x batch_size) per inserted step since the
        pacer was built; None before any step was stored."""
        inserted = self.inserted()
        return self.batches * self.batch_size / inserted if inserted > 0 else None

    # ------------------------------------------------------------------ internals
    def _request_until(self, target):
        population, per_request = self.population, self.per_request
        while True:
            inserted, pending = population.progress()
            if inserted + pending * per_request >= target:
                return
            population.step(self.exploration())
            self.requests += 1

    def _admit_sample(self):
        limiter, population = self.limiter, self.population
        assert limiter is not None
        while True:
            inserted = self._book()
            if limiter.try_sample(self.batch_size):
                return
            # Steps are booked up to what is stored (the limiter admits inserts whenever it
            # refuses a sample: the error buffer rules out both refusing): more are needed.
            target = inserted + limiter.inserts_to_sample(self.batch_size)
            stored, pending = population.progress()
            if pending and stored + pending * self.per_request >= target:
                population.wait_idle()   # what is requested will do: wait for it to be stored
            else:
                population.step(self.exploration())
                self.requests += 1

    def _book(self):
        """Tell the limiter of the steps stored since the last call (in chunks it admits;
        what it refuses now is told later). Returns the steps stored so far."""
        limiter = self.limiter
        assert limiter is not None
        inserted, _ = self.population.progress()
        while self._counted < inserted:
            n = min(inserted - self._counted, limiter.insert_size)
            if not limiter.try_insert(n):
                break
            self._counted += n
        return inserted
