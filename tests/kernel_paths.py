"""The tests' one switch between the optional C kernels and the numpy path they shortcut
(:func:`expreplay._kernels.numpy_only`), for fixtures that run a test both ways.

An object takes its kernels when it is built and keeps them (:mod:`expreplay._kernels`): build
what a test runs on a path inside :func:`kernel_path`; using it outside changes nothing. Never
patch a module or a kernel attribute instead (``tests/test_layout.py`` looks for that)."""

import contextlib

import pytest

from expreplay import _kernels

PATHS = ['C kernels', 'numpy']


@contextlib.contextmanager
def kernel_path(path, *needed):
    """``path`` ``'numpy'``: everything built inside the block takes the numpy path. Else the C
    kernels: the test is skipped unless each of ``needed`` (names of
    :data:`expreplay._kernels.KERNELS`) is in use here: built, and not inside ``numpy_only()``
    (``pytest --kernels numpy`` runs the whole suite inside it)."""
    if path == 'numpy':
        with _kernels.numpy_only():
            yield
        return
    missing = [name for name in needed if _kernels.get(name) is None]
    if missing:
        pytest.skip(f"the C kernels {missing} are not in use here (not built, or --kernels numpy)")
    yield
