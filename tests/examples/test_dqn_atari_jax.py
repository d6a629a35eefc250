"""examples/dqn_atari_jax.py run as a user runs it: it fills the memory, trains (the saved
parameters are no longer the initial ones), prints its progress, stops cleanly on Ctrl-C, and
never overwrites a file given to --save.

Each run starts a process that imports JAX and compiles the update (seconds to tens of seconds
on 2 cores), so the runs are marked slow, as the other examples'; CI runs them.
"""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip('jax', reason='the JAX example needs jax, flax and optax (the jax extra)')
pytest.importorskip('flax', reason='the JAX example needs flax (the jax extra)')
pytest.importorskip('optax', reason='the JAX example needs optax (the jax extra)')
pytest.importorskip('ale_py', reason="the JAX example's players are ale-py's vector env")
import flax.serialization  # noqa: E402

from test_examples import EXAMPLES, interrupt_example, run_example  # noqa: E402

SCRIPT = 'dqn_atari_jax.py'
LEARNING_STARTS, UPDATES, TRAIN_FREQUENCY, SEED = 500, 20, 4, 3
# A few hundred random steps on a small memory; 20 updates of batch 32 then: the smallest run
# that trains.
SMALL = ['--seed', SEED, '--buffer-size', 3000, '--learning-starts', LEARNING_STARTS, '--num-envs', 4,
         '--train-frequency', TRAIN_FREQUENCY, '--log-every', 1]
SMOKE = [*SMALL, '--total-timesteps', LEARNING_STARTS + UPDATES * TRAIN_FREQUENCY]


def initial_parameters(path, seed, num_actions=4):
    """The example's initial parameters for ``seed`` (its own ``initial_params``).

    In a process of its own: JAX running in this one would make the other tests' fork (their
    Ctrl-C child) unsafe.
    """
    code = ("import sys, flax.serialization; sys.path.insert(0, sys.argv[1]); "
            "import dqn_atari_jax as d; "
            f"params = d.initial_params(d.QNetwork({num_actions}), {seed}); "
            "open(sys.argv[2], 'wb').write(flax.serialization.to_bytes(params))")
    subprocess.run([sys.executable, '-c', code, EXAMPLES, str(path)], check=True, timeout=120,
                   env=dict(os.environ, PYTHONPATH=os.path.dirname(EXAMPLES)))
    return flax.serialization.msgpack_restore(path.read_bytes())['params']


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_trains_prints_progress_and_saves_updated_parameters(tmp_path):
    saved = tmp_path / 'params.msgpack'
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

    # The saved parameters are the Nature CNN's (Breakout: 4 actions), finite, and moved away
    # from the initial ones the same seed gives: the updates reached the network.
    params = flax.serialization.msgpack_restore(saved.read_bytes())['params']
    assert params['Conv_0']['kernel'].shape == (8, 8, 4, 32)
    assert params['Dense_1']['kernel'].shape == (512, 4)
    initial = initial_parameters(tmp_path / 'init.msgpack', SEED)
    moved = 0
    for layer, weights in params.items():
        for name, value in weights.items():
            assert np.isfinite(value).all(), (layer, name)
            moved += not np.allclose(value, initial[layer][name])
    assert moved == 10, f"{moved} of the 10 parameter arrays changed"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_stops_training_cleanly_and_saves(tmp_path):
    saved = tmp_path / 'params.msgpack'
    args = [*SMALL, '--total-timesteps', 10**7, '--save', saved]
    code, out, err = interrupt_example(tmp_path, SCRIPT, args, 'progress:', times=2)
    assert code == 130, (out[-3000:], err[-3000:])
    assert 'Traceback' not in out + err and 'leaked' not in err, err[-3000:]
    [line] = [line for line in out.splitlines() if line.startswith('Interrupted:')]
    assert 'training stopped, environments closed' in line and str(saved) in line, line
    assert 'params' in flax.serialization.msgpack_restore(saved.read_bytes())


def test_an_existing_save_path_is_refused_and_left_alone(tmp_path):
    mine = tmp_path / 'mine.msgpack'
    mine.write_bytes(b'a user file')
    proc = subprocess.run([sys.executable, os.path.join(EXAMPLES, SCRIPT), '--save', str(mine)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and '--save' in proc.stderr and 'exists' in proc.stderr, proc.stderr
    assert mine.read_bytes() == b'a user file'
