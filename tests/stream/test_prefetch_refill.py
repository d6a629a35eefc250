"""The prefetch thread's hand-over: a full buffer is refilled from half, and no wake-up is lost.

The thread is woken once per ``depth - depth // 2`` results (not once per result) and a consumer
only when it waits; these tests check the levels at which it works and, over many hand-overs
with both sides changing speed, that neither side is ever left waiting (every wait here ends
within a timeout, or the test fails).
"""

import random
import threading

import pytest

from expreplay.stream.prefetch import Prefetcher
from test_prefetch import counter

pytestmark = pytest.mark.timeout(120)
GUARD = 30


def test_a_full_buffer_is_refilled_only_once_drained_to_half():
    produce, made, _ = counter()
    p = Prefetcher(produce, 4, name='test-prefetch')
    try:
        assert p.wait_full(GUARD) and p.ready() == 4
        assert p.get() == 0
        # Above half: the thread was not woken, it still waits, nothing more was made.
        assert p.wait_full(GUARD) and p.ready() == 3 and p.produced == 4
        assert p.get() == 1
        # At half: it fills the buffer again.
        assert p.wait_for(lambda: p.ready() == 4, GUARD)
        assert p.produced == 6
        assert [p.get() for _ in range(6)] == list(range(2, 8))
    finally:
        p.stop()
        assert p.join(10)


def test_the_thread_released_to_refill_is_not_seen_idle_before_it_wakes():
    """The get() that releases the thread also marks it busy: a wait_full() that takes the lock
    before the woken thread does must wait for the refill, not read counts the thread is about
    to change (its next result here is held until the test lets it go)."""
    produce, made, _ = counter()
    hold = threading.Event()

    def held():
        if len(made) >= 2:         # the refill's result waits for the test
            hold.wait(GUARD)
        return produce()

    p = Prefetcher(held, 2, name='test-prefetch')
    try:
        assert p.wait_full(GUARD) and p.ready() == 2
        assert p.get() == 0        # down to half: releases the thread
        # The refill can not end while `hold` is clear: the thread is not idle.
        assert not p.wait_full(timeout=0.2)
        hold.set()
        assert p.wait_full(GUARD) and p.produced == 3
    finally:
        hold.set()
        p.stop()
        assert p.join(10)


@pytest.mark.parametrize('depth', [1, 2, 3, 4, 5])
def test_no_hand_over_is_lost_whatever_the_speeds(depth):
    """A producer and a consumer that each pause at random moments (a switch of threads):
    every result arrives in order, the buffer never holds more than depth."""
    produce, made, _ = counter()
    rng = random.Random(depth)
    pauses = [rng.random() < 0.3 for _ in range(4000)]

    def jittery():
        item = produce()
        if pauses[item % len(pauses)]:
            threading.Event().wait(0)      # gives the GIL away, as a real draw does
        return item

    p = Prefetcher(jittery, depth, name='test-prefetch')
    got, over = [], []

    def consume():
        for _ in range(3000):
            got.append(p.get())
            if p.ready() > depth:
                over.append(p.ready())
            if rng.random() < 0.3:
                threading.Event().wait(0)

    consumer = threading.Thread(target=consume)
    consumer.start()
    consumer.join(GUARD * 2)
    try:
        assert not consumer.is_alive(), "a hand-over was lost: the consumer waits forever"
        assert got == list(range(3000)) and not over
        assert len(made) - len(got) <= depth
    finally:
        p.stop()
        assert p.join(10)


def test_wait_full_sees_the_thread_idle_after_a_get_above_half():
    """wait_full() is for reading counts while the thread makes nothing: after a get that
    leaves the buffer above half it is already idle, and wait_full says so at once."""
    produce, made, _ = counter()
    p = Prefetcher(produce, 6, name='test-prefetch')
    try:
        for k in range(20):
            assert p.wait_full(GUARD)
            produced = p.produced
            assert p.produced == produced == len(made)      # idle: the counts hold still
            assert p.get() == k
    finally:
        p.stop()
        assert p.join(10)
