"""Bad input is refused at the door, with an error naming the argument.

Values that can not be stored exactly (a reward beyond float32, NaN frames, integers a float
memory would round) are refused as integer overflow already was, by the scalar checks the
writers use and by their vectorized forms (for batch writers); constructor arguments are
checked by the shared rules of ``expreplay._checks``, so the same bad value is refused the same
way by ``ReplayMemory``, ``ReplayStream`` and the episode schedulers.
"""

import math

import numpy as np
import pytest

import expreplay
from expreplay import Experience, ReplayMemory
from expreplay.storage.memory import as_frame
from expreplay.stream import Population, ReplayStream, Sampling


def float_memory(**kwargs):
    args = dict(max_size=100, state_shape=(3,), history_len=1, dtype='float32')
    args.update(kwargs)
    return ReplayMemory(**args)


def started_writer(mem):
    w = mem.new_writer()
    w.start_episode(np.zeros(mem.state_shape, mem.dtype))
    return w


# ---------------------------------------------------------------- capacity is a promise
def test_block_size_larger_than_max_size_is_refused_naming_both():
    with pytest.raises(ValueError, match=r'block_size \(2000000\).*max_size \(100\)'):
        ReplayMemory(100, (2,), 1, block_size=2_000_000)


def test_block_size_equal_to_max_size_is_accepted():
    mem = ReplayMemory(100, (2,), 1, block_size=100)
    assert mem.block_size == 100


# ---------------------------------------------------------------- storable numbers only
@pytest.mark.parametrize('reward', [1e300, -1e300, 2 * float(np.finfo(np.float32).max),
                                    math.inf, math.nan, np.float64(1e39)])
def test_a_reward_float32_can_not_hold_is_refused(reward):
    mem = float_memory()
    w = started_writer(mem)
    with pytest.raises(ValueError, match='reward'):
        w.add_step(0, reward, np.zeros(3, np.float32))
    assert mem.num_steps_written == 0


@pytest.mark.parametrize('reward', ['1.0', None, [1.0], True])
def test_a_reward_that_is_not_a_number_is_refused(reward):
    w = started_writer(float_memory())
    with pytest.raises(TypeError, match='reward'):
        w.add_step(0, reward, np.zeros(3, np.float32))


def test_largest_float32_reward_and_numpy_scalars_are_accepted():
    mem = float_memory()
    w = started_writer(mem)
    big = float(np.finfo(np.float32).max)
    w.add_step(0, big, np.zeros(3, np.float32))
    w.add_step(1, np.float32(-2.5), np.zeros(3, np.float32))
    w.add_step(1, np.int64(3), np.zeros(3, np.float32), terminated=True)
    assert sorted(mem.ring.reward[:3].tolist()) == [-2.5, 3.0, big]


