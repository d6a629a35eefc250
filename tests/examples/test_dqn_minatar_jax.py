"""examples/dqn_minatar_jax.py: the JAX learner on the stream learns, and a defect in what it is
fed makes the same short run fail the learning bar.

The learning bar: after a short Breakout run (CI_ARGS below), the greedy policy's mean score
over EVAL_EPISODES episodes must reach BAR. Uniformly random play scores ~0.5 and a fixed
action ~1.1-1.3 (sticky actions move the paddle anyway); the clean run's figures and the bar's
margin are in docs/minatar.md. The same run is then made with one defect injected between the
memory and the learner (each batch altered as a sampling bug would alter it): rewards zeroed,
actions shuffled across the batch (each transition paired with another's action), the next
state one frame off (the state itself), a terminal step bootstrapped (its discount gamma, not
0); and a target network never copied. Each must fail the bar: a bar those pass would not
catch a real defect. Defects in what the players store (between the env and the memory's
write) are injected the same way: an episode end not marked. The defects a short run can not
tell from noise (n-step returns off by one, priorities fed back inverted, a target copied
after every update, a hand-over every 10,000 updates: docs/minatar.md has their runs) are
caught by exact tests instead, named where each is defined below.

Each run is a subprocess that imports the example and runs its ``main`` (this file, run as a
script, is that subprocess).
"""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE_DIR = os.path.join(ROOT, 'examples')

# The paper's agent on a shorter clock: 60k frames, a 30k-frame memory learning from frame
# 1,000, epsilon 1 -> 0.1 over 5k frames, the target network copied every 252 updates (a
# multiple of the updates per call), a 4x larger step size. At 30k frames the clean seeds and
# an unmarked episode end overlapped within ~0.8 points; at 60k they are ~3 points apart.
CI_ARGS = ['--game', 'breakout', '--frames', '60000', '--replay-start', '1000',
           '--memory-size', '30000', '--exploration-frames', '5000', '--target-update', '252',
           '--lr', '1e-3', '--log-every', '1e9']
EVAL_EPISODES = 100
BAR = 4.5

DEFECTS = {
    'none': lambda batch, rng: batch,
    'rewards-zeroed': lambda batch, rng: batch._replace(reward=np.zeros_like(batch.reward)),
    'actions-shuffled': lambda batch, rng: batch._replace(action=rng.permutation(batch.action)),
    'next-state-off-by-one': lambda batch, rng: batch._replace(next_state=batch.state),
    # A terminal step bootstrapped: the discount of a transition whose window ends the episode
    # is the non-terminal one (gamma^n) instead of 0.
    'terminal-bootstrapped': lambda batch, rng: batch._replace(
        discount=np.where(batch.discount == 0, batch.discount.max(), batch.discount)),
}


def n_step_off_by_one(draw, memory, batch_size, settings, kwargs):
    """The n-step walk stops one step short (n - 1 rewards, the state n - 1 steps on) while
    the bootstrap is discounted by gamma^n, as a loop bound off by one would leave it."""
    short = dataclasses.replace(settings, n_step=max(1, settings.n_step - 1))
    batch = draw(memory, batch_size, short, **kwargs)
    return batch._replace(discount=batch.discount * settings.gamma)


# Defects in how the memory draws (the whole draw altered, not only its batch). Off by
# one, the n-step walk learns as well in a short run (with --n-step 3: 5.95 against 5.61 for
# the same seed); tests/stream/test_stream_rainbow.py shows the stream's n-step check refuses it.
SAMPLE_DEFECTS = {'n-step-off-by-one': n_step_off_by_one}


def priorities_inverted(update, memory, indices, priorities):
    """The learner's |TD| fed back inverted: the transitions it predicts worst are drawn least."""
    return update(memory, indices, 1.0 / (np.asarray(priorities, np.float64) + 1e-2))


# Inverted, the priorities scored higher than the clean prioritized runs (4.93 against 2.52 and
# 3.23 with --prioritized --n-step 3): no learning bar catches it here;
# tests/stream/test_stream_rainbow.py checks that the priorities fed back shape the draws.
PRIORITY_DEFECTS = {'priorities-inverted': priorities_inverted}


