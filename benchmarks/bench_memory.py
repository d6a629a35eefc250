"""Replay-memory benchmark: bytes per step and sampling speed against the plain-gather bound.

Setup (issue 2): 84x84 uint8 frames, history 4, batch 64, a 200k-step memory filled by four
writers with episodes of random length. In the same run, interleaved round by round:

- ``NHWC``: ``sample_batch(64)`` in tensorpack's channels-last layout ``(64, 84, 84, 5)``;
- ``NCHW``: ``sample_batch(64, layout='NCHW')``, ``(64, 5, 84, 84)``;
- ``bound``: ``frames[idx]``, one numpy fancy index gathering the same 64x5 frames
  (no drawing, no validity checks, no layout work): what a sampler can not beat;
- ``loop``: a per-index Python loop like the reference's (slice, pad, transpose, stack).

Figures are medians over rounds; ratios are taken within each round (the machine is shared).
Usage: python benchmarks/bench_memory.py [--rounds 15] [--batches 200]
"""

import argparse
import time

import numpy as np

from expreplay import ReplayMemory


def fill(mem, steps, rng, num_writers=4):
    pool = rng.integers(0, 256, (64,) + mem.state_shape, dtype=np.uint8)
    writers = [mem.new_writer() for _ in range(num_writers)]
    left = [0] * num_writers
    for i in range(steps + num_writers):
        lane = i % num_writers
        w = writers[lane]
        if left[lane] == 0:
            w.start_episode(pool[i % 64])
            left[lane] = int(rng.integers(100, 2000))
            continue
        left[lane] -= 1
        w.add_step(int(rng.integers(6)), float(rng.integers(-1, 2)), pool[(i + 1) % 64],
                   terminated=left[lane] == 0)
    for w in writers:
        w.close()


def rate(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--size', type=int, default=200_000, help='memory size in steps')
    ap.add_argument('--rounds', type=int, default=15, help='measurement rounds (median taken)')
    ap.add_argument('--batches', type=int, default=200, help='batches per measurement')
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    mem = ReplayMemory(args.size, (84, 84), 4)
    t = time.perf_counter()
    fill(mem, args.size, rng)
    print(f"filled {args.size} steps in {time.perf_counter() - t:.1f}s; {len(mem)} valid transitions")
    arrays = [mem._frames, mem._action, mem._reward, mem._epstep, mem._flags, mem._block_fill,
              mem._block_prev, mem._block_next, mem._block_prev_intact, mem._block_state, mem._block_gen]
    per_step = sum(a.nbytes for a in arrays) / mem.max_size
    print(f"bytes per step: {per_step:.1f} (frame {84 * 84} + {per_step - 84 * 84:.1f} overhead)")

    # Index sets for the bound, drawn the way sample_batch draws them.
    idx_sets = [mem._frame_index(mem._draw_valid_slots(64, rng)) for _ in range(args.batches)]
    frames = mem._frames
    it = iter(())

    def bound():
        nonlocal it
        try:
            idx = next(it)
        except StopIteration:
            it = iter(idx_sets)
            idx = next(it)
        return frames[idx]

    def loop_reference():
        # What the reference does per sample: slice the window, zero the frames before an
        # episode start, transpose to channels-last; then stack the batch.
        out = []
        for idx in idx_sets[0]:
            s = frames[idx].copy()
            out.append(s.transpose(1, 2, 0))
        return np.asarray(out)

    results = {k: [] for k in ('NHWC', 'NCHW', 'bound', 'loop')}
    for _ in range(args.rounds):
        results['bound'].append(rate(bound, args.batches))
        results['NHWC'].append(rate(lambda: mem.sample_batch(64, rng=rng), args.batches))
        results['NCHW'].append(rate(lambda: mem.sample_batch(64, rng=rng, layout='NCHW'), args.batches))
        results['loop'].append(rate(loop_reference, max(1, args.batches // 10)))
    r = {k: np.array(v) for k, v in results.items()}
    print(f"{'what':<8}{'batches/s (median)':>20}{'ratio to bound (median)':>26}")
    for k in ('bound', 'NHWC', 'NCHW', 'loop'):
        print(f"{k:<8}{np.median(r[k]):>20.0f}{np.median(r[k] / r['bound']):>26.3f}")


if __name__ == '__main__':
    main()
