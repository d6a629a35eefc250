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

import dataclasses
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np

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
from .acting.settings import ManagerSettings  # noqa: E402
from .acting.population import Population  # noqa: E402
from .presets import ATARI_DQN, FrameSchedule  # noqa: E402
from .storage.memory import ReplayMemory  # noqa: E402
from .stream.replay_stream import ReplayStream  # noqa: E402
from .stream.sampling import Sampling  # noqa: E402
from .stream.batch_format import TENSORPACK, TRANSITIONS  # noqa: E402

__all__ = ['ExpReplay', 'CLOSE_TIMEOUT']


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


#: Seconds ExpReplay's own population waits for its threads when training ends (the manager's
#: ``close_timeout``). Waiting for a simulator thread to finish its env step or predictor call
#: is cheap then, and a thread left running would call a closed Session: give a population
#: you pass in ``manager=ManagerSettings(close_timeout=CLOSE_TIMEOUT)`` too.
CLOSE_TIMEOUT = 60.0


@dataclasses.dataclass(frozen=True)
class MemoryCheckpoints:
    """Where and how often :class:`ExpReplay` saves its memory (frozen).

    Attributes:
        directory (str): the stream's ``checkpoint_dir``. A training started with a directory
            that holds a checkpoint loads it into the memory instead of filling it again (it
            must have the memory's settings); the memory is saved there when training ends.
        every_k_epochs (int): also save the memory every k epochs (e.g. as often as
            ``ModelSaver`` saves the model, so that a crash resumes from a matching pair).
            None: only at the end.
    """

    directory: str | os.PathLike
    every_k_epochs: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.directory, (str, os.PathLike)):
            raise TypeError(f"directory must be a path, got {self.directory!r}")
        if self.every_k_epochs is not None:
            object.__setattr__(self, 'every_k_epochs', check_int(
                self.every_k_epochs, 'every_k_epochs', 1, allow_float=True))


