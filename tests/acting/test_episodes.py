"""Episode control and records: seed schedules, curricula, ALE restart points, episode logs.

Scripted envs (tests/scripted_env.py) log the seed of every reset, so the seeds a scheduler chose
can be checked against what the env received. ALE tests use real emulators (ROMs ship with
ale-py) with RAM or raw grayscale observations, so they need no image resizing. No sleeps:
threads are synchronised by the manager, the crash test by the child's output pipe.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import zlib

import ale_py
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from expreplay import ManagerSettings, ReplayMemory, RunnerSettings
from expreplay.acting.episodes import (EPISODE_LOG_FILENAME, Curriculum, EpisodeLog, EpisodeRecord,
                                EpisodeStart, EpisodeTotals, FixedSeed, ProceduralSeeds,
                                RestartPool, SeedList, SeedsExhausted, read_episode_log)
from expreplay.acting import ActingGroup, EnvRunner, EnvRunnerManager
from expreplay.stream import Population, ReplayStream, Sampling
from scripted_env import ScriptedEnv

gym.register_envs(ale_py)

pytestmark = pytest.mark.timeout(60)

H = 3
OUR_THREADS = ('SimulatorThread', 'InferenceThread')


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    before = set(threading.enumerate())
    yield
    left = [t for t in set(threading.enumerate()) - before if t.name.startswith(OUR_THREADS)]
    for t in left:
        t.join(10)
    assert not [t.name for t in left if t.is_alive()]


class Records(list):
    """A thread-safe ``on_episode_end`` that keeps every record."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()

    def __call__(self, record):
        with self.lock:
            self.append(record)

    def by_key(self):
        return {(r.runner, r.env_index, r.episode): r for r in self}


class OptionsLog(gym.Wrapper):
    """Remembers the options of every reset (the scripted env ignores them)."""

    def __init__(self, env):
        super().__init__(env)
        self.options = []

    def reset(self, *, seed=None, options=None):
        self.options.append(options)
        return self.env.reset(seed=seed, options=options)


# ------------------------------------------------------------------------ seed schedules
def test_seed_schedules_unit():
    a, b = ProceduralSeeds(5), ProceduralSeeds(5)
    keys = [(r, e, k) for r in range(3) for e in range(2) for k in range(20)]
    seeds = [a.start(*key).seed for key in keys]
    assert seeds == [b.start(*key).seed for key in keys]          # same base: same seeds
    assert len(set(seeds)) == len(seeds)                          # a new seed per episode
    assert all(isinstance(s, int) and 0 <= s < 2 ** 31 for s in seeds)
    assert seeds != [ProceduralSeeds(6).start(*key).seed for key in keys]
    assert a.start(0, 0, 0) == EpisodeStart(seeds[0], None, 'reset', None)

    assert FixedSeed(9, options={'x': 1}).start(4, 0, 17) == EpisodeStart(9, {'x': 1})

    each = SeedList([10, 11, 12])
    assert [each.start(r, 0, k).seed for r in (0, 1) for k in range(5)] == [10, 11, 12, 10, 11] * 2
    once = SeedList([10, 11], cycle=False)
    assert once.start(0, 0, 1).seed == 11
    with pytest.raises(SeedsExhausted, match='2 seeds'):
        once.start(0, 0, 2)
    shared = SeedList([1, 2, 3], cycle=False, shared=True)
    assert sorted(shared.start(r, 0, 0).seed for r in range(3)) == [1, 2, 3]
    with pytest.raises(SeedsExhausted):
        shared.start(0, 0, 1)

    for bad in (lambda: ProceduralSeeds(-1), lambda: SeedList([]), lambda: FixedSeed(1.5),
                lambda: RestartPool(share=1.5), lambda: FixedSeed(1, options=[1])):
        with pytest.raises((ValueError, TypeError)):
            bad()


