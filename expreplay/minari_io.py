"""Minari datasets in and out of a :class:`~expreplay.ReplayMemory`.

`Minari <https://minari.farama.org>`_ is gymnasium's standard format for offline-RL datasets:
a dataset is a list of episodes, each with ``observations`` (steps + 1 of them: the reset
observation and every next observation, the final one included), ``actions``, ``rewards``,
``terminations`` and ``truncations`` (one per step). :meth:`ReplayMemory.episodes` yields
exactly that layout, so the two convert without loss::

    from expreplay.minari_io import export_minari, load_minari

    export_minari(memory, 'expreplay/pong-dqn-v0', action_space=env.action_space,
                  author='me', description='Pong, DQN after 10M frames')
    demos = load_minari('expreplay/pong-dqn-v0', history_len=4)   # a pre-filled ReplayMemory

Datasets live under ``$MINARI_DATASETS_PATH`` (``~/.minari/datasets`` by default).
Minari is optional: ``pip install expreplay[minari]``. It is imported when one of these
functions is called, never by ``import expreplay``.
"""

import shutil
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import DTypeLike

from .storage._inputs import check_extras
from .storage.memory import ReplayMemory

if TYPE_CHECKING:
    import minari

__all__ = ['export_minari', 'load_minari']

_INSTALL_HINT = "install the Minari extra: pip install 'expreplay[minari]'"

# Episodes are handed to Minari in chunks of about this many bytes of observations, so an
# export never holds a second copy of a large memory in RAM.
_EXPORT_CHUNK_BYTES = 64 << 20


def _import_minari():
    try:
        import gymnasium
        import minari
    except ImportError as err:
        raise ImportError(
            f"Minari datasets need the minari package ({err}); {_INSTALL_HINT}") from err
    return minari, gymnasium


def _storage_import_error(err):
    # Minari imports its storage backend (h5py, and PIL for images) only when a dataset is
    # written or read: a missing one shows up here, not at `import minari`.
    return ImportError(f"Minari could not load its storage backend ({err}); {_INSTALL_HINT}")


