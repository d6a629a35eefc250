"""The replay memory: every observation frame stored once, sampled as stacked histories.

:class:`ReplayMemory` is the façade users hold. Its parts, each a module of its own:

* :mod:`expreplay.storage.ring`: :class:`~expreplay.storage.ring.BlockRing`, the slot and block
  tables, their invariants (I1-I7) and the block life cycle (claim, retire, evict);
* :mod:`expreplay.storage.writers`: the write path (:class:`BatchWriter`, :class:`LaneWriter`),
  with the rules of what may be written in :mod:`expreplay.storage._inputs`;
* :mod:`expreplay.storage.sampling`: the uniform draw, the n-step window and the batches
  (:class:`SampleBatch`);
* :mod:`expreplay.storage.distribution`: how :meth:`ReplayMemory.sample` draws, uniformly or
  by priority (a :class:`~expreplay.storage.distribution.SamplingDistribution` the ring keeps);
* :mod:`expreplay.storage.priority`: the sum tree of a prioritized memory;
* :mod:`expreplay.storage.checkpoint`: the checkpoint file format over the ring's exported
  state (:meth:`~expreplay.storage.ring.BlockRing.state` / ``load_state``).

The public names of the writers and the input rules are re-exported here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from . import checkpoint as _checkpoint
from .checkpoint import CheckpointError
from .._checks import (check_allocatable, check_bool, check_choice, check_dtype, check_int,
                       check_probability, check_real, check_rng, check_shape)
# The input rules and the writers live in their own modules; their names stay importable from
# here (the acting package and users import them from expreplay.storage.memory).
from ._inputs import (_FLOAT32_MAX, _INT32_MAX, _INT32_MIN, as_frame, check_action,  # noqa: F401
                      check_actions, check_extra_fields, check_extras, check_flags, check_frames,
                      check_reward, check_rewards)
from .draw import DEFAULTS as DEFAULT_DRAW, LAYOUTS, DrawSettings
from .distribution import PrioritizedDistribution, SamplingDistribution, UniformDistribution
from .ring import BlockRing
from .sampling import SampleBatch, Sampler
from .stored_episodes import EpisodeReader, StoredEpisodes
from .writers import BatchWriter, LaneWriter, TensorpackAppender

__all__ = ['Experience', 'ReplayMemory', 'LaneWriter', 'BatchWriter', 'SampleBatch', 'CheckpointError', 'as_frame',
           'check_frames', 'check_rewards', 'check_actions', 'check_flags', 'load_into']



class Experience(NamedTuple):
    """One step in the tensorpack convention: the state acted upon, the action, the reward,
    and whether the episode ended with this step (see :meth:`ReplayMemory.append`)."""
    state: Any
    action: Any
    reward: Any
    isOver: Any


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

    def __init__(self, max_size: int | float, state_shape: Any, history_len: int | float,
                 dtype: Any = 'uint8', *, block_size: int | float | None = None,
                 prioritized: bool = False, alpha: float = 0.6, priority_eps: float = 1e-6,
                 extra_fields: Mapping[str, Any] | None = None) -> None:
        prioritized = check_bool(prioritized, 'prioritized')
        extra = check_extra_fields(extra_fields)
        alpha, priority_eps = _priority_args(alpha, priority_eps)
        self.max_size = check_int(max_size, 'max_size', 1, allow_float=True)
        self.history_len = check_int(history_len, 'history_len', 1, allow_float=True)
        self.state_shape: tuple[int, ...] = check_shape(state_shape, 'state_shape')
        self.dtype: np.dtype = check_dtype(dtype, 'dtype')
        self.block_size = _block_size(self.max_size, self.history_len, block_size)
        self.num_blocks = _num_blocks(self.max_size, self.block_size)
        self.num_slots = self.num_blocks * self.block_size
        self.ZERO_SLOT = self.num_slots          # the index of the all-zeros slot (I7)
        # The one place the flag is read: it chooses how samples are drawn, and the ring keeps
        # that object in step with its tables from now on.
        distribution = (PrioritizedDistribution(alpha, priority_eps) if prioritized
                        else UniformDistribution())
        self._check_allocatable(extra, distribution)
        # The slot and block tables, shared by the writers, the sampler and the checkpoints.
        self.ring = BlockRing(self.num_blocks, self.block_size, self.history_len,
                              self.state_shape, self.dtype, extra, distribution)
        self.sampler = Sampler(self.ring)
        self._rng = np.random.default_rng()
        self._appender: TensorpackAppender | None = None

    def _check_allocatable(self, extra: Mapping[str, np.dtype],
                           distribution: SamplingDistribution) -> None:
        """Refuse a memory that can not be allocated (:func:`check_allocatable`), naming its
        size."""
        frame_bytes = int(np.prod(self.state_shape)) * self.dtype.itemsize
        per_step = (frame_bytes + 13 + sum(d.itemsize for d in extra.values())
                    + distribution.bytes_per_slot)     # the class docstring's memory use
        check_allocatable(
            (self.num_slots + 1) * per_step,
            f"ReplayMemory(max_size={self.max_size}) of {self.state_shape} {self.dtype} frames",
            f"each step takes {per_step} bytes: choose a smaller max_size")

    # ------------------------------------------------------------------ writers
    def new_writer(self) -> LaneWriter:
        """A new :class:`LaneWriter` on this memory. Use one per environment and thread."""
        return LaneWriter(self)

    def new_batch_writer(self, num_lanes: int) -> BatchWriter:
        """A new :class:`BatchWriter` of ``num_lanes`` lanes: the steps of several environments
        written in one call (what the runners use). Use it from one thread."""
        return BatchWriter(self, num_lanes)

    def append(self, exp: Experience | tuple) -> None:
        """Add one step in tensorpack's single-writer convention.

        ``exp = Experience(state, action, reward, isOver)``: the state acted upon, the action
        taken, the reward received, and whether the episode ended with it. The state of the
        next ``append`` is the next state of this step, so a non-terminal step becomes
        sampleable once the next one is appended. This API has no final observation: the next
        frame of a step with ``isOver=True`` is stored as zeros (the DQN target masks it), and
        the step counts as terminated. Prefer :meth:`new_writer` for new code.
        """
        if self.ring.extras:
            raise ValueError(f"append() can not store this memory's extra_fields "
                             f"{sorted(self.ring.extras)} (an Experience has none): write its "
                             "steps with new_writer().add_step(..., extras={...})")
        if self._appender is None:
            self._appender = TensorpackAppender(self)
        self._appender.append(*exp)

    @property
    def extra_fields(self) -> dict[str, np.dtype]:
        """The extra per-step fields, name -> numpy dtype (a copy)."""
        return self.ring.extra_fields

    # ------------------------------------------------------------------ sampling
    def __len__(self) -> int:
        """The number of transitions that can be sampled now."""
        self.ring.lock.settle()
        return self.ring.num_valid

    @property
    def num_steps_written(self) -> int:
        """Steps added since the memory was created (including evicted ones)."""
        self.ring.lock.settle()
        return self.ring.num_steps_written

    @property
    def prioritized(self) -> bool:
        """Whether :meth:`sample` draws by priority."""
        return self.ring.distribution.prioritized

    @property
    def priority_settings(self) -> dict[str, float] | None:
        """``{'alpha': ..., 'priority_eps': ...}`` of a prioritized memory; None if uniform."""
        return self.ring.distribution.settings

    def sample_batch(self, batch_size: int | float, rng: Any = None, layout: str | None = None, *,
                     out: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """Sample ``batch_size`` transitions uniformly (with replacement) from the valid ones.

        Args:
            batch_size (int): number of transitions.
            rng: a ``numpy.random.Generator`` or ``RandomState``; the memory's own by default.
                A seed (an int) is refused with a TypeError naming ``rng``: a seed given per
                call would draw the same batch every time; pass ``numpy.random.default_rng(seed)``.
            layout (str): the states' layout (:class:`~expreplay.storage.draw.DrawSettings`;
                None: its default, ``'NHWC'``, tensorpack's).
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
        size: int = check_int(batch_size, 'batch_size', 1, allow_float=True)
        layout = (DEFAULT_DRAW.layout if layout is None
                  else check_choice(layout, 'layout', LAYOUTS))   # the rule DrawSettings applies
        rng = self._rng if rng is None else check_rng(rng, 'rng')
        if out is not None:
            self.sampler.check_comb_out(out, size, layout)
        return self.sampler.comb_batch(size, rng, layout, out)

    def sample(self, batch_size: int | float, *, n_step: int | None = None,
               gamma: float | None = None, beta: float | None = None, layout: str | None = None,
               rng: Any = None, out: SampleBatch | None = None,
               weight_norm: str | None = None) -> SampleBatch:
        """Sample ``batch_size`` n-step transitions (with replacement) as a :class:`SampleBatch`.

        A transition from the state at step ``t`` sums the rewards of steps ``t .. t + k - 1``
        (``gamma ** j`` for the j-th), where k is ``n_step``, or fewer when the episode ends
        sooner or the lane has not written further yet. ``next_state`` is the state at
        ``t + k``: for an episode that ended in the window, its final observation. ``discount``
        is ``gamma ** k``, and 0 when the episode *terminated* in the window (a *truncated*
        end bootstraps from the final observation). The window never leaves the episode, so it
        never crosses into another episode or another writer's lane, and its cost is bounded
        by the episode, whatever ``n_step`` says.

        So ``discount`` already holds what CleanRL's ``dqn.py`` computes as ``gamma * (1 -
        done)``, with the n-step power and the truncation rule in it: the target is
        ``reward + discount * max_a Q_target(next_state, a)``, never multiplied by gamma or
        ``1 - is_over`` again. Every field of the :class:`SampleBatch` is a fresh, C-contiguous,
        writable array (``state`` bool, uint8 or float as the memory; ``action`` int32: index
        with ``.long()`` in PyTorch) that no later ``sample`` writes while it is referenced,
        so ``torch.from_numpy(batch.state)`` may be held zero-copy, pinned, or be the source of
        a non-blocking device copy in flight (without ``out=``: that one reuses the arrays).
        docs/pytorch.md shows the update.

        Args:
            batch_size (int): number of transitions (whole floats accepted, as for the sizes).
            n_step, gamma, layout, weight_norm: the draw's settings, documented (with their
                defaults, used for those not given or None) by
                :class:`~expreplay.storage.draw.DrawSettings`.
            beta (float, optional): importance-sampling exponent in [0, 1] for a prioritized
                memory; None gives weights of 1. A uniform memory's weights are always 1.
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
        draw = DrawSettings.given(n_step=n_step, gamma=gamma, layout=layout,
                                  weight_norm=weight_norm)
        return self.draw(batch_size, draw, beta=beta, rng=rng, out=out)

    def draw(self, batch_size: int | float, settings: DrawSettings, *, beta: float | None = None,
             rng: Any = None, out: SampleBatch | None = None) -> SampleBatch:
        """:meth:`sample` with its settings as one :class:`~expreplay.storage.draw.DrawSettings`
        (how a :class:`~expreplay.stream.sampling.Sampling` draws: its settings are checked
        once, when it is built). The other arguments and the batch are :meth:`sample`'s."""
        size: int = check_int(batch_size, 'batch_size', 1, allow_float=True)
        if not isinstance(settings, DrawSettings):
            raise TypeError(f"settings must be a DrawSettings, got {type(settings).__name__}")
        beta = None if beta is None else check_probability(beta, 'beta')
        rng = self._rng if rng is None else check_rng(rng, 'rng')
        if out is not None:
            self.sampler.check_sample_out(out, size, settings.layout)
        return self.sampler.n_step_batch(size, settings, beta, rng, out)

    def update_priorities(self, indices: Any, priorities: Any) -> int:
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
        return self.sampler.update_priorities(
            *self.ring.distribution.check_update(indices, priorities))

    @property
    def stale_priority_updates(self) -> int:
        """:meth:`update_priorities` entries skipped so far (their slot was evicted/rewritten)."""
        return self.ring.distribution.stale_updates

    # ------------------------------------------------------------------ whole episodes
    def episodes(self) -> StoredEpisodes:
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
        return EpisodeReader(self.ring).stored()

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | os.PathLike[str]) -> int:
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
        return self.ring.lock.run(self._save, os.fspath(path))

    def _save(self, path: str) -> int:
        """:meth:`save` under the ring's lock."""
        counters, tables = self.ring.state()
        return _checkpoint.write(path, dict(self._settings(), **counters), tables)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, max_size: int | float | None = None,
             state_shape: Any = None, history_len: int | float | None = None, dtype: Any = None,
             block_size: int | float | None = None, prioritized: bool | None = None,
             alpha: float | None = None, priority_eps: float | None = None,
             extra_fields: Mapping[str, Any] | None = None) -> ReplayMemory:
        """Load a memory saved by :meth:`save`: its written slots bit-identical, its
        transitions sampled as before (a prioritized memory keeps its priorities, its running
        maximum priority and its stale-update count, so it draws exactly as it did).
        (:meth:`restore` fills a new memory the caller already holds instead.)

        The memory is built with the checkpoint's settings. Pass the settings you expect (any
        of ``max_size``, ``state_shape``, ``history_len``, ``dtype``, ``block_size``,
        ``prioritized``, ``alpha``, ``priority_eps``, ``extra_fields``; ``extra_fields={}``
        expects none) to have a checkpoint of other settings refused, naming each that differs
        (``alpha`` and ``priority_eps`` are compared when either side is prioritized).
        Checkpoints of format 2 (before priorities were saved) load as uniform memories.

        Raises:
            CheckpointError: (a ``ValueError``) the file is empty, truncated, corrupt, crafted
                (its tables break the memory's invariants) or of other settings; the message
                names the file and what is wrong.
            FileNotFoundError: there is no file at ``path``.
        """
        expected = _checkpoint.expected_settings(
            max_size=max_size, state_shape=state_shape, history_len=history_len, dtype=dtype,
            block_size=block_size, prioritized=prioritized, alpha=alpha,
            priority_eps=priority_eps, extra_fields=extra_fields)
        return cls._load(os.fspath(path), expected)

    @classmethod
    def _load(cls, path: str, expected: Mapping[str, Any]) -> ReplayMemory:
        """:meth:`load`: the memory built on the file's settings, its ring filled from the
        file (and checked) by the ring itself."""
        with _checkpoint.open_checkpoint(path) as source:
            source.check_settings(expected)
            config = source.settings
            # The block tables bound everything else: check their size before building the
            # memory (whose frames a crafted configuration could make huge).
            max_size, bs = config['max_size'], config['block_size']
            try:
                _block_size(max_size, config['history_len'], bs)
            except ValueError as err:
                source.fail(f"bad metadata: {err}")
            source.open('block_fill', np.int64, (_num_blocks(max_size, bs),)).close()
            mem = source.build(lambda: cls(
                max_size, config['state_shape'], config['history_len'], config['dtype'],
                block_size=bs, **{k: config[k] for k in _OPTIONAL_SETTINGS if k in config}))
            mem._fill(source)
        return mem

    def restore(self, path: str | os.PathLike[str]) -> None:
        """Fill this memory in place with the checkpoint at ``path`` (:meth:`save`'s): the
        object the caller holds becomes the saved memory, as :meth:`load` would have built it,
        so whatever already refers to it (a stream, a script) sees the transitions.

        The memory must be new: nothing written to it and no block taken by a writer (a
        ``ValueError`` says so otherwise). The file must have all of this memory's settings
        (``max_size``, ``state_shape``, ``history_len``, ``dtype``, ``block_size``,
        ``prioritized``, ``alpha``, ``priority_eps``, ``extra_fields``); a
        :class:`CheckpointError` names each that differs, and any failure to read the file
        leaves the memory empty, as it was. ``FileNotFoundError`` when there is no file.
        """
        path = os.fspath(path)
        priority: Mapping[str, float | None] = self.priority_settings or dict(
            alpha=None, priority_eps=None)
        expected = _checkpoint.expected_settings(
            max_size=self.max_size, state_shape=self.state_shape,
            history_len=self.history_len, dtype=self.dtype, block_size=self.block_size,
            prioritized=self.prioritized, extra_fields=self.extra_fields, **priority)
        # A misuse, not a bad file: a ValueError of its own (the file may be fine), said before
        # the file is opened, and again if a writer took a block meanwhile.
        self._require_new(path)
        touched = False
        with _checkpoint.open_checkpoint(path) as source:
            source.check_settings(expected)
            touched = self.ring.lock.run(self._fill_if_new, source)
        if touched:
            self._require_new(path)

    def _settings(self) -> dict[str, Any]:
        """The constructor's arguments, as a checkpoint's ``meta`` holds them."""
        settings = dict(max_size=self.max_size, state_shape=list(self.state_shape),
                        history_len=self.history_len, dtype=self.dtype.str,
                        block_size=self.block_size, prioritized=self.prioritized,
                        extra_fields=[[name, d.str] for name, d in self.extra_fields.items()])
        return dict(settings, **(self.priority_settings or {}))

    def _require_new(self, path: str) -> None:
        """Refuse to :meth:`restore` into this memory unless it is new (a ``ValueError``)."""
        if not self.ring.untouched:
            raise ValueError(f"ReplayMemory.restore needs a new memory: this one has "
                             f"{self.num_steps_written} steps written or blocks taken by "
                             f"writers, which {path} would overwrite (build a new ReplayMemory "
                             "to restore into, or use ReplayMemory.load)")

    def _fill_if_new(self, source: _checkpoint.CheckpointSource) -> bool:
        """:meth:`_fill` unless a writer touched the ring (True then), under its lock."""
        if not self.ring.untouched:
            return True
        self._fill(source)
        return False

    def _fill(self, source: _checkpoint.CheckpointSource) -> None:
        """This memory's new ring filled from ``source`` (and checked) by the ring itself."""
        source.check_tables(self.ring.table_names())
        self.ring.load_state(source.counters, source)


