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

The write path, same rounds, on a stream as an env produces it: ``add_step stream``, one lane
writing distinct frames (a pool of 1024 random 84x84 frames, cycled) in episodes of 200-400
steps (an end every ~300; a fresh ``new_writer()`` per measure, ``start_episode`` after each
end), against ``original append stream``, tensorpack's ``ReplayMemory.append(Experience(frame,
action, reward, isOver))`` of the same frames (its runner's convention: the state before the
action; an episode's final frame is not stored), from the reference file given by
``--reference`` (its rows are skipped with a message without it); ``--write-steps`` steps per
measure, the two in alternating order. ``add_step`` / ``original append``: the older case, ONE
frame written over and over with no episode end (the frame stays in the L1 cache, no episode
bookkeeping: a lower bound of a step's cost, not a stream). All on memories of
``--write-size`` steps written through once before the rounds (warm pages: a first write of a
page costs a page fault, which neither memory controls).

``--peers``: instead of the above, other buffers beside ours, in rounds of their own
(``peer_buffers.py``; a peer that is not installed is skipped with the reason):

- Flashbax's README set-up: a 500k buffer (``--peer-size``) of 32x32x3 observations (uint8
  here), batches of 256 transitions (an observation and the next one). Ours:
  ``ReplayMemory(500000, (32, 32, 3), 1).sample(256)``; Flashbax's flat buffer (JAX on the
  CPU, ``sample`` jitted); cpprb's ``ReplayBuffer(next_of='obs')``. The same frames, episodes
  of 200-400 steps.
