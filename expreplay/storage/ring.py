"""The replay memory's ring: the slot and block tables, their invariants, and the block life cycle.

Layout
======
The ring is ``num_blocks * block_size`` *slots*. A slot holds one observation frame plus the
step taken from it (action, reward, how the step ended) and the frame's index inside its
episode (``epstep``: 0 for the observation returned by ``reset()``).

Slots are handed out in *blocks* of ``block_size`` consecutive slots. Each writer (one per
environment, see :class:`~expreplay.storage.writers.LaneWriter`) owns one *active* block at a
time and fills it slot by slot; when it is full the writer takes another block and links the
two. The chain of blocks of one writer is its *lane*: inside a block an episode's frames are
contiguous, and across a block boundary the ``block_prev`` / ``block_next`` links say where the
lane continues. This is what lets any number of writers share the memory without declaring a
count up front, while each episode stays readable as consecutive frames.

A new block comes from the free list while there is one, and then by evicting the block that
was *retired* (filled, or abandoned by a closed writer) longest ago. Eviction is therefore
oldest-first across all writers, one block at a time, and the memory holds roughly the most
recent ``max_size`` steps.

Invariants (kept under ``lock``)
================================
I1  A block is in exactly one of: ``free``, ``retired`` (FIFO, oldest first), or active
    (owned by exactly one writer). Only the owner writes into an active block.
I2  Slots ``[0, block_fill[b])`` of block ``b`` hold written frames; the rest are garbage.
    ``block_fill`` only grows while the block is active and drops to 0 when it is evicted.
I3  A slot's VALID flag is set iff its transition can be sampled: an action was taken from its
    frame, the next frame is written (in the next slot of the lane), and every frame of its
    history (the ``history_len - 1`` frames before it, within its episode) is still stored.
    ``num_valid`` is the number of VALID slots.
I4  History never reaches further back than the previous block of the lane, because
    ``block_size >= history_len``; the next frame never lies further ahead than the next block.
I5  ``block_prev_intact[b]`` is False once the block before ``b`` in its lane has been evicted;
    the slots of ``b`` whose history reaches into it lose VALID at that moment.
I6  A lane's blocks retire in lane order, so eviction (FIFO) never removes a block before its
    predecessor: a VALID slot's next frame can not have been evicted.
I7  Slot ``zero_slot`` (the last one) is never written and stays zeros: history positions
    before an episode's first frame point at it, so one fancy index gathers padded states.

Frames are written outside the lock (a memcpy the writer owns, I1) and published under it by
updating ``block_fill`` / VALID (:meth:`BlockRing.publish`); a sampler holds the lock while it
gathers, so an evicted block can not be rewritten under a sample that is reading it.
A prioritized ring keeps a :class:`~expreplay.storage.priority.PriorityIndex` (``priorities``,
None when uniform) in step with VALID: :meth:`BlockRing.publish` enters the steps that became
VALID, :meth:`BlockRing.claim_block`'s eviction removes the slots it invalidates. A sample
token is ``block_gen * num_slots + slot`` (:meth:`BlockRing.tokens`): a slot rewritten since it
was sampled has a newer generation.

The tables are public attributes: the writers (:mod:`~expreplay.storage.writers`), the sampler
(:mod:`~expreplay.storage.sampling`), the C kernels and the checkpoint code read and write them
by the rules above; the block life cycle (claim, retire, evict) is only this class's.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._slots import _ACTIVE, _FREE, _HAS_ACTION, _RETIRED, _TERMINATED, _TRUNCATED, _VALID
from .priority import PriorityIndex
from .stored_episodes import StoredEpisodes

__all__ = ['BlockRing']


class BlockRing:
    """The slot and block tables of a replay memory and the block life cycle (module docstring).

    Args:
        num_blocks, block_size: the ring's geometry (``block_size >= history_len``, I4).
        history_len: frames in a state.
        state_shape, dtype: one frame's.
        extra_fields: name -> dtype of the extra per-step fields (one slot table each).
        priorities: ``(alpha, eps)`` for a prioritized ring, None for a uniform one.
    """

    def __init__(self, num_blocks: int, block_size: int, history_len: int,
                 state_shape: tuple[int, ...], dtype: np.dtype,
                 extra_fields: Mapping[str, np.dtype],
                 priorities: tuple[float, float] | None = None) -> None:
        self.num_blocks, self.block_size, self.history_len = num_blocks, block_size, history_len
        self.state_shape, self.dtype = state_shape, dtype
        self.num_slots = num_blocks * block_size
        self.zero_slot = self.num_slots                      # I7
        # np.zeros of a large array maps zero pages lazily: nothing is touched up front.
        self.frames = np.zeros((self.num_slots + 1,) + state_shape, dtype)
        self.action = np.zeros(self.num_slots, np.int32)
        self.reward = np.zeros(self.num_slots, np.float32)
        self.epstep = np.zeros(self.num_slots, np.int32)
        self.flags = np.zeros(self.num_slots, np.uint8)
        # Extra per-step fields, stored like the action and reward (the slot of the step's state).
        self.extras = {name: np.zeros(self.num_slots, d) for name, d in extra_fields.items()}

        self.block_fill = np.zeros(num_blocks, np.int64)
        self.block_prev = np.full(num_blocks, -1, np.int64)
        self.block_next = np.full(num_blocks, -1, np.int64)
        self.block_prev_intact = np.zeros(num_blocks, bool)
        self.block_state = np.full(num_blocks, _FREE, np.int8)
        self.block_gen = np.zeros(num_blocks, np.int64)      # +1 at every claim
        self.free: collections.deque[int] = collections.deque(range(num_blocks))
        self.retired: collections.deque[int] = collections.deque()
        # Block arrays of writers collected unclosed (queued by their finalizers, lock-free).
        self.abandoned: collections.deque[np.ndarray] = collections.deque()
        self.num_valid = 0
        self.num_steps_written = 0       # all steps ever added, for statistics
        self.priorities = (None if priorities is None else
                           PriorityIndex(self.num_slots, *priorities, self.flags, _VALID))
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ publishing (writers)
    def publish(self, slots: np.ndarray | int | None, valid: int, written: int) -> None:
        """``valid`` steps, taken from ``slots``, became VALID (and enter the priority tree),
        among ``written`` steps added (``slots`` may be None for a uniform ring). Caller holds
        the lock and has set their flags."""
        self.num_valid += valid
        self.num_steps_written += written
        if self.priorities is not None and slots is not None:
            self.priorities.on_publish(slots)

    def abandon(self, blocks: np.ndarray) -> None:
        """Queue a dropped writer's blocks (-1: none) to be retired at the next claim. Takes
        no lock: a garbage collector's finalizer calls it, in any thread, inside any code."""
        self.abandoned.append(blocks)

    # ------------------------------------------------------------------ block life cycle
    def claim_block(self, prev_block: int) -> int:
        """A new active block linked after ``prev_block`` (-1: a new lane), which retires.

        Evicts the oldest retired block when no block is free. Caller holds the lock.
        """
        while self.abandoned:
            self.retire_active(self.abandoned.popleft())
        if self.free:
            block = self.free.popleft()
        elif self.retired:
            block = self.retired.popleft()
            self._evict(block)
        else:
            raise RuntimeError(
                f"all {self.num_blocks} blocks of the replay memory are held by writers: too many "
                f"writers for {self.num_slots} slots with block_size={self.block_size}; "
                "use a smaller block_size or fewer writers")
        # Retire the writer's full block only now, so that it can not be handed straight back.
        if prev_block >= 0:
            self._retire(prev_block)
        self.block_state[block] = _ACTIVE
        self.block_gen[block] += 1
        self.block_fill[block] = 0
        self.block_prev[block] = prev_block
        self.block_next[block] = -1
        self.block_prev_intact[block] = prev_block >= 0
        if prev_block >= 0:
            self.block_next[prev_block] = block
        return block

    def retire_active(self, blocks: np.ndarray) -> None:
        """Retire those of ``blocks`` (a writer's, -1: none) that are still active. Caller
        holds the lock."""
        for block in blocks[blocks >= 0].tolist():
            if self.block_state[block] == _ACTIVE:
                self._retire(block)

    def _retire(self, block: int) -> None:
        self.block_state[block] = _RETIRED
        self.retired.append(block)

    def _evict(self, block: int) -> None:
        """Forget everything in ``block`` (I2, I3) and cut its successor's history (I5)."""
        lo = block * self.block_size
        flags = self.flags[lo:lo + self.block_size]
        self.num_valid -= int(np.count_nonzero(flags & _VALID))
        flags[:] = 0
        self.block_fill[block] = 0
        broken_slots = None
        succ = self.block_next[block]
        if succ >= 0 and self.block_prev[succ] == block:
            self.block_prev_intact[succ] = False
            # Slots at offset o of the successor need the evicted block when their history
            # (min(epstep, history_len - 1) frames back) reaches before offset 0.
            n = min(self.history_len - 1, int(self.block_fill[succ]))
            s_lo = succ * self.block_size
            needs = np.minimum(self.epstep[s_lo:s_lo + n], self.history_len - 1) > np.arange(n)
            broken = needs & ((self.flags[s_lo:s_lo + n] & _VALID) != 0)
            self.num_valid -= int(np.count_nonzero(broken))
            self.flags[s_lo:s_lo + n][broken] &= ~np.uint8(_VALID)
            broken_slots = s_lo + np.flatnonzero(broken)
            self.block_prev[succ] = -1
        if self.priorities is not None:
            self.priorities.on_evict(lo, lo + self.block_size, broken_slots)
        self.block_prev[block] = -1
        self.block_next[block] = -1
        self.block_state[block] = _FREE

    def restore(self, free: np.ndarray, retired: np.ndarray, num_valid: int,
                num_steps_written: int) -> None:
        """The block lists and counters of a checkpoint whose tables were read into this ring
        (which the checkpoint code then checks against I1-I7)."""
        self.free = collections.deque(int(b) for b in free)
        self.retired = collections.deque(int(b) for b in retired)
        self.num_valid = num_valid
        self.num_steps_written = num_steps_written

    @property
    def priority_leaves(self) -> np.ndarray | None:
        """The priority tree's leaves (one per slot) for the checkpoint; None when uniform."""
        return None if self.priorities is None else self.priorities.tree.leaves

    # ------------------------------------------------------------------ lane geometry
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

    # ------------------------------------------------------------------ whole episodes
    def episode_starts(self) -> list[tuple[int, int]]:
        """``(first slot, block generation)`` of every episode start stored, oldest lanes'
        blocks first. Caller holds the lock."""
        order = list(self.retired) + list(np.flatnonzero(self.block_state == _ACTIVE))
        starts: list[tuple[int, int]] = []
        for block in order:
            lo = block * self.block_size
            fill = int(self.block_fill[block])
            gen = int(self.block_gen[block])     # a reuse of the block changes it
            starts.extend((int(s), gen) for s in lo + np.flatnonzero(self.epstep[lo:lo + fill] == 0))
        return starts

    def read_episode(self, start: int, gen: int) -> dict[str, Any] | str:
        """Copies of the episode whose first frame is ``start``, in block generation ``gen``
        (see :meth:`ReplayMemory.episodes`), or :attr:`StoredEpisodes.EVICTED` /
        :attr:`StoredEpisodes.INCOMPLETE`. Takes the lock."""
        with self.lock:
            if self.block_gen[start // self.block_size] != gen:
                return StoredEpisodes.EVICTED
            slots = self.episode_slots(start)
            if slots is None:
                return StoredEpisodes.INCOMPLETE
            return self._episode_copy(slots)

    def _episode_copy(self, slots: np.ndarray) -> dict[str, Any]:
        steps = slots[:-1]
        return dict(observations=self.frames[slots].copy(),
                    actions=self.action[steps].copy(),
                    rewards=self.reward[steps].copy(),
                    terminations=(self.flags[steps] & _TERMINATED) != 0,
                    truncations=(self.flags[steps] & _TRUNCATED) != 0,
                    extras={name: arr[steps] for name, arr in self.extras.items()})

    def episode_slots(self, start: int) -> np.ndarray | None:
        """Slots of the episode whose first frame is ``start``, or None if it is incomplete
        (still running, abandoned, or cut by an eviction). Caller holds the lock."""
        bs = self.block_size
        slots = [start]
        slot = start
        while True:
            flags = int(self.flags[slot])
            if not flags & _HAS_ACTION:
                return None                       # still running, or abandoned
            block, offset = divmod(slot, bs)
            nxt = slot + 1 if offset + 1 < bs else int(self.block_next[block]) * bs
            if nxt < 0 or nxt % bs >= self.block_fill[nxt // bs] \
                    or self.epstep[nxt] != self.epstep[slot] + 1:
                return None
            slots.append(nxt)
            if flags & (_TERMINATED | _TRUNCATED):
                return np.array(slots)
            slot = nxt
