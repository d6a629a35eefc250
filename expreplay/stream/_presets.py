"""The values of the presets (:meth:`ReplayStream.atari_dqn`, :meth:`ReplayStream.minatar_dqn`,
:meth:`ExpReplay.atari_dqn <expreplay.tensorpack_io.ExpReplay.atari_dqn>`) and how a preset's
keyword arguments reach the part that owns them.

Each value is here once, with its source; a setting a part already defaults to (the memory's
``'uint8'``, the sampling's gamma 0.99 and 1-step returns, one player) is not restated. The
parts check every value: nothing is checked here but which part a keyword belongs to, that a
``seed`` reaches one, and the fill the exploration schedule is built on (used here before the
stream checks it).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .._checks import check_int

__all__ = ['ATARI_DQN', 'MINATAR_DQN', 'FrameSchedule', 'build_parts', 'preset_stream']

# tensorpack's examples/DeepQNetwork/DQN.py, in the parts' names. They are the Nature DQN's
# (Mnih et al. 2015) but for three: Nature's batch is 32, it plays one game at a time, and its
# epsilon stays at 0.1 after the first 1M frames.
ATARI_DQN: Mapping[str, Any] = {
    'max_size': 1_000_000,        # MEMORY_SIZE = 1e6
    'state_shape': (84, 84),      # IMAGE_SIZE, one grayscale frame (the ALE path of DQN.py)
    'history_len': 4,             # FRAME_HISTORY
    'batch_size': 64,             # BATCH_SIZE
    'update_frequency': 4,        # UPDATE_FREQ: agent steps per training step
    'num_players': 3,             # NUM_PARALLEL_PLAYERS
}


def atari_init_memory_size(max_size: int) -> int:
    """DQN.py's INIT_MEMORY_SIZE = MEMORY_SIZE // 20: 50,000 of 1M (a memory of another size
    fills a twentieth of it too)."""
    return max_size // 20


# The exploration callback's [(0, 1), (10, 0.1), (400, 0.01)] in epochs of STEPS_PER_EPOCH =
# 100k / UPDATE_FREQ training steps, i.e. 100k agent steps: 1 -> 0.1 over the first 1M agent
# steps of training, -> 0.01 by 40M (agent steps after the initial fill, epsilon 1 during it).
ATARI_EPSILON = ((0, 1.0), (1_000_000, 0.1), (40_000_000, 0.01))

# The MinAtar paper's DQN (Young & Tian 2019, arXiv:1903.03176; its repository's
# examples/dqn.py, whose constants are named here).
MINATAR_DQN: Mapping[str, Any] = {
    'max_size': 100_000,          # REPLAY_BUFFER_SIZE
    'history_len': 1,             # no frame stacking: a state is one observation
    'dtype': 'bool',              # MinAtar's observations: one boolean channel per object
    'batch_size': 32,             # BATCH_SIZE
    'update_frequency': 1,        # TRAINING_FREQ: one update per frame
    'init_memory_size': 5_000,    # REPLAY_START_SIZE: random frames before the first update
}
# EPSILON 1.0 -> END_EPSILON 0.1 linearly over FIRST_N_FRAMES = 100k frames after the replay
# start (epsilon 1 during it).
MINATAR_EPSILON = ((0, 1.0), (100_000, 0.1))


class FrameSchedule:
    """Epsilon of a preset: piecewise linear through ``points`` (pairs of frames after the
    initial fill and epsilon), the first epsilon before them, the last after them.

    A schedule of the population's steps stored (``schedule(steps)``): those since the
    population started plus :attr:`resumed`, the memory's own count when the stream was built
    (a memory restored from a checkpoint goes on where it was, not from epsilon 1). The
    preset sets :attr:`resumed` once the stream has restored the memory.
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


def _parameters(cls: type) -> set[str]:
    return set(inspect.signature(cls).parameters)


