"""Replay-memory benchmark: bytes per step, sampling and writing speed against their bounds and peers.

Setup: 84x84 uint8 frames, history 4, batch 64, a 200k-step memory filled by four
writers with episodes of random length. In the same run, interleaved round by round:

- ``NHWC``: ``sample_batch(64)`` in tensorpack's channels-last layout ``(64, 84, 84, 5)``;
- ``NCHW``: ``sample_batch(64, layout='NCHW')``, ``(64, 5, 84, 84)``;
- ``bound``: ``frames[idx]``, one numpy fancy index gathering the same 64x5 frames
  (no drawing, no validity checks, no layout work): what a sampler can not beat. Each call
  gathers a new index set, drawn the way sample_batch draws (all drawn before the rounds): a
  few hundred sets reused every round made the bound ~35% faster at 1M steps (their pages fit
  the TLB; the whole ring's do not) and every ratio to it look worse at 1M than at 200k;
- ``loop``: a per-index Python loop like the reference's (slice, pad, transpose, stack).

Rainbow-side figures, same run, same memory (prioritized; its uniform twin shares
the frames), batch 64:

- ``uniform n1`` / ``uniform n3``: ``sample(64)`` / ``sample(64, n_step=3)`` on the uniform twin
  (state and next state, ``history_len`` frames each, NHWC);
- ``per n1`` / ``per n3``: the same, drawn by priority with importance weights (beta 0.4);
- ``uniform n1 out`` / ``NHWC out``: ``sample(64, out=batch)`` / ``sample_batch(64, out=batch)``,
  refilling the arrays of an earlier batch (what a sampling loop that allocates nothing does);
- ``update``: ``update_priorities`` of one batch's 64 indices;
- ``cpprb uniform`` / ``cpprb per`` / ``cpprb update``: cpprb's ``ReplayBuffer`` and
  ``PrioritizedReplayBuffer`` (``next_of='obs'``, ``stack_compress='obs'``: frames stored once, as
  here) filled with the same frames and episodes, ``sample(64)``, ``sample(64, beta=0.4)`` and
  ``update_priorities``; only when cpprb is installed (``pip install cpprb``; a benchmark-only
  dependency).

The write path, same rounds: ``add_step``, one lane's ``LaneWriter.add_step(action, reward,
frame)`` on a memory of ``--write-size`` steps, against ``original append``, tensorpack's
``ReplayMemory.append(Experience(frame, action, reward, False))`` from the reference file given by
``--reference`` (its rows are skipped with a message without it). Both are called from the same
kind of Python loop, on memories written through once before the rounds (warm pages: a first
write of a page costs a page fault, which neither memory controls).

``--also-size 200000``: a second (uniform) memory of that size, filled the same way, measured
in the same rounds (``NHWC@<size>``, ``NCHW@<size>``, ``bound@<size>``, ratios to its own bound):
the two sizes side by side on the same machine at the same time.

Figures are medians over rounds; ratios are taken within each round (the machine is shared).
Memory: ``--size`` steps take ``size * 7 KB`` (1M: ~7 GB), and cpprb as much again.
Usage: python benchmarks/bench_memory.py [--size 1000000] [--rounds 15] [--batches 200] [--no-cpprb]
       [--also-size 200000] [--reference path/to/tensorpack_expreplay.py] [--write-size 200000]
"""

import argparse
import copy
import time

import numpy as np

from bench_population import load_reference   # the one loader of tensorpack's original
from expreplay import ReplayMemory
from expreplay.storage.sampling import Sampler


