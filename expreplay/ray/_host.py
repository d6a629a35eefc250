"""What runs inside an env actor's process: its envs, stepped in NEXT_STEP autoreset mode.

The driver side (:mod:`expreplay.ray._fleet`) creates one :class:`EnvHost` per actor with
``ray.remote`` and talks to it only through :meth:`EnvHost.spec`, :meth:`EnvHost.reset` and
:meth:`EnvHost.step`, whose arguments and results travel wrapped in a :class:`Packet`.
"""

import inspect
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import ray

# The rules for what an env may return, applied in the actor where the values are first seen
# (casting there first would round an integer reward or read the string 'False' as True).
from ..acting.envs import _flag, _flags, _reward, _rewards
from .errors import EnvBuildError

# What an actor answers to reset and step: (token, obs, reward, terminated, truncated, lives or
# None, seconds the envs took).
Result = tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray, 'np.ndarray | None', float]


def _accepts_index(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes the env index as a positional argument (else it is called bare)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    try:
        sig.bind(0)
    except TypeError:
        return False
    return True


def _is_vector(env: Any) -> bool:
    return isinstance(env, gym.vector.VectorEnv) or (
        hasattr(env, 'num_envs') and hasattr(env, 'single_action_space'))


def _lives_of(info: Any) -> np.ndarray | None:
    lives = info.get('lives') if isinstance(info, dict) else None
    return None if lives is None else np.asarray(lives, np.int64)


class Packet:
    """A request's or a result's arrays, wrapped so that Ray pickles them (protocol 5, the arrays'
    buffers out of band) rather than msgpack: tensorpack patches msgpack with msgpack_numpy in any
    process that imports it, which would encode bare numpy arrays as dicts that an unpatched peer
    can not read."""

    __slots__ = ('value',)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[type, tuple[Any]]:
        return Packet, (self.value,)


class EnvHost:
    """The envs of one actor and their NEXT_STEP autoreset; runs inside the actor process.

    ``make_env`` returns a gymnasium env (called once per env, with the env's global index when it
    takes an argument) or a vector env of exactly ``n`` envs (EnvPool, a gymnasium ``VectorEnv`` in
    NEXT_STEP mode, called once with the actor's first index), which autoresets by itself.
    """

    def __init__(self, make_env: Callable[..., Any], first_index: int, n: int) -> None:
        self.n = n
        # This incarnation: results from one the driver gave up on are dropped.
        self.token = (uuid.uuid4().hex, os.getpid())
        self.error: Exception | None = None
        self.vector: Any = None
        self.envs: list[Any] = []
        try:
            self._build(make_env, first_index, n)
        except Exception as exc:               # reported by spec(): a clear error at construction
            self.error = exc

    def _build(self, make_env: Callable[..., Any], first_index: int, n: int) -> None:
        with_index = _accepts_index(make_env)
        first = make_env(first_index) if with_index else make_env()
        if _is_vector(first):
            self._check_vector(first, n)
            self.vector = first
            obs_space = getattr(first, 'single_observation_space', None) or first.observation_space
            act_space = getattr(first, 'single_action_space', None) or first.action_space
        else:
            envs = [first] + [make_env(first_index + j) if with_index else make_env() for j in range(1, n)]
            for j, env in enumerate(envs):
                if not (hasattr(env, 'reset') and hasattr(env, 'step')):
                    raise EnvBuildError(f"make_env returned {type(env).__name__} for env "
                                        f"{first_index + j}, not an env (no reset/step)")
            self.envs = envs
            obs_space, act_space = envs[0].observation_space, envs[0].action_space
        self.obs_space, self.act_space = obs_space, act_space
        self.dtype = np.dtype(getattr(obs_space, 'dtype', None) or np.uint8)
        self.ended = np.zeros(n, bool)

    @staticmethod
    def _check_vector(env: Any, n: int) -> None:
        if int(env.num_envs) != n:
            raise EnvBuildError(f"make_env returned a vector env of {env.num_envs} envs; "
                                f"envs_per_actor is {n}")
        mode = (getattr(env, 'metadata', None) or {}).get('autoreset_mode')
        mode = getattr(mode, 'value', mode)
        if mode not in (None, 'NextStep'):
            raise EnvBuildError(f"make_env returned a vector env in autoreset mode {mode!r}; "
                                "RayVectorEnv needs NEXT_STEP (gymnasium's default, EnvPool's)")

    def spec(self) -> dict[str, Any]:
        """The envs' spaces and where this incarnation runs (raises what the build raised)."""
        if self.error is not None:
            raise self.error        # the original: the driver chains its own error to it
        return dict(obs_space=self.obs_space, act_space=self.act_space, pid=os.getpid(),
                    host=socket.gethostname(), node=ray.get_runtime_context().get_node_id(),
                    token=self.token)

    def _lives(self, infos: Sequence[dict[str, Any]]) -> np.ndarray | None:
        if all('lives' not in i for i in infos):
            return None
        return np.array([int(i.get('lives', -1)) for i in infos], np.int64)

    def reset(self, seeds: Sequence[int | None] | None) -> Packet:
        """Reset every env (``seeds``: one per env, or None); a :data:`Result` in a Packet."""
        if self.error is not None:
            self.spec()
        t0 = time.perf_counter()
        lives: np.ndarray | None
        if self.vector is not None:
            if seeds is None:
                obs, info = self.vector.reset()
            else:
                obs, info = self.vector.reset(seed=list(seeds))
            lives = _lives_of(info)
        else:
            results = [env.reset(seed=None if seeds is None else seeds[j]) for j, env in enumerate(self.envs)]
            obs = [r[0] for r in results]
            lives = self._lives([r[1] for r in results])
        self.ended[:] = False
        z = np.zeros(self.n, bool)
        return Packet((self.token, np.asarray(obs, self.dtype), np.zeros(self.n, np.float32), z, z, lives,
                       time.perf_counter() - t0))

    def step(self, actions: Packet) -> Packet:
        """Step every env with the array of ``n`` actions in ``actions``; a :data:`Result` in a
        Packet. An env whose episode ended last step is reset instead (its action ignored)."""
        acts = actions.value
        if self.error is not None:
            self.spec()
        if not isinstance(acts, np.ndarray) or acts.shape[:1] != (self.n,):
            raise ValueError(f"actions must be an array of {self.n} actions, got {type(acts).__name__} "
                             f"{getattr(acts, 'shape', '')}: {acts!r:.200}")
        t0 = time.perf_counter()
        if self.vector is not None:
            obs, reward, term, trunc, lives = self._step_vector(acts)
        else:
            obs, reward, term, trunc, lives = self._step_envs(acts)
        return Packet((self.token, obs, reward, term, trunc, lives, time.perf_counter() - t0))

    def _step_vector(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                         np.ndarray, np.ndarray | None]:
        obs, reward, term, trunc, info = self.vector.step(actions)
        return (np.asarray(obs, self.dtype), _rewards(reward, self.n),
                _flags(term, self.n, 'terminated'), _flags(trunc, self.n, 'truncated'), _lives_of(info))

    def _step_envs(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                       np.ndarray, np.ndarray | None]:
        obs = np.empty((self.n,) + tuple(self.obs_space.shape), self.dtype)
        reward = np.zeros(self.n)
        term, trunc = np.zeros(self.n, bool), np.zeros(self.n, bool)
        infos = []
        for j, env in enumerate(self.envs):
            if self.ended[j]:        # NEXT_STEP: this step resets the env, its action is ignored
                o, info = env.reset()
                self.ended[j] = False
            else:
                o, r, te, tr, info = env.step(actions[j])
                reward[j] = _reward(r, "step()'s reward")
                te, tr = _flag(te, 'terminated'), _flag(tr, 'truncated')
                term[j], trunc[j] = te, tr
                self.ended[j] = te or tr
            obs[j] = o
            infos.append(info)
        return obs, reward, term, trunc, self._lives(infos)

    def close(self) -> None:
        """Close the envs."""
        for env in self.envs or [self.vector]:
            close = getattr(env, 'close', None)
            if close is not None:
                close()
