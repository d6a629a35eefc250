"""examples/dqn_minatar_torch.py: the PyTorch learner on the stream learns, a defect in what is
stored makes the same short run fail the learning bar, and a stopped run resumes at one frame.

The learning bar: after the short Breakout run of the JAX example's test (CI_ARGS below), the
greedy policy's mean score over EVAL_EPISODES episodes must reach BAR. Uniformly random play
scores ~0.5, a fixed action ~1.1-1.3; the clean seeds' figures and the bar's margins are in
docs/pytorch.md. The same run with an episode's end not stored (its last step leads, unmarked,
to the next episode's first frame) must fail it: a bar it passes would not catch a real defect.

Each learning run is a subprocess that imports the example and runs its ``main`` (this file,
run as a script, is that subprocess: ``python tests/examples/test_dqn_minatar_torch.py DEFECT
SEED``).
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE_DIR = os.path.join(ROOT, 'examples')
EXAMPLE = os.path.join(EXAMPLE_DIR, 'dqn_minatar_torch.py')

# The JAX example's CI run: 60k frames, a 30k-frame memory learning from frame 1,000, epsilon
# 1 -> 0.1 over 5k frames, the target network copied every 252 updates, step size 1e-3.
CI_ARGS = ['--game', 'breakout', '--frames', '60000', '--replay-start', '1000',
           '--memory-size', '30000', '--exploration-frames', '5000', '--target-update', '252',
           '--lr', '1e-3', '--log-every', '1e9']
EVAL_EPISODES = 100
BAR = 4.5

# A run takes 2-4 minutes on 2 idle cores; beside other jobs several times that. The
# subprocess's own timeout (run()) still ends a hung run.
LEARNING_TIMEOUT = 1500


def needs_torch():
    pytest.importorskip('torch', reason="the torch extra: pip install -e '.[torch]'")
    pytest.importorskip('minatar', reason="the minatar extra: pip install -e '.[minatar]'")


def run(defect, seed=0):
    """The greedy mean score after the CI run with ``defect``, from a fresh process."""
    needs_torch()
    out = subprocess.run([sys.executable, __file__, defect, str(seed)], capture_output=True,
                         text=True, cwd=ROOT, timeout=LEARNING_TIMEOUT - 60)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    line = [x for x in out.stdout.splitlines() if x.startswith('greedy mean score')][-1]
    return float(line.split()[3]), out.stdout


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
def test_short_breakout_run_reaches_the_bar():
    score, out = run('none')
    assert score >= BAR, f"greedy mean {score:.2f} < {BAR}\n{out[-1500:]}"


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
def test_an_episode_end_not_stored_fails_the_bar():
    score, out = run('episode-end-unmarked')
    assert score < BAR, f"episode-end-unmarked: greedy mean {score:.2f} still reaches {BAR}\n{out[-1500:]}"


def episode_end_unmarked(make_player):
    """``make_player`` whose envs do not store an episode's end: its last step leads, unmarked,
    to the first frame of the next episode (the env reset under it)."""
    import gymnasium as gym

    class EpisodeEndUnmarked(gym.Wrapper):
        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset()
            return obs, reward, False, False, info

    return lambda game: EpisodeEndUnmarked(make_player(game))


def main(defect, seed):
    sys.path.insert(0, EXAMPLE_DIR)
    import dqn_minatar_torch
    if defect == 'episode-end-unmarked':   # in the players' envs only: the evaluation plays the game
        dqn_minatar_torch.make_player = episode_end_unmarked(dqn_minatar_torch.make_player)
    elif defect != 'none':
        raise SystemExit(f"unknown defect {defect!r}")
    dqn_minatar_torch.main(CI_ARGS + ['--seed', seed, '--eval-episodes', str(EVAL_EPISODES)])


if __name__ == '__main__':
    main(*sys.argv[1:])


def example(args, tmp_path, timeout=600):
    needs_torch()
    out = subprocess.run([sys.executable, EXAMPLE, *args], capture_output=True, text=True,
                         cwd=tmp_path, timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out.stdout


def returns_rows(path):
    lines = path.read_text().splitlines()
    assert lines[0] == 'frames,score'
    return [(int(f), float(s)) for f, s in (line.split(',') for line in lines[1:])]


def saved_frames(tmp_path):
    """(the learner file's frame and update count, the memory checkpoint's count of steps
    stored): the example saves both at the same frame, the memory's count."""
    import torch
    from expreplay import ReplayMemory
    saved = torch.load(tmp_path / 'ckpt' / 'learner.pt', weights_only=True)
    memory = ReplayMemory.load(tmp_path / 'ckpt' / 'memory' / 'replay_memory.npz')
    return (saved['frames'], saved['updates']), memory.num_steps_written


