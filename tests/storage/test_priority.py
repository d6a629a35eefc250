"""Prioritized replay: the tree against brute force, the sampling distribution (chi-square over
more than a million draws), the importance weights' formula, stale priority updates, evicted
slots leaving the tree, and writers + sampler + priority updates running concurrently."""

import math
import threading

import numpy as np
import pytest

from expreplay import ReplayMemory
from expreplay.storage.priority import SumMinTree
from expreplay import _kernels
from kernel_paths import PATHS, kernel_path
from test_memory import FRAME_SHAPE, action_of, decode, encode, reward_of
from test_nstep import Script, ScriptedWriters

VALID = 1


@pytest.fixture(autouse=True, params=PATHS)
def tree_impl(request):
    """Every test with the optional C tree kernel and with the numpy tree it stands in for."""
    with kernel_path(request.param, '_tree_ext'):
        yield request.param


def test_the_kernel_validates_its_arguments(tree_impl):
    if tree_impl == 'numpy':
        pytest.skip("C only")
    _tree_ext = _kernels.get('_tree_ext')
    tree = SumMinTree(100, fanout=4)
    sums, mins = tree.sum_levels, tree.min_levels
    out = np.empty(3, np.int64)
    with pytest.raises(ValueError, match='float64'):
        _tree_ext.find(tuple(a.astype(np.float32) for a in sums), np.zeros(3), out, 4)
    with pytest.raises(ValueError, match='length of u'):
        _tree_ext.find(sums, np.zeros(2), out, 4)
    with pytest.raises(ValueError, match='too short'):
        _tree_ext.find(sums[:1] + (np.zeros(2),), np.zeros(3), out, 4)
    with pytest.raises(ValueError, match='fanout'):
        _tree_ext.find(sums, np.zeros(3), out, 1)
    with pytest.raises(IndexError, match='leaf index'):
        _tree_ext.refresh(sums, mins, np.array([100000]), 4)
    with pytest.raises(ValueError, match='same levels'):
        _tree_ext.refresh(sums, mins[:-1], np.array([1]), 4)
    with pytest.raises(IndexError, match='leaf range'):
        _tree_ext.refresh_range(sums, mins, 0, 10 ** 6, 4)
    with pytest.raises(ValueError, match='int64'):
        _tree_ext.refresh(sums, mins, np.array([1.0]), 4)


def chi2_critical(dof, z=3.09):
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.09: p = 0.999)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi2(counts, probs):
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize('capacity,fanout', [(1, 2), (5, 2), (1000, 32), (4097, 16), (33, 32)])
def test_tree_matches_brute_force(capacity, fanout):
    rng = np.random.default_rng(capacity)
    tree = SumMinTree(capacity, fanout=fanout)
    leaves = np.zeros(capacity)
    for _ in range(50):
        idx = np.unique(rng.integers(0, capacity, rng.integers(1, 20)))
        values = np.where(rng.random(len(idx)) < 0.2, 0.0, rng.random(len(idx)) * 10)
        tree.set(idx, values)
        leaves[idx] = values
        if rng.random() < 0.2:
            lo = int(rng.integers(0, capacity))
            hi = int(rng.integers(lo, capacity + 1))
            tree.clear_range(lo, hi)
            leaves[lo:hi] = 0
        assert tree.total == pytest.approx(leaves.sum())
        present = leaves[leaves > 0]
        assert tree.min == (present.min() if len(present) else np.inf)
        np.testing.assert_array_equal(tree.get(np.arange(capacity)), leaves)
        if leaves.sum() > 0:
            u = rng.random(200) * leaves.sum()
            cum = np.cumsum(leaves)
            expected = np.searchsorted(cum, u, side='right')
            got = tree.find(u)
            ok = leaves[got] > 0
            # Rounding may only differ at a boundary, and only onto the neighbouring leaf.
            np.testing.assert_array_equal(got[ok], expected[ok])
            assert ok.mean() > 0.95


def filled_prioritized(max_size=300, num_lanes=3, rounds=400, seed=0, **kwargs):
    mem = ReplayMemory(max_size, FRAME_SHAPE, 2, block_size=10, prioritized=True, **kwargs)
    script = Script()
    writers = ScriptedWriters(mem, num_lanes, np.random.default_rng(seed), script)
    writers.write(rounds)
    return mem, script, writers


