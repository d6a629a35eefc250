"""expreplay.storage._gather: both layouts equal plain numpy indexing, for every implementation."""
import numpy as np
import pytest

from expreplay import _kernels
from expreplay.storage._gather import gather_frames
from kernel_paths import PATHS, kernel_path

N = 40  # ring slots


@pytest.fixture(params=PATHS)
def impl(request):
    """The gather kernel a caller built on each path takes (the C extension, skipped when it is
    not in use here; None on the numpy path), to give gather_frames as ``kernel``."""
    with kernel_path(request.param, '_gather_ext'):
        yield _kernels.get('_gather_ext')


def reference(frames, idx, layout):
    batch = frames[idx]  # (B, K, *frame_shape)
    return batch if layout == 'NCHW' else np.moveaxis(batch, 1, -1)


def random_frames(rng, shape, dtype, n=N):
    return rng.integers(-100 if np.dtype(dtype).kind != 'u' else 0, 100, (n,) + shape).astype(dtype)


def history_idx(rng, B, K, n=N):
    """Rows of consecutive slots, like the replay memory samples, plus a few arbitrary ones."""
    idx = rng.integers(0, n - K, (B, 1)) + np.arange(K)
    idx[::3] = rng.integers(0, n, (len(idx[::3]), K))
    return idx


@pytest.mark.parametrize('layout', ['NHWC', 'NCHW'])
@pytest.mark.parametrize('K', [1, 2, 5])
@pytest.mark.parametrize('dtype', [np.uint8, np.float32, np.int16])
@pytest.mark.parametrize('shape', [(4,), (6, 7), (5, 6, 3)], ids=['rank1', 'rank2', 'rank3'])
def test_matches_numpy(impl, shape, dtype, K, layout):
    rng = np.random.default_rng(0)
    frames = random_frames(rng, shape, dtype)
    for B in (1, 7, 64):
        idx = history_idx(rng, B, K)
        want = reference(frames, idx, layout)
        got = gather_frames(frames, idx, layout, kernel=impl)
        assert got.dtype == frames.dtype and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
        out = np.full(want.shape, 7, frames.dtype)
        assert gather_frames(frames, idx, layout, out=out, kernel=impl) is out
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize('K', [2, 3, 4, 5, 6, 7, 8, 9])
@pytest.mark.parametrize('frame_size', [1, 16, 18, 19, 20, 32, 35, 84 * 84])
def test_uint8_nhwc_vector_loop_and_tail(impl, K, frame_size):
    """Cover the extension's 16-pixel loop and its tail for every K it handles (2..8), and check
    that its overlapping 8-byte stores never write past the end of `out`."""
    rng = np.random.default_rng(K)
    frames = random_frames(rng, (frame_size,), np.uint8)
    idx = history_idx(rng, 5, K)
    want = reference(frames, idx, 'NHWC')
    buf = np.full(want.size + 16, 0xAB, np.uint8)
    out = buf[:want.size].reshape(want.shape)
    gather_frames(frames, idx, 'NHWC', out=out, kernel=impl)
    np.testing.assert_array_equal(out, want)
    assert (buf[want.size:] == 0xAB).all()


@pytest.mark.parametrize('layout', ['NHWC', 'NCHW'])
def test_indices_like_numpy(impl, layout):
    frames = random_frames(np.random.default_rng(1), (6, 7), np.uint8)
    idx = np.array([[-1, 0, 1, 2, 3], [N - 1, -N, 5, 6, 7]])
    np.testing.assert_array_equal(gather_frames(frames, idx, layout, kernel=impl),
                                  reference(frames, idx, layout))
    np.testing.assert_array_equal(gather_frames(frames, idx.astype(np.int32) % N, layout,
                                                kernel=impl),
                                  reference(frames, idx % N, layout))
    for bad in (N, -N - 1):
        with pytest.raises(IndexError):
            gather_frames(frames, np.array([[0, 1, 2, 3, bad]]), layout, kernel=impl)


@pytest.mark.parametrize('layout', ['NHWC', 'NCHW'])
def test_bad_out_raises(layout):
    frames = np.zeros((N, 6, 7), np.uint8)
    idx = np.zeros((4, 5), np.int64)
    good = gather_frames(frames, idx, layout)
    for bad in (np.zeros(good.shape, np.float32),                 # dtype
                np.zeros(good.shape[:-1] + (4,), np.uint8),        # shape
                np.zeros((4, 5, 6 * 7), np.uint8),                 # same size, other shape
                np.zeros(good.shape[::-1], np.uint8).T,            # not C-contiguous
                good.tolist()):                                    # not an array
        with pytest.raises(ValueError, match='out'):
            gather_frames(frames, idx, layout, out=bad)
    readonly = np.zeros(good.shape, np.uint8)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match='out'):
        gather_frames(frames, idx, layout, out=readonly)


