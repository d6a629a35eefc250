"""The examples: they run, they learn, and the staleness tuner writes what it promises.

The CartPole test trains for real (a few minutes, marked slow; CI runs it). The Atari tests are
smoke runs: a few dozen training steps on a tiny memory, then eval and play from the checkpoint.
"""

import csv
import os
import re
import signal
import subprocess
import sys
import types

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, 'examples')
sys.path.insert(0, EXAMPLES)


def run_example(script, *args, timeout):
    """Run an example as a user would; returns its stdout (stderr is shown on failure)."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS='1', TF_CPP_MIN_LOG_LEVEL='2',
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


# ------------------------------------------------------------------------------- CartPole
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_cartpole_reaches_475_within_100k_steps(tmp_path):
    out = run_example('dqn_cartpole.py', '--logdir', tmp_path / 'log', timeout=1150)
    score = float(re.search(r'^mean score ([\d.]+)$', out, re.M).group(1))
    steps = int(re.search(r'^env steps (\d+)$', out, re.M).group(1))
    assert steps <= 100_000, out
    assert score >= 475, out


# ------------------------------------------------------------------------------- Atari
# The tests that run the example as a user does are marked slow: each starts one to three
# processes that import TensorFlow and build the graph (20-30 s each on 2 cores) before they
# train for a few steps. CI runs them.
ATARI_SMOKE = ['--env', 'ALE/Pong-v5', '--memory-size', 3000, '--init-memory-size', 300,
               '--batch-size', 16, '--steps-per-epoch', 10, '--target-update', 5,
               '--eval-episodes', 2, '--max-episode-steps', 100]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_atari_train_eval_play_smoke(tmp_path):
    logdir = tmp_path / 'pong'
    run_example('dqn_atari.py', *ATARI_SMOKE, '--logdir', logdir, '--players', 2,
                '--max-epoch', 2, '--eval-every', 2, '--algo', 'Dueling', timeout=500)
    files = os.listdir(logdir)
    assert 'checkpoint' in files and any(f.startswith('events.out.tfevents') for f in files), files
    assert 'replay_memory.npz' in files, files   # the memory checkpoint, saved at the end
    stats = open(logdir / 'stats.json').read()
    assert 'expreplay/env_steps_per_sec' in stats and 'eval/mean_score' in stats

    out = run_example('dqn_atari.py', *ATARI_SMOKE, '--logdir', logdir, '--algo', 'Dueling',
                      '--task', 'eval', '--load', logdir / 'checkpoint', timeout=300)
    assert re.search(r'mean score -?[\d.]+, max score -?[\d.]+ over 2 games', out), out

    video = tmp_path / 'play.mp4'
    out = run_example('dqn_atari.py', *ATARI_SMOKE, '--logdir', logdir, '--algo', 'Dueling',
                      '--task', 'play', '--load', logdir / 'checkpoint', '--output', video, timeout=300)
    assert video.stat().st_size > 1000, out


def interrupt_example(tmp_path, script, args, marker, times=1, signals=(signal.SIGINT,)):
    """Run an example as a user does, press Ctrl-C (SIGINT) once ``marker`` was printed
    ``times`` times (or send ``signals``, one after the other as fast as a repeated ``kill``
    sends them); returns (exit code, stdout, stderr)."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS='1', PYTHONUNBUFFERED='1',
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]))
    env.pop('TF_CPP_MIN_LOG_LEVEL', None)          # as a user runs it: the example quiets TF
    with open(tmp_path / 'stderr', 'w+') as err:
        # A terminal's Ctrl-C: SIGINT handled by default in the child even when this run
        # inherited it ignored (a job started in the background of a non-interactive shell
        # is), else Python would not turn it into KeyboardInterrupt.
        proc = subprocess.Popen([sys.executable, os.path.join(EXAMPLES, script), *map(str, args)],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=ROOT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        out = []
        try:
            for line in proc.stdout:
                out.append(line)
                if sum(marker in seen for seen in out) == times:
                    break
            assert proc.poll() is None, ''.join(out)
            for signum in signals:
                proc.send_signal(signum)
            rest, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        return proc.returncode, ''.join(out) + rest, err.read()


def assert_stopped_cleanly(code, out, err):
    assert code == 130, (out[-3000:], err[-3000:])
    assert 'Traceback' not in out + err and 'leaked' not in err, err[-3000:]
    [line] = [line for line in out.splitlines() if line.startswith('Interrupted:')]
    assert 'training stopped, environments closed' in line
    # TensorFlow's start-up noise is not shown.
    assert 'cuda drivers' not in err and 'absl::InitializeLog' not in err, err[:3000]
    assert 'freeze_variables' not in out, out[:5000]
    return line


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_atari_ctrl_c_ends_training_with_one_line_and_the_envs_closed(tmp_path):
    """Ctrl-C in the middle of training: no traceback, no "nanobind: leaked ... ALEInterface",
    one line saying what is saved where; the memory is saved (complete, no temp file left)."""
    logdir = tmp_path / 'pong'
    # Single-env players (the other Atari runs use the default vector env).
    line = assert_stopped_cleanly(*interrupt_example(
        tmp_path, 'dqn_atari.py', [*ATARI_SMOKE, '--logdir', logdir, '--players', 2, '--vector', 0,
                                   '--max-epoch', 1000, '--eval-every', 0], 'Start Epoch 2'))
    assert f'saved in {logdir}: the model checkpoint and the replay memory' in line, line
    assert 'continue with --resume' in line
    files = os.listdir(logdir)
    assert 'replay_memory.npz' in files and not [f for f in files if '.tmp-' in f], files


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_atari_two_sigterms_stop_it_as_ctrl_c_and_the_saves_finish(tmp_path):
    """``kill`` twice (a scheduler's SIGTERM, then an impatient second one): the first stops
    the run as Ctrl-C does, the second only says it waits; the model and the replay memory are
    saved, and the memory loads."""
    from expreplay import ReplayMemory
    logdir = tmp_path / 'pong'
    line = assert_stopped_cleanly(*interrupt_example(
        tmp_path, 'dqn_atari.py', [*ATARI_SMOKE, '--logdir', logdir, '--max-epoch', 1000,
                                   '--eval-every', 0], 'Start Epoch 2',
        signals=(signal.SIGTERM, signal.SIGTERM)))
    assert f'saved in {logdir}: the model checkpoint and the replay memory' in line, line
    assert len(ReplayMemory.load(logdir / 'replay_memory.npz')) > 0


# Slow as the Atari runs below: most of it is the example's TensorFlow import and graph.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cartpole_ctrl_c_ends_training_with_one_line(tmp_path):
    logdir = tmp_path / 'cartpole'
    line = assert_stopped_cleanly(*interrupt_example(
        tmp_path, 'dqn_cartpole.py', ['--logdir', logdir, '--eval-every', 500, '--eval-episodes', 2],
        'greedy mean score', times=2))      # the first evaluation has saved its weights by then
    assert f'the best weights so far are in {logdir}' in line, line


def tree_state(path):
    """Every file under ``path`` with its size and modification time."""
    return {os.path.join(d, f): (os.stat(os.path.join(d, f)).st_size,
                                 os.stat(os.path.join(d, f)).st_mtime_ns)
            for d, _, files in os.walk(path) for f in files}


def fake_previous_run(logdir):
    logdir.mkdir(parents=True)
    for name in ('checkpoint', 'replay_memory.npz', 'model-120.index', 'stats.json'):
        (logdir / name).write_text(name)
    return tree_state(logdir)


def test_atari_refuses_a_logdir_that_holds_a_previous_run(tmp_path):
    import atari_run
    import dqn_atari
    logdir = tmp_path / 'pong'
    before = fake_previous_run(logdir)
    # The README's main command, over a previous run.
    args = dqn_atari.parse_args(['--env', 'ALE/Pong-v5', '--memory-size', '200000',
                                 '--logdir', str(logdir)])
    with pytest.raises(SystemExit) as info:
        atari_run.prepare_logdir(args)
    message = str(info.value)
    assert str(logdir) in message and 'a model checkpoint, a replay memory, 2 other files' in message
    for how in ('--resume', '--logdir', '--overwrite'):
        assert how in message, message
    assert tree_state(logdir) == before


def test_atari_overwrite_and_resume_decide_what_happens_to_a_previous_run(tmp_path, monkeypatch):
    import atari_run
    import dqn_atari
    actions = []
    monkeypatch.setattr(dqn_atari.logger, 'set_logger_dir', lambda d, action: actions.append(action))
    logdir = tmp_path / 'pong'
    fake_previous_run(logdir)
    atari_run.prepare_logdir(dqn_atari.parse_args(['--logdir', str(logdir), '--overwrite']))
    atari_run.prepare_logdir(dqn_atari.parse_args(['--logdir', str(logdir), '--resume']))
    atari_run.prepare_logdir(dqn_atari.parse_args(['--logdir', str(tmp_path / 'new')]))
    assert actions == ['d', 'k', 'k']    # tensorpack deletes only for the --overwrite
    with pytest.raises(SystemExit, match='nothing to resume'):
        atari_run.prepare_logdir(dqn_atari.parse_args(['--logdir', str(tmp_path / 'new'), '--resume']))
    with pytest.raises(SystemExit):
        dqn_atari.parse_args(['--resume', '--overwrite'])


def test_atari_start_that_fails_before_saving_leaves_no_previous_run(tmp_path, monkeypatch):
    # A memory too large for the machine (``--memory-size 5000000``) fails as the replay is
    # built, after the log directory is opened: the same command with a size that fits must
    # not then be refused as over a previous run. A previous run resumed by a start that fails
    # keeps every file.
    import atari_run
    import dqn_atari

    def too_large(*args, **kwargs):
        raise MemoryError("the replay memory does not fit")
    monkeypatch.setattr(dqn_atari, 'make_replay', too_large)
    logdir = tmp_path / 'pong'
    with pytest.raises(MemoryError):
        dqn_atari.train(dqn_atari.parse_args(['--logdir', str(logdir), '--memory-size', '5000000']), 6)
    assert atari_run.previous_run(str(logdir)) == [] and not logdir.exists()
    rerun = dqn_atari.parse_args(['--logdir', str(logdir), '--memory-size', '200000'])
    atari_run.prepare_logdir(rerun)   # not refused
    with pytest.raises(SystemExit, match='nothing to resume'):
        atari_run.prepare_logdir(dqn_atari.parse_args(['--logdir', str(logdir), '--resume']))

    previous = tmp_path / 'breakout'
    before = fake_previous_run(previous)
    with pytest.raises(MemoryError):
        dqn_atari.train(dqn_atari.parse_args(['--logdir', str(previous), '--resume']), 6)
    assert {path: state for path, state in tree_state(previous).items() if path in before} == before


def test_atari_players_default_to_the_vector_env():
    """ale-py's vector env (it steps outside the GIL) unless asked otherwise."""
    import dqn_atari
    args = dqn_atari.parse_args([])
    assert (args.vector, args.players) == (4, 2)
    args = dqn_atari.parse_args(['--vector', '0'])
    assert (args.vector, args.players) == (0, 3)
    assert dqn_atari.parse_args(['--vector', '8', '--players', '1']).players == 1
    with pytest.raises(SystemExit):
        dqn_atari.parse_args(['--vector', '-1'])


def atari_epsilon(step, exploration_steps, update_frequency=4):
    """The example's exploration schedule at a global step (piecewise linear)."""
    points = [(0, 1.0), (exploration_steps // update_frequency, 0.1),
              (40 * exploration_steps // update_frequency, 0.01)]
    return float(np.interp(step, [p[0] for p in points], [p[1] for p in points]))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_atari_ctrl_c_in_the_first_epoch_then_rerun_keeps_the_run_and_resume_restores_it(tmp_path):
    """Ctrl-C before the first epoch ends saves the model with the memory; a rerun of the same
    command without --resume leaves the run as it was; --resume restores the network, the
    global step and the exploration schedule's position, and says so."""
    logdir = tmp_path / 'pong'
    common = [*ATARI_SMOKE, '--logdir', logdir, '--players', 2, '--eval-every', 0,
              '--exploration-steps', 400]
    # The first progress line comes a second into the training: a training step is done.
    code, out, err = interrupt_example(tmp_path, 'dqn_atari.py',
                                       [*common, '--steps-per-epoch', 100000, '--progress-every', 2],
                                       'progress:')
    line = assert_stopped_cleanly(code, out, err)
    assert 'Start Epoch 2' not in out
    assert f'saved in {logdir}: the model checkpoint and the replay memory' in line, line
    steps = [int(m) for m in re.findall(r'^model-(\d+)\.index$', '\n'.join(os.listdir(logdir)), re.M)]
    assert len(steps) == 1 and steps[0] > 0, os.listdir(logdir)
    saved_step = steps[0]
    before = tree_state(logdir)

    env = dict(os.environ, TF_USE_LEGACY_KERAS='1', TF_CPP_MIN_LOG_LEVEL='2',
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]))
    rerun = subprocess.run([sys.executable, os.path.join(EXAMPLES, 'dqn_atari.py'),
                            *map(str, common)], capture_output=True, text=True, timeout=300,
                           env=env, cwd=ROOT)
    assert rerun.returncode != 0, rerun.stdout[-3000:]
    assert 'holds a previous run' in rerun.stderr and '--resume' in rerun.stderr, rerun.stderr[-3000:]
    assert tree_state(logdir) == before

    out = run_example('dqn_atari.py', *common, '--steps-per-epoch', 5, '--max-epoch', 1,
                      '--resume', timeout=500)
    report = re.search(r'Resumed (.*?): the network and global step (\d+) from model-(\d+), so '
                       r'epsilon ([\d.]+) \(the exploration schedule at step (\d+)\); epoch 1 next '
                       r'.*; the replay memory: (\d+) transitions from replay_memory\.npz\.', out)
    assert report, out[-5000:]
    assert report.group(1) == str(logdir)
    assert int(report.group(2)) == int(report.group(3)) == int(report.group(5)) == saved_step
    assert float(report.group(4)) == pytest.approx(atari_epsilon(saved_step, 400), abs=1e-3)
    assert int(report.group(6)) > 0
    assert f'Epoch 1 (global_step {saved_step + 5}) finished' in out, out[-3000:]


def test_progress_log_reports_agent_steps_games_and_epsilon():
    """The Atari example's ProgressLog: a line `first` seconds into the training, then every
    `every` seconds, nothing in between."""
    import logging

    from tensorpack_dqn import ProgressLog

    clock = types.SimpleNamespace(now=100.0)
    mem = types.SimpleNamespace(num_steps_written=1000)
    figures = types.SimpleNamespace(games=3, mean_score=-20.3, max_score=-19.0)   # a StreamStats
    stream = types.SimpleNamespace(stats=lambda: figures)
    replay = types.SimpleNamespace(mem=mem, stream=stream, exploration=0.95)
    cb = ProgressLog(replay, every=30, first=10, clock=lambda: clock.now)
    cb.trainer = types.SimpleNamespace(global_step=250, epoch_num=1)
    cb.before_train()
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    tp_logger = logging.getLogger('tensorpack')     # tensorpack's logger does not propagate
    tp_logger.addHandler(handler)
    try:
        cb.trigger_step()                 # the first training step (the fill is over): t = 0
        for now, steps, expect in [(109.0, 1500, 0), (110.0, 1800, 1), (139.0, 2000, 1),
                                   (140.0, 4200, 2), (169.9, 4300, 2), (170.0, 4400, 3)]:
            clock.now, mem.num_steps_written = now, steps
            cb.trigger_step()
            assert len(records) == expect, (now, [r.getMessage() for r in records])
    finally:
        tp_logger.removeHandler(handler)
    lines = [r.getMessage() for r in records]
    assert lines[0] == ("progress: 1800 agent steps (80/s), training step 250, epoch 1: 3 games "
                        "finished this epoch, mean score -20.3 (max -19), epsilon 0.950")
    assert lines[1].startswith("progress: 4200 agent steps (80/s)")
    assert lines[2].startswith("progress: 4400 agent steps (7/s)")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_atari_vector_env_and_resume_smoke(tmp_path):
    logdir = tmp_path / 'pong'
    common = [*ATARI_SMOKE, '--logdir', logdir, '--vector', 2, '--players', 1, '--eval-every', 0]
    run_example('dqn_atari.py', *common, '--max-epoch', 1, timeout=500)
    assert os.path.exists(logdir / 'replay_memory.npz')
    # --resume loads the model, the epoch count and the replay memory.
    run_example('dqn_atari.py', *common, '--max-epoch', 2, '--resume', timeout=500)
    log = open(logdir / 'log.log').read()
    assert 'ExpReplay resumes with' in log, log[-3000:]          # the memory came back
    assert 'Setting starting_epoch to 2' in log and 'Start Epoch 2' in log, log[-3000:]


def test_atari_preprocessing():
    from atari_wrappers import make_env, rom_name
    assert rom_name('ALE/SpaceInvaders-v5') == 'space_invaders'
    assert rom_name('ALE/Pong-v5') == 'pong'
    env = make_env('ALE/Breakout-v5', sticky=0.0)
    obs, info = env.reset(seed=3)
    assert obs.shape == (84, 84) and obs.dtype == np.uint8
    assert env.fire and info['lives'] == 5        # Breakout needs FIRE to start
    frames = [obs]
    for _ in range(20):
        obs, reward, terminated, truncated, info = env.step(0)
        frames.append(obs)
    assert not terminated and not truncated and 'lives' in info
    assert np.std(np.stack(frames)) > 0           # the screen is drawn, not blank
    env.close()
    # Same seed, same start: the no-op count comes from the env's seeded generator.
    a, b = make_env('ALE/Pong-v5'), make_env('ALE/Pong-v5')
    np.testing.assert_array_equal(a.reset(seed=7)[0], b.reset(seed=7)[0])
    a.close()
    b.close()


@pytest.mark.slow          # 1,500 agent steps of two emulators: seconds per game
@pytest.mark.parametrize('game', ['ALE/Pong-v5', 'ALE/Breakout-v5'])
def test_atari_preprocessing_steps_the_emulator_as_the_wrapped_env_does(game):
    # The preprocessing drives the emulator directly: every agent step must give what stepping
    # the wrapped env frame by frame gives (sticky actions, rewards, ends, lives, the max of
    # the last two frames), lost lives, fire presses and a game's end included.
    import cv2
    from atari_wrappers import make_env
    env = make_env(game, noop_max=0)
    twin = make_env(game, noop_max=0).env            # the same env without the preprocessing

    def reset(seed):
        _, info = env.reset(seed=seed)
        twin.reset(seed=seed)
        for press in (1, 2) if env.fire else ():     # what the preprocessing's reset pressed
            twin.step(press)
        return info['lives']

    lives = reset(5)
    rng = np.random.default_rng(0)
    ends = lost = 0
    for _ in range(1500):
        action = int(rng.integers(env.action_space.n))
        obs, reward, terminated, truncated, info = env.step(action)
        total, screens = 0.0, []
        for t in range(4):
            _, r, te, tr, twin_info = twin.step(action)
            total += r
            screens.append(twin.unwrapped.ale.getScreenGrayscale())
            if te or tr:
                break
        assert (reward, terminated, truncated) == (total, te, tr)
        assert info['lives'] == twin_info['lives']
        pooled = np.maximum(screens[2], screens[3]) if len(screens) == 4 else screens[-1]
        if env.fire and info['lives'] < lives and not (te or tr):
            lost += 1                                # the ball is relaunched after a lost life
            for press in (1, 2):
                twin.step(press)
            pooled = twin.unwrapped.ale.getScreenGrayscale()
        np.testing.assert_array_equal(
            obs, cv2.resize(pooled, (84, 84), interpolation=cv2.INTER_AREA))
        lives = info['lives']
        if terminated or truncated:
            ends += 1
            lives = reset(5 + ends)
    assert ends or lost, "the run saw no game end and no lost life: it checked too little"
    env.close()
    twin.close()


def test_evaluator_stacks_history_like_the_memory():
    """The evaluator feeds the network the states the memory trains it on."""
    from dqn_eval import HistoryStack
    from expreplay import ReplayMemory
    mem = ReplayMemory(100, (2,), 3, 'float32')
    w = mem.new_writer()
    frames = [np.full(2, i + 1, np.float32) for i in range(3)]
    w.start_episode(frames[0])
    w.add_step(0, 0.0, frames[1])
    w.add_step(0, 0.0, frames[2], terminated=True)
    stack = HistoryStack((2,), 3, np.float32)
    states = [stack.reset(frames[0]).copy(), stack.push(frames[1]).copy()]
    rng = np.random.default_rng(0)
    seen = {tuple(c[..., :-1].ravel()) for _ in range(20) for c in mem.sample_batch(2, rng=rng)[0]}
    assert seen == {tuple(s.ravel()) for s in states}


# ------------------------------------------------------------------------------- tune_staleness
def test_tune_staleness_tiny_sweep(tmp_path, capsys, monkeypatch):
    """Output into --out-dir only; one player measured once (no queue: staleness can not
    matter); the spread of the rounds in the CSV and on the plot; whole column headers; the
    recommendation marked on the plot."""
    import tune_staleness
    cwd = tmp_path / 'cwd'
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    out = tmp_path / 'sweep'
    rows, rec = tune_staleness.main(['--env', 'cheap', '--env-ms', '0.2', '--predictor', 'numpy',
                                     '--players', '1', '3', '--staleness', '1', '4', '--rounds', '2',
                                     '--train-ms', '1', '--seconds', '0.2', '--warmup', '0.05',
                                     '--init-memory-size', '100', '--out-dir', str(out)])
    text = capsys.readouterr().out
    assert os.listdir(cwd) == []
    assert sorted(os.listdir(out)) == ['staleness.csv', 'staleness.png', 'staleness_rounds.csv']
    assert 'recommendation: num_parallel_players=' in text
    assert '1 player is stepped inline (no queue): measured once' in text
    header = next(line.split() for line in text.splitlines() if line.split()[:1] == ['round'])
    for name in ('players', 'maximum_staleness', 'steps_per_sec', 'update_lag_mean',
                 'request_lag_max', 'mean_inference_batch'):
        assert name in header, header
    with open(out / 'staleness.csv') as f:
        table = list(csv.DictReader(f))
    assert [(r['players'], r['maximum_staleness']) for r in table] == [('1', 'any'), ('3', '1'), ('3', '4')]
    with open(out / 'staleness_rounds.csv') as f:
        rounds = list(csv.DictReader(f))
    assert len(rounds) == 2 * 3 and sorted({r['round'] for r in rounds}) == ['0', '1']
    for r in table:
        assert int(r['rounds']) == 2
        assert 0 < float(r['steps_per_sec_min']) <= float(r['steps_per_sec']) <= float(r['steps_per_sec_max'])
        mine = [float(x['steps_per_sec']) for x in rounds
                if (x['players'], x['maximum_staleness']) == (r['players'], r['maximum_staleness'])]
        assert min(mine) == pytest.approx(float(r['steps_per_sec_min']))
        assert max(mine) == pytest.approx(float(r['steps_per_sec_max']))
        if r['maximum_staleness'] != 'any':
            # The manager's guarantee: a step starts with at most maximum_staleness - 1 newer requests queued.
            assert int(r['request_lag_max']) <= int(r['maximum_staleness']) - 1
    assert (int(table[0]['request_lag_max']), int(table[0]['update_lag_max'])) == (0, 0)  # inline: no lag
    png = open(out / 'staleness.png', 'rb').read()
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 20_000
    assert (rec['players'], rec['maximum_staleness']) in {(1, None), (3, 1), (3, 4)}
    fig = tune_staleness.plot(rows, out / 'again.png', 'title', rec)
    marks = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert len(marks) == 2 and all(m.startswith('recommended') for m in marks), marks
    bars = [c for ax in fig.axes for c in ax.containers]
    assert bars, "the spread of the rounds is drawn as error bars"


def test_tune_staleness_writes_under_train_log_by_default():
    import tune_staleness
    assert tune_staleness.parse_args([]).out_dir == os.path.join('train_log', 'tune_staleness')


def test_tune_staleness_help_explains_every_flag():
    import tune_staleness
    parser = tune_staleness.build_parser()
    text = subprocess.run([sys.executable, os.path.join(EXAMPLES, 'tune_staleness.py'), '--help'],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT)).stdout
    actions = [a for a in parser._actions if a.option_strings != ['-h', '--help']]
    assert len(actions) >= 15
    for action in actions:
        assert action.help and len(action.help) > 15, f"{action.option_strings} has no real help"
        assert action.option_strings[0] in text
    assert 'request lag' in text and 'recommendation' in text


# ------------------------------------------------------------------------------- the DQN model
@pytest.mark.parametrize('method', ['DQN', 'Double', 'Dueling'])
def test_dqn_model_loss_and_target_sync(method):
    """The loss is the Huber loss to r + gamma * (1 - terminated) * Q_target(s', a*), with a* the
    online argmax for Double/Dueling and the target argmax for DQN; the sync op copies weights."""
    from dqn_model import DQNModel, tf
    from tensorpack.tfutils.tower import TowerContext
    rng = np.random.default_rng(0)
    with tf.Graph().as_default():
        model = DQNModel((3,), 2, method, 4, network='mlp', state_dtype='float32', hidden=(16,),
                         reward_clip=None, gamma=0.9)
        inputs = [tf.placeholder(s.dtype, s.shape, s.name) for s in model.inputs()]
        with TowerContext('', is_training=True):
            cost = model.build_graph(*inputs)
        sync = DQNModel.update_target_param()
        graph = tf.get_default_graph()
        q_online = graph.get_tensor_by_name('Qvalue:0')
        q_target = graph.get_tensor_by_name('target/Qvalue:0')
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            comb = rng.standard_normal((32, 3, 3)).astype(np.float32)
            action = rng.integers(0, 4, 32).astype(np.int32)
            reward = rng.standard_normal(32).astype(np.float32)
            over = rng.random(32) < 0.3
            feed = dict(zip(inputs, [comb, action, reward, over]))
            state = graph.get_tensor_by_name('state:0')
            # The target branch reads s' from comb_state itself; the online Q of s' is got by
            # feeding the 'state' tensor (as the runners' predictor does).
            q_s, c, q_next_target = sess.run([q_online, cost, q_target], feed)
            q_next_online = sess.run(q_online, {state: comb[..., 1:]})
            assert not np.allclose(q_next_online, q_next_target)   # independent initialisation
            best = q_next_target.argmax(1) if method == 'DQN' else q_next_online.argmax(1)
            target = reward + 0.9 * (1 - over) * q_next_target[np.arange(32), best]
            err = np.abs(target - q_s[np.arange(32), action])
            huber = np.where(err < 1, 0.5 * err ** 2, err - 0.5).mean()
            np.testing.assert_allclose(c, huber, rtol=1e-4)
            sess.run(sync)
            q_next_target = sess.run(q_target, feed)
            np.testing.assert_allclose(q_next_online, q_next_target, rtol=1e-6)


@pytest.mark.parametrize('env', ['CartPole-v1', 'ALE/NoSuchGame-v5'])
def test_dqn_atari_refuses_an_env_that_is_not_an_atari_game_naming_the_other_examples(env):
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, 'dqn_atari.py'), '--env', env],
                         capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f'--env {env} is not an Atari game' in out.stderr
    assert 'examples/dqn_cartpole.py' in out.stderr


def test_tune_staleness_picks_the_smallest_window_within_the_noise_of_the_best():
    import tune_staleness

    def row(players, window, mean, lo, hi, lag):
        return dict(players=players, maximum_staleness=window, steps_per_sec=mean,
                    steps_per_sec_min=lo, steps_per_sec_max=hi, update_lag_mean=lag)
    rows = [row(1, None, 190, 185, 195, 0.0), row(2, 2, 380, 370, 399, 0.5),
            row(4, 4, 430, 410, 460, 0.9), row(4, 8, 450, 400, 500, 1.1),
            row(4, 16, 440, 420, 470, 2.7)]
    pick, best, within = tune_staleness.recommend(rows)
    assert (best['players'], best['maximum_staleness']) == (4, 8)
    # 4 x 4's fastest round (460) reaches the best's slowest (400); 2 x 2's (399) does not.
    assert [(r['players'], r['maximum_staleness']) for r in within] == [(4, 4), (4, 8), (4, 16)]
    assert (pick['players'], pick['maximum_staleness']) == (4, 4)
    # One player within the noise: no window at all is the smallest.
    rows[0].update(steps_per_sec_max=420)
    assert tune_staleness.recommend(rows)[0]['players'] == 1
