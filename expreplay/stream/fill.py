"""The initial fill: step requests until the memory holds what the first batches need."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Protocol, Union

if TYPE_CHECKING:
    from ..acting.population import Population
    from ..storage.memory import ReplayMemory

__all__ = ['Progress', 'ProgressArg', 'fill_memory']

logger = logging.getLogger(__name__)


class Progress(Protocol):
    """What a ``progress(total, desc)`` factory returns."""

    def update(self, n: int) -> Any: ...

    def close(self) -> Any: ...


ProgressArg = Union[bool, None, Callable[[int, str], Progress]]


def fill_memory(memory: ReplayMemory, population: Population, target: int,
                progress: ProgressArg, closed: Callable[[], bool]) -> int:
    """Request steps until ``memory`` holds ``target`` transitions; returns the requests made.

    Also stops once that many steps were inserted while the memory still holds fewer
    transitions: it is then as full as it gets (each episode's final frame takes a slot
    without being a transition), and waiting longer would never end. Returns early when
    ``closed()``.
    """
    if len(memory) >= target:
        return 0
    logger.info("Filling the replay memory to %d transitions with exploration=%s ...",
                target, population.exploration)
    written_at_start = memory.num_steps_written
    bar = _make_progress(progress, target)
    shown = min(len(memory), target)
    bar.update(shown)
    requests = 0
    try:
        while len(memory) < target and memory.num_steps_written - written_at_start < target:
            if closed():
                break
            population.step(population.exploration)
            requests += 1
            now = min(len(memory), target)
            if now > shown:
                bar.update(now - shown)
                shown = now
    finally:
        bar.close()
    return requests


def check_progress(progress: Any) -> ProgressArg:
    """``progress`` if it is True, False, None or a callable; TypeError naming it otherwise."""
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        raise TypeError(f"progress must be True, False or a callable progress(total, desc), "
                        f"got {progress!r}")
    return progress


def _make_progress(progress: ProgressArg, total: int) -> Progress:
    desc = 'filling replay memory'
    if progress is True:
        try:
            from tqdm import tqdm
        except ImportError:
            return _NoProgress()
        return tqdm(total=total, desc=desc, dynamic_ncols=True)
    if not progress:
        return _NoProgress()
    return progress(total, desc)


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass
