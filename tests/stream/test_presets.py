"""The presets: ReplayStream.atari_dqn (tensorpack's DQN.py) and ReplayStream.minatar_dqn (the
MinAtar paper's DQN) build the set-up they name, take each part's settings for that part, a
preset of one's own builds through ReplayStream.from_preset, and they run."""

import dataclasses
import threading

import gymnasium as gym
import numpy as np
import pytest

from expreplay import ReplayMemory
from expreplay.presets import MINATAR_DQN
from expreplay.stream import Population, ReplayStream, Sampling
from scripted_env import ScriptedEnv


class MinAtarLike(gym.Env):
    """MinAtar's observations ((10, 10, 4) booleans), 6 actions, episodes of 20 steps."""

    observation_space = gym.spaces.Box(0, 1, (10, 10, 4), bool)
    action_space = gym.spaces.Discrete(6)
    made = 0
    closed = 0

    def __init__(self):
        MinAtarLike.made += 1
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action == 1), self.t >= 20, False, {}

    def _obs(self):
        obs = np.zeros((10, 10, 4), bool)
        obs[self.t % 10, 0, 0] = True
        return obs

    def close(self):
        MinAtarLike.closed += 1


def zeros(num_actions):
    def q_values(states):
        return np.zeros((len(states), num_actions), np.float32)
    return q_values


@pytest.fixture
def closing():
    streams = []
    yield streams.append
    for stream in streams:
        stream.close()
    assert not [t for t in threading.enumerate() if t.name.startswith('SimulatorThread')]


def test_minatar_preset_is_the_papers_replay(closing):
    made, closed = MinAtarLike.made, MinAtarLike.closed
    stream = ReplayStream.minatar_dqn(MinAtarLike, zeros(6))
    closing(stream)
    memory, sampling, population = stream.memory, stream.sampling, stream.population
    assert memory.max_size == 100_000 and memory.history_len == 1
    assert memory.state_shape == (10, 10, 4)      # what the players' space declares
    assert memory.dtype == np.dtype(bool) and not memory.prioritized
    # The player built to read the shape is the runner's: none is built only to look.
    assert MinAtarLike.made - made == 1 and MinAtarLike.closed - closed == 0
    assert sampling.batch_size == 32 and sampling.update_frequency == 1
    assert sampling.n_step == 1 and sampling.gamma == 0.99
    assert stream.init_memory_size == 5_000
    assert population.num_players == 1 and population.predictor is not None
    epsilon = population.exploration_schedule
    # 1 during the 5,000 random frames, then 1 -> 0.1 over the next 100,000.
    assert [epsilon(s) for s in (0, 5_000, 55_000, 105_000, 10**7)] == \
        pytest.approx([1.0, 1.0, 0.55, 0.1, 0.1])


def test_atari_preset_is_dqn_pys_replay(closing):
    stream = ReplayStream.atari_dqn(lambda: ScriptedEnv(obs_shape=(84, 84)), zeros(3))
    closing(stream)
    memory, sampling, population = stream.memory, stream.sampling, stream.population
    assert memory.max_size == 1_000_000 and memory.state_shape == (84, 84)
    assert memory.history_len == 4 and memory.dtype == np.dtype('uint8')
    assert sampling.batch_size == 64 and sampling.update_frequency == 4
    assert stream.init_memory_size == 50_000
    assert population.num_players == 3
    epsilon = population.exploration_schedule
    # 1 during the fill, 1 -> 0.1 over the first 1M agent steps after it, -> 0.01 by 40M.
    fill = 50_000
    assert [epsilon(fill + s) for s in (-fill, 0, 500_000, 1_000_000, 20_500_000, 40_000_000,
                                        10**9)] == \
        pytest.approx([1.0, 1.0, 0.55, 0.1, 0.055, 0.01, 0.01])


