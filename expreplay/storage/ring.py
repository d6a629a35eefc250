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
updating ``block_fill`` / VALID (:meth:`BlockRing.append`); a sampler holds the lock while it
gathers, so an evicted block can not be rewritten under a sample that is reading it.

Interrupted writes
==================
The invariants hold after an exception at any instant (a signal's ``KeyboardInterrupt``, a
``MemoryError``, a failing hook), without help from the process (no signal handler): every
write that changes more than one value prepares all it stores first, reading the tables and
changing nothing, then commits the stores as one through the lock's journal
(:class:`~expreplay.storage._guard.WriteGuard`): a write cut short after its commit point is
run again, whole, at the next entry into the lock; one cut short before it changed nothing.
The stores are absolute (a count is stored as the value computed before, never incremented in
place; the free and eviction lists are :class:`~expreplay.storage._block_queue.BlockQueue` queues
whose changes name their position), so running them twice is running them once. A writer's
cursors are stored in the same commit as the tables they point into. The C write kernel's
calls and the C critical sections (``WriteGuard.run``) take and release the lock in C, so no
exception leaves it held.
The ring's :class:`~expreplay.storage.distribution.SamplingDistribution` (``distribution``:
uniform, or prioritized with its priority tree) is kept in step with VALID under the same lock:
the publishing of steps tells it which became VALID (``on_publish``), an eviction which stopped
being VALID (``on_evict``); a checkpoint exports and loads its state with the tables. A sample
token is ``block_gen * num_slots + slot`` (:meth:`BlockRing.tokens`): a slot rewritten since it
was sampled has a newer generation.

Every write of the tables is this class's: a writer (:mod:`~expreplay.storage.writers`)
keeps only its lanes' cursors and hands its frames and steps to :meth:`BlockRing.start`,
:meth:`BlockRing.append` and the kernel bound below; it takes blocks with
:meth:`BlockRing.reserve` and gives them back with :meth:`BlockRing.retire` (eviction happens
inside :meth:`~BlockRing.reserve`); a checkpoint reads :meth:`BlockRing.state` and fills a new
ring through :meth:`BlockRing.load_state`, which checks the invariants before the ring is used.
The sampler (:mod:`~expreplay.storage.sampling`) only reads. The tables stay public attributes
for reading (``tests/test_layout.py`` fails on an assignment to one outside this module).

The optional C kernel ``expreplay.storage._write_ext`` is this class's delegated
implementation of the common writes: a ``Store`` bound by :meth:`BlockRing.bind_kernel` to the
tables, the lock, the counts, the distribution's queue of published slots and one writer's
cursors; each of its calls is one write, the lock taken and released inside it; it writes
exactly what :meth:`append` / :meth:`start` would and declines (changing nothing) whatever it
does not handle. A writer asks :mod:`expreplay._kernels` for it when it is built and gives it
to :meth:`BlockRing.bind_kernel` (:func:`expreplay._kernels.numpy_only` switches it off for
writers built inside it).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ._block_queue import BlockQueue
from ._checkpoint_checks import validate
from ._guard import WriteGuard
from ._lane_geometry import LaneGeometry
from ._slots import _ACTIVE, _FREE, _RETIRED, _VALID
from .distribution import SamplingDistribution
from .priority import PriorityIndex


__all__ = ['BlockRing', 'TABLES', 'EXTRA_PREFIX', 'Stores']

#: A writer's part of a ring write: ``(array, index, value)`` stores of its cursors.
Stores = Sequence[tuple[np.ndarray, Any, Any]]


def _store(stores: Stores) -> None:
    for array, index, value in stores:
        array[index] = value

