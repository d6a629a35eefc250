"""The checks a loaded checkpoint passes before its memory is handed out: the ring's
invariants (I1-I7, :mod:`expreplay.storage.ring`) over the tables read from the file, so that a
crafted file can not make the memory sample frames that do not form the transitions it claims.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import NoReturn, Protocol

import numpy as np

from . import _slots as _mem   # the slot flags and block states
from ._block_queue import BlockQueue

__all__ = ['validate']

Fail = Callable[[str], NoReturn]


class BlockRing(Protocol):
    """What the checks read of a :class:`expreplay.storage.ring.BlockRing` (which calls them
    from its ``load_state``: a protocol, so that this module needs no import of the ring)."""
    num_blocks: int
    block_size: int
    history_len: int
    num_slots: int
    block_fill: np.ndarray
    block_prev: np.ndarray
    block_next: np.ndarray
    block_state: np.ndarray
    block_prev_intact: np.ndarray
    block_gen: np.ndarray
    free: BlockQueue
    retired: BlockQueue
    flags: np.ndarray
    epstep: np.ndarray
    reward: np.ndarray
    extras: dict[str, np.ndarray]

    @property
    def num_valid(self) -> int: ...

    def history_index(self, slots: np.ndarray) -> np.ndarray: ...


def validate(ring: BlockRing, fail: Fail, chunk: int = 1 << 18) -> None:
    """Check the loaded tables against the memory's invariants (:mod:`expreplay.storage.ring`, I1-I6).

    Calls ``fail(problem)`` (which raises) at the first violation. What a file may contain is
    what sampling relies on, for every written slot, not only the VALID ones:

    - flags are only the known bits; an episode end (TERMINATED / TRUNCATED) is a step, so it
      is only set with HAS_ACTION; a VALID slot has HAS_ACTION;
    - a slot with HAS_ACTION (an n-step window walks on from any such slot, VALID or not) has
      its next frame stored and written: the next slot of its block, or the first of the
      block its ``block_next`` names, which links back; that frame is the next step of the
      same episode (``epstep + 1``);
    - the frame after a step that ended its episode is the episode's final frame: no action
      was taken from it (so no window runs past an episode's end);
    - a VALID slot's history frames are stored and consecutive steps of its episode;
    - rewards are finite (a NaN or inf reward would poison every n-step sum it enters), and so
      are the values of float extra fields (the writers refuse both).

    The ring's sampling distribution checks its own state against these tables afterwards
    (:meth:`expreplay.storage.distribution.SamplingDistribution.load_state`: a prioritized
    memory's tree holds exactly the VALID slots, within the bound that keeps its sums finite).
    """
    _validate_blocks(ring, fail)
    _validate_slot_flags(ring, fail)
    _validate_steps(ring, fail, chunk)
    _validate_histories(ring, fail, chunk)


def _validate_blocks(ring: BlockRing, fail: Fail) -> None:
    """The block lists and tables (I1, I5, I6)."""
    nb, bs = ring.num_blocks, ring.block_size
    fill, prev, nxt = ring.block_fill, ring.block_prev, ring.block_next
    state, intact = ring.block_state, ring.block_prev_intact
    free = np.array(ring.free, np.int64)
    retired = np.array(ring.retired, np.int64)

    # I1: every block is free or retired (nothing is active in a file), exactly once.
    listed = np.concatenate([free, retired])
    if len(listed) != nb or listed.min(initial=0) < 0 or listed.max(initial=0) >= nb \
            or len(np.unique(listed)) != nb:
        fail("inconsistent: the free and retired lists are not a partition of the blocks")
    if (state[free] != _mem._FREE).any() or (state[retired] != _mem._RETIRED).any():
        fail("inconsistent: block_state disagrees with the free and retired lists")
    if fill[free].any():
        fail("inconsistent: a free block holds written slots")
    if (prev < -1).any() or (prev >= nb).any() or (nxt < -1).any() or (nxt >= nb).any():
        fail("inconsistent: block links outside the block range")
    if (prev[free] != -1).any() or (nxt[free] != -1).any():
        fail("inconsistent: a free block is linked into a lane")
    if (ring.block_gen < 0).any():
        fail("inconsistent: negative block generation")

    # Lane links (I5, I6): a linked predecessor links back, is full, and retires earlier.
    position = np.full(nb, -1, np.int64)
    position[retired] = np.arange(len(retired))
    linked = np.flatnonzero(prev >= 0)
    p = prev[linked]
    if (nxt[p] != linked).any() or (fill[p] != bs).any() or (position[p] >= position[linked]).any():
        fail("inconsistent: a lane's block links do not form a chain of full blocks in "
             "eviction order")
    used = np.flatnonzero(state != _mem._FREE)
    if (intact[used] != (prev[used] >= 0)).any():
        fail("inconsistent: block_prev_intact disagrees with block_prev")


def _validate_slot_flags(ring: BlockRing, fail: Fail) -> None:
    """The flags, episode steps, rewards and extras of the written slots (I2, I3)."""
    bs, fill = ring.block_size, ring.block_fill

    # Slots. Written ones only: the others were not loaded and are zeros.
    offsets = np.arange(bs)
    written = (offsets[None, :] < fill[:, None]).reshape(-1)
    flags = ring.flags[:ring.num_slots]
    epstep = ring.epstep
    if (flags[~written] != 0).any():
        fail("inconsistent: flags set on unwritten slots")
    w_flags = flags[written]
    known = _mem._VALID | _mem._TERMINATED | _mem._TRUNCATED | _mem._HAS_ACTION
    if (w_flags & ~np.uint8(known)).any():
        fail("inconsistent: unknown slot flags")
    if (epstep[written] < 0).any():
        fail("inconsistent: negative episode step")
    valid_flags = (w_flags & _mem._VALID) != 0
    acted = (w_flags & _mem._HAS_ACTION) != 0
    if (valid_flags & ~acted).any():
        fail("inconsistent: a slot is marked valid but no action was taken from it")
    if (((w_flags & (_mem._TERMINATED | _mem._TRUNCATED)) != 0) & ~acted).any():
        fail("inconsistent: a slot is marked as an episode's end but no action was taken from it")
    count = int(np.count_nonzero(valid_flags))
    if count != ring.num_valid:
        fail(f"inconsistent: {count} slots are marked valid, the metadata says {ring.num_valid}")
    if not np.isfinite(ring.reward[:ring.num_slots][written]).all():
        fail("inconsistent: a reward that is NaN or infinite")
    for name, arr in ring.extras.items():
        if arr.dtype.kind == 'f' and not np.isfinite(arr[written]).all():
            fail(f"inconsistent: extra field {name!r} holds a NaN or infinite value")


def _validate_histories(ring: BlockRing, fail: Fail, chunk: int) -> None:
    """A VALID slot's history frames are stored and consecutive steps of its episode."""
    bs, hl, prev, intact = ring.block_size, ring.history_len, ring.block_prev, ring.block_prev_intact
    flags, epstep = ring.flags[:ring.num_slots], ring.epstep
    valid = np.flatnonzero(flags & _mem._VALID)
    for lo in range(0, len(valid), chunk):
        slots = valid[lo:lo + chunk]
        block, offset = np.divmod(slots, bs)
        # The history: within the block, or in the intact previous block (I4, I5).
        reach = np.minimum(epstep[slots], hl - 1)
        needs_prev = reach > offset
        if (needs_prev & ((prev[block] < 0) | ~intact[block])).any():
            fail("inconsistent: a valid slot's history reaches into a block that is not stored")
        index = ring.history_index(slots)
        back = np.arange(hl - 1, -1, -1)
        real = back[None, :] <= epstep[slots][:, None]
        want = epstep[slots][:, None] - back[None, :]
        got = epstep[np.where(real, index, 0)]
        if (real & (got != want)).any():
            fail("inconsistent: a valid slot's history frames are not consecutive steps of "
                 "its episode")


def _validate_steps(ring: BlockRing, fail: Fail, chunk: int) -> None:
    """Every slot with an action leads to the next frame of its episode (see :func:`validate`)."""
    bs, fill, prev, nxt = ring.block_size, ring.block_fill, ring.block_prev, ring.block_next
    flags, epstep = ring.flags[:ring.num_slots], ring.epstep
    acted = np.flatnonzero(flags & _mem._HAS_ACTION)     # only written slots have flags (checked)
    for lo in range(0, len(acted), chunk):
        slots = acted[lo:lo + chunk]

        def check(bad, problem):
            if bad.any():
                who = "valid slot's" if (flags[slots[bad]] & _mem._VALID).any() else "step's"
                fail(f"inconsistent: a {who} {problem}")
        block, offset = np.divmod(slots, bs)
        # The next frame: the next slot of the block, or the first of the next block (I4).
        last = offset + 1 == bs
        nblock = np.where(last, nxt[block], block)
        check((nblock < 0) | (last & (prev[np.maximum(nblock, 0)] != block)),
              "next frame is not stored (no next block)")
        noff = np.where(last, 0, offset + 1)
        check(noff >= fill[nblock], "next frame is not written")
        nslot = nblock * bs + noff
        check(epstep[nslot] != epstep[slots] + 1, "next frame is not the next step of its episode")
        ended = (flags[slots] & (_mem._TERMINATED | _mem._TRUNCATED)) != 0
        check(ended & ((flags[nslot] & _mem._HAS_ACTION) != 0),
              "step ended its episode, but an action was taken from the episode's final frame")
