"""Extra per-step fields: ``ReplayMemory(extra_fields=...)``.

Each step's extras are a function of the step's identity (lane, episode, t), which the frames
encode; every sampled transition's extras are checked against that reference, after the ring
wrapped around many times, through every write path (LaneWriter, BatchWriter with random lane
subsets, the C kernel's common step), uniform and prioritized, 1-step and n-step.
"""

import numpy as np
import pytest

import expreplay.storage.memory
from expreplay import CheckpointError, ReplayMemory
from kernel_paths import PATHS, kernel_path
from test_memory import FRAME_SHAPE, StreamModel, action_of, decode, encode, reward_of

FIELDS = {'lives': 'int8', 'segment': 'int32', 'score': 'float32', 'flag': 'bool'}


def extras_of(lane, episode, t):
    return {'lives': (lane + episode + t) % 5 - 2, 'segment': lane * 100000 + episode * 100 + t,
            'score': (lane - t) * 0.25, 'flag': (lane + t) % 3 == 0}


def check_batch_extras(mem, batch, layout='NHWC'):
    """Every row's extras are those written with the step taken from its state."""
    frames = batch.state[..., -1] if layout == 'NHWC' else batch.state[:, -1]
    assert set(batch.extras) == set(mem.extra_fields)
    for name, dtype in mem.extra_fields.items():
        assert batch.extras[name].dtype == dtype and batch.extras[name].shape == (len(frames),)
    for row, frame in enumerate(frames):
        lane, ep, t = decode(frame)
        want = extras_of(lane, ep, t)
        for name, values in batch.extras.items():
            assert values[row] == np.asarray(want[name], mem.extra_fields[name]), (name, row)
    return len(frames)


def write_lanes(mem, num_lanes, rounds, rng):
    """LaneWriters, round robin, random lengths and ends, every step with its extras."""
    model = StreamModel()
    writers = [mem.new_writer() for _ in range(num_lanes)]
    ep, t, length = [0] * num_lanes, [None] * num_lanes, [0] * num_lanes
    for _ in range(rounds):
        for lane, w in enumerate(writers):
            if t[lane] is None:
                ep[lane] += 1
                t[lane], length[lane] = 0, int(rng.integers(1, 12))
                w.start_episode(encode(lane, ep[lane], 0))
                model.steps[(lane, ep[lane])] = 0
                continue
            e, tt = ep[lane], t[lane]
            end = tt + 1 == length[lane]
            kind = str(rng.choice(['terminated', 'truncated'])) if end else None
            w.add_step(action_of(lane, e, tt), reward_of(lane, e, tt), encode(lane, e, tt + 1),
                       terminated=kind == 'terminated', truncated=kind == 'truncated',
                       extras=extras_of(lane, e, tt))
            model.steps[(lane, e)] = tt + 1
            if end:
                model.ending[(lane, e)] = kind
                t[lane] = None
            else:
                t[lane] = tt + 1
    return model


def write_batches(mem, num_lanes, calls, rng, fast=False):
    """One BatchWriter: random lane subsets, starts and steps in one call, extras as arrays.
    ``fast``: every call that can goes through try_add_steps (the C kernel), as the acting
    path does. Returns the number of calls the kernel took."""
    bw = mem.new_batch_writer(num_lanes)
    ep, t, length = [0] * num_lanes, [None] * num_lanes, [0] * num_lanes
    kernel_calls = 0
    for _ in range(calls):
        lanes = np.arange(num_lanes) if fast else np.flatnonzero(rng.random(num_lanes) < 0.7)
        starting = [j for j in lanes if t[j] is None]
        stepping = [j for j in lanes if t[j] is not None]
        if stepping:
            rows = []
            for j in stepping:
                e, tt = ep[j], t[j]
                end = tt + 1 == length[j]
                kind = str(rng.choice(['terminated', 'truncated'])) if end else None
                rows.append((action_of(j, e, tt), reward_of(j, e, tt), encode(j, e, tt + 1),
                             kind == 'terminated', kind == 'truncated', extras_of(j, e, tt)))
                t[j] = None if end else tt + 1
            acts, rews, frames, terms, truncs, ext = zip(*rows)
            extras = {name: np.array([x[name] for x in ext], FIELDS[name]) for name in FIELDS}
            args = (np.array(stepping, np.int64), np.array(acts, np.int64),
                    np.array(rews, np.float64), np.stack(frames), np.array(terms),
                    np.array(truncs))
            if fast and bw.try_add_steps(*args, extras=extras):
                kernel_calls += 1
            else:
                bw.add_steps(*args, extras=extras)
        if starting:
            for j in starting:
                ep[j] += 1
                t[j], length[j] = 0, int(rng.integers(1, 40 if fast else 12))
            frames = np.stack([encode(j, ep[j], 0) for j in starting])
            bw.start_episodes(np.array(starting), frames)
    bw.close()
    return kernel_calls


