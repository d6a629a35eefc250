"""EnvRunner and EnvRunnerManager, end to end through the threads into a real ReplayMemory.

Most tests drive scripted envs (tests/scripted_env.py) whose frames encode (env, episode, step),
so every sampled transition is checked against what the env emitted. Synchronisation is by
Events and Conditions only; timeouts are hang guards.
"""

import threading
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from expreplay import ReplayMemory
from expreplay.acting import (CallTimeout, EnvError, EnvRunner, EnvRunnerManager,
                              InferenceThread, ManagerClosed, PredictorError, RunnerError)
from scripted_env import (OldApiScriptedEnv, ScriptedEnv, ScriptedEnvError, check_batch, decode,
                          encode)

pytestmark = pytest.mark.timeout(60)

GUARD = 10.0   # seconds: only ever a hang guard
H = 3          # history_len of the scripted tests

# EnvRunnerManager's threading modes: the default (None: chosen for the runners; for single
# envs one pipelined thread), a thread per runner ('per-runner', turned into len(runners)
# by threads_for), and fewer threads than runners (pipelined).
DEFAULT = pytest.param(None, id='default')
PER_RUNNER = pytest.param('per-runner', id='thread-per-runner')
PIPELINED_1 = pytest.param(1, id='pipelined-1-thread')
PIPELINED_2 = pytest.param(2, id='pipelined-2-threads')
MODES = [DEFAULT, PER_RUNNER, PIPELINED_2]


def threads_for(threads, runners):
    """The simulator_threads argument for a mode of the parametrization above."""
    return len(runners) if threads == 'per-runner' else threads


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


class RecordingBatchWriter:
    """A BatchWriter that logs every call per lane, as the scalar calls a LaneWriter would get."""

    def __init__(self, writer, lanes):
        self.writer, self.lanes = writer, lanes

    def start_episodes(self, lanes, frames, **kw):
        for lane, frame in zip(np.asarray(lanes).tolist(), frames):
            self.lanes[lane].append(('start', np.array(frame)))
        self.writer.start_episodes(lanes, frames, **kw)

    def add_steps(self, lanes, actions, rewards, next_frames, terminated, truncated, **kw):
        for j, lane in enumerate(np.asarray(lanes).tolist()):
            self.lanes[lane].append(('step', int(actions[j]), float(rewards[j]), np.array(next_frames[j]),
                                     bool(terminated[j]), bool(truncated[j])))
        self.writer.add_steps(lanes, actions, rewards, next_frames, terminated, truncated, **kw)

    def add_steps_with_history(self, *args):
        return False    # the general path, so that every step is logged

    def close(self):
        self.writer.close()


class RecordingMemory:
    """A ReplayMemory whose writers log every call, per lane (in the order lanes are made)."""

    def __init__(self, *args, **kw):
        self.mem = ReplayMemory(*args, **kw)
        self.state_shape, self.dtype, self.history_len = self.mem.state_shape, self.mem.dtype, self.mem.history_len
        self.lanes = []

    def new_batch_writer(self, k):
        lanes = [[] for _ in range(k)]
        self.lanes.extend(lanes)
        return RecordingBatchWriter(self.mem.new_batch_writer(k), lanes)


# ----------------------------------------------------------------------------- end to end
@pytest.fixture(params=['C kernels', 'numpy'])
def kernels(request, monkeypatch):
    """Run a test with the optional C kernels of the acting path, and with the numpy path
    they are a shortcut for (as on a machine without a compiler)."""
    if request.param == 'numpy':
        import expreplay.acting.envs.frames
        import expreplay.acting.policy
        import expreplay.storage.writers
        monkeypatch.setattr(expreplay.acting.policy, '_acting_ext', None)
        monkeypatch.setattr(expreplay.acting.envs.frames, '_acting_ext', None)
        monkeypatch.setattr(expreplay.storage.writers, '_acting_ext', None)
    elif expreplay_kernels_missing():
        pytest.skip("the C kernels are not built here")
    return request.param


def expreplay_kernels_missing():
    import expreplay.acting.policy
    return expreplay.acting.policy._acting_ext is None