def run_scripted(base_seed, n_runners=3, requests=600, episode_lengths=(5, 3, 8)):
    """A threaded run with ProceduralSeeds and a fixed (seeded random) policy."""
    envs = [ScriptedEnv(i, episode_lengths=episode_lengths) for i in range(n_runners)]
    mem = ReplayMemory(500, (6,), H)
    records = Records()
    scheduler = ProceduralSeeds(base_seed)
    runners = [EnvRunner(envs[i], None, mem, H, seed=1, index=i, episode_starts=scheduler,
                         on_episode_end=records) for i in range(n_runners)]
    with EnvRunnerManager(runners, maximum_staleness=4) as mgr:
        for _ in range(requests):
            mgr.step(1.0)
    return envs, records


def test_procedural_seeds_reproduce_across_threaded_runs():
    envs_a, rec_a = run_scripted(21)
    envs_b, rec_b = run_scripted(21)
    a, b = rec_a.by_key(), rec_b.by_key()
    common = set(a) & set(b)
    # Thread timing decides how many steps each runner took (any idle thread takes the next
    # request), not what its episodes were: compare the episodes both runs played. The split
    # among runners varies from run to run, so only ask for a useful number in total.
    assert len(common) >= 30
    for key in common:
        assert (a[key].seed, a[key].score, a[key].length) == (b[key].seed, b[key].score, b[key].length)
        assert a[key].seed == ProceduralSeeds(21).seed_for(*key)
        assert a[key].start_kind == 'reset'
    for envs, records in ((envs_a, rec_a), (envs_b, rec_b)):
        for r in records:    # the env received exactly the recorded seed
            assert envs[r.runner].seeds[r.episode] == r.seed
    other = run_scripted(22, requests=60)[1].by_key()
    assert all(other[k].seed != a[k].seed for k in set(other) & common)


def test_default_records_keep_the_old_seeding():
    env = ScriptedEnv(0)
    records = Records()
    runner = EnvRunner(env, None, ReplayMemory(100, (6,), H), H, seed=7, index=2,
                       on_episode_end=records)
    group = ActingGroup([runner])
    for _ in range(40):
        group.step(1.0)
    assert env.seeds[0] == 9 and set(env.seeds[1:]) == {None}       # as without records
    assert [r.seed for r in records] == [9] + [None] * (len(records) - 1)
    assert [r.episode for r in records] == list(range(len(records)))
    assert [r.length for r in records] == [(5, 3, 8)[k % 3] for k in range(len(records))]
    assert [r.score for r in records] == runner.total_scores
    assert runner.start_counts() == {'reset': len(records) + 1}


@pytest.mark.slow
def test_ale_runs_with_the_same_base_seed_play_the_same_games():
    """Breakout with sticky actions: what happens depends on the seeds the runners reset with.

    (A seeded ALE reset reloads the ROM, ~0.3 s here: this test keeps to a few episodes.)
    """
    class FrameDigest(gym.Wrapper):
        def __init__(self, env):
            super().__init__(env)
            self.digests = []

        def reset(self, **kw):
            obs, info = self.env.reset(**kw)
            self.digests.append(zlib.crc32(obs.tobytes()))
            return obs, info

        def step(self, action):
            obs, *rest = self.env.step(action)
            self.digests[-1] = zlib.crc32(obs.tobytes(), self.digests[-1])
            return (obs, *rest)

    def run(base_seed, games=2):
        envs = [FrameDigest(gym.make('ALE/Breakout-v5', obs_type='ram', max_episode_steps=50,
                                     repeat_action_probability=0.25)) for _ in range(2)]
        records = Records()
        scheduler = ProceduralSeeds(base_seed)
        runners = [EnvRunner(env, None, ReplayMemory(1000, (128,), 4), 4, seed=3, index=i,
                             episode_starts=scheduler, on_episode_end=records)
                   for i, env in enumerate(envs)]
        # One pipelined thread gives the runners requests in turn: with a thread per runner,
        # which runner takes a request depends on scheduling (a seeded reset holds the GIL).
        with EnvRunnerManager(runners, maximum_staleness=2,
                              settings=ManagerSettings(simulator_threads=1)) as mgr:
            for _ in range(2 * games * 50 + 10):
                mgr.step(1.0)
        return {key: (r.seed, r.score, r.length, envs[r.runner].digests[r.episode])
                for key, r in records.by_key().items()}

    a, b, c = run(5), run(5), run(6, games=1)
    common = set(a) & set(b)
    assert len(common) >= 3
    assert all(a[k] == b[k] for k in common)
    # Another base seed: other seeds, and (sticky actions draw from them) other games.
    assert all(a[k][0] != c[k][0] for k in set(a) & set(c))
    assert any(a[k][3] != c[k][3] for k in set(a) & set(c))


