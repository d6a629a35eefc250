"""Environment adapters: one acting interface over the env APIs a runner may be given.

A runner (:class:`expreplay.runner.EnvRunner`) should not care which flavour of environment it
drives, so this module turns each of them into the same small protocol, :class:`EnvAdapter`:
``num_envs`` sub-environments stepped together, reporting per sub-environment what happened as
:class:`Step` and :class:`Reset` events.

Supported players (detected by :func:`adapt_env`):

* a gymnasium ``Env``: ``reset(seed=...) -> (obs, info)``, ``step(a) -> 5-tuple``;
* an old-gym-API env (gym < 0.26 style): ``reset() -> obs``, ``step(a) -> (obs, r, done, info)``,
  seeded through ``env.seed(s)`` when it has that method; a time-limit end is recognised from
  ``info['TimeLimit.truncated']``. An env that is neither subclass is classified by what its
  first ``reset()`` returns and checked again at its first ``step()``;
* a gymnasium ``VectorEnv`` (e.g. ``SyncVectorEnv``, ``AsyncVectorEnv`` or
  ``ale_py.vector_env.AtariVectorEnv``) in any of the three autoreset modes.

Also here: :class:`FrameFormat` (observation -> memory frame) and :class:`FrameHistory` (the
last ``history_len`` frames of each sub-environment's current episode, which is what the
predictor sees).

This module does not import gymnasium unless it is installed; nothing here imports TensorFlow.
"""

import inspect
import math
from typing import NamedTuple, Optional

import numpy as np

from ._gather import gather_frames
from .memory import as_frame

__all__ = ['Step', 'Reset', 'EnvAdapter', 'SingleEnvAdapter', 'VectorEnvAdapter', 'adapt_env',
           'FrameFormat', 'FrameHistory']

try:  # gymnasium is an optional dependency (extra 'atari'); duck typing covers the rest.
    import gymnasium as _gym
except ImportError:  # pragma: no cover - exercised only without gymnasium
    _gym = None


class Step(NamedTuple):
    """One sub-environment took the action it was given.

    ``obs`` is the observation after the step; when the episode ended with this step it is the
    final observation (the true next state, also for a truncated end). ``lives`` is the
    remaining lives reported in ``info['lives']`` (Atari), or None.
    """
    obs: np.ndarray
    reward: float
    terminated: bool
    truncated: bool
    lives: Optional[int]


class Reset(NamedTuple):
    """A sub-environment started a new episode; ``obs`` is its first observation."""
    obs: np.ndarray
    lives: Optional[int]


def _lives_from_info(info):
    lives = info.get('lives') if isinstance(info, dict) else None
    return None if lives is None else int(lives)


class EnvAdapter:
    """What a runner needs from an environment, whatever its API.

    ``num_envs`` sub-environments are stepped together. A sub-environment whose episode ended
    must not be stepped again until the adapter reports a :class:`Reset` for it; the runner
    still passes an action for it (any value), which is ignored.

    Protocol:
        ``reset(seed=None, options=None)`` -> list of ``num_envs`` :class:`Reset`: start every
        sub-environment; ``seed`` is an int (a vector env seeds its sub-envs ``seed + i``), or
        for a vector env a list of one seed (or None) per sub-environment; ``options`` goes to
        ``reset(options=...)``.
        ``step(actions)`` -> list of ``num_envs`` events, a :class:`Step`, a :class:`Reset`
        (a vector env in NEXT_STEP autoreset mode resets a finished sub-environment on the
        call after its end and ignores its action), or None (no news for that sub-environment).
        ``reset_finished()`` -> dict {index: :class:`Reset`} for the sub-environments whose
        episode ended in the last ``step`` and that can be reset right now. Called after the
        runner has stored the step, so that a reset failure can not lose a stepped transition.
        ``reset_finished(starts)`` with ``starts`` = {index: (seed, options)} resets those
        sub-environments with that seed and those options; only meaningful when
        ``controls_resets`` is True (the adapter, not the env, decides when to reset).
        ``close()``.
        ``can_clone_state``, ``clone_state(i, include_rng=False)``,
        ``restore_state(i, state, prev_action=None)``: emulator snapshots (ALE), for restart
        points; ``prev_action`` is the action of the step that led to the state.
    """

    num_envs = 1
    num_actions = None   # from the action space when it is Discrete, else None
    controls_resets = True   # False when the env resets finished sub-envs by itself (autoreset)

    def reset(self, seed=None, options=None):
        raise NotImplementedError

    def step(self, actions):
        raise NotImplementedError

    def reset_finished(self, starts=None):
        return {}

    @property
    def can_clone_state(self):
        return False

    def clone_state(self, i, include_rng=False):
        raise NotImplementedError(f"{type(self).__name__} can not clone emulator states")

    def restore_state(self, i, state, prev_action=None):
        raise NotImplementedError(f"{type(self).__name__} can not restore emulator states")

    def close(self):
        close = getattr(self.player, 'close', None)
        if callable(close):
            close()