- 84x84 frames with history 4, batch 64, a buffer of ``--frames-size`` steps (50k: Flashbax's
  stacked states take 28 KB a step). Ours: ``sample(64)`` (state and next state, 8 frames a row)
  and ``sample_batch(64)`` (5 frames a row). Flashbax keeps no history: its users store the
  stacked ``(84, 84, 4)`` states an env wrapper returns in its flat buffer (frames stored 4
  times; the pair it samples is the state and the next one: the same output as ``sample``), or
  single frames in its trajectory buffer sampled as runs of 5 (frames stored once, the output
  of ``sample_batch``, but runs cross episode ends, with no zeroed frames before an episode's
  first: the masking is the user's, where ours does it).

``--also-size 200000``: a second (uniform) memory of that size, filled the same way, measured
in the same rounds (``NHWC@<size>``, ``NCHW@<size>``, ``bound@<size>``, ratios to its own bound):
the two sizes side by side on the same machine at the same time.

Figures are medians over rounds; ratios are taken within each round (the machine is shared).
Memory: ``--size`` steps take ``size * 7 KB`` (1M: ~7 GB), and cpprb as much again; the
write-path rows four memories of ``--write-size`` steps (200k: 5.6 GB). ``--peers`` takes
~6 GB (three 500k buffers of 3 KB a step, 50k stacked states of 28 KB).
Usage: python benchmarks/bench_memory.py [--size 1000000] [--rounds 15] [--batches 200] [--no-cpprb]
       [--also-size 200000] [--reference path/to/tensorpack_expreplay.py] [--write-size 200000]
       [--write-steps 30000] [--peers] [--peer-size 500000] [--frames-size 50000]
"""

import argparse
import copy
import time

import numpy as np

from bench_population import load_reference   # the one loader of tensorpack's original
from expreplay import ReplayMemory
from expreplay.storage.sampling import Sampler
from expreplay.storage.distribution import UniformDistribution
from peer_buffers import cpprb_transitions, flashbax_flat, flashbax_sequences


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
    """(add_step, append) of ONE frame written over and over, no episode ends: one step of
    a lane writer, and of the original's memory, each on a memory of ``size`` steps written
    through once (warm pages). ``append`` is None without the reference. The frame stays in
    the L1 cache and no episode ends: a lower bound of the write path's cost, not a stream."""
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


def make_stream_writers(size, reference, steps, pool_size=1024, seed=3):
    """(ours, original): each writes the same ``steps`` steps of a realistic stream into its
    memory of ``size`` steps and returns how many it wrote; ``original`` is None without the
    reference.

    The stream: distinct frames (a pool of ``pool_size`` random 84x84 frames, 7 MB, cycled:
    each step's frame is another than the last, as an env's are) in episodes of 200-400 steps
    (an end every ~300). Ours: a fresh ``new_writer()`` per call, ``start_episode`` with each
    episode's first frame, ``add_step(action, reward, next_frame, terminated)`` per step. The
    original: ``append(Experience(frame, action, reward, isOver))`` per step, its
    ``EnvRunner``'s convention (the state before the action; the final frame of an episode
    is not stored). Both memories are written through once before (warm pages)."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 256, (pool_size, 84, 84), dtype=np.uint8)
    last = np.cumsum(rng.integers(200, 401, steps // 200 + 1)) - 1    # each episode's last step
    ends = np.zeros(steps, bool)
    ends[last[last < steps]] = True
    ends = ends.tolist()
    # The frames of the stream in order: the first of an episode, then each step's next one.
    frames = [pool[i % pool_size] for i in range(steps + sum(ends) + 1)]
    mem = ReplayMemory(size, (84, 84), 4)

    def ours():
        it = iter(frames)
        w = mem.new_writer()
        add_step, start_episode = w.add_step, w.start_episode
        start_episode(next(it))
        for end in ends:
            add_step(1, 1.0, next(it), end)
            if end:
                start_episode(next(it))
        w.close()
        return len(ends)

    warm(ours, size, len(ends))
    if reference is None:
        return ours, None
    original = reference.ReplayMemory(size, (84, 84), 4)
    experience = reference.Experience

    def theirs():
        it = iter(frames)
        append = original.append
        for end in ends:
            append(experience(next(it), 1, 1.0, end))
            if end:
                next(it)          # the final frame, which the original does not store
        next(it)
        return len(ends)

    warm(theirs, size, len(ends))
    return ours, theirs


def warm(write, size, steps):
    """Write through a memory once (its pages touched before the rounds)."""
    for _ in range(size // steps + 1):
        write()


def rate_of(write):
    """Steps per second of one call of ``write`` (which returns the steps it wrote)."""
    t = time.perf_counter()
    n = write()
    return n / (time.perf_counter() - t)


def rate(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t)


PEER_RATIOS = [('ours 32x32x3 b256', 'flashbax flat 32x32x3 b256'),
               ('ours 32x32x3 b256', 'cpprb 32x32x3 b256'),
               ('ours sample(64)@frames', 'flashbax flat stacked@frames'),
               ('ours sample_batch(64)@frames', 'flashbax runs of 5@frames')]


def make_peers(args, rng):
    """``{row: draw one batch}`` of the peers' cases (see the module docstring); a peer that is
    not installed is skipped with the reason printed."""
    peers = {}
    calls = args.batches * args.rounds + 1

    def peer(row, build):
        try:
            peers[row] = build()
        except ImportError as err:
            print(f"{row}: skipped, {err.name} is not installed (pip install {err.name})")

    # Flashbax's README set-up: a 500k buffer of 32x32x3 observations, batches of 256
    # transitions (an observation and the next one). uint8 frames (a pool of 4096, cycled),
    # episodes of 200-400 steps; each buffer built from the pool, no full copy made here.
    n = args.peer_size
    pool = rng.integers(0, 256, (4096, 32, 32, 3), dtype=np.uint8)
    last = np.cumsum(rng.integers(200, 401, n // 200 + 1)) - 1
    last = last[last < n]
    mem = ReplayMemory(n, (32, 32, 3), 1)
    w = mem.new_writer()
    w.start_episode(pool[0])
    is_last = np.zeros(n, bool)
    is_last[last] = True
    for t in range(n):
        w.add_step(0, 0.0, pool[(t + 1) % len(pool)], bool(is_last[t]))
        if is_last[t]:
            w.start_episode(pool[(t + 1) % len(pool)])
    w.close()
    peers['ours 32x32x3 b256'] = lambda: mem.sample(256, rng=rng)
    peer('flashbax flat 32x32x3 b256', lambda: flashbax_flat(pool, n, 256, calls))
    peer('cpprb 32x32x3 b256', lambda: cpprb_transitions(pool, n, 256, last + 1))
    # 84x84 frames, history 4, batch 64, a buffer of --frames-size steps. Ours: sample(64)
    # (state and next state, 4 frames each) and sample_batch(64) (5 frames a row). Flashbax:
    # its flat buffer of stacked (84, 84, 4) states (frames stored 4 times; the state and the
    # next one are the pair it samples), and its trajectory buffer of single frames sampled as
    # runs of 5 (frames stored once, like ours; runs cross episode ends, which ours never do).
    f = args.frames_size
    small = ReplayMemory(f, (84, 84), 4)
    fill(small, f, np.random.default_rng(4))
    peers['ours sample(64)@frames'] = lambda: small.sample(64, rng=rng)
    peers['ours sample_batch(64)@frames'] = lambda: small.sample_batch(64, rng=rng)
    frames = rng.integers(0, 256, (1024, 84, 84), dtype=np.uint8)[np.arange(f + 3) % 1024]
    peer('flashbax flat stacked@frames', lambda: flashbax_flat(frames, f, 64, calls, stack=4))
    peer('flashbax runs of 5@frames', lambda: flashbax_sequences(frames[:f], 5, 64, calls))
    return peers


def run_peers(args):
    """The peers' rows alone (``--peers``), in rounds of their own."""
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    peers = make_peers(args, rng)
    print(f"peers: built in {time.perf_counter() - t:.1f}s")
    results = {k: [] for k in peers}
    for i in range(args.rounds):
        for k, draw in (list(peers.items()) if i % 2 == 0 else list(peers.items())[::-1]):
            results[k].append(rate(draw, args.batches))
    r = {k: np.array(v) for k, v in results.items()}
    print(f"{'what':<32}{'batches/s (median)':>20}{'ms a batch':>12}")
    for k in peers:
        print(f"{k:<32}{np.median(r[k]):>20.0f}{1e3 / np.median(r[k]):>12.3f}")
    print("\nratios (median of within-round ratios of batches/s):")
    for a, b in PEER_RATIOS:
        if a in r and b in r:
            print(f"  {a} / {b}: {np.median(r[a] / r[b]):.2f}")


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
    ap.add_argument('--write-steps', type=int, default=30_000,
                    help='steps of the stream written per write-path measure')
    ap.add_argument('--peers', action='store_true',
                    help="instead, the peers' cases: Flashbax's README set-up and 84x84 frames "
                    "with history 4 against Flashbax's buffers (and cpprb)")
    ap.add_argument('--peer-size', type=int, default=500_000,
                    help="buffer size (steps) of Flashbax's README case (32x32x3, batch 256)")
    ap.add_argument('--frames-size', type=int, default=50_000,
                    help="buffer size (steps) of the 84x84 history-4 peers' case (Flashbax "
                    "stores stacked states there: 28 KB a step)")
    args = ap.parse_args()
    if args.peers:
        return run_peers(args)

    rng = np.random.default_rng(0)
    pmem = ReplayMemory(args.size, (84, 84), 4, prioritized=True)
    # The uniform twin: the same arrays (frames, flags, blocks, counts) without the priority
    # tree.
    mem = copy.copy(pmem)
    mem.ring = copy.copy(pmem.ring)
    mem.ring.distribution = UniformDistribution()
    mem.sampler = Sampler(mem.ring)
    episodes = []
    t = time.perf_counter()
    pool = fill(pmem, args.size, rng, episodes=episodes)
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
    stream_ours, stream_theirs = make_stream_writers(args.write_size, reference, args.write_steps)
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
             'uniform n3', 'per n1', 'per n3', 'update', 'add_step', 'add_step stream']
    if rb is not None:
        kinds += ['cpprb uniform', 'cpprb per', 'cpprb update']
    if append is not None:
        kinds += ['original append', 'original append stream']
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
        # the stream's two writers in alternating order (the first may find caches the
        # other's run left cold)
        pair = [('add_step stream', stream_ours), ('original append stream', stream_theirs)]
        for k, write in (pair if len(results['add_step stream']) % 2 == 0 else pair[::-1]):
            if write is not None:
                results[k].append(rate_of(write))
        if rb is not None:
            results['cpprb uniform'].append(rate(lambda: urb.sample(64), args.batches))
            results['cpprb per'].append(rate(lambda: rb.sample(64, beta=0.4), args.batches))
            results['cpprb update'].append(rate(
                lambda: rb.update_priorities(rb_sampled['indexes'], new_priorities),
                5 * args.batches))
    r = {k: np.array(v) for k, v in results.items()}
    print(f"{'what':<32}{'calls/s (median)':>18}{'ratio to bound (median)':>26}")
    for k in kinds:
        ref = r['bound' + tag] if small is not None and k.endswith(tag) else r['bound']
        bounded = (k not in ('add_step', 'original append', 'update', 'cpprb update')
                   and 'stream' not in k)
        print(f"{k:<32}{np.median(r[k]):>18.0f}"
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
        print(f"  add_step / the original's append, one frame repeated, no episode ends: "
              f"{ratio('add_step', 'original append'):.2f}")
        print(f"  add_step / the original's append, a stream (distinct frames, an episode end "
              f"every ~300 steps): {ratio('add_step stream', 'original append stream'):.2f}")
    else:
        print("  (no --reference: the original's append rows were skipped)")


if __name__ == '__main__':
    main()
