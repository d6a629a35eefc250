#!/usr/bin/env python
"""DQN / Double DQN / Dueling DQN on Atari: tensorpack's trainer, expreplay.ExpReplay as its data.

    python examples/dqn_atari.py --env ALE/Pong-v5 --memory-size 200000  # train (README's quick start)
    python examples/dqn_atari.py --env ALE/Pong-v5 --vector 0             # single-env players
    python examples/dqn_atari.py --env ALE/Pong-v5 --envpool 8            # EnvPool, asynchronous
    python examples/dqn_atari.py --ray-actors 8 --envs-per-actor 4 --ray-address HEAD:6379   # a Ray cluster
    python examples/dqn_atari.py --env ALE/Pong-v5 --algo Dueling --prioritized --n-step 3   # Rainbow's replay
    python examples/dqn_atari.py --task eval --load train_log/dqn-pong/checkpoint
    python examples/dqn_atari.py --task play --load train_log/dqn-pong/checkpoint --output pong.mp4

tensorpack's ``examples/DeepQNetwork/DQN.py`` on gymnasium's ALE with this package's replay. Read
it in this order: the hyperparameters (``parse_args``: Nature DQN's, as tensorpack's example),
``train`` (the replay memory filled by players stepping the games, the schedules, the trainer),
and the update itself in ``dqn_model.py`` (``DQNModel.build_graph``: the Huber loss to
r + gamma * Q_target(s', a*)). What a long run needs besides (log-directory protection,
``--resume``, Ctrl-C, progress lines, videos) is in ``atari_run.py`` and ``tensorpack_dqn.py``;
the preprocessing (grayscale 84x84, frameskip 4 with max-pool, no-op starts, fire on reset) in
``atari_wrappers.py``; the choice of players at the end of this file.

The players are ale-py's vector env by default: it steps its games in C++ threads that release
the GIL, where threads stepping single ALE envs take turns (ale-py's ``act`` holds the GIL), so
a learner gets its batches faster. How fast this runs: docs/examples.md. Pong needs a
few million agent steps: days on a CPU, hours on a GPU.
"""

import argparse

import atari_players
import atari_run

