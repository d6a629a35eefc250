"""EnvPool as a player: synchronous and asynchronous, its autoreset, life loss, seeds.

Every test runs a real EnvPool Atari pool (Pong or Breakout) through an EnvRunner into a real
memory, with a proxy that logs what EnvPool returned and what it was sent, and checks each
lane's writes against that log step by step.
"""

import os
import sys

import numpy as np
import pytest


from expreplay import ReplayMemory, RunnerSettings  # noqa: E402
from expreplay.acting.envs import AsyncVectorAdapter, VectorEnvAdapter, adapt_env  # noqa: E402
from expreplay.acting import ActingGroup, EnvRunner, EnvRunnerManager  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from acting_helpers import RecordingMemory  # noqa: E402

# EnvPool's emulators take seconds to start: the whole module runs in the full suite.
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def make(task='Pong-v5', num_envs=4, batch_size=None, **kw):
    # Imported here, not at collection: importing EnvPool takes seconds.
    envpool = pytest.importorskip('envpool', reason='EnvPool needs Python >= 3.11 on Linux')
    kw.setdefault('episodic_life', False)
    kw.setdefault('reward_clip', False)
    return envpool.make(task, env_type='gymnasium', num_envs=num_envs,
                        batch_size=batch_size or num_envs, img_height=84, img_width=84,
                        gray_scale=True, stack_num=1, **kw)


class Log:
    """Forwards to an EnvPool, logging every result (rows by env id) and every action sent."""

    def __init__(self, pool):
        self._pool = pool
        self.results = []          # (env_ids, obs, reward, terminated, truncated, lives)
        self.sent = {}             # env id -> actions sent, in order

    def __getattr__(self, name):
        return getattr(self._pool, name)

    def _log(self, out, actions=None, env_id=None):
        obs, reward, term, trunc, info = out
        ids = np.asarray(info['env_id'])
        self.results.append((ids.copy(), np.array(obs)[:, 0], np.array(reward), np.array(term),
                             np.array(trunc), np.array(info['lives'])))
        return out

    def reset(self, **kw):
        obs, info = self._pool.reset(**kw)
        self._log((obs, np.zeros(len(obs)), np.zeros(len(obs), bool), np.zeros(len(obs), bool), info))
        return obs, info

    def step(self, actions, env_id=None):
        ids = np.arange(self._pool.num_envs) if env_id is None else env_id
        for i, a in zip(np.asarray(ids).tolist(), np.asarray(actions).tolist()):
            self.sent.setdefault(i, []).append(a)
        return self._log(self._pool.step(actions, env_id))

    def async_reset(self):
        self._pool.async_reset()

    def recv(self):
        return self._log(self._pool.recv())

    def send(self, actions, env_id):
        for i, a in zip(np.asarray(env_id).tolist(), np.asarray(actions).tolist()):
            self.sent.setdefault(i, []).append(a)
        self._pool.send(actions, env_id)


def expected_lanes(log, num_envs, life_loss_terminal=False):
    """What each lane must have written, rebuilt from EnvPool's own outputs: NEXT_STEP
    autoreset (the row after an end is the next episode's first observation, its action
    ignored), a lost life terminal and a new training episode when asked."""
    want = {i: [] for i in range(num_envs)}
    ended = {i: True for i in range(num_envs)}          # the first report starts an episode
    lives = {i: None for i in range(num_envs)}
    taken = {i: 0 for i in range(num_envs)}             # actions consumed per env
    for ids, obs, reward, term, trunc, lv in log.results:
        for j, i in enumerate(ids.tolist()):
            if ended[i]:
                want[i].append(('start', obs[j]))
                ended[i] = False
                if taken[i] < len(log.sent.get(i, [])) and want[i][:-1]:
                    taken[i] += 1                       # the autoreset step's ignored action
                lives[i] = int(lv[j])
                continue
            action = log.sent[i][taken[i]]
            taken[i] += 1
            lost = life_loss_terminal and int(lv[j]) < lives[i]
            lives[i] = int(lv[j])
            t = bool(term[j]) or lost
            want[i].append(('step', action, float(reward[j]), obs[j], t, bool(trunc[j]) and not t))
            if term[j] or trunc[j]:
                ended[i] = True
            elif lost:
                want[i].append(('start', obs[j]))
    return want


