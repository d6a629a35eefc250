"""What a learner written against the stream gets right without knowing the library: epsilon
given once as a schedule, and a warning when the players never use the Q-function."""

import warnings

import numpy as np
import pytest

from expreplay import Population, ReplayMemory, ReplayStream, Sampling
from scripted_env import ScriptedEnv
from expreplay.stream import replay_stream, watch
from test_stream import EnvFactory, _scripted_vector, make_stream, our_threads, prefer, take


def test_an_exploration_schedule_is_read_at_the_steps_stored():
    seen = []

    def schedule(steps):
        seen.append(steps)
        return 1.0 if steps < 150 else 0.0

    with make_stream(EnvFactory(), prefer(1), exploration=schedule, init_memory_size=100,
                     prefetch=0) as stream:
        assert stream.exploration == 1.0           # before the start: the schedule at 0 steps
        batches = iter(stream)
        for _ in range(40):                        # 4 steps per batch: past 150 steps stored
            next(batches)
        assert stream.exploration == 0.0
        stream.reset_stats()
        for _ in range(20):
            next(batches)
        stats = stream.stats()
    # The schedule was read with the growing step count, and once it said 0 every action was greedy.
    assert seen == sorted(seen) and seen[-1] >= 150
    # greedy_fraction is the predictor's rows over the steps stored in the window: a step each
    # player predicted before reset_stats() and stored after it counts as a step without its row
    # (seen under load: 77 of 78). Any random action beyond that fails (epsilon 0.1: ~0.9).
    players = 2
    assert 1.0 - players / stats.steps <= stats.greedy_fraction <= 1.0
    assert our_threads() == []


def test_assigning_a_number_replaces_the_schedule():
    population = Population(EnvFactory(), 1, exploration=lambda steps: 0.5)
    assert population.exploration == 0.5 and population.exploration_schedule is not None
    population.exploration = 0.2
    assert population.exploration == 0.2 and population.exploration_schedule is None


@pytest.mark.parametrize('bad', [lambda steps: 1.5, lambda steps: -0.1])
def test_a_schedule_out_of_range_is_refused_naming_exploration(bad):
    with pytest.raises(ValueError, match='exploration'):
        Population(EnvFactory(), 1, exploration=bad)


@pytest.mark.parametrize('exploration, predictor, warns', [
    (1.0, prefer(1), True),        # a Q-function that is never used: the forgotten epsilon
    (0.5, prefer(1), False),
    (1.0, None, False),            # no Q-function: random play is all there can be
])
def test_a_stream_that_only_plays_at_random_warns_once(monkeypatch, exploration, predictor, warns):
    # Both thresholds: epsilon here is the Population's number, never assigned (the early one).
    monkeypatch.setattr(watch, 'RANDOM_PLAY_WARNING_BATCHES', 30)
    monkeypatch.setattr(watch, 'RANDOM_PLAY_UNSET_WARNING_BATCHES', 30)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        with make_stream(EnvFactory(), predictor, exploration=exploration, prefetch=0) as stream:
            batches = iter(stream)
            for _ in range(29):
                next(batches)
            assert not [w for w in caught if 'exploration 1.0' in str(w.message)]
            for _ in range(40):
                next(batches)
    random_play = [w for w in caught if 'exploration 1.0' in str(w.message)]
    assert len(random_play) == (1 if warns else 0)
    if warns:
        assert issubclass(random_play[0].category, RuntimeWarning)
        assert 'Population(exploration=' in str(random_play[0].message)
    np.testing.assert_equal(our_threads(), [])


@pytest.mark.default_prefetch
@pytest.mark.parametrize('players, vector, depth', [(1, False, 0), (1, True, 0), (2, False, 0),
                                                    (2, True, replay_stream.DEFAULT_PREFETCH)])
def test_the_default_prefetch_draws_ahead_only_for_vector_players(players, vector, depth):
    # One player is stepped by the drawing thread itself, and single envs hold the GIL: a
    # prefetch thread would only compete with the learner's. Vector players step outside it.
    factory = _scripted_vector(2) if vector else EnvFactory()
    stream = make_stream(factory, num_parallel_players=players)
    assert stream.prefetch is None          # chosen by start(), once the players exist
    with stream:
        next(iter(stream))
        assert stream.prefetch == depth
        assert (stream.prefetcher is None) == (depth == 0)
    assert our_threads() == []


def test_a_given_prefetch_is_kept_whatever_the_players():
    with make_stream(EnvFactory(), num_parallel_players=2, prefetch=3) as stream:
        assert stream.prefetch == 3
        next(iter(stream))
        assert stream.prefetcher is not None
    assert our_threads() == []


@pytest.mark.parametrize('layout', ['NHWC', 'NCHW'])
@pytest.mark.parametrize('players', [1, 2])
def test_the_players_states_have_the_layout_of_the_batches(layout, players):
    seen = []

    def predictor(states):
        seen.append(states.shape[1:])
        return np.zeros((len(states), 3), np.float32)

    memory = ReplayMemory(2000, (6,), 3)
    population = Population(lambda: ScriptedEnv(0), players, predictor, exploration=0.0, seed=0)
    stream = ReplayStream(memory, population, Sampling(8, 1, layout=layout, seed=0),
                          init_memory_size=32, prefetch=0, progress=False)
    with stream:
        batch = next(iter(stream))
    expected = (6, 3) if layout == 'NHWC' else (3, 6)
    assert batch.state.shape[1:] == expected
    assert seen and set(seen) == {expected}


def test_a_learner_counts_frames_by_the_memory_s_steps_written(tmp_path):
    # CleanRL's global_step, learning_starts and train_frequency: batch k (from 1) comes once
    # fill + (k - 1) * update_frequency frames are stored, exactly with one player stepped
    # inline; a memory restored from a checkpoint goes on with its own count.
    seen = []
    with make_stream(EnvFactory(), prefer(1), num_parallel_players=1, init_memory_size=100,
                     update_frequency=4, prefetch=0, checkpoint_dir=tmp_path) as stream:
        for k, _ in enumerate(stream, start=1):
            seen.append((k, stream.memory.num_steps_written))
            if k == 30:
                break
    assert seen == [(k, 100 + (k - 1) * 4) for k in range(1, 31)]
    with make_stream(EnvFactory(), prefer(1), num_parallel_players=1, init_memory_size=100,
                     update_frequency=4, prefetch=0, checkpoint_dir=tmp_path) as stream:
        assert stream.resumed
        first = next(iter(stream))
        assert first is not None and stream.memory.num_steps_written == 100 + 29 * 4


def test_every_episode_s_return_comes_with_its_frame_the_fill_s_told_apart():
    # A learning curve of every episode (the fill's included), as a returns file wants it:
    # each record says the frames stored when it ended; the fill's end at frames <= fill.
    # The stream's own window (stats(), from the fill's end) counts only the games after it.
    records = []
    with make_stream(EnvFactory(episode_lengths=(9, 4)), prefer(1), num_parallel_players=1,
                     init_memory_size=100, update_frequency=4, prefetch=0,
                     on_episode_end=records.append) as stream:
        take(iter(stream), 50)
        stats = stream.stats()
    frames = [r.frames for r in records]
    assert frames == list(np.cumsum([r.length for r in records]))   # one player: exact
    fill = [r for r in records if r.frames <= 100]
    assert fill and len(fill) < len(records)
    assert stats.games == len(records) - len(fill)
