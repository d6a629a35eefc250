"""Environment adapters: one acting interface over the env APIs a runner may be given.

A runner (:class:`expreplay.acting.group.EnvRunner`) should not care which flavour of environment it
drives, so this module turns each of them into the same small protocol, :class:`EnvAdapter`:
``num_envs`` sub-environments, whose results come back as arrays (:class:`Results`), so that
the acting path handles a batch of sub-environments with numpy operations instead of a Python
loop over them.

Supported players (detected by :func:`adapt_env`):

* a gymnasium ``Env``: ``reset(seed=...) -> (obs, info)``, ``step(a) -> 5-tuple``;
* an old-gym-API env (gym < 0.26 style): ``reset() -> obs``, ``step(a) -> (obs, r, done, info)``,
  seeded through ``env.seed(s)`` when it has that method; a time-limit end is recognised from
  ``info['TimeLimit.truncated']``. An env that is neither subclass is classified by what its
  first ``reset()`` returns and checked again at its first ``step()``;
* a gymnasium ``VectorEnv`` (e.g. ``SyncVectorEnv``, ``AsyncVectorEnv``,
  ``ale_py.vector_env.AtariVectorEnv``, a synchronous EnvPool) in any of the three autoreset
  modes;
* an asynchronous engine with EnvPool's ``async_reset()`` / ``recv()`` / ``send(actions,
  env_id)`` (EnvPool with ``batch_size < num_envs``, :class:`expreplay.ray.RayVectorEnv`):
  :class:`AsyncVectorAdapter`. ``recv`` returns the sub-environments that are ready; their
  next actions go back with ``send`` while the engine steps the others.

Also here: :class:`FrameFormat` (observations -> memory frames) and :class:`FrameHistory` (the
last ``history_len`` frames of each sub-environment's current episode, which is what the
predictor sees).

This module does not import gymnasium unless it is installed; nothing here imports TensorFlow.
"""

import inspect
import math
import warnings
from typing import NamedTuple, Optional

import numpy as np

from .._checks import check_bool
from ..storage._gather import gather_history
from ..storage.memory import as_frame, check_frames, check_reward, check_rewards

try:  # optional, built by setup.py when a C compiler is available
    from ..storage import _acting_ext
except ImportError:
    _acting_ext = None

__all__ = ['Results', 'EnvAdapter', 'SingleEnvAdapter', 'VectorEnvAdapter', 'AsyncVectorAdapter',
           'adapt_env', 'FrameFormat', 'FrameHistory', 'NO_LIVES']

try:  # gymnasium is an optional dependency (extra 'atari'); duck typing covers the rest.
    import gymnasium as _gym
except ImportError:  # pragma: no cover - exercised only without gymnasium
    _gym = None

NO_LIVES = -1   # lives value of a sub-env that reports none


class Results(NamedTuple):
    """What some sub-environments reported, row ``j`` for sub-env ``env_ids[j]``.

    A row is either a *step* (the sub-env took the action it was given: ``obs`` is the
    observation after it, the final observation when the episode ended, also for a truncated
    end) or, where ``started[j]``, the *first observation of a new episode* (after a reset, an
    autoreset, or a restarted remote actor; ``reward`` / ``terminated`` / ``truncated`` are
    meaningless there, and an episode the sub-env was in ends without a further step).
    ``lives`` is ``info['lives']`` per row (Atari), :data:`NO_LIVES` where none is reported,
    or None when the env reports none at all. ``started`` None means no row is a start.
    """
    env_ids: np.ndarray
    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    lives: Optional[np.ndarray]
    started: Optional[np.ndarray]


def _started_results(env_ids, obs, lives):
    n = len(env_ids)
    return Results(np.asarray(env_ids, np.int64), obs, np.zeros(n), np.zeros(n, bool),
                   np.zeros(n, bool), lives, np.ones(n, bool))


def _flag(value, name):
    """One flag an env returned (``terminated``, ``truncated``, ``done``) as a bool.

    The rule (:func:`~expreplay._checks.check_bool`'s, the writers' too): a flag is a bool, a
    numpy bool (also as a 0-d array), or the integer 0 or 1 (what C-backed envs return);
    anything else is refused naming the flag, since ``bool()`` would read the string
    ``'False'`` as True and a float or an array by rules that are not the env's.
    """
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    return check_bool(value, name)


