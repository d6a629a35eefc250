"""Checkpoints of prioritized memories: priorities survive a save and a
load exactly; files of format 2 (no priorities) load as uniform memories; a checkpoint of other
settings is refused naming the setting."""

import json

import numpy as np
import pytest

from expreplay import CheckpointError, ReplayMemory
from expreplay.storage import checkpoint as _checkpoint
from expreplay.stream import MemoryCheckpoint
from test_checkpoint import DROP, assert_same_memory, rewrite
from test_memory import FRAME_SHAPE, encode
from test_priority import all_tokens, filled_prioritized

VALID = 1


def prioritized_with_history(seed=0, **kwargs):
    """A prioritized memory that wrapped around, with learner priorities over a wide range, a
    raised running maximum, some stale updates, and steps queued since the last sample."""
    mem, script, writers = filled_prioritized(seed=seed, alpha=0.7, priority_eps=1e-3, **kwargs)
    rng = np.random.default_rng(seed)
    old = mem.sample(32, rng=rng)
    writers.write(200)                           # wraps: most of `old` is evicted
    assert mem.update_priorities(old.indices, rng.random(32)) > 0
    slots, tokens = all_tokens(mem)
    priorities = np.minimum(rng.exponential(1.0, len(slots)) ** 3, 30.0)
    priorities[::11] = 0.0
    priorities[5] = 40.0                          # the running maximum
    mem.update_priorities(tokens, priorities)
    writers.write(3)                              # queued, not yet in the tree
    assert len(mem.ring.priorities.pending)
    return mem, writers


def leaves(mem):
    return mem.ring.priorities.tree.get(np.arange(mem.num_slots))


def test_round_trip_keeps_the_exact_sampling_distribution(tmp_path):
    mem, writers = prioritized_with_history()
    for w in writers.writers:
        w.close()
    mem.save(tmp_path / 'mem.npz')               # flushes the queued steps first
    loaded = ReplayMemory.load(tmp_path / 'mem.npz')
    assert loaded.prioritized
    assert_same_memory(loaded, mem)
    a, b = mem.ring.priorities, loaded.ring.priorities
    assert (b.alpha, b.eps, b.max_priority, b.stale_updates) == \
        (a.alpha, a.eps, a.max_priority, a.stale_updates) == (0.7, 1e-3, 40.0, a.stale_updates)
    assert b.stale_updates > 0
    # The tree, inner nodes included, is the saved one bit for bit: the same draws follow.
    for level in range(a.tree.depth + 1):
        np.testing.assert_array_equal(b.tree.sum_levels[level], a.tree.sum_levels[level])
        np.testing.assert_array_equal(b.tree.min_levels[level], a.tree.min_levels[level])
    np.testing.assert_array_equal(leaves(loaded) > 0, (loaded.ring.flags[:loaded.num_slots] & VALID) != 0)
    for seed in range(5):
        x = mem.sample(64, n_step=3, beta=0.5, rng=np.random.default_rng(seed))
        y = loaded.sample(64, n_step=3, beta=0.5, rng=np.random.default_rng(seed))
        for field, u, v in zip(x._fields, x, y):
            np.testing.assert_array_equal(u, v, err_msg=field)
    # Indices handed out before the save still update the loaded memory's priorities.
    x = mem.sample(8, rng=np.random.default_rng(9))
    assert loaded.update_priorities(x.indices, np.full(8, 2.0)) == 0
    np.testing.assert_allclose(leaves(loaded)[x.indices % mem.num_slots], (2.0 + 1e-3) ** 0.7)
    # New steps enter at the running maximum priority that was saved.
    w = loaded.new_writer()
    w.start_episode(encode(99, 1, 0))
    w.add_step(0, 0.0, encode(99, 1, 1))
    w.add_step(0, 0.0, encode(99, 1, 2))
    loaded.sample(1)
    slot = w.current_slot - 1
    assert loaded.ring.flags[slot] & VALID
    assert leaves(loaded)[slot] == pytest.approx((40.0 + 1e-3) ** 0.7)


