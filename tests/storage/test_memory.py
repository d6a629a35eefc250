"""ReplayMemory: every sampled value checked against the stream of steps that was written.

Frames encode who wrote them: ``(lane + 1, episode, t)`` as int32 in the first 12 bytes of a
uint8 frame, so any sampled frame says which step of which episode of which lane it is, and a
zero frame is the padding before an episode's first observation.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from expreplay import Experience, ReplayMemory

FRAME_SHAPE = (4, 4)  # 16 bytes: room for three int32 and a checksum


def encode(lane, episode, t, shape=FRAME_SHAPE, dtype=np.uint8):
    words = np.array([lane + 1, episode, t, (lane * 7919 + episode * 104729 + t * 31) % 2**31],
                     np.int32)
    frame = np.zeros(int(np.prod(shape)) * np.dtype(dtype).itemsize, np.uint8)
    frame[:16] = words.view(np.uint8)
    return frame.view(dtype).reshape(shape)


def decode(frame):
    """(lane, episode, t) of an encoded frame, or None for a zero frame."""
    words = np.ascontiguousarray(frame).reshape(-1).view(np.uint8)[:16].view(np.int32)
    if not words.any():
        return None
    lane, episode, t, check = (int(w) for w in words)
    lane -= 1
    assert check == (lane * 7919 + episode * 104729 + t * 31) % 2**31, "torn or corrupt frame"
    return lane, episode, t


def action_of(lane, episode, t):
    return (lane * 3 + episode * 5 + t) % 7


def reward_of(lane, episode, t):
    return float((lane + 2 * episode + 3 * t) % 11) - 5.0


class StreamModel:
    """What was written: per (lane, episode), the end kind and the number of steps."""

    def __init__(self):
        self.steps = {}       # (lane, episode) -> number of steps added so far
        self.ending = {}      # (lane, episode) -> 'terminated' | 'truncated' once ended
        self.slot_seq = {}    # (lane, episode, t) -> global write order of the frame t

    def check_transition(self, frames, action, reward, is_over, history_len):
        """Assert that one sampled transition is exactly a step that was written."""
        ids = [decode(f) for f in frames]
        cur = ids[history_len - 1]
        assert cur is not None, "the current frame is never padding"
        lane, ep, t = cur
        assert t < self.steps[(lane, ep)], "only steps whose action was taken are sampled"
        for k in range(history_len):
            expected = (lane, ep, t - k) if t - k >= 0 else None
            assert ids[history_len - 1 - k] == expected, f"history frame {k} back"
        assert ids[history_len] == (lane, ep, t + 1), "next frame is the true next observation"
        assert action == action_of(lane, ep, t)
        assert reward == np.float32(reward_of(lane, ep, t))
        last = t + 1 == self.steps[(lane, ep)] and (lane, ep) in self.ending
        assert bool(is_over) == (last and self.ending[(lane, ep)] == 'terminated')
        return lane, ep, t


def write_random_stream(mem, num_lanes, num_rounds, rng, model):
    """Round-robin over lanes; random episode lengths; random terminated/truncated ends.

    Returns the number of frames written (slots used), in write order recorded in ``model``.
    """
    writers = [mem.new_writer() for _ in range(num_lanes)]
    episode = [0] * num_lanes
    t = [None] * num_lanes          # current step of each lane, None between episodes
    length = [0] * num_lanes
    seq = 0                         # frames written so far, in write order
    for _ in range(num_rounds):
        for lane, w in enumerate(writers):
            seq += 1
            if t[lane] is None:
                episode[lane] += 1
                ep = episode[lane]
                length[lane] = int(rng.integers(1, 12))
                t[lane] = 0
                w.start_episode(encode(lane, ep, 0))
                model.steps[(lane, ep)] = 0
                model.slot_seq[(lane, ep, 0)] = seq
                continue
            ep, tt = episode[lane], t[lane]
            end = tt + 1 == length[lane]
            kind = str(rng.choice(['terminated', 'truncated'])) if end else None
            w.add_step(action_of(lane, ep, tt), reward_of(lane, ep, tt), encode(lane, ep, tt + 1),
                       terminated=kind == 'terminated', truncated=kind == 'truncated')
            model.steps[(lane, ep)] = tt + 1
            model.slot_seq[(lane, ep, tt + 1)] = seq
            if end:
                model.ending[(lane, ep)] = kind
                t[lane] = None
            else:
                t[lane] = tt + 1
    return writers, seq


def all_valid_transitions(mem):
    """Every sampleable transition, read through the same index path sampling uses."""
    slots = np.flatnonzero(mem.ring.flags & 1)
    idx = mem.ring.frame_index(slots)
    frames = mem.ring.frames[idx]
    is_over = (mem.ring.flags[slots] & 2) != 0
    return slots, frames, mem.ring.action[slots], mem.ring.reward[slots], is_over


@pytest.mark.parametrize('num_lanes,history_len,max_size,block_size', [
    (1, 4, 60, None),     # one lane, default blocks
    (3, 4, 97, 8),        # several lanes, odd size
    (5, 1, 64, 4),        # no history
    (4, 2, 50, 2),        # block_size == history_len: history crosses every block edge
    (2, 6, 200, 7),
])
def test_random_streams_every_value(num_lanes, history_len, max_size, block_size):
    rng = np.random.default_rng(num_lanes * 100 + history_len)
    mem = ReplayMemory(max_size, FRAME_SHAPE, history_len, block_size=block_size)
    model = StreamModel()
    # Write ~20x the memory size: the ring wraps around many times.
    writers, total = write_random_stream(mem, num_lanes, 20 * max_size // num_lanes, rng, model)

    slots, frames, actions, rewards, is_over = all_valid_transitions(mem)
    assert len(mem) == len(slots) > 0
    seen = set()
    for f, a, r, o in zip(frames, actions, rewards, is_over):
        seen.add(model.check_transition(f, a, r, o, history_len))

    # Recency: every step whose frames are all among the newest writes is still sampleable
    # (eviction is oldest-first; the slack covers the lanes' partly filled blocks).
    keep = mem.num_slots - 2 * (num_lanes + 1) * mem.block_size
    for (lane, ep), n in model.steps.items():
        for t in range(n):
            oldest = model.slot_seq[(lane, ep, max(0, t - history_len + 1))]
            if oldest > total - keep:
                assert (lane, ep, t) in seen, f"recent step {(lane, ep, t)} was lost"

    # Public sampling, both layouts, gives the same checked transitions.
    for layout in ('NHWC', 'NCHW'):
        n = min(256, len(mem))
        state, action, reward, over = mem.sample_batch(n, rng=rng, layout=layout)
        assert action.dtype == np.int32 and reward.dtype == np.float32 and over.dtype == bool
        if layout == 'NHWC':
            assert state.shape == (n,) + FRAME_SHAPE + (history_len + 1,)
            state = np.moveaxis(state, -1, 1)
        else:
            assert state.shape == (n, history_len + 1) + FRAME_SHAPE
        for f, a, r, o in zip(state, action, reward, over):
            model.check_transition(f, a, r, o, history_len)


def test_truncated_end_keeps_true_next_state_and_bootstraps():
    mem = ReplayMemory(20, (3,), 2, dtype='float32')
    w = mem.new_writer()
    w.start_episode(np.array([1, 1, 1], np.float32))
    w.add_step(0, 1.0, np.array([2, 2, 2], np.float32))
    w.add_step(1, 2.0, np.array([3, 3, 3], np.float32), truncated=True)
    w.start_episode(np.array([7, 7, 7], np.float32))
    w.add_step(2, 3.0, np.array([8, 8, 8], np.float32), terminated=True)
    slots, frames, actions, rewards, is_over = all_valid_transitions(mem)
    got = {int(a): (f[:, 0].tolist(), bool(o)) for f, a, o in zip(frames, actions, is_over)}
    assert got == {
        0: ([0, 1, 2], False),     # zero padding before the first frame
        1: ([1, 2, 3], False),     # truncated: next is the final observation, no isOver
        2: ([0, 7, 8], True),      # terminated; the new episode starts with reset's obs
    }


def test_step_is_sampleable_as_soon_as_add_step_returns():
    mem = ReplayMemory(50, (2,), 4)
    w = mem.new_writer()
    w.start_episode(np.array([1, 0], np.uint8))
    assert len(mem) == 0
    for t in range(1, 6):
        w.add_step(t, 0.0, np.array([t + 1, 0], np.uint8))
        assert len(mem) == t
        state, action, _, _ = mem.sample_batch(1, rng=np.random.default_rng(t))
        assert state.shape == (1, 2, 5)


def test_legacy_append_matches_tensorpack_convention():
    mem = ReplayMemory(30, (2,), 3)
    for i in range(4):
        mem.append(Experience(np.array([i + 1, 0], np.uint8), i, float(i), i == 3))
    mem.append(Experience(np.array([9, 0], np.uint8), 5, 5.0, False))
    slots, frames, actions, rewards, is_over = all_valid_transitions(mem)
    got = {int(a): (f[:, 0].tolist(), bool(o)) for f, a, o in zip(frames, actions, is_over)}
    # Step 3 ended the episode: its next frame is unknown in this API and stored as zeros.
    # The step appended last waits for the next append to learn its next state.
    assert got == {0: ([0, 0, 1, 2], False), 1: ([0, 1, 2, 3], False),
                   2: ([1, 2, 3, 4], False), 3: ([2, 3, 4, 0], True)}


def test_uniform_over_valid_transitions():
    mem = ReplayMemory(40, (2,), 2, block_size=4)
    w = mem.new_writer()
    for ep in range(6):
        w.start_episode(np.array([ep + 1, 0], np.uint8))
        for t in range(5):
            w.add_step(ep * 10 + t, 0.0, np.array([ep + 1, t + 1], np.uint8), terminated=t == 4)
    valid_actions = sorted(int(a) for a in all_valid_transitions(mem)[2])
    rng = np.random.default_rng(0)
    draws = np.concatenate([mem.sample_batch(len(mem), rng=rng)[1] for _ in range(3000)])
    values, counts = np.unique(draws, return_counts=True)
    assert sorted(values.tolist()) == valid_actions
    expected = len(draws) / len(valid_actions)
    # Binomial standard deviation; 5 sigma keeps the test stable and still catches a skew.
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))


def test_sampling_too_early_says_how_many():
    mem = ReplayMemory(100, (2,), 4)
    w = mem.new_writer()
    w.start_episode(np.zeros(2, np.uint8))
    w.add_step(0, 0.0, np.zeros(2, np.uint8))
    with pytest.raises(ValueError, match=r"holds 1 valid transitions and needs at least 32"):
        mem.sample_batch(32)


@pytest.mark.parametrize('kwargs,exc,match', [
    (dict(history_len=0), ValueError, 'history_len'),
    (dict(history_len=2.5), ValueError, 'history_len'),   # a fraction (1e6 is a size)
    (dict(max_size=4, history_len=4), ValueError, 'max_size'),
    (dict(state_shape=(1, 2, 3, 4)), ValueError, 'state_shape'),
    (dict(dtype='U3'), TypeError, 'dtype'),
    (dict(block_size=2, history_len=4), ValueError, 'block_size'),
])
def test_bad_constructor_arguments(kwargs, exc, match):
    args = dict(max_size=100, state_shape=(84, 84), history_len=4)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        ReplayMemory(**args)


def test_bad_step_input_names_the_argument_and_changes_nothing():
    mem = ReplayMemory(100, (2, 3), 2)
    w = mem.new_writer()
    good = np.zeros((2, 3), np.uint8)
    with pytest.raises(RuntimeError, match='start_episode'):
        w.add_step(0, 0.0, good)
    with pytest.raises(ValueError, match=r'obs has shape \(3, 2\)'):
        w.start_episode(np.zeros((3, 2), np.uint8))
    with pytest.raises(TypeError, match='obs has dtype float64'):
        w.start_episode(np.zeros((2, 3)))
    with pytest.raises(ValueError, match='do not fit'):
        w.start_episode(np.full((2, 3), 300))
    w.start_episode(np.full((2, 3), 200))          # python ints that fit are fine
    with pytest.raises(ValueError, match='reward must be finite'):
        w.add_step(0, float('nan'), good)
    with pytest.raises(TypeError, match='action must be an integer'):
        w.add_step(1.5, 0.0, good)
    with pytest.raises(TypeError, match='action must be an integer'):
        w.add_step(True, 0.0, good)
    with pytest.raises(ValueError, match=r'next_obs has shape'):
        w.add_step(0, 0.0, np.zeros(6, np.uint8))
    assert len(mem) == 0
    w.add_step(np.int64(1), np.float32(1.5), good)
    assert len(mem) == 1
    with pytest.raises(ValueError, match='layout'):
        mem.sample_batch(1, layout='NCWH')
    with pytest.raises(ValueError, match='exp.state has shape'):
        mem.append(Experience(np.zeros(3, np.uint8), 0, 0.0, False))


@pytest.mark.parametrize('src', [np.float32, np.float64])
def test_a_float16_memory_refuses_wider_floats_naming_the_argument_and_the_fix(src):
    """float16 keeps 3 significant digits: wider float observations would be rounded silently,
    so they are refused as int32 values are by a uint8 memory; float16 ones are stored."""
    mem = ReplayMemory(100, (4,), 2, 'float16')
    w = mem.new_writer()
    fix = r"would round to 3 significant digits: store it in a memory of dtype='float32'"
    with pytest.raises(TypeError, match=rf"obs has dtype {np.dtype(src)}, which a float16 memory {fix}"):
        w.start_episode(np.full(4, 0.1, src))
    w.start_episode(np.full(4, 0.1, np.float16))
    with pytest.raises(TypeError, match=rf'next_obs has dtype {np.dtype(src)}.*{fix}'):
        w.add_step(0, 0.0, np.full(4, 0.2, src))
    bw = mem.new_batch_writer(1)
    with pytest.raises(TypeError, match=rf'frames has dtype {np.dtype(src)}.*{fix}'):
        bw.start_episodes([0], np.full((1, 4), 0.1, src))
    w.add_step(0, 0.0, np.full(4, 0.2, np.float16))
    assert len(mem) == 1
    # float64 into float32 is what a float32 memory is for.
    ReplayMemory(100, (4,), 2, 'float32').new_writer().start_episode(np.full(4, 0.1))


def test_state_ranks_and_dtypes():
    for shape, dtype in [((5,), np.float32), ((3, 4), np.int16), ((6, 5, 3), np.uint8)]:
        mem = ReplayMemory(30, shape, 3, dtype=dtype)
        w = mem.new_writer()
        w.start_episode(encode(0, 1, 0, shape, dtype) if np.prod(shape) * np.dtype(dtype).itemsize >= 16
                        else np.ones(shape, dtype))
        for t in range(4):
            w.add_step(t, 0.0, np.full(shape, t + 2, dtype))
        state, *_ = mem.sample_batch(4)
        assert state.shape == (4,) + shape + (4,) and state.dtype == dtype
        state, *_ = mem.sample_batch(4, layout='NCHW')
        assert state.shape == (4, 4) + shape


def test_many_writers_without_declaring_a_count():
    mem = ReplayMemory(1000, (2,), 4)
    writers = [mem.new_writer() for _ in range(mem.num_blocks)]
    for w in writers:
        w.start_episode(np.ones(2, np.uint8))
        w.add_step(0, 0.0, np.ones(2, np.uint8))
    assert len(mem) == len(writers)
    extra = mem.new_writer()
    with pytest.raises(RuntimeError, match='too many writers'):
        extra.start_episode(np.ones(2, np.uint8))
    writers[0].close()
    extra.start_episode(np.ones(2, np.uint8))   # the closed writer's block can be evicted now


def test_lazy_allocation_of_a_large_memory():
    # 1M Atari frames would be ~7 GB if touched; the pages must only be mapped, not committed.
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    mem = ReplayMemory(1_000_000, (84, 84), 4)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert (after - before) * 1024 < 200e6
    per_step = sum(a.nbytes for a in (mem.ring.frames, mem.ring.action, mem.ring.reward, mem.ring.epstep, mem.ring.flags)) / mem.max_size
    assert per_step <= 84 * 84 + 32


# ---------------------------------------------------------------------------- concurrency
def test_concurrent_writers_and_sampler_never_mix_frames():
    """Writers wrap the ring many times while a sampler checks every value it gets."""
    num_lanes, history_len = 4, 4
    mem = ReplayMemory(400, FRAME_SHAPE, history_len, block_size=16)
    stop = threading.Event()
    errors = []
    steps_target = 6000      # per lane: the ring wraps ~60 times
    episode_len = {}
    written_by_lane = [0] * num_lanes

    def writer(lane):
        try:
            w = mem.new_writer()
            rng = np.random.default_rng(lane)
            ep = 0
            written = 0
            while written < steps_target and not stop.is_set():
                ep += 1
                n = int(rng.integers(1, 15))
                episode_len[(lane, ep)] = n
                w.start_episode(encode(lane, ep, 0))
                for t in range(n):
                    w.add_step(action_of(lane, ep, t), reward_of(lane, ep, t), encode(lane, ep, t + 1),
                               terminated=(t + 1 == n and ep % 2 == 0), truncated=(t + 1 == n and ep % 2 == 1))
                    written += 1
            written_by_lane[lane] = written
            w.close()
        except BaseException as err:   # reported to the main thread
            errors.append(err)

    checked = [0]

    def sampler():
        rng = np.random.default_rng(99)
        try:
            while not stop.is_set():
                if len(mem) < 32:
                    continue
                state, action, reward, over = mem.sample_batch(32, rng=rng, layout='NCHW')
                for f, a, r, o in zip(state, action, reward, over):
                    ids = [decode(x) for x in f]
                    lane, ep, t = ids[history_len - 1]
                    for k in range(history_len):
                        assert ids[history_len - 1 - k] == ((lane, ep, t - k) if t >= k else None)
                    assert ids[history_len] == (lane, ep, t + 1)
                    assert a == action_of(lane, ep, t) and r == np.float32(reward_of(lane, ep, t))
                    n = episode_len[(lane, ep)]
                    assert bool(o) == (t + 1 == n and ep % 2 == 0)
                    checked[0] += 1
        except BaseException as err:
            errors.append(err)
            stop.set()

    writers = [threading.Thread(target=writer, args=(i,)) for i in range(num_lanes)]
    sampler_thread = threading.Thread(target=sampler)
    sampler_thread.start()
    for t in writers:
        t.start()
    for t in writers:
        t.join(timeout=60)
    stop.set()
    sampler_thread.join(timeout=10)
    assert not any(t.is_alive() for t in writers + [sampler_thread])
    assert not errors, errors[0]
    assert checked[0] > 1000
    assert mem.num_steps_written == sum(written_by_lane) >= num_lanes * steps_target


# ---------------------------------------------------------------------------- checkpoints
def _filled_memory(seed=0):
    rng = np.random.default_rng(seed)
    mem = ReplayMemory(120, FRAME_SHAPE, 4, block_size=8)
    writers, _ = write_random_stream(mem, 3, 200, rng, StreamModel())
    return mem, writers


def assert_same_tables(loaded, mem):
    """Every table of the checkpoint equal; slot tables compared on the written slots (the
    checkpoint holds those only: the rest is stale data of evicted blocks, never read)."""
    written = np.concatenate([np.arange(b * mem.block_size, b * mem.block_size + n)
                              for b, n in enumerate(mem.ring.block_fill) if n] or [np.zeros(0, int)])
    assert loaded.ring.table_names() == mem.ring.table_names()
    for (name, a, kind), (_, b, _) in zip(loaded.ring.tables(), mem.ring.tables()):
        if kind == 'slot':
            a, b = a[written], b[written]
        elif kind == 'queue':
            a, b = list(a), list(b)
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_save_load_round_trip_is_bit_identical(tmp_path):
    mem, writers = _filled_memory()
    for w in writers:
        w.close()     # the checkpoint retires active blocks; closing first makes both equal
    path = tmp_path / 'mem.npz'
    mem.save(path)
    loaded = ReplayMemory.load(path, max_size=120, state_shape=FRAME_SHAPE, history_len=4, dtype='uint8')
    assert_same_tables(loaded, mem)
    assert len(loaded) == len(mem) and loaded.num_steps_written == mem.num_steps_written
    a = mem.sample_batch(64, rng=np.random.default_rng(5))
    b = loaded.sample_batch(64, rng=np.random.default_rng(5))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    # The loaded memory takes new writers; the old lanes' blocks are evicted in order.
    w = loaded.new_writer()
    for ep in range(50):
        w.start_episode(encode(9, ep, 0))
        w.add_step(action_of(9, ep, 0), reward_of(9, ep, 0), encode(9, ep, 1), terminated=True)
    assert len(loaded) > 0


def test_load_refuses_other_configuration(tmp_path):
    mem, _ = _filled_memory()
    path = tmp_path / 'mem.npz'
    mem.save(path)
    with pytest.raises(ValueError, match=r'state_shape: checkpoint has \(4, 4\), expected \(84, 84\)'):
        ReplayMemory.load(path, state_shape=(84, 84))
    with pytest.raises(ValueError, match='dtype'):
        ReplayMemory.load(path, dtype='float32')
    (tmp_path / 'junk.npz').write_bytes(b'not a checkpoint')
    with pytest.raises(ValueError, match='not a readable ReplayMemory checkpoint'):
        ReplayMemory.load(tmp_path / 'junk.npz')


def test_save_killed_halfway_leaves_previous_checkpoint(tmp_path):
    mem, _ = _filled_memory()
    path = tmp_path / 'mem.npz'
    mem.save(path)
    before = path.read_bytes()
    # A child process loads the checkpoint, changes the memory and starts saving it over the
    # same path, then is killed by SIGKILL in the middle of writing the frames table.
    child = textwrap.dedent(f"""
        import os, signal, zipfile, numpy as np
        from expreplay import ReplayMemory
        mem = ReplayMemory.load({str(path)!r})
        w = mem.new_writer()
        w.start_episode(np.ones((4, 4), np.uint8))
        w.add_step(0, 0.0, np.ones((4, 4), np.uint8))
        real = zipfile._ZipWriteFile.write
        def dying_write(self, data):
            if self._zinfo.filename == 'frames.npy' and self._file_size > 0:
                real(self, bytes(data)[:len(data) // 2])   # half a block of frames, then die
                self._fileobj.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return real(self, data)
        zipfile._ZipWriteFile.write = dying_write
        mem.save({str(path)!r})
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, '-c', child], env=env, capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith('mem.npz.tmp')]
    assert leftovers, "the child should have died while writing its temporary file"
    assert path.read_bytes() == before
    loaded = ReplayMemory.load(path)
    np.testing.assert_array_equal(loaded.ring.frames, mem.ring.frames)
    assert len(loaded) == len(mem)


