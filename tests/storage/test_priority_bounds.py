"""What the priority tree accepts: nothing that can make its sums overflow, so that one huge
priority can not break every later sample."""

import numpy as np
import pytest

from expreplay import CheckpointError, ReplayMemory
from test_checkpoint import rewrite


def prioritized(alpha=1.0, priority_eps=1e-6, max_size=500):
    mem = ReplayMemory(max_size, (2,), 2, 'uint8', prioritized=True, alpha=alpha,
                       priority_eps=priority_eps, block_size=50)
    w = mem.new_writer()
    w.start_episode(np.zeros(2, np.uint8))
    for t in range(1, 300):
        w.add_step(t % 3, float(t), np.array([t % 256, t // 256], np.uint8), terminated=t % 30 == 0)
        if t % 30 == 0:
            w.start_episode(np.zeros(2, np.uint8))
    return mem


def test_a_priority_too_large_for_the_tree_is_refused_and_changes_nothing():
    mem = prioritized(alpha=1.0)
    batch = mem.sample(32, rng=np.random.default_rng(0))
    total = mem.ring.priorities.tree.total
    with pytest.raises(ValueError, match=r'priorities must be at most [\d.e+]+ for this memory '
                                         r'\(alpha=1, \d+ slots\).*got 1e\+308'):
        mem.update_priorities(batch.indices[:1], [1e308])
    assert mem.ring.priorities.tree.total == total
    assert mem.ring.priorities.max_priority == 1.0
    again = mem.sample(32, beta=0.5, rng=np.random.default_rng(1))     # the tree still works
    assert np.isfinite(again.weights).all()


def test_the_largest_accepted_priority_keeps_every_sum_finite():
    mem = prioritized(alpha=1.0)
    bound = mem.ring.priorities.priority_bound
    valid = np.flatnonzero(mem.ring.flags & 1)
    tokens = mem.ring.block_gen[valid // mem.block_size] * mem.num_slots + valid
    assert mem.update_priorities(tokens, np.full(len(valid), bound)) == 0   # every slot at it
    assert np.isfinite(mem.ring.priorities.tree.total)
    batch = mem.sample(64, beta=0.4, rng=np.random.default_rng(2))
    assert np.isin(batch.indices % mem.num_slots, valid).all() and np.isfinite(batch.weights).all()
    # A new step enters at the running maximum, which is the bound: still finite.
    w = mem.new_writer()
    w.start_episode(np.zeros(2, np.uint8))
    w.add_step(0, 0.0, np.ones(2, np.uint8))
    w.add_step(0, 0.0, np.ones(2, np.uint8))
    mem.sample(8, rng=np.random.default_rng(3))
    assert np.isfinite(mem.ring.priorities.tree.total)


def test_with_a_small_alpha_every_finite_priority_fits():
    mem = prioritized(alpha=0.6)
    batch = mem.sample(16, rng=np.random.default_rng(0))
    mem.update_priorities(batch.indices, np.full(16, 1e308))
    assert np.isfinite(mem.ring.priorities.tree.total)
    mem.sample(16, beta=1.0, rng=np.random.default_rng(1))


@pytest.mark.parametrize('eps', [1e308, 1e306])
def test_a_priority_eps_too_large_for_the_tree_is_refused_at_construction(eps):
    with pytest.raises(ValueError, match=r'priority_eps must be at most .*alpha=1, .*got 1e\+3'):
        ReplayMemory(500, (2,), 2, 'uint8', prioritized=True, alpha=1.0, priority_eps=eps)
    prioritized(alpha=0.5, priority_eps=eps).sample(8)      # fits when alpha shrinks it


def test_a_checkpoint_with_priorities_beyond_the_bound_is_refused(tmp_path):
    mem = prioritized(alpha=1.0)
    path = tmp_path / 'mem.npz'
    mem.save(path)
    ReplayMemory.load(path).sample(8)
    bad = rewrite(path, tmp_path / 'crafted.npz',
                  priority=lambda p: np.where(p > 0, 1e308, p))
    with pytest.raises(CheckpointError, match='above the bound') as info:
        ReplayMemory.load(bad)
    assert str(bad) in str(info.value)
    bad = rewrite(path, tmp_path / 'crafted_max.npz', meta_max_priority=1e308)
    with pytest.raises(CheckpointError, match='above the bound'):
        ReplayMemory.load(bad)
