"""The data's lags behind the learner (``stats().lags``), each against a set-up whose lag is
known exactly, and the fixed request lag, which must not move with the machine's load."""

import threading

import numpy as np
import pytest

from expreplay import Population, ReplayMemory, ReplayStream, Sampling
from expreplay.lags import DataLags
from scripted_env import ScriptedEnv


def q_values(states):
    return np.tile(np.arange(3, dtype=np.float32), (len(states), 1))


def stream_of(players, *, exploration=0.0, prefetch=0, request_lag=None, staleness=None,
              update_frequency=1):
    memory = ReplayMemory(4000, (6,), 2)
    population = Population(lambda: ScriptedEnv(0, episode_lengths=(37, 5, 90)), players,
                            q_values, exploration=exploration, request_lag=request_lag,
                            maximum_staleness=staleness, seed=0)
    return ReplayStream(memory, population, Sampling(8, update_frequency, seed=0),
                        init_memory_size=64, prefetch=prefetch, progress=False)


def test_the_weights_age_counts_the_updates_since_the_last_hand_over():
    # One inline player acting greedily: each batch's one step is predicted before the batch
    # is drawn, with the clock at the updates made. Weights handed over after every N-th batch
    # are 0, 1, .., N - 1 updates old at those steps, in turn.
    n, cycles = 5, 6
    with stream_of(1) as stream:
        for k, _ in enumerate(stream, 1):
            if k % n == 0:
                stream.predictor = q_values      # a hand-over (the same function is fine)
            if k == n * (cycles + 1):
                break
        age = stream.stats().lags.weights_age
    assert (age.count, age.min, age.max) == (n * cycles, 0, n - 1)
    assert age.mean == pytest.approx((n - 1) / 2)


def test_weights_never_handed_over_have_no_age():
    with stream_of(1) as stream:
        for k, _ in enumerate(stream):
            if k == 20:
                break
        lags = stream.stats().lags
    assert lags.updates == 20 and lags.weights_age.count == 0 and lags.weights_age.mean is None


def test_one_player_steps_its_requests_when_made():
    with stream_of(1, update_frequency=2) as stream:
        for k, _ in enumerate(stream):
            if k == 30:
                break
        request = stream.stats().lags.request_lag
    assert request.count == 2 * 30 and request.max == 0


@pytest.mark.parametrize('depth', [0, 1, 4])
def test_the_prefetch_delay_is_the_depth_of_a_full_buffer(depth):
    # A learner slower than the prefetch thread (it waits for the buffer to be full before
    # each batch) gets batches drawn up to `depth` updates before (a buffer of 1: exactly 1);
    # drawn in its own next(), none.
    with stream_of(2, exploration=1.0, prefetch=depth) as stream:
        for k, _ in enumerate(stream):
            if k == 40:
                break
            if depth:
                assert stream.prefetcher.wait_full(10)
        delay = stream.stats().lags.prefetch_delay
    assert delay.count == 40 and delay.max == depth
    if depth <= 1:
        assert delay.min == depth


def test_a_learner_that_counts_its_updates_sees_its_queue_as_delay():
    # A learner keeping 3 batches queued ahead of its updates (tensorpack's QueueInput):
    # every batch handed out after the first update waits 3 updates.
    with stream_of(2, exploration=1.0) as stream:
        stream.count_updates(0)         # before the first batch: the learner counts
        batches = iter(stream)
        queue = [next(batches) for _ in range(3)]
        for _ in range(30):
            queue.append(next(batches))
            queue.pop(0)
            stream.count_updates()
        lags = stream.stats().lags
    assert lags.updates == 30
    assert (lags.input_queue_delay.count, lags.input_queue_delay.min,
            lags.input_queue_delay.max) == (29, 3, 3)


def _hog(stop):
    """Load for the other core and the GIL: Python bytecode until ``stop`` is set."""
    x = 0
    while not stop.is_set():
        x += 1