@pytest.mark.slow
def test_a_run_resumed_from_its_checkpoint_continues_its_curve(tmp_path):
    common = ['--replay-start', '300', '--memory-size', '2000', '--target-update', '50',
              '--log-every', '0', '--checkpoint-dir', 'ckpt', '--returns', 'returns.csv',
              '--checkpoint-every', '500', '--prioritized', '--n-step', '3']
    first = example(['--frames', '1200', *common], tmp_path)
    assert 'training done: 1200 frames' in first and 'resources: threads' in first
    (frames, updates), memory_frames = saved_frames(tmp_path)
    # One update per frame after the 300-frame fill, the first at the fill's end.
    assert frames == memory_frames == 1200 and updates == 901, (frames, updates, memory_frames)
    rows = returns_rows(tmp_path / 'returns.csv')
    assert rows and rows[-1][0] <= 1200

    second = example(['--frames', '2000', *common], tmp_path)
    assert 'resuming from ckpt: frame 1200, update 901' in second, second[:500]
    assert 'transitions in the memory' in second and 'at random first' not in second
    frames = [int(line.split()[1]) for line in second.splitlines() if line.startswith('progress:')]
    # The frame count, epsilon's clock and the score log go on from the checkpoint (the
    # resumed stream's first batch, as a fresh one's, comes before a new frame).
    assert frames[0] == 1200 and frames[-1] == 2000 and frames == sorted(frames)
    assert 'epsilon 1.000' not in second.split('progress:', 1)[1]
    resumed = returns_rows(tmp_path / 'returns.csv')
    assert resumed[:len(rows)] == rows                    # the first sitting's rows are kept
    later = [f for f, _ in resumed[len(rows):]]
    assert later and later[0] > 1200 and later == sorted(later) and later[-1] <= 2000
    assert saved_frames(tmp_path) == ((2000, 901 + 1 + 800), 2000)


STOPPABLE_RUN = ['--frames', '100000', '--replay-start', '300', '--memory-size', '5000',
                 '--log-every', '0', '--checkpoint-dir', 'ckpt']


def stop_run(tmp_path, sig, args=STOPPABLE_RUN, when=lambda line, progress: progress == 50):
    """Start a run as a user does, send it ``sig`` once ``when(line, progress lines so far)``
    holds, and check that it stopped with its learner and memory saved at the same frame.
    Returns (frames, updates) saved and the output."""
    needs_torch()
    # SIGINT handled by default in the child even when this run inherited it ignored (a job
    # started in the background of a non-interactive shell does): else the run ignores Ctrl-C.
    proc = subprocess.Popen([sys.executable, '-u', EXAMPLE, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        progress, head = 0, []
        for line in proc.stdout:
            head.append(line)
            progress += line.startswith('progress:')
            if when(line, progress):
                proc.send_signal(sig)
                break
        rest = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, rest[-3000:]
    (frames, updates), memory_frames = saved_frames(tmp_path)
    assert f'stopped: the memory and the learner are saved in ckpt at frame {frames};' in rest, \
        rest[-3000:]
    assert frames == memory_frames, f"learner at frame {frames}, memory at {memory_frames}"
    return (frames, updates), ''.join(head) + rest


@pytest.mark.slow
@pytest.mark.timeout(LEARNING_TIMEOUT)
@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGTERM], ids=['ctrl-c', 'kill'])
def test_a_stopped_run_saves_the_learner_with_the_memory_and_goes_on(tmp_path, sig):
    (frames, updates), _ = stop_run(tmp_path, sig)
    # One update per frame after the fill, the first at its end; a stop inside next(stream),
    # after its frame is stored and before its update, leaves one update fewer.
    assert frames >= 300 + 49 and frames - 300 <= updates <= frames - 300 + 1, (frames, updates)
    resumed = example(['--frames', str(frames + 200), *STOPPABLE_RUN[2:]], tmp_path)
    assert f'resuming from ckpt: frame {frames}, update {updates}' in resumed
    assert f'training done: {frames + 200} frames' in resumed
    assert saved_frames(tmp_path) == ((frames + 200, updates + 1 + 200), frames + 200)


