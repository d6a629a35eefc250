"""A framework-free replay stream: threaded population and sampling behind ``for batch in stream``.

:class:`ReplayStream` is what :class:`expreplay.ExpReplay` does for tensorpack, for any other
trainer (PyTorch, JAX, TF2 eager, plain numpy). It is put together from the objects that own
each setting: the :class:`~expreplay.ReplayMemory` (capacity, frame layout, prioritization), the
:class:`~expreplay.acting.population.Population` (the players and how they act) and the
:class:`~expreplay.stream.sampling.Sampling` (the batches and their ratio to the inserts)::

    def q_values(states):                   # (n, *state_shape, history_len) -> (n, num_actions)
        return my_model(states)

    memory = ReplayMemory(100_000, (84, 84), history_len=4)
    population = Population(make_env, num_players=4, predictor=q_values)
    sampling = Sampling(batch_size=64, update_frequency=4)
    with ReplayStream(memory, population, sampling, init_memory_size=5_000) as stream:
        for step, batch in enumerate(stream):   # a SampleBatch: see Sampling's batch_format
            # the target: batch.reward + batch.discount * max_a Q(batch.next_state, a)
            train_on(batch.state, batch.action, batch.reward, batch.next_state, batch.discount)
            stream.exploration = max(0.1, 1 - step / 100_000)
            if step == 200_000:
                break

With ``Sampling(..., batch_format='tensorpack')`` the batches are tensorpack's 4-list instead
(1-step returns from a uniform memory only)::

    sampling = Sampling(batch_size=64, update_frequency=4, batch_format='tensorpack')
    with ReplayStream(memory, population, sampling, init_memory_size=5_000) as stream:
        for comb_state, action, reward, is_over in stream:   # NHWC: history_len + 1 frames
            train_on(comb_state[..., :-1], action, reward, comb_state[..., 1:],
                     0.99 * (1 - is_over))                    # the 1-step discount

The ratio of sampled to inserted transitions
============================================
The ratio counts the transitions actually inserted into the memory, whatever the player: one
per step of a single env; a vector env's sub-env steps, but not the rows in which a sub-env
autoresets (they store nothing); for an asynchronous engine (EnvPool in async mode, Ray
actors), the sub-envs' results as they are received. Before drawing batch ``k`` (from 1) the
stream has requested steps until the requests it made can insert at least

    fill + (k - 1) * update_frequency          transitions (``fill``: those of the initial fill)

so, past the initial fill, ``sampled : inserted = batch_size : update_frequency`` for every
kind of player: ``batch_size / update_frequency`` samples per inserted transition (16 for
tensorpack's DQN example, 64 / 4; 8 for the Nature DQN, 32 / 4). Set ``update_frequency`` to
the transitions you want inserted per batch; do not divide it by ``num_envs``: a request to a
vector or asynchronous player inserts up to ``num_envs`` transitions, and the stream makes
fewer requests accordingly (one request per two batches with 8 sub-envs and
``update_frequency=4``). ``stats().samples_per_insert`` is the measured ratio.

Staleness: requests run asynchronously in the simulator threads with at most
``maximum_staleness`` pending (with one player they run inline: none). When batch ``k`` is
drawn, the requests made so far are counted as inserting ``num_envs`` each while pending, so
the memory lacks at most ``maximum_staleness * num_envs`` of the ``fill + (k - 1) *
update_frequency`` (for single-env players: all but at most ``maximum_staleness`` of exactly
``fill + (k - 1) * update_frequency`` requests are in the memory). A request that inserts
fewer than counted (an autoreset row, a partial receive) is made up by the next batch's
requests: the count is cumulative, the ratio does not drift. The fill's requests go through the
same window: when the memory holds ``init_memory_size`` transitions, up to
``maximum_staleness`` of them may still be pending; they count as the fill's (``fill``
above), and they play at the fill's exploration after the first batch. A step acts with the
predictor's weights when it starts, whenever it was requested: the lag a window makes delays
the step and the exploration its request carries, not the weights.

With ``Sampling(samples_per_insert=)`` instead of ``update_frequency``, a
:class:`~expreplay.stream.ratelimit.SampleToInsertRatio` decides: before each batch the stream
books the transitions inserted so far with the limiter and requests steps (waiting for
pending ones to be stored when they will do) until it admits the batch, so ``sampled /
inserted`` stays within the limiter's error buffer of ``samples_per_insert`` (a fractional
ratio, e.g. 0.5, is fine).

Prefetch
========
With ``prefetch=depth`` (by default :data:`DEFAULT_PREFETCH` with several vector players, else
0: :func:`default_prefetch`) a thread of the stream's own (``ReplayStream-prefetch``) draws the
batches and makes the step requests above, keeping up to ``depth`` batches ready: the learner's
``next()`` only takes one, and never waits while the memory and the players keep up. What stays
exact: the ratio and the staleness bound above hold when each batch is *drawn*. What depth
changes: a batch may be drawn up to ``depth`` batches before it is handed out, so it holds no
transition inserted in the meantime (at most ``depth * update_frequency`` newer ones), and the
players run up to ``depth`` batches' requests ahead of the learner. The thread draws only when
there is room, so a slower learner slows the players with it. With prioritized replay the
queued batches were drawn, and their importance weights computed, with the priorities of the
moment they were drawn: priorities fed back with ``update_priorities`` shape the batches drawn
after the call, i.e. from the ``depth + 1``-th next batch on. If a slot of a queued batch is
rewritten before its priorities come back, that update is skipped and counted
(``stats().stale_priority_updates``), never applied to the new transition. ``prefetch=0`` draws
in the learner's ``next()``, as without a prefetcher. A consumer that queues batches itself
adds its queue to the depth: under tensorpack's ``QueueInput`` (50 batches) the learner trains
up to ``50 + depth`` batches behind the draws.

Ending: :meth:`ReplayStream.close` (from any thread) ends the iteration: a ``next()`` blocked
waiting for a batch returns, the loop ends (StopIteration), and the prefetch thread is
joined before the memory is saved. An exception in the prefetch thread or a simulator
thread is raised from the learner's next ``next()`` (batches still queued are dropped): the
same exception, chained to the original cause as the manager raises it (a
:class:`~expreplay.errors.RunnerError` naming the thread and runner), with a note naming the
prefetch thread; or from ``close()`` if no ``next()`` raised it.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import numpy as np

from .._checks import check_int
from ..stats import ScoreWindow, StreamStats
from ..presets import ATARI_DQN, MINATAR_DQN, Preset
from ..storage.memory import ReplayMemory
from .checkpoint import MemoryCheckpoint
from .fill import ProgressArg, check_progress, fill_memory
from .pacing import Pacer
from .preset_parts import build_preset_stream
from .prefetch import DEFAULT_PREFETCH, Prefetcher, default_prefetch
from .sampling import Sampling
from .watch import RandomPlayWatch

if TYPE_CHECKING:
    from ..acting.episodes import EpisodeTotals
    from ..lags import DataLags
    from ..acting.population import Population
    from ..storage.memory import SampleBatch
    from .ratelimit import SampleToInsertRatio

__all__ = ['ReplayStream', 'DEFAULT_PREFETCH', 'default_prefetch']

logger = logging.getLogger(__name__)


Batch = Any   # tensorpack's [comb_state, action, reward, isOver] list, or a SampleBatch


class ReplayStream:
    """Threaded experience replay as a plain Python iterator of numpy batches.

    Iterating fills the memory to ``init_memory_size`` first (once), then yields batches
    forever (:class:`~expreplay.storage.memory.SampleBatch` tuples, or tensorpack's
    ``[comb_state, action, reward, isOver]`` with ``batch_format='tensorpack'``: see
    :class:`~expreplay.stream.sampling.Sampling`), requesting environment steps from the
    population so that the sampling's ratio holds (see the module docstring for the exact
    bound), the batches drawn ahead by a prefetch thread (``prefetch``). Stop by breaking out of
    the loop and calling :meth:`close` (or use the stream as a context manager); a ``close()``
    from another thread ends the loop.

    Args:
        memory (ReplayMemory): where the players write and the batches come from; its
            prioritization decides whether :meth:`update_priorities` is fed back. The players'
            observation space is checked against its ``state_shape`` and ``dtype`` here.
        population (Population): the players and how they act; started on ``memory`` by
            :meth:`start`, stopped by :meth:`close`.
        sampling (Sampling): the batches and how many per inserted transition.
        init_memory_size (int): transitions in the memory before the first batch (at least
            ``batch_size`` are always collected).
        prefetch (int): batches a thread of the stream's own draws ahead (0: drawn in the
            learner's ``next()``); see "Prefetch" in :mod:`expreplay.stream.replay_stream` for
            what the depth means for freshness and prioritized replay. None: chosen by
            :meth:`start` (:func:`default_prefetch`): :data:`DEFAULT_PREFETCH` with several
            vector players, else 0.
        checkpoint_dir (str): where the memory is saved (:meth:`save_memory`, :meth:`close`).
            When a checkpoint is there and ``memory`` is new (nothing written to it), the
            checkpoint is loaded *into* ``memory``, in place (:meth:`MemoryCheckpoint.restore`:
            it must have all of ``memory``'s settings; a ``CheckpointError`` naming each that
            differs otherwise): :attr:`memory` is always the object passed. The fill then only
            adds what ``init_memory_size`` still asks for (:attr:`resumed`).
        progress: show the initial fill: True (tqdm, if installed), False, or
            ``progress(total, desc)`` returning an object with ``update(n)`` and ``close()``.
    """

    def __init__(self, memory: ReplayMemory, population: Population, sampling: Sampling,
                 init_memory_size: int = 0, *, prefetch: int | None = None,
                 checkpoint_dir: str | os.PathLike | None = None,
                 progress: ProgressArg = True) -> None:
        from ..acting.population import Population   # keeps `import expreplay.stream` light

        if not isinstance(memory, ReplayMemory):
            raise TypeError(f"memory must be a ReplayMemory, got {type(memory).__name__}")
        if not isinstance(population, Population):
            raise TypeError(f"population must be a Population, got {type(population).__name__}")
        if not isinstance(sampling, Sampling):
            raise TypeError(f"sampling must be a Sampling, got {type(sampling).__name__}")
        sampling.check_memory(memory)
        if population.request_lag is not None and sampling.samples_per_insert is not None:
            raise ValueError("request_lag needs Sampling(update_frequency=...): samples_per_insert "
                             "waits for requests to be stored, which request_lag holds back")
        self.sampling = sampling
        self.init_memory_size = check_int(init_memory_size, 'init_memory_size', 0,
                                          allow_float=True)
        if max(self.init_memory_size, sampling.batch_size) > memory.max_size:
            raise ValueError(f"init_memory_size ({self.init_memory_size}) and batch_size "
                             f"({sampling.batch_size}) must not exceed the memory's max_size "
                             f"({memory.max_size})")
        #: The prefetch depth; the default is chosen by :meth:`start`, once the players exist.
        self.prefetch: int | None = (None if prefetch is None
                                     else check_int(prefetch, 'prefetch', 0, allow_float=True))
        self._progress = check_progress(progress)
        self.checkpoint = None if checkpoint_dir is None else MemoryCheckpoint(checkpoint_dir)
        if self.checkpoint is not None:
            self.checkpoint.restore(memory)
        self.memory = memory
        #: Whether the memory held transitions when the stream was built (restored or given).
        self.resumed = len(memory) > 0
        population.check_fits(memory.state_shape, memory.dtype)
        self.population = population
        lag, given = population.request_lag, population.maximum_staleness
        if lag is not None and given is not None and given < self._requests_held(lag):
            raise ValueError(f"maximum_staleness={given} can not hold the requests of "
                             f"request_lag={lag}: give at least {self._requests_held(lag)}, or None")
        self.rate_limiter: SampleToInsertRatio | None = None   # built by start()
        self.fill_steps = 0              # step requests made by the initial fill
        self._pacer: Pacer | None = None              # the requests per batch, built by start()
        self._prefetcher: Prefetcher | None = None    # started by the first batches()
        # No lock is held across user code or a wait, or by close() (a Ctrl-C can land in
        # the main thread between any two bytecodes, and CPython does not promise that a
        # `with` block's exit runs after its body: a lock left held would hang the next
        # close). Start and close coordinate by single stores: each stores its part, then
        # reads the other's, so one of them always sees the other (see start(), batches()).
        # Taken without waiting by the start() that starts the population (a test-and-set);
        # given back if that start fails, so that a later one tries again.
        self._start_claim = threading.Lock()
        # One close() at a time, to its end. Reentrant: a close() cut short in this thread
        # between the acquire and the `with` body leaves it held, and this thread's next
        # close() still gets in.
        self._close_lock = threading.RLock()
        self._close_finished = False
        self._close_error: BaseException | None = None
        self._ready = threading.Event()   # set once the initial fill is done (or on close)
        self._closed = False
        self._random_play = RandomPlayWatch(population)

    # ------------------------------------------------------------------ the learner's knobs
    @property
    def exploration(self) -> float:
        """The population's epsilon now (:attr:`Population.exploration`); assign a number, or a
        schedule of the steps stored, to change it."""
        return self.population.exploration

    @exploration.setter
    def exploration(self, value: float | Callable[[int], float]) -> None:
        self.population.exploration = value

    @property
    def predictor(self) -> Callable[[np.ndarray], Any] | None:
        """The population's Q-function (:attr:`Population.predictor`); assign one to give the
        runners a new Q-function."""
        return self.population.predictor

    @predictor.setter
    def predictor(self, predictor: Callable[[np.ndarray], Any] | None) -> None:
        self.population.predictor = predictor

    @property
    def maximum_staleness(self) -> int:
        """Step requests that may be pending: the population's ``maximum_staleness``, or, left
        None, twice the transitions inserted per batch (as tensorpack's reference), which
        :meth:`start` gives the population as its default. The one place that default is
        decided: neither the population nor ExpReplay has one."""
        given = self.population.maximum_staleness
        if given is not None:
            return given
        if self.population.request_lag is not None:
            return self._requests_held(self.population.request_lag)
        return 2 * self.sampling.steps_per_batch

    def _requests_held(self, request_lag: int) -> int:
        """A window's requests with ``request_lag``: its updates', the prefetch's and one per player."""
        depth = DEFAULT_PREFETCH if self.prefetch is None else self.prefetch
        return (request_lag + depth + 2) * self.sampling.steps_per_batch + self.population.num_players

    @property
    def episode_totals(self) -> EpisodeTotals:
        """The population's episodes finished so far (:attr:`Population.episode_totals`)."""
        return self.population.episode_totals

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the population on the memory and fill it to ``init_memory_size``; idempotent.

        Iterating calls it; call it yourself to fill at a moment of your choice. Blocks until
        the fill is done. A memory resumed from a checkpoint is filled only up to what it lacks.
        A :meth:`close` from another thread during the fill ends it (``start`` returns; the
        stream is closed).
        """
        population, sampling = self.population, self.sampling
        if self._closed:
            raise RuntimeError("the ReplayStream is closed")
        if population.started or not self._start_claim.acquire(blocking=False):
            return
        try:
            # A close() from another thread meanwhile closes the population; its start sees
            # that and closes what it built (Population.start).
            population.start(self.memory, default_staleness=self.maximum_staleness,
                             layout=sampling.layout)
        except BaseException as err:
            self._start_claim.release()    # not started: a later start() tries again
            if self._closed and isinstance(err, Exception):   # closed under it: not a fault
                return
            raise
        if self.prefetch is None:
            self.prefetch = default_prefetch(population)
        limiter = self.rate_limiter = sampling.rate_limiter(population.per_request)
        try:
            self.fill_steps = fill_memory(
                self.memory, population, max(self.init_memory_size, sampling.batch_size),
                self._progress, lambda: self._closed)
            if self._closed:
                return
            pacer = Pacer(population, sampling.batch_size, sampling.update_frequency, limiter,
                          lambda: population.exploration)
            population.reset_stats()    # statistics windows start with the training
        except Exception:
            if self._closed:    # close() from another thread stopped the manager under us
                return
            raise
        self._pacer = pacer
        if not self._closed:
            self._ready.set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the initial fill is done or the stream is closed; True if ready."""
        self._ready.wait(timeout)
        return self._ready.is_set() and not self._closed

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def prefetcher(self) -> Prefetcher | None:
        """The thread drawing batches ahead: None with ``prefetch=0`` and before the first
        batch is asked for."""
        return self._prefetcher

    def close(self, save: bool = True) -> None:
        """Stop and join the prefetch thread and every simulator thread, then save the memory
        if a checkpoint is set.

        Idempotent and finishing: once a call has completed, later ones return at once. The
        threads get the population's ``close_timeout`` in all (one deadline for every wait):
        a thread still inside an env or predictor call then is reported (RuntimeWarning) and
        left running as a daemon; then the memory is saved. A call cut short (a second
        Ctrl-C, any exception) leaves the rest to the next call, which does every part again
        (stopping what is stopped is free) and saves; a save cut short leaves the previous
        checkpoint (saves are written aside and renamed). To keep a second Ctrl-C from
        cutting the save short at all, run the script's body in
        :func:`~expreplay.interrupts.stop_on_signals`. Any thread may call it: an iteration in
        another thread ends (see "Prefetch" in the module docstring); a second caller waits
        for the first. A runner or prefetch fault that no ``next()`` raised yet is raised
        here, after the threads are stopped and the memory is saved.
        """
        with self._close_lock:
            if not self._close_finished:
                self._close(save)
                self._close_finished = True
                error, self._close_error = self._close_error, None
                if error is not None:
                    raise error

    def _close(self, save: bool) -> None:
        """:meth:`close`'s work; each part may run again after an interrupted call."""
        self._closed = True      # stored before the prefetcher is read (see batches())
        prefetcher = self._prefetcher
        # A hold of the memory's lock that an exception cut short in this thread (the numpy
        # write path's `with` exit skipped) would keep the simulator threads waiting for it.
        self.memory.ring.lock.release_abandoned()
        self._ready.set()   # wakes anyone in wait_ready(), who then sees `closed`
        population = self.population
        close_timeout = population.close_timeout
        deadline = None if math.isinf(close_timeout) else time.monotonic() + close_timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        if prefetcher is not None:
            prefetcher.stop()
            if population.inline:
                # The prefetch thread does the env calls itself: let it finish the one it is
                # in before the runner is closed under it (within the one deadline).
                prefetcher.join(left())
        error: BaseException | None = None
        try:
            population.close(left())
        except Exception as err:   # re-raised below, once the memory is safe
            error = err
        if prefetcher is not None:
            if not prefetcher.join(left()):
                warnings.warn(f"ReplayStream.close: {prefetcher.name} still running after "
                              f"{close_timeout} s (inside an env or predictor call); left as a "
                              "daemon thread", RuntimeWarning, stacklevel=3)
            if error is None:
                error = prefetcher.unraised_error()
        if save and self.checkpoint is not None:
            self.checkpoint.save(self.memory)
        self._close_error = error

    def __enter__(self) -> ReplayStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Threads must not outlive a forgotten stream; never raise from a finalizer. (No
        # thread of the stream's refers to it: the prefetch thread holds only its parts.)
        try:
            if not self._close_finished:
                self.close(save=False)
        except Exception:
            pass

    # ------------------------------------------------------------------ batches
    def __iter__(self) -> Iterator[Batch]:
        """Yield batches until :meth:`close` (also one from another thread, also during the
        initial fill); see the class docstring."""
        if not self._closed:
            self.start()
        return self.batches()

    def batches(self) -> Iterator[Batch]:
        """The batch iterator behind ``iter(stream)``, without the implicit :meth:`start`.

        For a consumer thread that must not do the fill itself: call :meth:`wait_ready` first.
        The first call starts the prefetch thread; empty once the stream is closed. One
        consumer at a time.
        """
        if self._closed:
            return iter(())
        if self._pacer is None:
            raise RuntimeError("the ReplayStream is not started: call start()")
        if not self.prefetch:
            return _drawn_here(self._drawer(), lambda: self._closed, self.population.lags)
        prefetcher = self._prefetcher
        if prefetcher is None:
            # With one player the env steps and the predictor run in the drawing thread:
            # it enters the manager's thread_context, as the manager's threads do. Recorded
            # before its thread starts, and `_closed` read after: a close() either sees the
            # prefetcher (and stops it) or is seen here (and it never starts).
            prefetcher = self._prefetcher = Prefetcher(
                self._drawer(), self.prefetch, name='ReplayStream-prefetch',
                thread_context=self.population.thread_context, start=False)
            if self._closed:
                prefetcher.stop()
                return iter(())
            prefetcher.start()
        return _handed_out(prefetcher, self.population.lags)

    def _drawer(self) -> Callable[[], tuple[int, Batch]]:
        """The batches' maker: the requests due before the next batch (see the module
        docstring), then the batch, with the learner's update count at its draw. A function
        of the stream's parts, not of the stream: the prefetch thread calls it, and must not
        keep a dropped stream alive (its finalizer stops the threads, from the thread that
        dropped it)."""
        pacer, watch, sampling, memory = self._pacer, self._random_play, self.sampling, self.memory
        lags = self.population.lags
        assert pacer is not None

        def draw() -> tuple[int, Batch]:
            pacer.before_draw()
            watch.after_draw()
            return lags.updates, sampling.draw(memory)
        return draw

    def sample(self) -> list[np.ndarray] | SampleBatch:
        """One batch, without requesting new environment steps (thread-safe)."""
        return self.sampling.draw(self.memory)

    def count_updates(self, n: int = 1) -> None:
        """The learner made ``n`` updates (for one that queues batches, or uses several per
        update; ``count_updates(0)`` before the first batch says so): from the first call on,
        ``stats().lags`` counts these instead of the batches handed out, and the batches handed
        out ahead of them as the input queue's delay (:class:`~expreplay.lags.DataLags`).
        With ``request_lag`` it waits for the requests that update releases to start."""
        self.population.lags.count_updates(check_int(n, 'n', 0))

    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """Feed the learner's new priorities (|TD error|) for a batch's ``indices`` back to a
        prioritized memory; see :meth:`ReplayMemory.update_priorities
        <expreplay.ReplayMemory.update_priorities>` (stale entries are skipped and counted)."""
        return self.memory.update_priorities(indices, priorities)

    # ------------------------------------------------------------------ statistics
    def stats(self) -> StreamStats:
        """Figures since the last :meth:`reset_stats` (or the end of the fill): the
        population's (:meth:`Population.stats`) plus the memory's, the batches' and the
        prefetcher's, as a :class:`~expreplay.stats.StreamStats`."""
        memory, pacer, prefetcher = self.memory, self._pacer, self._prefetcher
        return StreamStats.extending(
            self.population.stats(),
            memory_transitions=len(memory), memory_fill=len(memory) / memory.max_size,
            fill_steps=self.fill_steps,
            stale_priority_updates=memory.stale_priority_updates if memory.prioritized else None,
            batches_drawn=pacer and pacer.batches, step_requests=pacer and pacer.requests,
            samples_per_insert=pacer and pacer.measured_samples_per_insert(),
            prefetch_ready=prefetcher and prefetcher.ready(),
            prefetch_waits=prefetcher and prefetcher.waits,
            prefetch_wait_time=prefetcher and prefetcher.wait_time)

    def reset_stats(self) -> ScoreWindow:
        """The mean and largest score of the games finished since the last call, a
        :class:`~expreplay.stats.ScoreWindow` (``(None, None)`` without games; a tuple, so
        ``mean, best = reset_stats()`` unpacks it); starts a new statistics window."""
        return self.population.reset_stats()

    def save_memory(self) -> None:
        """Save the memory to the checkpoint directory now (writers wait while it is written)."""
        if self.checkpoint is None:
            raise RuntimeError("no checkpoint_dir was given")
        self.checkpoint.save(self.memory)

    # ------------------------------------------------------------------ presets
    @classmethod
    def from_preset(cls, preset: Preset, get_player: Callable[[], Any] | None = None,
                    predictor: Callable[[np.ndarray], Any] | None = None, *,
                    memory: ReplayMemory | Mapping[str, Any] | None = None,
                    population: Population | Mapping[str, Any] | None = None,
                    sampling: Sampling | Mapping[str, Any] | None = None,
                    seed: int | None = None, **stream_settings: Any) -> ReplayStream:
        """A stream of ``get_player``'s games acted on with ``predictor``, its parts built from
        ``preset`` (:class:`expreplay.presets.Preset`).

        Each part is either passed in, used as it is, or built from the preset's values for
        it updated with a mapping of the part's own keyword arguments:
        ``memory={'max_size': 200_000, 'prioritized': True}``, ``population={'num_players':
        8}``, ``sampling={'n_step': 3, 'beta': 0.4}``. A population built here acts with the
        preset's epsilon schedule (:class:`~expreplay.presets.FrameSchedule`, going on from
        a memory restored from ``checkpoint_dir``) unless the mapping gives ``exploration``.
        ``seed`` seeds the population and the sampling built here. The other keywords are
        the stream's own (``init_memory_size``, the preset's fill by default; ``prefetch``,
        ``checkpoint_dir``, ``progress``).

        Raises TypeError naming a keyword no part takes, a setting given for a part that is
        passed in, a seed given twice, or get_player or predictor beside a population passed
        in (it has them); ValueError for a seed that would seed nothing.
        """
        return build_preset_stream(cls, preset, get_player, predictor, memory=memory,
                                   population=population, sampling=sampling, seed=seed,
                                   stream_settings=stream_settings)

    @classmethod
    def atari_dqn(cls, get_player: Callable[[], Any] | None = None,
                  predictor: Callable[[np.ndarray], Any] | None = None,
                  **settings: Any) -> ReplayStream:
        """The replay of tensorpack's ``examples/DeepQNetwork/DQN.py``: :meth:`from_preset` of
        :data:`expreplay.presets.ATARI_DQN` (its values and their sources are there), e.g.
        ``ReplayStream.atari_dqn(get_player, q_values, memory={'max_size': 200_000}, seed=0)``.
        """
        return cls.from_preset(ATARI_DQN, get_player, predictor, **settings)

    @classmethod
    def minatar_dqn(cls, get_player: Callable[[], Any] | None = None,
                    predictor: Callable[[np.ndarray], Any] | None = None,
                    **settings: Any) -> ReplayStream:
        """The replay of the MinAtar paper's DQN: :meth:`from_preset` of
        :data:`expreplay.presets.MINATAR_DQN` (its values and their sources are there; the
        frame shape is read from the players' observation space), e.g.
        ``ReplayStream.minatar_dqn(get_player, q_values, seed=0, memory={'prioritized': True},
        sampling={'n_step': 3}, init_memory_size=1_000)``.
        """
        return cls.from_preset(MINATAR_DQN, get_player, predictor, **settings)


def _drawn_here(draw: Callable[[], tuple[int, Batch]], closed: Callable[[], bool],
                lags: DataLags) -> Iterator[Batch]:
    """Batches drawn in the consumer's own next() (no prefetch thread), until ``closed()``;
    ``lags`` told of each hand-out and each next() after the first (an update made)."""
    while not closed():
        try:
            drawn_at, batch = draw()
            lags.handed_out(drawn_at)
        except Exception:
            if closed():   # close() from another thread stopped the manager under us
                return
            raise
        yield batch
        lags.next_asked()


def _handed_out(prefetcher: Prefetcher, lags: DataLags) -> Iterator[Batch]:
    """The prefetch thread's batches, until it is stopped; each told to ``lags``."""
    while True:
        item = prefetcher.get()
        if item is Prefetcher.END:
            return
        drawn_at, batch = item
        lags.handed_out(drawn_at)
        yield batch
        lags.next_asked()
