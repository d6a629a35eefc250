"""ReplayStream: the framework-free population + sampling behind ``for batch in stream``.

Every batch is checked end to end against the scripted envs' logs, the sampled:inserted ratio is
checked exactly, and shutdown is checked to leave no thread behind. No sleeps: threads are
synchronised with events and joins. The tests that take the ``prefetch`` fixture run with the
prefetch thread off (0, batches drawn in ``next()``) and on (the default depth); those that take
``kernels``, with the optional C kernels and with the numpy path they are a shortcut for.
"""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from expreplay import ManagerSettings, ReplayMemory, RunnerSettings
from expreplay.acting import RunnerError
from expreplay.stream import DEFAULT_PREFETCH, Population, PredictorSlot, ReplayStream, Sampling
from kernel_paths import PATHS, kernel_path
from scripted_env import OldApiScriptedEnv, ScriptedEnv, check_batch, decode

HISTORY = 3
OUR_THREADS = ('SimulatorThread', 'InferenceThread', 'ReplayStream-prefetch')


@pytest.fixture(params=[0, DEFAULT_PREFETCH], ids=['prefetch-off', 'prefetch-on'])
def prefetch(request):
    return request.param


@pytest.fixture(params=PATHS)
def kernels(request):
    """The stream built with every optional C kernel (the test is skipped where one is not
    built), then with none, as on a machine without a compiler."""
    with kernel_path(request.param, '_acting_ext', '_write_ext', '_gather_ext', '_tree_ext'):
        yield request.param


class EnvFactory:
    """``get_player`` for a stream: numbered scripted envs, remembered for check_batch."""

    def __init__(self, cls=ScriptedEnv, **env_kwargs):
        self.cls, self.env_kwargs, self.envs = cls, env_kwargs, {}
        self._lock = threading.Lock()

    def __call__(self):
        with self._lock:
            env_id = len(self.envs)
            env = self.cls(env_id, **self.env_kwargs)
            self.envs[env_id] = env
        return env


def prefer(action, num_actions=3):
    """A numpy Q-function whose greedy action is always ``action``; counts the states it saw."""
    def q_values(states):
        q_values.rows += len(states)
        q = np.zeros((len(states), num_actions), np.float32)
        q[:, action] = 1.0
        return q
    q_values.rows = 0
    return q_values


# Which part of the stream each setting belongs to (make_stream's keywords -> the part's).
MEMORY_ARGS = {'memory_size': 'max_size', 'state_shape': 'state_shape',
               'history_len': 'history_len', 'state_dtype': 'dtype',
               'prioritized': 'prioritized', 'alpha': 'alpha', 'priority_eps': 'priority_eps'}
POPULATION_ARGS = {'num_parallel_players': 'num_players', 'exploration': 'exploration',
                   'maximum_staleness': 'maximum_staleness', 'seed': 'seed',
                   'episode_starts': 'episode_starts', 'episode_log_dir': 'episode_log_dir',
                   'on_episode_end': 'on_episode_end', 'runner': 'runner', 'manager': 'manager'}
SAMPLING_ARGS = {'batch_size': 'batch_size', 'update_frequency': 'update_frequency',
                 'samples_per_insert': 'samples_per_insert', 'n_step': 'n_step',
                 'gamma': 'gamma', 'beta': 'beta', 'weight_norm': 'weight_norm',
                 'layout': 'layout', 'seed': 'seed', 'batch_format': 'batch_format'}


def make_stream(factory, predictor=None, memory=None, **kwargs):
    """A stream of the test's settings; ``kwargs`` go to the part that owns each (a given
    ``memory`` replaces the memory's settings)."""
    args = dict(num_parallel_players=2, state_shape=(6,), batch_size=16, memory_size=600,
                init_memory_size=100, update_frequency=4, history_len=HISTORY, seed=0,
                progress=False)
    args.update(kwargs)

    used = set()

    def part(names):
        used.update(mine for mine in names if mine in args)
        return {theirs: args[mine] for mine, theirs in names.items() if mine in args}

    sampling = Sampling(**part(SAMPLING_ARGS))
    population = Population(factory, predictor=predictor, **part(POPULATION_ARGS))
    memory_args = part(MEMORY_ARGS)
    if memory is None:
        memory = ReplayMemory(**memory_args)
    return ReplayStream(memory, population, sampling,
                        **{k: v for k, v in args.items() if k not in used})


def our_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith(OUR_THREADS)]


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


