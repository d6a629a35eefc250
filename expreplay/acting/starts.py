"""How an episode starts: the values an episode-start scheduler returns.

:class:`EpisodeStart` (the seed, reset options and kind of one episode's start, and a
:class:`RestartPoint` to restore) is what a scheduler (:mod:`expreplay.acting.episodes`) hands
the acting path, and a :class:`RestartPoint` what the acting path hands a scheduler that
collects them. Both are plain values, so that the schedulers and the acting path that
executes their starts (:mod:`expreplay.acting.group`) import them from here, not each other.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = ['EpisodeStart', 'RestartPoint']


class EpisodeStart(NamedTuple):
    """How to start one episode.

    Attributes:
        seed: passed to ``reset(seed=...)``; None resets without a seed (the env continues its
            own random sequence).
        options: passed to ``reset(options=...)`` (gymnasium envs only); None for none.
        kind: recorded as the episode's ``start_kind``: ``'reset'`` for a plain reset,
            ``'restart'`` for a start from a :class:`RestartPoint` (any string is allowed).
        restore: a :class:`RestartPoint` to restore right after the reset, or None.
    """
    seed: int | None = None
    options: dict[str, Any] | None = None
    kind: str = 'reset'
    restore: RestartPoint | None = None


class RestartPoint(NamedTuple):
    """A saved emulator state to start episodes from.

    Attributes:
        state: the emulator state (``ale_py.ALEState`` from ``cloneState``).
        frame: the observation the runner stored for that state (memory dtype and shape). ALE
            does not restore its screen buffer with ``restoreState`` (the screen keeps showing
            the frame before the restore until the next ``act``), so the first frame of a
            restarted episode is this saved frame, not a render.
        lives: ``info['lives']`` at that state, or None.
        action: the action of the step that led to the state (sticky actions repeat it), or None.
        origin: where it was harvested: ``{'runner', 'env_index', 'episode', 'step'}``
            (``step``: steps into that episode, which may itself have been a restart).
    """
    state: Any
    frame: np.ndarray
    lives: int | None
    action: int | None
    origin: dict[str, Any]
