"""The DQN agent shared by the examples: a tensorpack model and a greedy evaluator.

One ``DQNModel`` covers the three algorithms the examples offer:

* ``DQN``      target = r + gamma * max_a Q_target(s', a)                      (Mnih et al. 2015)
* ``Double``   target = r + gamma * Q_target(s', argmax_a Q_online(s', a))     (van Hasselt et al. 2016)
* ``Dueling``  Q = V + A - mean(A), trained with the Double target             (Wang et al. 2016)

and two networks: the Nature CNN for stacks of 84x84 frames, and a small MLP for vector
observations such as CartPole's.

:class:`PrioritizedNStepMixin` trains the same networks on n-step, prioritized batches, and
:class:`PriorityFeedback` hands the learner's |TD errors| back to the replay as priorities.

The model reads what ``expreplay.ExpReplay`` yields: ``[comb_state, action, reward, isOver]``,
``comb_state`` of shape ``(B, *state_shape, history + 1)`` holding the state's ``history``
frames and the next state's newest frame (a state and its successor share ``history - 1``
frames, so they are stored once). ``isOver`` is True only for a *terminated* step: a time
limit (truncation) bootstraps, which matters for CartPole's 500-step cap.
"""

if __name__ == '__main__':
    # A module the examples import, not a program: --help says so before TensorFlow loads.
    import argparse
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='This module is imported by examples/dqn_atari.py and examples/dqn_cartpole.py.',
    ).parse_args()
    raise SystemExit('dqn_model.py is imported by examples/dqn_atari.py and '
                     'examples/dqn_cartpole.py; run those (--help for their options).')

import functools
import gc
import logging
import os
import re
import sys
import tempfile
import time

os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')   # tensorpack needs tf.layers (tf-keras 2)

import numpy as np  # noqa: E402

# TensorFlow's start-up lines a user can do nothing about: absl's notice about logging before
# its initialisation, "no CUDA drivers" on a CPU machine (and its cuInit error), the CPU
# instruction notice and its continuation line. Other C++ messages at INFO and WARNING level
# printed during the import are dropped too; errors are not.
_TF_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IW]\d{4} \S+ +\d+ \S+:\d+\] .*"
    r"|E\d{4} \S+ +\d+ cuda_platform\.cc:\d+\] failed call to cuInit.*"
    r"|To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags\.)$")


def _import_tensorflow_quietly():
    """``import tensorflow``, with its start-up noise kept off the terminal.

    The noise comes from C++ before TensorFlow's own log level applies, so stderr (the file
    descriptor) is redirected into a temporary file during the import, and what is not noise
    is written back. ``TF_CPP_MIN_LOG_LEVEL`` (2 unless set) quiets what TensorFlow logs later;
    a user who sets it sees everything, unfiltered.
    """
    if 'tensorflow' in sys.modules or 'TF_CPP_MIN_LOG_LEVEL' in os.environ:
        import tensorflow
        return tensorflow
    os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode='w+b') as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow
            # Probing the devices now makes the CUDA platform report a missing driver here
            # (once), not in the middle of the training's first lines.
            tensorflow.config.list_physical_devices('GPU')
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors='replace').splitlines(True)
                    if not _TF_NOISE.match(line.rstrip('\n'))]
            sys.stderr.write(''.join(kept))
            sys.stderr.flush()
    # tensorflow.compat.v1's Python-side deprecation notices.
    tensorflow.get_logger().setLevel(logging.ERROR)
    return tensorflow


class _DropFreezeVariablesNotice(logging.Filter):
    # tensorpack's freeze_variables() warns once per target-network variable that the variable
    # getter returned a tf-keras variable; the variables are frozen all the same.
    def filter(self, record):
        return '[freeze_variables] variable getter did not return a Variable' not in str(record.msg)


tf_root = _import_tensorflow_quietly()

from tensorpack import Callback, ModelDesc, logger  # noqa: E402
from tensorpack.models import Conv2D, FullyConnected  # noqa: E402
from tensorpack.tfutils import summary, varreplace  # noqa: E402
from tensorpack.tfutils.scope_utils import auto_reuse_variable_scope  # noqa: E402
from tensorpack.tfutils.tower import get_current_tower_context  # noqa: E402

