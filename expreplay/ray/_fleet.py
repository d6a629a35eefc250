"""The driver's side of the env actors: starting them, their requests in flight, and the restart
and timeout policy that turns a dead, failing or hung actor into a restarted one (or, past its
budget, into :class:`~expreplay.ray.ActorFailedError`).

:class:`ActorFleet` owns the actors of one :class:`~expreplay.ray.RayVectorEnv`; each
:class:`Actor` keeps where one of them is up to; :class:`Traffic` counts what came back.
"""

import math
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ..stats import RayTrafficStats
from ._host import EnvHost, Packet, Result
from .errors import ActorFailedError, EnvBuildError


class Actor:
    """Where one actor is up to, as the driver sees it: its pending request, its incarnation
    (results of one given up on are dropped), whether it is coming back from a death."""

    __slots__ = ('index', 'handle', 'ref', 'sent_at', 'token', 'dead_tokens', 'recovering',
                 'lost_at', 'restarts', 'pid', 'host', 'node')

    def __init__(self, index: int, handle: Any) -> None:
        self.index, self.handle = index, handle
        self.ref: Any = None          # the pending request, if any
        self.sent_at = 0.0
        self.token: Any = None
        self.dead_tokens: set[Any] = set()
        self.recovering = False       # died; a reset of its new incarnation is pending
        self.lost_at = 0.0
        self.restarts = 0
        self.pid: int | None = None   # as last seen
        self.host: str | None = None
        self.node: str | None = None

    def seen(self, spec: dict[str, Any]) -> None:
        """Record where the actor runs, from its ``spec()``."""
        self.pid, self.host, self.node = spec['pid'], spec['host'], spec['node']
        if spec.get('token') is not None and self.token is None:
            self.token = spec['token']

    def sent(self, ref: Any) -> None:
        self.ref, self.sent_at = ref, time.perf_counter()

    def taken(self) -> Any:
        """The pending request, now no longer pending."""
        ref, self.ref = self.ref, None
        return ref

    def died(self) -> int:
        """Count a death (its current incarnation is given up on); the deaths so far."""
        self.restarts += 1
        self.dead_tokens.add(self.token)
        return self.restarts

    def start_recovery(self) -> None:
        self.recovering, self.lost_at = True, time.perf_counter()

    def came_back(self, token: Any) -> None:
        """The first result of a new incarnation arrived (``token`` names it)."""
        self.recovering = False
        self.token, self.pid = token, token[1]

    def deadline(self, step_timeout: float, start_timeout: float) -> float:
        # Coming back from a death is a process start and a make_env: start_timeout's kind of wait.
        if self.recovering:
            return self.lost_at + start_timeout
        return self.sent_at + step_timeout


class Traffic:
    """What the actors' results carried and cost, summed (each sum is documented as the
    :class:`~expreplay.stats.RayTrafficStats` field of its name)."""

    def __init__(self) -> None:
        self.results = 0
        self.env_steps = 0
        self.bytes = 0
        self.compute = 0.0
        self.round_trip = 0.0
        self.in_flight_sum = 0
        self.recv_calls = 0
        self.wait = 0.0

    def result(self, envs: int, result: Result, sent_at: float) -> None:
        self.results += 1
        self.env_steps += envs
        self.bytes += sum(x.nbytes for x in result[1:6] if x is not None)
        self.compute += result[6]
        self.round_trip += time.perf_counter() - sent_at

    def recv(self, in_flight: int) -> None:
        self.recv_calls += 1
        self.in_flight_sum += in_flight

    def waited(self, seconds: float) -> None:
        self.wait += seconds

    def report(self, actor_restarts: int) -> RayTrafficStats:
        """The sums, their means per env step and per ``recv``, and ``actor_restarts`` (the
        fleet's owner counts those)."""
        steps = max(self.env_steps, 1)
        return RayTrafficStats(
            results=self.results, env_steps=self.env_steps, bytes=self.bytes,
            compute=self.compute, round_trip=self.round_trip,
            in_flight_sum=self.in_flight_sum, recv_calls=self.recv_calls, wait=self.wait,
            bytes_per_step=self.bytes / steps, compute_per_step=self.compute / steps,
            round_trip_per_step=self.round_trip / steps,
            overhead_per_step=(self.round_trip - self.compute) / steps,
            mean_in_flight=self.in_flight_sum / self.recv_calls if self.recv_calls else None,
            actor_restarts=actor_restarts)


