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

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Literal

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

from ._checks import check_dtype, check_int  # noqa: E402
from .acting.population import Population  # noqa: E402
from .storage.memory import ReplayMemory  # noqa: E402
from .stream.replay_stream import ReplayStream  # noqa: E402
from .stream.sampling import Sampling  # noqa: E402

__all__ = ['ExpReplay']


class _ToTensorpackLog(logging.Handler):
    """Shows expreplay's own log records (checkpoint saves and loads, restarts) in tensorpack's
    log, where a tensorpack user looks; not when the application set up logging itself (the
    root logger has handlers), which then shows them as it chose."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            logging.getLogger('tensorpack').handle(record)


def _show_expreplay_log_in_tensorpack():
    package_logger = logging.getLogger('expreplay')
    if not any(isinstance(h, _ToTensorpackLog) for h in package_logger.handlers):
        package_logger.addHandler(_ToTensorpackLog())
        if package_logger.level == logging.NOTSET:
            package_logger.setLevel(logging.INFO)


_show_expreplay_log_in_tensorpack()


def _tensorpack_progress(total: int, desc: str) -> Any:
    # tensorpack's own bar style, so the fill looks like the epochs that follow it.
    return get_tqdm(total=total, desc=desc)


class ExpReplay(DataFlow, Callback):
    """Experience replay for DQN in tensorpack: a :class:`DataFlow` of batches and a :class:`Callback`.

    Arguments are those of tensorpack's ``examples/DeepQNetwork/expreplay.py``, plus keyword
    arguments with defaults; it builds the :class:`~expreplay.ReplayMemory`, the
    :class:`~expreplay.acting.population.Population` and the
    :class:`~expreplay.stream.sampling.Sampling` of a :class:`~expreplay.stream.ReplayStream`
    from them (:attr:`stream`). As a **DataFlow** it yields ``[comb_state, action, reward,
    isOver]`` batches forever (with ``n_step > 1`` or ``prioritized=True``, the eight fields of
    a :class:`~expreplay.storage.sampling.SampleBatch`), once the memory holds ``init_memory_size`` transitions, and per
    batch it has ``update_frequency`` transitions inserted: ``batch_size`` sampled transitions
    per ``update_frequency`` inserted ones, whatever the player (see
    :mod:`expreplay.stream.replay_stream` for the exact bound; its prefetch thread draws the
    batches ahead, ``prefetch``). It is not fork-safe: use it with ``QueueInput`` or
    ``FeedInput``, not a multiprocess prefetcher.

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
        get_player (callable): returns a new environment (see ``Population``'s ``get_player``);
            one is built here, to check its observation space against ``state_shape`` and
            ``state_dtype``.
        num_parallel_players (int): the Population's ``num_players``.
        state_shape (tuple): shape of one observation frame (without history); the memory's.
        batch_size (int): transitions per batch.
        memory_size (int): transitions kept in the replay memory (its ``max_size``).
        init_memory_size (int): transitions in the memory before training starts.
        update_frequency (int): transitions inserted per batch (whatever the player).
        history_len (int): frames per state.
        state_dtype: numpy dtype of the stored frames (the memory's ``dtype``).
        maximum_staleness (int): step requests that may be pending; None: the stream's
            default (:attr:`ReplayStream.maximum_staleness`: ``2 * update_frequency``, as the
            reference).
        exploration (float): initial epsilon (1.0, as the reference).
        seed (int): seeds the batch sampling and the environments' first resets.
        layout, n_step, gamma, beta, weight_norm, samples_per_insert: the
            :class:`~expreplay.stream.sampling.Sampling`'s.
        prioritized, alpha, priority_eps: the :class:`~expreplay.ReplayMemory`'s.
        checkpoint_dir (str): directory for the memory checkpoint (the stream's). A training
            started with a directory that holds one loads it into the memory built here
            instead of filling it again (it must have these settings, ``alpha`` and
            ``priority_eps`` included); the memory is saved there when training ends.
        checkpoint_every_k_epochs (int): also save the memory every k epochs (e.g. as often
            as ``ModelSaver`` saves the model, so that a crash resumes from a matching pair).
            None: only at the end.
        runner_kwargs, episode_starts, on_episode_end: the Population's.
        manager_kwargs (dict): the Population's; ``close_timeout`` defaults to 60 s here:
            training ends only once every thread is joined.
        episode_log_dir (str): the Population's, where ``episodes.jsonl`` is written. None
            (default): tensorpack's log directory (``logger.get_logger_dir()``, read when
            training starts), if one is set; False: no episode log.
        prefetch (int): the ReplayStream's (None: its default, 4 with several vector players,
            else 0: :func:`~expreplay.stream.replay_stream.default_prefetch`).

    Monitors (after every epoch, under ``expreplay/``): ``mean_score`` and ``max_score`` of
    the games finished in the epoch (only when some did), ``games``, ``mean_episode_length``,
    ``env_steps_per_sec``, ``memory_fill``, ``memory_transitions``, ``queue_depth``,
    ``mean_inference_batch``, ``greedy_fraction``, ``restarts``, ``episodes_total`` and
    ``restart_starts``: the fields of the stream's :meth:`~ReplayStream.stats` of those names
    (``env_steps_per_sec`` is ``steps_per_sec``; each is documented in
    :class:`expreplay.stats.StreamStats`), when they have a value.

    Faults: an exception in a simulator thread or the predictor fails the training at its next
    step, chained to the original.
    """

    def __init__(self, predictor_io_names: Any, get_player: Callable[[], Any],
                 num_parallel_players: int, state_shape: tuple[int, ...], batch_size: int,
                 memory_size: int, init_memory_size: int, update_frequency: int | None,
                 history_len: int, state_dtype: Any = 'uint8',
                 maximum_staleness: int | None = None, *, exploration: float = 1.0,
                 seed: int | None = None, layout: str = 'NHWC',
                 checkpoint_dir: str | os.PathLike | None = None,
                 checkpoint_every_k_epochs: int | None = None,
                 runner_kwargs: Mapping[str, Any] | None = None,
                 manager_kwargs: Mapping[str, Any] | None = None, episode_starts: Any = None,
                 episode_log_dir: str | os.PathLike | Literal[False] | None = None,
                 on_episode_end: Callable[[Any], None] | None = None, n_step: int = 1,
                 gamma: float = 0.99, prioritized: bool = False, alpha: float = 0.6,
                 priority_eps: float = 1e-6, beta: Any = None, weight_norm: str = 'memory',
                 samples_per_insert: float | None = None,
                 prefetch: int | None = None) -> None:
        predictor = self._take_predictor(predictor_io_names)
        if checkpoint_every_k_epochs is not None:
            if checkpoint_dir is None:
                raise ValueError("checkpoint_every_k_epochs needs a checkpoint_dir")
            checkpoint_every_k_epochs = check_int(checkpoint_every_k_epochs,
                                                  'checkpoint_every_k_epochs', 1, allow_float=True)
        self.checkpoint_every_k_epochs = checkpoint_every_k_epochs
        # The reference's names, checked here: the parts built below name theirs.
        num_parallel_players = check_int(num_parallel_players, 'num_parallel_players', 1,
                                         allow_float=True)
        memory_size = check_int(memory_size, 'memory_size', 1, allow_float=True)
        state_dtype = check_dtype(state_dtype, 'state_dtype')
        sampling = Sampling(batch_size, update_frequency, samples_per_insert=samples_per_insert,
                            n_step=n_step, gamma=gamma, beta=beta, weight_norm=weight_norm,
                            layout=layout, seed=seed,
                            # tensorpack's 4-list is 1-step uniform replay's; the rest needs
                            # SampleBatch's eight fields (discount, indices, weights).
                            batch_format='tensorpack' if n_step == 1 and not prioritized
                            else 'transitions')
        # At the end of training, waiting for a simulator thread to finish its env step or
        # predictor call is cheap, and a thread left running would call a closed Session.
        manager_kwargs = dict({'close_timeout': 60.0}, **(manager_kwargs or {}))
        population = Population(
            get_player, num_parallel_players, predictor, exploration=exploration,
            maximum_staleness=maximum_staleness, seed=seed, episode_starts=episode_starts,
            episode_log_dir=episode_log_dir or None, on_episode_end=on_episode_end,
            runner_kwargs=runner_kwargs, manager_kwargs=manager_kwargs)
        memory = ReplayMemory(memory_size, state_shape, history_len, state_dtype,
                              prioritized=prioritized, alpha=alpha, priority_eps=priority_eps)
        self.stream = ReplayStream(memory, population, sampling, init_memory_size,
                                   prefetch=prefetch, checkpoint_dir=checkpoint_dir,
                                   progress=_tensorpack_progress,
                                   arg_names={'dtype': 'state_dtype'})
        # None: follow tensorpack's log directory, which scripts usually set after building
        # the dataflow, so it is read in _before_train.
        self._episode_log_follows_logger = episode_log_dir is None
        self._fault: BaseException | None = None   # a simulator fault seen by the DataFlow
        self._fault_raised = False
        if self.stream.resumed:
            logger.info("ExpReplay resumes with %d transitions from %s; the initial fill only adds "
                        "what init_memory_size still asks for.",
                        len(self.stream.memory), checkpoint_dir)

    def _take_predictor(self, predictor_io_names: Any) -> Callable[..., Any] | None:
        """The predictor when ``predictor_io_names`` is one; else checks the names, kept for
        ``_setup_graph``."""
        if callable(predictor_io_names):
            self.predictor_io_names = None
            return predictor_io_names
        self.predictor_io_names = predictor_io_names
        # Fail here, not in the middle of the trainer's setup.
        if isinstance(predictor_io_names, (str, bytes)) or \
                not isinstance(predictor_io_names, (tuple, list)) or len(predictor_io_names) != 2:
            raise ValueError("predictor_io_names must be (input names, output names), e.g. "
                             f"(['state'], ['Qvalue']), or a callable; got {predictor_io_names!r}")
        return None

    # The reference's attribute names, kept for scripts that read them.
    @property
    def mem(self) -> ReplayMemory:
        """The :class:`~expreplay.ReplayMemory`."""
        return self.stream.memory

    @property
    def exploration(self) -> float:
        """Epsilon of the epsilon-greedy runners; assigning it reaches them at their next step."""
        return self.stream.exploration

    @exploration.setter
    def exploration(self, value: float) -> None:
        self.stream.exploration = float(value)

    @property
    def predictor(self) -> Callable[..., Any] | None:
        """The Q-function the runners act with (the stream's :attr:`~ReplayStream.predictor`):
        taken from the trainer in ``_setup_graph``, or assigned."""
        return self.stream.predictor

    @predictor.setter
    def predictor(self, predictor: Callable[..., Any] | None) -> None:
        self.stream.predictor = predictor

    def __getattr__(self, name: str) -> Any:
        # Read-only access to the constructor arguments (batch_size, history_len, ...), as the
        # reference stores them all as attributes. Only called when normal lookup fails.
        where = _REFERENCE_ATTRIBUTES.get(name)
        if where is not None and name != 'stream':
            part, attribute = where
            owner = self.stream if part == 'stream' else getattr(self.stream, part)
            return getattr(owner, attribute)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------ DataFlow
    def __iter__(self) -> Iterator[Any]:
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

    def __len__(self) -> int:
        raise NotImplementedError("ExpReplay yields batches forever")

    # ------------------------------------------------------------------ Callback
    def _setup_graph(self):
        if self.predictor_io_names is not None:
            self.predictor = self.trainer.get_predictor(*self.predictor_io_names)

    def _before_train(self):
        if self._episode_log_follows_logger:
            self.stream.population.episode_log_dir = logger.get_logger_dir()
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
        if stats.games:
            monitors.put_scalar('expreplay/mean_score', stats.mean_score)
            monitors.put_scalar('expreplay/max_score', stats.max_score)
        for name, field in _MONITORED:
            value = getattr(stats, field)
            if value is not None:      # a figure without data this epoch
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

    def save_memory(self) -> None:
        """Save the memory to ``checkpoint_dir`` now."""
        self.stream.save_memory()

    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """New priorities for a batch's ``indices`` (see :meth:`ReplayStream.update_priorities`);
        :class:`PriorityFeedback` in ``examples/tensorpack_dqn.py`` calls it after every step."""
        return self.stream.update_priorities(indices, priorities)


# (monitor name under 'expreplay/', field of ReplayStream.stats(): expreplay.stats.StreamStats)
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

# The reference's attribute name -> (the part of the stream that owns it, its name there).
_REFERENCE_ATTRIBUTES = {
    'get_player': ('population', 'get_player'),
    'num_parallel_players': ('population', 'num_players'),
    'maximum_staleness': ('stream', 'maximum_staleness'),
    'seed': ('population', 'seed'),
    'episode_starts': ('population', 'episode_starts'),
    'episode_log': ('population', 'episode_log'),
    'episode_totals': ('population', 'episode_totals'),
    'state_shape': ('memory', 'state_shape'),
    'memory_size': ('memory', 'max_size'),
    'history_len': ('memory', 'history_len'),
    'state_dtype': ('memory', 'dtype'),
    'prioritized': ('memory', 'prioritized'),
    'batch_size': ('sampling', 'batch_size'),
    'update_frequency': ('sampling', 'update_frequency'),
    'samples_per_insert': ('sampling', 'samples_per_insert'),
    'layout': ('sampling', 'layout'),
    'n_step': ('sampling', 'n_step'),
    'gamma': ('sampling', 'gamma'),
    'beta': ('sampling', 'beta'),
    'weight_norm': ('sampling', 'weight_norm'),
    'init_memory_size': ('stream', 'init_memory_size'),
    'checkpoint': ('stream', 'checkpoint'),
    'rate_limiter': ('stream', 'rate_limiter'),
    'prefetch': ('stream', 'prefetch'),
}