def all_tokens(mem):
    slots = np.flatnonzero(mem.ring.flags & VALID)
    return slots, mem.ring.block_gen[slots // mem.block_size] * mem.num_slots + slots


def test_sampling_distribution_chi_square_over_a_million_draws():
    alpha, eps = 0.7, 1e-6
    mem, _, _ = filled_prioritized(alpha=alpha, priority_eps=eps)
    slots, tokens = all_tokens(mem)
    rng = np.random.default_rng(1)
    # A wide spread of priorities, some tiny, some zero (eps keeps them drawable).
    priorities = rng.exponential(1.0, len(slots)) ** 2
    priorities[::17] = 0.0
    assert mem.update_priorities(tokens, priorities) == 0
    p = (priorities + eps) ** alpha
    probs = p / p.sum()
    # Cells: one per slot, pooling slots with tiny expected counts into one cell.
    draws, batch = 1_200_000, 200
    counts = np.zeros(mem.num_slots, np.int64)
    for _ in range(draws // batch + 1):
        b = mem.sample(batch, rng=rng)
        np.add.at(counts, b.indices % mem.num_slots, 1)
    assert counts.sum() >= 1_000_000
    assert counts[np.setdiff1d(np.arange(mem.num_slots), slots)].sum() == 0, "non-valid drawn"
    obs, exp = counts[slots], probs
    big = exp * counts.sum() >= 5
    obs = np.append(obs[big], obs[~big].sum())
    exp = np.append(exp[big], exp[~big].sum())
    stat = chi2(obs, exp)
    assert stat < chi2_critical(len(obs) - 1), (stat, len(obs))
    # The test has power: the same counts are far from uniform sampling.
    assert chi2(counts[slots], np.full(len(slots), 1 / len(slots))) > 10 * chi2_critical(len(slots) - 1)


def test_weights_equal_the_formula():
    mem, _, _ = filled_prioritized(seed=3)
    slots, tokens = all_tokens(mem)
    rng = np.random.default_rng(2)
    priorities = rng.random(len(slots)) * 5
    mem.update_priorities(tokens, priorities)
    p = (priorities + 1e-6) ** 0.6
    P = p / p.sum()
    N = len(mem)
    assert N == len(slots)
    for beta in (0.0, 0.4, 1.0):
        b = mem.sample(200, beta=beta, rng=rng)
        pos = np.searchsorted(slots, b.indices % mem.num_slots)
        w = (N * P[pos]) ** -beta / ((N * P) ** -beta).max()
        np.testing.assert_allclose(b.weights, w, rtol=1e-5)
    assert np.all(mem.sample(64, rng=rng).weights == 1)     # beta=None: no correction


def test_batch_weight_norm_divides_by_the_batch_largest_weight():
    mem, _, _ = filled_prioritized(seed=3)
    slots, tokens = all_tokens(mem)
    rng = np.random.default_rng(2)
    priorities = rng.random(len(slots)) * 5
    priorities[0] = 0.0                  # one near-zero priority: the memory's largest weight
    mem.update_priorities(tokens, priorities)
    p = (priorities + 1e-6) ** 0.6
    P = p / p.sum()
    N = len(mem)
    for beta in (0.4, 1.0):
        b = mem.sample(200, beta=beta, rng=np.random.default_rng(5), weight_norm='batch')
        m = mem.sample(200, beta=beta, rng=np.random.default_rng(5))      # the same draw
        np.testing.assert_array_equal(b.indices, m.indices)
        pos = np.searchsorted(slots, b.indices % mem.num_slots)
        w = (N * P[pos]) ** -beta
        np.testing.assert_allclose(b.weights, w / w.max(), rtol=1e-5)
        assert b.weights.max() == pytest.approx(1.0)
        # the memory-wide normalisation divides by the near-zero priority's weight instead
        np.testing.assert_allclose(m.weights, b.weights * w.max() / ((N * P) ** -beta).max(),
                                   rtol=1e-5)
        assert m.weights.max() < 0.1
    with pytest.raises(ValueError, match='weight_norm'):
        mem.sample(8, beta=0.4, weight_norm='max')


def test_new_steps_enter_at_running_max_priority():
    mem, _, writers = filled_prioritized(seed=4)
    slots, tokens = all_tokens(mem)
    mem.update_priorities(tokens, np.full(len(slots), 0.5))
    mem.update_priorities(tokens[:1], [7.0])
    writers.write(3)
    mem.sample(1)   # flushes the queued new steps into the tree
    new = np.setdiff1d(np.flatnonzero(mem.ring.flags & VALID), slots)
    assert len(new) > 0
    tree = mem.ring.priorities.tree
    np.testing.assert_allclose(tree.get(new), (7.0 + 1e-6) ** 0.6)


def test_stale_updates_are_skipped_and_counted_and_evicted_slots_leave_the_tree():
    mem, _, writers = filled_prioritized(seed=5)
    rng = np.random.default_rng(0)
    b = mem.sample(64, rng=rng)
    writers.write(400)            # far more than max_size: every sampled slot is evicted
    tree = mem.ring.priorities.tree
    mem.sample(1, rng=rng)
    # Evicted slots left the tree; every VALID slot is in it.
    in_tree = tree.get(np.arange(mem.num_slots)) > 0
    np.testing.assert_array_equal(in_tree, (mem.ring.flags & VALID) != 0)
    before = tree.get(np.arange(mem.num_slots)).copy()
    assert mem.update_priorities(b.indices, np.full(64, 100.0)) == 64
    assert mem.stale_priority_updates == 64
    np.testing.assert_array_equal(tree.get(np.arange(mem.num_slots)), before)
    # A fresh sample's indices update; repeated indices: the last priority wins.
    b = mem.sample(8, rng=rng)
    idx = np.concatenate([b.indices[:1], b.indices[:1]])
    assert mem.update_priorities(idx, [3.0, 9.0]) == 0
    assert tree.get(b.indices[0] % mem.num_slots) == pytest.approx((9.0 + 1e-6) ** 0.6)


def test_an_update_with_repeats_and_stale_entries_leaves_the_tree_of_its_last_values():
    """Repeated tokens (the last one's priority kept, an earlier larger one raising nothing),
    stale tokens (skipped, counted), the rest set: the tree, inner nodes included, is then the
    tree of exactly those leaves."""
    mem, _, writers = filled_prioritized(seed=6)
    rng = np.random.default_rng(2)
    old = mem.sample(32, rng=rng).indices
    writers.write(400)                                  # every slot of `old` rewritten since
    slots, tokens = all_tokens(mem)
    pick = rng.choice(len(slots), 40, replace=False)
    repeats = np.concatenate([tokens[pick], tokens[pick[:10]]])
    priorities = np.concatenate([rng.uniform(0, 2, 40), rng.uniform(0, 2, 10)])
    priorities[:10] = 50.0                              # overridden by the repeats after them
    prio = mem.ring.priorities
    top = prio.max_priority
    stale = mem.update_priorities(np.concatenate([old, repeats]),
                                  np.concatenate([np.full(len(old), 99.0), priorities]))
    assert stale == len(old)
    assert prio.max_priority == max(top, priorities[10:].max())
    want = {int(t) % mem.num_slots: p for t, p in zip(repeats, priorities)}   # last wins
    tree = prio.tree
    got = tree.get(np.array(sorted(want)))
    np.testing.assert_allclose(got, (np.array([want[k] for k in sorted(want)]) + 1e-6) ** 0.6)
    leaves = tree.leaves.copy()
    total, smallest = tree.total, tree.min
    tree.rebuild()                                      # the inner nodes from the leaves alone
    assert (tree.total, tree.min) == (total, smallest)
    np.testing.assert_array_equal(tree.leaves, leaves)


def test_queued_steps_are_entered_without_a_sample(monkeypatch):
    """A memory nobody samples from (a long fill) enters its queued steps every FLUSH_AT."""
    from expreplay.storage.priority import PriorityIndex
    monkeypatch.setattr(PriorityIndex, 'FLUSH_AT', 50)
    mem, _, writers = filled_prioritized(seed=7, rounds=300)
    prio = mem.ring.priorities
    assert len(prio.pending) < 50
    in_tree = prio.tree.get(np.arange(mem.num_slots)) > 0
    valid = (mem.ring.flags & VALID) != 0
    # Every VALID slot is in the tree, or still queued; nothing else is in the tree.
    queued = np.zeros(mem.num_slots, bool)
    queued[prio.pending] = True
    np.testing.assert_array_equal(in_tree | (queued & valid), valid)
    assert in_tree.sum() > len(prio.pending)


@pytest.mark.parametrize('indices,priorities,name', [
    ([0], [-1.0], 'priorities'), ([0], [np.nan], 'priorities'), ([0], [np.inf], 'priorities'),
    ([0, 1], [1.0], 'priorities'), ([[0]], [[1.0]], 'indices'), ([0.5], [1.0], 'indices'),
    ([-3], [1.0], 'indices'), ([10 ** 15], [1.0], 'indices'),
])
def test_bad_priority_updates_name_the_argument_and_change_nothing(indices, priorities, name):
    mem, _, _ = filled_prioritized(seed=6)
    b = mem.sample(4)
    indices = [b.indices[0] if i == 0 else i for i in np.ravel(indices)] \
        if np.ndim(indices) == 1 and np.asarray(indices).dtype.kind == 'i' else indices
    before = mem.ring.priorities.tree.get(np.arange(mem.num_slots)).copy()
    with pytest.raises(ValueError, match=name):
        mem.update_priorities(indices, priorities)
    np.testing.assert_array_equal(mem.ring.priorities.tree.get(np.arange(mem.num_slots)), before)
    assert mem.stale_priority_updates == 0


def test_bad_constructor_arguments():
    for kwargs, name in [(dict(alpha=1.5), 'alpha'), (dict(alpha=-0.1), 'alpha'),
                         (dict(priority_eps=0.0), 'priority_eps'),
                         (dict(priority_eps=float('nan')), 'priority_eps')]:
        with pytest.raises(ValueError, match=name):
            ReplayMemory(100, (2,), 2, prioritized=True, **kwargs)
    with pytest.raises(TypeError, match='prioritized'):
        ReplayMemory(100, (2,), 2, prioritized='yes')
    with pytest.raises(ValueError, match='prioritized'):
        ReplayMemory(100, (2,), 2).update_priorities([0], [1.0])


@pytest.mark.slow   # a concurrency stress run: long by design
def test_concurrent_writers_sampler_and_priority_updates_give_verified_samples():
    """Four writer threads on their own lanes, a sampler that feeds priorities back, and a
    second updater replaying old (mostly stale) indices, on a memory that wraps around many
    times. Every sampled transition is checked against what its writer wrote."""
    mem = ReplayMemory(400, FRAME_SHAPE, 3, block_size=8, prioritized=True)
    n, gamma, num_lanes, steps_per_lane = 3, 0.9, 4, 6000
    # Each lane's episodes are fixed in advance, so a sample can be checked while writing.
    plans = []
    for lane in range(num_lanes):
        rng = np.random.default_rng(100 + lane)
        plans.append([(int(rng.integers(1, 15)), str(rng.choice(['terminated', 'truncated'])))
                      for _ in range(steps_per_lane)])
    stop = threading.Event()
    errors = []
    old_indices = []

    def writer(lane):
        try:
            w = mem.new_writer()
            done = 0
            for ep, (length, kind) in enumerate(plans[lane], 1):
                w.start_episode(encode(lane, ep, 0))
                for t in range(length):
                    end = t + 1 == length
                    w.add_step(action_of(lane, ep, t), reward_of(lane, ep, t),
                               encode(lane, ep, t + 1), terminated=end and kind == 'terminated',
                               truncated=end and kind == 'truncated')
                    done += 1
                if done >= steps_per_lane or stop.is_set():
                    break
            w.close()
        except BaseException as err:   # reported by the main thread
            errors.append(err)

    def check(b):
        h = mem.history_len
        for i in range(len(b.action)):
            ids = [decode(f) for f in np.moveaxis(b.state[i], -1, 0)]
            nxt = [decode(f) for f in np.moveaxis(b.next_state[i], -1, 0)]
            lane, ep, t = ids[-1]
            length, kind = plans[lane][ep - 1]
            assert ids == [(lane, ep, t - k) if t >= k else None for k in range(h - 1, -1, -1)]
            assert b.action[i] == action_of(lane, ep, t)
            _, _, tk = nxt[-1]
            k = tk - t
            assert 1 <= k <= min(n, length - t)
            assert nxt == [(lane, ep, tk - j) if tk >= j else None for j in range(h - 1, -1, -1)]
            ended = tk == length     # k < n and not ended: the head of the running episode
            assert b.reward[i] == pytest.approx(
                sum(gamma ** j * reward_of(lane, ep, t + j) for j in range(k)), abs=1e-4)
            terminated = ended and kind == 'terminated'
            assert bool(b.is_over[i]) == terminated
            assert b.discount[i] == pytest.approx(0.0 if terminated else gamma ** k)
            assert b.weights[i] > 0 and b.weights[i] <= 1.0 + 1e-6

    def sampler():
        rng = np.random.default_rng(7)
        try:
            while not stop.is_set():
                if len(mem) < 32:
                    continue
                b = mem.sample(32, n_step=n, gamma=gamma, beta=0.5, rng=rng)
                check(b)
                mem.update_priorities(b.indices, rng.random(32) * 3)
                old_indices.append(b.indices)
                samples[0] += 1
        except BaseException as err:
            errors.append(err)

    def stale_updater():
        rng = np.random.default_rng(8)
        try:
            while not stop.is_set():
                if old_indices:
                    mem.update_priorities(old_indices[int(rng.integers(len(old_indices)))],
                                          rng.random(32))
        except BaseException as err:
            errors.append(err)

    samples = [0]
    writers = [threading.Thread(target=writer, args=(lane,)) for lane in range(num_lanes)]
    others = [threading.Thread(target=sampler), threading.Thread(target=stale_updater)]
    for th in writers + others:
        th.start()
    try:
        for th in writers:
            th.join(timeout=120)
    finally:
        stop.set()
        for th in writers + others:
            th.join(timeout=30)
    assert not errors, errors[0]
    assert not any(th.is_alive() for th in writers + others)
    assert samples[0] > 20
    assert mem.num_steps_written >= num_lanes * steps_per_lane > 40 * mem.max_size
    assert mem.stale_priority_updates > 0
    # At rest, the tree holds exactly the VALID slots.
    mem.sample(1)
    in_tree = mem.ring.priorities.tree.get(np.arange(mem.num_slots)) > 0
    np.testing.assert_array_equal(in_tree, (mem.ring.flags & VALID) != 0)
