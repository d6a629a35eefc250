"""The replay memory: every observation frame stored once, sampled as stacked histories.

Layout
======
The memory is one ring of ``num_blocks * block_size`` *slots*. A slot holds one observation
frame plus the step taken from it (action, reward, how the step ended) and the frame's index
inside its episode (``epstep``: 0 for the observation returned by ``reset()``).

Slots are handed out in *blocks* of ``block_size`` consecutive slots. Each writer (one per
environment, see :class:`LaneWriter`) owns one *active* block at a time and fills it slot by
slot; when it is full the writer takes another block and links the two. The chain of blocks of
one writer is its *lane*: inside a block an episode's frames are contiguous, and across a block
boundary the ``block_prev`` / ``block_next`` links say where the lane continues. This is what
lets any number of writers share the memory without declaring a count up front, while each
episode stays readable as consecutive frames.

A new block comes from the free list while there is one, and then by evicting the block that
was *retired* (filled, or abandoned by a closed writer) longest ago. Eviction is therefore
oldest-first across all writers, one block at a time, and the memory holds roughly the most
recent ``max_size`` steps.

Invariants (kept under ``self._lock``)
======================================
I1  A block is in exactly one of: the free list, ``_retired`` (FIFO, oldest first), or active
    (owned by exactly one writer). Only the owner writes into an active block.
I2  Slots ``[0, block_fill[b])`` of block ``b`` hold written frames; the rest are garbage.
    ``block_fill`` only grows while the block is active and drops to 0 when it is evicted.
I3  A slot's VALID flag is set iff its transition can be sampled: an action was taken from its
    frame, the next frame is written (in the next slot of the lane), and every frame of its
    history (the ``history_len - 1`` frames before it, within its episode) is still stored.
    ``_num_valid`` is the number of VALID slots.
I4  History never reaches further back than the previous block of the lane, because
    ``block_size >= history_len``; the next frame never lies further ahead than the next block.
I5  ``block_prev_intact[b]`` is False once the block before ``b`` in its lane has been evicted;
    the slots of ``b`` whose history reaches into it lose VALID at that moment.
I6  A lane's blocks retire in lane order, so eviction (FIFO) never removes a block before its
    predecessor: a VALID slot's next frame can not have been evicted.
I7  Slot ``ZERO_SLOT`` (the last one) is never written and stays zeros: history positions
    before an episode's first frame point at it, so one fancy index gathers padded states.

Frames are written outside the lock (a memcpy the writer owns, I1) and published under it by
updating ``block_fill`` / VALID; a sampler holds the lock while it gathers, so an evicted block
can not be rewritten under a sample that is reading it.
Prioritized memories keep a :class:`~expreplay.storage.priority.PriorityIndex` (``self._priorities``,
None when uniform) in step with VALID through two hooks, called under the lock by every write
path: ``on_publish(slots)`` when steps become VALID (``_publish_step``), and
``on_evict(lo, hi, invalidated)`` when a block is evicted (``_evict``). A sample token
(``SampleBatch.indices``) is ``block_gen * num_slots + slot``: a slot rewritten since it was
sampled has a newer generation, so :meth:`ReplayMemory.update_priorities` can tell.

This module is the ring, its validity rule (I1-I7) and sampling. The write path is
:mod:`expreplay.storage.writers` (:class:`BatchWriter`, :class:`LaneWriter`), the rules of what may be
written are :mod:`expreplay.storage._inputs`, the slot flags :mod:`expreplay.storage._slots`, the checkpoint
format :mod:`expreplay.storage.checkpoint`; the public names of the first two are re-exported here.
"""

import collections
import logging
import math
import os
import threading
import types

import numpy as np

from . import checkpoint as _checkpoint
from .checkpoint import CheckpointError
from .._checks import (check_allocatable, check_bool, check_choice, check_dtype, check_int,
                      check_probability, check_real, check_rng, check_shape)
from . import _gather
from ._gather import gather_frames
# The input rules and the writers live in their own modules; their names stay importable from
# here (acting.py, envs.py and users import them from expreplay.storage.memory).
from ._inputs import (_FLOAT32_MAX, _INT32_MAX, _INT32_MIN, as_frame, check_action,  # noqa: F401
                      check_actions, check_extra_fields, check_extras, check_flags, check_frames,
                      check_reward, check_rewards)
from .stored_episodes import StoredEpisodes
from ._slots import _ACTIVE, _FREE, _HAS_ACTION, _RETIRED, _TERMINATED, _TRUNCATED, _VALID  # noqa: F401
from .priority import PriorityIndex
from .writers import BatchWriter, LaneWriter

__all__ = ['Experience', 'ReplayMemory', 'LaneWriter', 'BatchWriter', 'SampleBatch', 'CheckpointError', 'as_frame',
           'check_frames', 'check_rewards', 'check_actions', 'check_flags']

logger = logging.getLogger(__name__)

Experience = collections.namedtuple('Experience', ['state', 'action', 'reward', 'isOver'])
Experience.__doc__ = """One step in the tensorpack convention: the state acted upon, the action, the reward,
and whether the episode ended with this step (see :meth:`ReplayMemory.append`)."""

_SampleBatchFields = collections.namedtuple(
    'SampleBatch', ['state', 'action', 'reward', 'next_state', 'discount', 'is_over', 'indices',
                    'weights'])


