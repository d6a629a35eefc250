"""What a draw costs when the batches before it are still held: the cache, not the copy.

    python benchmarks/bench_draw_cache.py                 # ~1 minute
    python benchmarks/bench_draw_cache.py --held 0 1 4 8 --rounds 5

A learner's pipeline keeps several batches alive at once (the prefetch buffer, the batch being
trained on), so the memory fills arrays that have left the cache since their last use, where a
loop that drops each batch at once refills the same arrays, still cached. This measures the CPU
of one ``sample(64)`` (state and next state, 84x84 frames, history 4, from a 50k-step memory of
distinct frames with episode ends) and of one ``sample_batch(64)`` while the last K batches are
held, K interleaved within each round; medians of the rounds. ``bench_e2e.py --profile``
compares the pipeline's draw with the K = 0 case, its floor.
"""

import argparse
import collections
import statistics
import time

import numpy as np

from expreplay import ReplayMemory


def filled_memory(size, seed=0):
    """A memory of ``size`` steps of distinct 84x84 frames, an episode end every 300 steps."""
    mem = ReplayMemory(size, (84, 84), 4)
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 256, (1024, 84, 84), dtype=np.uint8)
    w = mem.new_writer()
    w.start_episode(pool[0])
    for i in range(size):
        w.add_step(i % 6, 0.0, pool[i % 1024], i % 300 == 299)
        if i % 300 == 299:
            w.start_episode(pool[(i + 7) % 1024])
    return mem


def cpu_ms_per_draw(draw, held, calls, rng):
    """CPU ms of one ``draw(64, rng=rng)`` while the last ``held`` batches stay referenced."""
    keep = collections.deque(maxlen=held) if held else None
    for _ in range(held + 2):                 # the held batches exist before the clock starts
        batch = draw(64, rng=rng)
        if keep is not None:
            keep.append(batch)
    del batch
    c0 = time.thread_time()
    for _ in range(calls):
        batch = draw(64, rng=rng)
        if keep is not None:
            keep.append(batch)
        del batch
    return (time.thread_time() - c0) / calls * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--held', type=int, nargs='+', default=[0, 1, 2, 4, 6],
                   help='numbers of earlier batches kept alive while drawing')
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--calls', type=int, default=300, help='draws per measure')
    p.add_argument('--size', type=int, default=50_000, help='memory size in steps')
    args = p.parse_args()
    mem = filled_memory(args.size)
    rng = np.random.default_rng(1)
    results = collections.defaultdict(list)
    for r in range(args.rounds):
        order = args.held if r % 2 == 0 else args.held[::-1]
        for held in order:
            for name in ('sample', 'sample_batch'):
                results[name, held].append(
                    cpu_ms_per_draw(getattr(mem, name), held, args.calls, rng))
    print(f"CPU ms per draw of 64 (84x84, history 4, a {args.size}-step memory), medians of "
          f"{args.rounds} rounds:")
    print("| batches held | sample(64) | sample_batch(64) |")
    print("|---|---|---|")
    for held in args.held:
        print(f"| {held} | {statistics.median(results['sample', held]):.3f} | "
              f"{statistics.median(results['sample_batch', held]):.3f} |")


if __name__ == '__main__':
    main()
