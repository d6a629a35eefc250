"""The Atari example's application features, apart from the lesson in ``dqn_atari.py``.

What a long training run needs beyond the DQN itself, each skippable on a first reading:

* the run's flags (:func:`add_arguments`): ``--logdir``, ``--resume``, ``--overwrite``,
  ``--save-memory-every``, ``--progress-every``, ``--output``, ``--play-episodes``;
* log-directory protection (:func:`prepare_logdir`): a directory holding a previous run is
  never deleted without ``--overwrite``, and a start that fails before saving anything leaves
  no previous run behind (:func:`forget_unsaved_start`);
* the model saved every epoch and when training ends, Ctrl-C included (:func:`model_savers`),
  and one line saying what was saved where after a Ctrl-C (:func:`report_interrupt`);
* ``--resume`` (:func:`resume_point`, :func:`resume_report`): the network, the global step and
  with it the schedules, the epoch count, and the replay memory, with a line saying what came back;
* ``--task play``'s video (:func:`record_games`).

tensorpack (and so TensorFlow) is imported inside the functions that use it, so that
``dqn_atari.py --help`` answers before TensorFlow loads.
"""

if __name__ == '__main__':   # a module the examples import, not a program: --help says so
    import module_help
    module_help.answer(__doc__, 'atari_run.py', 'dqn_atari.py')

import contextlib
import logging
import os

MODEL, MEMORY = 'checkpoint', 'replay_memory.npz'   # what a run leaves in its log directory
LOG = 'log.log'   # tensorpack's log of the run, opened in the directory as the run starts


def add_arguments(p):
    """The run's flags: where it logs, resuming, saving, progress lines, videos."""
    g = p.add_argument_group('the run (log directory, resume, progress, video)')
    g.add_argument('--logdir', help='default: train_log/dqn-<game>')
    g.add_argument('--resume', action='store_true',
                   help='continue the run in --logdir: latest model checkpoint (network, global step, '
                        'hence the exploration schedule), saved replay memory, epoch count')
    g.add_argument('--overwrite', action='store_true',
                   help='delete what --logdir holds and start a new run there (without it, a '
                        'directory that holds a previous run is refused)')
    g.add_argument('--save-memory-every', type=int, default=0, metavar='EPOCHS',
                   help='also checkpoint the replay memory every k epochs (it is saved when training ends)')
    g.add_argument('--progress-every', type=float, default=30.0, metavar='SECONDS',
                   help="seconds between 'progress:' lines (the first comes after half of it)")
    g.add_argument('--output', help='play: the video (.mp4/.avi) or directory of PNG frames to write')
    g.add_argument('--play-episodes', type=int, default=1, help='play: games to record')


def check_arguments(p, args, name):
    """Refuse contradicting run flags; the log directory defaults to ``train_log/<name>``."""
    if args.resume and args.overwrite:
        p.error('--resume continues the run in --logdir, --overwrite deletes it: give one of them')
    args.logdir = args.logdir or os.path.join('train_log', name)


# ------------------------------------------------------------------ the log directory
def previous_run(logdir):
    """What ``logdir`` holds of a previous run, as phrases (empty: nothing, or no directory)."""
    if not os.path.isdir(logdir):
        return []
    names = os.listdir(logdir)
    held = [what for what, name in (('a model checkpoint', MODEL), ('a replay memory', MEMORY))
            if name in names]
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

    Returns the names the directory held before this start (None: there was no directory;
    empty once ``--overwrite`` deleted them), for :func:`forget_unsaved_start`.
    """
    from tensorpack import logger
    held = previous_run(args.logdir)
    before = os.listdir(args.logdir) if os.path.isdir(args.logdir) else None
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
    return [] if held and args.overwrite else before


@contextlib.contextmanager
def forget_unsaved_start(logdir, before):
    """Around a run's start and training: if it raises (a MemoryError building the replay
    memory, say) with no model checkpoint and no replay memory saved, remove the log that
    tensorpack opened in ``logdir`` for it, and the directory if the start made it. Else that
    log alone makes the directory a previous run: the same command would be refused, and
    ``--resume`` would find nothing to resume.

    Only the log, and only one this start added (``before``: what :func:`prepare_logdir` found
    there): a directory that holds a checkpoint, a memory or any other file the start added
    (TensorBoard events: it trained) is left as it is.
    """
    try:
        yield
    except BaseException:
        if os.path.isdir(logdir):
            added = set(os.listdir(logdir)) - set(before or ())
            if added == {LOG} and not {MODEL, MEMORY} & set(os.listdir(logdir)):
                path = os.path.join(logdir, LOG)
                tensorpack_log = logging.getLogger('tensorpack')
                for handler in list(tensorpack_log.handlers):   # the file the logger writes
                    if getattr(handler, 'baseFilename', None) == os.path.abspath(path):
                        tensorpack_log.removeHandler(handler)
                        handler.close()
                os.remove(path)
                if before is None and not os.listdir(logdir):
                    os.rmdir(logdir)
        raise


# ------------------------------------------------------------------ saving and Ctrl-C
def model_savers():
    """tensorpack's ModelSaver (every epoch), and once more when training ends, also by Ctrl-C:
    the trainer runs every callback's ``after_train`` then, so the network, the global step and
    with it the exploration schedule's position are saved beside the replay memory."""
    from tensorpack import CallbackFactory, ModelSaver
    saver = ModelSaver()
    return [saver, CallbackFactory(after_train=lambda _: saver.trigger())]