def _discrete_n(space):
    n = getattr(space, 'n', None)
    return None if n is None else int(n)


def _describe(player):
    return f"{type(player).__module__}.{type(player).__qualname__}"


class SingleEnvAdapter(EnvAdapter):
    """One environment with the gymnasium API or the old gym API (detected).

    Args:
        player: the environment.
        api: ``'gymnasium'``, ``'old'``, or None to detect it from the first ``reset()``.
    """

    num_envs = 1

    def __init__(self, player, api=None):
        self.player = player
        self.api = api
        self.num_actions = _discrete_n(getattr(player, 'action_space', None))
        self._done = False
        try:
            params = inspect.signature(player.reset).parameters
            self._reset_takes_seed = 'seed' in params or any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        except (TypeError, ValueError):  # builtins without a signature
            self._reset_takes_seed = False

    def reset(self, seed=None, options=None):
        self._done = False
        return [self._reset(seed, options)]

    def _reset(self, seed, options=None):
        p = self.player
        if self.api == 'gymnasium' or (self.api is None and self._reset_takes_seed):
            kwargs = {}
            if seed is not None:
                kwargs['seed'] = seed
            if options is not None:
                kwargs['options'] = options
            result = p.reset(**kwargs)
        else:
            if options is not None:
                raise TypeError(f"player {_describe(p)} has the old gym API: its reset() takes no "
                                f"options (got {options!r})")
            if seed is not None and callable(getattr(p, 'seed', None)):
                p.seed(seed)
            result = p.reset()
        is_new = isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)
        if self.api is None:
            self.api = 'gymnasium' if is_new else 'old'
        if self.api == 'gymnasium':
            if not is_new:
                raise TypeError(f"player {_describe(p)}: reset() returned {type(result).__name__}, "
                                "expected (obs, info) from a gymnasium-API env")
            obs, info = result
            return Reset(obs, _lives_from_info(info))
        return Reset(result, None)

    def step(self, actions):
        if self._done:
            raise RuntimeError("SingleEnvAdapter.step after the episode ended without a reset")
        result = self.player.step(int(actions[0]))
        if not isinstance(result, tuple) or len(result) not in (4, 5):
            raise TypeError(f"player {_describe(self.player)}: step() returned "
                            f"{type(result).__name__} of length {len(result) if isinstance(result, tuple) else '?'}, "
                            "expected a 5-tuple (gymnasium) or a 4-tuple (old gym)")
        if (len(result) == 5) != (self.api == 'gymnasium'):
            raise TypeError(f"player {_describe(self.player)}: reset() and step() disagree on the API "
                            f"(reset looked {self.api!r}, step returned a {len(result)}-tuple)")
        if len(result) == 5:
            obs, reward, terminated, truncated, info = result
            terminated, truncated = bool(terminated), bool(truncated)
        else:
            obs, reward, done, info = result
            # Old gym's TimeLimit marks a time-limit end in info; such an end bootstraps.
            truncated = bool(done) and bool(isinstance(info, dict) and info.get('TimeLimit.truncated', False))
            terminated = bool(done) and not truncated
        self._done = terminated or truncated
        return [Step(obs, float(reward), terminated, truncated, _lives_from_info(info))]

    def reset_finished(self, starts=None):
        if not self._done:
            return {}
        self._done = False
        # Without a start: no seed, so the env continues its own random sequence.
        seed, options = (starts or {}).get(0, (None, None))
        return {0: self._reset(seed, options)}

    def _ale(self):
        # Gymnasium's (and old gym's) Atari envs expose their ALEInterface as `unwrapped.ale`.
        ale = getattr(getattr(self.player, 'unwrapped', None), 'ale', None)
        return ale if callable(getattr(ale, 'cloneState', None)) else None

    @property
    def can_clone_state(self):
        return self._ale() is not None

    def clone_state(self, i, include_rng=False):
        ale = self._ale()
        if ale is None:
            return super().clone_state(i, include_rng)
        return ale.cloneState(include_rng=include_rng)

    def restore_state(self, i, state, prev_action=None):
        ale = self._ale()
        if ale is None:
            return super().restore_state(i, state, prev_action)
        sticky = ale.getFloat('repeat_action_probability')
        if prev_action is not None and sticky > 0:
            self._prime_sticky_action(ale, int(prev_action), sticky)
        ale.restoreState(state)

    def _prime_sticky_action(self, ale, action, sticky):
        """Make ``action`` the one that sticky actions repeat, as it was when the state was saved.

        ALE keeps that action outside its saved state (``StellaEnvironment::m_actions``, set to
        NOOP by the reset), so a restore alone would repeat NOOP where the original repeated its
        last action. Each emulated frame takes the given action with probability ``1 - sticky``:
        act it until it has taken with certainty (< 1e-9 left); the restore that follows
        overwrites those frames (and the RNG, if the state holds it).
        """
        unwrapped = self.player.unwrapped
        action_set = getattr(unwrapped, '_action_set', None)
        if action_set is None:
            action_set = ale.getMinimalActionSet()
        frames = 1 if sticky >= 1.0 else min(200, math.ceil(math.log(1e-9) / math.log(sticky)))
        for _ in range(frames):
            ale.act(action_set[action])


