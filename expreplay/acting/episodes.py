"""Episode control and records: where each episode starts, and what became of it.

The acting loop (:class:`expreplay.EnvRunner`) knows nothing about seeds, curricula or saved
emulator states; it asks an *episode-start scheduler* how to start each episode, and hands every
finished episode to a callback as an :class:`EpisodeRecord`. This module holds the small objects
that do those jobs:

* seed schedules: :class:`ProceduralSeeds`, :class:`FixedSeed`, :class:`SeedList`;
* :class:`Curriculum`: reset options as a function of training progress;
* :class:`EpisodeStart` and :class:`RestartPoint` (the values a scheduler returns and
  collects): defined in :mod:`expreplay.acting.starts`, importable from here;
* :class:`RestartPool`: starts a share of the episodes of ALE envs from emulator states saved
  in earlier episodes;
* :class:`EpisodeRecord`, :class:`EpisodeLog` (a crash-safe JSONL writer),
  :func:`read_episode_log` and :class:`EpisodeTotals` (counters for monitors): defined in
  :mod:`expreplay.acting.records`, importable from here.

The scheduler protocol
======================
An episode-start scheduler is any object with::

    start(runner_index, env_index, episode_index) -> EpisodeStart

called by runner ``runner_index`` before it resets sub-environment ``env_index`` for its game
number ``episode_index`` (0 for the first; counted per sub-environment, one per ``reset()``, so a
game of several lives is one episode). It may also have

* ``episode_end(record)``: called with the :class:`EpisodeRecord` of every finished episode;
* ``observe_step(runner_index, env_index, episode_step, snapshot)``: called after every step
  that did not end the game; ``snapshot(include_rng=False)`` returns a :class:`RestartPoint` of
  the sub-environment's current state (only for players that can clone their state: set the
  attribute ``needs_emulator_state = True`` to have runners refuse other players at once).

One scheduler object is usually shared by all runners (a population's ``episode_starts``), so its
methods are called from several simulator threads at once: the built-ins are thread-safe, and
their choices depend only on ``(runner_index, env_index, episode_index)``, never on the order in
which threads call them, which is what makes two runs with the same seeds play the same episodes.

Cost on ALE: a seeded ``reset(seed=...)`` of a gymnasium ALE env reseeds the emulator by
reloading the ROM, measured here at ~0.25 s (Pong) to ~0.33 s (Breakout) against ~10-15 ms for
an unseeded reset (ale-py 0.12.1, 2-core CPU). A schedule that seeds every episode adds that
per episode; for long training runs, the default (only the first reset seeded, the env's RNG
continuing) is reproducible per runner too, just not per episode.

Which resets a scheduler controls: every reset of a single environment, and the first reset of
a vector env (one seed per sub-environment, one ``options`` dict for all) as well as its
resets in gymnasium's DISABLED autoreset mode. A vector env in NEXT_STEP or SAME_STEP mode
resets its sub-environments itself; those episodes are recorded with ``start_kind='autoreset'``
and ``seed=None``, and the scheduler is not consulted for them.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._checks import check_bool, check_int, check_probability, check_real, check_seed
from .records import (EPISODE_LOG_FILENAME, EpisodeLog, EpisodeRecord, EpisodeTotals,  # noqa: F401
                      read_episode_log)
from .starts import EpisodeStart, RestartPoint

__all__ = ['EpisodeStart', 'RestartPoint', 'EpisodeScheduler', 'ProceduralSeeds', 'FixedSeed',
           'SeedList', 'SeedsExhausted', 'Curriculum', 'RestartPool', 'EpisodeRecord',
           'EpisodeLog', 'read_episode_log', 'EpisodeTotals', 'EPISODE_LOG_FILENAME']

# Seeds handed to reset(): below 2**31, so that envs that keep them in a C int accept them too.
_SEED_MASK = 0x7FFFFFFF


class EpisodeScheduler:
    """Base class of the built-in schedulers (documents the protocol; subclassing is optional).

    See the module docstring. ``start`` is required; ``episode_end`` and ``observe_step`` are
    optional hooks (the base class has no ``observe_step``, so runners skip the per-step call).
    """

    needs_emulator_state = False

    def start(self, runner_index: int, env_index: int, episode_index: int) -> EpisodeStart:
        raise NotImplementedError

    def episode_end(self, record: EpisodeRecord) -> None:
        """Called with every finished episode's :class:`EpisodeRecord` (default: nothing)."""