def load_into(memory: ReplayMemory, path: str | os.PathLike[str]) -> None:
    """Fill ``memory`` in place with the checkpoint at ``path``: ``memory.restore(path)``,
    which documents it (the settings the file must have, the errors).

    Deprecated: call :meth:`ReplayMemory.restore`. This alias stays for code written before
    the method, and warns of nothing."""
    memory.restore(path)


_OPTIONAL_SETTINGS = ('prioritized', 'alpha', 'priority_eps', 'extra_fields')


def _num_blocks(max_size: int, block_size: int) -> int:
    """The ring's blocks for ``max_size`` steps (at least two)."""
    return max(2, -(-max_size // block_size))


def _priority_args(alpha: Any, priority_eps: Any) -> tuple[float, float]:
    """``(alpha, priority_eps)`` checked: alpha in [0, 1], priority_eps > 0."""
    alpha = check_probability(alpha, 'alpha')
    priority_eps = check_real(priority_eps, 'priority_eps', minimum=0.0)
    if priority_eps <= 0:
        raise ValueError(f"priority_eps must be > 0 (a zero priority would never be "
                         f"sampled again), got {priority_eps!r}")
    return alpha, priority_eps


def _block_size(max_size: int, history_len: int, block_size: Any) -> int:
    """The ``block_size`` argument checked (see :class:`ReplayMemory`), or its default."""
    if max_size < history_len + 1:
        raise ValueError(f"max_size ({max_size}) is too small for history_len "
                         f"({history_len}): it must be at least history_len + 1")
    if block_size is None:
        block_size = max(history_len, -(-max_size // _DEFAULT_TARGET_BLOCKS))
    block_size = check_int(block_size, 'block_size', 1, allow_float=True)
    if block_size < history_len:  # I4
        raise ValueError(f"block_size ({block_size}) must be >= history_len ({history_len})")
    if block_size > max_size:
        # Refused rather than clamped: the ring holds at least two blocks, so such a
        # block_size would silently multiply the memory (100 steps asked, 2 blocks built).
        raise ValueError(f"block_size ({block_size}) must be <= max_size ({max_size}): "
                         "the memory holds at least two blocks, so a larger block would "
                         "allocate far more than max_size slots")
    return block_size