def test_episodes_yields_exactly_the_complete_stored_episodes():
    rng = np.random.default_rng(3)
    mem = ReplayMemory(150, FRAME_SHAPE, 4, block_size=8)
    model = StreamModel()
    writers, total = write_random_stream(mem, 3, 400, rng, model)
    seen = set()
    for ep in mem.episodes():
        n = len(ep['actions'])
        assert ep['observations'].shape == (n + 1,) + FRAME_SHAPE
        ids = [decode(f) for f in ep['observations']]
        lane, episode, t0 = ids[0]
        assert t0 == 0 and ids == [(lane, episode, t) for t in range(n + 1)]
        assert model.steps[(lane, episode)] == n and (lane, episode) in model.ending
        assert ep['actions'].tolist() == [action_of(lane, episode, t) for t in range(n)]
        assert ep['rewards'].tolist() == [reward_of(lane, episode, t) for t in range(n)]
        kind = model.ending[(lane, episode)]
        assert ep['terminations'].tolist() == [False] * (n - 1) + [kind == 'terminated']
        assert ep['truncations'].tolist() == [False] * (n - 1) + [kind == 'truncated']
        seen.add((lane, episode))
    # Every ended episode whose first frame is among the recent writes is reported.
    keep = mem.num_slots - 2 * (3 + 1) * mem.block_size
    recent = {k for k in model.ending if model.slot_seq[(k[0], k[1], 0)] > total - keep}
    assert recent and recent <= seen


