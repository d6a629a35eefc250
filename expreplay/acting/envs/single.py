"""The adapter of one environment, gymnasium API or old gym API (:class:`SingleEnvAdapter`)."""

from __future__ import annotations

import inspect
import math
from typing import Any, NoReturn

import numpy as np

from .base import (_ENV0, NO_LIVES, EnvAdapter, Results, _describe, _discrete_n, _flag,
                   _lives_from_info, _reward, _started_results)
from .singles import SingleEnvSteps

__all__ = ['SingleEnvAdapter']


class SingleEnvAdapter(EnvAdapter):
    """One environment with the gymnasium API or the old gym API (detected).

    Besides the protocol, :meth:`step_one` and :meth:`reset_one` work on scalars: its stepping,
    :class:`~expreplay.acting.envs.singles.SingleEnvSteps`, steps several single envs one call
    each and gathers their results into arrays itself.

    Args:
        player: the environment.
        api: ``'gymnasium'``, ``'old'``, or None to detect it from the first ``reset()``.
    """

    num_envs = 1
    stepping = SingleEnvSteps

    def __init__(self, player: Any, api: str | None = None) -> None:
        self.player = player
        self.api = api
        self.num_actions = _discrete_n(getattr(player, 'action_space', None))
        self._done = False
        self._step = player.step
        try:
            params = inspect.signature(player.reset).parameters
            self._reset_takes_seed = 'seed' in params or any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        except (TypeError, ValueError):  # builtins without a signature
            self._reset_takes_seed = False

    def reset(self, seed: Any = None, options: dict[str, Any] | None = None) -> Results:
        obs, lives = self.reset_one(seed, options)
        return _started_results(_ENV0, obs[None], None if lives == NO_LIVES else np.array([lives]))

    def reset_one(self, seed: int | None = None,
                  options: dict[str, Any] | None = None) -> tuple[np.ndarray, int]:
        """Reset; ``(first observation, lives or NO_LIVES)``."""
        self._done = False
        p = self.player
        if self.api == 'gymnasium' or (self.api is None and self._reset_takes_seed):
            kwargs: dict[str, Any] = {}
            if seed is not None:
                kwargs['seed'] = seed
            if options is not None:
                kwargs['options'] = options
            result = p.reset(**kwargs)
        else:
            if options is not None:
                raise TypeError(f"player {_describe(p)} has the old gym API: its reset() takes no "
                                f"options (got {options!r})")
            if seed is not None and callable(getattr(p, 'seed', None)):
                p.seed(seed)
            result = p.reset()
        is_new = isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)
        if self.api is None:
            self.api = 'gymnasium' if is_new else 'old'
        if self.api == 'gymnasium':
            if not is_new:
                raise TypeError(f"player {_describe(p)}: reset() returned {type(result).__name__}, "
                                "expected (obs, info) from a gymnasium-API env")
            obs, info = result
            return np.asarray(obs), _lives_from_info(info)
        return np.asarray(result), NO_LIVES

    def step_one(self, action: int) -> tuple[Any, float, bool, bool, int]:
        """Step with ``action``: ``(obs, reward, terminated, truncated, lives or NO_LIVES)``."""
        if self._done:
            raise RuntimeError("SingleEnvAdapter.step after the episode ended without a reset")
        result = self._step(action)
        if type(result) is not tuple or len(result) != (5 if self.api == 'gymnasium' else 4):
            self._bad_step_result(result)
        if self.api == 'gymnasium':
            obs, reward, terminated, truncated, info = result
            if type(terminated) is not bool or type(truncated) is not bool:
                terminated = _flag(terminated, f"player {_describe(self.player)}: step()'s terminated")
                truncated = _flag(truncated, f"player {_describe(self.player)}: step()'s truncated")
        else:
            obs, reward, done, info = result
            if type(done) is not bool:
                done = _flag(done, f"player {_describe(self.player)}: step()'s done")
            # Old gym's TimeLimit marks a time-limit end in info; such an end bootstraps.
            truncated = done and bool(isinstance(info, dict) and info.get('TimeLimit.truncated', False))
            terminated = done and not truncated
        reward = _reward(reward, f"player {_describe(self.player)}: step()'s reward")
        self._done = terminated or truncated
        lives = info.get('lives') if info and type(info) is dict else None
        return obs, reward, terminated, truncated, NO_LIVES if lives is None else int(lives)

    def _bad_step_result(self, result: Any) -> NoReturn:
        if not isinstance(result, tuple) or len(result) not in (4, 5):
            raise TypeError(f"player {_describe(self.player)}: step() returned "
                            f"{type(result).__name__} of length {len(result) if isinstance(result, tuple) else '?'}, "
                            "expected a 5-tuple (gymnasium) or a 4-tuple (old gym)")
        raise TypeError(f"player {_describe(self.player)}: reset() and step() disagree on the API "
                        f"(reset looked {self.api!r}, step returned a {len(result)}-tuple)")

    def step(self, actions: Any) -> Results:
        obs, reward, terminated, truncated, lives = self.step_one(int(actions[0]))
        return Results(_ENV0, np.asarray(obs)[None], np.array([float(reward)]), np.array([terminated]),
                       np.array([truncated]), None if lives == NO_LIVES else np.array([lives]), None)

    def reset_finished(self, starts: dict[int, tuple[Any, Any]] | None = None) -> Results | None:
        if not self._done:
            return None
        # Without a start: no seed, so the env continues its own random sequence.
        seed, options = (starts or {}).get(0, (None, None))
        return self.reset(seed, options)


    def _ale(self) -> Any:
        # Gymnasium's (and old gym's) Atari envs expose their ALEInterface as `unwrapped.ale`.
        ale = getattr(getattr(self.player, 'unwrapped', None), 'ale', None)
        return ale if callable(getattr(ale, 'cloneState', None)) else None

    @property
    def can_clone_state(self) -> bool:
        return self._ale() is not None

    def clone_state(self, i: int, include_rng: bool = False) -> Any:
        ale = self._ale()
        if ale is None:
            return super().clone_state(i, include_rng)
        return ale.cloneState(include_rng=include_rng)

    def restore_state(self, i: int, state: Any, prev_action: int | None = None) -> None:
        ale = self._ale()
        if ale is None:
            return super().restore_state(i, state, prev_action)
        sticky = ale.getFloat('repeat_action_probability')
        if prev_action is not None and sticky > 0:
            self._prime_sticky_action(ale, int(prev_action), sticky)
        ale.restoreState(state)

    def _prime_sticky_action(self, ale: Any, action: int, sticky: float) -> None:
        """Make ``action`` the one that sticky actions repeat, as it was when the state was saved.

        ALE keeps that action outside its saved state (``StellaEnvironment::m_actions``, set to
        NOOP by the reset), so a restore alone would repeat NOOP where the original repeated its
        last action. Each emulated frame takes the given action with probability ``1 - sticky``:
        act it until it has taken with certainty (< 1e-9 left); the restore that follows
        overwrites those frames (and the RNG, if the state holds it).
        """
        unwrapped = self.player.unwrapped
        action_set = getattr(unwrapped, '_action_set', None)
        if action_set is None:
            action_set = ale.getMinimalActionSet()
        frames = 1 if sticky >= 1.0 else min(200, math.ceil(math.log(1e-9) / math.log(sticky)))
        for _ in range(frames):
            ale.act(action_set[action])
