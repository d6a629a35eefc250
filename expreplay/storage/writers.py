"""The write path of the replay memory: :class:`BatchWriter` (many lanes in one call) and
:class:`LaneWriter` (one environment, scalar arguments).

A writer owns its lanes' active blocks (the ring's invariant I1, see
:mod:`expreplay.storage.ring`) and keeps only its lanes' cursors (the block, the next slot, the
current observation's slot): every write of the ring's tables is the ring's own
(:meth:`~expreplay.storage.ring.BlockRing.reserve`, :meth:`~expreplay.storage.ring.BlockRing.start`,
:meth:`~expreplay.storage.ring.BlockRing.append`, :meth:`~expreplay.storage.ring.BlockRing.retire`).
The rules of what may be written are :mod:`expreplay.storage._inputs`. Both classes are
re-exported by :mod:`expreplay.storage.memory`.

The common cases run in the ring's optional C kernel (a ``Store`` the ring binds to its
tables and a writer's cursors when the writer is built): a single lane's
:meth:`LaneWriter.add_step` and :meth:`LaneWriter.start_episode`, and a step of many lanes
(:meth:`BatchWriter.try_add_steps`). Writers built inside :func:`expreplay._kernels.numpy_only`
take the numpy path for good (what the tests do to check both).

A writer dropped without :meth:`~BatchWriter.close` gives its blocks back when it is garbage
collected (a finalizer queues them; the memory retires them at its next block claim, and
collects garbage once before it reports that every block is held).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from .. import _kernels
from .._checks import check_bool, check_int
from ._inputs import (as_frame, check_action, check_actions, check_extras, check_flags,
                      check_frames, check_reward, check_rewards)
from ._slots import _HAS_ACTION, _VALID
from .ring import BlockRing, Stores

__all__ = ['BatchWriter', 'LaneWriter', 'TensorpackAppender']



class WithRing(Protocol):
    """What a writer needs of its :class:`~expreplay.storage.memory.ReplayMemory`: the ring
    (a protocol, so that this module, which the memory imports, imports no memory)."""
    ring: BlockRing


_LANE0 = np.zeros(1, np.int64)
_LANE0.flags.writeable = False     # LaneWriter's lanes: known good, not checked again


class BatchWriter:
    """Writes the steps of ``num_lanes`` environments into lanes of a :class:`ReplayMemory`,
    all lanes of one call at once.

    This is the write path of the memory (a :class:`LaneWriter` is a batch writer of one lane):
    a call takes the frames, actions, rewards and ends of any subset of the lanes as arrays,
    writes the frames with one fancy-index copy, and publishes the steps under one acquisition
    of the memory's lock, without a Python loop over the lanes (a loop runs only over the
    lanes whose block is full, once every ``block_size`` steps). Each lane behaves exactly like
    a :class:`LaneWriter`: its own chain of blocks, its episodes contiguous, every step
    sampleable as soon as the call returns.

    Per-lane state (arrays over the lanes), and why the common call needs so few operations:

    * ``_block``: the lane's active block (-1: none yet); ``_next``: its next free slot.
      ``_safe`` counts the calls left before some lane may run out of room in its block; a call
      writes at most one frame per lane, so until it reaches 0 no block needs claiming.
    * ``_cur_slot``: the slot of the lane's current observation (-1: no episode open), the
      slot the next step is taken from; ``_cur_gen`` its block's generation when written.
    * ``_cur_off``: ``_cur_slot``'s offset in the active block, or -1 when it lies in the
      lane's previous block. A step from a slot at offset >= ``history_len - 1`` of the active
      block is VALID at once (I3: its history is in the block, and an active block is never
      evicted); the others (just after a block change) take the careful path, which checks
      the previous block's generation and the ``block_prev_intact`` link.

    Use it from one thread. ``lanes`` (of the methods that write): the lanes of the call, a
    sequence or 1-D array of *distinct* integers in ``[0, num_lanes)``; anything else (bools,
    floats, a negative or too large lane, a lane twice) is refused, naming ``lanes``, before
    anything is written (see :meth:`_lanes`).

    Dropped without :meth:`close`, a writer gives its blocks back once it is garbage collected.
    """

    def __init__(self, memory: WithRing, num_lanes: int) -> None:
        self.memory = memory
        self._ring = ring = memory.ring
        self.num_lanes = check_int(num_lanes, 'num_lanes', 1)
        k = self.num_lanes
        self._block = np.full(k, -1, np.int64)
        self._next = np.zeros(k, np.int64)
        self._cur_slot = np.full(k, -1, np.int64)
        self._cur_gen = np.zeros(k, np.int64)
        self._cur_epstep = np.zeros(k, np.int64)   # kept here: the slot's block may be evicted
        self._cur_off = np.full(k, -1, np.int64)
        self._safe = np.zeros(1, np.int64)   # an array: the C kernel counts it down too
        self._closed = False
        # The ring's C kernel bound to these cursors and the ring's tables (None: numpy), taken
        # here, once (expreplay._kernels): bound at first use instead, a path switched under
        # the live writer would decide, and its lanes' writes would mix the two paths.
        self._store: Any = ring.bind_kernel(_kernels.get('_write_ext'), self._cursors())
        # A static method (a bound one would keep the writer alive), given the ring by weak
        # reference (a memory holding its legacy writer would otherwise never be freed).
        self._finalizer = weakref.finalize(self, BatchWriter._give_back, weakref.ref(ring),
                                           self._block)

    def in_episode(self, lanes: Any = None) -> np.ndarray:
        """Bool array: which lanes are between an episode's first frame and its end."""
        self._ring.lock.settle()
        cur = self._cur_slot if lanes is None else self._cur_slot[lanes]
        return cur >= 0

    def current_slots(self, lanes: Any = None) -> np.ndarray:
        """The slot of each lane's newest observation (-1 outside an episode): a copy."""
        self._ring.lock.settle()
        return (self._cur_slot if lanes is None else self._cur_slot[lanes]).copy()

    def lane_in_episode(self, lane: int) -> bool:
        """Whether ``lane`` is between an episode's first frame and its end."""
        self._ring.lock.settle()
        return bool(self._cur_slot[lane] >= 0)

    def start_episodes(self, lanes: Any, frames: Any, *, checked: bool = False) -> None:
        """Start a new episode in each of ``lanes`` with its first observation ``frames[j]``.

        An episode still open in such a lane is abandoned: its steps so far stay sampleable.
        ``checked=True`` skips the frame check (the caller ran :func:`check_frames` itself).
        """
        ring = self._ring
        lanes = self._lanes(lanes)
        if not checked:
            frames = _batch(check_frames(frames, ring.state_shape, ring.dtype, 'frames'),
                            len(lanes), 'frames', ndim=2)
        if self._safe[0] > 0:
            self._start(lanes, frames)
        else:
            ring.lock.run(self._claim_then, self._start, lanes, frames)

    def _start(self, lanes, frames, safe=None):
        """:meth:`start_episodes`' write, once the lanes have room (``safe``: the calls left
        then, when the blocks were just claimed, under the lock, in the same write)."""
        slots = self._next[lanes]
        owner = self._advance(lanes, slots, 0, safe)
        if safe is None:
            self._ring.start(self._block[lanes], slots, frames, owner)
        else:
            self._ring.start_held(self._block[lanes], slots, frames, owner)

    def add_steps(self, lanes: Any, actions: Any, rewards: Any, next_frames: Any, terminated: Any,
                  truncated: Any, *, checked: bool = False,
                  extras: Mapping[str, Any] | None = None) -> None:
        """Record the step each of ``lanes`` took from its current observation.

        Args (arrays of ``len(lanes)``): ``actions`` (integers), ``rewards`` (finite),
        ``next_frames`` (the observation after the step; the final observation when the step
        ends the episode, also for a truncated end), ``terminated`` / ``truncated`` (bool: as
        in :meth:`LaneWriter.add_step`). A lane whose step ends its episode must start a new
        one before its next step. ``checked=True`` skips the checks of the values (the
        runners check them before, so that a bad value is the env's failure).
        ``extras``: for a memory with ``extra_fields``, a dict holding every field, each an
        array of ``len(lanes)`` values (always checked, whatever ``checked`` says).
        """
        ring = self._ring
        lanes = self._lanes(lanes)
        n = len(lanes)
        cur = self._cur_slot[lanes]
        if not checked:
            if (cur < 0).any():
                raise RuntimeError(f"add_steps: lanes {lanes[cur < 0].tolist()} are outside an episode: "
                                   "start_episodes(lanes, frames) with the reset observations first")
            actions = _batch(check_actions(actions, 'actions'), n, 'actions')
            rewards = _batch(check_rewards(rewards, 'rewards'), n, 'rewards')
            next_frames = _batch(check_frames(next_frames, ring.state_shape, ring.dtype,
                                              'next_frames'), n, 'next_frames', ndim=2)
            terminated = _batch(check_flags(terminated, 'terminated'), n, 'terminated')
            truncated = _batch(check_flags(truncated, 'truncated'), n, 'truncated')
        if ring.extras or extras:
            extras = check_extras(extras, ring.extra_fields, n)
        args = (lanes, cur, actions, rewards, next_frames, terminated, truncated, extras)
        if self._safe[0] > 0:
            self._append(*args)
        else:
            ring.lock.run(self._claim_then, self._append, *args)

    def _append(self, lanes, cur, actions, rewards, next_frames, terminated, truncated, extras,
                safe=None):
        """:meth:`add_steps`' write, once the lanes have room (``safe`` as in :meth:`_start`)."""
        ring = self._ring
        ended = terminated | truncated
        any_end = ended.any()
        if any_end:
            flags = (terminated.astype(np.uint8) << 1) | (truncated.astype(np.uint8) << 2) \
                | np.uint8(_HAS_ACTION | _VALID)
        else:
            flags = np.uint8(_HAS_ACTION | _VALID)
        slots = self._next[lanes]
        # A lane that just took a new block has its current slot in the previous block
        # (_cur_off -1), which another writer's claim may evict before we publish.
        careful = (self._cur_off[lanes] < ring.history_len - 1).any()
        epsteps = self._cur_epstep[lanes] + 1
        owner = self._advance(lanes, slots, epsteps, safe)
        if any_end:
            owner.append((self._cur_slot, lanes[ended], -1))     # the lanes' episodes ended
        write = ring.append if safe is None else ring.append_held
        write(self._block[lanes], slots, next_frames, epsteps, cur,
              self._cur_gen[lanes] if careful else None, actions, rewards, flags, extras, owner)

    def _claim_then(self, write, *args):
        """Under the lock: a new block for every lane whose block is full, then ``write(*args,
        safe=...)``, as one write of the ring: the claims (and the evictions they make) are
        undone if the write is cut short before it commits (:meth:`BlockRing.open_claims`)."""
        ring = self._ring
        ring.distribution.make_room(self.num_lanes)     # before the claims: a write of its own
        try:
            try:
                safe = self._claim_full_lanes(ring.open_claims(self._cursors()))
            except RuntimeError:
                # Every block is held: by writers alive, or by ones dropped in a reference
                # cycle, which only the cycle collector finds (their finalizers give the
                # blocks back, and the next claims take them).
                ring.lock.abort()
                gc.collect()
                safe = self._claim_full_lanes(ring.open_claims(self._cursors()))
            write(*args, safe=safe)
        except BaseException:
            ring.lock.abort()     # the claims undone now (or by the next entry, if cut short)
            raise

    def try_add_steps(self, lanes: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
                      next_frames: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, *,
                      extras: Mapping[str, Any] | None = None) -> bool:
        """:meth:`add_steps`' common case in one C call (the ring's write kernel), for a caller
        that checked the values (``checked=True``): True when the steps are stored; False,
        having changed nothing, when the kernel is not built or a lane needs the general path
        (a full block, a slot near a block start, an episode end, a bad reward): call
        :meth:`add_steps` then. ``lanes`` must be a valid int64 array of distinct lanes,
        ``actions`` int64, ``rewards`` float64, ``next_frames`` C-contiguous frames of the
        memory's dtype. ``extras`` as in :meth:`add_steps` (checked first: bad extras raise,
        changing nothing)."""
        ring = self._ring
        store = self._store
        if store is None or self._closed or next_frames.dtype != ring.dtype \
                or next_frames.shape[1:] != ring.state_shape:
            return False
        if ring.extras or extras:
            extras = check_extras(extras, ring.extra_fields, len(lanes))
            if (self._cur_off[lanes] < ring.history_len - 1).any():
                return False      # a current slot in the previous block: the numpy path's
            ring.stage_extras(self._cur_slot[lanes], extras)
        return store.steps(lanes, actions, next_frames, rewards, terminated, truncated) >= 0

    def close(self) -> None:
        """Detach from the memory: every lane's active block is retired. Idempotent."""
        self._finalizer.detach()
        self._ring.lock.settle()
        self._ring.retire(self._block, ((self._block, slice(None), -1),
                                        (self._cur_slot, slice(None), -1)))
        self._closed = True

    def kernel_binding(self) -> Any:
        """The ring's C kernel bound to this writer's cursors when it was built (None: not
        built, or the writer was built inside :func:`expreplay._kernels.numpy_only`)."""
        return self._store

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _give_back(ring_ref: weakref.ReferenceType[BlockRing], blocks: np.ndarray) -> None:
        """A dropped writer's finalizer: queue its active ``blocks`` for the ring to retire
        (lock-free: :meth:`~expreplay.storage.ring.BlockRing.abandon`), if the ring is alive."""
        ring = ring_ref()
        if ring is not None:
            ring.abandon(blocks)

    def _cursors(self) -> tuple[np.ndarray, ...]:
        """The lanes' cursors, in the order the ring's kernel binds them."""
        return (self._next, self._cur_slot, self._cur_epstep, self._cur_off, self._block,
                self._safe, self._cur_gen)

    def _lanes(self, lanes):
        """``lanes`` as an int64 array, by the rule of the class docstring: a sequence or 1-D
        array of distinct integers in ``[0, num_lanes)``. Checked on every call (it is cheap:
        a few numpy reductions), because a bad lane corrupts the memory: a repeated lane
        would count its step twice, a negative one write another lane's block."""
        if self._closed:
            raise RuntimeError("this writer is closed")
        self._ring.lock.settle()      # a write cut short may still store this writer's cursors
        if lanes is _LANE0:
            return lanes
        arr = np.asarray(lanes)
        if arr.ndim > 1 or (arr.dtype.kind not in "iu" and arr.size):
            raise TypeError(f"lanes must be distinct integer lane indices in [0, {self.num_lanes}), "
                            f"got {lanes!r}")
        arr = arr.astype(np.int64, copy=False).reshape(-1)
        if len(arr) and (arr.min() < 0 or arr.max() >= self.num_lanes):
            raise ValueError(f"lanes must be in [0, {self.num_lanes}) (this writer's lanes), got "
                             f"{arr.tolist()}")
        if len(arr) > 1 and np.bincount(arr, minlength=0).max() > 1:
            raise ValueError(f"lanes must be distinct (one step per lane per call), got {arr.tolist()}")
        return arr

    def _claim_full_lanes(self, log: list) -> int:
        """Give every lane with a full (or no) block a new one, in the write whose undo
        ``log`` is open; returns the calls left before some lane may need a block again."""
        ring = self._ring
        bs = ring.block_size
        blocks = self._block
        for j in np.flatnonzero((blocks < 0) | (self._next == blocks * bs + bs)).tolist():
            ring.claim(int(blocks[j]), self._lane_claims(j), log)
        return int((blocks * bs + bs - self._next).min())

    def _lane_claims(self, lane: int) -> Callable[[int], Stores]:
        """The cursor stores that make a claimed block ``lane``'s, committed with the claim;
        the lane's current observation then lies in the previous block."""
        bs = self._ring.block_size

        def stores(block: int) -> Stores:
            return ((self._block, lane, block), (self._next, lane, block * bs),
                    (self._cur_off, lane, -1))
        return stores

    def _advance(self, lanes, slots, epsteps, safe=None):
        """The cursor stores (committed with the ring's write) that make the frames written
        at ``slots`` the lanes' current observations, and count the call (``safe``: the
        calls left before it, when blocks were just claimed)."""
        block = self._block[lanes]
        left = int(self._safe[0]) if safe is None else safe
        return [(self._safe, 0, left - 1),
                (self._next, lanes, slots + 1), (self._cur_slot, lanes, slots),
                (self._cur_epstep, lanes, epsteps),
                (self._cur_gen, lanes, self._ring.block_gen[block]),
                (self._cur_off, lanes, slots - block * self._ring.block_size)]


