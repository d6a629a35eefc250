"""Acting: runners that step environments epsilon-greedily and write every step to the memory.

Three small parts, each with one job:

* :class:`EnvRunner` drives one environment (or one vector env) and writes each sub-env's steps
  to its own lane of the replay memory. It knows nothing about threads or batching: like the
  actors of Dopamine, CleanRL or Acme, the acting loop only hands transitions to a writer.
* :class:`BatchedPredictor` merges the Q-network calls of several simulator threads into one
  forward pass (one batch of 8 costs about twice a batch of 1 on a CPU, not 8 times), run by
  one of the waiting threads (leader/followers: no extra thread, no hand-over when alone).
* :class:`InferenceThread` runs a predictor in a thread of its own, for simulator threads that
  overlap acting with inference (pipelined mode).
* :class:`EnvRunnerManager` runs the runners in simulator threads (one per runner, or a few
  that each step several runners, pipelined), fed by a bounded queue of step requests, and
  surfaces faults, statistics and shutdown.

The two-phase runner step (:meth:`EnvRunner.begin_step` -> Q-values -> :meth:`EnvRunner.finish_step`)
is what lets the manager put the forward pass in the middle without the runner knowing.
"""

import collections
import contextlib
import functools
import logging
import numbers
import threading
import time
import warnings

import numpy as np

from .envs import FrameFormat, FrameHistory, Reset, adapt_env
from .episodes import EpisodeStart, RestartPoint, make_record

__all__ = ['EnvRunner', 'EnvRunnerManager', 'BatchedPredictor', 'InferenceThread',
           'RunnerError', 'EnvError', 'PredictorError', 'ManagerClosed']

logger = logging.getLogger(__name__)


class RunnerError(RuntimeError):
    """A simulator failed; ``__cause__`` is the original exception."""


class EnvError(RunnerError):
    """The environment raised while resetting or stepping."""


class PredictorError(RunnerError):
    """The predictor raised, or returned something that is not ``[Q-values, ...]``."""


class ManagerClosed(RunnerError):
    """The manager (or its batched predictor) was closed while a call was waiting on it."""


def _check_exploration(exploration):
    if isinstance(exploration, bool) or not isinstance(exploration, numbers.Real) \
            or not 0.0 <= float(exploration) <= 1.0:
        raise ValueError(f"exploration must be a probability in [0, 1], got {exploration!r}")
    return float(exploration)


