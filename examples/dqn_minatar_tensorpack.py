#!/usr/bin/env python
"""The MinAtar paper's DQN trained by tensorpack's trainer, with expreplay.ExpReplay as its data.

    python examples/dqn_minatar_tensorpack.py --game breakout               # the paper's 5M frames
    python examples/dqn_minatar_tensorpack.py --game breakout --frames 200000 --returns breakout_0.csv
    python examples/dqn_minatar_tensorpack.py --game breakout --prioritized --n-step 3   # PER + 3-step

The agent of ``dqn_minatar.py`` (Young & Tian 2019, the set-up of the MinAtar repository's
``examples/dqn.py``; that script's docstring and docs/minatar.md say where each value comes
from), built the way a tensorpack DQN script is built: a ``ModelDesc`` (the paper's network:
conv 3x3x16, valid, ReLU -> 128 ReLU -> one Q-value per action, PyTorch's default
initialisation), ``expreplay.ExpReplay`` as the trainer's DataFlow (through ``FeedInput``) and as
a callback (it fills the memory before training, reports the games every epoch and stops its
threads at the end), ``ScheduledHyperParamSetter(ObjAttrParam(replay, 'exploration'))`` for
epsilon, ``PeriodicTrigger(RunOp(update_target_param))`` for the target network, and
``SimpleTrainer``. The same values as the numpy script: memory 100k, batch 32, one update per
frame, target copied every 1,000 updates, 5,000 random frames first, epsilon 1 -> 0.1 over the
next 100k frames, centred RMSProp as PyTorch's (step 2.5e-4, smoothing 0.95, eps 0.01 added to
the root; TensorFlow's own centred RMSProp adds it under the root), Huber loss, gamma 0.99,
rewards unclipped.

Progress: a ``progress:`` line 15 s into training and every ``--log-every`` seconds after
(frames and their rate, training step, games finished this epoch and their mean score,
epsilon); every epoch (``--steps-per-epoch`` updates) the trainer's monitors print
``expreplay/mean_score``, ``expreplay/env_steps_per_sec`` and the other replay statistics
(docs/tensorpack.md), and write them to TensorBoard events and ``stats.json`` in ``--logdir``.
``--returns`` writes every training episode's ``frames,score``, as ``dqn_minatar.py`` does
(``examples/plot_minatar.py`` draws the paper's curves from them). At the end: ``training done:
F frames, G games, S training steps, memory M transitions``, then ``--eval-episodes`` greedy games.
"""

import os
import time

from dqn_minatar import EpisodeLog, argument_parser, describe, evaluate, make_env


def parse_args(argv=None):
    p = argument_parser(__doc__)
    p.add_argument('--logdir', help='TensorBoard events, stats.json and the log (emptied first; '
                                    'default: train_log/dqn-minatar-<game>)')
    p.add_argument('--steps-per-epoch', type=int, default=10_000,
                   help='training steps between the monitors\' reports')
    args = p.parse_args(argv)
    args.logdir = args.logdir or os.path.join('train_log', f'dqn-minatar-{args.game}')
    return args


if __name__ == '__main__':
    parse_args()   # --help and bad arguments answer before TensorFlow loads

from tf_setup import tf   # first: TensorFlow set up (quietly) before tensorpack imports it

import numpy as np  # noqa: E402
from dqn_model import DQNModel, PrioritizedNStepMixin  # noqa: E402
from tensorpack import (Callback, FeedInput, SimpleTrainer, TrainConfig,  # noqa: E402
                        launch_train_with_config, logger)
from tensorpack.models import Conv2D, FullyConnected  # noqa: E402
from tensorpack.tfutils.scope_utils import auto_reuse_variable_scope  # noqa: E402
from tensorpack.train.base import StopTraining  # noqa: E402
from tensorpack_dqn import ProgressLog, dqn_callbacks, make_replay, train_until_interrupted  # noqa: E402


def torch_default_init(fan_in):
    """PyTorch's default for Linear and Conv2d, weights and biases: uniform in +-1/sqrt(fan_in)."""
    bound = 1.0 / np.sqrt(fan_in)
    return tf.random_uniform_initializer(-bound, bound)


class CentredRMSProp(tf.train.Optimizer):
    """PyTorch's ``RMSprop(centered=True)`` without momentum: eps is added to the root,
    ``var -= lr * g / (sqrt(E[g^2] - E[g]^2) + eps)``. (``tf.train.RMSPropOptimizer(centered=True)``
    computes ``sqrt(E[g^2] - E[g]^2 + eps)``: with eps = 0.01 a step up to 10x larger.)"""

    def __init__(self, learning_rate, alpha=0.95, eps=0.01, name='CentredRMSProp'):
        super().__init__(use_locking=False, name=name)
        self.lr, self.alpha, self.eps = learning_rate, alpha, eps

    def _create_slots(self, var_list):
        for var in var_list:
            self._zeros_slot(var, 'mean_square', self._name)
            self._zeros_slot(var, 'mean', self._name)

    def _apply_dense(self, grad, var):
        a = self.alpha
        mean_square = tf.assign(self.get_slot(var, 'mean_square'),
                                a * self.get_slot(var, 'mean_square') + (1 - a) * tf.square(grad))
        mean = tf.assign(self.get_slot(var, 'mean'), a * self.get_slot(var, 'mean') + (1 - a) * grad)
        # >= 0 in exact arithmetic (Cauchy-Schwarz); the maximum keeps rounding out of the root.
        root = tf.sqrt(tf.maximum(mean_square - tf.square(mean), 0.0))
        return tf.assign_sub(var, self.lr * grad / (root + self.eps)).op

    _resource_apply_dense = _apply_dense   # given the variable itself; tf.assign serves both kinds


