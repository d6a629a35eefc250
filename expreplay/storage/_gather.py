"""Gather a batch of history frames out of the replay memory's frame ring.

The memory stores every frame once, in a ring `frames` of shape (N, *frame_shape). A batch of
B transitions is given as `idx` (B, K): the ring slots of each transition's K = history_len + 1
frames, oldest first. `gather_frames` copies them into one of two layouts:

    'NCHW'  (B, K, *frame_shape)  history on axis 1: whole frames are copied (one np.take).
    'NHWC'  (B, *frame_shape, K)  history on the last axis (channels-last, what tensorpack's
                                  DQN and most TF models take).

NHWC is the expensive one: neighbouring output bytes come from K different frames, so the batch
cannot be assembled from whole-frame copies. numpy only offers strided copies (~1 byte/cycle,
4-5x the cost of the gather itself); the optional C extension `_gather_ext` byte-transposes
16 pixels at a time in SSE2 registers (SSSE3 shuffles for five frames); a sampled batch
costs about 1.2x the plain gather of its frames (`benchmarks/bench_memory.py`).

These functions never ask :mod:`expreplay._kernels` for `_gather_ext`: the object that calls
them (the memory's sampler, an acting group's frame history) took it when it was built and
gives it as ``kernel`` (None: numpy), so that it keeps one path (:mod:`expreplay._kernels`).
"""
import numpy as np

LAYOUTS = ('NHWC', 'NCHW')


def gather_frames(frames, idx, layout='NHWC', out=None, *, kernel=None):
    """Return the frames at ring slots `idx` (B, K) as a (B, K, *frame_shape) ('NCHW') or
    (B, *frame_shape, K) ('NHWC', C-contiguous) array of frames.dtype.

    `kernel`: the caller's `_gather_ext` (taken when it was built), or None for numpy.

    `out`, if given, must be a writable C-contiguous array of exactly that shape and dtype; it
    is filled and returned, so a caller sampling in a loop allocates nothing.
    Indices follow numpy: -N <= i < N, anything else raises IndexError.
    """
    frames = np.asarray(frames)
    idx = np.asarray(idx)
    if frames.ndim < 2:
        raise ValueError('frames must have shape (N, *frame_shape), got %s' % (frames.shape,))
    if idx.ndim != 2 or idx.dtype.kind not in 'iu':
        raise ValueError('idx must be a 2-D integer array (batch, frames), got %s %s'
                         % (idx.dtype, idx.shape))
    (B, K), frame_shape = idx.shape, frames.shape[1:]
    if layout == 'NCHW':
        shape = (B, K) + frame_shape
    elif layout == 'NHWC':
        shape = (B,) + frame_shape + (K,)
    else:
        raise ValueError('layout must be one of %s, got %r' % (LAYOUTS, layout))
    out = _check_out(out, shape, frames.dtype)

    n = len(frames)
    # Checked once here so the copies below can use np.take(mode='wrap'): with out= given, the
    # default mode='raise' copies through an intermediate buffer and is ~2x slower.
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError('frame index out of bounds for %d frames' % n)

    if layout == 'NCHW':
        np.take(frames, idx, axis=0, out=out, mode='wrap')
    elif kernel is not None and interleave_takes(frames, K):
        kernel.interleave(frames, np.ascontiguousarray(idx, dtype=np.intp), out)
    else:
        _gather_nhwc_numpy(frames, idx, out)
    return out


def interleave_takes(frames, k):
    """Whether the C kernel's ``interleave`` takes NHWC gathers of ``k`` frames from ``frames``
    (where the kernel is there)."""
    return frames.itemsize == 1 and 2 <= k <= 8 and frames.flags.c_contiguous


def sampler_takes(frames, k, layout):
    """Whether the memory's C sampler (``_gather_ext.Ring``, where the sampler has one) builds
    batches of ``k`` frames a row in ``layout`` from ``frames``."""
    return layout == 'NCHW' or k == 1 or interleave_takes(frames, k)


def gather_history(frames, idx, kernel):
    """:func:`gather_frames` NHWC for indices the caller built itself (in range, intp): the
    acting path's per-step state gather, without the checks that cost as much as the copy.
    `kernel`: the caller's `_gather_ext`, or None for numpy."""
    out = np.empty((idx.shape[0],) + frames.shape[1:] + (idx.shape[1],), frames.dtype)
    if kernel is not None and frames.itemsize == 1 and 2 <= idx.shape[1] <= 8:
        kernel.interleave(frames, idx, out)
        return out
    return _gather_nhwc_numpy(frames, idx, out)


def _gather_nhwc_numpy(frames, idx, out):
    """Pure-numpy NHWC: gather one history column at a time, then one strided copy into
    out[..., j]. Per column, the copy's inner loop runs along a whole frame; copying the
    transposed view np.moveaxis(frames[idx], 1, -1) instead has an inner loop of only K
    elements and is ~5x slower. (Chunking rows to stay in L2 was measured: no gain.)"""
    column = np.empty((idx.shape[0],) + frames.shape[1:], frames.dtype)
    for j in range(idx.shape[1]):
        np.take(frames, idx[:, j], axis=0, out=column, mode='wrap')
        out[..., j] = column
    return out


def _check_out(out, shape, dtype):
    if out is None:
        return np.empty(shape, dtype)
    if not isinstance(out, np.ndarray):
        raise ValueError('out must be a numpy array, got %s' % type(out).__name__)
    if out.shape != shape or out.dtype != dtype:
        raise ValueError('out must have shape %s and dtype %s, got %s %s'
                         % (shape, dtype, out.shape, out.dtype))
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError('out must be a writable C-contiguous array')
    return out
