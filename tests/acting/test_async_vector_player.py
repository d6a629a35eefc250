"""Envs written in Python stepped in worker processes: gymnasium's ``AsyncVectorEnv`` (shared
memory) as a ``Population`` player behind a ``ReplayStream``.

CartPole's dynamics are deterministic given the state, so every stored transition can be
checked: stepping a local CartPole from the sampled state with the sampled action must give
the sampled next state, the reward and the terminal flag (a transition that crossed an episode
end, or paired the wrong sub-env's frames, would not).
"""

import functools

import gymnasium as gym
import numpy as np
import pytest

from expreplay import Population, ReplayMemory, ReplayStream, Sampling

SUB_ENVS = 2
BATCH = 16
UPDATE_FREQUENCY = 4


def make_player(made):
    """An AsyncVectorEnv of CartPole workers; ``made`` collects them for the test to inspect.
    forkserver: its workers are started from a clean server process, not forked from this
    one, whose threads (the stream's, pytest's) a fork would copy mid-flight."""
    env = gym.vector.AsyncVectorEnv([functools.partial(gym.make, 'CartPole-v1')] * SUB_ENVS,
                                    shared_memory=True, context='forkserver')
    made.append(env)
    return env


@pytest.fixture(scope='module')
def run():
    """A stream over two AsyncVectorEnv players, 200 batches drawn, then closed:
    ``(memory, stats before close, the players)``."""
    made = []
    memory = ReplayMemory(5_000, (4,), 1, dtype='float32')
    stream = ReplayStream(memory, Population(functools.partial(make_player, made), 2, seed=0),
                          Sampling(BATCH, UPDATE_FREQUENCY, seed=0), init_memory_size=200,
                          progress=False)
    try:
        for n, batch in enumerate(stream):
            assert batch[0].shape == (BATCH, 4, 1)
            if n == 200:
                break
        stats = stream.stats()
    finally:
        stream.close(save=False)
    return memory, stats, made


def replay_cartpole(state, action):
    """CartPole stepped from ``state`` with ``action``: ``(next obs, reward, terminated)``."""
    env = gym.make('CartPole-v1').unwrapped
    env.reset(seed=0)
    env.state = np.asarray(state, np.float64)
    obs, reward, terminated, _, _ = env.step(int(action))
    return obs, reward, terminated


def test_sampled_transitions_follow_the_dynamics(run):
    memory, _, _ = run
    batch = memory.sample(400, rng=np.random.default_rng(1))
    ends = 0
    for s, a, r, s2, over in zip(batch.state[..., 0], batch.action, batch.reward,
                                 batch.next_state[..., 0], batch.is_over):
        obs, reward, terminated = replay_cartpole(s, a)
        np.testing.assert_allclose(s2, obs, rtol=1e-5, atol=1e-5)
        assert r == reward
        assert bool(over) == terminated
        ends += bool(over)
    assert ends > 0            # episode ends were sampled too (random play: ~22 steps a game)


def test_ratio_counts_sub_env_steps(run):
    """update_frequency 4 is 4 inserted sub-env steps per batch (two vector steps of two
    sub-envs), whatever the player: the measured ratio is batch / update_frequency."""
    _, stats, _ = run
    assert stats.samples_per_insert == pytest.approx(BATCH / UPDATE_FREQUENCY, rel=0.1)


def test_close_ends_the_worker_processes(run):
    _, _, made = run
    assert len(made) == 2
    processes = [p for env in made for p in env.processes]
    assert len(processes) == 2 * SUB_ENVS
    assert all(not p.is_alive() for p in processes)
    assert all(p.exitcode == 0 for p in processes)
