"""Environment actors on Ray: a gymnasium ``VectorEnv`` whose sub-envs live in Ray actors.

:class:`RayVectorEnv` is an ordinary player for :class:`~expreplay.EnvRunner` (and everything built
on it): the replay memory and the Q-network stay in the learner's process (SEED-style: no weights
are shipped), and only observations, rewards and flags come back, one numpy array per actor and
step. Each actor steps ``envs_per_actor`` environments made by ``make_env`` inside the actor.

Two ways to drive it:

* sync (gymnasium): ``reset()``, ``step(actions)`` for all ``num_envs`` envs at once;
* async (EnvPool-style, ``is_async = True``): ``async_reset()``, then ``recv()`` returns the envs
  of the actors whose results are ready (with ``info['env_id']``) and ``send(actions, env_id)``
  sends their next actions, so a learner keeps several actors in flight and never waits on the
  slowest.

Both autoreset in NEXT_STEP mode: the step after an env's episode ended resets it, ignores its
action and returns its reset observation, reward 0, both flags False.

Faults: an actor whose process dies, whose env raises, whose node goes away, or that does not
answer within ``step_timeout``, is restarted by Ray (up to ``max_restarts`` times over its life);
its envs then come back with ``info['restarted']`` True and the first observation of a new
episode (the learner ends the interrupted episodes there: nothing bootstraps across the gap);
``actor_restarts`` counts the restarts. Past the budget, ``step``/``recv`` raise
:class:`ActorFailedError`, chained to Ray's (or the env's) error.

Ray is imported when this module is; ``import expreplay`` does not import it.
"""

import inspect
import math
import os
import socket
import time
import uuid

import numpy as np

from ._extras import extra_import_error

try:
    import gymnasium as gym
    import ray
    from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayTaskError
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as err:
    raise extra_import_error('RayVectorEnv', 'ray', err) from err

from ._checks import check_callable, check_int, check_real, check_timeout
# The rules for what an env may return, applied in the actor where the values are first seen
# (casting there first would round an integer reward or read the string 'False' as True).
from .acting.envs import _flag, _flags, _reward, _rewards

__all__ = ['RayVectorEnv', 'ActorFailedError', 'EnvBuildError']

_PLACEMENTS = ('SPREAD', 'PACK', 'STRICT_SPREAD', 'STRICT_PACK')


class ActorFailedError(RuntimeError):
    """An env actor failed past its restart budget (or could not be brought back in time).

    ``actor`` is the actor's index; the exception is chained to Ray's error (or the env's).
    """

    def __init__(self, message, actor):
        super().__init__(message)
        self.actor = actor


class EnvBuildError(ValueError):
    """``make_env`` failed (or built something that is not a usable env) inside an actor."""


def _accepts_index(fn):
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


def _is_vector(env):
    return isinstance(env, gym.vector.VectorEnv) or (
        hasattr(env, 'num_envs') and hasattr(env, 'single_action_space'))


class _Packet:
    """A request's or a result's arrays, wrapped so that Ray pickles them (protocol 5, the arrays'
    buffers out of band) rather than msgpack: tensorpack patches msgpack with msgpack_numpy in any
    process that imports it, which would encode bare numpy arrays as dicts that an unpatched peer
    can not read."""

    __slots__ = ('value',)

    def __init__(self, value):
        self.value = value

    def __reduce__(self):
        return _Packet, (self.value,)


