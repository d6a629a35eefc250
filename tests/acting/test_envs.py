"""Env adapters: API detection, the three vector autoreset modes, the asynchronous engine
protocol, frame formatting, history."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from expreplay.acting.envs import (NO_LIVES, AsyncVectorAdapter, FrameFormat, FrameHistory,
                            SingleEnvAdapter, VectorEnvAdapter, adapt_env)
from expreplay.acting.policy import EpsilonGreedy
from kernel_paths import kernel_path
from scripted_env import OldApiScriptedEnv, ScriptedEnv, decode, encode

pytestmark = pytest.mark.timeout(60)


def _ids(obs):
    return decode(obs)


def test_gymnasium_env_is_detected_and_reset_seeded():
    env = ScriptedEnv(3, episode_lengths=2, ends='truncated')
    ad = adapt_env(env)
    assert isinstance(ad, SingleEnvAdapter) and ad.api == 'gymnasium'
    assert ad.num_envs == 1 and ad.num_actions == 3
    r = ad.reset(seed=11)
    assert r.started.all() and _ids(r.obs[0]) == (3, 0, 0) and env.seeds == [11]
    s = ad.step([1])
    assert s.started is None and s.lives is None and _ids(s.obs[0]) == (3, 0, 1)
    assert (s.reward[0], s.terminated[0], s.truncated[0]) == (10.0, False, False)
    assert ad.reset_finished() is None
    obs, reward, term, trunc, lives = ad.step_one(2)     # the scalar form the acting path uses
    assert (term, trunc, lives) == (False, True, NO_LIVES) and _ids(obs) == (3, 0, 2)
    resets = ad.reset_finished()
    assert resets.env_ids.tolist() == [0] and resets.started.all() and _ids(resets.obs[0]) == (3, 1, 0)
    assert env.seeds == [11, None]   # later resets continue the env's own sequence


def test_old_api_env_is_detected_from_reset_and_truncation_read_from_info():
    env = OldApiScriptedEnv(4, episode_lengths=1, ends=('terminated', 'truncated'))
    ad = adapt_env(env)
    assert ad.api is None
    r = ad.reset(seed=5)
    assert ad.api == 'old' and env.seeds == [5] and _ids(r.obs[0]) == (4, 0, 0)
    s = ad.step([0])
    assert (s.terminated[0], s.truncated[0]) == (True, False)
    ad.reset_finished()
    s = ad.step([0])
    assert (s.terminated[0], s.truncated[0]) == (False, True)   # info['TimeLimit.truncated']
    ad.close()
    assert env.closed


def test_new_api_env_without_gymnasium_base_is_detected():
    class Duck:
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None):
            return np.zeros(2), {'lives': 3}

        def step(self, a):
            return np.ones(2), 1.0, True, False, {'lives': 2}

    ad = adapt_env(Duck())
    r = ad.reset(seed=1)
    assert ad.api == 'gymnasium' and r.lives.tolist() == [3]
    s = ad.step([1])
    assert s.terminated[0] and s.lives.tolist() == [2]


def test_mismatched_api_and_non_envs_are_refused_naming_player():
    with pytest.raises(TypeError, match='player'):
        adapt_env(object())

    class Liar:
        action_space = gym.spaces.Discrete(2)

        def reset(self):
            return np.zeros(2)          # old API ...

        def step(self, a):
            return np.zeros(2), 0.0, False, False, {}   # ... new API

    ad = adapt_env(Liar())
    ad.reset()
    with pytest.raises(TypeError, match='player'):
        ad.step([0])


def _vector(n, mode, **kw):
    fns = [lambda i=i: ScriptedEnv(i, **kw) for i in range(n)]
    return SyncVectorEnv(fns, autoreset_mode=mode)


@pytest.mark.parametrize('mode', [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP,
                                  AutoresetMode.DISABLED])
def test_vector_env_events_in_every_autoreset_mode(mode):
    venv = _vector(2, mode, episode_lengths=(1, 2), ends='terminated')
    ad = adapt_env(venv)
    assert isinstance(ad, VectorEnvAdapter) and ad.num_envs == 2 and ad.num_actions == 3
    r = ad.reset(seed=7)
    assert [_ids(o) for o in r.obs] == [(0, 0, 0), (1, 0, 0)] and r.started.all()
    assert [e.seeds for e in venv.envs] == [[7], [8]]
    # Step 1: both episodes (length 1) end; the final observation is reported.
    s = ad.step(np.array([1, 2]))
    assert s.started is None and s.terminated.all()
    assert [_ids(o) for o in s.obs] == [(0, 0, 1), (1, 0, 1)]
    assert s.reward.tolist() == [10.0, 20.0]
    finished = ad.reset_finished()
    if mode == AutoresetMode.NEXT_STEP:
        assert finished is None
        s = ad.step(np.array([0, 0]))   # the autoreset step: actions ignored
        assert s.started.all()
        assert [_ids(o) for o in s.obs] == [(0, 1, 0), (1, 1, 0)]
        assert all(len(e.transitions) == 1 for e in venv.envs)
    else:
        assert sorted(finished.env_ids.tolist()) == [0, 1] and finished.started.all()
        assert [_ids(finished.obs[list(finished.env_ids).index(i)]) for i in (0, 1)] == [(0, 1, 0), (1, 1, 0)]
    s = ad.step(np.array([2, 1]))
    assert [_ids(o) for o in s.obs] == [(0, 1, 1), (1, 1, 1)]
    assert not (s.terminated | s.truncated).any() and s.started is None
    venv.close()


class _ReportsEnvIds:
    """A vector env of ScriptedEnvs that takes actions in sub-env order and reports its rows in
    the order ``order`` with ``info['env_id']``, as EnvPool's synchronous mode may."""

    metadata = {'autoreset_mode': AutoresetMode.NEXT_STEP}

    def __init__(self, n, order, **kw):
        self.venv = _vector(n, AutoresetMode.NEXT_STEP, **kw)
        self.num_envs, self.single_action_space = n, self.venv.single_action_space
        self.order = np.asarray(order)

    def _reordered(self, obs, *rest):
        return (np.asarray(obs)[self.order], *[np.asarray(a)[self.order] for a in rest],
                {'env_id': self.order.astype(np.int32)})

    def reset(self, **kw):
        return self._reordered(self.venv.reset(**kw)[0])

    def step(self, actions):
        return self._reordered(*self.venv.step(actions)[:4])

    def close(self):
        self.venv.close()


