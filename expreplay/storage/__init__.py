"""The replay memory: frames stored once in a ring of blocks, written by lanes, sampled.

* :mod:`~expreplay.storage.memory`: :class:`ReplayMemory` (the ring, sampling, statistics);
* :mod:`~expreplay.storage.writers`: :class:`LaneWriter` and :class:`BatchWriter` (the write path);
* :mod:`~expreplay.storage.draw`: :class:`DrawSettings`, how a batch's transitions are read;
* :mod:`~expreplay.storage.distribution`: how a sample draws, uniformly or by priority;
* :mod:`~expreplay.storage.priority`: the sum tree behind prioritized sampling;
* :mod:`~expreplay.storage.checkpoint`: ``save`` / ``load`` and the checks a loaded file passes;
* :mod:`~expreplay.storage.stored_episodes`: what :meth:`ReplayMemory.episodes` returns, and
  the reader that finds and reads the complete episodes in the ring.

The optional C kernels of storage live here too (``_gather_ext``, ``_write_ext``,
``_tree_ext``); :mod:`expreplay._kernels` lists them, and each module that uses one falls back
to numpy when it is not built or switched off.
"""

from .checkpoint import CheckpointError
from .draw import DrawSettings
from .memory import Experience, ReplayMemory, SampleBatch
from .stored_episodes import StoredEpisodes
from .writers import BatchWriter, LaneWriter

__all__ = ['ReplayMemory', 'SampleBatch', 'Experience', 'LaneWriter', 'BatchWriter',
           'CheckpointError', 'StoredEpisodes', 'DrawSettings']
