"""The adapters of vector envs: synchronous (:class:`VectorEnvAdapter`, a gymnasium ``VectorEnv``
in any autoreset mode, stepped by the protocol's own :class:`~expreplay.acting.envs.base.Stepping`)
and asynchronous (:class:`AsyncVectorAdapter`, ``recv`` / ``send``, stepped by
:class:`AsyncSteps`)."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import numpy as np

from .base import (NO_LIVES, EnvAdapter, Results, Stepping, _batch_size, _describe, _discrete_n, _flags,
                   _rewards, _started_results)

__all__ = ['VectorEnvAdapter', 'AsyncVectorAdapter', 'AsyncSteps']


class _VectorBase(EnvAdapter):
    """What the synchronous and asynchronous vector adapters share: spaces, lives, restarts."""

    def __init__(self, player: Any) -> None:
        self.player = player
        self.num_envs = int(player.num_envs)
        self.num_actions = _discrete_n(getattr(player, 'single_action_space', None))
        self._all = np.arange(self.num_envs, dtype=np.int64)
        self._all_bytes = self._all.tobytes()
        # Sub-envs whose episode ended: their next report is a start (NEXT_STEP autoreset).
        self._ended = np.zeros(self.num_envs, bool)

    def _lives(self, info, n):
        """Per-row lives from a batched info dict (gymnasium masks absent keys), or None."""
        lives = info.get('lives') if isinstance(info, dict) else None
        if lives is None:
            return None
        lives = np.asarray(lives, np.int64).reshape(n)
        mask = info.get('_lives')
        return lives if mask is None else np.where(mask, lives, NO_LIVES)

    @staticmethod
    def _restarted(info, n):
        """Rows whose remote actor was restarted (their episode was cut), or None."""
        restarted = info.get('restarted') if isinstance(info, dict) else None
        return None if restarted is None else np.asarray(restarted, bool).reshape(n)

    def _next_step_results(self, env_ids, obs, reward, terminated, truncated, info):
        """Results of a NEXT_STEP engine: a row of a sub-env that had ended is its start."""
        n = len(env_ids)
        terminated = _flags(terminated, n, 'player terminated')
        truncated = _flags(truncated, n, 'player truncated')
        ended = terminated | truncated
        restarted = self._restarted(info, n)
        # The common synchronous step (all sub-envs, none had ended, none restarted, none
        # ends) touches no mask: count_nonzero is a fraction of a fancy index's cost on a few
        # rows. An engine's subset is indexed always: an id out of range fails here, in recv.
        started = None
        if env_ids is not self._all or restarted is not None or np.count_nonzero(self._ended):
            started = self._ended[env_ids]
            if restarted is not None:
                started |= restarted
            if np.count_nonzero(started):
                ended &= ~started
            else:
                started = None
            self._ended[env_ids] = ended
        elif np.count_nonzero(ended):
            self._ended[env_ids] = ended
        return Results(env_ids, obs, _rewards(reward, n), terminated, truncated,
                       self._lives(info, n), started)


class VectorEnvAdapter(_VectorBase):
    """A gymnasium ``VectorEnv`` (any autoreset mode), stepped synchronously.

    * NEXT_STEP (gymnasium's default, ``AtariVectorEnv``'s, EnvPool's): the step that ends an
      episode returns the final observation; the next ``step`` resets that sub-environment,
      ignores its action and returns the reset observation -> a started row.
    * SAME_STEP: the ending step returns the reset observation and puts the final one in
      ``info['final_obs']`` -> a step row with the final observation, and the start from
      :meth:`reset_finished`.
    * DISABLED: :meth:`reset_finished` resets the finished sub-environments with
      ``reset(options={'reset_mask': ...})``.

    Rows are put in sub-env order by ``info['env_id']`` when the env reports it (EnvPool).
    ``info['restarted']`` (a remote actor was replaced, :class:`expreplay.ray.RayVectorEnv`)
    marks rows that start a new episode. Envs that return only part of the batch per step
    synchronously (``AtariVectorEnv(batch_size < num_envs)``) are refused.
    """

    def __init__(self, player: Any) -> None:
        super().__init__(player)
        batch = _batch_size(player)
        if batch is not None and 0 < batch != self.num_envs:
            raise ValueError(f"player {_describe(player)} returns batches of {batch} of its {self.num_envs} "
                             "sub-environments per step; use batch_size == num_envs")
        mode = (getattr(player, 'metadata', None) or {}).get('autoreset_mode', 'NextStep')
        self.mode = getattr(mode, 'value', mode)
        if self.mode not in ('NextStep', 'SameStep', 'Disabled'):
            raise ValueError(f"player {_describe(player)}: unknown autoreset_mode {mode!r}")
        self._same_step_resets: Results | None = None
        self.controls_resets = self.mode == 'Disabled'
        # ale_py's AtariVectorEnv takes seeds as an array over the sub-envs being reset (-1:
        # unseeded); gymnasium's vector envs as a list over all sub-envs (None: unseeded).
        self._ale_seeds = type(player).__module__.startswith('ale_py')

    def _seed_arg(self, seeds, mask=None):
        """The ``seed=`` argument of the player's reset for per-sub-env ``seeds`` (or an int)."""
        if seeds is None or isinstance(seeds, (int, np.integer)):
            return seeds
        if len(seeds) != self.num_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.num_envs} sub-environments")
        if all(s is None for s in seeds):
            return None
        if self._ale_seeds:
            picked = [s for i, s in enumerate(seeds) if mask is None or mask[i]]
            return np.array([-1 if s is None else int(s) for s in picked], np.int64)
        return [None if s is None else int(s) for s in seeds]

    def _in_env_order(self, obs, info, *arrays):
        ids = info.get('env_id') if isinstance(info, dict) else None
        if ids is None:
            return (obs,) + arrays
        ids = np.asarray(ids)
        # Most engines report their sub-envs in order: one bytes comparison (every step),
        # where argsort and a reduction cost ~10x as much.
        if ids.size == self.num_envs and ids.astype(np.int64, copy=False).tobytes() == self._all_bytes:
            return (obs,) + arrays
        order = np.argsort(ids)
        return tuple(np.asarray(a)[order] for a in (obs,) + arrays)

    def reset(self, seed: Any = None, options: dict[str, Any] | None = None) -> Results | None:
        kwargs = {'seed': self._seed_arg(seed)}
        if options is not None:
            kwargs['options'] = dict(options)   # a copy: vector envs pop keys from it
        obs, info = self.player.reset(**kwargs)
        (obs,) = self._in_env_order(obs, info)
        self._ended[:] = False
        self._same_step_resets = None
        return _started_results(self._all, obs, self._lives(info, self.num_envs))

    def step(self, actions: np.ndarray) -> Results:
        obs, reward, terminated, truncated, info = self.player.step(np.asarray(actions))
        obs, reward, terminated, truncated = self._in_env_order(obs, info, reward, terminated, truncated)
        if self.mode == 'NextStep':
            return self._next_step_results(self._all, obs, reward, terminated, truncated, info)
        n = self.num_envs
        terminated = _flags(terminated, n, 'player terminated')
        truncated = _flags(truncated, n, 'player truncated')
        ended = terminated | truncated
        lives = self._lives(info, n)
        if self.mode == 'SameStep' and ended.any():
            idx = np.flatnonzero(ended)
            final_lives = self._lives(info.get('final_info') or {}, n)
            self._same_step_resets = _started_results(
                idx, np.asarray(obs)[idx], None if lives is None else lives[idx])
            obs = np.array(obs)
            obs[idx] = np.stack([np.asarray(info['final_obs'][i]) for i in idx])
            if lives is not None:
                lives = lives.copy()
                lives[idx] = NO_LIVES if final_lives is None else final_lives[idx]
        self._ended |= ended
        return Results(self._all, obs, _rewards(reward, n), terminated,
                       truncated, lives, None)

    def reset_finished(self, starts: dict[int, tuple[Any, Any]] | None = None) -> Results | None:
        if self.mode == 'SameStep':
            resets, self._same_step_resets = self._same_step_resets, None
            if resets is not None:
                self._ended[resets.env_ids] = False
            return resets
        if self.mode == 'Disabled' and self._ended.any():
            if not starts:
                mask = self._ended.copy()
                obs, info = self.player.reset(options={'reset_mask': mask})
                self._ended[:] = False
                idx = np.flatnonzero(mask)
                lives = self._lives(info, self.num_envs)
                return _started_results(idx, np.asarray(obs)[idx], None if lives is None else lives[idx])
            return self._reset_masked(starts)
        return None

    def _reset_masked(self, starts):
        """Reset the ended sub-envs with their own seeds; one reset call per distinct options."""
        groups: list[tuple[Any, list[int]]] = []   # [(options, [indices])]: options are compared with ==
        for i in np.flatnonzero(self._ended):
            seed, options = starts.get(int(i), (None, None))
            for opts, members in groups:
                if opts == options:
                    members.append(int(i))
                    break
            else:
                groups.append((options, [int(i)]))
        ids, obs, lives = [], [], []
        for options, members in groups:
            mask = np.zeros(self.num_envs, bool)
            mask[members] = True
            seeds = [starts.get(i, (None, None))[0] if mask[i] else None for i in range(self.num_envs)]
            out, info = self.player.reset(seed=self._seed_arg(seeds, mask),
                                          options=dict(options or {}, reset_mask=mask))
            got = self._lives(info, self.num_envs)
            self._ended[mask] = False
            ids += members
            obs.append(np.asarray(out)[members])
            lives.append(np.full(len(members), NO_LIVES) if got is None else got[members])
        return _started_results(np.array(ids), np.concatenate(obs), np.concatenate(lives))