@pytest.mark.parametrize('threads', MODES)
@pytest.mark.parametrize('env_cls', [ScriptedEnv, OldApiScriptedEnv])
def test_threads_end_to_end_every_sampled_transition(env_cls, threads, kernels):
    envs = {i: env_cls(i, episode_lengths=(5, 3, 8, 13), ends=('terminated', 'truncated', 'truncated'))
            for i in range(3)}
    mem = ReplayMemory(120, (6,), H, block_size=8)    # small: the run wraps around many times
    pred = StepPredictor()
    runners = [EnvRunner(envs[i], pred, mem, H, seed=3, index=i) for i in range(3)]
    checked = 0
    with EnvRunnerManager(runners, maximum_staleness=4, simulator_threads=threads_for(threads, runners)) as mgr:
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


@pytest.mark.parametrize('threads', [DEFAULT, PER_RUNNER, PIPELINED_1])
@pytest.mark.parametrize('mode', [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP,
                                  AutoresetMode.DISABLED])
def test_vector_env_runners_end_to_end(mode, threads, kernels):
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
    with EnvRunnerManager(runners, maximum_staleness=2, simulator_threads=threads_for(threads, runners)) as mgr:
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


def test_life_loss_with_scripted_lives_samples_right(kernels):
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
    # An observation the memory can not store is the env's failure (restartable), chained.
    with pytest.raises(EnvError, match='player observation') as info:
        EnvRunner(ScriptedEnv(0, obs_shape=(7,)), None, mem, H).step(1.0)
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(ValueError, match='exploration'):
        r.step(1.5)
    with pytest.raises(ValueError, match='maximum_staleness'):
        EnvRunnerManager([r], 0)


# ----------------------------------------------------------------------------- staleness
def _gated_runners(n_runners, gate, entered, mem):
    """Runners whose every env step waits for one permit of ``gate`` (after releasing one of
    ``entered``): the test decides when each step may complete."""
    def hook(env, action):
        entered.release()
        assert gate.acquire(timeout=GUARD)
    envs = {i: ScriptedEnv(i, step_hook=hook) for i in range(n_runners)}
    return envs, [EnvRunner(envs[i], StepPredictor(), mem, H, index=i) for i in range(n_runners)]


@pytest.mark.parametrize('threads', MODES)
@pytest.mark.parametrize('staleness,n_runners', [(1, 3), (3, 2), (3, 5), (5, 8)])
def test_staleness_guarantee_holds_in_every_mode(staleness, n_runners, threads):
    """A request is executed (its step in the memory) before more than maximum_staleness later
    ones are accepted; refused only while the window is full; no request is lost."""
    n = 60
    gate, entered = threading.Semaphore(0), threading.Semaphore(0)
    mem = ReplayMemory(500, (6,), H)
    envs, runners = _gated_runners(n_runners, gate, entered, mem)
    with EnvRunnerManager(runners, staleness, simulator_threads=threads_for(threads, runners)) as mgr:
        for k in range(n):
            while True:
                try:
                    mgr.step(0.5, timeout=0)
                    break
                except TimeoutError:
                    assert k >= staleness, k       # fewer pending than the window: never refused
                    # Let one waiting env step complete, and wait until it is booked.
                    assert entered.acquire(timeout=GUARD)
                    before = mgr.progress()[1]
                    gate.release()
                    assert mgr._window.wait_for(lambda: mgr.progress()[1] < before, GUARD)
            # Accepted k: requests 0 .. k - staleness are executed, their steps stored.
            assert mem.num_steps_written >= k - staleness + 1, (k, mem.num_steps_written)
        for _ in range(n):
            gate.release()
        mgr.wait_idle(GUARD)
    assert mem.num_steps_written == n == sum(len(e.transitions) for e in envs.values())
    greedy_ok({})