@pytest.mark.parametrize('layout', ['NHWC', 'NCHW'])
@pytest.mark.parametrize('env_cls', [ScriptedEnv, OldApiScriptedEnv])
def test_batches_are_right_end_to_end(layout, env_cls, prefetch, kernels):
    factory = EnvFactory(env_cls, episode_lengths=(7, 2, 12), ends=('terminated', 'truncated'))
    with make_stream(factory, prefer(1), layout=layout, exploration=0.5,
                     prefetch=prefetch) as stream:
        assert len(stream.memory) == 0
        batches = take(iter(stream), 60)
        assert len(stream.memory) >= 100
    for batch in batches:
        shape = (16, 6, HISTORY) if layout == 'NHWC' else (16, HISTORY, 6)
        assert batch.state.shape == batch.next_state.shape == shape
        assert batch.state.dtype == np.uint8 and batch.reward.dtype == np.float32
        assert batch.is_over.dtype == bool and np.issubdtype(batch.action.dtype, np.integer)
        assert check_batch(batch, factory.envs, HISTORY, layout) == 16
    assert our_threads() == []


class DrawLog(ReplayMemory):
    """A memory that records, at every batch drawn, the steps written and the step requests
    the stream had made (read in the drawing thread, at the moment of the draw)."""

    stream = None

    def _record(self):
        stream = self.stream
        self.draws.append((self.num_steps_written,
                           stream.fill_steps + stream.stats().step_requests, len(self.draws) + 1))

    def sample_batch(self, *args, **kwargs):
        self._record()
        return super().sample_batch(*args, **kwargs)

    def draw(self, *args, **kwargs):     # sample() and the stream's SampleBatches
        self._record()
        return super().draw(*args, **kwargs)


def draw_logged_stream(factory, **kwargs):
    memory = DrawLog(kwargs.pop('memory_size', 600), (6,), HISTORY,
                     prioritized=kwargs.get('prioritized', False))
    memory.draws = []
    kwargs.pop('prioritized', None)     # the memory's, given above
    stream = make_stream(factory, memory=memory, **kwargs)
    memory.stream = stream
    return stream, memory


@pytest.mark.parametrize('players', [1, 3])
def test_sampled_to_inserted_ratio(players, prefetch):
    """When batch k is drawn, exactly fill_steps + (k-1)*update_frequency step requests were
    made, and all but at most maximum_staleness of them are in the memory; batch k is handed
    out at most ``prefetch`` batches after it was drawn."""
    factory = EnvFactory()
    stream, memory = draw_logged_stream(factory, num_parallel_players=players,
                                        update_frequency=4, maximum_staleness=5,
                                        init_memory_size=50, prefetch=prefetch)
    with stream:
        for k, _ in enumerate(stream, start=1):
            drawn = stream.stats().batches_drawn
            assert k <= drawn <= k + prefetch, (k, drawn)
            if k == 200:
                break
    fill = stream.fill_steps
    assert fill >= 50
    assert len(memory.draws) >= 200
    for steps, requests, k in memory.draws:
        assert requests == fill + (k - 1) * 4, (k, requests)
        assert requests - 5 <= steps <= requests, (k, steps, requests)
        if players == 1:   # one runner runs inline: every request is executed at once
            assert steps == requests
    stats = stream.stats()
    inserted = memory.num_steps_written - fill
    assert stats.samples_per_insert == pytest.approx(16 * stats.batches_drawn / inserted)


def test_exploration_and_predictor_updates_reach_the_runners(prefetch):
    factory = EnvFactory(episode_lengths=(1000,))
    first = prefer(2)
    with make_stream(factory, first, exploration=1.0, num_parallel_players=2,
                     maximum_staleness=8, prefetch=prefetch) as stream:
        batches = iter(stream)
        take(batches, 20)
        assert first.rows == 0                # exploration 1: not a single greedy action
        stream.exploration = 0.0
        take(batches, 20)
        assert first.rows > 0
        stream.reset_stats()   # requests made at exploration 1 are done by now
        second = prefer(1)
        stream.predictor = second
        rows_before = first.rows
        # Steps recorded so far; the requests accepted before the switch (at most
        # maximum_staleness) may still run with the old predictor after it.
        before = {key: set(env.transitions) for key, env in factory.envs.items()}
        take(batches, 30)
        assert second.rows > 0 and stream.predictor is second
        assert first.rows - rows_before <= 8
        stats = stream.stats()
        assert stats.greedy_fraction >= 0.9   # window edges: a step predicted before the reset
    # Which env took which request depends on thread scheduling, so count over all envs:
    # every step after the switch acted greedily with the second predictor (action 1),
    # except at most maximum_staleness requests accepted before it. The prefetch thread had
    # made the requests of up to `prefetch` batches before the switch.
    after = [rec[0] for key, env in factory.envs.items()
             for k, rec in env.transitions.items() if k not in before.get(key, ())]
    assert len(after) >= (30 - prefetch) * 4 - 8
    assert sum(a != 1 for a in after) <= 8, after