def run(defect, seed=0, extra=()):
    """The greedy mean score after the CI run with ``defect``, from a fresh process."""
    pytest.importorskip('jax')
    pytest.importorskip('minatar')
    out = subprocess.run([sys.executable, __file__, defect, str(seed), *extra],
                         capture_output=True, text=True, cwd=ROOT, timeout=LEARNING_TIMEOUT - 60,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS='1'))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    line = [x for x in out.stdout.splitlines() if x.startswith('greedy mean score')][-1]
    return float(line.split()[3]), out.stdout


# A run takes 1-3 minutes on 2 idle cores; beside other jobs several times that. The
# subprocess's own timeout (run()) still ends a hung run.
LEARNING_TIMEOUT = 1200


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
def test_short_breakout_run_reaches_the_bar():
    score, out = run('none')
    assert score >= BAR, f"greedy mean {score:.2f} < {BAR}\n{out[-1500:]}"


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
@pytest.mark.parametrize('defect', ['rewards-zeroed', 'actions-shuffled',
                                    'next-state-off-by-one', 'terminal-bootstrapped'])
def test_a_defect_in_what_the_learner_is_fed_fails_the_bar(defect):
    score, out = run(defect)
    assert score < BAR, f"{defect}: greedy mean {score:.2f} still reaches {BAR}\n{out[-1500:]}"


# A target network never copied (it stays at its initialisation) fails the bar. One copied
# after every update does not: on this game and horizon DQN learns as well without a target
# network (greedy 7.24 and 8.33, docs/minatar.md), and neither does a hand-over every 10,000
# updates reliably (4.35, 4.50). Both intervals are checked exactly instead:
# test_a_resume_with_another_updates_per_call_keeps_the_schedules_and_the_frames counts the
# target's copies, test_weights_handed_over_every_n_updates_act_1_to_n_updates_old the
# weights' age.
@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
def test_a_target_network_never_copied_fails_the_bar():
    score, out = run('none', extra=('--target-update', str(10**9)))
    assert score < BAR, f"target never copied: greedy mean {score:.2f} reaches {BAR}\n{out[-1500:]}"


# A reward stored one step late is not in this list: DQN learns nearly as well with it (greedy
# means of 4.65 and 6.48 in the 30k-frame run, docs/minatar.md), so no learning bar can catch it;
# the storage's own tests do (tests/storage/test_nstep.py checks every stored field against a
# reference model).
@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
@pytest.mark.parametrize('defect', ['episode-end-unmarked'])
def test_a_defect_in_what_is_stored_fails_the_bar(defect):
    score, out = run(defect)
    assert score < BAR, f"{defect}: greedy mean {score:.2f} still reaches {BAR}\n{out[-1500:]}"


class RewardOneStepLate:
    """Each step stores the previous step's reward (0 for an episode's first)."""

    def __init__(self):
        self.previous = 0.0

    def __call__(self, env, result):
        obs, reward, terminated, truncated, info = result
        reward, self.previous = self.previous, (0.0 if terminated or truncated else reward)
        return obs, reward, terminated, truncated, info


class EpisodeEndUnmarked:
    """An episode's end is not stored: its last step leads, unmarked, to the first frame of
    the next episode (the env is reset under it)."""

    def __call__(self, env, result):
        obs, reward, terminated, truncated, info = result
        if terminated or truncated:
            obs, info = env.reset()
        return obs, reward, False, False, info


# Defects in what the players store: between the env and the memory's write, in the players'
# envs only (the greedy evaluation plays the real game). MinAtar's example keeps one frame per
# state, so a history frame from the previous episode cannot arise here.
STORED_DEFECTS = {'reward-one-step-late': RewardOneStepLate,
                  'episode-end-unmarked': EpisodeEndUnmarked}


