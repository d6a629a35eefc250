"""Environment adapters: one acting interface over the env APIs a runner may be given.

A runner (:class:`expreplay.acting.runner.EnvRunner`) should not care which flavour of environment it
drives, so this module turns each of them into the same small protocol, :class:`EnvAdapter`:
``num_envs`` sub-environments, whose results come back as arrays (:class:`Results`), so that
the acting path handles a batch of sub-environments with numpy operations instead of a Python
loop over them.

Supported players (detected by :func:`adapt_env`):

* a gymnasium ``Env``: ``reset(seed=...) -> (obs, info)``, ``step(a) -> 5-tuple``;
* an old-gym-API env (gym < 0.26 style): ``reset() -> obs``, ``step(a) -> (obs, r, done, info)``,
  seeded through ``env.seed(s)`` when it has that method; a time-limit end is recognised from
  ``info['TimeLimit.truncated']``. An env that is neither subclass is classified by what its
  first ``reset()`` returns and checked again at its first ``step()``;
* a gymnasium ``VectorEnv`` (e.g. ``SyncVectorEnv``, ``AsyncVectorEnv``,
  ``ale_py.vector_env.AtariVectorEnv``, a synchronous EnvPool) in any of the three autoreset
  modes;
* an asynchronous engine with EnvPool's ``async_reset()`` / ``recv()`` / ``send(actions,
  env_id)`` (EnvPool with ``batch_size < num_envs``, :class:`expreplay.ray.RayVectorEnv`):
  :class:`AsyncVectorAdapter`. ``recv`` returns the sub-environments that are ready; their
  next actions go back with ``send`` while the engine steps the others.

Also in this package (:mod:`.frames`): :class:`FrameFormat` (observations -> memory frames) and :class:`FrameHistory` (the
last ``history_len`` frames of each sub-environment's current episode, which is what the
predictor sees).

This module does not import gymnasium unless it is installed; nothing here imports TensorFlow.

Each adapter class names its :class:`Stepping` (``EnvAdapter.stepping``): how an acting group
steps envs of that kind (one ``step`` call per runner; one ``step_one`` call per single env,
:class:`~.singles.SingleEnvSteps`; ``recv`` / ``send``, :class:`~.vector.AsyncSteps`). Picking the
adapter picks the stepping, once: the group and the manager read the stepping's attributes and
call its methods, never the kind. A new kind is an adapter and its stepping, in a module of
their own, and a line here that detects it.

The package's modules: :mod:`.base` (the protocol, the stepping protocol and the rules for flags
and rewards), :mod:`.single` and :mod:`.singles`, :mod:`.vector` (the adapters and their
steppings), :mod:`.frames`; this module picks the adapter.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import NO_LIVES, EnvAdapter, Results, Stepping, _batch_size, _describe
# The rules for what an env returns (expreplay.ray's actors hold their envs to them too).
from .base import _flag, _flags, _reward, _rewards  # noqa: F401
from .frames import FrameFormat, FrameHistory
from .single import SingleEnvAdapter
from .vector import AsyncVectorAdapter, VectorEnvAdapter

__all__ = ['Results', 'EnvAdapter', 'Stepping', 'SingleEnvAdapter', 'VectorEnvAdapter',
           'AsyncVectorAdapter', 'adapt_env', 'FrameFormat', 'FrameHistory', 'NO_LIVES']

_gym: Any
try:  # gymnasium is an optional dependency (extra 'atari'); duck typing covers the rest.
    import gymnasium as _gym
except ImportError:  # pragma: no cover - exercised only without gymnasium
    _gym = None


def _is_vector_env(player: Any) -> bool:
    if _gym is not None and isinstance(player, _gym.vector.VectorEnv):
        return True
    # Other VectorEnv look-alikes (a wrapper that does not subclass it, envpool-style envs).
    return hasattr(player, 'num_envs') and hasattr(player, 'single_action_space')


def _is_async_engine(player: Any) -> bool:
    if not all(callable(getattr(player, m, None)) for m in ('recv', 'send')):
        return False
    flag = getattr(player, 'is_async', None)
    if flag is not None:
        return bool(flag)
    batch = _batch_size(player)
    return batch is not None and batch < int(player.num_envs)


def adapt_env(player: Any) -> EnvAdapter:
    """The :class:`EnvAdapter` for ``player``, whose class names the :class:`Stepping` acting
    groups step it with; TypeError naming ``player`` if it is no env."""
    if isinstance(player, EnvAdapter):
        return player
    if _is_vector_env(player):
        if _is_async_engine(player):
            return AsyncVectorAdapter(player)
        return VectorEnvAdapter(player)
    if not (callable(getattr(player, 'reset', None)) and callable(getattr(player, 'step', None))):
        raise TypeError(f"player must be a gymnasium Env, an old-gym-API env (reset/step), or a "
                        f"gymnasium VectorEnv; got {_describe(player)} without reset()/step()")
    if _gym is not None and isinstance(player, _gym.Env):
        return SingleEnvAdapter(player, api='gymnasium')
    return SingleEnvAdapter(player)
