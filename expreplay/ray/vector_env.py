""":class:`RayVectorEnv`: the gymnasium ``VectorEnv`` (sync and async API) over an
:class:`~expreplay.ray._fleet.ActorFleet` of env actors."""

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import ray

from .._checks import check_callable, check_int, check_real, check_timeout
from ..stats import RayTrafficStats
from ._fleet import Actor, ActorFleet
from ._host import Packet, Result

__all__ = ['RayVectorEnv']

_PLACEMENTS = ('SPREAD', 'PACK', 'STRICT_SPREAD', 'STRICT_PACK')

# What step, recv and reset's results are made of: obs, reward, terminated, truncated, info.
Batch = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class RayVectorEnv(gym.vector.VectorEnv):
    """A gymnasium ``VectorEnv`` of ``num_actors * envs_per_actor`` envs stepped in Ray actors.

    Args:
        make_env: a picklable callable run inside each actor. It returns a gymnasium env (called
            ``envs_per_actor`` times per actor, with the env's global index ``actor *
            envs_per_actor + j`` when it takes one positional argument, else with none), or a
            vector env of ``envs_per_actor`` envs in NEXT_STEP autoreset mode (an EnvPool; called
            once per actor, with the actor's first global index).
        num_actors (int): actors (>= 1), one placement-group bundle each.
        envs_per_actor (int): envs stepped by each actor (>= 1).
        num_cpus_per_actor (float): CPUs reserved per actor (> 0).
        max_restarts (int): restarts Ray grants each actor over its life (>= 0).
        step_timeout (float): seconds an actor may take to answer a request (or to come back after
            a death) before it is treated as dead; ``inf``: no limit.
        placement (str): the placement group's strategy: ``'SPREAD'`` (actors over the cluster's
            nodes, as far as they go), ``'STRICT_SPREAD'``, ``'PACK'`` or ``'STRICT_PACK'``.
        start_timeout (float): seconds to wait for the placement group and the actors to come up.

    Ray: if Ray is not initialised, the constructor calls ``ray.init(include_dashboard=False)``,
    which follows Ray's own rules (``RAY_ADDRESS`` if set, else a cluster started with ``ray
    start`` on this machine, else a new local instance with all its CPUs). Call
    ``ray.init(address=...)`` (or ``ray.init(num_cpus=...)``) first to choose. This class never
    shuts Ray down. The machines running actors must be able to import ``expreplay`` and
    whatever ``make_env`` needs (install them there, or pass a ``runtime_env`` to ``ray.init``).

    One thread drives it (as any env): the calls are not thread-safe.

    Attributes: ``actor_restarts`` (int, all actors), ``is_async = True``, ``num_actors``,
    ``envs_per_actor``; :meth:`stats` reports the traffic.
    """

    is_async = True

    def __init__(self, make_env: Callable[..., Any], num_actors: int, envs_per_actor: int, *,
                 num_cpus_per_actor: float = 1, max_restarts: int = 3, step_timeout: float = 60.0,
                 placement: str = 'SPREAD', start_timeout: float = 120.0) -> None:
        self._closed = True            # until the actors are up
        self._fleet: ActorFleet | None = None
        check_callable(make_env, 'make_env')
        self.num_actors = check_int(num_actors, 'num_actors', 1)
        self.envs_per_actor = check_int(envs_per_actor, 'envs_per_actor', 1)
        cpus = check_real(num_cpus_per_actor, 'num_cpus_per_actor', 0.0)
        if cpus <= 0:
            raise ValueError(f"num_cpus_per_actor must be > 0, got {num_cpus_per_actor!r}")
        self.max_restarts = check_int(max_restarts, 'max_restarts', 0)
        self.step_timeout = check_timeout(step_timeout, 'step_timeout')
        self.start_timeout = check_timeout(start_timeout, 'start_timeout')
        if placement not in _PLACEMENTS:
            raise ValueError(f"placement must be one of {_PLACEMENTS}, got {placement!r}")
        self.placement = placement
        self.num_envs = self.num_actors * self.envs_per_actor
        if not ray.is_initialized():
            ray.init(include_dashboard=False)
        self._fleet = ActorFleet(make_env, self.num_actors, self.envs_per_actor, cpus=cpus,
                                 max_restarts=self.max_restarts, step_timeout=self.step_timeout,
                                 start_timeout=self.start_timeout, placement=placement)
        self._closed = False
        self.single_observation_space, self.single_action_space = self._fleet.spaces
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = {'autoreset_mode': gym.vector.AutoresetMode.NEXT_STEP}
        self.render_mode = None
        self.closed = False

    @property
    def actor_restarts(self) -> int:
        """Restarts of all actors so far."""
        return self._fleet.restarts if self._fleet is not None else 0

    def _open_fleet(self) -> ActorFleet:
        if self._closed or self._fleet is None:
            raise RuntimeError("RayVectorEnv is closed")
        return self._fleet

    def _assemble(self, results: Sequence[tuple[Actor, Result, bool]]) -> Batch:
        """Concatenate per-actor results, in the order given, into batched arrays and an info."""
        k = self.envs_per_actor
        obs = np.concatenate([r[1] for _, r, _ in results]) if len(results) > 1 else results[0][1][1]
        reward = np.concatenate([r[2] for _, r, _ in results]).astype(np.float64)
        term = np.concatenate([r[3] for _, r, _ in results])
        trunc = np.concatenate([r[4] for _, r, _ in results])
        restarted = np.repeat(np.array([f for _, _, f in results], bool), k)
        env_id = np.concatenate([np.arange(a.index * k, a.index * k + k) for a, _, _ in results])
        info: dict[str, Any] = {'env_id': env_id, 'restarted': restarted}
        if any(r[5] is not None for _, r, _ in results):
            lives = np.concatenate([r[5] if r[5] is not None else np.full(k, -1) for _, r, _ in results])
            info['lives'] = lives
            info['_lives'] = lives >= 0
        return obs, reward, term, trunc, info

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[list[int | None] | None]:
        if seed is None:
            return [None] * self.num_actors
        if isinstance(seed, (int, np.integer)):
            seed = [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"seed: {len(seeds)} seeds for {self.num_envs} envs")
        k = self.envs_per_actor
        per = [seeds[i * k:(i + 1) * k] for i in range(self.num_actors)]
        return [None if all(s is None for s in p) else p for p in per]

    # ------------------------------------------------------------------ sync API
    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env; ``(obs (num_envs, ...), info)``. ``seed``: an int (env i gets
        ``seed + i``) or a list of ``num_envs`` seeds (None: unseeded); ``options`` is not used."""
        self.async_reset(seed=seed, options=options)
        obs, _, _, _, info = self._collect_all()
        return obs, info

    def step(self, actions: Any) -> Batch:
        """Step every env with ``actions`` (``num_envs``,); the gymnasium 5-tuple, batched, with
        ``info['restarted']`` (and ``info['lives']`` when the envs report lives)."""
        self._open_fleet()
        actions = np.asarray(actions)
        if actions.shape[:1] != (self.num_envs,):
            raise ValueError(f"actions must have shape ({self.num_envs},), got {actions.shape}")
        self.send(actions, np.arange(self.num_envs))
        return self._collect_all()

    def _collect_all(self) -> Batch:
        fleet = self._open_fleet()
        results = fleet.wait(fleet.actors, want_all=True)
        results.sort(key=lambda r: r[0].index)
        return self._assemble(results)

    # ------------------------------------------------------------------ async API
    def async_reset(self, seed: int | Sequence[int | None] | None = None,
                    options: dict[str, Any] | None = None) -> None:
        """Start a reset of every env (see :meth:`reset`); the observations come from :meth:`recv`."""
        fleet = self._open_fleet()
        fleet.drain()         # results in flight are of episodes this reset ends: drop them
        for actor, seeds in zip(fleet.actors, self._seeds(seed)):
            fleet.submit(actor, 'reset', seeds)

    def recv(self) -> Batch:
        """The envs of the actors whose results are ready (at least one actor; blocks until then):
        ``(obs (k, ...), reward (k,), terminated (k,), truncated (k,), info)`` with
        ``info['env_id']`` (k,) the envs' global indices and ``info['restarted']`` (k,)."""
        fleet = self._open_fleet()
        if not fleet.in_flight:
            raise RuntimeError("recv with no request in flight: call async_reset() or send() first")
        fleet.traffic.recv(fleet.in_flight)
        return self._assemble(fleet.wait(fleet.actors, want_all=False))

    def send(self, actions: Any, env_id: Any = None) -> None:
        """Send ``actions`` for the envs ``env_id`` (whole actors' sets, as :meth:`recv` gave them;
        None: all envs)."""
        fleet = self._open_fleet()
        actions = np.asarray(actions)
        k = self.envs_per_actor
        ids = np.arange(self.num_envs) if env_id is None else np.asarray(env_id, np.int64).reshape(-1)
        if actions.shape[:1] != ids.shape:
            raise ValueError(f"actions: {actions.shape[0] if actions.ndim else 'a scalar'} actions for "
                             f"{len(ids)} env_id")
        actors = self._actors_of(fleet, ids)
        per = actions.reshape((len(actors), k) + actions.shape[1:])
        for a, act in zip(actors, per):
            fleet.submit(a, 'step', Packet(np.ascontiguousarray(act)))

    def _actors_of(self, fleet: ActorFleet, env_id: np.ndarray) -> list[Actor]:
        """The actors whose envs ``env_id`` lists (whole sets, in order), each with no request
        in flight."""
        k = self.envs_per_actor
        if len(env_id) % k or len(env_id) == 0:
            raise ValueError(f"env_id must name whole actors' sets of {k} envs, got {len(env_id)} ids")
        groups = env_id.reshape(-1, k)
        first = groups[:, 0]
        if (first % k).any() or (groups != first[:, None] + np.arange(k)).any() \
                or first.min() < 0 or first.max() >= self.num_envs:
            raise ValueError(f"env_id must list whole actors' envs in order (a*{k} .. a*{k}+{k - 1}), "
                             f"got {env_id.tolist()}")
        actors = [fleet.actors[int(f) // k] for f in first]
        if len(set(a.index for a in actors)) != len(actors):
            raise ValueError(f"env_id names an actor twice: {env_id.tolist()}")
        for a in actors:
            if a.ref is not None:
                raise RuntimeError(f"send for actor {a.index} (envs {a.index * k}..{a.index * k + k - 1}) "
                                   "whose previous request is still in flight: recv() it first")
        return actors

    # ------------------------------------------------------------------ the rest
    def stats(self) -> RayTrafficStats:
        """Traffic so far: results (actor steps), env steps, payload bytes per env step, the
        actors' own compute time, the round trip and the transport overhead per env step (s),
        the mean number of actors in flight at a ``recv``: a
        :class:`~expreplay.stats.RayTrafficStats`."""
        if self._fleet is None:
            raise RuntimeError("RayVectorEnv did not start")
        return self._fleet.traffic.report(actor_restarts=self.actor_restarts)

    def actor_pids(self) -> list[tuple[str, int]]:
        """``[(host, pid)]`` of each actor's current process (asks the actors; for tests/ops)."""
        return [(s['host'], s['pid']) for s in self._open_fleet().refresh()]

    def actor_nodes(self) -> list[str]:
        """Each actor's current Ray node id."""
        return [s['node'] for s in self._open_fleet().refresh()]

    def actor_handles(self) -> list[Any]:
        """The Ray actor handles (index order)."""
        return [a.handle for a in self._fleet.actors] if self._fleet is not None else []

    def close(self, **kwargs: Any) -> None:
        """Kill every actor, wait until Ray reports them dead (and their local processes gone),
        remove the placement group. Idempotent."""
        self._closed = True
        self.closed = True
        if self._fleet is not None:
            self._fleet.close()

    def __repr__(self) -> str:
        return (f"RayVectorEnv({self.num_actors} actors x {self.envs_per_actor} envs, "
                f"{self.placement}, restarts={self.actor_restarts})")