class VectorEnvAdapter(EnvAdapter):
    """A gymnasium ``VectorEnv`` (any autoreset mode).

    * NEXT_STEP (gymnasium's default, ``AtariVectorEnv``'s): the step that ends an episode
      returns the final observation; the next ``step`` resets that sub-environment, ignores
      its action and returns the reset observation -> a :class:`Reset` event in ``step``.
    * SAME_STEP: the ending step returns the reset observation and puts the final one in
      ``info['final_obs']`` -> a :class:`Step` with the final observation, and the
      :class:`Reset` from :meth:`reset_finished`.
    * DISABLED: :meth:`reset_finished` resets the finished sub-environments with
      ``reset(options={'reset_mask': ...})``.

    Envs that return only part of the batch per step (``AtariVectorEnv(batch_size < num_envs)``)
    are refused.
    """

    def __init__(self, player):
        self.player = player
        self.num_envs = int(player.num_envs)
        batch = getattr(player, 'batch_size', self.num_envs)
        if isinstance(batch, (int, np.integer)) and 0 < batch != self.num_envs:
            raise ValueError(f"player {_describe(player)} returns batches of {batch} of its {self.num_envs} "
                             "sub-environments per step; use batch_size == num_envs")
        space = getattr(player, 'single_action_space', None)
        self.num_actions = _discrete_n(space)
        mode = (getattr(player, 'metadata', None) or {}).get('autoreset_mode', 'NextStep')
        self.mode = getattr(mode, 'value', mode)
        if self.mode not in ('NextStep', 'SameStep', 'Disabled'):
            raise ValueError(f"player {_describe(player)}: unknown autoreset_mode {mode!r}")
        self._ended = np.zeros(self.num_envs, bool)   # episode ended, no reset seen yet
        self._same_step_resets = {}
        self.controls_resets = self.mode == 'Disabled'
        # ale_py's AtariVectorEnv takes seeds as an array over the sub-envs being reset (-1:
        # unseeded); gymnasium's vector envs as a list over all sub-envs (None: unseeded).
        self._ale_seeds = type(player).__module__.startswith('ale_py')

    def _seed_arg(self, seeds, mask=None):
        """The ``seed=`` argument of the player's reset for per-sub-env ``seeds`` (or an int)."""
        if seeds is None or isinstance(seeds, (int, np.integer)):
            return seeds
        if len(seeds) != self.num_envs:
            raise ValueError(f"{len(seeds)} seeds for {self.num_envs} sub-environments")
        if all(s is None for s in seeds):
            return None
        if self._ale_seeds:
            picked = [s for i, s in enumerate(seeds) if mask is None or mask[i]]
            return np.array([-1 if s is None else int(s) for s in picked], np.int64)
        return [None if s is None else int(s) for s in seeds]

    def reset(self, seed=None, options=None):
        kwargs = {'seed': self._seed_arg(seed)}
        if options is not None:
            kwargs['options'] = dict(options)   # a copy: vector envs pop keys from it
        obs, info = self.player.reset(**kwargs)
        self._ended[:] = False
        self._same_step_resets = {}
        lives = self._lives(info)
        return [Reset(obs[i], lives[i]) for i in range(self.num_envs)]

    def _lives(self, info):
        """Per-sub-environment lives from a batched info dict (gymnasium masks absent keys)."""
        lives = info.get('lives') if isinstance(info, dict) else None
        if lives is None:
            return [None] * self.num_envs
        mask = info.get('_lives')
        return [int(lives[i]) if mask is None or mask[i] else None for i in range(self.num_envs)]

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.player.step(np.asarray(actions))
        lives = self._lives(info)
        events = []
        for i in range(self.num_envs):
            if self._ended[i]:
                if self.mode == 'NextStep':
                    # Autoreset step: the action was ignored and obs[i] is the reset observation.
                    self._ended[i] = False
                    events.append(Reset(obs[i], lives[i]))
                else:
                    events.append(None)
                continue
            term, trunc = bool(terminated[i]), bool(truncated[i])
            final_obs = obs[i]
            if (term or trunc) and self.mode == 'SameStep':
                final_obs = info['final_obs'][i]
                final_info = info.get('final_info', {})
                self._same_step_resets[i] = Reset(obs[i], lives[i])
                lives[i] = self._lives(final_info)[i] if final_info else None
            events.append(Step(final_obs, float(reward[i]), term, trunc, lives[i]))
            self._ended[i] = term or trunc
        return events

    def reset_finished(self, starts=None):
        if self.mode == 'SameStep':
            resets, self._same_step_resets = self._same_step_resets, {}
            self._ended[list(resets)] = False
            return resets
        if self.mode == 'Disabled' and self._ended.any():
            if not starts:
                mask = self._ended.copy()
                obs, info = self.player.reset(options={'reset_mask': mask})
                lives = self._lives(info)
                self._ended[:] = False
                return {int(i): Reset(obs[i], lives[i]) for i in np.flatnonzero(mask)}
            return self._reset_masked(starts)
        return {}

    def _reset_masked(self, starts):
        """Reset the ended sub-envs with their own seeds; one reset call per distinct options."""
        groups = []                       # [(options, [indices])]: options are compared with ==
        for i in np.flatnonzero(self._ended):
            seed, options = starts.get(int(i), (None, None))
            for opts, members in groups:
                if opts == options:
                    members.append(int(i))
                    break
            else:
                groups.append((options, [int(i)]))
        out = {}
        for options, members in groups:
            mask = np.zeros(self.num_envs, bool)
            mask[members] = True
            seeds = [starts.get(i, (None, None))[0] if mask[i] else None for i in range(self.num_envs)]
            obs, info = self.player.reset(seed=self._seed_arg(seeds, mask),
                                          options=dict(options or {}, reset_mask=mask))
            lives = self._lives(info)
            self._ended[mask] = False
            out.update({i: Reset(obs[i], lives[i]) for i in members})
        return out


