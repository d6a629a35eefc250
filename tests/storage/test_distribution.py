"""The sampling distribution (expreplay.storage.distribution): the one object that knows whether
a memory draws uniformly or by priority, chosen once from ``prioritized`` and called by the
ring, the writers, the sampler and the checkpoint code instead of a flag tested in each."""

import ast
import os

import numpy as np
import pytest

from expreplay import ReplayMemory
from expreplay.storage.checkpoint import CheckpointError, open_checkpoint
from expreplay.storage.distribution import (PrioritizedDistribution, SamplingDistribution,
                                            UniformDistribution)

STORAGE = os.path.join(os.path.dirname(__file__), '..', '..', 'expreplay', 'storage')


def _filled(prioritized, steps=300):
    mem = ReplayMemory(1000, (4,), 2, 'float32', block_size=16, prioritized=prioritized,
                       alpha=1.0, priority_eps=1e-3)
    w = mem.new_writer()
    w.start_episode(np.zeros(4, np.float32))
    for t in range(steps):
        w.add_step(t % 3, 1.0, np.full(4, t, np.float32), terminated=t % 50 == 49)
        if t % 50 == 49:
            w.start_episode(np.zeros(4, np.float32))
    return mem


def test_the_flag_chooses_the_distribution_and_the_memory_reports_it():
    uniform, prioritized = ReplayMemory(100, (4,), 2), ReplayMemory(100, (4,), 2, prioritized=True,
                                                                      alpha=0.5)
    assert type(uniform.ring.distribution) is UniformDistribution
    assert type(prioritized.ring.distribution) is PrioritizedDistribution
    assert uniform.prioritized is False and prioritized.prioritized is True
    assert uniform.priority_settings is None and uniform.ring.priorities is None
    assert prioritized.priority_settings == {'alpha': 0.5, 'priority_eps': 1e-6}
    assert prioritized.ring.priorities is prioritized.ring.distribution.priorities
    assert uniform.stale_priority_updates == 0 == prioritized.stale_priority_updates


def test_the_interface_is_abstract():
    with pytest.raises(TypeError):
        SamplingDistribution()     # type: ignore[abstract]


def test_a_uniform_memory_refuses_priorities():
    mem = _filled(False)
    batch = mem.sample(8, rng=np.random.default_rng(0), beta=0.5)
    assert (batch.weights == 1).all()
    with pytest.raises(ValueError, match="needs a prioritized memory"):
        mem.update_priorities(batch.indices, np.ones(8))


def test_the_uniform_distribution_draws_with_the_samplers_draw_and_keeps_nothing():
    dist = UniformDistribution()
    calls = []

    def uniform(n, rng):
        calls.append(n)
        return np.arange(n)
    slots, weights = dist.draw(5, None, 0.5, 'batch', uniform)
    assert calls == [5] and slots.tolist() == [0, 1, 2, 3, 4] and weights is None
    assert dist.tables() == [] and dist.state() == {}


@pytest.mark.parametrize('weight_norm', ['memory', 'batch'])
def test_prioritized_weights_by_norm(weight_norm):
    mem = _filled(True)
    rng = np.random.default_rng(1)
    batch = mem.sample(32, rng=rng, beta=0.5)
    mem.update_priorities(batch.indices, np.linspace(0.0, 5.0, 32))
    batch = mem.sample(32, rng=rng, beta=0.5, weight_norm=weight_norm)
    assert (batch.weights > 0).all() and (batch.weights <= 1).all()
    if weight_norm == 'batch':
        assert batch.weights.max() == 1.0
    assert (mem.sample(32, rng=rng).weights == 1).all()      # beta=None


def test_the_checkpoint_tables_and_counters_come_from_the_distribution():
    for prioritized, extra in ((False, []), (True, ['priority'])):
        mem = _filled(prioritized)
        names = mem.ring.table_names()
        assert names[len(names) - len(extra):] == extra
        with mem.ring.lock:
            counters, _ = mem.ring.state()
        assert ('max_priority' in counters) is prioritized
        # state() entered the steps published since the last sample.
        assert not prioritized or len(mem.ring.priorities.pending) == 0


def test_a_load_the_distribution_refuses_leaves_the_ring_new(tmp_path):
    mem = _filled(True)
    batch = mem.sample(16, rng=np.random.default_rng(2))
    mem.update_priorities(batch.indices, np.full(16, 3.0))
    path = str(tmp_path / 'm.npz')
    mem.save(path)
    fresh = ReplayMemory(1000, (4,), 2, 'float32', block_size=16, prioritized=True, alpha=1.0,
                         priority_eps=1e-3)
    ring, dist = fresh.ring, fresh.ring.distribution
    before = ring.priorities
    with open_checkpoint(path) as source:
        # The ring's tables pass their checks; the distribution refuses its counter.
        counters = dict(source.counters, max_priority=1e306)   # over the bound (alpha 1)
        with pytest.raises(CheckpointError, match='above the bound'):
            ring.load_state(counters, source)
    assert ring.untouched and len(fresh) == 0
    assert ring.distribution is dist and ring.priorities is not before
    assert ring.priorities.max_priority == 1.0 and ring.priorities.tree.total == 0
    assert fresh.priority_settings == mem.priority_settings
    assert ReplayMemory.load(path).ring.priorities.max_priority == 3.0


# The modules that call the distribution rather than test a flag.
CALLERS = ['ring.py', 'writers.py', 'sampling.py', '_checkpoint_checks.py']


@pytest.mark.parametrize('module', CALLERS)
def test_no_caller_branches_on_the_kind_of_distribution(module):
    with open(os.path.join(STORAGE, module)) as f:
        tree = ast.parse(f.read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.BoolOp, ast.Compare)):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Attribute) and sub.attr in ('priorities', 'prioritized'):
                    found.append(f'{module}:{node.lineno} {ast.unparse(sub)}')
    assert found == []
