"""MemoryCheckpoint: where a stream's replay memory is saved to and resumed from."""

from __future__ import annotations

import logging
import os
from typing import Any

from ..storage.memory import ReplayMemory

__all__ = ['MemoryCheckpoint']

logger = logging.getLogger(__name__)


class MemoryCheckpoint:
    """Where a replay memory is saved to and resumed from: ``<directory>/<filename>``.

    :meth:`restore` fills the caller's new memory in place (the object stays the caller's);
    :meth:`load` builds a new one. Both check that the checkpoint has the settings expected
    and refuse another one with a ``CheckpointError`` (a ``ValueError``) naming the setting.
    """

    FILENAME = 'replay_memory.npz'

    def __init__(self, directory: str | os.PathLike, filename: str = FILENAME) -> None:
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, filename)

    def exists(self) -> bool:
        """Whether a checkpoint file is there."""
        return os.path.isfile(self.path)

    def load(self, max_size: int, state_shape: tuple[int, ...], history_len: int, dtype: Any,
             **settings: Any) -> ReplayMemory | None:
        """The saved memory, or None when there is no checkpoint yet. ``settings``: more of
        :meth:`ReplayMemory.load`'s expected settings (``prioritized``, ``alpha``, ...)."""
        if not self.exists():
            return None
        memory = ReplayMemory.load(self.path, max_size=max_size, state_shape=state_shape,
                                   history_len=history_len, dtype=dtype, **settings)
        logger.info("Loaded the replay memory from %s (%d transitions).", self.path, len(memory))
        return memory

    def restore(self, memory: ReplayMemory) -> bool:
        """Fill ``memory`` in place with the saved one, if there is a checkpoint; True if it
        did, False when there is none. The checkpoint must have all of ``memory``'s settings
        (see :meth:`ReplayMemory.restore`, which refuses another one with a
        ``CheckpointError`` naming each setting and leaves ``memory`` empty).

        Raises ValueError, before anything is written, when a checkpoint is there and
        ``memory`` is not new (something was written to it): saving that memory would replace
        the saved run without anyone asking. The message names the ways out: a new memory to
        resume from the checkpoint, another directory to keep it, or deleting the file to
        replace it."""
        if not self.exists():
            return False
        if not memory.ring.untouched:
            raise ValueError(
                f"checkpoint_dir {self.directory!r} holds a saved replay memory ({self.path}), "
                f"and the memory given is not new ({memory.num_steps_written} steps written to "
                "it): it can not be loaded into, and saving it would replace the saved one. "
                "Pass a new ReplayMemory to resume from the checkpoint, another checkpoint_dir "
                "to keep both, or delete the file to replace it")
        memory.restore(self.path)
        logger.info("Loaded the replay memory from %s (%d transitions).", self.path, len(memory))
        return True

    def save(self, memory: ReplayMemory) -> int:
        """Save ``memory`` atomically (``ReplayMemory.save`` writes aside, then renames, and
        logs where, how big, how long). Returns the file's size in bytes."""
        os.makedirs(self.directory, exist_ok=True)
        return memory.save(self.path)
