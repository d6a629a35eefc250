"""EnvRunner: one environment stepped epsilon-greedily, every step written to a replay memory.

:class:`EnvRunner` is what a user builds and hands to a manager: one environment (a single env,
or a vector env's sub-envs, behind its adapter), its configuration, its exploration RNG and its
counters (steps, games, starts, restarts). Like the actors of Acme or CleanRL, it knows nothing
about how transitions are stored or batched, nor which group steps it: an
:class:`~expreplay.acting.group.ActingGroup` (built by an
:class:`~expreplay.acting.manager.EnvRunnerManager`, or by whoever steps runners directly) owns
the lanes of the runners it steps and their stepping state, and tells each runner what happened
to its envs. This module imports no other part of the acting layer but the env adapters and
the settings record.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .._checks import check_callable, check_int
from .envs import adapt_env
from .settings import RunnerSettings, check_settings

__all__ = ['EnvRunner', 'MAX_KEPT_GAMES']

logger = logging.getLogger(__name__)

# Finished-game records kept until they are read (``reset_stats``, ``pop_games``): a loop that
# never reads them must not grow without bound. Past this many the oldest half is dropped.
MAX_KEPT_GAMES = 10_000


def _append_bounded(records: list[Any], item: Any) -> None:
    records.append(item)
    if len(records) > MAX_KEPT_GAMES:
        del records[:len(records) - MAX_KEPT_GAMES // 2]


class EnvRunner:
    """One environment stepped epsilon-greedily, every step written to a replay memory.

    Args:
        player: a gymnasium ``Env``, an old-gym-API env (``reset() -> obs``, 4-tuple ``step``),
            a gymnasium ``VectorEnv`` such as ``ale_py.vector_env.AtariVectorEnv``
            (``stack_num=1``, ``batch_size == num_envs``) or a synchronous EnvPool, or an
            asynchronous engine (EnvPool with ``batch_size < num_envs``,
            :class:`expreplay.ray.RayVectorEnv`). A vector env's sub-environments are acted on
            with one predictor call per step and each writes its own memory lane. Anything
            else raises TypeError naming ``player``.
        predictor: ``predictor(states)`` returning the Q-values ``(n, num_actions)``, or
            tensorpack's ``[Q-values, ...]``: states ``(n, *state_shape, history_len)`` in the
            memory's dtype, channels-last, oldest frame first, zeros before the episode's first
            frame. Q-values of another shape, not numbers, or not finite raise
            :class:`PredictorError`. A group stepped directly calls it from the calling thread;
            a manager from one thread at a time. None is allowed when exploration is always 1.
        memory: a :class:`expreplay.ReplayMemory`.
        history_len (int): frames per state; must equal the memory's.
        settings (RunnerSettings, optional): ``life_loss_terminal``, ``num_actions`` and
            ``close_player``, documented at :class:`~expreplay.acting.settings.RunnerSettings`;
            None: its defaults. Anything else raises TypeError.
        seed (int, optional): base seed. The first reset is seeded with ``seed + index``
            (``seed + index * num_envs`` for a vector env, whose sub-envs take consecutive
            seeds); later resets continue each env's own random sequence. The exploration RNG
            is seeded from ``(seed, index)``. None: not reproducible.
        index (int): this runner's index among its siblings (seeding, names, messages).
        player_factory (callable, optional): builds a fresh player; used by :meth:`restart`
            (the manager's ``max_restarts``) to replace an env that raised. Without it a
            restart resets the same player.
        episode_starts (optional): an episode-start scheduler (see :mod:`expreplay.acting.episodes`):
            ``episode_starts.start(index, env_index, episode_index)`` decides the seed, reset
            options and possibly a saved state to restore for every reset this runner controls
            (then ``seed`` seeds only the exploration). None: the behaviour described at
            ``seed``.
        on_episode_end (callable, optional): called with the
            :class:`~expreplay.acting.episodes.EpisodeRecord` of every finished game (all lives),
            from the thread that steps this runner, after the step is in the memory.

    Attributes:
        settings (RunnerSettings): the settings it acts with.
        total_scores (list): score of every game finished (all lives), oldest first; emptied by
            :meth:`EnvRunnerManager.reset_stats` (at most the newest ``MAX_KEPT_GAMES`` kept).
        steps (int): environment steps taken and stored (all sub-environments, every group
            that stepped this runner).
        restarts (int): how many times :meth:`restart` replaced or reset the env.

    A runner is stepped by an :class:`~expreplay.acting.group.ActingGroup`, one group at a time
    (an :class:`~expreplay.acting.manager.EnvRunnerManager` builds them; to step runners
    without one, ``ActingGroup([runner, ...]).step(exploration)``). A failed step (the env
    raised, or returned an observation the memory can not store) ends the runner's episodes
    where they are in the memory (every step stored before stays sampleable, nothing is
    stitched across the gap) and raises :class:`EnvError`; the group's next step resets the
    env.
    """

    def __init__(self, player: Any, predictor: Callable[[np.ndarray], Any] | None, memory: Any,
                 history_len: int, *, settings: RunnerSettings | None = None,
                 seed: int | None = None, index: int = 0,
                 player_factory: Callable[[], Any] | None = None, episode_starts: Any = None,
                 on_episode_end: Callable[[Any], Any] | None = None) -> None:
        if not callable(getattr(memory, 'new_batch_writer', None)) or getattr(memory, 'state_shape', None) is None:
            raise TypeError(f"memory must be a ReplayMemory (with new_batch_writer() and state_shape), "
                            f"got {type(memory).__name__}")
        if getattr(memory, 'extra_fields', None):
            # The acting path writes frames, actions, rewards and ends only: a memory that
            # wants more per step would refuse the first one.
            raise ValueError(f"memory has extra_fields {sorted(memory.extra_fields)}, which an "
                             "EnvRunner does not write; write such a memory with its writers "
                             "(new_writer / new_batch_writer, extras=...)")
        self.memory = memory
        self.history_len = check_int(history_len, 'history_len', 1)
        if memory.history_len != self.history_len:
            raise ValueError(f"history_len={history_len} differs from the memory's "
                             f"history_len={memory.history_len}")
        self.predictor = check_callable(predictor, 'predictor', allow_none=True)
        self.index = check_int(index, 'index', 0)
        # Envs take non-negative seeds (gymnasium refuses others at the first reset).
        self._seed = None if seed is None else check_int(seed, 'seed', 0)
        self.settings = check_settings(settings, RunnerSettings, 'settings')
        if episode_starts is not None and not callable(getattr(episode_starts, 'start', None)):
            raise TypeError(f"episode_starts must have a start(runner_index, env_index, "
                            f"episode_index) method, got {type(episode_starts).__name__}")
        self.episode_starts = episode_starts
        self.on_episode_end = check_callable(on_episode_end, 'on_episode_end', allow_none=True)
        self._player_factory = check_callable(player_factory, 'player_factory', allow_none=True)
        # True once the seeded first reset is done; a scheduler decides the seeds itself.
        self._seeded = self._seed is None or episode_starts is not None
        # The exploration draws: this runner's own stream, whatever group it is stepped in.
        # SeedSequence takes non-negative entropy; (seed, index) keeps runners' streams apart.
        self._rng = np.random.default_rng(None if self._seed is None else [abs(self._seed), self.index])

        self.total_scores: list[float] = []
        self.steps = 0                # counted by count_steps(), as the groups store them
        self.restarts = 0
        self._games: list[tuple[float, int]] = []    # (score, length) since the last pop_games()
        self._stats_lock = threading.Lock()
        self.episodes_started: dict[str, int] = {}   # per start kind; see start_counts()
        self._closed = False
        self.num_envs = 0             # set with the player, by _attach
        self._attach(player, first=True)

    def _attach(self, player: Any, first: bool = False) -> None:
        adapter = adapt_env(player)
        if not first and adapter.num_envs != self.num_envs:
            raise ValueError(f"player_factory built a player with {adapter.num_envs} sub-envs, "
                             f"the runner was built for {self.num_envs}")
        if not first and adapter.stepping is not self.adapter.stepping:
            # The group that steps this runner was built for its kind's stepping.
            raise ValueError(f"player_factory built a player of another kind "
                             f"({type(adapter).__name__}, the runner was built for "
                             f"{type(self.adapter).__name__})")
        n_act = self.settings.num_actions if self.settings.num_actions is not None else adapter.num_actions
        if n_act is None:
            raise TypeError(f"player {type(player).__name__} has no Discrete action space; "
                            "pass settings=RunnerSettings(num_actions=...)")
        if getattr(self.episode_starts, 'needs_emulator_state', False) and not adapter.can_clone_state:
            raise TypeError(f"episode_starts={self.episode_starts!r} restores emulator states, which "
                            f"player {type(player).__name__} can not do (a single gymnasium ALE env "
                            "with `unwrapped.ale` can)")
        self.player = player
        # The player behind the acting interface (expreplay.acting.envs); read on every step,
        # hence an attribute, replaced only here. Typed Any: besides EnvAdapter's interface it
        # has the calls of its kind (step_one for a single env, recv / send when asynchronous),
        # which its stepping (adapter.stepping, built by the acting group) makes.
        self.adapter: Any = adapter
        self.num_envs = adapter.num_envs
        self.num_actions = int(n_act)

    @property
    def life_loss_terminal(self) -> bool:
        """Whether a lost life is stored as a terminal step (the settings' ``life_loss_terminal``)."""
        return self.settings.life_loss_terminal

    def __repr__(self) -> str:
        return f"EnvRunner(index={self.index}, player={type(self.player).__name__}, num_envs={self.num_envs})"

    @property
    def rng(self) -> np.random.Generator:
        """The exploration draws: this runner's own stream, whatever group steps it."""
        return self._rng

    @property
    def is_async(self) -> bool:
        """True for an asynchronous engine (``recv``/``send``)."""
        return self.adapter.is_async

    @property
    def is_vector(self) -> bool:
        """True unless the player is one synchronous env stepped one call at a time, pooled
        with other such runners (its adapter's :class:`~expreplay.acting.envs.Stepping` says)."""
        return not self.adapter.stepping.pools_runners

    def take_first_seed(self) -> int | None:
        """The seed of this runner's first reset (``seed + index * num_envs``) the first time,
        None afterwards and when a scheduler decides the seeds."""
        if self._seeded:
            return None
        self._seeded = True
        assert self._seed is not None
        return self._seed + self.index * self.num_envs

    # ------------------------------------------------------------------ acting
    def step(self, exploration: float) -> None:
        """Not how a runner is stepped (tensorpack's name, kept to say so): raises TypeError.

        A runner is stepped by an :class:`~expreplay.acting.group.ActingGroup`, which owns the
        lanes and the stepping state of the runners it steps:
        ``ActingGroup([runner]).step(exploration)`` (one group, kept and stepped again), or
        ``EnvRunnerManager([runner], maximum_staleness).step(exploration)`` (inline, no threads).
        """
        raise TypeError(f"{self!r}: EnvRunner.step is gone; a runner is stepped by an acting "
                        "group: group = expreplay.acting.ActingGroup([runner]) once, then "
                        "group.step(exploration), or an EnvRunnerManager([runner], ...)")

    # ------------------------------------------------------------------ counters
    def count_steps(self, n: int) -> None:
        """``n`` more steps of this runner's envs are stored (the acting group tells)."""
        self.steps += n

    @staticmethod
    def count_step_of(runners: Sequence[EnvRunner], positions: Iterable[int]) -> None:
        """One more step of ``runners[k]`` for each ``k`` of ``positions`` is stored (named twice:
        two): what an acting group tells, in one call per step rather than one per runner."""
        for k in positions:
            runners[k].steps += 1

    def record_game(self, score: float, length: int) -> None:
        """A game ended with ``score`` after ``length`` steps (the acting group tells). Thread-safe."""
        with self._stats_lock:
            _append_bounded(self.total_scores, float(score))
            _append_bounded(self._games, (float(score), int(length)))

    def count_start(self, kind: str) -> None:
        """An episode started as ``kind`` (the acting group tells). Thread-safe."""
        with self._stats_lock:
            self.episodes_started[kind] = self.episodes_started.get(kind, 0) + 1

    def pop_games(self, clear_total_scores: bool = False) -> list[tuple[float, int]]:
        """``[(score, length), ...]`` of the games finished since the last call, forgotten here.
        ``clear_total_scores`` also empties :attr:`total_scores`. Thread-safe."""
        with self._stats_lock:
            games, self._games = self._games, []
            if clear_total_scores:
                self.total_scores.clear()
        return games

    def start_counts(self) -> dict[str, int]:
        """Episodes started so far per start kind (``'reset'``, ``'restart'``, ``'autoreset'``,
        ...): a copy. Thread-safe."""
        with self._stats_lock:
            return dict(self.episodes_started)

    # ------------------------------------------------------------------ management
    def restart(self) -> None:
        """Recover from an :class:`EnvError`: replace the player (``player_factory``) or reset it.

        The open episodes stay in the memory as they are (every step taken is kept): the group
        whose step raised the :class:`EnvError` ended them there, and its next step of this
        runner resets the env (the new player).
        """
        if self._player_factory is not None:
            try:
                self.adapter.close()
            except Exception as err:  # the broken env may fail to close too; keep going
                logger.warning("closing the failed player of runner %d raised %r", self.index, err)
            self._attach(self._player_factory())
        self.restarts += 1

    def close(self) -> None:
        """Close the player (the settings' ``close_player``). Idempotent. The memory is the
        group's to let go (:meth:`ActingGroup.close <expreplay.acting.group.ActingGroup.close>`)."""
        if self._closed:
            return
        self._closed = True
        if self.settings.close_player:
            try:
                self.adapter.close()
            except Exception as err:
                logger.warning("closing the player of runner %d raised %r", self.index, err)
