"""What :meth:`ReplayMemory.episodes` returns: the stored complete episodes, and counts of the
ones it skipped."""


from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any


class StoredEpisodes:
    """The iterator :meth:`expreplay.ReplayMemory.episodes` returns: each complete episode the
    memory held when it was called, read whole when it is reached, and counts of the others.

    ``starts`` are ``(first slot, block generation)`` pairs listed under the memory's lock;
    ``read(slot, generation)`` reads one episode under the lock and returns its dict, or
    :attr:`EVICTED` (the block was reused since the listing), or :attr:`INCOMPLETE`.

    Attributes:
        yielded (int): episodes handed out so far.
        evicted (int): listed episodes skipped because writers evicted their first frame
            before they were reached (none when no writer runs during the iteration).
        incomplete (int): listed episodes skipped because they were still running, abandoned,
            or already cut by an eviction when they were reached.
    """

    EVICTED = 'evicted'
    INCOMPLETE = 'incomplete'

    def __init__(self, starts: Iterable[tuple[int, int]],
                 read: Callable[[int, int], dict[str, Any] | str]) -> None:
        self._starts = iter(starts)
        self._read = read
        self.yielded = self.evicted = self.incomplete = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        for start, generation in self._starts:
            episode = self._read(start, generation)
            if isinstance(episode, dict):
                self.yielded += 1
                return episode
            if episode is self.EVICTED:
                self.evicted += 1
            else:
                self.incomplete += 1
        raise StopIteration

    def __repr__(self) -> str:
        return (f"StoredEpisodes(yielded={self.yielded}, evicted={self.evicted}, "
                f"incomplete={self.incomplete})")
