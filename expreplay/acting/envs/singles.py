"""How an acting group steps single envs (:class:`SingleEnvSteps`, the stepping of
:class:`~expreplay.acting.envs.single.SingleEnvAdapter`): one ``step_one`` call per env, their
results gathered into reused rows.

An acting group of single-env runners makes one ``step_one`` call per env (each env's own
``step``), and the rest of the step (the memory's checks, the write) on the whole batch:
:class:`SingleEnvSteps` makes those calls, keeps their results as arrays and hands them to the
group in one piece.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import Stepping, SteppedGroup
from ...storage._inputs import unstorable_frames, unstorable_rewards

__all__ = ['SingleEnvSteps']


class SingleEnvSteps(Stepping):
    """The steps of a group of single-env runners (one lane each: a lane is its runner's
    position): one ``step_one`` call per env, the results gathered into reused buffers (one
    row per runner stepped), the memory's rules checked on the whole batch. Pooled: runners
    of this kind share groups (:attr:`Stepping.pools_runners`)."""

    pools_runners = True

    def __init__(self, group: SteppedGroup) -> None:
        super().__init__(group)
        m = len(group.runners)
        self._format = frame_format = group.frame_format
        self._obs = np.zeros((m,) + frame_format.state_shape, frame_format.dtype)
        self._reward = np.zeros(m, np.float64)
        self._term = np.zeros(m, bool)
        self._trunc = np.zeros(m, bool)
        self._lives = np.zeros(m, np.int64)
        self._all_rows = (self._obs, self._reward, self._term, self._trunc, self._lives)
        # (frames, rewards, terminated, truncated, lives) of this step's members (sliced only
        # when some runners did not step), set by call().
        self.rows: tuple[np.ndarray, ...] = self._all_rows
        self.m = 0
        self.failed: list[tuple[int, BaseException]] = []

    def lanes(self, members: np.ndarray, eps: Any) -> tuple[np.ndarray, Any]:
        return members, eps            # one lane per runner, in runner order

    def step(self, members: np.ndarray, lanes: np.ndarray, actions: np.ndarray,
             failures: list[Any]) -> bool:
        group = self.group
        runners = group.runners
        adapters = [runners[k].adapter for k in members.tolist()]
        if self.call(adapters, actions) and group.store_rows(members, actions, self.rows, fast=True):
            return not group.has_ended     # the common case: no episode ended, nothing to reset
        self.check_batch()
        ok = np.ones(len(members), bool)
        for j, err in self.failed:
            if ok[j]:
                ok[j] = False
                group.fail(int(members[j]), 'step', err, failures)
        rows = np.flatnonzero(ok)
        if len(rows):
            group.store_rows(members[rows], actions[rows], tuple(a[rows] for a in self.rows))
        return False

    def call(self, adapters: Sequence[Any], actions: np.ndarray) -> bool:
        """Step ``adapters[j]`` (a :class:`~expreplay.acting.envs.single.SingleEnvAdapter`, its
        ``step_one``) with ``actions[j]``; ``failed`` lists ``(j, error)``. True when every env
        stepped and returned what the memory can store without a check."""
        obs_buf, rew, term, trunc, lives = self._obs, self._reward, self._term, self._trunc, self._lives
        fmt = self._format
        shape, dtype = fmt.state_shape, fmt.dtype
        failed: list[tuple[int, BaseException]] = []
        acts = actions.tolist()
        for j, adapter in enumerate(adapters):
            try:
                obs, rew[j], term[j], trunc[j], lives[j] = adapter.step_one(acts[j])
                if type(obs) is not np.ndarray or obs.shape != shape or obs.dtype != dtype:
                    obs = fmt(obs)
                obs_buf[j] = obs
            except Exception as err:
                failed.append((j, err))
        self.m = m = len(adapters)
        self.failed = failed
        # An attribute, not a method: the common step reads it once more per step otherwise.
        self.rows = self._all_rows if m == len(obs_buf) else tuple(a[:m] for a in self._all_rows)
        return not failed and unstorable_frames(self.rows[0], dtype) is None

    def check_batch(self) -> None:
        """The memory's rules for what the envs returned, checked on the whole batch at once;
        the members that broke them join :attr:`failed`."""
        m = self.m
        rew, obs = self._reward[:m], self._obs[:m]
        bad = unstorable_rewards(rew)
        if bad is not None:
            self.failed += [(j, ValueError(f"reward {rew[j]!r} is not finite or does not fit float32"))
                            for j in np.flatnonzero(bad).tolist()]
        bad = unstorable_frames(obs, self._format.dtype)
        if bad is not None:
            self.failed += [(j, ValueError("observation holds NaN or inf"))
                            for j in np.flatnonzero(bad).tolist()]
