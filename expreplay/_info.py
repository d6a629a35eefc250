"""What this installation of expreplay has: version, active C kernels, importable extras.

``python -m expreplay`` prints it; :func:`info` returns it as a dict. Neither imports TensorFlow,
Ray or any other extra (see ``expreplay._extras``).
"""

import platform
from typing import Any

import numpy as np

from . import _kernels
from ._extras import EXTRA_MODULES, missing_modules

# The optional C kernels setup.py builds, and what each one speeds up (each falls back to numpy).
KERNELS = {name: what for name, (_, what) in _kernels.KERNELS.items()}


def _kernel_active(name: str) -> bool:
    # The registry the modules using a kernel ask: they fall back to numpy when it is None.
    return _kernels.loaded(name) is not None


def info() -> dict[str, Any]:
    """A dict: ``version``, ``python``, ``numpy``, ``kernels`` (kernel name -> active),
    ``extras`` (extra name -> all its modules importable) and ``missing`` (extra name -> its
    modules that are not, for the extras that are not complete)."""
    from . import __version__
    missing = {extra: missing_modules(extra) for extra in EXTRA_MODULES}
    return {
        'version': __version__,
        'python': platform.python_version(),
        'numpy': np.__version__,
        'kernels': {name: _kernel_active(name) for name in KERNELS},
        'extras': {extra: not mods for extra, mods in missing.items()},
        'missing': {extra: mods for extra, mods in missing.items() if mods},
    }


def report(data: dict[str, Any] | None = None) -> str:
    """``info()`` as the lines ``python -m expreplay`` prints."""
    data = info() if data is None else data
    lines = [f"expreplay {data['version']} (Python {data['python']}, numpy {data['numpy']})",
             "C kernels (optional; numpy is used where one is not built):"]
    for name, active in data['kernels'].items():
        state = 'active' if active else 'not built: numpy fallback'
        lines.append(f"  {name:12} {state:27} {KERNELS[name]}")
    lines.append("extras (pip install 'expreplay[NAME]'):")
    for extra, ok in data['extras'].items():
        state = 'importable' if ok else 'missing ' + ', '.join(data['missing'][extra])
        lines.append(f"  {extra:12} {state}")
    return '\n'.join(lines)
