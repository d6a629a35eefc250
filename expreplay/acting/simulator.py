"""A manager's simulator thread: its acting groups stepped on the requests of the window.

A :class:`SimulatorThread` steps one or two :class:`~expreplay.acting.group.ActingGroup` s, which
the manager built and hands it (this module knows them by what it calls). With
two (a *pipelined* thread) it begins one group's step and submits its states to the inference
thread, and while that forward pass runs finishes the other group's step. Every request it
takes is booked finished in the window with the steps it stored, also when the step failed.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._threads import DaemonThread
from .faults import Activity, Faults
from ..errors import ManagerClosed
from .window import InsertedSteps, Request, StalenessWindow

__all__ = ['SimulatorThread', 'close_group']

logger = logging.getLogger(__name__)


def close_group(group: Any) -> None:
    """Close an acting group and its runners (a runner that fails to close is logged)."""
    group.close()
    for r in group.runners:
        try:
            r.close()
        except Exception as err:
            logger.warning("closing runner %d raised %r", r.index, err)


class _GroupSlot:
    """An acting group on a thread, and the order its runners take requests in (the runner
    that stepped longest ago first, so every runner steps even with a small window)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.order = collections.deque(range(len(group.runners)))
        self.inserted = InsertedSteps(group)

    @property
    def capacity(self) -> int:
        return len(self.group.runners)

    def pick(self, m: int) -> np.ndarray:
        members = [self.order.popleft() for _ in range(m)]
        self.order.extend(members)
        return np.array(members, np.int64)


# An in-flight step: (slot, its requests, the Prediction of its Q-values or None).
_InFlight = tuple[_GroupSlot, list[Request], Any]


class SimulatorThread:
    """Steps ``groups`` in a daemon thread named ``name``, on the requests of ``window``.

    ``inference`` maps ``id(predictor)`` to the :class:`~expreplay.acting.inference.InferenceThread`
    of the groups with that predictor; faults go to ``faults`` (which may restart a runner);
    ``thread_context()`` is entered first.
    """

    def __init__(self, name: str, groups: Sequence[Any], window: StalenessWindow, faults: Faults,
                 inference: dict[int, Any], thread_context: Callable[[], Any] | None = None) -> None:
        self.groups = list(groups)
        self.activity = Activity(name)
        self._window = window
        self._faults = faults
        self._inference = inference
        self._thread_context = thread_context or contextlib.nullcontext
        self.thread = DaemonThread(self._run, name)

    @property
    def name(self) -> str:
        return self.activity.name

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        """Step the groups of this thread, up to two in flight: while one group's states are
        in the predictor, finish the other's step.

        Invariants: a group is either idle or in flight (begun, its Q-values coming); groups
        finish in the order they began; the idle group that waited longest begins next.
        """
        slots = [_GroupSlot(g) for g in self.groups]
        idle = collections.deque(slots)
        inflight: collections.deque[_InFlight] = collections.deque()   # oldest first
        owner = object()                    # this thread, for the inference thread's batching
        try:
            with self._thread_context():
                while True:
                    if idle and len(inflight) < 2:
                        slot = idle[0]
                        # With a group in flight, wait for a request or that group's Q-values,
                        # whichever comes first: beginning the idle group keeps both busy.
                        reqs = self._window.take(slot.capacity, block=not inflight,
                                                 until=inflight[0][2] if inflight else None)
                        if reqs is None:
                            return
                        if reqs:
                            idle.popleft()
                            entry = self._begin(slot, reqs, owner)
                            if entry is None:
                                idle.append(slot)
                                continue
                            inflight.append(entry)
                            if len(idle) and len(inflight) < 2:
                                continue
                    if inflight:
                        slot, reqs, pred = inflight.popleft()
                        ok = self._finish(slot, reqs, pred)
                        idle.append(slot)
                        if not ok:
                            return
        except BaseException as err:   # thread_context failed (the loop handles the rest)
            self._faults.record(self.name, err)
        finally:
            for slot, reqs, _ in inflight:    # closed or failed: those Q-values will not be used
                slot.group.abort()
                self._window.finish(reqs, slot.inserted.take())
            if self._window.closed:   # close() may have stopped waiting for us: close our own
                for group in self.groups:
                    close_group(group)

    def _begin(self, slot: _GroupSlot, reqs: list[Request], owner: object) -> _InFlight | None:
        """Begin a step of as many of the slot's runners as requests; submit their states.

        Returns the in-flight entry, or None when the step did not begin (a failure, the
        requests booked; a fatal one is recorded and stops the thread at its next take).
        """
        group = slot.group
        members = slot.pick(len(reqs))
        # One probability when the requests agree (the common case: a schedule changes it
        # rarely), which spares the group an array and its checks per step.
        first = reqs[0].exploration
        explorations = first if all(r.exploration == first for r in reqs) \
            else [r.exploration for r in reqs]
        activity = self.activity
        try:
            if self._window.closed:
                raise ManagerClosed("closed")
            activity.enter("a reset or receive", group)
            try:
                states = group.begin(explorations, members)
            finally:
                activity.leave()
            pred = None
            if len(states):
                pred = self._inference[id(group.predictor)].submit(states, owner)
            return slot, reqs, pred
        except BaseException as err:
            group.abort()
            # No step (a receive may have stored some).
            self._window.finish(reqs, slot.inserted.take())
            if not isinstance(err, ManagerClosed):
                self._faults.handle(self.name, err)
            return None

    def _finish(self, slot: _GroupSlot, reqs: list[Request], pred: Any) -> bool:
        """Wait for the group's Q-values and finish its step; False: stop this thread."""
        group = slot.group
        activity = self.activity
        try:
            if self._window.closed:               # close(): no further env step
                group.abort()
                return False
            q_values = None
            if pred is not None:
                try:
                    q_values = pred.wait()
                except BaseException:
                    group.abort()
                    raise
            activity.enter("an env step", group)
            try:
                failures = group.finish(q_values)
            finally:
                activity.leave()
            ok = True
            for _, err in failures:
                ok = self._faults.handle(self.name, err) and ok
            return ok
        except ManagerClosed:
            return False
        except BaseException as err:
            return self._faults.handle(self.name, err)
        finally:
            # At once: with a small maximum_staleness the window waits for it.
            self._window.finish(reqs, slot.inserted.take())