# ---------------------------------------------------------------------------------- export
def export_minari(memory: ReplayMemory, dataset_id: str, *, env: Any = None,
                  observation_space: Any = None, action_space: Any = None,
                  algorithm_name: str = 'expreplay', author: str | None = None,
                  description: str | None = None, data_format: str | None = None,
                  **minari_kwargs: Any) -> 'minari.MinariDataset':
    """Write the memory's complete episodes as a new Minari dataset.

    Every episode whose first observation and final step (terminated or truncated) are both
    still in the memory is written, with every observation (the final one included), action,
    reward, termination and truncation. Episodes cut by eviction, still running, or abandoned
    are left out (see :meth:`ReplayMemory.episodes`). Each episode is read whole; with writers
    running, an episode evicted before the export reached it is left out, and their number is
    logged (logger ``expreplay.minari_io``, WARNING). Export from a memory that writers are not
    filling to have every episode, or accept that episodes finished or evicted during the
    export may or may not be included.

    Args:
        memory (ReplayMemory): the memory to export.
        dataset_id (str): the new dataset's id, ``[namespace/]name-v<version>``
            (e.g. ``'expreplay/pong-dqn-v0'``). It must not exist yet.
        env (gymnasium.Env | str | EnvSpec, optional): the environment the data came from.
            Minari records its spec (so ``dataset.recover_environment()`` works) and its
            spaces are used unless ``observation_space`` / ``action_space`` are given.
        observation_space (gymnasium.spaces.Box, optional): must have the memory's
            ``state_shape``. Without it (and without ``env``) it is a Box of the memory's
            shape and dtype with bounds ``[0, 255]`` for uint8, the dtype's range for other
            integers, ``[False, True]`` for bool and ``(-inf, inf)`` for floats.
        action_space (gymnasium.spaces.Discrete, optional): without it (and without ``env``)
            it is **inferred** as ``Discrete(max stored action + 1)``, which is smaller than
            the environment's action space when the highest actions were never taken: pass the
            real one when you know it. Negative actions require an explicit ``action_space``.
        algorithm_name, author, description: dataset metadata (a description is generated
            when none is given).
        data_format (str, optional): Minari storage format, ``'hdf5'`` (Minari's default) or
            ``'arrow'`` (needs pyarrow).
        **minari_kwargs: passed to :func:`minari.create_dataset_from_buffers`
            (``author_email``, ``code_permalink``, ``eval_env``, ``requirements``, ...).
            ``jpeg_encoding`` defaults to False here: Minari otherwise stores uint8 image
            observations (such as 84x84 Atari frames) as lossy JPEG.

    Returns:
        minari.MinariDataset: the created dataset.

    Raises:
        ValueError: the memory holds no complete episode; ``dataset_id`` is malformed or
            already exists; a space does not fit the memory or its actions.
        TypeError: a space is not a Box / Discrete, or ``env`` is not a gymnasium env.
        ImportError: minari (or its storage backend) is not installed.

    Episodes written with the tensorpack-style :meth:`ReplayMemory.append` have no final
    observation: their terminal step's next observation is exported as zeros.

    The memory's extra per-step fields (``extra_fields``) become the episodes' ``infos``, one
    array per field with one entry per observation, as Minari's collector records them:
    ``infos[name][t + 1]`` is the value written with step ``t`` (the info that step
    returned). The memory keeps no value for the reset observation, so ``infos[name][0]``
    repeats step 0's.
    """
    minari, gym = _import_minari()
    if not isinstance(memory, ReplayMemory):
        raise TypeError(f"memory must be a ReplayMemory, got {type(memory).__name__}")
    dataset_path = _check_new_dataset_id(dataset_id)
    env, made_env = _env_instance(env, gym)
    try:
        if env is not None:
            observation_space = env.observation_space if observation_space is None else observation_space
            action_space = env.action_space if action_space is None else action_space
        obs_space = _observation_space_for(memory, observation_space, gym)
        action_space = _action_space_for(memory, action_space, gym)
        kwargs = dict(minari_kwargs, env=env, observation_space=obs_space,
                      action_space=action_space, algorithm_name=algorithm_name, author=author,
                      description=description, data_format=data_format)
        return _create_dataset(minari, memory, dataset_id, dataset_path, kwargs)
    finally:
        if made_env is not None:
            made_env.close()


def _env_instance(env: Any, gym: Any) -> tuple[Any, Any]:
    """``env`` as a gymnasium env (or None), and the env made here from an id or spec (to close)."""
    if env is None or isinstance(env, gym.Env):
        return env, None
    if isinstance(env, (str, gym.envs.registration.EnvSpec)):
        # Make it once here (for its spaces) and hand the instance to Minari, which would
        # otherwise make it a second time.
        made = gym.make(env)
        return made, made
    raise TypeError(
        f"env must be a gymnasium.Env, an env id or an EnvSpec, got "
        f"{type(env).__name__}; for other envs pass observation_space and "
        "action_space instead")


def _action_space_for(memory: ReplayMemory, space: Any, gym: Any) -> Any:
    """The Discrete space the dataset declares: the given one, or one inferred from the memory."""
    if space is None:
        space, count = _infer_action_space(memory, gym)
        if count == 0:
            raise _no_episodes_error(memory)
    elif not isinstance(space, gym.spaces.Discrete):
        raise TypeError(f"action_space must be gymnasium.spaces.Discrete (a ReplayMemory "
                        f"stores integer actions), got {space}")
    return space


