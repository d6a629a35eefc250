"""Sampling: what a stream's batches are, and how many of them per inserted transition.

One object owns the learner's side of the replay: the batch size, the n-step returns and their
discount, the importance-sampling exponent of prioritized replay, the layout of the states, the
sampling seed, and the insert ratio (``update_frequency`` inserted transitions per batch, or
``samples_per_insert`` sampled per inserted one). It draws batches from a memory; a
:class:`~expreplay.stream.ReplayStream` decides when.
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Callable, Union

import numpy as np

from .._checks import check_int, check_probability, check_real, check_seed
from ..storage.draw import DrawSettings
from .batch_format import BatchFormat, batch_format as as_batch_format
from .ratelimit import SampleToInsertRatio

if TYPE_CHECKING:
    from ..storage.memory import ReplayMemory, SampleBatch

__all__ = ['Sampling']

Beta = Union[float, Callable[[int], float], None]


class Sampling:
    """Batches drawn from a memory, and their ratio to the transitions inserted.

    Args:
        batch_size (int): transitions per batch.
        update_frequency (int): transitions inserted per batch, whatever the player (a request
            to a vector player inserts up to ``num_envs``: the stream requests accordingly);
            ``batch_size / update_frequency`` samples per inserted transition. Give it or
            ``samples_per_insert``.
        samples_per_insert (float): instead of ``update_frequency``: keep this many sampled
            transitions per inserted one, with a
            :class:`~expreplay.stream.ratelimit.SampleToInsertRatio` limiter (a fractional ratio,
            e.g. 0.5, is fine).
        n_step, gamma, weight_norm, layout: how the transitions are drawn, documented (with
            their defaults, used for those not given or None) by
            :class:`~expreplay.storage.draw.DrawSettings`; kept as :attr:`draw_settings` and
            readable as attributes of these names.
        beta (float or callable): importance-sampling exponent of prioritized replay in [0, 1],
            or a schedule ``beta(k)`` of the batch number k (0 for the first batch); None:
            weights of 1.
        seed (int): seeds the draws; None: unseeded.
        batch_format (str or BatchFormat): ``'transitions'`` (the default): every batch is a
            :class:`~expreplay.storage.memory.SampleBatch`, whatever the other settings, with
            the fields ``state, action, reward, next_state, discount, is_over, indices,
            weights``: the target is ``reward + discount * max_a Q(next_state, a)``,
            ``discount`` being ``gamma ** k`` for the k steps taken and 0 after a terminal step
            (see :meth:`ReplayMemory.sample <expreplay.ReplayMemory.sample>`), ``weights`` 1
            unless prioritized. ``'tensorpack'`` (what :class:`~expreplay.ExpReplay` uses for
            1-step uniform replay): tensorpack's ``[comb_state, action, reward, isOver]`` (one
            array of ``history_len + 1`` frames per transition). That 4-list has no discount,
            indices or weights, so ``'tensorpack'`` is refused (ValueError naming
            ``batch_format``) with ``n_step`` > 1, here, and with a prioritized memory, by
            :meth:`check_memory` (at the latest when the first batch is drawn). Kept as a
            :class:`~expreplay.stream.batch_format.BatchFormat` (``batch_format.name``).

    Example, the default batches (with ``batch_format='tensorpack'``, unpack the 4-list
    instead: ``for comb_state, action, reward, is_over in stream``)::

        sampling = Sampling(batch_size=32, update_frequency=4, n_step=3, gamma=0.99)
        with ReplayStream(memory, population, sampling, init_memory_size=1_000) as stream:
            for batch in stream:
                target = batch.reward + batch.discount * q_next_max(batch.next_state)
                update(batch.state, batch.action, target, batch.weights)

    One stream uses a Sampling (it counts the batches for the ``beta`` schedule); its draws are
    thread-safe.
    """

    def __init__(self, batch_size: int, update_frequency: int | None = None, *,
                 samples_per_insert: float | None = None, n_step: int | None = None,
                 gamma: float | None = None, beta: Beta = None, weight_norm: str | None = None,
                 layout: str | None = None, seed: int | None = None, batch_format: str | BatchFormat = 'transitions') -> None:
        # Sizes take whole floats (tensorpack's DQN.py passes floats), as ReplayMemory.
        self.batch_size = check_int(batch_size, 'batch_size', 1, allow_float=True)
        self.update_frequency: int | None
        self.samples_per_insert: float | None
        if samples_per_insert is not None:
            if update_frequency is not None:
                raise ValueError("give update_frequency or samples_per_insert, not both "
                                 "(update_frequency=None with samples_per_insert)")
            self.samples_per_insert = check_real(samples_per_insert, 'samples_per_insert')
            if self.samples_per_insert <= 0:
                raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert!r}")
            self.update_frequency = None
        else:
            if update_frequency is None:
                raise ValueError("update_frequency is None: give it, or samples_per_insert")
            self.samples_per_insert = None
            self.update_frequency = check_int(update_frequency, 'update_frequency', 1,
                                              allow_float=True)
        #: How the transitions are drawn (n_step, gamma, layout, weight_norm), checked once.
        self.draw_settings = DrawSettings.given(n_step=n_step, gamma=gamma, layout=layout,
                                                weight_norm=weight_norm)
        if beta is not None and not callable(beta):
            check_probability(beta, 'beta')
        self.beta = beta
        self.seed = check_seed(seed, 'seed')
        self.batch_format = as_batch_format(batch_format)
        self.batch_format.check(self.n_step)
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()     # the rng and the batch count: any thread may draw
        self.batches_sampled = 0          # batches drawn (the beta schedule's k)

    @property
    def n_step(self) -> int:
        """Rewards summed per transition (:attr:`draw_settings`)."""
        return self.draw_settings.n_step

    @property
    def gamma(self) -> float:
        """The discount of the n-step sums (:attr:`draw_settings`)."""
        return self.draw_settings.gamma

    @property
    def layout(self) -> str:
        """The states' layout, ``'NHWC'`` or ``'NCHW'`` (:attr:`draw_settings`)."""
        return self.draw_settings.layout

    @property
    def weight_norm(self) -> str:
        """What importance weights are divided by (:attr:`draw_settings`)."""
        return self.draw_settings.weight_norm

    @property
    def steps_per_batch(self) -> int:
        """Transitions inserted per batch (for ``samples_per_insert``: rounded up, >= 1)."""
        if self.update_frequency is not None:
            return self.update_frequency
        assert self.samples_per_insert is not None
        return max(1, math.ceil(self.batch_size / self.samples_per_insert))

    def check_memory(self, memory: ReplayMemory) -> None:
        """ValueError naming ``batch_format`` if batches of this format can not be drawn from
        ``memory``: ``'tensorpack'`` from a prioritized memory (the 4-list has no indices to
        feed priorities back, nor importance weights). Every draw checks it; a stream may call
        it as soon as it has the memory."""
        self.batch_format.check_memory(memory)

    def rate_limiter(self, per_request: int) -> SampleToInsertRatio | None:
        """The limiter for ``samples_per_insert`` (None for ``update_frequency``): a request
        stores up to ``per_request`` transitions, the largest insert booked at once; a batch is
        the sample chunk. The error buffer is the smallest that can not deadlock."""
        spi = self.samples_per_insert
        if spi is None:
            return None
        return SampleToInsertRatio(spi, 1, (per_request * spi + self.batch_size) / 2,
                                   insert_size=per_request, sample_size=self.batch_size)

    def draw(self, memory: ReplayMemory) -> list[np.ndarray] | SampleBatch:
        """One batch from ``memory`` (thread-safe)."""
        # Not the memory's ``out=`` buffers: a learner may keep a batch it was handed (a list
        # of recent batches, a framework that copies lazily), and a reused buffer would change
        # under it. The memory hands out arrays of earlier batches only once nothing refers to
        # them any more (``storage/_recycled.py``), which spares the page faults of new ones.
        with self._lock:
            self.batch_format.check_memory(memory)
            batch = self.batch_format.draw(self, memory, self._rng)
            self.batches_sampled += 1
            return batch

    def current_beta(self) -> float | None:
        """The importance-sampling exponent of the batch being drawn: ``beta``, or its
        schedule's value at the batches drawn before it."""
        return self.beta(self.batches_sampled) if callable(self.beta) else self.beta