# The tables :meth:`BlockRing.state` exports, name (the ring's attribute) -> kind: ``block``
# tables have a row per block, ``queue`` ones are the free list and the eviction FIFO (block
# numbers), ``slot`` ones a row per slot. The extra fields follow as ``extra.<field>`` slot
# tables, then the sampling distribution's (a prioritized one's leaves: the ``priority`` table).
TABLES = {
    'block_fill': 'block', 'block_prev': 'block', 'block_next': 'block',
    'block_prev_intact': 'block', 'block_state': 'block', 'block_gen': 'block',
    'free': 'queue', 'retired': 'queue',
    'frames': 'slot', 'action': 'slot', 'reward': 'slot', 'epstep': 'slot', 'flags': 'slot',
}
EXTRA_PREFIX = 'extra.'


class BlockRing(LaneGeometry):
    """The slot and block tables of a replay memory and the block life cycle (module docstring).

    Args:
        num_blocks, block_size: the ring's geometry (``block_size >= history_len``, I4).
        history_len: frames in a state.
        state_shape, dtype: one frame's.
        extra_fields: name -> dtype of the extra per-step fields (one slot table each).
        distribution: how samples are drawn (uniform or prioritized); the ring resets it to
            its new tables and keeps it in step with them (the module docstring).
    """

    # Set by _set_new (at construction, and by a load that failed).
    free: BlockQueue
    retired: BlockQueue

    def __init__(self, num_blocks: int, block_size: int, history_len: int,
                 state_shape: tuple[int, ...], dtype: np.dtype,
                 extra_fields: Mapping[str, np.dtype],
                 distribution: SamplingDistribution) -> None:
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

        self.block_fill = np.empty(num_blocks, np.int64)
        self.block_prev = np.empty(num_blocks, np.int64)
        self.block_next = np.empty(num_blocks, np.int64)
        self.block_prev_intact = np.empty(num_blocks, bool)
        self.block_state = np.empty(num_blocks, np.int8)
        self.block_gen = np.empty(num_blocks, np.int64)      # +1 at every claim
        # Block arrays of writers collected unclosed (queued by their finalizers, lock-free).
        self.abandoned: collections.deque[np.ndarray] = collections.deque()
        #: ``num_valid`` and ``num_steps_written``: one array, so that the C kernel counts too.
        self.counts = np.zeros(2, np.int64)
        #: The lock, and the journal that makes each write one (the module docstring).
        self.lock = WriteGuard()
        self.distribution = distribution
        self._set_new()   # free, retired, the counts, the distribution's state

    @property
    def num_valid(self) -> int:
        """The number of VALID slots (I3)."""
        return int(self.counts[0])

    @property
    def num_steps_written(self) -> int:
        """All steps ever added, for statistics."""
        return int(self.counts[1])

    @property
    def extra_fields(self) -> dict[str, np.dtype]:
        """The extra per-step fields, name -> dtype (a new dict each time)."""
        return {name: arr.dtype for name, arr in self.extras.items()}

    @property
    def priorities(self) -> PriorityIndex | None:
        """The prioritized distribution's priority index (tree, running maximum), for
        reading; None for a uniform ring."""
        return self.distribution.priorities

    # ------------------------------------------------------------------ writing (writers)
    # Each write prepares its stores, then commits them as one (module docstring); ``owner``:
    # the writer's cursor stores, committed with the tables they point into.

    def open_claims(self, cursors: Sequence[np.ndarray]) -> list:
        """Begin a write that claims blocks (:meth:`claim`) before its steps: returns its undo
        log, which holds from now what puts the tables and the writer's ``cursors`` back as
        they are, so that a write cut short before its commit (:meth:`start_held`,
        :meth:`append_held`) leaves no claim and no eviction behind. Caller holds the lock."""
        while self.abandoned:
            # Retired before it leaves the queue: a cut short retire is done again. (Blocks
            # given back, not part of the write.)
            self._retire_active(self.abandoned[0])
            self.abandoned.popleft()
        log = self.lock.undoable()
        log.append((self._put_back, (
            [(table, table.copy()) for table in (self.counts, *cursors)],
            self.free.ends(), self.retired.ends())))
        return log

    def _put_back(self, tables, free, retired):
        """An undo of :meth:`open_claims`: the counts, the queues and the cursors as they were."""
        for table, before in tables:
            table[:] = before
        self.free.restore(free)
        self.retired.restore(retired)

    def _block_rows(self) -> tuple[np.ndarray, ...]:
        """The per-block tables a claim changes."""
        return (self.block_fill, self.block_prev, self.block_next, self.block_prev_intact,
                self.block_state, self.block_gen)

    def _rows_back(self, blocks: np.ndarray, rows: list[np.ndarray]) -> None:
        """An undo of a claim's per-block stores."""
        for table, before in zip(self._block_rows(), rows):
            table[blocks] = before

    def claim(self, prev_block: int, owner: Callable[[int], Stores], log: list) -> int:
        """A new active block for a writer's lane, linked after ``prev_block`` (-1: a new
        lane), which retires; ``owner(block)``: the writer's cursor stores that record the
        block as its lane's. Evicts the oldest retired block when no block is free (I6). In a
        write opened by :meth:`open_claims` (its undo ``log``). Caller holds the lock. Raises
        RuntimeError when every block is held by a writer."""
        eviction = None
        if self.free:
            block = self.free.first()
        elif self.retired:
            block = self.retired.first()
            eviction = self._plan_eviction(block)
        else:
            raise RuntimeError(
                f"all {self.num_blocks} blocks of the replay memory are held by writers: too "
                f"many writers for {self.num_slots} slots with block_size={self.block_size}; "
                "use a smaller block_size or fewer writers")
        touched = [block, prev_block] if eviction is None else [block, prev_block, eviction[2]]
        blocks = np.unique(np.array([b for b in touched if b >= 0], np.int64))
        log.append((self._rows_back, (blocks, [t[blocks].copy() for t in self._block_rows()])))
        if eviction is not None:
            _, lo, _, broken, _ = eviction
            slots = np.arange(lo, lo + self.block_size)
            if broken is not None:
                slots = np.concatenate([slots, broken])
            log.append((self._flags_back, (slots, self.flags[slots].copy())))
            restore = self.distribution.snapshot(slots)
            if restore is not None:
                log.append(restore)
        self._claimed(block, prev_block, eviction, int(self.block_gen[block]) + 1,
                      self.free.head + 1, self.retired.head + 1, self.retired.tail, owner(block))
        return block

    def _frames_held(self, slots: np.ndarray, frames: np.ndarray) -> None:
        """Frames written in a write that claimed blocks: a claimed block may be an evicted
        one, whose frames the write's undo puts back."""
        self.lock.note(self._frames_back, slots, self.frames[slots].copy())
        self.frames[slots] = frames

    def _frames_back(self, slots: np.ndarray, frames: np.ndarray) -> None:
        """An undo of :meth:`_frames_held`."""
        self.frames[slots] = frames

    def _flags_back(self, slots: np.ndarray, flags: np.ndarray) -> None:
        """An undo of an eviction's flags."""
        self.flags[slots] = flags

    def _claimed(self, block: int, prev_block: int, eviction: tuple | None, gen: int,
                 free_head: int, retired_head: int, retired_tail: int, owner: Stores) -> None:
        """:meth:`reserve`'s stores."""
        if eviction is None:
            self.free.drop_to(free_head)
        else:
            self.retired.drop_to(retired_head)
            self._evicted(*eviction)
        # Retire the writer's full block only now, so that it can not be handed straight back.
        if prev_block >= 0:
            self.retired.put(retired_tail, prev_block)
            self.block_state[prev_block] = _RETIRED
            self.block_next[prev_block] = block
        self.block_state[block] = _ACTIVE
        self.block_gen[block] = gen
        self.block_fill[block] = 0
        self.block_prev[block] = prev_block
        self.block_next[block] = -1
        self.block_prev_intact[block] = prev_block >= 0
        _store(owner)

    def retire(self, blocks: np.ndarray, owner: Stores = ()) -> None:
        """A writer is done with its ``blocks`` (-1: none): those still active retire (their
        data stays sampleable until evicted); ``owner``: the writer's cursor stores committed
        with it. Takes the lock."""
        self.lock.run(self._retire_active, blocks, owner)

    def abandon(self, blocks: np.ndarray) -> None:
        """Queue a dropped writer's blocks (-1: none) to be retired at the next claim. Takes
        no lock: a garbage collector's finalizer calls it, in any thread, inside any code."""
        self.abandoned.append(blocks)

    def start(self, blocks: np.ndarray, slots: np.ndarray, frames: np.ndarray,
              owner: Stores) -> None:
        """Episodes' first frames written at ``slots``, the next slots of the writers' active
        ``blocks`` (I1, I2); ``owner``: the writer's cursor stores. Takes the lock to
        publish them."""
        self.frames[slots] = frames    # outside the lock: the slots are the writer's, unpublished
        self.lock.run(self._start, blocks, slots, owner)

    def start_held(self, blocks: np.ndarray, slots: np.ndarray, frames: np.ndarray,
                   owner: Stores) -> None:
        """:meth:`start` for a caller that holds the lock (a write that claimed blocks)."""
        self._frames_held(slots, frames)
        self._start(blocks, slots, owner)

    def _start(self, blocks, slots, owner):
        self.lock.commit(self._started, blocks, self.block_fill[blocks] + 1, slots, owner)

    def _started(self, blocks, fill, slots, owner):
        """:meth:`start`'s stores."""
        self.epstep[slots] = 0
        self.flags[slots] = 0
        self.block_fill[blocks] = fill
        _store(owner)

    def append(self, blocks: np.ndarray, slots: np.ndarray, frames: np.ndarray,
               epsteps: np.ndarray, taken: np.ndarray, gens: np.ndarray | None,
               actions: np.ndarray, rewards: np.ndarray, flags: np.ndarray | np.uint8,
               extras: Mapping[str, np.ndarray] | None, owner: Stores) -> None:
        """Steps taken from the slots ``taken``: their next frames written at ``slots`` (the
        next slots of the active ``blocks``, episode steps ``epsteps``), and the steps'
        actions, rewards, extras and ``flags`` (TERMINATED / TRUNCATED | HAS_ACTION | VALID);
        ``owner``: the writer's cursor stores.

        ``gens``: None when every ``taken`` slot lies at offset >= ``history_len - 1`` of its
        writer's active block (VALID at once, I3); else the block generations the writer saw
        when it wrote them, and a step is kept only where its slot was not evicted since, and
        VALID only where its history is intact (I5). Takes the lock to publish.
        """
        self.frames[slots] = frames   # outside the lock (I1, I2)
        self.lock.run(self._append, blocks, slots, epsteps, taken, gens, actions, rewards,
                      flags, extras, owner)

    def append_held(self, blocks: np.ndarray, slots: np.ndarray, frames: np.ndarray,
                    epsteps: np.ndarray, taken: np.ndarray, gens: np.ndarray | None,
                    actions: np.ndarray, rewards: np.ndarray, flags: np.ndarray | np.uint8,
                    extras: Mapping[str, np.ndarray] | None, owner: Stores) -> None:
        """:meth:`append` for a caller that holds the lock (a write that claimed blocks)."""
        self._frames_held(slots, frames)
        self._append(blocks, slots, epsteps, taken, gens, actions, rewards, flags, extras, owner)

    def _append(self, blocks, slots, epsteps, taken, gens, actions, rewards, flags, extras,
                owner):
        written = len(slots)
        if gens is not None:
            taken, actions, rewards, flags, extras, published = self._check_taken(
                taken, gens, actions, rewards, flags, extras)
        else:
            published = taken
        counts = self.counts + (len(published), written)
        self.lock.commit(self._appended, blocks, self.block_fill[blocks] + 1, slots, epsteps,
                         taken, actions, rewards, flags, extras, counts,
                         self.distribution.prepare_publish(published), owner)

    def _appended(self, blocks, fill, slots, epsteps, taken, actions, rewards, flags, extras,
                  counts, publication, owner):
        """:meth:`append`'s stores."""
        self.epstep[slots] = epsteps
        self.flags[slots] = 0
        self.block_fill[blocks] = fill
        self.action[taken] = actions
        self.reward[taken] = rewards
        if extras:
            for name, values in extras.items():
                self.extras[name][taken] = values
        self.flags[taken] = flags
        self.counts[:] = counts
        self.distribution.on_publish(publication)
        _store(owner)

    def stage_extras(self, taken: np.ndarray, extras: Mapping[str, np.ndarray]) -> None:
        """The ``extras`` of steps about to be taken from ``taken``, slots in their writers'
        active blocks that no step was taken from yet, stored before the C kernel publishes
        the steps (unpublished rows: nothing reads them until then, and a declined call
        leaves them to be written again)."""
        for name, values in extras.items():
            self.extras[name][taken] = values

    def _check_taken(self, slots, gens, actions, rewards, flags, extras):
        """:meth:`append`'s steps where some lie in a previous block or at the start of one:
        those whose slot was evicted since are dropped, and those whose history was cut are
        kept but not VALID. Returns the steps kept, their flags, and the slots that become
        VALID. Reads only."""
        flags = np.broadcast_to(flags, slots.shape)
        block, offset = np.divmod(slots, self.block_size)
        # A slot whose block was evicted since (it was the last of the lane's previous block,
        # and the oldest) is as gone as any evicted step.
        alive = (self.block_gen[block] == gens) & (self.block_state[block] != _FREE)
        if not alive.all():
            slots, block, offset = slots[alive], block[alive], offset[alive]
            actions, rewards, flags = actions[alive], rewards[alive], flags[alive]
            if extras:
                extras = {name: values[alive] for name, values in extras.items()}
        needs_prev = np.minimum(self.epstep[slots], self.history_len - 1) > offset
        valid = ~needs_prev | self.block_prev_intact[block]
        flags = np.where(valid, flags, flags & np.uint8(~_VALID & 0xFF))
        return slots, actions, rewards, flags, extras, slots[valid]

    # ------------------------------------------------------------------ the C kernel (delegated)
    def bind_kernel(self, ext: Any, cursors: tuple[np.ndarray, ...]) -> Any:
        """The C kernel ``ext``'s ``Store`` bound to these tables, this ring's lock, counts and
        distribution, and a writer's ``cursors`` (next, current slot, its episode step, its
        offset, block, safe count, its generation: see
        :class:`~expreplay.storage.writers.BatchWriter`); None when ``ext`` is None (the
        writer's numpy path: the kernel not built, or the writer built inside
        :func:`expreplay._kernels.numpy_only`).

        The Store's ``step``, ``start`` and ``steps`` are this ring's writes (what
        :meth:`append` / :meth:`start` store, the counts and the distribution's publication
        included), each one C call that takes the lock (``lock.raw``) and releases it in C:
        nothing can interrupt one part-way. They decline (-1, changing nothing) what they do
        not handle, and while the lock's journal holds a write cut short."""
        if ext is None:
            return None
        fmt = self.frames[:0].data.format if self.dtype.kind in 'iub' else ''
        return ext.Store(
            (self.frames, self.epstep, self.flags, self.action, self.reward, self.block_fill,
             self.block_gen, self.block_state, self.block_prev_intact),
            cursors, fmt, self.state_shape, self.history_len, self.block_size,
            (self.lock.raw, self.lock.pending, self.counts, self.distribution.published,
             self.distribution.publish_limit))

    # ------------------------------------------------------------------ block life cycle
    def _retire_active(self, blocks: np.ndarray, owner: Stores = ()) -> None:
        """The still active ``blocks`` retire, newest last, with ``owner``'s stores. Under
        the lock."""
        active = [b for b in blocks[blocks >= 0].tolist() if self.block_state[b] == _ACTIVE]
        self.lock.commit(self._retired, active, self.retired.tail, owner)

    def _retired(self, blocks: list[int], tail: int, owner: Stores) -> None:
        """:meth:`_retire_active`'s stores."""
        for i, block in enumerate(blocks):
            self.retired.put(tail + i, block)
            self.block_state[block] = _RETIRED
        _store(owner)

    def _plan_eviction(self, block: int) -> tuple:
        """What evicting ``block`` stores (:meth:`_evicted`'s arguments): everything in it is
        forgotten (I2, I3) and its successor's history cut (I5). Reads only."""
        lo = block * self.block_size
        num_valid = self.num_valid - int(np.count_nonzero(self.flags[lo:lo + self.block_size]
                                                          & _VALID))
        succ = int(self.block_next[block])
        broken_slots = None
        if succ >= 0 and self.block_prev[succ] == block:
            # Slots at offset o of the successor need the evicted block when their history
            # (min(epstep, history_len - 1) frames back) reaches before offset 0.
            n = min(self.history_len - 1, int(self.block_fill[succ]))
            s_lo = succ * self.block_size
            needs = np.minimum(self.epstep[s_lo:s_lo + n], self.history_len - 1) > np.arange(n)
            broken = needs & ((self.flags[s_lo:s_lo + n] & _VALID) != 0)
            num_valid -= int(np.count_nonzero(broken))
            broken_slots = s_lo + np.flatnonzero(broken)
        else:
            succ = -1
        return block, lo, succ, broken_slots, num_valid

    def _evicted(self, block: int, lo: int, succ: int, broken_slots: np.ndarray | None,
                 num_valid: int) -> None:
        """An eviction's stores (:meth:`_plan_eviction`)."""
        self.flags[lo:lo + self.block_size] = 0
        self.block_fill[block] = 0
        if succ >= 0:
            self.block_prev_intact[succ] = False
            self.flags[broken_slots] &= ~np.uint8(_VALID)
            self.block_prev[succ] = -1
        self.counts[0] = num_valid
        self.distribution.on_evict(lo, lo + self.block_size, broken_slots)
        self.block_prev[block] = -1
        self.block_next[block] = -1
        self.block_state[block] = _FREE

    # ------------------------------------------------------------------ exported state
    def state(self) -> tuple[dict[str, Any], dict[str, tuple[np.dtype, tuple[int, ...], list[np.ndarray]]]]:
        """What a checkpoint stores: ``(counters, tables)``; ``counters``: ``num_valid``,
        ``num_steps_written`` and the distribution's :meth:`~SamplingDistribution.state`;
        ``tables``: name -> (dtype, shape, chunks) of every table in :data:`TABLES` order, then
        the extra fields (``extra.<name>``) and the distribution's tables (a prioritized one's
        ``priority`` leaves). Slot tables hold the written slots only (chunks are views of
        each written block's rows, in block order);
        active blocks are exported retired (newest last), as after their writers' ``close()``.
        Caller holds the lock (the chunks are views)."""
        # First: the distribution enters what is pending into its tables, read below.
        distribution_counters = self.distribution.state()
        bs = self.block_size
        written = np.flatnonzero(self.block_fill).tolist()
        rows = int(self.block_fill.sum())
        active = np.flatnonzero(self.block_state == _ACTIVE)
        out = {}
        for name, arr, kind in self.tables():
            if name == 'block_state':
                arr = np.where(arr == _ACTIVE, _RETIRED, arr).astype(arr.dtype)
            elif kind == 'queue':
                arr = np.array(arr.tolist(), np.int64)
                if name == 'retired':
                    arr = np.concatenate([arr, active.astype(np.int64)])
            if kind == 'slot':
                chunks = [arr[b * bs:b * bs + int(self.block_fill[b])] for b in written]  # views
                out[name] = (arr.dtype, (rows,) + arr.shape[1:], chunks)
            else:
                out[name] = (arr.dtype, arr.shape, [arr])
        counters: dict[str, Any] = dict(num_valid=self.num_valid,
                                        num_steps_written=self.num_steps_written,
                                        **distribution_counters)
        return counters, out

    def table_names(self) -> list[str]:
        """The names of :meth:`state`'s tables for this ring."""
        return [name for name, _, _ in self.tables()]

    @property
    def untouched(self) -> bool:
        """Nothing ever written, no block held by a writer: :meth:`load_state` may fill it."""
        return self.num_steps_written == 0 and len(self.free) == self.num_blocks

    def load_state(self, counters: Mapping[str, Any], source: Any) -> None:
        """Fill this new ring (:attr:`untouched`) with an exported :meth:`state`, then check
        it against the invariants (I1-I7: :func:`~expreplay.storage._checkpoint_checks.validate`).
        In place (bound arrays stay valid); if reading or checking fails, the ring is new again.

        ``source`` supplies the tables: ``source.read_into(name, targets, dtype, shape)`` fills
        the C-contiguous ``targets`` in order, ``source.read_queue(name, max_len)`` returns a
        queue's int64 array, ``source.missing`` names tables its format lacks (they keep their
        initial value), and ``source.fail(problem)`` raises. Counters come from ``counters``
        (``num_valid``, ``num_steps_written``, and the distribution's: for a prioritized ring
        ``max_priority`` and ``stale_priority_updates``).
        """
        # Until it is checked, a load cut short (or failed) leaves a new ring: the journal
        # holds that reset, which the next entry into the lock runs if this one can not.
        self.lock.begin(self._set_new)
        try:
            self._load_state(counters, source)
        except BaseException:
            self._set_new()
            self.lock.end()
            raise
        self.lock.end()

    def _load_state(self, counters: Mapping[str, Any], source: Any) -> None:
        """:meth:`load_state`'s reading and checking, which may fail part-way."""
        bs, missing = self.block_size, set(source.missing)
        tables = [(n, a, k) for n, a, k in self.tables() if n not in missing]
        for name, arr, kind in tables:
            if kind == 'block':
                source.read_into(name, [arr], arr.dtype, arr.shape)
        fill = self.block_fill
        if fill.min() < 0 or fill.max() > bs:
            source.fail(f"inconsistent: block_fill outside [0, {bs}]")
        rows = int(fill.sum())
        written = [(b, int(fill[b])) for b in np.flatnonzero(fill).tolist()]
        for name, arr, kind in tables:
            if kind == 'queue':
                queue = BlockQueue(self.num_blocks, source.read_queue(name, self.num_blocks).tolist())
                setattr(self, name, queue)
            elif kind == 'slot':
                source.read_into(name, [arr[b * bs:b * bs + n] for b, n in written], arr.dtype,
                                 (rows,) + arr.shape[1:])
        self.counts[:] = (counters['num_valid'], counters['num_steps_written'])
        validate(self, source.fail)
        # After the ring's checks: the distribution checks its state against the VALID flags.
        self.distribution.load_state(counters, source.fail)

    def _set_new(self) -> None:
        """A ring nothing was written to, its tables set in place (writers and samplers keep
        the arrays they bound): at construction, and after a :meth:`load_state` that failed
        part-way. Slot rows stay as they are: garbage of free blocks (I2)."""
        for table, value in ((self.block_fill, 0), (self.block_prev, -1), (self.block_next, -1),
                             (self.block_prev_intact, False), (self.block_state, _FREE),
                             (self.block_gen, 0), (self.flags, 0)):
            table[:] = value
        self.free = BlockQueue(self.num_blocks, range(self.num_blocks))
        self.retired = BlockQueue(self.num_blocks)
        self.counts[:] = 0
        self.distribution.reset(self.flags, self.lock)

    def tables(self) -> list[tuple[str, Any, str]]:
        """(name, array, kind) of every exported table (see :data:`TABLES`), for reading."""
        out = [(name, getattr(self, name), kind) for name, kind in TABLES.items()]
        out += [(EXTRA_PREFIX + field, arr, 'slot') for field, arr in self.extras.items()]
        return out + self.distribution.tables()

