"""Replay memory checkpoints: what a save leaves on disk, and what a load
accepts.

Files are damaged the ways disks and users damage them (emptied, cut, single bits flipped,
tables rewritten by hand); every damaged file must either raise ``expreplay.CheckpointError``
naming the file, or load into exactly the memory that was saved. Kills are real SIGKILLs of
child processes in the middle of writing.
"""

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import expreplay
from expreplay import CheckpointError, ReplayMemory
from test_memory import (FRAME_SHAPE, StreamModel, action_of, all_valid_transitions,
                         assert_same_tables, decode, encode, reward_of, write_random_stream)


def filled(max_size=120, steps=200, seed=0, block_size=8, close=True):
    rng = np.random.default_rng(seed)
    mem = ReplayMemory(max_size, FRAME_SHAPE, 4, block_size=block_size)
    writers, _ = write_random_stream(mem, 3, steps, rng, StreamModel())
    if close:
        for w in writers:
            w.close()
    return mem


def assert_same_memory(loaded, mem):
    assert_same_tables(loaded, mem)
    assert len(loaded) == len(mem) and loaded.num_steps_written == mem.num_steps_written
    if len(mem) >= 32:
        for x, y in zip(mem.sample_batch(32, rng=np.random.default_rng(1)),
                        loaded.sample_batch(32, rng=np.random.default_rng(1))):
            np.testing.assert_array_equal(x, y)


def run_child(code, **kwargs):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], env=env,
                          capture_output=True, timeout=120, **kwargs)


def temps(path):
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name + '.tmp'))


DIE_IN_FRAMES = """
    import os, signal, zipfile, numpy as np
    from expreplay import ReplayMemory
    mem = ReplayMemory.load({path!r})
    w = mem.new_writer()
    w.start_episode(np.ones((4, 4), np.uint8))
    w.add_step(0, 0.0, np.ones((4, 4), np.uint8))
    real = zipfile._ZipWriteFile.write
    def write(self, data):
        if self._zinfo.filename == 'frames.npy' and self._file_size > 0:
            {action}
        return real(self, data)
    zipfile._ZipWriteFile.write = write
    mem.save({path!r})
"""


def kill_a_save(path):
    proc = run_child(DIE_IN_FRAMES.format(path=str(path), action=(
        "real(self, data); self._fileobj.flush(); os.kill(os.getpid(), signal.SIGKILL)")))
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    return proc


# ------------------------------------------------------------------------------ temp files
@pytest.mark.parametrize('then', ['save', 'load'])
def test_temp_files_of_killed_saves_are_removed_by_the_next_save_or_load(tmp_path, then, caplog):
    mem = filled()
    path = tmp_path / 'mem.npz'
    mem.save(path)
    for _ in range(2):
        kill_a_save(path)     # the second child's load removes the temp file of the first
    assert len(temps(path)) == 1
    # The name earlier versions gave their temp files (<path>.tmp-<pid>-<thread>), of a dead pid.
    dead_pid = int(run_child("import os; print(os.getpid())").stdout)
    (tmp_path / f'mem.npz.tmp-{dead_pid}-140000000000').write_bytes(b'x' * 1000)
    (tmp_path / 'mem.npz.tmp-notours').write_bytes(b'keep')      # not a name saves give
    assert len(temps(path)) == 3
    with caplog.at_level(logging.WARNING, logger='expreplay'):
        if then == 'save':
            mem.save(path)
        else:
            assert_same_memory(ReplayMemory.load(path), mem)
    assert temps(path) == ['mem.npz.tmp-notours']
    assert sum('did not finish' in r.getMessage() for r in caplog.records) == 2
    assert_same_memory(ReplayMemory.load(path), mem)