@pytest.mark.parametrize('order', [[0, 1, 2], [2, 0, 1]])
def test_vector_env_rows_are_put_in_sub_env_order_by_env_id(order):
    venv = _ReportsEnvIds(3, order, episode_lengths=5)
    ad = adapt_env(venv)
    assert isinstance(ad, VectorEnvAdapter)
    assert [_ids(o) for o in ad.reset(seed=0).obs] == [(0, 0, 0), (1, 0, 0), (2, 0, 0)]
    s = ad.step(np.array([0, 1, 2]))
    assert [_ids(o) for o in s.obs] == [(0, 0, 1), (1, 0, 1), (2, 0, 1)]
    # Each row's reward is its own sub-env's, for the action given to that sub-env.
    assert s.reward.tolist() == [e.transitions[(0, 0)][1] for e in venv.venv.envs]
    assert [e.transitions[(0, 0)][0] for e in venv.venv.envs] == [0, 1, 2]
    venv.close()


def test_vector_env_lives_per_sub_env():
    venv = _vector(2, AutoresetMode.NEXT_STEP, episode_lengths=50, lives=3, life_every=2)
    ad = adapt_env(venv)
    assert ad.reset(seed=0).lives.tolist() == [3, 3]
    ad.step(np.array([0, 0]))
    assert ad.step(np.array([0, 0])).lives.tolist() == [2, 2]