def test_bad_arguments_raise():
    frames = np.zeros((N, 6, 7), np.uint8)
    with pytest.raises(ValueError, match='layout'):
        gather_frames(frames, np.zeros((4, 5), int), 'NWHC')
    with pytest.raises(ValueError, match='idx'):
        gather_frames(frames, np.zeros(5, int))
    with pytest.raises(ValueError, match='idx'):
        gather_frames(frames, np.zeros((4, 5)))  # float indices
    with pytest.raises(ValueError, match='frames'):
        gather_frames(np.zeros(N, np.uint8), np.zeros((4, 5), int))


def test_extension_validates_its_arguments():
    with kernel_path('C kernels', '_gather_ext'):
        ext = _kernels.get('_gather_ext')
    frames = np.zeros((N, 6, 7), np.uint8)
    out = np.zeros((4, 6, 7, 5), np.uint8)
    idx = np.zeros((4, 5), np.intp)
    ext.interleave(frames, idx, out)
    with pytest.raises(ValueError):
        ext.interleave(frames, idx.astype(np.int32), out)       # idx not intp
    with pytest.raises(ValueError):
        ext.interleave(frames, idx, out[:3])                     # too small
    with pytest.raises(ValueError):
        ext.interleave(frames.astype(np.int16), idx, out)        # 2-byte items
    with pytest.raises(ValueError):
        ext.interleave(frames, np.zeros((4, 9), np.intp), np.zeros((4, 6, 7, 9), np.uint8))
    with pytest.raises(IndexError):
        ext.interleave(frames, np.full((4, 5), N, np.intp), out)
    with pytest.raises((ValueError, BufferError)):  # numpy refuses the buffer request
        ext.interleave(frames, idx, out.copy().T)                # not C-contiguous


def test_the_memory_sampler_resolves_histories_like_the_memory():
    """The memory's C sampler (Ring) gives exactly BlockRing.history_index + gather_frames for the
    states, and _n_step's walk, at episode starts (zero frames) and across block edges (the
    lane's previous block), in both layouts; and it refuses bad slots and buffers. (The
    reference gather is gather_frames' numpy path.)"""
    from expreplay import ReplayMemory
    rng = np.random.default_rng(0)
    for h in (1, 2, 4, 5):
        with kernel_path('C kernels', '_gather_ext'):
            mem = ReplayMemory(200, (6, 7), h, block_size=max(h, 6))
        writers = [mem.new_writer() for _ in range(3)]
        for i in range(3000):
            w = writers[i % 3]
            if i < 3 or rng.random() < 0.05:
                w.start_episode(rng.integers(0, 256, (6, 7), dtype=np.uint8))
            else:
                w.add_step(int(rng.integers(5)), float(rng.integers(-3, 4)),
                           rng.integers(0, 256, (6, 7), dtype=np.uint8))
        slots = np.flatnonzero(mem.ring.flags & 1).astype(np.int64)
        assert len(slots) > 100
        assert (mem.ring.epstep[slots] < h - 1).any() or h == 1                # zero-padded ones
        assert (slots % mem.block_size < h - 1).any() or h == 1            # across a block edge
        ring = mem.sampler.kernel(1, 'NCHW')
        for layout in ('NHWC', 'NCHW'):
            out = mem.sampler.empty_sample(len(slots), mem.sampler.state_shape(len(slots), h, layout))
            ring.sample(slots, 3, 0.9, layout == 'NCHW', out.state, out.next_state, out.action,
                        out.reward, out.discount, out.is_over, out.indices)
            reward, last, discount, is_over = mem.sampler.n_step(slots, 3, 0.9)
            for got, idx in ((out.state, mem.ring.history_index(slots)),
                             (out.next_state, mem.ring.history_index(last))):
                np.testing.assert_array_equal(got, gather_frames(mem.ring.frames, idx, layout))
            np.testing.assert_array_equal(out.reward, reward)
            np.testing.assert_array_equal(out.discount, discount)
            np.testing.assert_array_equal(out.is_over, is_over)
            np.testing.assert_array_equal(out.action, mem.ring.action[slots])
        bufs = (out.state, out.next_state, out.action, out.reward, out.discount, out.is_over,
                 out.indices)
        with pytest.raises(IndexError):
            ring.sample(np.full(len(slots), 10 ** 9, np.int64), 1, 0.9, layout == 'NCHW', *bufs)
        with pytest.raises(ValueError):
            ring.sample(slots[:1], 1, 0.9, layout == 'NCHW', *bufs)       # buffers of B rows
        with pytest.raises(ValueError):
            ring.sample(slots.astype(np.int32), 1, 0.9, layout == 'NCHW', *bufs)
        with pytest.raises(ValueError):
            ring.sample(slots, 1, 0.9, layout == 'NCHW', *bufs[:2], out.reward, *bufs[3:])
        with pytest.raises(ValueError):
            ring.comb(slots, True, out.state, out.action, out.reward, out.is_over)
