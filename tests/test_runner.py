"""EnvRunner and EnvRunnerManager, end to end through the threads into a real ReplayMemory.

Most tests drive scripted envs (tests/scripted_env.py) whose frames encode (env, episode, step),
so every sampled transition is checked against what the env emitted. Synchronisation is by
Events and Conditions only; timeouts are hang guards.
"""

import threading
import time

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from expreplay import ReplayMemory
from expreplay.runner import (BatchedPredictor, EnvError, EnvRunner, EnvRunnerManager,
                              InferenceThread, ManagerClosed, PredictorError, RunnerError)
from scripted_env import (OldApiScriptedEnv, ScriptedEnv, ScriptedEnvError, check_batch, decode,
                          encode)

pytestmark = pytest.mark.timeout(60)

GUARD = 10.0   # seconds: only ever a hang guard
H = 3          # history_len of the scripted tests

# EnvRunnerManager's threading modes: simulator_threads=None (a thread per runner, the
# BatchedPredictor) and fewer threads than runners (pipelined, an InferenceThread).
PER_RUNNER = pytest.param(None, id='thread-per-runner')
PIPELINED_1 = pytest.param(1, id='pipelined-1-thread')
PIPELINED_2 = pytest.param(2, id='pipelined-2-threads')


# ----------------------------------------------------------------------------- helpers
class StepPredictor:
    """Q-values that make the greedy action ``step % num_actions`` of the newest frame.

    Also checks every state it is given: channels-last, oldest first, consecutive frames of
    one episode, zeros before its start (what the memory will give the learner). With
    ``life_every`` (scripted lives, life loss terminal) an episode starts at each lost life.
    """

    def __init__(self, num_actions=3, history_len=H, life_every=None):
        self.num_actions = num_actions
        self.history_len = history_len
        self.life_every = life_every
        self.batch_sizes = []
        self.lock = threading.Lock()

    def __call__(self, states):
        with self.lock:
            self.batch_sizes.append(len(states))
        q = np.zeros((len(states), self.num_actions), np.float32)
        for b, s in enumerate(states):
            frames = [decode(s[..., k]) for k in range(self.history_len)]
            env_id, ep, t = frames[-1]
            start = 0 if self.life_every is None else t // self.life_every * self.life_every
            for k, f in enumerate(frames):
                back = self.history_len - 1 - k
                assert f == ((env_id, ep, t - back) if t - back >= start else None), frames
            q[b, t % self.num_actions] = 1.0
        return [q]


def greedy_ok(envs):
    """With exploration 0 every action the envs saw is the greedy one."""
    for env in envs.values():
        for (ep, t), rec in env.transitions.items():
            assert rec[0] == t % 3, (env.env_id, ep, t, rec)


def assert_all_stored(envs, mem):
    """Every step any env took is in the memory (nothing buffered or lost)."""
    assert sum(len(e.transitions) for e in envs.values()) == mem.num_steps_written


def assert_scores(envs, runners_games):
    """Finished-game scores equal the env's summed rewards per episode."""
    want = []
    for env in envs.values():
        per_ep = {}
        ended = set()
        for (ep, t), (a, r, term, trunc, lives) in env.transitions.items():
            per_ep[ep] = per_ep.get(ep, 0.0) + r
            if term or trunc:
                ended.add(ep)
        want += [per_ep[ep] for ep in ended]
    assert sorted(want) == sorted(runners_games)


def sample_and_check(mem, envs, n_batches=10, batch=64, **kw):
    rng = np.random.default_rng(0)
    assert len(mem) >= 16, len(mem)
    batch = min(batch, len(mem))
    return sum(check_batch(mem.sample_batch(batch, rng=rng), envs, H, **kw) for _ in range(n_batches))


def live_threads():
    return [t for t in threading.enumerate()
            if t.name.startswith(('SimulatorThread', 'InferenceThread'))]


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    before = set(live_threads())
    yield
    left = [t for t in live_threads() if t not in before]
    for t in left:
        t.join(GUARD)
    assert not [t.name for t in left if t.is_alive()]


class RecordingWriter:
    def __init__(self, writer, calls):
        self.writer, self.calls = writer, calls

    def start_episode(self, obs):
        self.calls.append(('start', np.array(obs)))
        self.writer.start_episode(obs)

    def add_step(self, action, reward, next_obs, terminated=False, truncated=False):
        self.calls.append(('step', action, reward, np.array(next_obs), terminated, truncated))
        self.writer.add_step(action, reward, next_obs, terminated=terminated, truncated=truncated)

    def close(self):
        self.writer.close()


class RecordingMemory:
    """A ReplayMemory whose writers log every call, per lane."""

    def __init__(self, *args, **kw):
        self.mem = ReplayMemory(*args, **kw)
        self.state_shape, self.dtype, self.history_len = self.mem.state_shape, self.mem.dtype, self.mem.history_len
        self.lanes = []

    def new_writer(self):
        calls = []
        self.lanes.append(calls)
        return RecordingWriter(self.mem.new_writer(), calls)