class AsyncSteps(Stepping):
    """The steps of an asynchronous engine (one runner per group): the first half of a step
    receives the ready sub-envs' results and stores them (their lanes act now), the second
    sends their next actions, and the engine steps the other sub-envs meanwhile."""

    one_runner = True

    def lanes(self, members: np.ndarray, eps: Any) -> tuple[np.ndarray, Any]:
        """Receive the ready sub-envs' results and store them: they are the lanes that act
        (the runner's lanes are the group's first, so a sub-env's index is its lane). Raises
        the :class:`~expreplay.errors.EnvError` of a failed receive."""
        group = self.group
        try:
            res = group.runners[0].adapter.recv()
            frames = group.frames_of(res)
        except Exception as err:
            raise group.fail(0, 'recv', err) from err
        group.store_results(0, res, frames, group.last_actions(res.env_ids))
        group.end_games()
        return res.env_ids, eps

    def step(self, members: np.ndarray, lanes: np.ndarray, actions: np.ndarray,
             failures: list[Any]) -> bool:
        """Send the received sub-envs' actions (their results come with a later receive, which
        ends their games: nothing else is due now)."""
        self._send(lanes, actions, failures)
        return True

    def abort(self, lanes: np.ndarray, actions: np.ndarray) -> None:
        # The received sub-envs wait for actions: send the random ones (stored as usual).
        self._send(lanes, actions, [])

    def _send(self, lanes: np.ndarray, actions: np.ndarray, failures: list[Any]) -> None:
        group = self.group
        group.note_actions(lanes, actions)
        try:
            group.runners[0].adapter.send(actions, lanes)
        except Exception as err:
            group.fail(0, 'send', err, failures)


