"""Population: the players that keep a replay memory filled, and everything about how they act.

One object owns the acting side's settings: where the players come from (``get_player``), how
many, the Q-function they act greedily with, epsilon, how many step requests may be pending
(the staleness), the seeds, how episodes start and where they are logged, and the options of
the runners and of their manager. It builds the :class:`~expreplay.EnvRunner` s and the
:class:`~expreplay.EnvRunnerManager` when it is started on a memory, steps them on request, reads
their statistics and stops them. It knows nothing about batches: a
:class:`~expreplay.stream.ReplayStream` decides when to step it, and a script that samples the
memory itself can drive it alone::

    population = Population(make_env, 4, q_values, exploration=1.0, maximum_staleness=8)
    population.start(memory)
    for _ in range(1000):
        population.step(population.exploration)
    population.close()
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .._threads import DaemonThread
from .._checks import check_callable, check_int, check_seed
from ..storage.draw import DrawSettings
from ..stats import ManagerStats, PopulationStats, ScoreWindow
from .exploration import Exploration, ExplorationArg
from ..lags import DataLags
from .episodes import EPISODE_LOG_FILENAME, EpisodeLog, EpisodeRecord, EpisodeTotals
from .runner import EnvRunner
from .manager import EnvRunnerManager
from .settings import ManagerSettings, RunnerSettings, check_settings

if TYPE_CHECKING:
    from ..storage.memory import ReplayMemory

__all__ = ['Population', 'PredictorSlot']

logger = logging.getLogger(__name__)


class PredictorSlot:
    """A swappable predictor that the runners call: replacing it takes effect on the next call.

    The runners use tensorpack's convention, ``predictor(states)[0]`` is the Q-value array. A
    function that returns the Q-value array itself (a numpy array, a torch or JAX tensor, anything
    that is not a list or tuple) is wrapped so that both conventions work.
    """

    def __init__(self, predictor: Callable[[np.ndarray], Any] | None = None,
                 lags: DataLags | None = None) -> None:
        self._predictor = predictor
        self._lags = lags      # told of each hand-over and of the states predicted
        #: The states go to the predictor frames first (``'NCHW'``) instead of last.
        self.frames_first = False

    def set(self, predictor: Callable[[np.ndarray], Any] | None) -> None:
        """Use ``predictor`` from the next call on (a plain attribute store: atomic): a
        hand-over of new weights, also when it is the same object."""
        if predictor is not None and not callable(predictor):
            raise TypeError(f"predictor must be callable, got {predictor!r}")
        self._predictor = predictor
        if self._lags is not None:
            self._lags.handed_over()

    @property
    def current(self) -> Callable[[np.ndarray], Any] | None:
        """The predictor the next call uses."""
        return self._predictor

    def __call__(self, states: np.ndarray) -> list | tuple:
        predictor = self._predictor
        if predictor is None:
            raise RuntimeError("no predictor set: the runners needed a greedy action before the "
                               "Q-function was given (set one, or use exploration=1.0)")
        if self.frames_first:
            states = np.moveaxis(states, -1, 1)     # a view: (n, history_len, *state_shape)
        out = predictor(states)
        if self._lags is not None:
            self._lags.acted(len(states))
        if isinstance(out, (list, tuple)):
            return out
        # As it came: the policy reads its values (as_q_values), a PyTorch tensor too, also
        # one that requires grad, which np.asarray would refuse.
        return [out]


class Population:
    """The players, the Q-function they act with, and the manager that steps them.

    Args:
        get_player: a callable returning a new environment: a gymnasium Env, an old-gym-API env
            (``reset() -> obs``, 4-tuple ``step``), a gymnasium VectorEnv, an EnvPool or a
            :class:`~expreplay.ray.RayVectorEnv`. Called once per player (the first when a
            stream checks the observation space, see :meth:`check_fits`), and again to
            replace a player that crashed when ``manager`` allows restarts.
        num_players (int): players, i.e. runners (a vector player counts once).
        predictor: the Q-function, ``predictor(states)`` with ``states`` of shape
            ``(n, *state_shape, history_len)`` (channels-last, oldest frame first, the memory's
            dtype; ``(n, history_len, *state_shape)`` when started with ``layout='NCHW'``, as a
            stream whose sampling has that layout starts it: the players' states then have
            the layout of the batches). It returns the Q-values ``(n, num_actions)``, or a list of outputs whose
            first is the Q-values (tensorpack's convention). With several players it is called
            from one inference thread (never concurrently), with one player from the thread
            that requests the steps (a stream's prefetch thread, which enters
            ``manager``'s ``thread_context`` if given). None is allowed while
            ``exploration`` is 1 (no greedy action is needed); see :attr:`predictor`.
        exploration (float or callable): epsilon of the epsilon-greedy runners, in [0, 1]:
            a number (assign :attr:`exploration` to change it), or a schedule
            ``exploration(steps)`` of the steps the players have stored in the memory since
            :meth:`start` (the initial fill included), read for every step request, e.g.
            ``lambda steps: max(0.1, 1 - steps / 100_000)``: given once, it needs no update
            from the training loop. Assigning a number later replaces the schedule.
        maximum_staleness (int): step requests that may be pending. None: the default of
            whoever starts the population (a stream's: :attr:`ReplayStream.maximum_staleness
            <expreplay.stream.ReplayStream.maximum_staleness>`), given to :meth:`start`.
        request_lag (int): start every step request exactly this many learner updates after
            it was made, on any machine, under any load (see the manager's ``request_lag``);
            None: at once when a thread is free. Two players or more.
        seed (int): seeds the environments' first resets (runner ``i`` gets a seed derived
            from it and ``i``); None: unseeded.
        episode_starts: an episode-start scheduler shared by all runners (seed schedules, a
            curriculum, a restart pool: see :mod:`expreplay.acting.episodes`). With
            :class:`~expreplay.acting.episodes.ProceduralSeeds` two runs with the same base seed
            and ``num_players`` play the same episode seeds.
        episode_log_dir (str): if given, every finished episode is appended to
            ``<episode_log_dir>/episodes.jsonl`` (:class:`~expreplay.acting.episodes.EpisodeLog`:
            flushed and fsync'd per episode; a resumed run appends). The attribute of the same
            name may be changed until :meth:`start`.
        on_episode_end (callable): called with every
            :class:`~expreplay.acting.episodes.EpisodeRecord`, from the simulator threads.
        runner (RunnerSettings): the settings of every :class:`~expreplay.EnvRunner`, e.g.
            ``RunnerSettings(life_loss_terminal=True)`` for Atari; None: the defaults.
        manager (ManagerSettings): the settings of the :class:`~expreplay.EnvRunnerManager`,
            e.g. ``ManagerSettings(max_restarts=3, close_timeout=60)``; None: the defaults
            (single-env players share one pipelined thread, each vector player gets its own;
            ``simulator_threads=num_players`` gives one thread per player). Anything but the
            record, a dict of keywords say, raises TypeError.

    Nothing is built until :meth:`start` (but :meth:`check_fits` builds the first player).
    A population serves one memory, once: started, closed, not restarted.
    """

    def __init__(self, get_player: Callable[[], Any], num_players: int = 1,
                 predictor: Callable[[np.ndarray], Any] | None = None, *,
                 exploration: ExplorationArg = 1.0, maximum_staleness: int | None = None,
                 request_lag: int | None = None, seed: int | None = None, episode_starts: Any = None,
                 episode_log_dir: str | os.PathLike | None = None,
                 on_episode_end: Callable[[EpisodeRecord], None] | None = None,
                 runner: RunnerSettings | None = None,
                 manager: ManagerSettings | None = None) -> None:
        self.get_player = check_callable(get_player, 'get_player')
        check_callable(predictor, 'predictor', allow_none=True)
        # Sizes take whole floats (tensorpack's DQN.py passes floats), as ReplayMemory.
        self.num_players = check_int(num_players, 'num_players', 1, allow_float=True)
        self._exploration = Exploration(exploration)
        self.maximum_staleness = None if maximum_staleness is None else check_int(
            maximum_staleness, 'maximum_staleness', 1, allow_float=True)
        self.request_lag = None if request_lag is None else check_int(request_lag, 'request_lag', 1)
        if self.request_lag is not None and self.num_players == 1:
            raise ValueError("request_lag needs num_players >= 2: one player steps inline, when "
                             "its request is made")
        self.seed = check_seed(seed, 'seed')
        #: The settings given to every runner and to the manager.
        self.runner_settings = check_settings(runner, RunnerSettings, 'runner')
        self.manager_settings = check_settings(manager, ManagerSettings, 'manager')
        self.episode_starts = episode_starts
        self.episode_log_dir = episode_log_dir
        self._on_episode_end = check_callable(on_episode_end, 'on_episode_end', allow_none=True)
        #: The learner's update clock (a stream ticks it) and the data's lags behind it.
        self.lags = DataLags()
        self._predictor = PredictorSlot(predictor, self.lags)
        self.episode_totals = EpisodeTotals()    # episodes finished, over the whole run
        self.episode_log: EpisodeLog | None = None   # while started with a log directory
        self.runners: list[EnvRunner] = []
        self.manager: EnvRunnerManager | None = None
        self._first_player: Any = None    # built by check_fits, given to the first runner
        self._fits: tuple[Any, ...] | None = None   # (player, state_shape, dtype) checked last
        self._closed = False
        self._starting = False            # a start() has claimed the population
        self._builder: DaemonThread | None = None   # the thread building the manager
        # Held for a few bytecodes only (never across user code or a wait), to claim a start.
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ acting settings
    @property
    def exploration(self) -> float:
        """Epsilon of the runners now (a schedule's value at the steps stored so far); assign a
        number or a schedule to change it (the next step request carries it)."""
        return self._exploration.at(self.manager.progress()[0] if self.manager is not None else 0)

    @exploration.setter
    def exploration(self, value: ExplorationArg) -> None:
        self._exploration.set(value)

    @property
    def exploration_schedule(self) -> Callable[[int], float] | None:
        """The schedule given as ``exploration``, or None when it is a number."""
        return self._exploration.schedule

    @property
    def exploration_assigned(self) -> bool:
        """Whether epsilon was assigned since the population was built (a number or a
        schedule), not only given to the constructor."""
        return self._exploration.assignments > 1

    @property
    def predictor(self) -> Callable[[np.ndarray], Any] | None:
        """The Q-function the runners use (see ``predictor`` in the class docstring).

        Assign a new one (e.g. after copying the learner's weights): it takes effect from the
        next greedy action any runner takes. A predictor that reads the live weights (a
        closure over a PyTorch module, say) needs no update at all.
        """
        return self._predictor.current

    @predictor.setter
    def predictor(self, predictor: Callable[[np.ndarray], Any] | None) -> None:
        self._predictor.set(predictor)

    @property
    def thread_context(self) -> Callable[[], contextlib.AbstractContextManager] | None:
        """The manager settings' ``thread_context`` when the population steps inline (one
        player: the requesting thread makes the env and predictor calls and must enter it),
        else None."""
        return self.manager_settings.thread_context if self.num_players == 1 else None

    @property
    def close_timeout(self) -> float:
        """Seconds :meth:`close` waits for the threads (the manager settings' ``close_timeout``)."""
        return self.manager_settings.close_timeout

    # ------------------------------------------------------------------ checks and start
    def frame_shape(self) -> tuple[int, ...]:
        """The frame shape the players declare: the first player's observation space (a
        vector player's ``single_observation_space``), for a memory built to fit them.

        Builds the first player, kept for the first runner (as :meth:`check_fits` does: no
        player is built only to look). TypeError if it declares no observation space.
        """
        player = self._take_first_player()
        space = (getattr(player, 'single_observation_space', None)
                 or getattr(player, 'observation_space', None))
        shape = getattr(space, 'shape', None)
        if shape is None:
            raise TypeError("get_player() returns a player without an observation space: give "
                            "the memory's state_shape")
        return tuple(shape)

    def _take_first_player(self) -> Any:
        """The first player, built now if it is not yet (None once started or closed)."""
        player = self._first_player
        if player is None and not self._starting and not self._closed:
            # User code, run with no lock held: a Ctrl-C reaches it as anywhere else.
            player = self._first_player = self.get_player()
        return player

    def check_fits(self, state_shape: tuple[int, ...], dtype: np.dtype, *,
                   shape_arg: str = 'state_shape', dtype_arg: str = 'dtype') -> None:
        """Refuse players whose observations a memory of ``state_shape`` frames of ``dtype``
        can not store, before any step is taken.

        Builds the first player (it becomes the first runner's) and reads its observation
        space (a vector player's ``single_observation_space``); a player without one is not
        checked here (its observations are, at every step). Raises ValueError naming
        ``shape_arg`` or ``dtype_arg`` (the caller's names for the two settings) and the fix.
        """
        player = self._take_first_player()
        if player is None or self._fits == (player, state_shape, dtype):
            return      # this player was checked for these frames (by a front end, say)
        try:
            check_observation_space(player, state_shape, dtype, shape_arg=shape_arg,
                                    dtype_arg=dtype_arg)
        except ValueError:
            self._first_player = None     # refused: not kept for a runner
            _close_quietly(player)
            raise
        self._fits = (player, state_shape, dtype)

    def start(self, memory: ReplayMemory, *, default_staleness: int | None = None,
              layout: str | None = None) -> None:
        """Build the runners on ``memory`` and their manager; steps nothing.

        ``default_staleness``: the ``maximum_staleness`` of a population that was given none
        (the starter's default; a :class:`~expreplay.stream.ReplayStream` passes its own, the
        one place that default is decided). A population with neither is refused
        (ValueError): it has no default of its own. ``layout``: the predictor's states
        frames last (``'NHWC'``; None: the same) or first (``'NCHW'``); a stream passes its
        sampling's, so that the players' states have the batches' layout.

        An exception on the way (a Ctrl-C in ``get_player()``, an env that fails to build)
        closes what was built and leaves the population as before the call. The manager's
        threads are started by a short-lived thread of the population's, so that no
        KeyboardInterrupt (Python raises it in the main thread only) lands between a thread's
        start and its recording: :meth:`close` sees every thread started. No lock is held
        across user code: a Ctrl-C reaches ``get_player()`` at once, and a :meth:`close`
        from another thread waits for the manager's construction only (milliseconds), not
        for the players; the start closes what it built once it sees the population closed.
        """
        frames_first = DrawSettings.given(layout=layout).layout == 'NCHW'
        staleness = self.maximum_staleness
        if staleness is None:
            if default_staleness is None:
                raise ValueError("the Population has no maximum_staleness: give it one, or "
                                 "start(memory, default_staleness=...)")
            staleness = default_staleness
        with self._lock:
            if self.manager is not None or self._starting or self._closed:
                raise RuntimeError("the Population is started already (or closed)")
            self._starting = True
        try:
            if self.episode_log_dir is not None:
                self.episode_log = EpisodeLog(os.path.join(os.fspath(self.episode_log_dir),
                                                           EPISODE_LOG_FILENAME))
            first, self._first_player = self._first_player, None
            self._predictor.frames_first = frames_first
            self._build(memory, first, staleness)
        except BaseException:
            if self.episode_log is not None:
                self.episode_log.close()
            self._starting = False
            raise
        if self._closed:      # close() ran meanwhile, before the manager was recorded
            self.close()

    def _build(self, memory: ReplayMemory, first: Any, staleness: int) -> None:
        on_end = _Fanout([self.episode_totals, self.episode_log, self._on_episode_end])
        runners: list[EnvRunner] = []
        try:
            for index in range(self.num_players):
                player = first if index == 0 and first is not None else self.get_player()
                # player_factory lets the manager replace a crashed env (max_restarts).
                runners.append(EnvRunner(player, self._predictor, memory, memory.history_len,
                                         settings=self.runner_settings, seed=self.seed,
                                         index=index, player_factory=self.get_player,
                                         episode_starts=self.episode_starts,
                                         on_episode_end=on_end))
            if len(runners) == 1:      # steps inline: starts no thread
                self.manager = EnvRunnerManager(runners, staleness, settings=self.manager_settings,
                                                request_lag=self.request_lag, lags=self.lags)
            else:
                self._start_manager(runners, staleness)
        except BaseException:
            for runner in runners:
                _close_quietly(runner)
            if first is not None and not runners:
                _close_quietly(first)
            raise
        self.runners = runners

    def _start_manager(self, runners: list[EnvRunner], staleness: int) -> None:
        """Build the manager, which starts the simulator and inference threads, in a thread of
        the population's own, and record it there.

        Python raises a KeyboardInterrupt in the main thread only: none lands in the
        manager's constructor between a thread's start and its recording (a thread nobody
        could stop), nor between the constructor's return and :attr:`manager`'s assignment.
        The building thread is recorded before it starts, and :meth:`close` waits for it.
        On an exception in the wait (a Ctrl-C) this thread waits for the building thread and
        closes the manager it recorded; a second exception cutting that short leaves the
        manager recorded, for :meth:`close` to finish.
        """
        failed: list[BaseException] = []

        def build() -> None:
            try:
                manager = EnvRunnerManager(runners, staleness, settings=self.manager_settings,
                                           request_lag=self.request_lag, lags=self.lags)
            except BaseException as err:
                failed.append(err)
                return
            self.manager = manager        # then `_closed` is read (see close())
            if self._closed:
                _close_quietly(manager)

        builder = self._builder = DaemonThread(build, 'Population-start')
        try:
            # Inside the try: start() waits for the thread to run, and a Ctrl-C in that wait
            # comes out of start() with the thread running.
            builder.start()
            builder.join()
        except BaseException:
            self._join_builder(1.0 + self.close_timeout)
            manager = self.manager
            if manager is not None:
                _close_quietly(manager)
                self.manager = None     # closed: a later start() may try again
            raise
        if failed:
            raise failed[0]

    def _join_builder(self, timeout: float | None) -> None:
        """Wait up to ``timeout`` seconds (None: for ever) for the building thread to end,
        also one whose ``start()`` an exception cut short: that thread may still be starting
        (it then builds and, seeing the population closed, closes the manager itself)."""
        builder = self._builder
        if builder is None or builder is threading.current_thread():
            return
        builder.join(None if timeout is None or math.isinf(timeout) else timeout)

    @property
    def started(self) -> bool:
        """Whether :meth:`start` built the runners (also once they are closed)."""
        return self.manager is not None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def per_request(self) -> int:
        """The most steps one request can store (the largest vector player's ``num_envs``)."""
        return max(int(getattr(r, 'num_envs', 1)) for r in self.runners)

    @property
    def inline(self) -> bool:
        """One runner steps inline, in the thread that requests: that thread does the env calls."""
        return self.num_players == 1

    # ------------------------------------------------------------------ stepping
    def step(self, exploration: float) -> None:
        """Request one step of a runner (see :meth:`EnvRunnerManager.step`)."""
        self._manager().step(exploration)

    def progress(self) -> tuple[int, int]:
        """``(steps stored, requests pending)`` (see :meth:`EnvRunnerManager.progress`; also
        after :meth:`close`)."""
        return self._manager().progress()

    def wait_idle(self) -> None:
        """Wait until no request is pending."""
        self._manager().wait_idle()

    def _manager(self) -> EnvRunnerManager:
        if self.manager is None:
            raise RuntimeError("the Population is not started: call start(memory)")
        return self.manager

    # ------------------------------------------------------------------ statistics
    def reset_stats(self) -> ScoreWindow:
        """The mean and largest score of the games finished since the last call, a
        :class:`~expreplay.stats.ScoreWindow` (``(None, None)`` without games, and before
        :meth:`start` and after :meth:`close`); starts a new statistics window."""
        if self.manager is None or self._closed:
            return ScoreWindow()
        return self.manager.reset_stats()

    def stats(self) -> PopulationStats:
        """The manager's figures since the last :meth:`reset_stats` (an empty window before
        :meth:`start` and after :meth:`close`), the window's greedy share and the episode
        totals of the run: a :class:`~expreplay.stats.PopulationStats`."""
        manager = self.manager
        window = manager.stats() if manager is not None and not self._closed else ManagerStats()
        starts = self.start_counts()
        greedy = None
        if window.steps:
            # States sent to the predictor per step taken: the share of greedy actions, i.e.
            # 1 - the exploration the runners actually applied in this window.
            rows = window.inference_calls * (window.mean_inference_batch or 0.0)
            greedy = min(1.0, rows / window.steps)
        return PopulationStats.extending(
            window, greedy_fraction=greedy,
            episodes_total=self.episode_totals.snapshot().episodes,
            episodes_started_total=sum(starts.values()), restart_starts=starts.get('restart', 0),
            lags=self.lags.figures())

    def start_counts(self) -> dict[str, int]:
        """Episodes started so far per start kind, over all runners (kept after close)."""
        out: dict[str, int] = {}
        for runner in self.runners:
            for kind, n in runner.start_counts().items():
                out[kind] = out.get(kind, 0) + n
        return out

    # ------------------------------------------------------------------ stopping
    def close(self, timeout: float | None = None) -> None:
        """Stop and join every simulator thread and close the players, then the episode log;
        idempotent (a call cut short by a KeyboardInterrupt is finished by the next one). A
        runner fault not raised yet is raised here. ``timeout``: seconds to wait for the
        threads (None: :attr:`close_timeout`); a thread still inside an env or predictor call
        then is reported and left running (see :class:`~expreplay.EnvRunnerManager`)."""
        # Single stores and reads, no lock: a close is not held up by a start in progress
        # beyond the manager's construction (whose thread looks at `_closed` once the
        # manager is recorded, and closes it itself if this call did not see it).
        self._closed = True
        self._join_builder(self.close_timeout if timeout is None else timeout)
        manager = self.manager
        first, self._first_player = self._first_player, None
        if first is not None:                 # checked but never started
            _close_quietly(first)
        try:
            if manager is not None:
                manager.close(timeout)        # idempotent, and finishes one cut short
        finally:
            if self.episode_log is not None:
                self.episode_log.close()      # after the threads: their last records are in it


def check_observation_space(player: Any, state_shape: tuple[int, ...], dtype: Any, *,
                            shape_arg: str, dtype_arg: str) -> None:
    """Refuse ``player`` if its observation space has frames a memory of ``state_shape`` and
    ``dtype`` can not store (see :meth:`Population.check_fits`)."""
    space = getattr(player, 'single_observation_space', None)
    batched = False
    if space is None:
        space = getattr(player, 'observation_space', None)
        batched = hasattr(player, 'num_envs')     # a look-alike may give the batched space
    shape, space_dtype = getattr(space, 'shape', None), getattr(space, 'dtype', None)
    if shape is None or space_dtype is None:
        return
    shape, dtype, state_shape = tuple(shape), np.dtype(dtype), tuple(state_shape)
    # The runners' rule (FrameFormat): equal once the axes of size 1 are removed.
    fits = [_squeezed(shape)] + ([_squeezed(shape[1:])] if batched and shape else [])
    if _squeezed(state_shape) not in fits:
        frame = shape[1:] if batched and shape and _squeezed(shape[1:]) else shape
        raise ValueError(f"get_player() returns a player whose observations have shape "
                         f"{shape} ({space!r}), which {shape_arg}={state_shape} does not "
                         f"fit: pass {shape_arg}={frame}")
    problem = _lossy(space, np.dtype(space_dtype), dtype)
    if problem is not None:
        raise ValueError(f"get_player() returns a player whose observations are {problem} "
                         f"({space!r}), which {dtype_arg}='{dtype}' can not store: pass "
                         f"{dtype_arg}='{_storing_dtype(np.dtype(space_dtype))}'")


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _lossy(space: Any, src: np.dtype, dtype: np.dtype) -> str | None:
    """Why values of ``space`` can not be stored as ``dtype`` (the memory's rule, read on the
    space's dtype and bounds), or None."""
    from ..storage._inputs import lossy_float   # the memory's rule for floats, not a copy
    if src == dtype or src.kind not in 'biuf':
        return None
    if dtype.kind == 'f':
        # A float memory takes what is finite (checked per step), unless it rounds (float16).
        return f"{src}" if lossy_float(src, dtype) else None
    if src.kind == 'f':
        return f"{src}"
    low, high = getattr(space, 'low', None), getattr(space, 'high', None)
    if low is None or high is None or src.kind == 'b':
        return None
    lo, hi = (0, 1) if dtype.kind == 'b' else (np.iinfo(dtype).min, np.iinfo(dtype).max)
    low, high = np.asarray(low), np.asarray(high)
    if low.size and (low.min() < lo or high.max() > hi):
        return f"{src} in [{low.min()}, {high.max()}]"
    return None


def _storing_dtype(src: np.dtype) -> str:
    return 'float32' if src.kind == 'f' else str(src)


class _Fanout:
    """Calls each of several episode-end callbacks in turn (one runner callback, many jobs)."""

    def __init__(self, callbacks: list[Any]) -> None:
        self.callbacks = [cb for cb in callbacks if cb is not None]

    def __call__(self, record: EpisodeRecord) -> None:
        for callback in self.callbacks:
            callback(record)


def _close_quietly(obj: Any) -> None:
    close = getattr(obj, 'close', None)
    if callable(close):
        try:
            close()
        except Exception:
            logger.exception("while closing %r", obj)