def _is_vector_env(player):
    if _gym is not None and isinstance(player, _gym.vector.VectorEnv):
        return True
    # Other VectorEnv look-alikes (a wrapper that does not subclass it, envpool-style envs).
    return hasattr(player, 'num_envs') and hasattr(player, 'single_action_space')


def adapt_env(player):
    """The :class:`EnvAdapter` for ``player``; TypeError naming ``player`` if it is no env."""
    if isinstance(player, EnvAdapter):
        return player
    if _is_vector_env(player):
        return VectorEnvAdapter(player)
    if not (callable(getattr(player, 'reset', None)) and callable(getattr(player, 'step', None))):
        raise TypeError(f"player must be a gymnasium Env, an old-gym-API env (reset/step), or a "
                        f"gymnasium VectorEnv; got {_describe(player)} without reset()/step()")
    if _gym is not None and isinstance(player, _gym.Env):
        return SingleEnvAdapter(player, api='gymnasium')
    return SingleEnvAdapter(player)


class FrameFormat:
    """Turns an observation into a frame the memory stores: ``state_shape``, ``dtype``.

    A size-preserving reshape is allowed (``AtariVectorEnv(stack_num=1)`` gives (1, 84, 84)
    per sub-environment for a (84, 84) memory); a dtype change only where no data is lost.
    """

    def __init__(self, state_shape, dtype):
        self.state_shape = tuple(state_shape)
        self.dtype = np.dtype(dtype)
        self._size = int(np.prod(self.state_shape))

    def __call__(self, obs):
        arr = np.asarray(obs)
        if arr.shape != self.state_shape and arr.size == self._size:
            arr = arr.reshape(self.state_shape)
        # The memory's own rule, so that the runner refuses exactly what the memory would.
        return as_frame(arr, self.state_shape, self.dtype, 'player observation').astype(
            self.dtype, copy=False)


