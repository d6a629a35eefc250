"""What the tensorpack DQN examples share: the replay, the schedules, the target sync, the run.

``dqn_atari.py``, ``dqn_cartpole.py`` and ``dqn_minatar_tensorpack.py`` train a ``DQNModel``
(``dqn_model.py``) the way tensorpack's ``examples/DeepQNetwork/DQN.py`` does:

* :func:`make_replay`: ``expreplay.ExpReplay`` with tensorpack's arguments, the trainer's
  DataFlow and a callback (it fills the memory before training, reports the games every epoch
  and stops its threads at the end);
* :func:`dqn_callbacks`: the replay, the target network copied every k training steps
  (:func:`target_sync`), epsilon on a schedule given in agent steps (:func:`epsilon_schedule`)
  and, with prioritized replay, the |TD errors| handed back (:class:`PriorityFeedback`);
  :func:`linear_beta` anneals the importance-weight exponent;
* :class:`ProgressLog`, a line every half minute while an epoch runs, and
  :func:`train_until_interrupted`, which turns Ctrl-C into a clean stop.

tensorpack's schedules count *training* steps and ExpReplay draws one batch per
``update_frequency`` agent steps, so a schedule written in agent steps is divided by it here,
once.
"""

if __name__ == '__main__':   # a module the examples import, not a program: --help says so
    import module_help
    module_help.answer(__doc__, 'tensorpack_dqn.py', 'the tensorpack examples')

import functools
import gc
import sys
import time

from tf_setup import tf   # first: it sets TensorFlow up, quietly, before tensorpack imports it

from dqn_model import DQNModel  # noqa: E402
from tensorpack import (Callback, ObjAttrParam, PeriodicTrigger, RunOp,  # noqa: E402
                        ScheduledHyperParamSetter, logger)

import expreplay  # noqa: E402
from expreplay import Population, ReplayMemory, Sampling  # noqa: E402
from expreplay.interrupts import stop_on_signals  # noqa: E402
from expreplay.tensorpack_io import CLOSE_TIMEOUT  # noqa: E402


# ---------------------------------------------------------------------------- the replay
def linear_beta(start, training_steps):
    """Prioritized replay's importance-weight exponent: ``start`` at the first training step,
    annealed linearly to 1 over ``training_steps`` (Schaul et al.)."""
    def beta(k):
        return min(1.0, start + (1.0 - start) * k / training_steps)
    return beta


def make_replay(args, *, get_player, players, state_shape, history, dtype, init_memory_size,
                training_steps, gamma=0.99, acting=None, sampling=None, **options):
    """``expreplay.ExpReplay`` as the examples build it: tensorpack's arguments, and the
    memory, the sampling and the population that hold the rest.

    From ``args`` (the flags the three examples share): ``batch_size``, ``memory_size``,
    ``update_frequency`` (agent steps per training step), ``seed`` (the players' and the
    draws'), ``n_step``, ``prioritized``, ``alpha`` and ``beta`` (its start, annealed to 1 over
    ``training_steps``). ``acting``: more options of the ``Population`` (``maximum_staleness``,
    ``runner`` settings, ``on_episode_end``, ...); ``sampling``: more of the ``Sampling``
    (``weight_norm``, ...); ``options`` go to ExpReplay as they are (``checkpoint``,
    ``prefetch``).
    """
    acting = dict(acting or {})
    # ExpReplay's close timeout (its own population's): the threads end before the Session.
    acting.setdefault('manager', expreplay.ManagerSettings(close_timeout=CLOSE_TIMEOUT))
    return expreplay.ExpReplay(
        predictor_io_names=(['state'], ['Qvalue']),   # the model's input and output tensors
        get_player=get_player,
        num_parallel_players=players,
        state_shape=state_shape,
        batch_size=args.batch_size,
        memory_size=args.memory_size,
        init_memory_size=init_memory_size,
        update_frequency=args.update_frequency,
        history_len=history,
        state_dtype=dtype,
        memory=ReplayMemory(args.memory_size, state_shape, history, dtype,
                            prioritized=args.prioritized, alpha=args.alpha),
        sampling=Sampling(
            args.batch_size, args.update_frequency, n_step=args.n_step, gamma=gamma,
            beta=linear_beta(args.beta, training_steps) if args.prioritized else None,
            seed=args.seed,
            # DQNModel reads tensorpack's 4-list; the models of n-step or prioritized replay
            # (PrioritizedNStepMixin) read a SampleBatch.
            batch_format='transitions' if args.n_step > 1 or args.prioritized else 'tensorpack',
            **(sampling or {})),
        population=Population(get_player, players, seed=args.seed, **acting),
        **options)


# ---------------------------------------------------------------------------- the callbacks
def target_sync(every_k_steps, verbose=False):
    """Copy the online network into the target network every k training steps, and once before
    the first (``run_before``, PeriodicTrigger's default): the target starts equal to it."""
    return PeriodicTrigger(RunOp(DQNModel.update_target_param, verbose=verbose),
                           every_k_steps=every_k_steps)