# ----------------------------------------------------------------------------- batching
def test_manager_merges_the_states_of_threads_waiting_at_once():
    """A thread per runner: states submitted while a call runs all go into the next call."""
    envs = {i: ScriptedEnv(i) for i in range(4)}
    inner = StepPredictor()
    first_call = []
    holder = {}

    def predictor(states):
        if not first_call:
            first_call.append(len(states))
            it = holder['it']
            with it._cond:   # the call runs unlocked: wait until the other runners have submitted
                assert it._cond.wait_for(
                    lambda: sum(len(p.states) for p in it._queue) >= 4 - len(states), GUARD)
        return inner(states)

    mem = ReplayMemory(500, (6,), H)
    runners = [EnvRunner(envs[i], predictor, mem, H, index=i) for i in range(4)]
    with EnvRunnerManager(runners, maximum_staleness=8, simulator_threads=4) as mgr:
        (holder['it'],) = mgr._inference_threads.values()
        for _ in range(400):
            mgr.step(0.0)
        mgr.wait_idle(GUARD)
        stats = mgr.stats()
    first = first_call[0]
    # All four in the first call, or the ones that waited during it together in the second.
    assert first == 4 or inner.batch_sizes[1] == 4 - first, inner.batch_sizes[:2]
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
        return np.repeat(states[:, :1], 2, axis=1).astype(np.float32)
    return predictor


def test_inference_thread_merges_other_submitters_never_one_submitter_twice():
    calls, release, entered = [], threading.Event(), threading.Event()
    it = InferenceThread(_blocking_predictor(calls, release, entered), max_batch=3)
    first = it.submit(np.array([[0.0]]), owner='a')
    assert entered.wait(GUARD)                    # the thread is inside the first call
    queued = [it.submit(np.array([[1.0], [2.0]]), 'a'), it.submit(np.array([[3.0]]), 'a'),
              it.submit(np.array([[4.0]]), 'b'), it.submit(np.array([[5.0], [6.0]]), 'c')]
    release.set()
    results = [p.wait() for p in [first] + queued]
    # Queued during the first call: a's first with b's (c's would pass max_batch), then a's
    # second with c's; a submission is never split unless it alone passes max_batch.
    assert calls == [[0.0], [1.0, 2.0, 4.0], [3.0, 5.0, 6.0]]
    assert [r[:, 0].tolist() for r in results] == [[0.0], [1.0, 2.0], [3.0], [4.0], [5.0, 6.0]]
    assert (it.calls, it.rows, it.max_rows_seen) == (3, 7, 3)
    big = it.submit(np.arange(7.0, 12.0)[:, None], 'a')
    assert big.wait()[:, 0].tolist() == [7.0, 8.0, 9.0, 10.0, 11.0]
    assert calls[-2:] == [[7.0, 8.0, 9.0], [10.0, 11.0]]   # 5 rows > max_batch: two calls
    it.close()
    it.thread.join(GUARD)
    assert not it.thread.is_alive()
    with pytest.raises(ManagerClosed):
        it.submit(np.zeros((1, 1)))


def test_inference_thread_delivers_errors_and_close_releases_waiters():
    def bad(states):
        raise ValueError('bad weights')

    it = InferenceThread(bad)
    preds = [it.submit(np.zeros((1, 1)), 'a'), it.submit(np.zeros((2, 1)), 'b')]
    for p in preds:
        with pytest.raises(PredictorError, match='bad weights') as info:
            p.wait()
        assert isinstance(info.value.__cause__, ValueError)
    it.close()
    it.thread.join(GUARD)

    calls, release, entered = [], threading.Event(), threading.Event()
    it = InferenceThread(_blocking_predictor(calls, release, entered))
    running = it.submit(np.zeros((1, 1)))
    assert entered.wait(GUARD)
    waiting = it.submit(np.ones((1, 1)))
    it.close()                                    # does not wait for the predictor
    for p in (running, waiting):
        with pytest.raises(ManagerClosed):
            p.wait()
    release.set()                                 # the call returns: the thread stops
    it.thread.join(GUARD)
    assert not it.thread.is_alive() and calls == [[0.0]]