def _flags(values, n, name):
    """``n`` flags of a vector env as a bool array: the rule of :func:`_flag` for each."""
    arr = np.asarray(values)
    if arr.dtype != np.bool_:
        if arr.dtype.kind not in 'iu' or ((arr != 0) & (arr != 1)).any():
            raise TypeError(f"{name} must be bools (or integers 0 and 1), got "
                            f"{arr.dtype} {arr.ravel()[:4].tolist()}")
        arr = arr.astype(bool)
    return arr.reshape(n)


def _reward(value, name='player reward'):
    """One reward an env returned: integers are held to the memory's rule (float32 must hold
    them exactly, :func:`expreplay.storage.memory.check_reward`) before they become floats; floats go
    on to the runner's range check."""
    if type(value) is float:
        return value
    return check_reward(value, name)


def _rewards(values, n, name='player rewards'):
    """``n`` rewards of a vector env as float64, integers held to the memory's rule first."""
    arr = np.asarray(values)
    if arr.dtype.kind != 'f':
        arr = check_rewards(arr, name)
    return arr.astype(np.float64).reshape(n)


def _lives_from_info(info):
    lives = info.get('lives') if isinstance(info, dict) else None
    return NO_LIVES if lives is None else int(lives)


class EnvAdapter:
    """What a runner needs from an environment, whatever its API.

    Synchronous adapters (``is_async`` False):
        ``reset(seed=None, options=None)`` -> :class:`Results` of every sub-env, all started.
        ``seed`` is an int (a vector env seeds its sub-envs ``seed + i``) or, for a vector env,
        a list of one seed (or None) per sub-env; ``options`` goes to ``reset(options=...)``.
        ``step(actions)`` -> :class:`Results` of every sub-env. A sub-env whose episode ended
        is not stepped again before it reports a start: in NEXT_STEP autoreset the next
        ``step`` ignores its action and reports the start; otherwise
        ``reset_finished(starts=None)`` -> :class:`Results` (or None) starts the finished ones
        that can be reset now. It is called after the runner stored the step, so that a
        reset failure can not lose a stepped transition. ``starts`` = {index: (seed, options)}
        resets those sub-envs that way; only meaningful when ``controls_resets`` is True (the
        adapter, not the env, decides when to reset).
    Asynchronous adapters (``is_async`` True): ``reset(seed=None)`` starts the engine and
        returns None; ``recv()`` -> :class:`Results` of the sub-envs that are ready (the first
        time: started); ``send(actions, env_ids)`` gives them their next actions.
    Both: ``close()``; ``can_clone_state``, ``clone_state(i, include_rng=False)``,
    ``restore_state(i, state, prev_action=None)``: emulator snapshots (ALE), for restart points.
    """

    num_envs = 1
    num_actions = None   # from the action space when it is Discrete, else None
    controls_resets = True   # False when the env resets finished sub-envs by itself (autoreset)
    is_async = False

    def reset(self, seed=None, options=None):
        raise NotImplementedError

    def step(self, actions):
        raise NotImplementedError

    def reset_finished(self, starts=None):
        return None

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

    Besides the protocol, :meth:`step_one` and :meth:`reset_one` work on scalars: the acting
    path steps several single envs one call each and gathers their results into arrays itself.

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
        self._step = player.step
        try:
            params = inspect.signature(player.reset).parameters
            self._reset_takes_seed = 'seed' in params or any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        except (TypeError, ValueError):  # builtins without a signature
            self._reset_takes_seed = False

    def reset(self, seed=None, options=None):
        obs, lives = self.reset_one(seed, options)
        return _started_results(_ENV0, obs[None], None if lives == NO_LIVES else np.array([lives]))

    def reset_one(self, seed=None, options=None):
        """Reset; ``(first observation, lives or NO_LIVES)``."""
        self._done = False
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
            return np.asarray(obs), _lives_from_info(info)
        return np.asarray(result), NO_LIVES

    def step_one(self, action):
        """Step with ``action``: ``(obs, reward, terminated, truncated, lives or NO_LIVES)``."""
        if self._done:
            raise RuntimeError("SingleEnvAdapter.step after the episode ended without a reset")
        result = self._step(action)
        if type(result) is not tuple or len(result) != (5 if self.api == 'gymnasium' else 4):
            self._bad_step_result(result)
        if self.api == 'gymnasium':
            obs, reward, terminated, truncated, info = result
            if type(terminated) is not bool or type(truncated) is not bool:
                terminated = _flag(terminated, f"player {_describe(self.player)}: step()'s terminated")
                truncated = _flag(truncated, f"player {_describe(self.player)}: step()'s truncated")
        else:
            obs, reward, done, info = result
            if type(done) is not bool:
                done = _flag(done, f"player {_describe(self.player)}: step()'s done")
            # Old gym's TimeLimit marks a time-limit end in info; such an end bootstraps.
            truncated = done and bool(isinstance(info, dict) and info.get('TimeLimit.truncated', False))
            terminated = done and not truncated
        reward = _reward(reward, f"player {_describe(self.player)}: step()'s reward")
        self._done = terminated or truncated
        lives = info.get('lives') if info and type(info) is dict else None
        return obs, reward, terminated, truncated, NO_LIVES if lives is None else int(lives)

    def _bad_step_result(self, result):
        if not isinstance(result, tuple) or len(result) not in (4, 5):
            raise TypeError(f"player {_describe(self.player)}: step() returned "
                            f"{type(result).__name__} of length {len(result) if isinstance(result, tuple) else '?'}, "
                            "expected a 5-tuple (gymnasium) or a 4-tuple (old gym)")
        raise TypeError(f"player {_describe(self.player)}: reset() and step() disagree on the API "
                        f"(reset looked {self.api!r}, step returned a {len(result)}-tuple)")

    def step(self, actions):
        obs, reward, terminated, truncated, lives = self.step_one(int(actions[0]))
        return Results(_ENV0, np.asarray(obs)[None], np.array([float(reward)]), np.array([terminated]),
                       np.array([truncated]), None if lives == NO_LIVES else np.array([lives]), None)

    def reset_finished(self, starts=None):
        if not self._done:
            return None
        # Without a start: no seed, so the env continues its own random sequence.
        seed, options = (starts or {}).get(0, (None, None))
        return self.reset(seed, options)


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



