"""A fast scripted environment whose observations say where they come from.

Use it to test anything that moves transitions from an environment to a learner (runners,
memories, data flows) end to end: every observation encodes ``(env_id, episode, step)``, every
reward is a known function of the step and the action, and the env logs what it emitted, so a
sampled transition can be checked frame by frame with :func:`check_batch`.

Observation (``uint8``, shape ``obs_shape``, default ``(6,)``; any shape with >= 6 elements):
the first six elements of the flattened frame are ``[255, env_id, episode % 256, episode // 256,
step % 256, step // 256]``, the rest zeros. ``step`` counts the steps taken in the current game
(0 for the observation ``reset()`` returns); ``episode`` counts this env's resets (0 first).
The leading 255 tells a real frame from the zero padding before an episode's start:
``decode(zeros)`` is None.

Dynamics: the action taken from the observation of step ``t`` earns ``reward_for(t, action)``
and leads to the observation of step ``t + 1``. Episode ``e`` lasts
``episode_lengths[e % len(episode_lengths)]`` steps and ends as
``ends[e % len(ends)]`` (``'terminated'`` or ``'truncated'``; the final observation is returned
either way). With ``lives=L`` the env reports ``info['lives'] = L - t // life_every`` after step
``t`` and terminates when no life is left (whichever end comes first).

APIs: :class:`ScriptedEnv` is a ``gymnasium.Env`` (``reset(seed=)`` -> ``(obs, info)``, 5-tuple
``step``); :class:`OldApiScriptedEnv` has the old gym API (``seed(s)``, ``reset() -> obs``,
``step -> (obs, reward, done, info)``, ``info['TimeLimit.truncated']`` on a truncated end). Both
work inside ``gymnasium.vector.SyncVectorEnv`` (the gymnasium one) with any autoreset mode.

Fault injection:
    ``fail_at_step=k``: the k-th call of ``step()`` (1-based, over the env's life) raises
        :class:`ScriptedEnvError` instead of stepping.
    ``reset_gate=threading.Event()``: reset number ``hang_on_reset`` (1-based; None: every
        reset) sets ``env.in_reset`` and then blocks until the test sets the gate (a hang in
        reset that the test can release).
    ``step_hook=f``: ``f(env, action)`` is called at the start of every ``step()`` (to gate or
        count steps from a test).

Records (append-only, written by the thread that steps the env):
    ``transitions[(episode, t)] = (action, reward, terminated, truncated, lives_after)`` for the
    step taken from the observation of step ``t``; ``seeds``: the seed of every reset (None when
    not seeded); ``resets``, ``steps_taken``: counters.
"""

import threading

import gymnasium as gym
import numpy as np

__all__ = ['ScriptedEnv', 'OldApiScriptedEnv', 'ScriptedEnvError', 'encode', 'decode',
           'reward_for', 'check_batch', 'MARK']

MARK = 255


class ScriptedEnvError(RuntimeError):
    """Raised by a scripted env's ``step()`` at ``fail_at_step``."""


