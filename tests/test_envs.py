"""Env adapters: API detection, the three vector autoreset modes, frame formatting, history."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from expreplay.envs import (FrameFormat, FrameHistory, Reset, SingleEnvAdapter, Step,
                            VectorEnvAdapter, adapt_env)
from scripted_env import OldApiScriptedEnv, ScriptedEnv, decode, encode

pytestmark = pytest.mark.timeout(60)


def _ids(obs):
    return decode(obs)


def test_gymnasium_env_is_detected_and_reset_seeded():
    env = ScriptedEnv(3, episode_lengths=2, ends='truncated')
    ad = adapt_env(env)
    assert isinstance(ad, SingleEnvAdapter) and ad.api == 'gymnasium'
    assert ad.num_envs == 1 and ad.num_actions == 3
    (r,) = ad.reset(seed=11)
    assert isinstance(r, Reset) and _ids(r.obs) == (3, 0, 0) and env.seeds == [11]
    (s,) = ad.step([1])
    assert s == Step(s.obs, 10.0, False, False, None) and _ids(s.obs) == (3, 0, 1)
    assert ad.reset_finished() == {}
    (s,) = ad.step([2])
    assert (s.terminated, s.truncated) == (False, True) and _ids(s.obs) == (3, 0, 2)
    resets = ad.reset_finished()
    assert list(resets) == [0] and _ids(resets[0].obs) == (3, 1, 0)
    assert env.seeds == [11, None]   # later resets continue the env's own sequence


def test_old_api_env_is_detected_from_reset_and_truncation_read_from_info():
    env = OldApiScriptedEnv(4, episode_lengths=1, ends=('terminated', 'truncated'))
    ad = adapt_env(env)
    assert ad.api is None
    (r,) = ad.reset(seed=5)
    assert ad.api == 'old' and env.seeds == [5] and _ids(r.obs) == (4, 0, 0)
    (s,) = ad.step([0])
    assert (s.terminated, s.truncated) == (True, False)
    ad.reset_finished()
    (s,) = ad.step([0])
    assert (s.terminated, s.truncated) == (False, True)   # info['TimeLimit.truncated']
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
    (r,) = ad.reset(seed=1)
    assert ad.api == 'gymnasium' and r.lives == 3
    (s,) = ad.step([1])
    assert s.terminated and s.lives == 2


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
    resets = ad.reset(seed=7)
    assert [_ids(r.obs) for r in resets] == [(0, 0, 0), (1, 0, 0)]
    assert [e.seeds for e in venv.envs] == [[7], [8]]
    # Step 1: both episodes (length 1) end; the final observation is reported.
    ev = ad.step(np.array([1, 2]))
    assert all(isinstance(e, Step) and e.terminated for e in ev)
    assert [_ids(e.obs) for e in ev] == [(0, 0, 1), (1, 0, 1)]
    assert [e.reward for e in ev] == [10.0, 20.0]
    finished = ad.reset_finished()
    if mode == AutoresetMode.NEXT_STEP:
        assert finished == {}
        ev = ad.step(np.array([0, 0]))   # the autoreset step: actions ignored
        assert all(isinstance(e, Reset) for e in ev)
        assert [_ids(e.obs) for e in ev] == [(0, 1, 0), (1, 1, 0)]
        assert all(len(e.transitions) == 1 for e in venv.envs)
    else:
        assert sorted(finished) == [0, 1]
        assert [_ids(finished[i].obs) for i in (0, 1)] == [(0, 1, 0), (1, 1, 0)]
    ev = ad.step(np.array([2, 1]))
    assert [_ids(e.obs) for e in ev] == [(0, 1, 1), (1, 1, 1)]
    assert not any(e.terminated or e.truncated for e in ev)
    venv.close()


def test_vector_env_lives_per_sub_env():
    venv = _vector(2, AutoresetMode.NEXT_STEP, episode_lengths=50, lives=3, life_every=2)
    ad = adapt_env(venv)
    assert [r.lives for r in ad.reset(seed=0)] == [3, 3]
    ad.step(np.array([0, 0]))
    assert [e.lives for e in ad.step(np.array([0, 0]))] == [2, 2]


def test_atari_vector_env_partial_batches_are_refused():
    from ale_py.vector_env import AtariVectorEnv
    venv = AtariVectorEnv('pong', num_envs=2, batch_size=1, stack_num=1, num_threads=1)
    try:
        with pytest.raises(ValueError, match='player'):
            adapt_env(venv)
    finally:
        venv.close()


def test_frame_format_reshapes_and_refuses_lossy_casts():
    fmt = FrameFormat((2, 3), np.uint8)
    assert fmt(np.arange(6, dtype=np.uint8).reshape(1, 2, 3)).shape == (2, 3)
    assert fmt(np.arange(6, dtype=np.int64).reshape(2, 3)).dtype == np.uint8
    with pytest.raises(ValueError, match='player observation'):
        fmt(np.zeros(5, np.uint8))
    with pytest.raises(TypeError, match='player observation'):
        fmt(np.zeros((2, 3), np.float32))
    assert FrameFormat((4,), np.float32)(np.zeros(4, np.float64)).dtype == np.float32


def test_frame_history_is_channels_last_oldest_first_zero_padded():
    h = FrameHistory(2, (6,), 3, np.uint8)
    h.start(0, encode(0, 0, 0))
    h.start(1, encode(1, 0, 0))
    h.push(1, encode(1, 0, 1))
    s = h.states([0, 1])
    assert s.shape == (2, 6, 3) and s.flags['C_CONTIGUOUS']
    assert [decode(s[0, :, k]) for k in range(3)] == [None, None, (0, 0, 0)]
    assert [decode(s[1, :, k]) for k in range(3)] == [None, (1, 0, 0), (1, 0, 1)]
    for t in range(2, 6):
        h.push(1, encode(1, 0, t))
    assert [decode(h.states([1])[0, :, k]) for k in range(3)] == [(1, 0, 3), (1, 0, 4), (1, 0, 5)]
    h.start(1, encode(1, 1, 0))   # a new episode forgets the old frames
    assert [decode(h.states([1])[0, :, k]) for k in range(3)] == [None, None, (1, 1, 0)]
    assert h.states([]).shape == (0, 6, 3)
