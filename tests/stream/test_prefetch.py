"""The prefetch thread: the Prefetcher on its own, and a ReplayStream drawing ahead with it.

Shutdown is checked under load and with a consumer blocked in ``next()``; faults in the
prefetch thread and in the simulator threads are checked to reach the consumer, chained; no
sleeps: threads are synchronised with events, conditions and joins.
"""

import threading

import numpy as np
import pytest

from expreplay import ManagerSettings, ReplayMemory
from expreplay.stream.prefetch import Prefetcher
from expreplay.acting import RunnerError
from scripted_env import check_batch
from test_stream import HISTORY, EnvFactory, make_stream, our_threads, prefer

pytestmark = pytest.mark.timeout(120)


def wait_for_waiting_consumer(prefetcher, timeout=30):
    assert prefetcher.wait_for(lambda: prefetcher.consumers_waiting > 0, timeout)


# ---------------------------------------------------------------------- the Prefetcher alone
def counter():
    """A producer of 0, 1, 2, ... (thread-safe), the list of what it made and its lock."""
    made = []
    lock = threading.Lock()

    def produce():
        with lock:
            made.append(len(made))
            return made[-1]
    return produce, made, lock


def test_prefetcher_hands_out_in_order_and_keeps_at_most_depth_ahead():
    produce, made, lock = counter()
    p = Prefetcher(produce, 3, name='test-prefetch')
    try:
        for k in range(200):
            assert p.get() == k
            # Produced but not handed out: at most depth (none is held back waiting for room).
            with lock:
                assert len(made) - (k + 1) <= 3
    finally:
        p.stop()
        assert p.join(10)
    assert p.get() is Prefetcher.END


def test_a_consumer_blocked_in_get_is_released_by_stop():
    gate = threading.Event()
    p = Prefetcher(lambda: gate.wait(30) and 'late', 2, name='test-prefetch')
    out = {}
    consumer = threading.Thread(target=lambda: out.setdefault('got', p.get()))
    consumer.start()
    wait_for_waiting_consumer(p)
    p.stop()
    consumer.join(10)
    assert not consumer.is_alive() and out['got'] is Prefetcher.END
    gate.set()                      # the producer returns: its result is dropped
    assert p.join(10)
    assert p.get() is Prefetcher.END


def test_an_error_in_produce_reaches_the_consumer_chained_and_named():
    calls = []

    def produce():
        calls.append(1)
        if len(calls) == 5:
            try:
                raise KeyError('deep')
            except KeyError as err:
                raise ValueError('sampling failed') from err
        return len(calls)

    p = Prefetcher(produce, 2, name='test-prefetch')
    got = []
    with pytest.raises(ValueError, match='sampling failed') as info:
        while True:
            got.append(p.get())
    assert isinstance(info.value.__cause__, KeyError)
    assert any('test-prefetch' in note for note in info.value.__notes__)
    assert got == list(range(1, len(got) + 1)) and len(got) <= 4
    assert p.unraised_error() is None          # it was raised
    p.stop()
    assert p.join(10)


def test_an_error_no_get_raised_is_kept_for_the_owner():
    p = Prefetcher(lambda: 1 / 0, 1, name='test-prefetch')
    assert p.wait_for(lambda: p.error is not None, 30)
    p.stop()
    assert p.join(10)
    assert isinstance(p.unraised_error(), ZeroDivisionError)


def test_bad_depth():
    with pytest.raises(ValueError, match='depth'):
        Prefetcher(lambda: 1, 0, name='test-prefetch')
    with pytest.raises(TypeError, match='produce'):
        Prefetcher(3, 1, name='test-prefetch')


# ---------------------------------------------------------------------- in a ReplayStream
@pytest.mark.parametrize('players', [1, 3])
def test_close_releases_a_consumer_blocked_in_next(players):
    """The envs stop stepping (a gate), so the prefetch thread can not draw: the consumer
    blocks in next(); a close() from another thread ends its loop before any env step
    returns, and once they return no thread is left."""
    gate = threading.Event()
    stepping = {'after_fill': False}

    def hook(env, action):
        if stepping['after_fill']:
            assert gate.wait(60)

    factory = EnvFactory(step_hook=hook)
    stream = make_stream(factory, prefer(1), num_parallel_players=players, exploration=0.5,
                         init_memory_size=60, prefetch=2,
                         manager=None if players == 1 else ManagerSettings(close_timeout=60))
    stream.start()
    stepping['after_fill'] = True
    batches = stream.batches()     # starts the prefetch thread
    prefetcher = stream.prefetcher
    outcome = {}

    def consume():
        try:
            outcome['batches'] = sum(1 for _ in batches)
        except BaseException as err:   # reported to the test thread
            outcome['error'] = err

    consumer = threading.Thread(target=consume)
    consumer.start()
    wait_for_waiting_consumer(prefetcher)   # no batch can come: the envs are held
    closer = threading.Thread(target=stream.close)
    closer.start()
    consumer.join(30)              # released by close(), the envs still held
    assert not consumer.is_alive()
    assert 'error' not in outcome and outcome['batches'] <= 2
    gate.set()                     # the env steps return; close() joins their threads
    closer.join(60)
    assert not closer.is_alive()
    assert stream.closed and our_threads() == []


