"""The memory's write and sample paths, with the C kernels and with the numpy path they stand
in for: reused output buffers (``out=``), the batch writer's lane rule, writers dropped without
``close()``, the sample arguments' rules, the n-step walk's bound, and many writers with a
concurrent sampler whose every sampled value is checked."""

import gc
import threading

import numpy as np
import pytest

from expreplay import ReplayMemory
from expreplay.storage.memory import SampleBatch
from kernel_paths import kernel_path
from test_memory import FRAME_SHAPE, StreamModel, action_of, decode, encode, reward_of


@pytest.fixture(params=['C kernels', 'numpy'])
def kernels(request):
    """The memory's C kernels (the sampler, the writers' store), or the numpy path: the
    switch is :func:`expreplay._kernels.numpy_only`."""
    with kernel_path(request.param, '_gather_ext', '_write_ext'):
        yield request.param


def filled(seed=0, max_size=400, history_len=4, num_lanes=3, steps=1500, **kwargs):
    """A memory written by ``num_lanes`` lane writers, episodes of 1 to 30 steps."""
    rng = np.random.default_rng(seed)
    mem = ReplayMemory(max_size, FRAME_SHAPE, history_len, **kwargs)
    writers = [mem.new_writer() for _ in range(num_lanes)]
    t = [None] * num_lanes
    episode = [0] * num_lanes
    length = [0] * num_lanes
    for i in range(steps):
        lane = i % num_lanes
        w = writers[lane]
        if t[lane] is None:
            episode[lane] += 1
            length[lane] = int(rng.integers(1, 30))
            t[lane] = 0
            w.start_episode(encode(lane, episode[lane], 0))
            continue
        tt = t[lane]
        end = tt + 1 == length[lane]
        w.add_step(action_of(lane, episode[lane], tt), reward_of(lane, episode[lane], tt),
                   encode(lane, episode[lane], tt + 1), terminated=end and tt % 2 == 0,
                   truncated=end and tt % 2 == 1)
        t[lane] = None if end else tt + 1
    return mem


# ----------------------------------------------------------------------------- out=
@pytest.mark.parametrize('layout', ['NHWC', 'NCHW'])
@pytest.mark.parametrize('prioritized', [False, True])
def test_sample_into_an_earlier_batch_gives_the_same_batch(kernels, layout, prioritized):
    mem = filled(prioritized=prioritized)
    out = mem.sample(32, n_step=3, beta=0.4, layout=layout, rng=np.random.default_rng(0))
    arrays = [id(a) for a in out]
    got = mem.sample(32, n_step=3, beta=0.4, layout=layout, rng=np.random.default_rng(1), out=out)
    want = mem.sample(32, n_step=3, beta=0.4, layout=layout, rng=np.random.default_rng(1))
    assert got is out and [id(a) for a in got] == arrays           # filled in place
    for name, a, b in zip(SampleBatch._fields, got, want):
        np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize('layout', ['NHWC', 'NCHW'])
def test_sample_batch_into_an_earlier_batch_gives_the_same_batch(kernels, layout):
    mem = filled()
    out = mem.sample_batch(32, np.random.default_rng(0), layout)
    got = mem.sample_batch(32, np.random.default_rng(1), layout, out=out)
    want = mem.sample_batch(32, np.random.default_rng(1), layout)
    assert got is out
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_an_out_of_another_shape_is_refused_and_left_alone(kernels):
    mem = filled(history_len=3)     # NHWC and NCHW states differ in shape
    small = mem.sample(16)
    before = [a.copy() for a in small]
    with pytest.raises(ValueError, match='out'):
        mem.sample(32, out=small)
    with pytest.raises(ValueError, match='out'):
        mem.sample(16, layout='NCHW', out=small)
    with pytest.raises(TypeError, match='out'):
        mem.sample(16, out=list(small))
    with pytest.raises(ValueError, match='out'):
        mem.sample_batch(32, out=mem.sample_batch(16))
    for a, b in zip(small, before):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- sample's arguments
def test_sample_refuses_a_seed_int_naming_rng(kernels):
    mem = filled()
    for method in (mem.sample, mem.sample_batch):
        with pytest.raises(TypeError, match='rng'):
            method(4, rng=42)


def test_sample_accepts_a_whole_float_batch_size(kernels):
    mem = filled()
    assert len(mem.sample(4.0).action) == 4
    assert len(mem.sample_batch(4.0)[1]) == 4
    with pytest.raises(ValueError, match='batch_size'):
        mem.sample(4.5)


