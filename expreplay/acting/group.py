"""ActingGroup: the one acting path, several runners' sub-envs stepped as one batch.

An :class:`ActingGroup` steps the sub-environments of a set of runners (the sub-envs of a
vector env, several single-env runners, or both) as one batch of *lanes*: per step one draw of
the exploration randoms, one gather of the greedy states, one predictor call, and one
vectorized write of all the lanes' steps into the memory. Per-env Python is left only where it
cannot be avoided: a single env's own ``step()`` / ``reset()`` call, and an episode's end.

A step has two halves, :meth:`ActingGroup.begin` (choose the random actions, return the states
that need Q-values) and :meth:`ActingGroup.finish` (act with the Q-values, store the steps), so
that a manager can put the forward pass of one group between the halves of another's
(:mod:`expreplay.acting.manager`). For an asynchronous engine (EnvPool ``recv``/``send``, Ray actors)
``begin`` receives the ready sub-envs' results and stores them, and ``finish`` sends their next
actions: the engine steps the other sub-envs meanwhile.

The group drives the env calls; the objects it is made of do the rest, one job each:
:class:`~expreplay.acting.policy.EpsilonGreedy` (the draws and the Q-values),
:class:`~expreplay.acting.lanes.LaneEpisodes` (episodes and the memory writes, the only part
that knows how steps are stored) and :class:`~expreplay.acting.resets.LaneResets` (resets and
scheduled starts).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .envs import NO_LIVES, FrameFormat, Results
from .lanes import LaneEpisodes
from .policy import EpsilonGreedy, as_q_values, check_q_values, explorations
from .resets import AUTORESET, LaneResets, env_error
from .runner import EnvRunner
from ..errors import EnvError, PredictorError
# The memory's rules for rewards and frames, on a whole step at once.
from ..storage._inputs import check_rewards, unstorable_frames, unstorable_rewards

__all__ = ['ActingGroup', 'check_q_values', 'as_q_values']

# What finish() returns: the runners whose env failed, with the error.
Failures = list[tuple[EnvRunner, EnvError]]


class ActingGroup:
    """Steps the sub-environments of several runners as one batch of lanes.

    Lane ``runner_lanes[r][i]`` is sub-env ``i`` of ``runners[r]``; each lane writes its own
    memory lane, and has its frame history, score, length and lives in arrays over all lanes.
    The runners must share the memory, the history length, the predictor and the number of
    actions; an asynchronous runner is a group of its own. The group's owner seats each runner
    in it (:meth:`EnvRunner.seat <expreplay.acting.runner.EnvRunner.seat>`: a runner is in one
    group at a time, and one that had stepped elsewhere resets its env and starts new
    episodes); building the group changes no runner.

    :meth:`begin` / :meth:`finish` step a subset of the runners (``members``, indices into
    :attr:`runners`), so that a manager with fewer requests than runners steps only some.
    Failures of single runners are returned by :meth:`finish` (their runners need a reset;
    the other members' steps are stored); the predictor's are raised. Use from one thread.

    The group owns the stepping state of the envs it steps, by runner position (the index into
    :attr:`runners`), which the runners read from their seat: reset flags (:meth:`needs_reset`,
    :meth:`request_reset`), steps stored (:meth:`steps_of`, :attr:`inserted`).
    """

    def __init__(self, runners: Iterable[EnvRunner]) -> None:
        runners = list(runners)
        first = runners[0]
        for r in runners[1:]:
            if r.memory is not first.memory or r.history_len != first.history_len \
                    or r.predictor is not first.predictor or r.num_actions != first.num_actions:
                raise ValueError("an ActingGroup's runners must share the memory, history_len, "
                                 "predictor and num_actions")
        if len(runners) > 1 and any(r.is_async for r in runners):
            raise ValueError("an asynchronous runner (recv/send) is a group of its own")
        self.runners = runners
        self.memory = first.memory
        self.predictor = first.predictor
        self.num_actions: int = first.num_actions
        self.is_async: bool = first.is_async
        # Single-env runners are stepped one env call each; a vector runner with one call.
        self.singles = all(not r.is_vector for r in runners)
        sizes = [r.num_envs for r in runners]
        starts = np.concatenate([[0], np.cumsum(sizes)])
        self.num_lanes = int(starts[-1])
        self.runner_lanes = [np.arange(starts[k], starts[k + 1]) for k in range(len(runners))]
        self._all_members = np.arange(len(runners))
        # Per runner position: its next step starts by resetting its env; steps it stored here.
        self._needs_reset, self._steps = [True] * len(runners), [0] * len(runners)
        self.inserted = 0                  # steps stored by all runners (read: InsertedSteps)
        self._format = FrameFormat(self.memory.state_shape, self.memory.dtype)
        # The policy, the lanes' frame history and batch writer take their C kernels as they
        # are built here, once (expreplay._kernels): the group keeps the path it was built with.
        self._policy = EpsilonGreedy([r.rng for r in runners], self.runner_lanes, self.num_actions)
        self._lanes = LaneEpisodes(runners, self.memory, self._format.state_shape,
                                   self._format.dtype, self._env_state)
        self._resets = LaneResets(runners, self.runner_lanes, self._format)
        self._singles = _SingleSteps(runners, self._format) if self.singles else None
        self._pending: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._closed = False
        self._released: set[int] = set()   # runners that moved to another group
        self.calls = 0                     # predictor calls made by step() (inline)
        self.rows = 0

    @classmethod
    def seated(cls, runners: Iterable[EnvRunner]) -> ActingGroup:
        """A group of ``runners`` with each runner seated in it (:meth:`EnvRunner.seat
        <expreplay.acting.runner.EnvRunner.seat>`): how the group's owner (a manager, or a
        runner stepped on its own) builds one."""
        group = cls(runners)
        for position, runner in enumerate(group.runners):
            runner.seat(group, position)
        return group

    @property
    def current_call(self) -> tuple[str, Any] | None:
        """``(what, runner)`` of the env call the group named running now (a reset, a restore...),
        else None: what a manager's watchdog names when the call hangs."""
        return self._resets.current_call

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

    def steps_of(self, position: int) -> int:
        """The steps ``runners[position]`` took and stored in this group."""
        return self._steps[position]

    def _env_state(self, k: int, env_index: int, include_rng: bool) -> Any:
        return self._resets.env_state(k, env_index, include_rng)

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

        ``exploration`` is one probability, or one per member. For an asynchronous runner this
        receives the ready sub-envs' results first (and stores them): the states are theirs.
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
        if self.is_async:
            lanes = self._receive()
        elif self.singles:
            lanes = members            # one lane per runner, in runner order
        elif len(members) == 1:
            lanes = self.runner_lanes[members[0]]
        else:
            lanes = np.concatenate([self.runner_lanes[k] for k in members])
            if isinstance(eps, np.ndarray):
                eps = np.repeat(eps, [self.runners[k].num_envs for k in members])
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
        if self.is_async:
            return self._send(lanes, actions)
        failures: Failures = []
        if self.singles:
            if self._step_singles(members, actions, failures):
                return failures        # the common case: no episode ended, nothing to reset
        else:
            offset = 0
            for k in members.tolist():
                size = self.runners[k].num_envs
                self._step_vector(k, actions[offset:offset + size], failures)
                offset += size
        # Every step is stored: now the callbacks may run (and even raise) without losing one.
        if self._lanes.has_records:
            self._lanes.emit_records()
        # Only now reset finished envs: a reset failure must not lose a step already taken.
        is_open = self._lanes.open
        if np.count_nonzero(is_open[lanes]) == len(lanes):
            return failures
        for k in members.tolist():
            if not self._needs_reset[k] and not is_open[self.runner_lanes[k]].all():
                try:
                    self._reset_finished(k)
                except EnvError as err:
                    self._fail(k, err, failures)
        return failures

    def finish_or_raise(self, q_values: Any) -> None:
        """:meth:`finish`, raising the first runner failure (for a runner stepped on its own)."""
        failures = self.finish(q_values)
        if failures:
            raise failures[0][1]

    def abort(self) -> None:
        """Forget a :meth:`begin` whose Q-values will not come (the predictor failed)."""
        pending, self._pending = self._pending, None
        if pending is not None and self.is_async:
            # The received sub-envs wait for actions: send the random ones (stored as usual).
            _, lanes, actions, _ = pending
            self._send(lanes, actions)

    # ------------------------------------------------------------------ resets
    def _reset_runner(self, k: int) -> None:
        """Reset every sub-env of runner ``k``: its episodes end where they are first (also
        when the reset fails), and the new ones start in the lanes."""
        lanes = self.runner_lanes[k]
        self._lanes.close(lanes)
        starts = self._resets.reset_runner(k, self._lanes.episode_indices(lanes))
        if starts is not None:
            self._lanes.start(*starts)

    def _reset_finished(self, k: int) -> None:
        """Start new games in runner ``k``'s sub-envs whose games ended."""
        lanes = self.runner_lanes[k]
        starts = self._resets.reset_finished(k, ~self._lanes.open[lanes],
                                             self._lanes.episode_indices(lanes))
        if starts is not None:
            self._lanes.start(*starts)

    # ------------------------------------------------------------------ env calls
    def _step_singles(self, members: np.ndarray, actions: np.ndarray, failures: Failures) -> bool:
        """One ``step`` call per single-env runner; True when the steps were stored in the
        common case (no failure, no episode end), so that nothing else is due."""
        assert self._singles is not None
        steps = self._singles
        if steps.step(members, actions) and self._lanes.store_fast(members, actions, *steps.rows):
            for k in members.tolist():
                self._steps[k] += 1
            self.inserted += len(members)
            return not self._lanes.has_records
        steps.check_batch()
        ok = np.ones(len(members), bool)
        for j, err in steps.failed:
            if ok[j]:
                ok[j] = False
                self._fail(int(members[j]), env_error(self.runners[members[j]], 'step', err), failures)
        rows = np.flatnonzero(ok)
        stepped = members[rows]
        for k in stepped.tolist():
            self._steps[k] += 1
        self.inserted += len(stepped)
        if not len(stepped):
            return False
        frames, rewards, term, trunc, lives = steps.rows
        self._lanes.store(stepped, actions[rows], frames[rows], rewards[rows], term[rows],
                          trunc[rows], lives[rows])
        return False

    def _step_vector(self, k: int, actions: np.ndarray, failures: Failures) -> None:
        runner = self.runners[k]
        try:
            res = runner.adapter.step(actions)
            frames = self._format.batch(res.obs, len(res.env_ids))
            _check_rewards(res.reward)
        except Exception as err:
            self._fail(k, env_error(runner, 'step', err), failures)
            return
        self._store_results(k, res, frames, actions[res.env_ids])

    def _receive(self) -> np.ndarray:
        """Asynchronous runner: receive the ready sub-envs' results and store them."""
        runner = self.runners[0]
        try:
            res = runner.adapter.recv()
            frames = self._format.batch(res.obs, len(res.env_ids))
            _check_rewards(res.reward)
        except Exception as err:
            self._needs_reset[0] = True
            self._lanes.close(self.runner_lanes[0])
            raise env_error(runner, 'recv', err) from err
        self._store_results(0, res, frames, self._lanes.last_actions(res.env_ids))
        if self._lanes.has_records:
            self._lanes.emit_records()
        return res.env_ids

    def _send(self, lanes: np.ndarray, actions: np.ndarray) -> Failures:
        runner = self.runners[0]
        self._lanes.note_actions(lanes, actions)
        try:
            runner.adapter.send(actions, lanes)
        except Exception as err:
            failures: Failures = []
            self._fail(0, env_error(runner, 'send', err), failures)
            return failures
        return []

    def _store_results(self, k: int, res: Results, frames: np.ndarray, actions: np.ndarray) -> None:
        """Store a vector runner's :class:`~expreplay.acting.envs.Results` (steps and starts)."""
        lanes = self.runner_lanes[k][res.env_ids]
        lives = res.lives if res.lives is not None else np.full(len(lanes), NO_LIVES)
        started = res.started
        if started is not None:
            self._lanes.start(lanes[started], frames[started], lives[started], AUTORESET)
            keep = ~started
            lanes, frames, actions, lives = lanes[keep], frames[keep], actions[keep], lives[keep]
            reward, term, trunc = res.reward[keep], res.terminated[keep], res.truncated[keep]
        else:
            reward, term, trunc = res.reward, res.terminated, res.truncated
        stepping = self._lanes.open[lanes]   # a sub-env that ended reports nothing until it starts
        if np.count_nonzero(stepping) < len(stepping):
            lanes, frames, actions, lives = lanes[stepping], frames[stepping], actions[stepping], lives[stepping]
            reward, term, trunc = reward[stepping], term[stepping], trunc[stepping]
        self._steps[k] += len(lanes)
        self.inserted += len(lanes)
        # The common step first, the general path when it declines (a frame fewer per step
        # than going through store(), which the history's push_steps spends).
        if len(lanes) and not self._lanes.store_fast(lanes, actions, frames, reward, term, trunc,
                                                     lives):
            self._lanes.store(lanes, actions, frames, reward, term, trunc, lives)

    def _fail(self, k: int, err: EnvError, failures: Failures) -> None:
        """Runner ``k`` failed: its episodes end here, its next step resets its env."""
        self._needs_reset[k] = True
        self._lanes.close(self.runner_lanes[k])
        failures.append((self.runners[k], err))

    # ------------------------------------------------------------------ membership, close
    def release(self, position: int) -> None:
        """``runners[position]`` moves to another group: its lanes here end where they are; a
        group left with no runner of its own detaches from the memory."""
        self._lanes.close(self.runner_lanes[position])
        self._released.add(position)
        if len(self._released) == len(self.runners):
            self.close()

    def close(self) -> None:
        """Detach from the memory (every lane's block is retired; the data stays). Idempotent."""
        if not self._closed:
            self._closed = True
            self._lanes.detach()