@pytest.mark.parametrize('round_', range(5))
def test_shutdown_under_load_leaves_no_thread_and_every_batch_right(round_):
    factory = EnvFactory(episode_lengths=(5, 11), ends=('terminated', 'truncated'))
    stream = make_stream(factory, prefer(2), num_parallel_players=4, exploration=0.4,
                         init_memory_size=80, maximum_staleness=3, prefetch=3, seed=round_)
    got_some = threading.Event()
    batches, outcome = [], {}

    def consume():
        try:
            for batch in stream:
                batches.append(batch)
                if len(batches) == 10 + 7 * round_:
                    got_some.set()
            outcome['ended'] = True
        except BaseException as err:
            outcome['error'] = err

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert got_some.wait(60)
    stream.close()                 # the consumer is consuming, the players are stepping
    consumer.join(30)
    assert not consumer.is_alive() and outcome == {'ended': True}
    assert our_threads() == []
    for batch in batches:
        assert check_batch(batch, factory.envs, HISTORY) == 16


def test_close_during_the_initial_fill_ends_the_iteration():
    """A close() from another thread while the fill runs: iter(stream) ends, nothing raised."""
    filling, closed = threading.Event(), threading.Event()

    class Progress:
        def __init__(self, total, desc):
            self.shown = 0

        def update(self, n):
            self.shown += n
            if self.shown >= 40 and not filling.is_set():
                filling.set()          # the fill thread waits here until the stream is closed
                assert closed.wait(30)

        def close(self):
            pass

    stream = make_stream(EnvFactory(), prefer(0), num_parallel_players=3, init_memory_size=400,
                         progress=Progress)
    outcome = {}

    def consume():
        try:
            outcome['batches'] = sum(1 for _ in stream)
        except BaseException as err:
            outcome['error'] = err

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert filling.wait(30)
    stream.close()
    closed.set()
    consumer.join(30)
    assert not consumer.is_alive()
    assert outcome == {'batches': 0}
    assert our_threads() == []


class FailingMemory(ReplayMemory):
    """Sampling raises at its ``fail_at``-th batch (a bug deep in sampling, say)."""

    fail_at = 7

    def draw(self, *args, **kwargs):     # what a stream's batches come from
        self.calls = getattr(self, 'calls', 0) + 1
        if self.calls == self.fail_at:
            try:
                raise IndexError('slot -10')
            except IndexError as err:
                raise RuntimeError('gather failed') from err
        return super().draw(*args, **kwargs)


@pytest.mark.parametrize('prefetch', [0, 3])
def test_a_sampling_error_reaches_the_consumer_chained(prefetch):
    memory = FailingMemory(600, (6,), HISTORY)
    stream = make_stream(EnvFactory(), memory=memory, prefetch=prefetch)
    got = 0
    with pytest.raises(RuntimeError, match='gather failed') as info:
        with stream:
            for _ in stream:
                got += 1
    assert isinstance(info.value.__cause__, IndexError)
    assert got <= FailingMemory.fail_at - 1
    if prefetch:
        assert any('ReplayStream-prefetch' in note for note in info.value.__notes__)
    assert our_threads() == []


def test_a_prefetch_error_no_next_raised_is_raised_by_close():
    memory = FailingMemory(600, (6,), HISTORY)
    memory.fail_at = 2
    stream = make_stream(EnvFactory(), memory=memory, prefetch=3)
    stream.start()
    stream.batches()               # starts the prefetch thread, which fails at its 2nd draw
    prefetcher = stream.prefetcher
    assert prefetcher.wait_for(lambda: prefetcher.error is not None, 30)
    with pytest.raises(RuntimeError, match='gather failed'):
        stream.close()
    assert our_threads() == []


@pytest.mark.parametrize('players', [1, 2])
def test_a_simulator_fault_reaches_the_consumer_through_the_prefetcher(players):
    factory = EnvFactory(fail_at_step=90)
    stream = make_stream(factory, num_parallel_players=players, init_memory_size=50, prefetch=4)
    with pytest.raises(RunnerError) as info:
        with stream:
            for batch in stream:
                check_batch(batch, factory.envs, HISTORY)
    assert 'scripted failure' in str(info.value.__cause__)
    assert our_threads() == []


def test_stats_show_the_prefetcher():
    with make_stream(EnvFactory(), prefer(1), exploration=0.5, prefetch=2) as stream:
        batches = iter(stream)
        for _ in range(30):
            next(batches)
        stats = stream.stats()
    assert 30 <= stats.batches_drawn <= 32
    assert 0 <= stats.prefetch_ready <= 2
    assert stats.prefetch_waits >= 0 and stats.prefetch_wait_time >= 0.0
    assert np.isfinite(stats.samples_per_insert)


def test_one_player_steps_in_the_prefetch_thread_inside_the_thread_context():
    """With one player the env and the predictor run where the batches are drawn: the
    prefetch thread, which enters the manager's thread_context first."""
    entered, predicted_in = [], set()

    class Context:
        def __enter__(self):
            entered.append(threading.current_thread().name)

        def __exit__(self, *exc):
            return False

    def q_values(states):
        predicted_in.add(threading.current_thread().name)
        return np.zeros((len(states), 3), np.float32)

    stream = make_stream(EnvFactory(), q_values, num_parallel_players=1, exploration=0.0,
                         prefetch=2, manager=ManagerSettings(thread_context=Context))
    with stream:
        stream.start()                    # the fill runs here, in this thread
        predicted_in.clear()
        batches = iter(stream)
        for _ in range(10):
            next(batches)
    assert entered == ['ReplayStream-prefetch']
    assert predicted_in == {'ReplayStream-prefetch'}
    assert our_threads() == []