# ------------------------------------------------------------------------------- batch writer
def write_batched_stream(mem, num_lanes, num_calls, rng, model, lane_offset=0):
    """Like write_random_stream through one BatchWriter: each call writes a random subset of
    the lanes (starts and steps in the same call, as a runner does), random episode lengths
    and ends. Frames and the model name lane ``j`` as ``lane_offset + j``. Returns the number
    of frames written."""
    bw = mem.new_batch_writer(num_lanes)
    episode = [0] * num_lanes
    t = [None] * num_lanes
    length = [0] * num_lanes
    written = 0
    for _ in range(num_calls):
        lanes = np.flatnonzero(rng.random(num_lanes) < 0.7)
        starting = [lane for lane in lanes if t[lane] is None]
        stepping = [lane for lane in lanes if t[lane] is not None]
        if stepping:
            acts, rews, frames, terms, truncs = [], [], [], [], []
            for lane in stepping:
                ep, tt, name = episode[lane], t[lane], lane + lane_offset
                end = tt + 1 == length[lane]
                kind = str(rng.choice(['terminated', 'truncated'])) if end else None
                acts.append(action_of(name, ep, tt))
                rews.append(reward_of(name, ep, tt))
                frames.append(encode(name, ep, tt + 1))
                terms.append(kind == 'terminated')
                truncs.append(kind == 'truncated')
                model.steps[(name, ep)] = tt + 1
                if end:
                    model.ending[(name, ep)] = kind
                    t[lane] = None
                else:
                    t[lane] = tt + 1
            bw.add_steps(np.array(stepping), np.array(acts), np.array(rews), np.stack(frames),
                         np.array(terms), np.array(truncs))
            written += len(stepping)
        if starting:
            for lane in starting:
                episode[lane] += 1
                length[lane] = int(rng.integers(1, 12))
                t[lane] = 0
                model.steps[(lane + lane_offset, episode[lane])] = 0
            bw.start_episodes(np.array(starting), np.stack(
                [encode(lane + lane_offset, episode[lane], 0) for lane in starting]))
            written += len(starting)
    bw.close()
    return written