def encode(env_id, episode, step, obs_shape=(6,)):
    """The observation of ``step`` in ``episode`` of env ``env_id``."""
    frame = np.zeros(int(np.prod(obs_shape)), np.uint8)
    frame[:6] = [MARK, env_id, episode % 256, episode // 256, step % 256, step // 256]
    return frame.reshape(obs_shape)


def decode(frame):
    """``(env_id, episode, step)`` of a frame made by :func:`encode`; None for a zero frame."""
    flat = np.asarray(frame).reshape(-1)
    if not flat.any():
        return None
    if flat[0] != MARK or flat[6:].any():
        raise AssertionError(f"not a scripted frame: {flat[:8]}")
    v = flat[:6].astype(int)
    return int(v[1]), int(v[2] + 256 * v[3]), int(v[4] + 256 * v[5])


def reward_for(step, action):
    """The reward of ``action`` taken from the observation of ``step``."""
    return float(10 * int(action) + step % 7)


def _cycle(value, k):
    if isinstance(value, (list, tuple)):
        return value[k % len(value)]
    return value


class _ScriptedCore:
    """The scripted dynamics shared by both API flavours."""

    def _setup(self, env_id, episode_lengths, ends, num_actions, obs_shape, lives, life_every,
               fail_at_step, reset_gate, hang_on_reset, step_hook):
        if not 0 <= env_id < 256:
            raise ValueError("env_id must fit a byte")
        self.env_id = env_id
        self.episode_lengths = episode_lengths
        self.ends = ends
        self.obs_shape = tuple(obs_shape)
        self.lives = lives
        self.life_every = life_every
        self.fail_at_step = fail_at_step
        self.reset_gate = reset_gate
        self.hang_on_reset = hang_on_reset
        self.step_hook = step_hook
        self.in_reset = threading.Event()
        self.action_space = gym.spaces.Discrete(num_actions)
        self.observation_space = gym.spaces.Box(0, 255, self.obs_shape, np.uint8)
        self.transitions = {}
        self.seeds = []
        self.resets = 0
        self.steps_taken = 0
        self.episode = -1
        self.t = 0
        self._over = True

    def _lives_now(self):
        return None if self.lives is None else self.lives - self.t // self.life_every

    def _info(self):
        lives = self._lives_now()
        return {} if lives is None else {'lives': lives}

    def _do_reset(self, seed):
        self.resets += 1
        self.seeds.append(seed)
        if self.reset_gate is not None and self.hang_on_reset in (None, self.resets):
            self.in_reset.set()
            self.reset_gate.wait()
        self.episode += 1
        self.t = 0
        self._over = False
        return encode(self.env_id, self.episode, 0, self.obs_shape), self._info()

    def _do_step(self, action):
        if self.step_hook is not None:
            self.step_hook(self, action)
        self.steps_taken += 1
        if self.fail_at_step is not None and self.steps_taken == self.fail_at_step:
            raise ScriptedEnvError(f"scripted failure of env {self.env_id} at step call {self.steps_taken}")
        if self._over:
            raise RuntimeError(f"scripted env {self.env_id}: step() after the episode ended, without reset()")
        action = int(action)
        if not self.action_space.contains(action):
            raise ValueError(f"invalid action {action}")
        t = self.t
        reward = reward_for(t, action)
        self.t += 1
        length = _cycle(self.episode_lengths, self.episode)
        lives = self._lives_now()
        terminated = truncated = False
        if lives is not None and lives <= 0:
            terminated = True
        elif self.t >= length:
            terminated = _cycle(self.ends, self.episode) == 'terminated'
            truncated = not terminated
        self._over = terminated or truncated
        self.transitions[(self.episode, t)] = (action, reward, terminated, truncated, lives)
        obs = encode(self.env_id, self.episode, self.t, self.obs_shape)
        return obs, reward, terminated, truncated, self._info()


_DEFAULTS = dict(episode_lengths=(5, 3, 8), ends=('terminated', 'truncated'), num_actions=3,
                 obs_shape=(6,), lives=None, life_every=4, fail_at_step=None, reset_gate=None,
                 hang_on_reset=None, step_hook=None)


class ScriptedEnv(_ScriptedCore, gym.Env):
    """The scripted env with the gymnasium API (see the module docstring for the arguments)."""

    metadata = {'render_modes': []}

    def __init__(self, env_id=0, **kwargs):
        unknown = set(kwargs) - set(_DEFAULTS)
        if unknown:
            raise TypeError(f"unknown arguments {sorted(unknown)}")
        self._setup(env_id, **{**_DEFAULTS, **kwargs})
        self.closed = False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._do_reset(seed)

    def step(self, action):
        return self._do_step(action)

    def close(self):
        self.closed = True
        super().close()


class OldApiScriptedEnv(_ScriptedCore):
    """The scripted env with the old gym API; not a ``gymnasium.Env`` (detected by behaviour)."""

    def __init__(self, env_id=0, **kwargs):
        unknown = set(kwargs) - set(_DEFAULTS)
        if unknown:
            raise TypeError(f"unknown arguments {sorted(unknown)}")
        self._setup(env_id, **{**_DEFAULTS, **kwargs})
        self._next_seed = None
        self.closed = False

    def seed(self, seed=None):
        self._next_seed = seed
        return [seed]

    def reset(self):
        seed, self._next_seed = self._next_seed, None
        return self._do_reset(seed)[0]

    def step(self, action):
        obs, reward, terminated, truncated, info = self._do_step(action)
        if truncated:
            info = dict(info, **{'TimeLimit.truncated': True})
        return obs, reward, terminated or truncated, info

    def close(self):
        self.closed = True


def _as_comb(batch, layout):
    """A 1-step SampleBatch as tensorpack's 4-list, after checking what the 4-list can not show."""
    axis = -1 if layout == 'NHWC' else 1
    state, next_state = np.asarray(batch.state), np.asarray(batch.next_state)
    older = np.take(next_state, range(state.shape[axis] - 1), axis=axis)
    newer = np.take(state, range(1, state.shape[axis]), axis=axis)
    # Where the state's episode ended with this step, the next state is its final observation:
    # its history is still the same episode's frames.
    assert np.array_equal(older, newer), "next_state's older frames are not the state's newer ones"
    assert np.array_equal(np.asarray(batch.discount) == 0, np.asarray(batch.is_over)), \
        "discount is not 0 exactly on the terminated steps"
    newest = np.take(next_state, [next_state.shape[axis] - 1], axis=axis)
    return [np.concatenate([state, newest], axis=axis), batch.action, batch.reward, batch.is_over]


def check_batch(batch, envs, history_len, layout='NHWC', life_loss_terminal=False):
    """Check every transition of a ``sample_batch`` result against what the envs emitted.

    Args:
        batch: ``[comb_state, action, reward, isOver]`` as returned by ``sample_batch``, or a
            1-step SampleBatch (a stream's batch), checked the same way: its state with the
            next state's newest frame, and its own check that the next state's older frames
            are the state's newer ones and that ``discount`` is 0 exactly where ``is_over``.
        envs: ``{env_id: env}`` of the scripted envs that produced the data.
        history_len: frames per state.
        life_loss_terminal: the data was written with life losses as episode ends (frames from
            before the last lost life are then zeros, and a life-losing step has isOver).

    Checks, per transition: the next frame is the observation after the step; the history
    frames are the preceding observations of the same episode (same life when
    ``life_loss_terminal``), zeros before its start; action, reward and isOver match the env's
    log (isOver only for terminated steps, so a truncated end bootstraps). Returns the number
    of transitions checked; raises AssertionError with the details on the first mismatch.
    """
    if hasattr(batch, 'next_state'):
        batch = _as_comb(batch, layout)
    comb, action, reward, is_over = batch
    comb = np.asarray(comb)
    if layout == 'NHWC':
        comb = np.moveaxis(comb, -1, 1)    # -> (B, history_len + 1, *shape)
    assert comb.shape[1] == history_len + 1, comb.shape
    for b in range(len(comb)):
        nxt = decode(comb[b, -1])
        assert nxt is not None, f"sample {b}: the next frame is zeros"
        env_id, ep, t1 = nxt
        t = t1 - 1
        assert t >= 0, f"sample {b}: next frame is a reset observation {nxt}"
        env = envs[env_id]
        rec = env.transitions.get((ep, t))
        assert rec is not None, f"sample {b}: env {env_id} never stepped from episode {ep} step {t}"
        act, rew, term, trunc, lives_after = rec
        start = 0
        if life_loss_terminal and env.lives is not None:
            # The training episode began at the last step that cost a life, at or before t.
            start = (t // env.life_every) * env.life_every
        for k in range(history_len):
            want_step = t - (history_len - 1 - k)
            got = decode(comb[b, k])
            want = (env_id, ep, want_step) if want_step >= start else None
            assert got == want, (f"sample {b} (env {env_id} episode {ep} step {t}): history frame {k} "
                                 f"is {got}, expected {want}")
        assert int(action[b]) == act, f"sample {b}: action {action[b]}, env took {act} at {(env_id, ep, t)}"
        assert float(reward[b]) == rew, f"sample {b}: reward {reward[b]}, env gave {rew} at {(env_id, ep, t)}"
        want_over = term
        if life_loss_terminal and env.lives is not None and t1 % env.life_every == 0:
            want_over = True
        assert bool(is_over[b]) == want_over, (f"sample {b}: isOver {is_over[b]}, expected {want_over} "
                                               f"(terminated={term}, truncated={trunc}) at {(env_id, ep, t)}")
    return len(comb)
