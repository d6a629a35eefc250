"""What every ``stats()`` returns: typed, frozen records, each figure documented once, here.

* :class:`ManagerStats`: :meth:`EnvRunnerManager.stats <expreplay.EnvRunnerManager.stats>`, the
  players' figures since the last ``reset_stats()`` (the *window*) and a few totals;
* :class:`PopulationStats`: :meth:`Population.stats
  <expreplay.acting.population.Population.stats>`, those plus the share of greedy actions and
  the episode totals of the whole run;
* :class:`StreamStats`: :meth:`ReplayStream.stats <expreplay.ReplayStream.stats>` (and
  ``ExpReplay.stream.stats()``), those plus the memory, the batches and the prefetcher;
* :class:`RateLimiterStats`: :meth:`SampleToInsertRatio.stats
  <expreplay.stream.ratelimit.SampleToInsertRatio.stats>`;
* :class:`RayTrafficStats`: :meth:`RayVectorEnv.stats <expreplay.ray.RayVectorEnv.stats>`;
* :class:`EpisodeTotalsStats`: :meth:`EpisodeTotals.snapshot
  <expreplay.acting.episodes.EpisodeTotals.snapshot>`, the episode totals of a whole run;
* :class:`DataLagStats` (``PopulationStats.lags``): how far behind the learner the data is,
  each lag's :class:`LagFigures` (:class:`~expreplay.lags.DataLags` counts them).

Every ``reset_stats()`` (of the manager, the population and the stream) returns a
:class:`ScoreWindow`: the mean and largest score of the window it closes, a named tuple, so
``mean, best = stream.reset_stats()`` unpacks it as tensorpack's ``reset_stats()`` was.

Read the figures as attributes (``stream.stats().mean_score``); ``as_dict()`` gives a plain
dict (for a logger or ``json.dumps``). A figure that has no value yet (no game finished, no
batch drawn, no prefetcher) is None. Each record extends the one before it in the list above
where it says so, so the stream's record has every field of the population's and the
manager's.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, NamedTuple, TypeVar

__all__ = ['ScoreWindow', 'ManagerStats', 'PopulationStats', 'StreamStats', 'RateLimiterStats',
           'RayTrafficStats', 'EpisodeTotalsStats', 'LagFigures', 'DataLagStats']

_R = TypeVar('_R', bound='_Record')


class ScoreWindow(NamedTuple):
    """What ``reset_stats()`` returns: the scores of the games finished in the window it
    closes. A tuple, ``(mean, max)``, for code that unpacks it; ``ScoreWindow()`` is a window
    without games."""

    #: Mean and largest score of those games; None without games.
    mean: float | None = None
    max: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Record:
    """A frozen record of figures."""

    def as_dict(self) -> dict[str, Any]:
        """The figures as a plain dict, field name -> value (a record inside as a dict too)."""
        return {name: value.as_dict() if isinstance(value, _Record) else value
                for name, value in self._fields().items()}

    def _fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def extending(cls: type[_R], base: _Record, **more: Any) -> _R:
        """This record from the fields of ``base`` (a record this one extends) and ``more``."""
        return cls(**base._fields(), **more)

    # Reading a record as the dict it used to be, for code written before the records: it
    # works and warns once per place (read the attribute instead).
    def __getitem__(self, key: str) -> Any:
        _warn_dict_read(key)
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        """The dict-style read of a figure, None counting as absent (deprecated)."""
        _warn_dict_read(key)
        value = getattr(self, key, None)
        return default if value is None else value


def _warn_dict_read(key: str) -> None:
    warnings.warn(f"stats() returns a record now: read stats.{key} instead of "
                  f"stats[{key!r}] / stats.get({key!r}) (as_dict() gives a dict)",
                  DeprecationWarning, stacklevel=3)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ManagerStats(_Record):
    """The players' figures: the window's (since the last ``reset_stats()``) and, where said,
    totals or the state now. The defaults are an empty window (a population not started)."""

    #: Games (episodes) finished in the window.
    games: int = 0
    #: Mean and largest score of those games; None without games.
    mean_score: float | None = None
    max_score: float | None = None
    #: Mean steps per game; None without games.
    mean_episode_length: float | None = None
    #: Env steps taken in the window, and per second of it.
    steps: int = 0
    steps_per_sec: float = 0.0
    #: Predictor calls in the window, and states per call (None without calls).
    inference_calls: int = 0
    mean_inference_batch: float | None = None
    #: Largest predictor call so far (states; threaded modes only, else None).
    max_inference_batch: int | None = None
    #: Step requests pending now (accepted, not finished), and of those not started yet.
    queue_depth: int = 0
    queued: int = 0
    #: Runner restarts (a crashed env replaced), total.
    restarts: int = 0
    #: Remote actors restarted by their engine (e.g. Ray), total.
    actor_restarts: int = 0
    #: Names of the threads a close left running (inside an env or predictor call).
    stuck_threads: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class LagFigures(_Record):
    """One lag, in learner updates, over every event counted since the first update."""

    #: Events counted (requests started, states predicted, batches handed out).
    count: int = 0
    #: Their mean, smallest and largest lag; None before the first.
    mean: float | None = None
    min: int | None = None
    max: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataLagStats(_Record):
    """How far behind the learner the data it trains on is, each source apart, in learner
    updates (:class:`~expreplay.lags.DataLags` says how each is counted). Cumulative
    from the learner's first update; not reset by ``reset_stats()``."""

    #: The learner's updates so far: batches handed to it, or what it counted itself
    #: (``ReplayStream.count_updates``; ``ExpReplay`` counts tensorpack's steps).
    updates: int = 0
    #: Updates made between a step request and its start (the staleness window's lag; 0 for
    #: one player, stepped when asked).
    request_lag: LagFigures = LagFigures()
    #: Updates made since the weights a greedy action was computed with were handed over
    #: (assigned as the predictor), per state; empty until a predictor is assigned after the
    #: first update (a predictor that reads live weights is as new as the last update).
    weights_age: LagFigures = LagFigures()
    #: Updates made between a batch's draw and its hand-out (the prefetch depth's lag).
    prefetch_delay: LagFigures = LagFigures()
    #: Batches handed out ahead of the update that uses them, for a learner that counts its
    #: updates itself and queues batches (tensorpack's ``QueueInput``); empty otherwise.
    input_queue_delay: LagFigures = LagFigures()


