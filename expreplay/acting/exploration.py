"""Exploration: the epsilon of epsilon-greedy players, a number or a schedule of the steps stored."""

from __future__ import annotations

from typing import Callable, Union

from .._checks import check_probability

__all__ = ['Exploration']

ExplorationArg = Union[float, Callable[[int], float]]


class Exploration:
    """Epsilon, given as a number or as a schedule ``epsilon(steps)`` of the steps stored.

    A schedule is read at every step request with the steps the players have stored so far
    (the initial fill included), so a training loop need not update it; each value it returns
    is checked to be in [0, 1] (ValueError naming ``exploration`` otherwise).
    """

    def __init__(self, value: ExplorationArg = 1.0) -> None:
        self.number = 1.0
        self.schedule: Callable[[int], float] | None = None
        self.set(value)

    def set(self, value: ExplorationArg) -> None:
        """Use ``value`` (a number, or a schedule checked on step 0) from now on."""
        if callable(value):
            check_probability(value(0), "exploration (the schedule's value at step 0)")
            self.schedule = value
        else:
            self.number = check_probability(value, 'exploration')
            self.schedule = None

    def at(self, steps: int) -> float:
        """Epsilon after ``steps`` stored steps."""
        if self.schedule is None:
            return self.number
        return check_probability(self.schedule(steps), "exploration (the schedule's value)")