def test_pipelined_thread_steps_one_group_while_the_other_is_predicted():
    """One simulator thread, four single-env runners (two groups of two): a group's forward
    pass runs while the other group's envs step. Each predictor call waits (up to a second)
    for an env of another group to step during it: a thread that predicted and stepped in
    turn would make every call time out and see no overlap."""
    lock = threading.Lock()
    state = {'calling': frozenset(), 'stepped_during': threading.Event()}
    overlaps = []

    def hook(env, action):
        with lock:
            if state['calling'] and env.env_id not in state['calling']:
                state['stepped_during'].set()

    inner = StepPredictor()

    def predictor(states):
        ids = frozenset(decode(s[..., -1])[0] for s in states)
        with lock:
            state['calling'], state['stepped_during'] = ids, threading.Event()
            stepped = state['stepped_during']
        overlaps.append(stepped.wait(0.5))
        with lock:
            state['calling'] = frozenset()
        return inner(states)

    envs = {i: ScriptedEnv(i, step_hook=hook) for i in range(4)}
    mem = ReplayMemory(500, (6,), H)
    runners = [EnvRunner(envs[i], predictor, mem, H, index=i) for i in range(4)]
    with EnvRunnerManager(runners, 8, simulator_threads=1) as mgr:
        assert mgr.pipelined
        for _ in range(60):
            mgr.step(0.0)
        mgr.wait_idle(GUARD)
    assert max(inner.batch_sizes) == 2                     # one group (half the runners) per call
    # Serial acting would overlap never; a call can miss only while the caller has queued no
    # request for the other group yet.
    assert sum(overlaps) >= len(overlaps) // 2, overlaps
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
        with pytest.raises((ValueError, TypeError), match='simulator_threads'):
            EnvRunnerManager(runners, 2, simulator_threads=bad)
    with EnvRunnerManager(runners, 2, simulator_threads=3) as mgr:   # = one per runner
        assert not mgr.pipelined and len(mgr._threads) == 3

# ----------------------------------------------------------------------------- faults
def _step_until_raises(mgr, n=10_000):
    for _ in range(n):
        mgr.step(0.5)
    raise AssertionError("no fault surfaced")


@pytest.mark.parametrize('threads,where', [('per-runner', r'SimulatorThread-1 \(runner 1\)'),
                                           (None, r'SimulatorThread-0 \(runner 1\)'),
                                           (2, r'SimulatorThread-1 \(runner 1\)')],
                         ids=['thread-per-runner', 'default', 'pipelined-2-threads'])
def test_env_failure_surfaces_from_step_within_a_second(threads, where):
    failed_at = []

    def hook(env, action):
        if env.steps_taken + 1 == env.fail_at_step:
            failed_at.append(time.monotonic())

    envs = {i: ScriptedEnv(i, fail_at_step=(40 if i == 1 else None), step_hook=hook) for i in range(3)}
    mem = ReplayMemory(500, (6,), H)
    pred = StepPredictor()   # shared, as in training
    runners = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(3)]
    mgr = EnvRunnerManager(runners, 3, simulator_threads=threads_for(threads, runners))
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


@pytest.mark.parametrize('threads', MODES)
def test_unreported_failure_is_raised_by_close(threads):
    failed = threading.Event()

    def hook(env, action):
        if env.steps_taken + 1 == env.fail_at_step:
            failed.set()

    envs = [ScriptedEnv(i, fail_at_step=5, step_hook=hook) for i in range(2)]
    mem = ReplayMemory(100, (6,), H)
    runners = [EnvRunner(e, None, mem, H, index=i) for i, e in enumerate(envs)]
    mgr = EnvRunnerManager(runners, 20, simulator_threads=threads_for(threads, runners))
    for _ in range(12):
        mgr.step(1.0)
    assert failed.wait(GUARD)
    with pytest.raises(EnvError) as info:
        mgr.close()
    assert isinstance(info.value.__cause__, ScriptedEnvError)
    mgr.close()


@pytest.mark.parametrize('n_runners,threads', [(1, None), (3, 'per-runner'), (3, None), (3, 2)],
                         ids=['inline', 'thread-per-runner', 'default', 'pipelined-2-threads'])
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
        with EnvRunnerManager(runners, 2, simulator_threads=threads_for(threads, runners)) as mgr:
            _step_until_raises(mgr)
    assert time.monotonic() - calls[9] < 1.0
    assert isinstance(info.value.__cause__, ValueError) and 'bad weights' in str(info.value)


@pytest.mark.parametrize('threads', MODES)
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
    mgr = EnvRunnerManager(runners, 2, max_restarts=1, simulator_threads=threads_for(threads, runners))
    with pytest.raises(EnvError):     # runner 0: restarted once, then its replacement fails
        _step_until_raises(mgr)
    stats = mgr.stats()
    mgr.close()
    assert stats['restarts'] == 1 and runners[0].restarts == 1
    assert 10 in envs and envs[10].steps_taken == 60
    assert_all_stored(envs, mem)
    sample_and_check(mem, envs, n_batches=3)



