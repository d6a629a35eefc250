"""Sampling the replay memory's ring: the uniform draw, the n-step window, the states' gather,
and the batches they make (:class:`SampleBatch`, tensorpack's 4-list). Which slots a
:meth:`ReplayMemory.sample` draws is the ring's sampling distribution's choice
(:mod:`expreplay.storage.distribution`: uniform, through :meth:`Sampler.draw_uniform`, or by
priority); ``sample_batch`` always draws uniformly.

What may be drawn is the ring's VALID rule (I3 in :mod:`expreplay.storage.ring`): a slot is
drawn only when it is VALID, and everything a transition reads from it follows from the
invariants: its history is intact (I3, I5), in its block or the lane's previous one (I4), zeros
before its episode's first frame (I7), and every frame ahead of it is newer and therefore still
stored (I6), which is what lets the n-step window walk forward without checks. All of it runs
under the ring's lock, so no block is evicted under a gather.

The common cases run in the optional C sampler (``_gather_ext.Ring``, bound to the ring's
tables when the :class:`Sampler` is built); a sampler built inside
:func:`expreplay._kernels.numpy_only` takes the numpy path, for good.
"""

from __future__ import annotations

import collections
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _kernels
from . import _gather
from ._gather import gather_frames
from ._recycled import ArrayPool
from ._slots import _HAS_ACTION, _TERMINATED, _VALID
from .ring import BlockRing

if TYPE_CHECKING:
    from .draw import DrawSettings

__all__ = ['SampleBatch', 'Sampler']

