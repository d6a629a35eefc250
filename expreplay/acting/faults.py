"""A manager's faults, runner restarts, and the watchdog on env and predictor calls.

:class:`Faults` keeps the first fault of any thread (raised from the caller's next call,
chained to the original) and restarts a runner whose env raised while restarts are left.
:class:`Watchdog` fails the manager with :class:`~expreplay.errors.CallTimeout` when a thread
has been inside one env or predictor call for longer than ``call_timeout``; it reads what each
simulator thread is doing from its :class:`Activity`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ..errors import CallTimeout, EnvError, RunnerError

__all__ = ['Faults', 'Activity', 'Watchdog']

logger = logging.getLogger(__name__)


class Faults:
    """The first fault of a manager's threads; ``on_fault()`` is called when it is recorded."""

    def __init__(self, max_restarts: int, on_fault: Callable[[], None]) -> None:
        self.max_restarts = max_restarts
        self._on_fault = on_fault
        self._lock = threading.Lock()
        self._fault: tuple[str, BaseException] | None = None   # (thread name, exception)
        self._reported = False

    @property
    def failed(self) -> bool:
        return self._fault is not None

    @property
    def unreported(self) -> bool:
        """A fault was recorded and no call raised it yet."""
        with self._lock:
            return self._fault is not None and not self._reported

    def handle(self, name: str, err: BaseException) -> bool:
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
        self.record(name, err)
        return False

    def record(self, name: str, err: BaseException) -> None:
        """The manager has failed: its calls raise this fault from now on."""
        with self._lock:
            if self._fault is None:
                self._fault = (name, err)
        self._on_fault()

    def mark_reported(self) -> None:
        """The fault reached the caller some other way (raised as it was, inline)."""
        with self._lock:
            self._reported = True

    def raise_if_failed(self) -> None:
        if self._fault is not None:
            self.raise_fault()

    def raise_fault(self) -> NoReturn:
        """Raise the recorded fault: its class (RunnerError for any other exception), naming
        the thread, chained to the original exception."""
        assert self._fault is not None
        name, err = self._fault
        self.mark_reported()
        cls = type(err) if isinstance(err, RunnerError) else RunnerError
        cause = err.__cause__ if isinstance(err, RunnerError) and err.__cause__ is not None else err
        raise cls(f"{name} failed: {err}") from cause


class Activity:
    """What a simulator thread is doing now, for the watchdog: ``what`` of ``group`` since
    ``since`` (described only when the watchdog reports it: this is set twice per step)."""
    __slots__ = ('name', 'what', 'group', 'since')

    def __init__(self, name: str) -> None:
        self.name = name
        self.what: str | None = None
        self.group: Any = None
        self.since: float | None = None

    def enter(self, what: str, group: Any) -> None:
        self.what, self.group, self.since = what, group, time.monotonic()

    def leave(self) -> None:
        self.since = None

    def describe(self) -> str:
        call = self.group.current_call       # read once: the thread may leave it meanwhile
        if call is not None:                 # a call the group named (a reset, a restore...)
            what, runner = call
            return (f"{'a ' if what == 'reset' else ''}{what} of runner {runner.index} "
                    f"(player {type(runner.player).__name__})")
        return f"{self.what} of runner(s) {[r.index for r in self.group.runners]}"


class Watchdog:
    """Fails ``faults`` when a simulator thread (its :class:`Activity`) or an inference thread
    (``busy_since``) has been in one call for more than ``call_timeout`` seconds."""

    def __init__(self, call_timeout: float, activities: Sequence[Activity],
                 inference_threads: Sequence[Any], faults: Faults) -> None:
        self.call_timeout = call_timeout
        self._activities = list(activities)
        self._inference = list(inference_threads)
        self._faults = faults

    def check(self, now: float) -> float | None:
        """Seconds to the next possible expiry (None: nothing running can expire); 0 when a
        call just expired and failed the manager."""
        if math.isinf(self.call_timeout):
            return None
        soonest = None
        calls = [(a.name, a.describe() if a.since is not None else None, a.since)
                 for a in self._activities]
        calls += [(b.thread.name, 'the predictor', b.busy_since) for b in self._inference]
        for name, what, since in calls:
            if since is None:
                continue
            left = since + self.call_timeout - now
            if left <= 0:
                if not self._faults.failed:
                    self._faults.record(name, CallTimeout(
                        f"{name} has been in {what} for {now - since:.1f} s "
                        f"(call_timeout={self.call_timeout} s)"))
                return 0.0
            soonest = left if soonest is None else min(soonest, left)
        # Not every call is seen starting from here: look again at least once a timeout.
        return self.call_timeout if soonest is None else soonest + 1e-3