# ---------------------------------------------------------------------------------- EnvRunner
class EnvRunner:
    """Steps one environment epsilon-greedily and writes every step to a replay memory.

    Args:
        player: a gymnasium ``Env``, an old-gym-API env (``reset() -> obs``, 4-tuple ``step``),
            or a gymnasium ``VectorEnv`` such as ``ale_py.vector_env.AtariVectorEnv``
            (``stack_num=1``, ``batch_size == num_envs``). A vector env's sub-environments are
            acted on with one predictor call per step and each writes its own memory lane.
            Anything else raises TypeError naming ``player``.
        predictor: ``predictor(states) -> [q_values, ...]`` (tensorpack's convention): states
            ``(n, *state_shape, history_len)`` in the memory's dtype, channels-last, oldest frame
            first, zeros before the episode's first frame; ``q_values`` ``(n, num_actions)``.
            :meth:`step` calls it from the calling thread; a manager calls it from one thread at
            a time (see :class:`EnvRunnerManager`). None is allowed when exploration is always 1.
        memory: a :class:`expreplay.ReplayMemory` (anything with ``new_writer()``,
            ``state_shape`` and ``dtype``).
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
        episode_starts (optional): an episode-start scheduler (see :mod:`expreplay.episodes`):
            ``episode_starts.start(index, env_index, episode_index)`` decides the seed, reset
            options and possibly a saved state to restore for every reset this runner controls
            (then ``seed`` seeds only the exploration). None: the behaviour described at
            ``seed``.
        on_episode_end (callable, optional): called with the
            :class:`~expreplay.episodes.EpisodeRecord` of every finished game (all lives),
            from the thread that steps this runner, after the step is in the memory.

    Attributes:
        total_scores (list): score of every game finished (all lives), oldest first; emptied by
            :meth:`EnvRunnerManager.reset_stats`.
        steps (int): environment steps taken (all sub-environments).
        restarts (int): how many times :meth:`restart` replaced or reset the env.
        episodes_started (dict): episodes started so far per start kind (``'reset'``,
            ``'restart'``, ``'autoreset'``, ...); read it with :meth:`start_counts`.

    Use from one thread at a time.
    """

    def __init__(self, player, predictor, memory, history_len, *, seed=None, index=0,
                 num_actions=None, life_loss_terminal=False, player_factory=None,
                 close_player=True, episode_starts=None, on_episode_end=None):
        self.predictor = predictor
        self.memory = memory
        self.history_len = int(history_len)
        mem_h = getattr(memory, 'history_len', self.history_len)
        if mem_h != self.history_len:
            raise ValueError(f"history_len={history_len} differs from the memory's history_len={mem_h}")
        if not callable(getattr(memory, 'new_writer', None)) or getattr(memory, 'state_shape', None) is None:
            raise TypeError(f"memory must be a ReplayMemory (with new_writer() and state_shape), "
                            f"got {type(memory).__name__}")
        self.index = int(index)
        self.life_loss_terminal = bool(life_loss_terminal)
        self._seed = seed
        # True once the seeded first reset is done; a scheduler decides the seeds itself.
        self._seeded = seed is None or episode_starts is not None
        if episode_starts is not None and not callable(getattr(episode_starts, 'start', None)):
            raise TypeError(f"episode_starts must have a start(runner_index, env_index, "
                            f"episode_index) method, got {type(episode_starts).__name__}")
        if on_episode_end is not None and not callable(on_episode_end):
            raise TypeError(f"on_episode_end must be callable, got {on_episode_end!r}")
        self.episode_starts = episode_starts
        self.on_episode_end = on_episode_end
        # Optional scheduler hooks, looked up once: the per-step one costs a call per step.
        self._observe_step = getattr(episode_starts, 'observe_step', None)
        self._scheduler_episode_end = getattr(episode_starts, 'episode_end', None)
        # SeedSequence takes non-negative entropy; (seed, index) keeps runners' streams apart.
        self._rng = np.random.default_rng(None if seed is None else [abs(int(seed)), self.index])
        self._player_factory = player_factory
        self._close_player = close_player
        self._num_actions_arg = num_actions

        self.total_scores = []
        self.steps = 0
        self.restarts = 0
        self.predict_calls = 0     # predictor calls made by step() itself (not by a manager)
        self.predict_rows = 0
        self._games = []           # (score, length) since the last pop_games()
        self._stats_lock = threading.Lock()
        self._closed = False
        self._writers = None

        self._attach(player)
        n = self.num_envs
        self._writers = [memory.new_writer() for _ in range(n)]
        self._format = FrameFormat(memory.state_shape, getattr(memory, 'dtype', np.uint8))
        self._history = FrameHistory(n, self._format.state_shape, self.history_len, self._format.dtype)
        self._open = np.zeros(n, bool)      # sub-env is inside an episode that the memory is recording
        self._score = np.zeros(n, np.float64)
        self._length = np.zeros(n, np.int64)
        self._lives = [None] * n
        self._started = False
        self._pending = None                # (actions, greedy indices) between begin/finish_step
        # Per sub-env bookkeeping of the current game, for its EpisodeRecord.
        self._games_started = np.zeros(n, np.int64)   # games started so far (the next index)
        self._episode_info = [None] * n                 # (index, EpisodeStart, monotonic start)
        self._life_losses = np.zeros(n, np.int64)
        self._finished = []                             # records of this step, emitted after it
        self.episodes_started = {}
        self._snapshots = [functools.partial(self._snapshot, i) for i in range(n)]
        self._last_actions = [None] * n

    def _attach(self, player):
        adapter = adapt_env(player)
        if self._writers is not None and adapter.num_envs != self.num_envs:
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

    def __repr__(self):
        return f"EnvRunner(index={self.index}, player={type(self.player).__name__}, num_envs={self.num_envs})"

    # ------------------------------------------------------------------ acting
    def step(self, exploration):
        """Take one epsilon-greedy step in every sub-environment and store it.

        With probability ``exploration`` a sub-env takes a uniformly random action, else the
        argmax of ``predictor(states)[0]``. Raises :class:`EnvError` / :class:`PredictorError`
        (chained to the original) when the env / predictor fails.
        """
        states = self.begin_step(exploration)
        q_values = None
        if len(states):
            try:
                outputs = self.predictor(states)
                q_values = outputs[0]
            except Exception as err:
                self.abort_step()
                raise PredictorError(f"predictor raised for runner {self.index}: {err!r}") from err
            self.predict_calls += 1
            self.predict_rows += len(states)
        self.finish_step(q_values)

    def begin_step(self, exploration):
        """First half of :meth:`step`: choose the random actions, return the states to predict.

        Returns ``(k, *state_shape, history_len)``: the states of the ``k`` sub-environments
        that act greedily this step (possibly none). Pass ``predictor(states)[0]`` (or None if
        ``k == 0``) to :meth:`finish_step`. The first call resets the env (seeded).
        """
        exploration = _check_exploration(exploration)
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self._pending is not None:
            raise RuntimeError("begin_step called twice without finish_step")
        if not self._started:
            self._reset_all()
        n = self.num_envs
        # Draw for every sub-env, also those waiting for an autoreset, so that the random
        # stream does not depend on episode boundaries.
        explore = self._rng.random(n) < exploration
        actions = self._rng.integers(self.num_actions, size=n)
        greedy = np.flatnonzero(~explore & self._open)
        self._pending = (actions, greedy)
        return self._history.states(greedy)

    def finish_step(self, q_values):
        """Second half of :meth:`step`: act, store the steps, start new episodes where due."""
        if self._pending is None:
            raise RuntimeError("finish_step called without begin_step")
        actions, greedy = self._pending
        self._pending = None
        if len(greedy):
            q = np.asarray(q_values)
            if q.ndim != 2 or q.shape[0] != len(greedy):
                raise PredictorError(f"predictor returned Q-values of shape {q.shape} for "
                                     f"{len(greedy)} states; expected ({len(greedy)}, num_actions)")
            actions[greedy] = q.argmax(axis=1)
        events = self._env_call('step', self._adapter.step, actions)
        for i, event in enumerate(events):
            if isinstance(event, Reset):
                # NEXT_STEP autoreset: the action was ignored; the env chose how to start.
                self._begin_episode(i, event, _AUTORESET)
            elif event is not None:
                self._record_step(i, int(actions[i]), event)
        # Every step is stored: now the callbacks may run (and even raise) without losing one.
        if self._finished:
            self._emit_records()
        # Only now reset finished envs: a reset failure must not lose a step already taken.
        self._reset_finished()

    def _reset_finished(self):
        adapter = self._adapter
        planned = None
        if self.episode_starts is not None and adapter.controls_resets:
            planned = {i: self._plan(i) for i in np.flatnonzero(~self._open)}
        if planned:
            plan = {i: (s.seed, s.options) for i, s in planned.items()}
            resets = self._env_call('reset', adapter.reset_finished, plan)
        else:
            resets = self._env_call('reset', adapter.reset_finished)
        for i, event in resets.items():
            if planned:
                start = planned[i]
            elif adapter.controls_resets:
                start = _PLAIN_RESET
            else:
                start = _AUTORESET     # SAME_STEP autoreset
            self._begin_episode(i, self._maybe_restore(i, start, event), start)

    def _plan(self, i):
        """Ask the scheduler how to start sub-env ``i``'s next game."""
        start = self.episode_starts.start(self.index, int(i), int(self._games_started[i]))
        if not isinstance(start, EpisodeStart):
            raise TypeError(f"episode_starts.start() must return an EpisodeStart, got {start!r}")
        return start

    def _maybe_restore(self, i, start, event):
        """After the reset of a restart: restore the saved state, whose first frame is saved."""
        point = start.restore
        if point is None:
            return event
        self._env_call('restore', self._adapter.restore_state, i, point.state, point.action)
        # ALE keeps its pre-restore screen until the next act(): the frame saved with the
        # state is what the observation pipeline produced for it.
        return Reset(point.frame, point.lives)

    def abort_step(self):
        """Forget a :meth:`begin_step` whose Q-values will not come (the predictor failed)."""
        self._pending = None

    def _env_call(self, what, fn, *args):
        try:
            return fn(*args)
        except Exception as err:
            raise EnvError(f"player {type(self.player).__name__} of runner {self.index} raised "
                           f"in {what}: {err!r}") from err

    def _reset_all(self):
        n = self.num_envs
        if self.episode_starts is not None:
            starts = [self._plan(i) for i in range(n)]
            options = [s.options for s in starts]
            if any(o != options[0] for o in options[1:]):
                raise ValueError(f"runner {self.index}: a vector env resets all its sub-envs with one "
                                 f"options dict; the scheduler gave {options}")
            seeds = starts[0].seed if n == 1 else [s.seed for s in starts]
            events = self._env_call('reset', self._adapter.reset, seeds, options[0])
            events = [self._maybe_restore(i, s, e) for i, (s, e) in enumerate(zip(starts, events))]
        else:
            seed = None
            if not self._seeded:
                seed = int(self._seed) + self.index * n
                self._seeded = True
            events = self._env_call('reset', self._adapter.reset, seed)
            # An int seed starts sub-env i with seed + i (gymnasium's vector convention).
            starts = [_PLAIN_RESET if seed is None else EpisodeStart(seed + i) for i in range(n)]
        for i, event in enumerate(events):
            self._begin_episode(i, event, starts[i])
        self._started = True

    def _begin_episode(self, i, event, start):
        frame = self._format(event.obs)
        self._writers[i].start_episode(frame)
        self._history.start(i, frame)
        self._open[i] = True
        self._score[i] = 0.0
        self._length[i] = 0
        self._lives[i] = event.lives
        self._life_losses[i] = 0
        self._episode_info[i] = (int(self._games_started[i]), start, time.monotonic())
        self._games_started[i] += 1
        with self._stats_lock:
            self.episodes_started[start.kind] = self.episodes_started.get(start.kind, 0) + 1

    def _snapshot(self, i, include_rng=False):
        """A :class:`~expreplay.episodes.RestartPoint` of sub-env ``i`` now (between steps)."""
        state = self._env_call('clone_state', self._adapter.clone_state, i, include_rng)
        index, _, _ = self._episode_info[i]
        return RestartPoint(state, self._history.latest(i).copy(), self._lives[i],
                            self._last_actions[i],
                            {'runner': self.index, 'env_index': int(i), 'episode': index,
                             'step': int(self._length[i])})

    def _finish_game(self, i, step):
        index, start, started_at = self._episode_info[i]
        self._finished.append(make_record(
            self.index, i, index, start.seed, start.kind, self._score[i], self._length[i],
            step.terminated, step.truncated, self._life_losses[i], started_at,
            options=start.options,
            restored_from=None if start.restore is None else start.restore.origin))

    def _emit_records(self):
        records, self._finished = self._finished, []
        for record in records:
            if self._scheduler_episode_end is not None:
                self._scheduler_episode_end(record)
            if self.on_episode_end is not None:
                self.on_episode_end(record)

    def _record_step(self, i, action, step):
        frame = self._format(step.obs)
        game_over = step.terminated or step.truncated
        lives_before, self._lives[i] = self._lives[i], step.lives
        lost = step.lives is not None and lives_before is not None and step.lives < lives_before
        life_lost = self.life_loss_terminal and lost
        if lost:
            self._life_losses[i] += 1
        # A life loss is terminal for training only; a game both truncated and ended by a life
        # loss counts as terminated (no bootstrapping across a lost life).
        terminated = step.terminated or life_lost
        truncated = step.truncated and not terminated
        self._writers[i].add_step(action, step.reward, frame, terminated=terminated, truncated=truncated)
        self.steps += 1
        self._score[i] += step.reward
        self._length[i] += 1
        if game_over:
            self._open[i] = False
            with self._stats_lock:
                self.total_scores.append(float(self._score[i]))
                self._games.append((float(self._score[i]), int(self._length[i])))
            self._finish_game(i, step)
            return
        if life_lost:
            # The env goes on from this frame: it is the first frame of the next training
            # episode, so the state after a lost life holds no frames from the previous life.
            self._writers[i].start_episode(frame)
            self._history.start(i, frame)
        else:
            self._history.push(i, frame)
        if self._observe_step is not None:
            self._last_actions[i] = action     # for a snapshot: sticky actions repeat it
            self._observe_step(self.index, i, int(self._length[i]), self._snapshots[i])

    # ------------------------------------------------------------------ management
    def pop_games(self, clear_total_scores=False):
        """``[(score, length), ...]`` of the games finished since the last call, forgotten here.
        ``clear_total_scores`` also empties :attr:`total_scores`. Thread-safe."""
        with self._stats_lock:
            games, self._games = self._games, []
            if clear_total_scores:
                self.total_scores.clear()
        return games

    def start_counts(self):
        """A copy of :attr:`episodes_started` (episodes started per start kind). Thread-safe."""
        with self._stats_lock:
            return dict(self.episodes_started)

    def restart(self):
        """Recover from an :class:`EnvError`: replace the player (``player_factory``) or reset it.

        The open episodes stay in the memory as they are (every step taken is kept); the next
        :meth:`begin_step` starts new ones.
        """
        if self._player_factory is not None:
            try:
                self._adapter.close()
            except Exception as err:  # the broken env may fail to close too; keep going
                logger.warning("closing the failed player of runner %d raised %r", self.index, err)
            self._attach(self._player_factory())
        self._pending = None
        self._started = False
        self._open[:] = False
        self.restarts += 1

    def close(self):
        """Detach from the memory (the data stays) and close the player. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for w in self._writers:
            w.close()
        if self._close_player:
            try:
                self._adapter.close()
            except Exception as err:
                logger.warning("closing the player of runner %d raised %r", self.index, err)


# How episodes start when no scheduler decides: an unseeded reset, or the env's own autoreset.
_PLAIN_RESET = EpisodeStart()
_AUTORESET = EpisodeStart(kind='autoreset')


# --------------------------------------------------------------------------- predictions: shared parts
def _run_merged(predictor, batch):
    """Call ``predictor`` once on the states of every request in ``batch``; rows per request."""
    states = batch[0].states if len(batch) == 1 else np.concatenate([r.states for r in batch])
    q = np.asarray(predictor(states)[0])
    if q.ndim != 2 or q.shape[0] != len(states):
        raise ValueError(f"predictor returned Q-values of shape {q.shape} for "
                         f"{len(states)} states; expected ({len(states)}, num_actions)")
    return np.split(q, np.cumsum([len(r.states) for r in batch])[:-1])


def _run_unlocked(cond, predictor, batch):
    """Run ``predictor`` on ``batch`` with ``cond``'s lock released (the caller holds it), then
    give each request its rows, or the predictor's exception to every one of them."""
    cond.release()
    try:
        results, error = _run_merged(predictor, batch), None
    except BaseException as err:
        results, error = None, err
    finally:
        cond.acquire()
    for k, req in enumerate(batch):   # close() may have failed some already
        req.complete(None if results is None else results[k], error)