# ----------------------------------------------------------------------------- end to end
@pytest.mark.parametrize('threads', [PER_RUNNER, PIPELINED_1, PIPELINED_2])
@pytest.mark.parametrize('env_cls', [ScriptedEnv, OldApiScriptedEnv])
def test_threads_end_to_end_every_sampled_transition(env_cls, threads):
    envs = {i: env_cls(i, episode_lengths=(5, 3, 8, 13), ends=('terminated', 'truncated', 'truncated'))
            for i in range(3)}
    mem = ReplayMemory(120, (6,), H, block_size=8)    # small: the run wraps around many times
    pred = StepPredictor()
    runners = [EnvRunner(envs[i], pred, mem, H, seed=3, index=i) for i in range(3)]
    checked = 0
    with EnvRunnerManager(runners, maximum_staleness=4, simulator_threads=threads) as mgr:
        for k in range(1500):
            mgr.step(0.0 if k % 2 else 1.0)
            if k % 300 == 299:   # sample while the threads write
                checked += sample_and_check(mem, envs, n_batches=3)
        mgr.wait_idle(GUARD)
        games = [s for r in runners for s in r.total_scores]
        stats = mgr.stats()
        mean, mx = mgr.reset_stats()
    checked += sample_and_check(mem, envs)
    assert checked >= 1000
    assert mem.num_steps_written > 10 * mem.max_size
    assert_all_stored(envs, mem)
    assert stats['games'] == len(games) > 100 and stats['queue_depth'] <= 4
    assert mean == pytest.approx(np.mean(games)) and mx == max(games)
    assert_scores(envs, games)
    assert mgr.reset_stats() == (None, None)
    assert sum(pred.batch_sizes) > 0     # the predictor checked every state it was given


def test_single_runner_runs_inline_without_threads():
    env = ScriptedEnv(0)
    mem = ReplayMemory(500, (6,), H)
    pred = StepPredictor()
    runner = EnvRunner(env, pred, mem, H, seed=1)
    before = threading.active_count()
    with EnvRunnerManager([runner], maximum_staleness=8) as mgr:
        assert threading.active_count() == before
        for _ in range(300):
            mgr.step(0.0)
            assert len(env.transitions) == runner.steps   # executed before step() returned
        stats = mgr.stats()
    greedy_ok({0: env})
    assert stats['inference_calls'] > 0 and stats['mean_inference_batch'] == 1.0
    sample_and_check(mem, {0: env})
    assert_all_stored({0: env}, mem)


@pytest.mark.parametrize('threads', [PER_RUNNER, PIPELINED_1])
@pytest.mark.parametrize('mode', [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP,
                                  AutoresetMode.DISABLED])
def test_vector_env_runners_end_to_end(mode, threads):
    envs = {}

    def make(i):
        def fn():
            envs[i] = ScriptedEnv(i, episode_lengths=(4, 7, 2), ends=('truncated', 'terminated'))
            return envs[i]
        return fn

    venvs = [SyncVectorEnv([make(3 * r + j) for j in range(3)], autoreset_mode=mode) for r in range(2)]
    mem = ReplayMemory(200, (6,), H, block_size=8)
    pred = StepPredictor()
    runners = [EnvRunner(v, pred, mem, H, seed=100, index=r) for r, v in enumerate(venvs)]
    assert runners[0].num_envs == 3
    with EnvRunnerManager(runners, maximum_staleness=2, simulator_threads=threads) as mgr:
        for _ in range(600):
            mgr.step(0.0)
    games = [s for r in runners for s in r.total_scores]   # after close: no game is in flight
    greedy_ok(envs)                 # also: the autoreset step's ignored action is never stored
    assert_all_stored(envs, mem)
    assert_scores(envs, games)
    sample_and_check(mem, envs)
    assert [envs[i].seeds[0] for i in range(6)] == [100, 101, 102, 103, 104, 105]
    assert max(pred.batch_sizes) >= 3   # one predictor row per sub-env, in one call


def test_atari_vector_env_next_step_autoreset_smoke():
    from ale_py.vector_env import AtariVectorEnv

    class Recorder(gym.vector.VectorWrapper):
        def __init__(self, env):
            super().__init__(env)
            self.log = []

        def reset(self, **kw):
            obs, info = self.env.reset(**kw)
            self.log.append(('reset', obs.copy()))
            return obs, info

        def step(self, actions):
            out = self.env.step(actions)
            self.log.append(('step', np.array(actions), *[np.copy(x) for x in out[:4]]))
            return out

    # 25 agent steps per episode: several truncations and NEXT_STEP autoresets in the run.
    venv = Recorder(AtariVectorEnv('pong', num_envs=2, stack_num=1, num_threads=2,
                                   max_num_frames_per_episode=100))
    mem = RecordingMemory(1000, (84, 84), 4)
    seen = []

    def predictor(states):
        seen.append((states.shape, states.dtype))
        return [np.random.default_rng(len(seen)).random((len(states), 6))]

    runner = EnvRunner(venv, predictor, mem, 4, seed=0)
    with EnvRunnerManager([runner], maximum_staleness=1) as mgr:
        for _ in range(70):
            mgr.step(0.5)
    assert len(runner.total_scores) >= 4
    assert seen and all(shape[1:] == (84, 84, 4) and dtype == np.uint8 for shape, dtype in seen)
    assert max(shape[0] for shape, _ in seen) == 2     # both sub-envs in one predictor call
    # Rebuild what each lane must have received from the env's own outputs.
    for i, lane in enumerate(mem.lanes):
        want, ended = [], False
        for entry in venv.log:
            if entry[0] == 'reset':
                want.append(('start', entry[1][i, 0]))
                continue
            _, actions, obs, rew, term, trunc = entry
            if ended:           # autoreset step: action ignored, obs is the reset obs
                want.append(('start', obs[i, 0]))
                ended = False
            else:
                want.append(('step', int(actions[i]), float(rew[i]), obs[i, 0], bool(term[i]), bool(trunc[i])))
                ended = bool(term[i] or trunc[i])
        assert len(lane) == len(want)
        for got, exp in zip(lane, want):
            assert got[0] == exp[0]
            if got[0] == 'start':
                assert np.array_equal(got[1], exp[1])
            else:
                assert got[1:3] == exp[1:3] and got[4:] == exp[4:] and np.array_equal(got[3], exp[3])
        assert sum(1 for c in lane if c[0] == 'step' and c[5]) >= 2   # truncations seen
    comb, action, reward, over = mem.mem.sample_batch(32)
    assert comb.shape == (32, 84, 84, 5) and not over.any()