def test_overrides_win_in_the_part_that_owns_them(closing):
    made = MinAtarLike.made
    stream = ReplayStream.minatar_dqn(
        MinAtarLike, zeros(6),
        memory={'state_shape': (10, 10, 4), 'max_size': 1_000, 'prioritized': True},
        sampling={'batch_size': 8, 'update_frequency': 2, 'n_step': 3, 'gamma': 0.9},
        population={'num_players': 2, 'exploration': 0.2},
        seed=7, init_memory_size=100, prefetch=0, progress=False)
    closing(stream)
    assert MinAtarLike.made == made + 1   # a shape given: only the runner's first player
    memory, sampling, population = stream.memory, stream.sampling, stream.population
    assert memory.max_size == 1_000 and memory.prioritized and memory.history_len == 1
    assert memory.dtype == np.dtype(bool)     # the preset's value, kept beside the overrides
    assert (sampling.batch_size, sampling.update_frequency, sampling.n_step, sampling.gamma) == \
        (8, 2, 3, 0.9)
    assert population.num_players == 2 and population.exploration == 0.2
    assert population.exploration_schedule is None
    assert population.seed == 7 and sampling.seed == 7    # one seed for the run
    assert stream.init_memory_size == 100 and stream.prefetch == 0
    # The preset itself is unchanged, and can not be changed in place.
    assert dict(MINATAR_DQN.memory) == {'max_size': 100_000, 'history_len': 1, 'dtype': 'bool'}
    with pytest.raises(TypeError):
        MINATAR_DQN.memory['max_size'] = 5


def test_a_preset_of_ones_own_builds_its_parts(closing):
    preset = dataclasses.replace(MINATAR_DQN, name='a small MinAtar DQN',
                                 sampling={'batch_size': 4, 'update_frequency': 2},
                                 init_memory_size=30, epsilon=((0, 1.0), (100, 0.5)))
    stream = ReplayStream.from_preset(preset, MinAtarLike, zeros(6), memory={'max_size': 200},
                                      progress=False)
    closing(stream)
    assert (stream.sampling.batch_size, stream.sampling.update_frequency) == (4, 2)
    assert stream.memory.max_size == 200 and stream.memory.dtype == np.dtype(bool)
    assert stream.init_memory_size == 30
    epsilon = stream.population.exploration_schedule
    assert [epsilon(s) for s in (0, 30, 80, 130, 10**6)] == \
        pytest.approx([1.0, 1.0, 0.75, 0.5, 0.5])


def test_atari_fill_follows_the_memory_size_and_the_schedule_the_fill(closing):
    stream = ReplayStream.atari_dqn(lambda: ScriptedEnv(obs_shape=(84, 84)), zeros(3),
                                    memory={'max_size': 2_000})
    closing(stream)
    assert stream.init_memory_size == 100     # DQN.py's memory size // 20
    epsilon = stream.population.exploration_schedule
    assert epsilon(100) == 1.0 and epsilon(100 + 500_000) == pytest.approx(0.55)
    stream = ReplayStream.atari_dqn(lambda: ScriptedEnv(obs_shape=(84, 84)), zeros(3),
                                    memory={'max_size': 2_000}, init_memory_size=300)
    closing(stream)
    assert stream.population.exploration_schedule(300 + 500_000) == pytest.approx(0.55)


def test_parts_passed_in_are_used_as_they_are(closing):
    population = Population(MinAtarLike, 1, zeros(6), seed=1, exploration=0.5)
    sampling = Sampling(16, 1, seed=2)
    stream = ReplayStream.minatar_dqn(population=population, sampling=sampling,
                                      memory={'state_shape': (10, 10, 4), 'max_size': 500},
                                      init_memory_size=50)
    closing(stream)
    assert stream.population is population and stream.sampling is sampling
    assert population.exploration == 0.5 and population.seed == 1 and sampling.seed == 2
    assert stream.memory.max_size == 500
    memory = ReplayMemory(400, (10, 10, 4), 1, 'bool')
    stream = ReplayStream.minatar_dqn(MinAtarLike, zeros(6), memory=memory, init_memory_size=50)
    closing(stream)
    assert stream.memory is memory


@pytest.mark.parametrize('preset', ['minatar_dqn', 'atari_dqn'])
def test_seed_reaches_the_parts_built_and_is_refused_when_it_would_seed_none(closing, preset):
    build = getattr(ReplayStream, preset)
    common = dict(memory={'state_shape': (10, 10, 4), 'dtype': 'bool', 'max_size': 500},
                  init_memory_size=50)
    stream = build(population=Population(MinAtarLike, 1, zeros(6), seed=1), seed=3, **common)
    closing(stream)
    assert stream.population.seed == 1 and stream.sampling.seed == 3
    stream = build(MinAtarLike, zeros(6), sampling=Sampling(16, 1, seed=2), seed=3, **common)
    closing(stream)
    assert stream.population.seed == 3 and stream.sampling.seed == 2
    with pytest.raises(ValueError, match=r'seed=3 would seed nothing: it seeds the population '
                                         r'and the sampling, and each is passed in'):
        build(population=Population(MinAtarLike, 1, zeros(6), seed=1),
              sampling=Sampling(16, 1, seed=2), seed=3, **common)


