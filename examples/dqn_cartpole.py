#!/usr/bin/env python
"""Double DQN on CartPole-v1 in a few minutes on a laptop CPU: tensorpack + expreplay.ExpReplay.

    python examples/dqn_cartpole.py                 # train, then print "mean score X"
    python examples/dqn_cartpole.py --task eval --load train_log/dqn-cartpole/best-model
    python examples/dqn_cartpole.py --prioritized --n-step 3   # PER + 3-step returns

The same machinery as the Atari example (``dqn_atari.py``) on a problem small enough to
learn in minutes: vector observations (4 floats) stored as float32 frames, a 2-layer MLP
instead of the Nature CNN, one frame per state (the observation is the full state).

How it knows it is done: every ``--eval-every`` environment steps a callback plays 20 greedy
episodes with the current network and keeps the best weights; training stops once that
evaluation averages ``--stop-score`` or the ``--steps`` budget is spent. The final figure
comes from 20 *fresh* greedy episodes (other seeds) played by the best weights. DQN on
CartPole is known to collapse after it has solved the task (the replay memory fills with
perfect episodes and the values drift); keeping the best evaluated weights is the standard
remedy and costs one checkpoint.

Hyperparameters (after rl-baselines3-zoo's tuned CartPole DQN): Adam at 2.3e-3 decaying linearly
to a tenth over the budget (the decay damps DQN's oscillations on CartPole), batch 64, one
training step per 2 env steps, target copied every 64 training steps, epsilon 1 -> 0.04 over the
first 8k env steps, a 2x256 MLP, gamma 0.99, Huber loss, Double DQN. Measured on a 2-core CPU:
seeds 0-9 all reach a 20-episode greedy mean of 500 after 7.5k-57.5k env steps (seed 0, the
default: 20k steps, 45-50 s including TensorFlow's start-up; other machines' TensorFlow may take
another number of steps: one needed 37.5k for seed 0).
"""

import argparse
import os
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--task', choices=['train', 'eval'], default='train',
                   help='train (then evaluate the best weights), or only evaluate --load')
    p.add_argument('--load', help='a checkpoint to evaluate (--task eval) or to start from')
    p.add_argument('--logdir', default='train_log/dqn-cartpole',
                   help='checkpoints, TensorBoard events and the log go here (emptied first)')
    p.add_argument('--seed', type=int, default=0, help='seeds TF, the memory sampling and the envs')
    p.add_argument('--algo', choices=['DQN', 'Double', 'Dueling'], default='Double')
    p.add_argument('--steps', type=int, default=100_000,
                   help='environment-step budget for training (the initial fill included)')
    p.add_argument('--lr', type=float, default=2.3e-3, help='Adam learning rate')
    p.add_argument('--final-lr-fraction', type=float, default=0.1,
                   help='the learning rate falls linearly to this fraction of --lr over --steps')
    p.add_argument('--gamma', type=float, default=0.99, help='discount factor')
    p.add_argument('--hidden', type=int, default=256, help='width of the two hidden layers')
    p.add_argument('--batch-size', type=int, default=64)
    p.add_argument('--prioritized', action='store_true', help='proportional prioritized replay')
    p.add_argument('--alpha', type=float, default=0.6, help='priority exponent (--prioritized)')
    p.add_argument('--beta', type=float, default=0.4,
                   help='importance-weight exponent at the start, annealed to 1 over --steps')
    p.add_argument('--n-step', type=int, default=1, help='n-step returns')
    p.add_argument('--update-frequency', type=int, default=2,
                   help='environment steps per training step (the replay ratio is batch/this)')
    p.add_argument('--memory-size', type=int, default=100_000, help='replay memory capacity')
    p.add_argument('--init-memory-size', type=int, default=1_000,
                   help='random-policy transitions collected before training starts')
    p.add_argument('--target-update', type=int, default=64,
                   help='copy the online network into the target network every N training steps')
    p.add_argument('--exploration-steps', type=int, default=8_000,
                   help='environment steps over which epsilon falls linearly from 1')
    p.add_argument('--final-exploration', type=float, default=0.04, help='epsilon after the decay')
    p.add_argument('--players', type=int, default=1,
                   help='parallel environments (1: stepped inline in the data thread, no simulator threads)')
    p.add_argument('--eval-every', type=int, default=2_500, help='environment steps between greedy evaluations')
    p.add_argument('--eval-episodes', type=int, default=20, help='episodes per evaluation')
    p.add_argument('--stop-score', type=float, default=495.0,
                   help='stop training once a periodic evaluation averages this (500 is the maximum)')
    return p.parse_args(argv)