HISTORY = 4   # frames per state: one frame can not show which way the ball moves


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--env', default='ALE/Pong-v5', help='a gymnasium ALE id, e.g. ALE/Breakout-v5')
    p.add_argument('--task', choices=['train', 'eval', 'play'], default='train',
                   help='train; eval: mean/max score of --eval-episodes games; play: record games')
    p.add_argument('--algo', choices=['DQN', 'Double', 'Dueling'], default='Double')
    p.add_argument('--load', help='model checkpoint to start from (train) or to use (eval, play)')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--memory-size', type=int, default=1_000_000,
                   help='frames in the replay memory, ~7 KB each (1M: ~7 GB; 100k: ~0.7 GB)')
    p.add_argument('--init-memory-size', type=int,
                   help='random-policy steps before training (default: memory size / 20, at most 50k)')
    p.add_argument('--batch-size', type=int, default=64)
    p.add_argument('--update-frequency', type=int, default=4, help='agent steps per training step')
    p.add_argument('--target-update', type=int, default=10_000,
                   help='copy the online network into the target network every N training steps')
    p.add_argument('--optimizer', choices=['adam', 'rmsprop'], default='adam')
    p.add_argument('--lr', type=float, help='learning rate (default: 1e-4 Adam, 1e-3 RMSProp as tensorpack); '
                                            'halved at epoch 60, /10 at epoch 400 as tensorpack')
    p.add_argument('--exploration-steps', type=int, default=1_000_000,
                   help='agent steps over which epsilon falls from 1 to 0.1 (then to 0.01 by 40x that)')
    p.add_argument('--steps-per-epoch', type=int, default=5_000, help='training steps per epoch')
    p.add_argument('--max-epoch', type=int, default=2_000)
    p.add_argument('--prioritized', action='store_true', help='proportional prioritized replay')
    p.add_argument('--alpha', type=float, default=0.6, help='priority exponent (--prioritized)')
    p.add_argument('--beta', type=float, default=0.4,
                   help='importance-weight exponent at the start, annealed to 1 over the run')
    p.add_argument('--n-step', type=int, default=1, help='n-step returns (Rainbow: 3)')
    p.add_argument('--no-life-loss', action='store_true',
                   help='do not treat a lost life as terminal for training (scores are per game either way)')
    p.add_argument('--sticky', type=float, default=0.25,
                   help='probability the emulator repeats the previous action (v5 default; 0 = Nature DQN)')
    p.add_argument('--eval-every', type=int, default=5, help='epochs between greedy evaluations (0: never)')
    p.add_argument('--eval-episodes', type=int, default=10, help='games per evaluation')
    p.add_argument('--eval-epsilon', type=float, default=0.01,
                   help='random actions during evaluation, so that a stuck agent can not play forever')
    p.add_argument('--max-episode-steps', type=int,
                   help='cut evaluation games after this many agent steps (default: ALE limit, 27k steps)')
    atari_players.add_arguments(p)   # --vector (the default), --players, --envpool, --ray-actors, ...
    atari_run.add_arguments(p)       # --logdir, --resume, --overwrite, --progress-every, --output, ...
    args = p.parse_args(argv)
    atari_players.check_arguments(p, args)
    atari_run.check_arguments(p, args, 'dqn-' + args.env.split('/')[-1].split('-')[0].lower())
    if args.lr is None:
        args.lr = 1e-3 if args.optimizer == 'rmsprop' else 1e-4
    if args.init_memory_size is None:
        args.init_memory_size = min(args.memory_size // 20, 50_000)
    return args


if __name__ == '__main__':
    parse_args()   # --help and bad arguments answer before TensorFlow loads

from tf_setup import tf   # first: TensorFlow set up (quietly) before tensorpack imports it

from atari_wrappers import FRAME_SHAPE, make_env  # noqa: E402
from dqn_eval import evaluate  # noqa: E402
from dqn_model import DQNModel, PrioritizedNStepDQN  # noqa: E402
import gymnasium as gym  # noqa: E402
from expreplay import ManagerSettings, RunnerSettings  # noqa: E402
from expreplay.tensorpack_io import CLOSE_TIMEOUT, MemoryCheckpoints  # noqa: E402
from tensorpack import (Callback, OfflinePredictor, PeriodicTrigger, PredictConfig,  # noqa: E402
                        QueueInput, ScheduledHyperParamSetter, SimpleTrainer, SmartInit,
                        TrainConfig, launch_train_with_config, logger)
from tensorpack_dqn import ProgressLog, dqn_callbacks, make_replay, train_until_interrupted  # noqa: E402


def build_model(args, num_actions):
    """The Nature CNN and the DQN loss (dqn_model.py). With n-step or prioritized batches the
    training envs clip each step's reward (see training_players), so the model does not."""
    rainbow = args.prioritized or args.n_step > 1
    return (PrioritizedNStepDQN if rainbow else DQNModel)(
        FRAME_SHAPE, HISTORY, args.algo, num_actions, network='nature', state_dtype='uint8',
        gamma=0.99, learning_rate=args.lr, optimizer=args.optimizer,
        reward_clip=None if rainbow else 1.0, grad_clip=10.0)


def train(args, num_actions):
    before = atari_run.prepare_logdir(args)   # never deletes a previous run without --overwrite
    with atari_run.forget_unsaved_start(args.logdir, before):   # a failed start leaves no run
        start_training(args, num_actions)


def start_training(args, num_actions):
    tf.set_random_seed(args.seed)
    uf = args.update_frequency
    # The replay memory, filled by players stepping the games with the current network:
    # epsilon-greedy, one batch of transitions drawn per uf agent steps.
    replay = make_replay(
        args, get_player=training_players(args), players=args.players, state_shape=FRAME_SHAPE,
        history=HISTORY, dtype='uint8', init_memory_size=args.init_memory_size,
        training_steps=args.max_epoch * args.steps_per_epoch,
        acting=dict(
            maximum_staleness=args.maximum_staleness,
            runner=RunnerSettings(life_loss_terminal=not args.no_life_loss),
            # ExpReplay's close timeout too: the threads end before the Session.
            manager=ManagerSettings(simulator_threads=args.simulator_threads or None,
                                    close_timeout=CLOSE_TIMEOUT)),
        # Saved when training ends (and every k epochs); --resume loads it instead of refilling.
        checkpoint=MemoryCheckpoints(args.logdir, every_k_epochs=args.save_memory_every or None))
    callbacks = [
        # The epoch's monitors are minutes away: a line soon after the fill, then regularly.
        ProgressLog(replay, every=args.progress_every, first=args.progress_every / 2),
        *atari_run.model_savers(),   # every epoch and at the end (Ctrl-C too)
        # The replay, the target network copied every --target-update training steps, epsilon
        # 1 -> 0.1 over --exploration-steps agent steps, then -> 0.01 by 40 times that.
        *dqn_callbacks(replay, target_update=args.target_update, update_frequency=uf,
                       epsilon=[(0, 1.0), (args.exploration_steps, 0.1), (40 * args.exploration_steps, 0.01)],
                       prioritized=args.prioritized, verbose_sync=True),
        ScheduledHyperParamSetter('learning_rate', [(0, args.lr), (60, args.lr / 2), (400, args.lr / 10)]),
    ]
    session_init, starting_epoch = (SmartInit(args.load) if args.load else None), 1
    if args.resume:   # the memory came back above (ExpReplay loads the checkpoint's memory)
        session_init, starting_epoch, checkpoint = atari_run.resume_point(args)
        callbacks.append(atari_run.resume_report(replay, checkpoint, starting_epoch, args))
    if args.eval_every:
        callbacks.append(PeriodicTrigger(Evaluator(args), every_k_epochs=args.eval_every))
    config = TrainConfig(
        model=build_model(args, num_actions),
        data=QueueInput(replay),   # as the reference: drawing batches overlaps with training
        callbacks=callbacks, session_init=session_init, starting_epoch=starting_epoch,
        steps_per_epoch=args.steps_per_epoch, max_epoch=args.max_epoch)
    # Each training step: one batch from the replay, one step of the model's optimizer.
    launch_train_with_config(config, SimpleTrainer())


def get_player(args, train=False, render_mode=None):
    """One preprocessed game; training runs cut nothing short (the ALE caps a game at 27k steps)."""
    return make_env(args.env, sticky=args.sticky, render_mode=render_mode,
                    max_episode_steps=None if train else args.max_episode_steps)


class Evaluator(Callback):
    """Greedy (epsilon --eval-epsilon) evaluation on whole games; writes eval/{mean,max}_score."""

    def __init__(self, args):
        self.args = args

    def _setup_graph(self):
        self.predictor = self.trainer.get_predictor(['state'], ['Qvalue'])

    def _trigger(self):
        a = self.args
        scores = evaluate(lambda: get_player(a), self.predictor, HISTORY, a.eval_episodes,
                          epsilon=a.eval_epsilon, seed=10**6 + self.epoch_num, progress=True)
        self.trainer.monitors.put_scalar('eval/mean_score', float(scores.mean()))
        self.trainer.monitors.put_scalar('eval/max_score', float(scores.max()))


def main(argv=None):
    args = parse_args(argv)
    probe = get_player(args)
    num_actions = probe.action_space.n
    probe.close()
    logger.info(f"{args.env}: {num_actions} actions")
    if args.task == 'train':
        _, interrupted = train_until_interrupted(train, args, num_actions)
        if interrupted:
            atari_run.report_interrupt(args.logdir)
        return None
    if not args.load:
        raise SystemExit(f'--task {args.task} needs --load (a checkpoint, e.g. {args.logdir}/checkpoint)')
    predictor = OfflinePredictor(PredictConfig(
        model=build_model(args, num_actions), session_init=SmartInit(args.load),
        input_names=['state'], output_names=['Qvalue']))
    if args.task == 'play':
        atari_run.record_games(args, predictor, lambda **kw: get_player(args, **kw), HISTORY)
        return None
    scores = evaluate(lambda: get_player(args), predictor, HISTORY, args.eval_episodes,
                      epsilon=args.eval_epsilon, seed=10**6 + args.seed, progress=True)
    print(f"mean score {scores.mean():.1f}, max score {scores.max():.1f} over {len(scores)} games")
    return scores


# ---------------------------------------------------------------------- the players
def training_players(args):
    """``make_player`` for the training players the flags ask for (atari_players.py: ale-py's
    vector env by default). With n-step or prioritized replay the rewards are clipped per step
    where they are stored, so the model does not clip them."""
    clip = args.prioritized or args.n_step > 1

    def single_env():   # --vector 0
        env = get_player(args, train=True)
        return gym.wrappers.ClipReward(env, -1.0, 1.0) if clip else env
    return atari_players.player_factory(args, single_env, clip)


if __name__ == '__main__':
    main()
