"""The tensorpack side of prioritized n-step replay (examples/dqn_model.py and
examples/tensorpack_dqn.py): the mixin's per-sample |TD| and weighted loss, checked against numpy
on the tensors of each training step, and PriorityFeedback writing them back as the memory's
priorities."""

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, 'examples'))

pytest.importorskip('tensorpack')


@pytest.mark.timeout(300)
def test_td_errors_and_loss_and_priority_feedback(tmp_path):
    import gymnasium as gym
    from dqn_model import DQNModel, PrioritizedNStepMixin, tf
    from tensorpack_dqn import PriorityFeedback
    from tensorpack import (Callback, FeedInput, SimpleTrainer, TrainConfig,
                            launch_train_with_config, logger)

    import expreplay

    class Model(PrioritizedNStepMixin, DQNModel):
        pass

    logger.set_logger_dir(str(tmp_path / 'log'), action='d')
    model = Model((4,), 1, 'Double', 2, network='mlp', state_dtype='float32', hidden=(16,),
                  reward_clip=None, learning_rate=1e-3)
    replay = expreplay.ExpReplay(
        (['state'], ['Qvalue']), lambda: gym.make('CartPole-v1'), 1, (4,), 32, 2000, 200, 2, 1,
        'float32', memory=expreplay.ReplayMemory(2000, (4,), 1, 'float32', prioritized=True,
                                                 alpha=0.6),
        sampling=expreplay.Sampling(32, 2, beta=0.5, n_step=3, gamma=0.9, seed=0))
    checked = []

    class Check(Callback):
        names = ['reward', 'discount', 'is_weights', 'sample_indices', 'q_taken',
                 'bootstrap_value', 'td_error_abs', 'cost']

        def _setup_graph(self):
            self.fetches = self.get_tensors_maybe_in_tower([n + ':0' for n in self.names])

        def _before_run(self, ctx):
            return tf.train.SessionRunArgs(fetches=self.fetches)

        def _after_run(self, ctx, values):
            v = dict(zip(self.names, values.results))
            target = v['reward'] + v['discount'] * v['bootstrap_value']
            td = np.abs(target - v['q_taken'])
            np.testing.assert_allclose(v['td_error_abs'], td, rtol=1e-5, atol=1e-6)
            huber = np.where(td <= 1, 0.5 * td ** 2, td - 0.5)
            np.testing.assert_allclose(v['cost'], np.mean(v['is_weights'] * huber), rtol=1e-5)
            assert set(np.unique(v['discount'])) <= {0.0, np.float32(0.9), np.float32(0.81),
                                                     np.float32(0.729)}
            # PriorityFeedback ran first (callbacks run in order): the memory holds the new
            # priorities of every slot of this batch (the last of repeated ones).
            mem = replay.mem
            slots = v['sample_indices'] % mem.num_slots
            last = {s: t for s, t in zip(slots, v['td_error_abs'])}
            tree = mem.ring.priorities.tree
            for s, t in last.items():
                assert tree.get(s) == pytest.approx((t + 1e-6) ** 0.6, rel=1e-5)
            checked.append(len(slots))

    config = TrainConfig(model=model, data=FeedInput(replay),
                         callbacks=[replay, PriorityFeedback(replay), Check()],
                         steps_per_epoch=20, max_epoch=2)
    launch_train_with_config(config, SimpleTrainer())
    assert len(checked) == 40 and all(n == 32 for n in checked)


# Runs the example as a user does (a process that imports TensorFlow and builds the graph): slow,
# as the other such runs in test_examples.py.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_atari_example_trains_with_prioritized_n_step(tmp_path):
    from test_examples import ATARI_SMOKE, run_example
    logdir = tmp_path / 'pong'
    run_example('dqn_atari.py', *ATARI_SMOKE, '--logdir', logdir, '--players', 2,
                '--max-epoch', 2, '--eval-every', 2, '--algo', 'Dueling', '--prioritized',
                '--n-step', 3, timeout=500)
    stats = open(logdir / 'stats.json').read()
    assert 'expreplay/stale_priority_updates' in stats and 'eval/mean_score' in stats
