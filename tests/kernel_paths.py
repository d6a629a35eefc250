"""The tests' one switch between the optional C kernels and the numpy path they shortcut
(:func:`expreplay._kernels.numpy_only`), for fixtures that run a test both ways."""

import contextlib

import pytest

from expreplay import _kernels

PATHS = ['C kernels', 'numpy']

# True while the whole suite runs on the numpy path (``pytest --kernels numpy``, conftest.py).
SUITE_ON_NUMPY = False


@contextlib.contextmanager
def kernel_path(path, *needed):
    """``path`` ``'numpy'``: everything built inside the block takes the numpy path. Else the C
    kernels: the test is skipped unless each of ``needed`` (names of
    :data:`expreplay._kernels.KERNELS`) is built here."""
    if SUITE_ON_NUMPY and path != 'numpy':
        pytest.skip("the suite runs on the numpy path (--kernels numpy)")
    if path == 'numpy':
        with _kernels.numpy_only():
            yield
        return
    missing = [name for name in needed if _kernels.loaded(name) is None]
    if missing:
        pytest.skip(f"the C kernels {missing} are not built here")
    yield