def main(defect, seed, *extra):
    sys.path.insert(0, EXAMPLE_DIR)
    import dqn_minatar_jax
    from expreplay import ReplayMemory

    if defect in STORED_DEFECTS:
        make_defect, probe = STORED_DEFECTS[defect], dqn_minatar_jax.StartProbe

        class StoringDefect(probe):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.defect = make_defect()

            def step(self, action):
                return self.defect(self.env, super().step(action))

        dqn_minatar_jax.StartProbe = StoringDefect
    # ReplayMemory.draw is what every batch comes from (a stream's, and sample()'s): a defect
    # put there reaches the learner whatever path the example takes.
    # Each injected defect counts the batches (or feedbacks) it altered: a run whose learner
    # never met its defect (the example drawing another way) fails, instead of passing clean.
    applied = [0]
    if defect in STORED_DEFECTS:
        pass            # counted by the probe's steps below
    elif defect in SAMPLE_DEFECTS:
        defective, draw = SAMPLE_DEFECTS[defect], ReplayMemory.draw

        def defective_draw(self, size, settings, **kwargs):
            applied[0] += 1
            return defective(draw, self, size, settings, kwargs)

        ReplayMemory.draw = defective_draw
    elif defect in PRIORITY_DEFECTS:
        feed, update = PRIORITY_DEFECTS[defect], ReplayMemory.update_priorities

        def defective_update(self, indices, priorities):
            applied[0] += 1
            return feed(update, self, indices, priorities)

        ReplayMemory.update_priorities = defective_update
    else:
        alter, rng, draw = DEFECTS[defect], np.random.default_rng(int(seed)), ReplayMemory.draw

        def draw_with_defect(self, *args, **kwargs):
            applied[0] += 1
            return alter(draw(self, *args, **kwargs), rng)

        ReplayMemory.draw = draw_with_defect
    dqn_minatar_jax.main(CI_ARGS + ['--seed', seed, '--eval-episodes', str(EVAL_EPISODES), *extra])
    if defect not in STORED_DEFECTS and applied[0] == 0:
        raise SystemExit(f"the defect {defect!r} never reached the learner: no batch passed "
                         "through it")


if __name__ == '__main__':
    main(*sys.argv[1:])


def example(args, tmp_path):
    pytest.importorskip('jax')
    pytest.importorskip('minatar')
    out = subprocess.run([sys.executable, os.path.join(EXAMPLE_DIR, 'dqn_minatar_jax.py'), *args],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS='1'))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


def returns_rows(path):
    lines = path.read_text().splitlines()
    assert lines[0] == 'frames,score'
    return [(int(f), float(s)) for f, s in (line.split(',') for line in lines[1:])]


@pytest.mark.slow
def test_a_run_resumed_from_its_checkpoint_continues_its_curve(tmp_path):
    common = ['--replay-start', '300', '--memory-size', '2000', '--target-update', '48',
              '--log-every', '0', '--checkpoint-dir', 'ckpt', '--returns', 'returns.csv',
              '--checkpoint-every', '500', '--prioritized', '--n-step', '3']
    first = example(['--frames', '1200', *common], tmp_path)
    assert 'training done: 1200 frames' in first and 'resources: threads' in first
    assert (tmp_path / 'ckpt' / 'learner.npz').exists()
    rows = returns_rows(tmp_path / 'returns.csv')
    assert rows and rows[-1][0] <= 1200

    second = example(['--frames', '2000', *common], tmp_path)
    # The first call comes at the fill's end (300 frames), then one every K = 4 frames (the
    # default --updates-per-call), K updates each: 1 + 900 / 4 calls by frame 1200.
    assert 'resuming from ckpt: frame 1200, update 904' in second, second[:500]
    assert 'transitions in the memory' in second and 'at random first' not in second
    frames = [int(m) for m in
              (line.split()[1] for line in second.splitlines() if line.startswith('progress:'))]
    # The frame count, epsilon's clock and the score log go on from the checkpoint.
    assert frames[0] == 1200 and frames[-1] == 2000 and frames == sorted(frames)
    assert 'epsilon 1.000' not in second.split('progress:', 1)[1]
    resumed = returns_rows(tmp_path / 'returns.csv')
    assert resumed[:len(rows)] == rows                    # the first sitting's rows are kept
    later = [f for f, _ in resumed[len(rows):]]
    assert later and later[0] > 1200 and later == sorted(later) and later[-1] <= 2000