def test_close_from_another_thread_ends_the_iteration(prefetch):
    factory = EnvFactory()
    stream = make_stream(factory, prefer(0), exploration=0.5, num_parallel_players=3,
                         prefetch=prefetch)
    got_some = threading.Event()
    outcome = {}

    def consume():
        try:
            for n, _ in enumerate(stream):
                if n == 20:
                    got_some.set()
            outcome['ended'] = True
        except BaseException as err:   # reported to the test thread
            outcome['error'] = err

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert got_some.wait(30)
    stream.close()
    consumer.join(10)
    assert not consumer.is_alive()
    assert outcome == {'ended': True}
    assert our_threads() == []
    stream.close()   # idempotent
    with pytest.raises(RuntimeError, match='closed'):
        stream.start()


def test_checkpoint_resumes_without_refilling(tmp_path):
    factory = EnvFactory()
    with make_stream(factory, checkpoint_dir=tmp_path, init_memory_size=200) as stream:
        take(iter(stream), 10)
    saved = len(stream.memory)
    assert saved >= 200 and (tmp_path / 'replay_memory.npz').is_file()

    resumed = make_stream(EnvFactory(), checkpoint_dir=tmp_path, init_memory_size=200)
    assert resumed.resumed and len(resumed.memory) == saved
    with resumed:
        take(iter(resumed), 5)
        assert resumed.fill_steps == 0
        assert resumed.stats().fill_steps == 0
    with pytest.raises(ValueError, match='history_len'):
        make_stream(EnvFactory(), checkpoint_dir=tmp_path, history_len=HISTORY + 1)


@pytest.mark.parametrize('players', [1, 2])
def test_a_failing_env_surfaces_from_the_iteration(players, prefetch):
    factory = EnvFactory(fail_at_step=80)
    stream = make_stream(factory, num_parallel_players=players, init_memory_size=50,
                         prefetch=prefetch)
    with pytest.raises(RunnerError) as info:
        with stream:
            for _ in stream:
                pass
    assert 'scripted failure' in str(info.value.__cause__)
    assert our_threads() == []


def test_memory_argument_and_sample():
    memory = ReplayMemory(300, (6,), HISTORY)
    with make_stream(EnvFactory(), memory=memory, init_memory_size=40) as stream:
        stream.start()
        assert stream.memory is memory and len(memory) >= 40
        # The fill's last requests may still be storing when start() returns: let them finish
        # before counting, and again after the draw, so that only a request sample() made
        # could change the count.
        stream.population.wait_idle()
        written = memory.num_steps_written
        assert stream.sample().state.shape == (16, 6, HISTORY)
        stream.population.wait_idle()
        assert memory.num_steps_written == written   # sample() requests no steps


@pytest.mark.parametrize('sampling, default', [(dict(update_frequency=4), 8),
                                                (dict(update_frequency=None,
                                                      samples_per_insert=2.0), 16)])
def test_the_staleness_default_is_the_streams_alone(sampling, default):
    """Twice the transitions inserted per batch (tensorpack's reference), decided by the stream
    and given to the population when it starts; a population's own value wins, and a population
    started with neither has no default to fall back on."""
    with make_stream(EnvFactory(), init_memory_size=20, **sampling) as stream:
        assert stream.population.maximum_staleness is None
        assert stream.maximum_staleness == default          # before the start: what it will use
        stream.start()
        assert stream.population.manager.maximum_staleness == default == stream.maximum_staleness
    with make_stream(EnvFactory(), init_memory_size=20, maximum_staleness=3, **sampling) as stream:
        stream.start()
        assert stream.population.manager.maximum_staleness == 3 == stream.maximum_staleness

    alone = Population(EnvFactory(), 2)
    with pytest.raises(ValueError, match='no maximum_staleness'):
        alone.start(ReplayMemory(100, (6,), HISTORY))
    alone.start(ReplayMemory(100, (6,), HISTORY), default_staleness=5)
    assert alone.manager.maximum_staleness == 5
    alone.close()
    given = Population(EnvFactory(), 2, maximum_staleness=2)
    given.start(ReplayMemory(100, (6,), HISTORY), default_staleness=5)
    assert given.manager.maximum_staleness == 2
    given.close()


