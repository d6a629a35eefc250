"""InferenceThread: the predictor in a thread of its own, merging the submissions of several
simulator threads, delivering its errors, released by close()."""

import threading

import numpy as np
import pytest

from expreplay.acting import InferenceThread, ManagerClosed, PredictorError
from acting_helpers import GUARD
from acting_helpers import no_thread_left_behind  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(60)


def _blocking_predictor(calls, release, entered):
    """Records each call's row values; the first call waits for ``release``."""
    def predictor(states):
        calls.append(states[:, 0].tolist())
        if len(calls) == 1:
            entered.set()
            assert release.wait(GUARD)
        return np.repeat(states[:, :1], 2, axis=1).astype(np.float32)
    return predictor


def test_inference_thread_merges_other_submitters_never_one_submitter_twice():
    calls, release, entered = [], threading.Event(), threading.Event()
    it = InferenceThread(_blocking_predictor(calls, release, entered), max_batch=3, name='InferenceThread')
    first = it.submit(np.array([[0.0]]), owner='a')
    assert entered.wait(GUARD)                    # the thread is inside the first call
    queued = [it.submit(np.array([[1.0], [2.0]]), 'a'), it.submit(np.array([[3.0]]), 'a'),
              it.submit(np.array([[4.0]]), 'b'), it.submit(np.array([[5.0], [6.0]]), 'c')]
    release.set()
    results = [p.wait() for p in [first] + queued]
    # Queued during the first call: a's first with b's (c's would pass max_batch), then a's
    # second with c's; a submission is never split unless it alone passes max_batch.
    assert calls == [[0.0], [1.0, 2.0, 4.0], [3.0, 5.0, 6.0]]
    assert [r[:, 0].tolist() for r in results] == [[0.0], [1.0, 2.0], [3.0], [4.0], [5.0, 6.0]]
    assert (it.calls, it.rows, it.max_rows_seen) == (3, 7, 3)
    big = it.submit(np.arange(7.0, 12.0)[:, None], 'a')
    assert big.wait()[:, 0].tolist() == [7.0, 8.0, 9.0, 10.0, 11.0]
    assert calls[-2:] == [[7.0, 8.0, 9.0], [10.0, 11.0]]   # 5 rows > max_batch: two calls
    it.close()
    it.thread.join(GUARD)
    assert not it.thread.is_alive()
    with pytest.raises(ManagerClosed):
        it.submit(np.zeros((1, 1)))


def test_inference_thread_delivers_errors_and_close_releases_waiters():
    def bad(states):
        raise ValueError('bad weights')

    it = InferenceThread(bad, 32, name='InferenceThread')
    preds = [it.submit(np.zeros((1, 1)), 'a'), it.submit(np.zeros((2, 1)), 'b')]
    for p in preds:
        with pytest.raises(PredictorError, match='bad weights') as info:
            p.wait()
        assert isinstance(info.value.__cause__, ValueError)
    it.close()
    it.thread.join(GUARD)

    calls, release, entered = [], threading.Event(), threading.Event()
    it = InferenceThread(_blocking_predictor(calls, release, entered), 32, name='InferenceThread')
    running = it.submit(np.zeros((1, 1)))
    assert entered.wait(GUARD)
    waiting = it.submit(np.ones((1, 1)))
    it.close()                                    # does not wait for the predictor
    for p in (running, waiting):
        with pytest.raises(ManagerClosed):
            p.wait()
    release.set()                                 # the call returns: the thread stops
    it.thread.join(GUARD)
    assert not it.thread.is_alive() and calls == [[0.0]]
