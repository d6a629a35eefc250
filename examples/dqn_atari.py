#!/usr/bin/env python
"""DQN / Double DQN / Dueling DQN on Atari with tensorpack and expreplay.ExpReplay.

    python examples/dqn_atari.py --env ALE/Pong-v5                      # train
    python examples/dqn_atari.py --env ALE/Pong-v5 --memory-size 100000  # fits in ~1 GB of RAM
    python examples/dqn_atari.py --env ALE/Pong-v5 --vector 4            # ale-py's C++ vector env
    python examples/dqn_atari.py --env ALE/Pong-v5 --envpool 8           # EnvPool, asynchronous
    python examples/dqn_atari.py --env ALE/Pong-v5 --ray-actors 2 --envs-per-actor 4  # envs in Ray actors
    python examples/dqn_atari.py --ray-actors 8 --envs-per-actor 4 --ray-address HEAD:6379   # a cluster
    python examples/dqn_atari.py --env ALE/Pong-v5 --algo Dueling --prioritized --n-step 3
    python examples/dqn_atari.py --env ALE/Pong-v5 --task eval --load train_log/dqn-pong/checkpoint
    python examples/dqn_atari.py --env ALE/Pong-v5 --task play --load ... --output pong.mp4

This is tensorpack's ``examples/DeepQNetwork/DQN.py`` on gymnasium's ALE, with the replay memory
from this package: the script builds ``expreplay.ExpReplay`` with the reference's arguments, uses
it as the trainer's DataFlow and as a callback, and drives its ``exploration`` attribute with
``ScheduledHyperParamSetter(ObjAttrParam(...))``, exactly as the reference does.

Hyperparameters follow tensorpack's example (Nature DQN): a memory of 1M frames (stored once:
~7 GB; ``--memory-size`` shrinks it), batch 64, one training step per 4 agent steps, target
network copied every 10k training steps, epsilon 1 -> 0.1 over the first 1M agent steps and
-> 0.01 by 40M, Adam (or tensorpack's RMSProp), Huber loss, rewards clipped to [-1, 1].

Progress: tqdm bars for the memory fill and each epoch; a ``progress:`` line 15 s into the
training (30-40 s after the start here) and every 30 s after it (``--progress-every``; agent
steps and their rate, games finished this epoch and their mean score, epsilon); every epoch the
monitors print (and write to TensorBoard events and ``stats.json`` in the log directory) the
training game scores (``expreplay/mean_score``: whole games, all lives), env steps per second,
the loss and the mean predicted Q; every ``--eval-every`` epochs a greedy evaluation adds
``eval/mean_score``.
``tensorboard --logdir train_log`` shows the curves. Ctrl-C stops the training cleanly (the
environments are closed, the model and the replay memory are saved) and says what is saved
where; ``--resume`` continues that run (network, global step and so the exploration schedule,
replay memory, epoch count) and says what it restored. A log directory that holds a previous
run is never deleted: a run without ``--resume`` refuses it (``--logdir`` elsewhere, or
``--overwrite`` to delete it).

Speed, measured with the README's quick-start command (3 players, ``--memory-size 200000``):
on the 2-core CPU machines this was developed on, the 10k-step initial fill takes 10-15 s and
training makes 4.4-5.5 training steps/s (batch 64; Double DQN runs the Nature CNN forward three
times and backward once), 14-24 agent steps/s; a new user's faster machine made 87 agent
steps/s. Pong needs a few million agent steps: days on such a CPU, hours on a GPU. The replay
machinery is not the bottleneck here (``tune_staleness.py`` measures it alone).

``--prioritized`` (proportional PER, alpha 0.6, beta 0.4 -> 1 over the run) and ``--n-step N``
train on the memory's n-step, prioritized batches (``PrioritizedNStepMixin``), and hand the
|TD errors| back after every step (``PriorityFeedback``); with ``--algo Dueling`` that is the
replay side of Rainbow. Rewards are then clipped per step by the training envs (an n-step
reward is a sum, which clipping in the loss would get wrong): EnvPool's and ale-py's vector
env's own clipping, a ``ClipReward`` wrapper around single envs and Ray actors' envs, so that
an asynchronous engine stays asynchronous. The training scores (``expreplay/mean_score``) are
then in clipped units; evaluation scores are the game's.
"""