def test_a_live_save_of_the_same_path_keeps_its_temp_file(tmp_path):
    """A save in progress (another process, its temp file locked) is left alone by a
    concurrent save and load, and completes afterwards."""
    mem = filled()
    path = tmp_path / 'mem.npz'
    mem.save(path)
    child = subprocess.Popen(
        [sys.executable, '-c', textwrap.dedent(DIE_IN_FRAMES.format(path=str(path), action=(
            "print('writing', flush=True); import sys; sys.stdin.readline(); "
            "zipfile._ZipWriteFile.write = real")))],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == 'writing\n', child.stderr.read()
        live = temps(path)
        assert len(live) == 1
        assert_same_memory(ReplayMemory.load(path), mem)
        mem.save(path)
        assert temps(path) == live
    finally:
        out, err = child.communicate('go\n', timeout=60)
    assert child.returncode == 0, err
    assert temps(path) == []
    assert ReplayMemory.load(path).num_steps_written == mem.num_steps_written + 1   # the child's


# ------------------------------------------------------------------------------ size and log
def test_a_checkpoint_holds_the_written_slots_only(tmp_path):
    frame = (32, 32)
    mem = ReplayMemory(20_000, frame, 4)
    w = mem.new_writer()
    w.start_episode(np.zeros(frame, np.uint8))
    for t in range(3_000):                     # 15% of the capacity
        w.add_step(t % 4, 1.0, np.full(frame, t % 251, np.uint8), truncated=t % 500 == 499)
        if t % 500 == 499:
            w.start_episode(np.zeros(frame, np.uint8))
    w.close()
    path = tmp_path / 'mem.npz'
    size = mem.save(path)
    assert size == path.stat().st_size
    frames_written = int(mem.ring.block_fill.sum()) * 32 * 32
    full = mem.num_slots * 32 * 32
    assert frames_written < 0.2 * full
    assert size < frames_written + 100 * int(mem.ring.block_fill.sum()) // 5 + 64_000, size
    loaded = ReplayMemory.load(path)
    assert_same_memory(loaded, mem)
    # An empty memory's checkpoint is a few KB, whatever its capacity.
    assert ReplayMemory(10**6, (84, 84), 4).save(tmp_path / 'empty.npz') < 100_000
    assert len(ReplayMemory.load(tmp_path / 'empty.npz')) == 0


def test_every_save_logs_where_how_big_and_how_long(tmp_path, caplog):
    mem = filled()
    path = tmp_path / 'mem.npz'
    with caplog.at_level(logging.INFO, logger='expreplay'):
        size = mem.save(path)
    [message] = [r.getMessage() for r in caplog.records if r.name.startswith('expreplay')]
    assert str(path) in message
    assert f"{size / 1024:.2f} KB" in message
    assert f"{len(mem)} transitions" in message
    assert ' s.' in message and ' in ' in message


# ------------------------------------------------------------------------------ damaged files
def test_checkpoint_error_is_a_value_error_exported_by_the_package():
    assert expreplay.CheckpointError is CheckpointError
    assert issubclass(CheckpointError, ValueError)
    assert 'CheckpointError' in expreplay.__all__


def test_empty_and_truncated_files_raise_checkpoint_error_naming_the_path(tmp_path):
    mem = filled()
    path = tmp_path / 'mem.npz'
    mem.save(path)
    data = path.read_bytes()
    bad = tmp_path / 'bad.npz'
    bad.write_bytes(b'')
    with pytest.raises(CheckpointError, match=r"bad\.npz.*empty"):
        ReplayMemory.load(bad)
    cuts = sorted(set(np.linspace(1, len(data) - 1, 60).astype(int)) | {len(data) - 1, 22, 100})
    for cut in cuts:
        bad.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=r"bad\.npz") as info:
            ReplayMemory.load(bad)
        assert str(bad) in str(info.value) and info.value.path == str(bad)