def _create_dataset(minari: Any, memory: ReplayMemory, dataset_id: str, dataset_path: Any,
                    kwargs: dict[str, Any]) -> Any:
    """Create the dataset from the memory's first chunk of episodes and add the others to it;
    ``kwargs``: for ``minari.create_dataset_from_buffers``."""
    chunks = _episode_chunks(memory, kwargs['observation_space'], kwargs['action_space'], minari)
    first = next(chunks, None)
    if first is None:
        raise _no_episodes_error(memory)
    if kwargs['description'] is None:
        kwargs['description'] = (f"Complete episodes exported from an expreplay ReplayMemory "
                                 f"(state_shape={memory.state_shape}, dtype={memory.dtype}).")
    if kwargs['data_format'] is None:
        del kwargs['data_format']            # Minari's default
    kwargs.setdefault('jpeg_encoding', False)
    _check_jpeg_supported(minari, kwargs, kwargs['observation_space'])
    try:
        dataset = minari.create_dataset_from_buffers(dataset_id, first, **kwargs)
        for chunk in chunks:
            dataset.update_dataset_from_buffer(chunk)
    except BaseException as err:
        # The id was checked to be new, so whatever is at its path now is our partial
        # dataset: remove it rather than leave a half-written one that blocks the id.
        shutil.rmtree(dataset_path, ignore_errors=True)
        if isinstance(err, ImportError):
            raise _storage_import_error(err) from err
        raise
    return dataset


def _check_new_dataset_id(dataset_id):
    """Validate ``dataset_id`` before anything is written; return its (absent) path."""
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.storage.datasets_root_dir import get_dataset_path

    if not isinstance(dataset_id, str):
        raise TypeError(f"dataset_id must be a str, got {type(dataset_id).__name__}")
    try:
        # Minari requires the version (a missing one fails inside parse_dataset_id with an
        # unhelpful TypeError), and creates the dataset directory before it parses the id:
        # check first so that a malformed id leaves nothing behind.
        _namespace, _name, _version = parse_dataset_id(dataset_id)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"dataset_id {dataset_id!r} is not a valid Minari dataset id: it must be "
            f"'[namespace/]name-v<version>', e.g. 'expreplay/pong-dqn-v0' ({err})") from None
    path = get_dataset_path(dataset_id)
    if path.exists():
        raise ValueError(f"dataset_id {dataset_id!r}: a Minari dataset already exists at {path}; "
                         "choose another name or version, or minari.delete_dataset() it")
    return path


def _observation_space_for(memory, space, gym):
    """The Box the dataset declares: the given one checked against the memory, or a new one."""
    shape, dtype = memory.state_shape, memory.dtype
    low: Any
    high: Any
    if space is None:
        if dtype.kind == 'b':
            low, high = False, True
        elif dtype == np.uint8:
            low, high = 0, 255
        elif dtype.kind in 'iu':
            low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
        else:
            low, high = -np.inf, np.inf
        return gym.spaces.Box(low, high, shape, dtype)
    if not isinstance(space, gym.spaces.Box):
        raise TypeError(f"observation_space must be gymnasium.spaces.Box, got {space}")
    if tuple(space.shape) != shape:
        raise ValueError(f"observation_space has shape {space.shape}, but the memory's "
                         f"state_shape is {shape}; pass an observation_space that fits the "
                         "stored frames")
    if not np.can_cast(dtype, space.dtype, 'safe'):
        raise ValueError(f"observation_space has dtype {space.dtype}, which can not hold the "
                         f"memory's {dtype} frames exactly")
    return space


def _infer_action_space(memory, gym):
    """``Discrete(max action + 1)`` over the complete episodes, and how many there are."""
    lo, hi, count = None, None, 0
    for episode in memory.episodes():
        actions = episode['actions']
        count += 1
        if actions.size:
            lo = int(actions.min()) if lo is None else min(lo, int(actions.min()))
            hi = int(actions.max()) if hi is None else max(hi, int(actions.max()))
    if count and lo is not None and lo < 0:
        raise ValueError(f"the memory holds negative actions (down to {lo}): the action space "
                         "can not be inferred, pass action_space (e.g. Discrete(n, start=...))")
    return gym.spaces.Discrete((hi if hi is not None else 0) + 1), count


