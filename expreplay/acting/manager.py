"""EnvRunnerManager: simulator threads fed by a bounded window of step requests.

The manager builds and wires the parts, one job each: the staleness window
(:class:`~expreplay.acting.window.StalenessWindow`), the simulator threads and how runners are
grouped on them (:class:`~expreplay.acting.simulator.SimulatorThread`), faults and the watchdog
(:mod:`expreplay.acting.faults`), and statistics (:class:`~expreplay.acting.stats.ActingStats`);
it does shutdown itself. Acting is :class:`expreplay.acting.group.ActingGroup`'s; inference is
:class:`expreplay.acting.inference.InferenceThread`'s.
"""

from __future__ import annotations

import collections
import contextlib
import math
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any

from .._checks import check_int, check_probability, check_timeout
from .faults import Faults, Watchdog
from .group import ActingGroup
from ..errors import EnvError, ManagerClosed, RunnerError
from .inference import InferenceThread
from .runner import EnvRunner
from .settings import ManagerSettings, check_settings
from .simulator import SimulatorThread, close_group
from ..stats import ManagerStats
from .stats import ActingStats, ScoreWindow
from ..lags import DataLags
from .window import InsertedSteps, StalenessWindow

__all__ = ['EnvRunnerManager']


def plan_groups(runners: Sequence[EnvRunner], simulator_threads: int | None) -> list[list[ActingGroup]]:
    """The acting groups of each simulator thread (the manager's own, each runner in one):
    ``simulator_threads`` as :class:`~expreplay.acting.settings.ManagerSettings` documents it."""
    n = len(runners)
    # Whether a runner is pooled is its stepping's word (envs.Stepping.pools_runners): single
    # envs, whose steps hold the GIL, are; a vector or asynchronous engine is not.
    if simulator_threads is None:
        pooled = [r for r in runners if r.adapter.stepping.pools_runners]
        others = [[r] for r in runners if not r.adapter.stepping.pools_runners]
        owned = ([pooled] if len(pooled) > 1 else [[r] for r in pooled]) + others
    else:
        owned = [list(runners[j::simulator_threads]) for j in range(simulator_threads)]
    plan = []
    for rs in owned:
        groups: list[ActingGroup] = []
        # A runner that is not pooled is a group of its own; pooled runners that can share a
        # predictor call (and a stepping) form two halves, pipelined.
        for r in rs:
            if not r.adapter.stepping.pools_runners:
                groups.append(ActingGroup([r]))
        by_key: dict[tuple[Any, ...], list[EnvRunner]] = collections.defaultdict(list)
        for r in rs:
            if r.adapter.stepping.pools_runners:
                by_key[(r.adapter.stepping, id(r.predictor), id(r.memory), r.num_actions)].append(r)
        for members in by_key.values():
            if len(members) == 1 or simulator_threads == n:
                groups.extend(ActingGroup([r]) for r in members)
            else:
                half = (len(members) + 1) // 2
                groups += [ActingGroup(members[:half]), ActingGroup(members[half:])]
        plan.append(groups)
    assert sum(len(g.runners) for gs in plan for g in gs) == n
    return plan


