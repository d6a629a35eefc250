"""How a batch's transitions are read out of a memory: the settings written once.

:meth:`ReplayMemory.sample <expreplay.ReplayMemory.sample>` (and ``sample_batch``, for the
layout) and :class:`~expreplay.stream.sampling.Sampling` take these settings; both resolve what
they were given with :meth:`DrawSettings.given`, so each default and each check lives here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._checks import check_choice, check_int, check_real

__all__ = ['DrawSettings', 'DEFAULTS', 'LAYOUTS', 'WEIGHT_NORMS']

#: The layouts of stacked states: frames last (tensorpack's DQNModel) or first.
LAYOUTS = ('NHWC', 'NCHW')
#: What prioritized importance weights are divided by.
WEIGHT_NORMS = ('memory', 'batch')


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrawSettings:
    """The settings of a draw of n-step transitions (frozen; change one with
    ``dataclasses.replace``).

    Attributes:
        n_step (int): rewards summed per transition (n-step returns), >= 1.
        gamma (float): the discount of the n-step sums, in (0, 1]. A batch's ``discount`` is
            ``gamma ** k`` for the k steps taken and 0 after a terminal step.
        layout (str): ``'NHWC'``: states of shape ``(B, *state_shape, frames)``, frames last
            (tensorpack's DQNModel); ``'NCHW'``: ``(B, frames, *state_shape)``, frames first
            (PyTorch's convolutions, models that transpose on the device).
        weight_norm (str): what a prioritized memory's importance weights are divided by:
            ``'memory'``, the memory's largest; ``'batch'``, the batch's (each batch's largest
            is then 1; docs/rainbow.md).

    A bad value is refused at construction, with a ValueError or TypeError naming the field.
    """

    n_step: int = 1
    gamma: float = 0.99
    layout: str = 'NHWC'
    weight_norm: str = 'memory'

    def __post_init__(self) -> None:
        # Normalised values are stored (a whole float n_step is refused, numpy scalars become
        # Python numbers), so that two equal settings compare equal.
        object.__setattr__(self, 'n_step', check_int(self.n_step, 'n_step', 1))
        gamma = check_real(self.gamma, 'gamma')
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma!r}")
        object.__setattr__(self, 'gamma', gamma)
        check_choice(self.layout, 'layout', LAYOUTS)
        check_choice(self.weight_norm, 'weight_norm', WEIGHT_NORMS)

    @classmethod
    def given(cls, **settings: Any) -> DrawSettings:
        """The settings of those given that are not None, the others at their defaults: how a
        signature whose draw settings default to None (not given) reads them."""
        given = {name: value for name, value in settings.items() if value is not None}
        if not given:
            return DEFAULTS
        # A loop that calls sample() with the same settings each time makes (and checks) their
        # record once: a few microseconds saved on every call after the first.
        try:
            key = (cls, tuple(sorted((name, type(v), v) for name, v in given.items())))
            made = _MADE.get(key)
        except TypeError:                 # an unhashable value: refused by the checks below
            key, made = None, None
        if made is None:
            made = cls(**given)
            if key is not None and len(_MADE) < _MADE_LIMIT:
                _MADE[key] = made
        return made


#: The defaults, made once.
DEFAULTS = DrawSettings()
# Records made by given(), by the values given (and their types: 1 and 1.0 hash alike, but
# only one is a valid n_step). Bounded: a loop over ever-new gammas does not grow it forever.
_MADE: dict[Any, DrawSettings] = {}
_MADE_LIMIT = 256
