"""The adapters' protocol (:class:`EnvAdapter`), what they return (:class:`Results`), how an
acting group steps them (:class:`Stepping`, the strategy of an env kind), and the rules every
adapter holds an env's flags and rewards to."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import numpy as np

from ..._checks import check_bool
from ...storage._inputs import check_reward, check_rewards

__all__ = ['Results', 'EnvAdapter', 'Stepping', 'SteppedGroup', 'NO_LIVES']

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


class SteppedGroup(Protocol):
    """What a :class:`Stepping` uses of the acting group it steps for
    (:class:`~expreplay.acting.group.ActingGroup`): the group stores, the stepping makes the env
    calls. ``k`` is a runner's position in :attr:`runners`."""

    runners: list[Any]
    runner_lanes: list[np.ndarray]

    @property
    def frame_format(self) -> Any: ...

    @property
    def has_ended(self) -> bool: ...

    def frames_of(self, res: Results) -> np.ndarray: ...

    def store_results(self, k: int, res: Results, frames: np.ndarray, actions: np.ndarray) -> None: ...

    def store_rows(self, lanes: np.ndarray, actions: np.ndarray, rows: tuple[np.ndarray, ...],
                   fast: bool = False) -> bool: ...

    def fail(self, k: int, what: str, err: BaseException, failures: list[Any] | None = None
             ) -> Any: ...

    def end_games(self) -> None: ...

    def last_actions(self, env_ids: np.ndarray) -> np.ndarray: ...

    def note_actions(self, lanes: np.ndarray, actions: np.ndarray) -> None: ...


class Stepping:
    """How an acting group steps the envs of one kind: the strategy an adapter class names
    (:attr:`EnvAdapter.stepping`, so :func:`~expreplay.acting.envs.adapt_env` chooses it with
    the adapter), built once per group over its runners, which are all of that kind.

    This one is the protocol's own: each runner's adapter stepped with one
    ``step(actions)`` call (a vector env's sub-envs at once), its :class:`Results` handed to
    the group. A kind with other calls (one env call per single env, ``recv`` / ``send``)
    subclasses it in its adapter's module; the group and the manager read only what is
    here, never the kind.

    Class attributes, read when groups are planned and built:
        pools_runners: runners of this kind are pooled: a manager puts those that share a
            predictor, memory and action count into shared groups on one pipelined thread
            (their env calls hold the GIL). False: a runner is a group, and by default a
            thread, of its own (its engine steps outside the GIL).
        one_runner: a group of this kind holds one runner only.
    """

    pools_runners = False
    one_runner = False

    def __init__(self, group: SteppedGroup) -> None:
        self.group = group

    def lanes(self, members: np.ndarray, eps: Any) -> tuple[np.ndarray, Any]:
        """The first half of a step of ``members`` (runner positions), after the resets: the
        lanes that act now, and ``eps`` (one probability, or one per member) for them."""
        group = self.group
        if len(members) == 1:
            return group.runner_lanes[members[0]], eps
        lanes = np.concatenate([group.runner_lanes[k] for k in members])
        if isinstance(eps, np.ndarray):
            eps = np.repeat(eps, [group.runners[k].num_envs for k in members])
        return lanes, eps

    def step(self, members: np.ndarray, lanes: np.ndarray, actions: np.ndarray,
             failures: list[Any]) -> bool:
        """The second half: act ``actions`` in ``lanes`` (as :meth:`lanes` returned them) and
        hand the results to the group; a runner whose env failed joins ``failures`` (through
        the group's ``fail``). True when nothing else is due this step (no
        episode ended: the group need not look for games to end and envs to reset)."""
        group = self.group
        runners = group.runners
        offset = 0
        for k in members.tolist():
            runner = runners[k]
            acts = actions[offset:offset + runner.num_envs]
            offset += runner.num_envs
            try:
                res = runner.adapter.step(acts)
                frames = group.frames_of(res)
            except Exception as err:
                group.fail(k, 'step', err, failures)
                continue
            group.store_results(k, res, frames, acts[res.env_ids])
        return False

    def abort(self, lanes: np.ndarray, actions: np.ndarray) -> None:
        """A step begun (its random ``actions`` drawn for ``lanes``) whose Q-values will not
        come: what the envs need (nothing, unless they wait for actions)."""


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

    ``stepping``: the :class:`Stepping` an acting group steps adapters of this class with (the
    kind's calls are the stepping's business; the group makes none of its own).
    ``plans_starts``: an episode-start scheduler's seeds and options reach this adapter's
    resets (False: the env is seeded when it is made, and starts its episodes itself).
    """

    player: Any = None
    num_envs = 1
    num_actions: int | None = None   # from the action space when it is Discrete, else None
    controls_resets = True   # False when the env resets finished sub-envs by itself (autoreset)
    is_async = False
    stepping: type[Stepping] = Stepping
    plans_starts = True

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