if __name__ == '__main__':
    parse_args()   # --help and bad arguments answer before TensorFlow loads (~20 s)

from tf_setup import tf   # first: TensorFlow set up (quietly) before tensorpack imports it

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

from dqn_eval import evaluate  # noqa: E402
from dqn_model import DQNModel, PrioritizedNStepDQN  # noqa: E402
from tensorpack import (Callback, FeedInput, OfflinePredictor, PredictConfig,  # noqa: E402
                        ScheduledHyperParamSetter, SimpleTrainer, SmartInit, TrainConfig,
                        launch_train_with_config, logger)
from tensorpack.train.base import StopTraining  # noqa: E402
from tensorpack_dqn import dqn_callbacks, make_replay, train_until_interrupted  # noqa: E402

ENV_ID = 'CartPole-v1'
STATE_SHAPE = (4,)   # one observation; the memory stores it as one float32 "frame"
HISTORY = 1          # CartPole's observation is Markov: no frame stacking needed
NUM_ACTIONS = 2


def make_env():
    return gym.make(ENV_ID)   # 500-step time limit: a truncation, which the memory bootstraps


def build_model(args):
    rainbow = args.prioritized or args.n_step > 1   # n-step / prioritized batches
    return (PrioritizedNStepDQN if rainbow else DQNModel)(
        STATE_SHAPE, HISTORY, args.algo, NUM_ACTIONS, network='mlp', state_dtype='float32',
        hidden=(args.hidden, args.hidden), gamma=args.gamma, learning_rate=args.lr,
        optimizer='adam', reward_clip=None, grad_clip=10.0)


