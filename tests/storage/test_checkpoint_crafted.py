"""Crafted checkpoints that would load and then sample wrong are refused at load: every
written slot's flags, episode steps and links that sampling relies on are checked, not only
the slots marked valid, and so are the rewards."""

import numpy as np
import pytest

from expreplay import CheckpointError, ReplayMemory
from test_checkpoint import rewrite

HAS_ACTION, TERMINATED, VALID = 8, 2, 1


def scripted_memory(extra_fields=None):
    """One lane, blocks of 10: three 4-step episodes (frames 0-14), then an open one whose
    newest frame is the last slot of block 1 (slot 19), so nothing follows it."""
    mem = ReplayMemory(100, (2,), 2, 'uint8', block_size=10, extra_fields=extra_fields)
    w = mem.new_writer()
    extras = {'x': 0.5} if extra_fields else None
    for ep in range(4):
        w.start_episode(np.array([ep, 0], np.uint8))
        for t in range(1, 5):
            w.add_step(t % 3, float(t), np.array([ep, t], np.uint8), terminated=t == 4 and ep < 3,
                       extras=extras)
            if ep == 3 and t == 4:
                break
    w.close()
    return mem


def saved(tmp_path, mem):
    path = tmp_path / 'mem.npz'
    mem.save(path)
    return path


def test_the_scripted_memory_loads_and_samples_its_episodes(tmp_path):
    mem = scripted_memory()
    flags = mem.ring.flags
    assert flags[4] == 0 and flags[19] == 0 and (flags[15:19] & HAS_ACTION).all()
    loaded = ReplayMemory.load(rewrite(saved(tmp_path, mem), tmp_path / 'same.npz'))
    batch = loaded.sample(16, n_step=10, rng=np.random.default_rng(0))
    episode, step = batch.state[:, 0, -1], batch.state[:, 1, -1]
    assert (batch.next_state[:, 0, -1] == episode).all()     # the window stays in its episode
    ended = episode < 3
    assert (batch.next_state[ended, 1, -1] == 4).all() and (batch.discount[ended] == 0).all()
    assert (batch.next_state[~ended, 1, -1] == 4).all()     # the open episode's newest frame
    np.testing.assert_allclose(batch.reward, [sum(0.99 ** j * (s + 1 + j) for j in range(4 - s))
                                              for s in step], rtol=1e-6)


def _with(slots, bits):
    def change(flags):
        flags[slots] |= np.uint8(bits)
        return flags
    return change


@pytest.mark.parametrize('changes, problem', [
    # An action on each finished episode's final frame: a window would walk into the next one.
    (dict(flags=_with([4, 9, 14], HAS_ACTION)), "step's next frame is not the next step of its episode"),
    # An action on the lane's newest frame, the last of its block: nothing follows it
    # (the gather kernel was handed slot -10 for it).
    (dict(flags=_with([19], HAS_ACTION)), "step's next frame is not stored"),
    # An episode's end on a frame no action was taken from.
    (dict(flags=_with([4], TERMINATED)), "marked as an episode's end but no action was taken"),
    # A terminated step followed by more steps: a window would sum rewards past the end.
    (dict(flags=_with([1], TERMINATED)), "an action was taken from the episode's final frame"),
    (dict(reward=lambda r: np.where(np.arange(len(r)) == 2, np.nan, r).astype(np.float32)),
     'reward that is NaN or infinite'),
    (dict(reward=lambda r: np.where(np.arange(len(r)) == 7, np.inf, r).astype(np.float32)),
     'reward that is NaN or infinite'),
    (dict(reward=lambda r: np.where(np.arange(len(r)) == 0, -np.inf, r).astype(np.float32)),
     'reward that is NaN or infinite'),
])
def test_crafted_slots_that_would_sample_wrong_are_refused(tmp_path, changes, problem):
    path = saved(tmp_path, scripted_memory())
    bad = rewrite(path, tmp_path / 'crafted.npz', **changes)
    with pytest.raises(CheckpointError, match=problem) as info:
        ReplayMemory.load(bad)
    assert str(bad) in str(info.value)


def test_a_nan_in_a_float_extra_field_is_refused(tmp_path):
    path = saved(tmp_path, scripted_memory(extra_fields={'x': 'float32'}))
    assert ReplayMemory.load(path).extra_fields == {'x': np.dtype('float32')}
    bad = rewrite(path, tmp_path / 'crafted.npz',
                  **{'extra.x': lambda x: np.where(np.arange(len(x)) == 3, np.nan, x).astype(np.float32)})
    with pytest.raises(CheckpointError, match="extra field 'x' holds a NaN"):
        ReplayMemory.load(bad)
