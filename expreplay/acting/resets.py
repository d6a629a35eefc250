"""How an acting group's episodes start: env resets, scheduled starts, restored states.

:class:`LaneResets` resets a runner's sub-envs (the first step, after a failure or a restart,
and the finished ones after a step), asks the runner's episode-start scheduler how each game
starts (seed, options, a saved state to restore), and names the env call running now for a
manager's watchdog (:attr:`LaneResets.current_call`). It returns the starts (lanes, first
frames, lives, :class:`~expreplay.acting.starts.EpisodeStart` s) to the acting group, which
hands them to its lanes (:class:`~expreplay.acting.lanes.LaneEpisodes`): the two are peers
the group composes, neither knows the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .envs import NO_LIVES, FrameFormat
from .runner import EnvRunner
from .starts import EpisodeStart
from ..errors import EnvError

__all__ = ['LaneResets', 'Starts', 'env_error']

# How episodes start when no scheduler decides: an unseeded reset, or the env's own autoreset.
PLAIN_RESET = EpisodeStart()
AUTORESET = EpisodeStart(kind='autoreset')

# New episodes for the group's lanes: (lanes, first frames, lives, one EpisodeStart per lane).
Starts = tuple[np.ndarray, np.ndarray, np.ndarray, list[EpisodeStart]]


def env_error(runner: EnvRunner, what: str, err: BaseException) -> EnvError:
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
    """Resets of the runners ``runners`` whose lanes are ``runner_lanes``; frames in
    ``frame_format``. A reset returns the :data:`Starts` it made (None: an asynchronous engine
    reports its starts with its results)."""

    def __init__(self, runners: Sequence[EnvRunner], runner_lanes: Sequence[np.ndarray],
                 frame_format: FrameFormat) -> None:
        self.runners = list(runners)
        self.runner_lanes = list(runner_lanes)
        self._format = frame_format
        # (what, runner) of the env call running now through _env_call (a reset, a restore...),
        # else None: what a manager's watchdog names when the call hangs.
        self.current_call: tuple[str, EnvRunner] | None = None

    def _env_call(self, runner: EnvRunner, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        self.current_call = (what, runner)
        try:
            return fn(*args)
        except Exception as err:
            raise env_error(runner, what, err) from err
        finally:
            self.current_call = None

    def _plan(self, runner: EnvRunner, env_index: int, episode_index: int) -> EpisodeStart:
        """Ask the scheduler how to start sub-env ``env_index``'s game ``episode_index``."""
        start = runner.episode_starts.start(runner.index, int(env_index), int(episode_index))
        if not isinstance(start, EpisodeStart):
            raise TypeError(f"episode_starts.start() must return an EpisodeStart, got {start!r}")
        return start

    def reset_runner(self, k: int, episode_indices: np.ndarray) -> Starts | None:
        """Reset every sub-env of runner ``k`` (first step, after a failure or a restart);
        ``episode_indices``: the index of each sub-env's next game."""
        runner = self.runners[k]
        lanes = self.runner_lanes[k]
        adapter = runner.adapter
        n = runner.num_envs
        if runner.episode_starts is not None and not adapter.is_async:
            starts = [self._plan(runner, i, episode_indices[i]) for i in range(n)]
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
            return None
        frames = self._env_call(runner, 'reset', self._format.batch, res.obs, n)
        lives = res.lives if res.lives is not None else np.full(n, NO_LIVES)
        frames, lives = self._restore_where_planned(runner, starts, frames, lives)
        return lanes, frames, lives, starts

    def reset_finished(self, k: int, finished: np.ndarray, episode_indices: np.ndarray
                       ) -> Starts | None:
        """Start new games in runner ``k``'s sub-envs whose games ended (after a step):
        ``finished[i]`` for sub-env ``i``, whose next game is ``episode_indices[i]``."""
        runner = self.runners[k]
        adapter = runner.adapter
        lanes = self.runner_lanes[k]
        planned = None
        if runner.episode_starts is not None and adapter.controls_resets:
            planned = {int(i): self._plan(runner, int(i), episode_indices[i])
                       for i in np.flatnonzero(finished)}
        if planned:
            plan = {i: (s.seed, s.options) for i, s in planned.items()}
            res = self._env_call(runner, 'reset', adapter.reset_finished, plan)
        else:
            res = self._env_call(runner, 'reset', adapter.reset_finished)
        if res is None:
            return None
        frames = self._env_call(runner, 'reset', self._format.batch, res.obs, len(res.env_ids))
        lives = res.lives if res.lives is not None else np.full(len(res.env_ids), NO_LIVES)
        if planned:
            starts = [planned[int(i)] for i in res.env_ids]
        else:
            starts = [PLAIN_RESET if adapter.controls_resets or not runner.is_vector else AUTORESET
                      ] * len(res.env_ids)
        frames, lives = self._restore_where_planned(runner, starts, frames, lives,
                                                    env_ids=res.env_ids)
        return lanes[res.env_ids], frames, lives, starts

    def _restore_where_planned(self, runner: EnvRunner, starts: list[EpisodeStart], frames: np.ndarray,
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