def _close_queue(owner):
    """Mark a BatchedPredictor / InferenceThread closed and fail its queued and running
    requests with ManagerClosed, waking their callers (its lock is held)."""
    owner._closed = True
    for req in list(owner._queue) + owner._running:
        req.complete(None, ManagerClosed("closed"))
    owner._queue.clear()
    owner._cond.notify_all()


class _Prediction:
    """One caller's states and, once its batch ran, its rows of Q-values or the error."""
    __slots__ = ('states', 'arrived', 'done', 'result', 'error', 'lead', 'group', '_woken', '_ready')

    def __init__(self, states):
        self.states = states
        self.arrived = time.monotonic()
        self.done = False
        self.result = None
        self.error = None
        self.lead = False     # woken to lead the next batch rather than with a result
        self.group = None     # InferenceThread: the submission it belongs to
        self._woken = False
        # A held lock as a one-shot wake-up signal: cheaper than an Event on the hot path.
        self._ready = threading.Lock()
        self._ready.acquire()

    def wait(self):
        self._ready.acquire()

    def wake(self):
        """Wake the caller (once; the batcher's lock is held)."""
        if not self._woken:
            self._woken = True
            self._ready.release()

    def complete(self, result, error):
        """Deliver the outcome (once; the batcher's lock is held)."""
        if not self.done:
            self.done = True
            self.result, self.error = result, error
            self.wake()