@pytest.mark.parametrize('bad', [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize('src', ['float32', 'float64'])
def test_nan_or_inf_frames_are_refused_by_a_float_memory(bad, src):
    mem = float_memory()
    frame = np.array([0.0, bad, 1.0], src)
    w = mem.new_writer()
    with pytest.raises(ValueError, match='obs.*(NaN|inf)'):
        w.start_episode(frame)
    w.start_episode(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match='next_obs'):
        w.add_step(0, 0.0, frame)
    assert mem.num_steps_written == 0


def test_float64_values_beyond_float32_are_refused():
    with pytest.raises(ValueError, match='obs.*float32'):
        started_writer(float_memory()).add_step(0, 0.0, np.array([0.0, 1e300, 0.0]))


def test_float64_rounding_into_float32_is_accepted():
    mem = float_memory()
    w = started_writer(mem)
    w.add_step(0, 0.0, np.array([0.1, -3.3, 1e30]))
    assert mem.ring.frames[1].tolist() == np.float32([0.1, -3.3, 1e30]).tolist()


def test_integers_a_float_memory_would_round_are_refused():
    w = started_writer(float_memory())
    with pytest.raises(ValueError, match='obs.*float32'):
        w.add_step(0, 0.0, np.array([0, 2**40 + 1, 0], np.int64))
    # 2**24 and 2**40 are exact in float32: accepted; so is 2**40 + 1 in a float64 memory.
    w.add_step(0, 0.0, np.array([2**24, 2**40, -7], np.int64))
    mem64 = float_memory(dtype='float64')
    started_writer(mem64).add_step(0, 0.0, np.array([0, 2**40 + 1, 0], np.int64))
    assert mem64.ring.frames[1, 1] == 2**40 + 1


def test_a_bool_memory_refuses_integers_other_than_0_and_1():
    mem = ReplayMemory(100, (3,), 1, dtype=bool)
    w = mem.new_writer()
    with pytest.raises(ValueError, match='obs'):
        w.start_episode(np.array([0, 2, 1]))
    w.start_episode(np.array([0, 1, 1]))


@pytest.mark.parametrize('flag', ['no', math.nan, 1.0, None, 'False'])
def test_terminated_and_truncated_must_be_bools(flag):
    mem = float_memory()
    w = started_writer(mem)
    with pytest.raises(TypeError, match='terminated'):
        w.add_step(0, 0.0, np.zeros(3, np.float32), terminated=flag)
    with pytest.raises(TypeError, match='truncated'):
        w.add_step(0, 0.0, np.zeros(3, np.float32), truncated=flag)
    assert mem.num_steps_written == 0
    w.add_step(0, 0.0, np.zeros(3, np.float32), terminated=np.bool_(True))


def test_append_refuses_unstorable_steps_and_writes_nothing():
    mem = float_memory()
    ok = np.zeros(3, np.float32)
    mem.append(Experience(ok, 0, 1.0, False))
    for exp in (Experience(ok, 0, 1e300, False), Experience(np.float32([0, math.nan, 0]), 0, 0.0, False),
                Experience(ok, 0, 0.0, 'no')):
        with pytest.raises((TypeError, ValueError)):
            mem.append(exp)
    assert mem.num_steps_written == 0 and len(mem) == 0
    mem.append(Experience(ok, 1, 1.0, True))
    assert len(mem) == 2


def test_vectorized_checks_apply_the_scalar_rules():
    """The batch forms refuse exactly what the per-step checks refuse, naming the argument."""
    from expreplay.storage.memory import check_actions, check_flags, check_frames, check_rewards
    f32max = float(np.finfo(np.float32).max)
    assert check_rewards(np.array([0.0, -1.0, f32max]), 'rewards').dtype == np.float32
    for bad in (np.array([0.0, 1e300]), np.array([math.nan]), np.array([1.0, -math.inf])):
        with pytest.raises(ValueError, match='rewards'):
            check_rewards(bad, 'rewards')
    for bad in (np.array(['1.0']), np.array([True]), np.array([1.0], object)):
        with pytest.raises(TypeError, match='rewards'):
            check_rewards(bad, 'rewards')

    np.testing.assert_array_equal(check_actions(np.array([0, 5], np.int64), 'actions'), [0, 5])
    with pytest.raises(ValueError, match='actions'):
        check_actions(np.array([0, 2**31]), 'actions')
    with pytest.raises(TypeError, match='actions'):
        check_actions(np.array([0.0, 1.0]), 'actions')

    np.testing.assert_array_equal(check_flags(np.array([True, False]), 'terminated'), [True, False])
    with pytest.raises(TypeError, match='terminated'):
        check_flags(np.array([1.0, math.nan]), 'terminated')

    frames = np.zeros((2, 3), np.float64)
    assert check_frames(frames, (3,), np.dtype('float32'), 'next_obs').shape == (2, 3)
    frames[1, 2] = math.nan
    with pytest.raises(ValueError, match=r'next_obs\[1\].*NaN'):
        check_frames(frames, (3,), np.dtype('float32'), 'next_obs')
    with pytest.raises(ValueError, match=r'next_obs\[0\]'):
        check_frames(np.array([[0, 2**40 + 1, 0]]), (3,), np.dtype('float32'), 'next_obs')
    with pytest.raises(ValueError, match='next_obs.*shape'):
        check_frames(np.zeros((2, 4)), (3,), np.dtype('float32'), 'next_obs')
    with pytest.raises(ValueError, match='fit'):
        check_frames(np.array([[0, 300, 0]]), (3,), np.dtype('uint8'), 'next_obs')
    # One frame: the scalar form refuses the same values.
    with pytest.raises(ValueError, match='player observation.*NaN'):
        as_frame(np.float32([0, math.nan, 0]), (3,), np.dtype('float32'), 'player observation')


# ---------------------------------------------------------------- ReplayMemory arguments
@pytest.mark.parametrize('kwargs, error, match', [
    (dict(state_shape='84'), TypeError, 'state_shape'),
    (dict(state_shape=(84.7, True)), TypeError, 'state_shape'),
    (dict(state_shape=(84, True)), TypeError, 'state_shape'),
    (dict(state_shape=(84.0, 84.0)), TypeError, 'state_shape'),
    (dict(state_shape=(0, 3)), ValueError, 'state_shape'),
    (dict(dtype=None), TypeError, 'dtype'),
    (dict(dtype='U4'), TypeError, 'dtype'),
    (dict(history_len=4.9), ValueError, 'history_len'),
    (dict(history_len=True), TypeError, 'history_len'),
    (dict(max_size=float('inf')), ValueError, 'max_size'),
    (dict(max_size=1e6 + 0.5), ValueError, 'max_size'),
    (dict(max_size='1000'), TypeError, 'max_size'),
    (dict(block_size=8.5), ValueError, 'block_size'),
])
def test_replay_memory_refuses_bad_arguments_naming_them(kwargs, error, match):
    args = dict(max_size=1000, state_shape=(4, 4), history_len=4, dtype='uint8')
    args.update(kwargs)
    with pytest.raises(error, match=match):
        ReplayMemory(**args)


def test_replay_memory_accepts_whole_float_sizes():
    """tensorpack's DQN.py passes MEMORY_SIZE = 1e6."""
    mem = ReplayMemory(1e6, (2,), 4.0, block_size=1e3)
    assert (mem.max_size, mem.history_len, mem.block_size) == (1_000_000, 4, 1000)
    assert all(type(v) is int for v in (mem.max_size, mem.history_len, mem.block_size))
    assert ReplayMemory(100, np.int64(3), 1).state_shape == (3,)
    assert ReplayMemory(100, np.array([2, 3]), 1).state_shape == (2, 3)


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(rng=42), TypeError, 'rng'),
    (dict(rng='abc'), TypeError, 'rng'),
    (dict(batch_size=True), TypeError, 'batch_size'),
    (dict(batch_size=2.5), ValueError, 'batch_size'),
    (dict(batch_size=0), ValueError, 'batch_size'),
    (dict(layout='nhwc'), ValueError, 'layout'),
])
def test_sample_batch_refuses_bad_arguments_naming_them(kwargs, error, match):
    mem = float_memory()
    w = started_writer(mem)
    for _ in range(20):
        w.add_step(0, 0.0, np.zeros(3, np.float32))
    args = dict(batch_size=8)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        mem.sample_batch(**args)
    assert len(mem.sample_batch(8, rng=np.random.RandomState(0))[0]) == 8