tf = tf_root.compat.v1
tf.disable_eager_execution()   # a TF1 graph model, as tensorpack's trainer runs it anyway
logging.getLogger('tensorpack').addFilter(_DropFreezeVariablesNotice())

METHODS = ('DQN', 'Double', 'Dueling')


class DQNModel(ModelDesc):
    """A tensorpack ``ModelDesc`` for DQN, Double DQN and Dueling DQN.

    Args:
        state_shape (tuple): one observation frame, ``(84, 84)`` or ``(4,)``.
        history (int): frames per state.
        method (str): ``'DQN'``, ``'Double'`` or ``'Dueling'``.
        num_actions (int): size of the discrete action space.
        network (str): ``'nature'`` (uint8 frames, scaled by 1/255) or ``'mlp'``.
        state_dtype: dtype of the frames the memory stores (``uint8`` / ``float32``).
        hidden (tuple): MLP hidden layer widths.
        gamma (float): discount factor.
        learning_rate (float): initial value of the ``learning_rate`` variable
            (a ``ScheduledHyperParamSetter('learning_rate', ...)`` can change it).
        optimizer (str): ``'adam'`` or ``'rmsprop'`` (tensorpack's DQN example's settings).
        reward_clip (float or None): clip rewards to ``[-c, c]`` (Atari: 1, so that one
            learning rate fits every game); None keeps them.
        grad_clip (float or None): clip the global gradient norm.
    """

    def __init__(self, state_shape, history, method, num_actions, *, network='nature',
                 state_dtype='uint8', hidden=(256, 256), gamma=0.99, learning_rate=1e-4,
                 optimizer='adam', reward_clip=1.0, grad_clip=10.0):
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if network not in ('nature', 'mlp'):
            raise ValueError(f"network must be 'nature' or 'mlp', got {network!r}")
        self.state_shape = tuple(state_shape)
        self.history = int(history)
        self.method = method
        self.num_actions = int(num_actions)
        self.network = network
        self.state_dtype = tf.as_dtype(np.dtype(state_dtype))
        self.hidden = tuple(hidden)
        self.gamma = float(gamma)
        self.learning_rate = float(learning_rate)
        self.optimizer_name = optimizer
        self.reward_clip = reward_clip
        self.grad_clip = grad_clip

    def inputs(self):
        return [tf.TensorSpec((None,) + self.state_shape + (self.history + 1,), self.state_dtype, 'comb_state'),
                tf.TensorSpec((None,), tf.int32, 'action'),
                tf.TensorSpec((None,), tf.float32, 'reward'),
                tf.TensorSpec((None,), tf.bool, 'isOver')]

    # ------------------------------------------------------------------ networks
    def _nature_cnn(self, state):
        # (B, 84, 84, history) uint8 -> [0, 1]. Frames are already channels-last, as the
        # memory hands them out, so the convolution needs no transpose.
        x = tf.cast(state, tf.float32) / 255.0
        if x.shape.rank == 5:   # colour frames: merge (C, history) into channels
            x = tf.reshape(x, [-1] + list(self.state_shape[:2]) + [self.state_shape[2] * self.history])
        x = Conv2D('conv0', x, 32, 8, strides=4, activation=tf.nn.relu)
        x = Conv2D('conv1', x, 64, 4, strides=2, activation=tf.nn.relu)
        x = Conv2D('conv2', x, 64, 3, strides=1, activation=tf.nn.relu)
        return FullyConnected('fc0', x, 512, activation=tf.nn.relu)

    def _mlp(self, state):
        x = tf.reshape(tf.cast(state, tf.float32), [-1, int(np.prod(self.state_shape)) * self.history])
        for i, width in enumerate(self.hidden):
            x = FullyConnected(f'fc{i}', x, width, activation=tf.nn.relu)
        return x

    @auto_reuse_variable_scope
    def get_DQN_prediction(self, state):
        """Q-values ``(B, num_actions)`` for states ``(B, *state_shape, history)``."""
        features = self._nature_cnn(state) if self.network == 'nature' else self._mlp(state)
        if self.method != 'Dueling':
            q = FullyConnected('fct', features, self.num_actions)
        else:
            # Separate value and advantage streams; subtracting the mean advantage makes
            # the split identifiable without changing the greedy action.
            value = FullyConnected('fctV', features, 1)
            adv = FullyConnected('fctA', features, self.num_actions)
            q = value + adv - tf.reduce_mean(adv, axis=1, keepdims=True)
        return tf.identity(q, name='Qvalue')

    # ------------------------------------------------------------------ training graph
    def build_graph(self, comb_state, action, reward, isOver):
        # The predictor the runners use feeds 'state' directly; training slices it out
        # of comb_state. Both paths go through this one tensor.
        state = tf.identity(comb_state[..., :self.history], name='state')
        q = self.get_DQN_prediction(state)
        if not get_current_tower_context().is_training:
            return

        next_state = comb_state[..., 1:]
        if self.reward_clip:
            reward = tf.clip_by_value(reward, -self.reward_clip, self.reward_clip)
        q_taken, best_next = self._q_taken_and_best_next(q, action, next_state)
        not_over = 1.0 - tf.cast(isOver, tf.float32)
        target = tf.stop_gradient(reward + not_over * self.gamma * best_next)
        # Huber loss: quadratic near 0, linear beyond 1, so a surprising reward can not
        # produce an exploding gradient.
        cost = tf.losses.huber_loss(target, q_taken, reduction=tf.losses.Reduction.MEAN)
        cost = tf.identity(cost, name='cost')
        summary.add_moving_summary(cost)
        return cost

    def _q_taken_and_best_next(self, q, action, next_state):
        """Q(s, a) of the actions taken, and the bootstrap value of the next states."""
        q_taken = tf.reduce_sum(q * tf.one_hot(action, self.num_actions), axis=1)
        summary.add_moving_summary(tf.reduce_mean(tf.reduce_max(q, axis=1), name='predict_reward'))

        # The target network: same function, variables under 'target/', kept out of the
        # trainable collection; update_target_param() copies the online weights into it.
        with tf.variable_scope('target'), varreplace.freeze_variables(skip_collection=True):
            q_next_target = self.get_DQN_prediction(next_state)
        if self.method == 'DQN':
            best_next = tf.reduce_max(q_next_target, axis=1)
        else:
            # Double DQN: the online network chooses, the target network evaluates; this
            # removes most of max-operator's overestimation.
            greedy = tf.argmax(self.get_DQN_prediction(next_state), axis=1)
            best_next = tf.reduce_sum(q_next_target * tf.one_hot(greedy, self.num_actions), axis=1)
        return q_taken, best_next

    def optimizer(self):
        lr = tf.get_variable('learning_rate', initializer=self.learning_rate, trainable=False)
        tf.summary.scalar('learning_rate', lr)
        if self.optimizer_name == 'rmsprop':   # tensorpack's DQN example
            opt = tf.train.RMSPropOptimizer(lr, decay=0.95, momentum=0.95, epsilon=1e-2)
        else:                                   # Adam with a large epsilon, as Rainbow / Dopamine
            opt = tf.train.AdamOptimizer(lr, epsilon=1.5e-4)
        if self.grad_clip:
            from tensorpack.tfutils import optimizer as tp_opt, gradproc
            opt = tp_opt.apply_grad_processors(opt, [gradproc.GlobalNormClip(self.grad_clip)])
        return opt

    @staticmethod
    def update_target_param():
        """An op copying every online variable into its 'target/' twin (run it periodically)."""
        variables = {v.op.name: v for v in tf.global_variables()}
        ops = [v.assign(variables[name[len('target/'):]].read_value())
               for name, v in variables.items() if name.startswith('target/')]
        if not ops:
            raise RuntimeError("no 'target/' variables: was the training graph built?")
        return tf.group(*ops, name='update_target_network')