class _EnvHost:
    """The envs of one actor and their NEXT_STEP autoreset; runs inside the actor process.

    ``make_env`` returns a gymnasium env (called once per env, with the env's global index when it
    takes an argument) or a vector env of exactly ``n`` envs (EnvPool, a gymnasium ``VectorEnv`` in
    NEXT_STEP mode, called once with the actor's first index), which autoresets by itself.
    """

    def __init__(self, make_env, first_index, n):
        self.n = n
        # This incarnation: results from one the driver gave up on are dropped.
        self.token = (uuid.uuid4().hex, os.getpid())
        self.error = None
        try:
            self._build(make_env, first_index, n)
        except Exception as exc:               # reported by spec(): a clear error at construction
            self.error = exc

    def _build(self, make_env, first_index, n):
        with_index = _accepts_index(make_env)
        first = make_env(first_index) if with_index else make_env()
        if _is_vector(first):
            if int(first.num_envs) != n:
                raise EnvBuildError(f"make_env returned a vector env of {first.num_envs} envs; "
                                    f"envs_per_actor is {n}")
            mode = (getattr(first, 'metadata', None) or {}).get('autoreset_mode')
            mode = getattr(mode, 'value', mode)
            if mode not in (None, 'NextStep'):
                raise EnvBuildError(f"make_env returned a vector env in autoreset mode {mode!r}; "
                                    "RayVectorEnv needs NEXT_STEP (gymnasium's default, EnvPool's)")
            self.vector = first
            self.envs = None
            obs_space = getattr(first, 'single_observation_space', None) or first.observation_space
            act_space = getattr(first, 'single_action_space', None) or first.action_space
        else:
            envs = [first] + [make_env(first_index + j) if with_index else make_env() for j in range(1, n)]
            for j, env in enumerate(envs):
                if not (hasattr(env, 'reset') and hasattr(env, 'step')):
                    raise EnvBuildError(f"make_env returned {type(env).__name__} for env "
                                        f"{first_index + j}, not an env (no reset/step)")
            self.vector = None
            self.envs = envs
            obs_space, act_space = envs[0].observation_space, envs[0].action_space
        self.obs_space, self.act_space = obs_space, act_space
        self.dtype = np.dtype(getattr(obs_space, 'dtype', None) or np.uint8)
        self.ended = np.zeros(n, bool)

    def spec(self):
        if self.error is not None:
            raise self.error        # the original: the driver chains its own error to it
        return dict(obs_space=self.obs_space, act_space=self.act_space, pid=os.getpid(),
                    host=socket.gethostname(), node=ray.get_runtime_context().get_node_id(),
                    token=self.token)

    def _lives(self, infos):
        if all('lives' not in i for i in infos):
            return None
        return np.array([int(i.get('lives', -1)) for i in infos], np.int64)

    def reset(self, seeds):
        if self.error is not None:
            self.spec()
        t0 = time.perf_counter()
        if self.vector is not None:
            if seeds is None:
                obs, info = self.vector.reset()
            else:
                obs, info = self.vector.reset(seed=list(seeds))
            lives = info.get('lives') if isinstance(info, dict) else None
            lives = None if lives is None else np.asarray(lives, np.int64)
        else:
            results = [env.reset(seed=None if seeds is None else seeds[j]) for j, env in enumerate(self.envs)]
            obs = [r[0] for r in results]
            lives = self._lives([r[1] for r in results])
        self.ended[:] = False
        z = np.zeros(self.n, bool)
        return _Packet((self.token, np.asarray(obs, self.dtype), np.zeros(self.n, np.float32), z, z, lives,
                        time.perf_counter() - t0))

    def step(self, actions):
        actions = actions.value
        if self.error is not None:
            self.spec()
        if not isinstance(actions, np.ndarray) or actions.shape[:1] != (self.n,):
            raise ValueError(f"actions must be an array of {self.n} actions, got {type(actions).__name__} "
                             f"{getattr(actions, 'shape', '')}: {actions!r:.200}")
        t0 = time.perf_counter()
        if self.vector is not None:
            obs, reward, term, trunc, info = self.vector.step(actions)
            lives = info.get('lives') if isinstance(info, dict) else None
            lives = None if lives is None else np.asarray(lives, np.int64)
            obs = np.asarray(obs, self.dtype)
            reward = _rewards(reward, self.n)
            term, trunc = _flags(term, self.n, 'terminated'), _flags(trunc, self.n, 'truncated')
        else:
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
            lives = self._lives(infos)
        return _Packet((self.token, obs, reward, term, trunc, lives, time.perf_counter() - t0))

    def close(self):
        for env in self.envs or [self.vector]:
            close = getattr(env, 'close', None)
            if close is not None:
                close()


