"""A framework-free replay stream: threaded population and sampling behind ``for batch in stream``.

:class:`ReplayStream` is what :class:`expreplay.ExpReplay` does for tensorpack, for any other
trainer (PyTorch, JAX, TF2 eager, plain numpy)::

    def q_values(states):                   # (n, *state_shape, history_len) -> (n, num_actions)
        return my_model(states)

    with ReplayStream(q_values, make_env, num_parallel_players=4, state_shape=(84, 84),
                      batch_size=64, memory_size=100_000, init_memory_size=5_000,
                      update_frequency=4, history_len=4) as stream:
        for step, (comb_state, action, reward, is_over) in enumerate(stream):
            train_on(comb_state, action, reward, is_over)
            stream.exploration = max(0.1, 1 - step / 100_000)
            if step == 200_000:
                break

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
``update_frequency=4``). ``stats()['samples_per_insert']`` is the measured ratio.

Staleness: requests run asynchronously in the simulator threads with at most
``maximum_staleness`` pending (with one player they run inline: none). When batch ``k`` is
drawn, the requests made so far are counted as inserting ``num_envs`` each while pending, so
the memory lacks at most ``maximum_staleness * num_envs`` of the ``fill + (k - 1) *
update_frequency`` (for single-env players: all but at most ``maximum_staleness`` of exactly
``fill + (k - 1) * update_frequency`` requests are in the memory). A request that inserts
fewer than counted (an autoreset row, a partial receive) is made up by the next batch's
requests: the count is cumulative, the ratio does not drift.

With ``samples_per_insert=`` instead of ``update_frequency``, a
:class:`~expreplay.stream.ratelimit.SampleToInsertRatio` decides: before each batch the stream
books the transitions inserted so far with the limiter and requests steps (waiting for
pending ones to be stored when they will do) until it admits the batch, so ``sampled /
inserted`` stays within the limiter's error buffer of ``samples_per_insert`` (a fractional
ratio, e.g. 0.5, is fine).

Prefetch
========
With ``prefetch=depth`` (default :data:`DEFAULT_PREFETCH`) a thread of the stream's own
(``ReplayStream-prefetch``) draws the batches and makes the step requests above, keeping up
to ``depth`` batches ready: the learner's ``next()`` only takes one, and never waits while
the memory and the players keep up. What stays exact: the ratio and the staleness bound
above hold when each batch is *drawn*. What depth changes: a batch may be drawn up to
``depth`` batches before it is handed out, so it holds no transition inserted in the
meantime (at most ``depth * update_frequency`` newer ones), and the players run up to
``depth`` batches' requests ahead of the learner. The thread draws only when there is room,
so a slower learner slows the players with it. With prioritized replay the queued batches
were drawn, and their importance weights computed, with the priorities of the moment they
were drawn: priorities fed back with ``update_priorities`` shape the batches drawn after
the call, i.e. from the ``depth + 1``-th next batch on. If a slot of a queued batch is
rewritten before its priorities come back, that update is skipped and counted
(``stats()['stale_priority_updates']``), never applied to the new transition. ``prefetch=0``
draws in the learner's ``next()``, as without a prefetcher. A consumer that queues batches
itself adds its queue to the depth: under tensorpack's ``QueueInput`` (50 batches) the
learner trains up to ``50 + depth`` batches behind the draws.

Ending: :meth:`ReplayStream.close` (from any thread) ends the iteration: a ``next()`` blocked
waiting for a batch returns, the loop ends (StopIteration), and the prefetch thread is
joined before the memory is saved. An exception in the prefetch thread or a simulator
thread is raised from the learner's next ``next()`` (batches still queued are dropped): the
same exception, chained to the original cause as the manager raises it (a
:class:`~expreplay.errors.RunnerError` naming the thread and runner), with a note naming the
prefetch thread; or from ``close()`` if no ``next()`` raised it.
"""

import collections.abc
import inspect
import logging
import math
import os
import threading
import warnings

import numpy as np

from .._checks import (check_callable, check_choice, check_dtype, check_int, check_probability,
                      check_real, check_seed, check_shape)
from ..acting.episodes import EPISODE_LOG_FILENAME, EpisodeLog, EpisodeTotals
from ..storage.memory import ReplayMemory
from .pacing import Pacer
from .prefetch import Prefetcher
from .ratelimit import SampleToInsertRatio

__all__ = ['ReplayStream', 'PredictorSlot', 'MemoryCheckpoint', 'REPLAY_ARGS_DOC',
           'DEFAULT_PREFETCH']