# ------------------------------------------------------------------------------- curriculum
def test_curriculum_options_reach_reset_and_the_records():
    env = OptionsLog(ScriptedEnv(0, episode_lengths=(5, 3, 8)))
    stages = [(0, {'level': 0}), (10, {'level': 1}), (30, {'level': 2})]
    curriculum = Curriculum(stages, seeds=ProceduralSeeds(1))
    records = Records()
    runner = EnvRunner(env, None, ReplayMemory(200, (6,), H), H, seed=0,
                       episode_starts=curriculum, on_episode_end=records)
    group = ActingGroup([runner])
    for _ in range(60):
        group.step(1.0)
    assert len(records) >= 8
    done = 0
    for k, r in enumerate(records):
        # Episode k started once episodes 0..k-1 (the progress counted) had finished.
        want = {'level': 0 if done < 10 else 1 if done < 30 else 2}
        assert r.options == want == env.options[k], (k, done)
        assert r.seed == ProceduralSeeds(1).seed_for(0, 0, k) == env.unwrapped.seeds[k]
        done += r.length
    assert curriculum.progress == sum(r.length for r in records)

    # Progress set by hand, options from a function.
    manual = Curriculum(lambda p: {'difficulty': p}, count_env_steps=False)
    env2 = OptionsLog(ScriptedEnv(1, episode_lengths=(2,)))
    runner2 = EnvRunner(env2, None, ReplayMemory(100, (6,), H), H, episode_starts=manual)
    group2 = ActingGroup([runner2])
    group2.step(1.0)
    manual.progress = 0.5
    for _ in range(4):
        group2.step(1.0)
    assert env2.options == [{'difficulty': 0}, {'difficulty': 0.5}, {'difficulty': 0.5}]
    runner.close()
    runner2.close()


def test_old_api_env_refuses_reset_options():
    from scripted_env import OldApiScriptedEnv
    runner = EnvRunner(OldApiScriptedEnv(0), None, ReplayMemory(100, (6,), H), H,
                       episode_starts=FixedSeed(3, options={'a': 1}))
    group = ActingGroup([runner])
    with pytest.raises(Exception, match='takes no options'):
        group.step(1.0)
    ok = OldApiScriptedEnv(0)
    runner = EnvRunner(ok, None, ReplayMemory(100, (6,), H), H, episode_starts=FixedSeed(3))
    group = ActingGroup([runner])
    for _ in range(10):
        group.step(1.0)
    assert ok.seeds[:3] == [3, 3, 3]


# ---------------------------------------------------------------------------- vector envs
def test_vector_env_starts_disabled_mode_and_autoreset_records():
    def venv(mode, first):
        return SyncVectorEnv([lambda i=i: OptionsLog(ScriptedEnv(first + i)) for i in range(2)],
                             autoreset_mode=mode)

    sched = Curriculum(lambda p: {'p': p}, seeds=ProceduralSeeds(4), count_env_steps=False)
    records = Records()
    disabled = venv(AutoresetMode.DISABLED, 0)
    runner = EnvRunner(disabled, None, ReplayMemory(300, (6,), H), H, index=1,
                       episode_starts=sched, on_episode_end=records)
    group = ActingGroup([runner])
    for k in range(40):
        sched.progress = k // 10        # different options while sub-envs reset at other times
        group.step(1.0)
    for i, sub in enumerate(disabled.envs):
        seeds = sub.unwrapped.seeds
        assert seeds == [ProceduralSeeds(4).seed_for(1, i, e) for e in range(len(seeds))]
        assert len(seeds) >= 5
        mine = sorted((r for r in records if r.env_index == i), key=lambda r: r.episode)
        assert [r.options for r in mine] == sub.options[:len(mine)]
        assert [r.seed for r in mine] == seeds[:len(mine)]
    assert {r.start_kind for r in records} == {'reset'}
    runner.close()

    # NEXT_STEP: the env resets by itself; only the first reset is the scheduler's.
    records = Records()
    nxt = venv(AutoresetMode.NEXT_STEP, 2)
    runner = EnvRunner(nxt, None, ReplayMemory(300, (6,), H), H, index=0,
                       episode_starts=ProceduralSeeds(4), on_episode_end=records)
    group = ActingGroup([runner])
    for _ in range(30):
        group.step(1.0)
    for i, sub in enumerate(nxt.envs):
        mine = sorted((r for r in records if r.env_index == i), key=lambda r: r.episode)
        assert mine[0].seed == ProceduralSeeds(4).seed_for(0, i, 0) == sub.unwrapped.seeds[0]
        assert mine[0].start_kind == 'reset'
        assert [(r.start_kind, r.seed) for r in mine[1:]] == [('autoreset', None)] * (len(mine) - 1)
    assert runner.start_counts()['autoreset'] >= 4
    runner.close()


