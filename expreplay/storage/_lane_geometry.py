"""Where a lane's frames lie: the read-only index arithmetic over a replay ring's block links
(the ring's invariants I4 and I7, :mod:`expreplay.storage.ring`), shared by the ring, the
sampler, the checks and the tests."""

from __future__ import annotations

import numpy as np

__all__ = ['LaneGeometry']


class LaneGeometry:
    """Where a lane's frames lie (I4, I7): the read-only index arithmetic over a ring's block
    links, shared by the sampler, the checks and the tests."""

    block_size: int
    num_slots: int
    history_len: int
    zero_slot: int
    block_gen: np.ndarray
    block_next: np.ndarray
    block_prev: np.ndarray
    epstep: np.ndarray

    def tokens(self, slots: np.ndarray) -> np.ndarray:
        """The sample tokens (``SampleBatch.indices``) of ``slots``: generation and slot."""
        return self.block_gen[slots // self.block_size] * self.num_slots + slots

    def next_slots(self, slots: np.ndarray) -> np.ndarray:
        """The slot of the lane's next frame after each of ``slots`` (I4)."""
        bs = self.block_size
        block, offset = np.divmod(slots, bs)
        return np.where(offset + 1 < bs, slots + 1, self.block_next[block] * bs)

    def frame_index(self, slots: np.ndarray) -> np.ndarray:
        """Slot index of every frame of each transition: (B, history_len + 1), oldest first:
        the state's (:meth:`history_index`), then the next frame (the lane's next slot)."""
        return np.concatenate([self.history_index(slots), self.next_slots(slots)[:, None]],
                              axis=1)

    def history_index(self, slots: np.ndarray) -> np.ndarray:
        """Slot index of the ``history_len`` frames of the state at each slot, oldest first.

        Frame ``k`` steps back lies in the same block when the offset allows, else in the
        previous block of the lane (I4); before the episode's first frame it is the zero
        slot (I7).
        """
        bs = self.block_size
        block, offset = np.divmod(slots, bs)
        back = np.arange(self.history_len - 1, -1, -1)            # k, oldest first
        pos = offset[:, None] - back                                # offset of frame k back
        prev_base = self.block_prev[block][:, None] * bs + bs
        hist = np.where(pos >= 0, block[:, None] * bs + pos, prev_base + pos)
        return np.where(back <= self.epstep[slots][:, None], hist, self.zero_slot)
