"""How a replay memory chooses the transitions of a sample: its *sampling distribution*.

A :class:`SamplingDistribution` is the one object that knows whether a memory draws uniformly
or by priority. :class:`~expreplay.storage.memory.ReplayMemory` reads its ``prioritized``
argument once, to build a :class:`UniformDistribution` or a :class:`PrioritizedDistribution`;
everything after that calls the object instead of testing the flag:

* the ring (:class:`~expreplay.storage.ring.BlockRing`) keeps it in step with the VALID slots
  (:meth:`~SamplingDistribution.on_publish`, :meth:`~SamplingDistribution.on_evict`), exports
  and loads its state with the ring's (:meth:`~SamplingDistribution.tables`,
  :meth:`~SamplingDistribution.state`, :meth:`~SamplingDistribution.load_state`, which also
  checks what a file holds for it) and makes it new again (:meth:`~SamplingDistribution.reset`);
* the sampler draws a batch's slots and weights from it (:meth:`~SamplingDistribution.draw`)
  and hands it the learner's priorities (:meth:`~SamplingDistribution.update`);

A distribution owns its state (the uniform one has none; the prioritized one its
:class:`~expreplay.storage.priority.PriorityIndex`), and that state follows the ring's
tables, so every method that changes it runs under the ring's lock, called by the ring or the
sampler, which hold it. Only :meth:`~SamplingDistribution.check_update` (which changes
nothing) runs without it.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import numpy as np

from .. import _kernels
from ._guard import WriteGuard
from ._slots import _VALID
from .priority import PriorityIndex

__all__ = ['SamplingDistribution', 'UniformDistribution', 'PrioritizedDistribution']

#: A uniform draw of ``n`` VALID slots with a generator: the sampler's (it runs over the
#: ring's written slots in the C sampler, and ``sample_batch`` draws with it whatever the
#: memory's distribution).
UniformDraw = Callable[[int, Any], np.ndarray]

#: The table a prioritized memory's checkpoint stores its tree's leaves in (one per slot).
PRIORITY_TABLE = 'priority'

_NOT_PRIORITIZED = ("update_priorities needs a prioritized memory "
                    "(ReplayMemory(..., prioritized=True))")


class SamplingDistribution(abc.ABC):
    """Which VALID slots of a ring a sample draws, and the state that takes.

    Attributes (of the class): ``prioritized`` is what :attr:`ReplayMemory.prioritized`
    reports; ``tracks_slots`` says whether :meth:`on_publish` needs the slots (when False the
    write path does not gather them); ``bytes_per_slot`` is the memory it adds per slot.
    """

    prioritized: bool
    tracks_slots: bool
    bytes_per_slot: int

    @property
    @abc.abstractmethod
    def priorities(self) -> PriorityIndex | None:
        """The priority index (tree, running maximum, pending steps), for reading; None when
        the draws do not use priorities."""

    @property
    @abc.abstractmethod
    def settings(self) -> dict[str, float] | None:
        """``{'alpha': ..., 'priority_eps': ...}`` for a prioritized distribution, else None
        (:attr:`ReplayMemory.priority_settings`)."""

    @property
    @abc.abstractmethod
    def stale_updates(self) -> int:
        """:meth:`update` entries skipped so far because their slot was evicted or rewritten."""

    #: The list the ring's C write kernel appends the slots it publishes to (None: it need
    #: not tell), and the length at which it declines, leaving the step to the numpy path.
    published: list[int] | None = None
    publish_limit: int = 0

    @abc.abstractmethod
    def reset(self, flags: np.ndarray, guard: WriteGuard) -> None:
        """Forget everything: the ring's tables are new (nothing written). ``flags`` is the
        ring's slot-flag table (one per slot), which a distribution may keep to read VALID;
        ``guard`` the ring's lock, whose journal its own writes go through."""

    def make_room(self, n: int) -> None:
        """Make sure :meth:`prepare_publish` of up to ``n`` slots writes nothing of its own
        (a write that claims blocks calls it first). Under the lock."""

    def snapshot(self, slots: np.ndarray) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
        """``(restore, args)`` that puts the state of ``slots`` back as it is now (for an
        undo log), or None when this distribution keeps no state per slot."""
        return None

    @abc.abstractmethod
    def prepare_publish(self, slots: np.ndarray) -> Any:
        """What :meth:`on_publish` stores for steps taken from ``slots`` (an int array) that
        become VALID in the write being prepared. Under the lock, before that write commits."""

    @abc.abstractmethod
    def on_publish(self, publication: Any) -> None:
        """Store :meth:`prepare_publish`'s ``publication`` (inside the write's commit: done
        twice, it is done once)."""

    @abc.abstractmethod
    def on_evict(self, lo: int, hi: int, invalidated: np.ndarray | None) -> None:
        """Slots ``lo .. hi - 1`` (an evicted block) and ``invalidated`` (slots whose history
        the eviction cut) are no longer VALID."""

    @abc.abstractmethod
    def draw(self, n: int, rng: Any, beta: float | None, weight_norm: str,
             uniform: UniformDraw) -> tuple[np.ndarray, np.ndarray | None]:
        """``n`` VALID slots and their importance weights (None: all 1), as
        :meth:`ReplayMemory.sample` documents ``beta`` and ``weight_norm``. ``uniform`` is
        the sampler's uniform draw."""

    @abc.abstractmethod
    def check_update(self, indices: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`ReplayMemory.update_priorities`' arguments checked and converted to (int64
        sample tokens, float64 priorities); a ValueError when they, or this distribution,
        can not take them. Changes nothing (no lock needed)."""

    @abc.abstractmethod
    def update(self, tokens: np.ndarray, priorities: np.ndarray, block_gen: np.ndarray,
               block_size: int) -> int:
        """Give the transitions of the sample ``tokens`` (from :meth:`check_update`) their
        new ``priorities``, skipping those whose slot was rewritten since (its block's
        generation in ``block_gen`` differs); returns the count skipped."""

    @abc.abstractmethod
    def tables(self) -> list[tuple[str, np.ndarray, str]]:
        """``(name, array, kind)`` of the tables a checkpoint stores for this distribution
        (kinds as in :data:`expreplay.storage.ring.TABLES`); a load reads into the arrays."""

    @abc.abstractmethod
    def state(self) -> dict[str, Any]:
        """The counters a checkpoint stores beside :meth:`tables`, after entering whatever is
        pending into those tables (so they are complete when the checkpoint reads them)."""

    @abc.abstractmethod
    def load_state(self, counters: Mapping[str, Any], fail: Callable[[str], NoReturn]) -> None:
        """Take an exported :meth:`state`'s counters, once its :meth:`tables` were read in and
        the ring's tables checked (VALID is then what the file says), check them against the
        VALID slots (``fail(problem)`` raises), and rebuild what a checkpoint does not store.
        If it fails, the ring calls :meth:`reset`."""


class UniformDistribution(SamplingDistribution):
    """Every VALID slot equally likely: the ring's VALID flags are the whole state, so this
    keeps none, its write hooks do nothing, and its weights are all 1."""

    prioritized = False
    tracks_slots = False
    bytes_per_slot = 0

    @property
    def priorities(self) -> None:
        return None

    @property
    def settings(self) -> None:
        return None

    @property
    def stale_updates(self) -> int:
        return 0

    def reset(self, flags: np.ndarray, guard: WriteGuard) -> None:
        pass

    def prepare_publish(self, slots: np.ndarray) -> None:
        return None

    def on_publish(self, publication: None) -> None:
        pass

    def on_evict(self, lo: int, hi: int, invalidated: np.ndarray | None) -> None:
        pass

    def draw(self, n: int, rng: Any, beta: float | None, weight_norm: str,
             uniform: UniformDraw) -> tuple[np.ndarray, None]:
        return uniform(n, rng), None

    def check_update(self, indices: Any, priorities: Any) -> NoReturn:
        raise ValueError(_NOT_PRIORITIZED)

    def update(self, tokens: np.ndarray, priorities: np.ndarray, block_gen: np.ndarray,
               block_size: int) -> NoReturn:
        raise ValueError(_NOT_PRIORITIZED)

    def tables(self) -> list[tuple[str, np.ndarray, str]]:
        return []

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, counters: Mapping[str, Any], fail: Callable[[str], NoReturn]) -> None:
        pass


class PrioritizedDistribution(SamplingDistribution):
    """Proportional prioritized draws (Schaul et al.): slot ``i`` with probability
    ``p_i ** alpha / sum_j p_j ** alpha``, kept in a
    :class:`~expreplay.storage.priority.PriorityIndex` over the ring's slots, which new steps
    enter at the largest priority given so far.

    Args:
        alpha (float): priority exponent in [0, 1].
        eps (float): added to every priority (> 0).

    The index is built by :meth:`reset`, when the ring gives its flags (the ring does so
    when it is built).
    """

    prioritized = True
    tracks_slots = True
    bytes_per_slot = 17       # the tree's sums and minima (ReplayMemory's docstring: 16.5)

    _index: PriorityIndex
    published: list[int]

    def __init__(self, alpha: float, eps: float) -> None:
        self.alpha = float(alpha)
        self.eps = float(eps)
        # The tree kernel of every index this distribution builds (the first one, and the new
        # one after a failed load), taken once, here, with the memory (expreplay._kernels):
        # the memory keeps the path it was built with.
        self._tree_ext = _kernels.get('_tree_ext')
        # One list for the life of the distribution (the C write kernels hold it): the steps
        # published since the last flush of whichever index is current.
        self.published = []
        self.publish_limit = PriorityIndex.FLUSH_AT

    @property
    def priorities(self) -> PriorityIndex:
        return self._index

    @property
    def settings(self) -> dict[str, float]:
        return {'alpha': self.alpha, 'priority_eps': self.eps}

    @property
    def stale_updates(self) -> int:
        return self._index.stale_updates

    def reset(self, flags: np.ndarray, guard: WriteGuard) -> None:
        # A new index rather than a cleared one: PriorityIndex refuses an eps too large for
        # the slot count when it is built, which is when the memory is built.
        self.published.clear()
        self._index = PriorityIndex(len(flags), self.alpha, self.eps, flags, _VALID,
                                    kernel=self._tree_ext, pending=self.published, guard=guard)
        self._flags = flags

    def prepare_publish(self, slots: np.ndarray) -> tuple[int, list[int]]:
        return self._index.prepare_publish(slots)

    def make_room(self, n: int) -> None:
        if len(self.published) + n >= PriorityIndex.FLUSH_AT:
            self._index.flush()

    def snapshot(self, slots: np.ndarray) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        tree = self._index.tree
        return tree.set, (slots, tree.get(slots).copy())

    def on_publish(self, publication: tuple[int, list[int]]) -> None:
        self._index.on_publish(publication)

    def on_evict(self, lo: int, hi: int, invalidated: np.ndarray | None) -> None:
        self._index.on_evict(lo, hi, invalidated)

    def draw(self, n: int, rng: Any, beta: float | None, weight_norm: str,
             uniform: UniformDraw) -> tuple[np.ndarray, np.ndarray | None]:
        index = self._index
        index.flush()            # every published step is drawable
        slots = index.draw(n, rng)
        if beta is None:
            return slots, None
        weights = index.weights(slots, beta)     # 'memory': over the memory's largest
        if weight_norm == 'batch':
            weights = weights / weights.max()
        return slots, weights

    def check_update(self, indices: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray]:
        return self._index.check_update(indices, priorities)

    def update(self, tokens: np.ndarray, priorities: np.ndarray, block_gen: np.ndarray,
               block_size: int) -> int:
        self._index.flush()      # a pending step updated now must not re-enter at the maximum
        return self._index.update(tokens, priorities, block_gen, block_size)

    def tables(self) -> list[tuple[str, np.ndarray, str]]:
        return [(PRIORITY_TABLE, self._index.leaves, 'slot')]

    def state(self) -> dict[str, Any]:
        self._index.flush()      # steps published since the last sample enter the leaves
        return self._index.state()

    def load_state(self, counters: Mapping[str, Any], fail: Callable[[str], NoReturn]) -> None:
        """The counters taken; then the tree must hold exactly the VALID slots (written slots
        only were loaded, the others are zeros), with finite values within the bound that
        keeps its sums finite (:meth:`PriorityIndex.check_priorities`), and so must the
        running maximum: the draw relies on all of it. Only then are the inner nodes rebuilt
        from the leaves (bit for bit: they are a function of the leaves)."""
        index = self._index
        index.load_state(counters['max_priority'], counters['stale_priority_updates'])
        leaves = index.leaves
        if not np.isfinite(leaves).all() or (leaves < 0).any():
            fail("inconsistent: priorities that are negative or not finite")
        if leaves.max(initial=0.0) > index.max_value \
                or index.max_priority > index.priority_bound:
            fail(f"inconsistent: priorities above the bound that keeps the priority tree's sums "
                 f"finite (tree values <= {index.max_value:.4g})")
        if ((leaves > 0) != ((self._flags & _VALID) != 0)).any():
            fail("inconsistent: the priority table disagrees with the valid slots")
        index.rebuild()