class MinAtarDQN(DQNModel):
    """tensorpack's DQN model (target network, Huber TD loss, ``update_target_param``) with the
    paper's network and optimizer. States are ``(B, 10, 10, C, 1)``: one boolean frame."""

    def __init__(self, channels, num_actions, args):
        super().__init__((10, 10, channels), 1, 'DQN', num_actions, state_dtype='bool',
                         gamma=args.gamma, learning_rate=args.lr, reward_clip=None, grad_clip=None)

    @auto_reuse_variable_scope
    def get_DQN_prediction(self, state):
        x = tf.cast(state[..., 0], tf.float32)
        channels = self.state_shape[-1]
        x = Conv2D('conv0', x, 16, 3, padding='valid', activation=tf.nn.relu,
                   kernel_initializer=torch_default_init(9 * channels),
                   bias_initializer=torch_default_init(9 * channels))
        x = FullyConnected('fc0', x, 128, activation=tf.nn.relu,
                           kernel_initializer=torch_default_init(8 * 8 * 16),
                           bias_initializer=torch_default_init(8 * 8 * 16))
        q = FullyConnected('fct', x, self.num_actions, kernel_initializer=torch_default_init(128),
                           bias_initializer=torch_default_init(128))
        return tf.identity(q, name='Qvalue')

    def optimizer(self):
        return CentredRMSProp(self.learning_rate)


class PrioritizedNStepMinAtarDQN(PrioritizedNStepMixin, MinAtarDQN):
    """MinAtarDQN trained on the memory's n-step, prioritized batches (weighted Huber loss)."""


class FrameBudget(Callback):
    """Ends training once ``args.frames`` frames were played (the fill included): says what was
    done, plays the greedy evaluation games while the session is open, and stops the trainer."""

    def __init__(self, replay, episodes, args):
        self.replay, self.episodes, self.args = replay, episodes, args
        # Batch k is drawn after replay_start + (k - 1) * update_frequency frames.
        self.steps = max(0, -(-(args.frames - args.replay_start) // args.update_frequency)) + 1
        self.summary = {}   # what was done, once the budget is spent

    def _setup_graph(self):
        self.predictor = self.trainer.get_predictor(['state'], ['Qvalue'])

    def _before_train(self):
        self.start = time.time()

    def _trigger_step(self):
        if self.global_step < self.steps:
            return
        s = self.summary
        s.update(frames=self.replay.mem.num_steps_written, games=len(self.episodes.rows),
                 training_steps=self.global_step, memory=len(self.replay.mem))
        logger.info(f"training done: {s['frames']} frames, {s['games']} games, "
                    f"{s['training_steps']} training steps, memory {s['memory']} transitions in "
                    f"{time.time() - self.start:.0f} s")
        if self.args.eval_episodes:
            s['greedy_scores'] = evaluate(lambda states: self.predictor(states)[0], self.args.game,
                                          self.args.eval_episodes, seed=10**6 + self.args.seed)
            logger.info(f"greedy mean score {s['greedy_scores'].mean():.2f} over "
                        f"{self.args.eval_episodes} episodes")
        raise StopTraining(f"{self.args.frames} frames played")


def train(args):
    """Train for ``args.frames`` frames; returns the frames, games, training steps and memory
    size at the end (and the greedy scores, with ``--eval-episodes``): empty if stopped early."""
    logger.set_logger_dir(args.logdir, action='d')
    logger.info(describe(args))
    tf.set_random_seed(args.seed)
    probe = make_env(args.game)
    channels, num_actions = probe.observation_space.shape[-1], probe.action_space.n
    probe.close()
    uf = args.update_frequency
    episodes = EpisodeLog(args.returns)
    replay = make_replay(
        args, get_player=lambda: make_env(args.game),
        players=1,   # the paper's one env, stepped inline by FeedInput's next()
        state_shape=(10, 10, channels), history=1, dtype='bool', init_memory_size=args.replay_start,
        training_steps=args.frames / uf, gamma=args.gamma,
        sampling=dict(weight_norm=args.weight_norm), acting=dict(on_episode_end=episodes),
        # The paper alternates a frame and an update: drawn ahead, batches would let the env
        # run ahead of the learner's weights.
        prefetch=0)
    budget = FrameBudget(replay, episodes, args)
    model = (PrioritizedNStepMinAtarDQN if args.prioritized or args.n_step > 1 else MinAtarDQN)(
        channels, num_actions, args)
    # The replay (it fills the memory before training, reports the games every epoch), the
    # target network copied every --target-update updates, epsilon 1 -> final over the
    # exploration frames after the fill (the first training step comes right after it).
    replay_callbacks = dqn_callbacks(
        replay, target_update=args.target_update, update_frequency=uf, prioritized=args.prioritized,
        epsilon=[(0, 1.0), (args.exploration_frames, args.final_exploration)])
    config = TrainConfig(
        model=model,
        # FeedInput, not QueueInput: QueueInput's 50 queued batches would step the env 50
        # updates ahead of the learner, where the paper alternates a frame and an update.
        data=FeedInput(replay),
        callbacks=[*replay_callbacks, ProgressLog(replay, every=args.log_every, first=15), budget],
        steps_per_epoch=min(args.steps_per_epoch, budget.steps),
        max_epoch=10**9,   # FrameBudget stops the training
    )
    try:
        launch_train_with_config(config, SimpleTrainer())
    finally:
        episodes.close()
    return budget.summary


def main(argv=None):
    args = parse_args(argv)
    _, interrupted = train_until_interrupted(train, args)
    if interrupted:
        print("Interrupted: training stopped, environment closed"
              + (f"; the episodes so far are in {args.returns}." if args.returns else "."))
        raise SystemExit(130)


if __name__ == '__main__':
    main()
