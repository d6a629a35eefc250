"""ReplayMemory.sample: every n-step field of every sampled transition against a Python reference.

Frames encode ``(lane, episode, t)`` (see test_memory), so a sampled state says which step of
which episode it is; the reference recomputes reward sum, bootstrap state, discount and is_over
from the scripted stream (terminated, truncated and abandoned episodes; several writers, some
closed and replaced; the ring wrapping around many times).
"""

import numpy as np
import pytest

from expreplay import ReplayMemory
from kernel_paths import kernel_path
from test_memory import FRAME_SHAPE, action_of, decode, encode, reward_of


@pytest.fixture(params=['C kernels', 'numpy'])
def kernels(request):
    """With the optional C kernels (frame gather, priority tree) and with the numpy paths
    they stand in for (a machine without a compiler)."""
    with kernel_path(request.param, '_gather_ext', '_tree_ext'):
        yield request.param


class Script:
    """What was written, per (lane, episode): steps taken and how the episode ended."""

    def __init__(self):
        self.steps = {}
        self.ending = {}    # 'terminated' | 'truncated' | 'abandoned'

    def expected(self, lane, ep, t, n, gamma, history_len):
        """(reward, next-state ids, discount, is_over) of the n-step transition from step t."""
        steps = self.steps[(lane, ep)]
        k = min(n, steps - t)
        reward = sum(gamma ** j * reward_of(lane, ep, t + j) for j in range(k))
        ended_in_window = t + k == steps and self.ending.get((lane, ep)) in ('terminated',
                                                                            'truncated')
        terminated = ended_in_window and self.ending[(lane, ep)] == 'terminated'
        nxt = [(lane, ep, t + k - i) if t + k - i >= 0 else None
               for i in range(history_len - 1, -1, -1)]
        return reward, nxt, 0.0 if terminated else gamma ** k, terminated


class ScriptedWriters:
    """Round-robin over writers; random lengths and ends; now and then an episode is abandoned
    (start_episode mid-episode) or a writer is closed and replaced by a new lane. Lane ids are
    never reused, so a frame names its episode for the whole test."""

    def __init__(self, mem, num_lanes, rng, script, max_len=12):
        self.mem, self.rng, self.script, self.max_len = mem, rng, script, max_len
        self.writers = [mem.new_writer() for _ in range(num_lanes)]
        self.lane_ids = list(range(num_lanes))
        self.next_lane = num_lanes
        self.episode = {}
        self.t = [None] * num_lanes
        self.length = [0] * num_lanes

    def replace_writer(self, i):
        if self.t[i] is not None:
            lane = self.lane_ids[i]
            self.script.ending[(lane, self.episode[lane])] = 'abandoned'
            self.t[i] = None
        self.writers[i].close()
        self.writers[i] = self.mem.new_writer()
        self.lane_ids[i] = self.next_lane
        self.next_lane += 1

    def write(self, num_rounds):
        rng, script, t = self.rng, self.script, self.t
        for _ in range(num_rounds):
            for i in range(len(self.writers)):
                lane = self.lane_ids[i]
                if t[i] is not None and rng.random() < 0.01:
                    if rng.random() < 0.5:
                        self.replace_writer(i)
                        lane = self.lane_ids[i]
                    else:
                        script.ending[(lane, self.episode[lane])] = 'abandoned'
                        t[i] = None
                if t[i] is None:
                    self.episode[lane] = ep = self.episode.get(lane, 0) + 1
                    self.length[i] = int(rng.integers(1, self.max_len))
                    t[i] = 0
                    self.writers[i].start_episode(encode(lane, ep, 0))
                    script.steps[(lane, ep)] = 0
                    continue
                ep, tt = self.episode[lane], t[i]
                end = tt + 1 == self.length[i]
                kind = str(rng.choice(['terminated', 'truncated'])) if end else None
                self.writers[i].add_step(action_of(lane, ep, tt), reward_of(lane, ep, tt),
                                         encode(lane, ep, tt + 1),
                                         terminated=kind == 'terminated',
                                         truncated=kind == 'truncated')
                script.steps[(lane, ep)] = tt + 1
                if end:
                    script.ending[(lane, ep)] = kind
                    t[i] = None
                else:
                    t[i] = tt + 1

    def close(self):
        for w in self.writers:
            w.close()