class SampleBatch(_SampleBatchFields):
    """A batch from :meth:`ReplayMemory.sample` (n-step, optionally prioritized).

    ``state`` / ``next_state``: ``history_len`` stacked frames each (layout as asked);
    ``action`` int32; ``reward`` float32, the discounted sum of the k <= n rewards taken;
    ``discount`` float32, ``gamma ** k``, 0 when the episode terminated within the window (so
    the target is ``reward + discount * max_a Q(next_state, a)``); ``is_over`` bool, terminated
    within the window; ``indices`` int64, opaque tokens for :meth:`ReplayMemory.update_priorities`;
    ``weights`` float32 importance weights (all 1 for a uniform memory or ``beta=None``).

    ``extras``: the memory's extra per-step fields (``ReplayMemory(extra_fields=...)``), a dict
    of field name to an array of ``B`` values, each the value written with the step taken from
    ``state`` (empty for a memory without extra fields). It is an attribute, not one of the
    tuple's items, so that the batch still unpacks into its eight fields and feeds a tensorpack
    model's eight inputs as before (``_replace`` keeps it too).
    """

    extras = types.MappingProxyType({})   # an instance's own dict shadows this empty default

    def __new__(cls, state, action, reward, next_state, discount, is_over, indices, weights,
                extras=None):
        self = super().__new__(cls, state, action, reward, next_state, discount, is_over,
                               indices, weights)
        if extras is not None:
            self.extras = extras
        return self

    def _replace(self, **changes):
        extras = changes.pop('extras', self.extras)
        return type(self)(*super()._replace(**changes), extras=dict(extras))

_DEFAULT_TARGET_BLOCKS = 256


