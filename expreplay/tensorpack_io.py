"""tensorpack integration: :class:`ExpReplay`, a drop-in for tensorpack's DQN example replay.

tensorpack's ``examples/DeepQNetwork/DQN.py`` does ``from expreplay import ExpReplay``, which
picks up the example's own ``expreplay.py`` next to it. Remove that file (or write
``from expreplay.tensorpack_io import ExpReplay``) and the script runs on this package; the rest
stays as it is: ``TrainConfig(data=QueueInput(expreplay), callbacks=[..., expreplay,
ScheduledHyperParamSetter(ObjAttrParam(expreplay, 'exploration'), ...)])``.

tensorpack 0.11 builds its layers with ``tf.layers``, which TensorFlow >= 2.16 only provides with
the ``tf-keras`` package installed and ``TF_USE_LEGACY_KERAS=1`` set *before TensorFlow is
imported*. Importing this module sets it when TensorFlow is not imported yet, and warns with the
fix when TensorFlow was already imported without it.
"""

import logging
import numbers
import os
import sys
import warnings

from ._extras import extra_import_error


def _ensure_legacy_keras():
    """Route ``tf.keras`` / ``tf.compat.v1.layers`` to tf-keras, as tensorpack needs.

    TensorFlow reads ``TF_USE_LEGACY_KERAS`` once, when it is imported; setting it later has no
    effect, so all we can do then is say how to fix the script.
    """
    tf = sys.modules.get('tensorflow')
    if tf is None:
        os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
        if os.environ['TF_USE_LEGACY_KERAS'] not in ('1', 'true', 'True'):
            warnings.warn(
                f"TF_USE_LEGACY_KERAS={os.environ['TF_USE_LEGACY_KERAS']!r} is set: tensorpack's "
                "layers (tf.layers) will not be available. Unset it or set it to 1.",
                RuntimeWarning, stacklevel=2)
        return
    # TensorFlow >= 2.16 records its choice in a module attribute; older versions have no
    # such switch (tf.layers always exists there).
    if getattr(tf, '_tf_uses_legacy_keras', True) is False:
        warnings.warn(
            "TensorFlow was imported before expreplay.tensorpack_io without TF_USE_LEGACY_KERAS=1: "
            "tensorpack's layers (tf.layers) will fail with 'not available with Keras 3'. Fix: set "
            "the variable before TensorFlow is imported, e.g. `TF_USE_LEGACY_KERAS=1 python "
            "train.py`, or `os.environ['TF_USE_LEGACY_KERAS'] = '1'` (or `import expreplay."
            "tensorpack_io`) at the top of the script, before `import tensorflow`; and install "
            "tf-keras of the same minor version as tensorflow.",
            RuntimeWarning, stacklevel=2)


_ensure_legacy_keras()

# The imports below load TensorFlow: they must come after the environment is set.
try:
    from tensorpack.callbacks.base import Callback  # noqa: E402
    from tensorpack.dataflow.base import DataFlow, DataFlowTerminated  # noqa: E402
    from tensorpack.utils import logger  # noqa: E402
    from tensorpack.utils.utils import get_tqdm  # noqa: E402
except ImportError as err:
    raise extra_import_error('ExpReplay', 'tensorpack', err) from err

from ._checks import check_int  # noqa: E402
from .stream.replay_stream import DEFAULT_PREFETCH, REPLAY_ARGS_DOC, ReplayStream  # noqa: E402

__all__ = ['ExpReplay']


class _ToTensorpackLog(logging.Handler):
    """Shows expreplay's own log records (checkpoint saves and loads, restarts) in tensorpack's
    log, where a tensorpack user looks; not when the application set up logging itself (the
    root logger has handlers), which then shows them as it chose."""

    def emit(self, record):
        if not logging.getLogger().handlers:
            logging.getLogger('tensorpack').handle(record)


def _show_expreplay_log_in_tensorpack():
    package_logger = logging.getLogger('expreplay')
    if not any(isinstance(h, _ToTensorpackLog) for h in package_logger.handlers):
        package_logger.addHandler(_ToTensorpackLog())
        if package_logger.level == logging.NOTSET:
            package_logger.setLevel(logging.INFO)


_show_expreplay_log_in_tensorpack()


def _tensorpack_progress(total, desc):
    # tensorpack's own bar style, so the fill looks like the epochs that follow it.
    return get_tqdm(total=total, desc=desc)