class FailingReset(ScriptedEnv):
    """A scripted env whose ``fail_at``-th reset raises (a failure in the first half of a step)."""

    def __init__(self, env_id, fail_at=None, **kw):
        super().__init__(env_id, **kw)
        self.fail_at, self.reset_calls = fail_at, 0

    def reset(self, **kw):
        self.reset_calls += 1
        if self.reset_calls == self.fail_at:
            raise ScriptedEnvError("scripted reset failure")
        return super().reset(**kw)


@pytest.mark.parametrize('restarts', [0, 1])
def test_pipelined_reset_failure_books_every_request(restarts):
    envs = {i: FailingReset(i, fail_at=5 if i == 2 else None, episode_lengths=6) for i in range(4)}
    mem = ReplayMemory(500, (6,), H)
    pred = StepPredictor()
    runners = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(4)]
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
    assert not any(g.in_step for g in mgr._groups)     # no step left half begun
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
@pytest.mark.parametrize('threads', MODES)
def test_close_under_load_joins_every_thread(threads):
    envs = {i: ScriptedEnv(i) for i in range(4)}
    mem = ReplayMemory(300, (6,), H)
    pred = StepPredictor()   # shared, as in training
    runners = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(4)]
    mgr = EnvRunnerManager(runners, 16, simulator_threads=threads_for(threads, runners))
    started = set(live_threads())
    assert len(started) == {'per-runner': 4, None: 1, 2: 2}[threads] + 1   # + the InferenceThread
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


@pytest.mark.parametrize('threads', MODES)
def test_close_while_envs_hang_in_reset_warns_and_threads_end_when_released(threads):
    gate = threading.Event()
    envs = [ScriptedEnv(i, reset_gate=gate, hang_on_reset=1) for i in range(2)]
    mem = ReplayMemory(100, (6,), H)
    pred = StepPredictor()   # shared, as in training
    runners = [EnvRunner(e, pred, mem, H, index=i) for i, e in enumerate(envs)]
    mgr = EnvRunnerManager(runners, 2, simulator_threads=threads_for(threads, runners))
    mgr.step(0.5)
    if threads == 'per-runner':
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
    assert all(t.daemon and t.is_alive() for t in mgr._threads if t.name in stuck)
    gate.set()                                  # the resets return: the threads stop
    for t in mgr._threads:
        t.join(GUARD)
        assert not t.is_alive()
    assert all(r._closed for r in runners)      # each closed its own runner on the way out


@pytest.mark.parametrize('threads', MODES)
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
    mgr = EnvRunnerManager(runners, 2, simulator_threads=threads_for(threads, runners))
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


@pytest.mark.parametrize('threads', MODES)
def test_stats_figures(threads):
    envs = {i: ScriptedEnv(i, episode_lengths=4) for i in range(2)}
    mem = ReplayMemory(300, (6,), H)
    pred = StepPredictor()   # shared, as in training
    runners = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(2)]
    with EnvRunnerManager(runners, 2, simulator_threads=threads_for(threads, runners)) as mgr:
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
    ('per-runner', {'SimulatorThread-0', 'SimulatorThread-1', 'SimulatorThread-2', 'InferenceThread'}),
    (None, {'SimulatorThread-0', 'InferenceThread'}),
    (2, {'SimulatorThread-0', 'SimulatorThread-1', 'InferenceThread'})],
    ids=['thread-per-runner', 'default', 'pipelined-2-threads'])
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
    with EnvRunnerManager(runners, 3, thread_context=Context, simulator_threads=threads_for(threads, runners)) as mgr:
        for _ in range(30):
            mgr.step(0.0)
    assert entered == names


# ----------------------------------------------------------------------------- hardening
class WrongQ:
    """A predictor returning ``make(n)`` for n states, and counting its calls."""

    def __init__(self, make):
        self.make, self.calls = make, 0

    def __call__(self, states):
        self.calls += 1
        return self.make(len(states))