def _check_seed(seed: Any, what: str = 'seed') -> int:
    return check_seed(seed, what, allow_none=False)


def _copy(options):
    # Each episode gets its own dict: envs may modify the one they are given (gymnasium's
    # vector envs pop keys), and the records keep it.
    return None if options is None else dict(options)


def _check_options(options):
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"options must be a dict or None, got {type(options).__name__}")
    return options


# ------------------------------------------------------------------------------ seed schedules
class ProceduralSeeds(EpisodeScheduler):
    """A new seed for every episode, derived from ``base_seed`` and where the episode is played.

    Episode ``e`` of sub-environment ``env_index`` of runner ``runner_index`` is reset with a
    seed drawn from ``numpy.random.SeedSequence([base_seed, runner_index, env_index, e])``: the
    same in every run with the same base seed and runner layout, whatever the thread timing,
    and (with overwhelming probability) different for every episode of the run.

    Args:
        base_seed (int): non-negative.
        options (dict, optional): reset options for every episode.
    """

    def __init__(self, base_seed: int, options: dict[str, Any] | None = None) -> None:
        self.base_seed = _check_seed(base_seed, 'base_seed')
        self.options = _check_options(options)

    def seed_for(self, runner_index: int, env_index: int, episode_index: int) -> int:
        """The seed of that episode (what :meth:`start` uses)."""
        entropy = [self.base_seed, int(runner_index), int(env_index), int(episode_index)]
        return int(np.random.SeedSequence(entropy).generate_state(1)[0]) & _SEED_MASK

    def start(self, runner_index: int, env_index: int, episode_index: int) -> EpisodeStart:
        return EpisodeStart(self.seed_for(runner_index, env_index, episode_index), _copy(self.options))

    def __repr__(self) -> str:
        return f"ProceduralSeeds({self.base_seed})"


class FixedSeed(EpisodeScheduler):
    """The same seed for every episode of every runner (each episode replays the same start).

    Args:
        seed (int): non-negative.
        options (dict, optional): reset options for every episode.
    """

    def __init__(self, seed: int, options: dict[str, Any] | None = None) -> None:
        self.seed = _check_seed(seed)
        self.options = _check_options(options)

    def start(self, runner_index: int, env_index: int, episode_index: int) -> EpisodeStart:
        return EpisodeStart(self.seed, _copy(self.options))

    def __repr__(self) -> str:
        return f"FixedSeed({self.seed})"


class SeedsExhausted(RuntimeError):
    """A :class:`SeedList` with ``cycle=False`` ran out of seeds."""


class SeedList(EpisodeScheduler):
    """Seeds from an explicit list.

    Args:
        seeds (sequence of int): non-negative, at least one.
        cycle (bool): after the last seed start over from the first; False raises
            :class:`SeedsExhausted` from :meth:`start` instead (the runner then fails with it:
            use this to play a fixed evaluation set exactly once).
        shared (bool): False (default): every sub-environment of every runner walks the list
            on its own (its episode ``e`` gets ``seeds[e]``), so the seeds an episode gets do not
            depend on thread timing. True: one cursor for all, each seed handed out once per
            cycle to whichever runner resets next (which runner plays which seed then depends on
            timing, the set of seeds played does not).
        options (dict, optional): reset options for every episode.
    """

    def __init__(self, seeds: Sequence[int], cycle: bool = True, shared: bool = False,
                 options: dict[str, Any] | None = None) -> None:
        self.seeds = [_check_seed(s, f'seeds[{i}]') for i, s in enumerate(seeds)]
        if not self.seeds:
            raise ValueError("seeds is empty")
        self.cycle = check_bool(cycle, 'cycle')
        self.shared = check_bool(shared, 'shared')
        self.options = _check_options(options)
        self._lock = threading.Lock()
        self._cursor = 0

    def start(self, runner_index: int, env_index: int, episode_index: int) -> EpisodeStart:
        if self.shared:
            with self._lock:
                k = self._cursor
                self._cursor += 1
        else:
            k = int(episode_index)
        if k >= len(self.seeds) and not self.cycle:
            who = "all runners" if self.shared else f"runner {runner_index}, env {env_index}"
            raise SeedsExhausted(f"SeedList: all {len(self.seeds)} seeds used ({who}); "
                                 "pass cycle=True to start over")
        return EpisodeStart(self.seeds[k % len(self.seeds)], _copy(self.options))

    def __repr__(self) -> str:
        return f"SeedList({len(self.seeds)} seeds, cycle={self.cycle}, shared={self.shared})"