def write_script(mem, num_lanes, num_rounds, rng, script):
    writers = ScriptedWriters(mem, num_lanes, rng, script)
    writers.write(num_rounds)
    return writers


def ids_of(states, layout):
    """Decoded ids of each frame of each state, oldest first."""
    if layout == 'NHWC':
        states = np.moveaxis(states, -1, 1)
    return [[decode(f) for f in s] for s in states]


def check_batch(mem, batch, script, n, gamma, layout):
    h = mem.history_len
    B = len(batch.action)
    assert batch.state.dtype == batch.next_state.dtype == mem.dtype
    shape = (B,) + FRAME_SHAPE + (h,) if layout == 'NHWC' else (B, h) + FRAME_SHAPE
    assert batch.state.shape == batch.next_state.shape == shape
    assert batch.action.dtype == np.int32 and batch.reward.dtype == np.float32
    assert batch.discount.dtype == np.float32 and batch.is_over.dtype == bool
    assert batch.indices.dtype == np.int64 and batch.weights.dtype == np.float32
    states, nexts = ids_of(batch.state, layout), ids_of(batch.next_state, layout)
    for i in range(B):
        lane, ep, t = states[i][-1]
        assert states[i] == [(lane, ep, t - k) if t - k >= 0 else None
                             for k in range(h - 1, -1, -1)]
        assert t < script.steps[(lane, ep)]
        assert batch.action[i] == action_of(lane, ep, t)
        reward, nxt, discount, over = script.expected(lane, ep, t, n, gamma, h)
        assert batch.reward[i] == pytest.approx(reward, rel=1e-5, abs=1e-5)
        assert nexts[i] == nxt, (states[i], nexts[i], nxt)
        assert batch.discount[i] == pytest.approx(discount, rel=1e-6)
        assert bool(batch.is_over[i]) == over
        # The index names the slot holding the state's current frame.
        slot = int(batch.indices[i]) % mem.num_slots
        assert decode(mem.ring.frames[slot]) == (lane, ep, t)


