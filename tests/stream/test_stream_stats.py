"""Every ``stats()`` returns a frozen record of :mod:`expreplay.stats`, each field documented
once there; the stream's record extends the population's, which extends the manager's."""

import ast
import dataclasses
import inspect

import pytest

from expreplay import stats as stats_module
from expreplay.acting.episodes import EpisodeRecord, EpisodeTotals
from expreplay.stats import (EpisodeTotalsStats, ManagerStats, PopulationStats, RateLimiterStats,
                             RayTrafficStats, ScoreWindow, StreamStats)
from expreplay.stream import Population
from expreplay.stream.ratelimit import SampleToInsertRatio
from test_stream import EnvFactory, make_stream, prefer, take

RECORDS = (ManagerStats, PopulationStats, StreamStats, RateLimiterStats, RayTrafficStats,
           EpisodeTotalsStats)


def _field_docs():
    """``{(class name, field): its #: comment}`` read from the module's source; a comment
    stands for the fields that follow it up to the next comment or blank line."""
    lines = inspect.getsource(stats_module).splitlines()
    docs = {}
    for node in ast.parse('\n'.join(lines)).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign):
                above = stmt.lineno - 2
                while above >= 0 and not lines[above].strip().startswith('#:') \
                        and lines[above].strip():
                    above -= 1
                comment = lines[above].strip() if above >= 0 else ''
                docs[node.name, stmt.target.id] = comment if comment.startswith('#:') else None
    return docs


def test_every_field_is_documented_once_in_the_class_that_adds_it():
    docs = _field_docs()
    for record in RECORDS:
        own = {f.name for f in dataclasses.fields(record)}
        for base in record.__mro__[1:]:
            if dataclasses.is_dataclass(base):
                own -= {f.name for f in dataclasses.fields(base)}
        for name in own:
            assert docs.get((record.__name__, name)), f'{record.__name__}.{name} has no #: doc'
        # No field is declared (and documented) again in a record that extends another.
        inherited = set().union(*(getattr(b, '__annotations__', {}) for b in record.__mro__[1:]))
        assert not set(record.__annotations__) & inherited


