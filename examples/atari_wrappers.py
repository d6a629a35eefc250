"""Atari preprocessing for DQN (Mnih et al. 2015; Machado et al. 2018), on gymnasium + ale-py.

What the agent sees, and why:

* **frameskip 4**: the agent picks an action every 4th frame and the action repeats in
  between. Four times fewer decisions per second of play, and consecutive frames barely differ.
* **max over the last two frames**: Atari hardware draws some sprites only on every other frame
  (they flicker); the per-pixel max of the last two frames of a skip shows them all.
* **grayscale, 84x84** (opencv, area interpolation): colour adds little for these games, and an
  84x84 byte frame is 7 KB, which is what makes a replay memory of a million frames possible.
* **up to 30 no-op starts**: the emulator is deterministic; a random number of no-op actions
  after reset gives every episode a different start, so the agent can not memorise one.
* **fire on reset**: games such as Breakout wait for FIRE before anything moves. Pressing it
  for the agent skips a useless exploration problem. It is pressed again after a lost life.
* **scores per game**: an episode here is a whole game (all lives), so the reported score is the
  game score. Treating a lost life as terminal *for training* (it speeds learning) is an option
  of the replay runner, which reads ``info['lives']``; it is not done here.

Frames are single 84x84 frames: the replay memory stacks the history (4 frames), so each frame
is stored once instead of four times.

``make_vector_env`` builds ale-py's C++ ``AtariVectorEnv`` with the same preprocessing: its
sub-environments step in native threads that release the GIL, which Python threads can not do.
"""

if __name__ == '__main__':   # a module the examples import, not a program: --help says so
    import module_help
    module_help.answer(__doc__, 'atari_wrappers.py', 'dqn_atari.py')

import re

import cv2
import gymnasium as gym
import numpy as np

import ale_py

gym.register_envs(ale_py)   # makes the 'ALE/...' ids known to gymnasium

FRAME_SHAPE = (84, 84)


class AtariPreprocess(gym.Wrapper):
    """Frame skip with max-pooling, grayscale 84x84, no-op starts and fire-on-reset.

    Wrap an ALE env created with ``frameskip=1`` (this wrapper does the skipping, so that it
    can see the last two frames of each skip). Observations are ``uint8`` arrays of shape
    ``(84, 84)``; ``info['lives']`` is passed through.
    """

    def __init__(self, env, frame_skip=4, noop_max=30, fire_reset=True, size=FRAME_SHAPE):
        super().__init__(env)
        if env.unwrapped._frameskip != 1:
            raise ValueError("create the env with frameskip=1: AtariPreprocess skips frames itself")
        self.ale = env.unwrapped.ale
        self.frame_skip = frame_skip
        self.noop_max = noop_max
        self.size = tuple(size)
        meanings = env.unwrapped.get_action_meanings()
        self.fire = fire_reset and len(meanings) >= 3 and meanings[1] == 'FIRE'
        self._action_set = env.unwrapped._action_set      # action index -> the ALE's action
        h, w = self.ale.getScreenDims()
        self._screens = np.zeros((2, h, w), np.uint8)   # the last two raw frames of a skip
        self._lives = 0
        self.observation_space = gym.spaces.Box(0, 255, self.size, np.uint8)

    def _frame(self):
        pooled = np.maximum(self._screens[0], self._screens[1])
        # cv2 takes (width, height); INTER_AREA averages the pixels it shrinks away.
        return cv2.resize(pooled, self.size[::-1], interpolation=cv2.INTER_AREA)

    def reset(self, *, seed=None, options=None):
        _, info = self.env.reset(seed=seed, options=options)
        noops = int(self.env.unwrapped.np_random.integers(1, self.noop_max + 1)) if self.noop_max else 0
        for _ in range(noops):
            _, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                _, info = self.env.reset()
        if self.fire:
            info = self._press_fire(info)
        self._lives = self.ale.lives()
        self.ale.getScreenGrayscale(self._screens[0])
        self._screens[1] = self._screens[0]
        return self._frame(), info

    def _press_fire(self, info):
        # FIRE, then another action, as the OpenAI baselines wrapper: some games need the
        # button released before it counts.
        for action in (1, 2):
            _, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                _, info = self.env.reset()
        return info

    def step(self, action):
        # The skipped frames go straight to the emulator (ale.act, sticky actions included)
        # rather than through the wrapped env's step: that would copy out an RGB screen and
        # build an info dict for each of them, only for them to be thrown away. The ends and
        # the info are the wrapped env's own. (ale.act keeps the GIL while it emulates: Python
        # threads stepping these envs take turns; the vector env below does not.)
        ale, code = self.ale, self._action_set[action]
        total, terminated, truncated = 0.0, False, False
        for t in range(self.frame_skip):
            total += ale.act(code)
            terminated = ale.game_over(with_truncation=False)
            truncated = ale.game_truncated()
            if t >= self.frame_skip - 2:   # keep the last two frames for the max-pool
                self.ale.getScreenGrayscale(self._screens[t - self.frame_skip + 2])
            if terminated or truncated:
                # The skip was cut short: the newest frame is the final one.
                self.ale.getScreenGrayscale(self._screens[1])
                if t < self.frame_skip - 2:
                    self._screens[0] = self._screens[1]
                break
        lives = self.ale.lives()
        info = {'lives': lives, 'episode_frame_number': ale.getEpisodeFrameNumber(),
                'frame_number': ale.getFrameNumber()}
        if self.fire and lives < self._lives and not (terminated or truncated):
            info = self._press_fire(info)   # relaunch the ball after a lost life
            self.ale.getScreenGrayscale(self._screens[1])
            self._screens[0] = self._screens[1]
        self._lives = lives
        return self._frame(), total, terminated, truncated, info


