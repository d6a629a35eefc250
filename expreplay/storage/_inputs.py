"""What may enter the replay memory: the input rules shared by every write path.

Each rule has a one-value form (:func:`check_action`, :func:`check_reward`, :func:`as_frame`:
a :class:`~expreplay.storage.memory.LaneWriter` step, an env adapter's frame) and a vectorized form
(:func:`check_actions`, :func:`check_rewards`, :func:`check_frames`, :func:`check_flags`: a
:class:`~expreplay.storage.writers.BatchWriter` call); both forms raise the same errors, naming the
argument. Everything here is re-exported by :mod:`expreplay.storage.memory`.
"""

import math
import numbers

import numpy as np
from numpy.typing import ArrayLike

from .._checks import check_dtype

__all__ = ['as_frame', 'check_frames', 'check_rewards', 'unstorable_rewards', 'unstorable_frames',
           'lossy_float',
           'check_actions', 'check_flags',
           'check_action', 'check_reward', 'check_extra_fields', 'check_extras']

# The rules of what may enter the memory. Each has a one-value form (used per step by the
# writers) and a vectorized form (for batch writers); both raise the same errors.
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_MAX_SQUARED = _FLOAT32_MAX ** 2
_INT32_MIN, _INT32_MAX = -2**31, 2**31 - 1


def _reward_error(name, value):
    return (f"{name} must be finite and at most {_FLOAT32_MAX:.4g} in magnitude (rewards are "
            f"stored as float32), got {value!r}")


def _inexact_reward_error(name, value):
    return (f"{name} is the integer {value}, which float32 (the rewards' storage) can not hold "
            f"exactly: it would be stored as {int(np.float32(value))}; integer rewards must be "
            f"exact in float32 (any up to 2**24 = 16777216 in magnitude is)")