@pytest.mark.timeout(120)
def test_the_n_step_walk_is_bounded_by_the_episode_not_by_n(kernels):
    """An n far beyond any episode walks no further than the episodes do (a walk of n steps
    would not end within the test's timeout) and gives what n = the longest episode gives."""
    mem = filled()
    want = mem.sample(64, n_step=30, rng=np.random.default_rng(5))
    got = mem.sample(64, n_step=10 ** 12, rng=np.random.default_rng(5))
    for name, a, b in zip(SampleBatch._fields, got, want):
        np.testing.assert_array_equal(a, b, err_msg=name)


# ----------------------------------------------------------------------------- lanes
@pytest.mark.parametrize('lanes,error', [
    ([0, 0], ValueError), ([1, 2, 1], ValueError), ([-1], ValueError), ([3], ValueError),
    ([5], ValueError), ([0.7], TypeError), ([True, False], TypeError), ([[0, 1]], TypeError),
    (['0'], TypeError)])
def test_a_batch_writer_refuses_bad_lanes_naming_them_and_writes_nothing(kernels, lanes, error):
    mem = ReplayMemory(200, FRAME_SHAPE, 2, block_size=10)
    bw = mem.new_batch_writer(3)
    bw.start_episodes(np.arange(3), np.stack([encode(j, 1, 0) for j in range(3)]))
    tables = [a.copy() for a in (mem.ring.frames, mem.ring.flags, mem.ring.epstep, mem.ring.block_fill)]
    n = len(np.asarray(lanes).reshape(-1))
    frames = np.stack([encode(0, 1, 1)] * n)
    with pytest.raises(error, match='lanes'):
        bw.add_steps(lanes, np.zeros(n, np.int32), np.zeros(n), frames, np.zeros(n, bool),
                     np.zeros(n, bool))
    with pytest.raises(error, match='lanes'):
        bw.start_episodes(lanes, frames)
    with pytest.raises(error, match='lanes'):
        bw.add_steps(lanes, np.zeros(n, np.int32), np.zeros(n), frames, np.zeros(n, bool),
                     np.zeros(n, bool), checked=True)
    for a, b in zip((mem.ring.frames, mem.ring.flags, mem.ring.epstep, mem.ring.block_fill), tables):
        np.testing.assert_array_equal(a, b)
    assert len(mem) == 0


def test_a_memory_written_with_good_lanes_round_trips(kernels, tmp_path):
    mem = ReplayMemory(200, FRAME_SHAPE, 2, block_size=10)
    bw = mem.new_batch_writer(3)
    bw.start_episodes([0, 1, 2], np.stack([encode(j, 1, 0) for j in range(3)]))
    for t in range(5):
        bw.add_steps([2, 0], np.zeros(2, np.int32), np.zeros(2),
                     np.stack([encode(j, 1, t + 1) for j in (2, 0)]), np.zeros(2, bool),
                     np.zeros(2, bool))
    assert len(mem) == 10 == np.count_nonzero(mem.ring.flags & 1)
    mem.save(tmp_path / 'm.npz')
    assert len(ReplayMemory.load(tmp_path / 'm.npz')) == 10


# ----------------------------------------------------------------------------- dropped writers
@pytest.mark.parametrize('kind', ['lane writer', 'batch writer', 'in a reference cycle',
                                  'acting group'])
def test_dropped_writers_give_their_blocks_back(kernels, kind):
    """20 writers (or acting groups) dropped without close() on a memory of 20 blocks, then a new
    writer works: each gave its block back when it was collected (a cycle's, when the
    collector ran)."""
    mem = ReplayMemory(20 * 8, FRAME_SHAPE, 2, block_size=8)
    assert mem.num_blocks == 20
    for i in range(20):
        if kind == 'acting group':
            from expreplay.acting import ActingGroup, EnvRunner
            from scripted_env import ScriptedEnv
            w = ActingGroup([EnvRunner(ScriptedEnv(i, obs_shape=FRAME_SHAPE, episode_lengths=[5]),
                                       None, mem, 2, seed=i)])
            w.step(1.0)
        elif kind == 'lane writer':
            w = mem.new_writer()
            w.start_episode(encode(i, 1, 0))
            w.add_step(0, 1.0, encode(i, 1, 1))
        else:
            w = mem.new_batch_writer(1)
            w.start_episodes([0], encode(i, 1, 0)[None])
            if kind == 'in a reference cycle':
                w.cycle = w
        del w
    fresh = mem.new_writer()
    fresh.start_episode(encode(99, 1, 0))
    for t in range(30):      # four blocks' worth: every claim finds a block given back
        fresh.add_step(0, 1.0, encode(99, 1, t + 1))
    assert decode(mem.ring.frames[fresh.current_slot]) == (99, 1, 30)


