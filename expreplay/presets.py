"""Presets: a published agent's replay settings, each with the part that owns it.

A :class:`Preset` is data: the keyword arguments of the memory, the population and the
sampling it builds, the exploration schedule, and the initial fill. It builds nothing itself:
:meth:`ReplayStream.from_preset <expreplay.stream.ReplayStream.from_preset>` builds a stream
from one, and :meth:`ReplayStream.atari_dqn`, :meth:`ReplayStream.minatar_dqn` and
:meth:`ExpReplay.atari_dqn <expreplay.tensorpack_io.ExpReplay.atari_dqn>` are the two
below. A setting a part already defaults to (the memory's ``'uint8'``, the sampling's gamma
0.99 and 1-step returns, one player) is not restated here; the parts check every value.

This module imports no part, so that the stream and the tensorpack front end both read it
from above.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np

__all__ = ['ATARI_DQN', 'MINATAR_DQN', 'FrameSchedule', 'Preset']

#: A preset's initial fill: a number of transitions, or a rule of the memory's max_size.
Fill = Union[int, Callable[[int], int]]


@dataclasses.dataclass(frozen=True)
class Preset:
    """One agent's replay: each part's keyword arguments, its epsilon and its fill.

    Args:
        name (str): what the values reproduce, for messages.
        memory (Mapping): keyword arguments of :class:`~expreplay.ReplayMemory`; without
            ``state_shape`` the stream reads the players' declared observation shape.
        population (Mapping): keyword arguments of :class:`~expreplay.acting.population.
            Population` other than ``get_player``, ``predictor`` and ``exploration``.
        sampling (Mapping): keyword arguments of :class:`~expreplay.stream.sampling.Sampling`.
        epsilon (sequence of (frames, epsilon)): the exploration schedule's points, in frames
            after the initial fill (epsilon 1 during it): see :class:`FrameSchedule`.
        init_memory_size (int or callable): the initial fill, or a rule of the memory's
            ``max_size`` that gives it (a memory of another size then fills its share too).

    A variant is ``dataclasses.replace(MINATAR_DQN, sampling={...})``; the parts' own
    keywords given when the stream is built override these (see ``from_preset``).
    """

    name: str
    memory: Mapping[str, Any]
    population: Mapping[str, Any]
    sampling: Mapping[str, Any]
    epsilon: Sequence[tuple[int, float]]
    init_memory_size: Fill

    def __post_init__(self) -> None:
        # Read-only views: a preset is shared by every stream built from it.
        for part in ('memory', 'population', 'sampling'):
            object.__setattr__(self, part, types.MappingProxyType(dict(getattr(self, part))))
        object.__setattr__(self, 'epsilon',
                           tuple((int(frame), float(eps)) for frame, eps in self.epsilon))

    def fill(self, max_size: int) -> int:
        """The initial fill of a memory of ``max_size`` transitions."""
        if callable(self.init_memory_size):
            return self.init_memory_size(max_size)
        return self.init_memory_size


# tensorpack's examples/DeepQNetwork/DQN.py, in the parts' names. They are the Nature DQN's
# (Mnih et al. 2015) but for three: Nature's batch is 32, it plays one game at a time, and its
# epsilon stays at 0.1 after the first 1M frames.
ATARI_DQN = Preset(
    name="tensorpack's DQN.py",
    memory={'max_size': 1_000_000,      # MEMORY_SIZE = 1e6
            'state_shape': (84, 84),    # IMAGE_SIZE, one grayscale frame (DQN.py's ALE path)
            'history_len': 4},          # FRAME_HISTORY
    population={'num_players': 3},      # NUM_PARALLEL_PLAYERS
    sampling={'batch_size': 64,         # BATCH_SIZE
              'update_frequency': 4},   # UPDATE_FREQ: agent steps per training step
    # The exploration callback's [(0, 1), (10, 0.1), (400, 0.01)] in epochs of
    # STEPS_PER_EPOCH = 100k / UPDATE_FREQ training steps, i.e. 100k agent steps.
    epsilon=((0, 1.0), (1_000_000, 0.1), (40_000_000, 0.01)),
    # INIT_MEMORY_SIZE = MEMORY_SIZE // 20: 50,000 of 1M.
    init_memory_size=lambda max_size: max_size // 20,
)

# The MinAtar paper's DQN (Young & Tian 2019, arXiv:1903.03176; its repository's
# examples/dqn.py, whose constants are named here).
MINATAR_DQN = Preset(
    name="the MinAtar paper's DQN",
    memory={'max_size': 100_000,        # REPLAY_BUFFER_SIZE
            'history_len': 1,           # no frame stacking: a state is one observation
            'dtype': 'bool'},           # one boolean channel per object
    population={},
    sampling={'batch_size': 32,         # BATCH_SIZE
              'update_frequency': 1},   # TRAINING_FREQ: one update per frame
    # EPSILON 1.0 -> END_EPSILON 0.1 linearly over FIRST_N_FRAMES after the replay start.
    epsilon=((0, 1.0), (100_000, 0.1)),
    init_memory_size=5_000,             # REPLAY_START_SIZE: random frames first
)


class FrameSchedule:
    """Epsilon of a preset: piecewise linear through ``points`` (pairs of frames after the
    initial fill and epsilon), the first epsilon before them, the last after them.

    A schedule of the population's steps stored (``schedule(steps)``): those since the
    population started plus :attr:`resumed`, the memory's own count when the stream was built
    (a memory restored from a checkpoint goes on where it was, not from epsilon 1). Whoever
    builds the stream sets :attr:`resumed` once the memory is restored.
    """

    def __init__(self, points: Sequence[tuple[int, float]], fill: int) -> None:
        self.points = tuple((int(frame), float(eps)) for frame, eps in points)
        self.fill = int(fill)
        #: Steps the memory held when the stream was built (restored from a checkpoint).
        self.resumed = 0
        self._frames = np.array([self.fill + frame for frame, _ in self.points], np.float64)
        self._epsilons = np.array([eps for _, eps in self.points], np.float64)

    def __call__(self, steps: int) -> float:
        return float(np.interp(self.resumed + steps, self._frames, self._epsilons))

    def __repr__(self) -> str:
        return f"FrameSchedule({list(self.points)}, fill={self.fill})"