@pytest.mark.parametrize('preset', ['minatar_dqn', 'atari_dqn'])
@pytest.mark.parametrize('part, name', [('memory', 'max_size'), (None, 'init_memory_size'),
                                        ('sampling', 'batch_size'),
                                        ('population', 'num_players')])
@pytest.mark.parametrize('value', ['big', None, [100]])
def test_a_number_of_the_wrong_type_is_a_type_error_naming_it(preset, part, name, value):
    settings = {'memory': {'state_shape': (10, 10, 4), 'dtype': 'bool'}}
    if part is None:
        settings[name] = value
    else:
        settings.setdefault(part, {})[name] = value
    with pytest.raises(TypeError, match=f'^{name} must be an integer'):
        getattr(ReplayStream, preset)(MinAtarLike, zeros(6), **settings)


@pytest.mark.parametrize('kwargs, message', [
    (dict(max_size=10), r"max_size is the memory's setting: give it as memory=\{'max_size': "),
    (dict(batch_size=4), r"batch_size is the sampling's setting: give it as sampling="),
    (dict(batchsize=4), r"unexpected keyword argument 'batchsize'"),
    (dict(memory={'max_sise': 10}), r"unexpected keyword argument 'max_sise'"),
    (dict(sampling={'nstep': 3}), r"unexpected keyword argument 'nstep'"),
    (dict(memory=100), r"memory must be a ReplayMemory or a mapping of its settings, got int"),
    (dict(seed=3, population={'seed': 1}),
     r"seed is given twice: seed=3 and population=\{'seed': 1\}"),
])
def test_a_setting_no_part_takes_is_refused_naming_it(kwargs, message):
    with pytest.raises(TypeError, match=message):
        ReplayStream.minatar_dqn(MinAtarLike, zeros(6), **kwargs)


def test_a_population_passed_in_brings_its_own_get_player():
    with pytest.raises(TypeError, match='population passed in has its get_player'):
        ReplayStream.minatar_dqn(MinAtarLike, population=Population(MinAtarLike, 1))
    with pytest.raises(TypeError, match="the MinAtar paper's DQN needs get_player"):
        ReplayStream.minatar_dqn()


def test_the_parts_check_the_values(closing):
    with pytest.raises(ValueError, match='batch_size'):
        ReplayStream.minatar_dqn(MinAtarLike, memory={'state_shape': (10, 10, 4)},
                                 sampling={'batch_size': 0})
    with pytest.raises(ValueError, match='dtype'):   # a uint8 frame in the paper's bool memory
        ReplayStream.minatar_dqn(lambda: ScriptedEnv(obs_shape=(10, 10, 4)),
                                 memory={'state_shape': (10, 10, 4), 'dtype': 'bool'})


@pytest.mark.parametrize('preset, make_env, num_actions, shape', [
    ('minatar_dqn', MinAtarLike, 6, (10, 10, 4, 1)),
    ('atari_dqn', lambda: ScriptedEnv(obs_shape=(84, 84)), 3, (84, 84, 4)),
])
def test_a_preset_stream_runs(closing, preset, make_env, num_actions, shape):
    stream = getattr(ReplayStream, preset)(make_env, zeros(num_actions),
                                           memory={'max_size': 1_000}, init_memory_size=60,
                                           sampling={'batch_size': 8}, seed=0, progress=False)
    closing(stream)
    for k, batch in enumerate(stream):
        assert batch.state.shape == (8,) + shape
        if k == 20:
            break
    assert len(stream.memory) >= 60 + 20 * stream.sampling.update_frequency - 8
    assert 0.0 < stream.exploration <= 1.0


def test_a_resumed_memory_goes_on_with_its_epsilon(tmp_path, closing):
    kwargs = dict(memory={'state_shape': (10, 10, 4), 'max_size': 1_000}, init_memory_size=100,
                  progress=False, checkpoint_dir=tmp_path)
    stream = ReplayStream.minatar_dqn(MinAtarLike, zeros(6), **kwargs)
    for k, _ in enumerate(stream):
        if k == 400:
            break
    stream.close()
    frames = stream.memory.num_steps_written
    assert frames >= 500
    resumed = ReplayStream.minatar_dqn(MinAtarLike, zeros(6), **kwargs)
    closing(resumed)
    assert resumed.resumed
    epsilon = resumed.population.exploration_schedule
    # The population counts its steps from 0 again; the schedule adds the memory's count.
    assert epsilon(0) == pytest.approx(1.0 - 0.9 * (frames - 100) / 100_000)