@pytest.mark.slow
def test_atari_vector_env_partial_batches_run_asynchronously():
    """AtariVectorEnv(batch_size < num_envs) is driven with its own send/recv: every step of
    every sub-env is stored, truncations included, and the memory samples what was stored."""
    from ale_py.vector_env import AtariVectorEnv
    from expreplay import ReplayMemory
    from expreplay.acting import ActingGroup, EnvRunner
    venv = AtariVectorEnv('pong', num_envs=4, batch_size=2, stack_num=1, num_threads=2,
                          max_num_frames_per_episode=80)
    assert isinstance(adapt_env(venv), AsyncVectorAdapter)
    mem = ReplayMemory(2000, (84, 84), 4)
    seen = []
    runner = EnvRunner(venv, lambda s: (seen.append(len(s)), np.ones((len(s), 6)))[1], mem, 4, seed=0)
    group = ActingGroup([runner])
    for _ in range(120):
        group.step(0.5)
    assert max(seen) <= 2                              # one recv's sub-envs per call
    assert runner.steps == mem.num_steps_written >= 200
    assert len(runner.total_scores) >= 4               # 20-step games: truncated, autoreset
    assert runner.start_counts()['autoreset'] >= 8
    comb, action, reward, over = mem.sample_batch(64)
    assert comb.shape == (64, 84, 84, 5) and not over.any()
    runner.close()


def test_frame_format_reshapes_and_refuses_lossy_casts():
    fmt = FrameFormat((2, 3), np.uint8)
    assert fmt(np.arange(6, dtype=np.uint8).reshape(1, 2, 3)).shape == (2, 3)
    assert fmt(np.arange(6, dtype=np.int64).reshape(2, 3)).dtype == np.uint8
    with pytest.raises(ValueError, match='player observation'):
        fmt(np.zeros(5, np.uint8))
    with pytest.raises(TypeError, match='player observation'):
        fmt(np.zeros((2, 3), np.float32))
    assert FrameFormat((4,), np.float32)(np.zeros(4, np.float64)).dtype == np.float32


@pytest.mark.parametrize('kernel', ['C kernels', 'numpy'])
def test_frame_history_is_channels_last_oldest_first_zero_padded(kernel):
    with kernel_path(kernel, '_acting_ext', '_gather_ext'):
        h = FrameHistory(2, (6,), 3, np.uint8)
    h.start([0, 1], np.stack([encode(0, 0, 0), encode(1, 0, 0)]))
    h.push([1], encode(1, 0, 1)[None])
    s = h.states([0, 1])
    assert s.shape == (2, 6, 3) and s.flags['C_CONTIGUOUS']
    assert [decode(s[0, :, k]) for k in range(3)] == [None, None, (0, 0, 0)]
    assert [decode(s[1, :, k]) for k in range(3)] == [None, (1, 0, 0), (1, 0, 1)]
    for t in range(2, 6):
        h.push(np.array([1]), encode(1, 0, t)[None])
    assert [decode(h.states([1])[0, :, k]) for k in range(3)] == [(1, 0, 3), (1, 0, 4), (1, 0, 5)]
    assert decode(h.latest(1)) == (1, 0, 5)
    h.start([1], encode(1, 1, 0)[None])   # a new episode forgets the old frames
    assert [decode(h.states([1])[0, :, k]) for k in range(3)] == [None, None, (1, 1, 0)]
    assert [decode(h.states([0])[0, :, k]) for k in range(3)] == [None, None, (0, 0, 0)]
    assert h.states([]).shape == (0, 6, 3)


@pytest.mark.parametrize('built, used', [('C kernels', 'numpy'), ('numpy', 'C kernels')])
def test_a_history_and_a_policy_keep_the_path_they_were_built_with(built, used):
    """One moment (:mod:`expreplay._kernels`): a frame history and an epsilon-greedy policy
    take their kernels when built; used under the other path, they keep theirs."""
    names = ('_acting_ext', '_gather_ext')
    with kernel_path(built, *names):
        h = FrameHistory(2, (6,), 3, np.uint8)
        policy = EpsilonGreedy([np.random.default_rng(0)], [np.arange(2)], 4)
    c = built == 'C kernels'
    with kernel_path(used, *names):
        assert (h.kernel is not None) == c and (h._gather_ext is not None) == c
        assert (policy._ext is not None) == c
        h.start([0, 1], np.stack([encode(0, 0, 0), encode(1, 0, 0)]))
        h.push([1], encode(1, 0, 1)[None])
        assert [decode(h.states([1])[0, :, k]) for k in range(3)] == [None, (1, 0, 0), (1, 0, 1)]
        actions, greedy = policy.draw(np.arange(2), 0.0, np.ones(2, bool))
        assert greedy.tolist() == [0, 1]
        policy.act_greedy(np.array([[0, 1, 3, 2], [5, 0, 0, 0]], np.float32), greedy, actions)
        assert actions.tolist() == [2, 0]


