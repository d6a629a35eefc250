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

    Loading checks that the checkpoint matches the memory the caller would otherwise use
    (size, frame shape, history, dtype, prioritized, and the settings given) and refuses
    another one with ``ValueError`` naming the setting.
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

    def resume(self, memory: ReplayMemory) -> ReplayMemory | None:
        """The saved memory, expected to have ``memory``'s size, frame shape, history, dtype,
        prioritization (``alpha`` and ``priority_eps`` included) and extra fields; None when
        there is no checkpoint yet."""
        return self.load(memory.max_size, memory.state_shape, memory.history_len, memory.dtype,
                         prioritized=memory.prioritized, extra_fields=memory.extra_fields,
                         **(memory.priority_settings or {}))

    def save(self, memory: ReplayMemory) -> int:
        """Save ``memory`` atomically (``ReplayMemory.save`` writes aside, then renames, and
        logs where, how big, how long). Returns the file's size in bytes."""
        os.makedirs(self.directory, exist_ok=True)
        return memory.save(self.path)