def check_every_valid_slot(mem):
    slots = np.flatnonzero(mem.ring.flags & 1)
    assert len(slots) == len(mem) > 0
    for slot in slots:
        want = extras_of(*decode(mem.ring.frames[slot]))
        for name, arr in mem.ring.extras.items():
            assert arr[slot] == np.asarray(want[name], arr.dtype), (name, slot)


@pytest.mark.parametrize('prioritized', [False, True])
@pytest.mark.parametrize('num_lanes, history_len, max_size, block_size', [
    (1, 4, 60, None), (3, 4, 97, 8), (4, 2, 50, 2), (5, 1, 64, 4)])
def test_lane_writers_extras_in_every_sample(prioritized, num_lanes, history_len, max_size,
                                             block_size):
    rng = np.random.default_rng(num_lanes * 10 + history_len)
    mem = ReplayMemory(max_size, FRAME_SHAPE, history_len, block_size=block_size,
                       extra_fields=FIELDS, prioritized=prioritized)
    write_lanes(mem, num_lanes, 20 * max_size // num_lanes, rng)
    assert mem.num_steps_written > 10 * mem.num_slots          # wrapped around many times
    check_every_valid_slot(mem)
    for n_step in (1, 3):
        for layout in ('NHWC', 'NCHW'):
            batch = mem.sample(min(64, len(mem)), n_step=n_step, layout=layout, rng=rng)
            assert check_batch_extras(mem, batch, layout) == min(64, len(mem))


@pytest.mark.parametrize('num_lanes, history_len, max_size, block_size', [
    (6, 4, 300, 8), (8, 2, 200, 2), (3, 6, 400, 7)])
def test_batch_writer_random_subsets_extras(num_lanes, history_len, max_size, block_size):
    rng = np.random.default_rng(num_lanes)
    mem = ReplayMemory(max_size, FRAME_SHAPE, history_len, block_size=block_size,
                       extra_fields=FIELDS)
    write_batches(mem, num_lanes, 20 * max_size // num_lanes, rng)
    assert mem.num_steps_written > 10 * mem.num_slots
    check_every_valid_slot(mem)
    assert check_batch_extras(mem, mem.sample(128, rng=rng)) == 128


@pytest.mark.parametrize('prioritized', [False, True])
@pytest.mark.parametrize('path', PATHS)
def test_the_c_kernels_common_step_writes_extras_and_priorities(path, prioritized):
    rng = np.random.default_rng(3)
    with kernel_path(path, '_write_ext'):
        mem = ReplayMemory(400, FRAME_SHAPE, 4, block_size=20, extra_fields=FIELDS,
                           prioritized=prioritized)
        calls = write_batches(mem, 4, 2000, rng, fast=True)     # its writer built here
    if path == 'numpy':
        assert calls == 0                       # the general path took every step
    else:
        assert calls > 1000                     # most steps went through the kernel
    check_every_valid_slot(mem)
    assert check_batch_extras(mem, mem.sample(256, rng=rng)) == 256
    if prioritized:
        prio = mem.ring.priorities
        prio.flush()
        in_tree = prio.tree.get(np.arange(mem.num_slots)) > 0
        np.testing.assert_array_equal(in_tree, (mem.ring.flags[:mem.num_slots] & 1) != 0)


def test_the_c_kernel_now_serves_prioritized_memories():
    """A prioritized memory's common step goes through the kernel (it used to be refused),
    and its new steps enter the tree at the running max priority."""
    with kernel_path('C kernels', '_write_ext'):
        mem = ReplayMemory(400, FRAME_SHAPE, 4, block_size=20, prioritized=True)
        bw = mem.new_batch_writer(2)
    lanes = np.arange(2)
    frames = np.stack([encode(j, 1, 0) for j in lanes])
    bw.start_episodes(lanes, frames)
    taken = 0
    for t in range(10):
        frames = np.stack([encode(j, 1, t + 1) for j in lanes])
        args = (lanes, np.zeros(2, np.int64), np.ones(2), frames, np.zeros(2, bool),
                np.zeros(2, bool))
        if bw.try_add_steps(*args):
            taken += 1
        else:
            bw.add_steps(*args)
    assert taken >= 5
    mem.update_priorities(mem.sample(4).indices, [5.0] * 4)
    before = set(np.flatnonzero(mem.ring.priorities.tree.get(np.arange(mem.num_slots)) > 0))
    frames = np.stack([encode(j, 1, 11) for j in lanes])
    assert bw.try_add_steps(lanes, np.zeros(2, np.int64), np.ones(2), frames,
                            np.zeros(2, bool), np.zeros(2, bool))
    mem.sample(1)
    leaves = mem.ring.priorities.tree.get(np.arange(mem.num_slots))
    new = sorted(set(np.flatnonzero(leaves > 0)) - before)
    assert len(new) == 2
    np.testing.assert_allclose(leaves[new], (5.0 + 1e-6) ** 0.6)


# ------------------------------------------------------------------------------ bad input
def one_step_memory(**kwargs):
    mem = ReplayMemory(100, FRAME_SHAPE, 2, block_size=10, extra_fields=FIELDS, **kwargs)
    w = mem.new_writer()
    w.start_episode(encode(0, 1, 0))
    w.add_step(0, 0.0, encode(0, 1, 1), extras=extras_of(0, 1, 0))
    return mem, w


def snapshot(mem):
    return [a.copy() for a in (mem.ring.frames, mem.ring.action, mem.ring.reward, mem.ring.flags, mem.ring.epstep,
                               mem.ring.block_fill, *mem.ring.extras.values())] + [len(mem)]


def assert_untouched(mem, before):
    after = snapshot(mem)
    for a, b in zip(before[:-1], after[:-1]):
        np.testing.assert_array_equal(a, b)
    assert before[-1] == after[-1]


GOOD = extras_of(0, 1, 1)


@pytest.mark.parametrize('extras, match', [
    (None, "missing field 'flag'"),
    ({}, "missing field 'flag'"),
    ({k: v for k, v in GOOD.items() if k != 'segment'}, "missing field 'segment'"),
    ({**GOOD, 'other': 1}, "unknown field 'other'"),
    ({**GOOD, 'lives': 200}, r"extras\['lives'\] has values in \[200, 200\]"),
    ({**GOOD, 'lives': 1.5}, r"extras\['lives'\] has dtype float64"),
    ({**GOOD, 'segment': 2 ** 40}, r"extras\['segment'\]"),
    ({**GOOD, 'score': float('nan')}, r"extras\['score'\] holds a NaN"),
    ({**GOOD, 'score': 1e300}, r"extras\['score'\] holds 1e\+300"),
    ({**GOOD, 'flag': 2}, r"extras\['flag'\] holds 2"),
    ({**GOOD, 'lives': [1, 2]}, r"extras\['lives'\] has shape \(2,\)"),
    ({**GOOD, 'lives': 'x'}, r"extras\['lives'\] has dtype <U1"),
])
def test_bad_extras_of_a_step_name_the_field_and_change_nothing(extras, match):
    mem, w = one_step_memory()
    before = snapshot(mem)
    with pytest.raises(ValueError, match=match):
        w.add_step(0, 0.0, encode(0, 1, 2), extras=extras)
    assert_untouched(mem, before)
    w.add_step(0, 0.0, encode(0, 1, 2), extras=GOOD)       # the writer still works
    assert len(mem) == 2


@pytest.mark.parametrize('change, match', [
    (lambda e: {k: v[:1] for k, v in e.items()}, r"extras\['lives'\] has shape \(1,\)"),
    (lambda e: {**e, 'lives': np.array([1, 999])}, r"extras\['lives'\] has values"),
    (lambda e: {k: v for k, v in e.items() if k != 'score'}, "missing field 'score'"),
    (lambda e: None, "missing field"),
])
def test_bad_extras_of_a_batch_name_the_field_and_change_nothing(change, match):
    mem = ReplayMemory(100, FRAME_SHAPE, 2, block_size=10, extra_fields=FIELDS)
    bw = mem.new_batch_writer(2)
    lanes = np.arange(2)
    bw.start_episodes(lanes, np.stack([encode(j, 1, 0) for j in lanes]))
    before = snapshot(mem)
    good = {name: np.array([extras_of(j, 1, 0)[name] for j in lanes], FIELDS[name])
            for name in FIELDS}
    args = (lanes, np.zeros(2, np.int64), np.zeros(2), np.stack([encode(j, 1, 1) for j in lanes]),
            np.zeros(2, bool), np.zeros(2, bool))
    with pytest.raises(ValueError, match=match):
        bw.add_steps(*args, extras=change(good))
    with pytest.raises(ValueError, match=match):
        bw.add_steps(*args, checked=True, extras=change(good))     # checked: extras still are
    with pytest.raises(ValueError, match=match):   # checked first, on either path
        bw.try_add_steps(*args, extras=change(good))
    assert_untouched(mem, before)


def test_extras_on_a_memory_without_fields_are_refused():
    mem = ReplayMemory(100, FRAME_SHAPE, 2, block_size=10)
    w = mem.new_writer()
    w.start_episode(encode(0, 1, 0))
    with pytest.raises(ValueError, match="unknown field 'lives'"):
        w.add_step(0, 0.0, encode(0, 1, 1), extras={'lives': 3})
    assert len(mem) == 0
    w.add_step(0, 0.0, encode(0, 1, 1))
    assert mem.sample(1).extras == {}
    assert mem.extra_fields == {}


@pytest.mark.parametrize('fields, exc, match', [
    ({'lives': 'U4'}, TypeError, r"extra_fields\['lives'\]"),
    ({'lives': None}, TypeError, r"extra_fields\['lives'\]"),
    ({'two words': 'int8'}, ValueError, 'identifiers'),
    ({3: 'int8'}, ValueError, 'identifiers'),
    (['lives'], TypeError, 'extra_fields must be a dict'),
])
def test_bad_extra_fields_are_refused(fields, exc, match):
    with pytest.raises(exc, match=match):
        ReplayMemory(100, FRAME_SHAPE, 2, extra_fields=fields)


def test_append_refuses_a_memory_with_extra_fields():
    from expreplay import Experience
    mem = ReplayMemory(100, FRAME_SHAPE, 2, extra_fields={'lives': 'int8'})
    with pytest.raises(ValueError, match='extra_fields'):
        mem.append(Experience(encode(0, 1, 0), 0, 0.0, False))
    assert mem.num_steps_written == 0 and not mem.ring.block_fill.any()


def test_sample_batch_keeps_its_four_list_and_the_named_batch_its_eight_fields():
    mem, w = one_step_memory()
    for t in range(1, 10):
        w.add_step(0, 0.0, encode(0, 1, t + 1), extras=extras_of(0, 1, t))
    assert len(mem.sample_batch(4)) == 4
    batch = mem.sample(4)
    state, action, reward, next_state, discount, is_over, indices, weights = batch
    assert len(batch) == 8 and batch._fields[-1] == 'weights'
    again = batch._replace(weights=np.zeros(4))
    assert again.extras.keys() == batch.extras.keys()
    np.testing.assert_array_equal(again.extras['segment'], batch.extras['segment'])


# ------------------------------------------------------------------------------ checkpoints
def test_checkpoint_round_trip_keeps_the_extras(tmp_path):
    rng = np.random.default_rng(5)
    mem = ReplayMemory(97, FRAME_SHAPE, 4, block_size=8, extra_fields=FIELDS, prioritized=True)
    write_lanes(mem, 3, 600, rng)
    mem.save(tmp_path / 'mem.npz')
    loaded = ReplayMemory.load(tmp_path / 'mem.npz', extra_fields=FIELDS)
    assert loaded.extra_fields == mem.extra_fields
    assert list(loaded.extra_fields) == list(FIELDS)      # in order
    written = np.flatnonzero(np.arange(mem.block_size)[None, :] < mem.ring.block_fill[:, None])
    for name in FIELDS:
        np.testing.assert_array_equal(loaded.ring.extras[name][written], mem.ring.extras[name][written])
    check_every_valid_slot(loaded)
    x = mem.sample(64, rng=np.random.default_rng(1))
    y = loaded.sample(64, rng=np.random.default_rng(1))
    for name in FIELDS:
        np.testing.assert_array_equal(x.extras[name], y.extras[name])
    with np.load(tmp_path / 'mem.npz') as archive:
        assert archive['extra.segment'].shape == (len(written),)


@pytest.mark.parametrize('expected, match', [
    ({}, "extra_fields: checkpoint has {'lives': 'int8'}, expected {}"),
    ({'lives': 'int16'}, "expected {'lives': 'int16'}"),
    ({'lives': 'int8', 'segment': 'int32'}, 'extra_fields'),
])
def test_a_checkpoint_of_other_extra_fields_is_refused(tmp_path, expected, match):
    mem = ReplayMemory(100, FRAME_SHAPE, 2, extra_fields={'lives': 'int8'})
    mem.save(tmp_path / 'mem.npz')
    with pytest.raises(CheckpointError, match=match):
        ReplayMemory.load(tmp_path / 'mem.npz', extra_fields=expected)
    assert ReplayMemory.load(tmp_path / 'mem.npz', extra_fields={'lives': np.int8}).extra_fields \
        == {'lives': np.dtype('int8')}


def test_crafted_extra_tables_are_refused(tmp_path):
    from test_checkpoint import rewrite
    mem, _ = one_step_memory()
    mem.save(tmp_path / 'mem.npz')
    for changes, match in [
            (dict(**{'extra.lives': lambda a: a.astype(np.int64)}), "'extra.lives' holds int64"),
            (dict(**{'extra.lives': None}), "no table 'extra.lives'"),
            (dict(meta_extra_fields=[['lives', 'int8']]), 'unexpected entries'),
            (dict(meta_extra_fields=[['lives', 'int8'], ['lives', 'int8']]), 'distinct'),
            (dict(meta_extra_fields='lives'), 'extra_fields')]:
        bad = rewrite(tmp_path / 'mem.npz', tmp_path / 'bad.npz', **changes)
        with pytest.raises(CheckpointError, match=match):
            ReplayMemory.load(bad)
