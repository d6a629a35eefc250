"""The DQN update of the tensorpack examples: the Q-network, the loss and the target network.

One ``DQNModel`` covers the three algorithms the examples offer:

* ``DQN``      target = r + gamma * max_a Q_target(s', a)                      (Mnih et al. 2015)
* ``Double``   target = r + gamma * Q_target(s', argmax_a Q_online(s', a))     (van Hasselt et al. 2016)
* ``Dueling``  Q = V + A - mean(A), trained with the Double target             (Wang et al. 2016)

and two networks: the Nature CNN for stacks of 84x84 frames, and a small MLP for vector
observations such as CartPole's. ``DQNModel.build_graph`` is the update: the Huber loss to the
target above, which tensorpack's trainer minimises once per batch.

The model reads what ``expreplay.ExpReplay`` yields: ``[comb_state, action, reward, isOver]``,
``comb_state`` of shape ``(B, *state_shape, history + 1)`` holding the state's ``history``
frames and the next state's newest frame (a state and its successor share ``history - 1``
frames, so they are stored once). ``isOver`` is True only for a *terminated* step: a time
limit (truncation) bootstraps, which matters for CartPole's 500-step cap.

:class:`PrioritizedNStepDQN` trains the same networks on n-step, prioritized batches
(``tensorpack_dqn.PriorityFeedback`` hands its |TD errors| back to the replay as priorities).
"""

if __name__ == '__main__':   # a module the examples import, not a program: --help says so
    import module_help
    module_help.answer(__doc__, 'dqn_model.py', 'the tensorpack examples')

from tf_setup import tf   # first: it sets TensorFlow up, quietly, before tensorpack imports it

import numpy as np  # noqa: E402
from tensorpack import ModelDesc  # noqa: E402
from tensorpack.models import Conv2D, FullyConnected  # noqa: E402
from tensorpack.tfutils import summary, varreplace  # noqa: E402
from tensorpack.tfutils.scope_utils import auto_reuse_variable_scope  # noqa: E402
from tensorpack.tfutils.tower import get_current_tower_context  # noqa: E402

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

    # ------------------------------------------------------------------ the update
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
    """Train a :class:`DQNModel` on the n-step, prioritized batches of ``ExpReplay(...,
    memory=ReplayMemory(..., prioritized=True), sampling=Sampling(..., n_step=3))``:
    ``class Model(PrioritizedNStepMixin, DQNModel)``.

    Inputs: the fields of :class:`expreplay.storage.memory.SampleBatch` (``state``, ``action``,
    ``reward``, ``next_state``, ``discount``, ``is_over``, ``sample_indices``, ``is_weights``).
    The target is ``reward + discount * Q_target(next_state, .)`` (the memory's discount is
    ``gamma ** k`` for the k steps summed, 0 after a terminal step, so the model's ``gamma`` is
    not used), the loss the mean of ``is_weights * huber(target - Q(state, action))``, and
    ``td_error_abs`` the per-sample |TD error| that ``tensorpack_dqn.PriorityFeedback`` hands
    back to the memory. A uniform memory's weights are all 1, so the mixin serves n-step without PER too.

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


class PrioritizedNStepDQN(PrioritizedNStepMixin, DQNModel):
    """DQNModel trained on n-step, prioritized batches (build it with ``reward_clip=None``)."""
