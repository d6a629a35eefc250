"""How a :class:`~expreplay.presets.Preset` becomes a stream: each part passed in is used as
it is, each part not passed in is built from the preset's values updated with the caller's
mapping for it (:meth:`ReplayStream.from_preset <expreplay.stream.ReplayStream.from_preset>`
documents the arguments). Every keyword goes to the part it is given for: nothing is routed
by reading signatures."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .._checks import check_int
from ..acting.population import Population
from ..presets import FrameSchedule, Preset
from ..storage.memory import ReplayMemory
from .sampling import Sampling

__all__ = ['build_preset_stream']


def build_preset_stream(stream_type: type, preset: Preset,
                        get_player: Callable[[], Any] | None,
                        predictor: Callable[[np.ndarray], Any] | None, *,
                        memory: Any, population: Any, sampling: Any, seed: int | None,
                        stream_settings: dict[str, Any]) -> Any:
    """A ``stream_type`` (:class:`~expreplay.stream.ReplayStream`) of ``preset``: see
    ``ReplayStream.from_preset``."""
    for key in stream_settings:
        owners = [part for part in ('memory', 'population', 'sampling')
                  if key in getattr(preset, part)]
        if owners:
            raise TypeError(f"{key} is the {owners[0]}'s setting: give it as "
                            f"{owners[0]}={{{key!r}: ...}}")
    memory_args = _part_settings(memory, ReplayMemory, 'memory', preset.memory)
    population_args = _part_settings(population, Population, 'population', preset.population)
    sampling_args = _part_settings(sampling, Sampling, 'sampling', preset.sampling)
    if seed is not None:
        if population_args is None and sampling_args is None:
            raise ValueError(f"seed={seed!r} would seed nothing: it seeds the population and "
                             "the sampling, and each is passed in; set the seed on them")
        for name, args in (('population', population_args), ('sampling', sampling_args)):
            if args is not None:
                if 'seed' in args:
                    raise TypeError(f"seed is given twice: seed={seed!r} and "
                                    f"{name}={{'seed': {args['seed']!r}}}")
                args['seed'] = seed
    if population_args is None:
        if get_player is not None or predictor is not None:
            raise TypeError("a population passed in has its get_player and predictor: give "
                            "them to it, not to the preset")
        get_player = population.get_player
    elif get_player is None:
        raise TypeError(f"{preset.name} needs get_player (or a population)")

    # The fill follows the memory's size (checked by the memory's rule before it is built:
    # the memory is built last, when the players have said their frame shape).
    max_size = (memory.max_size if memory_args is None else
                check_int(memory_args['max_size'], 'max_size', 1, allow_float=True))
    fill = check_int(stream_settings.setdefault('init_memory_size', preset.fill(max_size)),
                     'init_memory_size', 0, allow_float=True)
    schedule = None
    if population_args is not None:
        if 'exploration' not in population_args:
            schedule = population_args['exploration'] = FrameSchedule(preset.epsilon, fill)
        population = Population(get_player, predictor=predictor, **population_args)
    if memory_args is not None:
        if 'state_shape' not in memory_args:
            # What the players declare; the player built to read it is the first runner's.
            memory_args['state_shape'] = population.frame_shape()
        memory = ReplayMemory(**memory_args)
    if sampling_args is not None:
        sampling = Sampling(**sampling_args)
    stream = stream_type(memory, population, sampling, **stream_settings)
    if schedule is not None:
        schedule.resumed = stream.memory.num_steps_written
    return stream


def _part_settings(given: Any, part_type: type, name: str,
                   values: Mapping[str, Any]) -> dict[str, Any] | None:
    """The keyword arguments to build a part with (the preset's ``values`` updated with a
    mapping given), or None for a part passed in (``given`` itself, used as it is)."""
    if given is None:
        return dict(values)
    if isinstance(given, part_type):
        return None
    if isinstance(given, Mapping):
        return {**values, **given}
    raise TypeError(f"{name} must be a {part_type.__name__} or a mapping of its settings, got "
                    f"{type(given).__name__}")