@pytest.mark.parametrize('bad,match', [
    (lambda n: np.zeros((n, 9)), r'shape \(\d+, 9\).*num_actions=3'),        # too many columns
    (lambda n: np.zeros((n, 1)), r'shape \(\d+, 1\).*num_actions=3'),        # one column
    (lambda n: np.full((n, 3), np.nan), 'non-finite'),                        # all NaN
    (lambda n: np.tile(np.float32([0, 1, np.inf]), (n, 1)), 'non-finite'),     # one inf, float32
    (lambda n: np.full((n, 3), 'a'), 'dtype'),                                # strings
    (lambda n: np.array([[object()] * 3] * n), 'dtype'),                      # objects
    (lambda n: [np.zeros((n + 1, 3))], r'shape'),                             # wrong row count
], ids=['9-columns', '1-column', 'nan', 'inf32', 'strings', 'objects', 'rows'])
@pytest.mark.parametrize('n_runners', [1, 3], ids=['inline', 'threads'])
def test_bad_q_values_are_a_predictor_error_and_no_action_reaches_an_env(bad, match, n_runners):
    envs = {i: ScriptedEnv(i) for i in range(n_runners)}
    mem = ReplayMemory(200, (6,), H)
    pred = WrongQ(bad)
    runners = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(n_runners)]
    with pytest.raises(PredictorError, match=match):
        with EnvRunnerManager(runners, 2) as mgr:
            _step_until_raises(mgr)
    assert pred.calls >= 1
    # Exploration 0.5: only the random actions were taken, all in range.
    assert all(a < 3 for e in envs.values() for (a, *_) in e.transitions.values())


def test_predictor_may_return_the_q_array_or_tensorpack_s_list(kernels):
    # Also Q-values the acting kernel does not take (integers, float16, a strided view):
    # the checked numpy path acts on them the same.
    for wrap in (lambda q: q, lambda q: [q], lambda q: (q, 'extra output'),
                 lambda q: q.astype(np.int64), lambda q: q.astype(np.float16),
                 lambda q: np.repeat(q, 2, axis=1)[:, ::2], lambda q: q.astype(np.float64)):
        env = ScriptedEnv(0)
        inner = StepPredictor()
        runner = EnvRunner(env, lambda s: wrap(inner(s)[0]), ReplayMemory(200, (6,), H), H)
        for _ in range(50):
            runner.step(0.0)
        greedy_ok({0: env})
        runner.close()


class BadObsAt(ScriptedEnv):
    """A scripted env whose ``bad_at``-th step returns an observation of the wrong shape."""

    def __init__(self, env_id, bad_at, **kw):
        super().__init__(env_id, **kw)
        self.bad_at = bad_at

    def step(self, action):
        out = super().step(action)
        if self.steps_taken == self.bad_at:
            return (np.zeros(5, np.uint8),) + out[1:]
        return out


def test_a_rejected_observation_ends_the_episode_cleanly_and_the_runner_goes_on():
    env = BadObsAt(0, bad_at=37, episode_lengths=1000)
    mem = ReplayMemory(500, (6,), H)
    runner = EnvRunner(env, StepPredictor(), mem, H, seed=0)
    for _ in range(36):
        runner.step(0.5)
    with pytest.raises(EnvError, match='player observation') as info:
        runner.step(0.5)
    assert isinstance(info.value.__cause__, ValueError)
    for _ in range(200):       # the next step resets the env and starts a new episode
        runner.step(0.5)
    assert env.resets == 2
    # Every stored transition is exactly what the env did; the rejected step is not stored
    # and nothing bootstraps across it.
    assert mem.num_steps_written == env.steps_taken - 1
    rng = np.random.default_rng(0)
    assert sum(check_batch(mem.sample_batch(64, rng=rng), {0: env}, H) for _ in range(20)) == 1280


def test_finished_game_records_are_bounded_when_never_read(monkeypatch):
    import expreplay.acting.runner
    monkeypatch.setattr(expreplay.acting.runner, 'MAX_KEPT_GAMES', 100)
    runner = EnvRunner(ScriptedEnv(0, episode_lengths=1), None, ReplayMemory(200, (6,), H), H)
    for _ in range(1000):      # 500 games of one step (a reset between each)
        runner.step(1.0)
    assert 50 <= len(runner.total_scores) <= 100 and 50 <= len(runner.pop_games()) <= 100
    runner.close()