class LaneWriter:
    """Writes one environment's steps into its own lane of a :class:`ReplayMemory`.

    Use it from one thread. Call :meth:`start_episode` with the observation ``reset()``
    returned, then :meth:`add_step` after every environment step. Each step is sampleable as
    soon as ``add_step`` returns, so a writer stopped mid-episode loses nothing it has added.
    A :class:`BatchWriter` of one lane, with scalar arguments.
    """

    def __init__(self, memory: WithRing) -> None:
        self.memory = memory
        self._ring = ring = memory.ring
        self._writer = BatchWriter(memory, 1)
        # The ring's C kernel bound to this lane's cursors, for add_step's and start_episode's
        # common case: the binding its batch writer took when built just above (one moment,
        # expreplay._kernels); None: numpy, or a memory whose steps it does not take (extra
        # fields, float frames).
        self._store = (self._writer.kernel_binding()
                       if not ring.extras and ring.dtype.kind in 'iub' else None)

    @property
    def in_episode(self) -> bool:
        """True between :meth:`start_episode` and the step that ends the episode."""
        return self._writer.lane_in_episode(0)

    @property
    def current_slot(self) -> int | None:
        """The memory slot of this lane's newest observation; None outside an episode."""
        slot = int(self._writer.current_slots()[0])
        return slot if slot >= 0 else None

    def start_episode(self, obs: Any) -> None:
        """Start a new episode in this lane with its first observation (from ``reset()``).

        An episode still open is abandoned: its steps so far stay sampleable.
        """
        store = self._store
        if store is not None and store.start(obs) >= 0:
            return
        frame = self._check_obs(obs, 'obs')
        self._writer.start_episodes(_LANE0, frame[None], checked=True)

    def add_step(self, action: Any, reward: Any, next_obs: Any, terminated: Any = False,
                 truncated: Any = False, *, extras: Mapping[str, Any] | None = None) -> None:
        """Record the step taken from the current observation.

        Args:
            action (int): the action taken.
            reward (float): the reward received (finite).
            next_obs: the observation after the step; when the step ends the episode it is
                the final observation (the true next state, also for a truncated end).
            terminated (bool): the episode reached a terminal state (``isOver`` when sampled).
            truncated (bool): the episode was cut (time limit): the transition bootstraps.
            extras (dict): for a memory with ``extra_fields``, every field's value for this
                step (a scalar each), e.g. ``{'lives': info['lives']}``; returned with the
                transition from the current observation.
        """
        store = self._store
        if store is not None and extras is None \
                and store.step(action, reward, next_obs, terminated, truncated) >= 0:
            # The common case (int action, float reward, a frame of the memory's shape and
            # dtype, bool ends, room in the block) checked and stored in one C call.
            return
        if not self._writer.lane_in_episode(0):
            raise RuntimeError("add_step called outside an episode: call start_episode(obs) "
                               "with the reset observation first")
        action = self._check_action(action)
        reward = self._check_reward(reward)
        frame = self._check_obs(next_obs, 'next_obs')
        terminated = check_bool(terminated, 'terminated')
        truncated = check_bool(truncated, 'truncated')
        if extras is not None or self._ring.extras:
            extras = check_extras(extras, self._ring.extra_fields)
        self._writer.add_steps(_LANE0, np.array([action], np.int32), np.array([reward], np.float32),
                               frame[None], np.array([terminated]), np.array([truncated]),
                               checked=True, extras=extras)

    def close(self) -> None:
        """Detach from the memory: the lane's active block is retired. Idempotent."""
        self._writer.close()

    def _check_obs(self, obs, name):
        return as_frame(obs, self._ring.state_shape, self._ring.dtype, name)

    # The one-value forms of the input rules (expreplay.storage._inputs).
    _check_action = staticmethod(check_action)
    _check_reward = staticmethod(check_reward)


