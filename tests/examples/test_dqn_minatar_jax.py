"""examples/dqn_minatar_jax.py: the JAX learner on the stream learns, and a defect in what it is
fed makes the same short run fail the learning bar.

The learning bar: after a short Breakout run (CI_ARGS below), the greedy policy's mean score
over EVAL_EPISODES episodes must reach BAR. Uniformly random play scores ~0.5 and a fixed
action ~1.1-1.3 (sticky actions move the paddle anyway); the clean run's figures and the bar's
margin are in docs/minatar.md. The same run is then made with one defect injected between the
memory and the learner (each batch altered as a sampling bug would alter it): rewards zeroed,
actions shuffled across the batch (each transition paired with another's action), the next
state one frame off (the state itself). Each must fail the bar: a bar those pass would not catch
a real defect.

Each run is a subprocess that imports the example and runs its ``main`` (this file, run as a
script, is that subprocess).
"""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE_DIR = os.path.join(ROOT, 'examples')

# The paper's agent on a shorter clock: a 30k-frame memory learning from frame 1,000, epsilon
# 1 -> 0.1 over 5k frames, the target network copied every 250 updates, a 4x larger step size.
CI_ARGS = ['--game', 'breakout', '--frames', '30000', '--replay-start', '1000',
           '--memory-size', '30000', '--exploration-frames', '5000', '--target-update', '250',
           '--lr', '1e-3', '--log-every', '1e9']
EVAL_EPISODES = 100
BAR = 3.5

DEFECTS = {
    'none': lambda batch, rng: batch,
    'rewards-zeroed': lambda batch, rng: batch._replace(reward=np.zeros_like(batch.reward)),
    'actions-shuffled': lambda batch, rng: batch._replace(action=rng.permutation(batch.action)),
    'next-state-off-by-one': lambda batch, rng: batch._replace(next_state=batch.state),
}


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


# A run takes 1-2.5 minutes on 2 idle cores; beside other jobs several times that. The
# subprocess's own timeout (run()) still ends a hung run.
LEARNING_TIMEOUT = 1200


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
def test_short_breakout_run_reaches_the_bar():
    score, out = run('none')
    assert score >= BAR, f"greedy mean {score:.2f} < {BAR}\n{out[-1500:]}"


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
@pytest.mark.parametrize('defect', [d for d in DEFECTS if d != 'none'])
def test_a_defect_in_what_the_learner_is_fed_fails_the_bar(defect):
    score, out = run(defect)
    assert score < BAR, f"{defect}: greedy mean {score:.2f} still reaches {BAR}\n{out[-1500:]}"


def main(defect, seed, *extra):
    sys.path.insert(0, EXAMPLE_DIR)
    import dqn_minatar_jax
    from expreplay import ReplayMemory

    alter, rng, sample = DEFECTS[defect], np.random.default_rng(int(seed)), ReplayMemory.sample

    def sample_with_defect(self, *args, **kwargs):
        return alter(sample(self, *args, **kwargs), rng)

    ReplayMemory.sample = sample_with_defect
    dqn_minatar_jax.main(CI_ARGS + ['--seed', seed, '--eval-episodes', str(EVAL_EPISODES), *extra])


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
    common = ['--replay-start', '300', '--memory-size', '2000', '--target-update', '50',
              '--log-every', '0', '--checkpoint-dir', 'ckpt', '--returns', 'returns.csv',
              '--checkpoint-every', '500', '--prioritized', '--n-step', '3']
    first = example(['--frames', '1200', *common], tmp_path)
    assert 'training done: 1200 frames' in first and 'resources: threads' in first
    assert (tmp_path / 'ckpt' / 'learner.npz').exists()
    rows = returns_rows(tmp_path / 'returns.csv')
    assert rows and rows[-1][0] <= 1200

    second = example(['--frames', '2000', *common], tmp_path)
    assert 'resuming from ckpt: frame 1200, update 901' in second, second[:500]
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


def stop_mid_run(tmp_path, sig):
    """Start a run of the example as a user does, send it ``sig`` once it has trained for 50
    frames, and check that it stopped cleanly with its learner and memory saved; returns the
    frame count saved."""
    pytest.importorskip('jax')
    pytest.importorskip('minatar')
    # SIGINT handled by default in the child even when this run inherited it ignored (a job
    # started in the background of a non-interactive shell does): else the run ignores Ctrl-C.
    proc = subprocess.Popen([sys.executable, '-u', os.path.join(EXAMPLE_DIR, 'dqn_minatar_jax.py'),
                             *STOPPABLE_RUN],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path, env=dict(os.environ, OPENBLAS_NUM_THREADS='1'),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        progress = 0
        for line in proc.stdout:          # training has started: interrupt it mid-run
            progress += line.startswith('progress:')
            if progress == 50:
                proc.send_signal(sig)
                break
        rest = proc.communicate(timeout=120)[0]   # the stop takes ~5 s at load 10 on 2 cores
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, rest[-3000:]
    assert 'stopped: the memory and the learner are saved in ckpt' in rest, rest[-3000:]
    with np.load(tmp_path / 'ckpt' / 'learner.npz') as saved:
        frames = int(saved['frames'])
    assert frames >= 300 + 48
    return frames


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
def test_ctrl_c_saves_the_learner_with_the_memory_and_the_run_goes_on(tmp_path):
    frames = stop_mid_run(tmp_path, signal.SIGINT)
    resumed = example(['--frames', str(frames + 200), *STOPPABLE_RUN[2:]], tmp_path)
    assert f'resuming from ckpt: frame {frames}' in resumed
    assert f'training done: {frames + 200} frames' in resumed


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
def test_kill_stops_the_run_as_ctrl_c_does(tmp_path):
    # SIGTERM: how a run in the background (whose Ctrl-C the shell ignores) or a batch
    # scheduler's job is stopped.
    stop_mid_run(tmp_path, signal.SIGTERM)


def test_the_players_numpy_forward_is_the_networks():
    # The players act through a numpy copy of the forward pass (it runs beside the update in
    # flight): it must give the flax network's Q-values for the same flat weights.
    pytest.importorskip('jax')
    pytest.importorskip('minatar')
    code = '''
import sys; sys.path.insert(0, sys.argv[1])
import numpy as np, jax, jax.numpy as jnp
from jax.flatten_util import ravel_pytree
import dqn_minatar_jax as ex
for channels, actions in ((4, 6), (10, 3)):
    net = ex.QNetwork(actions)
    params = net.init(jax.random.PRNGKey(channels), jnp.zeros((1, 10, 10, channels)))
    flat, _ = ravel_pytree(params)
    flat = flat + jax.random.normal(jax.random.PRNGKey(1), flat.shape) * 0.1   # not the init
    params = _(flat)
    states = np.random.default_rng(0).random((7, 10, 10, channels, 1)) < 0.3
    q = ex.GreedyPolicy(params, flat)(states)
    np.testing.assert_allclose(q, np.asarray(net.apply(params, states[..., 0])), rtol=1e-4, atol=1e-5)
print('ok')
'''
    out = subprocess.run([sys.executable, '-c', code, EXAMPLE_DIR], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, OPENBLAS_NUM_THREADS='1'))
    assert out.returncode == 0 and out.stdout.strip() == 'ok', out.stderr[-3000:]