def report_interrupt(logdir):
    """After a Ctrl-C: one line saying what is saved where; exits with 130 (as a shell does)."""
    saved = [what for what, name in (('the model checkpoint', MODEL), ('the replay memory', MEMORY))
             if os.path.exists(os.path.join(logdir, name))]
    where = (f"saved in {logdir}: {' and '.join(saved)}" if saved else
             "nothing saved yet (the model is saved at the end of each epoch)")
    resume = ' (continue with --resume)' if 'the model checkpoint' in saved else ''
    print(f"Interrupted: training stopped, environments closed; {where}{resume}.")
    raise SystemExit(130)


# ------------------------------------------------------------------ --resume
def resume_point(args):
    """``(session_init, starting_epoch, checkpoint or None)`` for ``--resume``.

    The latest model checkpoint restores the network, the optimizer, the target network and the
    global step; the exploration schedule counts global steps, so it continues where it was.
    The epoch count comes from ``stats.json``, written at each epoch's end. The epoch that was
    running when the run stopped is run again in full: its bar counts from 0, while the global
    step (and the exploration schedule, which counts it) continues from the checkpoint's, so
    every later epoch ends that many global steps later than in a run never stopped (the
    learning-rate schedule counts epochs). tensorpack's AutoResumeTrainConfig asserts that both
    files exist, which a Ctrl-C in the first epoch does not leave.
    """
    from tensorpack import SmartInit, logger
    from tensorpack.callbacks import JSONWriter

    from tf_setup import tf
    checkpoint = tf.train.latest_checkpoint(args.logdir)
    last_epoch = JSONWriter.load_existing_epoch_number()
    if last_epoch is not None:
        logger.info(f"--resume: stats.json records epoch {last_epoch}. "
                    f"Setting starting_epoch to {last_epoch + 1}.")
    session_init = SmartInit(checkpoint) if checkpoint else (SmartInit(args.load) if args.load else None)
    return session_init, (last_epoch or 0) + 1, checkpoint


def resume_report(replay, checkpoint, starting_epoch, args):
    """A callback that says, once the session is restored and the schedules are set, what
    ``--resume`` restored and what it could not. Place it after the schedule setters
    (callbacks run in order)."""
    from tensorpack import CallbackFactory, logger

    def report(callback):
        step = callback.global_step
        if checkpoint:
            parts = [f"the network and global step {step} from {os.path.basename(checkpoint)}, "
                     f"so epsilon {replay.exploration:.3f} (the exploration schedule at step {step})"]
        else:
            parts = ["no model checkpoint: the network, the global step and the exploration "
                     "schedule start from scratch"
                     + (f" (the network from --load {args.load})" if args.load else "")]
        parts.append(f"epoch {starting_epoch} next (run in full: its bar counts 0 to "
                     f"{args.steps_per_epoch} training steps, while the global step and the "
                     f"exploration schedule continue from {step})")
        stream = replay.stream
        if stream.resumed:
            parts.append(f"the replay memory: {len(stream.memory)} transitions from "
                         f"{os.path.basename(stream.checkpoint.path)}")
        else:
            parts.append("no replay memory saved: it was filled again")
        logger.info(f"Resumed {args.logdir}: " + "; ".join(parts) + ".")
    return CallbackFactory(before_train=report)


# ------------------------------------------------------------------ --task play
def record_games(args, predictor, make_env, history):
    """Play ``--play-episodes`` games with rendering on; write the full-colour frames as a
    video (``.mp4``/``.avi``) or as PNGs in a directory."""
    import cv2

    from dqn_eval import play_episode
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

    env = make_env(render_mode='rgb_array')
    for k in range(args.play_episodes):
        score = play_episode(env, predictor, history, epsilon=args.eval_epsilon, seed=args.seed + k,
                             on_frame=write)
        print(f"game {k}: score {score}")
    env.close()
    if writer is not None:
        writer.release()
    print(f"wrote {count} frames to {output}")
