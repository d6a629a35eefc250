"""The acting layer's settings: typed records, each default and check written once.

:class:`RunnerSettings` is what every :class:`~expreplay.EnvRunner` takes besides its env, its
seed and index, its factory, its episode-start scheduler and its callback;
:class:`ManagerSettings` is how an :class:`~expreplay.EnvRunnerManager` runs its runners. A
:class:`~expreplay.acting.population.Population` takes one of each (``runner=``, ``manager=``)
and hands them to what it builds. A record checks its values when it is made (the error names
the field) and can not be changed afterwards; a variant is ``dataclasses.replace(settings,
field=value)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from .._checks import check_bool, check_int, check_timeout

__all__ = ['RunnerSettings', 'ManagerSettings', 'DEFAULT_CLOSE_TIMEOUT']

#: Seconds :meth:`EnvRunnerManager.close <expreplay.EnvRunnerManager.close>` waits for the
#: threads, unless :attr:`ManagerSettings.close_timeout` says otherwise.
DEFAULT_CLOSE_TIMEOUT = 5.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerSettings:
    """How a runner acts on its env and stores what it sees.

    Args:
        life_loss_terminal (bool): Atari. A life lost (``info['lives']`` decreases) is stored as
            a terminated step and the next step starts a new episode in the memory, without
            resetting the env; the score counts the whole game, and the env is reset only when
            the game is over (the DQN convention).
        num_actions (int, optional): needed only when the player's action space is not
            Discrete; None: read from that space.
        close_player (bool): :meth:`EnvRunner.close <expreplay.EnvRunner.close>` also closes
            the player.
    """

    life_loss_terminal: bool = False
    num_actions: int | None = None
    close_player: bool = True

    def __post_init__(self) -> None:
        _store(self, 'life_loss_terminal', check_bool(self.life_loss_terminal, 'life_loss_terminal'))
        if self.num_actions is not None:
            _store(self, 'num_actions', check_int(self.num_actions, 'num_actions', 1))
        _store(self, 'close_player', check_bool(self.close_player, 'close_player'))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ManagerSettings:
    """How a manager runs its runners: threads, batching, faults and waits.

    Args:
        simulator_threads (int, optional): how many simulator threads step the runners, at
            most one per runner (the manager checks). None (default): chosen for what the
            runners are. Single-env runners (whose env steps hold the GIL, like single ALE
            envs) share one *pipelined* thread; each vector or asynchronous runner
            (``AtariVectorEnv``, EnvPool, Ray actors, whose engines step outside the GIL) gets
            a thread of its own (as the runner's adapter's stepping says:
            :attr:`~expreplay.acting.envs.Stepping.pools_runners`). The number of runners: one
            thread per runner, each stepping its runner alone (wins for envs that release the
            GIL while stepping, e.g. subprocess vector envs, when there are cores to spare).
            ``k`` in between: runner ``i`` goes to thread ``i % k``, pipelined.
        max_inference_batch (int): at most this many states per predictor call.
        max_restarts (int): times each runner may be restarted
            (:meth:`EnvRunner.restart <expreplay.EnvRunner.restart>`) after its env raised,
            instead of failing the manager. Counted in the manager's ``stats()``.
        close_timeout (float): seconds the manager's ``close()`` waits for the threads in total
            (``float('inf')``: as long as it takes).
        call_timeout (float): seconds an env call (step, reset, receive) or a predictor call
            may take before the manager fails with :class:`~expreplay.errors.CallTimeout`,
            raised from its ``step()`` and naming the thread and what it was doing
            (``float('inf')``: no limit). Not enforced inline (one runner): the call runs in
            the caller's own thread.
        thread_context (callable, optional): returns a context manager that every thread the
            manager starts enters first (e.g. ``lambda: sess.as_default()`` for TF1 sessions);
            the predictor runs in these threads. A population of one player steps inline: the
            thread that requests the steps (a stream's prefetch thread) enters it then.
    """

    simulator_threads: int | None = None
    max_inference_batch: int = 32
    max_restarts: int = 0
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT
    call_timeout: float = 120.0
    thread_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None

    def __post_init__(self) -> None:
        if self.simulator_threads is not None:
            _store(self, 'simulator_threads', check_int(self.simulator_threads, 'simulator_threads', 1))
        _store(self, 'max_inference_batch', check_int(self.max_inference_batch, 'max_inference_batch', 1))
        _store(self, 'max_restarts', check_int(self.max_restarts, 'max_restarts', 0))
        _store(self, 'close_timeout', check_timeout(self.close_timeout, 'close_timeout'))
        _store(self, 'call_timeout', check_timeout(self.call_timeout, 'call_timeout'))
        if self.call_timeout == 0:
            raise ValueError("call_timeout must be > 0 (float('inf'): no limit)")
        if self.thread_context is not None and not callable(self.thread_context):
            raise TypeError(f"thread_context must be a callable that returns a context manager "
                            f"(e.g. a contextlib.contextmanager function), got {self.thread_context!r}")


_Settings = TypeVar('_Settings', RunnerSettings, ManagerSettings)

# What each record's refusal suggests instead.
_EXAMPLES = {RunnerSettings: 'RunnerSettings(life_loss_terminal=True)',
             ManagerSettings: 'ManagerSettings(close_timeout=60)'}


def check_settings(value: Any, record: type[_Settings], name: str) -> _Settings:
    """``value`` if it is a ``record``; None gives the defaults, ``record()``. Anything else
    (a dict of keywords, say) is refused with a TypeError naming ``name`` and the record."""
    if value is None:
        return record()
    if not isinstance(value, record):
        raise TypeError(f"{name} must be a {record.__name__} (e.g. {_EXAMPLES[record]}), "
                        f"got {type(value).__name__}")
    return value


def _store(record: Any, field: str, value: Any) -> None:
    # The record is frozen: its checked, normalised values are stored past the freeze, once,
    # while it is being made.
    object.__setattr__(record, field, value)
