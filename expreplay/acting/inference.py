"""Inference batching: the predictor runs in a thread of its own, on merged submissions.

Simulator threads submit the states of one acting group and go on with other work (the env
steps of their other group) while the forward pass runs; the forward pass releases the GIL
(TensorFlow, PyTorch, JAX all do), so env stepping and inference overlap on two cores. One
call merges the submissions of different submitters that are queued when it starts (one batch
of 8 costs about twice a batch of 1 on a CPU, not 8 times), but never two of one submitter,
which would make it wait for both. The predictor is called from this thread only, never
concurrently: it need not be thread-safe.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._checks import check_int
from .._threads import DaemonThread
from .policy import as_q_values
from ..errors import ManagerClosed, PredictorError

__all__ = ['InferenceThread', 'Prediction']


class Prediction:
    """A submission's states and, once computed, its Q-values or the error (``done``)."""
    __slots__ = ('states', 'owner', 'result', 'error', '_done', '_ready')

    @property
    def done(self) -> bool:
        return self._done

    def __init__(self, states: np.ndarray, owner: object) -> None:
        self.states = states
        self.owner = owner
        self.result: Any = None
        self.error: BaseException | None = None
        self._done = False
        # A held lock as a one-shot wake-up signal: cheaper than an Event on the hot path.
        self._ready = threading.Lock()
        self._ready.acquire()

    def wait(self) -> Any:
        """The Q-values; raises the predictor's error (:class:`PredictorError`, chained) or
        :class:`ManagerClosed`."""
        self._ready.acquire()
        self._ready.release()
        if self.error is not None:
            if isinstance(self.error, (ManagerClosed, PredictorError)):
                raise self.error
            raise PredictorError(f"predictor raised: {self.error!r}") from self.error
        return self.result

    def _complete(self, result: Any, error: BaseException | None) -> None:
        """Deliver the outcome once (the thread's lock is held)."""
        if not self._done:
            self._done = True
            self.result, self.error = result, error
            self._ready.release()


