"""A manager's statistics window: games, steps and predictor calls since the last reset."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

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

    def reset(self) -> tuple[float | None, float | None]:
        """``(mean, max)`` score of the games finished since the last call, or ``(None, None)``;
        starts a new window and empties the runners' ``total_scores``."""
        self._collect_games(clear_total_scores=True)
        scores = [s for s, _ in self._games]
        self._games = []
        self._start = time.monotonic()
        self._steps = self._total_steps()
        self._inference = self._inference_counts()
        if not scores:
            return None, None
        return float(np.mean(scores)), float(np.max(scores))

    def figures(self) -> dict[str, Any]:
        """The window's ``games``, ``mean_score``, ``max_score``, ``mean_episode_length``,
        ``steps``, ``steps_per_sec``, ``inference_calls``, ``mean_inference_batch``, and the
        totals ``restarts`` and ``actor_restarts`` (see :meth:`EnvRunnerManager.stats
        <expreplay.acting.manager.EnvRunnerManager.stats>`)."""
        self._collect_games()
        games = self._games
        elapsed = max(time.monotonic() - self._start, 1e-9)
        steps = self._total_steps() - self._steps
        calls, rows = self._inference_counts()
        calls, rows = calls - self._inference[0], rows - self._inference[1]
        return {
            'games': len(games),
            'mean_score': float(np.mean([s for s, _ in games])) if games else None,
            'max_score': float(np.max([s for s, _ in games])) if games else None,
            'mean_episode_length': float(np.mean([n for _, n in games])) if games else None,
            'steps': steps,
            'steps_per_sec': steps / elapsed,
            'inference_calls': calls,
            'mean_inference_batch': rows / calls if calls else None,
            'restarts': sum(r.restarts for r in self._runners),
            'actor_restarts': sum(int(getattr(r.player, 'actor_restarts', 0) or 0)
                                  for r in self._runners),
        }
