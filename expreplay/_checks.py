"""Argument checks shared by every public constructor and call.

One rule per kind of argument, each raising an error that names the argument, so that the same
bad value is refused the same way wherever it is passed (``ReplayMemory``, ``EnvRunner``,
``EnvRunnerManager``, ``ReplayStream``, ``ExpReplay``).
"""

import math
import numbers
from collections.abc import Sequence
from typing import Any, Literal, TypeVar, overload

import numpy as np

_T = TypeVar('_T')

__all__ = ['check_int', 'check_probability', 'check_timeout', 'check_real', 'check_bool',
           'check_callable', 'check_shape', 'check_dtype', 'check_seed', 'check_rng', 'check_choice',
           'check_allocatable', 'format_bytes']


def check_int(value: Any, name: str, minimum: int | None = None, maximum: int | None = None, *,
              allow_float: bool = False) -> int:
    """``value`` as an int, refusing bools, strings and fractions.

    ``allow_float``: a whole float (``1e6``, which tensorpack's DQN.py passes as a size) is
    accepted; ``4.9``, ``inf`` and NaN are not.
    """
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, numbers.Integral):
        out = int(value)
    elif allow_float and isinstance(value, numbers.Real):
        if not math.isfinite(value) or value != math.floor(value):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        out = int(math.floor(value))
    else:
        raise TypeError(f"{name} must be an integer, got {value!r}")
    return _in_range(out, value, name, minimum, maximum)


def _in_range(out: Any, value: Any, name: str, minimum: float | None, maximum: float | None) -> Any:
    if minimum is not None and out < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    if maximum is not None and out > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value!r}")
    return out


def check_real(value: Any, name: str, minimum: float | None = None, maximum: float | None = None, *,
               finite: bool = True) -> float:
    """``value`` as a float; bools and non-numbers refused, NaN always, inf unless not ``finite``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    out = float(value)
    if math.isnan(out) or (finite and math.isinf(out)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return _in_range(out, value, name, minimum, maximum)


def check_probability(value: Any, name: str) -> float:
    """A probability in [0, 1]."""
    if type(value) is float and 0.0 <= value <= 1.0:     # the per-step case, first
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) \
            or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
    return float(value)


@overload
def check_timeout(value: Any, name: str, *, allow_none: Literal[False] = False) -> float: ...
@overload
def check_timeout(value: Any, name: str, *, allow_none: bool) -> float | None: ...
def check_timeout(value: Any, name: str, *, allow_none: bool = False) -> float | None:
    """Seconds to wait: >= 0; ``float('inf')`` means wait forever (returned as None when
    ``allow_none``, the form ``threading`` waits take); negative or NaN refused."""
    if value is None and allow_none:
        return None
    out = check_real(value, name, minimum=0.0, finite=False)
    if math.isinf(out):
        return None if allow_none else out
    return out


def check_bool(value: Any, name: str) -> bool:
    """A bool (numpy's too, or the integers 0 and 1); 'no', 1.0 or NaN are refused."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {value!r}")


def check_callable(value: _T, name: str, *, allow_none: bool = False) -> _T:
    """``value``, refused unless callable (or None when allowed)."""
    if value is None and allow_none:
        return value
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {value!r}")
    return value


def check_shape(value: Any, name: str, *, min_rank: int = 1, max_rank: int = 3) -> tuple[int, ...]:
    """A frame shape as a tuple of positive ints: an int ``n`` means ``(n,)``.

    Strings (``'84'`` would read as ``(8, 4)``), floats and bools are refused, whole floats too:
    a shape comes from an array's ``.shape``, never from arithmetic.
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        value = (value,)
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list, np.ndarray)):
        raise TypeError(f"{name} must be a tuple of ints, got {value!r}")
    dims = []
    for d in value:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, numbers.Integral):
            raise TypeError(f"{name} must be a tuple of ints, got {tuple(value)!r}")
        dims.append(int(d))
    if not min_rank <= len(dims) <= max_rank or min(dims, default=1) < 1:
        raise ValueError(f"{name} must have rank {min_rank} to {max_rank} and positive sizes, "
                         f"got {tuple(dims)}")
    return tuple(dims)


def check_dtype(value: Any, name: str, kinds: str = 'biuf') -> np.dtype:
    """A numpy dtype of one of ``kinds`` (numpy's kind letters); None is refused (numpy would
    read it as float64)."""
    if value is None:
        raise TypeError(f"{name} must be a numpy dtype, got None")
    try:
        out = np.dtype(value)
    except TypeError:
        raise TypeError(f"{name} must be a numpy dtype, got {value!r}") from None
    if out.kind not in kinds:
        raise TypeError(f"{name} must be a boolean, integer or float dtype, got {out}")
    return out


@overload
def check_seed(value: Any, name: str = ..., *, allow_none: Literal[False]) -> int: ...
@overload
def check_seed(value: Any, name: str = ..., *, allow_none: bool = ...) -> int | None: ...
def check_seed(value: Any, name: str = 'seed', *, allow_none: bool = True) -> int | None:
    """A seed: a non-negative int (or None when allowed)."""
    if value is None and allow_none:
        return None
    return check_int(value, name, minimum=0)


def check_rng(value: Any, name: str = 'rng', *, allow_none: bool = True) -> Any:
    """A ``numpy.random.Generator`` or legacy ``RandomState`` (or None when allowed)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, (np.random.Generator, np.random.RandomState)):
        raise TypeError(f"{name} must be a numpy.random.Generator or RandomState, got {value!r}; "
                        "pass numpy.random.default_rng(seed) to seed it")
    return value


def check_choice(value: Any, name: str, choices: Sequence[str]) -> str:
    """One of the strings ``choices``."""
    if isinstance(value, str) and value in choices:
        return value
    raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def format_bytes(n: float) -> str:
    """``n`` bytes for a message: ``'512 B'``, ``'1.50 MB'``, ..., ``'3.20 TB'``."""
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ('KB', 'MB', 'GB'):
        n /= 1024
        if n < 1024:
            return f"{n:.2f} {unit}"
    return f"{n / 1024:.2f} TB"


def check_allocatable(nbytes: int, what: str, advice: str) -> None:
    """Refuse, before anything is allocated, a size this machine can not allocate.

    numpy's own MemoryError says neither how much was asked nor why; this one says that
    ``what`` needs ``nbytes`` and gives ``advice``. The probe is one ``numpy.empty`` of
    ``nbytes``, freed at once: it reserves address space and touches no page (as the
    allocation it stands for, lazily mapped zeros), so it costs microseconds whatever the size.
    """
    try:
        probe = np.empty(int(nbytes), np.uint8)
    except (MemoryError, ValueError) as err:      # ValueError: beyond numpy's maximum size
        raise MemoryError(f"{what} needs about {format_bytes(nbytes)}, more than this machine "
                          f"can allocate; {advice}") from err
    del probe
