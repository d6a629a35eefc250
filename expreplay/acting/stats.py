"""A manager's statistics window: games, steps and predictor calls since the last reset, read
as a :class:`~expreplay.stats.ManagerStats` (its figures are documented there)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from ..stats import ManagerStats, ScoreWindow
from .runner import EnvRunner

__all__ = ['ActingStats']

# Games collected and never read: past this many, the newest half is kept.
_MAX_WINDOW_GAMES = 100_000


class ActingStats:
    """Figures of ``runners`` since the last :meth:`reset`; ``inference_counts()`` returns the
    predictor's ``(calls, rows)`` so far."""

    def __init__(self, runners: Sequence[EnvRunner], inference_counts: Callable[[], tuple[int, int]]) -> None:
        self._runners = list(runners)
        self._inference_counts = inference_counts
        self._games: list[tuple[float, int]] = []
        self._start = time.monotonic()
        self._steps = 0
        self._inference = (0, 0)

    def _collect_games(self, clear_total_scores: bool = False) -> None:
        for r in self._runners:
            self._games.extend(r.pop_games(clear_total_scores))
        if len(self._games) > _MAX_WINDOW_GAMES:        # never read: keep the newest
            del self._games[:-_MAX_WINDOW_GAMES // 2]

    def _total_steps(self) -> int:
        return sum(r.steps for r in self._runners)

    def reset(self) -> ScoreWindow:
        """The scores of the games finished since the last call (``ScoreWindow()`` without
        games); starts a new window and empties the runners' ``total_scores``."""
        self._collect_games(clear_total_scores=True)
        scores = [s for s, _ in self._games]
        self._games = []
        self._start = time.monotonic()
        self._steps = self._total_steps()
        self._inference = self._inference_counts()
        if not scores:
            return ScoreWindow()
        return ScoreWindow(mean=float(np.mean(scores)), max=float(np.max(scores)))

    def figures(self, *, max_inference_batch: int | None, queue_depth: int, queued: int,
                stuck_threads: tuple[str, ...]) -> ManagerStats:
        """The window's figures and the runners' totals, with the figures of now the manager
        holds (given here): :meth:`EnvRunnerManager.stats
        <expreplay.acting.manager.EnvRunnerManager.stats>`'s record."""
        self._collect_games()
        games = self._games
        elapsed = max(time.monotonic() - self._start, 1e-9)
        steps = self._total_steps() - self._steps
        calls, rows = self._inference_counts()
        calls, rows = calls - self._inference[0], rows - self._inference[1]
        scores = [s for s, _ in games]
        return ManagerStats(
            games=len(games),
            mean_score=float(np.mean(scores)) if games else None,
            max_score=float(np.max(scores)) if games else None,
            mean_episode_length=float(np.mean([n for _, n in games])) if games else None,
            steps=steps, steps_per_sec=steps / elapsed,
            inference_calls=calls, mean_inference_batch=rows / calls if calls else None,
            max_inference_batch=max_inference_batch,
            queue_depth=queue_depth, queued=queued,
            restarts=sum(r.restarts for r in self._runners),
            actor_restarts=sum(int(getattr(r.player, 'actor_restarts', 0) or 0)
                               for r in self._runners),
            stuck_threads=stuck_threads)
