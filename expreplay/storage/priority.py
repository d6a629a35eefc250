"""Proportional prioritized sampling (Schaul et al., 2016): a vectorized sum tree and min tree.

:class:`SumMinTree` keeps, over ``capacity`` leaves, the sum of every subtree (to draw a leaf
with probability proportional to its value) and the minimum of every subtree (for the largest
importance weight, which normalizes the others). It is a ``fanout``-ary tree stored one numpy
array per level; every operation works on a whole batch of leaves at once, level by level, so
its cost is ``depth`` numpy calls whatever the batch size: no per-item Python loop. A wide
fanout (32 by default) keeps the depth at 4 for a million leaves, which is what makes updating
64 priorities cheap next to sampling a batch of frames.

A leaf of value 0 is *absent*: it is never drawn and does not count in the minimum.

The optional C kernel ``expreplay.storage._tree_ext`` (built by setup.py when a compiler is there;
see :mod:`expreplay._kernels`) runs
the descent and the updates: a batch's draw or update in a few microseconds instead of a few
numpy calls per level. A tree uses it for every operation or (without it) numpy for every one,
never a mix: an inner node is a function of its children, but the two sum them in a
different order, so they may differ in the last bit.

:class:`PriorityIndex` is the state of a prioritized memory's sampling distribution
(:class:`~expreplay.storage.distribution.PrioritizedDistribution`):
the tree over the memory's slots, the exponent ``alpha``, the running maximum priority new
steps enter with, and the memory's hooks (:meth:`PriorityIndex.on_publish`,
:meth:`PriorityIndex.on_evict`). All its methods run under the memory's lock.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import _kernels
from ._guard import WriteGuard

__all__ = ['SumMinTree', 'PriorityIndex']

# The default ``kernel`` of a tree: the one :func:`expreplay._kernels.get` gives when it is built.
_AT_BUILD: Any = object()


class SumMinTree:
    """Sums and minima over ``capacity`` non-negative leaves, updated and sampled in batches.

    Args:
        capacity (int): number of leaves (indices ``0 .. capacity - 1``).
        fanout (int): children per node (>= 2).
        kernel: the C tree kernel to use (None: numpy); by default the one
            :mod:`expreplay._kernels` gives when the tree is built.
    """

    def __init__(self, capacity: int, fanout: int = 32, *, kernel: Any = _AT_BUILD) -> None:
        if capacity < 1 or fanout < 2:
            raise ValueError(f"capacity must be >= 1 and fanout >= 2, got {capacity}, {fanout}")
        self.capacity = int(capacity)
        self.fanout = int(fanout)
        # Level sizes bottom-up: each a multiple of the fanout (so that it reshapes into rows
        # of children), padded with absent nodes; the level above the root's has `fanout`.
        sizes = []
        n = self.capacity
        while True:
            n = -(-n // self.fanout) * self.fanout
            sizes.append(n)
            n //= self.fanout
            if n == 1:
                break
        sizes.append(1)
        sizes.reverse()
        self.depth = len(sizes) - 1
        # Level l holds sizes[l] nodes; level `depth` holds the leaves.
        self._sum = [np.zeros(n) for n in sizes]
        self._min = [np.full(n, np.inf) for n in sizes]
        # The same arrays as rows of siblings, made once (a reshape per call costs as much as
        # the arithmetic on a 64-row batch).
        self._sum_rows: list[Any] = [None] + [a.reshape(-1, self.fanout) for a in self._sum[1:]]
        self._min_rows: list[Any] = [None] + [a.reshape(-1, self.fanout) for a in self._min[1:]]
        self._upper = np.triu(np.ones((self.fanout, self.fanout)))
        # Chosen once, here (expreplay._kernels): a tree switched to the other path while it
        # lives would mix two summation orders in its inner nodes (module docstring).
        self._ext = _kernels.get('_tree_ext') if kernel is _AT_BUILD else kernel
        self._sum_levels, self._min_levels = tuple(self._sum), tuple(self._min)

    @property
    def total(self) -> float:
        """The sum of all leaves."""
        return float(self._sum[0][0])

    @property
    def min(self) -> float:
        """The smallest present (non-zero) leaf; ``inf`` when none is present."""
        return float(self._min[0][0])

    @property
    def sum_levels(self) -> tuple[np.ndarray, ...]:
        """The nodes' sums, one array per level (root first, leaves last, padded with absent
        nodes); for reading: the tree keeps them consistent."""
        return self._sum_levels

    @property
    def min_levels(self) -> tuple[np.ndarray, ...]:
        """The nodes' minima over present leaves, laid out as :attr:`sum_levels`."""
        return self._min_levels

    @property
    def leaves(self) -> np.ndarray:
        """The ``capacity`` leaf values as a writable view (for a checkpoint to read into;
        call :meth:`rebuild` after writing to it)."""
        return self._sum[-1][:self.capacity]

    def rebuild(self) -> None:
        """Recompute every inner node (sums and minima) from the leaves.

        Inner nodes are always a function of their children alone (see :meth:`set`), so the
        rebuilt tree is the tree that held those leaves, bit for bit.
        """
        leaves = self._sum[-1]
        self._min[-1][:] = np.where(leaves > 0, leaves, np.inf)
        if self._ext is not None:
            self._ext.refresh_range(self._sum_levels, self._min_levels, 0, self.capacity,
                                    self.fanout)
            return
        add, minimum = np.add.reduce, np.minimum.reduce
        for level in range(self.depth - 1, -1, -1):
            rows = self._sum_rows[level + 1]
            self._sum[level][:len(rows)] = add(rows, axis=1)
            self._min[level][:len(rows)] = minimum(self._min_rows[level + 1], axis=1)

    def get(self, idx: Any) -> np.ndarray:
        """Leaf values at ``idx``."""
        return self._sum[-1][idx]

    def set(self, idx: Any, values: Any) -> None:
        """Set leaves ``idx`` (int array, no duplicates) to ``values`` (>= 0; 0 removes)."""
        idx = np.asarray(idx, np.int64)
        values = np.asarray(values, np.float64)
        self._sum[-1][idx] = values
        self._min[-1][idx] = np.where(values > 0, values, np.inf)
        if self._ext is not None:
            self._ext.refresh(self._sum_levels, self._min_levels, np.ascontiguousarray(idx),
                              self.fanout)
            return
        k = self.fanout
        add, minimum = np.add.reduce, np.minimum.reduce
        for level in range(self.depth - 1, -1, -1):
            # Duplicate parents are harmless: each is recomputed from its final children.
            idx = idx // k
            self._sum[level][idx] = add(self._sum_rows[level + 1][idx], axis=1)
            self._min[level][idx] = minimum(self._min_rows[level + 1][idx], axis=1)

    @property
    def has_kernel(self) -> bool:
        """Whether this tree runs the C kernel."""
        return self._ext is not None

    def update_live(self, tokens: np.ndarray, values: np.ndarray, raw: np.ndarray,
                    block_gen: np.ndarray, flags: np.ndarray, block_size: int,
                    valid_bit: int) -> tuple[int, float] | None:
        """:meth:`PriorityIndex.update`'s work in one C call (``_tree_ext.update_live``: see
        its docstring), or None when this tree has no C kernel."""
        if self._ext is None:
            return None
        return self._ext.update_live(self._sum_levels, self._min_levels, self.fanout, tokens,
                                     values, raw, block_gen, flags, block_size, self.capacity,
                                     valid_bit)

    def clear_range(self, lo: int, hi: int) -> None:
        """Remove leaves ``lo .. hi - 1`` (a contiguous run: one slice per level)."""
        if hi <= lo:
            return
        self._sum[-1][lo:hi] = 0.0
        self._min[-1][lo:hi] = np.inf
        if self._ext is not None:
            self._ext.refresh_range(self._sum_levels, self._min_levels, lo, hi, self.fanout)
            return
        k = self.fanout
        for level in range(self.depth - 1, -1, -1):
            lo, hi = lo // k, (hi - 1) // k + 1
            self._sum[level][lo:hi] = self._sum_rows[level + 1][lo:hi].sum(axis=1)
            self._min[level][lo:hi] = self._min_rows[level + 1][lo:hi].min(axis=1)

    def find(self, u: Any) -> np.ndarray:
        """The leaf where each prefix sum ``u`` (array in ``[0, total)``) falls.

        Leaf ``i`` is returned for ``u`` in ``[sum(leaves[:i]), sum(leaves[:i + 1]))``, so a
        uniform ``u`` draws leaves in proportion to their values. Floating-point rounding can,
        rarely, land on an absent leaf next to the boundary: callers check :meth:`get` > 0.
        """
        u = np.array(u, np.float64)
        if self._ext is not None:
            out = np.empty(len(u), np.int64)
            self._ext.find(self._sum_levels, u, out, self.fanout)
            return out
        node = np.zeros(len(u), np.int64)
        k = self.fanout
        rows = np.arange(len(u))
        for level in range(1, self.depth + 1):
            base = node * k
            # Running sums of each node's children; a product with a triangular matrix of ones
            # is several times faster than np.cumsum along a short axis.
            cum = self._sum_rows[level][node] @ self._upper
            j = np.minimum((cum <= u[:, None]).sum(axis=1), k - 1)
            node = base + j
            u -= cum[rows, j] - self._sum[level][node]     # the sum of the children before j
        return node


