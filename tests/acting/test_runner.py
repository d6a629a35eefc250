"""EnvRunner and its acting group: what reaches the memory, episode ends and lives, seeding,
the arguments refused, the predictor's outputs checked, and a runner moving between groups
(each group stepped directly, as a caller without a manager steps runners)."""


import gymnasium as gym
import numpy as np
import pytest

from expreplay import ReplayMemory, RunnerSettings
from expreplay.acting import ActingGroup, EnvError, EnvRunner, EnvRunnerManager, PredictorError
from acting_helpers import (GUARD, H, RecordingMemory, StepPredictor, assert_all_stored, assert_scores,
                            greedy_ok, sample_and_check, step_until_raises)
from acting_helpers import kernels, no_thread_left_behind  # noqa: F401 (fixtures)
from scripted_env import ScriptedEnv, check_batch, encode

pytestmark = pytest.mark.timeout(60)


@pytest.mark.slow
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


@pytest.mark.slow
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
    runner = EnvRunner(env, None, mem, 4, seed=0, settings=RunnerSettings(life_loss_terminal=True))
    group = ActingGroup([runner])
    for _ in range(5000):
        group.step(1.0)
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
    lives = RunnerSettings(life_loss_terminal=True)
    runners = [EnvRunner(envs[i], pred, mem, H, settings=lives, index=i) for i in range(2)]
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
        group = ActingGroup([runner])
        for _ in range(200):
            group.step(0.5)
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
    r = EnvRunner(NoSpace(), None, mem, H, settings=RunnerSettings(num_actions=2))
    group = ActingGroup([r])
    group.step(1.0)
    # An observation the memory can not store is the env's failure (restartable), chained.
    with pytest.raises(EnvError, match='player observation') as info:
        ActingGroup([EnvRunner(ScriptedEnv(0, obs_shape=(7,)), None, mem, H)]).step(1.0)
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(ValueError, match='exploration'):
        group.step(1.5)
    # A runner is stepped by a group (tensorpack's EnvRunner.step says so).
    with pytest.raises(TypeError, match=r'ActingGroup\(\[runner\]\)'):
        r.step(1.0)
    with pytest.raises(ValueError, match='maximum_staleness'):
        EnvRunnerManager([r], 0)


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
    # Q-values as Python lists: read as tensorpack's [Q, ...], the message says so.
    (lambda n: np.zeros((n, 3)).tolist(),
     r"a Python list of \d+ items whose first is list of shape \(3,\).*tensorpack's \[Q-values"),
    (lambda n: [0.0, 1.0, 2.0],
     r"list of 3 items whose first is float of shape \(\).*\(n_states, num_actions\)"),
], ids=['9-columns', '1-column', 'nan', 'inf32', 'strings', 'objects', 'rows', 'lists', 'a-row'])
@pytest.mark.parametrize('n_runners', [1, 3], ids=['inline', 'threads'])
def test_bad_q_values_are_a_predictor_error_and_no_action_reaches_an_env(bad, match, n_runners):
    envs = {i: ScriptedEnv(i) for i in range(n_runners)}
    mem = ReplayMemory(200, (6,), H)
    pred = WrongQ(bad)
    runners = [EnvRunner(envs[i], pred, mem, H, index=i) for i in range(n_runners)]
    with pytest.raises(PredictorError, match=match):
        with EnvRunnerManager(runners, 2) as mgr:
            step_until_raises(mgr)
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
        group = ActingGroup([runner])
        for _ in range(50):
            group.step(0.0)
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
    group = ActingGroup([EnvRunner(env, StepPredictor(), mem, H, seed=0)])
    for _ in range(36):
        group.step(0.5)
    with pytest.raises(EnvError, match='player observation') as info:
        group.step(0.5)
    assert isinstance(info.value.__cause__, ValueError)
    for _ in range(200):       # the next step resets the env and starts a new episode
        group.step(0.5)
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
    group = ActingGroup([runner])
    for _ in range(500):       # 250 games of one step (a reset between each)
        group.step(1.0)
    assert 50 <= len(runner.total_scores) <= 100 and 50 <= len(runner.pop_games()) <= 100
    runner.close()


def test_a_runner_stepped_by_its_own_group_then_managed_starts_new_episodes_and_counts_on():
    envs = {i: ScriptedEnv(i, episode_lengths=1000) for i in range(2)}
    mem = ReplayMemory(400, (6,), H, block_size=8)
    runners = [EnvRunner(envs[i], StepPredictor(), mem, H, index=i) for i in range(2)]
    solo = ActingGroup([runners[0]])
    for _ in range(10):
        solo.step(0.5)                    # its own group, its own lane
    active = lambda: int((mem.ring.block_state == 1).sum())   # noqa: E731
    assert active() == 1
    solo.close()                          # its owner lets it go before the runner moves
    with EnvRunnerManager(runners, 2) as mgr:
        assert active() == 0              # the solo group let its block go
        for _ in range(100):
            mgr.step(0.5)
        mgr.wait_idle(GUARD)
    assert envs[0].resets == 2            # a new episode in the manager's group
    assert sum(r.steps for r in runners) == mem.num_steps_written   # both groups' steps
    assert_all_stored(envs, mem)
    sample_and_check(mem, envs)


def test_a_group_owns_its_runners_stepping_state_and_changes_no_runner_until_it_steps():
    env = ScriptedEnv(0, episode_lengths=1000)
    mem = ReplayMemory(200, (6,), H, block_size=8)
    runner = EnvRunner(env, StepPredictor(), mem, H)
    solo = ActingGroup([runner])
    for _ in range(3):
        solo.step(1.0)
    group = ActingGroup([runner])         # building a group changes no runner, nor the other group
    assert runner.steps == 3 and not solo.needs_reset(0) and group.needs_reset(0)
    with pytest.raises(ValueError, match='distinct'):
        ActingGroup([runner, runner])     # one lane map: a runner's envs have one place in it
    solo.close()                          # what the group's owner (a manager) does first
    group.step(1.0)
    assert runner.steps == 4 == mem.num_steps_written and env.resets == 2
    with pytest.raises(RuntimeError, match='closed'):
        solo.step(1.0)                    # closed, it let its memory lane go


def test_a_memory_with_extra_fields_is_refused_by_a_runner_naming_them():
    # The acting path writes no extra fields; the memory would refuse its first step.
    mem = ReplayMemory(200, (6,), H, extra_fields={'lives': 'int8'})
    with pytest.raises(ValueError, match=r"extra_fields \['lives'\]"):
        EnvRunner(ScriptedEnv(0), StepPredictor(), mem, H)
