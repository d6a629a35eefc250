"""examples/dqn_atari.py's training players with --prioritized / --n-step: every stored reward
is clipped per step, and an asynchronous engine stays asynchronous (a ClipReward wrapper around
it would hide recv/send and the runner would then refuse an asynchronous EnvPool)."""

import os
import sys

import gymnasium as gym
import numpy as np
import pytest

from expreplay.acting.envs import adapt_env

# The example imports tensorpack (and so TensorFlow, seconds to load): the module runs in the
# full suite, and imports it only when its tests run.
pytestmark = pytest.mark.slow
EXAMPLES = os.path.join(os.path.dirname(__file__), '..', '..', 'examples')


@pytest.fixture(scope='module')
def dqn_atari():
    pytest.importorskip('tensorpack')
    pytest.importorskip('ale_py')
    sys.path.insert(0, EXAMPLES)
    os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
    import dqn_atari
    return dqn_atari


@pytest.fixture
def players(dqn_atari):
    def make(*argv):
        args = dqn_atari.parse_args(['--env', 'ALE/Pong-v5', *map(str, argv)])
        return dqn_atari.training_players(args)()
    return make


@pytest.mark.parametrize('flags', [['--prioritized'], ['--n-step', 3], []])
def test_an_asynchronous_envpool_stays_asynchronous_and_clips_rewards(flags, players):
    pytest.importorskip('envpool')
    env = players('--envpool', 4, *flags)
    try:
        assert adapt_env(env).is_async, "the runner must see EnvPool's recv/send"
        assert env.config['reward_clip'] is bool(flags)
    finally:
        env.close()


def test_a_vector_env_clips_rewards_in_the_engine(players, dqn_atari):
    env = players('--vector', 2, '--prioritized')
    try:
        assert not isinstance(env, dqn_atari.gym.Wrapper) and not hasattr(env, 'env')
        env.reset(seed=0)
        # Clipped by ale-py itself: over random play every reward is in [-1, 1].
        rewards = [env.step(np.random.default_rng(t).integers(0, 6, 2))[1] for t in range(300)]
        assert np.abs(np.concatenate(rewards)).max() <= 1.0
    finally:
        env.close()


class BigRewards(gym.Env):
    """A stand-in single env whose rewards are far outside [-1, 1]."""

    observation_space = gym.spaces.Box(0, 255, (84, 84), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return np.zeros((84, 84), np.uint8), {}

    def step(self, action):
        return np.zeros((84, 84), np.uint8), 37.0 * (1 if action else -1), False, False, {}

    def close(self):
        pass


def test_a_single_env_is_wrapped_in_clip_reward(monkeypatch, players, dqn_atari):
    monkeypatch.setattr(dqn_atari, 'get_player', lambda args, train=False: BigRewards())
    # Single-env players (--vector 0): the default is ale-py's vector env.
    env = players('--vector', 0, '--prioritized', '--update-frequency', 4)
    env.reset()
    assert env.step(1)[1] == 1.0 and env.step(0)[1] == -1.0
    plain = players('--vector', 0)
    plain.reset()
    assert plain.step(1)[1] == 37.0                  # uniform 1-step: the model clips