@dataclasses.dataclass(frozen=True, kw_only=True)
class PopulationStats(ManagerStats):
    """:class:`ManagerStats` plus the greedy share of the window and the run's episode totals."""

    #: States predicted per step taken in the window: the share of greedy actions, i.e. 1 -
    #: the exploration the runners applied. None without steps.
    greedy_fraction: float | None = None
    #: Episodes finished since the population started (not reset).
    episodes_total: int = 0
    #: Episodes started since the population started (not reset).
    episodes_started_total: int = 0
    #: Of those, started from a restart point (:class:`~expreplay.acting.episodes.RestartPool`).
    restart_starts: int = 0
    #: The data's lags behind the learner (not reset).
    lags: DataLagStats = DataLagStats()


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamStats(PopulationStats):
    """:class:`PopulationStats` plus the memory, the batches and the prefetcher."""

    #: Transitions in the memory now, and as a fraction of its ``max_size``.
    memory_transitions: int
    memory_fill: float
    #: Step requests the initial fill made (0 when a resumed memory needed none).
    fill_steps: int
    #: Priority updates skipped because their slot was rewritten (a prioritized memory only).
    stale_priority_updates: int | None = None
    #: Batches drawn since the fill (None before the stream is started).
    batches_drawn: int | None = None
    #: Measured sampled transitions per transition inserted since the fill, whatever the
    #: player (None before a batch).
    samples_per_insert: float | None = None
    #: Step requests made since the fill (None before the stream is started).
    step_requests: int | None = None
    #: With a prefetch thread: batches ready now, the ``next()`` calls that found none ready
    #: and waited, and the seconds they waited, summed (None without one).
    prefetch_ready: int | None = None
    prefetch_waits: int | None = None
    prefetch_wait_time: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RateLimiterStats(_Record):
    """A samples-per-insert limiter's counts."""

    #: Transitions and samples admitted so far.
    inserts: int
    samples: int
    #: ``inserts * samples_per_insert - samples`` now (kept in the limiter's
    #: ``[min_diff, max_diff]`` once sampling started).
    diff: float
    #: Seconds inserters and samplers waited to be admitted, summed.
    insert_wait_time: float
    sample_wait_time: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayTrafficStats(_Record):
    """What a :class:`~expreplay.ray.RayVectorEnv`'s actors returned and what it cost, so far."""

    #: Results received (one per actor request) and the env steps they carried.
    results: int
    env_steps: int
    #: Payload bytes received, summed.
    bytes: int
    #: Seconds the actors spent stepping (their own clock), and from send to receive, summed.
    compute: float
    round_trip: float
    #: Actors in flight summed over ``recv`` calls, and those calls.
    in_flight_sum: int
    recv_calls: int
    #: Seconds ``recv`` waited for a result, summed.
    wait: float
    #: Per env step: payload bytes, compute, round trip, and transport overhead (round trip -
    #: compute), in seconds.
    bytes_per_step: float
    compute_per_step: float
    round_trip_per_step: float
    overhead_per_step: float
    #: Mean actors in flight at a ``recv`` (None before the first).
    mean_in_flight: float | None
    #: Actors restarted after a death, total.
    actor_restarts: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeTotalsStats(_Record):
    """Episodes finished since an :class:`~expreplay.acting.episodes.EpisodeTotals` was made
    (over the whole run: never reset), and what they added up to."""

    #: Episodes finished, and the env steps and lives lost in them, summed.
    episodes: int = 0
    steps: int = 0
    life_losses: int = 0
    #: Episodes finished per start kind (``'reset'``, ``'restart'``, ``'autoreset'``, ...;
    #: the record's own copy).
    by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