class _Ticket:
    """A promise to call :meth:`predict` or :meth:`cancel` soon; see :meth:`BatchedPredictor.ticket`."""

    def __init__(self, batcher):
        self._batcher = batcher
        self._open = True

    def predict(self, states):
        """Q-values ``(len(states), num_actions)`` for ``states``, computed in a shared batch."""
        if not self._open:
            raise RuntimeError("a ticket is good for one predict()")
        self._open = False
        return self._batcher._predict(states)

    def cancel(self):
        """No prediction needed after all. Idempotent."""
        if self._open:
            self._open = False
            self._batcher._cancel()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cancel()


class BatchedPredictor:
    """Merges the predictor calls of several threads into one call on all their states.

    Leader/followers: a caller that finds no batch in progress becomes the *leader*; callers
    arriving meanwhile queue their states and sleep. The leader runs the predictor on the queued
    states (its own included) once every announced caller has asked or given up, or the batch
    holds ``max_batch`` rows, or the oldest request has waited ``max_wait`` seconds; then it
    wakes each caller with its rows. Requests that arrive while the predictor runs form the next
    batch, led by the oldest of them. A lone caller runs the predictor at once in its own thread
    (no hand-over), and batches grow with the load. Requests are never split.

    Callers announce themselves with :meth:`ticket` *before* they know whether they need a
    prediction, then call ``ticket.predict(states)`` or ``ticket.cancel()``: that is how the
    leader knows whether waiting for more is worth it.

    The predictor runs in one caller's thread at a time, never concurrently: it need not be
    thread-safe, but it must work from any thread that calls :meth:`ticket`.
    """

    def __init__(self, predictor, max_batch=32, max_wait=0.002):
        if max_batch < 1 or max_wait < 0:
            raise ValueError(f"need max_batch >= 1 and max_wait >= 0, got {max_batch}, {max_wait}")
        self.predictor = predictor
        self.max_batch = int(max_batch)
        self.max_wait = float(max_wait)
        self._cond = threading.Condition(threading.Lock())
        self._queue = collections.deque()   # waiting requests, oldest first
        self._queued_rows = 0
        self._expected = 0                  # tickets not yet used or cancelled
        self._busy = False                  # a leader is collecting or running a batch
        self._running = []                  # requests inside the predictor right now
        self._closed = False
        self._watchers = 0                  # threads in wait_for_queued
        self.calls = 0                      # predictor calls and rows, for statistics
        self.rows = 0
        self.max_rows_seen = 0

    def ticket(self):
        """Announce a caller that will :meth:`_Ticket.predict` or :meth:`_Ticket.cancel` soon."""
        with self._cond:
            if self._closed:
                raise ManagerClosed("the batched predictor is closed")
            self._expected += 1
        return _Ticket(self)

    def _cancel(self):
        with self._cond:
            self._expected -= 1
            if self._expected == 0 and self._queue:
                self._cond.notify_all()   # the leader may stop waiting

    def _predict(self, states):
        req = _Prediction(states)
        with self._cond:
            self._expected -= 1
            if self._closed:
                raise ManagerClosed("the batched predictor is closed")
            self._queue.append(req)
            self._queued_rows += len(states)
            lead = not self._busy
            if lead:
                self._busy = True
            elif self._expected == 0 or self._queued_rows >= self.max_batch or self._watchers:
                # Wake the leader only when this completes its batch: every wake-up costs a
                # GIL hand-over, and most arrivals neither start nor complete a batch.
                self._cond.notify_all()
        if not lead:
            req.wait()   # woken by a leader or by close(): never waits forever
            lead = req.lead and not req.done
        if lead:
            self._lead(req)
        if req.error is not None:
            if isinstance(req.error, ManagerClosed):
                raise ManagerClosed("the batched predictor was closed while a prediction was waiting")
            raise PredictorError(f"predictor raised: {req.error!r}") from req.error
        return req.result

    def _lead(self, own):
        """Run batches until ``own`` is served, then pass the lead to the oldest waiting caller."""
        with self._cond:
            try:
                while not own.done:
                    batch = self._collect()
                    if batch is None:
                        break                  # closed: close() completed every request
                    self._running = batch
                    _run_unlocked(self._cond, self.predictor, batch)
                    self._running = []
            finally:
                if self._queue and not self._closed:
                    nxt = self._queue[0]
                    nxt.lead = True
                    nxt.wake()
                else:
                    self._busy = False

    def _collect(self):
        """Wait for a batch worth running and take it from the queue (lock held); None if closed."""
        deadline = self._queue[0].arrived + self.max_wait if self._queue else 0.0
        while not self._closed and self._queued_rows < self.max_batch and self._expected > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._cond.wait(remaining)
        if self._closed or not self._queue:
            return None
        batch, rows = [], 0
        while self._queue and (not batch or rows + len(self._queue[0].states) <= self.max_batch):
            req = self._queue.popleft()
            batch.append(req)
            rows += len(req.states)
        self._queued_rows -= rows
        self.calls += 1
        self.rows += rows
        self.max_rows_seen = max(self.max_rows_seen, rows)
        return batch

    def wait_for_queued(self, n, timeout):
        """Block until ``n`` requests wait for the predictor (or close); for tests and monitoring."""
        with self._cond:
            self._watchers += 1
            try:
                return self._cond.wait_for(lambda: self._closed or len(self._queue) >= n, timeout)
            finally:
                self._watchers -= 1

    def close(self):
        """Fail every waiting call with :class:`ManagerClosed`. Idempotent, does not block.

        A predictor call in progress can not be interrupted: its callers are released now,
        and the leader's thread continues when the call returns.
        """
        with self._cond:
            if not self._closed:
                self._queued_rows = 0
                _close_queue(self)