def fill(mem, steps, rng, num_writers=4, episodes=None):
    """Four writers, episodes of random length; ``episodes`` (a list) receives each episode's
    (frame pool indices, actions, rewards), so that cpprb can be given the same data."""
    pool = rng.integers(0, 256, (64,) + mem.state_shape, dtype=np.uint8)
    writers = [mem.new_writer() for _ in range(num_writers)]
    left = [0] * num_writers
    current = [None] * num_writers
    for i in range(steps + num_writers):
        lane = i % num_writers
        w = writers[lane]
        if left[lane] == 0:
            w.start_episode(pool[i % 64])
            left[lane] = int(rng.integers(100, 2000))
            current[lane] = ([i % 64], [], [])
            continue
        left[lane] -= 1
        action, reward = int(rng.integers(6)), float(rng.integers(-1, 2))
        w.add_step(action, reward, pool[(i + 1) % 64], terminated=left[lane] == 0)
        frames, actions, rewards = current[lane]
        frames.append((i + 1) % 64)
        actions.append(action)
        rewards.append(reward)
        if left[lane] == 0 and episodes is not None:
            episodes.append(current[lane])
    for w in writers:
        w.close()
    return pool


def fill_cpprb(size, pool, episodes, history_len, prioritized=True):
    """cpprb's PrioritizedReplayBuffer (or ReplayBuffer) holding the same episodes as stacked
    NHWC states."""
    import cpprb
    shape = pool.shape[1:] + (history_len,)
    rb = (cpprb.PrioritizedReplayBuffer if prioritized else cpprb.ReplayBuffer)(
        size, {'obs': {'shape': shape, 'dtype': np.uint8}, 'act': {'dtype': np.int32},
               'rew': {}, 'done': {}}, next_of='obs', stack_compress='obs')
    zero = np.zeros((history_len - 1,) + pool.shape[1:], np.uint8)
    added = 0
    for frames, actions, rewards in episodes:
        seq = np.concatenate([zero, pool[frames]])                  # (h - 1 + L + 1, 84, 84)
        stacks = np.lib.stride_tricks.sliding_window_view(seq, history_len, axis=0)  # (L+1, 84, 84, h)
        n = len(actions)
        done = np.zeros(n, np.float32)
        done[-1] = 1
        for lo in range(0, n, 500):   # chunks: a whole episode's copies would be large
            hi = min(n, lo + 500)
            rb.add(obs=np.ascontiguousarray(stacks[lo:hi]),
                   next_obs=np.ascontiguousarray(stacks[lo + 1:hi + 1]),
                   act=np.asarray(actions[lo:hi], np.int32), rew=np.asarray(rewards[lo:hi]),
                   done=done[lo:hi])
        rb.on_episode_end()
        added += n
        if added >= size:
            break
    return rb


