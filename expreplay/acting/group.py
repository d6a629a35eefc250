"""ActingGroup: the one acting path, several runners' sub-envs stepped as one batch.

An :class:`ActingGroup` steps the sub-environments of a set of runners (the sub-envs of a
vector env, several single-env runners, or both) as one batch of *lanes*: per step one draw of
the exploration randoms, one gather of the greedy states, one predictor call, and one
vectorized write of all the lanes' steps into the memory. Per-env Python is left only where it
cannot be avoided: a single env's own ``step()`` / ``reset()`` call, and an episode's end.

A step has two halves, :meth:`ActingGroup.begin` (choose the random actions, return the states
that need Q-values) and :meth:`ActingGroup.finish` (act with the Q-values, store the steps), so
that a manager can put the forward pass of one group between the halves of another's
(:mod:`expreplay.acting.manager`).

The group drives a step and tells each runner what happened to its envs (steps stored, games
ended and started, episode records, the steps a scheduler observes); the objects it is made of
do the rest, one job each: the stepping of its runners' env kind
(:class:`~expreplay.acting.envs.Stepping`, which the runners' adapters name: the env calls of a
step, e.g. an asynchronous engine's ``begin`` receives the ready sub-envs' results and its
``finish`` sends their next actions), :class:`~expreplay.acting.policy.EpsilonGreedy` (the
draws and the Q-values), :class:`~expreplay.acting.lanes.LaneEpisodes` (episodes and the memory
writes, the only part that knows how steps are stored; it knows lanes, not runners) and
:class:`LaneResets` (the env calls that start episodes: resets, scheduled starts, restored
states). The group never asks which kind of env it steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .envs import NO_LIVES, FrameFormat, Results
from .lanes import EndedGame, LaneEpisodes
from .policy import EpsilonGreedy, as_q_values, check_q_values, explorations
from .records import EpisodeRecord, make_record
from .runner import EnvRunner
from .starts import EpisodeStart, RestartPoint
from ..errors import EnvError, PredictorError
# The memory's rules for rewards and frames, on a whole step at once.
from ..storage._inputs import check_rewards, unstorable_rewards

__all__ = ['ActingGroup', 'check_q_values', 'as_q_values']

# What finish() returns: the runners whose env failed, with the error.
Failures = list[tuple[EnvRunner, EnvError]]

# How episodes start when no scheduler decides: an unseeded reset, or the env's own autoreset.
PLAIN_RESET = EpisodeStart()
AUTORESET = EpisodeStart(kind='autoreset')

# New episodes for the group's lanes: (lanes, first frames, lives, one EpisodeStart per lane).
Starts = tuple[np.ndarray, np.ndarray, np.ndarray, list[EpisodeStart]]


class ActingGroup:
    """Steps the sub-environments of several runners as one batch of lanes.

    Lane ``runner_lanes[r][i]`` is sub-env ``i`` of ``runners[r]``; each lane writes its own
    memory lane, and has its frame history, score, length and lives in arrays over all lanes.
    The runners must share the memory, the history length, the predictor, the number of
    actions and their adapters' stepping (:class:`~expreplay.acting.envs.Stepping`: one env
    kind per group; a kind whose stepping says ``one_runner``, an asynchronous engine, is a
    group of its own). Building the group changes no
    runner; its first step of each runner resets the env. A runner is stepped by one group at a
    time: whoever builds groups (an :class:`~expreplay.acting.manager.EnvRunnerManager`, or a
    caller stepping runners directly, ``ActingGroup([runner]).step(exploration)``) closes a
    group before its runners go to another (whose first step starts new episodes; the steps
    the runner counts go on).

    :meth:`begin` / :meth:`finish` step a subset of the runners (``members``, indices into
    :attr:`runners`), so that a manager with fewer requests than runners steps only some.
    Failures of single runners are returned by :meth:`finish` (their runners need a reset;
    the other members' steps are stored); the predictor's are raised. Use from one thread.

    The group owns the lane map (which lanes are whose sub-envs) and the stepping state of the
    envs it steps, by runner position (the index into :attr:`runners`): reset flags
    (:meth:`needs_reset`, :meth:`request_reset`) and the steps stored by all of them
    (:attr:`inserted`); it tells each runner the steps, games and starts of its envs.
    """

    def __init__(self, runners: Iterable[EnvRunner]) -> None:
        runners = list(runners)
        if not runners:
            raise ValueError("an ActingGroup needs a runner")
        if len({id(r) for r in runners}) != len(runners):
            raise ValueError("an ActingGroup's runners must be distinct")
        first = runners[0]
        stepping = first.adapter.stepping
        for r in runners[1:]:
            if r.memory is not first.memory or r.history_len != first.history_len \
                    or r.predictor is not first.predictor or r.num_actions != first.num_actions:
                raise ValueError("an ActingGroup's runners must share the memory, history_len, "
                                 "predictor and num_actions")
            if r.adapter.stepping is not stepping:
                raise ValueError(f"an ActingGroup's runners must be of one env kind: {r!r} is "
                                 f"stepped by {r.adapter.stepping.__name__}, {first!r} by "
                                 f"{stepping.__name__}")
        if len(runners) > 1 and stepping.one_runner:
            raise ValueError(f"{first!r} is a group of its own: its stepping, "
                             f"{stepping.__name__}, steps one runner (e.g. an asynchronous "
                             "engine's recv/send)")
        self.runners = runners
        self.memory = first.memory
        self.predictor = first.predictor
        self.num_actions: int = first.num_actions
        sizes = [r.num_envs for r in runners]
        starts = np.concatenate([[0], np.cumsum(sizes)])
        self.num_lanes = int(starts[-1])
        self.runner_lanes = [np.arange(starts[k], starts[k + 1]) for k in range(len(runners))]
        self._all_members = np.arange(len(runners))
        # Per runner position: its next step starts by resetting its env.
        self._needs_reset = [True] * len(runners)
        self.inserted = 0                  # steps stored by all runners (read: InsertedSteps)
        self._format = FrameFormat(self.memory.state_shape, self.memory.dtype)
        # The policy, the lanes' frame history and batch writer take their C kernels as they
        # are built here, once (expreplay._kernels): the group keeps the path it was built with.
        self._policy = EpsilonGreedy([r.rng for r in runners], self.runner_lanes, self.num_actions)
        # Lane -> (its runner's position, its sub-env's index in that runner).
        self._lane_runner = np.repeat(np.arange(len(runners)), sizes)
        self._lanes_are_positions = self.num_lanes == len(runners)   # one env per runner
        self._lane_env = np.concatenate([np.arange(s) for s in sizes])
        self._lanes = LaneEpisodes(np.repeat([r.life_loss_terminal for r in runners], sizes),
                                   self.memory, self._format.state_shape, self._format.dtype)
        self._resets = LaneResets(runners, self.runner_lanes, self._format)
        # The episode-start schedulers that observe steps (restart pools), by runner position,
        # and the snapshot each lane hands them.
        observers = [(k, getattr(r.episode_starts, 'observe_step', None))
                     for k, r in enumerate(runners)]
        self._observers = {k: f for k, f in observers if f is not None}
        self._snapshots = [_Snapshot(self, lane) for lane in range(self.num_lanes)]
        # The env calls of a step, as the runners' kind makes them: chosen once, here.
        self._stepping = stepping(self)
        self._pending: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._closed = False
        self.calls = 0                     # predictor calls made by step() (inline)
        self.rows = 0

    @property
    def current_call(self) -> tuple[str, Any] | None:
        """``(what, runner)`` of the env call the group named running now (a reset, a restore...),
        else None: what a manager's watchdog names when the call hangs."""
        return self._resets.current_call

    @property
    def frame_format(self) -> FrameFormat:
        """How the runners' observations become memory frames."""
        return self._format

    @property
    def in_step(self) -> bool:
        """True between :meth:`begin` and :meth:`finish` (or :meth:`abort`)."""
        return self._pending is not None

    def needs_reset(self, position: int) -> bool:
        """Whether the next step of ``runners[position]`` starts by resetting its env."""
        return self._needs_reset[position]

    def request_reset(self, position: int) -> None:
        """The next step of ``runners[position]`` resets its env (after a restart: a new
        player)."""
        self._needs_reset[position] = True

    def restart_point(self, lane: int, include_rng: bool = False) -> RestartPoint:
        """A :class:`~expreplay.acting.starts.RestartPoint` of ``lane`` now (between steps)."""
        k, env_index = int(self._lane_runner[lane]), int(self._lane_env[lane])
        state = self._resets.env_state(k, env_index, include_rng)
        at = self._lanes.position(lane)
        return RestartPoint(state, at.frame, at.lives, at.last_action,
                            {'runner': self.runners[k].index, 'env_index': env_index,
                             'episode': at.game, 'step': at.step})

    # ------------------------------------------------------------------ a step
    def step(self, exploration: float | Sequence[float], members: Sequence[int] | None = None) -> int:
        """One step of ``members`` (all by default), the predictor called here: the steps stored."""
        before = self.inserted
        states = self.begin(exploration, members)
        q_values = None
        if len(states):
            self.calls += 1
            self.rows += len(states)
            assert self.predictor is not None     # begin() refused greedy rows without one
            try:
                q_values = as_q_values(self.predictor(states))
            except PredictorError:
                self.abort()
                raise
            except Exception as err:
                self.abort()
                raise PredictorError(f"predictor raised: {err!r}") from err
        self.finish_or_raise(q_values)
        return self.inserted - before

    def begin(self, exploration: float | Sequence[float] | np.ndarray,
              members: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """First half of a step: reset where needed, choose the random actions, and return the
        states of the lanes that act greedily (``(k, *state_shape, history_len)``).

        ``exploration`` is one probability, or one per member. The stepping says which lanes
        act (an asynchronous engine's receives the ready sub-envs' results first and stores
        them: the states are theirs).
        Raises :class:`EnvError` (its ``runner`` set) when a reset or receive fails.
        """
        if self._closed:
            raise RuntimeError("the acting group is closed")
        if self._pending is not None:
            raise RuntimeError("begin called twice without finish")
        members = self._all_members if members is None else np.asarray(members, np.int64)
        eps = explorations(exploration, members)
        for k in members.tolist():
            if self._needs_reset[k]:
                self._reset_runner(k)
                self._needs_reset[k] = False
        lanes, eps = self._stepping.lanes(members, eps)
        actions, greedy = self._policy.draw(lanes, eps, self._lanes.open)
        if len(greedy) and self.predictor is None:
            raise PredictorError(f"runners {[r.index for r in self.runners]} have predictor=None, "
                                 f"which needs exploration 1; got {exploration!r}")
        self._pending = (members, lanes, actions, greedy)
        return self._lanes.states(lanes[greedy])

    def finish(self, q_values: Any) -> Failures:
        """Second half: act (greedy where :meth:`begin` returned states), store every step,
        start new episodes where due. Returns ``[(runner, EnvError), ...]`` for the runners
        whose env failed (each needs a reset; the steps of the others are stored)."""
        if self._pending is None:
            raise RuntimeError("finish called without begin")
        members, lanes, actions, greedy = self._pending
        self._pending = None
        if len(greedy):
            self._policy.act_greedy(q_values, greedy, actions)
        failures: Failures = []
        if self._stepping.step(members, lanes, actions, failures):
            return failures            # nothing else due (e.g. no episode ended)
        # Every step is stored: now the callbacks may run (and even raise) without losing one.
        if self._lanes.has_ended:
            self._end_games()
        # Only now reset finished envs: a reset failure must not lose a step already taken.
        is_open = self._lanes.open
        if np.count_nonzero(is_open[lanes]) == len(lanes):
            return failures
        for k in members.tolist():
            if not self._needs_reset[k] and not is_open[self.runner_lanes[k]].all():
                try:
                    self._reset_finished(k)
                except EnvError as err:
                    self.fail(k, 'reset', err, failures)
        return failures

    def finish_or_raise(self, q_values: Any) -> None:
        """:meth:`finish`, raising the first runner failure (for a caller stepping the group
        itself, as :meth:`step` does)."""
        failures = self.finish(q_values)
        if failures:
            raise failures[0][1]

    def abort(self) -> None:
        """Forget a :meth:`begin` whose Q-values will not come (the predictor failed)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            _, lanes, actions, _ = pending
            self._stepping.abort(lanes, actions)

    # ------------------------------------------------------------------ resets
    def _reset_runner(self, k: int) -> None:
        """Reset every sub-env of runner ``k``: its episodes end where they are first (also
        when the reset fails), and the new ones start in the lanes."""
        lanes = self.runner_lanes[k]
        self._lanes.close(lanes)
        starts = self._resets.reset_runner(k, self._lanes.episode_indices(lanes))
        if starts is not None:
            self._start(*starts)

    def _reset_finished(self, k: int) -> None:
        """Start new games in runner ``k``'s sub-envs whose games ended."""
        lanes = self.runner_lanes[k]
        starts = self._resets.reset_finished(k, ~self._lanes.open[lanes],
                                             self._lanes.episode_indices(lanes))
        if starts is not None:
            self._start(*starts)

    def _start(self, lanes: np.ndarray, frames: np.ndarray, lives: np.ndarray,
               starts: list[EpisodeStart]) -> None:
        """New episodes in ``lanes`` (one :class:`EpisodeStart` each), counted by their runners."""
        self._lanes.start(lanes, frames, lives, starts)
        for lane, start in zip(lanes.tolist(), starts):
            self.runners[self._lane_runner[lane]].count_start(start.kind)

    # ------------------------------------------------------------------ what runners are told
    def _stored(self, lanes: np.ndarray, actions: np.ndarray) -> None:
        """``lanes`` stored a step taken with ``actions``: tell the schedulers that observe
        steps (restart pools) where each lane still in its game is now."""
        self._lanes.note_actions(lanes, actions)
        observers = self._observers
        for lane in lanes[self._lanes.open[lanes]].tolist():
            k = self._lane_runner[lane]
            f = observers.get(k)
            if f is not None:
                f(self.runners[k].index, int(self._lane_env[lane]),
                  self._lanes.game_length(lane), self._snapshots[lane])

    def _end_games(self) -> None:
        """Tell the runners of the games that ended: their counters first (no user code), then
        the records to the schedulers and the runners' ``on_episode_end``."""
        ended = self._lanes.take_ended()
        for game in ended:
            self.runners[self._lane_runner[game.lane]].record_game(game.score, game.length)
        for game in ended:
            runner = self.runners[self._lane_runner[game.lane]]
            record = self._record(runner, game)
            end = getattr(runner.episode_starts, 'episode_end', None)
            if end is not None:
                end(record)
            if runner.on_episode_end is not None:
                runner.on_episode_end(record)

    def _record(self, runner: EnvRunner, game: EndedGame) -> EpisodeRecord:
        start = game.start
        return make_record(runner.index, self._lane_env[game.lane], game.game, start.seed,
                           start.kind, game.score, game.length, game.terminated, game.truncated,
                           game.life_losses, game.started_at, options=start.options,
                           restored_from=None if start.restore is None else start.restore.origin,
                           frames=self.memory.num_steps_written)

    # ------------------------------------------------------------------ what the stepping hands
    # The stepping (envs.Stepping) makes a step's env calls and hands the results here.
    @property
    def has_ended(self) -> bool:
        """Some lane's game ended in the steps stored since the games were last ended."""
        return self._lanes.has_ended

    def frames_of(self, res: Results) -> np.ndarray:
        """The memory frames of ``res``'s observations; raises if those or its rewards can not
        be stored (the memory's rules)."""
        frames = self._format.batch(res.obs, len(res.env_ids))
        _check_rewards(res.reward)
        return frames

    def store_rows(self, lanes: np.ndarray, actions: np.ndarray, rows: tuple[np.ndarray, ...],
                   fast: bool = False) -> bool:
        """Store one step of each of ``lanes``, taken with ``actions``: ``rows`` = (frames,
        rewards, terminated, truncated, lives), a row per lane. ``fast``: only if the common
        step's kernel takes it (False, nothing stored, otherwise); the general path else."""
        if fast:
            if not self._lanes.store_fast(lanes, actions, *rows):
                return False
        else:
            self._lanes.store(lanes, actions, *rows)
        # A lane's runner position: the lane itself when every runner has one env.
        EnvRunner.count_step_of(self.runners, lanes.tolist() if self._lanes_are_positions
                                else self._lane_runner[lanes].tolist())
        self.inserted += len(lanes)
        if self._observers:
            self._stored(lanes, actions)
        return True

    def store_results(self, k: int, res: Results, frames: np.ndarray, actions: np.ndarray) -> None:
        """Store runner ``k``'s :class:`~expreplay.acting.envs.Results` (steps and starts), its
        observations as ``frames`` (:meth:`frames_of`), taken with ``actions`` (a row each)."""
        lanes = self.runner_lanes[k][res.env_ids]
        lives = res.lives if res.lives is not None else np.full(len(lanes), NO_LIVES)
        started = res.started
        if started is not None:
            self._start(lanes[started], frames[started], lives[started],
                        [AUTORESET] * int(np.count_nonzero(started)))
            keep = ~started
            lanes, frames, actions, lives = lanes[keep], frames[keep], actions[keep], lives[keep]
            reward, term, trunc = res.reward[keep], res.terminated[keep], res.truncated[keep]
        else:
            reward, term, trunc = res.reward, res.terminated, res.truncated
        stepping = self._lanes.open[lanes]   # a sub-env that ended reports nothing until it starts
        if np.count_nonzero(stepping) < len(stepping):
            lanes, frames, actions, lives = lanes[stepping], frames[stepping], actions[stepping], lives[stepping]
            reward, term, trunc = reward[stepping], term[stepping], trunc[stepping]
        self.runners[k].count_steps(len(lanes))
        self.inserted += len(lanes)
        # The common step first, the general path when it declines (a frame fewer per step
        # than going through store(), which the history's push_steps spends).
        if not len(lanes):
            return
        if not self._lanes.store_fast(lanes, actions, frames, reward, term, trunc, lives):
            self._lanes.store(lanes, actions, frames, reward, term, trunc, lives)
        if self._observers:
            self._stored(lanes, actions)

    def fail(self, k: int, what: str, err: BaseException, failures: Failures | None = None
             ) -> EnvError:
        """Runner ``k``'s env failed in ``what`` with ``err``: its episodes end here and its
        next step resets its env. Returns the :class:`EnvError` naming the runner, also
        added to ``failures`` (what :meth:`finish` returns) when given."""
        self._needs_reset[k] = True
        self._lanes.close(self.runner_lanes[k])
        error = env_error(self.runners[k], what, err)
        if failures is not None:
            failures.append((self.runners[k], error))
        return error

    def end_games(self) -> None:
        """Tell the runners of the games that ended, if any did (:meth:`has_ended`)."""
        if self._lanes.has_ended:
            self._end_games()

    def last_actions(self, lanes: np.ndarray) -> np.ndarray:
        """The last action each of ``lanes`` was given."""
        return self._lanes.last_actions(lanes)

    def note_actions(self, lanes: np.ndarray, actions: np.ndarray) -> None:
        """``lanes`` were given ``actions`` (their results come later: an asynchronous engine)."""
        self._lanes.note_actions(lanes, actions)

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Detach from the memory (every lane's block is retired; the data stays). Idempotent."""
        if not self._closed:
            self._closed = True
            self._lanes.detach()


def env_error(runner: EnvRunner, what: str, err: BaseException) -> EnvError:
    """``err`` (raised by ``runner``'s env in ``what``) as an :class:`EnvError` naming the runner."""
    if isinstance(err, EnvError):
        err.runner = runner
        return err
    out = EnvError(f"player {type(runner.player).__name__} of runner {runner.index} raised "
                   f"in {what}: {err!r}")
    out.__cause__ = err
    out.runner = runner
    return out


class LaneResets:
    """Resets of the runners ``runners`` whose lanes are ``runner_lanes``; frames in
    ``frame_format``. A reset returns the :data:`Starts` it made (None: an asynchronous engine
    reports its starts with its results)."""

    def __init__(self, runners: Sequence[EnvRunner], runner_lanes: Sequence[np.ndarray],
                 frame_format: FrameFormat) -> None:
        self.runners = list(runners)
        self.runner_lanes = list(runner_lanes)
        self._format = frame_format
        # (what, runner) of the env call running now through _env_call (a reset, a restore...),
        # else None: what a manager's watchdog names when the call hangs.
        self.current_call: tuple[str, EnvRunner] | None = None

    def _env_call(self, runner: EnvRunner, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        self.current_call = (what, runner)
        try:
            return fn(*args)
        except Exception as err:
            raise env_error(runner, what, err) from err
        finally:
            self.current_call = None

    def _plan(self, runner: EnvRunner, env_index: int, episode_index: int) -> EpisodeStart:
        """Ask the scheduler how to start sub-env ``env_index``'s game ``episode_index``."""
        start = runner.episode_starts.start(runner.index, int(env_index), int(episode_index))
        if not isinstance(start, EpisodeStart):
            raise TypeError(f"episode_starts.start() must return an EpisodeStart, got {start!r}")
        return start

    def reset_runner(self, k: int, episode_indices: np.ndarray) -> Starts | None:
        """Reset every sub-env of runner ``k`` (first step, after a failure or a restart);
        ``episode_indices``: the index of each sub-env's next game."""
        runner = self.runners[k]
        lanes = self.runner_lanes[k]
        adapter = runner.adapter
        n = runner.num_envs
        if runner.episode_starts is not None and adapter.plans_starts:
            starts = [self._plan(runner, i, episode_indices[i]) for i in range(n)]
            options = [s.options for s in starts]
            if any(o != options[0] for o in options[1:]):
                raise ValueError(f"runner {runner.index}: a vector env resets all its sub-envs with one "
                                 f"options dict; the scheduler gave {options}")
            seeds = starts[0].seed if n == 1 else [s.seed for s in starts]
            res = self._env_call(runner, 'reset', adapter.reset, seeds, options[0])
        else:
            seed = runner.take_first_seed()
            res = self._env_call(runner, 'reset', adapter.reset, seed)
            # An int seed starts sub-env i with seed + i (gymnasium's vector convention).
            starts = [PLAIN_RESET if seed is None else EpisodeStart(seed + i) for i in range(n)]
        if res is None:                  # asynchronous: the starts arrive with recv()
            return None
        frames = self._env_call(runner, 'reset', self._format.batch, res.obs, n)
        lives = res.lives if res.lives is not None else np.full(n, NO_LIVES)
        frames, lives = self._restore_where_planned(runner, starts, frames, lives)
        return lanes, frames, lives, starts

    def reset_finished(self, k: int, finished: np.ndarray, episode_indices: np.ndarray
                       ) -> Starts | None:
        """Start new games in runner ``k``'s sub-envs whose games ended (after a step):
        ``finished[i]`` for sub-env ``i``, whose next game is ``episode_indices[i]``."""
        runner = self.runners[k]
        adapter = runner.adapter
        lanes = self.runner_lanes[k]
        planned = None
        if runner.episode_starts is not None and adapter.controls_resets:
            planned = {int(i): self._plan(runner, int(i), episode_indices[i])
                       for i in np.flatnonzero(finished)}
        if planned:
            plan = {i: (s.seed, s.options) for i, s in planned.items()}
            res = self._env_call(runner, 'reset', adapter.reset_finished, plan)
        else:
            res = self._env_call(runner, 'reset', adapter.reset_finished)
        if res is None:
            return None
        frames = self._env_call(runner, 'reset', self._format.batch, res.obs, len(res.env_ids))
        lives = res.lives if res.lives is not None else np.full(len(res.env_ids), NO_LIVES)
        if planned:
            starts = [planned[int(i)] for i in res.env_ids]
        else:
            starts = [PLAIN_RESET if adapter.controls_resets else AUTORESET] * len(res.env_ids)
        frames, lives = self._restore_where_planned(runner, starts, frames, lives,
                                                    env_ids=res.env_ids)
        return lanes[res.env_ids], frames, lives, starts

    def _restore_where_planned(self, runner: EnvRunner, starts: list[EpisodeStart], frames: np.ndarray,
                               lives: np.ndarray, env_ids: np.ndarray | None = None
                               ) -> tuple[np.ndarray, np.ndarray]:
        """After the reset of a restart: restore the saved state, whose first frame is saved."""
        if not any(s.restore is not None for s in starts):
            return frames, lives
        frames, lives = frames.copy(), lives.copy()
        for j, s in enumerate(starts):
            point = s.restore
            if point is None:
                continue
            i = j if env_ids is None else int(env_ids[j])
            self._env_call(runner, 'restore', runner.adapter.restore_state, i, point.state,
                           point.action)
            # ALE keeps its pre-restore screen until the next act(): the frame saved with the
            # state is what the observation pipeline produced for it.
            frames[j] = point.frame
            lives[j] = NO_LIVES if point.lives is None else point.lives
        return frames, lives

    def env_state(self, runner_index: int, env_index: int, include_rng: bool = False) -> Any:
        """The emulator state of sub-env ``env_index`` of ``runners[runner_index]``, now."""
        runner = self.runners[runner_index]
        return self._env_call(runner, 'clone_state', runner.adapter.clone_state, env_index,
                              include_rng)


class _Snapshot:
    """What an observing scheduler calls (``snapshot(include_rng=False)``) to take a restart
    point of one lane, now, between steps."""
    __slots__ = ('_group', '_lane')

    def __init__(self, group: ActingGroup, lane: int) -> None:
        self._group, self._lane = group, lane

    def __call__(self, include_rng: bool = False) -> RestartPoint:
        return self._group.restart_point(self._lane, include_rng)


def _check_rewards(rewards: Any) -> None:
    """The memory's rule for a vector step's rewards (:func:`check_rewards`), its common case
    (the adapters' float64 rows, all storable) without building the float32 copy."""
    if type(rewards) is not np.ndarray or rewards.dtype.kind != 'f' \
            or unstorable_rewards(rewards) is not None:
        check_rewards(rewards, 'player rewards')