def build_parts(values: Mapping[str, Any], overrides: dict[str, Any], *,
                get_player: Callable[[], Any] | None, predictor: Any,
                epsilon: Sequence[tuple[int, float]],
                init_memory_size: Callable[[int], int] | None = None) -> tuple[Any, dict]:
    """A :class:`ReplayStream`'s parts from a preset's ``values`` and the caller's
    ``overrides`` (keyword arguments of ReplayMemory, Population, Sampling or ReplayStream,
    each sent to the part that takes it; ``seed`` to both the population and the sampling;
    ``memory``, ``population`` or ``sampling``: a part passed in, used as it is).

    Returns ``(schedule, stream_kwargs)``: the :class:`FrameSchedule` given as ``exploration``
    (None when the caller gave ``exploration`` or a population) and the stream's arguments.
    ``state_shape``, when neither the preset nor the caller gives it, is the first player's
    observation shape. ``init_memory_size(max_size)``: the preset's fill when it depends on
    the memory's size.
    """
    from ..acting.population import Population
    from ..storage.memory import ReplayMemory
    from .replay_stream import ReplayStream
    from .sampling import Sampling

    owners = {'memory': (ReplayMemory, _parameters(ReplayMemory)),
              'population': (Population, _parameters(Population) - {'get_player', 'predictor'}),
              'sampling': (Sampling, _parameters(Sampling))}
    stream_args = _parameters(ReplayStream) - set(owners)
    given = {name: part for name in owners
             if (part := overrides.pop(name, None)) is not None}
    kwargs: dict[str, dict[str, Any]] = {name: {} for name in owners}
    stream_kwargs: dict[str, Any] = {}
    for source in (values, overrides):
        for key, value in source.items():
            parts = [name for name, (_, args) in owners.items() if key in args]
            if key in stream_args:
                stream_kwargs[key] = value
            elif not parts:
                raise TypeError(f"{key!r} is not an argument of ReplayMemory, Population, "
                                "Sampling or ReplayStream")
            for name in parts:
                if name not in given:
                    kwargs[name][key] = value
                elif source is overrides and key != 'seed':
                    raise TypeError(f"{key}={value!r} is the {name}'s setting, and a {name} is "
                                    f"passed in: set it on that {name}")
    if 'seed' in overrides and not any('seed' in args for args in kwargs.values()):
        seeded = ' and the '.join(name for name, (_, args) in owners.items() if 'seed' in args)
        raise ValueError(f"seed={overrides['seed']!r} would seed nothing: it seeds the {seeded}, "
                         "and each is passed in; set the seed on them")
    if 'init_memory_size' in stream_kwargs:
        stream_kwargs['init_memory_size'] = check_int(stream_kwargs['init_memory_size'],
                                                      'init_memory_size', 0, allow_float=True)
    population = given.get('population')
    if population is not None:
        if get_player is not None or predictor is not None:
            raise TypeError("a population passed in has its get_player and predictor: give "
                            "them to it, not to the preset")
        get_player = population.get_player
    elif get_player is None:
        raise TypeError("a preset needs get_player (or a population)")

    memory = given.get('memory')
    if memory is None:
        args = kwargs['memory']
        if 'state_shape' not in args:
            args['state_shape'] = _observation_shape(get_player)
        memory = ReplayMemory(**args)
    if init_memory_size is not None:
        stream_kwargs.setdefault('init_memory_size', init_memory_size(memory.max_size))
    schedule = None
    if population is None:
        args = kwargs['population']
        if 'exploration' not in args:
            schedule = args['exploration'] = FrameSchedule(
                epsilon, stream_kwargs.get('init_memory_size', 0))
        population = Population(get_player, predictor=predictor, **args)
    sampling = given.get('sampling') or Sampling(**kwargs['sampling'])
    stream_kwargs.update(memory=memory, population=population, sampling=sampling)
    return schedule, stream_kwargs


def preset_stream(cls: type, values: Mapping[str, Any], overrides: dict[str, Any], *,
                  get_player: Callable[[], Any] | None, predictor: Any,
                  epsilon: Sequence[tuple[int, float]],
                  init_memory_size: Callable[[int], int] | None = None) -> Any:
    """A ``cls`` (ReplayStream) of the preset ``values`` and the caller's ``overrides``; its
    exploration schedule, if it has the preset's, goes on from a restored memory's count."""
    schedule, stream_kwargs = build_parts(values, dict(overrides), get_player=get_player,
                                          predictor=predictor, epsilon=epsilon,
                                          init_memory_size=init_memory_size)
    stream = cls(**stream_kwargs)
    if schedule is not None:
        schedule.resumed = stream.memory.num_steps_written
    return stream


def _observation_shape(get_player: Callable[[], Any]) -> tuple[int, ...]:
    """The frame shape of the players ``get_player`` makes (a vector player's sub-envs'),
    read from one built and closed for it."""
    player = get_player()
    try:
        space = (getattr(player, 'single_observation_space', None)
                 or getattr(player, 'observation_space', None))
        shape = getattr(space, 'shape', None)
        if shape is None:
            raise TypeError("get_player() returns a player without an observation space: pass "
                            "state_shape")
        return tuple(shape)
    finally:
        close = getattr(player, 'close', None)
        if close is not None:
            close()
