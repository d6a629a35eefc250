"""The exceptions the acting layer raises (one place, so that every module raises the same)."""

from __future__ import annotations

from typing import Any

__all__ = ['RunnerError', 'EnvError', 'PredictorError', 'ManagerClosed', 'CallTimeout']


class RunnerError(RuntimeError):
    """A simulator failed; ``__cause__`` is the original exception."""


class EnvError(RunnerError):
    """The environment raised while resetting or stepping, or returned something the memory
    can not store. ``runner`` is the :class:`~expreplay.acting.runner.EnvRunner` whose env it was."""
    runner: Any = None


class PredictorError(RunnerError):
    """The predictor raised, or returned something that is not Q-values of the right shape."""


class ManagerClosed(RunnerError):
    """The manager (or its inference thread) was closed while a call was waiting on it."""


class CallTimeout(RunnerError):
    """An env or predictor call has not returned within the manager's ``call_timeout``."""
