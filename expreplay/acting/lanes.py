"""The episodes of an acting group's lanes, and how their steps reach the memory.

:class:`LaneEpisodes` is the one object of the acting path that knows how data is stored (as
Acme's adders are for its actors): it owns the group's
:class:`~expreplay.storage.writers.BatchWriter` and :class:`~expreplay.acting.envs.FrameHistory`,
and per lane the episode's bookkeeping (open or not, score, length, lives, the start it had).
It writes a batch of steps, starts and ends episodes, and turns a lost life into a new training
episode when asked. It knows lanes, not runners: a finished game is kept as an
:class:`EndedGame` until the acting group takes it (:meth:`LaneEpisodes.take_ended`) and tells
the game's runner.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numpy as np

from .envs import NO_LIVES, FrameHistory

__all__ = ['EndedGame', 'LaneEpisodes', 'LanePosition']


class EndedGame(NamedTuple):
    """A game that ended in a lane: what its episode record is made of."""
    lane: int
    game: int             # the lane's game count when it started
    start: Any            # what the lane's :meth:`LaneEpisodes.start` was given for it
    started_at: float     # time.monotonic() at its start
    score: float
    length: int
    terminated: bool
    truncated: bool
    life_losses: int


class LanePosition(NamedTuple):
    """Where a lane's episode is now (between steps): what a restart point saves besides the
    env's state."""
    frame: np.ndarray     # the latest frame (a copy)
    lives: int | None
    last_action: int
    game: int             # the index of the game it is in
    step: int             # steps into that game


class LaneEpisodes:
    """Per-lane episodes, written through ``memory.new_batch_writer``: one lane per entry of
    ``life_loss_terminal`` (whether a lost life ends the lane's training episode).

    ``open[lane]`` (read-only outside) is True while the lane is inside an episode the memory
    records.
    """

    def __init__(self, life_loss_terminal: np.ndarray, memory: Any, frame_shape: tuple[int, ...],
                 dtype: np.dtype) -> None:
        n = len(life_loss_terminal)
        self._writer = memory.new_batch_writer(n)
        self._history = FrameHistory(n, frame_shape, memory.history_len, dtype)
        self.open = np.zeros(n, bool)
        self._score = np.zeros(n, np.float64)
        self._length = np.zeros(n, np.int64)
        self._lives = np.full(n, NO_LIVES, np.int64)
        self._life_losses = np.zeros(n, np.int64)
        self._life_loss_terminal = np.asarray(life_loss_terminal, bool)
        self._games_started = np.zeros(n, np.int64)
        self._episode_info: list[tuple[int, Any, float] | None] = [None] * n
        self._last_actions = np.zeros(n, np.int64)   # for restart points; async: what was sent
        self._ended: list[EndedGame] = []   # games that ended, until the group takes them
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
        """``lanes`` were given ``actions`` (an asynchronous engine stores them later; a
        restart point saves the last)."""
        self._last_actions[lanes] = actions

    @property
    def has_ended(self) -> bool:
        """True when games ended and wait for :meth:`take_ended`."""
        return bool(self._ended)

    def take_ended(self) -> list[EndedGame]:
        """The games that ended since the last call, in the order they ended."""
        ended, self._ended = self._ended, []
        return ended

    def game_length(self, lane: int) -> int:
        """The steps ``lane`` took in the game it is in."""
        return int(self._length[lane])

    def position(self, lane: int) -> LanePosition:
        """Where ``lane``'s episode is now (between steps)."""
        info = self._episode_info[lane]
        assert info is not None
        lives = int(self._lives[lane])
        return LanePosition(self._history.latest(lane).copy(), None if lives == NO_LIVES else lives,
                            int(self._last_actions[lane]), info[0], int(self._length[lane]))

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
              starts: list[Any]) -> None:
        """Begin new episodes in ``lanes`` with their first frames; ``starts``: how each began
        (one per lane, kept for its :class:`EndedGame`)."""
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
        for lane, start in zip(lanes.tolist(), starts):
            self._episode_info[lane] = (int(self._games_started[lane]), start, now)
            self._games_started[lane] += 1

    def close(self, lanes: np.ndarray) -> None:
        """End the lanes' episodes where they are (nothing bootstraps across the gap)."""
        self.open[lanes] = False

    def detach(self) -> None:
        """Detach from the memory (every lane's block is retired; the data stays)."""
        self._writer.close()

    # ------------------------------------------------------------------ ends
    def _end_game(self, lane: int, terminated: bool, truncated: bool) -> None:
        self.open[lane] = False
        info = self._episode_info[lane]
        assert info is not None
        index, start, started_at = info
        self._ended.append(EndedGame(lane, index, start, started_at, float(self._score[lane]),
                                     int(self._length[lane]), terminated, truncated,
                                     int(self._life_losses[lane])))
