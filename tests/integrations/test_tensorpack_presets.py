"""ExpReplay.atari_dqn: tensorpack's DQN.py replay in one call, its overrides, and a few batches."""

import threading

import numpy as np
import pytest

# Before TensorFlow: it sets TF_USE_LEGACY_KERAS=1 for tensorpack's layers.
tensorpack_io = pytest.importorskip('expreplay.tensorpack_io')

from expreplay import ReplayMemory  # noqa: E402
from expreplay.acting.population import Population  # noqa: E402
from expreplay.acting.settings import ManagerSettings  # noqa: E402
from expreplay.stream.sampling import Sampling  # noqa: E402
from scripted_env import ScriptedEnv  # noqa: E402

ExpReplay, CLOSE_TIMEOUT = tensorpack_io.ExpReplay, tensorpack_io.CLOSE_TIMEOUT
OUR_THREADS = ('SimulatorThread', 'InferenceThread', 'ReplayStream-prefetch')


def atari_env():
    return ScriptedEnv(obs_shape=(84, 84), episode_lengths=(30,))


def q_values(states):
    return np.tile(np.float32([0, 0, 1]), (len(states), 1))


def test_the_preset_is_dqn_pys_expreplay():
    replay = ExpReplay.atari_dqn((['state'], ['Qvalue']), atari_env)
    stream = replay.stream
    try:
        assert replay.predictor_io_names == (['state'], ['Qvalue'])
        assert replay.mem.max_size == 1_000_000 and replay.mem.state_shape == (84, 84)
        assert replay.mem.history_len == 4 and replay.mem.dtype == np.dtype('uint8')
        assert stream.sampling.batch_size == 64 and stream.sampling.update_frequency == 4
        assert stream.sampling.batch_format.name == 'tensorpack'   # DQN.py's model reads the 4-list
        assert stream.init_memory_size == 50_000
        population = stream.population
        assert population.num_players == 3 and population.close_timeout == CLOSE_TIMEOUT
        epsilon = population.exploration_schedule
        # DQN.py's [(0, 1), (10, 0.1), (400, 0.01)] in epochs of 100k agent steps, after the fill.
        assert [epsilon(50_000 + s) for s in (-50_000, 0, 500_000, 1_000_000, 40_000_000)] == \
            pytest.approx([1.0, 1.0, 0.55, 0.1, 0.01])
        assert replay.exploration == 1.0
    finally:
        stream.close()


def test_overrides_win():
    replay = ExpReplay.atari_dqn(q_values, atari_env, memory_size=2_000, batch_size=16,
                                 num_parallel_players=1, update_frequency=2, exploration=0.3)
    stream = replay.stream
    try:
        assert replay.mem.max_size == 2_000 and stream.init_memory_size == 100   # // 20
        assert stream.sampling.batch_size == 16 and stream.sampling.update_frequency == 2
        assert stream.population.num_players == 1 and replay.exploration == 0.3
        assert stream.population.exploration_schedule is None
    finally:
        stream.close()
    replay = ExpReplay.atari_dqn(q_values, atari_env, memory_size=2_000, init_memory_size=500)
    try:
        assert replay.stream.init_memory_size == 500
        assert replay.stream.population.exploration_schedule(500 + 500_000) == pytest.approx(0.55)
    finally:
        replay.stream.close()


def test_parts_passed_in_give_tensorpacks_arguments():
    memory = ReplayMemory(3_000, (84, 84), 4, prioritized=True)
    sampling = Sampling(32, 8, batch_format='transitions')
    population = Population(atari_env, 2, exploration=0.5,
                            manager=ManagerSettings(close_timeout=CLOSE_TIMEOUT))
    replay = ExpReplay.atari_dqn(q_values, atari_env, memory=memory, sampling=sampling,
                                 population=population)
    try:
        assert replay.mem is memory and replay.stream.sampling is sampling
        assert replay.stream.population is population and replay.exploration == 0.5
        assert replay.stream.init_memory_size == 150
    finally:
        replay.stream.close()
    with pytest.raises(TypeError, match="exploration is the population's"):
        ExpReplay.atari_dqn(q_values, atari_env, population=population, exploration=0.1)
    # ExpReplay's own check: an argument that disagrees with the part passed in.
    with pytest.raises(ValueError, match='memory_size=1000 and memory.max_size=3000 disagree'):
        ExpReplay.atari_dqn(q_values, atari_env, memory=memory, memory_size=1_000)


def test_seed_seeds_the_parts_built_here_and_is_refused_when_it_would_seed_none():
    replay = ExpReplay.atari_dqn(q_values, atari_env, memory_size=2_000, seed=5)
    try:
        stream = replay.stream
        assert stream.population.seed == 5 and stream.sampling.seed == 5
        assert stream.sampling.batch_format.name == 'tensorpack'    # as ExpReplay's own sampling
        assert stream.population.exploration_schedule is not None   # the preset's epsilon
    finally:
        replay.stream.close()
    memory = ReplayMemory(2_000, (84, 84), 4, prioritized=True)
    replay = ExpReplay.atari_dqn(q_values, atari_env, memory=memory, seed=5)
    try:
        assert replay.stream.sampling.batch_format.name == 'transitions' and replay.stream.sampling.seed == 5
    finally:
        replay.stream.close()
    population = Population(atari_env, 2, seed=1, manager=ManagerSettings(close_timeout=CLOSE_TIMEOUT))
    with pytest.raises(ValueError, match=r'seed=5 would seed nothing: .* population and the '
                                         r'sampling, and both are passed in'):
        ExpReplay.atari_dqn(q_values, atari_env, memory_size=2_000, population=population,
                            sampling=Sampling(64, 4, batch_format='tensorpack', seed=2), seed=5)


@pytest.mark.parametrize('name', ['memory_size', 'init_memory_size'])
@pytest.mark.parametrize('value', ['big', None, [1_000]])
def test_a_size_of_the_wrong_type_is_a_type_error_naming_it(name, value):
    with pytest.raises(TypeError, match=f'^{name} must be an integer'):
        ExpReplay.atari_dqn(q_values, atari_env, **{name: value})


def test_the_preset_runs_a_few_batches():
    replay = ExpReplay.atari_dqn(q_values, atari_env, memory_size=2_000, batch_size=8,
                                 num_parallel_players=2)
    replay.before_train()
    batches = iter(replay)
    for _ in range(10):
        comb_state, action, reward, is_over = next(batches)
        assert comb_state.shape == (8, 84, 84, 5)
    assert len(replay.mem) >= 100
    assert 0.99 < replay.exploration <= 1.0       # the schedule, read at the steps stored
    replay.after_train()
    assert not [t for t in threading.enumerate() if t.name.startswith(OUR_THREADS)]
