"""EnvRunnerManager: simulator threads fed by a bounded window of step requests.

The manager's jobs: the staleness window (how far acting may lag the learner's requests), the
threads and how runners are grouped on them, faults (raised from the caller's next call,
chained), the watchdog on env and predictor calls, shutdown, and statistics. Acting itself is
:class:`expreplay.acting.group.ActingGroup`'s; inference is :class:`expreplay.acting.inference.InferenceThread`'s.
"""

import collections
import contextlib
import logging
import math
import threading
import time
import warnings

import numpy as np

from .._checks import check_int, check_probability, check_timeout
from .group import ActingGroup
from .runner import EnvRunner
from ..errors import CallTimeout, EnvError, ManagerClosed, RunnerError
from .inference import InferenceThread

__all__ = ['EnvRunnerManager']

logger = logging.getLogger(__name__)


class _Request:
    __slots__ = ('seq', 'exploration', 'done')

    def __init__(self, seq, exploration):
        self.seq = seq
        self.exploration = exploration
        self.done = False


class _Activity:
    """What a simulator thread is doing now, for the watchdog: ``what`` of ``group`` since
    ``since`` (described only when the watchdog reports it: this is set twice per step)."""
    __slots__ = ('name', 'what', 'group', 'since')

    def __init__(self, name):
        self.name, self.what, self.group, self.since = name, None, None, None

    def enter(self, what, group):
        self.what, self.group, self.since = what, group, time.monotonic()

    def leave(self):
        self.since = None

    def describe(self):
        call = self.group.current_call       # read once: the thread may leave it meanwhile
        if call is not None:                 # a call the group named (a reset, a restore...)
            what, runner = call
            return (f"{'a ' if what == 'reset' else ''}{what} of runner {runner.index} "
                    f"(player {type(runner.player).__name__})")
        return f"{self.what} of runner(s) {[r.index for r in self.group.runners]}"


class _GroupSlot:
    """An acting group on a thread, and the order its runners take requests in (the runner
    that stepped longest ago first, so every runner steps even with a small window)."""

    def __init__(self, group):
        self.group = group
        self.order = collections.deque(range(len(group.runners)))
        self._steps_seen = sum(r.steps for r in group.runners)

    def take_inserted(self):
        """Steps the group stored since the last call (its runners are stepped by this
        slot's thread only, so the difference is exactly what the last request(s) stored)."""
        steps = sum(r.steps for r in self.group.runners)
        inserted, self._steps_seen = steps - self._steps_seen, steps
        return inserted

    @property
    def capacity(self):
        return len(self.group.runners)

    def pick(self, m):
        members = [self.order.popleft() for _ in range(m)]
        self.order.extend(members)
        return np.array(members, np.int64)


