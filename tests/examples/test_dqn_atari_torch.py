"""examples/dqn_atari_torch.py run as a user runs it: it fills the memory, trains (the saved
network is no longer the initial one), prints its progress, stops cleanly on Ctrl-C, and never
overwrites a file given to --save. The same checks as the JAX Atari example's."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip('torch', reason="the PyTorch example needs the torch extra")
pytest.importorskip('ale_py', reason="the PyTorch example's players are ale-py's vector env")
import torch  # noqa: E402

from test_examples import EXAMPLES, interrupt_example, run_example  # noqa: E402

SCRIPT = 'dqn_atari_torch.py'
LEARNING_STARTS, UPDATES, TRAIN_FREQUENCY, SEED = 500, 20, 4, 3
# A few hundred random steps on a small memory; 20 updates of batch 32 then: the smallest run
# that trains. One torch thread: the suite runs two tests at a time on 2 cores.
SMALL = ['--seed', SEED, '--buffer-size', 3000, '--learning-starts', LEARNING_STARTS, '--num-envs', 4,
         '--train-frequency', TRAIN_FREQUENCY, '--log-every', 1, '--threads', 1]
SMOKE = [*SMALL, '--total-timesteps', LEARNING_STARTS + UPDATES * TRAIN_FREQUENCY]


def initial_network(seed, num_actions=4):
    """The example's initial network for ``seed`` (the same seeding as its ``train``)."""
    sys.path.insert(0, EXAMPLES)
    import dqn_atari_torch
    torch.manual_seed(seed)
    return dqn_atari_torch.QNetwork(num_actions).state_dict()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_trains_prints_progress_and_saves_an_updated_network(tmp_path):
    saved = tmp_path / 'net.pt'
    out = run_example(SCRIPT, *SMOKE, '--save', saved, timeout=280)

    done = re.search(r'^training done: (\d+) agent steps, (\d+) updates', out, re.M)
    assert done, out
    steps, updates = int(done.group(1)), int(done.group(2))
    # One update per TRAIN_FREQUENCY steps stored after the fill (the first at its end); a
    # request to the 4 games stores up to 4 steps, so the count may be off by one.
    assert LEARNING_STARTS + UPDATES * TRAIN_FREQUENCY <= steps, out
    assert UPDATES - 1 <= updates <= UPDATES + 2, out
    progress = re.findall(r'^progress: (\d+) agent steps.*? (\d+) updates? .*'
                          r'loss ([\d.]+), epsilon ([\d.]+)$', out, re.M)
    assert progress, out
    counts = [int(u) for _, u, _, _ in progress]
    assert counts[0] == 1 and counts == sorted(counts) and counts[-1] == updates, out
    assert all(np.isfinite(float(loss)) for _, _, loss, _ in progress), out

    # The saved network is the Nature CNN (Breakout: 4 actions), finite, and moved away from
    # the initial one the same seed gives: the updates reached the network.
    state = torch.load(saved, weights_only=True)
    assert state['net.0.weight'].shape == (32, 4, 8, 8) and state['net.9.weight'].shape == (4, 512)
    initial = initial_network(SEED)
    assert state.keys() == initial.keys()
    moved = sum(not torch.allclose(state[k], initial[k]) for k in state)
    assert all(torch.isfinite(v).all() for v in state.values())
    assert moved == len(state) == 10, f"{moved} of the {len(state)} parameter arrays changed"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_stops_training_cleanly_and_saves(tmp_path):
    saved = tmp_path / 'net.pt'
    args = [*SMALL, '--total-timesteps', 10**7, '--save', saved]
    code, out, err = interrupt_example(tmp_path, SCRIPT, args, 'progress:', times=2)
    assert code == 130, (out[-3000:], err[-3000:])
    assert 'Traceback' not in out + err and 'leaked' not in err, err[-3000:]
    [line] = [line for line in out.splitlines() if line.startswith('Interrupted:')]
    assert 'training stopped, environments closed' in line and str(saved) in line, line
    assert 'net.0.weight' in torch.load(saved, weights_only=True)


def test_an_existing_save_path_is_refused_and_left_alone(tmp_path):
    mine = tmp_path / 'mine.pt'
    mine.write_bytes(b'a user file')
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, SCRIPT), '--save', str(mine)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and '--save' in proc.stderr and 'exists' in proc.stderr, proc.stderr
    assert mine.read_bytes() == b'a user file'