def test_help_answers_before_torch_loads():
    out = subprocess.run([sys.executable, '-X', 'importtime', EXAMPLE, '--help'],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and '--checkpoint-dir' in out.stdout and '--weights-every' in out.stdout
    assert '(default: 5000000)' in ' '.join(out.stdout.split())   # the defaults are shown
    assert ' torch' not in out.stderr and 'minatar' not in out.stderr   # -X importtime's list


PLAYERS = '''
import sys; sys.path.insert(0, sys.argv[1])
import threading
import numpy as np, torch
import dqn_minatar_torch as ex

# The network takes the stream's channels-last states, for the players (one frame each,
# (n, 10, 10, C, 1), bool) and the batches alike, and is the paper's: its Q-values are a
# plain NCHW convolution's.
net = ex.QNetwork(4, 6)
states = np.random.default_rng(0).random((7, 10, 10, 4, 1)) < 0.3
x = torch.from_numpy(states[..., 0]).float().permute(0, 3, 1, 2)
h = torch.relu(torch.nn.functional.conv2d(x, net.conv.weight, net.conv.bias)).flatten(1)
want = net.out(torch.relu(net.hidden(h)))
policy = ex.GreedyPolicy(net, torch.device('cpu'))
q = policy(states)
assert not q.requires_grad and torch.allclose(q, want.detach(), atol=1e-6)

# Live weights: the players see the learner's step at once. A copy handed over: they see
# the weights of the hand-over until the next one.
with torch.no_grad():
    net.out.bias += 1.0
assert torch.allclose(policy(states), q + 1.0, atol=1e-5)
policy.load(net)
with torch.no_grad():
    net.out.bias += 1.0
assert torch.allclose(policy(states), q + 1.0, atol=1e-5)

# no_grad is per thread: set inside the predictor, a forward in another thread records no graph.
seen = []
player = threading.Thread(target=lambda: seen.append(ex.GreedyPolicy(net, torch.device('cpu'))(states)))
player.start()
player.join()
assert not seen[0].requires_grad and seen[0].grad_fn is None
print('ok')
'''


def test_the_players_forward_is_the_networks_live_or_handed_over():
    needs_torch()
    out = subprocess.run([sys.executable, '-c', PLAYERS, EXAMPLE_DIR], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == 'ok', out.stderr[-3000:]


def test_several_players_with_weights_handed_over_train_to_the_frame(tmp_path):
    out = example(['--players', '2', '--staleness', '4', '--frames', '1000', '--replay-start', '200',
                   '--memory-size', '1500', '--target-update', '50', '--log-every', '0',
                   '--weights-every', '8', '--returns', 'returns.csv'], tmp_path)
    assert '2 players' in out and 'every 8 updates' in out, out[:500]
    assert 'training done: 1000 frames' in out, out[-500:]
    last = [line for line in out.splitlines() if line.startswith('progress:')][-1]
    at, updates = int(last.split()[1]), int(last.split()[4])
    assert at == 1000 and abs(updates - (at - 200)) <= 5, last   # one update per frame
    ends = [f for f, _ in returns_rows(tmp_path / 'returns.csv')]
    assert ends and ends == sorted(ends) and ends[-1] <= 1000
