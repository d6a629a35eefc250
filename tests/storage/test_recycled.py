"""A sampled batch's arrays are filled again only once nothing outside the memory refers to them.

The memory reuses the arrays of batches that were dropped (expreplay.storage._recycled): every
way of keeping a batch, or any array of it, or a view or buffer over one, must keep it from
being overwritten, also while another thread draws; a batch dropped is reused. What a batch
hands out is a fresh view each time, so changing an array's shape, dtype or flags, or keeping
a weak reference to it, never reaches a later batch.
"""

import gc
import queue
import threading
import weakref

import numpy as np
import pytest

from expreplay import ReplayMemory
from expreplay.storage._recycled import ArrayPool
from kernel_paths import kernel_path

pytestmark = pytest.mark.timeout(120)


def filled_memory(extras=False):
    mem = ReplayMemory(2000, (6, 6), 4, extra_fields={'logp': np.float32} if extras else None)
    rng = np.random.default_rng(0)
    w = mem.new_writer()
    w.start_episode(rng.integers(0, 255, (6, 6), dtype=np.uint8))
    for t in range(1500):
        end = t % 97 == 96
        w.add_step(t % 5, float(t), rng.integers(0, 255, (6, 6), dtype=np.uint8),
                   terminated=end, extras={'logp': np.float32(t)} if extras else None)
        if end:
            w.start_episode(rng.integers(0, 255, (6, 6), dtype=np.uint8))
    return mem


def snapshot(batch):
    return [np.array(a, copy=True) for a in batch]


def same(batch, copies):
    return all(np.array_equal(a, c) for a, c in zip(batch, copies))


def buffers(batch):
    """The memory addresses of a batch's arrays (which buffer each one reads)."""
    return {a.__array_interface__['data'][0] for a in batch}


KEEPERS = {
    'the batch': lambda b: b,
    'one array': lambda b: b[0],
    'a small array': lambda b: b[-1],
    'a view': lambda b: b[0][1:],
    'a memoryview': lambda b: memoryview(b[0]),
    'an array over its buffer': lambda b: np.frombuffer(b[2], np.float32),
}


@pytest.mark.parametrize('method', ['sample', 'sample_batch'])
@pytest.mark.parametrize('keeper', list(KEEPERS))
def test_what_is_held_is_never_refilled(method, keeper):
    """Keep a part of a batch, drop the rest: none of the batch's arrays is overwritten by later
    draws (one kept array keeps its whole set)."""
    with kernel_path('C kernels', '_gather_ext'):
        mem = filled_memory()
        draw = getattr(mem, method)
        batch = draw(16)
        copies, ids = snapshot(batch), buffers(batch)
        kept = KEEPERS[keeper](batch)
        whole = list(batch)           # read back below, so held until then
        del batch
        for _ in range(30):
            later = draw(16)
            assert not ids & buffers(later)
        assert same(whole, copies)
        del kept


@pytest.mark.parametrize('method', ['sample', 'sample_batch'])
def test_a_dropped_batch_is_refilled(method):
    with kernel_path('C kernels', '_gather_ext'):
        mem = filled_memory()
        draw = getattr(mem, method)
        ids = buffers(draw(16))
        for _ in range(20):
            assert ids == buffers(draw(16))           # the one set, every time
        assert mem.sampler._pool.made == 1
        draw(17)                                      # another size: new arrays
        assert mem.sampler._pool.made == 2


def test_extras_are_part_of_the_set():
    with kernel_path('C kernels', '_gather_ext'):
        mem = filled_memory(extras=True)
        batch = mem.sample(16)
        logp = batch.extras['logp']
        copy = logp.copy()
        state_buffer = buffers([batch.state])
        del batch
        for _ in range(10):
            later = mem.sample(16)
            assert buffers([later.state]) != state_buffer
            assert buffers([later.extras['logp']]) != buffers([logp])
        assert np.array_equal(logp, copy)