# ---------------------------------------------------------------------------- records
def test_life_losses_are_counted_and_a_record_is_a_whole_game():
    env = ScriptedEnv(0, episode_lengths=10 ** 6, lives=3, life_every=4)
    records = Records()
    runner = EnvRunner(env, None, ReplayMemory(200, (6,), H), H,
                       settings=RunnerSettings(life_loss_terminal=True), on_episode_end=records)
    group = ActingGroup([runner])
    for _ in range(40):
        group.step(1.0)
    assert len(records) == 3
    for r in records:
        assert (r.length, r.life_losses, r.terminated, r.truncated) == (12, 3, True, False)
        assert r.wall_time > 0 and r.steps_per_sec == pytest.approx(12 / r.wall_time)
    assert [r.score for r in records] == runner.total_scores


def test_episode_log_lines_parse_and_are_typed(tmp_path):
    path = tmp_path / 'sub' / EPISODE_LOG_FILENAME
    totals = EpisodeTotals()
    with EpisodeLog(path) as log:
        runner = EnvRunner(ScriptedEnv(0), None, ReplayMemory(100, (6,), H), H, seed=3,
                           episode_starts=FixedSeed(3, options={'mode': np.int64(2)}),
                           on_episode_end=lambda r: (log(r), totals(r)))
        group = ActingGroup([runner])
        for _ in range(30):
            group.step(1.0)
        runner.close()
    assert log.closed and log.write(EpisodeRecord(*([0] * 12))) is False   # dropped after close
    lines = path.read_text().splitlines()
    assert len(lines) == totals.snapshot().episodes == log.records_written >= 4
    types = dict(runner=int, env_index=int, episode=int, seed=int, start_kind=str, score=float,
                 length=int, terminated=bool, truncated=bool, life_losses=int, wall_time=float,
                 steps_per_sec=float, end_time=float, options=dict, restored_from=type(None),
                 frames=int)
    for k, line in enumerate(lines):
        data = json.loads(line)
        assert set(data) == set(types)
        for key, typ in types.items():
            assert isinstance(data[key], typ), (key, data[key])
        assert data['episode'] == k and data['seed'] == 3 and data['options'] == {'mode': 2}
    records = read_episode_log(path)
    assert [r.length for r in records] == [(5, 3, 8)[k % 3] for k in range(len(lines))]
    # One runner alone: each record's frames is the steps stored up to its episode's end.
    assert [r.frames for r in records] == list(np.cumsum([r.length for r in records]))
    assert records[1].truncated and records[0].terminated

    # A line cut by a crash is skipped; damage anywhere else is an error.
    with open(path, 'a') as f:
        f.write(lines[0][:25])
    assert len(read_episode_log(path)) == len(lines)
    path.write_text(lines[0] + '\n{"runner": 0,\n' + lines[1] + '\n')
    with pytest.raises(ValueError, match='line 2'):
        read_episode_log(path)


def test_episode_log_is_thread_safe(tmp_path):
    path = tmp_path / EPISODE_LOG_FILENAME
    log = EpisodeLog(path, fsync=False)
    start = threading.Barrier(4)

    def writer(w):
        start.wait()
        for k in range(200):
            log(EpisodeRecord(w, 0, k, None, 'reset', float(k), k, True, False, 0, 1.0, float(k),
                              options={'pad': 'x' * (k % 50)}))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    records = read_episode_log(path)
    assert sorted((r.runner, r.episode) for r in records) == [(w, k) for w in range(4) for k in range(200)]