@pytest.mark.parametrize('num_lanes,history_len,max_size,block_size,n', [
    (1, 4, 60, None, 3),
    (3, 4, 97, 8, 5),       # n-step windows cross block edges
    (5, 1, 64, 4, 3),       # no history; windows longer than a block
    (4, 2, 50, 2, 7),       # block_size == history_len
    (2, 6, 200, 7, 1),      # n = 1 through the same path
])
def test_every_n_step_field_against_reference(num_lanes, history_len, max_size, block_size, n,
                                              kernels):
    rng = np.random.default_rng(num_lanes * 1000 + n)
    mem = ReplayMemory(max_size, FRAME_SHAPE, history_len, block_size=block_size)
    script = Script()
    gamma = 0.9
    # Check while writing (running and abandoned episodes at the lanes' heads), and write
    # ~30x the memory size in total: the ring wraps around many times.
    writers = ScriptedWriters(mem, num_lanes, rng, script)
    for round_ in range(6):
        writers.write(5 * max_size // num_lanes)
        for layout in ('NHWC', 'NCHW'):
            batch = mem.sample(min(300, len(mem)), n_step=n, gamma=gamma, layout=layout, rng=rng)
            check_batch(mem, batch, script, n, gamma, layout)
            assert np.all(batch.weights == 1)
        if round_ % 2:
            writers.replace_writer(round_ % num_lanes)   # a closed lane's head stays sampleable
    writers.close()

    # Exhaustively: every valid slot's n-step transition, through the sampler's own walk.
    slots = np.flatnonzero(mem.ring.flags & 1)
    reward, last, discount, over = mem.sampler.n_step(slots, n, gamma)
    for s, r, l_, d, o in zip(slots, reward, last, discount, over):
        lane, ep, t = decode(mem.ring.frames[s])
        exp_r, exp_next, exp_d, exp_o = script.expected(lane, ep, t, n, gamma, history_len)
        assert r == pytest.approx(exp_r, rel=1e-5, abs=1e-5)
        assert decode(mem.ring.frames[l_]) == exp_next[-1]
        assert d == pytest.approx(exp_d) and bool(o) == exp_o


def test_n_step_small_case_by_hand():
    mem = ReplayMemory(40, (1,), 2, dtype='float32')
    w = mem.new_writer()
    w.start_episode([1.0])
    w.add_step(0, 1.0, [2.0])
    w.add_step(1, 2.0, [3.0])
    w.add_step(2, 4.0, [4.0], truncated=True)     # truncated: bootstraps from [4]
    w.start_episode([10.0])
    w.add_step(3, 8.0, [11.0])
    w.add_step(4, 16.0, [12.0], terminated=True)  # terminated: discount 0
    slots = np.flatnonzero(mem.ring.flags & 1)
    r, last, d, o = mem.sampler.n_step(slots, 2, 0.5)
    got = {int(mem.ring.action[s]): (float(r_), float(mem.ring.frames[l_][0]), float(d_), bool(o_))
           for s, r_, l_, d_, o_ in zip(slots, r, last, d, o)}
    assert got == {
        0: (1 + 0.5 * 2, 3.0, 0.25, False),
        1: (2 + 0.5 * 4, 4.0, 0.25, False),
        2: (4.0, 4.0, 0.5, False),
        3: (8 + 0.5 * 16, 12.0, 0.0, True),
        4: (16.0, 12.0, 0.0, True),
    }


def test_sample_n1_matches_sample_batch_fields():
    mem = ReplayMemory(100, FRAME_SHAPE, 3, block_size=5)
    script = Script()
    write_script(mem, 3, 200, np.random.default_rng(5), script)
    rng_a, rng_b = np.random.default_rng(9), np.random.default_rng(9)
    comb, action, reward, over = mem.sample_batch(64, rng=rng_a)
    batch = mem.sample(64, n_step=1, gamma=0.99, rng=rng_b)
    np.testing.assert_array_equal(batch.state, comb[..., :-1])
    np.testing.assert_array_equal(batch.next_state, comb[..., 1:])
    np.testing.assert_array_equal(batch.action, action)
    np.testing.assert_array_equal(batch.reward, reward)
    np.testing.assert_array_equal(batch.is_over, over)
    np.testing.assert_allclose(batch.discount, np.where(over, 0.0, 0.99), rtol=1e-6)


@pytest.mark.parametrize('kwargs,name', [
    (dict(n_step=0), 'n_step'), (dict(gamma=0.0), 'gamma'), (dict(gamma=1.5), 'gamma'),
    (dict(gamma=float('nan')), 'gamma'), (dict(beta=-0.1), 'beta'), (dict(beta=2), 'beta'),
    (dict(layout='HWC'), 'layout'), (dict(batch_size=10_000), 'batch_size'),
])
def test_bad_sample_arguments_name_the_argument(kwargs, name):
    mem = ReplayMemory(100, FRAME_SHAPE, 2)
    write_script(mem, 2, 50, np.random.default_rng(1), Script())
    before = (mem.ring.flags.copy(), len(mem))
    kwargs = dict(dict(batch_size=8), **kwargs)
    with pytest.raises(ValueError, match=name):
        mem.sample(kwargs.pop('batch_size'), **kwargs)
    np.testing.assert_array_equal(mem.ring.flags, before[0])
    assert len(mem) == before[1]