# Batches the prefetch thread keeps ready by default: enough to absorb the players' and the
# sampler's jitter for a learner taking 1 ms per batch (benchmarks/bench_e2e.py measures it).
DEFAULT_PREFETCH = 4

# The Rainbow-side arguments, documented once for ReplayStream and ExpReplay (spliced into both
# docstrings where the line ``REPLAY_ARGS`` stands).
REPLAY_ARGS_DOC = """\
        n_step (int): rewards summed per transition (n-step returns, >= 1). With ``n_step > 1``
            or ``prioritized`` the batches are :class:`~expreplay.storage.memory.SampleBatch` tuples
            ``(state, action, reward, next_state, discount, is_over, indices, weights)``: the
            target is ``reward + discount * Q(next_state)``, ``discount`` being ``gamma ** k``
            for the k steps taken and 0 after a terminal step (see
            :meth:`ReplayMemory.sample <expreplay.ReplayMemory.sample>`). Otherwise they keep
            tensorpack's ``[comb_state, action, reward, isOver]``.
        gamma (float): the discount of the n-step sums, in (0, 1].
        prioritized (bool): proportional prioritized replay; feed the learner's |TD errors|
            back with ``update_priorities(batch.indices, td)``.
        alpha (float): priority exponent in [0, 1].
        priority_eps (float): added to every priority (> 0).
        beta (float or callable): importance-sampling exponent in [0, 1], or a schedule
            ``beta(k)`` of the batch number k (0 for the first batch); None: weights of 1.
        samples_per_insert (float): instead of ``update_frequency`` (pass None for it): keep
            this many sampled transitions per inserted one, with a
            :class:`~expreplay.stream.ratelimit.SampleToInsertRatio` limiter; ``batch_size /
            update_frequency`` is the equivalent of the fixed schedule.
        prefetch (int): batches a thread of the stream's own draws ahead (0: drawn in the
            learner's ``next()``); see "Prefetch" in :mod:`expreplay.stream` for what the
            depth means for freshness and prioritized replay.
"""

logger = logging.getLogger(__name__)


class PredictorSlot:
    """A swappable predictor that the runners call: replacing it takes effect on the next call.

    The runners use tensorpack's convention, ``predictor(states)[0]`` is the Q-value array. A
    function that returns the Q-value array itself (a numpy array, a torch or JAX tensor, anything
    that is not a list or tuple) is wrapped so that both conventions work.
    """

    def __init__(self, predictor=None):
        self._predictor = predictor

    def set(self, predictor):
        """Use ``predictor`` from the next call on (a plain attribute store: atomic)."""
        if predictor is not None and not callable(predictor):
            raise TypeError(f"predictor must be callable, got {predictor!r}")
        self._predictor = predictor

    @property
    def current(self):
        return self._predictor

    def __call__(self, states):
        predictor = self._predictor
        if predictor is None:
            raise RuntimeError("no predictor set: the runners needed a greedy action before the "
                               "Q-function was given (set one, or use exploration=1.0)")
        out = predictor(states)
        if isinstance(out, (list, tuple)):
            return out
        return [np.asarray(out)]


class MemoryCheckpoint:
    """Where a replay memory is saved to and resumed from: ``<directory>/<filename>``.

    Loading checks that the checkpoint matches the memory the caller would otherwise build
    (size, frame shape, history, dtype, prioritized and its alpha / priority_eps) and refuses
    another one with ``ValueError`` naming the setting.
    """

    FILENAME = 'replay_memory.npz'

    def __init__(self, directory, filename=FILENAME):
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, filename)

    def exists(self):
        return os.path.isfile(self.path)

    def load(self, max_size, state_shape, history_len, dtype, **settings):
        """The saved memory, or None when there is no checkpoint yet. ``settings``: more of
        :meth:`ReplayMemory.load`'s expected settings (``prioritized``, ``alpha``, ...)."""
        if not self.exists():
            return None
        memory = ReplayMemory.load(self.path, max_size=max_size, state_shape=state_shape,
                                   history_len=history_len, dtype=dtype, **settings)
        logger.info("Loaded the replay memory from %s (%d transitions).", self.path, len(memory))
        return memory

    def save(self, memory):
        """Save ``memory`` atomically (``ReplayMemory.save`` writes aside, then renames, and
        logs where, how big, how long). Returns the file's size in bytes."""
        os.makedirs(self.directory, exist_ok=True)
        return memory.save(self.path)


