"""The episodes of an acting group's lanes, and how their steps reach the memory.

:class:`LaneEpisodes` is the one object of the acting path that knows how data is stored (as
Acme's adders are for its actors): it owns the group's
:class:`~expreplay.storage.writers.BatchWriter` and :class:`~expreplay.acting.envs.FrameHistory`,
and per lane the episode's bookkeeping (open or not, score, length, lives, the start it had).
It writes a batch of steps, starts and ends episodes, turns a lost life into a new training
episode when asked, and collects an :class:`~expreplay.acting.episodes.EpisodeRecord` for every
finished game, emitted once the step is stored.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .envs import NO_LIVES, FrameHistory
from .records import make_record
from .runner import EnvRunner
from .starts import EpisodeStart, RestartPoint

__all__ = ['LaneEpisodes']


class LaneEpisodes:
    """Per-lane episodes of the runners ``runners`` (lane ``runner_lanes[k][i]`` is sub-env ``i``
    of ``runners[k]``), written through ``memory.new_batch_writer``.

    ``open[lane]`` (read-only outside) is True while the lane is inside an episode the memory
    records. ``env_state(runner_position, env_index, include_rng)`` returns the env's state for a restart point, which
    a scheduler that observes steps takes through the snapshot it is handed (see
    :class:`~expreplay.acting.episodes.RestartPool`).
    """

    def __init__(self, runners: Sequence[EnvRunner], memory: Any, frame_shape: tuple[int, ...],
                 dtype: np.dtype, env_state: Callable[[int, int, bool], Any]) -> None:
        self.runners = list(runners)
        sizes = [r.num_envs for r in self.runners]
        n = int(sum(sizes))
        self._lane_runner = np.repeat(np.arange(len(self.runners)), sizes)
        self._lane_env = np.concatenate([np.arange(s) for s in sizes])
        self._writer = memory.new_batch_writer(n)
        self._history = FrameHistory(n, frame_shape, memory.history_len, dtype)
        self.open = np.zeros(n, bool)
        self._score = np.zeros(n, np.float64)
        self._length = np.zeros(n, np.int64)
        self._lives = np.full(n, NO_LIVES, np.int64)
        self._life_losses = np.zeros(n, np.int64)
        self._life_loss_terminal = np.repeat([r.life_loss_terminal for r in self.runners], sizes)
        self._games_started = np.zeros(n, np.int64)
        self._episode_info: list[tuple[int, EpisodeStart, float] | None] = [None] * n
        self._last_actions = np.zeros(n, np.int64)   # for restart points; async: what was sent
        observers = [(k, getattr(r.episode_starts, 'observe_step', None))
                     for k, r in enumerate(self.runners)]
        self._observers = {k: f for k, f in observers if f is not None}
        self._finished: list[tuple[EnvRunner, Any]] = []   # records of this step, emitted after it
        self._env_state = env_state
        self._snapshots = [_Snapshot(self, lane) for lane in range(n)]
        # The acting kernel the history took when built just above, as the writer took its
        # binding (one moment, expreplay._kernels): the fast step needs both.
        self._kernel = self._history.kernel

    # ------------------------------------------------------------------ reading
    def states(self, lanes: np.ndarray) -> np.ndarray:
        """The predictor's input for ``lanes``: ``(len(lanes), *state_shape, history_len)``."""
        return self._history.states(lanes)

    def episode_indices(self, lanes: np.ndarray) -> np.ndarray:
        """How many games each of ``lanes`` has started (the index of its next one): a copy."""
        return self._games_started[lanes]

    def last_actions(self, lanes: np.ndarray) -> np.ndarray:
        """The actions ``lanes`` took (or were sent) last."""
        return self._last_actions[lanes]

    def note_actions(self, lanes: np.ndarray, actions: np.ndarray) -> None:
        """``lanes`` were given ``actions`` (an asynchronous engine stores them later)."""
        self._last_actions[lanes] = actions

    @property
    def has_records(self) -> bool:
        """True when games ended in this step and their records wait for :meth:`emit_records`."""
        return bool(self._finished)

    # ------------------------------------------------------------------ writing
    def store_fast(self, lanes: np.ndarray, actions: np.ndarray, frames: np.ndarray,
                   rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                   lives: np.ndarray) -> bool:
        """The common step in two C calls, if none ends an episode, loses a life or changes a
        memory block: the ring's write (:meth:`BatchWriter.try_add_steps`) and the lanes' own
        bookkeeping (history, score, length, lives: :meth:`FrameHistory.push_steps
        <expreplay.acting.envs.FrameHistory.push_steps>`, the numpy path's rules of
        :meth:`store`); False, nothing written, otherwise (then :meth:`store` it)."""
        ext = self._kernel
        if ext is None or not ext.lives_kept(lanes, lives, self._lives) \
                or not self._writer.try_add_steps(lanes, actions, rewards, frames, terminated,
                                                  truncated):
            return False
        if not self._history.push_steps(lanes, frames, rewards, lives, self._score, self._length,
                                        self._lives):
            # A table the kernel does not take (it checked before changing anything).
            self._score[lanes] += rewards
            self._length[lanes] += 1
            if lives.max() >= 0:
                self._lives[lanes] = lives
            self._history.push(lanes, frames)
        if self._observers:
            self._last_actions[lanes] = actions
            self._observe(lanes)
        return True

    def store(self, lanes: np.ndarray, actions: np.ndarray, frames: np.ndarray,
              rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
              lives: np.ndarray) -> None:
        """Write the steps of ``lanes`` (arrays, one row each, at least one) and do the
        episodes' bookkeeping: the general path (episode ends, lost lives, a new memory block),
        after :meth:`store_fast` declined."""
        life_lost = self._lose_lives(lanes, lives)
        if life_lost is not None:
            # A life loss is terminal for training only; a game both truncated and ended by a
            # life loss counts as terminated (no bootstrapping across a lost life).
            self._writer.add_steps(lanes, actions, rewards, frames, terminated | life_lost,
                                   truncated & ~(terminated | life_lost), checked=True)
        else:
            self._writer.add_steps(lanes, actions, rewards, frames, terminated, truncated,
                                   checked=True)
        self._score[lanes] += rewards
        self._length[lanes] += 1
        game_over = terminated | truncated
        if life_lost is not None or game_over.any():
            for j in np.flatnonzero(game_over).tolist():
                self._end_game(int(lanes[j]), bool(terminated[j]), bool(truncated[j]))
            if life_lost is not None:
                # The env goes on from this frame: it is the first frame of the next training
                # episode, so the state after a lost life holds no frames from the previous life.
                restart = life_lost & ~game_over
                self._writer.start_episodes(lanes[restart], frames[restart], checked=True)
                self._history.start(lanes[restart], frames[restart])
                going = ~(game_over | life_lost)
            else:
                going = ~game_over
            self._history.push(lanes[going], frames[going])
        else:
            self._history.push(lanes, frames)
        if self._observers:
            self._last_actions[lanes] = actions
            self._observe(lanes[~game_over])

    def _lose_lives(self, lanes: np.ndarray, lives: np.ndarray) -> np.ndarray | None:
        """Book the lives the steps report; the lanes whose lost life ends a training episode
        (None when none does)."""
        if lives.max() < 0:
            return None
        prev_lives = self._lives[lanes]
        lost = (lives >= 0) & (prev_lives >= 0) & (lives < prev_lives)
        life_lost = lost & self._life_loss_terminal[lanes]
        self._lives[lanes] = lives
        if lost.any():
            self._life_losses[lanes[lost]] += 1
        return life_lost if life_lost.any() else None

    def start(self, lanes: np.ndarray, frames: np.ndarray, lives: np.ndarray,
              start: EpisodeStart | list[EpisodeStart]) -> None:
        """Begin new episodes in ``lanes`` with their first frames (``start`` for every lane,
        or a list of one :class:`EpisodeStart` per lane)."""
        if not len(lanes):
            return
        self._writer.start_episodes(lanes, frames, checked=True)
        self._history.start(lanes, frames)
        self.open[lanes] = True
        self._score[lanes] = 0.0
        self._length[lanes] = 0
        self._lives[lanes] = lives
        self._life_losses[lanes] = 0
        now = time.monotonic()
        for j, lane in enumerate(lanes.tolist()):
            s = start[j] if isinstance(start, list) else start
            self._episode_info[lane] = (int(self._games_started[lane]), s, now)
            self._games_started[lane] += 1
            self.runners[self._lane_runner[lane]].count_start(s.kind)

    def close(self, lanes: np.ndarray) -> None:
        """End the lanes' episodes where they are (nothing bootstraps across the gap)."""
        self.open[lanes] = False

    def detach(self) -> None:
        """Detach from the memory (every lane's block is retired; the data stays)."""
        self._writer.close()

    # ------------------------------------------------------------------ ends and records
    def _end_game(self, lane: int, terminated: bool, truncated: bool) -> None:
        self.open[lane] = False
        runner = self.runners[self._lane_runner[lane]]
        runner.record_game(self._score[lane], self._length[lane])
        info = self._episode_info[lane]
        assert info is not None
        index, start, started_at = info
        self._finished.append((runner, make_record(
            runner.index, self._lane_env[lane], index, start.seed, start.kind, self._score[lane],
            self._length[lane], terminated, truncated, self._life_losses[lane], started_at,
            options=start.options,
            restored_from=None if start.restore is None else start.restore.origin)))

    def emit_records(self) -> None:
        """Hand this step's records to the schedulers and the runners' ``on_episode_end``."""
        records, self._finished = self._finished, []
        for runner, record in records:
            end = getattr(runner.episode_starts, 'episode_end', None)
            if end is not None:
                end(record)
            if runner.on_episode_end is not None:
                runner.on_episode_end(record)

    def _observe(self, lanes: np.ndarray) -> None:
        """Tell the schedulers that observe steps (restart pools) where each lane is now."""
        observers = self._observers
        for lane in lanes.tolist():
            k = self._lane_runner[lane]
            f = observers.get(k)
            if f is not None:
                f(self.runners[k].index, int(self._lane_env[lane]), int(self._length[lane]),
                  self._snapshots[lane])

    def restart_point(self, lane: int, include_rng: bool = False) -> RestartPoint:
        """A :class:`~expreplay.acting.starts.RestartPoint` of ``lane`` now (between steps)."""
        state = self._env_state(int(self._lane_runner[lane]), int(self._lane_env[lane]), include_rng)
        info = self._episode_info[lane]
        assert info is not None
        lives = int(self._lives[lane])
        return RestartPoint(state, self._history.latest(lane).copy(),
                            None if lives == NO_LIVES else lives, int(self._last_actions[lane]),
                            {'runner': self.runners[self._lane_runner[lane]].index,
                             'env_index': int(self._lane_env[lane]), 'episode': info[0],
                             'step': int(self._length[lane])})


class _Snapshot:
    """What an observing scheduler calls (``snapshot(include_rng=False)``) to take a restart
    point of one lane, now, between steps."""
    __slots__ = ('_lanes', '_lane')

    def __init__(self, lanes: LaneEpisodes, lane: int) -> None:
        self._lanes, self._lane = lanes, lane

    def __call__(self, include_rng: bool = False) -> RestartPoint:
        return self._lanes.restart_point(self._lane, include_rng)
