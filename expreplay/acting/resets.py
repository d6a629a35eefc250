"""How an acting group's episodes start: env resets, scheduled starts, restored states.

:class:`LaneResets` resets a runner's sub-envs (the first step, after a failure or a restart,
and the finished ones after a step), asks the runner's episode-start scheduler how each game
starts (seed, options, a saved state to restore), and names the env call running now for a
manager's watchdog (:attr:`LaneResets.current_call`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .envs import NO_LIVES, FrameFormat
from .episodes import EpisodeStart
from .lanes import LaneEpisodes
from .member import GroupMember
from ..errors import EnvError

__all__ = ['LaneResets', 'env_error']

# How episodes start when no scheduler decides: an unseeded reset, or the env's own autoreset.
PLAIN_RESET = EpisodeStart()
AUTORESET = EpisodeStart(kind='autoreset')


def env_error(runner: GroupMember, what: str, err: BaseException) -> EnvError:
    """``err`` (raised by ``runner``'s env in ``what``) as an :class:`EnvError` naming the runner."""
    if isinstance(err, EnvError):
        err.runner = runner
        return err
    out = EnvError(f"player {type(runner.player).__name__} of runner {runner.index} raised "
                   f"in {what}: {err!r}")
    out.__cause__ = err
    out.runner = runner
    return out


class LaneResets:
    """Resets of the runners ``runners`` whose lanes are ``runner_lanes`` in ``lanes``."""

    def __init__(self, runners: Sequence[GroupMember], runner_lanes: Sequence[np.ndarray],
                 lanes: LaneEpisodes, frame_format: FrameFormat) -> None:
        self.runners = list(runners)
        self.runner_lanes = list(runner_lanes)
        self._lanes = lanes
        self._format = frame_format
        # (what, runner) of the env call running now through _env_call (a reset, a restore...),
        # else None: what a manager's watchdog names when the call hangs.
        self.current_call: tuple[str, GroupMember] | None = None

    def _env_call(self, runner: GroupMember, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        self.current_call = (what, runner)
        try:
            return fn(*args)
        except Exception as err:
            raise env_error(runner, what, err) from err
        finally:
            self.current_call = None

    def _plan(self, runner: GroupMember, env_index: int, lane: int) -> EpisodeStart:
        """Ask the scheduler how to start sub-env ``env_index``'s next game."""
        start = runner.episode_starts.start(runner.index, int(env_index),
                                            self._lanes.episode_index(lane))
        if not isinstance(start, EpisodeStart):
            raise TypeError(f"episode_starts.start() must return an EpisodeStart, got {start!r}")
        return start

    def reset_runner(self, k: int) -> None:
        """Reset every sub-env of runner ``k`` (first step, after a failure or a restart)."""
        runner = self.runners[k]
        lanes = self.runner_lanes[k]
        self._lanes.close(lanes)
        adapter = runner.adapter
        n = runner.num_envs
        if runner.episode_starts is not None and not adapter.is_async:
            starts = [self._plan(runner, i, int(lanes[i])) for i in range(n)]
            options = [s.options for s in starts]
            if any(o != options[0] for o in options[1:]):
                raise ValueError(f"runner {runner.index}: a vector env resets all its sub-envs with one "
                                 f"options dict; the scheduler gave {options}")
            seeds = starts[0].seed if n == 1 else [s.seed for s in starts]
            res = self._env_call(runner, 'reset', adapter.reset, seeds, options[0])
        else:
            seed = runner.take_first_seed()
            res = self._env_call(runner, 'reset', adapter.reset, seed)
            # An int seed starts sub-env i with seed + i (gymnasium's vector convention).
            starts = [PLAIN_RESET if seed is None else EpisodeStart(seed + i) for i in range(n)]
        if res is None:                  # asynchronous: the starts arrive with recv()
            return
        frames = self._env_call(runner, 'reset', self._format.batch, res.obs, n)
        lives = res.lives if res.lives is not None else np.full(n, NO_LIVES)
        frames, lives = self._restore_where_planned(runner, starts, frames, lives)
        self._lanes.start(lanes, frames, lives, starts)

    def reset_finished(self, k: int) -> None:
        """Start new games in runner ``k``'s sub-envs whose games ended (after a step)."""
        runner = self.runners[k]
        adapter = runner.adapter
        lanes = self.runner_lanes[k]
        planned = None
        if runner.episode_starts is not None and adapter.controls_resets:
            planned = {int(i): self._plan(runner, int(i), int(lanes[i]))
                       for i in np.flatnonzero(~self._lanes.open[lanes])}
        if planned:
            plan = {i: (s.seed, s.options) for i, s in planned.items()}
            res = self._env_call(runner, 'reset', adapter.reset_finished, plan)
        else:
            res = self._env_call(runner, 'reset', adapter.reset_finished)
        if res is None:
            return
        frames = self._env_call(runner, 'reset', self._format.batch, res.obs, len(res.env_ids))
        lives = res.lives if res.lives is not None else np.full(len(res.env_ids), NO_LIVES)
        if planned:
            starts = [planned[int(i)] for i in res.env_ids]
        else:
            starts = [PLAIN_RESET if adapter.controls_resets or not runner.is_vector else AUTORESET
                      ] * len(res.env_ids)
        frames, lives = self._restore_where_planned(runner, starts, frames, lives,
                                                    env_ids=res.env_ids)
        self._lanes.start(lanes[res.env_ids], frames, lives, starts)

    def _restore_where_planned(self, runner: GroupMember, starts: list[EpisodeStart], frames: np.ndarray,
                               lives: np.ndarray, env_ids: np.ndarray | None = None
                               ) -> tuple[np.ndarray, np.ndarray]:
        """After the reset of a restart: restore the saved state, whose first frame is saved."""
        if not any(s.restore is not None for s in starts):
            return frames, lives
        frames, lives = frames.copy(), lives.copy()
        for j, s in enumerate(starts):
            point = s.restore
            if point is None:
                continue
            i = j if env_ids is None else int(env_ids[j])
            self._env_call(runner, 'restore', runner.adapter.restore_state, i, point.state,
                           point.action)
            # ALE keeps its pre-restore screen until the next act(): the frame saved with the
            # state is what the observation pipeline produced for it.
            frames[j] = point.frame
            lives[j] = NO_LIVES if point.lives is None else point.lives
        return frames, lives

    def env_state(self, runner_index: int, env_index: int, include_rng: bool = False) -> Any:
        """The emulator state of sub-env ``env_index`` of ``runners[runner_index]``, now."""
        runner = self.runners[runner_index]
        return self._env_call(runner, 'clone_state', runner.adapter.clone_state, env_index,
                              include_rng)