# ---------------------------------------------------------------------------------- curriculum
class Curriculum(EpisodeScheduler):
    """Reset options that change with training progress.

    Args:
        options: either ``options(progress) -> dict or None``, or a list of stages
            ``[(threshold, options), ...]``: the options of the last stage whose threshold is
            ``<= progress`` (None before the first).
        seeds (scheduler, optional): where the seeds come from (e.g. :class:`ProceduralSeeds`);
            None: reset without a seed.
        count_env_steps (bool): True (default): :attr:`progress` is the number of environment
            steps of the episodes finished so far (added up from the records the runners send to
            :meth:`episode_end`). False: set :attr:`progress` yourself (training steps, epochs, a
            success rate...); it is read at every episode start.

    Options are chosen when an episode starts, so a new stage reaches each sub-environment at
    its next reset. The episode records carry the options each episode was started with.
    """

    def __init__(self, options: Callable[[int], dict[str, Any] | None] | Sequence[tuple[float, Any]],
                 seeds: EpisodeScheduler | None = None, count_env_steps: bool = True) -> None:
        self.stages: list[tuple[float, Any]] | None = None
        self._options_fn: Callable[[Any], Any]
        if callable(options):
            self._options_fn = options
        else:
            stages = sorted(((check_real(t, f'options[{i}] threshold'), _check_options(o))
                             for i, (t, o) in enumerate(options)), key=lambda s: s[0])
            if not stages:
                raise ValueError("options: give a function or at least one (threshold, options) stage")
            self.stages = stages
            self._options_fn = self._stage_options
        self.seeds = seeds
        self.count_env_steps = check_bool(count_env_steps, 'count_env_steps')
        self.progress = 0
        self._lock = threading.Lock()

    def _stage_options(self, progress: int) -> dict[str, Any] | None:
        chosen = None
        for threshold, options in self.stages or ():
            if threshold <= progress:
                chosen = options
        return chosen

    def options_for(self, progress: int) -> dict[str, Any] | None:
        """The reset options at this progress."""
        return _check_options(self._options_fn(progress))

    def start(self, runner_index: int, env_index: int, episode_index: int) -> EpisodeStart:
        seed = None
        if self.seeds is not None:
            seed = self.seeds.start(runner_index, env_index, episode_index).seed
        return EpisodeStart(seed, _copy(self.options_for(self.progress)))

    def episode_end(self, record: EpisodeRecord) -> None:
        if self.count_env_steps:
            with self._lock:
                self.progress += record.length
        hook = getattr(self.seeds, 'episode_end', None)
        if hook is not None:
            hook(record)