def test_flipped_bits_are_detected_or_harmless(tmp_path):
    """Any single flipped bit: CheckpointError, or (in bytes nothing reads, e.g. a zip
    timestamp) a memory identical to the saved one; never another exception or other data."""
    mem = filled()
    path = tmp_path / 'mem.npz'
    mem.save(path)
    data = bytearray(path.read_bytes())
    rng = np.random.default_rng(0)
    anywhere = set(rng.integers(0, len(data), 150).tolist())
    # The central directory, swept: most of its bytes are fields nothing checks (times,
    # attributes), so it counts for "detected or harmless" but not in the detection ratio,
    # which would otherwise move with the file's length.
    positions = sorted(anywhere | set(range(len(data) - 120, len(data), 3)))
    bad = tmp_path / 'bad.npz'
    detected = 0
    for pos in positions:
        flipped = bytearray(data)
        flipped[pos] ^= 1 << int(rng.integers(8))
        bad.write_bytes(bytes(flipped))
        try:
            loaded = ReplayMemory.load(bad)
        except CheckpointError as err:
            assert str(bad) in str(err)
            detected += pos in anywhere
        else:
            assert_same_memory(loaded, mem)
    assert detected > 0.8 * len(anywhere)


def test_flipped_version_fields_of_the_zip_headers_raise_checkpoint_error(tmp_path):
    """Every bit of the "version" fields of every zip header (central directory and local):
    zipfile refuses some with NotImplementedError ("zip file version 10.9"), which must reach
    the caller as CheckpointError like any other damage, or load the same memory."""
    mem = filled()
    path = tmp_path / 'mem.npz'
    mem.save(path)
    data = bytes(path.read_bytes())
    fields = []
    for signature, first in ((b'PK\x01\x02', 4), (b'PK\x03\x04', 4)):
        at = data.find(signature)
        while at >= 0:
            fields += range(at + first, at + first + (4 if signature == b'PK\x01\x02' else 2))
            at = data.find(signature, at + 4)
    assert len(fields) > 20
    bad = tmp_path / 'bad.npz'
    refused = 0
    for pos in fields:
        for bit in range(8):
            flipped = bytearray(data)
            flipped[pos] ^= 1 << bit
            bad.write_bytes(bytes(flipped))
            try:
                loaded = ReplayMemory.load(bad)
            except CheckpointError as err:
                assert str(bad) in str(err)
                refused += 1
            else:
                assert_same_memory(loaded, mem)
    assert refused > 0


# ------------------------------------------------------------------------------ crafted files
DROP = object()   # rewrite(meta_key=DROP): remove the key from the metadata


def rewrite(path, out, **changes):
    """Rewrite a checkpoint with numpy (as a user would), changing tables or metadata."""
    import json
    with np.load(path) as archive:
        tables = {name: archive[name] for name in archive.files}
    meta = json.loads(bytes(tables['meta']).decode())
    for key, value in changes.items():
        if key.startswith('meta_') and value is DROP:
            del meta[key[5:]]
        elif key.startswith('meta_'):
            meta[key[5:]] = value
        elif value is None:
            del tables[key]
        else:
            tables[key] = value(tables[key].copy()) if callable(value) else value
    tables['meta'] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(out, **tables)
    return out


def test_a_rewritten_but_unchanged_checkpoint_loads(tmp_path):
    mem = filled()
    mem.save(tmp_path / 'mem.npz')
    assert_same_memory(ReplayMemory.load(rewrite(tmp_path / 'mem.npz', tmp_path / 'same.npz')), mem)


def _all_valid(flags):
    return flags | np.uint8(1 | 8)