# --------------------------------------------------------------------------- InferenceThread
class InferenceThread:
    """Runs a predictor in a thread of its own on the states that simulator threads submit.

    This is what lets one simulator thread overlap acting with inference: it submits the states
    of one group of runners, steps the envs of another group while the forward pass runs here
    (TensorFlow releases the GIL inside the call), then collects the Q-values (see
    ``simulator_threads`` of :class:`EnvRunnerManager`). Submissions are served in order, one
    predictor call each: merging two queued submissions of one simulator thread would make it
    wait for both, the serial acting the groups are there to avoid. A submission of more than
    ``max_batch`` rows takes several calls; one array of states is never split.

    The predictor is only ever called from this thread, never concurrently.
    ``thread_context`` is entered by the thread first (see :class:`EnvRunnerManager`).
    """

    def __init__(self, predictor, max_batch=32, name='InferenceThread', thread_context=None):
        if max_batch < 1:
            raise ValueError(f"need max_batch >= 1, got {max_batch}")
        self.predictor = predictor
        self.max_batch = int(max_batch)
        self._thread_context = thread_context or contextlib.nullcontext
        self._cond = threading.Condition(threading.Lock())
        self._queue = collections.deque()   # submitted, not yet in a call; oldest first
        self._running = []                  # requests inside the predictor right now
        self._closed = False
        self._failure = None                # what ended the thread, if not close()
        self.calls = 0                      # predictor calls and rows, for statistics
        self.rows = 0
        self.max_rows_seen = 0
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def submit(self, states_list):
        """Queue one request per array of states, all in the same batch-to-be; returns them.

        Call ``req.wait()`` on each, then read ``req.result`` (its Q-values) or ``req.error``
        (the predictor's exception, or :class:`ManagerClosed`). Raises :class:`ManagerClosed`
        after :meth:`close`, :class:`PredictorError` if the thread itself failed.
        """
        reqs = [_Prediction(s) for s in states_list]
        group = object()
        for r in reqs:
            r.group = group
        with self._cond:
            if self._closed:
                raise ManagerClosed("the inference thread is closed")
            if self._failure is not None:
                raise PredictorError(f"{self.thread.name} failed: {self._failure!r}") from self._failure
            self._queue.extend(reqs)
            self._cond.notify()
        return reqs

    def _serve(self):
        try:
            with self._thread_context():
                self._serve_requests()
        except BaseException as err:   # e.g. thread_context raised: no request may wait forever
            with self._cond:
                self._failure = err
                for req in list(self._queue) + self._running:
                    req.complete(None, err)
                self._queue.clear()
                self._cond.notify_all()

    def _serve_requests(self):
        with self._cond:
            while True:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch, rows = [], 0
                while self._queue and (not batch or self._fits(batch[0], rows)):
                    req = self._queue.popleft()
                    batch.append(req)
                    rows += len(req.states)
                self.calls += 1
                self.rows += rows
                self.max_rows_seen = max(self.max_rows_seen, rows)
                self._running = batch
                _run_unlocked(self._cond, self.predictor, batch)
                self._running = []

    def _fits(self, first, rows):
        """Can the next queued request join the call that ``first`` opened (``rows`` so far)?"""
        nxt = self._queue[0]
        return nxt.group is first.group and rows + len(nxt.states) <= self.max_batch

    def close(self):
        """Fail every waiting request with :class:`ManagerClosed` and tell the thread to stop.

        Idempotent, does not block: join :attr:`thread` to wait. A predictor call in progress
        can not be interrupted: its requests are failed now, and the thread stops when the call
        returns.
        """
        with self._cond:
            if not self._closed:
                _close_queue(self)


# --------------------------------------------------------------------------- EnvRunnerManager
class _Request:
    __slots__ = ('seq', 'exploration', 'done')

    def __init__(self, seq, exploration):
        self.seq = seq
        self.exploration = exploration
        self.done = False