def _check_rewards(rewards: Any) -> None:
    """The memory's rule for a vector step's rewards (:func:`check_rewards`), its common case
    (the adapters' float64 rows, all storable) without building the float32 copy."""
    if type(rewards) is not np.ndarray or rewards.dtype.kind != 'f' \
            or unstorable_rewards(rewards) is not None:
        check_rewards(rewards, 'player rewards')


class _SingleSteps:
    """The env calls of a step of single-env runners, their results gathered into reused
    buffers (one row per member), and the memory's rules checked on the whole batch."""

    def __init__(self, runners: Sequence[EnvRunner], frame_format: FrameFormat) -> None:
        self._runners = list(runners)
        self._format = frame_format
        m = len(self._runners)
        self._obs = np.zeros((m,) + frame_format.state_shape, frame_format.dtype)
        self._reward = np.zeros(m, np.float64)
        self._term = np.zeros(m, bool)
        self._trunc = np.zeros(m, bool)
        self._lives = np.zeros(m, np.int64)
        self._all_rows = (self._obs, self._reward, self._term, self._trunc, self._lives)
        # (frames, rewards, terminated, truncated, lives) of this step's members (sliced only
        # when some runners did not step), set by step().
        self.rows: tuple[np.ndarray, ...] = self._all_rows
        self.m = 0
        self.failed: list[tuple[int, BaseException]] = []
        self.runners: list[EnvRunner] = []

    def step(self, members: np.ndarray, actions: np.ndarray) -> bool:
        """Step runner ``members[j]`` with ``actions[j]``; ``failed`` lists ``(j, error)``.
        True when every env stepped and returned what the memory can store without a check."""
        obs_buf, rew, term, trunc, lives = self._obs, self._reward, self._term, self._trunc, self._lives
        fmt = self._format
        shape, dtype = fmt.state_shape, fmt.dtype
        runners = self._runners
        failed: list[tuple[int, BaseException]] = []
        acts = actions.tolist()
        self.runners = [runners[k] for k in members.tolist()]
        for j, runner in enumerate(self.runners):
            try:
                obs, rew[j], term[j], trunc[j], lives[j] = runner.adapter.step_one(acts[j])
                if type(obs) is not np.ndarray or obs.shape != shape or obs.dtype != dtype:
                    obs = fmt(obs)
                obs_buf[j] = obs
            except Exception as err:
                failed.append((j, err))
        self.m = m = len(members)
        self.failed = failed
        # An attribute, not a method: the common step reads it once more per step otherwise.
        self.rows = self._all_rows if m == len(obs_buf) else tuple(a[:m] for a in self._all_rows)
        return not failed and unstorable_frames(self.rows[0], dtype) is None

    def check_batch(self) -> None:
        """The memory's rules for what the envs returned, checked on the whole batch at once;
        the members that broke them join :attr:`failed`."""
        m = self.m
        rew, obs = self._reward[:m], self._obs[:m]
        bad = unstorable_rewards(rew)
        if bad is not None:
            self.failed += [(j, ValueError(f"reward {rew[j]!r} is not finite or does not fit float32"))
                            for j in np.flatnonzero(bad).tolist()]
        bad = unstorable_frames(obs, self._format.dtype)
        if bad is not None:
            self.failed += [(j, ValueError("observation holds NaN or inf"))
                            for j in np.flatnonzero(bad).tolist()]
