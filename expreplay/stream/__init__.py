"""The learner's side: a stream of sampled batches, kept at a ratio to the steps inserted.

* :mod:`~expreplay.stream.replay_stream`: :class:`ReplayStream` (the memory, the population
  and the sampling put together as an iterator of numpy batches);
* :mod:`~expreplay.stream.prefetch`: the thread that draws batches ahead of the learner;
* :mod:`~expreplay.stream.pacing`: how many steps the population makes per batch;
* :mod:`~expreplay.stream.ratelimit`: :class:`SampleToInsertRatio`, a samples-per-insert bound.

Importing this package does not import the acting layer: the stream imports it when it builds
its population.
"""

from .replay_stream import DEFAULT_PREFETCH, REPLAY_ARGS_DOC, MemoryCheckpoint, PredictorSlot, ReplayStream

__all__ = ['ReplayStream', 'PredictorSlot', 'MemoryCheckpoint', 'REPLAY_ARGS_DOC', 'DEFAULT_PREFETCH']