@pytest.mark.parametrize('threads', MODES)
def test_a_hung_env_step_is_a_call_timeout_from_step(threads):
    gate = threading.Event()

    def hook(env, action):
        if env.env_id == 1 and env.steps_taken == 20:
            assert gate.wait(GUARD)

    envs = {i: ScriptedEnv(i, step_hook=hook) for i in range(3)}
    mem = ReplayMemory(300, (6,), H)
    runners = [EnvRunner(envs[i], StepPredictor(), mem, H, index=i) for i in range(3)]
    mgr = EnvRunnerManager(runners, 3, call_timeout=0.3, simulator_threads=threads_for(threads, runners))
    start = None
    try:
        with pytest.raises(CallTimeout, match=r'SimulatorThread-\d.*an env step') as info:
            for _ in range(10_000):
                mgr.step(0.5)
                if start is None and envs[1].steps_taken >= 20:
                    start = time.monotonic()
        assert start is not None and time.monotonic() - start < 0.3 + 2.0
        assert 'call_timeout=0.3' in str(info.value)
    finally:
        gate.set()
        mgr.close()


def test_timeouts_accept_infinity_and_refuse_negative_or_nan():
    mem = ReplayMemory(100, (6,), H)
    runners = [EnvRunner(ScriptedEnv(i), None, mem, H, index=i) for i in range(2)]
    with EnvRunnerManager(runners, 2, close_timeout=float('inf'), call_timeout=float('inf')) as mgr:
        for _ in range(20):
            mgr.step(1.0, timeout=float('inf'))
        mgr.wait_idle(float('inf'))
    for kw in ({'close_timeout': -1}, {'close_timeout': float('nan')}, {'call_timeout': -0.5},
               {'call_timeout': 0}, {'max_restarts': -1}):
        with pytest.raises((ValueError, TypeError), match=next(iter(kw))):
            EnvRunnerManager(runners, 2, **kw)


def test_a_second_close_waits_for_the_first():
    gate = threading.Event()
    envs = [ScriptedEnv(i, reset_gate=gate, hang_on_reset=2, episode_lengths=3) for i in range(2)]
    mem = ReplayMemory(100, (6,), H)
    runners = [EnvRunner(e, None, mem, H, index=i) for i, e in enumerate(envs)]
    mgr = EnvRunnerManager(runners, 2)
    deadline = time.monotonic() + GUARD
    while not (envs[0].in_reset.is_set() or envs[1].in_reset.is_set()):   # until a reset hangs
        assert time.monotonic() < deadline
        try:
            mgr.step(1.0, timeout=0.01)
        except TimeoutError:
            pass
    order = []

    def close(tag, timeout):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', RuntimeWarning)
            mgr.close(timeout=timeout)
        order.append(tag)

    first = threading.Thread(target=close, args=('first', 0.5))
    first.start()
    # The first close has begun (it notifies when it marks closed).
    assert mgr._window.wait_for(lambda: mgr._window.closed, GUARD)
    second = threading.Thread(target=close, args=('second', GUARD))
    second.start()
    first.join(GUARD)
    second.join(GUARD)
    gate.set()
    assert order == ['first', 'second']
    for t in mgr._threads:
        t.join(GUARD)


def test_a_runner_stepped_alone_then_managed_starts_new_episodes_and_frees_its_old_lane():
    envs = {i: ScriptedEnv(i, episode_lengths=1000) for i in range(2)}
    mem = ReplayMemory(400, (6,), H, block_size=8)
    runners = [EnvRunner(envs[i], StepPredictor(), mem, H, index=i) for i in range(2)]
    for _ in range(10):
        runners[0].step(0.5)              # its own group, its own lane
    active = lambda: int((mem._block_state == 1).sum())   # noqa: E731
    assert active() == 1
    with EnvRunnerManager(runners, 2) as mgr:
        assert active() == 0              # the solo group let its block go
        for _ in range(100):
            mgr.step(0.5)
        mgr.wait_idle(GUARD)
    assert envs[0].resets == 2            # a new episode in the manager's group
    assert_all_stored(envs, mem)
    sample_and_check(mem, envs)


def test_a_memory_with_extra_fields_is_refused_by_a_runner_naming_them():
    # The acting path writes no extra fields; the memory would refuse its first step.
    mem = ReplayMemory(200, (6,), H, extra_fields={'lives': 'int8'})
    with pytest.raises(ValueError, match=r"extra_fields \['lives'\]"):
        EnvRunner(ScriptedEnv(0), StepPredictor(), mem, H)