def test_life_loss_is_terminal_for_training_only_on_breakout():
    class Watch(gym.Wrapper):
        def __init__(self, env):
            super().__init__(env)
            self.resets, self.game_rewards, self.lives_log = 0, [], []

        def reset(self, **kw):
            self.resets += 1
            self.game_rewards.append(0.0)
            obs, info = self.env.reset(**kw)
            self.lives_log.append([info['lives']])
            return obs, info

        def step(self, a):
            obs, r, term, trunc, info = self.env.step(a)
            self.game_rewards[-1] += r
            self.lives_log[-1].append(info['lives'])
            return obs, r, term, trunc, info

    env = Watch(gym.wrappers.ResizeObservation(
        gym.make('ALE/Breakout-v5', obs_type='grayscale', repeat_action_probability=0.0), (84, 84)))
    mem = RecordingMemory(3000, (84, 84), 4)
    runner = EnvRunner(env, None, mem, 4, seed=0, life_loss_terminal=True)
    for _ in range(5000):
        runner.step(1.0)
        if len(runner.total_scores) == 2:
            break
    assert len(runner.total_scores) == 2
    # Scores are per game (all lives), and the env was reset only at game over.
    assert runner.total_scores == env.game_rewards[:2]
    assert env.resets == 3
    (lane,) = mem.lanes
    steps = [c for c in lane if c[0] == 'step']
    lives = [lv for game in env.lives_log[:2] for lv in game[1:]] + env.lives_log[2][1:]
    prev = [lv for game in env.lives_log[:2] for lv in game[:-1]] + env.lives_log[2][:-1]
    assert len(steps) == len(lives)
    lost = [b > a for a, b in zip(lives, prev)]
    assert sum(lost) >= 8                                   # 5 lives per game
    assert [c[4] for c in steps] == lost                    # terminated exactly at each life lost
    assert not any(c[5] for c in steps)
    # After a lost life that is not game over, the next training episode starts from the same
    # frame without an env reset.
    starts = [k for k, c in enumerate(lane) if c[0] == 'start']
    assert len(starts) == 1 + sum(lost)
    for k, c in enumerate(lane[:-1]):
        if c[0] == 'step' and c[4]:
            assert lane[k + 1][0] == 'start'
    life_starts = [k for k in starts if k > 0 and lane[k - 1][0] == 'step' and lane[k - 1][4]]
    same_frame = sum(np.array_equal(lane[k][1], lane[k - 1][3]) for k in life_starts)
    assert same_frame == len(life_starts) - 2              # all but the two game overs (real resets)
    runner.close()


def test_life_loss_with_scripted_lives_samples_right():
    envs = {i: ScriptedEnv(i, episode_lengths=10 ** 6, lives=3, life_every=4) for i in range(2)}
    mem = ReplayMemory(400, (6,), H)
    pred = StepPredictor(life_every=4)
    runners = [EnvRunner(envs[i], pred, mem, H, index=i, life_loss_terminal=True) for i in range(2)]
    with EnvRunnerManager(runners, 2) as mgr:
        for _ in range(300):
            mgr.step(0.5)
    games = [s for r in runners for s in r.total_scores]   # after close: no game is in flight
    sample_and_check(mem, envs, life_loss_terminal=True)
    assert_scores(envs, games)
    assert games
    for e in envs.values():   # a game is 3 lives of 4 steps; only the current one is shorter
        for ep in range(e.episode):
            assert len([1 for (g, t) in e.transitions if g == ep]) == 12


# ----------------------------------------------------------------------------- seeding, API
def test_seeding_is_reproducible():
    def run(seed):
        env = ScriptedEnv(0)
        runner = EnvRunner(env, StepPredictor(), ReplayMemory(100, (6,), H), H, seed=seed, index=2)
        for _ in range(200):
            runner.step(0.5)
        return env

    a, b, c = run(7), run(7), run(8)
    assert a.transitions == b.transitions != c.transitions
    assert a.seeds[0] == 9 and set(a.seeds[1:]) == {None}


def test_bad_players_and_arguments_are_refused():
    mem = ReplayMemory(100, (6,), H)
    with pytest.raises(TypeError, match='player'):
        EnvRunner(object(), None, mem, H)
    with pytest.raises(ValueError, match='history_len'):
        EnvRunner(ScriptedEnv(0), None, mem, H + 1)

    class NoSpace:
        def reset(self):
            return encode(0, 0, 0)

        def step(self, a):
            return encode(0, 0, 1), 0.0, False, {}

    with pytest.raises(TypeError, match='num_actions'):
        EnvRunner(NoSpace(), None, mem, H)
    r = EnvRunner(NoSpace(), None, mem, H, num_actions=2)
    r.step(1.0)
    with pytest.raises(ValueError, match='player observation'):
        EnvRunner(ScriptedEnv(0, obs_shape=(7,)), None, mem, H).step(1.0)
    with pytest.raises(ValueError, match='exploration'):
        r.step(1.5)
    with pytest.raises(ValueError, match='maximum_staleness'):
        EnvRunnerManager([r], 0)