def check_action(action, name='action'):
    """One action as an int (the rule of :func:`check_actions`, for one value)."""
    if isinstance(action, np.ndarray) and action.ndim == 0:
        action = action[()]
    if isinstance(action, (bool, np.bool_)) or not isinstance(action, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {action!r} ({type(action).__name__})")
    if not _INT32_MIN <= int(action) <= _INT32_MAX:
        raise ValueError(f"{name} {action} does not fit int32")
    return int(action)

def check_reward(reward, name='reward'):
    """One reward as a float that float32 holds (the rule of :func:`check_rewards`)."""
    if isinstance(reward, np.ndarray) and reward.ndim == 0:
        reward = reward[()]
    if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {reward!r} ({type(reward).__name__})")
    value = float(reward)
    if not -_FLOAT32_MAX <= value <= _FLOAT32_MAX:   # NaN fails both comparisons
        raise ValueError(_reward_error(name, value))
    if isinstance(reward, numbers.Integral) and int(np.float32(value)) != int(reward):
        raise ValueError(_inexact_reward_error(name, int(reward)))
    return value


def check_rewards(rewards: ArrayLike, name: str = 'rewards') -> np.ndarray:
    """``rewards`` (any shape) as float32, refusing non-numbers, NaN, inf and values beyond
    float32's range (which it would store as inf).

    The rule for integer rewards (an env's score change, e.g. ALE's): accepted when float32
    holds them exactly, refused otherwise (16777217 would be stored as 16777216), as integer
    frames are in a float memory. Float rewards are rounded to float32: that is what a float
    reward is stored as.
    """
    arr = np.asarray(rewards)
    if arr.dtype.kind not in 'iuf':
        raise TypeError(f"{name} must be real numbers, got dtype {arr.dtype}")
    if arr.dtype.kind in 'iu':
        problem = _unstorable(arr, np.dtype(np.float32))
        if problem is not None:
            index = np.unravel_index(problem[0], arr.shape)
            raise ValueError(_inexact_reward_error(f"{name}[{', '.join(map(str, index))}]",
                                                   int(arr[index])))
    if arr.dtype.kind == 'f':
        bad = unstorable_rewards(arr)
        if bad is not None:
            index = np.unravel_index(int(np.argmax(bad)), arr.shape)
            raise ValueError(_reward_error(f"{name}[{', '.join(map(str, index))}]",
                                           float(arr[index])))
    return arr.astype(np.float32)


def unstorable_rewards(rewards: np.ndarray) -> np.ndarray | None:
    """The rule for float rewards, on an array: None when float32 stores every one, else a
    bool mask of those it can not (NaN, inf, beyond float32's range). One comparison in the
    common case: the acting path checks a whole step with it. (The C kernels' fast paths
    decline such rewards, and the numpy path then applies this rule.)"""
    with np.errstate(over='ignore', invalid='ignore'):
        # A sum of squares that is finite and within float32's range squared means every
        # reward is: one product, a fraction of the reduction's cost on a step's few rewards.
        # (Up to float64, whose rounding of the sum can not hide a value above the limit.)
        if rewards.ndim == 1 and rewards.dtype.kind == 'f' and rewards.dtype.itemsize <= 8 \
                and float(rewards.dot(rewards)) <= _FLOAT32_MAX_SQUARED:
            return None
        if np.abs(rewards).max(initial=0.0) <= _FLOAT32_MAX:
            return None
        return ~(np.abs(rewards) <= _FLOAT32_MAX)


def unstorable_frames(frames: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """The rule of :func:`as_frame` for frames already of the memory's ``dtype`` (the acting
    path's buffers): None when every frame can be stored, else a bool mask over the frames of
    those that can not (only a float memory refuses values of its own dtype: NaN and inf)."""
    if dtype.kind != 'f' or np.isfinite(frames).all():
        return None
    return ~np.isfinite(frames.reshape(len(frames), -1)).all(axis=1)


def check_actions(actions: ArrayLike, name: str = 'actions') -> np.ndarray:
    """``actions`` (any shape) as int32, refusing non-integer dtypes and values beyond int32."""
    arr = np.asarray(actions)
    if arr.dtype.kind not in 'iu':
        raise TypeError(f"{name} must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < _INT32_MIN or arr.max() > _INT32_MAX):
        raise ValueError(f"{name} has values in [{arr.min()}, {arr.max()}] that do not fit int32")
    return arr.astype(np.int32)


def check_flags(flags: ArrayLike, name: str) -> np.ndarray:
    """``flags`` (e.g. ``terminated`` of a batch) as a bool array; other dtypes are refused
    (as :func:`~expreplay._checks.check_bool` refuses 'no', 1.0 or NaN for one value)."""
    arr = np.asarray(flags)
    if arr.dtype != np.bool_:
        raise TypeError(f"{name} must be bools, got dtype {arr.dtype}")
    return arr


def lossy_float(src: np.dtype, dtype: np.dtype) -> bool:
    """Whether floats of ``src`` lose precision in a float memory of ``dtype`` that is narrower
    than float32 (float16). float64 into float32 is what a float32 memory is for: accepted."""
    return src.kind == 'f' and dtype.kind == 'f' and dtype.itemsize < min(src.itemsize, 4)


def _unstorable(arr, dtype, what='frames'):
    """Why ``arr`` can not be stored as ``dtype`` exactly: None, or (flat index or None, reason).

    Integers must fit (no wrap-around), bools hold 0 and 1 only, a float memory takes finite
    values within its range and integers it represents exactly (float32 rounds 2**40 + 1);
    float to int is lossy by kind. Rounding float64 fractions into float32 is accepted: it is
    what a float32 memory is for; rounding float32 or float64 into float16 (3 significant
    digits) is not, as it silently loses what the env computed (:func:`lossy_float`).
    """
    src = arr.dtype
    if src.kind not in 'biuf':
        return None, f"has dtype {src}, which can not be stored as {dtype} without losing data"
    if dtype.kind in 'iu':
        if src.kind == 'f':
            return None, f"has dtype {src}, which can not be stored as {dtype} without losing data"
        if src.kind in 'iu' and arr.size and src != dtype:
            info = np.iinfo(dtype)
            bad = (arr < info.min) | (arr > info.max)
            if bad.any():
                return int(np.argmax(bad)), (f"has values in [{arr.min()}, {arr.max()}] that do "
                                             f"not fit the memory dtype {dtype}")
        return None
    if dtype.kind == 'b':
        if src.kind == 'f':
            return None, f"has dtype {src}, which can not be stored as {dtype} without losing data"
        if src.kind in 'iu':
            bad = (arr != 0) & (arr != 1)
            if bad.any():
                k = int(np.argmax(bad))
                return k, f"holds {arr.flat[k]}: a bool memory takes 0 and 1 only"
        return None
    # A float memory.
    finfo = np.finfo(dtype)
    if lossy_float(src, dtype):
        return None, (f"has dtype {src}, which a {dtype} memory would round to "
                      f"{finfo.precision} significant digits: store it in a memory of "
                      f"dtype='float32', or convert the observations to {dtype} yourself")
    if src.kind == 'f':
        if src == dtype and np.isfinite(arr).all():
            return None
        with np.errstate(invalid='ignore', over='ignore'):
            bad = ~(np.abs(arr) <= finfo.max)
        if bad.any():
            k = int(np.argmax(bad))
            v = float(arr.flat[k])
            what = ('a NaN' if math.isnan(v) else 'an inf' if math.isinf(v)
                    else f"{v:g}, beyond the range of {dtype}")
            return k, f"holds {what}, which can not be stored as {dtype}: {what} must be finite"
        return None
    if src.kind in 'iu' and src.itemsize * 8 > finfo.nmant + 1:
        # Exact iff the odd part of |v| has at most nmant + 1 bits (int64 fits float32's range).
        limit = 2 ** (finfo.nmant + 1)
        big = (arr > limit) | (arr < -limit)
        if big.any():
            v = arr[big]
            u = v.astype(np.uint64) if src.kind == 'u' else \
                np.where(v < 0, -v.astype(np.int64), v.astype(np.int64)).view(np.uint64)
            odd = u // (u & (~u + np.uint64(1)))
            inexact = odd >= np.uint64(limit)
            if inexact.any():
                k = int(np.flatnonzero(big.reshape(-1))[int(np.argmax(inexact))])
                return k, (f"holds the integer {arr.flat[k]}, which {dtype} can not represent "
                           "exactly (use a wider float dtype or an integer memory)")
    return None


def as_frame(obs: ArrayLike, state_shape: tuple[int, ...], dtype: np.dtype,
             name: str) -> np.ndarray:
    """``obs`` as an array of ``state_shape`` that can be stored as ``dtype`` without loss.

    Raises ValueError (wrong shape, values out of range: integer overflow, NaN or inf or
    beyond the range of a float memory, integers a float dtype would round) or TypeError (a
    lossy dtype, e.g. float to int), naming ``name``. Shared by the writers and the runners'
    frame format, so one rule decides what may enter the memory (:func:`check_frames` is its
    batch form).
    """
    arr = np.asarray(obs)
    if arr.shape != state_shape:
        raise ValueError(f"{name} has shape {arr.shape}, expected state_shape {state_shape}")
    problem = _unstorable(arr, dtype)
    if problem is not None:
        raise (TypeError if problem[0] is None else ValueError)(f"{name} {problem[1]}")
    return arr


def check_frames(frames: ArrayLike, state_shape: tuple[int, ...], dtype: np.dtype,
                 name: str) -> np.ndarray:
    """A batch of frames ``(n, *state_shape)`` that can be stored as ``dtype`` without loss.

    The rule of :func:`as_frame` for many frames at once; an error names the first bad frame
    (``name[i]``).
    """
    arr = np.asarray(frames)
    if arr.shape[1:] != tuple(state_shape) or arr.ndim != len(state_shape) + 1:
        raise ValueError(f"{name} has shape {arr.shape}, expected (n, *state_shape) with "
                         f"state_shape {tuple(state_shape)}")
    problem = _unstorable(arr, dtype)
    if problem is not None:
        index, reason = problem
        if index is None:
            raise TypeError(f"{name} {reason}")
        frame_size = max(1, int(np.prod(state_shape)))
        raise ValueError(f"{name}[{index // frame_size}] {reason}")
    return arr


# ------------------------------------------------------------------ extra per-step fields
def check_extra_fields(extra_fields, name='extra_fields'):
    """``extra_fields`` (a mapping of field name to dtype, or None) as a dict of numpy dtypes.

    Names are identifiers (they become checkpoint table and Minari info names); dtypes are
    bool, integer or float (one scalar per step).
    """
    if extra_fields is None:
        return {}
    if not hasattr(extra_fields, 'items'):
        raise TypeError(f"{name} must be a dict of field name to dtype, got "
                        f"{type(extra_fields).__name__}")
    out = {}
    for field, dtype in extra_fields.items():
        if not isinstance(field, str) or not field.isidentifier():
            raise ValueError(f"{name}: field names must be identifiers, got {field!r}")
        # native byte order: the stored array's dtype is then named by its name alone
        out[field] = check_dtype(dtype, f"{name}[{field!r}]").newbyteorder('=')
    return out


def check_extras(extras, fields, n=None, name='extras'):
    """The extras of one call: a dict with exactly the memory's ``fields`` (name -> dtype).

    ``n=None``: one step, each value a scalar; else ``n`` steps, each value an array of ``n``.
    Returns name -> array of ``max(n, 1)`` values in the field's dtype. Raises ValueError naming
    the field for an unknown or missing field, a wrong shape, or values the field's dtype can
    not hold exactly (the frames' rule: no integer overflow, no float into an integer field,
    finite floats), TypeError when ``extras`` is not a dict.
    """
    if extras is None:
        extras = {}
    elif not hasattr(extras, 'items'):
        raise TypeError(f"{name} must be a dict of field name to values, got "
                        f"{type(extras).__name__}")
    if extras.keys() != fields.keys():
        unknown = sorted(set(extras) - set(fields), key=str)
        if unknown:
            raise ValueError(f"{name}: unknown field {unknown[0]!r} (the memory's extra_fields "
                             f"are {sorted(fields)})")
        missing = sorted(set(fields) - set(extras))
        raise ValueError(f"{name}: missing field {missing[0]!r} (every step carries every "
                         f"extra field: {sorted(fields)})")
    out = {}
    for field, dtype in fields.items():
        arr = np.asarray(extras[field])
        where = f"{name}[{field!r}]"
        expected = () if n is None else (n,)
        if arr.shape != expected:
            raise ValueError(f"{where} has shape {arr.shape}, expected {expected} "
                             f"({'one value' if n is None else 'one value per lane of the call'})")
        problem = _unstorable(arr, dtype, what='extras')
        if problem is not None:
            raise ValueError(f"{where} {problem[1]} (field dtype {dtype})")
        out[field] = arr.astype(dtype).reshape(-1)
    return out