class _VectorBase(EnvAdapter):
    """What the synchronous and asynchronous vector adapters share: spaces, lives, restarts."""

    def __init__(self, player):
        self.player = player
        self.num_envs = int(player.num_envs)
        self.num_actions = _discrete_n(getattr(player, 'single_action_space', None))
        self._all = np.arange(self.num_envs, dtype=np.int64)
        # Sub-envs whose episode ended: their next report is a start (NEXT_STEP autoreset).
        self._ended = np.zeros(self.num_envs, bool)

    def _lives(self, info, n):
        """Per-row lives from a batched info dict (gymnasium masks absent keys), or None."""
        lives = info.get('lives') if isinstance(info, dict) else None
        if lives is None:
            return None
        lives = np.asarray(lives, np.int64).reshape(n)
        mask = info.get('_lives')
        return lives if mask is None else np.where(mask, lives, NO_LIVES)

    @staticmethod
    def _restarted(info, n):
        """Rows whose remote actor was restarted (their episode was cut), or None."""
        restarted = info.get('restarted') if isinstance(info, dict) else None
        return None if restarted is None else np.asarray(restarted, bool).reshape(n)

    def _next_step_results(self, env_ids, obs, reward, terminated, truncated, info):
        """Results of a NEXT_STEP engine: a row of a sub-env that had ended is its start."""
        n = len(env_ids)
        started = self._ended[env_ids]
        restarted = self._restarted(info, n)
        if restarted is not None:
            started = started | restarted
        terminated = _flags(terminated, n, 'player terminated')
        truncated = _flags(truncated, n, 'player truncated')
        self._ended[env_ids] = (terminated | truncated) & ~started
        return Results(env_ids, obs, _rewards(reward, n), terminated, truncated,
                       self._lives(info, n), started if started.any() else None)


