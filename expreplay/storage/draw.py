"""How a batch's transitions are read out of a memory: the settings written once.

:meth:`ReplayMemory.sample <expreplay.ReplayMemory.sample>` (and ``sample_batch``, for the
layout) and :class:`~expreplay.stream.sampling.Sampling` take these settings; both resolve what
they were given with :meth:`DrawSettings.given`, so each default and each check lives here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._checks import check_choice, check_int, check_real

__all__ = ['DrawSettings', 'LAYOUTS', 'WEIGHT_NORMS']

#: The layouts of stacked states: frames last (tensorpack's DQNModel) or first.
LAYOUTS = ('NHWC', 'NCHW')
#: What prioritized importance weights are divided by.
WEIGHT_NORMS = ('memory', 'batch')


@dataclasses.dataclass(frozen=True)
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
        return cls(**{name: value for name, value in settings.items() if value is not None})