def make_writers(size, reference):
    """(add_step, append): one step of a lane writer, and of the original's memory, each on a
    memory of ``size`` steps written through once (warm pages). ``append`` is None without
    the reference."""
    frame = np.random.default_rng(2).integers(0, 256, (84, 84), dtype=np.uint8)
    mem = ReplayMemory(size, (84, 84), 4)
    writer = mem.new_writer()
    writer.start_episode(frame)
    for _ in range(size + size // 4):
        writer.add_step(1, 1.0, frame)

    def add_step():
        writer.add_step(1, 1.0, frame)
    if reference is None:
        return add_step, None
    original = reference.ReplayMemory(size, (84, 84), 4)
    experience = reference.Experience
    for _ in range(size):
        original.append(experience(frame, 1, 1.0, False))

    def append():
        original.append(experience(frame, 1, 1.0, False))
    return add_step, append


def rate(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--size', type=int, default=1_000_000, help='memory size in steps')
    ap.add_argument('--no-cpprb', action='store_true', help='skip the cpprb comparison')
    ap.add_argument('--rounds', type=int, default=15, help='measurement rounds (median taken)')
    ap.add_argument('--batches', type=int, default=200, help='batches per measurement')
    ap.add_argument('--also-size', type=int, default=None,
                    help='also measure sample_batch on a memory of this size, same rounds')
    ap.add_argument('--reference', default=None,
                    help="tensorpack's original expreplay.py, for the write path's comparison")
    ap.add_argument('--write-size', type=int, default=200_000,
                    help='memory size (steps) of the write-path rows')
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    pmem = ReplayMemory(args.size, (84, 84), 4, prioritized=True)
    # The uniform twin: the same arrays (frames, flags, blocks) without the priority tree.
    mem = copy.copy(pmem)
    mem.ring = copy.copy(pmem.ring)
    mem.ring.priorities = None
    mem.sampler = Sampler(mem.ring)
    episodes = []
    t = time.perf_counter()
    pool = fill(pmem, args.size, rng, episodes=episodes)
    mem.ring.num_valid = pmem.ring.num_valid
    print(f"filled {args.size} steps in {time.perf_counter() - t:.1f}s; {len(mem)} valid transitions")
    rb = urb = None
    if not args.no_cpprb:
        try:
            t = time.perf_counter()
            rb = fill_cpprb(args.size, pool, episodes, 4)
            urb = fill_cpprb(args.size, pool, episodes, 4, prioritized=False)
            print(f"cpprb: filled {rb.get_stored_size()} transitions twice in "
                  f"{time.perf_counter() - t:.1f}s")
        except ImportError:
            print("cpprb is not installed: no comparison (pip install cpprb)")
    del episodes
    reference = None
    if args.reference:
        reference = load_reference(args.reference)
    else:
        print("no --reference given: the original's append rows are skipped")
    add_step, append = make_writers(args.write_size, reference)
    r = mem.ring
    arrays = [r.frames, r.action, r.reward, r.epstep, r.flags, r.block_fill, r.block_prev,
              r.block_next, r.block_prev_intact, r.block_state, r.block_gen]
    per_step = sum(a.nbytes for a in arrays) / mem.max_size
    print(f"bytes per step: {per_step:.1f} (frame {84 * 84} + {per_step - 84 * 84:.1f} overhead)")
    tree = pmem.ring.priorities.tree
    tree_bytes = sum(a.nbytes for a in tree._sum + tree._min)
    print(f"priority tree: {tree_bytes / mem.max_size:.1f} bytes per step more "
          f"(fanout {tree.fanout}, depth {tree.depth})")

    def make_bound(m):
        """frames[idx], each call a new index set drawn the way sample_batch draws them (a
        set reused would find its pages in the TLB, which fresh draws from a 1M ring do not)."""
        idx_sets = [m.ring.frame_index(m.sampler.draw_uniform(64, rng))
                    for _ in range(args.batches * args.rounds)]
        frames = m.ring.frames
        it = iter(idx_sets)

        def bound():
            return frames[next(it)]
        return bound, idx_sets[:args.batches]

    bound, idx_sets = make_bound(mem)
    frames = mem.ring.frames
    small = None
    if args.also_size:
        small = ReplayMemory(args.also_size, (84, 84), 4)
        t = time.perf_counter()
        fill(small, args.also_size, np.random.default_rng(1))
        print(f"also: filled {args.also_size} steps in {time.perf_counter() - t:.1f}s")
        small_bound, _ = make_bound(small)

    def loop_reference():
        # What the reference does per sample: slice the window, zero the frames before an
        # episode start, transpose to channels-last; then stack the batch.
        out = []
        for idx in idx_sets[0]:
            s = frames[idx].copy()
            out.append(s.transpose(1, 2, 0))
        return np.asarray(out)

    sampled = pmem.sample(64, rng=rng)
    new_priorities = rng.random(64) * 2
    if rb is not None:
        rb_sampled = rb.sample(64, beta=0.4)
    reused = mem.sample(64, rng=rng)
    reused_batch = mem.sample_batch(64, rng=rng)

    kinds = ['NHWC', 'NHWC out', 'NCHW', 'bound', 'loop', 'uniform n1', 'uniform n1 out',
             'uniform n3', 'per n1', 'per n3', 'update', 'add_step']
    if rb is not None:
        kinds += ['cpprb uniform', 'cpprb per', 'cpprb update']
    if append is not None:
        kinds += ['original append']
    if small is not None:
        tag = f"@{args.also_size // 1000}k"
        kinds += ['NHWC' + tag, 'NCHW' + tag, 'bound' + tag]
    results = {k: [] for k in kinds}
    for _ in range(args.rounds):
        if small is not None:
            results['bound' + tag].append(rate(small_bound, args.batches))
            results['NHWC' + tag].append(rate(lambda: small.sample_batch(64, rng=rng), args.batches))
            results['NCHW' + tag].append(rate(lambda: small.sample_batch(64, rng=rng, layout='NCHW'),
                                              args.batches))
        results['bound'].append(rate(bound, args.batches))
        results['NHWC'].append(rate(lambda: mem.sample_batch(64, rng=rng), args.batches))
        results['NHWC out'].append(rate(lambda: mem.sample_batch(64, rng=rng, out=reused_batch),
                                        args.batches))
        results['NCHW'].append(rate(lambda: mem.sample_batch(64, rng=rng, layout='NCHW'), args.batches))
        results['loop'].append(rate(loop_reference, max(1, args.batches // 10)))
        results['uniform n1'].append(rate(lambda: mem.sample(64, rng=rng), args.batches))
        results['uniform n1 out'].append(rate(lambda: mem.sample(64, rng=rng, out=reused),
                                              args.batches))
        results['uniform n3'].append(rate(lambda: mem.sample(64, n_step=3, rng=rng), args.batches))
        results['per n1'].append(rate(lambda: pmem.sample(64, beta=0.4, rng=rng), args.batches))
        results['per n3'].append(rate(lambda: pmem.sample(64, n_step=3, beta=0.4, rng=rng),
                                      args.batches))
        results['update'].append(rate(lambda: pmem.update_priorities(sampled.indices,
                                                                     new_priorities),
                                      5 * args.batches))
        results['add_step'].append(rate(add_step, 100 * args.batches))
        if append is not None:
            results['original append'].append(rate(append, 100 * args.batches))
        if rb is not None:
            results['cpprb uniform'].append(rate(lambda: urb.sample(64), args.batches))
            results['cpprb per'].append(rate(lambda: rb.sample(64, beta=0.4), args.batches))
            results['cpprb update'].append(rate(
                lambda: rb.update_priorities(rb_sampled['indexes'], new_priorities),
                5 * args.batches))
    r = {k: np.array(v) for k, v in results.items()}
    print(f"{'what':<16}{'calls/s (median)':>18}{'ratio to bound (median)':>26}")
    for k in kinds:
        ref = r['bound' + tag] if small is not None and k.endswith(tag) else r['bound']
        bounded = k not in ('add_step', 'original append', 'update', 'cpprb update')
        print(f"{k:<16}{np.median(r[k]):>18.0f}"
              + (f"{np.median(r[k] / ref):>26.3f}" if bounded else f"{'-':>26}"))

    def ratio(a, b):   # median over rounds of the within-round ratio of rates
        return float(np.median(r[a] / r[b]))

    print("\nratios (median of within-round ratios):")
    print(f"  sample_batch(64) NHWC / gather bound:        {ratio('NHWC', 'bound'):.2f}")
    print(f"  sample_batch(64, out=) NHWC / gather bound:  {ratio('NHWC out', 'bound'):.2f}")
    print(f"  prioritized / uniform sampling (n=1):        {ratio('per n1', 'uniform n1'):.2f}")
    print(f"  update_priorities(64) time / one PER sample: {ratio('per n1', 'update'):.3f}")
    print(f"  n-step (n=3) / 1-step sample():              {ratio('uniform n3', 'uniform n1'):.2f}")
    print(f"  n-step (n=3) sample() / sample_batch():      {ratio('uniform n3', 'NHWC'):.2f}"
          "   (sample_batch gathers 5 frames a row, sample() 8)")
    if rb is not None:
        print(f"  sample(64) / cpprb uniform sample:           {ratio('uniform n1', 'cpprb uniform'):.2f}")
        print(f"  sample(64, out=) / cpprb uniform sample:     {ratio('uniform n1 out', 'cpprb uniform'):.2f}")
        print(f"  PER sample / cpprb PER sample:               {ratio('per n1', 'cpprb per'):.2f}")
        print(f"  update_priorities / cpprb's:                 {ratio('update', 'cpprb update'):.2f}")
    if append is not None:
        print(f"  add_step / the original's append:            {ratio('add_step', 'original append'):.2f}")


if __name__ == '__main__':
    main()