# ----------------------------------------------------------------------------- staleness
class GateRunner:
    """A runner whose step ``k`` (the exploration value carries k) blocks until released."""

    predictor = None

    def __init__(self, gates, started, finished):
        self.gates, self.started, self.finished = gates, started, finished

    def begin_step(self, exploration):
        self.k = int(round(exploration * 1000))
        self.started[self.k].set()
        return np.zeros((0, 1))

    def finish_step(self, q):
        assert self.gates[self.k].wait(GUARD)
        self.finished[self.k].set()

    def abort_step(self):
        pass

    def close(self):
        pass


def _gated_manager(n_runners, staleness, n_requests, threads=None):
    ev = lambda: [threading.Event() for _ in range(n_requests)]  # noqa: E731
    gates, started, finished = ev(), ev(), ev()
    runners = [GateRunner(gates, started, finished) for _ in range(n_runners)]
    return EnvRunnerManager(runners, staleness, simulator_threads=threads), gates, started, finished


def test_staleness_window_blocks_on_the_oldest_unfinished_request():
    mgr, gates, started, finished = _gated_manager(3, 2, 10)
    with mgr:
        mgr.step(0.000)
        mgr.step(0.001)
        with pytest.raises(TimeoutError):
            mgr.step(0.002, timeout=0)           # 2 pending = maximum_staleness
        gates[1].set()                           # the newer one finishes ...
        assert finished[1].wait(GUARD)
        with pytest.raises(TimeoutError):
            mgr.step(0.002, timeout=0)           # ... but request 0 still blocks request 2
        assert not finished[0].is_set()
        gates[0].set()
        mgr.step(0.002, timeout=GUARD)           # accepted once request 0 finished
        assert finished[0].is_set()
        gates[2].set()


@pytest.mark.parametrize('threads', [PER_RUNNER, PIPELINED_1])
@pytest.mark.parametrize('staleness,n_runners', [(1, 3), (3, 2), (3, 5), (5, 8)])
def test_staleness_guarantee_under_random_completion_order(staleness, n_runners, threads):
    """A request is executed before more than maximum_staleness later ones are accepted.

    Pipelined on one thread, requests finish in the order they were taken, so the test
    releases the oldest running one instead of a random one.
    """
    n = 60
    mgr, gates, started, finished = _gated_manager(n_runners, staleness, n, threads)
    rng = np.random.default_rng(staleness * 10 + n_runners)
    released = set()
    with mgr:
        for k in range(n):
            while True:
                try:
                    mgr.step(k / 1000, timeout=0)
                    break
                except TimeoutError:
                    # Refused: allowed only while request k - staleness is unfinished.
                    assert k >= staleness and not finished[k - staleness].is_set(), k
                # Finish a random running request (any order), then try again.
                running = [j for j in range(k) if j not in released and started[j].is_set()]
                if not running:
                    oldest = min(j for j in range(k) if j not in released)
                    assert started[oldest].wait(GUARD)
                    running = [oldest]
                j = int(rng.choice(running)) if threads is None else min(running)
                released.add(j)
                gates[j].set()
                assert finished[j].wait(GUARD)
                _wait_booked(mgr, j)
            # Accepted k: every request up to k - staleness has finished.
            assert all(finished[j].is_set() for j in range(k - staleness + 1)), k
        for g in gates:
            g.set()


def _wait_booked(mgr, j):
    # The runner signals `finished` just before the manager books the request as done.
    with mgr._lock:
        assert mgr._space.wait_for(lambda: all(r.done for r in mgr._unfinished if r.seq == j), GUARD)


# ----------------------------------------------------------------------------- batching
def test_batched_predictor_merges_concurrent_callers():
    calls = []

    def predictor(states):
        calls.append(len(states))
        return [np.repeat(states.reshape(len(states), -1)[:, :1], 2, axis=1).astype(np.float32)]

    bp = BatchedPredictor(predictor, max_batch=32, max_wait=GUARD)
    tickets = [bp.ticket() for _ in range(4)]   # four callers announced: nobody runs alone
    results = {}

    def call(i):
        results[i] = tickets[i].predict(np.full((1, 2), i, np.float32))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GUARD)
    assert calls == [4]
    assert {i: results[i].tolist() for i in results} == {i: [[i, i]] for i in range(4)}
    # A cancelled ticket does not hold up the others.
    t1, t2 = bp.ticket(), bp.ticket()
    t2.cancel()
    assert t1.predict(np.zeros((2, 2), np.float32)).shape == (2, 2)
    assert calls == [4, 2]
    bp.close()
    with pytest.raises(ManagerClosed):
        bp.ticket()