def assert_lanes(mem, want):
    for i, lane in enumerate(mem.lanes):
        exp = want[i]
        # The last results may still be in flight: the lane has written a prefix of the log.
        assert len(exp) - 2 <= len(lane) <= len(exp), (i, len(lane), len(exp))
        for got, e in zip(lane, exp):
            assert got[0] == e[0]
            if got[0] == 'start':
                assert np.array_equal(got[1], e[1])
            else:
                assert got[1:3] == e[1:3] and got[4:] == e[4:] and np.array_equal(got[3], e[3])


def random_q(states):
    return np.random.default_rng(len(states)).random((len(states), 6))


@pytest.mark.parametrize('batch_size', [4, 2], ids=['sync', 'async'])
def test_envpool_pong_every_write_matches_what_envpool_returned(batch_size):
    pool = Log(make(num_envs=4, batch_size=batch_size, max_episode_steps=30, seed=3))
    adapter = adapt_env(pool)
    assert isinstance(adapter, AsyncVectorAdapter if batch_size < 4 else VectorEnvAdapter)
    mem = RecordingMemory(2000, (84, 84), 4)
    runner = EnvRunner(pool, random_q, mem, 4)
    with EnvRunnerManager([runner], maximum_staleness=1) as mgr:
        for _ in range(150):
            mgr.step(0.5)
    want = expected_lanes(pool, 4)
    assert_lanes(mem, want)
    # 30-step episodes: NEXT_STEP autoresets and truncated ends (which bootstrap) happened.
    truncated = sum(1 for lane in mem.lanes for c in lane if c[0] == 'step' and c[5])
    assert truncated >= 4 and len(runner.total_scores) >= 4
    comb, action, reward, over = mem.mem.sample_batch(32)
    assert comb.shape == (32, 84, 84, 5) and not over.any()


def test_envpool_breakout_life_loss_is_terminal_for_training_only():
    pool = Log(make('Breakout-v5', num_envs=2, seed=1))
    mem = RecordingMemory(4000, (84, 84), 4)
    runner = EnvRunner(pool, None, mem, 4, settings=RunnerSettings(life_loss_terminal=True))
    group = ActingGroup([runner])
    for _ in range(1500):
        group.step(1.0)
        if len(runner.total_scores) >= 1:
            break
    assert runner.total_scores, "a Breakout game ended"
    want = expected_lanes(pool, 2, life_loss_terminal=True)
    assert_lanes(mem, want)
    lost = sum(1 for lane in mem.lanes for c in lane if c[0] == 'step' and c[4])
    assert lost >= 5                         # every lost life of the finished game, at least


@pytest.mark.filterwarnings("ignore:EnvPool seeds are fixed")
def test_envpool_seeded_sync_runs_are_reproducible():
    def run():
        pool = make(num_envs=2, seed=7)
        mem = ReplayMemory(1000, (84, 84), 4)
        runner = EnvRunner(pool, None, mem, 4, seed=5)
        group = ActingGroup([runner])
        for _ in range(200):
            group.step(1.0)
        batch = mem.sample_batch(64, rng=np.random.default_rng(0))
        runner.close()
        return batch

    a, b = run(), run()
    for x, y in zip(a, b):
        assert np.array_equal(x, y)


def test_envpool_async_warns_that_a_reset_seed_cannot_reach_it():
    pool = make(num_envs=4, batch_size=2, seed=0)
    runner = EnvRunner(pool, None, ReplayMemory(500, (84, 84), 4), 4, seed=1)
    group = ActingGroup([runner])
    with pytest.warns(RuntimeWarning, match='envpool.make'):
        group.step(1.0)
    runner.close()
