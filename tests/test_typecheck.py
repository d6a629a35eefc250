"""The package's types: mypy (configured in pyproject.toml) finds no error, and the public API
is annotated, so that a user's editor and type checker see what each call takes and returns.
"""

import importlib
import inspect
import os
import pkgutil
import subprocess
import sys

import expreplay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mypy_finds_no_error():
    # From the repository root, so that mypy reads pyproject.toml's [tool.mypy] (the files to
    # check among them) as a developer's `python -m mypy` does.
    proc = subprocess.run([sys.executable, '-m', 'mypy'], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert proc.returncode == 0, f"mypy reports errors:\n{proc.stdout}\n{proc.stderr}"


# What counts as public: every module of the package none of whose dotted name's parts starts
# with '_' (expreplay, expreplay.storage, expreplay.ray.vector_env, ...); in each, the names in
# its __all__ that the package defines (functions and classes, re-exports counted once); of a
# public class, its constructor (__init__) and every method and property whose name does not
# start with '_', its own or inherited from another class of the package (not those of a base
# from another library, gymnasium's VectorEnv say). A module that can not be imported because
# an optional extra is missing is left out.

def _public_modules():
    names = ['expreplay']
    for found in pkgutil.walk_packages(expreplay.__path__, 'expreplay.'):
        if not any(part.startswith('_') for part in found.name.split('.')):
            names.append(found.name)
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue
    return modules


def _ours(obj):
    return (getattr(obj, '__module__', None) or '').split('.')[0] == 'expreplay'


def _public_objects():
    """``{qualified name: function or class}`` of the public API, and the names listed in an
    ``__all__`` that its module does not have."""
    seen, out, absent = set(), {}, []
    for module in _public_modules():
        for name in getattr(module, '__all__', ()):
            try:
                obj = getattr(module, name)
            except ImportError:         # a lazy name of an extra that is not installed
                continue
            except AttributeError:
                absent.append(f'{module.__name__}.{name}')
                continue
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and _ours(obj) and id(obj) not in seen:
                seen.add(id(obj))
                out[f'{obj.__module__}.{obj.__qualname__}'] = obj
    return out, absent


def _callables_of(cls):
    """``{name: (function, is_method)}``: the constructor, public methods and property getters
    that ``cls`` defines or inherits from the package's classes."""
    out = {}
    for klass in reversed(cls.__mro__):
        if not _ours(klass):
            continue
        for name, attr in vars(klass).items():
            if name != '__init__' and name.startswith('_'):
                continue
            if isinstance(attr, staticmethod):
                out[name] = (attr.__func__, False)
            elif isinstance(attr, classmethod):
                out[name] = (attr.__func__, True)
            elif isinstance(attr, property) and attr.fget is not None:
                out[name] = (attr.fget, True)
            elif inspect.isfunction(attr) and _ours(attr):
                # (not typing's placeholder __init__ that a Protocol class carries)
                out[name] = (attr, True)
    return out


def _missing_annotations(fn, is_method):
    """What of ``fn``'s signature is not annotated: parameter names, and 'return'."""
    params = list(inspect.signature(fn).parameters.values())
    if is_method:
        params = params[1:]          # self or cls
    missing = [p.name for p in params if p.annotation is inspect.Parameter.empty]
    if inspect.signature(fn).return_annotation is inspect.Signature.empty:
        missing.append('return')
    return missing


def test_public_api_is_annotated():
    objects, absent = _public_objects()
    unannotated = [f"{name}: listed in __all__, not defined" for name in absent]
    for qualname, obj in sorted(objects.items()):
        if inspect.isfunction(obj):
            members = {'': (obj, False)}
        else:
            members = {f'.{name}': fn for name, fn in _callables_of(obj).items()}
        for member, (fn, is_method) in members.items():
            missing = _missing_annotations(fn, is_method)
            if missing:
                unannotated.append(f"{qualname}{member}: {', '.join(missing)}")
    assert not unannotated, ("public API without annotations (what is missing):\n"
                             + '\n'.join(unannotated))
