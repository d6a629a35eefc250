"""SampleToInsertRatio: admission rules, the deadlock check, waits, timeouts, close."""

import threading
import time

import numpy as np
import pytest

from expreplay.stream.ratelimit import RateLimiterClosed, RateLimiterTimeout, SampleToInsertRatio


def test_rules_follow_the_diff_band():
    lim = SampleToInsertRatio(2.0, 3, 4.0)     # target 6, diff allowed in [2, 10]
    assert not lim.can_sample(1)
    for _ in range(3):
        assert lim.try_insert(1)               # the fill is always admitted
    assert lim.stats().diff == 6
    assert lim.try_insert(1) and lim.try_insert(1)   # diff 10 = max_diff
    assert not lim.can_insert(1)                      # 12 > 10: the actor waits
    for _ in range(8):
        assert lim.try_sample(1)                      # diff 10 -> 2 = min_diff
    assert not lim.try_sample(1)                      # the learner waits
    assert lim.stats().samples == 8 and lim.stats().inserts == 5


@pytest.mark.parametrize('spi,insert_size,sample_size', [
    (1.0, 1, 1), (16.0, 1, 64), (0.25, 8, 1), (8.0, 4, 32), (2.5, 3, 7)])
def test_smallest_allowed_buffer_never_deadlocks_and_a_smaller_one_is_refused(
        spi, insert_size, sample_size):
    needed = (insert_size * spi + sample_size) / 2
    with pytest.raises(ValueError, match='error_buffer'):
        SampleToInsertRatio(spi, 5, needed * 0.999, insert_size=insert_size,
                            sample_size=sample_size)
    rng = np.random.default_rng(int(spi * 100) + insert_size)
    for _ in range(20):
        lim = SampleToInsertRatio(spi, 5, needed, insert_size=insert_size,
                                  sample_size=sample_size)
        for _ in range(300):
            # Whatever the chunk sizes chosen, someone can always go ahead.
            can_i, can_s = lim.can_insert(insert_size), lim.can_sample(sample_size)
            assert can_i or can_s, lim.stats()
            # A smaller chunk than the largest is admitted whenever the largest is.
            if can_s and (not can_i or rng.random() < 0.5):
                assert lim.try_sample(int(rng.integers(1, sample_size + 1)))
            else:
                assert lim.try_insert(int(rng.integers(1, insert_size + 1)))
            if lim.inserts >= lim.min_size_to_sample and lim.samples:
                assert lim.stats().diff >= lim.min_diff


def test_below_the_bound_a_deadlock_is_reachable():
    """The constructor's rule is not stricter than needed: with a buffer just under it, the
    state where neither side may proceed exists (checked on the rules directly)."""
    spi, a, b = 4.0, 2, 6
    eb = (a * spi + b) / 2 - 1        # 6: the rule asks for 7
    lim = SampleToInsertRatio.__new__(SampleToInsertRatio)
    lim.samples_per_insert, lim.min_size_to_sample = spi, 1
    lim.min_diff, lim.max_diff = spi - eb, spi + eb
    found = False
    for inserts in range(1, 10):
        for samples in range(0, 40):
            lim.inserts, lim.samples = inserts, samples
            if not lim._can_insert(a) and not lim._can_sample(b):
                found = True
    assert found


def test_bad_arguments_are_named():
    for args, kwargs, name in [((0, 1, 1), {}, 'samples_per_insert'),
                               ((-1, 1, 1), {}, 'samples_per_insert'),
                               ((1, 0, 1), {}, 'min_size_to_sample'),
                               ((1, 1, -1), {}, 'error_buffer'),
                               ((1, 1, 10), dict(insert_size=0), 'insert_size'),
                               ((1, 1, 10), dict(sample_size=0), 'sample_size')]:
        with pytest.raises(ValueError, match=name):
            SampleToInsertRatio(*args, **kwargs)
    lim = SampleToInsertRatio(1, 1, 5, insert_size=2, sample_size=3)
    with pytest.raises(ValueError, match='n=3'):
        lim.try_insert(3)
    with pytest.raises(ValueError, match='n=4'):
        lim.await_sample(4)
    with pytest.raises(ValueError, match='timeout'):
        lim.await_insert(1, timeout=-1)


def test_a_waiting_sampler_goes_ahead_when_an_insert_lets_it():
    lim = SampleToInsertRatio(1.0, 2, 1.0)
    done = threading.Event()
    errors = []

    def learner():
        try:
            lim.await_sample(1, timeout=30)
            done.set()
        except BaseException as err:
            errors.append(err)

    th = threading.Thread(target=learner)
    th.start()
    lim.await_insert(1)
    assert not done.wait(0.2), "sampled before min_size_to_sample items were inserted"
    lim.await_insert(1)
    assert done.wait(10)
    th.join(10)
    assert not errors and not th.is_alive()
    assert lim.samples == 1