def test_predictor_slot_accepts_both_conventions():
    q = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert PredictorSlot(lambda s: q)(None)[0] is not None
    np.testing.assert_array_equal(PredictorSlot(lambda s: q)(None)[0], q)
    np.testing.assert_array_equal(PredictorSlot(lambda s: [q, 'other'])(None)[0], q)
    with pytest.raises(RuntimeError, match='no predictor'):
        PredictorSlot()(None)
    with pytest.raises(TypeError):
        PredictorSlot().set(42)


def test_bad_arguments_fail_at_construction():
    with pytest.raises(ValueError, match='init_memory_size'):
        make_stream(EnvFactory(), init_memory_size=1000, memory_size=500)
    with pytest.raises(ValueError, match='layout'):
        make_stream(EnvFactory(), layout='NCWH')
    with pytest.raises(TypeError, match='get_player'):
        Population('not callable', 1)


def test_stream_does_not_import_tensorflow():
    code = ("import sys, expreplay.stream, expreplay; expreplay.ReplayStream; "
            "assert 'tensorflow' not in sys.modules and 'tensorpack' not in sys.modules")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, '-c', code], check=True, cwd=root)


def test_first_frames_of_a_batch_are_real_observations():
    # A cheap sanity check of what the example and README promise: the newest state frame of
    # every sampled transition is a real observation, never padding.
    with make_stream(EnvFactory(), init_memory_size=60) as stream:
        batch = next(iter(stream))
    for state, next_state in zip(np.moveaxis(batch.state, -1, 1), np.moveaxis(batch.next_state, -1, 1)):
        assert decode(state[-1]) is not None and decode(next_state[-1]) is not None


def test_numpy_example_runs():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, os.path.join(root, 'examples', 'numpy_stream.py'),
                          '--steps', '100'], check=True, cwd=root, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=root))
    lines = [line for line in out.stdout.splitlines() if line.startswith('update')]
    assert lines[0].startswith('update     0') and lines[-1].startswith('update   100'), out.stdout


def test_vector_env_players_insert_update_frequency_per_batch(prefetch):
    from gymnasium.vector import AutoresetMode, SyncVectorEnv
    envs = {}

    def make(env_id):
        def build():
            envs[env_id] = ScriptedEnv(env_id, episode_lengths=(6, 9))
            return envs[env_id]
        return build

    made = []

    def get_player():
        base = 3 * len(made)
        made.append(SyncVectorEnv([make(base + j) for j in range(3)],
                                  autoreset_mode=AutoresetMode.NEXT_STEP))
        return made[-1]

    stream = make_stream(get_player, prefer(2), num_parallel_players=1, exploration=0.3,
                         init_memory_size=60, prefetch=prefetch)
    with stream:
        written_after_fill = stream.start() or stream.memory.num_steps_written
        for k, batch in enumerate(stream, start=1):
            check_batch(batch, envs, HISTORY)
            if k == 120:
                break
        if prefetch:
            # Read the counts while the prefetch thread is idle (its buffer full), not while
            # it is making the requests of its next batch.
            assert stream.prefetcher.wait_full(timeout=60)
        drawn = stream.stats().batches_drawn
        steps = stream.memory.num_steps_written - written_after_fill
        measured = stream.stats().samples_per_insert
    # update_frequency counts inserted transitions: 4 per batch, although a request steps 3
    # sub-envs and an autoreset row stores nothing. One runner runs inline: what the
    # requests made before the last draw inserted is in the memory, short of the target by
    # less than one request (3 steps).
    assert 4 * (drawn - 1) <= steps < 4 * (drawn - 1) + 3
    assert measured == pytest.approx(16 * drawn / steps)
    assert measured == pytest.approx(16 / 4, rel=0.05)


@pytest.mark.parametrize('manager,pipelined,threads', [
    (None, True, ['InferenceThread', 'SimulatorThread-0']),
    (ManagerSettings(simulator_threads=3), False,
     ['InferenceThread', 'SimulatorThread-0', 'SimulatorThread-1', 'SimulatorThread-2'])],
    ids=['default', 'thread-per-player'])