class FakeEngine:
    """An EnvPool-style asynchronous engine over scripted envs: ``recv`` returns the
    ``batch`` sub-envs that were sent actions longest ago (NEXT_STEP autoreset, as EnvPool)."""

    is_async = True

    def __init__(self, n, batch, **kw):
        self.envs = [ScriptedEnv(i, **kw) for i in range(n)]
        self.num_envs, self.batch = n, batch
        self.single_action_space = self.envs[0].action_space
        self.ready, self.ended, self.restarted = [], [False] * n, set()
        self.sent = []

    def async_reset(self):
        self.ready = [(i, self.envs[i].reset()[0], 0.0, False, False) for i in range(self.num_envs)]

    def recv(self):
        out, self.ready = self.ready[:self.batch], self.ready[self.batch:]
        ids = np.array([o[0] for o in out])
        info = {'env_id': ids, 'restarted': np.array([i in self.restarted for i in ids])}
        self.restarted -= set(ids.tolist())
        return (np.stack([o[1] for o in out]), np.array([o[2] for o in out]),
                np.array([o[3] for o in out]), np.array([o[4] for o in out]), info)

    def send(self, actions, env_id):
        self.sent.append((np.array(env_id), np.array(actions)))
        for i, a in zip(env_id.tolist(), actions.tolist()):
            if self.ended[i]:
                self.ended[i] = False
                self.ready.append((i, self.envs[i].reset()[0], 0.0, False, False))
                continue
            obs, r, term, trunc, _ = self.envs[i].step(a)
            self.ended[i] = term or trunc
            self.ready.append((i, obs, r, term, trunc))


def test_async_engine_protocol_reports_starts_steps_and_restarted_actors():
    eng = FakeEngine(4, 2, episode_lengths=2, ends='terminated')
    ad = adapt_env(eng)
    assert isinstance(ad, AsyncVectorAdapter) and ad.is_async and ad.num_envs == 4
    with pytest.warns(RuntimeWarning, match='seed'):
        assert ad.reset(seed=3) is None
    r = ad.recv()
    assert r.env_ids.tolist() == [0, 1] and r.started.all()          # first reports: starts
    ad.send(np.array([1, 1]), r.env_ids)
    r = ad.recv()
    assert r.env_ids.tolist() == [2, 3] and r.started.all()
    ad.send(np.array([0, 0]), r.env_ids)
    r = ad.recv()                                                    # steps of envs 0 and 1
    assert r.started is None and [_ids(o) for o in r.obs] == [(0, 0, 1), (1, 0, 1)]
    ad.send(np.array([2, 2]), r.env_ids)
    ad.recv()
    ad.send(np.array([0, 0]), np.array([2, 3]))
    r = ad.recv()                                                    # envs 0, 1 end their episode
    assert r.terminated.all() and r.started is None
    eng.restarted.add(3)                                             # env 3's actor was replaced
    ad.send(np.array([0, 0]), r.env_ids)
    r = ad.recv()
    assert r.env_ids.tolist() == [2, 3] and r.started.tolist() == [False, True]
    ad.send(np.array([0, 0]), r.env_ids)
    r = ad.recv()                                                    # the autoreset of 0 and 1
    assert r.started.all() and [_ids(o) for o in r.obs] == [(0, 1, 0), (1, 1, 0)]


