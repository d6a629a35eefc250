"""ReplayMemory.episodes() while writers run: every episode it yields is whole, the others are
skipped and counted."""

import threading

import numpy as np
import pytest

from expreplay import ReplayMemory
from scripted_env import ScriptedEnv, decode


class ScriptedWriters:
    """Threads that each play a scripted env into its own lane of ``mem``, counting the steps
    written under a condition so that a test can wait for the memory to move on."""

    def __init__(self, mem, num, lengths):
        self.mem = mem
        self.envs = [ScriptedEnv(i, episode_lengths=lengths, num_actions=4) for i in range(num)]
        self.stop = threading.Event()
        self.cond = threading.Condition()
        self.steps = 0
        self.errors = []
        self.threads = [threading.Thread(target=self._play, args=(env,), daemon=True)
                        for env in self.envs]

    def _play(self, env):
        try:
            writer = self.mem.new_writer()
            rng = np.random.default_rng(env.env_id)
            obs, _ = env.reset()
            writer.start_episode(obs)
            while not self.stop.is_set():
                action = int(rng.integers(4))
                obs, reward, terminated, truncated, _ = env.step(action)
                writer.add_step(action, reward, obs, terminated, truncated)
                if terminated or truncated:
                    obs, _ = env.reset()
                    writer.start_episode(obs)
                with self.cond:
                    self.steps += 1
                    self.cond.notify_all()
            writer.close()
        except BaseException as err:          # reaches the test through self.errors
            self.errors.append(err)
            with self.cond:
                self.cond.notify_all()

    def wait_for(self, steps):
        """Wait until ``steps`` more steps were written (or a writer failed)."""
        with self.cond:
            target = self.steps + steps
            assert self.cond.wait_for(lambda: self.steps >= target or self.errors, timeout=60)
        assert not self.errors, self.errors

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in self.threads)
        assert not self.errors, self.errors


def check_whole(episode, envs):
    """The episode is one scripted game from its reset frame to its end, as the env played it."""
    obs = episode['observations']
    first = decode(obs[0])
    assert first is not None
    env_id, number, step0 = first
    assert step0 == 0, f"episode starts mid-game, at step {step0} of env {env_id}'s game {number}"
    steps = len(episode['actions'])
    assert [decode(f) for f in obs] == [(env_id, number, t) for t in range(steps + 1)]
    played = [envs[env_id].transitions[(number, t)] for t in range(steps)]
    assert episode['actions'].tolist() == [p[0] for p in played]
    assert episode['rewards'].tolist() == [p[1] for p in played]
    assert episode['terminations'].tolist() == [p[2] for p in played]
    assert episode['truncations'].tolist() == [p[3] for p in played]
    assert played[-1][2] or played[-1][3]                      # ends where the game ended
    assert not any(p[2] or p[3] for p in played[:-1])


def test_episodes_read_while_writers_evict_are_whole_or_counted():
    mem = ReplayMemory(3000, (6,), 4, 'uint8', block_size=50)
    with ScriptedWriters(mem, 4, lengths=(7, 23, 4, 41, 12)) as writers:
        writers.wait_for(6000)                 # the ring is full and evicting
        seen = 0
        episodes = mem.episodes()
        listed = None
        for episode in episodes:
            check_whole(episode, writers.envs)
            seen += 1
            # Let the writers move on by most of the memory before the next episode is read:
            # the episodes listed after this one are being evicted meanwhile.
            writers.wait_for(1500)
        listed = episodes.yielded + episodes.evicted + episodes.incomplete
    assert seen == episodes.yielded >= 1
    assert episodes.evicted >= 1, episodes        # the race did happen
    assert listed >= 50
    assert episodes.incomplete <= 4 + 4          # running episodes (one per lane), cut ones


def test_episodes_of_an_idle_memory_skip_nothing_but_the_running_and_cut_ones():
    mem = ReplayMemory(3000, (6,), 4, 'uint8', block_size=50)
    with ScriptedWriters(mem, 3, lengths=(7, 23, 4)) as writers:
        writers.wait_for(5000)
    episodes = mem.episodes()
    got = list(episodes)
    for episode in got:
        check_whole(episode, writers.envs)
    assert episodes.evicted == 0 and episodes.yielded == len(got) > 100
    assert episodes.incomplete <= 3 + 3    # each lane's abandoned last game, its cut oldest one


def play(mem, env, steps, rng):
    """``steps`` steps of a scripted env into a new lane of ``mem`` (from this thread)."""
    writer = mem.new_writer()
    obs, _ = env.reset()
    writer.start_episode(obs)
    for _ in range(steps):
        action = int(rng.integers(4))
        obs, reward, terminated, truncated, _ = env.step(action)
        writer.add_step(action, reward, obs, terminated, truncated)
        if terminated or truncated:
            obs, _ = env.reset()
            writer.start_episode(obs)
    writer.close()


def test_export_minari_leaves_out_and_reports_the_episodes_evicted_under_it(
        tmp_path, monkeypatch, caplog):
    pytest.importorskip("minari")
    gym = pytest.importorskip('gymnasium')
    from expreplay.minari_io import export_minari
    monkeypatch.setenv('MINARI_DATASETS_PATH', str(tmp_path / 'minari'))
    rng = np.random.default_rng(0)
    mem = ReplayMemory(1000, (6,), 4, 'uint8', block_size=50)
    envs = [ScriptedEnv(0, episode_lengths=(7, 23, 4), num_actions=4),
            ScriptedEnv(1, episode_lengths=(11, 5), num_actions=4)]
    play(mem, envs[0], 1500, rng)
    episodes = mem.episodes()          # the episodes are listed now...
    play(mem, envs[1], 600, rng)       # ...and writers evict the oldest 600 steps before the read
    monkeypatch.setattr(mem, 'episodes', lambda: episodes)
    with caplog.at_level('WARNING', logger='expreplay.minari_io'):
        dataset = export_minari(mem, 'test/evicted-v0', action_space=gym.spaces.Discrete(4))
    assert episodes.evicted > 10 and episodes.yielded > 10
    [warning] = [r.getMessage() for r in caplog.records if 'evicted' in r.getMessage()]
    assert f'{episodes.evicted} of the memory' in warning and f'({episodes.yielded} are)' in warning
    exported = list(dataset.iterate_episodes())
    assert len(exported) == episodes.yielded
    for ep in exported:
        check_whole(dict(observations=ep.observations, actions=ep.actions, rewards=ep.rewards,
                         terminations=ep.terminations, truncations=ep.truncations), envs)
