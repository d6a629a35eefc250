"""Frames for the memory and the predictor: :class:`FrameFormat` (observations -> memory frames)
and :class:`FrameHistory` (the last ``history_len`` frames of each sub-environment's current
episode, which is what the predictor sees).

``FrameHistory.states`` computes its gather rows in the optional C kernel
``expreplay.acting._acting_ext`` and gathers the frames with ``expreplay.storage._gather_ext``;
a history built inside :func:`expreplay._kernels.numpy_only` uses numpy for both, for good (what
the tests do to check both).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ... import _kernels
from ...storage._gather import gather_history
from ...storage._inputs import as_frame, check_frames

__all__ = ['FrameFormat', 'FrameHistory']


class FrameFormat:
    """Turns observations into frames the memory stores: ``state_shape``, ``dtype``.

    The shape rule: an observation has ``state_shape``, or differs from it only by axes of
    size 1 (``AtariVectorEnv(stack_num=1)`` and EnvPool give (1, 84, 84) per sub-environment
    for a (84, 84) memory; an (84, 84, 1) observation fits too): the two shapes are equal once
    their size-1 axes are removed. Any other shape is refused, also one of the same size (a
    (4, 2) observation is not a (2, 4) frame: reshaping it would scramble it). A dtype change
    is allowed only where no data is lost (the memory's own rule,
    :func:`expreplay.storage.memory.as_frame`, so that the runner refuses exactly what the memory would).
    """

    def __init__(self, state_shape: Sequence[int], dtype: npt.DTypeLike) -> None:
        self.state_shape = tuple(state_shape)
        self.dtype = np.dtype(dtype)
        self._squeezed = _squeezed(self.state_shape)

    def __call__(self, obs: Any) -> np.ndarray:
        """One observation as a frame."""
        arr = np.asarray(obs)
        if arr.shape != self.state_shape and _squeezed(arr.shape) == self._squeezed:
            arr = arr.reshape(self.state_shape)
        return as_frame(arr, self.state_shape, self.dtype, 'player observation').astype(
            self.dtype, copy=False)

    def batch(self, obs: Any, n: int) -> np.ndarray:
        """``n`` stacked observations as ``(n, *state_shape)`` frames."""
        arr = np.asarray(obs)
        shape = (n,) + self.state_shape
        if arr.shape != shape and _squeezed(arr.shape) == _squeezed(shape):
            arr = arr.reshape(shape)       # moves size-1 axes only: the data keeps its order
        if arr.ndim == 0 or len(arr) != n:
            raise ValueError(f"player observations of shape {arr.shape} for {n} sub-environments")
        return check_frames(arr, self.state_shape, self.dtype, 'player observations').astype(
            self.dtype, copy=False)


def _squeezed(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


class FrameHistory:
    """The last ``history_len`` frames of each lane's (sub-environment's) current episode.

    A ring of ``history_len`` frames per lane: a new frame overwrites the lane's oldest one
    (one frame copied per step, not ``history_len``). States are handed out channels-last
    ``(n, *state_shape, history_len)``, oldest first, zero-padded before the episode's first
    frame: the same frames the memory gives the learner as ``comb_state[..., :-1]``.
    Invariant: row ``lane * h + pos[lane]`` holds the lane's newest frame, the rows after it
    (cyclically) the older ones, oldest first; rows from before the episode's start are zeros.
    """

    def __init__(self, num_lanes: int, state_shape: Sequence[int], history_len: int,
                 dtype: npt.DTypeLike) -> None:
        self.history_len = h = int(history_len)
        self._frames = np.zeros((num_lanes * h,) + tuple(state_shape), dtype)
        self._pos = np.zeros(num_lanes, np.int64)
        self._base = np.arange(num_lanes, dtype=np.int64) * h     # each lane's first row
        self._ring = np.arange(1, h + 1)
        self._rows = np.zeros((num_lanes, h), np.intp)             # states()' scratch
        # The kernels, chosen once, here (expreplay._kernels): the acting kernel (its rows,
        # and push_steps on these buffers) and the gather kernel states()
        # gives gather_history. Switched under a live history, the group's bound kernel and
        # this history's own calls would take different paths over the same buffers.
        self._ext = _kernels.get('_acting_ext')
        self._gather_ext = _kernels.get('_gather_ext')

    def start(self, lanes: npt.ArrayLike, frames: np.ndarray) -> None:
        """Begin a new episode in each of ``lanes`` with its first frame ``frames[j]``."""
        h = self.history_len
        lanes = np.asarray(lanes, np.int64)
        rows = lanes * h
        if h > 1:
            self._frames[(rows[:, None] + np.arange(h)).ravel()] = 0
        self._pos[lanes] = 0
        self._frames[rows] = frames

    def push(self, lanes: npt.ArrayLike, frames: np.ndarray) -> None:
        """Append the next frame of each of ``lanes``' episodes."""
        h = self.history_len
        lanes = np.asarray(lanes, np.int64)
        pos = (self._pos[lanes] + 1) % h
        self._pos[lanes] = pos
        self._frames[self._base[lanes] + pos] = frames

    def push_steps(self, lanes: np.ndarray, frames: np.ndarray, rewards: np.ndarray,
                   lives: np.ndarray, scores: np.ndarray, lengths: np.ndarray,
                   lives_now: np.ndarray) -> bool:
        """The common step of the acting kernel (:attr:`kernel`, not None): push ``frames[j]``
        into the history of ``lanes[j]`` (as :meth:`push`) and, in the same C call, book the
        step in the episode counters its caller hands in (``scores[lane] += reward``,
        ``lengths[lane] += 1``, ``lives_now[lane] = lives`` where lives are reported: the
        lanes' arrays, :class:`~expreplay.acting.lanes.LaneEpisodes`).

        One C call does both because that is the kernel's signature (splitting it would need a
        change to the C code); the history's arrays are written here, by the history's own
        method, and the counters only as handed in. False, nothing changed, when the kernel
        does not take one of the arrays: the caller then does both in numpy (:meth:`push`)."""
        ext = self._ext
        assert ext is not None, "push_steps is the acting kernel's (see kernel)"
        return not ext.push_steps(lanes, frames, rewards, lives, self._frames, self._pos,
                                  self._base, self.history_len, scores, lengths, lives_now)

    @property
    def kernel(self) -> Any:
        """The acting C kernel this history was built with (None: numpy)."""
        return self._ext

    def latest(self, lane: int) -> np.ndarray:
        """The newest frame of ``lane`` (a view)."""
        return self._frames[lane * self.history_len + self._pos[lane]]

    def states(self, lanes: npt.ArrayLike) -> np.ndarray:
        """Stacked states of ``lanes``: ``(len(lanes), *state_shape, history_len)``."""
        lanes = np.asarray(lanes, np.int64)
        if self._ext is not None:
            rows = self._rows[:len(lanes)]
            self._ext.history_rows(lanes, self._pos, self._base, self.history_len, rows)
        else:
            rows = self._base[lanes][:, None] + (self._pos[lanes][:, None] + self._ring) % self.history_len
        return gather_history(self._frames, rows, self._gather_ext)