def test_several_single_env_players_default_to_one_pipelined_thread(manager, pipelined, threads):
    factory = EnvFactory()
    stream = make_stream(factory, prefer(1), num_parallel_players=3, exploration=0.5,
                         manager=manager, prefetch=0)
    with stream:
        for k, batch in enumerate(stream, start=1):
            check_batch(batch, factory.envs, HISTORY)
            if k == 20:
                break
        assert stream.population.manager.pipelined == pipelined
        assert sorted(our_threads()) == threads
        assert all(env.steps_taken > 0 for env in factory.envs.values())   # every player steps
    assert our_threads() == []


def test_vector_env_players_get_a_thread_each():
    from gymnasium.vector import SyncVectorEnv
    counter = iter(range(100))

    def get_player():
        return SyncVectorEnv([lambda: ScriptedEnv(next(counter)) for _ in range(2)])

    stream = make_stream(get_player, prefer(1), num_parallel_players=2, init_memory_size=40)
    with stream:
        take(iter(stream), 5)
        assert not stream.population.manager.pipelined
        # with the depth the stream got (the default rule: test_learner_path)
        drawing = ['ReplayStream-prefetch'] if stream.prefetch else []
        assert sorted(our_threads()) == sorted(['InferenceThread', 'SimulatorThread-0',
                                                'SimulatorThread-1'] + drawing)
    assert our_threads() == []


# ---------------------------------------------------------------------- arguments checked early
@pytest.mark.parametrize('kwargs,error,words', [
    (dict(prioritized='no'), TypeError, 'prioritized'),
    (dict(prioritized=2), TypeError, 'prioritized'),      # the memory's rule: 0 and 1 are bools
    (dict(runner=3), TypeError, r'runner must be a RunnerSettings.*got int'),
    (dict(runner={'life_loss_terminal': True}), TypeError, r'runner must be a RunnerSettings.*got dict'),
    (dict(manager=[('max_restarts', 1)]), TypeError, r'manager must be a ManagerSettings.*got list'),
    (dict(manager={'max_restarts': 1}), TypeError, r'manager must be a ManagerSettings.*got dict'),
    (dict(manager=RunnerSettings()), TypeError, r'manager must be a ManagerSettings.*got RunnerSettings'),
    (dict(memory='a memory'), TypeError, 'memory'),
    (dict(init_memory_size=601), ValueError, 'init_memory_size'),
    (dict(prefetch=-1), ValueError, 'prefetch'),
    (dict(prefetch=1.5), (TypeError, ValueError), 'prefetch'),
])
def test_bad_stream_arguments_fail_at_construction_naming_the_argument(kwargs, error, words):
    factory = EnvFactory()
    with pytest.raises(error, match=words):
        make_stream(factory, **kwargs)
    assert factory.envs == {}        # refused before any player was built


@pytest.mark.parametrize('memory,words', [
    (ReplayMemory(600, (7,), HISTORY), r'shape \(6,\).*state_shape=\(7,\).*state_shape=\(6,\)'),
    (ReplayMemory(600, (6, 2), HISTORY), r'state_shape=\(6, 2\)'),
    (ReplayMemory(600, (6,), HISTORY, 'int8'), r"uint8 in \[0, 255\].*dtype='int8'.*pass dtype='uint8'"),
    (ReplayMemory(600, (6,), HISTORY, bool), r"dtype='bool'"),
])
def test_a_memory_the_players_observations_do_not_fit_is_refused_at_construction(memory, words):
    """The first player's observation space is read when the stream is built (that player
    becomes the first runner's): frames the memory can not store are refused then, naming the
    memory's setting and the fix, not at the first step in a simulator thread."""
    factory = EnvFactory(OldApiScriptedEnv)      # records close()
    with pytest.raises(ValueError, match=words):
        make_stream(factory, memory=memory)
    assert len(factory.envs) == 1 and factory.envs[0].closed   # the checked player is closed


def test_the_checked_player_is_the_first_runners():
    factory = EnvFactory()
    with make_stream(factory, prefer(1), num_parallel_players=2, init_memory_size=40) as stream:
        assert len(factory.envs) == 1          # built by the check, at construction
        take(iter(stream), 3)
        assert len(factory.envs) == 2 and all(env.steps_taken for env in factory.envs.values())
        assert [r.player for r in stream.population.runners] == [factory.envs[0], factory.envs[1]]


def test_the_runner_and_manager_settings_reach_them():
    runner = RunnerSettings(life_loss_terminal=True)
    manager = ManagerSettings(max_restarts=2, max_inference_batch=8)
    stream = make_stream(EnvFactory(lives=3, life_every=4), prefer(1), runner=runner, manager=manager)
    with stream:
        take(iter(stream), 3)
        assert stream.population.manager.settings is manager
        assert stream.population.manager.max_restarts == 2
        assert all(r.settings is runner and r.life_loss_terminal for r in stream.population.runners)