def _episode_chunks(memory, obs_space, action_space, minari):
    """Lists of Minari EpisodeBuffers of about _EXPORT_CHUNK_BYTES of observations each."""
    from minari.data_collector import EpisodeBuffer

    lo = int(action_space.start)
    hi = lo + int(action_space.n)
    chunk, nbytes = [], 0
    episodes = memory.episodes()
    for episode in episodes:
        actions = episode['actions']
        if actions.size and (actions.min() < lo or actions.max() >= hi):
            bad = actions[(actions < lo) | (actions >= hi)][0]
            raise ValueError(f"the memory holds action {bad}, outside action_space {action_space}")
        observations = episode['observations']
        if observations.dtype != obs_space.dtype:
            observations = observations.astype(obs_space.dtype)   # a safe cast, checked above
        chunk.append(EpisodeBuffer(
            observations=observations,
            # Minari's own collector stores Discrete actions in the space's dtype (int64).
            actions=actions.astype(action_space.dtype),
            rewards=episode['rewards'],
            terminations=episode['terminations'],
            truncations=episode['truncations'],
            infos=_infos_of(episode['extras'])))
        nbytes += observations.nbytes
        if nbytes >= _EXPORT_CHUNK_BYTES:
            yield chunk
            chunk, nbytes = [], 0
    if episodes.evicted:
        import logging
        logging.getLogger(__name__).warning("export_minari: %d of the memory's complete episodes were evicted by its "
                       "writers before they were read, and are not in the dataset (%d are)",
                       episodes.evicted, episodes.yielded)
    if chunk:
        yield chunk


def _infos_of(extras):
    """Minari infos (one per observation: the reset's, then each step's) from the memory's
    per-step extra fields; the reset entry, which the memory does not hold, repeats the first
    step's value."""
    if not extras:
        return None
    return {name: np.concatenate([values[:1], values]) for name, values in extras.items()}


def _check_jpeg_supported(minari, kwargs, obs_space):
    import inspect

    if 'jpeg_encoding' in inspect.signature(minari.create_dataset_from_buffers).parameters:
        return
    # Minari before 0.5.4 has no switch: it JPEG-encodes what it takes for images, lossily.
    requested = kwargs.pop('jpeg_encoding')
    looks_like_image = (obs_space.dtype == np.uint8 and len(obs_space.shape) in (2, 3)
                        and min(obs_space.shape[:2]) >= 32)
    if not requested and looks_like_image:
        raise ImportError(f"minari {minari.__version__} stores uint8 image observations as lossy "
                          f"JPEG and can not turn it off: upgrade it (minari>=0.5.4), or pass "
                          f"jpeg_encoding=True to accept lossy frames")


def _no_episodes_error(memory):
    return ValueError(
        f"the memory holds no complete episode to export ({memory.num_steps_written} steps "
        "written): an episode is exported only when its first observation and its final "
        "(terminated or truncated) step are both still stored")