class ReplayMemory:
    """A replay memory of ``max_size`` steps that stores each observation frame once.

    Args:
        max_size (int): number of steps kept; the oldest are evicted first.
        state_shape (tuple): shape of one observation frame, rank 1 to 3
            (``(84, 84)`` for Atari, ``(4,)`` for CartPole).
        history_len (int): frames stacked into one state (4 for Atari DQN).
        dtype: numpy dtype of the frames (``'uint8'`` for images).
        block_size (int, optional): slots per block (see the module docstring), from
            ``history_len`` to ``max_size`` (a larger one is refused: the memory holds at
            least two blocks, so it would multiply the memory). At most ``num_blocks - 1``
            writers can be active at once; the default gives about 256 blocks. Larger blocks
            mean fewer, coarser evictions.
        prioritized (bool): proportional prioritized replay (Schaul et al.): :meth:`sample`
            draws each transition with probability ``p_i ** alpha / sum_j p_j ** alpha``, new
            steps enter at the largest priority given so far (1 to begin with), and the learner
            feeds new priorities back with :meth:`update_priorities`.
        alpha (float): priority exponent in [0, 1] (0: uniform).
        priority_eps (float): added to every priority (> 0), so that every transition keeps a
            chance of being drawn; at most the bound of :meth:`update_priorities`' priorities.
            (:meth:`sample_batch` always draws uniformly.)
        extra_fields (dict, optional): extra per-step fields, name -> dtype (bool, integer or
            float), e.g. ``{'lives': 'int8', 'segment': 'int32'}``: one scalar per step, given
            with the step (``add_step(..., extras={...})``, a batch writer's ``extras=``),
            stored beside its action and reward, returned by :meth:`sample` for the step taken
            from the sampled state (``SampleBatch.extras``), kept by checkpoints and exported to
            Minari as step infos. Every step must carry every field. :meth:`sample_batch`'s
            4-list has no room for them (use :meth:`sample`), and :meth:`append` refuses a
            memory that has them (an ``Experience`` has no extras).

    Sizes accept whole floats (``1e6``); numbers that the memory can not store exactly are
    refused (see :func:`as_frame` and :func:`check_rewards`).

    Writers: :meth:`new_writer` gives each environment its own :class:`LaneWriter`
    (any number of them, one thread each). :meth:`append` is the tensorpack-style single
    writer. Samplers call :meth:`sample_batch` from any thread.

    Memory use: ``max_size * (frame bytes + 13 + the extra fields' bytes)`` bytes, plus
    16.5 bytes a step for a prioritized memory's tree, allocated lazily (pages are touched as
    they are written, so a large memory starts cheap).
    """

    ZERO_SLOT = None  # set per instance: the index of the all-zeros slot (I7)

    def __init__(self, max_size, state_shape, history_len, dtype='uint8', *, block_size=None,
                 prioritized=False, alpha=0.6, priority_eps=1e-6, extra_fields=None):
        prioritized = check_bool(prioritized, 'prioritized')
        extra_fields = check_extra_fields(extra_fields)
        alpha = check_probability(alpha, 'alpha')
        priority_eps = check_real(priority_eps, 'priority_eps', minimum=0.0)
        if priority_eps <= 0:
            raise ValueError(f"priority_eps must be > 0 (a zero priority would never be "
                             f"sampled again), got {priority_eps!r}")
        self.max_size = check_int(max_size, 'max_size', 1, allow_float=True)
        self.history_len = check_int(history_len, 'history_len', 1, allow_float=True)
        self.state_shape = check_shape(state_shape, 'state_shape')
        self.dtype = check_dtype(dtype, 'dtype')
        if self.max_size < self.history_len + 1:
            raise ValueError(f"max_size ({self.max_size}) is too small for history_len "
                             f"({self.history_len}): it must be at least history_len + 1")

        if block_size is None:
            block_size = max(self.history_len, -(-self.max_size // _DEFAULT_TARGET_BLOCKS))
        self.block_size = check_int(block_size, 'block_size', 1, allow_float=True)
        if self.block_size < self.history_len:  # I4
            raise ValueError(f"block_size ({self.block_size}) must be >= history_len ({self.history_len})")
        if self.block_size > self.max_size:
            # Refused rather than clamped: the ring holds at least two blocks, so such a
            # block_size would silently multiply the memory (100 steps asked, 2 blocks built).
            raise ValueError(f"block_size ({self.block_size}) must be <= max_size ({self.max_size}): "
                             "the memory holds at least two blocks, so a larger block would "
                             "allocate far more than max_size slots")
        self.num_blocks = max(2, -(-self.max_size // self.block_size))
        self.num_slots = self.num_blocks * self.block_size
        self.ZERO_SLOT = self.num_slots
        self._frame_bytes = int(np.prod(self.state_shape)) * self.dtype.itemsize
        per_step = (self._frame_bytes + 13 + sum(d.itemsize for d in extra_fields.values())
                    + (17 if prioritized else 0))     # the class docstring's memory use
        check_allocatable(
            (self.num_slots + 1) * per_step,
            f"ReplayMemory(max_size={self.max_size}) of {self.state_shape} {self.dtype} frames",
            f"each step takes {per_step} bytes: choose a smaller max_size")

        # np.zeros of a large array maps zero pages lazily: nothing is touched up front.
        self._frames = np.zeros((self.num_slots + 1,) + self.state_shape, self.dtype)
        self._action = np.zeros(self.num_slots, np.int32)
        self._reward = np.zeros(self.num_slots, np.float32)
        self._epstep = np.zeros(self.num_slots, np.int32)
        self._flags = np.zeros(self.num_slots, np.uint8)

        self._block_fill = np.zeros(self.num_blocks, np.int64)
        self._block_prev = np.full(self.num_blocks, -1, np.int64)
        self._block_next = np.full(self.num_blocks, -1, np.int64)
        self._block_prev_intact = np.zeros(self.num_blocks, bool)
        self._block_state = np.full(self.num_blocks, _FREE, np.int8)
        self._block_gen = np.zeros(self.num_blocks, np.int64)  # +1 at every claim
        self._free = collections.deque(range(self.num_blocks))
        self._retired = collections.deque()
        self._abandoned = collections.deque()   # block arrays of writers collected unclosed
        self._num_valid = 0
        self._num_steps_written = 0   # all steps ever added, for statistics

        # Extra per-step fields, stored like the action and reward (the slot of the step's state).
        self._extras = {name: np.zeros(self.num_slots, dtype)
                        for name, dtype in extra_fields.items()}

        # Prioritized replay (None: uniform). Its hooks: on_publish, on_evict.
        self._priorities = PriorityIndex(self.num_slots, alpha, priority_eps, self._flags,
                                         _VALID) if prioritized else None

        self._lock = threading.Lock()
        self._ring = None             # the C sampler bound to the tables, built at first use
        self._rng = np.random.default_rng()
        self._legacy_writer = None
        self._legacy_pending = None   # (action, reward) of the last non-terminal append

    # ------------------------------------------------------------------ writers
    def new_writer(self):
        """A new :class:`LaneWriter` on this memory. Use one per environment and thread."""
        return LaneWriter(self)

    @property
    def extra_fields(self):
        """The extra per-step fields, name -> numpy dtype (a copy)."""
        return {name: arr.dtype for name, arr in self._extras.items()}

    def new_batch_writer(self, num_lanes):
        """A new :class:`BatchWriter` of ``num_lanes`` lanes: the steps of several environments
        written in one call (what the runners use). Use it from one thread."""
        return BatchWriter(self, num_lanes)

    def append(self, exp):
        """Add one step in tensorpack's single-writer convention.

        ``exp = Experience(state, action, reward, isOver)``: the state acted upon, the action
        taken, the reward received, and whether the episode ended with it. The state of the
        next ``append`` is the next state of this step, so a non-terminal step becomes
        sampleable once the next one is appended. This API has no final observation: the next
        frame of a step with ``isOver=True`` is stored as zeros (the DQN target masks it), and
        the step counts as terminated. Prefer :meth:`new_writer` for new code.
        """
        state, action, reward, is_over = exp
        if self._extras:
            raise ValueError(f"append() can not store this memory's extra_fields "
                             f"{sorted(self._extras)} (an Experience has none): write its steps "
                             "with new_writer().add_step(..., extras={...})")
        if self._legacy_writer is None:
            self._legacy_writer = LaneWriter(self)
        w = self._legacy_writer
        # Check everything before writing anything, so that a bad step changes nothing.
        w._check_obs(state, 'exp.state')
        action, reward = w._check_action(action), w._check_reward(reward)
        is_over = check_bool(is_over, 'exp.isOver')
        if self._legacy_pending is None:
            w.start_episode(state)
        else:
            w.add_step(*self._legacy_pending, next_obs=state)
            self._legacy_pending = None
        if is_over:
            w.add_step(action, reward, np.zeros(self.state_shape, self.dtype), terminated=True)
        else:
            self._legacy_pending = (action, reward)

    # ------------------------------------------------------------------ block management
    def _claim_block(self, prev_block):
        """Give a writer a new active block linked after ``prev_block`` (-1: a new lane).

        Evicts the oldest retired block when no block is free. Caller holds the lock.
        """
        while self._abandoned:
            self._retire_active(self._abandoned.popleft())
        if self._free:
            block = self._free.popleft()
        elif self._retired:
            block = self._retired.popleft()
            self._evict(block)
        else:
            raise RuntimeError(
                f"all {self.num_blocks} blocks of the replay memory are held by writers: too many "
                f"writers for max_size={self.max_size} with block_size={self.block_size}; "
                "use a smaller block_size or fewer writers")
        # Retire the writer's full block only now, so that it can not be handed straight back.
        if prev_block >= 0:
            self._retire(prev_block)
        self._block_state[block] = _ACTIVE
        self._block_gen[block] += 1
        self._block_fill[block] = 0
        self._block_prev[block] = prev_block
        self._block_next[block] = -1
        self._block_prev_intact[block] = prev_block >= 0
        if prev_block >= 0:
            self._block_next[prev_block] = block
        return block

    def _retire_active(self, blocks):
        """Retire those of ``blocks`` (a writer's, -1: none) that are still active. Caller
        holds the lock."""
        for block in blocks[blocks >= 0].tolist():
            if self._block_state[block] == _ACTIVE:
                self._retire(block)

    def _retire(self, block):
        self._block_state[block] = _RETIRED
        self._retired.append(block)

    def _evict(self, block):
        """Forget everything in ``block`` (I2, I3) and cut its successor's history (I5)."""
        lo = block * self.block_size
        flags = self._flags[lo:lo + self.block_size]
        self._num_valid -= int(np.count_nonzero(flags & _VALID))
        flags[:] = 0
        self._block_fill[block] = 0
        broken_slots = None
        succ = self._block_next[block]
        if succ >= 0 and self._block_prev[succ] == block:
            self._block_prev_intact[succ] = False
            # Slots at offset o of the successor need the evicted block when their history
            # (min(epstep, history_len - 1) frames back) reaches before offset 0.
            n = min(self.history_len - 1, int(self._block_fill[succ]))
            s_lo = succ * self.block_size
            offsets = np.arange(n)
            needs = np.minimum(self._epstep[s_lo:s_lo + n], self.history_len - 1) > offsets
            broken = needs & ((self._flags[s_lo:s_lo + n] & _VALID) != 0)
            self._num_valid -= int(np.count_nonzero(broken))
            self._flags[s_lo:s_lo + n][broken] &= ~np.uint8(_VALID)
            broken_slots = s_lo + np.flatnonzero(broken)
            self._block_prev[succ] = -1
        if self._priorities is not None:
            self._priorities.on_evict(lo, lo + self.block_size, broken_slots)
        self._block_prev[block] = -1
        self._block_next[block] = -1
        self._block_state[block] = _FREE

    # ------------------------------------------------------------------ sampling
    def __len__(self):
        """The number of transitions that can be sampled now."""
        return self._num_valid

    @property
    def num_steps_written(self):
        """Steps added since the memory was created (including evicted ones)."""
        return self._num_steps_written

    def sample_batch(self, batch_size, rng=None, layout='NHWC', *, out=None):
        """Sample ``batch_size`` transitions uniformly (with replacement) from the valid ones.

        Args:
            batch_size (int): number of transitions.
            rng: a ``numpy.random.Generator`` or ``RandomState``; the memory's own by default.
                A seed (an int) is refused with a TypeError naming ``rng``: a seed given per
                call would draw the same batch every time; pass ``numpy.random.default_rng(seed)``.
            layout: ``'NHWC'`` (channels-last, tensorpack's DQNModel) or ``'NCHW'``
                (channels-first, for models that transpose on the device).
            out (list, optional): a 4-list returned by an earlier ``sample_batch`` of the same
                ``batch_size`` and ``layout``, whose arrays are filled in place and returned,
                so that a sampling loop allocates nothing (see :meth:`sample`'s ``out``).

        Returns:
            ``[comb_state, action, reward, isOver]``. ``comb_state`` holds ``history_len + 1``
            frames per transition, oldest first, zeros before the episode's first frame; the
            last one is the next state. Shape ``(B, *state_shape, history_len + 1)`` for NHWC,
            ``(B, history_len + 1, *state_shape)`` for NCHW. ``action`` int32, ``reward``
            float32, ``isOver`` bool (True only for terminated steps; truncated ends bootstrap).

        Raises:
            ValueError: fewer than ``batch_size`` valid transitions are stored, or ``out`` does
                not fit the batch.
        """
        batch_size = check_int(batch_size, 'batch_size', 1, allow_float=True)
        check_choice(layout, 'layout', ('NHWC', 'NCHW'))
        rng = self._rng if rng is None else check_rng(rng, 'rng')
        k = self.history_len + 1
        if out is not None:
            _check_out(out, {0: self._state_shape(batch_size, k, layout)}, 'sample_batch')
        ring = self._sampler(k, layout)
        with self._lock:
            self._check_batch_size(batch_size)
            slots = self._draw_valid_slots(batch_size, rng)
            if ring is not None:
                if out is None:
                    out = [np.empty(self._state_shape(batch_size, k, layout), self.dtype),
                           np.empty(batch_size, np.int32), np.empty(batch_size, np.float32),
                           np.empty(batch_size, bool)]
                ring.comb(slots, layout == 'NCHW', *out)
                return out
            comb_state = gather_frames(self._frames, self._frame_index(slots), layout)
            action = self._action[slots]
            reward = self._reward[slots]
            is_over = (self._flags[slots] & _TERMINATED) != 0
        batch = [comb_state, action, reward, is_over]
        if out is None:
            return batch
        for dst, src in zip(out, batch):
            np.copyto(dst, src)
        return out

    def sample(self, batch_size, *, n_step=1, gamma=0.99, beta=None, layout='NHWC', rng=None,
               out=None):
        """Sample ``batch_size`` n-step transitions (with replacement) as a :class:`SampleBatch`.

        A transition from the state at step ``t`` sums the rewards of steps ``t .. t + k - 1``
        (``gamma ** j`` for the j-th), where k is ``n_step``, or fewer when the episode ends
        sooner or the lane has not written further yet. ``next_state`` is the state at
        ``t + k``: for an episode that ended in the window, its final observation. ``discount``
        is ``gamma ** k``, and 0 when the episode *terminated* in the window (a *truncated*
        end bootstraps from the final observation). The window never leaves the episode, so it
        never crosses into another episode or another writer's lane, and its cost is bounded
        by the episode, whatever ``n_step`` says.

        Args:
            batch_size (int): number of transitions (whole floats accepted, as for the sizes).
            n_step (int): steps summed, >= 1.
            gamma (float): discount in (0, 1].
            beta (float, optional): importance-sampling exponent in [0, 1] for a prioritized
                memory; None gives weights of 1. A uniform memory's weights are always 1.
            layout: ``'NHWC'`` gives ``state`` and ``next_state`` of shape
                ``(B, *state_shape, history_len)``; ``'NCHW'`` ``(B, history_len, *state_shape)``.
            rng: a ``numpy.random.Generator`` or ``RandomState``; the memory's own by default.
                A seed (an int) is refused with a TypeError naming ``rng``: a seed given per
                call would draw the same batch every time; pass ``numpy.random.default_rng(seed)``.
            out (SampleBatch, optional): a batch returned by an earlier ``sample`` of the same
                ``batch_size`` and ``layout`` (and memory): its arrays are overwritten with the
                new batch and it is returned, so that a sampling loop allocates nothing
                (``batch = mem.sample(64, out=batch)``). The caller must be done with the
                previous contents, which are gone.

        Raises:
            ValueError: a bad argument (named), ``out`` that does not fit the batch, or fewer
                than ``batch_size`` valid transitions.
            TypeError: ``rng`` is not a numpy generator.
        """
        batch_size = check_int(batch_size, 'batch_size', 1, allow_float=True)
        n_step = check_int(n_step, 'n_step', 1)
        gamma = check_real(gamma, 'gamma')
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
        if beta is not None:
            beta = check_probability(beta, 'beta')
        check_choice(layout, 'layout', ('NHWC', 'NCHW'))
        rng = self._rng if rng is None else check_rng(rng, 'rng')
        shape = self._state_shape(batch_size, self.history_len, layout)
        if out is not None:
            if not isinstance(out, SampleBatch):
                raise TypeError(f"out must be a SampleBatch from sample(), got {type(out).__name__}")
            _check_out(out, {0: shape, 3: shape}, 'sample')
            if set(out.extras) != set(self._extras):
                raise ValueError("out: its extras are not this memory's extra fields")
        ring = self._sampler(self.history_len, layout)
        prio = self._priorities
        with self._lock:
            self._check_batch_size(batch_size)
            if prio is not None:
                prio.flush()
                slots = prio.draw(batch_size, rng)
                weights = None if beta is None else prio.weights(slots, beta)
            else:
                slots = self._draw_valid_slots(batch_size, rng)
                weights = None
            if ring is not None:
                if out is None:
                    out = self._empty_sample(batch_size, shape)
                ring.sample(slots, n_step, gamma, layout == 'NCHW', out.state, out.next_state,
                            out.action, out.reward, out.discount, out.is_over, out.indices)
                for name, arr in self._extras.items():
                    np.take(arr, slots, out=out.extras[name])
            else:
                reward, last, discount, is_over = self._n_step(slots, n_step, gamma)
                batch = SampleBatch(
                    self._gather_states(slots, layout), self._action[slots], reward,
                    self._gather_states(last, layout), discount, is_over,
                    self._block_gen[slots // self.block_size] * self.num_slots + slots,
                    np.ones(batch_size, np.float32),
                    extras={name: arr[slots] for name, arr in self._extras.items()})
                if out is None:
                    out = batch
                else:
                    for dst, src in zip(out, batch):
                        np.copyto(dst, src)
                    for name, values in batch.extras.items():
                        np.copyto(out.extras[name], values)
        if weights is None:
            out.weights.fill(1.0)
        else:
            out.weights[:] = weights
        return out

    def _check_batch_size(self, batch_size):
        if self._num_valid < batch_size:
            raise ValueError(
                f"cannot sample batch_size={batch_size}: the memory holds {self._num_valid} "
                f"valid transitions and needs at least {batch_size}")

    def _state_shape(self, batch_size, frames, layout):
        if layout == 'NHWC':
            return (batch_size,) + self.state_shape + (frames,)
        return (batch_size, frames) + self.state_shape

    def _empty_sample(self, batch_size, shape):
        b = batch_size
        return SampleBatch(np.empty(shape, self.dtype), np.empty(b, np.int32),
                           np.empty(b, np.float32), np.empty(shape, self.dtype),
                           np.empty(b, np.float32), np.empty(b, bool), np.empty(b, np.int64),
                           np.empty(b, np.float32),
                           extras={name: np.empty(b, arr.dtype) for name, arr in self._extras.items()})

    def _sampler(self, frames=1, layout='NCHW'):
        """The C sampler bound to this memory's tables (:class:`expreplay.storage._gather.Ring`), or
        None: not built, switched off (``expreplay.storage._gather._gather_ext = None``), or a layout
        it does not take (channels-last needs 1-byte frames, at most 8 a row). The defaults
        ask only whether the kernel is there (for the draw)."""
        if not _gather.sampler_takes(self._frames, frames, layout):
            return None
        ring = self._ring
        if ring is None:
            ring = self._ring = _gather.Ring(
                self._frames, self._epstep, self._flags, self._action, self._reward,
                self._block_prev, self._block_next, self._block_gen, self._block_fill,
                self.history_len,
                self.block_size, self.ZERO_SLOT)
        return ring

    def _n_step(self, slots, n, gamma):
        """Walk each VALID slot's lane forward up to ``n`` steps within its episode.

        Returns (discounted reward sum float32, slot of the bootstrap frame, discount float32,
        terminated bool). A step from a slot without an action (the newest frame of a running
        or abandoned episode) is never taken; frames ahead of a VALID slot are newer than it
        and therefore still stored (I6). The walk ends when every row's episode has, so it
        costs at most the longest remaining episode, not ``n``.
        """
        bs = self.block_size
        cur = slots
        total = np.zeros(len(slots))
        discount = np.ones(len(slots))
        active = np.ones(len(slots), bool)
        terminated = np.zeros(len(slots), bool)
        for j in range(n):
            flags = self._flags[cur]
            total += np.where(active, discount * self._reward[cur], 0.0)
            discount = np.where(active, discount * gamma, discount)
            block, offset = np.divmod(cur, bs)
            nxt = np.where(offset + 1 < bs, cur + 1, self._block_next[block] * bs)
            cur = np.where(active, nxt, cur)
            terminated |= active & ((flags & _TERMINATED) != 0)
            if j + 1 < n:
                # An episode's final frame (terminated, truncated or abandoned) has no action,
                # and the lane's next episode starts in the slot after it: stop there.
                active &= (self._flags[cur] & _HAS_ACTION) != 0
                if not active.any():
                    break
        discount = np.where(terminated, 0.0, discount)
        return total.astype(np.float32), cur, discount.astype(np.float32), terminated

    def update_priorities(self, indices, priorities):
        """Give sampled transitions new priorities (the learner's |TD error|, >= 0).

        ``indices`` are the ``indices`` of a :class:`SampleBatch` from :meth:`sample`. A
        transition evicted or overwritten since it was sampled is skipped (and counted in
        :attr:`stale_priority_updates`); the others get ``(priority + priority_eps) ** alpha``.
        For repeated indices the last priority wins. Returns the number of skipped entries.

        Raises:
            ValueError: the memory is not prioritized, the arrays differ in length, an index is
                not one this memory handed out, or a priority is negative, not finite, or
                above the bound that keeps the priority tree's sums finite
                (:meth:`~expreplay.storage.priority.PriorityIndex.check_priorities`: about
                ``(1.8e308 / (2 * slots)) ** (1 / alpha)``). Nothing is changed then.
        """
        if self._priorities is None:
            raise ValueError("update_priorities needs a prioritized memory "
                             "(ReplayMemory(..., prioritized=True))")
        indices, priorities = np.asarray(indices), np.asarray(priorities)
        if indices.ndim != 1 or (indices.size and indices.dtype.kind not in 'iu'):
            raise ValueError(f"indices must be a 1-D integer array, got {indices.dtype} "
                             f"{indices.shape}")
        if priorities.dtype.kind not in 'iuf' or priorities.shape != indices.shape:
            raise ValueError(f"priorities must be a real array of the indices' shape "
                             f"{indices.shape}, got {priorities.dtype} {priorities.shape}")
        priorities = priorities.astype(np.float64)
        # min >= 0 is False for NaN too; max finite rules out +inf.
        if priorities.size and not (priorities.min() >= 0 and math.isfinite(priorities.max())):
            raise ValueError("priorities must be finite and >= 0")
        self._priorities.check_priorities(priorities)    # the bound that keeps the tree finite
        indices = indices.astype(np.int64)
        if indices.size and indices.min() < 0:
            raise ValueError("indices must come from sample(): negative index")
        slots, gen = np.divmod(indices, self.num_slots)[::-1]
        prio = self._priorities
        with self._lock:
            current = self._block_gen[slots // self.block_size]
            if indices.size and (gen > current).any():
                raise ValueError("indices must come from sample(): an index names a slot "
                                 "generation this memory has not written")
            prio.flush()
            live = (gen == current) & ((self._flags[slots] & _VALID) != 0)
            stale = len(slots) - int(np.count_nonzero(live))
            if stale:
                slots, priorities = slots[live], priorities[live]
            if len(slots) > 1:
                # Keep the last of repeated slots (numpy's fancy assignment does not promise it):
                # in a stable sort, the last of equal slots is the last written.
                order = np.argsort(slots, kind='stable')
                ordered = slots[order]
                last = np.ones(len(slots), bool)
                np.not_equal(ordered[1:], ordered[:-1], out=last[:-1])
                if not last.all():
                    order = order[last]
                    slots, priorities = slots[order], priorities[order]
            if len(slots):
                prio.tree.set(slots, prio.priority_values(priorities))
            prio.stale_updates += stale
        return stale

    @property
    def stale_priority_updates(self):
        """:meth:`update_priorities` entries skipped so far (their slot was evicted/rewritten)."""
        return 0 if self._priorities is None else self._priorities.stale_updates

    @property
    def _priority_leaves(self):
        """The priority tree's leaves (one per slot) for the checkpoint; None when uniform."""
        return None if self._priorities is None else self._priorities.tree.leaves

    @property
    def prioritized(self):
        """Whether :meth:`sample` draws by priority."""
        return self._priorities is not None

    def _draw_valid_slots(self, n, rng):
        """Uniform draw over VALID slots: uniform over written slots, then reject the others.

        Written slots are contiguous per block (I2), so a draw over the running sum of
        ``block_fill`` is a draw over written slots; almost all of them are VALID (the
        exceptions are each episode's final frame and a few slots at block edges).
        """
        ring = self._sampler()
        if ring is not None:         # the same draws, mapped and filtered in C
            chosen = np.empty(n, np.int64)
            total, got = ring.written(), 0
            for _ in range(32):
                u = _integers(rng, total, 2 * (n - got) + 8)
                got = ring.pick(u if u.dtype == np.int64 else u.astype(np.int64), chosen, got)
                if got == n:
                    return chosen
            chosen = chosen[:got]
            valid = np.flatnonzero(self._flags & _VALID)
            return np.concatenate([chosen, valid[_integers(rng, len(valid), n - got)]])
        cum = np.cumsum(self._block_fill)
        total = int(cum[-1])
        chosen = np.empty(0, np.int64)
        for _ in range(32):
            u = _integers(rng, total, 2 * (n - len(chosen)) + 8)
            block = np.searchsorted(cum, u, side='right')
            slot = block * self.block_size + (u - (cum[block] - self._block_fill[block]))
            slot = slot[(self._flags[slot] & _VALID) != 0]
            chosen = np.concatenate([chosen, slot[:n - len(chosen)]])
            if len(chosen) == n:
                return chosen
        # Mostly invalid slots (e.g. one-step episodes): enumerate the valid ones instead.
        valid = np.flatnonzero(self._flags & _VALID)
        return np.concatenate([chosen, valid[_integers(rng, len(valid), n - len(chosen))]])

    def _frame_index(self, slots):
        """Slot index of every frame of each transition: (B, history_len + 1), oldest first.

        History frame ``k`` steps back lies in the same block when the offset allows, else in
        the previous block of the lane (I4); before the episode's first frame it is the zero
        slot (I7). The next frame is the next slot of the lane.
        """
        bs = self.block_size
        block, offset = np.divmod(slots, bs)
        hist = self._history_index(slots, block, offset)
        nxt = np.where(offset + 1 < bs, slots + 1, self._block_next[block] * bs)
        return np.concatenate([hist, nxt[:, None]], axis=1)

    def _gather_states(self, slots, layout):
        """The states (``history_len`` frames, oldest first) whose newest frame is at each slot:
        the numpy path (the C sampler, :meth:`_sampler`, builds them itself).

        Most states are ``history_len`` consecutive slots (the exceptions start near an
        episode's first frame or reach into the lane's previous block), and numpy copies those
        out of a strided view of the ring (a state = one contiguous run of frames) as fast as
        it gathers whole frames, about twice the speed of numpy's per-frame interleave; the
        exceptions go through :func:`gather_frames`.
        """
        h = self.history_len
        idx = self._history_index(slots)
        if layout != 'NHWC' or h == 1:
            return gather_frames(self._frames, idx, layout)
        start = slots - (h - 1)
        straight = (idx == start[:, None] + np.arange(h)).all(axis=1)
        out = self._stacked_view()[np.where(straight, start, 0)]
        bent = ~straight
        if bent.any():
            out[bent] = gather_frames(self._frames, idx[bent], layout)
        return out

    def _stacked_view(self):
        """``frames`` seen as (slot, *state_shape, history_len): row i = slots i .. i + h - 1."""
        frames = self._frames
        cached = getattr(self, '_stacked', None)
        if cached is None or cached[0] is not frames:   # load() may swap the frames array
            h = self.history_len
            view = np.lib.stride_tricks.as_strided(
                frames, shape=(len(frames) - h + 1,) + self.state_shape + (h,),
                strides=frames.strides + frames.strides[:1], writeable=False)
            self._stacked = cached = (frames, view)
        return cached[1]

    def _history_index(self, slots, block=None, offset=None):
        """Slot index of the ``history_len`` frames of the state at each slot, oldest first."""
        bs = self.block_size
        if block is None:
            block, offset = np.divmod(slots, bs)
        back = np.arange(self.history_len - 1, -1, -1)            # k, oldest first
        pos = offset[:, None] - back                                # offset of frame k back
        prev_base = self._block_prev[block][:, None] * bs + bs
        hist = np.where(pos >= 0, block[:, None] * bs + pos, prev_base + pos)
        return np.where(back <= self._epstep[slots][:, None], hist, self.ZERO_SLOT)

    # ------------------------------------------------------------------ whole episodes
    def episodes(self):
        """The complete episodes still stored, oldest lanes' blocks first, as an iterator.

        An episode is complete when its first frame (from ``reset()``) and its final step
        (terminated or truncated) are both still in the memory. Each is a dict of copies:
        ``observations`` (steps + 1, *state_shape), ``actions`` int32, ``rewards`` float32,
        ``terminations`` and ``truncations`` bool (steps,), the layout Minari datasets use,
        and ``extras``, the extra fields' values of each step (name -> (steps,)).

        Writers may run meanwhile: the episodes' first frames are listed when this is called,
        and each episode is read later under the memory's lock, whole, as a sample is. One
        whose first frame was evicted in between (its slots may hold another episode by then)
        is skipped, never read in part. The returned :class:`~expreplay.storage.stored_episodes.StoredEpisodes`
        counts what it skipped: ``evicted`` (evicted while the iteration went on) and
        ``incomplete`` (still running, abandoned, or cut by an earlier eviction).
        """
        with self._lock:
            order = list(self._retired) + list(np.flatnonzero(self._block_state == _ACTIVE))
            starts = []
            for block in order:
                lo = block * self.block_size
                fill = int(self._block_fill[block])
                gen = int(self._block_gen[block])     # a reuse of the block changes it
                starts.extend((int(s), gen) for s in
                              lo + np.flatnonzero(self._epstep[lo:lo + fill] == 0))

        def read(start, gen):
            with self._lock:
                if self._block_gen[start // self.block_size] != gen:
                    return StoredEpisodes.EVICTED
                slots = self._episode_slots(start)
                if slots is None:
                    return StoredEpisodes.INCOMPLETE
                steps = slots[:-1]
                return dict(
                    observations=self._frames[slots].copy(),
                    actions=self._action[steps].copy(),
                    rewards=self._reward[steps].copy(),
                    terminations=(self._flags[steps] & _TERMINATED) != 0,
                    truncations=(self._flags[steps] & _TRUNCATED) != 0,
                    extras={name: arr[steps] for name, arr in self._extras.items()})
        return StoredEpisodes(starts, read)

    def _episode_slots(self, start):
        """Slots of the episode whose first frame is ``start``, or None if it is incomplete."""
        bs = self.block_size
        slots = [start]
        slot = start
        while True:
            flags = int(self._flags[slot])
            if not flags & _HAS_ACTION:
                return None                       # still running, or abandoned
            block, offset = divmod(slot, bs)
            nxt = slot + 1 if offset + 1 < bs else int(self._block_next[block]) * bs
            if nxt < 0 or nxt % bs >= self._block_fill[nxt // bs] \
                    or self._epstep[nxt] != self._epstep[slot] + 1:
                return None
            slots.append(nxt)
            if flags & (_TERMINATED | _TRUNCATED):
                return np.array(slots)
            slot = nxt

    # ------------------------------------------------------------------ checkpoints
    def save(self, path):
        """Write a checkpoint of the memory to ``path`` (one ``.npz`` file); returns its size
        in bytes.

        Only written slots are stored, so the file grows with the memory's fill, not its
        capacity. The file is written beside ``path`` and renamed over it only when complete,
        so a crash or kill during ``save`` leaves the previous checkpoint intact; such a
        save's temporary file is removed by the next save or load of ``path``. Arrays are
        streamed to the file block by block (no second copy of the frames in RAM). Writers
        and samplers wait while it runs. Writers attached now are not part of the checkpoint:
        after :meth:`load`, their partly filled blocks are retired and new writers start new
        lanes. Each save is logged (logger ``expreplay.storage.memory``, INFO): where, how big, how
        long. See :mod:`expreplay.storage.checkpoint` for the format.
        """
        path = os.fspath(path)
        with self._lock:
            transitions = self._num_valid
            size, seconds = _checkpoint.save(self, path)
        logger.info("Saved the replay memory (%d transitions) to %s: %s in %.2f s.",
                    transitions, path, _checkpoint.format_bytes(size), seconds)
        return size

    @classmethod
    def load(cls, path, *, max_size=None, state_shape=None, history_len=None, dtype=None,
             block_size=None, prioritized=None, alpha=None, priority_eps=None,
             extra_fields=None):
        """Load a memory saved by :meth:`save`: its written slots bit-identical, its
        transitions sampled as before (a prioritized memory keeps its priorities, its running
        maximum priority and its stale-update count, so it draws exactly as it did).

        The memory is built with the checkpoint's settings. Pass the settings you expect (any
        of ``max_size``, ``state_shape``, ``history_len``, ``dtype``, ``block_size``,
        ``prioritized``, ``alpha``, ``priority_eps``, ``extra_fields``; ``extra_fields={}``
        expects none) to have a checkpoint of other settings
        refused, naming each setting that differs (``alpha`` and ``priority_eps`` are compared
        when either side is prioritized). Checkpoints of format 2 (before priorities were
        saved) load as uniform memories.

        Raises:
            CheckpointError: (a ``ValueError``) the file is empty, truncated, corrupt, crafted
                (its tables break the memory's invariants) or of other settings; the message
                names the file and what is wrong.
            FileNotFoundError: there is no file at ``path``.
        """
        path = os.fspath(path)
        expected = dict(
            max_size=None if max_size is None else check_int(max_size, 'max_size', 1,
                                                             allow_float=True),
            history_len=None if history_len is None else check_int(history_len, 'history_len', 1,
                                                                   allow_float=True),
            state_shape=None if state_shape is None else check_shape(state_shape, 'state_shape'),
            dtype=None if dtype is None else check_dtype(dtype, 'dtype').str,
            block_size=None if block_size is None else check_int(block_size, 'block_size', 1,
                                                                 allow_float=True),
            prioritized=None if prioritized is None else check_bool(prioritized, 'prioritized'),
            alpha=None if alpha is None else check_probability(alpha, 'alpha'),
            priority_eps=None if priority_eps is None else check_real(priority_eps,
                                                                      'priority_eps'),
            extra_fields=None if extra_fields is None else {
                name: dtype.name for name, dtype in check_extra_fields(extra_fields).items()})
        return _checkpoint.load(cls, path, expected)


def _check_out(out, shapes, method):
    """``out`` of an earlier batch: its items ``i`` must have the shapes ``shapes[i]`` (the
    states'); the kernel (or numpy's copy) checks the other arrays' sizes and dtypes."""
    try:
        ok = all(out[i].shape == shape for i, shape in shapes.items())
    except (TypeError, AttributeError, IndexError, KeyError):
        ok = False
    if not ok:
        raise ValueError(f"out must be a batch returned by an earlier {method}() of the same "
                         f"batch_size and layout (state shape {shapes[0]})")


def _integers(rng, high, size):
    """``size`` uniform ints in [0, high) from a numpy Generator or a legacy RandomState."""
    if hasattr(rng, 'integers'):
        return rng.integers(0, high, size=size)
    return rng.randint(0, high, size=size)