# ---------------------------------------------------------------------- the ratio, per player
def _ratio_run(get_player, prefetch, batches=150, num_actions=3, **kwargs):
    stream = make_stream(get_player, prefer(1, num_actions), exploration=0.3, prefetch=prefetch,
                         **kwargs)
    with stream:
        stream.start()
        written = stream.memory.num_steps_written
        for k, _ in enumerate(stream, start=1):
            if k == batches:
                break
        stats = stream.stats()
        inserted = stream.memory.num_steps_written - written
    return stats, inserted


def _scripted_vector(num_envs):
    from gymnasium.vector import AutoresetMode, SyncVectorEnv
    counter = iter(range(200))

    def get_player():
        return SyncVectorEnv([lambda: ScriptedEnv(next(counter), episode_lengths=(3, 5))
                              for _ in range(num_envs)], autoreset_mode=AutoresetMode.NEXT_STEP)
    return get_player


def _envpool(batch_size):
    envpool = pytest.importorskip('envpool', reason='EnvPool needs Python >= 3.11 on Linux')

    def get_player():
        return envpool.make('Pong-v5', env_type='gymnasium', num_envs=4, batch_size=batch_size,
                            img_height=84, img_width=84, gray_scale=True, stack_num=1,
                            episodic_life=False, reward_clip=False, num_threads=1)
    return get_player


PLAYERS = {
    'single': (lambda: EnvFactory(episode_lengths=(3, 5)), dict(num_parallel_players=1)),
    'single-x3': (lambda: EnvFactory(episode_lengths=(3, 5)), dict(num_parallel_players=3)),
    'sync-vector': (lambda: _scripted_vector(3), dict(num_parallel_players=2)),
    'envpool-sync': (lambda: _envpool(4), dict(num_parallel_players=1, state_shape=(84, 84),
                                               num_actions=6, seed=None)),
    'envpool-async': (lambda: _envpool(2), dict(num_parallel_players=1, state_shape=(84, 84),
                                                num_actions=6, seed=None)),
}
# Pong's emulator makes these 3-8 s each; the scripted players check the same rule fast.
SLOW_PLAYERS = ('envpool-sync', 'envpool-async')


@pytest.mark.parametrize('player', [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PLAYERS
                                    else p for p in sorted(PLAYERS)])
@pytest.mark.parametrize('schedule', ['update_frequency', 'samples_per_insert'])
def test_measured_ratio_is_the_asked_one_for_every_player(player, schedule, prefetch):
    """16 sampled transitions per inserted one (batch 16, update_frequency 4), counted in the
    transitions the memory received, whatever a request to the player inserts; stats()
    reports the measured value."""
    make_player, kwargs = PLAYERS[player]
    if schedule == 'update_frequency':
        kwargs = dict(kwargs, update_frequency=4)
    else:
        kwargs = dict(kwargs, update_frequency=None, samples_per_insert=4.0)
    stats, inserted = _ratio_run(make_player(), prefetch, init_memory_size=60,
                                 maximum_staleness=4, **kwargs)
    sampled = 16 * stats.batches_drawn
    # Off by at most the requests pending at the two ends (4 of up to 4 inserts each).
    assert abs(sampled / 4 - inserted) <= 2 * 4 * 4 + 4, (sampled, inserted)
    assert stats.samples_per_insert == pytest.approx(sampled / inserted, rel=0.05)
    assert stats.samples_per_insert == pytest.approx(4.0, rel=0.1)


def test_resume_refuses_a_checkpoint_of_other_priority_settings(tmp_path):
    def memory(alpha):
        return ReplayMemory(600, (6,), HISTORY, prioritized=True, alpha=alpha)

    with make_stream(EnvFactory(), memory=memory(0.6), checkpoint_dir=tmp_path) as stream:
        take(iter(stream), 3)
    with pytest.raises(ValueError, match='alpha'):
        make_stream(EnvFactory(), memory=memory(0.5), checkpoint_dir=tmp_path)
    resumed = make_stream(EnvFactory(), memory=memory(0.6), checkpoint_dir=tmp_path)
    assert resumed.resumed and resumed.memory.priority_settings == {'alpha': 0.6,
                                                                     'priority_eps': 1e-6}
    resumed.close()