class VectorEnvAdapter(_VectorBase):
    """A gymnasium ``VectorEnv`` (any autoreset mode), stepped synchronously.

    * NEXT_STEP (gymnasium's default, ``AtariVectorEnv``'s, EnvPool's): the step that ends an
      episode returns the final observation; the next ``step`` resets that sub-environment,
      ignores its action and returns the reset observation -> a started row.
    * SAME_STEP: the ending step returns the reset observation and puts the final one in
      ``info['final_obs']`` -> a step row with the final observation, and the start from
      :meth:`reset_finished`.
    * DISABLED: :meth:`reset_finished` resets the finished sub-environments with
      ``reset(options={'reset_mask': ...})``.

    Rows are put in sub-env order by ``info['env_id']`` when the env reports it (EnvPool).
    ``info['restarted']`` (a remote actor was replaced, :class:`expreplay.ray.RayVectorEnv`)
    marks rows that start a new episode. Envs that return only part of the batch per step
    synchronously (``AtariVectorEnv(batch_size < num_envs)``) are refused.
    """

    def __init__(self, player):
        super().__init__(player)
        batch = _batch_size(player)
        if batch is not None and 0 < batch != self.num_envs:
            raise ValueError(f"player {_describe(player)} returns batches of {batch} of its {self.num_envs} "
                             "sub-environments per step; use batch_size == num_envs")
        mode = (getattr(player, 'metadata', None) or {}).get('autoreset_mode', 'NextStep')
        self.mode = getattr(mode, 'value', mode)
        if self.mode not in ('NextStep', 'SameStep', 'Disabled'):
            raise ValueError(f"player {_describe(player)}: unknown autoreset_mode {mode!r}")
        self._same_step_resets = None
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

    def _in_env_order(self, obs, info, *arrays):
        ids = info.get('env_id') if isinstance(info, dict) else None
        if ids is None:
            return (obs,) + arrays
        order = np.argsort(np.asarray(ids))
        if (order == self._all).all():
            return (obs,) + arrays
        return tuple(np.asarray(a)[order] for a in (obs,) + arrays)

    def reset(self, seed=None, options=None):
        kwargs = {'seed': self._seed_arg(seed)}
        if options is not None:
            kwargs['options'] = dict(options)   # a copy: vector envs pop keys from it
        obs, info = self.player.reset(**kwargs)
        (obs,) = self._in_env_order(obs, info)
        self._ended[:] = False
        self._same_step_resets = None
        return _started_results(self._all, obs, self._lives(info, self.num_envs))

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.player.step(np.asarray(actions))
        obs, reward, terminated, truncated = self._in_env_order(obs, info, reward, terminated, truncated)
        if self.mode == 'NextStep':
            return self._next_step_results(self._all, obs, reward, terminated, truncated, info)
        n = self.num_envs
        terminated = _flags(terminated, n, 'player terminated')
        truncated = _flags(truncated, n, 'player truncated')
        ended = terminated | truncated
        lives = self._lives(info, n)
        if self.mode == 'SameStep' and ended.any():
            idx = np.flatnonzero(ended)
            final_lives = self._lives(info.get('final_info') or {}, n)
            self._same_step_resets = _started_results(
                idx, np.asarray(obs)[idx], None if lives is None else lives[idx])
            obs = np.array(obs)
            obs[idx] = np.stack([np.asarray(info['final_obs'][i]) for i in idx])
            if lives is not None:
                lives = lives.copy()
                lives[idx] = NO_LIVES if final_lives is None else final_lives[idx]
        self._ended |= ended
        return Results(self._all, obs, _rewards(reward, n), terminated,
                       truncated, lives, None)

    def reset_finished(self, starts=None):
        if self.mode == 'SameStep':
            resets, self._same_step_resets = self._same_step_resets, None
            if resets is not None:
                self._ended[resets.env_ids] = False
            return resets
        if self.mode == 'Disabled' and self._ended.any():
            if not starts:
                mask = self._ended.copy()
                obs, info = self.player.reset(options={'reset_mask': mask})
                self._ended[:] = False
                idx = np.flatnonzero(mask)
                lives = self._lives(info, self.num_envs)
                return _started_results(idx, np.asarray(obs)[idx], None if lives is None else lives[idx])
            return self._reset_masked(starts)
        return None

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
        ids, obs, lives = [], [], []
        for options, members in groups:
            mask = np.zeros(self.num_envs, bool)
            mask[members] = True
            seeds = [starts.get(i, (None, None))[0] if mask[i] else None for i in range(self.num_envs)]
            out, info = self.player.reset(seed=self._seed_arg(seeds, mask),
                                          options=dict(options or {}, reset_mask=mask))
            got = self._lives(info, self.num_envs)
            self._ended[mask] = False
            ids += members
            obs.append(np.asarray(out)[members])
            lives.append(np.full(len(members), NO_LIVES) if got is None else got[members])
        return _started_results(np.array(ids), np.concatenate(obs), np.concatenate(lives))


