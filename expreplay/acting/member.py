"""What an acting group reads of the runners it steps: :class:`GroupMember`.

The group (:mod:`expreplay.acting.group`) and its parts (:mod:`~expreplay.acting.lanes`,
:mod:`~expreplay.acting.resets`) are typed against this protocol rather than against
:class:`~expreplay.acting.runner.EnvRunner`, which builds a group of its own for
:meth:`~expreplay.acting.runner.EnvRunner.step`: the runner module imports the group, never the
reverse. Everything here is read; a runner's own state changes only through its own methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

__all__ = ['GroupMember']


class GroupMember(Protocol):
    """A runner as its acting group sees it (:class:`~expreplay.acting.runner.EnvRunner`)."""

    @property
    def index(self) -> int: ...
    @property
    def memory(self) -> Any: ...
    @property
    def history_len(self) -> int: ...
    @property
    def predictor(self) -> Callable[[np.ndarray], Any] | None: ...
    @property
    def num_actions(self) -> int: ...
    @property
    def num_envs(self) -> int: ...
    @property
    def player(self) -> Any: ...
    @property
    def adapter(self) -> Any:
        """The player behind :class:`~expreplay.acting.envs.EnvAdapter`'s interface, with the
        calls of its kind (``step_one`` for a single env, ``recv`` / ``send`` when
        asynchronous)."""
    @property
    def is_async(self) -> bool: ...
    @property
    def is_vector(self) -> bool: ...
    @property
    def rng(self) -> np.random.Generator: ...
    @property
    def life_loss_terminal(self) -> bool: ...
    @property
    def episode_starts(self) -> Any: ...
    @property
    def on_episode_end(self) -> Callable[[Any], Any] | None: ...

    def take_first_seed(self) -> int | None:
        """The seed of the runner's first reset, once (None afterwards)."""

    def record_game(self, score: float, length: int) -> None:
        """A game of the runner ended (its score and length)."""

    def count_start(self, kind: str) -> None:
        """An episode of the runner started as ``kind``."""

    def join_group(self, group: Any) -> None:
        """``group`` steps the runner from now on."""