def test_batched_predictor_respects_max_batch():
    calls = []
    bp = BatchedPredictor(lambda s: (calls.append(len(s)), [np.zeros((len(s), 2))])[1],
                          max_batch=3, max_wait=GUARD)
    tickets = [bp.ticket() for _ in range(3)]
    threads = [threading.Thread(target=tickets[i].predict, args=(np.zeros((2, 1)),)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GUARD)
    assert sorted(calls) == [2, 2, 2]      # requests are never split, nor merged past max_batch
    bp.close()


def test_batched_predictor_runs_a_lone_call_in_the_callers_thread():
    where = []
    bp = BatchedPredictor(lambda s: (where.append(threading.current_thread()), [np.zeros((len(s), 2))])[1],
                          max_wait=GUARD)
    with bp.ticket() as t:
        assert t.predict(np.zeros((1, 1))).shape == (1, 2)
    assert where == [threading.current_thread()]   # no hand-over to another thread


def test_manager_batches_states_of_several_runners():
    envs = {i: ScriptedEnv(i) for i in range(4)}
    entered, go = threading.Event(), threading.Event()
    inner = StepPredictor()

    inner_first = []

    def predictor(states):
        if not entered.is_set():
            inner_first.append(len(states))
            entered.set()
            assert go.wait(GUARD)
        return inner(states)

    mem = ReplayMemory(500, (6,), H)
    runners = [EnvRunner(envs[i], predictor, mem, H, index=i) for i in range(4)]
    with EnvRunnerManager(runners, maximum_staleness=8, max_inference_wait=GUARD) as mgr:
        for _ in range(4):
            mgr.step(0.0)
        assert entered.wait(GUARD)
        first = inner_first[0]
        (batcher,) = mgr._batchers.values()
        if first < 4:   # the runners not in the first batch all wait for the next one
            assert batcher.wait_for_queued(4 - first, GUARD)
        go.set()
        for _ in range(400):
            mgr.step(0.0)
        stats = mgr.stats()
    # Either all four states came in the first call, or the rest came together in the second
    # (perhaps with the next state of the first runner).
    assert first == 4 or inner.batch_sizes[1] >= 4 - first
    assert max(inner.batch_sizes[:2]) >= 2
    assert stats['mean_inference_batch'] > 1.0
    greedy_ok(envs)
    sample_and_check(mem, envs)



def _blocking_predictor(calls, release, entered):
    """Records each call's row values; the first call waits for ``release``."""
    def predictor(states):
        calls.append(states[:, 0].tolist())
        if len(calls) == 1:
            entered.set()
            assert release.wait(GUARD)
        return [np.repeat(states[:, :1], 2, axis=1).astype(np.float32)]
    return predictor


def test_inference_thread_runs_each_submission_in_its_own_calls_of_max_batch_rows():
    calls, release, entered = [], threading.Event(), threading.Event()
    it = InferenceThread(_blocking_predictor(calls, release, entered), max_batch=3)
    (first,) = it.submit([np.array([[0.0]])])
    assert entered.wait(GUARD)                    # the thread is inside the first call
    rows = [np.array([[1.0], [2.0]]), np.array([[3.0], [4.0]]), np.array([[5.0]]), np.array([[6.0]])]
    queued = it.submit(rows[:1]) + it.submit(rows[1:3]) + it.submit(rows[3:])
    release.set()
    for req in [first] + queued:
        req.wait()
        assert req.error is None
    # Queued during the first call: not merged with each other, arrays never split, a
    # submission's arrays together up to max_batch rows.
    assert calls == [[0.0], [1.0, 2.0], [3.0, 4.0, 5.0], [6.0]]
    assert [r.result[:, 0].tolist() for r in queued] == [[1.0, 2.0], [3.0, 4.0], [5.0], [6.0]]
    assert (it.calls, it.rows, it.max_rows_seen) == (4, 7, 3)
    big = it.submit([np.array([[7.0], [8.0]]), np.array([[9.0], [10.0]])])
    for req in big:
        req.wait()
    assert calls[-2:] == [[7.0, 8.0], [9.0, 10.0]]   # 4 rows > max_batch: two calls
    it.close()
    it.thread.join(GUARD)
    assert not it.thread.is_alive()
    with pytest.raises(ManagerClosed):
        it.submit([np.zeros((1, 1))])


def test_inference_thread_delivers_errors_and_close_releases_waiters():
    def bad(states):
        raise ValueError('bad weights')

    it = InferenceThread(bad)
    reqs = it.submit([np.zeros((1, 1)), np.zeros((2, 1))])
    for r in reqs:
        r.wait()
        assert isinstance(r.error, ValueError)    # every request of the failed call gets it
    it.close()
    it.thread.join(GUARD)

    calls, release, entered = [], threading.Event(), threading.Event()
    it = InferenceThread(_blocking_predictor(calls, release, entered))
    running = it.submit([np.zeros((1, 1))])
    assert entered.wait(GUARD)
    waiting = it.submit([np.ones((1, 1))])
    it.close()                                    # does not wait for the predictor
    for r in running + waiting:
        r.wait()
        assert isinstance(r.error, ManagerClosed)
    release.set()                                 # the call returns: the thread stops
    it.thread.join(GUARD)
    assert not it.thread.is_alive() and calls == [[0.0]]


class RecordingRunner:
    """Wraps an EnvRunner and tells ``on_begin`` / ``on_finish`` about its two step halves."""

    def __init__(self, runner, on_begin, on_finish):
        self._runner, self._on_begin, self._on_finish = runner, on_begin, on_finish

    def begin_step(self, exploration):
        self._on_begin(self._runner.index)
        return self._runner.begin_step(exploration)

    def finish_step(self, q_values):
        self._on_finish(self._runner.index)
        self._runner.finish_step(q_values)

    def __getattr__(self, name):
        return getattr(self._runner, name)


def test_pipelined_thread_steps_one_group_while_the_other_is_predicted():
    """One simulator thread, four runners: each predictor call holds one group's states, and
    while a group's envs step, another group is already begun and submitted (its forward pass
    can run meanwhile). A thread that predicted for all its runners, then stepped them all,
    would never have another group in flight while stepping."""
    lock = threading.Lock()
    in_flight, call_of, calls, overlapped = set(), {}, [], []

    def on_begin(i):
        with lock:
            in_flight.add(i)

    def on_finish(i):
        with lock:
            in_flight.discard(i)
            overlapped.append(bool(in_flight - call_of[i]))

    inner = StepPredictor()

    def predictor(states):
        ids = frozenset(decode(s[..., -1])[0] for s in states)
        with lock:
            calls.append(ids)
            call_of.update((i, ids) for i in ids)
        return inner(states)

    envs = {i: ScriptedEnv(i) for i in range(4)}
    mem = ReplayMemory(500, (6,), H)
    runners = [RecordingRunner(EnvRunner(envs[i], predictor, mem, H, index=i), on_begin, on_finish)
               for i in range(4)]
    with EnvRunnerManager(runners, 8, simulator_threads=1) as mgr:
        assert mgr.pipelined
        for _ in range(400):
            mgr.step(0.0)
        mgr.wait_idle(GUARD)
    assert max(len(c) for c in calls) == 2                   # one group (half the runners) per call
    assert len(overlapped) == 400 and sum(overlapped) > 300, sum(overlapped)
    greedy_ok(envs)
    assert_all_stored(envs, mem)
    sample_and_check(mem, envs)


@pytest.mark.parametrize('staleness', [1, 3])
def test_pipelined_runners_take_turns_when_requests_are_fewer_than_runners(staleness):
    envs = {i: ScriptedEnv(i) for i in range(4)}
    mem = ReplayMemory(500, (6,), H)
    runners = [EnvRunner(envs[i], StepPredictor(), mem, H, index=i) for i in range(4)]
    with EnvRunnerManager(runners, staleness, simulator_threads=1) as mgr:
        for _ in range(120):
            mgr.step(0.0)
        mgr.wait_idle(GUARD)
    steps = [r.steps for r in runners]
    assert sum(steps) == 120 and max(steps) - min(steps) <= staleness, steps
    greedy_ok(envs)
    assert_all_stored(envs, mem)


def test_simulator_threads_must_be_between_one_and_the_number_of_runners():
    mem = ReplayMemory(100, (6,), H)
    runners = [EnvRunner(ScriptedEnv(i), None, mem, H, index=i) for i in range(3)]
    for bad in (0, 4, 1.5, True):
        with pytest.raises(ValueError, match='simulator_threads'):
            EnvRunnerManager(runners, 2, simulator_threads=bad)
    with EnvRunnerManager(runners, 2, simulator_threads=3) as mgr:   # = one per runner
        assert not mgr.pipelined and len(mgr._threads) == 3

# ----------------------------------------------------------------------------- faults
def _step_until_raises(mgr, n=10_000):
    for _ in range(n):
        mgr.step(0.5)
    raise AssertionError("no fault surfaced")


@pytest.mark.parametrize('threads,where', [(None, 'SimulatorThread-1'),
                                           (1, r'SimulatorThread-0 \(runner 1\)'),
                                           (2, r'SimulatorThread-1 \(runner 1\)')],
                         ids=['thread-per-runner', 'pipelined-1-thread', 'pipelined-2-threads'])
def test_env_failure_surfaces_from_step_within_a_second(threads, where):
    failed_at = []

    def hook(env, action):
        if env.steps_taken + 1 == env.fail_at_step:
            failed_at.append(time.monotonic())

    envs = {i: ScriptedEnv(i, fail_at_step=(40 if i == 1 else None), step_hook=hook) for i in range(3)}
    mem = ReplayMemory(500, (6,), H)
    pred = StepPredictor()   # shared, as in training
    mgr = EnvRunnerManager([EnvRunner(envs[i], pred, mem, H, index=i) for i in range(3)], 3,
                           simulator_threads=threads)
    with pytest.raises(EnvError, match=where) as info:
        _step_until_raises(mgr)
    assert time.monotonic() - failed_at[0] < 1.0
    assert isinstance(info.value.__cause__, ScriptedEnvError)
    with pytest.raises(EnvError):          # a failed manager keeps refusing
        mgr.step(0.5)
    mgr.close()                            # already reported: close does not raise it again
    mgr.close()
    assert_all_stored(envs, mem)           # everything stepped before the failure is stored
    sample_and_check(mem, envs, n_batches=2)


@pytest.mark.parametrize('threads', [PER_RUNNER, PIPELINED_1])
def test_unreported_failure_is_raised_by_close(threads):
    failed = threading.Event()

    def hook(env, action):
        if env.steps_taken + 1 == env.fail_at_step:
            failed.set()

    envs = [ScriptedEnv(i, fail_at_step=5, step_hook=hook) for i in range(2)]
    mem = ReplayMemory(100, (6,), H)
    mgr = EnvRunnerManager([EnvRunner(e, None, mem, H, index=i) for i, e in enumerate(envs)], 20,
                           simulator_threads=threads)
    for _ in range(12):
        mgr.step(1.0)
    assert failed.wait(GUARD)
    with pytest.raises(EnvError) as info:
        mgr.close()
    assert isinstance(info.value.__cause__, ScriptedEnvError)
    mgr.close()


@pytest.mark.parametrize('n_runners,threads', [(1, None), (3, None), (3, 1), (3, 2)],
                         ids=['inline', 'thread-per-runner', 'pipelined-1-thread', 'pipelined-2-threads'])
def test_predictor_failure_surfaces_from_step(n_runners, threads):
    calls = []

    def predictor(states):
        calls.append(time.monotonic())
        if len(calls) == 10:
            raise ValueError('bad weights')
        return [np.zeros((len(states), 3))]

    mem = ReplayMemory(500, (6,), H)
    runners = [EnvRunner(ScriptedEnv(i), predictor, mem, H, index=i) for i in range(n_runners)]
    with pytest.raises(PredictorError) as info:
        with EnvRunnerManager(runners, 2, simulator_threads=threads) as mgr:
            _step_until_raises(mgr)
    assert time.monotonic() - calls[9] < 1.0
    assert isinstance(info.value.__cause__, ValueError) and 'bad weights' in str(info.value)


@pytest.mark.parametrize('threads', [PER_RUNNER, PIPELINED_1])
def test_failed_env_is_restarted_and_counted(threads):
    envs = {}

    def factory(env_id, fail):
        def make():
            envs[env_id] = ScriptedEnv(env_id, fail_at_step=fail)
            return envs[env_id]
        return make

    mem = ReplayMemory(500, (6,), H)
    pred = StepPredictor()   # shared, as in training
    runners = [EnvRunner(factory(i, 100 if i == 0 else None)(), pred, mem, H, index=i,
                         player_factory=factory(10 + i, 60))   # replacements fail after 60 steps
               for i in range(2)]
    mgr = EnvRunnerManager(runners, 2, max_restarts=1, simulator_threads=threads)
    with pytest.raises(EnvError):     # runner 0: restarted once, then its replacement fails
        _step_until_raises(mgr)
    stats = mgr.stats()
    mgr.close()
    assert stats['restarts'] == 1 and runners[0].restarts == 1
    assert 10 in envs and envs[10].steps_taken == 60
    assert_all_stored(envs, mem)
    sample_and_check(mem, envs, n_batches=3)



class FailingBegin(RecordingRunner):
    """An EnvRunner whose ``fail_at``-th begin_step raises an EnvError (as a failed reset)."""

    def __init__(self, runner, fail_at):
        super().__init__(runner, lambda i: None, lambda i: None)
        self.fail_at, self.begins = fail_at, 0

    def begin_step(self, exploration):
        self.begins += 1
        if self.begins == self.fail_at:
            raise EnvError("scripted begin_step failure")
        return super().begin_step(exploration)


@pytest.mark.parametrize('restarts', [0, 1])
def test_pipelined_begin_step_failure_books_every_request(restarts):
    envs = {i: ScriptedEnv(i) for i in range(4)}
    mem = ReplayMemory(500, (6,), H)
    pred = StepPredictor()
    inner = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(4)]
    runners = [FailingBegin(r, fail_at=30 if i == 2 else None) for i, r in enumerate(inner)]
    mgr = EnvRunnerManager(runners, 8, simulator_threads=1, max_restarts=restarts)
    if restarts:
        for _ in range(300):
            mgr.step(0.0)
        mgr.wait_idle(GUARD)
        assert mgr.stats()['restarts'] == 1
    else:
        with pytest.raises(EnvError, match=r'\(runner 2\)'):
            for _ in range(10_000):
                mgr.step(0.0)
        (thread,) = mgr._threads
        thread.join(GUARD)                            # the failed thread stops by itself
        assert not thread.is_alive()
    stats = mgr.stats()
    mgr.close()
    # Every request the thread took was booked as finished (queued ones were never taken).
    assert stats['queue_depth'] - stats['queued'] == 0
    assert all(r._pending is None for r in inner)     # no step left half begun
    greedy_ok(envs)
    assert_all_stored(envs, mem)
    sample_and_check(mem, envs, n_batches=3)