@pytest.mark.parametrize('load', [False, True], ids=['idle', 'loaded'])
@pytest.mark.parametrize('lag', [1, 7])
def test_a_fixed_request_lag_is_exact_whatever_the_load(lag, load):
    stop = threading.Event()
    hogs = [threading.Thread(target=_hog, args=(stop,)) for _ in range(2 if load else 0)]
    for h in hogs:
        h.start()
    try:
        with stream_of(3, exploration=0.5, request_lag=lag, update_frequency=2) as stream:
            for k, _ in enumerate(stream):
                if k == 60:
                    break
            request = stream.stats().lags.request_lag
    finally:
        stop.set()
        for h in hogs:
            h.join()
    assert request.count >= 2 * (60 - lag - 2)
    assert request.min == request.max == lag


def test_without_a_fixed_lag_requests_start_when_a_thread_is_free():
    with stream_of(3, exploration=0.5, update_frequency=2) as stream:
        for k, _ in enumerate(stream):
            if k == 60:
                break
        request = stream.stats().lags.request_lag
    assert request.count > 0 and request.max < 7     # a window of 4 requests: 2 batches


def test_a_fixed_request_lag_is_refused_where_it_can_not_hold():
    with pytest.raises(ValueError, match='request_lag needs num_players >= 2'):
        Population(lambda: ScriptedEnv(0), 1, q_values, request_lag=3)
    with pytest.raises(ValueError, match='maximum_staleness=10 can not hold the requests of '
                                         'request_lag=8: give at least'):
        stream_of(3, request_lag=8, staleness=10)
    population = Population(lambda: ScriptedEnv(0), 2, q_values, request_lag=3)
    with pytest.raises(ValueError, match='request_lag needs Sampling\\(update_frequency'):
        ReplayStream(ReplayMemory(500, (6,), 2), population,
                     Sampling(8, samples_per_insert=4.0), progress=False)
    with pytest.raises(ValueError, match='request_lag must be'):
        Population(lambda: ScriptedEnv(0), 2, q_values, request_lag=0)


def test_a_close_ends_an_update_waiting_for_a_held_request():
    # The clock's update waits for the requests it releases; a close from another thread (the
    # players stopped) must end that wait, not hang the learner.
    with stream_of(2, exploration=1.0, request_lag=2) as stream:
        for k, _ in enumerate(stream):
            if k == 5:
                break
        closer = threading.Thread(target=stream.close)
        closer.start()
        closer.join(30)
        assert not closer.is_alive()
        stream.population.lags.next_asked()      # returns: the window is closed


def test_data_lags_count_nothing_before_the_first_update():
    lags = DataLags()
    lags.requests_started([0])
    lags.handed_over()
    lags.acted(5)
    lags.handed_out(0)
    figures = lags.figures()
    assert figures.updates == 0
    assert [f.count for f in (figures.request_lag, figures.weights_age,
                              figures.prefetch_delay, figures.input_queue_delay)] == [0] * 4


def test_the_lags_are_part_of_the_stream_s_figures_and_of_their_plain_dict():
    import json
    with stream_of(2, exploration=1.0) as stream:
        for k, _ in enumerate(stream):
            if k == 10:
                break
        stats = stream.stats()
    assert stats.lags.updates == 10
    assert json.loads(json.dumps(stats.as_dict()))['lags']['updates'] == 10


def test_waiting_for_the_players_starts_the_requests_a_fixed_lag_holds():
    # No update comes while the learner waits for the window to empty (before a save, at the
    # end of a run): the held requests start then, and their shorter lag is counted as it is.
    with stream_of(3, exploration=1.0, request_lag=50) as stream:
        for k, _ in enumerate(stream):
            if k == 20:
                break
        assert stream.population.progress()[1] > 0       # held: 50 updates not made yet
        stream.population.wait_idle()
        assert stream.population.progress()[1] == 0
        request = stream.stats().lags.request_lag
    assert request.count > 0 and request.max < 50