class AsyncVectorAdapter(_VectorBase):
    """An engine with EnvPool's asynchronous API: ``async_reset()``, ``recv()``, ``send()``.

    EnvPool with ``batch_size < num_envs`` (its C++ threads step the other sub-envs while the
    runner predicts for the ones ``recv`` returned), :class:`expreplay.ray.RayVectorEnv` (remote
    actors), ale-py's ``AtariVectorEnv(batch_size < num_envs)`` (no ``async_reset``: its
    ``reset`` returns the first ready batch; ``send(actions)`` goes to the last batch
    received), or anything with the same methods. ``recv`` -> ``(obs, reward, terminated,
    truncated, info)`` for the ready sub-envs, ``info['env_id']`` saying which;
    ``send(actions, env_id)``. Autoreset is NEXT_STEP (EnvPool's): a sub-env that ended reports
    its next episode's first observation on its next ``recv``, its action ignored; a sub-env's
    first report is its first observation.

    EnvPool is seeded when it is made (``envpool.make(..., seed=s)``); a ``seed`` given to
    :meth:`reset` can not reach it and is ignored with a warning.
    """

    is_async = True
    controls_resets = False

    def __init__(self, player):
        super().__init__(player)
        try:
            params = inspect.signature(player.send).parameters
            self._send_takes_ids = 'env_id' in params or len(params) >= 2
        except (TypeError, ValueError):
            self._send_takes_ids = True

    _in_flight = 0     # sub-envs sent actions whose results have not been received

    def reset(self, seed=None, options=None):
        if options is not None:
            raise TypeError(f"player {_describe(self.player)} is asynchronous: its resets take no "
                            f"options (got {options!r})")
        # Results still in flight (a runner closed or restarted mid-pipeline) are received and
        # dropped first: resetting an engine with steps in flight corrupts EnvPool's state.
        while self._in_flight > 0:
            self._in_flight -= len(self.player.recv()[1])
        self._in_flight = 0
        self._ended[:] = True     # every sub-env's first report is the start of an episode
        if not callable(getattr(self.player, 'async_reset', None)):
            obs, info = self.player.reset(seed=seed)      # ale-py: the first ready batch
            n = len(obs)
            self._first = (obs, np.zeros(n), np.zeros(n, bool), np.zeros(n, bool), info)
            self._in_flight = self.num_envs - n
            return None
        if seed is not None:
            warnings.warn(f"player {_describe(self.player)} is seeded when it is made (e.g. "
                          f"envpool.make(..., seed=...)); reset seed {seed!r} is ignored",
                          RuntimeWarning, stacklevel=3)
        self.player.async_reset()
        self._in_flight = self.num_envs        # every sub-env's first observation is coming

    _first = None

    def recv(self):
        if self._first is not None:
            out, self._first = self._first, None
        else:
            out = self.player.recv()
            self._in_flight -= len(out[1])
        obs, reward, terminated, truncated, info = out
        env_ids = np.asarray(info['env_id'], np.int64)
        return self._next_step_results(env_ids, obs, reward, terminated, truncated, info)

    def send(self, actions, env_ids):
        if self._send_takes_ids:
            self.player.send(actions, env_ids)
        else:
            self.player.send(actions)
        self._in_flight += len(env_ids)


def _batch_size(player):
    batch = getattr(player, 'batch_size', None)
    if batch is None:
        config = getattr(player, 'config', None)     # EnvPool keeps it in its config dict
        if isinstance(config, dict):
            batch = config.get('batch_size')
    return int(batch) if isinstance(batch, (int, np.integer)) else None


def _is_vector_env(player):
    if _gym is not None and isinstance(player, _gym.vector.VectorEnv):
        return True
    # Other VectorEnv look-alikes (a wrapper that does not subclass it, envpool-style envs).
    return hasattr(player, 'num_envs') and hasattr(player, 'single_action_space')


def _is_async_engine(player):
    if not all(callable(getattr(player, m, None)) for m in ('recv', 'send')):
        return False
    flag = getattr(player, 'is_async', None)
    if flag is not None:
        return bool(flag)
    batch = _batch_size(player)
    return batch is not None and batch < int(player.num_envs)


def adapt_env(player):
    """The :class:`EnvAdapter` for ``player``; TypeError naming ``player`` if it is no env."""
    if isinstance(player, EnvAdapter):
        return player
    if _is_vector_env(player):
        if _is_async_engine(player):
            return AsyncVectorAdapter(player)
        return VectorEnvAdapter(player)
    if not (callable(getattr(player, 'reset', None)) and callable(getattr(player, 'step', None))):
        raise TypeError(f"player must be a gymnasium Env, an old-gym-API env (reset/step), or a "
                        f"gymnasium VectorEnv; got {_describe(player)} without reset()/step()")
    if _gym is not None and isinstance(player, _gym.Env):
        return SingleEnvAdapter(player, api='gymnasium')
    return SingleEnvAdapter(player)