class ExpReplay(DataFlow, Callback):
    """Experience replay for DQN in tensorpack: a :class:`DataFlow` of batches and a :class:`Callback`.

    Arguments are those of tensorpack's ``examples/DeepQNetwork/expreplay.py``, plus keyword
    arguments with defaults. As a **DataFlow** it yields ``[comb_state, action, reward, isOver]``
    batches forever, once the memory holds ``init_memory_size`` transitions, and per batch it
    has ``update_frequency`` transitions inserted: ``batch_size`` sampled transitions per
    ``update_frequency`` inserted ones, whatever the player (see :mod:`expreplay.stream` for
    the exact bound; its prefetch thread draws the batches ahead, ``prefetch``). It is
    not fork-safe: use it with ``QueueInput`` or ``FeedInput``, not a multiprocess prefetcher.

    As a **Callback** it takes its predictor from the trainer (``_setup_graph``), builds
    ``num_parallel_players`` runners and fills the memory before training (``_before_train``),
    reports statistics to the trainer's monitors after every epoch (``_trigger``), and stops
    every simulator thread when training ends (``_after_train``), saving the memory first if
    ``checkpoint_dir`` is set.

    Set :attr:`exploration` (epsilon) directly or with
    ``ScheduledHyperParamSetter(ObjAttrParam(expreplay, 'exploration'), ...)``: the runners use
    the value from their next step on.

    Args:
        predictor_io_names (tuple[list[str], list[str]]): input and output tensor names of the
            Q-network, e.g. ``(['state'], ['Qvalue'])``, passed to ``trainer.get_predictor``.
            A callable is accepted too and used as the predictor as is (no trainer needed).
        get_player (callable): returns a new environment: a gymnasium Env, an old-gym-API env
            (``reset() -> obs``, 4-tuple ``step``) or a gymnasium VectorEnv.
        num_parallel_players (int): environments, each stepped by its own thread.
        state_shape (tuple): shape of one observation frame (without history).
        batch_size (int): transitions per batch.
        memory_size (int): transitions kept in the replay memory.
        init_memory_size (int): transitions in the memory before training starts.
        update_frequency (int): transitions inserted per batch (whatever the player).
        history_len (int): frames per state.
        state_dtype: numpy dtype of the stored frames.
        maximum_staleness (int): step requests that may be pending; ``2 * update_frequency``
            by default, as the reference.
        exploration (float): initial epsilon (1.0, as the reference).
        seed (int): seeds the batch sampling and the environments' first resets.
        layout (str): ``'NHWC'`` (frames on the last axis, tensorpack's DQNModel) or
            ``'NCHW'`` (frames first, for models that transpose on the device).
        checkpoint_dir (str): directory for the memory checkpoint. A training started with a
            directory that holds one loads it instead of filling the memory again; the memory
            is saved there when training ends.
        checkpoint_every_k_epochs (int): also save the memory every k epochs (e.g. as often
            as ``ModelSaver`` saves the model, so that a crash resumes from a matching pair).
            None: only at the end.
        runner_kwargs (dict): extra keyword arguments for every :class:`~expreplay.EnvRunner`
            (e.g. ``life_loss_terminal=True`` for Atari).
        manager_kwargs (dict): extra keyword arguments for the
            :class:`~expreplay.EnvRunnerManager` (e.g. ``max_restarts=3``); ``close_timeout``
            defaults to 60 s here: training ends only once every thread is joined.
            ``simulator_threads`` keeps the manager's default (single-env players share one
            pipelined thread: it steps them in two groups while the other group's forward pass
            runs; each vector player gets its own); ``num_parallel_players`` gives one thread
            per player (players that release the GIL, with cores to spare).
        episode_starts: an episode-start scheduler for all runners (seed schedules, a
            curriculum, a restart pool: see :mod:`expreplay.acting.episodes`).
        episode_log_dir (str): where ``episodes.jsonl`` (one record per finished episode,
            flushed and fsync'd as it finishes) is written. None (default): tensorpack's log
            directory (``logger.get_logger_dir()``, read when training starts), if one is set;
            False: no episode log.
        on_episode_end (callable): called with every
            :class:`~expreplay.acting.episodes.EpisodeRecord`, from the simulator threads.
REPLAY_ARGS

    Monitors (after every epoch, under ``expreplay/``): ``mean_score`` and ``max_score`` of
    the games finished in the epoch (only when some did), ``games``, ``mean_episode_length``,
    ``env_steps_per_sec``, ``memory_fill`` (fraction of ``memory_size``),
    ``memory_transitions``, ``queue_depth`` (step requests pending), ``mean_inference_batch``
    (states per predictor call), ``greedy_fraction`` (share of greedy actions: 1 - the
    exploration the runners applied) and ``restarts``; and totals since the start of training:
    ``episodes_total`` (episodes finished) and ``restart_starts`` (episodes started from a
    restart point).

    Faults: an exception in a simulator thread or the predictor fails the training at its next
    step, chained to the original.
    """

    def __init__(self, predictor_io_names, get_player, num_parallel_players, state_shape,
                 batch_size, memory_size, init_memory_size, update_frequency, history_len,
                 state_dtype='uint8', maximum_staleness=None, *, exploration=1.0, seed=None,
                 layout='NHWC', checkpoint_dir=None, checkpoint_every_k_epochs=None,
                 runner_kwargs=None, manager_kwargs=None, episode_starts=None,
                 episode_log_dir=None, on_episode_end=None, n_step=1, gamma=0.99,
                 prioritized=False, alpha=0.6, priority_eps=1e-6, beta=None,
                 samples_per_insert=None, prefetch=DEFAULT_PREFETCH):
        if callable(predictor_io_names):
            predictor, self.predictor_io_names = predictor_io_names, None
        else:
            predictor, self.predictor_io_names = None, predictor_io_names
            # Fail here, not in the middle of the trainer's setup.
            if isinstance(predictor_io_names, (str, bytes)) or \
                    not isinstance(predictor_io_names, (tuple, list)) or len(predictor_io_names) != 2:
                raise ValueError("predictor_io_names must be (input names, output names), e.g. "
                                 f"(['state'], ['Qvalue']), or a callable; got {predictor_io_names!r}")
        if checkpoint_every_k_epochs is not None:
            if checkpoint_dir is None:
                raise ValueError("checkpoint_every_k_epochs needs a checkpoint_dir")
            checkpoint_every_k_epochs = check_int(checkpoint_every_k_epochs,
                                                  'checkpoint_every_k_epochs', 1, allow_float=True)
        self.checkpoint_every_k_epochs = checkpoint_every_k_epochs
        # At the end of training, waiting for a simulator thread to finish its env step or
        # predictor call is cheap, and a thread left running would call a closed Session.
        manager_kwargs = dict({'close_timeout': 60.0}, **(manager_kwargs or {}))
        self.stream = ReplayStream(
            predictor, get_player, num_parallel_players, state_shape, batch_size, memory_size,
            init_memory_size, update_frequency, history_len, state_dtype,
            maximum_staleness=maximum_staleness, exploration=exploration, seed=seed,
            layout=layout, checkpoint_dir=checkpoint_dir, progress=_tensorpack_progress,
            runner_kwargs=runner_kwargs, manager_kwargs=manager_kwargs,
            episode_starts=episode_starts, on_episode_end=on_episode_end,
            episode_log_dir=episode_log_dir or None, n_step=n_step, gamma=gamma,
            prioritized=prioritized, alpha=alpha, priority_eps=priority_eps, beta=beta,
            samples_per_insert=samples_per_insert, prefetch=prefetch)
        # None: follow tensorpack's log directory, which scripts usually set after building
        # the dataflow, so it is read in _before_train.
        self._episode_log_follows_logger = episode_log_dir is None
        self._fault = None            # a simulator fault seen by the DataFlow (EnqueueThread)
        self._fault_raised = False
        if self.stream.resumed:
            logger.info("ExpReplay resumes with %d transitions from %s; the initial fill only adds "
                        "what init_memory_size still asks for.",
                        len(self.stream.memory), self.stream.checkpoint.path)

    # The reference's attribute names, kept for scripts that read them.
    @property
    def mem(self):
        """The :class:`~expreplay.ReplayMemory`."""
        return self.stream.memory

    @property
    def exploration(self):
        """Epsilon of the epsilon-greedy runners; assigning it reaches them at their next step."""
        return self.stream.exploration

    @exploration.setter
    def exploration(self, value):
        self.stream.exploration = float(value)

    @property
    def predictor(self):
        return self.stream.predictor

    @predictor.setter
    def predictor(self, predictor):
        self.stream.set_predictor(predictor)

    def __getattr__(self, name):
        # Read-only access to the constructor arguments (batch_size, history_len, ...), as the
        # reference stores them all as attributes. Only called when normal lookup fails.
        if name != 'stream' and name in _STREAM_ATTRIBUTES:
            return getattr(self.stream, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------ DataFlow
    def __iter__(self):
        # Runs in tensorpack's EnqueueThread, which starts before _before_train: wait for the fill.
        if not self.stream.wait_ready():
            raise DataFlowTerminated()
        try:
            yield from self.stream.batches()
        except Exception as err:
            # A simulator fault (or a sampling error). Raised here, it would only be logged by the
            # EnqueueThread, which then closes the input queue, and tensorpack ends a training
            # whose queue is closed as if the data had run out. So record it, and hand out one
            # more batch from the memory (intact: only the population failed): the trainer's
            # main thread, which may be waiting for data, completes one more step and raises
            # the fault from _trigger_step.
            self._fault = err
            yield self.stream.sample()
            raise err
        # The stream ends only when it is closed: tell the EnqueueThread to exit quietly.
        raise DataFlowTerminated()

    def __len__(self):
        raise NotImplementedError("ExpReplay yields batches forever")

    # ------------------------------------------------------------------ Callback
    def _setup_graph(self):
        if self.predictor_io_names is not None:
            self.predictor = self.trainer.get_predictor(*self.predictor_io_names)

    def _before_train(self):
        if self._episode_log_follows_logger:
            self.stream.episode_log_dir = logger.get_logger_dir()
        self.stream.start()

    def _trigger_step(self):
        fault = self._fault
        if fault is not None:
            self._fault_raised = True
            raise RuntimeError(f"ExpReplay could not produce a batch: {fault}") from fault

    def _trigger(self):
        monitors = self.trainer.monitors
        stats = self.stream.stats()
        self.stream.reset_stats()   # the next window starts now
        if stats.get('games'):
            monitors.put_scalar('expreplay/mean_score', stats['mean_score'])
            monitors.put_scalar('expreplay/max_score', stats['max_score'])
        for name, key in _MONITORED:
            value = stats.get(key)
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                monitors.put_scalar('expreplay/' + name, value)
        if (self.checkpoint_every_k_epochs is not None
                and self.epoch_num % self.checkpoint_every_k_epochs == 0):
            self.stream.save_memory()

    def _after_train(self):
        # Before the trainer closes its session: the runners may be inside the predictor.
        try:
            self.stream.close()
        finally:
            if self._fault is not None and not self._fault_raised:
                # The learner was starved when the fault hit: the trainer stopped on the closed
                # input queue as if the data had run out. Say why.
                logger.error("ExpReplay: training stopped because the replay failed: %r", self._fault)

    def save_memory(self):
        """Save the memory to ``checkpoint_dir`` now."""
        self.stream.save_memory()

    def update_priorities(self, indices, priorities):
        """New priorities for a batch's ``indices`` (see :meth:`ReplayStream.update_priorities`);
        :class:`PriorityFeedback` in ``examples/dqn_model.py`` calls it after every step."""
        return self.stream.update_priorities(indices, priorities)


if ExpReplay.__doc__:   # None under python -OO
    ExpReplay.__doc__ = ExpReplay.__doc__.replace('REPLAY_ARGS\n', REPLAY_ARGS_DOC)


# (monitor name under 'expreplay/', key of ReplayStream.stats())
_MONITORED = (
    ('games', 'games'),
    ('mean_episode_length', 'mean_episode_length'),
    ('env_steps_per_sec', 'steps_per_sec'),
    ('memory_fill', 'memory_fill'),
    ('memory_transitions', 'memory_transitions'),
    ('queue_depth', 'queue_depth'),
    ('mean_inference_batch', 'mean_inference_batch'),
    ('greedy_fraction', 'greedy_fraction'),
    ('restarts', 'restarts'),
    ('episodes_total', 'episodes_total'),
    ('restart_starts', 'restart_starts'),
)

_STREAM_ATTRIBUTES = frozenset([
    'get_player', 'num_parallel_players', 'state_shape', 'batch_size', 'memory_size',
    'init_memory_size', 'update_frequency', 'history_len', 'state_dtype', 'maximum_staleness',
    'seed', 'layout', 'checkpoint', 'episode_starts', 'episode_log', 'episode_totals',
    'n_step', 'gamma', 'prioritized', 'beta', 'samples_per_insert', 'rate_limiter',
    'named_batches', 'prefetch'])