def _default_progress(total, desc):
    """A tqdm bar when tqdm is installed, else a silent stand-in."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoProgress()
    return tqdm(total=total, desc=desc, dynamic_ncols=True)


class _NoProgress:
    def update(self, n):
        pass

    def close(self):
        pass


class _Population:
    """The runners and their manager: build them, step them, read their statistics, stop them.

    One job: keep the environments stepping into the memory on request. It knows nothing about
    batches or training.
    """

    def __init__(self, get_player, num_players, predictor, memory, history_len,
                 maximum_staleness, seed, runner_kwargs, manager_kwargs):
        from ..acting import EnvRunner, EnvRunnerManager   # keeps `import expreplay.stream` light

        runners = []
        try:
            for index in range(num_players):
                # player_factory lets the manager replace a crashed env (max_restarts).
                kwargs = dict(dict(seed=seed, index=index, player_factory=get_player),
                              **runner_kwargs)
                runners.append(EnvRunner(get_player(), predictor, memory, history_len, **kwargs))
            self.manager = EnvRunnerManager(runners, maximum_staleness, **manager_kwargs)
        except BaseException:
            for runner in runners:
                _close_quietly(runner)
            raise
        self.runners = runners
        # The most steps one request can store (a vector player's sub-envs).
        self.per_request = max(int(getattr(r, 'num_envs', 1)) for r in runners)
        # One runner steps inline, in the thread that requests: that thread does the env calls.
        self.inline = len(runners) == 1

    def step(self, exploration):
        self.manager.step(exploration)

    def progress(self):
        return self.manager.progress()

    def wait_idle(self):
        self.manager.wait_idle()

    def reset_stats(self):
        return self.manager.reset_stats()

    def stats(self):
        return self.manager.stats()

    def close(self):
        self.manager.close()

    def start_counts(self):
        """Episodes started so far per start kind, over all runners."""
        out = {}
        for runner in self.runners:
            for kind, n in runner.start_counts().items():
                out[kind] = out.get(kind, 0) + n
        return out


class _Fanout:
    """Calls each of several episode-end callbacks in turn (one runner callback, many jobs)."""

    def __init__(self, callbacks):
        self.callbacks = [cb for cb in callbacks if cb is not None]

    def __call__(self, record):
        for callback in self.callbacks:
            callback(record)


# Keyword arguments the stream sets itself (runner_kwargs may still override seed, index and
# player_factory, and give episode_starts / on_episode_end, which the stream combines).
_STREAM_SETS_FOR_RUNNER = ('player', 'predictor', 'memory', 'history_len')
_STREAM_SETS_FOR_MANAGER = ('env_runners', 'maximum_staleness')


def _check_kwargs(kwargs, name, target, reserved):
    """A copy of ``kwargs`` (None: empty) after checking that it is a mapping of keyword
    arguments that ``target`` (``'EnvRunner'`` or ``'EnvRunnerManager'``) accepts."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, collections.abc.Mapping):
        raise TypeError(f"{name} must be a dict of keyword arguments for {target}, "
                        f"got {kwargs!r}")
    from .. import acting as runner      # keeps `import expreplay.stream` light
    accepted = set(inspect.signature(getattr(runner, target)).parameters) - set(reserved)
    for key in kwargs:
        if key not in accepted:
            hint = (f" (the stream sets {key!r} itself)" if key in reserved else
                    f"; it takes {', '.join(sorted(accepted))}")
            raise TypeError(f"{name}: {target} has no argument {key!r}{hint}")
    return dict(kwargs)


# The stream's memory settings, as (the stream's argument, the memory's attribute).
_MEMORY_SETTINGS = (('memory_size', 'max_size'), ('state_shape', 'state_shape'),
                    ('history_len', 'history_len'), ('state_dtype', 'dtype'),
                    ('prioritized', 'prioritized'))


def _check_memory(memory, **wanted):
    """Refuse a ``memory=`` that is not the one the stream's settings describe."""
    if not isinstance(memory, ReplayMemory):
        raise TypeError(f"memory must be a ReplayMemory, got {type(memory).__name__}")
    for mine, theirs in _MEMORY_SETTINGS:
        got = getattr(memory, theirs)
        if got != wanted[mine]:
            raise ValueError(f"memory: its {theirs} is {got!r}, but the stream was given "
                             f"{mine}={wanted[mine]!r}")


def _drawn_here(draw, closed):
    """Batches drawn in the consumer's own next() (no prefetch thread), until ``closed()``."""
    while not closed():
        try:
            batch = draw()
        except Exception:
            if closed():   # close() from another thread stopped the manager under us
                return
            raise
        yield batch


def _handed_out(prefetcher):
    """The prefetch thread's batches, until it is stopped."""
    while True:
        batch = prefetcher.get()
        if batch is Prefetcher.END:
            return
        yield batch


def _close_quietly(obj):
    close = getattr(obj, 'close', None)
    if callable(close):
        try:
            close()
        except Exception:
            logger.exception("while closing %r", obj)