def test_a_closed_writer_is_not_given_back_twice(kernels):
    mem = ReplayMemory(4 * 8, FRAME_SHAPE, 2, block_size=8)
    w = mem.new_writer()
    w.start_episode(encode(0, 1, 0))
    w.close()
    del w
    gc.collect()
    others = [mem.new_writer() for _ in range(3)]
    for k, o in enumerate(others):
        o.start_episode(encode(k, 1, 0))
    # Four blocks, three active: the closed writer's block was retired once, and the next
    # claim evicts it rather than finding it twice in the eviction queue.
    assert sorted(mem.ring.retired) == sorted(set(mem.ring.retired))
    assert np.count_nonzero(mem.ring.block_state == 1) == 3


def test_a_writers_finalizer_keeps_neither_the_writer_nor_the_memory_alive(kernels):
    """A writer's finalizer holds nothing that leads back to the writer (the memory holds its
    tensorpack appender's writer): a memory dropped with writers still open is freed, its
    ring too (the finalizers hold it only by weak reference)."""
    import weakref
    mem = ReplayMemory(4 * 8, FRAME_SHAPE, 2, block_size=8)
    mem.append((encode(0, 1, 0), 0, 1.0, False))
    w = mem.new_writer()
    w.start_episode(encode(1, 1, 0))
    refs = [weakref.ref(x) for x in (mem, mem.ring, w)]
    del mem, w
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


# ----------------------------------------------------------------------------- concurrency
def check_n_step(batch, model, history_len, n, gamma, layout):
    """Every field of a sampled n-step batch against what was written (``model``: final)."""
    state, next_state = batch.state, batch.next_state
    if layout == 'NHWC':
        state, next_state = np.moveaxis(state, -1, 1), np.moveaxis(next_state, -1, 1)
    for b in range(len(batch.action)):
        ids = [decode(f) for f in state[b]]
        lane, ep, t = ids[-1]
        for k in range(history_len):
            assert ids[-1 - k] == ((lane, ep, t - k) if t - k >= 0 else None)
        nxt = [decode(f) for f in next_state[b]]
        lane2, ep2, t2 = nxt[-1]
        assert (lane2, ep2) == (lane, ep), "the window never leaves the episode"
        k = t2 - t
        assert 1 <= k <= n
        for j in range(history_len):
            assert nxt[-1 - j] == ((lane, ep, t2 - j) if t2 - j >= 0 else None)
        steps = model.steps[(lane, ep)]
        assert t2 <= steps, "the next state was written"
        ended = t2 == steps and (lane, ep) in model.ending
        terminated = ended and model.ending[(lane, ep)] == 'terminated'
        assert batch.action[b] == action_of(lane, ep, t)
        want = sum(gamma ** j * np.float32(reward_of(lane, ep, t + j)) for j in range(k))
        assert batch.reward[b] == pytest.approx(want, rel=1e-6, abs=1e-6)
        assert batch.is_over[b] == terminated
        assert batch.discount[b] == pytest.approx(0.0 if terminated else gamma ** k, rel=1e-6)


