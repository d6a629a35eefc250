"""The epsilon-greedy choice of an acting group's actions: exploration draws and Q-value checks.

:class:`EpsilonGreedy` draws, for a batch of lanes, whether each explores and which random
action it takes, and turns the predictor's Q-values into the greedy lanes' actions. The common
cases run in the optional C kernel ``expreplay.acting._acting_ext``; a policy built inside
:func:`expreplay._kernels.numpy_only` uses numpy for good (what the tests do to check both).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _kernels
from .._checks import check_probability
from ..errors import PredictorError

__all__ = ['EpsilonGreedy', 'as_q_values', 'check_q_values', 'explorations']

# Exploration uniforms drawn ahead per lane, in rows of (explore?, random action).
_DRAWS = 256


def as_q_values(outputs: Any) -> Any:
    """The Q-values of a predictor's outputs: ``[Q, ...]`` (tensorpack) or the array itself.

    A list or tuple is tensorpack's convention, its first item the Q-values of all the states:
    a first item that is not a 2-D array (a row of Q-values, as ``list(q)`` gives; a number:
    the Q-values returned as Python lists) raises a :class:`PredictorError` saying what came
    and what to return instead, not a shape error about the first row.

    A PyTorch tensor is read as its values, whatever it carries: one that requires grad (a
    forward without ``torch.no_grad()``) is detached, one on a GPU is copied to the host, a
    bfloat16 one is widened to float32. This module does not import torch: a tensor can only
    come from a process that has.
    """
    outputs = _from_tensor(outputs)
    if isinstance(outputs, (list, tuple)):
        if not outputs:
            raise PredictorError("predictor returned an empty list; expected [Q-values, ...] or "
                                 "a Q-value array")
        first = _from_tensor(outputs[0])
        if not (isinstance(first, np.ndarray) and first.ndim == 2) and _ndim(first) != 2:
            rows = (" (one row of Q-values per item, as list(q) or q.tolist() give)"
                    if _ndim(first) == 1 else "")
            raise PredictorError(
                f"predictor returned a Python {type(outputs).__name__} of {len(outputs)} items "
                f"whose first is {type(first).__name__} {_shape(first)}{rows}: a list or tuple "
                f"is read as tensorpack's [Q-values, ...], its first item the Q-values of all "
                f"the states, shape (n_states, num_actions). Return the Q-values as one array "
                f"of shape (n_states, num_actions) (q itself, or numpy.asarray(rows)), or as "
                f"[q, ...] as tensorpack's predictors do")
        return first
    return outputs


def _from_tensor(value: Any) -> Any:
    """``value`` as a numpy array if it is a PyTorch tensor, else ``value`` itself."""
    torch = sys.modules.get('torch')   # no tensor exists unless torch was imported
    if torch is None or not isinstance(value, torch.Tensor):
        return value
    value = value.detach()
    if value.dtype == torch.bfloat16:      # numpy has no bfloat16
        value = value.float()
    return value.cpu().numpy()


def _ndim(value: Any) -> int | None:
    try:
        return int(np.ndim(value))
    except ValueError:          # ragged nested lists
        return None


def _shape(value: Any) -> str:
    try:
        return f"of shape {np.shape(value)}"
    except ValueError:
        return "(ragged)"


def check_q_values(q: Any, n: int, num_actions: int) -> np.ndarray:
    """``q`` as an ``(n, num_actions)`` numeric array of finite values, else PredictorError.

    No out-of-range action can come out of an argmax over a checked array.
    """
    q = np.asarray(q)
    if q.shape != (n, num_actions):
        raise PredictorError(f"predictor returned Q-values of shape {q.shape} for {n} states; "
                             f"expected ({n}, num_actions={num_actions})")
    if q.dtype.kind not in 'iuf':
        raise PredictorError(f"predictor returned Q-values of dtype {q.dtype}; expected numbers")
    if q.dtype.kind == 'f' and not np.isfinite(q).all():
        raise PredictorError(f"predictor returned non-finite Q-values (NaN or inf) for "
                             f"{int((~np.isfinite(q)).any(axis=1).sum())} of {n} states")
    return q


def explorations(exploration: float | Sequence[float] | np.ndarray,
                 members: np.ndarray) -> float | np.ndarray:
    """One exploration probability, or one per member checked against ``members``."""
    if isinstance(exploration, (list, tuple, np.ndarray)):
        eps = np.asarray(exploration, np.float64)
        if eps.shape != members.shape or not ((eps >= 0) & (eps <= 1)).all():
            raise ValueError(f"exploration must be probabilities in [0, 1], one per member, "
                             f"got {exploration!r}")
        return eps
    return check_probability(exploration, 'exploration')


class EpsilonGreedy:
    """Epsilon-greedy actions for the lanes of several runners.

    The exploration randoms are drawn ahead from each runner's own RNG (``rngs[k]`` for the
    lanes ``runner_lanes[k]``), so that a runner's actions depend on its seed and its steps
    only, not on which runners step with it; a batch of lanes reads them with one fancy index.
    """

    def __init__(self, rngs: Sequence[np.random.Generator], runner_lanes: Sequence[np.ndarray],
                 num_actions: int) -> None:
        self._rngs = list(rngs)
        self._runner_lanes = list(runner_lanes)
        self.num_actions = int(num_actions)
        num_lanes = sum(len(lanes) for lanes in self._runner_lanes)
        self._lane_runner = np.repeat(np.arange(len(self._rngs)),
                                      [len(lanes) for lanes in self._runner_lanes])
        # Per lane, _DRAWS rows of (explore?, random action) uniforms, the next at its cursor.
        self._uniforms = np.zeros((num_lanes, _DRAWS, 2))
        self._cursor = np.full(num_lanes, _DRAWS)
        self._eps = np.zeros(1)
        # The kernel, chosen once, here (expreplay._kernels): switched under a live policy,
        # its cached uniforms and cursors above would be drawn by two paths in turn.
        self._ext = _kernels.get('_acting_ext')

    def draw(self, lanes: np.ndarray, eps: float | np.ndarray,
             acting: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Draws for ``lanes`` (one probability, or one per lane): ``(random actions, positions
        of the rows that act greedily)``. A lane not ``acting`` (no open episode) never is greedy."""
        ext = self._ext
        if ext is not None:
            n = len(lanes)
            actions, greedy = np.empty(n, np.int64), np.empty(n, np.int64)
            if not isinstance(eps, np.ndarray):
                self._eps[0] = eps
                eps = self._eps
            g = ext.draw_actions(lanes, self._uniforms, self._cursor, _DRAWS, eps, acting,
                                 self.num_actions, actions, greedy)
            if g >= 0:
                return actions, greedy[:g]
        u = self._uniforms_of(lanes)
        actions = (u[:, 1] * self.num_actions).astype(np.int64)
        return actions, np.flatnonzero((u[:, 0] >= eps) & acting[lanes])

    def _uniforms_of(self, lanes: np.ndarray) -> np.ndarray:
        """The next (explore, action) uniforms of each lane: ``(len(lanes), 2)``."""
        cursor = self._cursor[lanes]
        if cursor.max() == _DRAWS:
            for k in np.unique(self._lane_runner[lanes[cursor == _DRAWS]]).tolist():
                rows = self._runner_lanes[k]
                rows = rows[self._cursor[rows] == _DRAWS]
                self._uniforms[rows] = self._rngs[k].random((len(rows), _DRAWS, 2))
                self._cursor[rows] = 0
            cursor = self._cursor[lanes]
        self._cursor[lanes] = cursor + 1
        return self._uniforms[lanes, cursor]

    def act_greedy(self, q_values: Any, greedy: np.ndarray, actions: np.ndarray) -> None:
        """Set ``actions[greedy]`` to the argmax of the predictor's outputs for those rows."""
        q = as_q_values(q_values)
        # The kernel checks and acts on the common case (float32/64 Q-values, all finite);
        # anything else goes through the checks, which say what is wrong or convert.
        if self._ext is None or self._ext.greedy_actions(q, greedy, actions, self.num_actions):
            q = check_q_values(q, len(greedy), self.num_actions)
            actions[greedy] = q.argmax(axis=1)