class FrameHistory:
    """The last ``history_len`` frames of each sub-environment's current episode.

    Kept channels-first and oldest first (cheap to shift), handed out channels-last
    ``(n, *state_shape, history_len)``, zero-padded before the episode's first frame: the
    same frames the memory gives the learner as ``comb_state[..., :-1]`` for that step.
    """

    def __init__(self, num_envs, state_shape, history_len, dtype):
        self.history_len = int(history_len)
        self._frames = np.zeros((num_envs, self.history_len) + tuple(state_shape), dtype)

    def start(self, i, frame):
        """Begin a new episode in slot ``i`` with its first frame."""
        self._frames[i, :-1] = 0
        self._frames[i, -1] = frame

    def push(self, i, frame):
        """Append the next frame of slot ``i``'s episode."""
        self._frames[i, :-1] = self._frames[i, 1:]
        self._frames[i, -1] = frame

    def latest(self, i):
        """The newest frame of slot ``i`` (a view)."""
        return self._frames[i, -1]

    def states(self, indices):
        """Stacked states of the given slots: ``(len(indices), *state_shape, history_len)``."""
        h = self.history_len
        indices = np.asarray(indices, np.intp)
        # The same channels-last gather the memory samples with: rows of history slots.
        frames = self._frames.reshape((-1,) + self._frames.shape[2:])
        return gather_frames(frames, indices[:, None] * h + np.arange(h), 'NHWC')