class PrioritizedNStepMixin:
    """Train a :class:`DQNModel` on the n-step, prioritized batches of ``ExpReplay(n_step=...,
    prioritized=True)``: ``class Model(PrioritizedNStepMixin, DQNModel)``.

    Inputs: the fields of :class:`expreplay.storage.memory.SampleBatch` (``state``, ``action``,
    ``reward``, ``next_state``, ``discount``, ``is_over``, ``sample_indices``, ``is_weights``).
    The target is ``reward + discount * Q_target(next_state, .)`` (the memory's discount is
    ``gamma ** k`` for the k steps summed, 0 after a terminal step, so the model's ``gamma`` is
    not used), the loss the mean of ``is_weights * huber(target - Q(state, action))``, and
    ``td_error_abs`` the per-sample |TD error| that :class:`PriorityFeedback` hands back to the
    memory. A uniform memory's weights are all 1, so the mixin serves n-step without PER too.

    Rewards are not clipped here: an n-step reward is a sum, and clipping the sum is not
    clipping each step. Clip per step before they are stored (Atari: a ``ClipReward`` env
    wrapper) and build the model with ``reward_clip=None``.
    """

    def inputs(self):
        shape = (None,) + self.state_shape + (self.history,)
        return [tf.TensorSpec(shape, self.state_dtype, 'state'),
                tf.TensorSpec((None,), tf.int32, 'action'),
                tf.TensorSpec((None,), tf.float32, 'reward'),
                tf.TensorSpec(shape, self.state_dtype, 'next_state'),
                tf.TensorSpec((None,), tf.float32, 'discount'),
                tf.TensorSpec((None,), tf.bool, 'is_over'),
                tf.TensorSpec((None,), tf.int64, 'sample_indices'),
                tf.TensorSpec((None,), tf.float32, 'is_weights')]

    def build_graph(self, state, action, reward, next_state, discount, is_over, indices, weights):
        if self.reward_clip:
            raise ValueError("PrioritizedNStepMixin: reward_clip must be None (clip each step's "
                             "reward before it is stored, e.g. with gymnasium's ClipReward)")
        q = self.get_DQN_prediction(state)
        if not get_current_tower_context().is_training:
            return
        q_taken, best_next = self._q_taken_and_best_next(q, action, next_state)
        q_taken = tf.identity(q_taken, name='q_taken')
        best_next = tf.identity(best_next, name='bootstrap_value')
        target = tf.stop_gradient(reward + discount * best_next)
        tf.abs(target - q_taken, name='td_error_abs')
        # The indices as the tower received them: with QueueInput the 'sample_indices'
        # placeholder only feeds the queue, so the step's own indices are this tensor.
        tf.identity(indices, name='batch_indices')
        per_sample = tf.losses.huber_loss(target, q_taken, reduction=tf.losses.Reduction.NONE)
        # Schaul et al.: the weights scale each sample's loss; the mean is over the batch.
        cost = tf.reduce_mean(weights * per_sample, name='cost')
        summary.add_moving_summary(cost)
        return cost


