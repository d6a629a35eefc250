"""What a stream's batches are: a behaviour chosen once, when the :class:`~expreplay.stream.
sampling.Sampling` is built, never a name compared at each draw.

* :data:`TRANSITIONS` (``'transitions'``): every batch a
  :class:`~expreplay.storage.memory.SampleBatch`, whatever the other settings (n-step returns,
  prioritized replay, extras).
* :data:`TENSORPACK` (``'tensorpack'``): tensorpack's ``[comb_state, action, reward, isOver]``,
  ``history_len + 1`` frames per transition, for a model of tensorpack's four inputs. It has no
  discount, indices or weights, so it refuses n-step returns (:meth:`BatchFormat.check`, when
  the sampling is built) and a prioritized memory (:meth:`BatchFormat.check_memory`, when a
  stream gets the memory), each naming ``batch_format`` and what to use instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .._checks import check_choice

if TYPE_CHECKING:
    from ..storage.draw import DrawSettings
    from ..storage.memory import ReplayMemory

__all__ = ['BatchFormat', 'TRANSITIONS', 'TENSORPACK', 'batch_format']

_SAMPLE_BATCH_FIELDS = ("SampleBatch: state, action, reward, next_state, discount, is_over, "
                        "indices, weights")


class Sampling(Protocol):
    """What a format reads of the :class:`~expreplay.stream.sampling.Sampling` it draws for."""

    batch_size: int
    draw_settings: DrawSettings

    def current_beta(self) -> float | None: ...


class BatchFormat:
    """One kind of batch: what it can carry (:meth:`check`, :meth:`check_memory`) and how it is
    drawn (:meth:`draw`)."""

    #: The name ``Sampling(batch_format=...)`` takes.
    name = ''

    def check(self, n_step: int) -> None:
        """ValueError naming ``batch_format`` if this format can not carry ``n_step``."""

    def check_memory(self, memory: ReplayMemory) -> None:
        """ValueError naming ``batch_format`` if this format can not be drawn from ``memory``."""

    def draw(self, sampling: Sampling, memory: ReplayMemory, rng: Any) -> Any:
        """One batch of ``sampling``'s settings from ``memory`` (the sampling's lock held)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"batch_format={self.name!r}"


class _Transitions(BatchFormat):
    name = 'transitions'

    def draw(self, sampling: Sampling, memory: ReplayMemory, rng: Any) -> Any:
        return memory.draw(sampling.batch_size, sampling.draw_settings,
                           beta=sampling.current_beta(), rng=rng)


class _Tensorpack(BatchFormat):
    name = 'tensorpack'

    def check(self, n_step: int) -> None:
        if n_step > 1:
            raise ValueError(
                f"batch_format='tensorpack' can not carry n-step returns (n_step={n_step}): "
                "tensorpack's [comb_state, action, reward, isOver] has no discount for the "
                f"steps summed; use batch_format='transitions' ({_SAMPLE_BATCH_FIELDS}), or "
                "n_step=1")

    def check_memory(self, memory: ReplayMemory) -> None:
        if memory.prioritized:
            raise ValueError(
                "batch_format='tensorpack' can not carry prioritized replay: tensorpack's "
                "[comb_state, action, reward, isOver] has no indices (to feed priorities back "
                "with update_priorities) and no importance weights; use "
                f"batch_format='transitions' ({_SAMPLE_BATCH_FIELDS}), or a uniform memory "
                "(prioritized=False)")

    def draw(self, sampling: Sampling, memory: ReplayMemory, rng: Any) -> Any:
        return memory.sample_batch(sampling.batch_size, rng=rng,
                                   layout=sampling.draw_settings.layout)


TRANSITIONS: BatchFormat = _Transitions()
TENSORPACK: BatchFormat = _Tensorpack()
_BY_NAME = {f.name: f for f in (TRANSITIONS, TENSORPACK)}


def batch_format(value: str | BatchFormat) -> BatchFormat:
    """The format ``value`` names (or is); ValueError naming ``batch_format`` otherwise."""
    if isinstance(value, BatchFormat):
        return value
    return _BY_NAME[check_choice(value, 'batch_format', tuple(_BY_NAME))]