def test_steps_queued_at_the_save_are_in_the_checkpoint(tmp_path):
    mem, _ = prioritized_with_history(seed=1)
    pending = np.unique(mem.ring.priorities.pending)
    pending = pending[(mem.ring.flags[pending] & VALID) != 0]
    assert len(pending)
    mem.save(tmp_path / 'mem.npz')
    loaded = ReplayMemory.load(tmp_path / 'mem.npz')
    np.testing.assert_array_equal(leaves(loaded)[pending], (40.0 + 1e-3) ** 0.7)


def test_a_uniform_memory_has_no_priority_table(tmp_path):
    mem = ReplayMemory(100, FRAME_SHAPE, 2, block_size=10)
    w = mem.new_writer()
    w.start_episode(encode(0, 1, 0))
    for t in range(30):
        w.add_step(0, 1.0, encode(0, 1, t + 1))
    mem.save(tmp_path / 'mem.npz')
    with np.load(tmp_path / 'mem.npz') as archive:
        assert 'priority' not in archive.files
        meta = json.loads(bytes(archive['meta']).decode())
    assert meta['version'] == _checkpoint.VERSION and meta['prioritized'] is False
    assert not ReplayMemory.load(tmp_path / 'mem.npz').prioritized


def as_format_2(path, out):
    """The file a format-2 expreplay wrote for the same memory: no priorities, no settings."""
    return rewrite(path, out, priority=None, meta_version=2, meta_prioritized=DROP,
                   meta_alpha=DROP, meta_priority_eps=DROP, meta_max_priority=DROP,
                   meta_stale_priority_updates=DROP)


def test_format_2_checkpoints_load_as_uniform_memories(tmp_path):
    mem, writers = prioritized_with_history(seed=2)
    for w in writers.writers:
        w.close()
    mem.save(tmp_path / 'v3.npz')
    old = as_format_2(tmp_path / 'v3.npz', tmp_path / 'v2.npz')
    with np.load(old) as archive:
        meta = json.loads(bytes(archive['meta']).decode())
        assert 'priority' not in archive.files
    assert meta['version'] == 2 and 'prioritized' not in meta and 'alpha' not in meta
    loaded = ReplayMemory.load(old)
    assert not loaded.prioritized and loaded.ring.priorities is None
    assert len(loaded) == len(mem)
    for x, y in zip(mem.sample_batch(32, rng=np.random.default_rng(1)),
                    loaded.sample_batch(32, rng=np.random.default_rng(1))):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(CheckpointError, match='prioritized: checkpoint has False, expected True'):
        ReplayMemory.load(old, prioritized=True)
    # A format-2 file with a priority table is not one format 2 wrote.
    with pytest.raises(CheckpointError, match='unexpected entries'):
        ReplayMemory.load(rewrite(tmp_path / 'v3.npz', tmp_path / 'odd.npz', meta_version=2,
                                  meta_prioritized=False))


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    """A prioritized checkpoint (alpha 0.7, eps 1e-3, 300 steps, block 10) and a uniform one."""
    path = tmp_path_factory.mktemp('ckpt')
    mem, _ = prioritized_with_history(seed=3)
    mem.save(path / 'per.npz')
    uniform = ReplayMemory(300, FRAME_SHAPE, 2, block_size=10)
    w = uniform.new_writer()
    w.start_episode(encode(0, 1, 0))
    for t in range(50):
        w.add_step(0, 1.0, encode(0, 1, t + 1))
    uniform.save(path / 'uniform.npz')
    return path