class GreedyEvaluation(Callback):
    """Every ``every`` env steps: play greedy episodes, keep the best weights, stop when done.

    Env steps are read from the replay memory (every step any runner takes is written there),
    so the budget counts exactly the transitions the agent experienced.
    """

    def __init__(self, replay, args):
        self.replay, self.args = replay, args
        self.next_eval = args.eval_every
        self.best = -np.inf
        self.best_path = os.path.join(args.logdir, 'best-model')
        self.history = []   # (env steps, mean score)

    def _setup_graph(self):
        self.predictor = self.trainer.get_predictor(['state'], ['Qvalue'])
        self.saver = tf.train.Saver(max_to_keep=1)

    def _before_train(self):
        self.start_time = time.time()

    def _trigger_step(self):
        steps = self.replay.mem.num_steps_written
        if steps < self.next_eval and steps < self.args.steps:
            return
        self.next_eval = (steps // self.args.eval_every + 1) * self.args.eval_every
        # Seeds differ per evaluation and from the final one (which uses 10**6 + ...).
        scores = evaluate(make_env, self.predictor, HISTORY, self.args.eval_episodes, seed=steps)
        mean = float(scores.mean())
        self.history.append((steps, mean))
        self.trainer.monitors.put_scalar('eval/mean_score', mean)
        self.trainer.monitors.put_scalar('eval/min_score', float(scores.min()))
        logger.info(f"env steps {steps}: greedy mean score {mean:.1f} (min {scores.min():.0f}) "
                    f"after {time.time() - self.start_time:.0f} s, epsilon {self.replay.exploration:.3f}")
        if mean > self.best:
            self.best = mean
            self.saver.save(tf.get_default_session(), self.best_path, write_meta_graph=False)
        if mean >= self.args.stop_score:
            raise StopTraining(f"solved: mean score {mean:.1f} >= {self.args.stop_score}")
        if steps >= self.args.steps:
            raise StopTraining(f"environment-step budget {self.args.steps} spent")


def train(args):
    logger.set_logger_dir(args.logdir, action='d')
    tf.set_random_seed(args.seed)
    model = build_model(args)
    uf = args.update_frequency
    replay = make_replay(args, get_player=make_env, players=args.players, state_shape=STATE_SHAPE,
                         history=HISTORY, dtype='float32', init_memory_size=args.init_memory_size,
                         training_steps=args.steps / uf, gamma=args.gamma)
    evaluation = GreedyEvaluation(replay, args)
    config = TrainConfig(
        model=model,
        # FeedInput, not QueueInput: QueueInput prefetches 50 batches, which would both train on
        # batches sampled 50 updates ago and step the env 50*uf times ahead of the learner.
        # A tiny MLP trains fast enough that prefetching buys nothing.
        data=FeedInput(replay),
        callbacks=[
            # The replay (it fills the memory before training), the target network copied every
            # --target-update training steps, epsilon 1 -> final over --exploration-steps.
            *dqn_callbacks(replay, target_update=args.target_update, update_frequency=uf,
                           epsilon=[(0, 1.0), (args.exploration_steps, args.final_exploration)],
                           prioritized=args.prioritized),
            ScheduledHyperParamSetter(
                'learning_rate',
                [(0, args.lr), (max(1, args.steps // uf), args.lr * args.final_lr_fraction)],
                interp='linear', step_based=True),
            evaluation,
        ],
        session_init=SmartInit(args.load) if args.load else None,
        steps_per_epoch=1000,
        max_epoch=10**6,   # the evaluation callback stops training
    )
    start = time.time()
    launch_train_with_config(config, SimpleTrainer())
    env_steps = replay.mem.num_steps_written
    logger.info(f"training done: {env_steps} env steps in {time.time() - start:.0f} s; "
                f"best periodic evaluation {evaluation.best:.1f}")
    # The first periodic evaluation that reached --stop-score (what compare_cartpole.py reads).
    solved = [steps for steps, mean in evaluation.history if mean >= args.stop_score]
    print(f"solved at env steps {solved[0]}" if solved else "not solved")
    return evaluation.best_path, env_steps


def final_evaluation(args, checkpoint):
    predictor = OfflinePredictor(PredictConfig(
        model=build_model(args), session_init=SmartInit(checkpoint),
        input_names=['state'], output_names=['Qvalue']))
    scores = evaluate(make_env, predictor, HISTORY, args.eval_episodes, seed=10**6 + args.seed)
    return scores


def main(argv=None):
    args = parse_args(argv)
    if args.task == 'train':
        result, interrupted = train_until_interrupted(train, args)
        if interrupted:
            best = os.path.join(args.logdir, 'best-model')
            kept = (f"the best weights so far are in {best} (evaluate them with --task eval "
                    f"--load {best})" if os.path.exists(best + '.index') else
                    "no weights kept yet (the first evaluation had not run)")
            print(f"Interrupted: training stopped, environments closed; {kept}.")
            raise SystemExit(130)
        checkpoint, env_steps = result
    else:
        if not args.load:
            raise SystemExit('--task eval needs --load')
        checkpoint, env_steps = args.load, None
    scores = final_evaluation(args, checkpoint)
    if env_steps is not None:
        print(f"env steps {env_steps}")
    print(f"scores {scores.astype(int).tolist()}")
    print(f"mean score {scores.mean():.1f}")
    return scores.mean()


if __name__ == '__main__':
    main()