@pytest.mark.parametrize('changes, match', [
    # Every written slot marked valid (the count fixed up so that it agrees).
    (dict(flags=_all_valid, meta_num_valid='ALL'), 'valid'),
    (dict(meta_num_valid=3), r'slots are marked valid, the metadata says 3'),
    (dict(block_fill=lambda f: np.where(f > 0, f + 1, f)), 'block_fill|shape'),
    (dict(block_fill=lambda f: np.where(f > 0, 99, f)), 'block_fill'),
    (dict(retired=lambda r: np.concatenate([r, r[:1]])), 'retired|partition'),
    (dict(free=lambda f: np.arange(3)), 'partition|free'),
    (dict(retired=lambda r: r[::-1].copy()), 'chain|eviction order'),
    (dict(block_prev=lambda p: np.where(p >= 0, (p + 1) % len(p), p)), 'chain|link|prev'),
    (dict(block_prev_intact=lambda i: ~i), 'intact|history'),
    (dict(epstep=lambda e: e + (np.arange(len(e), dtype=np.int32) % 2)), 'episode|consecutive'),
    (dict(flags=lambda f: f | np.uint8(64)), 'unknown slot flags'),
    (dict(block_state=lambda s: np.full_like(s, 1)), 'block_state'),
    (dict(frames=lambda f: f[:-1]), "table 'frames' holds"),
    (dict(reward=lambda r: r.astype(np.float64)), "table 'reward' holds float64"),
    (dict(action=None), "no table 'action'"),
    (dict(extra=np.zeros(3)), 'unexpected entries'),
    (dict(meta_max_size='120'), 'max_size must be an integer'),
    (dict(meta_max_size=10**15), 'block_fill|max_size'),
    (dict(meta_state_shape='44'), 'state_shape'),
    (dict(meta_dtype=None), 'dtype'),
    (dict(meta_block_size=10**6), 'block_size'),
    (dict(meta_version=99), 'unsupported checkpoint format version 99'),
    (dict(meta_num_steps_written=-1), 'num_steps_written'),
])
def test_crafted_checkpoints_are_refused_before_use(tmp_path, changes, match):
    mem = filled()
    path = tmp_path / 'mem.npz'
    mem.save(path)
    if changes.get('meta_num_valid') == 'ALL':
        changes['meta_num_valid'] = int(mem.ring.block_fill.sum())
    bad = rewrite(path, tmp_path / 'crafted.npz', **changes)
    with pytest.raises(CheckpointError, match=match) as info:
        ReplayMemory.load(bad)
    assert str(bad) in str(info.value)


def test_a_file_that_is_not_a_checkpoint_is_refused(tmp_path):
    np.savez(tmp_path / 'other.npz', x=np.zeros(3))
    with pytest.raises(CheckpointError, match='no metadata'):
        ReplayMemory.load(tmp_path / 'other.npz')
    (tmp_path / 'text.npz').write_text('hello')
    with pytest.raises(CheckpointError, match='not a readable ReplayMemory checkpoint'):
        ReplayMemory.load(tmp_path / 'text.npz')
    with pytest.raises(FileNotFoundError):
        ReplayMemory.load(tmp_path / 'missing.npz')


def test_active_writers_blocks_are_saved_retired_and_loaded_consistent(tmp_path):
    """Saving with writers attached (mid-episode) gives a checkpoint that passes every check."""
    mem = filled(close=False)
    mem.save(tmp_path / 'mem.npz')
    loaded = ReplayMemory.load(tmp_path / 'mem.npz')
    assert len(loaded) == len(mem)
    w = loaded.new_writer()
    w.start_episode(np.ones(FRAME_SHAPE, np.uint8))
    for _ in range(300):                       # wraps around: every old block is evicted
        w.add_step(0, 0.0, np.ones(FRAME_SHAPE, np.uint8))
    assert len(loaded) > 0


def test_load_checks_the_expected_configuration_like_the_constructor(tmp_path):
    mem = filled()
    mem.save(tmp_path / 'mem.npz')
    with pytest.raises(TypeError, match='state_shape'):
        ReplayMemory.load(tmp_path / 'mem.npz', state_shape='44')
    with pytest.raises(ValueError, match='history_len'):
        ReplayMemory.load(tmp_path / 'mem.npz', history_len=4.5)
    assert len(ReplayMemory.load(tmp_path / 'mem.npz', max_size=120.0, state_shape=[4, 4])) == len(mem)