class ExpReplay(DataFlow, Callback):
    """Experience replay for DQN in tensorpack: a :class:`DataFlow` of batches and a :class:`Callback`.

    A :class:`~expreplay.stream.ReplayStream` (:attr:`stream`) of three parts, each owning its
    settings: a :class:`~expreplay.ReplayMemory`, a :class:`~expreplay.stream.sampling.Sampling`
    and a :class:`~expreplay.acting.population.Population`. tensorpack's arguments (those of
    ``examples/DeepQNetwork/expreplay.py``) build the plain ones; for any other setting pass the
    part itself (``memory=``, ``sampling=``, ``population=``), which replaces the one they would
    build and must agree with them (ValueError naming both otherwise).

    As a **DataFlow** it yields ``[comb_state, action, reward, isOver]`` batches forever (the
    sampling's ``batch_format``: the eight fields of a
    :class:`~expreplay.storage.sampling.SampleBatch` for a prioritized memory or a sampling
    passed in with the default ``'transitions'``), once the memory holds ``init_memory_size``
    transitions, and per batch it has ``update_frequency`` transitions inserted: ``batch_size``
    sampled transitions per ``update_frequency`` inserted ones, whatever the player (see
    :mod:`expreplay.stream.replay_stream` for the exact bound; its prefetch thread draws the
    batches ahead, ``prefetch``). It is not fork-safe: use it with ``QueueInput`` or
    ``FeedInput``, not a multiprocess prefetcher.

    As a **Callback** it takes its predictor from the trainer (``_setup_graph``), starts the
    population's ``num_parallel_players`` runners and fills the memory before training
    (``_before_train``), reports statistics to the trainer's monitors after every epoch
    (``_trigger``), and stops every simulator thread when training ends (``_after_train``),
    saving the memory first if a ``checkpoint`` is given.

    Set :attr:`exploration` (epsilon) directly or with
    ``ScheduledHyperParamSetter(ObjAttrParam(expreplay, 'exploration'), ...)``: the runners use
    the value from their next step on. The other settings are read from the parts:
    ``expreplay.stream.sampling.batch_size``, ``expreplay.stream.population.seed``,
    ``expreplay.mem.max_size``, ``expreplay.stream.maximum_staleness``...

    Args (tensorpack's ten, then the parts):
        predictor_io_names (tuple[list[str], list[str]]): input and output tensor names of the
            Q-network, e.g. ``(['state'], ['Qvalue'])``, passed to ``trainer.get_predictor``.
            A callable is accepted too and used as the predictor as is (no trainer needed).
        get_player (callable): the population's ``get_player``.
        num_parallel_players (int): the population's ``num_players``.
        state_shape (tuple): the memory's ``state_shape`` (one frame, without history).
        batch_size (int): the sampling's ``batch_size``.
        memory_size (int): the memory's ``max_size``.
        init_memory_size (int): the stream's ``init_memory_size``: transitions in the memory
            before training starts.
        update_frequency (int): the sampling's ``update_frequency`` (None with a ``sampling``
            of ``samples_per_insert``).
        history_len (int): the memory's ``history_len``.
        state_dtype: the memory's ``dtype`` (None: the memory's default).
        memory (ReplayMemory): instead of ``ReplayMemory(memory_size, state_shape,
            history_len, state_dtype)``: for prioritized replay (``prioritized``, ``alpha``,
            ``priority_eps``) or any other option of the memory.
        sampling (Sampling): instead of ``Sampling(batch_size, update_frequency)`` (whose
            batches are tensorpack's 4-list from a uniform memory, SampleBatches from a
            prioritized one): for ``n_step``, ``gamma``, ``beta``, ``weight_norm``,
            ``layout``, ``seed``, ``samples_per_insert`` or ``batch_format``. Give it
            ``batch_format='tensorpack'`` for a model of tensorpack's four inputs.
        population (Population): instead of ``Population(get_player, num_parallel_players)``:
            for ``exploration``, ``maximum_staleness``, ``seed``, ``episode_starts``,
            ``episode_log_dir``, ``on_episode_end``, ``runner`` or ``manager`` settings.
            Built without a predictor: ExpReplay gives it the trainer's (or
            ``predictor_io_names`` when that is a callable). The one built here waits
            :data:`CLOSE_TIMEOUT` s for its threads when training ends; one passed in keeps
            its own ``manager`` settings. A population without an ``episode_log_dir`` (the one
            built here, say) writes its ``episodes.jsonl`` to tensorpack's log directory
            (``logger.get_logger_dir()``, read when training starts), if one is set: the
            training's files in one place.
        checkpoint (MemoryCheckpoints): where and how often the memory is saved; None: never.
        prefetch (int): the stream's ``prefetch`` (None: its default).

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
                 history_len: int, state_dtype: Any = None, *,
                 memory: ReplayMemory | None = None, sampling: Sampling | None = None,
                 population: Population | None = None,
                 checkpoint: MemoryCheckpoints | None = None,
                 prefetch: int | None = None) -> None:
        predictor = self._take_predictor(predictor_io_names)
        if checkpoint is not None and not isinstance(checkpoint, MemoryCheckpoints):
            raise TypeError(f"checkpoint must be a MemoryCheckpoints (e.g. MemoryCheckpoints("
                            f"'train_log/memory', every_k_epochs=10)), got {checkpoint!r}")
        self.checkpoint = checkpoint
        # tensorpack's arguments map onto the parts' settings here, in this one place. Those
        # of another name are read under their tensorpack names first (the rules the parts
        # apply), so that a bad one is refused naming the argument the script passed.
        if memory is None:
            size = check_int(memory_size, 'memory_size', 1, allow_float=True)
            memory = (ReplayMemory(size, state_shape, history_len) if state_dtype is None else
                      ReplayMemory(size, state_shape, history_len,
                                   check_dtype(state_dtype, 'state_dtype')))
        else:
            _agree('memory', memory, ReplayMemory, memory_size=('max_size', memory_size),
                   state_shape=('state_shape', state_shape),
                   history_len=('history_len', history_len),
                   **({} if state_dtype is None else {'state_dtype': ('dtype', state_dtype)}))
        if sampling is None:
            # tensorpack's 4-list is uniform replay's; a prioritized memory's batches need
            # SampleBatch's indices and weights.
            sampling = Sampling(batch_size, update_frequency,
                                batch_format=TRANSITIONS if memory.prioritized else TENSORPACK)
        else:
            _agree('sampling', sampling, Sampling, batch_size=('batch_size', batch_size),
                   update_frequency=('update_frequency', update_frequency))
        if population is None:
            population = _tensorpack_population(get_player, num_parallel_players, predictor)
        else:
            _agree('population', population, Population, get_player=('get_player', get_player),
                   num_parallel_players=('num_players', num_parallel_players))
            self._give_predictor(population, predictor)
        # The players are checked against the memory under tensorpack's argument names (the
        # stream's own check then finds the first player checked).
        population.check_fits(memory.state_shape, memory.dtype, dtype_arg='state_dtype')
        # Tensorpack's log directory is usually set by the script after it builds the dataflow:
        # read in _before_train.
        self._episode_log_follows_logger = population.episode_log_dir is None
        self.stream = ReplayStream(memory, population, sampling, init_memory_size,
                                   prefetch=prefetch,
                                   checkpoint_dir=None if checkpoint is None else checkpoint.directory,
                                   progress=_tensorpack_progress)
        self._fault: BaseException | None = None   # a simulator fault seen by the DataFlow
        self._fault_raised = False
        if self.stream.resumed:
            logger.info("ExpReplay resumes with %d transitions from %s; the initial fill only adds "
                        "what init_memory_size still asks for.",
                        len(self.stream.memory), checkpoint.directory if checkpoint else None)

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

    @staticmethod
    def _give_predictor(population: Population, predictor: Callable[..., Any] | None) -> None:
        """Give a population passed in the predictor of ``predictor_io_names``; one it has
        already would be replaced (by the trainer's at ``_setup_graph``): refused."""
        held = population.predictor
        if held is None or held is predictor:
            if predictor is not None:
                population.predictor = predictor
            return
        given = ('a callable' if predictor is not None else
                 'tensor names: the trainer\'s predictor replaces it at _setup_graph')
        raise ValueError(f"population.predictor ({held!r}) and predictor_io_names ({given}) "
                         "disagree: build the Population without a predictor (ExpReplay gives it "
                         "one), or pass that predictor as predictor_io_names")

    # The reference's attribute names that tensorpack scripts use; the rest is read from
    # :attr:`stream`'s parts, which own it.
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
        self.stream.count_updates(0)     # the trainer's steps are the updates (_trigger_step)
        if self._episode_log_follows_logger:
            self.stream.population.episode_log_dir = logger.get_logger_dir()
        self.stream.start()

    def _trigger_step(self):
        # The batches in tensorpack's QueueInput wait ahead of these updates.
        self.stream.count_updates()
        fault = self._fault
        if fault is not None:
            self._fault_raised = True
            raise RuntimeError(f"ExpReplay could not produce a batch: {fault}") from fault

    def _trigger(self):
        monitors = self.trainer.monitors
        stats = self.stream.stats()
        # The scores of the window this closes (the next starts now), as tensorpack's
        # reset_stats() gave them: a game that ended after stats() counts too.
        scores = self.stream.reset_stats()
        if scores.mean is not None:
            monitors.put_scalar('expreplay/mean_score', scores.mean)
            monitors.put_scalar('expreplay/max_score', scores.max)
        for name, field in _MONITORED:
            value = getattr(stats, field)
            if value is not None:      # a figure without data this epoch
                monitors.put_scalar('expreplay/' + name, value)
        every = None if self.checkpoint is None else self.checkpoint.every_k_epochs
        if every is not None and self.epoch_num % every == 0:
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
        """Save the memory to the ``checkpoint``'s directory now."""
        self.stream.save_memory()

    def update_priorities(self, indices: Any, priorities: Any) -> int:
        """New priorities for a batch's ``indices`` (see :meth:`ReplayStream.update_priorities`);
        :class:`PriorityFeedback` in ``examples/tensorpack_dqn.py`` calls it after every step."""
        return self.stream.update_priorities(indices, priorities)

    # ------------------------------------------------------------------ presets
    @classmethod
    def atari_dqn(cls, predictor_io_names: Any, get_player: Callable[[], Any],
                  **overrides: Any) -> ExpReplay:
        """The ExpReplay of tensorpack's ``examples/DeepQNetwork/DQN.py``, its exploration
        schedule included: the values of :meth:`ReplayStream.atari_dqn
        <expreplay.stream.ReplayStream.atari_dqn>` in tensorpack's arguments
        (``memory_size=1e6``, ``state_shape=(84, 84)``, ``history_len=4``, ``batch_size=64``,
        ``update_frequency=4``, ``num_parallel_players=3``, ``init_memory_size=memory_size //
        20``)::

            expreplay = ExpReplay.atari_dqn((['state'], ['Qvalue']), lambda: get_player(train=True))

        Epsilon is the population's schedule (1 during the fill, 1 -> 0.1 over the first 1M
        agent steps, -> 0.01 by 40M, going on from a memory restored from a ``checkpoint``):
        drop DQN.py's ``ScheduledHyperParamSetter(ObjAttrParam(expreplay, 'exploration'),
        ...)``, which would replace it by its numbers.

        Overrides: any argument of ExpReplay (``memory_size=200_000``, ``checkpoint=...``,
        ``memory=ReplayMemory(..., prioritized=True)``...), ``exploration`` (a number or a
        schedule of the steps stored, for the population built here) and ``seed`` (seeds the
        population and the sampling built here; refused when both are passed in). Parts passed
        in give tensorpack's arguments they hold (a ``memory`` its size, frame shape, history
        and dtype; a ``sampling`` its batch size and update frequency; a ``population`` its
        number of players and its exploration: ``exploration`` is then refused).
        """
        memory_values, sampling_values = ATARI_DQN.memory, ATARI_DQN.sampling
        args: dict[str, Any] = {
            'num_parallel_players': ATARI_DQN.population['num_players'],
            'state_shape': memory_values['state_shape'],
            'batch_size': sampling_values['batch_size'], 'memory_size': memory_values['max_size'],
            'update_frequency': sampling_values['update_frequency'],
            'history_len': memory_values['history_len']}
        memory, sampling = overrides.get('memory'), overrides.get('sampling')
        population = overrides.get('population')
        if memory is not None:
            args.update(memory_size=memory.max_size, state_shape=memory.state_shape,
                        history_len=memory.history_len, state_dtype=memory.dtype)
        if sampling is not None:
            args.update(batch_size=sampling.batch_size, update_frequency=sampling.update_frequency)
        exploration = overrides.pop('exploration', None)
        seed = overrides.pop('seed', None)
        if population is not None:
            if exploration is not None:
                raise TypeError("exploration is the population's: set it on the population "
                                "passed in")
            args['num_parallel_players'] = population.num_players
        if seed is not None and population is not None and sampling is not None:
            raise ValueError(f"seed={seed!r} would seed nothing: it seeds the population and the "
                             "sampling, and both are passed in; set the seed on them")
        args.update(overrides)
        # Both are used here before ExpReplay checks them: a wrong type says which it is.
        args.setdefault('init_memory_size', ATARI_DQN.fill(
            check_int(args['memory_size'], 'memory_size', allow_float=True)))
        fill = check_int(args['init_memory_size'], 'init_memory_size', 0, allow_float=True)
        if seed is not None and sampling is None:
            # ExpReplay's own sampling, seeded: the 4-list unless the memory is prioritized.
            prioritized = memory is not None and memory.prioritized
            args['sampling'] = Sampling(args['batch_size'], args['update_frequency'], seed=seed,
                                        batch_format=TRANSITIONS if prioritized else TENSORPACK)
        schedule = None
        if population is None:
            if exploration is None:
                exploration = schedule = FrameSchedule(ATARI_DQN.epsilon, fill)
            args['population'] = _tensorpack_population(
                get_player, args['num_parallel_players'], None, exploration=exploration, seed=seed)
        replay = cls(predictor_io_names, get_player, **args)
        if schedule is not None:
            schedule.resumed = replay.mem.num_steps_written
        return replay


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


def _tensorpack_population(get_player: Callable[[], Any], num_parallel_players: Any,
                           predictor: Callable[..., Any] | None, *, exploration: Any = None,
                           seed: int | None = None) -> Population:
    """ExpReplay's own population: its threads waited for :data:`CLOSE_TIMEOUT` s
    (``exploration`` None: the population's default)."""
    players = check_int(num_parallel_players, 'num_parallel_players', 1, allow_float=True)
    given = {} if exploration is None else {'exploration': exploration}
    return Population(get_player, players, predictor, seed=seed,
                      manager=ManagerSettings(close_timeout=CLOSE_TIMEOUT), **given)


def _agree(part_name: str, part: Any, cls: type, **args: tuple[str, Any]) -> None:
    """Refuse a part passed in that is not a ``cls`` (TypeError), or whose settings differ from
    tensorpack's arguments (``args``: tensorpack's name -> (the part's attribute, the value
    given)), with a ValueError naming both."""
    # The stream refuses a wrong type too, but its attributes are read here first.
    if not isinstance(part, cls):
        raise TypeError(f"{part_name} must be a {cls.__name__}, got {type(part).__name__}")
    for name, (attribute, given) in args.items():
        held = getattr(part, attribute)
        if not _same(given, held):
            raise ValueError(
                f"{name}={given!r} and {part_name}.{attribute}={held!r} disagree: a {part_name} "
                f"passed in replaces the one tensorpack's arguments would build, so give "
                f"{name} the {part_name}'s value")


def _same(given: Any, held: Any) -> bool:
    """Whether a tensorpack argument as given (``1e6``, a list shape, ``'uint8'``, ...) is the
    part's normalized setting."""
    try:
        if isinstance(held, tuple):            # a shape: an int n is (n,), as the memory reads it
            given = tuple(given) if isinstance(given, (tuple, list, np.ndarray)) else (given,)
        elif isinstance(held, np.dtype):
            return bool(np.dtype(given) == held) if given is not None else False
        elif callable(held):
            return given is held or bool(given == held)   # the same function (or bound method)
        return bool(given == held)
    except (TypeError, ValueError):
        return False