def epsilon_schedule(replay, points, update_frequency):
    """Set ``replay.exploration`` along the piecewise-linear schedule ``points``, pairs
    ``(agent steps, epsilon)``. tensorpack counts training steps, one per ``update_frequency``
    agent steps: the schedule is converted here (a point after 0 stays after the first step)."""
    steps = [(s if s == 0 else max(1, s // update_frequency), eps) for s, eps in points]
    return ScheduledHyperParamSetter(ObjAttrParam(replay, 'exploration'), steps,
                                     interp='linear', step_based=True)


def dqn_callbacks(replay, *, target_update, epsilon, update_frequency, prioritized,
                  verbose_sync=False):
    """The callbacks of every DQN run here, in order: the replay, the target sync every
    ``target_update`` training steps, the exploration schedule ``epsilon`` (pairs of agent
    steps and epsilon) and, if ``prioritized``, the priority feedback. A callback that reads
    epsilon when training starts goes after them (tensorpack runs callbacks in order)."""
    return [replay, target_sync(target_update, verbose_sync),
            epsilon_schedule(replay, epsilon, update_frequency)] + (
        [PriorityFeedback(replay)] if prioritized else [])


class PriorityFeedback(Callback):
    """After every training step, give the step's |TD errors| to the replay as new priorities.

    The batch's indices (``batch_indices``) and the model's ``td_error_abs`` are fetched by the
    training step's own ``session.run`` (no extra run, no wait for the GPU beyond the step itself), and
    ``replay.update_priorities`` then costs about a tenth of a millisecond under the memory's
    lock, so the trainer is not stalled. Entries whose transition was evicted since the batch
    was sampled (a prefetching ``QueueInput`` trains on batches sampled a while ago) are
    skipped by the memory and counted (``expreplay/stale_priority_updates`` is monitored).

    Args:
        replay: an ``ExpReplay`` (or ``ReplayStream``) with ``prioritized=True``.
    """

    def __init__(self, replay, indices='batch_indices', td_error='td_error_abs'):
        self.replay = replay
        self._names = [indices, td_error]

    def _setup_graph(self):
        # ':0': the tensors. A bare name finds the placeholder *operation*, and running a
        # placeholder op fails even when its tensor is fed.
        self._fetches = self.get_tensors_maybe_in_tower([n + ':0' for n in self._names])

    def _before_run(self, ctx):
        return tf.train.SessionRunArgs(fetches=self._fetches)

    def _after_run(self, run_context, run_values):
        indices, td_error = run_values.results
        self.replay.update_priorities(indices, td_error)

    def _trigger(self):
        memory = getattr(self.replay, 'memory', None) or self.replay.mem
        self.trainer.monitors.put_scalar('expreplay/stale_priority_updates',
                                         memory.stale_priority_updates)


class ProgressLog(Callback):
    """Logs one line ``first`` seconds into the training, then every ``every`` seconds: agent
    steps and their rate, games finished this epoch and their mean score, epsilon.

    An epoch's monitors come at its end, which on a CPU is minutes away (5000 training steps);
    this shows from the first minute on that the run is alive and what it is doing.
    """

    def __init__(self, replay, every=30.0, first=15.0, clock=time.monotonic):
        self.replay, self.every, self.first, self.clock = replay, float(every), float(first), clock

    def _before_train(self):
        self._last = None      # set at the first training step: the initial fill is over then

    def _trigger_step(self):
        now = self.clock()
        if self._last is None:
            self._last, self._last_steps, self._reports = now, self.replay.mem.num_steps_written, 0
        elif now - self._last >= (self.first if self._reports == 0 else self.every):
            self._reports += 1
            self.report(now)

    def report(self, now):
        steps = self.replay.mem.num_steps_written
        rate = (steps - self._last_steps) / max(now - self._last, 1e-9)
        self._last, self._last_steps = now, steps
        stats = self.replay.stream.stats()        # since the epoch began
        games, mean = stats.games, stats.mean_score
        line = (f"progress: {steps} agent steps ({rate:.0f}/s), training step {self.global_step}, "
                f"epoch {self.epoch_num}: {games} games finished this epoch")
        if mean is not None:
            line += f", mean score {mean:.1f} (max {stats.max_score:.0f})"
        logger.info(line + f", epsilon {self.replay.exploration:.3f}")


# ---------------------------------------------------------------------------- the run
def train_until_interrupted(train, *args, **kwargs):
    """``train(*args, **kwargs)``, stopped cleanly by Ctrl-C or SIGTERM (a ``kill`` of a run
    in the background, a scheduler ending the job); returns ``(result, interrupted)``.

    On the first signal tensorpack's trainer still runs every callback's ``after_train``:
    ExpReplay stops and joins its simulator threads, closes the environments and saves the
    memory when it has a checkpoint directory, and the model is saved; a second signal only
    prints a line, so those saves finish (:func:`expreplay.interrupts.stop_on_signals`). The
    interrupt is then caught here, so the user sees one line instead of a traceback; the
    trainer, its callbacks and the emulators they hold are collected before the interpreter
    exits (else ale-py reports them as leaked), also after a training that ended normally:
    they form reference cycles that hold the emulators.
    """
    try:
        with stop_on_signals():
            result = train(*args, **kwargs)
        gc.collect()
        return result, False
    except KeyboardInterrupt:
        hook = sys.unraisablehook
        sys.unraisablehook = functools.partial(_quiet_half_built_bar, hook)
    try:
        gc.collect()   # outside the except block: the traceback no longer holds the trainer
    finally:
        sys.unraisablehook = hook
    return None, True


def _quiet_half_built_bar(hook, unraisable):
    """A Ctrl-C inside tqdm's constructor (the trainer builds a bar as each epoch starts)
    leaves a bar whose ``__del__`` raises AttributeError when it is collected: harmless, and
    not the user's to see. Everything else goes to ``hook``."""
    obj = unraisable.object
    if not (isinstance(unraisable.exc_value, AttributeError)
            and getattr(obj, '__qualname__', '') == 'tqdm.__del__'):
        hook(unraisable)