import argparse
import gc
import os

HISTORY = 4   # frames per state: one frame can not show which way the ball moves


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--env', default='ALE/Pong-v5', help='a gymnasium ALE id, e.g. ALE/Breakout-v5')
    p.add_argument('--task', choices=['train', 'eval', 'play'], default='train',
                   help='train; eval: mean/max score of --eval-episodes games; play: record games')
    p.add_argument('--algo', choices=['DQN', 'Double', 'Dueling'], default='Double')
    p.add_argument('--load', help='model checkpoint to start from (train) or to use (eval, play)')
    p.add_argument('--logdir', help='default: train_log/dqn-<game>')
    p.add_argument('--resume', action='store_true',
                   help='continue the run in --logdir: latest model checkpoint (network, global step, '
                        'hence the exploration schedule), saved replay memory, epoch count')
    p.add_argument('--overwrite', action='store_true',
                   help='delete what --logdir holds and start a new run there (without it, a '
                        'directory that holds a previous run is refused)')
    p.add_argument('--seed', type=int, default=0)
    # The replay memory.
    p.add_argument('--memory-size', type=int, default=1_000_000,
                   help='frames in the replay memory, ~7 KB each (1M: ~7 GB; 100k: ~0.7 GB)')
    p.add_argument('--init-memory-size', type=int,
                   help='random-policy steps before training (default: memory size / 20, at most 50k)')
    p.add_argument('--players', type=int, default=3,
                   help='environments (see --simulator-threads)')
    p.add_argument('--simulator-threads', type=int, metavar='K',
                   help='threads stepping the players (default: 1 for single envs, which hold '
                        'the GIL: one thread overlaps one group\'s env steps with the other '
                        'group\'s forward pass; one per player with --vector)')
    p.add_argument('--vector', type=int, default=0, metavar='N',
                   help='use ale-py AtariVectorEnv with N sub-envs per player instead: they step in '
                        'C++ threads that release the GIL, which Python-thread players can not')
    p.add_argument('--envpool', type=int, default=0, metavar='N',
                   help='use one EnvPool of N envs instead (pip install envpool; Python >= 3.11), '
                        'asynchronous: the predictor runs on one half while EnvPool steps the other')
    p.add_argument('--ray-actors', type=int, default=0, metavar='N',
                   help='step the envs in N Ray actors (expreplay.RayVectorEnv, one player of N x '
                        '--envs-per-actor envs); the replay and the CNN stay in this process')
    p.add_argument('--envs-per-actor', type=int, default=4, metavar='K', help='envs per Ray actor')
    p.add_argument('--ray-address', metavar='ADDR',
                   help="a running Ray cluster's address (e.g. head-ip:6379; default: a local Ray)")
    p.add_argument('--maximum-staleness', type=int,
                   help='step requests that may be pending (default 2 x update frequency; see tune_staleness.py)')
    p.add_argument('--no-life-loss', action='store_true',
                   help='do not treat a lost life as terminal for training (scores are per game either way)')
    p.add_argument('--sticky', type=float, default=0.25,
                   help='probability the emulator repeats the previous action (v5 default; 0 = Nature DQN)')
    p.add_argument('--save-memory-every', type=int, default=0, metavar='EPOCHS',
                   help='also checkpoint the replay memory every k epochs (it is saved when training ends)')
    # Learning.
    p.add_argument('--batch-size', type=int, default=64)
    p.add_argument('--prioritized', action='store_true', help='proportional prioritized replay')
    p.add_argument('--alpha', type=float, default=0.6, help='priority exponent (--prioritized)')
    p.add_argument('--beta', type=float, default=0.4,
                   help='importance-weight exponent at the start, annealed to 1 over the run')
    p.add_argument('--n-step', type=int, default=1, help='n-step returns (Rainbow: 3)')
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
    p.add_argument('--progress-every', type=float, default=30.0, metavar='SECONDS',
                   help="seconds between 'progress:' lines (the first comes after half of it)")
    # Evaluation and play.
    p.add_argument('--eval-every', type=int, default=5, help='epochs between greedy evaluations (0: never)')
    p.add_argument('--eval-episodes', type=int, default=10, help='games per evaluation')
    p.add_argument('--eval-epsilon', type=float, default=0.01,
                   help='random actions during evaluation, so that a stuck agent can not play forever')
    p.add_argument('--max-episode-steps', type=int,
                   help='cut games after this many agent steps (default: ALE limit, 27k steps)')
    p.add_argument('--output', help='play: the video (.mp4/.avi) or directory of PNG frames to write')
    p.add_argument('--play-episodes', type=int, default=1)
    args = p.parse_args(argv)
    if args.resume and args.overwrite:
        p.error('--resume continues the run in --logdir, --overwrite deletes it: give one of them')
    game = args.env.split('/')[-1].split('-')[0].lower()
    args.logdir = args.logdir or os.path.join('train_log', f'dqn-{game}')
    if args.lr is None:
        args.lr = 1e-3 if args.optimizer == 'rmsprop' else 1e-4
    if args.init_memory_size is None:
        args.init_memory_size = min(args.memory_size // 20, 50_000)
    return args


if __name__ == '__main__':
    parse_args()   # --help and bad arguments answer before TensorFlow loads

os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')   # before TensorFlow is imported

from atari_wrappers import FRAME_SHAPE, make_env, make_envpool, make_vector_env  # noqa: E402
import gymnasium as gym  # noqa: E402
from dqn_model import (DQNModel, PrioritizedNStepMixin, PriorityFeedback, ProgressLog,  # noqa: E402
                       evaluate, play_episode, tf, train_until_interrupted)
from tensorpack import (Callback, ModelSaver, ObjAttrParam,  # noqa: E402
                        OfflinePredictor, PeriodicTrigger, PredictConfig, QueueInput, RunOp,
                        ScheduledHyperParamSetter, SimpleTrainer, SmartInit, TrainConfig,
                        launch_train_with_config, logger)
from tensorpack.callbacks import JSONWriter  # noqa: E402

import expreplay  # noqa: E402


def get_player(args, train=False, render_mode=None):
    """One preprocessed game; training runs cut nothing short (the ALE caps a game at 27k steps)."""
    return make_env(args.env, sticky=args.sticky, render_mode=render_mode,
                    max_episode_steps=None if train else args.max_episode_steps)


class RainbowReplayModel(PrioritizedNStepMixin, DQNModel):
    """DQNModel trained on n-step, prioritized batches."""


def rainbow_replay(args):
    """Whether training uses the memory's n-step / prioritized batches."""
    return args.prioritized or args.n_step > 1


def build_model(args, num_actions):
    if rainbow_replay(args):
        # Rewards are clipped per step by the training envs (see training_players).
        return RainbowReplayModel(FRAME_SHAPE, HISTORY, args.algo, num_actions, network='nature',
                                  state_dtype='uint8', learning_rate=args.lr,
                                  optimizer=args.optimizer, reward_clip=None, grad_clip=10.0)
    return DQNModel(FRAME_SHAPE, HISTORY, args.algo, num_actions, network='nature',
                    state_dtype='uint8', gamma=0.99, learning_rate=args.lr,
                    optimizer=args.optimizer, reward_clip=1.0, grad_clip=10.0)


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


def training_players(args):
    """``make_player`` for the training players the arguments ask for. (The stream counts
    ``update_frequency`` in transitions stored, whatever the player, so it needs no scaling
    by the number of envs a request steps.)

    With ``--prioritized`` / ``--n-step`` every step's reward is clipped to [-1, 1] before it is
    stored, inside the engine where it has a switch (EnvPool's ``reward_clip``, ale-py's
    ``reward_clipping``), in the actors' own envs for Ray, and by a ``ClipReward`` wrapper only
    around a single env: a wrapper around an engine would hide its asynchronous
    ``recv``/``send`` (the runner would then refuse an asynchronous EnvPool). Sets
    ``args.players`` to 1 for the one-player engines.
    """
    clip = rainbow_replay(args)
    if args.envpool:
        # One player; a request receives (and stores) the steps of half its envs.
        def make_player():
            return make_envpool(args.env, args.envpool, sticky=args.sticky, seed=args.seed,
                                reward_clip=clip)
        args.players = 1
        return make_player
    if args.ray_actors:
        # One player whose envs live in Ray actors (on this machine or a cluster's nodes). The
        # actors build their envs with atari_wrappers.make_env, shipped by value: the nodes need
        # expreplay[ray,atari] installed, not this examples directory.
        import atari_wrappers
        import ray
        ray.cloudpickle.register_pickle_by_value(atari_wrappers)
        if not ray.is_initialized():
            ray.init(address=args.ray_address, include_dashboard=False)
        env_id, sticky = args.env, args.sticky

        def make():              # runs in the actor, where nothing has registered the ALE envs yet
            import ale_py
            import gymnasium
            gymnasium.register_envs(ale_py)
            env = make_env(env_id, sticky=sticky, max_episode_steps=None)
            return gymnasium.wrappers.ClipReward(env, -1.0, 1.0) if clip else env

        def make_player():
            return expreplay.RayVectorEnv(make, args.ray_actors, args.envs_per_actor)
        args.players = 1           # all the actors are one player's (one batched forward per step)
        return make_player
    if args.vector:
        def make_player():
            return make_vector_env(args.env, args.vector, sticky=args.sticky, reward_clipping=clip)
        return make_player

    def make_player():
        env = get_player(args, train=True)
        return gym.wrappers.ClipReward(env, -1.0, 1.0) if clip else env
    return make_player


def previous_run(logdir):
    """What ``logdir`` holds of a previous run, as phrases (empty: nothing, or no directory)."""
    if not os.path.isdir(logdir):
        return []
    names = os.listdir(logdir)
    held = [what for what, name in (('a model checkpoint', 'checkpoint'),
                                    ('a replay memory', 'replay_memory.npz')) if name in names]
    others = len(names) - len(held)
    if others:
        held.append(f"{others} other file{'s' if others > 1 else ''}")
    return held


def prepare_logdir(args):
    """Open the log directory without ever losing a previous run in it.

    A directory that holds anything is a previous run: ``--resume`` continues it, ``--overwrite``
    deletes it (and says so); without either the run is refused, saying how to go on. A
    ``--resume`` of a directory without a model checkpoint or a replay memory is refused too
    (a mistyped path would otherwise train from scratch under the name of a resume).
    """
    held = previous_run(args.logdir)
    if args.resume:
        if not any(what in held for what in ('a model checkpoint', 'a replay memory')):
            raise SystemExit(f"--resume: {args.logdir} holds no model checkpoint and no replay "
                             "memory, there is nothing to resume (give the run's --logdir)")
    elif held and not args.overwrite:
        raise SystemExit(f"{args.logdir} holds a previous run ({', '.join(held)}); nothing was "
                         "changed. Continue it with --resume, start a new run elsewhere with "
                         "--logdir DIR, or delete it and start again there with --overwrite.")
    elif held:
        logger.warning(f"--overwrite: deleting the previous run in {args.logdir} ({', '.join(held)}).")
    logger.set_logger_dir(args.logdir, action='d' if held and args.overwrite else 'k')


class SaveModelAtExit(ModelSaver):
    """tensorpack's ModelSaver (every epoch), and once more when training ends, also by Ctrl-C:
    the trainer runs every callback's ``after_train`` then, so the network, the global step and
    with it the exploration schedule's position are saved beside the replay memory."""

    def _after_train(self):
        self._trigger()


def resume_point(args):
    """``(session_init, starting_epoch, checkpoint or None)`` for ``--resume``.

    The latest model checkpoint restores the network, the optimizer, the target network and the
    global step; the exploration schedule counts global steps, so it continues where it was.
    The epoch count comes from ``stats.json``, written at each epoch's end: a run stopped
    before its first epoch ended starts epoch 1 again, its step count continuing.
    (tensorpack's AutoResumeTrainConfig asserts that both files exist, which a Ctrl-C in the
    first epoch does not leave.)
    """
    checkpoint = tf.train.latest_checkpoint(args.logdir)
    last_epoch = JSONWriter.load_existing_epoch_number()
    if last_epoch is not None:
        logger.info(f"--resume: stats.json records epoch {last_epoch}. "
                    f"Setting starting_epoch to {last_epoch + 1}.")
    session_init = SmartInit(checkpoint) if checkpoint else (SmartInit(args.load) if args.load else None)
    return session_init, (last_epoch or 0) + 1, checkpoint


class ResumeReport(Callback):
    """Says, once the session is restored and the schedules are set, what ``--resume`` restored
    and what it could not. Placed after the schedule setters (callbacks run in order)."""

    def __init__(self, replay, checkpoint, starting_epoch, args):
        self.replay, self.checkpoint, self.starting_epoch = replay, checkpoint, starting_epoch
        self.args = args

    def _before_train(self):
        parts = []
        if self.checkpoint:
            parts.append(f"the network and global step {self.global_step} from "
                         f"{os.path.basename(self.checkpoint)}, so epsilon "
                         f"{self.replay.exploration:.3f} (the exploration schedule at step "
                         f"{self.global_step})")
        else:
            parts.append("no model checkpoint: the network, the global step and the exploration "
                         "schedule start from scratch"
                         + (f" (the network from --load {self.args.load})" if self.args.load else ""))
        parts.append(f"epoch {self.starting_epoch} next" + (
            "" if self.starting_epoch > 1
            else " (no epoch had finished: epoch 1 again, its step count continuing)"))
        stream = self.replay.stream
        if stream.resumed:
            parts.append(f"the replay memory: {len(stream.memory)} transitions from "
                         f"{os.path.basename(stream.checkpoint.path)}")
        else:
            parts.append("no replay memory saved: it was filled again")
        logger.info(f"Resumed {self.args.logdir}: " + "; ".join(parts) + ".")


def train(args, num_actions):
    prepare_logdir(args)
    tf.set_random_seed(args.seed)
    uf = args.update_frequency
    player = training_players(args)

    total_steps = args.max_epoch * args.steps_per_epoch

    def beta(k):   # annealed linearly to 1 over the run (Schaul et al.)
        return min(1.0, args.beta + (1.0 - args.beta) * k / total_steps)
    replay = expreplay.ExpReplay(
        predictor_io_names=(['state'], ['Qvalue']),
        get_player=player,
        num_parallel_players=args.players,
        state_shape=FRAME_SHAPE,
        batch_size=args.batch_size,
        memory_size=args.memory_size,
        init_memory_size=args.init_memory_size,
        update_frequency=args.update_frequency,
        history_len=HISTORY,
        state_dtype='uint8',
        maximum_staleness=args.maximum_staleness,
        seed=args.seed,
        # Saved when training ends (and every k epochs); --resume loads it instead of refilling.
        checkpoint_dir=args.logdir,
        checkpoint_every_k_epochs=args.save_memory_every or None,
        runner_kwargs={'life_loss_terminal': not args.no_life_loss},
        # Default: single envs share one pipelined thread, vector envs get a thread each.
        manager_kwargs={'simulator_threads': args.simulator_threads} if args.simulator_threads else None,
        n_step=args.n_step, gamma=0.99, prioritized=args.prioritized, alpha=args.alpha,
        beta=beta if args.prioritized else None,
    )
    callbacks = [
        # The epoch's monitors are minutes away: a line soon after the fill, then regularly.
        ProgressLog(replay, every=args.progress_every, first=args.progress_every / 2),
        SaveModelAtExit(),   # every epoch and at the end (Ctrl-C too); --resume and --load read it
        PeriodicTrigger(RunOp(DQNModel.update_target_param, verbose=True),
                        every_k_steps=args.target_update),
        replay,
        ScheduledHyperParamSetter('learning_rate', [(0, args.lr), (60, args.lr / 2), (400, args.lr / 10)]),
        # The schedule counts training steps; one training step is uf agent steps.
        ScheduledHyperParamSetter(
            ObjAttrParam(replay, 'exploration'),
            [(0, 1.0), (args.exploration_steps // uf, 0.1), (40 * args.exploration_steps // uf, 0.01)],
            interp='linear', step_based=True),
    ]
    session_init, starting_epoch = (SmartInit(args.load) if args.load else None), 1
    if args.resume:
        # The memory came back above (ExpReplay loads the checkpoint_dir's memory).
        session_init, starting_epoch, checkpoint = resume_point(args)
        callbacks.append(ResumeReport(replay, checkpoint, starting_epoch, args))
    if args.prioritized:
        callbacks.append(PriorityFeedback(replay))
    if args.eval_every:
        callbacks.append(PeriodicTrigger(Evaluator(args), every_k_epochs=args.eval_every))
    config = TrainConfig(
        model=build_model(args, num_actions),
        # QueueInput as the reference: sampling batches overlaps with training.
        data=QueueInput(replay),
        callbacks=callbacks,
        session_init=session_init,
        starting_epoch=starting_epoch,
        steps_per_epoch=args.steps_per_epoch,
        max_epoch=args.max_epoch,
    )
    launch_train_with_config(config, SimpleTrainer())
    # The trainer and its callbacks form reference cycles that hold the emulators; collect
    # them now, while ale-py can still free them cleanly (else it warns of leaks at exit).
    del config, callbacks, replay
    gc.collect()


def offline_predictor(args, num_actions):
    if not args.load:
        raise SystemExit(f'--task {args.task} needs --load (a checkpoint, e.g. {args.logdir}/checkpoint)')
    return OfflinePredictor(PredictConfig(
        model=build_model(args, num_actions), session_init=SmartInit(args.load),
        input_names=['state'], output_names=['Qvalue']))


def play(args, predictor):
    """Play games with rendering on; write the full-colour frames as a video or as PNGs."""
    import cv2
    output = args.output or os.path.join(args.logdir, 'play.mp4')
    video = output.endswith(('.mp4', '.avi'))
    os.makedirs(os.path.dirname(os.path.abspath(output)) if video else output, exist_ok=True)
    writer, count = None, 0

    def write(env):   # frames go straight to disk: a long game would not fit in RAM
        nonlocal writer, count
        frame = cv2.cvtColor(env.render(), cv2.COLOR_RGB2BGR)
        if not video:
            cv2.imwrite(os.path.join(output, f'{count:06d}.png'), frame)
        else:
            if writer is None:
                fourcc = cv2.VideoWriter_fourcc(*('mp4v' if output.endswith('.mp4') else 'MJPG'))
                writer = cv2.VideoWriter(output, fourcc, 15, frame.shape[1::-1])   # 60 fps / skip 4
            writer.write(frame)
        count += 1

    env = get_player(args, render_mode='rgb_array')
    for k in range(args.play_episodes):
        score = play_episode(env, predictor, HISTORY, epsilon=args.eval_epsilon, seed=args.seed + k,
                             on_frame=write)
        print(f"game {k}: score {score}")
    env.close()
    if writer is not None:
        writer.release()
    print(f"wrote {count} frames to {output}")


def main(argv=None):
    args = parse_args(argv)
    probe = get_player(args)
    num_actions = probe.action_space.n
    probe.close()
    logger.info(f"{args.env}: {num_actions} actions")
    if args.task == 'train':
        _, interrupted = train_until_interrupted(train, args, num_actions)
        if interrupted:
            saved = [what for what, name in (('the model checkpoint', 'checkpoint'),
                                             ('the replay memory', 'replay_memory.npz'))
                     if os.path.exists(os.path.join(args.logdir, name))]
            where = (f"saved in {args.logdir}: {' and '.join(saved)}" if saved else
                     "nothing saved yet (the model is saved at the end of each epoch)")
            resume = ' (continue with --resume)' if 'the model checkpoint' in saved else ''
            print(f"Interrupted: training stopped, environments closed; {where}{resume}.")
            raise SystemExit(130)
        return None
    predictor = offline_predictor(args, num_actions)
    if args.task == 'play':
        play(args, predictor)
        return None
    scores = evaluate(lambda: get_player(args), predictor, HISTORY, args.eval_episodes,
                      epsilon=args.eval_epsilon, seed=10**6 + args.seed, progress=True)
    print(f"mean score {scores.mean():.1f}, max score {scores.max():.1f} over {len(scores)} games")
    return scores


if __name__ == '__main__':
    main()
