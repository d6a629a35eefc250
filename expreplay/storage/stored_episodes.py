"""What :meth:`ReplayMemory.episodes` returns: the stored complete episodes, and counts of the
ones it skipped (:class:`StoredEpisodes`); and how complete episodes are found in a ring and
read (:class:`EpisodeReader`, reads only)."""


from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ._slots import _ACTIVE, _HAS_ACTION, _TERMINATED, _TRUNCATED
from .ring import BlockRing

__all__ = ['StoredEpisodes', 'EpisodeReader']


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


class EpisodeReader:
    """Finds and reads the complete episodes stored in a :class:`~expreplay.storage.ring.BlockRing`
    (reads only), for :meth:`ReplayMemory.episodes`: :meth:`stored` lists the episodes' first
    frames and hands :meth:`read` to the :class:`StoredEpisodes` it returns.

    Like the :class:`~expreplay.storage.sampling.Sampler`, it only reads the ring's tables, and
    every method that reads them takes the ring's lock (or says its caller holds it): an episode
    is read whole under one hold, so no block is evicted under it.
    """

    def __init__(self, ring: BlockRing) -> None:
        self.ring = ring

    def stored(self) -> StoredEpisodes:
        """The iterator over the complete episodes stored now (:meth:`ReplayMemory.episodes`)."""
        return StoredEpisodes(self.starts(), self.read)

    def starts(self) -> list[tuple[int, int]]:
        """``(first slot, block generation)`` of every episode start stored, oldest lanes'
        blocks first. Takes the lock."""
        return self.ring.lock.run(self._starts)

    def _starts(self) -> list[tuple[int, int]]:
        ring = self.ring
        order = list(ring.retired) + list(np.flatnonzero(ring.block_state == _ACTIVE))
        starts: list[tuple[int, int]] = []
        for block in order:
            lo = block * ring.block_size
            fill = int(ring.block_fill[block])
            gen = int(ring.block_gen[block])     # a reuse of the block changes it
            starts.extend((int(s), gen)
                          for s in lo + np.flatnonzero(ring.epstep[lo:lo + fill] == 0))
        return starts

    def read(self, start: int, gen: int) -> dict[str, Any] | str:
        """Copies of the episode whose first frame is ``start``, in block generation ``gen``
        (see :meth:`ReplayMemory.episodes`), or :attr:`StoredEpisodes.EVICTED` /
        :attr:`StoredEpisodes.INCOMPLETE`. Takes the lock."""
        return self.ring.lock.run(self._read, start, gen)

    def _read(self, start: int, gen: int) -> dict[str, Any] | str:
        ring = self.ring
        if ring.block_gen[start // ring.block_size] != gen:
            return StoredEpisodes.EVICTED
        slots = self._slots(start)
        if slots is None:
            return StoredEpisodes.INCOMPLETE
        return self._copy(slots)

    def _copy(self, slots: np.ndarray) -> dict[str, Any]:
        """The episode at ``slots`` (its frames; its steps are all but the last). Caller holds
        the lock."""
        ring = self.ring
        steps = slots[:-1]
        return dict(observations=ring.frames[slots].copy(),
                    actions=ring.action[steps].copy(),
                    rewards=ring.reward[steps].copy(),
                    terminations=(ring.flags[steps] & _TERMINATED) != 0,
                    truncations=(ring.flags[steps] & _TRUNCATED) != 0,
                    extras={name: arr[steps] for name, arr in ring.extras.items()})

    def _slots(self, start: int) -> np.ndarray | None:
        """Slots of the episode whose first frame is ``start``, or None if it is incomplete
        (still running, abandoned, or cut by an eviction). Caller holds the lock."""
        ring = self.ring
        bs = ring.block_size
        slots = [start]
        slot = start
        while True:
            flags = int(ring.flags[slot])
            if not flags & _HAS_ACTION:
                return None                       # still running, or abandoned
            block, offset = divmod(slot, bs)
            nxt = slot + 1 if offset + 1 < bs else int(ring.block_next[block]) * bs
            if nxt < 0 or nxt % bs >= ring.block_fill[nxt // bs] \
                    or ring.epstep[nxt] != ring.epstep[slot] + 1:
                return None
            slots.append(nxt)
            if flags & (_TERMINATED | _TRUNCATED):
                return np.array(slots)
            slot = nxt