class PriorityIndex:
    """Prioritized-replay state of a memory of ``num_slots`` slots.

    The tree stores ``(priority + eps) ** alpha`` for each sampleable slot and 0 for the rest.
    Steps published by a writer enter at the running maximum priority; they are queued by
    :meth:`on_publish` (one list append, cheap inside a writer's step) and entered in one
    vectorized update by :meth:`flush`, which every sample and priority update runs first, so
    a sampler always sees every published step. ``flags`` is the memory's slot-flag array
    (read at each flush to skip steps that stopped being sampleable): a memory that replaces
    that array must build a new index.
    """

    # Queued steps are entered once this many wait, so that a memory nobody samples from
    # (a long initial fill) does not queue a Python int per step without bound.
    FLUSH_AT = 65536

    def __init__(self, num_slots: int, alpha: float, eps: float, flags: np.ndarray,
                 valid_bit: int, *, kernel: Any = _AT_BUILD, pending: list[int] | None = None,
                 guard: WriteGuard | None = None) -> None:
        self.tree = SumMinTree(num_slots, kernel=kernel)    # kernel: as SumMinTree's
        # The memory's lock: its journal makes each change of this index one (a flush, an
        # update); an index of its own (a test's) gets a guard of its own.
        self._guard = WriteGuard() if guard is None else guard
        self._flags, self._valid_bit = flags, valid_bit   # the memory's slot flags (VALID)
        self.alpha = float(alpha)
        self.eps = float(eps)
        # The bound that keeps the tree finite: a sum over num_slots leaves of at most
        # max_value each is at most half of float64's maximum (the half absorbs rounding).
        self.max_value = float(np.finfo(np.float64).max) / (2 * num_slots)
        self.priority_bound = self._raw_bound() - self.eps
        if not self.priority_bound >= 1.0:     # new steps enter at priority 1 to begin with
            raise ValueError(
                f"priority_eps must be at most {self._raw_bound() - 1.0:.4g} for this memory "
                f"(alpha={self.alpha:g}, {num_slots} slots): (1 + priority_eps) ** alpha must be "
                f"at most {self.max_value:.4g} so that the priority tree's sums stay finite; "
                f"got {eps!r}")
        self.max_priority = 1.0      # raw priority (before eps and alpha), as in Schaul et al.
        # Slots published and not yet in the tree, in the order they came (repeats kept); the
        # memory's C write kernel appends to the same list.
        self._pending: list[int] = [] if pending is None else pending
        self._pending.clear()
        self.stale_updates = 0       # update_priorities entries skipped: slot evicted/rewritten

    def _raw_bound(self):
        """The largest ``p + eps`` whose tree value ``(p + eps) ** alpha`` is <= max_value."""
        if self.alpha == 0.0:
            return np.inf
        try:
            return math.exp(math.log(self.max_value) / self.alpha)
        except OverflowError:
            return np.inf

    def check_priorities(self, priorities: np.ndarray) -> None:
        """Refuse raw priorities above :attr:`priority_bound`.

        The rule: a priority ``p`` is accepted when ``(p + eps) ** alpha``, its value in the
        tree, is at most ``float64 max / (2 * num_slots)``, so that no sum over the tree can
        overflow (an infinite total makes every later draw fail). For alpha = 1 and a million
        slots that is about 9e301; for alpha < 0.003 every finite priority is accepted.
        Refused rather than clamped: a priority that large is a bug in the learner's TD
        errors, which a clamp would hide.
        """
        if len(priorities) and priorities.max() > self.priority_bound:
            raise ValueError(
                f"priorities must be at most {self.priority_bound:.4g} for this memory "
                f"(alpha={self.alpha:g}, {self.tree.capacity} slots) so that the priority "
                f"tree's sums stay finite; got {float(priorities.max())!r}")

    def check_update(self, indices: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray]:
        """The arguments of :meth:`ReplayMemory.update_priorities` checked (as documented
        there) and converted: (int64 tokens, float64 priorities)."""
        indices, priorities = np.asarray(indices), np.asarray(priorities)
        if indices.ndim != 1 or (indices.size and indices.dtype.kind not in 'iu'):
            raise ValueError(f"indices must be a 1-D integer array, got {indices.dtype} "
                             f"{indices.shape}")
        if priorities.dtype.kind not in 'iuf' or priorities.shape != indices.shape:
            raise ValueError(f"priorities must be a real array of the indices' shape "
                             f"{indices.shape}, got {priorities.dtype} {priorities.shape}")
        priorities = priorities.astype(np.float64)
        if priorities.size:
            # min >= 0 is False for NaN too; max finite rules out +inf.
            top = float(priorities.max())
            if not (priorities.min() >= 0 and math.isfinite(top)):
                raise ValueError("priorities must be finite and >= 0")
            if top > self.priority_bound:     # the bound that keeps the tree finite
                self.check_priorities(priorities)
        indices = indices.astype(np.int64)
        if indices.size and indices.min() < 0:
            raise ValueError("indices must come from sample(): negative index")
        return indices, priorities

    def update(self, tokens: np.ndarray, priorities: np.ndarray, block_gen: np.ndarray,
               block_size: int) -> int:
        """Set the priorities of the transitions of sample ``tokens`` (checked by
        :meth:`check_update`) whose slot still holds them (its block's generation in
        ``block_gen`` is the token's, and it is VALID); the last of repeated slots wins.
        Returns the count skipped (added to :attr:`stale_updates`). Under the memory's lock,
        after :meth:`flush`."""
        slots, gen = np.divmod(tokens, self.tree.capacity)[::-1]
        current = block_gen[slots // block_size]
        if tokens.size and (gen > current).any():
            raise ValueError("indices must come from sample(): an index names a slot "
                             "generation this memory has not written")
        values = (priorities + self.eps) ** self.alpha
        if self.tree.has_kernel:
            live = None
        else:
            live = self._live_last(slots, gen == current, values, priorities)
        result: list[int] = []
        self._guard.commit(self._updated, tokens, values, priorities, block_gen, block_size,
                           live, self.max_priority, self.stale_updates, result)
        return result[0]

    def _updated(self, tokens, values, priorities, block_gen, block_size, live, max0, stale0,
                 result):
        """:meth:`update`'s stores: the tree's leaves, the running maximum and the stale
        count, each from values taken before (``max0``, ``stale0``); the skipped count goes
        to ``result``."""
        if live is None:
            done = self.tree.update_live(tokens, values, priorities, block_gen, self._flags,
                                         block_size, self._valid_bit)
            assert done is not None      # has_kernel
            stale, top = done
        else:
            stale, slots, values, top = live
            if len(slots):
                self.tree.set(slots, values)
        self.max_priority = max(max0, top)
        self.stale_updates = stale0 + stale
        result[:] = [stale]

    def _live_last(self, slots, same_gen, values, priorities):
        """The numpy path's plan of an update: (skipped count, the live slots with the last
        of repeated ones, their tree values, the largest raw priority among them)."""
        live = same_gen & ((self._flags[slots] & self._valid_bit) != 0)
        stale = len(slots) - int(np.count_nonzero(live))
        if stale:
            slots, values, priorities = slots[live], values[live], priorities[live]
        if len(slots) > 1:
            # Keep the last of repeated slots (numpy's fancy assignment does not promise it):
            # in a stable sort, the last of equal slots is the last written.
            order = np.argsort(slots, kind='stable')
            ordered = slots[order]
            last = np.empty(len(slots), bool)
            last[-1] = True
            np.not_equal(ordered[1:], ordered[:-1], out=last[:-1])
            if not last.all():
                order = order[last]
                slots, values, priorities = slots[order], values[order], priorities[order]
        top = float(priorities.max()) if len(slots) else -math.inf
        return stale, slots, values, top

    # -- exported state (a checkpoint's; the leaves are the ring's ``priority`` table)
    @property
    def leaves(self) -> np.ndarray:
        """The tree's leaves, one per slot: what a checkpoint stores and, for a new index,
        reads into (then :meth:`load_state` and :meth:`rebuild`)."""
        return self.tree.leaves

    def state(self) -> dict[str, float | int]:
        """The counters a checkpoint stores beside the leaves (after a :meth:`flush`)."""
        return dict(max_priority=self.max_priority, stale_priority_updates=self.stale_updates)

    def load_state(self, max_priority: float, stale_updates: int) -> None:
        """The counters of an exported :meth:`state` (its leaves were read into :attr:`leaves`)."""
        self.max_priority = float(max_priority)
        self.stale_updates = int(stale_updates)

    def rebuild(self) -> None:
        """Recompute the tree's inner nodes from its leaves (after a checkpoint's were read)."""
        self.tree.rebuild()

    @property
    def pending(self) -> np.ndarray:
        """The slots published since the last :meth:`flush`, not in the tree yet (in the order
        they came, repeats kept): a copy."""
        return np.array(self._pending, np.int64)

    # -- hooks called by the memory's write path (under its lock)
    def prepare_publish(self, slots: np.ndarray) -> tuple[int, list[int]]:
        """What :meth:`on_publish` stores for steps from ``slots`` (an int array) that become
        sampleable: where they go in the queue, and them. Enters the queue into the tree
        first when it is full, so that a memory nobody samples from does not queue without
        bound."""
        if len(self._pending) + len(slots) >= self.FLUSH_AT:
            self.flush()
        return len(self._pending), np.asarray(slots).ravel().tolist()

    def on_publish(self, publication: tuple[int, list[int]]) -> None:
        """Queue the steps of a :meth:`prepare_publish` (a store at a fixed place in the
        queue: done twice, it is done once)."""
        at, slots = publication
        self._pending[at:] = slots

    def on_evict(self, lo: int, hi: int, invalidated: np.ndarray | None = None) -> None:
        """Slots ``lo .. hi - 1`` (an evicted block) and ``invalidated`` (an int array of
        slots whose history was cut) are no longer sampleable."""
        self.tree.clear_range(lo, hi)
        if invalidated is not None and len(invalidated):
            self.tree.set(invalidated, np.zeros(len(invalidated)))

    # -- sampling side
    def flush(self) -> None:
        """Enter the queued steps at the running maximum priority (skipping any that stopped
        being sampleable since they were queued)."""
        if not self._pending:
            return
        slots = np.unique(np.array(self._pending, np.int64))
        value = (self.max_priority + self.eps) ** self.alpha
        valid = (self._flags[slots] & self._valid_bit) != 0
        self._guard.commit(self._flushed, slots, np.where(valid, value, 0.0))

    def _flushed(self, slots: np.ndarray, values: np.ndarray) -> None:
        """:meth:`flush`'s stores: the queue is emptied in place (the C kernel holds it)."""
        self.tree.set(slots, values)
        self._pending.clear()

    def draw(self, n: int, rng: Any) -> np.ndarray:
        """``n`` slots drawn with probability proportional to the tree's values."""
        total = self.tree.total
        out = self.tree.find(_uniform(rng, n) * total)
        for _ in range(64):
            bad = self.tree.get(out) <= 0
            if not bad.any():
                return out
            out[bad] = self.tree.find(_uniform(rng, int(bad.sum())) * total)
        raise RuntimeError("prioritized draw kept landing on absent leaves: the tree is corrupt")

    def weights(self, slots: np.ndarray, beta: float) -> np.ndarray:
        """Importance weights ``(N * P(i)) ** -beta / max_j (N * P(j)) ** -beta``.

        With ``P(i) = p_i / total`` that is ``(p_i / p_min) ** -beta``: N and the total cancel.
        """
        return (self.tree.get(slots) / self.tree.min) ** -beta


def _uniform(rng, n):
    """``n`` floats in [0, 1) from a numpy Generator or a legacy RandomState."""
    if hasattr(rng, 'random'):
        return rng.random(n)
    return rng.random_sample(n)