def test_a_waiting_actor_goes_ahead_when_a_sample_lets_it():
    lim = SampleToInsertRatio(1.0, 1, 1.0)
    lim.await_insert(1)
    lim.await_insert(1)          # diff 2 = max_diff
    done = threading.Event()
    th = threading.Thread(target=lambda: (lim.await_insert(1, timeout=30), done.set()))
    th.start()
    assert not done.wait(0.2), "the actor ran ahead of the learner"
    lim.await_sample(1)
    assert done.wait(10)
    th.join(10)
    assert lim.inserts == 3


def test_timeouts_raise():
    lim = SampleToInsertRatio(1.0, 5, 1.0)
    start = time.monotonic()
    with pytest.raises(RateLimiterTimeout, match='sample'):
        lim.await_sample(1, timeout=0.1)
    assert 0.1 <= time.monotonic() - start < 5
    for _ in range(6):
        lim.await_insert(1)
    with pytest.raises(RateLimiterTimeout, match='insert'):
        lim.await_insert(1, timeout=0.05)
    assert lim.inserts == 6 and lim.samples == 0      # a timed-out call counts nothing


def test_close_releases_every_waiter():
    actors_side = SampleToInsertRatio(1.0, 3, 1.0)
    for _ in range(4):
        actors_side.await_insert(1)       # the diff is at max_diff: inserts wait
    learners_side = SampleToInsertRatio(1.0, 3, 1.0)   # nothing inserted: samples wait
    closed = []
    lock = threading.Lock()

    def run(fn):
        try:
            fn()
        except RateLimiterClosed:
            with lock:
                closed.append(fn)

    threads = [threading.Thread(target=run, args=(lambda: actors_side.await_insert(1),))
               for _ in range(4)]
    threads += [threading.Thread(target=run, args=(lambda: learners_side.await_sample(1),))
                for _ in range(4)]
    for th in threads:
        th.start()
    # Poll (bounded) until all eight are blocked inside the limiters.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and \
            actors_side.waiting + learners_side.waiting < 8:
        time.sleep(0.005)
    assert actors_side.waiting + learners_side.waiting == 8
    actors_side.close()
    learners_side.close()
    for th in threads:
        th.join(10)
    assert not any(th.is_alive() for th in threads)
    assert len(closed) == 8
    assert actors_side.inserts == 4 and learners_side.samples == 0
    with pytest.raises(RateLimiterClosed):
        actors_side.try_insert(1)


def test_concurrent_actors_and_learners_keep_the_ratio():
    spi, min_size, eb = 4.0, 50, 40.0
    lim = SampleToInsertRatio(spi, min_size, eb, insert_size=2, sample_size=8)
    stop = threading.Event()
    errors, violations = [], []

    def actor():
        try:
            for _ in range(500):
                lim.await_insert(2, timeout=30)
        except RateLimiterClosed:
            pass
        except BaseException as err:
            errors.append(err)

    def learner():
        try:
            while True:
                lim.await_sample(8, timeout=30)
        except RateLimiterClosed:
            pass
        except BaseException as err:
            errors.append(err)

    def monitor():
        while not stop.is_set():
            s = lim.stats()
            if s.inserts >= min_size and not (lim.min_diff <= s.diff <= lim.max_diff):
                violations.append(s)

    actors = [threading.Thread(target=actor) for _ in range(3)]
    learners = [threading.Thread(target=learner) for _ in range(2)]
    mon = threading.Thread(target=monitor)
    for th in actors + learners + [mon]:
        th.start()
    for th in actors:
        th.join(60)
    # Once the actors are done the learners drain down to min_diff and wait; close frees them.
    deadline = time.monotonic() + 30
    while lim.can_sample(8) and time.monotonic() < deadline:
        time.sleep(0.01)
    lim.close()
    stop.set()
    for th in learners + [mon]:
        th.join(30)
    assert not errors, errors
    assert not any(th.is_alive() for th in actors + learners + [mon])
    assert not violations, violations[:3]
    assert lim.inserts == 3000
    # The learners sampled all the ratio allowed: within one batch of the band's low end.
    assert lim.min_diff <= lim.stats().diff < lim.min_diff + 8


@pytest.mark.parametrize('spi,min_size,buffer,n', [
    (2.0, 3, 4.0, 1), (16.0, 1, 40.0, 64), (0.5, 10, 20.0, 16), (2.5, 2, 9.0, 7)])
def test_inserts_to_sample_is_exactly_what_admits_the_sample(spi, min_size, buffer, n):
    lim = SampleToInsertRatio(spi, min_size, buffer, sample_size=n)
    for _ in range(40):
        need = lim.inserts_to_sample(n)
        for _ in range(max(0, need - 1)):
            assert lim.try_insert(1)
            assert not lim.can_sample(n)           # one insert short: still refused
        if need:
            assert lim.try_insert(1)
        assert lim.inserts_to_sample(n) == 0
        assert lim.try_sample(n)                   # exactly enough
