"""Acting: runners that step environments epsilon-greedily and write every step to the memory.

Two objects, one job each:

* :class:`EnvRunner` is one environment (a single env, or a vector env's sub-envs) with its
  configuration and its counters: what a user builds and hands to a manager. Like the actors
  of Acme or CleanRL, it knows nothing about how transitions are stored or batched.
* :class:`ActingGroup` is the one acting path. It steps the sub-environments of a set of
  runners (the sub-envs of a vector env, several single-env runners, or both) as one batch of
  *lanes*: per step one draw of the exploration randoms, one gather of the greedy states, one
  predictor call, and one vectorized write of all the lanes' steps into the memory
  (:class:`expreplay.storage.memory.BatchWriter`). Per-env Python is left only where it cannot be
  avoided: a single env's own ``step()`` / ``reset()`` call, and an episode's end.

A step has two halves, :meth:`ActingGroup.begin` (choose the random actions, return the states
that need Q-values) and :meth:`ActingGroup.finish` (act with the Q-values, store the steps), so
that a manager can put the forward pass of one group between the halves of another's
(:mod:`expreplay.acting.manager`). For an asynchronous engine (EnvPool ``recv``/``send``, Ray actors)
``begin`` receives the ready sub-envs' results and stores them, and ``finish`` sends their next
actions: the engine steps the other sub-envs meanwhile.
"""

import functools
import logging
import threading
import time

import numpy as np

from .._checks import check_bool, check_callable, check_int, check_probability
from .envs import NO_LIVES, FrameFormat, FrameHistory, adapt_env
from .episodes import EpisodeStart, RestartPoint, make_record
from ..errors import EnvError, PredictorError
from ..storage.memory import _FLOAT32_MAX, check_rewards   # the memory's rule for rewards

try:  # optional, built by setup.py when a C compiler is available
    from ..storage import _acting_ext
except ImportError:
    _acting_ext = None

__all__ = ['EnvRunner', 'ActingGroup', 'check_q_values', 'as_q_values']

logger = logging.getLogger(__name__)

# How episodes start when no scheduler decides: an unseeded reset, or the env's own autoreset.
_PLAIN_RESET = EpisodeStart()
_AUTORESET = EpisodeStart(kind='autoreset')

# Finished-game records kept until they are read (``reset_stats``, ``pop_games``): a loop that
# never reads them must not grow without bound. Past this many the oldest half is dropped.
MAX_KEPT_GAMES = 10_000