class EnvRunnerManager:
    """Runs :class:`~expreplay.acting.runner.EnvRunner` s in simulator threads, one step request at a time.

    Args:
        env_runners (list): the runners. With one runner, :meth:`step` runs it inline in the
            caller's thread (no threads at all).
        maximum_staleness (int): how many step requests may be unfinished at once (see below).
        settings (ManagerSettings, optional): ``simulator_threads``, ``max_inference_batch``,
            ``max_restarts``, ``close_timeout``, ``call_timeout`` and ``thread_context``,
            documented at :class:`~expreplay.acting.settings.ManagerSettings`; None: its
            defaults. Anything else raises TypeError. ``simulator_threads`` above the number
            of runners raises ValueError.
        request_lag (int, optional): start each step request exactly this many learner
            updates after it was made (counted by ``lags``; see
            :mod:`expreplay.acting.window`), whatever the machine's speed or load: a lag that
            runs can share and replicate. None (default): a request starts as soon as a thread
            is free. Needs two runners or more, and ``maximum_staleness`` large enough to
            hold ``request_lag`` updates' requests (:class:`~expreplay.ReplayStream` checks).
        lags (DataLags, optional): the learner's update clock, shared with whoever ticks it
            (a stream), and the data's lags (:attr:`lags`); None: one of the manager's own.

    Staleness guarantee (every mode): :meth:`step` accepts request ``k`` only once every
    request before ``k - maximum_staleness + 1`` has finished (its steps are in the memory).
    Hence at most ``maximum_staleness`` requests are pending at any time, and a request is
    executed before more than ``maximum_staleness`` later requests are accepted. ``step``
    blocks while that does not hold. Each request is one step of one runner (all of its
    sub-envs; for an asynchronous runner, the sub-envs one ``recv`` returned, whose steps are
    stored when the engine returns them, at a later request of that runner).

    Threads: a thread owns one or two acting groups (:class:`~expreplay.acting.group.ActingGroup`);
    a group steps its runners' sub-envs as one batch, taking up to one request per runner.
    A *pipelined* thread (several single-env runners) splits them into two groups: it begins
    one group's step (random draws, state gather), submits its states to the
    :class:`~expreplay.acting.inference.InferenceThread` and, while that forward pass runs (outside
    the GIL), finishes the other group's step (env steps, memory write). Both groups are full
    only while ``maximum_staleness`` is at least the number of runners. A thread with one
    group (a vector runner) waits for its Q-values; several such threads overlap each other.

    Inference: one :class:`~expreplay.acting.inference.InferenceThread` per distinct predictor merges
    the states of the groups waiting at once into one call (at most ``max_inference_batch``
    rows). The predictor is called from that thread only (the caller's thread in inline
    mode), never concurrently: it need not be thread-safe, but it must work from a thread this
    manager starts (see ``thread_context``).

    Faults: an exception in a simulator thread or in the predictor is raised from the next
    :meth:`step` (at once if one is blocked waiting), or from :meth:`close` if no ``step``
    raised it: an :class:`EnvError`, :class:`PredictorError`, :class:`CallTimeout` or
    :class:`RunnerError` naming the thread and the runner, chained to the original
    (``__cause__``). Once failed, :meth:`step` keeps raising. With ``max_restarts`` an
    :class:`EnvError` restarts the runner instead (its episodes end where they are).

    Shutdown: :meth:`close` (also on leaving a ``with`` block) drops queued requests, releases
    threads waiting on the queue or for a prediction, lets each thread finish the env step it is
    in (everything stepped is stored), and joins every thread within ``close_timeout``. A thread
    stuck inside an env call or the predictor (C code can not be interrupted from Python) is
    left running as a daemon thread, named in ``stuck_threads`` and reported with a
    ``RuntimeWarning``; it stops when that call returns. A second ``close`` waits for the first.
    """

    def __init__(self, env_runners: Iterable[EnvRunner], maximum_staleness: int, *,
                 settings: ManagerSettings | None = None, request_lag: int | None = None,
                 lags: DataLags | None = None) -> None:
        if isinstance(env_runners, EnvRunner) or not hasattr(env_runners, '__iter__'):
            raise TypeError(f"env_runners must be a list of EnvRunner, got {env_runners!r}")
        self._runners = list(env_runners)
        if not self._runners:
            raise ValueError("env_runners is empty")
        for i, runner in enumerate(self._runners):
            if not isinstance(runner, EnvRunner):
                raise TypeError(f"env_runners[{i}] must be an EnvRunner, got {runner!r} "
                                f"({type(runner).__name__})")
        if len({id(r) for r in self._runners}) != len(self._runners):
            raise ValueError("env_runners holds the same runner twice")
        self.maximum_staleness = check_int(maximum_staleness, 'maximum_staleness', 1)
        n = len(self._runners)
        self.request_lag = None if request_lag is None else check_int(request_lag, 'request_lag', 1)
        #: The settings it runs with (:class:`~expreplay.acting.settings.ManagerSettings`).
        self.settings = settings = check_settings(settings, ManagerSettings, 'settings')
        if settings.simulator_threads is not None:        # the record checked its minimum
            check_int(settings.simulator_threads, 'simulator_threads', maximum=n)
        if self.request_lag is not None and n == 1:
            raise ValueError("request_lag needs two runners or more: a single runner steps "
                             "inline, when its request is made")
        #: The learner's update count and the data's lags (the caller's, or one of its own).
        self.lags = DataLags() if lags is None else lags
        self._thread_context = settings.thread_context or contextlib.nullcontext
        self.stuck_threads: list[str] = []
        # One close() at a time. Re-entrant: a hold that a KeyboardInterrupt left in a close
        # cut short (between its acquire and its try) does not stop this thread's next close.
        self._close_lock = threading.RLock()
        self._close_finished = False            # the threads joined and the groups closed

        self._window = StalenessWindow(self.maximum_staleness, self._check_usable, self._watch,
                                       self.lags, self.request_lag)
        self._faults = Faults(self.max_restarts, self._window.halt)
        self._inference_threads: dict[int, InferenceThread] = {}    # id(predictor) -> its thread
        self._simulators: list[SimulatorThread] = []
        self._threads: list[threading.Thread] = []       # the simulators' threads
        self._groups: list[ActingGroup] = []
        self._inline: ActingGroup | None = None
        if n == 1:
            runner = self._runners[0]
            self._inline = ActingGroup([runner])
            self._inline_steps = InsertedSteps(self._inline)
            self._groups = [self._inline]
            self.pipelined = False
        else:
            plan = plan_groups(self._runners, settings.simulator_threads)
            self.pipelined = any(len(groups) > 1 for groups in plan)
            self._start_threads(plan, settings.max_inference_batch)
        self._watchdog = Watchdog(self.call_timeout, [s.activity for s in self._simulators],
                                  list(self._inference_threads.values()), self._faults)
        self._stats = ActingStats(self._runners, self._inference_counts)

    @property
    def max_restarts(self) -> int:
        """Times each runner may be restarted (the settings' ``max_restarts``)."""
        return self.settings.max_restarts

    @property
    def close_timeout(self) -> float:
        """Seconds :meth:`close` waits for the threads (the settings' ``close_timeout``)."""
        return self.settings.close_timeout

    @property
    def call_timeout(self) -> float:
        """Seconds an env or predictor call may take (the settings' ``call_timeout``)."""
        return self.settings.call_timeout

    def _start_threads(self, plan: list[list[ActingGroup]], max_inference_batch: int) -> None:
        for groups in plan:
            for g in groups:
                key = id(g.predictor)
                if key not in self._inference_threads:
                    suffix = f'-{len(self._inference_threads)}' if self._inference_threads else ''
                    self._inference_threads[key] = InferenceThread(
                        g.predictor, max_inference_batch, name='InferenceThread' + suffix,
                        thread_context=self._thread_context, on_done=self._window.wake_workers)
        self._groups = [g for groups in plan for g in groups]
        self._simulators = [SimulatorThread(f'SimulatorThread-{j}', groups, self._window,
                                            self._faults, self._inference_threads, self._thread_context)
                            for j, groups in enumerate(plan)]
        self._threads = [s.thread for s in self._simulators]
        for s in self._simulators:
            s.start()

    # ------------------------------------------------------------------ the caller's side
    def step(self, exploration: float, timeout: float | None = None) -> None:
        """Request one step of some runner with this exploration; returns once accepted.

        Blocks while the staleness window is full (see the class docstring); ``timeout``
        (seconds) raises TimeoutError instead of blocking longer, the request not accepted.
        Raises the first fault of any thread (see the class docstring), or
        :class:`ManagerClosed` after :meth:`close`.
        """
        exploration = check_probability(exploration, 'exploration')
        if self._inline is not None:
            return self._step_inline(self._inline, exploration)
        if timeout is not None:
            timeout = check_timeout(timeout, 'timeout', allow_none=True)
        self._window.accept(exploration, timeout)

    def progress(self) -> tuple[int, int]:
        """``(inserted, pending)`` at one instant: the steps the finished requests stored in
        the memory (what a request stores depends on the player: one step, a vector env's
        sub-env steps but not its autoreset rows, an asynchronous engine's received results),
        and the requests accepted but not finished."""
        return self._window.progress()

    def wait_idle(self, timeout: float | None = None) -> None:
        """Block until every accepted request has finished (its steps are in the memory).

        Raises the first fault like :meth:`step`, and TimeoutError after ``timeout`` seconds.
        Useful before reading statistics or saving the memory at a quiet moment.
        """
        self._window.wait_idle(check_timeout(timeout, 'timeout', allow_none=True))

    def wait_for(self, ready: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until ``ready()`` is true, looked at whenever a request finishes and at a fault
        or :meth:`close` (e.g. ``lambda: mgr.progress()[1] < 3``); False after ``timeout`` s."""
        return self._window.wait_for(ready, check_timeout(timeout, 'timeout', allow_none=True))

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has begun."""
        return self._window.closed

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        """The simulator threads (none when a single runner steps in the caller's thread); the
        ones :meth:`close` left running are named in ``stuck_threads``."""
        return tuple(self._threads)

    @property
    def groups(self) -> tuple[ActingGroup, ...]:
        """The acting groups this manager built and steps (each runner is in one): read them,
        the manager steps and closes them."""
        return tuple(self._groups)

    @property
    def inference_threads(self) -> tuple[InferenceThread, ...]:
        """The threads that run the predictors' batched calls, one per distinct predictor."""
        return tuple(self._inference_threads.values())

    def _check_usable(self) -> None:
        """Raise the first fault, or ManagerClosed after close() (the window's waits call it)."""
        self._faults.raise_if_failed()
        if self._window.closed:
            raise ManagerClosed("the EnvRunnerManager is closed")

    def _watch(self, now: float) -> float | None:
        # Built after the window, which may call this only from a wait.
        return self._watchdog.check(now)

    def _step_inline(self, group: ActingGroup, exploration: float) -> None:
        self._check_usable()
        self.lags.requests_started([self.lags.updates])     # started when made: no lag
        try:
            group.step(exploration)
        except EnvError as err:
            if not self._faults.handle('EnvRunner-0', err):
                self._faults.mark_reported()
                raise
        except Exception as err:
            self._faults.record('EnvRunner-0', err)
            self._faults.mark_reported()
            raise
        finally:
            self._window.add_inserted(self._inline_steps.take())

    # ------------------------------------------------------------------ statistics
    def _inference_counts(self) -> tuple[int, int]:
        if self._inline is not None:
            return self._inline.calls, self._inline.rows
        return (sum(b.calls for b in self._inference_threads.values()),
                sum(b.rows for b in self._inference_threads.values()))

    def reset_stats(self) -> ScoreWindow:
        """The mean and largest score of the games finished since the last call, a
        :class:`~expreplay.stats.ScoreWindow` (``(None, None)`` without games; a tuple, so
        ``mean, best = reset_stats()`` unpacks it); starts a new statistics window (see
        :meth:`stats`) and, as in tensorpack, empties the runners' ``total_scores``."""
        return self._stats.reset()

    def stats(self) -> ManagerStats:
        """Figures since the last :meth:`reset_stats` (does not reset them), and a few totals
        and figures of now: a :class:`~expreplay.stats.ManagerStats`."""
        pending, queued = self._window.counts()
        return self._stats.figures(
            max_inference_batch=max([b.max_rows_seen for b in self._inference_threads.values()],
                                    default=None),
            queue_depth=pending, queued=queued, stuck_threads=tuple(self.stuck_threads))

    # ------------------------------------------------------------------ shutdown
    def close(self, timeout: float | None = None) -> None:
        """Stop and join every thread, close the runners; raise a fault no step() raised.

        Idempotent; a second call while the first runs waits for it (``timeout`` at most). A
        call cut short (a KeyboardInterrupt while it joins) leaves the joining to the next
        call, which does it. See the class docstring for threads stuck in an env or the
        predictor.
        """
        timeout = self.close_timeout if timeout is None else check_timeout(timeout, 'timeout')
        first = self._window.close()
        if not self._close_lock.acquire(timeout=-1 if math.isinf(timeout) else timeout):
            return
        try:
            if self._close_finished:
                return
            self._join(timeout)
            if self._inline is not None:
                close_group(self._inline)
            for sim in self._simulators:
                if not sim.thread.is_alive():
                    for g in sim.groups:
                        close_group(g)
            self._close_finished = True
        finally:
            self._close_lock.release()
        if first and self._faults.unreported:
            self._faults.raise_fault()

    def _join(self, timeout: float) -> None:
        """Join the threads within ``timeout`` in total; name the ones left running."""
        deadline = time.monotonic() + timeout
        for b in self._inference_threads.values():
            b.close()
        threads = self._threads + [b.thread for b in self._inference_threads.values()]
        for t in threads:
            t.join(None if math.isinf(timeout) else max(0.0, deadline - time.monotonic()))
        self.stuck_threads = [t.name for t in threads if t.is_alive()]
        if self.stuck_threads:
            warnings.warn(f"EnvRunnerManager.close: {', '.join(self.stuck_threads)} still inside "
                          f"an env or predictor call after {timeout} s; left running as daemon "
                          "threads, they stop when that call returns", RuntimeWarning, stacklevel=3)

    def __enter__(self) -> EnvRunnerManager:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.close()
        except RunnerError:
            if exc_type is None:
                raise
            # An exception is already propagating (most likely this fault, surfaced by step).