class EnvRunnerManager:
    """Runs :class:`~expreplay.acting.group.EnvRunner` s in simulator threads, one step request at a time.

    Args:
        env_runners (list): the runners. With one runner, :meth:`step` runs it inline in the
            caller's thread (no threads at all).
        maximum_staleness (int): how many step requests may be unfinished at once (see below).
        simulator_threads (int, optional): how many simulator threads step the runners.
            None (default): chosen for what the runners are. Single-env runners (whose env
            steps hold the GIL, like single ALE envs) share one *pipelined* thread; each vector
            or asynchronous runner (``AtariVectorEnv``, EnvPool, Ray actors, whose engines step
            outside the GIL) gets a thread of its own. ``len(env_runners)``: one thread per
            runner, each stepping its runner alone (wins for envs that release the GIL while
            stepping, e.g. subprocess vector envs, when there are cores to spare). ``k`` in
            between: runner ``i`` goes to thread ``i % k``, pipelined.
        max_inference_batch (int): at most this many states per predictor call.
        max_restarts (int): times each runner may be restarted (:meth:`EnvRunner.restart`)
            after its env raised, instead of failing the manager. Counted in :meth:`stats`.
        close_timeout (float): seconds :meth:`close` waits for the threads in total
            (``float('inf')``: as long as it takes).
        call_timeout (float): seconds an env call (step, reset, receive) or a predictor call
            may take before the manager fails with :class:`CallTimeout`, raised from
            :meth:`step` and naming the thread and what it was doing (``float('inf')``: no
            limit). Not enforced inline (one runner): the call runs in your own thread.
        thread_context (callable, optional): returns a context manager that every thread this
            manager starts enters first (e.g. ``lambda: sess.as_default()`` for TF1 sessions);
            the predictor runs in these threads.

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

    def __init__(self, env_runners, maximum_staleness, *, simulator_threads=None,
                 max_inference_batch=32, max_restarts=0,
                 close_timeout=5.0, call_timeout=120.0, thread_context=None):
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
        if simulator_threads is not None:
            simulator_threads = check_int(simulator_threads, 'simulator_threads', 1, n)
        self.max_restarts = check_int(max_restarts, 'max_restarts', 0)
        self.close_timeout = check_timeout(close_timeout, 'close_timeout')
        self.call_timeout = check_timeout(call_timeout, 'call_timeout')
        if self.call_timeout == 0:
            raise ValueError("call_timeout must be > 0 (float('inf'): no limit)")
        if thread_context is not None and not callable(thread_context):
            raise TypeError(f"thread_context must be a callable that returns a context manager "
                            f"(e.g. a contextlib.contextmanager function), got {thread_context!r}")
        self._thread_context = thread_context or contextlib.nullcontext
        self.stuck_threads = []

        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)    # simulator threads wait for requests
        self._space = threading.Condition(self._lock)   # step() waits for the staleness window
        self._queue = collections.deque()               # accepted, not started
        self._unfinished = collections.deque()          # accepted, oldest first, done ones popped from the left
        self._next_seq = 0
        self._pending = 0
        self._inserted = 0            # steps stored by finished requests (see progress())
        self._closed = False
        self._close_done = threading.Event()
        self._fault = None            # (thread name, exception)
        self._fault_reported = False

        self._window_games = []
        self._window_start = time.monotonic()
        self._window_steps = 0
        self._window_infer = (0, 0)

        self._batchers = {}            # id(predictor) -> InferenceThread
        self._threads = []
        self._activities = []
        self._groups = []
        self._thread_groups = []       # per simulator thread: its acting groups
        self._inline = None
        if n == 1:
            runner = self._runners[0]
            self._inline = runner._group if runner._group is not None else ActingGroup([runner])
            self._groups = [self._inline]
            self.pipelined = False
            return
        plan = self._plan(simulator_threads)
        self.pipelined = any(len(groups) > 1 for groups in plan)
        for groups in plan:
            for g in groups:
                key = id(g.predictor)
                if key not in self._batchers:
                    suffix = f'-{len(self._batchers)}' if self._batchers else ''
                    self._batchers[key] = InferenceThread(
                        g.predictor, max_inference_batch, name='InferenceThread' + suffix,
                        thread_context=self._thread_context, on_done=self._prediction_done)
                self._groups.append(g)
        self._thread_groups = plan
        for j, groups in enumerate(plan):
            activity = _Activity(f'SimulatorThread-{j}')
            self._activities.append(activity)
            self._threads.append(threading.Thread(
                target=self._simulate, args=([_GroupSlot(g) for g in groups], activity),
                name=activity.name, daemon=True))
        for t in self._threads:
            t.start()

    def _plan(self, simulator_threads):
        """Acting groups per simulator thread (see the class docstring)."""
        runners = self._runners
        n = len(runners)
        if simulator_threads is None:
            singles = [r for r in runners if not r.is_vector]
            others = [[r] for r in runners if r.is_vector]
            owned = ([singles] if len(singles) > 1 else [[r] for r in singles]) + others
        else:
            owned = [runners[j::simulator_threads] for j in range(simulator_threads)]
        plan = []
        for rs in owned:
            groups = []
            # Vector and asynchronous runners are groups of their own; single envs that can
            # share a predictor call form two halves, pipelined.
            for r in rs:
                if r.is_vector:
                    groups.append(ActingGroup([r]))
            singles = [r for r in rs if not r.is_vector]
            by_key = collections.defaultdict(list)
            for r in singles:
                by_key[(id(r.predictor), id(r.memory), r.num_actions)].append(r)
            for members in by_key.values():
                if len(members) == 1 or simulator_threads == n:
                    groups.extend(ActingGroup([r]) for r in members)
                else:
                    half = (len(members) + 1) // 2
                    groups += [ActingGroup(members[:half]), ActingGroup(members[half:])]
            plan.append(groups)
        assert sum(len(g.runners) for gs in plan for g in gs) == n
        return plan

    # ------------------------------------------------------------------ the caller's side
    def step(self, exploration, timeout=None):
        """Request one step of some runner with this exploration; returns once accepted.

        Blocks while the staleness window is full (see the class docstring); ``timeout``
        (seconds) raises TimeoutError instead of blocking longer, the request not accepted.
        Raises the first fault of any thread (see the class docstring), or
        :class:`ManagerClosed` after :meth:`close`.
        """
        exploration = check_probability(exploration, 'exploration')
        if self._inline is not None:
            return self._step_inline(exploration)
        if timeout is not None:
            timeout = check_timeout(timeout, 'timeout', allow_none=True)
        with self._lock:
            if self._fault is not None or self._closed or not self._window_open():
                self._wait(self._window_open, timeout)
            if not self._window_open():
                raise TimeoutError(f"step() not accepted within {timeout} s: {self._pending} "
                                   f"requests pending (maximum_staleness={self.maximum_staleness})")
            req = _Request(self._next_seq, exploration)
            self._next_seq += 1
            self._queue.append(req)
            self._unfinished.append(req)
            self._pending += 1
            self._work.notify()

    def progress(self):
        """``(inserted, pending)`` at one instant: the steps the finished requests stored in
        the memory (what a request stores depends on the player: one step, a vector env's
        sub-env steps but not its autoreset rows, an asynchronous engine's received results),
        and the requests accepted but not finished."""
        with self._lock:
            return self._inserted, self._pending

    def wait_idle(self, timeout=None):
        """Block until every accepted request has finished (its steps are in the memory).

        Raises the first fault like :meth:`step`, and TimeoutError after ``timeout`` seconds.
        Useful before reading statistics or saving the memory at a quiet moment.
        """
        timeout = check_timeout(timeout, 'timeout', allow_none=True)
        with self._lock:
            self._wait(lambda: self._pending == 0, timeout)
            if self._pending:
                raise TimeoutError(f"{self._pending} requests still pending after {timeout} s")

    def _wait(self, ready, timeout):
        """Wait (lock held) until ``ready()``, a fault, close, or ``timeout``; the watchdog
        runs while waiting, since a stuck call is what keeps the caller waiting."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._raise_if_unusable()
            if ready():
                return
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            wait = self._watchdog(now)
            if self._fault is not None:        # the watchdog just failed the manager
                continue
            if deadline is not None:
                wait = deadline - now if wait is None else min(wait, deadline - now)
            self._space.wait(wait)

    def _watchdog(self, now):
        """Fail the manager if a call runs past ``call_timeout``; else seconds to the next
        possible expiry (None: nothing running can expire)."""
        if math.isinf(self.call_timeout):
            return None
        soonest = None
        calls = [(a.name, a.describe() if a.since is not None else None, a.since)
                 for a in self._activities]
        calls += [(b.thread.name, 'the predictor', b.busy_since) for b in self._batchers.values()]
        for name, what, since in calls:
            if since is None:
                continue
            left = since + self.call_timeout - now
            if left <= 0:
                if self._fault is None:
                    self._fault = (name, CallTimeout(
                        f"{name} has been in {what} for {now - since:.1f} s "
                        f"(call_timeout={self.call_timeout} s)"))
                return None
            soonest = left if soonest is None else min(soonest, left)
        # Not every call is seen starting from here: look again at least once a timeout.
        return self.call_timeout if soonest is None else soonest + 1e-3

    def _window_open(self):
        return not self._unfinished or self._next_seq - self._unfinished[0].seq < self.maximum_staleness

    def _raise_if_unusable(self):
        if self._fault is not None:
            self._raise_fault()
        if self._closed:
            raise ManagerClosed("the EnvRunnerManager is closed")

    def _raise_fault(self):
        name, err = self._fault
        self._fault_reported = True
        cls = type(err) if isinstance(err, RunnerError) else RunnerError
        cause = err.__cause__ if isinstance(err, RunnerError) and err.__cause__ is not None else err
        raise cls(f"{name} failed: {err}") from cause

    def _step_inline(self, exploration):
        with self._lock:
            self._raise_if_unusable()
        group = self._inline
        before = sum(r.steps for r in group.runners)
        try:
            group.step(exploration)
        except EnvError as err:
            if not self._handle_fault('EnvRunner-0', err):
                with self._lock:
                    self._fault_reported = True
                raise
        except Exception as err:
            self._record_fault('EnvRunner-0', err)
            with self._lock:
                self._fault_reported = True
            raise
        finally:
            inserted = sum(r.steps for r in group.runners) - before
            with self._lock:
                self._inserted += inserted

    # ------------------------------------------------------------------ the threads' side
    def _simulate(self, slots, activity):
        """Step the groups ``slots`` of this thread, up to two in flight: while one group's
        states are in the predictor, finish the other's step.

        Invariants: a group is either idle or in flight (begun, its Q-values coming); groups
        finish in the order they began; the idle group that waited longest begins next.
        """
        idle = collections.deque(slots)
        inflight = collections.deque()      # (slot, requests, prediction or None), oldest first
        owner = object()                    # this thread, for the inference thread's batching
        name = activity.name
        try:
            with self._thread_context():
                while True:
                    if idle and len(inflight) < 2:
                        slot = idle[0]
                        # With a group in flight, wait for a request or that group's Q-values,
                        # whichever comes first: beginning the idle group keeps both busy.
                        reqs = self._take_up_to(slot.capacity, block=not inflight,
                                                until=inflight[0][2] if inflight else None)
                        if reqs is None:
                            return
                        if reqs:
                            idle.popleft()
                            entry = self._begin(slot, reqs, owner, activity)
                            if entry is None:
                                idle.append(slot)
                                continue
                            inflight.append(entry)
                            if len(idle) and len(inflight) < 2:
                                continue
                    if inflight:
                        slot, reqs, pred = inflight.popleft()
                        ok = self._finish_group(slot, reqs, pred, activity)
                        idle.append(slot)
                        if not ok:
                            return
        except BaseException as err:   # thread_context failed (the loop handles the rest)
            self._record_fault(name, err)
        finally:
            for slot, reqs, _ in inflight:    # closed or failed: those Q-values will not be used
                slot.group.abort()
                self._finish(*reqs, inserted=slot.take_inserted())
            if self._closed:     # close() may have stopped waiting for us: close our own
                for slot in slots:
                    self._close_group(slot.group)

    @staticmethod
    def _close_group(group):
        group.close()
        for r in group.runners:
            try:
                r.close()
            except Exception as err:
                logger.warning("closing runner %d raised %r", r.index, err)

    def _begin(self, slot, reqs, owner, activity):
        """Begin a step of as many of the slot's runners as requests; submit their states.

        Returns the in-flight entry, or None when the step did not begin (a failure, the
        requests booked; a fatal one is recorded and stops the thread at its next take).
        """
        group = slot.group
        members = slot.pick(len(reqs))
        explorations = reqs[0].exploration if len(reqs) == 1 else [r.exploration for r in reqs]
        try:
            if self._closed:
                raise ManagerClosed("closed")
            activity.enter("a reset or receive", group)
            try:
                states = group.begin(explorations, members)
            finally:
                activity.leave()
            pred = None
            if len(states):
                pred = self._batchers[id(group.predictor)].submit(states, owner)
            return slot, reqs, pred
        except BaseException as err:
            group.abort()
            self._finish(*reqs, inserted=slot.take_inserted())   # no step (a receive may have stored some)
            if not isinstance(err, ManagerClosed):
                self._handle_fault(activity.name, err)
            return None

    def _finish_group(self, slot, reqs, pred, activity):
        """Wait for the group's Q-values and finish its step; False: stop this thread."""
        group = slot.group
        try:
            if self._closed:                      # close(): no further env step
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
                ok = self._handle_fault(activity.name, err) and ok
            return ok
        except ManagerClosed:
            return False
        except BaseException as err:
            return self._handle_fault(activity.name, err)
        finally:
            # At once: with a small maximum_staleness the window waits for it.
            self._finish(*reqs, inserted=slot.take_inserted())

    def _take_up_to(self, n, block, until=None):
        """Up to ``n`` queued requests; None once closed or failed. ``block``: wait for one;
        else with ``until`` (a Prediction), wait for one only while it is not done."""
        with self._lock:
            while not self._queue and not self._closed and self._fault is None:
                if not (block or (until is not None and not until.done)):
                    break
                self._work.wait()
            if self._closed or self._fault is not None:
                return None
            return [self._queue.popleft() for _ in range(min(n, len(self._queue)))]

    def _prediction_done(self):
        """The inference thread delivered Q-values: wake simulator threads waiting for them."""
        with self._lock:
            self._work.notify_all()

    def _finish(self, *reqs, inserted=0):
        """Book requests as finished (their ``inserted`` steps are in the memory); wakes
        step() once."""
        if not reqs:
            return
        with self._lock:
            self._inserted += inserted
            for req in reqs:
                req.done = True
            self._pending -= len(reqs)
            while self._unfinished and self._unfinished[0].done:
                self._unfinished.popleft()
            self._space.notify_all()

    def _handle_fault(self, name, err):
        """Restart the failed runner if allowed (True), else record the fault (False)."""
        runner = getattr(err, 'runner', None)
        if isinstance(err, EnvError) and runner is not None and runner.restarts < self.max_restarts:
            logger.warning("%s: restarting %r after: %s", name, runner, err)
            try:
                runner.restart()
                return True
            except Exception as restart_err:
                err = EnvError(f"restarting {runner!r} raised {restart_err!r}")
                err.__cause__ = restart_err
        if runner is not None:
            name = f'{name} (runner {runner.index})'
        self._record_fault(name, err)
        return False

    def _record_fault(self, name, err):
        """The manager has failed: step() and wait_idle() raise it from now on."""
        with self._lock:
            if self._fault is None:
                self._fault = (name, err)
            self._space.notify_all()
            self._work.notify_all()

    # ------------------------------------------------------------------ statistics
    def _collect_games(self, clear_total_scores=False):
        for r in self._runners:
            self._window_games.extend(r.pop_games(clear_total_scores))
        if len(self._window_games) > 100_000:        # never read: keep the newest
            del self._window_games[:-50_000]

    def _infer_counts(self):
        calls = sum(b.calls for b in self._batchers.values())
        rows = sum(b.rows for b in self._batchers.values())
        if self._inline is not None:
            calls, rows = self._inline.calls, self._inline.rows
        return calls, rows

    def _total_steps(self):
        return sum(r.steps for r in self._runners)

    def reset_stats(self):
        """``(mean, max)`` score of the games finished since the last call, or ``(None, None)``;
        starts a new statistics window (see :meth:`stats`) and, as in tensorpack, empties the
        runners' ``total_scores``."""
        self._collect_games(clear_total_scores=True)
        scores = [s for s, _ in self._window_games]
        self._window_games = []
        self._window_start = time.monotonic()
        self._window_steps = self._total_steps()
        self._window_infer = self._infer_counts()
        if not scores:
            return None, None
        return float(np.mean(scores)), float(np.max(scores))

    def stats(self):
        """Figures since the last :meth:`reset_stats` (does not reset them).

        Keys: ``games``, ``mean_score``, ``max_score``, ``mean_episode_length`` (steps per
        game; None without games), ``steps``, ``steps_per_sec``, ``inference_calls``,
        ``mean_inference_batch`` (states per predictor call, None without calls); and, now:
        ``max_inference_batch`` (largest call so far, threaded modes only), ``queue_depth``
        (requests pending: accepted, not finished), ``queued`` (not started), ``restarts``
        (runner restarts, total), ``actor_restarts`` (remote actors restarted by their engine,
        e.g. Ray), ``stuck_threads``.
        """
        self._collect_games()
        games = self._window_games
        elapsed = max(time.monotonic() - self._window_start, 1e-9)
        steps = self._total_steps() - self._window_steps
        calls, rows = self._infer_counts()
        calls, rows = calls - self._window_infer[0], rows - self._window_infer[1]
        with self._lock:
            pending, queued = self._pending, len(self._queue)
        return {
            'games': len(games),
            'mean_score': float(np.mean([s for s, _ in games])) if games else None,
            'max_score': float(np.max([s for s, _ in games])) if games else None,
            'mean_episode_length': float(np.mean([n for _, n in games])) if games else None,
            'steps': steps,
            'steps_per_sec': steps / elapsed,
            'inference_calls': calls,
            'mean_inference_batch': rows / calls if calls else None,
            'max_inference_batch': max([b.max_rows_seen for b in self._batchers.values()], default=None),
            'queue_depth': pending,
            'queued': queued,
            'restarts': sum(r.restarts for r in self._runners),
            'actor_restarts': sum(int(getattr(r.player, 'actor_restarts', 0) or 0) for r in self._runners),
            'stuck_threads': list(self.stuck_threads),
        }

    # ------------------------------------------------------------------ shutdown
    def close(self, timeout=None):
        """Stop and join every thread, close the runners; raise a fault no step() raised.

        Idempotent; a second call while the first runs waits for it. See the class docstring
        for threads stuck in an env or the predictor.
        """
        timeout = self.close_timeout if timeout is None else check_timeout(timeout, 'timeout')
        with self._lock:
            first = not self._closed
            self._closed = True
            self._queue.clear()
            self._work.notify_all()
            self._space.notify_all()
        if not first:
            self._close_done.wait(None if math.isinf(timeout) else timeout)
            return
        try:
            deadline = time.monotonic() + timeout
            for b in self._batchers.values():
                b.close()
            threads = self._threads + [b.thread for b in self._batchers.values()]
            for t in threads:
                t.join(None if math.isinf(timeout) else max(0.0, deadline - time.monotonic()))
            self.stuck_threads = [t.name for t in threads if t.is_alive()]
            if self.stuck_threads:
                warnings.warn(f"EnvRunnerManager.close: {', '.join(self.stuck_threads)} still inside "
                              f"an env or predictor call after {timeout} s; left running as daemon "
                              "threads, they stop when that call returns", RuntimeWarning, stacklevel=2)
            if self._inline is not None:
                self._close_group(self._inline)
            for t, groups in zip(self._threads, self._thread_groups):
                if not t.is_alive():
                    for g in groups:
                        self._close_group(g)
        finally:
            self._close_done.set()
        with self._lock:
            unreported = self._fault is not None and not self._fault_reported
        if unreported:
            self._raise_fault()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.close()
        except RunnerError:
            if exc_type is None:
                raise
            # An exception is already propagating (most likely this fault, surfaced by step).