def _append_bounded(records, item):
    records.append(item)
    if len(records) > MAX_KEPT_GAMES:
        del records[:len(records) - MAX_KEPT_GAMES // 2]


def as_q_values(outputs):
    """The Q-values of a predictor's outputs: ``[Q, ...]`` (tensorpack) or the array itself."""
    if isinstance(outputs, (list, tuple)):
        if not outputs:
            raise PredictorError("predictor returned an empty list; expected [Q-values, ...] or "
                                 "a Q-value array")
        return outputs[0]
    return outputs


def check_q_values(q, n, num_actions):
    """``q`` as an ``(n, num_actions)`` numeric array of finite values, else PredictorError.

    No out-of-range action can come out of an argmax over a checked array.
    """
    q = np.asarray(q)
    if q.shape != (n, num_actions):
        raise PredictorError(f"predictor returned Q-values of shape {q.shape} for {n} states; "
                             f"expected ({n}, num_actions={num_actions})")
    if q.dtype.kind not in 'iuf':
        raise PredictorError(f"predictor returned Q-values of dtype {q.dtype}; expected numbers")
    if q.dtype.kind == 'f' and not np.isfinite(q).all():
        raise PredictorError(f"predictor returned non-finite Q-values (NaN or inf) for "
                             f"{int((~np.isfinite(q)).any(axis=1).sum())} of {n} states")
    return q


# ---------------------------------------------------------------------------------- EnvRunner
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
            :class:`PredictorError`. :meth:`step` calls it from the calling thread; a manager
            from one thread at a time. None is allowed when exploration is always 1.
        memory: a :class:`expreplay.ReplayMemory`.
        history_len (int): frames per state; must equal the memory's.
        seed (int, optional): base seed. The first reset is seeded with ``seed + index``
            (``seed + index * num_envs`` for a vector env, whose sub-envs take consecutive
            seeds); later resets continue each env's own random sequence. The exploration RNG
            is seeded from ``(seed, index)``. None: not reproducible.
        index (int): this runner's index among its siblings (seeding, names, messages).
        num_actions (int, optional): needed only when ``player``'s action space is not Discrete.
        life_loss_terminal (bool): Atari. A life lost (``info['lives']`` decreases) is stored as
            a terminated step and the next step starts a new episode in the memory, without
            resetting the env; the score counts the whole game, and the env is reset only when
            the game is over (the DQN convention).
        player_factory (callable, optional): builds a fresh player; used by :meth:`restart`
            (the manager's ``max_restarts``) to replace an env that raised. Without it a
            restart resets the same player.
        close_player (bool): :meth:`close` also closes the player.
        episode_starts (optional): an episode-start scheduler (see :mod:`expreplay.acting.episodes`):
            ``episode_starts.start(index, env_index, episode_index)`` decides the seed, reset
            options and possibly a saved state to restore for every reset this runner controls
            (then ``seed`` seeds only the exploration). None: the behaviour described at
            ``seed``.
        on_episode_end (callable, optional): called with the
            :class:`~expreplay.acting.episodes.EpisodeRecord` of every finished game (all lives),
            from the thread that steps this runner, after the step is in the memory.

    Attributes:
        total_scores (list): score of every game finished (all lives), oldest first; emptied by
            :meth:`EnvRunnerManager.reset_stats` (at most the newest ``MAX_KEPT_GAMES`` kept).
        steps (int): environment steps taken and stored (all sub-environments).
        restarts (int): how many times :meth:`restart` replaced or reset the env.

    A failed step (the env raised, or returned an observation the memory can not store) ends
    the runner's episodes where they are in the memory (every step stored before stays
    sampleable, nothing is stitched across the gap) and raises :class:`EnvError`; the next
    step resets the env. Use from one thread at a time.
    """

    def __init__(self, player, predictor, memory, history_len, *, seed=None, index=0,
                 num_actions=None, life_loss_terminal=False, player_factory=None,
                 close_player=True, episode_starts=None, on_episode_end=None):
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
        self.life_loss_terminal = check_bool(life_loss_terminal, 'life_loss_terminal')
        if episode_starts is not None and not callable(getattr(episode_starts, 'start', None)):
            raise TypeError(f"episode_starts must have a start(runner_index, env_index, "
                            f"episode_index) method, got {type(episode_starts).__name__}")
        self.episode_starts = episode_starts
        self.on_episode_end = check_callable(on_episode_end, 'on_episode_end', allow_none=True)
        self._player_factory = check_callable(player_factory, 'player_factory', allow_none=True)
        self._close_player = check_bool(close_player, 'close_player')
        self._num_actions_arg = None if num_actions is None else check_int(num_actions, 'num_actions', 1)
        # True once the seeded first reset is done; a scheduler decides the seeds itself.
        self._seeded = self._seed is None or episode_starts is not None
        # The exploration draws: this runner's own stream, whatever group it is stepped in.
        # SeedSequence takes non-negative entropy; (seed, index) keeps runners' streams apart.
        self._rng = np.random.default_rng(None if self._seed is None else [abs(self._seed), self.index])

        self.total_scores = []
        self.steps = 0
        self.restarts = 0
        self._games = []              # (score, length) since the last pop_games()
        self._stats_lock = threading.Lock()
        self.episodes_started = {}    # episodes started per start kind; see start_counts()
        self._closed = False
        self._adapter = None
        self._attach(player)
        self._group = None            # the ActingGroup that steps this runner

    def _attach(self, player):
        adapter = adapt_env(player)
        if self._adapter is not None and adapter.num_envs != self.num_envs:
            raise ValueError(f"player_factory built a player with {adapter.num_envs} sub-envs, "
                             f"the runner was built for {self.num_envs}")
        n_act = self._num_actions_arg if self._num_actions_arg is not None else adapter.num_actions
        if n_act is None:
            raise TypeError(f"player {type(player).__name__} has no Discrete action space; "
                            "pass num_actions=")
        if getattr(self.episode_starts, 'needs_emulator_state', False) and not adapter.can_clone_state:
            raise TypeError(f"episode_starts={self.episode_starts!r} restores emulator states, which "
                            f"player {type(player).__name__} can not do (a single gymnasium ALE env "
                            "with `unwrapped.ale` can)")
        self.player = player
        self._adapter = adapter
        self.num_envs = adapter.num_envs
        self.num_actions = int(n_act)
        self.needs_reset = True       # the next step starts by resetting the env

    def __repr__(self):
        return f"EnvRunner(index={self.index}, player={type(self.player).__name__}, num_envs={self.num_envs})"

    @property
    def is_async(self):
        """True for an asynchronous engine (``recv``/``send``): see :class:`ActingGroup`."""
        return self._adapter.is_async

    @property
    def is_vector(self):
        return self.num_envs > 1 or self._adapter.is_async or not hasattr(self._adapter, 'step_one')

    # ------------------------------------------------------------------ acting
    def _own_group(self):
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self._group is None:
            ActingGroup([self])
        elif len(self._group.runners) > 1:
            raise RuntimeError(f"{self!r} is stepped by an EnvRunnerManager with other runners; "
                               "step the manager")
        return self._group

    def step(self, exploration):
        """Take one epsilon-greedy step in every sub-environment and store it.

        With probability ``exploration`` a sub-env takes a uniformly random action, else the
        argmax of the predictor's Q-values. Raises :class:`EnvError` / :class:`PredictorError`
        (chained to the original) when the env / predictor fails.
        """
        self._own_group().step(exploration)

    # ------------------------------------------------------------------ counters
    def _record_game(self, score, length):
        with self._stats_lock:
            _append_bounded(self.total_scores, float(score))
            _append_bounded(self._games, (float(score), int(length)))

    def _count_start(self, kind):
        with self._stats_lock:
            self.episodes_started[kind] = self.episodes_started.get(kind, 0) + 1

    def pop_games(self, clear_total_scores=False):
        """``[(score, length), ...]`` of the games finished since the last call, forgotten here.
        ``clear_total_scores`` also empties :attr:`total_scores`. Thread-safe."""
        with self._stats_lock:
            games, self._games = self._games, []
            if clear_total_scores:
                self.total_scores.clear()
        return games

    def start_counts(self):
        """Episodes started so far per start kind (``'reset'``, ``'restart'``, ``'autoreset'``,
        ...): a copy. Thread-safe."""
        with self._stats_lock:
            return dict(self.episodes_started)

    # ------------------------------------------------------------------ management
    def restart(self):
        """Recover from an :class:`EnvError`: replace the player (``player_factory``) or reset it.

        The open episodes stay in the memory as they are (every step taken is kept); the next
        step starts new ones.
        """
        if self._player_factory is not None:
            try:
                self._adapter.close()
            except Exception as err:  # the broken env may fail to close too; keep going
                logger.warning("closing the failed player of runner %d raised %r", self.index, err)
            self._attach(self._player_factory())
        if self._group is not None:
            self._group.abort()
        self.needs_reset = True
        self.restarts += 1

    def close(self):
        """Detach from the memory (the data stays) and close the player. Idempotent."""
        if self._closed:
            return
        self._closed = True
        group = self._group
        if group is not None and group.runners == [self]:
            group.close()
        if self._close_player:
            try:
                self._adapter.close()
            except Exception as err:
                logger.warning("closing the player of runner %d raised %r", self.index, err)


# ---------------------------------------------------------------------------------- ActingGroup
class ActingGroup:
    """Steps the sub-environments of several runners as one batch of lanes.

    Lane ``runner_lanes[r][i]`` is sub-env ``i`` of ``runners[r]``; each lane writes its own
    memory lane through one :class:`~expreplay.storage.memory.BatchWriter`, and has its frame history,
    score, length and lives in arrays over all lanes. The runners must share the memory, the
    history length, the predictor and the number of actions; an asynchronous runner is a group
    of its own. Building a group moves the runners into it (each is in one group at a time; a
    runner that had stepped elsewhere resets its env and starts new episodes).

    :meth:`begin` / :meth:`finish` step a subset of the runners (``members``, indices into
    :attr:`runners`), so that a manager with fewer requests than runners steps only some.
    Failures of single runners are returned by :meth:`finish` (their runners need a reset;
    the other members' steps are stored); the predictor's are raised. Use from one thread.
    """

    # (what, runner) of the env call running now through _env_call (a reset, restore...), else
    # None: what a manager's watchdog names when the call hangs.
    current_call = None

    def __init__(self, runners):
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
        self.num_actions = first.num_actions
        self.is_async = first.is_async
        # Single-env runners are stepped one env call each; a vector runner with one call.
        self.singles = all(not r.is_vector for r in runners)
        sizes = [r.num_envs for r in runners]
        starts = np.concatenate([[0], np.cumsum(sizes)])
        self.num_lanes = int(starts[-1])
        self.runner_lanes = [np.arange(starts[k], starts[k + 1]) for k in range(len(runners))]
        self._all_members = np.arange(len(runners))
        self._lane_runner = np.repeat(np.arange(len(runners)), sizes)
        self._lane_env = np.concatenate([np.arange(s) for s in sizes])
        # Exploration randoms, drawn ahead from each runner's own RNG (so that a runner's
        # actions depend on its seed and its steps only, not on which runners step with it)
        # and read for a batch of lanes with one fancy index: per lane, _DRAWS rows of
        # (explore?, random action) uniforms, the next at its cursor.
        self._uniforms = np.zeros((self.num_lanes, _DRAWS, 2))
        self._cursor = np.full(self.num_lanes, _DRAWS)
        self._eps = np.zeros(1)

        for r in runners:
            if r._group is not None and r._group is not self:
                r._group.release(r)       # its episodes there end where they are
            r._group = self
            r.needs_reset = True
        n = self.num_lanes
        self._format = FrameFormat(self.memory.state_shape, self.memory.dtype)
        self._frame_shape, self._dtype = self._format.state_shape, self._format.dtype
        self._writer = self.memory.new_batch_writer(n)
        self._history = FrameHistory(n, self._frame_shape, first.history_len, self._dtype)
        self._open = np.zeros(n, bool)          # lane is inside an episode the memory records
        self._score = np.zeros(n, np.float64)
        self._length = np.zeros(n, np.int64)
        self._lives = np.full(n, NO_LIVES, np.int64)
        self._life_losses = np.zeros(n, np.int64)
        self._life_loss_terminal = np.repeat([r.life_loss_terminal for r in runners], sizes)
        self._games_started = np.zeros(n, np.int64)
        self._episode_info = [None] * n         # (episode index, EpisodeStart, monotonic start)
        self._last_actions = np.zeros(n, np.int64)   # for restart snapshots; async: what was sent
        self._observers = [(k, getattr(r.episode_starts, 'observe_step', None)) for k, r in enumerate(runners)]
        self._observers = [(k, f) for k, f in self._observers if f is not None]
        self._snapshots = [functools.partial(self._snapshot, j) for j in range(n)]
        self._finished = []                     # records of this step, emitted after it
        self._pending = None
        self._closed = False
        self._released = set()                  # runners that moved to another group
        self.calls = 0                          # predictor calls made by step() (inline)
        self.rows = 0
        # Reused buffers of the single-env step (one row per member).
        m = len(runners)
        self._obs_buf = np.zeros((m,) + self._frame_shape, self._dtype)
        self._reward_buf = np.zeros(m, np.float64)
        self._term_buf = np.zeros(m, bool)
        self._trunc_buf = np.zeros(m, bool)
        self._lives_buf = np.zeros(m, np.int64)

    # ------------------------------------------------------------------ a step
    def step(self, exploration, members=None):
        """One step of ``members`` (all runners by default), the predictor called here."""
        states = self.begin(exploration, members)
        q_values = None
        if len(states):
            self.calls += 1
            self.rows += len(states)
            try:
                q_values = as_q_values(self.predictor(states))
            except PredictorError:
                self.abort()
                raise
            except Exception as err:
                self.abort()
                raise PredictorError(f"predictor raised: {err!r}") from err
        self.finish_or_raise(q_values)

    def begin(self, exploration, members=None):
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
        if isinstance(exploration, (list, tuple, np.ndarray)):
            eps = np.asarray(exploration, np.float64)
            if eps.shape != members.shape or not ((eps >= 0) & (eps <= 1)).all():
                raise ValueError(f"exploration must be probabilities in [0, 1], one per member, "
                                 f"got {exploration!r}")
        else:
            eps = check_probability(exploration, 'exploration')
        for k in members.tolist():
            if self.runners[k].needs_reset:
                self._reset_runner(k)
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
        actions, greedy = self._draw(lanes, eps)
        if len(greedy) and self.predictor is None:
            raise PredictorError(f"runners {[r.index for r in self.runners]} have predictor=None, "
                                 f"which needs exploration 1; got {exploration!r}")
        self._pending = (members, lanes, actions, greedy)
        return self._history.states(lanes[greedy])

    def _draw(self, lanes, eps):
        """Epsilon-greedy draws for ``lanes``: (random actions, positions of the greedy rows)."""
        if _acting_ext is not None:
            n = len(lanes)
            actions, greedy = np.empty(n, np.int64), np.empty(n, np.int64)
            if not isinstance(eps, np.ndarray):
                self._eps[0] = eps
                eps = self._eps
            g = _acting_ext.draw_actions(lanes, self._uniforms, self._cursor, _DRAWS, eps,
                                         self._open, self.num_actions, actions, greedy)
            if g >= 0:
                return actions, greedy[:g]
        u = self._uniforms_of(lanes)
        actions = (u[:, 1] * self.num_actions).astype(np.int64)
        return actions, np.flatnonzero((u[:, 0] >= eps) & self._open[lanes])

    def _uniforms_of(self, lanes):
        """The next (explore, action) uniforms of each lane: ``(len(lanes), 2)``."""
        cursor = self._cursor[lanes]
        if cursor.max() == _DRAWS:
            for k in np.unique(self._lane_runner[lanes[cursor == _DRAWS]]).tolist():
                rows = self.runner_lanes[k]
                rows = rows[self._cursor[rows] == _DRAWS]
                self._uniforms[rows] = self.runners[k]._rng.random((len(rows), _DRAWS, 2))
                self._cursor[rows] = 0
            cursor = self._cursor[lanes]
        self._cursor[lanes] = cursor + 1
        return self._uniforms[lanes, cursor]

    def finish(self, q_values):
        """Second half: act (greedy where :meth:`begin` returned states), store every step,
        start new episodes where due. Returns ``[(runner, EnvError), ...]`` for the runners
        whose env failed (each needs a reset; the steps of the others are stored)."""
        if self._pending is None:
            raise RuntimeError("finish called without begin")
        members, lanes, actions, greedy = self._pending
        self._pending = None
        if len(greedy):
            q = as_q_values(q_values)
            # The kernel checks and acts on the common case (float32/64 Q-values, all finite);
            # anything else goes through the checks, which say what is wrong or convert.
            if _acting_ext is None or _acting_ext.greedy_actions(q, greedy, actions, self.num_actions):
                q = check_q_values(q, len(greedy), self.num_actions)
                actions[greedy] = q.argmax(axis=1)
        if self.is_async:
            return self._send(lanes, actions)
        failures = []
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
        if self._finished:
            self._emit_records()
        # Only now reset finished envs: a reset failure must not lose a step already taken.
        if self._open[lanes].all():
            return failures
        for k in members.tolist():
            if not self.runners[k].needs_reset and not self._open[self.runner_lanes[k]].all():
                try:
                    self._reset_finished(k)
                except EnvError as err:
                    self._fail(k, err, failures)
        return failures

    def finish_or_raise(self, q_values):
        """:meth:`finish`, raising the first runner failure (for a runner stepped on its own)."""
        failures = self.finish(q_values)
        if failures:
            raise failures[0][1]

    def abort(self):
        """Forget a :meth:`begin` whose Q-values will not come (the predictor failed)."""
        pending, self._pending = self._pending, None
        if pending is not None and self.is_async:
            # The received sub-envs wait for their next actions: send the random ones drawn,
            # so that the engine's pipeline stays whole (those steps are stored as usual).
            _, lanes, actions, _ = pending
            self._send(lanes, actions)

    # ------------------------------------------------------------------ env calls
    def _step_singles(self, members, actions, failures):
        """One ``step`` call per single-env runner, results gathered into the reused buffers."""
        obs_buf, rew, term, trunc, lives = (self._obs_buf, self._reward_buf, self._term_buf,
                                            self._trunc_buf, self._lives_buf)
        shape, dtype, fmt = self._frame_shape, self._dtype, self._format
        runners = self.runners
        failed = []
        acts = actions.tolist()
        member_ids = members.tolist()
        for j, k in enumerate(member_ids):
            try:
                obs, rew[j], term[j], trunc[j], lives[j] = runners[k]._adapter.step_one(acts[j])
                if type(obs) is not np.ndarray or obs.shape != shape or obs.dtype != dtype:
                    obs = fmt(obs)
                obs_buf[j] = obs
            except Exception as err:
                failed.append((j, err))
        m = len(members)
        if not failed and (dtype.kind != 'f' or np.isfinite(obs_buf[:m]).all()):
            # The common case in one C call (it checks the rewards itself); the buffers are
            # sliced only when some runners did not step.
            if m < len(obs_buf):
                obs_buf, rew, term, trunc, lives = obs_buf[:m], rew[:m], term[:m], trunc[:m], lives[:m]
            if self._writer.add_steps_with_history(members, actions, rew, obs_buf, term, trunc,
                                                   lives, self._history, self._score,
                                                   self._length, self._lives):
                for k in member_ids:
                    runners[k].steps += 1
                if self._observers:
                    self._observe_stepped(members, actions)
                return not self._finished
        # The memory's rules for what the envs returned, checked on the whole batch at once.
        if not np.abs(rew[:m]).max() <= _FLOAT32_MAX:
            failed += [(j, ValueError(f"reward {rew[j]!r} is not finite or does not fit float32"))
                       for j in np.flatnonzero(~(np.abs(rew[:m]) <= _FLOAT32_MAX)).tolist()]
        if dtype.kind == 'f' and not np.isfinite(obs_buf[:m]).all():
            failed += [(j, ValueError("observation holds NaN or inf")) for j in
                       np.flatnonzero(~np.isfinite(obs_buf[:m].reshape(m, -1)).all(axis=1)).tolist()]
        if failed:
            ok = np.ones(m, bool)
            for j, err in failed:
                if ok[j]:
                    ok[j] = False
                    self._fail(members[j], self._env_error(runners[members[j]], 'step', err), failures)
            rows = np.flatnonzero(ok)
        else:
            rows = slice(None, m)
        stepped = members[rows]
        for k in stepped.tolist():
            runners[k].steps += 1
        self._store(stepped, actions[rows], obs_buf[rows], rew[rows], term[rows], trunc[rows],
                    lives[rows], fast=False)
        return False

    def _step_vector(self, k, actions, failures):
        runner = self.runners[k]
        try:
            res = runner._adapter.step(actions)
            frames = self._format.batch(res.obs, len(res.env_ids))
            check_rewards(res.reward, 'player rewards')
        except Exception as err:
            self._fail(k, self._env_error(runner, 'step', err), failures)
            return
        self._store_results(k, res, frames, actions[res.env_ids])

    def _receive(self):
        """Asynchronous runner: receive the ready sub-envs' results and store them."""
        runner = self.runners[0]
        try:
            res = runner._adapter.recv()
            frames = self._format.batch(res.obs, len(res.env_ids))
            check_rewards(res.reward, 'player rewards')
        except Exception as err:
            runner.needs_reset = True
            self._close_lanes(self.runner_lanes[0])
            raise self._env_error(runner, 'recv', err) from err
        self._store_results(0, res, frames, self._last_actions[res.env_ids])
        if self._finished:
            self._emit_records()
        return res.env_ids

    def _send(self, lanes, actions):
        runner = self.runners[0]
        self._last_actions[lanes] = actions
        try:
            runner._adapter.send(actions, lanes)
        except Exception as err:
            failures = []
            self._fail(0, self._env_error(runner, 'send', err), failures)
            return failures
        return []

    def _store_results(self, k, res, frames, actions):
        """Store a vector runner's :class:`~expreplay.acting.envs.Results` (steps and starts)."""
        lanes = self.runner_lanes[k][res.env_ids]
        lives = res.lives if res.lives is not None else np.full(len(lanes), NO_LIVES)
        started = res.started
        if started is not None:
            self._start_episodes(lanes[started], frames[started], lives[started], _AUTORESET)
            keep = ~started
            lanes, frames, actions, lives = lanes[keep], frames[keep], actions[keep], lives[keep]
            reward, term, trunc = res.reward[keep], res.terminated[keep], res.truncated[keep]
        else:
            reward, term, trunc = res.reward, res.terminated, res.truncated
        stepping = self._open[lanes]      # a sub-env that ended reports nothing until it starts
        if not stepping.all():
            lanes, frames, actions, lives = lanes[stepping], frames[stepping], actions[stepping], lives[stepping]
            reward, term, trunc = reward[stepping], term[stepping], trunc[stepping]
        self.runners[k].steps += len(lanes)
        self._store(lanes, actions, frames, reward, term, trunc, lives)

    # ------------------------------------------------------------------ storing
    def _observe_stepped(self, lanes, actions):
        self._last_actions[lanes] = actions
        self._observe(lanes)

    def _store(self, lanes, actions, frames, rewards, terminated, truncated, lives, fast=True):
        """Write the steps of ``lanes`` (arrays, one row each) and do the episodes' bookkeeping."""
        if not len(lanes):
            return
        # The common case (no episode end, no lost life, no block change) in one C call.
        if fast and self._writer.add_steps_with_history(
                lanes, actions, rewards, frames, terminated, truncated, lives, self._history,
                self._score, self._length, self._lives):
            if self._observers:
                self._observe_stepped(lanes, actions)
            return
        if lives.max() >= 0:
            prev_lives = self._lives[lanes]
            lost = (lives >= 0) & (prev_lives >= 0) & (lives < prev_lives)
            life_lost = lost & self._life_loss_terminal[lanes]
            self._lives[lanes] = lives
            if lost.any():
                self._life_losses[lanes[lost]] += 1
            any_life_lost = life_lost.any()
        else:
            any_life_lost = False
        if any_life_lost:
            # A life loss is terminal for training only; a game both truncated and ended by a
            # life loss counts as terminated (no bootstrapping across a lost life).
            self._writer.add_steps(lanes, actions, rewards, frames, terminated | life_lost,
                                   truncated & ~(terminated | life_lost), checked=True)
        else:
            self._writer.add_steps(lanes, actions, rewards, frames, terminated, truncated,
                                   checked=True)
        self._score[lanes] += rewards
        self._length[lanes] += 1
        game_over = terminated | truncated
        if any_life_lost or game_over.any():
            for j in np.flatnonzero(game_over).tolist():
                self._end_game(int(lanes[j]), bool(terminated[j]), bool(truncated[j]))
            if any_life_lost:
                # The env goes on from this frame: it is the first frame of the next training
                # episode, so the state after a lost life holds no frames from the previous life.
                restart = life_lost & ~game_over
                self._writer.start_episodes(lanes[restart], frames[restart], checked=True)
                self._history.start(lanes[restart], frames[restart])
                going = ~(game_over | life_lost)
            else:
                going = ~game_over
            self._history.push(lanes[going], frames[going])
        else:
            self._history.push(lanes, frames)
        if self._observers:
            self._last_actions[lanes] = actions
            self._observe(lanes[~game_over])

    def _observe(self, lanes):
        """Tell the schedulers that observe steps (restart pools) where each lane is now."""
        observers = dict(self._observers)
        for lane in lanes.tolist():
            k = self._lane_runner[lane]
            f = observers.get(k)
            if f is not None:
                f(self.runners[k].index, int(self._lane_env[lane]), int(self._length[lane]),
                  self._snapshots[lane])

    def _end_game(self, lane, terminated, truncated):
        self._open[lane] = False
        runner = self.runners[self._lane_runner[lane]]
        runner._record_game(self._score[lane], self._length[lane])
        index, start, started_at = self._episode_info[lane]
        self._finished.append((runner, make_record(
            runner.index, self._lane_env[lane], index, start.seed, start.kind, self._score[lane],
            self._length[lane], terminated, truncated, self._life_losses[lane], started_at,
            options=start.options,
            restored_from=None if start.restore is None else start.restore.origin)))

    def _emit_records(self):
        records, self._finished = self._finished, []
        for runner, record in records:
            end = getattr(runner.episode_starts, 'episode_end', None)
            if end is not None:
                end(record)
            if runner.on_episode_end is not None:
                runner.on_episode_end(record)

    def _start_episodes(self, lanes, frames, lives, start):
        """Begin new episodes in ``lanes`` with their first frames (``start`` for every lane,
        or a list of one :class:`EpisodeStart` per lane)."""
        if not len(lanes):
            return
        self._writer.start_episodes(lanes, frames, checked=True)
        self._history.start(lanes, frames)
        self._open[lanes] = True
        self._score[lanes] = 0.0
        self._length[lanes] = 0
        self._lives[lanes] = lives
        self._life_losses[lanes] = 0
        now = time.monotonic()
        for j, lane in enumerate(lanes.tolist()):
            s = start[j] if isinstance(start, list) else start
            self._episode_info[lane] = (int(self._games_started[lane]), s, now)
            self._games_started[lane] += 1
            self.runners[self._lane_runner[lane]]._count_start(s.kind)

    def _close_lanes(self, lanes):
        """End the lanes' episodes where they are (nothing bootstraps across the gap)."""
        self._open[lanes] = False

    # ------------------------------------------------------------------ resets
    def _env_error(self, runner, what, err):
        if isinstance(err, EnvError):
            err.runner = runner
            return err
        out = EnvError(f"player {type(runner.player).__name__} of runner {runner.index} raised "
                       f"in {what}: {err!r}")
        out.__cause__ = err
        out.runner = runner
        return out

    def _fail(self, k, err, failures):
        """Runner ``k`` failed: its episodes end here, its next step resets its env."""
        runner = self.runners[k]
        runner.needs_reset = True
        self._close_lanes(self.runner_lanes[k])
        failures.append((runner, err))

    def _env_call(self, runner, what, fn, *args):
        self.current_call = (what, runner)
        try:
            return fn(*args)
        except Exception as err:
            raise self._env_error(runner, what, err) from err
        finally:
            self.current_call = None

    def _plan(self, runner, env_index, lane):
        """Ask the scheduler how to start sub-env ``env_index``'s next game."""
        start = runner.episode_starts.start(runner.index, int(env_index), int(self._games_started[lane]))
        if not isinstance(start, EpisodeStart):
            raise TypeError(f"episode_starts.start() must return an EpisodeStart, got {start!r}")
        return start

    def _reset_runner(self, k):
        """Reset every sub-env of runner ``k`` (first step, after a failure or a restart)."""
        runner = self.runners[k]
        lanes = self.runner_lanes[k]
        self._close_lanes(lanes)
        adapter = runner._adapter
        n = runner.num_envs
        if runner.episode_starts is not None and not adapter.is_async:
            starts = [self._plan(runner, i, lanes[i]) for i in range(n)]
            options = [s.options for s in starts]
            if any(o != options[0] for o in options[1:]):
                raise ValueError(f"runner {runner.index}: a vector env resets all its sub-envs with one "
                                 f"options dict; the scheduler gave {options}")
            seeds = starts[0].seed if n == 1 else [s.seed for s in starts]
            res = self._env_call(runner, 'reset', adapter.reset, seeds, options[0])
        else:
            seed = None
            if not runner._seeded:
                seed = runner._seed + runner.index * n
                runner._seeded = True
            res = self._env_call(runner, 'reset', adapter.reset, seed)
            # An int seed starts sub-env i with seed + i (gymnasium's vector convention).
            starts = [_PLAIN_RESET if seed is None else EpisodeStart(seed + i) for i in range(n)]
        runner.needs_reset = False
        if res is None:                  # asynchronous: the starts arrive with recv()
            return
        frames = self._env_call(runner, 'reset', self._format.batch, res.obs, n)
        lives = res.lives if res.lives is not None else np.full(n, NO_LIVES)
        frames, lives = self._restore_where_planned(runner, lanes, starts, frames, lives)
        self._start_episodes(lanes, frames, lives, starts)

    def _reset_finished(self, k):
        runner = self.runners[k]
        adapter = runner._adapter
        lanes = self.runner_lanes[k]
        planned = None
        if runner.episode_starts is not None and adapter.controls_resets:
            planned = {int(i): self._plan(runner, i, lanes[i]) for i in np.flatnonzero(~self._open[lanes])}
        if planned:
            plan = {i: (s.seed, s.options) for i, s in planned.items()}
            res = self._env_call(runner, 'reset', adapter.reset_finished, plan)
        else:
            res = self._env_call(runner, 'reset', adapter.reset_finished)
        if res is None:
            return
        frames = self._env_call(runner, 'reset', self._format.batch, res.obs, len(res.env_ids))
        lives = res.lives if res.lives is not None else np.full(len(res.env_ids), NO_LIVES)
        if planned:
            starts = [planned[int(i)] for i in res.env_ids]
        else:
            starts = [_PLAIN_RESET if adapter.controls_resets or not runner.is_vector else _AUTORESET
                      ] * len(res.env_ids)
        frames, lives = self._restore_where_planned(runner, lanes[res.env_ids], starts, frames, lives,
                                                    env_ids=res.env_ids)
        self._start_episodes(lanes[res.env_ids], frames, lives, starts)

    def _restore_where_planned(self, runner, lanes, starts, frames, lives, env_ids=None):
        """After the reset of a restart: restore the saved state, whose first frame is saved."""
        if not any(s.restore is not None for s in starts):
            return frames, lives
        frames, lives = frames.copy(), lives.copy()
        for j, s in enumerate(starts):
            point = s.restore
            if point is None:
                continue
            i = j if env_ids is None else int(env_ids[j])
            self._env_call(runner, 'restore', runner._adapter.restore_state, i, point.state, point.action)
            # ALE keeps its pre-restore screen until the next act(): the frame saved with the
            # state is what the observation pipeline produced for it.
            frames[j] = point.frame
            lives[j] = NO_LIVES if point.lives is None else point.lives
        return frames, lives

    def _snapshot(self, lane, include_rng=False):
        """A :class:`~expreplay.acting.episodes.RestartPoint` of ``lane`` now (between steps)."""
        runner = self.runners[self._lane_runner[lane]]
        i = int(self._lane_env[lane])
        state = self._env_call(runner, 'clone_state', runner._adapter.clone_state, i, include_rng)
        index, _, _ = self._episode_info[lane]
        lives = int(self._lives[lane])
        return RestartPoint(state, self._history.latest(lane).copy(),
                            None if lives == NO_LIVES else lives, int(self._last_actions[lane]),
                            {'runner': runner.index, 'env_index': i, 'episode': index,
                             'step': int(self._length[lane])})

    # ------------------------------------------------------------------ membership, close
    def release(self, runner):
        """``runner`` moves to another group: its lanes here end where they are; a group
        left with no runner of its own detaches from the memory."""
        k = self.runners.index(runner)
        self._close_lanes(self.runner_lanes[k])
        self._released.add(k)
        if len(self._released) == len(self.runners):
            self.close()

    def close(self):
        """Detach from the memory (every lane's block is retired; the data stays). Idempotent."""
        if not self._closed:
            self._closed = True
            self._writer.close()


_DRAWS = 256
