"""The arrays of sampled batches, reused once nothing outside refers to them.

Why: a batch of 64 states of 84x84x4 frames is two 1.8 MB arrays. When the learner drops a
batch in another thread (a prefetch thread draws, the learner frees), malloc gives blocks that
large back to the system, and the next batch's arrays are page-faulted in anew: ~300 faults and
0.3-0.7 ms of CPU a batch on a busy machine, several times the copy itself (~0.19 ms). Arrays
that nothing refers to any more can be filled again instead.

What "nothing" means: CPython counts the references to every object, and whatever can read an
array's memory holds one to it: a name or a container (the batch tuple, a queue), a view (its
``base``), a buffer export (a ``memoryview``, ``torch.from_numpy``, a device transfer in
flight). So a set of arrays whose counts are the pool's own is unreachable from outside, and
filling it again can not be observed. A set of which one array is still held is left alone.

What a caller gets is a fresh *view* of each pooled array, never the pooled array itself: the
view is the caller's to change (its ``shape``, ``dtype``, ``strides``, ``flags.writeable``, a
``weakref`` to it) and dies with the caller's last reference, while the pooled array behind it
keeps its own shape, dtype and flags for the next batch. Only a raw pointer to the memory (an
address read from ``__array_interface__`` or ``ctypes``, which CPython does not count) can see
the next batch's values.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable

import numpy as np

__all__ = ['ArrayPool']


def _most_refs(arrays: tuple[np.ndarray, ...]) -> int:
    return max(sys.getrefcount(a) for a in arrays)


# The count _most_refs sees for arrays held by nothing but their tuple (the interpreter's own
# temporaries included, which differ between Python versions).
_OWN = _most_refs((np.empty(1),))


class ArrayPool:
    """Sets of arrays of one kind (``key``: their shapes and dtypes), handed out again once
    nothing but the pool holds them.

    Args:
        limit (int): sets kept (the oldest one is forgotten past it: freed when its holder
            drops it). Enough for the batches that wait in a prefetch buffer, the learner's
            and the ones its loop still names.

    Not thread-safe: its owner calls it under a lock (the ring's).
    """

    def __init__(self, limit: int = 16) -> None:
        self.limit = limit
        self._key: Hashable = None
        self._sets: list[tuple[np.ndarray, ...]] = []
        self.made = 0          # sets allocated (a set reused is not counted)

    def take(self, key: Hashable, make: Callable[[], tuple[np.ndarray, ...]]
             ) -> list[np.ndarray]:
        """Views of the arrays of a set of kind ``key`` that nothing outside the pool refers
        to, or of a new one from ``make()``, in a list of the caller's own (the views refer to
        the set, which keeps it from being handed out again while the caller holds one of
        them, or anything built from it); the caller overwrites every element of them."""
        if key != self._key:        # another batch size or layout: the old sets do not fit
            self._key, self._sets = key, []
        sets = self._sets
        for i, arrays in enumerate(sets):
            if _most_refs(arrays) <= _OWN:
                sets.append(sets.pop(i))    # the most recently used last: the oldest is dropped
                return [a.view() for a in arrays]
        arrays = make()
        self.made += 1
        sets.append(arrays)
        if len(sets) > self.limit:
            del sets[0]
        return [a.view() for a in arrays]