class TensorpackAppender:
    """:meth:`ReplayMemory.append`'s single writer (tensorpack's convention, documented
    there): a :class:`LaneWriter` that holds each non-terminal step back until the next
    ``append`` brings its next state."""

    def __init__(self, memory: WithRing) -> None:
        self.memory = memory
        self._writer = LaneWriter(memory)
        # (action, reward, the lane's current slot) of the step held back: the slot tells
        # whether an append cut short wrote it already (the lane has moved on since).
        self._pending: tuple[int, float, int | None] | None = None

    def append(self, state: Any, action: Any, reward: Any, is_over: Any) -> None:
        """Add one step (see :meth:`ReplayMemory.append`)."""
        ring, w = self.memory.ring, self._writer
        # Check everything before writing anything, so that a bad step changes nothing.
        as_frame(state, ring.state_shape, ring.dtype, 'exp.state')
        action, reward = check_action(action), check_reward(reward)
        is_over = check_bool(is_over, 'exp.isOver')
        held = self._pending
        if held is None:
            w.start_episode(state)
        elif held[2] == w.current_slot:
            w.add_step(held[0], held[1], next_obs=state)
        self._pending = None
        if is_over:
            w.add_step(action, reward, np.zeros(ring.state_shape, ring.dtype), terminated=True)
        else:
            self._pending = (action, reward, w.current_slot)


def _batch(arr, n, name, ndim=1):
    """``arr``, refused unless it holds one value (one frame: ``ndim`` > 1) per lane."""
    if arr.shape[:1] != (n,) or (ndim == 1 and arr.ndim != 1):
        raise ValueError(f"{name} has shape {arr.shape}: expected one per lane of the call ({n})")
    return arr