@pytest.mark.slow   # a concurrency stress run: long by design
@pytest.mark.parametrize('layout', ['NHWC', 'NCHW'])
def test_many_writers_and_a_sampler_reusing_its_buffers_see_only_what_was_written(kernels, layout):
    """Six lane writers (add_step's one-call path) and two batch writers in threads, on a
    memory small enough to evict all the time; a sampler draws n-step batches into the same
    out= buffers meanwhile and keeps a copy of each; every value of every copy is checked
    against what was written."""
    history_len, n, gamma = 4, 3, 0.9
    mem = ReplayMemory(60 * 16, FRAME_SHAPE, history_len, block_size=16)
    models = [StreamModel() for _ in range(8)]
    errors, stop, sampled = [], threading.Event(), []

    def lane_writer(k):
        try:
            rng = np.random.default_rng(k)
            w = mem.new_writer()
            model = models[k]
            for ep in range(1, 10 ** 6):
                if stop.is_set():
                    break
                length = int(rng.integers(1, 40))
                model.steps[(k, ep)] = 0
                w.start_episode(encode(k, ep, 0))
                for t in range(length):
                    end = t + 1 == length
                    kind = ('terminated' if rng.random() < 0.5 else 'truncated') if end else None
                    model.steps[(k, ep)] = t + 1   # before the write: a sample may follow at once
                    if end:
                        model.ending[(k, ep)] = kind
                    w.add_step(action_of(k, ep, t), reward_of(k, ep, t), encode(k, ep, t + 1),
                               terminated=kind == 'terminated', truncated=kind == 'truncated')
            w.close()
        except Exception as err:   # pragma: no cover - reported below
            errors.append(err)

    def batch_writer(k):
        from test_memory import write_batched_stream
        try:
            write_batched_stream(mem, 4, 800, np.random.default_rng(k), models[k],
                                 lane_offset=10 * k)
        except Exception as err:   # pragma: no cover - reported below
            errors.append(err)

    def sampler():
        try:
            rng = np.random.default_rng(99)
            out = None
            while not stop.is_set():
                if len(mem) >= 64:
                    out = mem.sample(64, n_step=n, gamma=gamma, layout=layout, rng=rng, out=out)
                    sampled.append(SampleBatch(*(a.copy() for a in out)))
                stop.wait(0.0002)   # pace, as a learner does
        except Exception as err:   # pragma: no cover - reported below
            errors.append(err)

    batchers = [threading.Thread(target=batch_writer, args=(k,)) for k in (6, 7)]
    lanes = [threading.Thread(target=lane_writer, args=(k,)) for k in range(6)]
    s = threading.Thread(target=sampler)
    for th in [s] + batchers + lanes:
        th.start()
    for th in batchers:
        th.join(120)
    stop.set()
    for th in lanes + [s]:
        th.join(60)
    assert not any(th.is_alive() for th in [s] + batchers + lanes)
    assert not errors, errors
    merged = StreamModel()
    for m in models:
        merged.steps.update(m.steps)
        merged.ending.update(m.ending)
    assert len(sampled) >= 10
    for batch in sampled:
        check_n_step(batch, merged, history_len, n, gamma, layout)


@pytest.mark.parametrize('built, used', [('C kernels', 'numpy'), ('numpy', 'C kernels')])
def test_a_memory_and_its_writers_keep_the_path_they_were_built_with(built, used):
    """One moment (:mod:`expreplay._kernels`): the sampler, the priority tree and a writer's
    binding are taken when each is built; used under the other path, they keep theirs (also the
    tree a prioritized memory builds anew, as after a failed load)."""
    names = ('_gather_ext', '_write_ext', '_tree_ext')
    with kernel_path(built, *names):
        mem = ReplayMemory(400, FRAME_SHAPE, 4, block_size=20, prioritized=True)
        lane, batch = mem.new_writer(), mem.new_batch_writer(2)
    c = built == 'C kernels'
    with kernel_path(used, *names):
        lane.start_episode(encode(0, 1, 0))
        for t in range(30):
            lane.add_step(action_of(0, 1, t), reward_of(0, 1, t), encode(0, 1, t + 1))
        lanes = np.arange(2)
        batch.start_episodes(lanes, np.stack([encode(j + 1, 1, 0) for j in lanes]))
        taken = 0
        for t in range(30):
            args = (lanes, np.zeros(2, np.int64), np.zeros(2),
                    np.stack([encode(j + 1, 1, t + 1) for j in lanes]), np.zeros(2, bool),
                    np.zeros(2, bool))
            if batch.try_add_steps(*args):
                taken += 1
            else:
                batch.add_steps(*args, checked=True)
        assert taken > 20 if c else taken == 0
        assert (mem.sampler.kernel(1, 'NCHW') is not None) == c
        assert (batch.kernel_binding() is not None) == c
        assert (mem.ring.priorities.tree._ext is not None) == c
        sample = mem.sample(32)
        assert [decode(f) for f in sample.state[..., -1]].count(None) == 0
        mem.ring.distribution.reset(mem.ring.flags, mem.ring.lock)   # a new tree, as a failed load builds
        assert (mem.ring.priorities.tree._ext is not None) == c