def test_a_new_table_is_one_registry_entry_and_old_files_still_load(tmp_path, monkeypatch):
    """How a later version adds a per-slot table (as version 3 added priorities): an entry in
    the ring's TABLES and a version bump; files of the previous version load, the new table
    at its initial value."""
    from expreplay.storage import checkpoint as _checkpoint
    from expreplay.storage import ring as ring_module

    class VisitedMemory(ReplayMemory):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.ring.visits = np.ones(self.num_slots, np.float32)

    rng = np.random.default_rng(0)
    old = VisitedMemory(120, FRAME_SHAPE, 4, block_size=8)
    for w in write_random_stream(old, 3, 200, rng, StreamModel())[0]:
        w.close()
    old.save(tmp_path / 'now.npz')                      # written by today's format

    current = _checkpoint.VERSION
    monkeypatch.setattr(_checkpoint, 'VERSION', current + 1)
    monkeypatch.setitem(ring_module.TABLES, 'visits', 'slot')
    monkeypatch.setattr(_checkpoint, 'MISSING_IN_OLD_VERSIONS',
                        {**_checkpoint.MISSING_IN_OLD_VERSIONS, current: ('visits',)})
    mem = VisitedMemory.load(tmp_path / 'now.npz')
    assert_same_memory(mem, old)
    assert (mem.ring.visits == 1).all()
    written = np.flatnonzero(mem.ring.flags & 1)
    mem.ring.visits[written] = np.arange(len(written), dtype=np.float32)
    mem.save(tmp_path / 'next.npz')
    again = VisitedMemory.load(tmp_path / 'next.npz')
    np.testing.assert_array_equal(again.ring.visits[written], np.arange(len(written)))
    with np.load(tmp_path / 'next.npz') as archive:
        assert archive['visits'].shape == (int(mem.ring.block_fill.sum()),)   # written slots only


@pytest.mark.slow   # a concurrency stress run: long by design
def test_saves_taken_while_writers_run_hold_exactly_the_written_transitions(tmp_path):
    """Four writer threads and a sampler run while checkpoints are taken; each checkpoint
    loads (every table consistent) and every transition in it is a step that was written:
    consecutive frames of one episode, its action and reward, its next frame."""
    mem = ReplayMemory(400, FRAME_SHAPE, 3, block_size=8)
    stop = threading.Event()
    errors = []

    def write(lane):
        try:
            w = mem.new_writer()
            rng = np.random.default_rng(lane)
            for ep in range(10**9):
                length = int(rng.integers(1, 30))
                w.start_episode(encode(lane, ep, 0))
                for t in range(length):
                    if stop.is_set():
                        return
                    w.add_step(action_of(lane, ep, t), reward_of(lane, ep, t), encode(lane, ep, t + 1),
                               terminated=t + 1 == length)
        except BaseException as err:      # reaches the test below
            errors.append(err)

    def sample():
        rng = np.random.default_rng(99)
        try:
            while not stop.is_set():
                if len(mem) >= 16:
                    mem.sample_batch(16, rng=rng)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=write, args=(lane,)) for lane in range(4)]
    threads.append(threading.Thread(target=sample))
    for t in threads:
        t.start()
    checked = 0
    try:
        for k in range(8):
            while mem.num_steps_written < 300 * (k + 1) and not errors:
                threading.Event().wait(0.001)
            mem.save(tmp_path / 'mem.npz')
            loaded = ReplayMemory.load(tmp_path / 'mem.npz')
            slots, frames, actions, rewards, is_over = all_valid_transitions(loaded)
            assert len(slots) == len(loaded) > 0
            for f, a, r, over in zip(frames, actions, rewards, is_over):
                ids = [decode(x) for x in f]
                lane, ep, t = ids[-2]
                assert ids[-1] == (lane, ep, t + 1)
                for back, got in enumerate(reversed(ids[:-1])):
                    assert got == ((lane, ep, t - back) if t - back >= 0 else None)
                assert (a, r) == (action_of(lane, ep, t), np.float32(reward_of(lane, ep, t)))
                checked += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[0]
    assert checked > 1000