def test_batches_held_by_another_thread_stay_intact():
    """A drawing thread and a learner thread, as a prefetch buffer runs them: the learner holds
    each batch for a while (several draws later), checks it never changed, then drops it. A
    batch refilled while held would fail the check."""
    with kernel_path('C kernels', '_gather_ext'):
        mem = filled_memory(extras=True)
        handed: queue.Queue = queue.Queue(maxsize=3)
        errors = []

        def draw():
            try:
                for _ in range(400):
                    batch = mem.sample(32)
                    handed.put((batch, snapshot(batch) + [batch.extras['logp'].copy()]))
            except Exception as err:       # reaches the assertion below
                errors.append(err)
            finally:
                handed.put(None)

        drawer = threading.Thread(target=draw)
        drawer.start()
        held = []
        while (item := handed.get()) is not None:
            held.append(item)
            if len(held) > 4:
                batch, copies = held.pop(0)
                assert same(list(batch) + [batch.extras['logp']], copies)
        drawer.join()
        assert not errors
        for batch, copies in held:
            assert same(list(batch) + [batch.extras['logp']], copies)
        # about 11 batches are alive at once here: the same arrays go round
        assert mem.sampler._pool.made <= mem.sampler._pool.limit


def test_the_pool_keeps_at_most_limit_sets():
    pool = ArrayPool(limit=2)
    held = [pool.take('k', lambda: (np.empty(3),)) for _ in range(4)]
    assert pool.made == 4 and len(pool._sets) == 2
    del held
    assert pool.take('k', lambda: (np.empty(3),)) and pool.made == 4


CHANGES = {
    'shape': lambda a: setattr(a, 'shape', (a.shape[0], -1)),
    'dtype': lambda a: setattr(a, 'dtype', np.int8 if a.dtype.itemsize == 1 else np.uint8),
    'read-only': lambda a: setattr(a.flags, 'writeable', False),
    'strides': lambda a: setattr(a, 'strides', (0,) + a.strides[1:]),
}


# numpy 2.4 deprecates setting shape, dtype and strides in place; users still do it.
@pytest.mark.filterwarnings('ignore::DeprecationWarning')
@pytest.mark.parametrize('path', ['C kernels', 'numpy'])
@pytest.mark.parametrize('method', ['sample', 'sample_batch'])
@pytest.mark.parametrize('change', list(CHANGES))
def test_in_place_changes_to_a_dropped_batch_never_reach_a_later_one(path, method, change):
    """A learner that reshapes, retypes or freezes a batch's arrays before dropping them gets
    later batches of the promised shape, dtype and flags, with the same values a memory that
    never handed out that batch would give."""
    with kernel_path(path, '_gather_ext'):
        mem, twin = filled_memory(), filled_memory()
        draw, twin_draw = getattr(mem, method), getattr(twin, method)
        rng, twin_rng = np.random.default_rng(1), np.random.default_rng(1)
        expected = twin_draw(16, rng=twin_rng)
        layout = [(a.shape, a.dtype, a.flags.writeable) for a in expected]
        for _ in range(20):
            batch = draw(16, rng=rng)
            for a in batch:
                try:
                    CHANGES[change](a)
                except (AttributeError, ValueError):   # numpy refuses it for this array
                    pass
            del batch
            later = draw(16, rng=rng)
            expected = twin_draw(16, rng=twin_rng)
            twin_draw(16, rng=twin_rng)       # the twin's draws stay in step (two per round)
            assert [(a.shape, a.dtype, a.flags.writeable) for a in later] == layout
            assert same(later, snapshot(expected))
            del later


def test_a_weak_reference_to_a_dropped_array_dies_with_it():
    """The array a user held a weak reference to is gone once dropped: the reference never
    shows a later batch's contents."""
    with kernel_path('C kernels', '_gather_ext'):
        mem = filled_memory()
        batch = mem.sample(16)
        ref = weakref.ref(batch.state)
        del batch
        gc.collect()
        later = mem.sample(16)
        assert ref() is None and buffers([later.state])    # the buffer went round, not the array