@pytest.mark.parametrize('num_lanes,history_len,max_size,block_size', [
    (1, 4, 60, None), (6, 4, 300, 8), (5, 1, 128, 4), (8, 2, 200, 2), (3, 6, 400, 7),
])
def test_batch_writer_random_subsets_every_value(num_lanes, history_len, max_size, block_size):
    rng = np.random.default_rng(num_lanes * 10 + history_len)
    mem = ReplayMemory(max_size, FRAME_SHAPE, history_len, block_size=block_size)
    model = StreamModel()
    written = write_batched_stream(mem, num_lanes, 20 * max_size // num_lanes, rng, model)
    assert written > 10 * mem.num_slots        # the ring wrapped around many times
    slots, frames, actions, rewards, is_over = all_valid_transitions(mem)
    assert len(mem) == len(slots) > 0
    for f, a, r, o in zip(frames, actions, rewards, is_over):
        model.check_transition(f, a, r, o, history_len)
    # Sampling agrees with the tables: every sampled transition is a written step.
    for comb, act, rew, over in zip(*mem.sample_batch(min(256, len(mem)), rng=rng, layout='NCHW')):
        model.check_transition(comb, act, rew, over, history_len)


@pytest.mark.slow   # a concurrency stress run: long by design
def test_batch_writers_with_a_concurrent_sampler_never_mix_frames():
    """Four batch writers in threads, a sampler checking every sampled value meanwhile."""
    history_len = 3
    mem = ReplayMemory(3000, FRAME_SHAPE, history_len, block_size=16)
    models = [StreamModel() for _ in range(4)]
    errors, stop, sampled = [], threading.Event(), []

    def writer(k):
        try:
            write_batched_stream(mem, 6, 1000, np.random.default_rng(k), models[k], lane_offset=10 * k)
        except Exception as err:   # pragma: no cover - reported below
            errors.append(err)

    def sampler():
        rng = np.random.default_rng(99)
        while not stop.is_set():
            if len(mem) >= 64:
                sampled.append(mem.sample_batch(64, rng=rng, layout='NCHW'))
            stop.wait(0.0002)   # pace, as a learner does: an unpaced loop starves the writers

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    s = threading.Thread(target=sampler)
    s.start()
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    stop.set()
    s.join(60)
    assert not errors, errors
    merged = StreamModel()
    for m in models:
        merged.steps.update(m.steps)
        merged.ending.update(m.ending)
    # Checked against the final model: it knows every step written, also after the sample.
    checked = 0
    for batch in sampled:
        for comb, act, rew, over in zip(*batch):
            merged.check_transition(comb, act, rew, over, history_len)
            checked += 1
    assert checked >= 640


@pytest.mark.slow   # a concurrency stress run: long by design
def test_a_block_change_never_publishes_into_an_evicted_block():
    """Writers in threads on a memory with barely more blocks than writers, and a sampler
    holding the lock often, so that a lane's previous block is now and then evicted between its
    change of block and the publish of the step taken from that block's last slot: that step
    must be dropped, never written into the block's new owner. Every sampled and every valid
    transition is checked."""
    history_len = 4
    num_lanes = 4
    mem = ReplayMemory(7 * 16, FRAME_SHAPE, history_len, block_size=16)   # 7 blocks, 4 writers
    models = [StreamModel() for _ in range(num_lanes)]
    errors, stop, sampled = [], threading.Event(), []

    def writer(k):
        try:
            write_batched_stream(mem, 1, 6000, np.random.default_rng(k), models[k], lane_offset=k)
        except Exception as err:   # pragma: no cover - reported below
            errors.append(err)

    def sampler():
        rng = np.random.default_rng(7)
        while not stop.is_set():
            if len(mem) >= 16:
                sampled.append(mem.sample_batch(16, rng=rng, layout='NCHW'))
            stop.wait(0.0002)   # pace, as a learner does: an unpaced loop starves the writers

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(num_lanes)]
    s = threading.Thread(target=sampler)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)      # switch threads often: races show up
    try:
        s.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        stop.set()
        s.join(60)
        sys.setswitchinterval(interval)
    assert not errors, errors
    merged = StreamModel()
    for m in models:
        merged.steps.update(m.steps)
        merged.ending.update(m.ending)
    for batch in sampled:
        for comb, act, rew, over in zip(*batch):
            merged.check_transition(comb, act, rew, over, history_len)
    slots, frames, actions, rewards, is_over = all_valid_transitions(mem)
    assert len(slots) > 0 and len(sampled) > 50
    for f, a, r, o in zip(frames, actions, rewards, is_over):
        merged.check_transition(f, a, r, o, history_len)