def test_help_answers_before_jax_loads():
    out = subprocess.run([sys.executable, '-X', 'importtime',
                          os.path.join(EXAMPLE_DIR, 'dqn_minatar_jax.py'), '--help'],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and '--checkpoint-dir' in out.stdout
    assert '(default: 5000000)' in ' '.join(out.stdout.split())   # the defaults are shown
    assert ' jax' not in out.stderr and 'minatar' not in out.stderr   # -X importtime's list


STOPPABLE_RUN = ['--frames', '100000', '--replay-start', '300', '--memory-size', '5000',
                 '--log-every', '0', '--checkpoint-dir', 'ckpt']


def saved_frames(tmp_path):
    """(the learner file's frame, the memory checkpoint's count of steps stored): the example
    saves both at the same frame, the memory's count."""
    from expreplay import ReplayMemory
    with np.load(tmp_path / 'ckpt' / 'learner.npz') as saved:
        learner = int(saved['frames']), int(saved['updates'])
    memory = ReplayMemory.load(tmp_path / 'ckpt' / 'memory' / 'replay_memory.npz')
    return learner, memory.num_steps_written


def stop_run(tmp_path, sig, args=STOPPABLE_RUN, when=lambda line, progress: progress == 50,
             delay=0.0, second=None):
    """Start a run of the example as a user does, send it ``sig`` once ``when(line, progress
    lines so far)`` holds (and ``delay`` seconds more), and ``second`` (a signal) 10 ms
    after it; check that it stopped with its learner and memory saved at the same frame.
    Returns (frames, updates) saved and the output."""
    pytest.importorskip('jax')
    pytest.importorskip('minatar')
    # SIGINT handled by default in the child even when this run inherited it ignored (a job
    # started in the background of a non-interactive shell does): else the run ignores Ctrl-C.
    proc = subprocess.Popen([sys.executable, '-u', os.path.join(EXAMPLE_DIR, 'dqn_minatar_jax.py'),
                             *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path, env=dict(os.environ, OPENBLAS_NUM_THREADS='1'),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        progress, head = 0, []
        for line in proc.stdout:
            head.append(line)
            progress += line.startswith('progress:')
            if when(line, progress):
                time.sleep(delay)
                proc.send_signal(sig)
                if second is not None:
                    time.sleep(0.01)
                    proc.send_signal(second)
                break
        rest = proc.communicate(timeout=120)[0]   # the stop takes ~5 s at load 10 on 2 cores
    finally:
        if proc.poll() is None:
            proc.kill()
    out = ''.join(head) + rest
    # A second signal is held back (a line printed) until the saves are done; one that comes
    # once they are (the process exiting, the handlers restored) ends it as SIGTERM does.
    assert proc.returncode == 0 or (second is not None and proc.returncode == -second), rest[-3000:]
    (frames, updates), memory_frames = saved_frames(tmp_path)
    assert f'stopped: the memory and the learner are saved in ckpt at frame {frames};' in rest, \
        rest[-3000:]
    assert frames == memory_frames, f"learner at frame {frames}, memory at {memory_frames}"
    return (frames, updates), out


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
def test_ctrl_c_saves_the_learner_with_the_memory_and_the_run_goes_on(tmp_path):
    (frames, _), _ = stop_run(tmp_path, signal.SIGINT)
    assert frames >= 300 + 48
    resumed = example(['--frames', str(frames + 200), *STOPPABLE_RUN[2:]], tmp_path)
    assert f'resuming from ckpt: frame {frames}' in resumed
    assert f'training done: {frames + 200} frames' in resumed


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
def test_kill_stops_the_run_as_ctrl_c_does(tmp_path):
    # SIGTERM: how a run in the background (whose Ctrl-C the shell ignores) or a batch
    # scheduler's job is stopped.
    (frames, _), _ = stop_run(tmp_path, signal.SIGTERM)
    assert frames >= 300 + 48


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
def test_a_second_kill_right_after_the_first_does_not_cut_the_save_short(tmp_path):
    # A scheduler, or an impatient user, sending SIGTERM twice: the saves complete anyway, the
    # learner and the memory at the same frame (checked by stop_run).
    (frames, _), _ = stop_run(tmp_path, signal.SIGTERM, second=signal.SIGTERM)
    assert frames >= 300 + 48


FILL_RUN = ['--frames', '50200', '--replay-start', '50000', '--memory-size', '60000',
            '--log-every', '0', '--checkpoint-dir', 'ckpt', '--returns', 'returns.csv']


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
def test_kill_during_the_fill_saves_it_and_the_resumed_run_goes_on_from_it(tmp_path):
    # Stopped 1 s into the fill of 50,000 random frames (several seconds of it on 2 cores).
    (frames, updates), _ = stop_run(tmp_path, signal.SIGTERM, args=FILL_RUN, delay=1.0,
                                    when=lambda line, progress: 'at random first' in line)
    assert 0 < frames < 50_000 and updates == 0, (frames, updates)
    rows = returns_rows(tmp_path / 'returns.csv')
    assert rows and rows[-1][0] <= frames              # the fill's episodes, up to the stop

    resumed = example(FILL_RUN, tmp_path)
    assert f'resuming from ckpt: frame {frames}, update 0' in resumed, resumed[:500]
    progress = [int(line.split()[1]) for line in resumed.splitlines() if line.startswith('progress:')]
    # The fill completes (to 50,000 transitions), then the frames go on from there.
    assert progress[0] == 50_000 and progress[-1] == 50_200 and progress == sorted(progress)
    assert 'training done: 50200 frames' in resumed
    again = returns_rows(tmp_path / 'returns.csv')
    assert again[:len(rows)] == rows                   # the rows of the first sitting are kept
    later = [f for f, _ in again[len(rows):]]
    assert later and later[0] > frames and later == sorted(later) and later[-1] <= 50_200


def last_line(out):
    """The last line's frames, games, request lag (mean, max) and weights' age (mean, max)."""
    done = re.search(r"^training done: (\d+) frames, (\d+) games in \d+ s, mean request lag "
                     r"([\d.]+) updates \(max (\d+)\), acting weights' mean age ([\d.]+) "
                     r"updates \(max (\d+)\)$", out, re.M)
    assert done, out[-2000:]
    return int(done[1]), int(done[2]), float(done[3]), int(done[4]), float(done[5]), int(done[6])


def test_weights_handed_over_every_n_updates_act_1_to_n_updates_old(tmp_path):
    # One player stepped inline, one update per frame, greedy from the first update on: the
    # weights each action is computed with are 1, 2, ..., 100 updates old, over and over
    # (handed over after each update: always 1).
    out = example(['--frames', '700', '--replay-start', '200', '--memory-size', '1000',
                   '--exploration-frames', '1', '--final-exploration', '0',
                   '--updates-per-call', '1', '--weights-every', '100', '--log-every', '0'],
                  tmp_path)
    frames, _, lag, _, age, age_max = last_line(out)
    assert frames == 700 and lag == 0 and age_max == 100 and 49 <= age <= 52, out[-300:]


def test_several_players_with_a_staleness_window_train_and_log_their_frames(tmp_path):
    # ~17 s on 2 cores (load average 1.5), most of it JAX's import and compilation.
    out = example(['--players', '2', '--staleness', '4', '--frames', '1000', '--replay-start', '200',
                   '--memory-size', '1500', '--target-update', '48', '--log-every', '0',
                   '--weights-every', '8', '--returns', 'returns.csv'], tmp_path)
    assert '2 players' in out, out[:500]
    frames, games, lag, lag_max, age, age_max = last_line(out)
    # No request past --frames, and the last ones are stored before the stop: exactly 1,000.
    assert frames == 1000 and 0 <= lag <= lag_max, out[-300:]
    # Weights handed over every 8 updates (every other call of 4): the players act with
    # weights 4 or 8 updates old (after each call: always 4).
    assert 4 < age <= age_max == 8, out[-300:]
    last = [line for line in out.splitlines() if line.startswith('progress:')][-1]
    at, updates = int(last.split()[1]), int(last.split()[4])
    assert abs(updates - (at - 200)) <= 5, last          # one update per frame after the fill
    rows = returns_rows(tmp_path / 'returns.csv')
    ends = [f for f, _ in rows]
    assert len(rows) == games and ends == sorted(ends), ends
    assert frames - 200 < ends[-1] <= frames, (ends[-1], frames)   # episodes of ~20-100 frames


def test_the_players_numpy_forward_is_the_networks():
    # The players act through a numpy copy of the forward pass (it runs beside the update in
    # flight), the update through the same function in JAX: both must give the flax network's
    # Q-values for the same weights, and the update the paper's step. And the learner files of
    # the flat-vector layout (before the update took flax's trees) still load.
    pytest.importorskip('jax')
    pytest.importorskip('minatar')
    code = '''
import os, sys, tempfile; sys.path.insert(0, sys.argv[1])
import numpy as np, jax, jax.numpy as jnp
from jax.flatten_util import ravel_pytree
import dqn_minatar_jax as ex
for channels, actions in ((4, 6), (10, 3)):
    net = ex.QNetwork(actions)
    params = net.init(jax.random.PRNGKey(channels), jnp.zeros((1, 10, 10, channels)))
    params = jax.tree.map(lambda w: w + 0.1 * jax.random.normal(jax.random.PRNGKey(1), w.shape),
                          params)   # not the init
    states = np.random.default_rng(0).random((7, 10, 10, channels, 1)) < 0.3
    q = ex.GreedyPolicy(params)(states)
    want = np.asarray(net.apply(params, states[..., 0]))
    np.testing.assert_allclose(q, want, rtol=1e-4, atol=1e-5)
    # ... and the update's forward (the same function in JAX) is the network's too
    np.testing.assert_allclose(np.asarray(jax.jit(lambda p, x: ex.q_values(p, x, jnp))(
        params, states[..., 0])), want, rtol=1e-4, atol=1e-5)

# The update is the paper's: one centred RMSProp step on the Huber loss of the TD error, as
# written plainly with the flax network.
optimizer = ex.centred_rmsprop(1e-3)
rng = np.random.default_rng(1)
s, s2 = (rng.random((32, 10, 10, 10)) < 0.3 for _ in range(2))
batch = (s, rng.integers(0, 3, 32), rng.random(32).astype(np.float32), s2,
         np.full(32, 0.99, np.float32), rng.random(32).astype(np.float32))
target = jax.tree.map(lambda w: w * 0.5, params)
state = (params, target, optimizer.init(params))
(got, got_target, _), td = ex.make_update(optimizer)(state, *batch)

def loss(p):
    q = net.apply(p, s)[np.arange(32), batch[1]]
    err = q - (batch[2] + batch[4] * net.apply(target, s2).max(1))
    return jnp.mean(batch[5] * jnp.where(jnp.abs(err) <= 1, 0.5 * err ** 2, jnp.abs(err) - 0.5)), err

(_, err), grads = jax.value_and_grad(loss, has_aux=True)(params)
updates, _ = optimizer.update(grads, state[2], params)
want = jax.tree.map(lambda w, u: w + u, params, updates)
for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(np.asarray(td), np.abs(np.asarray(err)), rtol=1e-5, atol=1e-6)
assert got_target is target

# K updates in one call (--updates-per-call) are the K updates made one call each, on the
# batch's K minibatches in order.
big = tuple(np.concatenate([x] + [np.roll(x, k + 1, axis=0) for k in range(3)]) for x in batch)
(one_by_one, _, opt_one), tds = state, []
for k in range(4):
    (one_by_one, _, opt_one), td = ex.make_update(optimizer)(
        (one_by_one, target, opt_one), *(x[32 * k:32 * (k + 1)] for x in big))
    tds.append(np.asarray(td))
(in_one, _, opt_in_one), td = ex.make_update(optimizer, 4)(state, *big)
for g, w in zip(jax.tree.leaves((in_one, opt_in_one)), jax.tree.leaves((one_by_one, opt_one))):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(np.asarray(td), np.concatenate(tds), rtol=1e-5, atol=1e-6)

# A learner file of the example's earlier layout (one flat vector per tree) is read as the tree.
flat, unravel = ravel_pytree(params)
flat_state = (flat, flat * 2, optimizer.init(flat))
flat_state = (flat_state[0], flat_state[1], optimizer.update(flat, flat_state[2], flat)[1])
path = os.path.join(tempfile.mkdtemp(), 'learner.npz')
ex.save_learner(path, flat_state, {'frames': 7, 'updates': 3})
like = (params, params, optimizer.init(params))
state, counters = ex.load_learner(path, like, optimizer)
assert counters == {'frames': 7, 'updates': 3}, counters
assert jax.tree.structure(state) == jax.tree.structure(like)
for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(jax.tree.map(unravel, flat_state))):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
ex.save_learner(path, state, {'frames': 7, 'updates': 3})   # and the tree itself, as saved now
again, _ = ex.load_learner(path, like, optimizer)
for got, want in zip(jax.tree.leaves(again), jax.tree.leaves(state)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
print('ok')
'''
    out = subprocess.run([sys.executable, '-c', code, EXAMPLE_DIR], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, OPENBLAS_NUM_THREADS='1'))
    assert out.returncode == 0 and out.stdout.strip() == 'ok', out.stderr[-3000:]


RESUMED_ACROSS_K = '''
import json, sys; sys.path.insert(0, sys.argv[1])
import numpy as np
import dqn_minatar_jax as ex

calls = []     # per call of the update: the (online, target) weights it was given
handed = []    # the versions of the weights handed to the players
build = ex.build_learner

def build_learner(*args, **kwargs):
    network, optimizer, state, update = build(*args, **kwargs)
    def recorded(state, *batch):
        calls.append((state[0], state[1]))
        return update(state, *batch)
    return network, optimizer, state, recorded

load = ex.GreedyPolicy.load

def recorded_load(self, params, version=0):
    handed.append(version)
    load(self, params, version)

ex.build_learner, ex.GreedyPolicy.load = build_learner, recorded_load

def saved(ckpt):
    with np.load(ckpt + '/learner.npz') as f:
        return int(f['frames']), int(f['updates'])

runs = []
for ckpt, frames, k in (('fresh', 701, 4), ('ckpt', 706, 1), ('ckpt', 1201, 4)):
    calls.clear(), handed.clear()
    resumed = saved(ckpt)[1] if ckpt == 'ckpt' and runs[1:] else 0
    ex.main(['--frames', str(frames), '--updates-per-call', str(k), '--replay-start', '200',
             '--memory-size', '3000', '--target-update', '100', '--weights-every', '8',
             '--log-every', '1e9', '--checkpoint-dir', ckpt, '--returns', ckpt + '.csv'])
    # Call i is given the state after resumed + k * i updates: the target changed before it
    # was copied then (to the online weights it is given).
    copies = [resumed + k * i for i in range(1, len(calls))
              if calls[i][1] is not calls[i - 1][1] and calls[i][1] is calls[i][0]]
    memory = ex.ReplayMemory.load(ckpt + '/memory/replay_memory.npz').num_steps_written
    runs.append(dict(saved=saved(ckpt), memory=memory, resumed=resumed, copies=copies,
                     handed=handed[1:]))   # handed[0]: the weights the players start with
print('RUNS ' + json.dumps(runs))
'''


@pytest.mark.timeout(LEARNING_TIMEOUT)
def test_a_resume_with_another_updates_per_call_keeps_the_schedules_and_the_frames(tmp_path):
    # A fresh run of 4 updates per call whose --frames is not the fill plus a multiple of 4;
    # a run of 1 per call (saved at update 507, no multiple of 4) resumed with 4: each stops
    # at --frames exactly, and the resumed one copies the target once per 100 updates and
    # hands the weights over once per 8.
    pytest.importorskip('jax')
    pytest.importorskip('minatar')
    out = subprocess.run([sys.executable, '-c', RESUMED_ACROSS_K, EXAMPLE_DIR], capture_output=True,
                         text=True, cwd=tmp_path, timeout=600,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS='1'))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    fresh, first, resumed = json.loads(out.stdout.split('RUNS ', 1)[1])
    for run, frames in ((fresh, 701), (first, 706), (resumed, 1201)):
        assert run['saved'][0] == run['memory'] == frames, run
        assert f'training done: {frames} frames' in out.stdout
    assert max(f for f, _ in returns_rows(tmp_path / 'fresh.csv')) <= 701
    assert max(f for f, _ in returns_rows(tmp_path / 'ckpt.csv')) <= 1201
    assert resumed['resumed'] == first['saved'][1] == 507, (first, resumed)
    # The copies: at the first count of the resumed run's calls (507 + 4i) past each multiple
    # of 100 (the one at 1003 comes after the last call: no call is given it).
    assert resumed['copies'] == [603, 703, 803, 903], resumed
    end = resumed['saved'][1] - resumed['resumed']
    versions = resumed['handed']
    assert versions and versions[0] <= 8 and set(np.diff(versions)) == {8}, versions
    assert versions[-1] > end - 4 - 8, (versions[-1], end)   # up to the last call's


def test_a_fixed_request_lag_holds_every_request_that_many_updates(tmp_path):
    # --request-lag 16 with 2 players: the requests made after the first update start 16
    # updates later (one update per call here), and the run still stops at --frames exactly.
    out = example(['--players', '2', '--request-lag', '16', '--updates-per-call', '1',
                   '--frames', '800', '--replay-start', '200', '--memory-size', '1500',
                   '--target-update', '48', '--log-every', '0'], tmp_path)
    frames, _, lag, lag_max, _, _ = last_line(out)
    assert frames == 800, out[-300:]
    # The stream's count: every request waits 16 updates but the last few, which the run's
    # end starts at once (no update comes after them) and which pull the mean under 16.
    assert 15 <= lag <= 16 and lag_max == 16, out[-300:]