# ---------------------------------------------------------------------------------- import
def load_minari(dataset_or_id: 'minari.MinariDataset | str', memory: ReplayMemory | None = None, *,
                max_size: int | None = None, history_len: int = 4, dtype: DTypeLike | None = None,
                extra_fields: Mapping[str, DTypeLike] | None = None) -> ReplayMemory:
    """Fill a ReplayMemory with every episode of a Minari dataset (demonstrations, say).

    Each episode is written with one :class:`~expreplay.LaneWriter`, step by step: the first
    observation starts the episode, and every step stores its action, reward, next
    observation and how it ended (terminated, truncated). So the loaded transitions sample
    exactly like ones a runner wrote, truncated last steps bootstrapping.

    Args:
        dataset_or_id (minari.MinariDataset | str): a dataset, or the id of a local one
            (``minari.load_dataset``; not downloaded).
        memory (ReplayMemory, optional): append into this memory. Its ``state_shape`` must be
            the dataset's observation shape and its dtype able to hold the observations.
            Without it, a new memory is created.
        max_size (int, optional): for a new memory; by default large enough to hold the whole
            dataset (its steps plus one frame per episode).
        history_len (int): for a new memory (ignored when ``memory`` is given).
        dtype (optional): for a new memory; the dataset's observation dtype by default.
        extra_fields (dict, optional): for a new memory, its extra per-step fields (name ->
            dtype), loaded from the episodes' step infos: step ``t`` gets ``infos[name][t + 1]``
            (the info step t returned; ``infos[name][0]``, the reset's, has no step). A given
            ``memory``'s own ``extra_fields`` are loaded the same way. Info keys that are not
            fields are ignored; a field missing from an episode's infos, of the wrong length,
            or with values the field's dtype can not hold raises ValueError naming it.

    Returns:
        ReplayMemory: the filled memory (``memory`` itself when given).

    Raises:
        TypeError: the dataset's action space is not Discrete, its actions are not integers,
            or its observation space is not a Box; ``dataset_or_id`` has the wrong type.
        ValueError: ``memory`` does not fit the observations; an episode is malformed.
        FileNotFoundError: no local dataset has that id.

    A dataset larger than the memory: steps are written in dataset order and the memory
    evicts oldest-first (one block at a time), so the memory ends up with the most recent
    ``max_size`` steps: the last episodes of the dataset (and, when appending, after the
    memory's own older content is gone). The episode straddling the cut keeps its later steps,
    sampleable where their history is intact, but it is no longer a complete episode.

    Episodes whose last step is neither terminated nor truncated (collection stopped
    mid-episode) are loaded and sampleable, but stay open: :meth:`ReplayMemory.episodes`
    does not list them. Episodes of zero steps carry no transition and are skipped.
    """
    minari, gym = _import_minari()
    dataset = _open_dataset(dataset_or_id, minari)
    name = f"dataset {dataset.id!r}"
    shape, obs_dtype = _dataset_observations(dataset, gym, name)
    if memory is None:
        if max_size is None:
            # Every episode takes its steps plus one slot for its final observation.
            max_size = max(int(dataset.total_steps) + len(dataset), history_len + 1)
        memory = ReplayMemory(max_size, shape, history_len,
                              dtype=obs_dtype if dtype is None else dtype,
                              extra_fields=extra_fields)
    else:
        if not isinstance(memory, ReplayMemory):
            raise TypeError(f"memory must be a ReplayMemory, got {type(memory).__name__}")
        if max_size is not None or dtype is not None or extra_fields is not None:
            raise ValueError("max_size, dtype and extra_fields configure a new memory: do not "
                             "pass them together with memory")
        if memory.state_shape != shape:
            raise ValueError(f"memory has state_shape {memory.state_shape}, but the "
                             f"observations of {name} have shape {shape}")
        _check_dtype_fits(memory.dtype, obs_dtype, name)
    writer = memory.new_writer()
    try:
        for episode in _iterate(dataset):
            _write_episode(writer, episode, shape, name)
    finally:
        writer.close()
    return memory


def _open_dataset(dataset_or_id: Any, minari: Any) -> Any:
    if isinstance(dataset_or_id, str):
        try:
            return minari.load_dataset(dataset_or_id)
        except ImportError as err:
            raise _storage_import_error(err) from err
    if isinstance(dataset_or_id, minari.MinariDataset):
        return dataset_or_id
    raise TypeError(f"dataset_or_id must be a minari.MinariDataset or a dataset id, got "
                    f"{type(dataset_or_id).__name__}")