@pytest.mark.parametrize('failing', ['InferenceThread', 'SimulatorThread'])
def test_a_thread_whose_context_fails_fails_the_manager(failing):
    class Context:
        def __enter__(self):
            if threading.current_thread().name.startswith(failing):
                raise RuntimeError('no graph here')

        def __exit__(self, *exc):
            pass

    mem = ReplayMemory(100, (6,), H)
    runners = [EnvRunner(ScriptedEnv(i), StepPredictor(), mem, H, index=i) for i in range(3)]
    mgr = EnvRunnerManager(runners, 2, simulator_threads=1, thread_context=Context)
    with pytest.raises(RunnerError) as info:      # not a hang once the window is full
        _step_until_raises(mgr)
    assert isinstance(info.value.__cause__, RuntimeError) and 'no graph here' in str(info.value)
    mgr.close()


def test_pipelined_stats_count_one_call_per_group():
    envs = {i: ScriptedEnv(i) for i in range(4)}
    mem = ReplayMemory(500, (6,), H)
    pred = StepPredictor()
    runners = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(4)]
    with EnvRunnerManager(runners, 8, simulator_threads=1) as mgr:
        for _ in range(200):
            mgr.step(0.0)
        mgr.wait_idle(GUARD)
        s = mgr.stats()
    # Exploration 0: every step is one predicted row; a group holds two runners.
    assert s['steps'] == 200 and round(s['inference_calls'] * s['mean_inference_batch']) == 200
    assert s['max_inference_batch'] == 2 == max(pred.batch_sizes)
    assert s['inference_calls'] == len(pred.batch_sizes)

