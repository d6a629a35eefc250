"""Exploration: the epsilon of epsilon-greedy players, a number or a schedule of the steps stored."""

from __future__ import annotations

import inspect
from typing import Callable, Union

from .._checks import check_probability

__all__ = ['Exploration', 'check_schedule']

ExplorationArg = Union[float, Callable[[int], float]]


def check_schedule(schedule: Callable[..., float]) -> None:
    """TypeError naming ``exploration`` unless ``schedule`` can be called with one positional argument
    (the steps stored), e.g. ``lambda steps: max(0.1, 1 - steps / 100_000)``.

    Checked from the signature, without calling it: a schedule of no argument (``lambda: 0.1``)
    or of two would otherwise fail as a bare TypeError at the first step request. A callable
    whose signature can not be read (some builtins) is accepted as is.
    """
    try:
        signature = inspect.signature(schedule)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(0)
    except TypeError as err:
        what = getattr(schedule, '__qualname__', None) or type(schedule).__name__
        raise TypeError(
            f"exploration must be a number in [0, 1] or a schedule of the steps stored, a function "
            f"of one argument returning epsilon (e.g. lambda steps: max(0.1, 1 - steps / "
            f"100_000)); got {what}{signature}, which can not be called as exploration(steps): "
            f"{err}") from None


class Exploration:
    """Epsilon, given as a number or as a schedule ``epsilon(steps)`` of the steps stored.

    A schedule is read at every step request with the steps the players have stored so far
    (the initial fill included), so a training loop need not update it; it must take one
    argument (TypeError naming ``exploration`` otherwise, when it is given), and each value it
    returns is checked to be in [0, 1] (ValueError naming ``exploration`` otherwise).

    :attr:`assignments` counts the values given (the first one included): a watch of the
    stream tells a number nobody ever changed from one a training loop assigns.
    """

    def __init__(self, value: ExplorationArg = 1.0) -> None:
        self.number = 1.0
        self.schedule: Callable[[int], float] | None = None
        self.assignments = 0
        self.set(value)

    def set(self, value: ExplorationArg) -> None:
        """Use ``value`` (a number, or a schedule checked on step 0) from now on."""
        if callable(value):
            check_schedule(value)
            check_probability(value(0), "exploration (the schedule's value at step 0)")
            self.schedule = value
        else:
            self.number = check_probability(value, 'exploration')
            self.schedule = None
        self.assignments += 1

    def at(self, steps: int) -> float:
        """Epsilon after ``steps`` stored steps."""
        if self.schedule is None:
            return self.number
        return check_probability(self.schedule(steps), "exploration (the schedule's value)")