# -------------------------------------------------------------------------------- restart pool
class RestartPool(EpisodeScheduler):
    """Starts a share of the episodes of ALE envs from emulator states saved in earlier ones.

    While the runners play, every ``harvest_every``-th step of an episode (steps
    ``harvest_every``, ``2 * harvest_every``, ...; never a game-over step) is cloned
    (``ALEInterface.cloneState``) into the pool, with the frame the runner stored for it. At each
    episode start, with probability ``share`` (when the pool is not empty) the episode starts
    from a pooled state instead: the env is reset as usual (with the seed and options of
    ``base``), then the state is restored (``restoreState``), and the runner starts a new
    episode in the memory whose first frame is the pooled frame. ALE does not restore its screen
    buffer, so rendering after the restore would show the pre-restore screen, and stepping a
    NOOP to get a fresh frame would change the trajectory; the frame saved with the state is
    exactly what the observation pipeline produced for it. Such episodes are recorded with
    ``start_kind='restart'`` and ``restored_from`` (the point's origin); their score and length
    count from the restart point, and time-limit wrappers count from it too (they are reset).

    Args:
        share (float): probability in [0, 1] that an episode starts from the pool.
        capacity (int): states kept; when full, the oldest is dropped (states stay as fresh as
            the policy that reached them).
        harvest_every (int): clone a state every this many steps of each episode.
        base (scheduler, optional): seeds and options of the resets (of plain starts, and of
            the reset that precedes a restore); None: reset without a seed.
        include_rng (bool): clone the emulator's RNG with the state (``cloneState(include_rng=)``).
            Measured on ale-py 0.12.1 with sticky actions (``repeat_action_probability > 0``):
            True makes a restart replay the original's sticky-action draws exactly, so every
            restart from one point repeats the same randomness; False (default) restores the
            game state only, and the env's own RNG (seeded by the reset) decides, so restarts
            from one point diverge. Without sticky actions both replay the same frames.
        seed (int): seeds the start decisions: whether episode ``e`` of ``(runner, env)``
            restarts, and from which pool entry, are drawn from ``(seed, runner, env, e)``.
            (The pool's content still depends on thread timing when several runners share it.)

    Only single gymnasium ALE envs (``player.unwrapped.ale``) are supported: a runner with
    another player refuses this scheduler with TypeError. All runners sharing a pool must play
    the same game (mode and difficulty). Thread-safe.

    Attributes:
        harvested (int): states added so far.
        restarts (int): episodes started from the pool so far.
    """

    needs_emulator_state = True

    def __init__(self, share: float = 0.25, capacity: int = 64, harvest_every: int = 100,
                 base: Any = None, include_rng: bool = False, seed: int = 0) -> None:
        self.share = check_probability(share, 'share')
        self.capacity = check_int(capacity, 'capacity', 1, allow_float=True)
        self.harvest_every = check_int(harvest_every, 'harvest_every', 1, allow_float=True)
        self.base = base
        self.include_rng = check_bool(include_rng, 'include_rng')
        self.seed = _check_seed(seed)
        self._pool: collections.deque[RestartPoint] = collections.deque(maxlen=self.capacity)
        self._lock = threading.Lock()
        self.harvested = 0
        self.restarts = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._pool)

    def points(self) -> list[RestartPoint]:
        """A list of the pooled :class:`RestartPoint` s, oldest first."""
        with self._lock:
            return list(self._pool)

    def add(self, point: RestartPoint) -> None:
        """Put a :class:`RestartPoint` into the pool (the oldest goes when it is full)."""
        if not isinstance(point, RestartPoint):
            raise TypeError(f"expected a RestartPoint, got {type(point).__name__}")
        with self._lock:
            self._pool.append(point)
            self.harvested += 1

    def clear(self) -> None:
        """Empty the pool."""
        with self._lock:
            self._pool.clear()

    def start(self, runner_index: int, env_index: int, episode_index: int) -> EpisodeStart:
        plain = (self.base.start(runner_index, env_index, episode_index)
                 if self.base is not None else EpisodeStart())
        if self.share <= 0.0:
            return plain
        rng = np.random.default_rng([self.seed, int(runner_index), int(env_index), int(episode_index)])
        if rng.random() >= self.share:
            return plain
        with self._lock:
            if not self._pool:
                return plain
            point = self._pool[int(rng.integers(len(self._pool)))]
            self.restarts += 1
        return EpisodeStart(plain.seed, plain.options, 'restart', point)

    def observe_step(self, runner_index: int, env_index: int, episode_step: int,
                     snapshot: Callable[..., RestartPoint]) -> None:
        if episode_step % self.harvest_every == 0:
            self.add(snapshot(include_rng=self.include_rng))

    def episode_end(self, record: EpisodeRecord) -> None:
        hook = getattr(self.base, 'episode_end', None)
        if hook is not None:
            hook(record)

    def __repr__(self) -> str:
        return (f"RestartPool(share={self.share}, capacity={self.capacity}, "
                f"harvest_every={self.harvest_every}, {len(self)} states)")