# ----------------------------------------------------------------------------- shutdown
@pytest.mark.parametrize('threads', [PER_RUNNER, PIPELINED_1, PIPELINED_2])
def test_close_under_load_joins_every_thread(threads):
    envs = {i: ScriptedEnv(i) for i in range(4)}
    mem = ReplayMemory(300, (6,), H)
    pred = StepPredictor()   # shared, as in training
    runners = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(4)]
    mgr = EnvRunnerManager(runners, 16, simulator_threads=threads)
    started = set(live_threads())
    assert len(started) == (4 if threads is None else threads + 1)   # + the InferenceThread
    running = threading.Event()
    errors = []

    def trainer():
        try:
            while True:
                mgr.step(0.3)
                if sum(e.steps_taken for e in envs.values()) > 200:
                    running.set()
        except ManagerClosed as err:
            errors.append(err)

    t = threading.Thread(target=trainer)
    t.start()
    assert running.wait(GUARD)
    start = time.monotonic()
    mgr.close()
    assert time.monotonic() - start < 2.0
    t.join(GUARD)
    assert errors and not t.is_alive()
    assert mgr.stuck_threads == [] and not any(t.is_alive() for t in started)
    mgr.close()                                   # idempotent
    with pytest.raises(ManagerClosed):
        mgr.step(0.5)
    assert_all_stored(envs, mem)                  # no step taken was lost
    sample_and_check(mem, envs, n_batches=3)


