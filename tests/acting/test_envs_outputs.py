"""What an environment may return: observations of the memory's frame shape (or that shape
with size-1 axes added or removed), flags that are bools (or 0/1 integers), and rewards the
memory stores exactly. Anything else is refused naming what was wrong, not reinterpreted."""

import re

import gymnasium as gym
import numpy as np
import pytest

from expreplay import EnvRunner, EnvRunnerManager, ReplayMemory
from expreplay.acting.envs import FrameFormat, SingleEnvAdapter, adapt_env
from scripted_env import ScriptedEnv

H = 2


class Tampered(gym.Wrapper):
    """A scripted env whose step results pass through ``change(obs, r, term, trunc, info)``."""

    def __init__(self, change, **kw):
        super().__init__(ScriptedEnv(0, **kw))
        self.change = change

    def step(self, action):
        return self.change(*self.env.step(action))


class OldApi:
    """An old-gym-API env (reset -> obs, step -> 4-tuple) with a scripted ``done``."""

    def __init__(self, done):
        self.done = done

    def reset(self):
        return np.zeros(6, np.uint8)

    def step(self, action):
        return np.zeros(6, np.uint8), 0.0, self.done, {}


class FakeVector:
    """A duck-typed synchronous vector env of two sub-envs returning the given arrays."""

    num_envs = 2
    single_action_space = gym.spaces.Discrete(2)
    metadata = {'autoreset_mode': 'NextStep'}

    def __init__(self, terminated=(False, False), reward=(0.0, 0.0), obs_shape=(2, 6)):
        self.terminated, self.reward, self.obs_shape = terminated, reward, obs_shape

    def reset(self, seed=None, options=None):
        return np.zeros(self.obs_shape, np.uint8), {}

    def step(self, actions):
        return (np.zeros(self.obs_shape, np.uint8), np.asarray(self.reward),
                np.asarray(self.terminated), np.zeros(2, bool), {})


# ------------------------------------------------------------------------------ observations
def refusal_chain(env, mem):
    """The messages of the exception chain a one-runner manager raises within 5 steps of
    ``env`` (one of them names what was refused)."""
    runner = EnvRunner(env, None, mem, H, seed=0)
    with EnvRunnerManager([runner], maximum_staleness=2) as mgr:
        with pytest.raises(Exception) as info:
            for _ in range(5):
                mgr.step(1.0)
    chain, err = [], info.value
    while err is not None:
        chain.append(str(err))
        err = err.__cause__
    return chain


def test_an_observation_of_the_same_size_but_another_shape_is_refused():
    fmt = FrameFormat((2, 4), np.uint8)
    with pytest.raises(ValueError, match=r'player observation has shape \(4, 2\), expected '
                                         r'state_shape \(2, 4\)'):
        fmt(np.arange(8, dtype=np.uint8).reshape(4, 2))
    with pytest.raises(ValueError, match='player observations'):
        fmt.batch(np.zeros((3, 4, 2), np.uint8), 3)
    with pytest.raises(ValueError, match='player observation'):
        fmt(np.zeros(8, np.uint8))


def test_size_one_axes_are_the_only_difference_allowed():
    fmt = FrameFormat((2, 4), np.uint8)
    frame = np.arange(8, dtype=np.uint8).reshape(2, 4)
    for shape in [(1, 2, 4), (2, 4, 1), (2, 1, 4), (1, 2, 1, 4)]:
        np.testing.assert_array_equal(fmt(frame.reshape(shape)), frame)
    batch = np.arange(24, dtype=np.uint8).reshape(3, 2, 4)
    np.testing.assert_array_equal(fmt.batch(batch.reshape(3, 1, 2, 4), 3), batch)
    np.testing.assert_array_equal(fmt.batch(frame, 1), frame[None])     # one env, unbatched
    np.testing.assert_array_equal(FrameFormat((84, 84, 1), np.uint8)(np.ones((84, 84), np.uint8)),
                                  np.ones((84, 84, 1), np.uint8))


def test_a_runner_refuses_a_transposed_observation():
    env = Tampered(lambda o, r, te, tr, i: (o.reshape(4, 2) if o.size == 8 else o, r, te, tr, i),
                   obs_shape=(2, 4))
    mem = ReplayMemory(200, (2, 4), H)
    chain = refusal_chain(env, mem)
    assert any('player observation has shape (4, 2)' in text for text in chain), chain
    assert len(mem) == 0


