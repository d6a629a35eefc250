"""The staleness window's wake-ups: each waiter is woken when what it waits for happens.

The window wakes a waiter only when its condition may have changed (a prediction delivered
wakes only the takers waiting for one; a finish wakes step() only when the window moved). A
lost wake-up leaves a thread blocked: every wait here is bounded by a join with a timeout,
and the races are run many times with the threads started at varying moments.
"""

import threading

import pytest

from expreplay.acting.window import StalenessWindow

pytestmark = pytest.mark.timeout(120)
GUARD = 30


def window(size):
    return StalenessWindow(size, check=lambda: None, watch=lambda now: None)


def run(target):
    """``target`` in a thread; returns a join that says whether it ended within GUARD s."""
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault('result', target()))
    thread.start()

    def join():
        thread.join(GUARD)
        assert not thread.is_alive(), "a waiter was never woken"
        return out.get('result')
    return join


class Pending:
    """A prediction not delivered yet, as a pipelined simulator thread waits for one."""
    done = False


def test_a_taker_waiting_for_its_prediction_is_woken_when_it_is_delivered():
    w = window(4)
    for _ in range(300):
        pred = Pending()
        join = run(lambda: w.take(1, block=False, until=pred))
        pred.done = True             # as the inference thread delivers, then calls on_done
        w.wake_workers()
        assert join() == []          # no request came: it returns to finish its group


def test_a_taker_waiting_for_requests_only_is_woken_by_a_request_not_a_prediction():
    w = window(4)
    for _ in range(100):
        join = run(lambda: w.take(2, block=True))
        w.wake_workers()             # another thread's prediction: nothing for this one
        w.accept(0.5, GUARD)
        reqs = join()
        assert len(reqs) == 1
        w.finish(reqs, 1)


def test_step_blocked_on_a_full_window_is_woken_when_the_oldest_finishes_last():
    """Requests finished out of order move nothing until the oldest finishes; that finish
    must wake step() (with a request still pending: not as an idle window)."""
    w = window(3)
    for _ in range(200):
        for _ in range(3):
            w.accept(0.1, GUARD)
        oldest, second, third = w.take(3, block=True)
        join = run(lambda: w.accept(0.1, GUARD))
        w.finish([second], 2)        # out of order: still full
        w.finish([oldest], 1)        # moves the window by two; `third` still pending
        join()
        w.finish([third], 1)
        w.finish(w.take(1, block=True), 1)
        assert w.counts() == (0, 0)


def test_wait_idle_and_wait_for_are_woken_by_finishes_that_do_not_move_the_window():
    w = window(3)
    for k in range(100):
        for _ in range(3):
            w.accept(0.1, GUARD)
        oldest, *newer = w.take(3, block=True)
        target = w.progress()[0] + 2
        seen = run(lambda: w.wait_for(lambda: w.progress()[0] >= target, GUARD))
        idle = run(lambda: w.wait_idle(GUARD))
        w.finish(newer[:1], 2)       # the window does not move; the count the watcher wants is there
        assert seen() is True
        w.finish(newer[1:], 0)
        w.finish([oldest], 0)        # now idle
        idle()


def test_close_releases_every_waiter():
    """A taker waiting for its prediction, step() on a full window, a wait_for: close()
    releases all three (the window's check raises once closed, as the manager's does)."""
    holder = {}

    def check():
        if holder['w'].closed:
            raise RuntimeError('closed')

    w = holder['w'] = StalenessWindow(1, check=check, watch=lambda now: None)
    w.accept(0.1, GUARD)
    assert len(w.take(1, block=True)) == 1
    taker = run(lambda: w.take(1, block=False, until=Pending()))
    errors = []

    def step():
        try:
            w.accept(0.1, GUARD)
        except RuntimeError as err:
            errors.append(err)

    stepper = run(step)
    watcher = run(lambda: w.wait_for(lambda: w.closed, GUARD))
    w.close()
    assert taker() is None
    stepper()
    assert watcher() is True
    assert [str(e) for e in errors] == ['closed']
