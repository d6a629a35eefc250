"""The optional extras: which modules each one provides, and the error when one is missing.

Nothing here imports an extra's modules: :func:`missing_modules` asks the import system whether
they can be found (``importlib.util.find_spec``), so that ``import expreplay`` and
``python -m expreplay`` stay numpy-only.
"""

import importlib.util
import sys

# extra -> the top-level modules it installs (import names, not distribution names).
EXTRA_MODULES = {
    'atari': ('gymnasium', 'ale_py', 'cv2'),
    'tensorpack': ('tensorflow', 'tf_keras', 'tensorpack', 'tqdm'),
    'minari': ('minari', 'h5py', 'PIL'),
    'ray': ('ray', 'gymnasium'),
    'envpool': ('envpool',),
    'minatar': ('minatar', 'gymnasium'),
    'jax': ('jax', 'flax', 'optax'),
    'torch': ('torch',),
    'test': ('pytest', 'pytest_timeout', 'xdist', 'tqdm', 'matplotlib', 'mypy'),
}
# 'all' is every extra above (pyproject.toml: expreplay[atari,tensorpack,...,test]).
EXTRA_MODULES['all'] = tuple(dict.fromkeys(m for mods in EXTRA_MODULES.values() for m in mods))


def _findable(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None      # None: blocked (an import of it fails)
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    # A bare directory of that name (the session directory Ray leaves in the temporary
    # directory, say, when run from there) is found as a namespace package without an
    # origin: not the installed package.
    return spec is not None and spec.origin is not None


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` (a key of ``EXTRA_MODULES``) that can not be imported."""
    return [m for m in EXTRA_MODULES[extra] if not _findable(m)]


def extra_import_error(feature: str, extra: str, err: BaseException) -> ImportError:
    """The ImportError to raise (``from err``) when ``feature`` needs ``extra`` and ``err`` says
    one of its modules is missing or broken."""
    return ImportError(f"{feature} needs the {extra} extra ({err}): "
                       f"pip install 'expreplay[{extra}]'")


def require_extra(feature: str, extra: str) -> None:
    """Raise the ImportError naming ``extra`` (and its modules that are missing) unless every
    module of it can be imported; nothing is imported.

    For a script that imports an extra's packages itself (the JAX examples import ``flax.linen``):
    called before those imports, a missing package is named with the extra that installs it,
    not as a bare ``ModuleNotFoundError: No module named 'flax.linen'``::

        require_extra('examples/dqn_minatar_jax.py', 'jax')
    """
    missing = missing_modules(extra)
    if missing:
        raise ImportError(f"{feature} needs the {extra} extra (missing: {', '.join(missing)}): "
                          f"pip install 'expreplay[{extra}]'", name=missing[0])