class AsyncVectorAdapter(_VectorBase):
    """An engine with EnvPool's asynchronous API: ``async_reset()``, ``recv()``, ``send()``.

    EnvPool with ``batch_size < num_envs`` (its C++ threads step the other sub-envs while the
    runner predicts for the ones ``recv`` returned), :class:`expreplay.ray.RayVectorEnv` (remote
    actors), ale-py's ``AtariVectorEnv(batch_size < num_envs)`` (no ``async_reset``: its
    ``reset`` returns the first ready batch; ``send(actions)`` goes to the last batch
    received), or anything with the same methods. ``recv`` -> ``(obs, reward, terminated,
    truncated, info)`` for the ready sub-envs, ``info['env_id']`` saying which;
    ``send(actions, env_id)``. Autoreset is NEXT_STEP (EnvPool's): a sub-env that ended reports
    its next episode's first observation on its next ``recv``, its action ignored; a sub-env's
    first report is its first observation.

    EnvPool is seeded when it is made (``envpool.make(..., seed=s)``); a ``seed`` given to
    :meth:`reset` can not reach it and is ignored with a warning.
    """

    is_async = True
    controls_resets = False
    stepping = AsyncSteps
    plans_starts = False      # seeded when made; starts its episodes itself (autoreset)

    def __init__(self, player: Any) -> None:
        super().__init__(player)
        try:
            params = inspect.signature(player.send).parameters
            self._send_takes_ids = 'env_id' in params or len(params) >= 2
        except (TypeError, ValueError):
            self._send_takes_ids = True

    _in_flight = 0     # sub-envs sent actions whose results have not been received

    def reset(self, seed: Any = None, options: dict[str, Any] | None = None) -> None:
        if options is not None:
            raise TypeError(f"player {_describe(self.player)} is asynchronous: its resets take no "
                            f"options (got {options!r})")
        # Results still in flight (a runner closed or restarted mid-pipeline) are received and
        # dropped first: resetting an engine with steps in flight corrupts EnvPool's state.
        while self._in_flight > 0:
            self._in_flight -= len(self.player.recv()[1])
        self._in_flight = 0
        self._ended[:] = True     # every sub-env's first report is the start of an episode
        if not callable(getattr(self.player, 'async_reset', None)):
            obs, info = self.player.reset(seed=seed)      # ale-py: the first ready batch
            n = len(obs)
            self._first = (obs, np.zeros(n), np.zeros(n, bool), np.zeros(n, bool), info)
            self._in_flight = self.num_envs - n
            return None
        if seed is not None:
            warnings.warn(f"player {_describe(self.player)} is seeded when it is made (e.g. "
                          f"envpool.make(..., seed=...)); reset seed {seed!r} is ignored",
                          RuntimeWarning, stacklevel=3)
        self.player.async_reset()
        self._in_flight = self.num_envs        # every sub-env's first observation is coming

    _first: tuple[Any, ...] | None = None   # ale-py: the first ready batch, returned by reset()

    def recv(self) -> Results:
        if self._first is not None:
            out, self._first = self._first, None
        else:
            out = self.player.recv()
            self._in_flight -= len(out[1])
        obs, reward, terminated, truncated, info = out
        env_ids = np.asarray(info['env_id'], np.int64)
        return self._next_step_results(env_ids, obs, reward, terminated, truncated, info)

    def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
        if self._send_takes_ids:
            self.player.send(actions, env_ids)
        else:
            self.player.send(actions)
        self._in_flight += len(env_ids)
