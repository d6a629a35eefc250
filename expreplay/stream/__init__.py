"""The learner's side: a stream of sampled batches, kept at a ratio to the steps inserted.

* :mod:`~expreplay.stream.replay_stream`: :class:`ReplayStream` (a memory, a population and a
  sampling put together as an iterator of numpy batches);
* :mod:`~expreplay.stream.sampling`: :class:`Sampling` (batch size, n-step, gamma, beta, layout,
  the insert ratio);
* :mod:`~expreplay.stream.checkpoint`: :class:`MemoryCheckpoint` (where the memory is saved and
  resumed from);
* :mod:`~expreplay.stream.fill`: the initial fill;
* :mod:`~expreplay.stream.prefetch`: the thread that draws batches ahead of the learner;
* :mod:`~expreplay.stream.pacing`: how many steps the population makes per batch;
* :mod:`~expreplay.stream.ratelimit`: :class:`SampleToInsertRatio`, a samples-per-insert bound.

Importing this package does not import the acting layer (:class:`Population`,
:class:`PredictorSlot` are re-exported from :mod:`expreplay.acting.population` on first use).
"""

import importlib
from typing import Any

from .checkpoint import MemoryCheckpoint
from .replay_stream import DEFAULT_PREFETCH, ReplayStream
from .sampling import Sampling

__all__ = ['ReplayStream', 'Sampling', 'Population', 'MemoryCheckpoint', 'PredictorSlot',
           'DEFAULT_PREFETCH']

_FROM_ACTING = ('Population', 'PredictorSlot')


def __getattr__(name: str) -> Any:
    if name in _FROM_ACTING:
        value = getattr(importlib.import_module('..acting.population', __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