def _dataset_observations(dataset: Any, gym: Any, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of the dataset's observations, once its spaces are checked to fit a
    ReplayMemory."""
    action_space = dataset.action_space
    if not isinstance(action_space, gym.spaces.Discrete):
        raise TypeError(f"{name} has action_space {action_space}: a ReplayMemory stores one "
                        "integer action per step, so only Discrete action spaces can be loaded")
    obs_space = dataset.observation_space
    if not isinstance(obs_space, gym.spaces.Box) or not 1 <= len(obs_space.shape) <= 3:
        raise TypeError(f"{name} has observation_space {obs_space}: only Box observations of "
                        "rank 1 to 3 can be loaded into a ReplayMemory")
    return tuple(obs_space.shape), np.dtype(obs_space.dtype)


def _iterate(dataset):
    try:
        yield from dataset.iterate_episodes()
    except ImportError as err:
        raise _storage_import_error(err) from err


def _check_dtype_fits(mem_dtype, obs_dtype, name):
    # The writer's rule: integers into integers when the values fit (checked per frame as
    # they are written), anything else only by a same-kind cast (float64 -> float32 is fine,
    # float -> uint8 is not).
    if mem_dtype.kind in 'iub' and obs_dtype.kind in 'iub':
        return
    if not np.can_cast(obs_dtype, mem_dtype, 'same_kind'):
        raise ValueError(f"memory has dtype {mem_dtype}, which can not hold the {obs_dtype} "
                         f"observations of {name}")


def _write_episode(writer, episode, shape, name):
    where = f"{name}, episode {episode.id}"
    obs = np.asarray(episode.observations)
    actions = np.asarray(episode.actions)
    rewards = np.asarray(episode.rewards)
    terms = np.asarray(episode.terminations, bool)
    truncs = np.asarray(episode.truncations, bool)
    steps = len(rewards)
    if actions.ndim == 2 and actions.shape[1] == 1:
        actions = actions[:, 0]      # some writers store Discrete actions as (steps, 1)
    if not (np.issubdtype(actions.dtype, np.integer) or np.issubdtype(actions.dtype, np.bool_)) \
            and actions.size:
        raise TypeError(f"{where}: actions have dtype {actions.dtype}; a ReplayMemory "
                        "stores integer actions")
    if obs.shape != (steps + 1,) + shape:
        raise ValueError(f"{where}: observations have shape {obs.shape}, expected "
                         f"{(steps + 1,) + shape} ({steps} steps + the final observation)")
    for key, arr in (('actions', actions), ('terminations', terms), ('truncations', truncs)):
        if arr.shape != (steps,):
            raise ValueError(f"{where}: {key} have shape {arr.shape}, expected ({steps},)")
    ends = np.flatnonzero(terms | truncs)
    if ends.size and ends[0] != steps - 1:
        raise ValueError(f"{where}: the episode ends at step {ends[0]} of {steps}: only its "
                         "last step may be terminated or truncated")
    fields = writer.memory.extra_fields
    extras = _step_extras(episode, fields, steps, where)
    if steps == 0:
        return
    try:
        writer.start_episode(obs[0])
        for t in range(steps):
            writer.add_step(int(actions[t]), rewards[t], obs[t + 1],
                            terminated=bool(terms[t]), truncated=bool(truncs[t]),
                            extras={name: values[t] for name, values in extras.items()}
                            if extras else None)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{where}: {err}") from err


def _step_extras(episode, fields, steps, where):
    """The memory's extra fields for each step, from the episode's infos (``infos[name][1:]``),
    all checked before anything is written."""
    if not fields:
        return {}
    infos = getattr(episode, 'infos', None) or {}
    out = {}
    for name in fields:
        if name not in infos:
            raise ValueError(f"{where}: its infos have no {name!r}, an extra field of the "
                             f"memory (infos: {sorted(infos)})")
        values = np.asarray(infos[name])
        if values.shape != (steps + 1,):
            raise ValueError(f"{where}: infos[{name!r}] has shape {values.shape}, expected "
                             f"({steps + 1},) (one per observation)")
        out[name] = values[1:]
    try:
        check_extras(out, fields, steps, name='infos')
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from err
    return out