def test_the_stream_population_and_manager_return_their_records():
    with make_stream(EnvFactory(), prefer(1), exploration=0.0, init_memory_size=60,
                     prefetch=2) as stream:
        before = stream.stats()
        assert type(before) is StreamStats and before.games == 0 and before.steps == 0
        assert before.batches_drawn is None and before.prefetch_ready is None
        take(iter(stream), 30)
        stats = stream.stats()
        population = stream.population.stats()
        manager = stream.population.manager.stats()
    assert type(population) is PopulationStats and type(manager) is ManagerStats
    assert 0 < stats.memory_transitions <= len(stream.memory)
    assert stats.batches_drawn >= 30 and stats.prefetch_waits >= 0
    assert stats.greedy_fraction == pytest.approx(1.0, abs=0.05)
    assert stats.stale_priority_updates is None          # a uniform memory
    # The stream's record carries the population's and the manager's fields, by name.
    assert set(population.as_dict()) < set(stats.as_dict())
    assert set(manager.as_dict()) < set(population.as_dict())
    assert isinstance(stats.stuck_threads, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.games = 3


def test_after_games_every_layer_returns_its_record_and_reset_stats_its_score_window():
    # Greedy action 1 in games of 4 steps; no prefetch thread, so nothing steps after wait_idle.
    with make_stream(EnvFactory(episode_lengths=4), prefer(1), exploration=0.0,
                     init_memory_size=60, prefetch=0) as stream:
        take(iter(stream), 40)
        population, manager = stream.population, stream.population.manager
        population.wait_idle()
        stats = stream.stats()
        assert type(stats) is StreamStats and type(population.stats()) is PopulationStats
        assert type(manager.stats()) is ManagerStats
        assert stats.games > 0 and stats.mean_episode_length == 4.0 and stats.steps > 0
        assert stats.mean_score is not None and stats.max_score >= stats.mean_score
        assert stats.episodes_total >= stats.games and stats.inference_calls > 0
        totals = stream.episode_totals.snapshot()
        assert type(totals) is EpisodeTotalsStats and totals.episodes == stats.episodes_total
        assert totals.steps == 4 * totals.episodes
        assert sum(totals.by_kind.values()) == totals.episodes

        # Each layer's reset_stats() returns a ScoreWindow, a tuple that unpacks as tensorpack's
        # (mean, max): the population's closes the window the stream's stats() just read ...
        window = population.reset_stats()
        assert type(window) is ScoreWindow
        mean, best = window
        assert (mean, best) == (window.mean, window.max) == (stats.mean_score, stats.max_score)
        # ... and the manager's and the stream's find the next one empty.
        assert type(manager.reset_stats()) is ScoreWindow
        empty = stream.reset_stats()
        assert type(empty) is ScoreWindow and empty == ScoreWindow() == (None, None)
        assert stream.stats().games == 0 and stream.stats().episodes_total == stats.episodes_total
    closed = population.reset_stats()
    assert type(closed) is ScoreWindow and closed == (None, None)


def test_episode_totals_snapshot_is_a_record_of_the_totals_then():
    totals = EpisodeTotals()
    record = EpisodeRecord(runner=0, env_index=0, episode=0, seed=None, start_kind='reset',
                           score=1.0, length=7, terminated=True, truncated=False, life_losses=2,
                           wall_time=1.0, steps_per_sec=7.0, end_time=0.0)
    totals(record)
    totals(record._replace(start_kind='restart', length=3, life_losses=0))
    snapshot = totals.snapshot()
    assert snapshot == EpisodeTotalsStats(episodes=2, steps=10, life_losses=2,
                                          by_kind={'reset': 1, 'restart': 1})
    totals(record)
    assert snapshot.episodes == 2 and snapshot.by_kind == {'reset': 1, 'restart': 1}   # a copy
    # The dict it used to be, for a logger; and the old dict read still works, with a warning.
    assert totals.snapshot().as_dict() == {'episodes': 3, 'steps': 17, 'life_losses': 4,
                                           'by_kind': {'reset': 2, 'restart': 1}}
    with pytest.warns(DeprecationWarning, match='read stats.episodes instead'):
        assert totals.snapshot()['episodes'] == 3


def test_a_population_not_started_reports_an_empty_window():
    stats = Population(EnvFactory(), 2).stats()
    assert stats == PopulationStats()
    assert (stats.games, stats.steps, stats.mean_score, stats.greedy_fraction) == (0, 0, None, None)


def test_the_rate_limiter_returns_its_record():
    lim = SampleToInsertRatio(2.0, 3, 4.0)
    for _ in range(3):
        assert lim.try_insert(1)
    stats = lim.stats()
    assert type(stats) is RateLimiterStats
    assert (stats.inserts, stats.samples, stats.diff, stats.sample_wait_time) == (3, 0, 6.0, 0.0)


def test_the_ray_traffic_counts_make_its_record():
    pytest.importorskip('ray')
    import time

    import numpy as np

    from expreplay.ray._fleet import Traffic
    traffic = Traffic()
    empty = traffic.report(actor_restarts=0)
    assert type(empty) is RayTrafficStats and empty.mean_in_flight is None
    assert (empty.results, empty.env_steps, empty.bytes_per_step) == (0, 0, 0.0)
    frames, small = np.zeros((2, 6), np.uint8), np.zeros(2, np.float32)
    # (token, obs, reward, terminated, truncated, lives or None, the actor's compute seconds)
    traffic.result(2, (None, frames, small, small, small, None, 0.5), time.perf_counter())
    traffic.result(2, (None, frames, small, small, small, small, 0.3), time.perf_counter())
    traffic.recv(in_flight=2)
    traffic.recv(in_flight=1)
    traffic.waited(0.25)
    stats = traffic.report(actor_restarts=1)
    assert (stats.results, stats.env_steps, stats.recv_calls, stats.actor_restarts) == (2, 4, 2, 1)
    assert stats.bytes == 2 * (12 + 3 * 8) + 8 and stats.bytes_per_step == stats.bytes / 4
    assert stats.compute == pytest.approx(0.8) and stats.compute_per_step == pytest.approx(0.2)
    assert stats.overhead_per_step == pytest.approx((stats.round_trip - 0.8) / 4)
    assert (stats.mean_in_flight, stats.wait) == (1.5, 0.25)


def test_reading_a_record_as_a_dict_still_works_and_says_how_to_read_it():
    stats = Population(EnvFactory(), 2).stats()
    with pytest.warns(DeprecationWarning, match='read stats.games instead'):
        assert stats['games'] == 0
    with pytest.warns(DeprecationWarning):
        assert stats.get('mean_score', 'none') == 'none'   # None reads as absent, as before
    with pytest.warns(DeprecationWarning), pytest.raises(KeyError):
        stats['no_such_figure']