class ActorFleet:
    """The env actors of one RayVectorEnv, one placement-group bundle each (the arguments are
    RayVectorEnv's). On a failure to start, what was started is removed before the error is
    raised."""

    def __init__(self, make_env: Callable[..., Any], num_actors: int, envs_per_actor: int, *,
                 cpus: float, max_restarts: int, step_timeout: float, start_timeout: float,
                 placement: str) -> None:
        self.envs_per_actor = envs_per_actor
        self.max_restarts = max_restarts
        self.step_timeout, self.start_timeout = step_timeout, start_timeout
        self.actors: list[Actor] = []
        self.restarts = 0              # of all actors
        self.traffic = Traffic()
        self._by_ref: dict[Any, Actor] = {}   # pending request -> its actor
        self._pg: PlacementGroup | None = None
        try:
            self._pg = self._reserve(num_actors, cpus, placement)
            self.spaces = self._start(make_env, self._pg, num_actors, cpus)
        except BaseException:
            self.close()
            raise

    def _reserve(self, n: int, cpus: float, placement: str) -> PlacementGroup:
        pg = placement_group([{'CPU': cpus}] * n, strategy=placement)
        try:
            ray.get(pg.ready(), timeout=_seconds(self.start_timeout))
        except GetTimeoutError as exc:
            remove_placement_group(pg)
            raise RuntimeError(f"RayVectorEnv: the cluster did not grant {n} bundles of "
                               f"{cpus} CPU ({placement}) within start_timeout={self.start_timeout} s "
                               f"(available: {ray.available_resources()})") from exc
        return pg

    def _start(self, make_env: Callable[..., Any], pg: PlacementGroup, n: int,
               cpus: float) -> tuple[Any, Any]:
        """Start the actors; their envs' (observation space, action space)."""
        k = self.envs_per_actor
        remote: Any = ray.remote(EnvHost)
        self.actors = [Actor(i, remote.options(
            num_cpus=cpus, max_restarts=self.max_restarts, max_task_retries=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
        ).remote(make_env, i * k, k)) for i in range(n)]
        specs = [a.handle.spec.remote() for a in self.actors]
        for actor, ref in zip(self.actors, specs):
            i = actor.index
            try:
                actor.seen(ray.get(ref, timeout=_seconds(self.start_timeout)))
            except RayTaskError as exc:   # chained to Ray's error: it carries the actor's traceback
                raise EnvBuildError(f"RayVectorEnv: make_env failed in actor {i} (envs "
                                    f"{i * k}..{i * k + k - 1}): {describe(exc)}") from exc
            except RayActorError as exc:      # e.g. make_env could not be unpickled there
                raise EnvBuildError(f"RayVectorEnv: actor {i} (envs {i * k}..{i * k + k - 1}) "
                                    f"failed to start: {exc}") from exc
            except GetTimeoutError as exc:
                raise RuntimeError(f"RayVectorEnv: actor {i} did not start within "
                                   f"start_timeout={self.start_timeout} s") from exc
        spec0 = ray.get(specs[0])
        for i, spec in enumerate(ray.get(specs[1:]), 1):
            if spec['obs_space'] != spec0['obs_space'] or spec['act_space'] != spec0['act_space']:
                raise EnvBuildError(f"RayVectorEnv: actor {i}'s envs have spaces {spec['obs_space']}, "
                                    f"{spec['act_space']}; actor 0's: {spec0['obs_space']}, "
                                    f"{spec0['act_space']}")
        return spec0['obs_space'], spec0['act_space']

    # ------------------------------------------------------------------ requests and results
    @property
    def in_flight(self) -> int:
        """Requests sent and not yet taken."""
        return len(self._by_ref)

    def submit(self, actor: Actor, method: str, arg: Any) -> None:
        """Send ``actor`` a request (``'reset'`` or ``'step'``), replacing any pending one."""
        ref = getattr(actor.handle, method).remote(arg)
        if actor.ref is not None:
            self._by_ref.pop(actor.ref, None)
        actor.sent(ref)
        self._by_ref[ref] = actor

    def _lose(self, actor: Actor, exc: BaseException) -> None:
        """``actor`` died (or hung, or its env raised): count it, have Ray restart it, reset it."""
        if actor.died() > self.max_restarts:
            self._fail(actor, exc, f"died {actor.restarts} times, past max_restarts={self.max_restarts}")
        self.restarts += 1
        if not isinstance(exc, RayActorError):
            # Alive but useless (its env raised, or it hangs): Ray restarts it in a fresh process.
            ray.kill(actor.handle, no_restart=False)
        actor.start_recovery()
        self.submit(actor, 'reset', None)

    def _fail(self, actor: Actor, exc: BaseException, why: str) -> None:
        k = self.envs_per_actor
        raise ActorFailedError(f"RayVectorEnv: actor {actor.index} (envs {actor.index * k}.."
                               f"{(actor.index + 1) * k - 1}, pid {actor.pid} on "
                               f"{actor.host}) {why}: {describe(exc)}", actor.index) from exc

    def _take(self, actor: Actor) -> tuple[Result, bool] | None:
        """The result of ``actor``'s finished request and whether the actor came back from a death
        with it, or None (then the actor was resubmitted)."""
        ref = actor.taken()
        self._by_ref.pop(ref, None)
        try:
            result = ray.get(ref).value
        except RayActorError as exc:
            # Died (ActorDiedError: while running this task, or for good; ActorUnavailableError:
            # Ray is restarting it). Only Ray's actor table tells "for good" apart.
            if isinstance(exc, ActorDiedError) and _actor_state(actor.handle) == 'DEAD':
                self._fail(actor, exc, "died and will not be restarted (Ray's max_restarts="
                           f"{self.max_restarts} spent)")
            if actor.recovering:              # the same death, seen again: ask its next incarnation
                self.submit(actor, 'reset', None)
            else:
                self._lose(actor, exc)
            return None
        except RayTaskError as exc:           # its env (or make_env, on a restart) raised
            self._lose(actor, exc)
            return None
        token = result[0]
        if token in actor.dead_tokens:        # answered by the incarnation we gave up on
            self.submit(actor, 'reset', None)
            return None
        restarted = actor.recovering
        if restarted:
            actor.came_back(token)
        self.traffic.result(self.envs_per_actor, result, actor.sent_at)
        return result, restarted

    def _deadline(self, actor: Actor) -> float:
        return actor.deadline(self.step_timeout, self.start_timeout)

    def _expire(self, now: float) -> None:
        """Treat every actor past its deadline (an answer, or its return after a death) as dead."""
        for actor in list(self._by_ref.values()):
            if now > self._deadline(actor):
                what = (f"come back after a death within start_timeout={self.start_timeout} s" if actor.recovering
                        else f"answer within step_timeout={self.step_timeout} s")
                self._lose(actor, GetTimeoutError(f"did not {what}"))

    def wait(self, wanted: Sequence[Actor], want_all: bool) -> list[tuple[Actor, Result, bool]]:
        """Results of ready actors among ``wanted``: ``[(actor, result, restarted)]``, at least
        one (all of ``wanted`` with ``want_all``); dead or hung actors are restarted meanwhile."""
        out: list[tuple[Actor, Result, bool]] = []
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
            self.traffic.waited(time.perf_counter() - t0)
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

    def drain(self) -> None:
        """Wait for (and drop) every result in flight."""
        if self._by_ref:
            self.wait([a for a in self.actors if a.ref is not None], want_all=True)

    def refresh(self) -> list[dict[str, Any]]:
        """Ask every actor where it runs now; their ``spec()`` answers (index order)."""
        specs = ray.get([a.handle.spec.remote() for a in self.actors])
        for a, spec in zip(self.actors, specs):
            a.seen(spec)
        return specs

    def close(self) -> None:
        """Kill every actor, wait until Ray reports them dead (and their local processes gone),
        remove the placement group. Idempotent."""
        actors, self.actors = self.actors, []
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


def _seconds(timeout: float) -> float | None:
    """A timeout as ``ray.get`` takes it (None: no limit)."""
    return None if math.isinf(timeout) else timeout


def _actor_state(handle: Any) -> str | None:
    """Ray's actor-table state of ``handle`` ('ALIVE', 'RESTARTING', 'DEAD', ...), or None.

    Ray has no public call for it without the dashboard; the GCS actor table behind
    ``ray._private.state`` answers on any cluster (Ray is pinned to 2.60 by the extra).
    """
    try:
        from ray._private import state
        return state.actors(actor_id=handle._actor_id.hex()).get('State')
    except Exception:
        return None


def describe(exc: BaseException) -> str:
    """``Type: message`` of an error; for an error raised inside an actor, of the original one
    (Ray's error, the one chained, also shows the actor's traceback)."""
    if isinstance(exc, RayTaskError) and isinstance(getattr(exc, 'cause', None), BaseException):
        exc = exc.cause
    return f"{type(exc).__name__}: {exc}"


def _wait_pids_gone(pids: Sequence[int], deadline: float) -> None:
    import psutil
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=max(0.0, deadline - time.monotonic()))