def make_env(env_id='ALE/Pong-v5', *, sticky=0.25, noop_max=30, render_mode=None,
             max_episode_steps=None):
    """One preprocessed ALE environment (observations ``(84, 84)`` uint8).

    ``max_episode_steps`` cuts a game after that many agent steps (the ALE itself ends a game
    after 108k frames, 27k agent steps).

    ``sticky`` is the probability that the emulator repeats the previous action instead of the
    chosen one (the v5 default, 0.25, per Machado et al.); 0 gives the Nature DQN setting.
    """
    env = gym.make(env_id, frameskip=1, repeat_action_probability=sticky, render_mode=render_mode)
    env = AtariPreprocess(env, noop_max=noop_max)
    if max_episode_steps:
        # Outside the preprocessing, so that it counts agent steps, not emulator frames; a
        # cut game is *truncated*, which the replay memory bootstraps.
        env = gym.wrappers.TimeLimit(env, max_episode_steps)
    return env


def rom_name(env_id):
    """'ALE/SpaceInvaders-v5' -> 'space_invaders' (the name AtariVectorEnv wants)."""
    base = env_id.split('/')[-1].split('-')[0].replace('NoFrameskip', '')
    return re.sub(r'(?<!^)(?=[A-Z])', '_', base).lower()


def make_vector_env(env_id, num_envs, *, sticky=0.25, noop_max=30, num_threads=0,
                    reward_clipping=False):
    """ale-py's native vector env with the same preprocessing, one frame per observation.

    Scores stay per game (no episodic life), rewards are not clipped (the model clips them
    for the loss; the scores must stay the game's) unless ``reward_clipping`` (n-step replay
    clips each step before it is stored).
    """
    from ale_py.vector_env import AtariVectorEnv
    return AtariVectorEnv(
        rom_name(env_id), num_envs, num_threads=num_threads,
        repeat_action_probability=sticky, noop_max=noop_max,
        img_height=FRAME_SHAPE[0], img_width=FRAME_SHAPE[1], grayscale=True,
        stack_num=1, frameskip=4, maxpool=True, use_fire_reset=True,
        episodic_life=False, reward_clipping=reward_clipping)


def make_envpool(env_id, num_envs, *, batch_size=None, sticky=0.25, noop_max=30, seed=0,
                 reward_clip=False):
    """EnvPool's C++ Atari pool with the same preprocessing, one frame per observation.

    ``batch_size`` < ``num_envs`` makes it asynchronous: ``recv`` returns the first
    ``batch_size`` envs that are ready while the others keep stepping in EnvPool's threads, so
    the runner predicts for one part while the engine steps the rest (default: half).
    ``reward_clip``: EnvPool clips every reward to its sign (n-step replay clips each step
    before it is stored; a wrapper would hide ``recv``/``send``).
    """
    import envpool
    return envpool.make(
        env_id.split('/')[-1], env_type='gymnasium', num_envs=num_envs,
        batch_size=batch_size or max(1, num_envs // 2), seed=seed,
        img_height=FRAME_SHAPE[0], img_width=FRAME_SHAPE[1], gray_scale=True, stack_num=1,
        frame_skip=4, noop_max=noop_max, repeat_action_probability=sticky,
        episodic_life=False, reward_clip=reward_clip, use_fire_reset=True)