_SampleBatchFields = collections.namedtuple(  # type: ignore[name-match]
    'SampleBatch', ['state', 'action', 'reward', 'next_state', 'discount', 'is_over',
                           'indices', 'weights'])


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

    The arrays are the caller's: keep any of them (by name, in a container, as a view, a
    ``memoryview``, ``torch.from_numpy`` or a device transfer in flight) and it is never
    written again. Once nothing refers to a batch's arrays, the memory may fill their buffers
    with a later batch; each batch is handed out as fresh array objects over those buffers, so
    whatever was done to a dropped array (its shape, dtype or flags changed, a ``weakref`` to
    it) does not reach a later batch. Only a raw address (``__array_interface__``, ``ctypes``),
    which holds no reference, can see a later batch's values: copy what you keep that way.
    (The same holds for :meth:`ReplayMemory.sample_batch`'s list.)
    """

    extras: Mapping[str, np.ndarray] = types.MappingProxyType({})   # an instance's own dict shadows it

    def __new__(cls, state: np.ndarray, action: np.ndarray, reward: np.ndarray,
                next_state: np.ndarray, discount: np.ndarray, is_over: np.ndarray,
                indices: np.ndarray, weights: np.ndarray,
                extras: Mapping[str, np.ndarray] | None = None) -> SampleBatch:
        self = super().__new__(cls, state, action, reward, next_state, discount, is_over,
                               indices, weights)
        if extras is not None:
            self.extras = extras
        return self

    def _replace(self, **changes: Any) -> SampleBatch:
        extras = changes.pop('extras', self.extras)
        return type(self)(*super()._replace(**changes), extras=dict(extras))


class Sampler:
    """Draws transitions from a :class:`~expreplay.storage.ring.BlockRing` and builds batches.

    Every method that reads the ring takes its lock (or says its caller holds it). The
    arguments are checked by :class:`~expreplay.ReplayMemory`, which documents them.
    """

    def __init__(self, ring: BlockRing) -> None:
        self.ring = ring
        # The kernel is taken here, once (expreplay._kernels): the C sampler bound to the
        # tables, or None for numpy, and the gather kernel the numpy path's gathers are given.
        # Taken later, a path switched under this sampler would mix its bound Ring with
        # another path's gathers.
        ext = self._gather_ext = _kernels.get('_gather_ext')
        self._kernel = None if ext is None else ext.Ring(
            ring.frames, ring.epstep, ring.flags, ring.action, ring.reward, ring.block_prev,
            ring.block_next, ring.block_gen, ring.block_fill, ring.history_len,
            ring.block_size, ring.zero_slot)
        self._stacked: tuple[np.ndarray, np.ndarray] | None = None
        self._pool = ArrayPool()  # the arrays of batches nobody holds any more, refilled

    # ------------------------------------------------------------------ batches
    def comb_batch(self, batch_size: int, rng: Any, layout: str,
                   out: list[np.ndarray] | None) -> list[np.ndarray]:
        """tensorpack's ``[comb_state, action, reward, isOver]`` of uniform draws."""
        kernel = self.kernel(self.ring.history_len + 1, layout)
        batch = self.ring.lock.run(self._comb_locked, batch_size, rng, layout, out, kernel)
        if out is None or batch is out:
            return batch
        for dst, src in zip(out, batch):
            np.copyto(dst, src)
        return out

    def _comb_locked(self, batch_size, rng, layout, out, kernel):
        """:meth:`comb_batch`'s draw and gather, under the lock: ``out`` filled (the C
        sampler), or a new batch."""
        ring = self.ring
        k = ring.history_len + 1
        self.check_batch_size(batch_size)
        slots = self.draw_uniform(batch_size, rng)
        if kernel is not None:
            if out is None:
                out = self._pool.take(('comb', batch_size, k, layout), lambda: (
                    np.empty(self.state_shape(batch_size, k, layout), ring.dtype),
                    np.empty(batch_size, np.int32), np.empty(batch_size, np.float32),
                    np.empty(batch_size, bool)))
            kernel.comb(slots, layout == 'NCHW', *out)
            return out
        comb_state = gather_frames(ring.frames, ring.frame_index(slots), layout,
                                   kernel=self._gather_ext)
        return [comb_state, ring.action[slots], ring.reward[slots],
                (ring.flags[slots] & _TERMINATED) != 0]

    def n_step_batch(self, batch_size: int, settings: DrawSettings, beta: float | None, rng: Any,
                     out: SampleBatch | None) -> SampleBatch:
        """A :class:`SampleBatch` of n-step transitions, drawn by the ring's distribution."""
        out, weights = self.ring.lock.run(self._n_step_locked, batch_size, settings.n_step,
                                          settings.gamma, beta, settings.layout, rng, out,
                                          settings.weight_norm)
        if weights is None:
            out.weights.fill(1.0)
        else:
            out.weights[:] = weights
        return out

    def _n_step_locked(self, batch_size, n_step, gamma, beta, layout, rng, out, weight_norm):
        """:meth:`n_step_batch`'s draw and gather, under the lock: (the batch, the weights)."""
        ring = self.ring
        kernel = self.kernel(ring.history_len, layout)
        self.check_batch_size(batch_size)
        slots, weights = ring.distribution.draw(batch_size, rng, beta, weight_norm,
                                                self.draw_uniform)
        if kernel is not None:
            if out is None:
                out = self.empty_sample(batch_size,
                                        self.state_shape(batch_size, ring.history_len, layout))
            kernel.sample(slots, n_step, gamma, layout == 'NCHW', out.state, out.next_state,
                          out.action, out.reward, out.discount, out.is_over, out.indices)
            for name, arr in ring.extras.items():
                np.take(arr, slots, out=out.extras[name])
        else:
            out = self._n_step_numpy(slots, n_step, gamma, layout, out)
        return out, weights

    def _n_step_numpy(self, slots: np.ndarray, n_step: int, gamma: float, layout: str,
                      out: SampleBatch | None) -> SampleBatch:
        ring = self.ring
        reward, last, discount, is_over = self.n_step(slots, n_step, gamma)
        batch = SampleBatch(
            self.gather_states(slots, layout), ring.action[slots], reward,
            self.gather_states(last, layout), discount, is_over, ring.tokens(slots),
            np.ones(len(slots), np.float32),
            extras={name: arr[slots] for name, arr in ring.extras.items()})
        if out is None:
            return batch
        for dst, src in zip(out, batch):
            np.copyto(dst, src)
        for name, values in batch.extras.items():
            np.copyto(out.extras[name], values)
        return out

    def check_comb_out(self, out: Any, batch_size: int, layout: str) -> None:
        """Refuse an ``out=`` of ``sample_batch`` that is not a 4-list of ``batch_size`` in
        ``layout``."""
        shape = self.state_shape(batch_size, self.ring.history_len + 1, layout)
        _check_out(out, {0: shape}, 'sample_batch')

    def check_sample_out(self, out: Any, batch_size: int, layout: str) -> None:
        """Refuse an ``out=`` of ``sample`` that is not a :class:`SampleBatch` of
        ``batch_size`` in ``layout`` with this memory's extra fields."""
        if not isinstance(out, SampleBatch):
            raise TypeError(f"out must be a SampleBatch from sample(), got {type(out).__name__}")
        shape = self.state_shape(batch_size, self.ring.history_len, layout)
        _check_out(out, {0: shape, 3: shape}, 'sample')
        if set(out.extras) != set(self.ring.extras):
            raise ValueError("out: its extras are not this memory's extra fields")

    def check_batch_size(self, batch_size: int) -> None:
        """Refuse a batch larger than the VALID slots. Caller holds the lock."""
        if self.ring.num_valid < batch_size:
            raise ValueError(
                f"cannot sample batch_size={batch_size}: the memory holds {self.ring.num_valid} "
                f"valid transitions and needs at least {batch_size}")

    def state_shape(self, batch_size: int, frames: int, layout: str) -> tuple[int, ...]:
        """The shape of ``batch_size`` stacks of ``frames`` frames in ``layout``."""
        if layout == 'NHWC':
            return (batch_size,) + self.ring.state_shape + (frames,)
        return (batch_size, frames) + self.ring.state_shape

    def empty_sample(self, batch_size: int, shape: tuple[int, ...]) -> SampleBatch:
        """An uninitialized :class:`SampleBatch` of ``batch_size`` rows, states of ``shape``
        (the arrays of one that nothing refers to any more, or new ones). Caller holds the
        lock."""
        b, dtype, extras = batch_size, self.ring.dtype, self.ring.extras
        arrays = self._pool.take(('sample', b, shape), lambda: (
            np.empty(shape, dtype), np.empty(b, np.int32), np.empty(b, np.float32),
            np.empty(shape, dtype), np.empty(b, np.float32), np.empty(b, bool),
            np.empty(b, np.int64), np.empty(b, np.float32),
            *(np.empty(b, arr.dtype) for arr in extras.values())))
        state, action, reward, next_state, discount, is_over, indices, weights, *more = arrays
        return SampleBatch(state, action, reward, next_state, discount, is_over, indices, weights,
                           extras=dict(zip(extras, more)))

    def kernel(self, frames: int, layout: str) -> Any:
        """The C sampler bound to the ring's tables (``_gather_ext.Ring``), or None: this
        sampler was built without it (not built, or inside
        :func:`expreplay._kernels.numpy_only`), or a layout it does not take (channels-last
        needs 1-byte frames, at most 8 a row)."""
        kernel = self._kernel
        if kernel is None or not _gather.sampler_takes(self.ring.frames, frames, layout):
            return None
        return kernel

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> int:
        """Set the priorities (float64) of the transitions of sample tokens ``indices``
        (int64), both checked by the distribution's ``check_update``; skip those rewritten
        since. Returns the skipped count."""
        ring = self.ring
        return ring.lock.run(ring.distribution.update, indices, priorities, ring.block_gen,
                             ring.block_size)

    # ------------------------------------------------------------------ draws
    def draw_uniform(self, n: int, rng: Any) -> np.ndarray:
        """Uniform draw over VALID slots: uniform over written slots, then reject the others.
        Caller holds the lock.

        Written slots are contiguous per block (I2), so a draw over the running sum of
        ``block_fill`` is a draw over written slots; almost all of them are VALID (the
        exceptions are each episode's final frame and a few slots at block edges).
        """
        ring = self.ring
        kernel = self.kernel(1, 'NCHW')      # any layout: only the draw is asked for
        if kernel is not None:         # the same draws, mapped and filtered in C
            chosen = np.empty(n, np.int64)
            total, got = kernel.written(), 0
            for _ in range(32):
                u = _integers(rng, total, 2 * (n - got) + 8)
                got = kernel.pick(u if u.dtype == np.int64 else u.astype(np.int64), chosen, got)
                if got == n:
                    return chosen
            chosen = chosen[:got]
        else:
            fill = ring.block_fill
            cum = np.cumsum(fill)
            total = int(cum[-1])
            chosen = np.empty(0, np.int64)
            for _ in range(32):
                u = _integers(rng, total, 2 * (n - len(chosen)) + 8)
                block = np.searchsorted(cum, u, side='right')
                slot = block * ring.block_size + (u - (cum[block] - fill[block]))
                slot = slot[(ring.flags[slot] & _VALID) != 0]
                chosen = np.concatenate([chosen, slot[:n - len(chosen)]])
                if len(chosen) == n:
                    return chosen
        # Mostly invalid slots (e.g. one-step episodes): enumerate the valid ones instead.
        valid = np.flatnonzero(ring.flags & _VALID)
        return np.concatenate([chosen, valid[_integers(rng, len(valid), n - len(chosen))]])

    # ------------------------------------------------------------------ the numpy paths
    def n_step(self, slots: np.ndarray, n: int, gamma: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Walk each VALID slot's lane forward up to ``n`` steps within its episode.

        Returns (discounted reward sum float32, slot of the bootstrap frame, discount float32,
        terminated bool). A step from a slot without an action (the newest frame of a running
        or abandoned episode) is never taken; frames ahead of a VALID slot are newer than it
        and therefore still stored (I6). The walk ends when every row's episode has, so it
        costs at most the longest remaining episode, not ``n``.
        """
        ring = self.ring
        cur = slots
        total = np.zeros(len(slots))
        discount = np.ones(len(slots))
        active = np.ones(len(slots), bool)
        terminated = np.zeros(len(slots), bool)
        for j in range(n):
            flags = ring.flags[cur]
            total += np.where(active, discount * ring.reward[cur], 0.0)
            discount = np.where(active, discount * gamma, discount)
            cur = np.where(active, ring.next_slots(cur), cur)
            terminated |= active & ((flags & _TERMINATED) != 0)
            if j + 1 < n:
                # An episode's final frame (terminated, truncated or abandoned) has no action,
                # and the lane's next episode starts in the slot after it: stop there.
                active &= (ring.flags[cur] & _HAS_ACTION) != 0
                if not active.any():
                    break
        discount = np.where(terminated, 0.0, discount)
        return total.astype(np.float32), cur, discount.astype(np.float32), terminated

    def gather_states(self, slots: np.ndarray, layout: str) -> np.ndarray:
        """The states (``history_len`` frames, oldest first) whose newest frame is at each slot:
        the numpy path (the C sampler builds them itself).

        Most states are ``history_len`` consecutive slots (the exceptions start near an
        episode's first frame or reach into the lane's previous block), and numpy copies those
        out of a strided view of the ring (a state = one contiguous run of frames) as fast as
        it gathers whole frames, about twice the speed of numpy's per-frame interleave; the
        exceptions go through :func:`gather_frames`.
        """
        ring = self.ring
        h = ring.history_len
        idx = ring.history_index(slots)
        if layout != 'NHWC' or h == 1:
            return gather_frames(ring.frames, idx, layout, kernel=self._gather_ext)
        start = slots - (h - 1)
        straight = (idx == start[:, None] + np.arange(h)).all(axis=1)
        out = self._stacked_view()[np.where(straight, start, 0)]
        bent = ~straight
        if bent.any():
            out[bent] = gather_frames(ring.frames, idx[bent], layout, kernel=self._gather_ext)
        return out

    def _stacked_view(self) -> np.ndarray:
        """The frames seen as (slot, *state_shape, history_len): row i = slots i .. i + h - 1."""
        frames = self.ring.frames
        cached = self._stacked
        if cached is None or cached[0] is not frames:
            h = self.ring.history_len
            view = np.lib.stride_tricks.as_strided(
                frames, shape=(len(frames) - h + 1,) + self.ring.state_shape + (h,),
                strides=frames.strides + frames.strides[:1], writeable=False)
            self._stacked = cached = (frames, view)
        return cached[1]


def _check_out(out: Any, shapes: Mapping[int, tuple[int, ...]], method: str) -> None:
    """``out`` of an earlier batch: its items ``i`` must have the shapes ``shapes[i]`` (the
    states'); the kernel (or numpy's copy) checks the other arrays' sizes and dtypes."""
    try:
        ok = all(out[i].shape == shape for i, shape in shapes.items())
    except (TypeError, AttributeError, IndexError, KeyError):
        ok = False
    if not ok:
        raise ValueError(f"out must be a batch returned by an earlier {method}() of the same "
                         f"batch_size and layout (state shape {shapes[0]})")


def _integers(rng: Any, high: int, size: int) -> np.ndarray:
    """``size`` uniform ints in [0, high) from a numpy Generator or a legacy RandomState.

    A Generator's floats scaled: ``Generator.integers`` costs ~2.5x as much per call in
    Python (the draw holds the GIL for it every batch), and floor(u * high) of a double u
    is uniform over [0, high) within high / 2**53 (below 1e-9 for a memory under 9M steps)."""
    if high <= 0:
        raise ValueError(f"no integers in [0, {high})")
    if hasattr(rng, 'integers'):
        u = rng.random(size)
        u *= high
        np.minimum(u, high - 1, out=u)     # u * high may round up to high itself
        return u.astype(np.int64)
    return rng.randint(0, high, size=size)