# ---------------------------------------------------------------- ReplayStream arguments
def build_stream(**kwargs):
    """A stream of small settings; ``kwargs`` are the new settings of its parts, by the name
    each part gives them."""
    args = dict(predictor=None, get_player=lambda: None, num_players=2, state_shape=(6,),
                batch_size=16, max_size=600, init_memory_size=100, update_frequency=4,
                history_len=3, progress=False)
    args.update(kwargs)
    memory = {k: args.pop(k) for k in ('max_size', 'state_shape', 'history_len', 'dtype')
              if k in args}
    population = {k: args.pop(k) for k in ('get_player', 'num_players', 'predictor',
                                           'exploration', 'maximum_staleness',
                                           'on_episode_end') if k in args}
    sampling = {k: args.pop(k) for k in ('batch_size', 'update_frequency', 'layout') if k in args}
    if 'seed' in args:                 # seeds the players and the draws
        population['seed'] = sampling['seed'] = args.pop('seed')
    return ReplayStream(ReplayMemory(**memory), Population(**population), Sampling(**sampling),
                        **args)


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(batch_size=True), TypeError, 'batch_size'),
    (dict(batch_size=16.5), ValueError, 'batch_size'),
    (dict(max_size=float('inf')), ValueError, 'max_size'),
    (dict(max_size='600'), TypeError, 'max_size'),
    (dict(num_players=0), ValueError, 'num_players'),
    (dict(history_len=2.9), ValueError, 'history_len'),
    (dict(seed='abc'), TypeError, 'seed'),
    (dict(seed=-1), ValueError, 'seed'),
    (dict(seed=1.5), TypeError, 'seed'),
    (dict(state_shape='84'), TypeError, 'state_shape'),
    (dict(state_shape=(6.0,)), TypeError, 'state_shape'),
    (dict(dtype=None), TypeError, 'dtype'),
    (dict(exploration=1.5), ValueError, 'exploration'),
    (dict(exploration='1'), ValueError, 'exploration'),
    (dict(maximum_staleness=0), ValueError, 'maximum_staleness'),
    (dict(layout='channels_last'), ValueError, 'layout'),
    (dict(get_player=None), TypeError, 'get_player'),
    (dict(predictor=42), TypeError, 'predictor'),
    (dict(on_episode_end=42), TypeError, 'on_episode_end'),
    (dict(progress='yes'), TypeError, 'progress'),
    (dict(init_memory_size=-1), ValueError, 'init_memory_size'),
    (dict(init_memory_size=601), ValueError, 'init_memory_size'),
])
def test_replay_stream_refuses_bad_arguments_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        build_stream(**kwargs)


