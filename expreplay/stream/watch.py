"""RandomPlayWatch: a warning when a stream's players never use the Q-function."""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ['RandomPlayWatch', 'RANDOM_PLAY_WARNING_BATCHES']

# Batches drawn after the fill with every step at exploration 1.0 before the watch warns: a
# training loop that forgot to lower epsilon learns nothing, and nothing else would say so.
RANDOM_PLAY_WARNING_BATCHES = 10_000


class RandomPlayWatch:
    """Counts the batches drawn while the population acts only at random (exploration 1.0,
    with a predictor set) and warns once (RuntimeWarning) when they reach
    :data:`RANDOM_PLAY_WARNING_BATCHES`; it stops looking once a greedy action is possible."""

    def __init__(self, population: Any) -> None:
        self.population = population
        self.batches: int | None = 0     # None once done: warned, or greedy actions are taken

    def after_draw(self) -> None:
        """Called by the drawing thread for every batch."""
        if self.batches is None:
            return
        population = self.population
        if population.exploration < 1.0 or population.predictor is None:
            self.batches = None          # greedy actions are taken, or none can be
            return
        self.batches += 1
        if self.batches >= RANDOM_PLAY_WARNING_BATCHES:
            self.batches = None
            warnings.warn(
                f"ReplayStream: {RANDOM_PLAY_WARNING_BATCHES} batches drawn since the initial "
                "fill and every step was taken at exploration 1.0: the players never use the "
                "predictor. Lower epsilon as the training goes, once with a schedule "
                "(Population(exploration=lambda steps: max(0.1, 1 - steps / 100_000))) or by "
                "assigning stream.exploration", RuntimeWarning, stacklevel=3)
