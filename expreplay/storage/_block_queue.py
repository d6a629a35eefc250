"""A FIFO of block numbers whose every change is one store of a value computed before it: the
ring's free list and eviction order, written inside journaled writes
(:class:`~expreplay.storage._guard.WriteGuard`), which may run their stores twice."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

__all__ = ['BlockQueue']


class BlockQueue:
    """Block numbers, oldest first, in a ring buffer of ``capacity`` (a block is listed at most
    once, so the ring's block count is enough). ``head`` and ``tail`` count positions from the
    start and only grow: the queue holds positions ``head .. tail - 1``. A change names the
    position it stores at (:meth:`put`) or the new head (:meth:`drop_to`), so doing it twice is
    doing it once."""

    __slots__ = ('_buf', 'head', 'tail')

    def __init__(self, capacity: int, items: Iterable[int] = ()) -> None:
        self._buf = np.empty(max(int(capacity), 1), np.int64)
        self.head = 0
        self.tail = 0
        for position, block in enumerate(items):
            self.put(position, int(block))

    def __len__(self) -> int:
        return self.tail - self.head

    def __bool__(self) -> bool:
        return self.tail > self.head

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.array(self.tolist(), dtype=np.int64 if dtype is None else dtype)

    def __repr__(self) -> str:
        return f"BlockQueue({self.tolist()})"

    def first(self) -> int:
        """The oldest block (the queue is not empty)."""
        return int(self._buf[self.head % len(self._buf)])

    def last(self) -> int:
        """The newest block (the queue is not empty)."""
        return int(self._buf[(self.tail - 1) % len(self._buf)])

    def tolist(self) -> list[int]:
        """The blocks, oldest first."""
        cap = len(self._buf)
        return self._buf[np.arange(self.head, self.tail) % cap].tolist()

    def put(self, position: int, block: int) -> None:
        """``block`` at ``position`` (the tail when the write was prepared), which becomes the
        newest."""
        self._buf[position % len(self._buf)] = block
        self.tail = position + 1

    def drop_to(self, head: int) -> None:
        """Forget the blocks before position ``head``."""
        self.head = head

    def ends(self) -> tuple[int, int]:
        """``(head, tail)``: what :meth:`restore` takes back to (the blocks stored between
        stay where they are until a :meth:`put` overwrites them)."""
        return self.head, self.tail

    def restore(self, ends: tuple[int, int]) -> None:
        """The queue as it was when :meth:`ends` was read, with no :meth:`put` at or below
        its tail since."""
        self.head, self.tail = ends
