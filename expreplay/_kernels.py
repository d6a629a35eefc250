"""The optional C kernels: one registry of what is built, and one switch to run without them.

setup.py builds each kernel when a C compiler is there; every one is a shortcut for a numpy path
that does the same (the tests run both). The rule, one moment: an object that calls a kernel
asks :func:`get` for it when it is built (a writer for the ring's write binding, a memory's
sampler, a prioritized memory's sampling distribution for its trees, a priority tree, an acting
group's policy and frame history), keeps it in an attribute and uses that attribute
afterwards; so an object keeps the path it was built with. (A path switched under a live object
would mix layouts or caches: a binding made for one path, a tree summed in another order.)
Module-level functions never ask: the object that calls them gives them its kernel.

:func:`numpy_only` is the one switch: objects built inside it use numpy, as on a machine
without a compiler. ``python -m expreplay`` (:mod:`expreplay._info`) reports :data:`KERNELS`.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Iterator
from types import ModuleType

__all__ = ['KERNELS', 'get', 'loaded', 'numpy_only']

# name -> (module, what it speeds up).
KERNELS = {
    '_gather_ext': ('expreplay.storage._gather_ext',
                    'the sampler: draws, n-step walks, states gathered in one pass'),
    '_write_ext': ('expreplay.storage._write_ext',
                   "the ring's common writes: add_step, start_episode, a batch of steps"),
    '_tree_ext': ('expreplay.storage._tree_ext', "the priority tree's draws and updates"),
    '_acting_ext': ('expreplay.acting._acting_ext',
                    "an acting step's draws, greedy actions, state rows and frame histories"),
}

_modules: dict[str, ModuleType | None] = {}
_lock = threading.Lock()
_numpy_only = 0     # the depth of numpy_only() blocks open (any thread)


def loaded(name: str) -> ModuleType | None:
    """The kernel ``name`` of :data:`KERNELS` if it is built (imported once), else None;
    whatever :func:`numpy_only` says."""
    if name not in _modules:
        try:
            module: ModuleType | None = importlib.import_module(KERNELS[name][0])
        except ImportError:
            module = None
        _modules[name] = module
    return _modules[name]


def get(name: str) -> ModuleType | None:
    """The kernel ``name`` to use now: None inside :func:`numpy_only` or when it is not built."""
    return None if _numpy_only else loaded(name)


@contextlib.contextmanager
def numpy_only() -> Iterator[None]:
    """Inside the block, objects being built take the numpy path of every kernel (the C one
    they would have taken is a shortcut for it). Objects built before keep theirs."""
    global _numpy_only
    with _lock:
        _numpy_only += 1
    try:
        yield
    finally:
        with _lock:
            _numpy_only -= 1