CHILD = textwrap.dedent('''
    import sys
    sys.path.insert(0, {tests!r})
    from expreplay import ReplayMemory
    from expreplay.acting.episodes import EpisodeLog, ProceduralSeeds
    from expreplay.acting import ActingGroup, EnvRunner
    from scripted_env import ScriptedEnv

    log = EpisodeLog({path!r})
    def on_end(record):
        log(record)                               # on disk (flushed, fsync'd) when it returns
        print(record.episode, flush=True)         # ... and only then announced
    runner = EnvRunner(ScriptedEnv(0, episode_lengths=(7, 2, 4)), None,
                       ReplayMemory(1000, (6,), 4), 4, seed=0,
                       episode_starts=ProceduralSeeds(8), on_episode_end=on_end)
    group = ActingGroup([runner])
    while True:
        group.step(1.0)
''')


@pytest.mark.slow
def test_records_survive_a_killed_process(tmp_path):
    path = str(tmp_path / EPISODE_LOG_FILENAME)
    script = CHILD.format(tests=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), path=path)
    proc = subprocess.Popen([sys.executable, '-c', script], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        announced = -1
        for line in proc.stdout:                  # blocks until the child announces a record
            announced = int(line)
            if announced >= 49:
                break
        os.kill(proc.pid, signal.SIGKILL)         # mid-run, probably mid-episode or mid-write
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL and announced == 49
    records = read_episode_log(path)
    assert len(records) >= 50                     # everything announced survived
    for k, r in enumerate(records):
        assert r.episode == k and r.length == (7, 2, 4)[k % 3]
        assert r.seed == ProceduralSeeds(8).seed_for(0, 0, k)
        assert isinstance(r.score, float) and isinstance(r.terminated, bool)


# ------------------------------------------------------------------------- restart pool
class ScriptedActions:
    """A predictor replaying a fixed action sequence, one action per call (exploration 0).

    At the first state of an episode (history all zeros but the newest frame) it jumps to
    ``offset()``: the step of the trajectory that episode starts from.
    """

    def __init__(self, actions, num_actions, offset):
        self.actions, self.num_actions, self.offset = actions, num_actions, offset
        self.pos = 0

    def __call__(self, states):
        (state,) = states
        if not state[..., :-1].any():
            self.pos = self.offset()
        q = np.zeros((1, self.num_actions), np.float32)
        q[0, self.actions[self.pos]] = 1.0
        self.pos += 1
        return [q]


class SpyStarts:
    """Wraps a scheduler and remembers every EpisodeStart it returned."""

    def __init__(self, inner):
        self.inner, self.starts = inner, []
        self.needs_emulator_state = inner.needs_emulator_state
        self.observe_step = inner.observe_step
        self.episode_end = inner.episode_end

    def start(self, *args):
        s = self.inner.start(*args)
        self.starts.append(s)
        return s


class LaneLog:
    """A memory whose writers also log every call: the frames the runner stored, in order."""

    def __init__(self, *args):
        self.mem = ReplayMemory(*args)
        self.state_shape, self.dtype = self.mem.state_shape, self.mem.dtype
        self.history_len = self.mem.history_len
        self.episodes = []    # [{'frames': [...], 'actions': [...], 'rewards': [...], ...}]

    @property
    def num_steps_written(self):
        return self.mem.num_steps_written

    def new_batch_writer(self, k):
        log, inner = self, self.mem.new_batch_writer(k)
        current = [None] * k

        class Writer:
            def start_episodes(self, lanes, frames, **kw):
                for lane, frame in zip(np.asarray(lanes).tolist(), frames):
                    current[lane] = {'frames': [np.array(frame)], 'actions': [], 'rewards': [], 'ends': []}
                    log.episodes.append(current[lane])
                inner.start_episodes(lanes, frames, **kw)

            def add_steps(self, lanes, actions, rewards, next_frames, terminated, truncated, **kw):
                for j, lane in enumerate(np.asarray(lanes).tolist()):
                    ep = current[lane]
                    ep['frames'].append(np.array(next_frames[j]))
                    ep['actions'].append(int(actions[j]))
                    ep['rewards'].append(float(rewards[j]))
                    ep['ends'].append((bool(terminated[j]), bool(truncated[j])))
                inner.add_steps(lanes, actions, rewards, next_frames, terminated, truncated, **kw)

            def try_add_steps(self, *args, **kw):
                return False    # the general path, so that every step is logged

            def close(self):
                inner.close()
        return Writer()


@pytest.mark.parametrize('sticky, include_rng, same', [
    (0.0, False, True),     # deterministic emulator: the state alone replays the trajectory
    (0.25, True, True),     # sticky actions: the cloned RNG replays their draws too
    (0.25, False, False),   # sticky actions, RNG not cloned: the restart diverges (measured)
])
@pytest.mark.slow
def test_restart_on_pong_replays_the_original_trajectory(sticky, include_rng, same):
    steps, every = 120, 40

    def pong():
        return gym.make('ALE/Pong-v5', obs_type='grayscale', repeat_action_probability=sticky,
                        max_episode_steps=steps)

    def play(pool, games):
        """Run one runner over a fresh Pong until ``games`` games ended; its memory and records."""
        env = pong()
        spy = SpyStarts(pool)

        def offset():   # where in `actions` the current game starts
            point = spy.starts[-1].restore
            return 0 if point is None else point.origin['step']

        mem = LaneLog(3 * steps + 10, (210, 160), 4)
        records = Records()
        runner = EnvRunner(env, ScriptedActions(actions, env.action_space.n, offset), mem, 4,
                           seed=0, episode_starts=spy, on_episode_end=records)
        group = ActingGroup([runner])
        while len(records) < games:
            group.step(0.0)
        runner.close()
        return mem, records, runner

    actions = np.random.default_rng(0).integers(pong().action_space.n, size=2 * steps)
    # The original trajectory, harvested every 40 steps; the next game is a plain one again.
    harvest = RestartPool(share=0.0, harvest_every=every, base=FixedSeed(7),
                          include_rng=include_rng)
    mem, records, runner = play(harvest, 1)
    (first,) = records
    assert first.start_kind == 'reset' and first.length == steps and first.truncated
    orig = mem.episodes[0]
    # Steps 40 and 80 (step 120 ended the game); the next game is harvested from as it plays.
    points = [p for p in harvest.points() if p.origin['episode'] == 0]
    assert [p.origin for p in points] == [
        {'runner': 0, 'env_index': 0, 'episode': 0, 'step': k} for k in (every, 2 * every)]
    assert all(p.action == orig['actions'][p.origin['step'] - 1] for p in points)

    for point in points:
        # Restart in another env (runners share one pool) from this point, same actions.
        pool = RestartPool(share=1.0, harvest_every=10 ** 6, base=FixedSeed(7),
                           include_rng=include_rng)
        pool.add(point)
        mem, (second,), runner = play(pool, 1)
        k = point.origin['step']
        assert second.start_kind == 'restart' and second.seed == 7 and second.episode == 0
        assert second.restored_from == point.origin and pool.restarts >= 1
        assert runner.start_counts() == {'restart': 2}     # the next game restarted too
        rest = mem.episodes[0]
        # The restarted episode starts in the memory with the frame stored for the state.
        assert np.array_equal(rest['frames'][0], orig['frames'][k])
        n = steps - k                              # the original's remaining steps
        assert rest['actions'][:n] == orig['actions'][k:]
        equal = [np.array_equal(a, b) for a, b in zip(rest['frames'][1:n + 1], orig['frames'][k + 1:])]
        if same:
            assert all(equal), (k, equal.index(False))
            assert rest['rewards'][:n] == orig['rewards'][k:]
        else:
            assert not all(equal), k
        # Its own time limit counts from the restart point.
        assert second.length == steps and len(rest['actions']) == steps
    assert len(set(orig['actions'])) > 1           # not a trivial constant-action replay


@pytest.mark.slow
def test_restart_pool_on_a_threaded_breakout_run():
    """Several runners share one pool; restarts are recorded and scored from the restart point."""
    def player():
        return gym.make('ALE/Breakout-v5', obs_type='ram', max_episode_steps=60,
                        repeat_action_probability=0.0)

    # Unseeded resets: a seeded ALE reset reloads the ROM (~0.3 s).
    pool = RestartPool(share=0.5, capacity=4, harvest_every=15)
    records = Records()
    mem = ReplayMemory(2000, (128,), 4)
    runners = [EnvRunner(player(), None, mem, 4, seed=1, index=i, episode_starts=pool,
                         on_episode_end=records) for i in range(2)]
    with EnvRunnerManager(runners, maximum_staleness=2) as mgr:
        for _ in range(2 * 60 * 8):
            mgr.step(1.0)
    kinds = [r.start_kind for r in records]
    assert 'restart' in kinds and 'reset' in kinds
    assert len(pool) == 4 and pool.harvested > 4          # full, oldest dropped
    for r in records:
        assert (r.restored_from is not None) == (r.start_kind == 'restart')
        assert r.seed is None
        if r.restored_from:
            assert r.restored_from['step'] % 15 == 0 and r.length <= 60
    started = sum(sum(r.start_counts().values()) for r in runners)
    assert sum(r.start_counts().get('restart', 0) for r in runners) == pool.restarts
    assert started == len(records) + 2                    # one game in flight per runner
    assert mem.num_steps_written == sum(r.steps for r in runners)


def test_restart_pool_refuses_players_without_an_emulator():
    with pytest.raises(TypeError, match='restores emulator states'):
        EnvRunner(ScriptedEnv(0), None, ReplayMemory(100, (6,), H), H, episode_starts=RestartPool())
    venv = SyncVectorEnv([lambda: gym.make('ALE/Pong-v5', obs_type='ram')])
    with pytest.raises(TypeError, match='restores emulator states'):
        EnvRunner(venv, None, ReplayMemory(100, (128,), H), H, episode_starts=RestartPool())
    venv.close()


# ---------------------------------------------------------------------------- pass-through
def test_stream_writes_the_episode_log_and_counts_totals(tmp_path):
    envs = []

    def make_env():
        envs.append(ScriptedEnv(len(envs)))
        return envs[-1]

    seen = Records()
    with ReplayStream(ReplayMemory(500, (6,), H),
                      Population(make_env, 2, seed=0, episode_starts=ProceduralSeeds(12),
                                 episode_log_dir=str(tmp_path / 'logs'), on_episode_end=seen),
                      Sampling(8, 4, seed=0), init_memory_size=50, progress=False) as stream:
        batches = iter(stream)
        for _ in range(40):
            next(batches)
    stats = stream.stats()
    records = read_episode_log(tmp_path / 'logs' / EPISODE_LOG_FILENAME)
    assert len(records) == len(seen) == stats.episodes_total > 20
    assert stats.episodes_started_total == len(records) + 2 and stats.restart_starts == 0
    for r in records:
        want = ProceduralSeeds(12).seed_for(r.runner, 0, r.episode)
        assert r.seed == want == envs[r.runner].seeds[r.episode]


@pytest.mark.slow
def test_expreplay_logs_episodes_next_to_tensorpack_logs(tmp_path):
    # Imported here: it loads TensorFlow, which the other tests of this file do not need.
    from test_tensorpack_io import EnvFactory, TinyDQN, make_expreplay, simple_config, train

    expreplay = make_expreplay(EnvFactory(), population=dict(episode_starts=ProceduralSeeds(5)))
    stats, errors, threads = train(tmp_path, simple_config(expreplay, TinyDQN((6,)), max_epoch=2))
    assert errors == [] and threads == []
    records = read_episode_log(tmp_path / 'log' / EPISODE_LOG_FILENAME)
    assert [s['expreplay/restart_starts'] for s in stats] == [0, 0]
    totals = [s['expreplay/episodes_total'] for s in stats]
    assert 0 < totals[0] < totals[1] <= len(records) == expreplay.stream.episode_totals.episodes
    assert all(r.seed == ProceduralSeeds(5).seed_for(r.runner, 0, r.episode) for r in records)
    assert expreplay.stream.population.episode_log.closed