_ENV0 = np.zeros(1, np.int64)


class FrameFormat:
    """Turns observations into frames the memory stores: ``state_shape``, ``dtype``.

    The shape rule: an observation has ``state_shape``, or differs from it only by axes of
    size 1 (``AtariVectorEnv(stack_num=1)`` and EnvPool give (1, 84, 84) per sub-environment
    for a (84, 84) memory; an (84, 84, 1) observation fits too): the two shapes are equal once
    their size-1 axes are removed. Any other shape is refused, also one of the same size (a
    (4, 2) observation is not a (2, 4) frame: reshaping it would scramble it). A dtype change
    is allowed only where no data is lost (the memory's own rule,
    :func:`expreplay.storage.memory.as_frame`, so that the runner refuses exactly what the memory would).
    """

    def __init__(self, state_shape, dtype):
        self.state_shape = tuple(state_shape)
        self.dtype = np.dtype(dtype)
        self._squeezed = _squeezed(self.state_shape)

    def __call__(self, obs):
        """One observation as a frame."""
        arr = np.asarray(obs)
        if arr.shape != self.state_shape and _squeezed(arr.shape) == self._squeezed:
            arr = arr.reshape(self.state_shape)
        return as_frame(arr, self.state_shape, self.dtype, 'player observation').astype(
            self.dtype, copy=False)

    def batch(self, obs, n):
        """``n`` stacked observations as ``(n, *state_shape)`` frames."""
        arr = np.asarray(obs)
        shape = (n,) + self.state_shape
        if arr.shape != shape and _squeezed(arr.shape) == _squeezed(shape):
            arr = arr.reshape(shape)       # moves size-1 axes only: the data keeps its order
        if arr.ndim == 0 or len(arr) != n:
            raise ValueError(f"player observations of shape {arr.shape} for {n} sub-environments")
        return check_frames(arr, self.state_shape, self.dtype, 'player observations').astype(
            self.dtype, copy=False)


def _squeezed(shape):
    return tuple(d for d in shape if d != 1)


class FrameHistory:
    """The last ``history_len`` frames of each lane's (sub-environment's) current episode.

    A ring of ``history_len`` frames per lane: a new frame overwrites the lane's oldest one
    (one frame copied per step, not ``history_len``). States are handed out channels-last
    ``(n, *state_shape, history_len)``, oldest first, zero-padded before the episode's first
    frame: the same frames the memory gives the learner as ``comb_state[..., :-1]``.
    Invariant: row ``lane * h + pos[lane]`` holds the lane's newest frame, the rows after it
    (cyclically) the older ones, oldest first; rows from before the episode's start are zeros.
    """

    def __init__(self, num_lanes, state_shape, history_len, dtype):
        self.history_len = h = int(history_len)
        self._frames = np.zeros((num_lanes * h,) + tuple(state_shape), dtype)
        self._pos = np.zeros(num_lanes, np.int64)
        self._base = np.arange(num_lanes, dtype=np.int64) * h     # each lane's first row
        self._ring = np.arange(1, h + 1)
        self._rows = np.zeros((num_lanes, h), np.intp)             # states()' scratch

    def start(self, lanes, frames):
        """Begin a new episode in each of ``lanes`` with its first frame ``frames[j]``."""
        h = self.history_len
        lanes = np.asarray(lanes, np.int64)
        rows = lanes * h
        if h > 1:
            self._frames[(rows[:, None] + np.arange(h)).ravel()] = 0
        self._pos[lanes] = 0
        self._frames[rows] = frames

    def push(self, lanes, frames):
        """Append the next frame of each of ``lanes``' episodes."""
        h = self.history_len
        lanes = np.asarray(lanes, np.int64)
        pos = (self._pos[lanes] + 1) % h
        self._pos[lanes] = pos
        self._frames[self._base[lanes] + pos] = frames

    def latest(self, lane):
        """The newest frame of ``lane`` (a view)."""
        return self._frames[lane * self.history_len + self._pos[lane]]

    def states(self, lanes):
        """Stacked states of ``lanes``: ``(len(lanes), *state_shape, history_len)``."""
        if _acting_ext is not None:
            lanes = np.asarray(lanes, np.int64)
            rows = self._rows[:len(lanes)]
            _acting_ext.history_rows(lanes, self._pos, self._base, self.history_len, rows)
        else:
            rows = self._base[lanes][:, None] + (self._pos[lanes][:, None] + self._ring) % self.history_len
        return gather_history(self._frames, rows)