class EnvRunnerManager:
    """Runs :class:`EnvRunner` s in simulator threads, one step request at a time.

    Args:
        env_runners (list): the runners. With one runner, :meth:`step` runs it inline in the
            caller's thread (no threads at all). With several, thread ``SimulatorThread-<i>``
            runs ``env_runners[i]``; any idle thread takes the oldest queued request.
        maximum_staleness (int): how many step requests may be unfinished at once (see below).
        simulator_threads (int, optional): None (default): one simulator thread per runner,
            as above. ``k`` fewer than the runners: *pipelined* mode, below.
        max_inference_batch (int): at most this many states per predictor call.
        max_inference_wait (float): seconds a prediction may wait for others to join its batch
            (thread-per-runner mode only).
        max_restarts (int): times each runner may be restarted (:meth:`EnvRunner.restart`)
            after its env raised, instead of failing the manager. Counted in :meth:`stats`.
        close_timeout (float): seconds :meth:`close` waits for the threads in total.
        thread_context (callable, optional): returns a context manager that every thread this
            manager starts enters first (e.g. ``lambda: sess.as_default()`` for TF1 sessions);
            the predictor runs in these threads.

    Staleness guarantee: :meth:`step` accepts request ``k`` only once every request before
    ``k - maximum_staleness + 1`` has finished (its steps are in the memory). Hence at most
    ``maximum_staleness`` requests are pending at any time, and a request is executed before
    more than ``maximum_staleness`` later requests are accepted (in fact before the
    ``maximum_staleness``-th later one is). ``step`` blocks while that does not hold. At most
    ``maximum_staleness`` runners therefore act at once.

    Pipelined mode (``simulator_threads=k < len(env_runners)``): thread ``SimulatorThread-<j>``
    steps runners ``j, j + k, j + 2k, ...`` in two groups of about half of them: it begins one
    group's steps (random actions drawn, states gathered), submits their states to an
    :class:`InferenceThread` (``InferenceThread``; one per distinct predictor) and, while that
    forward pass runs, finishes the other group's steps (the env steps, the memory writes).
    Each accepted request is one step of one of the taking thread's runners (the one idle
    longest); threads take requests as they can, so with runners not divisible among the
    threads, those of a thread with fewer runners step more often. This is the mode
    for envs that hold the GIL, like single ALE envs: on 2 cores, 8 Pong runners on one thread
    wrote 1.2-1.6x the steps/s of 8 threads (``benchmarks/bench_population.py``). For envs that
    release the GIL (``AtariVectorEnv``, subprocess vector envs), a thread per runner lets
    their steps overlap each other. Both groups are full only while ``maximum_staleness`` is at
    least the thread's runner count (plus a few queued requests): a smaller window leaves them
    partly empty. The staleness guarantee below holds in both modes.

    Inference: runners that share a predictor share one :class:`BatchedPredictor`, which
    merges the states of all runners needing a greedy action at once into one call (at most
    ``max_inference_batch`` rows, waiting at most ``max_inference_wait`` for late-comers). The
    predictor is called from one simulator thread at a time (the caller's thread in inline
    mode; the InferenceThread in pipelined mode), never concurrently: it need not be
    thread-safe, but it must work from any thread this manager starts (see ``thread_context``).

    Faults: an exception in a simulator thread or in the predictor is raised from the next
    :meth:`step` (at once if one is blocked waiting), or from :meth:`close` if no ``step``
    raised it: an :class:`EnvError`, :class:`PredictorError` or :class:`RunnerError` naming
    the thread (pipelined, also the runner: ``SimulatorThread-0 (runner 3)``), chained to the
    original (``__cause__``). Once failed, :meth:`step` keeps raising. With ``max_restarts``
    an :class:`EnvError` restarts the runner instead.

    Shutdown: :meth:`close` (also on leaving a ``with`` block) drops queued requests, releases
    threads waiting on the queue or for a prediction, lets each thread finish the env step it is
    in (everything stepped is stored), and joins every thread within ``close_timeout``. A thread
    stuck inside an env call or the predictor (C code can not be interrupted from Python) is
    left running as a daemon thread (it will not block interpreter exit), named in
    ``stuck_threads`` and reported with a ``RuntimeWarning``; it stops and closes its runner as
    soon as that call returns.
    """

    def __init__(self, env_runners, maximum_staleness, *, simulator_threads=None,
                 max_inference_batch=32, max_inference_wait=0.002, max_restarts=0,
                 close_timeout=5.0, thread_context=None):
        self._runners = list(env_runners)
        if not self._runners:
            raise ValueError("env_runners is empty")
        if len({id(r) for r in self._runners}) != len(self._runners):
            raise ValueError("env_runners holds the same runner twice")
        if isinstance(maximum_staleness, bool) or not isinstance(maximum_staleness, numbers.Integral) \
                or maximum_staleness < 1:
            raise ValueError(f"maximum_staleness must be an integer >= 1, got {maximum_staleness!r}")
        self.maximum_staleness = int(maximum_staleness)
        n = len(self._runners)
        if simulator_threads is None:
            simulator_threads = n
        if isinstance(simulator_threads, bool) or not isinstance(simulator_threads, numbers.Integral) \
                or not 1 <= simulator_threads <= n:
            raise ValueError(f"simulator_threads must be an integer in [1, {n}] (the number of "
                             f"runners) or None, got {simulator_threads!r}")
        # Pipelined when some thread owns several runners (see the class docstring).
        self.pipelined = n > 1 and simulator_threads < n
        self.max_restarts = int(max_restarts)
        self.close_timeout = float(close_timeout)
        self._thread_context = thread_context or contextlib.nullcontext
        self.stuck_threads = []

        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)    # simulator threads wait for requests
        self._space = threading.Condition(self._lock)   # step() waits for the staleness window
        self._queue = collections.deque()               # accepted, not started
        self._unfinished = collections.deque()          # accepted, oldest first, done ones popped from the left
        self._next_seq = 0
        self._pending = 0
        self._closed = False
        self._fault = None            # (thread name, exception)
        self._fault_reported = False
        self._runner_closed = [False] * len(self._runners)

        self._window_games = []
        self._window_start = time.monotonic()
        self._window_steps = 0
        self._window_infer = (0, 0)

        # One batcher per distinct predictor (only runners sharing one batch together): a
        # BatchedPredictor (a thread per runner) or an InferenceThread (pipelined).
        self._batchers = {}
        self._batcher_of = []
        self._threads = []             # simulator threads
        self._owner = [0] * n          # runner -> index of the simulator thread that steps it
        if n == 1:
            return                     # inline: step() runs the runner in the caller's thread
        for r in self._runners:
            key = id(r.predictor)
            if key not in self._batchers:
                if self.pipelined:
                    suffix = f'-{len(self._batchers)}' if self._batchers else ''
                    self._batchers[key] = InferenceThread(
                        r.predictor, max_inference_batch, name='InferenceThread' + suffix,
                        thread_context=self._thread_context)
                else:
                    self._batchers[key] = BatchedPredictor(r.predictor, max_inference_batch,
                                                           max_inference_wait)
            self._batcher_of.append(self._batchers[key])
        if self.pipelined:
            owned = [list(range(j, n, simulator_threads)) for j in range(simulator_threads)]
            for j, idx in enumerate(owned):
                for i in idx:
                    self._owner[i] = j
            targets = [(self._simulate_pipelined, (idx,)) for idx in owned]
        else:
            self._owner = list(range(n))
            targets = [(self._simulate, (i,)) for i in range(n)]
        for j, (fn, args) in enumerate(targets):
            self._threads.append(threading.Thread(target=fn, args=args, name=f'SimulatorThread-{j}',
                                                  daemon=True))
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ the caller's side
    def step(self, exploration, timeout=None):
        """Request one step of some runner with this exploration; returns once accepted.

        Blocks while the staleness window is full (see the class docstring); ``timeout``
        (seconds) raises TimeoutError instead of blocking longer, the request not accepted.
        Raises the first fault of any thread (see the class docstring), or
        :class:`ManagerClosed` after :meth:`close`.
        """
        exploration = _check_exploration(exploration)
        if not self._threads:
            return self._step_inline(exploration)
        with self._lock:
            self._raise_if_unusable()
            ok = self._space.wait_for(
                lambda: self._closed or self._fault is not None or self._window_open(), timeout)
            self._raise_if_unusable()
            if not ok:
                raise TimeoutError(f"step() not accepted within {timeout} s: {self._pending} "
                                   f"requests pending (maximum_staleness={self.maximum_staleness})")
            req = _Request(self._next_seq, exploration)
            self._next_seq += 1
            self._queue.append(req)
            self._unfinished.append(req)
            self._pending += 1
            self._work.notify()

    def wait_idle(self, timeout=None):
        """Block until every accepted request has finished (its steps are in the memory).

        Raises the first fault like :meth:`step`, and TimeoutError after ``timeout`` seconds.
        Useful before reading statistics or saving the memory at a quiet moment.
        """
        with self._lock:
            ok = self._space.wait_for(
                lambda: self._closed or self._fault is not None or self._pending == 0, timeout)
            self._raise_if_unusable()
            if not ok:
                raise TimeoutError(f"{self._pending} requests still pending after {timeout} s")

    def _window_open(self):
        return not self._unfinished or self._next_seq - self._unfinished[0].seq < self.maximum_staleness

    def _raise_if_unusable(self):
        if self._fault is not None:
            self._raise_fault()
        if self._closed:
            raise ManagerClosed("the EnvRunnerManager is closed")

    def _raise_fault(self):
        name, err = self._fault
        self._fault_reported = True
        cls = type(err) if isinstance(err, RunnerError) else RunnerError
        cause = err.__cause__ if isinstance(err, RunnerError) and err.__cause__ is not None else err
        raise cls(f"{name} failed: {err}") from cause

    def _step_inline(self, exploration):
        with self._lock:
            self._raise_if_unusable()
        runner = self._runners[0]
        try:
            runner.step(exploration)
        except Exception as err:
            if not self._handle_fault('EnvRunner-0', runner, err):
                with self._lock:
                    self._fault_reported = True
                raise

    # ------------------------------------------------------------------ the threads' side
    def _simulate(self, i):
        runner = self._runners[i]
        batcher = self._batcher_of[i]
        name = threading.current_thread().name
        try:
            with self._thread_context():
                while True:
                    req = self._take()
                    if req is None:
                        return
                    try:
                        with batcher.ticket() as ticket:
                            states = runner.begin_step(req.exploration)
                            q_values = None
                            if len(states):
                                try:
                                    q_values = ticket.predict(states)
                                except BaseException:
                                    runner.abort_step()
                                    raise
                        runner.finish_step(q_values)
                    except ManagerClosed:
                        return
                    except BaseException as err:
                        if not self._handle_fault(name, runner, err):
                            return
                    finally:
                        self._finish(req)
        except BaseException as err:   # thread_context failed (the loop handles the rest)
            self._record_fault(name, err)
        finally:
            with self._lock:
                closing = self._closed
            if closing:   # close() did not wait for us: close our own runner
                self._close_runner(i)

    def _simulate_pipelined(self, owned):
        """Step the runners ``owned`` in groups of about half of them, two groups in flight:
        while one group's states are in the predictor (on the inference thread), finish the
        other group's steps (their env steps hold the GIL; the forward pass does not).

        Invariants: a runner is either idle or in exactly one in-flight group; groups finish in
        the order they began; idle runners are used oldest first, so every runner gets steps
        even when fewer requests than runners are pending (small ``maximum_staleness``).
        """
        idle = collections.deque(owned)
        group_size = (len(owned) + 1) // 2
        inflight = collections.deque()    # groups begun, oldest first: [(runner, request, prediction)]
        name = threading.current_thread().name
        try:
            with self._thread_context():
                while True:
                    if len(inflight) < 2 and idle:
                        reqs = self._take_up_to(min(group_size, len(idle)), block=not inflight)
                        if reqs is None:
                            return
                        if reqs:
                            members = [idle.popleft() for _ in reqs]
                            entries = self._begin_steps(name, members, reqs)
                            if entries is None:
                                return
                            begun = {i for i, _, _ in entries}
                            idle.extend(i for i in members if i not in begun)   # restarted
                            if entries:
                                inflight.append(entries)
                            continue
                    if inflight:
                        entries = inflight.popleft()
                        ok = self._finish_steps(name, entries)
                        idle.extend(i for i, _, _ in entries)
                        if not ok:
                            return
        except BaseException as err:   # thread_context failed (the loop handles the rest)
            self._record_fault(name, err)
        finally:
            for entries in inflight:       # closed or failed: those Q-values will not be used
                for i, req, _ in entries:
                    self._runners[i].abort_step()
                    self._finish(req)
            with self._lock:
                closing = self._closed
            if closing:   # close() did not wait for us: close our own runners
                for i in owned:
                    self._close_runner(i)

    def _begin_steps(self, name, members, reqs):
        """begin_step one runner per request and submit their states for prediction together.

        Returns the group's entries ``(runner index, request, prediction or None)`` (runners
        restarted after a failed begin_step left out), or None after a fault that stops this
        thread.
        """
        entries, by_batcher = [], {}

        def give_up(k):   # abort what began, book every request of the group; stop the thread
            for j, r, _ in entries:
                self._runners[j].abort_step()
            self._finish(*[r for _, r, _ in entries], *reqs[k:])
            return None

        for k, (i, req) in enumerate(zip(members, reqs)):
            if self._closed:                      # close(): no new step begins
                return give_up(k)
            runner = self._runners[i]
            try:
                states = runner.begin_step(req.exploration)   # the first one resets the env
            except BaseException as err:
                if self._handle_fault(f'{name} (runner {i})', runner, err):
                    self._finish(req)             # restarted: this request took no step
                    continue
                return give_up(k)
            entries.append([i, req, None])
            if len(states):
                by_batcher.setdefault(id(self._batcher_of[i]), []).append((len(entries) - 1, states))
        for items in by_batcher.values():
            batcher = self._batcher_of[entries[items[0][0]][0]]
            try:
                preds = batcher.submit([states for _, states in items])
            except ManagerClosed:
                return give_up(len(reqs))
            except PredictorError as err:         # the inference thread died
                self._handle_fault(name, self._runners[entries[items[0][0]][0]], err)
                return give_up(len(reqs))
            for (k, _), pred in zip(items, preds):
                entries[k][2] = pred
        return [tuple(e) for e in entries]

    def _finish_steps(self, name, entries):
        """Wait for each runner's Q-values and finish its step; False: stop this thread."""
        ok = True
        for i, req, pred in entries:
            runner = self._runners[i]
            try:
                if not ok or self._closed:        # failed, or close(): no further env step
                    runner.abort_step()
                    ok = False
                    continue
                q_values = None
                if pred is not None:
                    pred.wait()
                    if isinstance(pred.error, ManagerClosed):
                        runner.abort_step()
                        ok = False
                        continue
                    if pred.error is not None:
                        runner.abort_step()
                        raise PredictorError(f"predictor raised: {pred.error!r}") from pred.error
                    q_values = pred.result
                runner.finish_step(q_values)
            except BaseException as err:
                ok = self._handle_fault(f'{name} (runner {i})', runner, err) and ok
            finally:
                self._finish(req)   # at once: with a small maximum_staleness the window waits for it
        return ok

    def _take_up_to(self, n, block):
        """Up to ``n`` queued requests (waiting for one if ``block``); None once closed."""
        with self._lock:
            while block and not self._queue and not self._closed:
                self._work.wait()
            if self._closed:
                return None
            return [self._queue.popleft() for _ in range(min(n, len(self._queue)))]

    def _take(self):
        with self._lock:
            while not self._queue and not self._closed:
                self._work.wait()
            if self._closed:
                return None
            return self._queue.popleft()

    def _finish(self, *reqs):
        """Book requests as finished (their steps are in the memory); wakes step() once."""
        with self._lock:
            for req in reqs:
                req.done = True
            self._pending -= len(reqs)
            while self._unfinished and self._unfinished[0].done:
                self._unfinished.popleft()
            self._space.notify_all()

    def _handle_fault(self, name, runner, err):
        """Restart the runner if allowed (True), else record the fault (False)."""
        if isinstance(err, EnvError) and runner.restarts < self.max_restarts:
            logger.warning("%s: restarting %r after: %s", name, runner, err)
            try:
                runner.restart()
                return True
            except Exception as restart_err:
                err = restart_err
        self._record_fault(name, err)
        return False

    def _record_fault(self, name, err):
        """The manager has failed: step() and wait_idle() raise it from now on."""
        with self._lock:
            if self._fault is None:
                self._fault = (name, err)
            self._space.notify_all()
            self._work.notify_all()

    # ------------------------------------------------------------------ statistics
    def _collect_games(self, clear_total_scores=False):
        for r in self._runners:
            pop = getattr(r, 'pop_games', None)
            if pop is not None:
                self._window_games.extend(pop(clear_total_scores))

    def _infer_counts(self):
        calls = sum(b.calls for b in self._batchers.values())
        rows = sum(b.rows for b in self._batchers.values())
        calls += sum(getattr(r, 'predict_calls', 0) for r in self._runners)
        rows += sum(getattr(r, 'predict_rows', 0) for r in self._runners)
        return calls, rows

    def _total_steps(self):
        return sum(getattr(r, 'steps', 0) for r in self._runners)

    def reset_stats(self):
        """``(mean, max)`` score of the games finished since the last call, or ``(None, None)``;
        starts a new statistics window (see :meth:`stats`) and, as in tensorpack, empties the
        runners' ``total_scores``."""
        self._collect_games(clear_total_scores=True)
        scores = [s for s, _ in self._window_games]
        self._window_games = []
        self._window_start = time.monotonic()
        self._window_steps = self._total_steps()
        self._window_infer = self._infer_counts()
        if not scores:
            return None, None
        return float(np.mean(scores)), float(np.max(scores))

    def stats(self):
        """Figures since the last :meth:`reset_stats` (does not reset them).

        Keys: ``games``, ``mean_score``, ``max_score``, ``mean_episode_length`` (steps per
        game; None without games), ``steps``, ``steps_per_sec``, ``inference_calls``,
        ``mean_inference_batch`` (states per predictor call, None without calls); and, now:
        ``max_inference_batch`` (largest batched call so far, threaded mode only),
        ``queue_depth`` (requests pending: accepted, not finished), ``queued`` (not started),
        ``restarts`` (total), ``stuck_threads``.
        """
        self._collect_games()
        games = self._window_games
        elapsed = max(time.monotonic() - self._window_start, 1e-9)
        steps = self._total_steps() - self._window_steps
        calls, rows = self._infer_counts()
        calls, rows = calls - self._window_infer[0], rows - self._window_infer[1]
        with self._lock:
            pending, queued = self._pending, len(self._queue)
        return {
            'games': len(games),
            'mean_score': float(np.mean([s for s, _ in games])) if games else None,
            'max_score': float(np.max([s for s, _ in games])) if games else None,
            'mean_episode_length': float(np.mean([n for _, n in games])) if games else None,
            'steps': steps,
            'steps_per_sec': steps / elapsed,
            'inference_calls': calls,
            'mean_inference_batch': rows / calls if calls else None,
            'max_inference_batch': max([b.max_rows_seen for b in self._batchers.values()], default=None),
            'queue_depth': pending,
            'queued': queued,
            'restarts': sum(getattr(r, 'restarts', 0) for r in self._runners),
            'stuck_threads': list(self.stuck_threads),
        }

    # ------------------------------------------------------------------ shutdown
    def _close_runner(self, i):
        with self._lock:
            if self._runner_closed[i]:
                return
            self._runner_closed[i] = True
        try:
            self._runners[i].close()
        except Exception as err:
            logger.warning("closing runner %d raised %r", i, err)

    def close(self, timeout=None):
        """Stop and join every thread, close the runners; raise a fault no step() raised.

        Idempotent. See the class docstring for threads stuck in an env or the predictor.
        """
        timeout = self.close_timeout if timeout is None else float(timeout)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.clear()
            self._work.notify_all()
            self._space.notify_all()
        deadline = time.monotonic() + timeout
        for b in self._batchers.values():
            b.close()
        threads = self._threads + [b.thread for b in self._batchers.values()
                                   if isinstance(b, InferenceThread)]
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for i in range(len(self._runners)):
            if not self._threads or not self._threads[self._owner[i]].is_alive():
                self._close_runner(i)
        self.stuck_threads = [t.name for t in threads if t.is_alive()]
        if self.stuck_threads:
            warnings.warn(f"EnvRunnerManager.close: {', '.join(self.stuck_threads)} still inside an env "
                          f"or predictor call after {timeout} s; left running as daemon threads, they "
                          "stop when that call returns", RuntimeWarning, stacklevel=2)
        with self._lock:
            unreported = self._fault is not None and not self._fault_reported
        if unreported:
            self._raise_fault()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.close()
        except RunnerError:
            if exc_type is None:
                raise
            # An exception is already propagating (most likely this fault, surfaced by step).