class ReplayStream:
    """Threaded experience replay as a plain Python iterator of numpy batches.

    Iterating fills the memory to ``init_memory_size`` first (once), then yields
    ``[comb_state, action, reward, isOver]`` batches forever, requesting environment steps so
    that ``update_frequency`` transitions are inserted per batch (see the module docstring for
    the exact ratio), the batches drawn ahead by a prefetch thread (``prefetch``). Stop by
    breaking out of the loop and calling :meth:`close` (or use the stream as a context
    manager); a ``close()`` from another thread ends the loop.

    Args:
        predictor: the Q-function, ``predictor(states)`` with ``states`` of shape
            ``(n, *state_shape, history_len)`` (channels-last, oldest frame first, dtype
            ``state_dtype``). It returns the Q-values ``(n, num_actions)``, or a list of outputs
            whose first is the Q-values (tensorpack's convention). With several players it is
            called from one inference thread (never concurrently), with one player from the
            thread that draws the batches (the prefetch thread, which enters
            ``manager_kwargs['thread_context']`` if given; with ``prefetch=0`` the thread that
            iterates). ``None`` is allowed while ``exploration`` is 1 (no greedy
            action is needed); see :meth:`set_predictor`.
        get_player: a callable returning a new environment (gymnasium, old gym API, or a
            gymnasium VectorEnv); called once per player, and again to replace a player that
            crashed when ``manager_kwargs`` allows restarts.
        num_parallel_players (int): environments stepped by their own threads.
        state_shape (tuple): shape of one observation frame.
        batch_size (int): transitions per batch.
        memory_size (int): transitions kept in the replay memory.
        init_memory_size (int): transitions in the memory before the first batch (at least
            ``batch_size`` are always collected).
        update_frequency (int): transitions inserted per batch, whatever the player (a request
            to a vector player inserts up to ``num_envs``: the stream requests accordingly).
        history_len (int): frames per state.
        state_dtype: dtype of the stored frames.
        maximum_staleness (int): pending step requests allowed; default ``2 * update_frequency``.
        exploration (float): initial epsilon of the epsilon-greedy runners; assign the attribute
            to change it: the next step request carries the new value.
        seed (int): seeds the sampling and, through the runners, the environments' first resets.
        layout (str): ``'NHWC'`` (frames on the last axis, tensorpack's DQNModel) or ``'NCHW'``.
        checkpoint_dir (str): if given, the memory is loaded from it when a checkpoint is there
            (no refill), and :meth:`save_memory` / :meth:`close` save it there.
        memory (ReplayMemory): use this memory instead of building (or loading) one; its
            ``max_size``, ``state_shape``, ``history_len``, ``dtype`` and ``prioritized`` must
            be the stream's ``memory_size``, ``state_shape``, ``history_len``, ``state_dtype``
            and ``prioritized`` (refused with ``ValueError`` naming the setting otherwise).
        progress: show the initial fill: True (tqdm, if installed), False, or
            ``progress(total, desc)`` returning an object with ``update(n)`` and ``close()``.
        runner_kwargs (dict): extra keyword arguments for every :class:`~expreplay.EnvRunner`
            (e.g. ``life_loss_terminal=True`` for Atari); a key EnvRunner does not take is
            refused at construction.
        manager_kwargs (dict): extra keyword arguments (checked the same way) for the
            :class:`~expreplay.EnvRunnerManager` (e.g. ``max_restarts``, ``max_inference_batch``).
            ``simulator_threads`` keeps the manager's default (single-env players share one
            pipelined thread, each vector player gets its own); ``num_parallel_players`` gives
            one thread per player (envs that release the GIL, with cores to spare).
        episode_starts: an episode-start scheduler shared by all runners (see
            :mod:`expreplay.acting.episodes`: seed schedules, a curriculum, a restart pool). With
            :class:`~expreplay.acting.episodes.ProceduralSeeds` two runs with the same base seed and
            ``num_parallel_players`` play the same episode seeds.
        episode_log_dir (str): if given, every finished episode is appended to
            ``<episode_log_dir>/episodes.jsonl`` (:class:`~expreplay.acting.episodes.EpisodeLog`:
            flushed and fsync'd per episode; a resumed run appends). The attribute of the same
            name may be changed until :meth:`start`.
        on_episode_end (callable): called with every :class:`~expreplay.acting.episodes.EpisodeRecord`,
            from the simulator threads.
REPLAY_ARGS
    """

    def __init__(self, predictor, get_player, num_parallel_players, state_shape, batch_size,
                 memory_size, init_memory_size, update_frequency, history_len,
                 state_dtype='uint8', *, maximum_staleness=None, exploration=1.0, seed=None,
                 layout='NHWC', checkpoint_dir=None, memory=None, progress=True,
                 runner_kwargs=None, manager_kwargs=None, episode_starts=None,
                 episode_log_dir=None, on_episode_end=None, n_step=1, gamma=0.99,
                 prioritized=False, alpha=0.6, priority_eps=1e-6, beta=None,
                 samples_per_insert=None, prefetch=DEFAULT_PREFETCH):
        self.get_player = check_callable(get_player, 'get_player')
        check_callable(predictor, 'predictor', allow_none=True)
        # Sizes take whole floats (tensorpack's DQN.py passes memory_size=1e6), as ReplayMemory.
        self.num_parallel_players = check_int(num_parallel_players, 'num_parallel_players', 1,
                                              allow_float=True)
        self.batch_size = check_int(batch_size, 'batch_size', 1, allow_float=True)
        self.memory_size = check_int(memory_size, 'memory_size', 1, allow_float=True)
        self.init_memory_size = check_int(init_memory_size, 'init_memory_size', 0, allow_float=True)
        if samples_per_insert is not None:
            if update_frequency is not None:
                raise ValueError("give update_frequency or samples_per_insert, not both "
                                 "(update_frequency=None with samples_per_insert)")
            self.samples_per_insert = check_real(samples_per_insert, 'samples_per_insert')
            if self.samples_per_insert <= 0:
                raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert!r}")
            self.update_frequency = None
        else:
            if update_frequency is None:
                raise ValueError("update_frequency is None: give it, or samples_per_insert")
            self.samples_per_insert = None
            self.update_frequency = check_int(update_frequency, 'update_frequency', 1, allow_float=True)
        self.history_len = check_int(history_len, 'history_len', 1, allow_float=True)
        if max(self.init_memory_size, self.batch_size) > self.memory_size:
            raise ValueError(f"init_memory_size ({self.init_memory_size}) and batch_size "
                             f"({self.batch_size}) must not exceed memory_size ({self.memory_size})")
        if maximum_staleness is None:
            # As the reference: twice the steps requested per batch.
            per_batch = self.update_frequency if self.update_frequency is not None else \
                math.ceil(self.batch_size / self.samples_per_insert)
            maximum_staleness = 2 * max(1, per_batch)
        self.maximum_staleness = check_int(maximum_staleness, 'maximum_staleness', 1,
                                           allow_float=True)
        self.layout = check_choice(layout, 'layout', ('NHWC', 'NCHW'))
        self.state_shape = check_shape(state_shape, 'state_shape')
        self.state_dtype = check_dtype(state_dtype, 'state_dtype')
        self.exploration = exploration           # checked by the property
        self.seed = check_seed(seed, 'seed')
        if not (progress is None or isinstance(progress, bool) or callable(progress)):
            raise TypeError(f"progress must be True, False or a callable progress(total, desc), "
                            f"got {progress!r}")
        self._rng = np.random.default_rng(seed)
        self._sample_lock = threading.Lock()     # the rng: prefetch thread and sample() callers
        self.prefetch = check_int(prefetch, 'prefetch', 0, allow_float=True)
        self._runner_kwargs = _check_kwargs(runner_kwargs, 'runner_kwargs', 'EnvRunner',
                                            _STREAM_SETS_FOR_RUNNER)
        if episode_starts is not None and self._runner_kwargs.get('episode_starts') is not None:
            raise ValueError("episode_starts is given twice (also in runner_kwargs)")
        check_callable(on_episode_end, 'on_episode_end', allow_none=True)
        runner_starts = self._runner_kwargs.pop('episode_starts', None)
        # `is None`, not `or`: a scheduler may define __len__ (an empty RestartPool is falsy).
        self.episode_starts = episode_starts if episode_starts is not None else runner_starts
        self.episode_log_dir = episode_log_dir
        self.episode_log = None          # the EpisodeLog while started with a log directory
        self.episode_totals = EpisodeTotals()
        self._on_episode_end = on_episode_end
        self._manager_kwargs = _check_kwargs(manager_kwargs, 'manager_kwargs',
                                             'EnvRunnerManager', _STREAM_SETS_FOR_MANAGER)
        self._progress = progress
        self._predictor = PredictorSlot(predictor)
        self.n_step = check_int(n_step, 'n_step', 1)
        self.gamma = check_real(gamma, 'gamma')
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
        if beta is not None and not callable(beta):
            check_probability(beta, 'beta')
        self.beta = beta
        if not isinstance(prioritized, (bool, np.bool_)):
            raise TypeError(f"prioritized must be True or False, got {prioritized!r}")
        self.prioritized = bool(prioritized)
        # The named n-step batch whenever the tensorpack 4-list can not carry what is asked.
        self.named_batches = self.n_step > 1 or self.prioritized
        self.rate_limiter = None          # built by start() when samples_per_insert is given
        self._batches_sampled = 0

        self.checkpoint = None if checkpoint_dir is None else MemoryCheckpoint(checkpoint_dir)
        if memory is None and self.checkpoint is not None:
            memory = self.checkpoint.load(
                self.memory_size, self.state_shape, self.history_len, self.state_dtype,
                prioritized=self.prioritized, extra_fields={},   # the runners write none
                **(dict(alpha=alpha, priority_eps=priority_eps) if self.prioritized else {}))
        if memory is None:
            memory = ReplayMemory(self.memory_size, self.state_shape, self.history_len,
                                  self.state_dtype, prioritized=self.prioritized, alpha=alpha,
                                  priority_eps=priority_eps)
        else:
            _check_memory(memory, memory_size=self.memory_size, state_shape=self.state_shape,
                          history_len=self.history_len, state_dtype=self.state_dtype,
                          prioritized=self.prioritized)
        self.memory = memory
        self.resumed = len(memory) > 0   # True when the memory came with transitions
        self.fill_steps = 0              # step requests made by the initial fill

        self._population = None
        self._pacer = None                # the step requests per batch, built by start()
        self._prefetcher = None           # the prefetch thread, started by the first batches()
        self._closed_start_counts = {}
        self._lock = threading.Lock()     # guards start/close against each other
        self._ready = threading.Event()   # set once the initial fill is done (or on close)
        self._closed = False

    @property
    def exploration(self):
        """Epsilon of the runners; assign it to change it (the next step request carries it)."""
        return self._exploration

    @exploration.setter
    def exploration(self, value):
        self._exploration = check_probability(value, 'exploration')

    # ------------------------------------------------------------------ predictor
    @property
    def predictor(self):
        """The Q-function the runners use (see the class docstring for its convention)."""
        return self._predictor.current

    @predictor.setter
    def predictor(self, predictor):
        self._predictor.set(predictor)

    def set_predictor(self, predictor):
        """Give the runners a new Q-function (e.g. after copying the learner's weights).

        Takes effect from the next greedy action any runner takes. A predictor that reads
        the live weights (a closure over a PyTorch module, say) needs no update at all.
        """
        self._predictor.set(predictor)

    # ------------------------------------------------------------------ lifecycle
    def start(self):
        """Build the runners and fill the memory to ``init_memory_size``; idempotent.

        Iterating calls it; call it yourself to fill at a moment of your choice. Blocks until
        the fill is done. A memory resumed from a checkpoint is filled only up to what it lacks.
        A :meth:`close` from another thread during the fill ends it (``start`` returns; the
        stream is closed).
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("the ReplayStream is closed")
            if self._population is not None:
                return
            if self.episode_log_dir is not None:
                self.episode_log = EpisodeLog(os.path.join(os.fspath(self.episode_log_dir),
                                                           EPISODE_LOG_FILENAME))
            runner_kwargs = dict(self._runner_kwargs)
            runner_kwargs['episode_starts'] = self.episode_starts
            runner_kwargs['on_episode_end'] = _Fanout([
                self.episode_totals, self.episode_log, self._on_episode_end,
                self._runner_kwargs.get('on_episode_end')])
            try:
                population = self._population = _Population(
                    self.get_player, self.num_parallel_players, self._predictor, self.memory,
                    self.history_len, self.maximum_staleness, self.seed, runner_kwargs,
                    self._manager_kwargs)
            except BaseException:
                if self.episode_log is not None:
                    self.episode_log.close()
                raise
        limiter = None
        if self.samples_per_insert is not None:
            limiter = self.rate_limiter = self._make_rate_limiter(population)
        try:
            self._fill(population)
            pacer = Pacer(population, self.batch_size, self.update_frequency, limiter,
                          lambda: self._exploration)
            population.reset_stats()    # statistics windows start with the training
        except Exception:
            if self._closed:    # close() from another thread stopped the manager under us
                return
            raise
        with self._lock:
            if self._closed:
                return
            self._pacer = pacer
        self._ready.set()

    def _make_rate_limiter(self, population):
        """The limiter for ``samples_per_insert``: a request stores up to ``per_request``
        transitions, the largest insert booked at once; a batch is the sample chunk. The
        error buffer is the smallest that can not deadlock."""
        per_request = population.per_request
        spi = self.samples_per_insert
        return SampleToInsertRatio(spi, 1, (per_request * spi + self.batch_size) / 2,
                                   insert_size=per_request, sample_size=self.batch_size)

    def _fill(self, population):
        """Request steps until the memory holds ``init_memory_size`` transitions (and a batch).

        Also stops once that many steps were inserted while the memory still holds fewer
        transitions: it is then as full as it gets (each episode's final frame takes a slot
        without being a transition), and waiting longer would never end.
        """
        memory = self.memory
        target = max(self.init_memory_size, self.batch_size)
        if len(memory) >= target:
            return
        logger.info("Filling the replay memory to %d transitions with exploration=%s ...",
                    target, self.exploration)
        written_at_start = memory.num_steps_written
        bar = self._make_progress(target)
        shown = min(len(memory), target)
        bar.update(shown)
        try:
            while len(memory) < target and memory.num_steps_written - written_at_start < target:
                if self._closed:
                    return
                population.step(self.exploration)
                self.fill_steps += 1
                now = min(len(memory), target)
                if now > shown:
                    bar.update(now - shown)
                    shown = now
        finally:
            bar.close()

    def _make_progress(self, total):
        if self._progress is True:
            return _default_progress(total, 'filling replay memory')
        if not self._progress:
            return _NoProgress()
        return self._progress(total, 'filling replay memory')

    def wait_ready(self, timeout=None):
        """Block until the initial fill is done or the stream is closed; True if ready."""
        self._ready.wait(timeout)
        return self._ready.is_set() and not self._closed

    @property
    def closed(self):
        return self._closed

    def close(self, save=True):
        """Stop and join the prefetch thread and every simulator thread, then save the memory
        if a checkpoint is set.

        Idempotent; any thread may call it: an iteration in another thread ends (see
        "Prefetch" in the module docstring). A runner or prefetch fault that no ``next()``
        raised yet is raised here, after the threads are stopped and the memory is saved.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            population, self._population = self._population, None
            prefetcher = self._prefetcher
        self._ready.set()   # wakes anyone in wait_ready(), who then sees `closed`
        timeout = None
        if population is not None:
            close_timeout = population.manager.close_timeout
            timeout = None if math.isinf(close_timeout) else close_timeout
        if prefetcher is not None:
            prefetcher.stop()
            if population is None or population.inline:
                # The prefetch thread does the env calls itself: let it finish the one it is
                # in before the runner is closed under it.
                prefetcher.join(timeout)
        error = None
        if population is not None:
            try:
                population.close()
            except Exception as err:   # re-raised below, once the memory is safe
                error = err
            # Start counts stay readable after close (stats() of a closed stream).
            self._closed_start_counts = population.start_counts()
        if prefetcher is not None:
            if not prefetcher.join(timeout):
                warnings.warn(f"ReplayStream.close: {prefetcher.name} still running after "
                              f"{timeout} s (inside an env or predictor call); left as a daemon "
                              "thread", RuntimeWarning, stacklevel=2)
            if error is None:
                error = prefetcher.unraised_error()
        if self.episode_log is not None:
            self.episode_log.close()   # after the threads: their last records are in it
        if save and self.checkpoint is not None:
            self.checkpoint.save(self.memory)
        if error is not None:
            raise error

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __del__(self):
        # Threads must not outlive a forgotten stream; never raise from a finalizer.
        try:
            if not self._closed:
                self.close(save=False)
        except Exception:
            pass

    # ------------------------------------------------------------------ batches
    def __iter__(self):
        """Yield batches until :meth:`close` (also one from another thread, also during the
        initial fill); see the class docstring."""
        if not self._closed:
            self.start()
        return self.batches()

    def batches(self):
        """The batch iterator behind ``iter(stream)``, without the implicit :meth:`start`.

        For a consumer thread that must not do the fill itself: call :meth:`wait_ready` first.
        The first call starts the prefetch thread; empty once the stream is closed. One
        consumer at a time.
        """
        with self._lock:
            if self._closed:
                return iter(())
            if self._pacer is None:
                raise RuntimeError("the ReplayStream is not started: call start()")
            if not self.prefetch:
                return _drawn_here(self._draw, lambda: self._closed)
            if self._prefetcher is None:
                # With one player the env steps and the predictor run in the drawing thread:
                # it enters the manager's thread_context, as the manager's threads do.
                context = (self._manager_kwargs.get('thread_context')
                           if self.num_parallel_players == 1 else None)
                self._prefetcher = Prefetcher(self._draw, self.prefetch,
                                              name='ReplayStream-prefetch',
                                              thread_context=context)
            return _handed_out(self._prefetcher)

    def _draw(self):
        """The requests due before the next batch (see the module docstring), then the batch."""
        self._pacer.before_draw()
        return self.sample()

    def sample(self):
        """One batch, without requesting new environment steps (thread-safe)."""
        # A fresh batch each time, not the memory's ``out=`` buffers: a learner may keep a
        # batch it was handed (a list of recent batches, a framework that copies lazily), and
        # a reused buffer would change under it; allocating is not what limits the stream.
        with self._sample_lock:
            if not self.named_batches:
                return self.memory.sample_batch(self.batch_size, rng=self._rng,
                                                layout=self.layout)
            beta = self.beta(self._batches_sampled) if callable(self.beta) else self.beta
            batch = self.memory.sample(self.batch_size, n_step=self.n_step, gamma=self.gamma,
                                       beta=beta, layout=self.layout, rng=self._rng)
            self._batches_sampled += 1
            return batch

    def update_priorities(self, indices, priorities):
        """Feed the learner's new priorities (|TD error|) for a batch's ``indices`` back to a
        prioritized memory; see :meth:`ReplayMemory.update_priorities
        <expreplay.ReplayMemory.update_priorities>` (stale entries are skipped and counted)."""
        return self.memory.update_priorities(indices, priorities)

    # ------------------------------------------------------------------ statistics
    def stats(self):
        """Figures since the last :meth:`reset_stats` (or the end of the fill), as a flat dict.

        The manager's figures (``games``, ``mean_score``, ``max_score``,
        ``mean_episode_length``, ``steps``, ``steps_per_sec``, ``inference_calls``,
        ``mean_inference_batch``, ``queue_depth``, ``restarts``, ...; None where there is no
        data), plus ``greedy_fraction`` (states predicted per step: 1 - the exploration the
        runners applied), ``memory_transitions``, ``memory_fill`` (fraction of
        ``memory_size``) and ``fill_steps`` (0 when a resumed memory needed no fill); and totals
        since the start (not reset by :meth:`reset_stats`): ``episodes_total`` (episodes
        finished), ``episodes_started_total`` and ``restart_starts`` (episodes started from a
        restart point, see :class:`~expreplay.acting.episodes.RestartPool`); ``batches_drawn``,
        ``samples_per_insert`` (measured: sampled transitions per transition inserted since
        the fill, whatever the player; None before one), ``step_requests`` (made since the
        fill); with a prefetcher ``prefetch_ready`` (batches ready now), ``prefetch_waits``
        (``next()`` calls that found none ready and waited) and ``prefetch_wait_time``
        (seconds they waited, summed).
        """
        population = self._population
        out = dict(population.stats()) if population is not None else {}
        starts = population.start_counts() if population is not None else self._closed_start_counts
        out['episodes_total'] = self.episode_totals.snapshot()['episodes']
        out['episodes_started_total'] = sum(starts.values())
        out['restart_starts'] = starts.get('restart', 0)
        steps, calls = out.get('steps'), out.get('inference_calls')
        if steps and calls is not None:
            # States sent to the predictor per step taken: the share of greedy actions, i.e.
            # 1 - the exploration the runners actually applied in this window.
            rows = calls * (out.get('mean_inference_batch') or 0.0)
            out['greedy_fraction'] = min(1.0, rows / steps)
        out['memory_transitions'] = len(self.memory)
        out['memory_fill'] = len(self.memory) / self.memory_size
        out['fill_steps'] = self.fill_steps
        if self.prioritized:
            out['stale_priority_updates'] = self.memory.stale_priority_updates
        pacer = self._pacer
        if pacer is not None:
            out['batches_drawn'] = pacer.batches
            out['samples_per_insert'] = pacer.measured_samples_per_insert()
            out['step_requests'] = pacer.requests
        prefetcher = self._prefetcher
        if prefetcher is not None:
            out['prefetch_ready'] = prefetcher.ready()
            out['prefetch_waits'] = prefetcher.waits
            out['prefetch_wait_time'] = prefetcher.wait_time
        return out

    def reset_stats(self):
        """``(mean, max)`` score of the games finished since the last call, or ``(None, None)``;
        starts a new statistics window."""
        population = self._population
        if population is None:
            return None, None
        return population.reset_stats()

    def save_memory(self):
        """Save the memory to the checkpoint directory now (writers wait while it is written)."""
        if self.checkpoint is None:
            raise RuntimeError("no checkpoint_dir was given")
        self.checkpoint.save(self.memory)


if ReplayStream.__doc__:   # None under python -OO
    ReplayStream.__doc__ = ReplayStream.__doc__.replace('REPLAY_ARGS\n', REPLAY_ARGS_DOC)