def test_replay_stream_exploration_assignments_are_checked():
    stream = build_stream()
    stream.exploration = np.float32(0.25)
    assert stream.exploration == 0.25 and type(stream.exploration) is float
    for bad in (1.5, -0.1, math.nan, '0.1', None):
        with pytest.raises(ValueError, match='exploration'):
            stream.exploration = bad
    assert stream.exploration == 0.25


def test_replay_stream_accepts_whole_float_sizes_like_replay_memory():
    stream = build_stream(max_size=1e3, init_memory_size=1e2, batch_size=16.0,
                          update_frequency=4.0, history_len=3.0, num_players=2.0,
                          seed=np.int64(7))
    assert (stream.memory.max_size, stream.init_memory_size, stream.sampling.batch_size,
            stream.sampling.update_frequency, stream.population.num_players) == (1000, 100, 16, 4, 2)
    assert stream.population.seed == 7 and stream.sampling.seed == 7
    assert all(type(v) is int for v in (stream.init_memory_size, stream.sampling.batch_size,
                                        stream.sampling.update_frequency,
                                        stream.population.num_players))


def test_a_float_env_with_the_default_uint8_memory_is_refused_naming_the_fix():
    """CartPole's float observations, stored in the default uint8 frames, would fail at the
    first step in a simulator thread: refused when the stream is built, with the fix."""
    gym = pytest.importorskip('gymnasium')
    with pytest.raises(ValueError, match=r"float32.*dtype='uint8' can not store: pass dtype='float32'"):
        build_stream(get_player=lambda: gym.make('CartPole-v1'), state_shape=(4,))
    with pytest.raises(ValueError, match=r"shape \(4,\).*state_shape=\(6,\)"):
        build_stream(get_player=lambda: gym.make('CartPole-v1'), dtype='float32')
    build_stream(get_player=lambda: gym.make('CartPole-v1'), state_shape=(4,),
                 dtype='float32').close()


# ---------------------------------------------------------------- episode schedulers
@pytest.mark.parametrize('make, error, match', [
    (lambda: expreplay.ProceduralSeeds('abc'), TypeError, 'base_seed'),
    (lambda: expreplay.ProceduralSeeds(1.5), TypeError, 'base_seed'),
    (lambda: expreplay.FixedSeed(True), TypeError, 'seed'),
    (lambda: expreplay.SeedList([1, 'x']), TypeError, 'seeds'),
    (lambda: expreplay.SeedList([1, 2], cycle='no'), TypeError, 'cycle'),
    (lambda: expreplay.RestartPool(share='half'), ValueError, 'share'),
    (lambda: expreplay.RestartPool(share=math.nan), ValueError, 'share'),
    (lambda: expreplay.RestartPool(capacity=2.5), ValueError, 'capacity'),
    (lambda: expreplay.RestartPool(harvest_every=0), ValueError, 'harvest_every'),
    (lambda: expreplay.RestartPool(seed='abc'), TypeError, 'seed'),
    (lambda: expreplay.Curriculum([('x', {})]), TypeError, 'threshold'),
    (lambda: expreplay.Curriculum([(math.nan, {})]), ValueError, 'threshold'),
    (lambda: expreplay.Curriculum([(0, {})], count_env_steps='yes'), TypeError, 'count_env_steps'),
    (lambda: expreplay.EpisodeLog('/nonexistent-dir/never/episodes.jsonl', fsync='no'), TypeError,
     'fsync'),
])
def test_episode_schedulers_refuse_bad_arguments_naming_them(make, error, match):
    with pytest.raises(error, match=match):
        make()