class InferenceThread:
    """Runs ``predictor`` in a thread named ``name`` on the states submitted to it.

    Args:
        predictor: ``predictor(states)`` -> Q-values ``(n, A)`` or ``[Q-values, ...]``; None for
            groups that always explore (they submit no states).
        max_batch (int): at most this many states per call; a larger submission is run in
            calls of ``max_batch`` states.
        name (str): the thread's name.
        thread_context (callable, optional): a context manager the thread enters first (e.g.
            a TF1 session's ``as_default``).

        on_done (callable, optional): called (from this thread, no lock held) after each call's
            predictions are delivered: lets a simulator thread wait for "a prediction is done
            or a request came", whichever is first.
        inline_below (float): seconds. While the predictor's calls take less than this (a
            running average), :meth:`submit` runs it in the submitting thread instead: a
            hand-over to this thread and back costs more than such a call (tens of
            microseconds). Calls are serialized either way. 0: always in this thread.

    Attributes ``calls``, ``rows``, ``max_rows_seen`` count the predictor calls; ``busy_since``
    is the monotonic time the running call started (None when idle), for a watchdog.
    """

    def __init__(self, predictor: Callable[[np.ndarray], Any] | None, max_batch: int, *,
                 name: str, thread_context: Callable[[], Any] | None = None,
                 on_done: Callable[[], None] | None = None, inline_below: float = 2e-4) -> None:
        self.predictor = predictor
        self._on_done = on_done
        self.inline_below = float(inline_below)
        self._call_time = 1.0          # running average of a call's seconds: start threaded
        self._call_lock = threading.Lock()   # the predictor runs under it, wherever it runs
        self.max_batch = check_int(max_batch, 'max_inference_batch', 1)
        self._thread_context = thread_context or contextlib.nullcontext
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[Prediction] = collections.deque()
        self._running: list[Prediction] = []
        self._closed = False
        self._failure: BaseException | None = None
        self.calls = 0
        self.rows = 0
        self.max_rows_seen = 0
        self.busy_since: float | None = None
        self.thread = DaemonThread(self._serve, name)
        self.thread.start()

    def submit(self, states: np.ndarray, owner: object = None) -> Prediction:
        """Queue ``states`` for prediction; returns its :class:`Prediction` at once.

        Raises :class:`ManagerClosed` after :meth:`close`, :class:`PredictorError` if the
        thread itself failed.
        """
        pred = Prediction(states, owner)
        with self._cond:
            if self._closed:
                raise ManagerClosed("the inference thread is closed")
            if self._failure is not None:
                raise PredictorError(f"{self.thread.name} failed: {self._failure!r}") from self._failure
            inline = self._call_time < self.inline_below and not self._queue
            if not inline:
                self._queue.append(pred)
                self._cond.notify_all()   # the thread, and any wait_queued() caller
        if inline:
            try:
                result, error = self._run([pred])[0], None
            except BaseException as err:
                result, error = None, err
            with self._cond:
                pred._complete(result, error)
        return pred

    def wait_queued(self, rows: int, timeout: float | None = None) -> bool:
        """Block until at least ``rows`` submitted states wait for the next call (a running
        call's are not counted); False after ``timeout`` seconds. Callable from the predictor,
        e.g. to see which submissions a call running now leaves for the next one."""
        with self._cond:
            return self._cond.wait_for(
                lambda: sum(len(p.states) for p in self._queue) >= rows, timeout)

    def _serve(self):
        try:
            with self._thread_context():
                self._serve_requests()
        except BaseException as err:   # e.g. thread_context raised: no request may wait forever
            with self._cond:
                self._failure = err
                for pred in list(self._queue) + self._running:
                    pred._complete(None, err)
                self._queue.clear()
                self._cond.notify_all()

    def _serve_requests(self):
        cond = self._cond
        with cond:
            while True:
                while not self._queue and not self._closed:
                    cond.wait()
                if self._closed:
                    return
                batch = self._take_batch()
                self._running = batch
                cond.release()
                try:
                    results, error = self._run(batch), None
                except BaseException as err:
                    results, error = None, err
                finally:
                    cond.acquire()
                for k, pred in enumerate(batch):   # close() may have failed some already
                    pred._complete(None if results is None else results[k], error)
                self._running = []
                if self._on_done is not None:
                    cond.release()
                    try:
                        self._on_done()
                    finally:
                        cond.acquire()

    def _take_batch(self):
        """The oldest submission, and queued ones of other submitters while they fit."""
        first = self._queue.popleft()
        batch, rows, owners = [first], len(first.states), {first.owner}
        for pred in list(self._queue):
            if rows + len(pred.states) > self.max_batch:
                break
            if pred.owner in owners:
                continue
            self._queue.remove(pred)
            batch.append(pred)
            rows += len(pred.states)
            owners.add(pred.owner)
        return batch

    def _run(self, batch):
        """Predict every submission of ``batch`` (calls of at most ``max_batch`` rows)."""
        states = batch[0].states if len(batch) == 1 else np.concatenate([p.states for p in batch])
        n = len(states)
        chunks = []
        for lo in range(0, n, self.max_batch):
            part = states[lo:lo + self.max_batch]
            with self._call_lock:
                self.busy_since = t0 = time.monotonic()
                try:
                    assert self.predictor is not None   # groups without one submit nothing
                    q = np.asarray(as_q_values(self.predictor(part)))
                finally:
                    self.busy_since = None
                self._call_time += 0.2 * (time.monotonic() - t0 - self._call_time)
            if q.ndim != 2 or q.shape[0] != len(part):
                raise PredictorError(f"predictor returned Q-values of shape {q.shape} for "
                                     f"{len(part)} states; expected ({len(part)}, num_actions)")
            chunks.append(q)
            self.calls += 1
            self.rows += len(part)
            self.max_rows_seen = max(self.max_rows_seen, len(part))
        q = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
        if len(batch) == 1:
            return [q]
        return np.split(q, np.cumsum([len(p.states) for p in batch])[:-1])

    def close(self) -> None:
        """Fail every waiting submission with :class:`ManagerClosed`, tell the thread to stop.

        Idempotent, does not block: join :attr:`thread` to wait. A predictor call in progress
        can not be interrupted: its submissions are failed now, and the thread stops when the
        call returns.
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            for pred in list(self._queue) + self._running:
                pred._complete(None, ManagerClosed("the inference thread is closed"))
            self._queue.clear()
            self._cond.notify_all()