class _Actor:
    """Where an actor is up to, as the driver sees it."""

    __slots__ = ('index', 'handle', 'ref', 'sent_at', 'token', 'dead_tokens', 'recovering',
                 'lost_at', 'restarts', 'pid', 'host', 'node', 'error')

    def __init__(self, index, handle, spec):
        self.index, self.handle = index, handle
        self.ref = None               # the pending request, if any
        self.sent_at = 0.0
        self.token = spec['token']
        self.dead_tokens = set()
        self.recovering = False       # died; a reset of its new incarnation is pending
        self.lost_at = 0.0
        self.restarts = 0
        self.pid, self.host, self.node = spec['pid'], spec['host'], spec['node']  # as last seen
        self.error = None


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

    def __init__(self, make_env, num_actors, envs_per_actor, *, num_cpus_per_actor=1, max_restarts=3,
                 step_timeout=60.0, placement='SPREAD', start_timeout=120.0):
        self._closed = True            # until every part is up (close() then undoes what is)
        self._actors, self._pg = [], None
        check_callable(make_env, 'make_env')
        self.num_actors = check_int(num_actors, 'num_actors', 1)
        self.envs_per_actor = check_int(envs_per_actor, 'envs_per_actor', 1)
        cpus = check_real(num_cpus_per_actor, 'num_cpus_per_actor', 0.0)
        if cpus <= 0:
            raise ValueError(f"num_cpus_per_actor must be > 0, got {num_cpus_per_actor!r}")
        self.max_restarts = check_int(max_restarts, 'max_restarts', 0)
        self.step_timeout = check_timeout(step_timeout, 'step_timeout')
        self.start_timeout = start_timeout = check_timeout(start_timeout, 'start_timeout')
        if placement not in _PLACEMENTS:
            raise ValueError(f"placement must be one of {_PLACEMENTS}, got {placement!r}")
        self.placement = placement
        self.num_envs = self.num_actors * self.envs_per_actor
        if not ray.is_initialized():
            ray.init(include_dashboard=False)

        n, k = self.num_actors, self.envs_per_actor
        self._closed = False
        try:
            self._pg = placement_group([{'CPU': cpus}] * n, strategy=placement)
            try:
                ray.get(self._pg.ready(), timeout=None if math.isinf(start_timeout) else start_timeout)
            except GetTimeoutError as exc:
                raise RuntimeError(f"RayVectorEnv: the cluster did not grant {n} bundles of "
                                   f"{cpus} CPU ({placement}) within start_timeout={start_timeout} s "
                                   f"(available: {ray.available_resources()})") from exc
            remote = ray.remote(_EnvHost)
            handles = [remote.options(
                num_cpus=cpus, max_restarts=self.max_restarts, max_task_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=i),
            ).remote(make_env, i * k, k) for i in range(n)]
            self._actors = [_Actor(i, h, {'token': None, 'pid': None, 'host': None, 'node': None})
                            for i, h in enumerate(handles)]
            specs = [h.spec.remote() for h in handles]
            for i, ref in enumerate(specs):
                try:
                    spec = ray.get(ref, timeout=None if math.isinf(start_timeout) else start_timeout)
                except RayTaskError as exc:   # chained to Ray's error: it carries the actor's traceback
                    raise EnvBuildError(f"RayVectorEnv: make_env failed in actor {i} (envs "
                                        f"{i * k}..{i * k + k - 1}): {_describe(exc)}") from exc
                except RayActorError as exc:      # e.g. make_env could not be unpickled there
                    raise EnvBuildError(f"RayVectorEnv: actor {i} (envs {i * k}..{i * k + k - 1}) "
                                        f"failed to start: {exc}") from exc
                except GetTimeoutError as exc:
                    raise RuntimeError(f"RayVectorEnv: actor {i} did not start within "
                                       f"start_timeout={start_timeout} s") from exc
                self._actors[i] = _Actor(i, handles[i], spec)
            spec0 = ray.get(specs[0])
            for i, spec in enumerate(ray.get(specs[1:]), 1):
                if spec['obs_space'] != spec0['obs_space'] or spec['act_space'] != spec0['act_space']:
                    raise EnvBuildError(f"RayVectorEnv: actor {i}'s envs have spaces {spec['obs_space']}, "
                                        f"{spec['act_space']}; actor 0's: {spec0['obs_space']}, "
                                        f"{spec0['act_space']}")
        except BaseException:
            self.close()
            raise
        self.single_observation_space = spec0['obs_space']
        self.single_action_space = spec0['act_space']
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = {'autoreset_mode': gym.vector.AutoresetMode.NEXT_STEP}
        self.render_mode = None
        self.closed = False
        self.actor_restarts = 0
        self._by_ref = {}             # pending request -> its actor
        self._stats = dict(results=0, env_steps=0, bytes=0, compute=0.0, round_trip=0.0,
                           in_flight_sum=0, recv_calls=0, wait=0.0)

    # ------------------------------------------------------------------ requests and results
    def _submit(self, actor, method, arg):
        ref = getattr(actor.handle, method).remote(arg)
        if actor.ref is not None:
            self._by_ref.pop(actor.ref, None)
        actor.ref, actor.sent_at = ref, time.perf_counter()
        self._by_ref[ref] = actor

    def _check_open(self):
        if self._closed:
            raise RuntimeError("RayVectorEnv is closed")

    def _lose(self, actor, exc):
        """``actor`` died (or hung, or its env raised): count it, have Ray restart it, reset it."""
        actor.restarts += 1
        actor.dead_tokens.add(actor.token)
        if actor.restarts > self.max_restarts:
            self._fail(actor, exc, f"died {actor.restarts} times, past max_restarts={self.max_restarts}")
        self.actor_restarts += 1
        if not isinstance(exc, RayActorError):
            # Alive but useless (its env raised, or it hangs): Ray restarts it in a fresh process.
            ray.kill(actor.handle, no_restart=False)
        actor.recovering, actor.lost_at = True, time.perf_counter()
        self._submit(actor, 'reset', None)

    def _fail(self, actor, exc, why):
        err = ActorFailedError(f"RayVectorEnv: actor {actor.index} (envs {actor.index * self.envs_per_actor}.."
                               f"{(actor.index + 1) * self.envs_per_actor - 1}, pid {actor.pid} on "
                               f"{actor.host}) {why}: {_describe(exc)}", actor.index)
        actor.error = err
        raise err from exc

    def _take(self, actor):
        """The result of ``actor``'s finished request, or None (then the actor was resubmitted)."""
        ref = actor.ref
        self._by_ref.pop(ref, None)
        actor.ref = None
        try:
            result = ray.get(ref).value
        except RayActorError as exc:
            # Died (ActorDiedError: while running this task, or for good; ActorUnavailableError:
            # Ray is restarting it). Only Ray's actor table tells "for good" apart.
            if isinstance(exc, ActorDiedError) and _actor_state(actor.handle) == 'DEAD':
                self._fail(actor, exc, "died and will not be restarted (Ray's max_restarts="
                           f"{self.max_restarts} spent)")
            if actor.recovering:              # the same death, seen again: ask its next incarnation
                self._submit(actor, 'reset', None)
            else:
                self._lose(actor, exc)
            return None
        except RayTaskError as exc:           # its env (or make_env, on a restart) raised
            self._lose(actor, exc)
            return None
        token = result[0]
        if token in actor.dead_tokens:        # answered by the incarnation we gave up on
            self._submit(actor, 'reset', None)
            return None
        restarted = actor.recovering
        if restarted:
            actor.recovering = False
            actor.token, actor.pid = token, token[1]
        st = self._stats
        st['results'] += 1
        st['env_steps'] += self.envs_per_actor
        st['bytes'] += sum(x.nbytes for x in result[1:6] if x is not None)
        st['compute'] += result[6]
        st['round_trip'] += time.perf_counter() - actor.sent_at
        return result, restarted

    def _deadline(self, actor):
        # Coming back from a death is a process start and a make_env: start_timeout's kind of wait.
        if actor.recovering:
            return actor.lost_at + self.start_timeout
        return actor.sent_at + self.step_timeout

    def _expire(self, now):
        """Treat every actor past its deadline (an answer, or its return after a death) as dead."""
        for actor in list(self._by_ref.values()):
            if now > self._deadline(actor):
                what = (f"come back after a death within start_timeout={self.start_timeout} s" if actor.recovering
                        else f"answer within step_timeout={self.step_timeout} s")
                self._lose(actor, GetTimeoutError(f"did not {what}"))

    def _wait(self, wanted, want_all):
        """Results of ready actors among ``wanted``: [(actor, result, restarted)] (at least one)."""
        out = []
        while True:
            refs = [a.ref for a in wanted if a.ref is not None]
            if not refs:
                return out
            soonest = min(self._deadline(a) for a in wanted if a.ref is not None)
            timeout = None if math.isinf(soonest) else max(0.0, soonest - time.perf_counter()) + 1e-3
            t0 = time.perf_counter()
            ready, _ = ray.wait(refs, num_returns=len(refs) if want_all else 1, timeout=timeout)
            if ready and not want_all and len(refs) > 1:    # and whatever else is ready by now
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            self._stats['wait'] += time.perf_counter() - t0
            for ref in ready:
                actor = self._by_ref.get(ref)
                if actor is None or actor.ref is not ref:
                    continue
                got = self._take(actor)
                if got is not None:
                    out.append((actor,) + got)
            self._expire(time.perf_counter())
            if out and (not want_all or all(a.ref is None for a in wanted)):
                return out

    def _assemble(self, results):
        """Concatenate per-actor results, in the order given, into batched arrays and an info."""
        k = self.envs_per_actor
        obs = np.concatenate([r[1] for _, r, _ in results]) if len(results) > 1 else results[0][1][1]
        reward = np.concatenate([r[2] for _, r, _ in results]).astype(np.float64)
        term = np.concatenate([r[3] for _, r, _ in results])
        trunc = np.concatenate([r[4] for _, r, _ in results])
        restarted = np.repeat(np.array([f for _, _, f in results], bool), k)
        env_id = np.concatenate([np.arange(a.index * k, a.index * k + k) for a, _, _ in results])
        info = {'env_id': env_id, 'restarted': restarted}
        if any(r[5] is not None for _, r, _ in results):
            lives = np.concatenate([r[5] if r[5] is not None else np.full(k, -1) for _, r, _ in results])
            info['lives'] = lives
            info['_lives'] = lives >= 0
        return obs, reward, term, trunc, info

    def _seeds(self, seed):
        if seed is None:
            return [None] * self.num_actors
        if isinstance(seed, (int, np.integer)):
            seed = [int(seed) + i for i in range(self.num_envs)]
        seed = list(seed)
        if len(seed) != self.num_envs:
            raise ValueError(f"seed: {len(seed)} seeds for {self.num_envs} envs")
        k = self.envs_per_actor
        per = [seed[i * k:(i + 1) * k] for i in range(self.num_actors)]
        return [None if all(s is None for s in p) else p for p in per]

    # ------------------------------------------------------------------ sync API
    def reset(self, *, seed=None, options=None):
        """Reset every env; ``(obs (num_envs, ...), info)``. ``seed``: an int (env i gets
        ``seed + i``) or a list of ``num_envs`` seeds (None: unseeded); ``options`` is not used."""
        self._check_open()
        self.async_reset(seed=seed, options=options)
        obs, _, _, _, info = self._collect_all()
        return obs, info

    def step(self, actions):
        """Step every env with ``actions`` (``num_envs``,); the gymnasium 5-tuple, batched, with
        ``info['restarted']`` (and ``info['lives']`` when the envs report lives)."""
        self._check_open()
        actions = np.asarray(actions)
        if actions.shape[:1] != (self.num_envs,):
            raise ValueError(f"actions must have shape ({self.num_envs},), got {actions.shape}")
        self.send(actions, np.arange(self.num_envs))
        return self._collect_all()

    def _collect_all(self):
        results = self._wait(self._actors, want_all=True)
        results.sort(key=lambda r: r[0].index)
        return self._assemble(results)

    # ------------------------------------------------------------------ async API
    def async_reset(self, seed=None, options=None):
        """Start a reset of every env (see :meth:`reset`); the observations come from :meth:`recv`."""
        self._check_open()
        if self._by_ref:      # results in flight are of episodes this reset ends: drop them
            self._wait([a for a in self._actors if a.ref is not None], want_all=True)
        for actor, seeds in zip(self._actors, self._seeds(seed)):
            self._submit(actor, 'reset', seeds)

    def recv(self):
        """The envs of the actors whose results are ready (at least one actor; blocks until then):
        ``(obs (k, ...), reward (k,), terminated (k,), truncated (k,), info)`` with
        ``info['env_id']`` (k,) the envs' global indices and ``info['restarted']`` (k,)."""
        self._check_open()
        if not self._by_ref:
            raise RuntimeError("recv with no request in flight: call async_reset() or send() first")
        st = self._stats
        st['recv_calls'] += 1
        st['in_flight_sum'] += len(self._by_ref)
        return self._assemble(self._wait(self._actors, want_all=False))

    def send(self, actions, env_id=None):
        """Send ``actions`` for the envs ``env_id`` (whole actors' sets, as :meth:`recv` gave them;
        None: all envs)."""
        self._check_open()
        actions = np.asarray(actions)
        k = self.envs_per_actor
        env_id = np.arange(self.num_envs) if env_id is None else np.asarray(env_id, np.int64).reshape(-1)
        if actions.shape[:1] != env_id.shape:
            raise ValueError(f"actions: {actions.shape[0] if actions.ndim else 'a scalar'} actions for "
                             f"{len(env_id)} env_id")
        if len(env_id) % k or len(env_id) == 0:
            raise ValueError(f"env_id must name whole actors' sets of {k} envs, got {len(env_id)} ids")
        groups = env_id.reshape(-1, k)
        first = groups[:, 0]
        if (first % k).any() or (groups != first[:, None] + np.arange(k)).any() \
                or first.min() < 0 or first.max() >= self.num_envs:
            raise ValueError(f"env_id must list whole actors' envs in order (a*{k} .. a*{k}+{k - 1}), "
                             f"got {env_id.tolist()}")
        actors = [self._actors[int(f) // k] for f in first]
        if len(set(a.index for a in actors)) != len(actors):
            raise ValueError(f"env_id names an actor twice: {env_id.tolist()}")
        for a in actors:
            if a.ref is not None:
                raise RuntimeError(f"send for actor {a.index} (envs {a.index * k}..{a.index * k + k - 1}) "
                                   "whose previous request is still in flight: recv() it first")
        per = actions.reshape((len(actors), k) + actions.shape[1:])
        for a, act in zip(actors, per):
            self._submit(a, 'step', _Packet(np.ascontiguousarray(act)))

    # ------------------------------------------------------------------ the rest
    def stats(self):
        """Traffic so far: results (actor steps), env steps, payload bytes per env step, the
        actors' own compute time, the round trip and the transport overhead per env step (s), and
        the mean number of actors in flight at a ``recv``."""
        st = dict(self._stats)
        n = max(st['env_steps'], 1)
        st['bytes_per_step'] = st['bytes'] / n
        st['compute_per_step'] = st['compute'] / n
        st['round_trip_per_step'] = st['round_trip'] / n
        st['overhead_per_step'] = (st['round_trip'] - st['compute']) / n
        st['mean_in_flight'] = st['in_flight_sum'] / st['recv_calls'] if st['recv_calls'] else None
        st['actor_restarts'] = self.actor_restarts
        return st

    def actor_pids(self):
        """``[(host, pid)]`` of each actor's current process (asks the actors; for tests/ops)."""
        self._check_open()
        specs = ray.get([a.handle.spec.remote() for a in self._actors])
        for a, s in zip(self._actors, specs):
            a.pid, a.host, a.node = s['pid'], s['host'], s['node']
        return [(s['host'], s['pid']) for s in specs]

    def actor_nodes(self):
        """Each actor's current Ray node id."""
        self.actor_pids()
        return [a.node for a in self._actors]

    def actor_handles(self):
        """The Ray actor handles (index order)."""
        return [a.handle for a in self._actors]

    def close(self, **kwargs):
        """Kill every actor, wait until Ray reports them dead (and their local processes gone),
        remove the placement group. Idempotent."""
        if self._closed and not self._actors and self._pg is None:
            return
        self._closed = True
        self.closed = True
        actors, self._actors = self._actors, []
        pids = [(a.host, a.pid) for a in actors]
        for a in actors:
            try:
                ray.kill(a.handle, no_restart=True)
            except Exception:
                pass
        deadline = time.monotonic() + 30.0
        for a in actors:               # a request to a killed actor fails once Ray knows it is dead
            while time.monotonic() < deadline:
                try:
                    ray.get(a.handle.spec.remote(), timeout=max(0.1, deadline - time.monotonic()))
                except ActorDiedError:
                    break
                except Exception:
                    continue
        _wait_pids_gone([p for h, p in pids if p is not None and h == socket.gethostname()], deadline)
        if self._pg is not None:
            try:
                remove_placement_group(self._pg)
            except Exception:
                pass
            self._pg = None
        self._by_ref = {}

    def __repr__(self):
        return (f"RayVectorEnv({self.num_actors} actors x {self.envs_per_actor} envs, "
                f"{self.placement}, restarts={getattr(self, 'actor_restarts', 0)})")


def _actor_state(handle):
    """Ray's actor-table state of ``handle`` ('ALIVE', 'RESTARTING', 'DEAD', ...), or None.

    Ray has no public call for it without the dashboard; the GCS actor table behind
    ``ray._private.state`` answers on any cluster (Ray is pinned to 2.60 by the extra).
    """
    try:
        from ray._private import state
        return state.actors(actor_id=handle._actor_id.hex()).get('State')
    except Exception:
        return None


def _describe(exc):
    """``Type: message`` of an error; for an error raised inside an actor, of the original one
    (Ray's error, the one chained, also shows the actor's traceback)."""
    if isinstance(exc, RayTaskError) and isinstance(getattr(exc, 'cause', None), BaseException):
        exc = exc.cause
    return f"{type(exc).__name__}: {exc}"


def _wait_pids_gone(pids, deadline):
    import psutil
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=max(0.0, deadline - time.monotonic()))