class PriorityFeedback(Callback):
    """After every training step, give the step's |TD errors| to the replay as new priorities.

    The batch's indices (``batch_indices``) and the model's ``td_error_abs`` are fetched by the training
    step's own ``session.run`` (no extra run, no wait for the GPU beyond the step itself), and
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


# ---------------------------------------------------------------------- greedy evaluation
class HistoryStack:
    """Stacks the last ``history`` frames channels-last, zeros before the episode's start.

    This is exactly how the replay memory builds the states the network trained on, so the
    evaluator feeds the network what it knows.
    """

    def __init__(self, frame_shape, history, dtype):
        self.buf = np.zeros(tuple(frame_shape) + (history,), dtype)

    def reset(self, frame):
        self.buf[...] = 0
        self.buf[..., -1] = frame
        return self.buf

    def push(self, frame):
        self.buf[..., :-1] = self.buf[..., 1:]
        self.buf[..., -1] = frame
        return self.buf


def play_episode(env, predictor, history, *, epsilon=0.0, rng=None, seed=None, on_frame=None):
    """Play one episode; returns its score (sum of rewards, all lives).

    ``predictor(states)[0]`` gives the Q-values of a batch of states. ``epsilon`` > 0 takes a
    random action that often (evaluation usually uses 0.0 or 0.01-0.05 so that an agent
    stuck in a loop can not play forever).
    """
    rng = rng or np.random.default_rng()
    obs, _ = env.reset(seed=seed)
    obs = np.asarray(obs)
    stack = HistoryStack(obs.shape, history, obs.dtype)
    state = stack.reset(obs)
    score = 0.0
    while True:
        if epsilon > 0 and rng.random() < epsilon:
            action = int(env.action_space.sample())
        else:
            action = int(np.argmax(predictor(state[None])[0][0]))
        obs, reward, terminated, truncated, _ = env.step(action)
        score += float(reward)
        if on_frame is not None:
            on_frame(env)
        if terminated or truncated:
            return score
        state = stack.push(np.asarray(obs))


def evaluate(make_env, predictor, history, episodes, *, epsilon=0.0, seed=0, parallel=None,
             progress=False):
    """Scores of ``episodes`` episodes, played ``parallel`` at a time in lockstep.

    Each episode gets its own environment reset with seed ``seed + i``, so an evaluation is
    reproducible and two evaluations with different ``seed`` see different starts. Playing
    episodes in lockstep batches the Q-network's forward passes (one call for all of them),
    which is far cheaper than one call per state.
    """
    parallel = min(episodes, parallel or episodes)
    rng = np.random.default_rng(seed)
    envs = [make_env() for _ in range(parallel)]
    scores = []
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=episodes, desc='evaluating', dynamic_ncols=True)
    try:
        started = 0
        slots = []   # per env: [episode index, stack, state, score] or None when idle

        def start(k):
            nonlocal started
            obs, _ = envs[k].reset(seed=None if seed is None else seed + started)
            obs = np.asarray(obs)
            stack = HistoryStack(obs.shape, history, obs.dtype)
            started += 1
            return [stack, stack.reset(obs), 0.0]

        slots = [start(k) for k in range(parallel)]
        while any(s is not None for s in slots):
            live = [k for k, s in enumerate(slots) if s is not None]
            q = predictor(np.stack([slots[k][1] for k in live]))[0]
            for row, k in enumerate(live):
                if epsilon > 0 and rng.random() < epsilon:
                    action = int(envs[k].action_space.sample())
                else:
                    action = int(np.argmax(q[row]))
                obs, reward, terminated, truncated, _ = envs[k].step(action)
                slots[k][2] += float(reward)
                if terminated or truncated:
                    scores.append(slots[k][2])
                    if bar is not None:
                        bar.update(1)
                    slots[k] = start(k) if started < episodes else None
                else:
                    slots[k][1] = slots[k][0].push(np.asarray(obs))
    finally:
        for env in envs:
            env.close()
        if bar is not None:
            bar.close()
    return np.array(scores)


# ------------------------------------------------------------------------------ running a training
def train_until_interrupted(train, *args, **kwargs):
    """``train(*args, **kwargs)``, stopped cleanly by Ctrl-C; returns ``(result, interrupted)``.

    On Ctrl-C tensorpack's trainer still runs every callback's ``after_train``: ExpReplay
    stops and joins its simulator threads, closes the environments and saves the memory when
    it has a checkpoint directory. The interrupt is then caught here, so the user sees one
    line instead of a traceback; the trainer, its callbacks and the emulators they hold are
    collected before the interpreter exits (else ale-py reports them as leaked).
    """
    try:
        return train(*args, **kwargs), False
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
        games, mean = stats.get('games') or 0, stats.get('mean_score')
        line = (f"progress: {steps} agent steps ({rate:.0f}/s), training step {self.global_step}, "
                f"epoch {self.epoch_num}: {games} games finished this epoch")
        if mean is not None:
            line += f", mean score {mean:.1f} (max {stats.get('max_score'):.0f})"
        logger.info(line + f", epsilon {self.replay.exploration:.3f}")
