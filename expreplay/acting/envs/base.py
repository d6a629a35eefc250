"""The adapters' protocol (:class:`EnvAdapter`), what they return (:class:`Results`), and the
rules every adapter holds an env's flags and rewards to."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..._checks import check_bool
from ...storage._inputs import check_reward, check_rewards

__all__ = ['Results', 'EnvAdapter', 'NO_LIVES']

NO_LIVES = -1   # lives value of a sub-env that reports none


class Results(NamedTuple):
    """What some sub-environments reported, row ``j`` for sub-env ``env_ids[j]``.

    A row is either a *step* (the sub-env took the action it was given: ``obs`` is the
    observation after it, the final observation when the episode ended, also for a truncated
    end) or, where ``started[j]``, the *first observation of a new episode* (after a reset, an
    autoreset, or a restarted remote actor; ``reward`` / ``terminated`` / ``truncated`` are
    meaningless there, and an episode the sub-env was in ends without a further step).
    ``lives`` is ``info['lives']`` per row (Atari), :data:`NO_LIVES` where none is reported,
    or None when the env reports none at all. ``started`` None means no row is a start.
    """
    env_ids: np.ndarray
    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    lives: np.ndarray | None
    started: np.ndarray | None


def _started_results(env_ids: Any, obs: Any, lives: np.ndarray | None) -> Results:
    n = len(env_ids)
    return Results(np.asarray(env_ids, np.int64), obs, np.zeros(n), np.zeros(n, bool),
                   np.zeros(n, bool), lives, np.ones(n, bool))


def _flag(value: Any, name: str) -> bool:
    """One flag an env returned (``terminated``, ``truncated``, ``done``) as a bool.

    The rule (:func:`~expreplay._checks.check_bool`'s, the writers' too): a flag is a bool, a
    numpy bool (also as a 0-d array), or the integer 0 or 1 (what C-backed envs return);
    anything else is refused naming the flag, since ``bool()`` would read the string
    ``'False'`` as True and a float or an array by rules that are not the env's.
    """
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    return check_bool(value, name)


def _flags(values: Any, n: int, name: str) -> np.ndarray:
    """``n`` flags of a vector env as a bool array: the rule of :func:`_flag` for each."""
    arr = np.asarray(values)
    if arr.dtype != np.bool_:
        if arr.dtype.kind not in 'iu' or ((arr != 0) & (arr != 1)).any():
            raise TypeError(f"{name} must be bools (or integers 0 and 1), got "
                            f"{arr.dtype} {arr.ravel()[:4].tolist()}")
        arr = arr.astype(bool)
    return arr.reshape(n)


def _reward(value: Any, name: str = 'player reward') -> float:
    """One reward an env returned: integers are held to the memory's rule (float32 must hold
    them exactly, :func:`expreplay.storage._inputs.check_reward`) before they become floats; floats go
    on to the runner's range check."""
    if type(value) is float:
        return value
    return check_reward(value, name)


def _rewards(values: Any, n: int, name: str = 'player rewards') -> np.ndarray:
    """``n`` rewards of a vector env as float64, integers held to the memory's rule first."""
    arr = np.asarray(values)
    if arr.dtype.kind != 'f':
        arr = check_rewards(arr, name)
    return arr.astype(np.float64).reshape(n)


def _lives_from_info(info: Any) -> int:
    lives = info.get('lives') if isinstance(info, dict) else None
    return NO_LIVES if lives is None else int(lives)


class EnvAdapter:
    """What a runner needs from an environment, whatever its API.

    Synchronous adapters (``is_async`` False):
        ``reset(seed=None, options=None)`` -> :class:`Results` of every sub-env, all started.
        ``seed`` is an int (a vector env seeds its sub-envs ``seed + i``) or, for a vector env,
        a list of one seed (or None) per sub-env; ``options`` goes to ``reset(options=...)``.
        ``step(actions)`` -> :class:`Results` of every sub-env. A sub-env whose episode ended
        is not stepped again before it reports a start: in NEXT_STEP autoreset the next
        ``step`` ignores its action and reports the start; otherwise
        ``reset_finished(starts=None)`` -> :class:`Results` (or None) starts the finished ones
        that can be reset now. It is called after the runner stored the step, so that a
        reset failure can not lose a stepped transition. ``starts`` = {index: (seed, options)}
        resets those sub-envs that way; only meaningful when ``controls_resets`` is True (the
        adapter, not the env, decides when to reset).
    Asynchronous adapters (``is_async`` True): ``reset(seed=None)`` starts the engine and
        returns None; ``recv()`` -> :class:`Results` of the sub-envs that are ready (the first
        time: started); ``send(actions, env_ids)`` gives them their next actions.
    Both: ``close()``; ``can_clone_state``, ``clone_state(i, include_rng=False)``,
    ``restore_state(i, state, prev_action=None)``: emulator snapshots (ALE), for restart points.
    """

    player: Any = None
    num_envs = 1
    num_actions: int | None = None   # from the action space when it is Discrete, else None
    controls_resets = True   # False when the env resets finished sub-envs by itself (autoreset)
    is_async = False

    def reset(self, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> Results | None:
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> Results:
        raise NotImplementedError

    def reset_finished(self, starts: dict[int, tuple[Any, Any]] | None = None) -> Results | None:
        return None

    @property
    def can_clone_state(self) -> bool:
        return False

    def clone_state(self, i: int, include_rng: bool = False) -> Any:
        raise NotImplementedError(f"{type(self).__name__} can not clone emulator states")

    def restore_state(self, i: int, state: Any, prev_action: int | None = None) -> None:
        raise NotImplementedError(f"{type(self).__name__} can not restore emulator states")

    def close(self) -> None:
        close = getattr(self.player, 'close', None)
        if callable(close):
            close()


def _discrete_n(space: Any) -> int | None:
    n = getattr(space, 'n', None)
    return None if n is None else int(n)


def _describe(player: Any) -> str:
    return f"{type(player).__module__}.{type(player).__qualname__}"


def _batch_size(player: Any) -> int | None:
    batch = getattr(player, 'batch_size', None)
    if batch is None:
        config = getattr(player, 'config', None)     # EnvPool keeps it in its config dict
        if isinstance(config, dict):
            batch = config.get('batch_size')
    return int(batch) if isinstance(batch, (int, np.integer)) else None


_ENV0 = np.zeros(1, np.int64)