@pytest.mark.parametrize('threads', [PER_RUNNER, PIPELINED_1])
def test_close_while_envs_hang_in_reset_warns_and_threads_end_when_released(threads):
    gate = threading.Event()
    envs = [ScriptedEnv(i, reset_gate=gate, hang_on_reset=1) for i in range(2)]
    mem = ReplayMemory(100, (6,), H)
    pred = StepPredictor()   # shared, as in training
    runners = [EnvRunner(e, pred, mem, H, index=i) for i, e in enumerate(envs)]
    mgr = EnvRunnerManager(runners, 2, simulator_threads=threads)
    mgr.step(0.5)
    if threads is None:
        mgr.step(0.5)     # one request per thread: both threads reset their env first, and hang
        assert envs[0].in_reset.wait(GUARD) and envs[1].in_reset.wait(GUARD)
        stuck = ['SimulatorThread-0', 'SimulatorThread-1']
    else:                 # the one thread hangs in the first reset
        assert envs[0].in_reset.wait(GUARD) or envs[1].in_reset.wait(GUARD)
        stuck = ['SimulatorThread-0']
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match=', '.join(stuck)):
        mgr.close(timeout=0.3)
    assert time.monotonic() - start < 1.5
    assert mgr.stuck_threads == stuck
    assert all(t.daemon and t.is_alive() for t in mgr._threads)
    gate.set()                                  # the resets return: the threads stop
    for t in mgr._threads:
        t.join(GUARD)
        assert not t.is_alive()
    assert all(r._closed for r in runners)      # each closed its own runner on the way out


@pytest.mark.parametrize('threads', [PER_RUNNER, PIPELINED_1])
def test_close_while_predictor_hangs_releases_a_blocked_step(threads):
    release, entered = threading.Event(), threading.Event()

    leader = []

    def predictor(states):
        leader.append(threading.current_thread().name)
        entered.set()
        assert release.wait(GUARD)
        return [np.zeros((len(states), 3))]

    mem = ReplayMemory(100, (6,), H)
    runners = [EnvRunner(ScriptedEnv(i), predictor, mem, H, index=i) for i in range(3)]
    mgr = EnvRunnerManager(runners, 2, simulator_threads=threads)
    mgr.step(0.0)
    mgr.step(0.0)
    assert entered.wait(GUARD)
    outcome = []

    def blocked_step():   # the window is full and nothing finishes: this step() blocks
        try:
            mgr.step(0.0)
        except ManagerClosed as err:
            outcome.append(err)

    t = threading.Thread(target=blocked_step)
    t.start()
    with pytest.warns(RuntimeWarning, match=leader[0]):
        mgr.close(timeout=0.3)
    t.join(GUARD)
    assert outcome and not t.is_alive()
    # Only the thread inside the predictor is left; a runner waiting for its result was released.
    assert mgr.stuck_threads == leader
    release.set()                               # the predictor returns: its thread stops
    for th in mgr._threads:
        th.join(GUARD)
        assert not th.is_alive()


@pytest.mark.parametrize('threads', [PER_RUNNER, PIPELINED_1])
def test_stats_figures(threads):
    envs = {i: ScriptedEnv(i, episode_lengths=4) for i in range(2)}
    mem = ReplayMemory(300, (6,), H)
    pred = StepPredictor()   # shared, as in training
    runners = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(2)]
    with EnvRunnerManager(runners, 2, simulator_threads=threads) as mgr:
        assert mgr.reset_stats() == (None, None)
        for _ in range(100):
            mgr.step(0.0)
        mgr.wait_idle(GUARD)
        s = mgr.stats()
        # Greedy action t % 3 from step t earns 10 * (t % 3) + t: 0 + 11 + 22 + 3 per game.
        assert s['steps'] == 100 and s['games'] == sum(r.steps // 4 for r in runners) >= 24
        assert s['mean_episode_length'] == 4.0 and s['steps_per_sec'] > 0
        assert s['mean_score'] == s['max_score'] == 36.0
        assert s['inference_calls'] >= 1 and 1.0 <= s['mean_inference_batch'] <= 2.0
        assert s['queue_depth'] == 0 and s['queued'] == 0 and s['restarts'] == 0
        mean, mx = mgr.reset_stats()
        assert (mean, mx) == (s['mean_score'], s['max_score'])
        assert mgr.stats()['games'] == 0 and mgr.stats()['steps'] == 0


@pytest.mark.parametrize('threads,names', [
    (None, {'SimulatorThread-0', 'SimulatorThread-1', 'SimulatorThread-2'}),
    (2, {'SimulatorThread-0', 'SimulatorThread-1', 'InferenceThread'})],
    ids=['thread-per-runner', 'pipelined-2-threads'])
def test_thread_context_is_entered_by_every_thread_the_manager_starts(threads, names):
    entered, lock = set(), threading.Lock()

    class Context:
        def __enter__(self):
            with lock:
                entered.add(threading.current_thread().name)

        def __exit__(self, *exc):
            pass

    mem = ReplayMemory(100, (6,), H)
    pred = StepPredictor()
    runners = [EnvRunner(ScriptedEnv(i), pred, mem, H, index=i) for i in range(3)]
    with EnvRunnerManager(runners, 3, thread_context=Context, simulator_threads=threads) as mgr:
        for _ in range(30):
            mgr.step(0.0)
    assert entered == names