@pytest.mark.parametrize('which, settings, match', [
    ('uniform', dict(prioritized=True), 'prioritized: checkpoint has False, expected True'),
    ('per', dict(prioritized=False), 'prioritized: checkpoint has True, expected False'),
    ('per', dict(alpha=0.6), 'alpha: checkpoint has 0.7, expected 0.6'),
    ('per', dict(prioritized=True, priority_eps=1e-6),
     'priority_eps: checkpoint has 0.001, expected 1e-06'),
    ('per', dict(max_size=1000), 'max_size: checkpoint has 300, expected 1000'),
    ('per', dict(block_size=20), 'block_size: checkpoint has 10, expected 20'),
    ('per', dict(history_len=4), 'history_len: checkpoint has 2, expected 4'),
    ('uniform', dict(prioritized=True, alpha=0.7), 'prioritized: checkpoint has False'),
])
def test_other_settings_are_refused_naming_the_setting(saved, which, settings, match):
    with pytest.raises(CheckpointError, match=match) as info:
        ReplayMemory.load(saved / f'{which}.npz', **settings)
    assert str(saved / f'{which}.npz') in str(info.value)


def test_matching_settings_load(saved):
    mem = ReplayMemory.load(saved / 'per.npz', max_size=300, block_size=10, prioritized=True,
                            alpha=0.7, priority_eps=1e-3)
    assert mem.prioritized
    # alpha / priority_eps mean nothing for two uniform memories
    assert not ReplayMemory.load(saved / 'uniform.npz', prioritized=False, alpha=0.2).prioritized


def test_bad_expected_settings_name_the_argument(saved):
    with pytest.raises(TypeError, match='prioritized'):
        ReplayMemory.load(saved / 'per.npz', prioritized='yes')
    with pytest.raises(ValueError, match='alpha'):
        ReplayMemory.load(saved / 'per.npz', alpha=1.5)


def test_the_streams_checkpoint_passes_the_prioritized_settings(saved, tmp_path):
    (tmp_path / MemoryCheckpoint.FILENAME).write_bytes((saved / 'per.npz').read_bytes())
    ckpt = MemoryCheckpoint(tmp_path)
    with pytest.raises(CheckpointError, match='prioritized: checkpoint has True, expected False'):
        ckpt.load(300, FRAME_SHAPE, 2, 'uint8', prioritized=False)
    with pytest.raises(CheckpointError, match='alpha'):
        ckpt.load(300, FRAME_SHAPE, 2, 'uint8', prioritized=True, alpha=0.5)
    assert ckpt.load(300, FRAME_SHAPE, 2, 'uint8', prioritized=True, alpha=0.7,
                     priority_eps=1e-3).prioritized


def _valid_positions(fill_order_flags):
    return np.flatnonzero(fill_order_flags & VALID)


@pytest.mark.parametrize('change, match', [
    (lambda p, f: np.where(np.arange(len(p)) == _valid_positions(f)[0], -1.0, p), 'negative'),
    (lambda p, f: np.where(np.arange(len(p)) == _valid_positions(f)[0], np.nan, p), 'finite'),
    (lambda p, f: np.where((f & VALID) == 0, 1.0, p), 'disagrees with the valid slots'),
    (lambda p, f: np.where(np.arange(len(p)) == _valid_positions(f)[3], 0.0, p),
     'disagrees with the valid slots'),
    (lambda p, f: p.astype(np.float32), "table 'priority' holds float32"),
    (None, "no table 'priority'"),
])
def test_crafted_priority_tables_are_refused(saved, tmp_path, change, match):
    with np.load(saved / 'per.npz') as archive:
        flags = archive['flags']
    fn = None if change is None else (lambda p: change(p, flags))
    bad = rewrite(saved / 'per.npz', tmp_path / 'bad.npz', priority=fn)
    with pytest.raises(CheckpointError, match=match):
        ReplayMemory.load(bad)


@pytest.mark.parametrize('key, value, match', [
    ('alpha', 1.5, 'alpha'), ('priority_eps', 0.0, 'priority_eps'),
    ('max_priority', -1.0, 'max_priority'), ('max_priority', 'big', 'max_priority'),
    ('stale_priority_updates', -2, 'stale_priority_updates'), ('prioritized', 1, 'prioritized'),
])
def test_crafted_prioritized_metadata_is_refused(saved, tmp_path, key, value, match):
    bad = rewrite(saved / 'per.npz', tmp_path / 'bad.npz', **{'meta_' + key: value})
    with pytest.raises(CheckpointError, match=match):
        ReplayMemory.load(bad)