# ------------------------------------------------------------------------------ flags
@pytest.mark.parametrize('field, value', [('terminated', 'False'), ('truncated', 'no'),
                                          ('terminated', 0.0), ('truncated', 2),
                                          ('terminated', None), ('terminated', np.array([True]))])
def test_a_flag_that_is_not_a_bool_is_refused_naming_it(field, value):
    def change(o, r, te, tr, i):
        return (o, r, value, tr, i) if field == 'terminated' else (o, r, te, value, i)
    ad = SingleEnvAdapter(Tampered(change), api='gymnasium')
    ad.reset_one()
    with pytest.raises(TypeError, match=re.escape(f"step()'s {field} must be a bool") + '.*got '
                       + re.escape(repr(value))):
        ad.step_one(0)


@pytest.mark.parametrize('value, ended', [(np.bool_(True), True), (1, True), (np.int64(0), False),
                                          (np.array(True), True), (False, False)])
def test_bools_numpy_bools_and_zero_one_integers_are_flags(value, ended):
    ad = SingleEnvAdapter(Tampered(lambda o, r, te, tr, i: (o, r, value, False, i)), api='gymnasium')
    ad.reset_one()
    _, _, terminated, truncated, _ = ad.step_one(0)
    assert terminated is ended and truncated is False


def test_an_old_api_done_that_is_not_a_bool_is_refused():
    ad = SingleEnvAdapter(OldApi('False'))
    ad.reset_one()
    with pytest.raises(TypeError, match=r"step\(\)'s done must be a bool"):
        ad.step_one(0)
    ad = SingleEnvAdapter(OldApi(np.bool_(False)))
    ad.reset_one()
    assert ad.step_one(0)[2:4] == (False, False)


def test_vector_flags_must_be_bools_or_zero_one_integers():
    for bad in [np.array(['False', 'True']), np.array([0.0, 1.0]), np.array([0, 2])]:
        ad = adapt_env(FakeVector(terminated=bad))
        ad.reset()
        with pytest.raises(TypeError, match='player terminated must be bools'):
            ad.step(np.zeros(2, np.int64))
    ad = adapt_env(FakeVector(terminated=np.array([0, 1], np.uint8)))
    ad.reset()
    assert ad.step(np.zeros(2, np.int64)).terminated.tolist() == [False, True]


# ------------------------------------------------------------------------------ rewards
def test_an_integer_reward_float32_can_not_hold_is_refused():
    ad = SingleEnvAdapter(Tampered(lambda o, r, te, tr, i: (o, 16777217, te, tr, i)), api='gymnasium')
    ad.reset_one()
    with pytest.raises(ValueError, match=r"reward is the integer 16777217, .* stored as 16777216"):
        ad.step_one(0)
    ad = SingleEnvAdapter(Tampered(lambda o, r, te, tr, i: (o, np.int64(-16777216), te, tr, i)),
                          api='gymnasium')
    ad.reset_one()
    assert ad.step_one(0)[1] == -16777216.0
    ad = adapt_env(FakeVector(reward=np.array([3, 16777217])))
    ad.reset()
    with pytest.raises(ValueError, match=r'player rewards\[1\] is the integer 16777217'):
        ad.step(np.zeros(2, np.int64))


def test_a_runner_stores_no_rounded_integer_reward():
    env = Tampered(lambda o, r, te, tr, i: (o, 2**24 + 1, te, tr, i))
    mem = ReplayMemory(200, (6,), H)
    chain = refusal_chain(env, mem)
    assert any('16777217' in text for text in chain), chain
    assert len(mem) == 0


def test_the_memory_writers_refuse_inexact_integer_rewards():
    mem = ReplayMemory(100, (2,), H)
    w = mem.new_writer()
    w.start_episode(np.zeros(2, np.uint8))
    with pytest.raises(ValueError, match='integer 16777217'):
        w.add_step(0, 16777217, np.zeros(2, np.uint8))
    w.add_step(0, 16777216, np.zeros(2, np.uint8))
    bw = mem.new_batch_writer(2)
    bw.start_episodes([0, 1], np.zeros((2, 2), np.uint8))
    with pytest.raises(ValueError, match=r'rewards\[0\] is the integer 33554433'):
        bw.add_steps([0, 1], [0, 0], np.array([33554433, 1]), np.zeros((2, 2), np.uint8),
                     np.zeros(2, bool), np.zeros(2, bool))