def test_async_engine_reporting_an_unknown_sub_env_fails_in_recv():
    eng = FakeEngine(4, 2, episode_lengths=50)
    ad = adapt_env(eng)
    assert ad.reset() is None
    for _ in range(3):                    # the starts of all four, then a step of two
        r = ad.recv()
        ad.send(np.zeros(2, np.int64), r.env_ids)
    good_recv = eng.recv

    def recv_with_unknown_id():
        obs, reward, term, trunc, info = good_recv()
        return obs, reward, term, trunc, {'env_id': np.array([0, 9])}   # as EnvPool: no 'restarted'
    eng.recv = recv_with_unknown_id
    with pytest.raises(IndexError):       # here, where the group makes it the runner's failure
        ad.recv()


def test_async_engine_end_to_end_every_sampled_transition():
    from expreplay import ReplayMemory
    from expreplay.acting import ActingGroup, EnvRunner
    from scripted_env import check_batch
    eng = FakeEngine(6, 3, episode_lengths=(4, 7, 2), ends=('truncated', 'terminated'))
    mem = ReplayMemory(300, (6,), 3, block_size=8)
    runner = EnvRunner(eng, lambda s: np.zeros((len(s), 3)), mem, 3)
    group = ActingGroup([runner])
    assert runner.is_async
    for _ in range(900):
        group.step(0.5)
    envs = {e.env_id: e for e in eng.envs}
    taken = sum(len(e.transitions) for e in eng.envs)
    # Every step the engine took is stored, except the ones whose results the runner has not
    # received yet (at most one per sub-env).
    assert taken - eng.num_envs <= mem.num_steps_written == runner.steps <= taken
    rng = np.random.default_rng(0)
    for _ in range(10):
        check_batch(mem.sample_batch(64, rng=rng), envs, 3)


def test_an_adapter_names_its_stepping_and_a_group_is_of_one_kind():
    """The env kind is chosen once, with the adapter: its stepping. A group steps one kind, an
    asynchronous engine alone, and a restart may not change a runner's kind."""
    from expreplay import ReplayMemory
    from expreplay.acting import ActingGroup, EnvRunner
    from expreplay.acting.envs import Stepping
    from expreplay.acting.envs.singles import SingleEnvSteps
    from expreplay.acting.envs.vector import AsyncSteps
    vec = SyncVectorEnv([lambda: ScriptedEnv(0), lambda: ScriptedEnv(1)])
    assert adapt_env(ScriptedEnv(0)).stepping is SingleEnvSteps and SingleEnvSteps.pools_runners
    assert adapt_env(vec).stepping is Stepping and not Stepping.pools_runners
    eng = FakeEngine(4, 2)
    assert adapt_env(eng).stepping is AsyncSteps and AsyncSteps.one_runner
    mem = ReplayMemory(100, (6,), 3)
    single, vector = EnvRunner(ScriptedEnv(2), None, mem, 3), EnvRunner(vec, None, mem, 3)
    with pytest.raises(ValueError, match='one env kind'):
        ActingGroup([single, vector])
    engine = EnvRunner(eng, None, mem, 3)
    with pytest.raises(ValueError, match='a group of its own'):
        ActingGroup([engine, EnvRunner(FakeEngine(4, 2), None, mem, 3)])
    one = SyncVectorEnv([lambda: ScriptedEnv(4)])       # one sub-env, as the runner had
    restartable = EnvRunner(ScriptedEnv(3), None, mem, 3, player_factory=lambda: one)
    with pytest.raises(ValueError, match='another kind'):
        restartable.restart()


def test_a_float_space_is_refused_by_a_float16_memory_naming_the_fix():
    """The population's check of the player's observation space applies the memory's rule:
    float32 observations would be rounded by a float16 memory."""
    from expreplay.acting.population import check_observation_space

    class Player:
        observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    with pytest.raises(ValueError, match=r"observations are float32 .* which dtype='float16' can "
                                         r"not store: pass dtype='float32'"):
        check_observation_space(Player(), (4,), 'float16', shape_arg='state_shape',
                                dtype_arg='dtype')
    with pytest.raises(ValueError, match=r"state_dtype='float16' can not store: pass "
                                         r"state_dtype='float32'"):
        check_observation_space(Player(), (4,), 'float16', shape_arg='state_shape',
                                dtype_arg='state_dtype')
    check_observation_space(Player(), (4,), 'float32', shape_arg='state_shape',
                            dtype_arg='dtype')      # stored as they come
