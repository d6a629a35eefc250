"""`expreplay.info()` / `python -m expreplay`, and the ImportError of an integration whose extra
is missing. A missing module is simulated in a subprocess with ``sys.modules[name] = None``."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import expreplay
from expreplay import _extras, _info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)


def test_info_reports_version_kernels_and_extras():
    data = expreplay.info()
    assert data['version'] == expreplay.__version__
    assert set(data['kernels']) == {'_gather_ext', '_write_ext', '_acting_ext', '_tree_ext'}
    # A kernel is reported active exactly when the registry the modules ask has it loaded.
    from expreplay import _kernels
    for name in data['kernels']:
        assert data['kernels'][name] == (_kernels.loaded(name) is not None)
    assert set(data['extras']) == set(_extras.EXTRA_MODULES)
    assert 'pytest' not in data['missing'].get('test', [])     # this suite runs under pytest
    for extra, ok in data['extras'].items():
        assert ok == (extra not in data['missing'])


def test_info_imports_no_extra_and_sees_a_blocked_module():
    out = run_python("""
        import json, sys
        sys.modules['ray'] = None                       # as if Ray were not installed
        sys.modules['expreplay.storage._tree_ext'] = None       # as if the kernel were not built
        import expreplay
        data = expreplay.info()
        heavy = [m for m in ('tensorflow', 'tensorpack', 'minari', 'envpool', 'torch', 'cv2')
                 if sys.modules.get(m) is not None]
        print(json.dumps({'info': data, 'heavy': heavy}))
    """)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result['heavy'] == []
    data = result['info']
    assert data['extras']['ray'] is False
    assert data['missing']['ray'] == ['ray']
    assert data['kernels']['_tree_ext'] is False


def test_python_m_expreplay_prints_the_report():
    out = run_python("""
        import runpy, sys
        sys.modules['expreplay.storage._gather_ext'] = None
        sys.modules['minatar'] = None
        runpy.run_module('expreplay', run_name='__main__')
    """)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f'expreplay {expreplay.__version__} (Python ')
    assert any(line.split()[:2] == ['_gather_ext', 'not'] for line in lines), out.stdout
    assert any(line.split()[:3] == ['minatar', 'missing', 'minatar'] for line in lines), out.stdout
    # the real command works too
    env = dict(os.environ, PYTHONPATH=ROOT)
    real = subprocess.run([sys.executable, '-m', 'expreplay'], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert real.returncode == 0 and real.stdout.startswith('expreplay '), real.stderr


@pytest.mark.parametrize('blocked, statement, extra', [
    ('tensorpack', 'from expreplay import ExpReplay', 'tensorpack'),
    ('tensorflow', 'from expreplay.tensorpack_io import ExpReplay', 'tensorpack'),
    ('ray', 'from expreplay import RayVectorEnv', 'ray'),
    ('gymnasium', 'from expreplay.ray import RayVectorEnv', 'ray'),
])
def test_a_missing_extra_is_named_with_the_original_error_chained(blocked, statement, extra):
    out = run_python(f"""
        import sys
        sys.modules[{blocked!r}] = None
        try:
            {statement}
        except ImportError as err:
            print(err)
            print(type(err.__cause__).__name__, err.__cause__)
        else:
            print('imported')
    """)
    assert out.returncode == 0, out.stderr
    message, cause = out.stdout.splitlines()[-2:]   # tensorpack may print first
    assert f"needs the {extra} extra" in message
    assert f"pip install 'expreplay[{extra}]'" in message
    assert cause.startswith('ImportError') or cause.startswith('ModuleNotFoundError'), cause
    assert blocked in cause


def test_a_missing_minari_is_named():
    out = run_python("""
        import sys
        sys.modules['minari'] = None
        from expreplay import ReplayMemory, export_minari
        try:
            export_minari(ReplayMemory(10, (2,), 1), 'x/y-v0')
        except ImportError as err:
            print(err)
            print(type(err.__cause__).__name__)
    """)
    assert out.returncode == 0, out.stderr
    message, cause = out.stdout.splitlines()[-2:]   # tensorpack may print first
    assert "pip install 'expreplay[minari]'" in message
    assert cause in ('ImportError', 'ModuleNotFoundError')


def test_a_bare_directory_of_the_name_is_not_an_installed_package(tmp_path, monkeypatch):
    # Ray leaves a directory named ray in the temporary directory: run from there, `import ray`
    # finds it as a namespace package. It must not count as the extra being installed.
    (tmp_path / 'expreplay_test_pkg').mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(_extras.EXTRA_MODULES, 'fake', ('expreplay_test_pkg', 'json'))
    assert _extras.missing_modules('fake') == ['expreplay_test_pkg']
    (tmp_path / 'expreplay_test_pkg' / '__init__.py').write_text('')
    import importlib
    importlib.invalidate_caches()
    assert _extras.missing_modules('fake') == []


def _pyproject_extras():
    import tomllib
    with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
        return tomllib.load(f)['project']['optional-dependencies']


def test_every_extra_of_pyproject_is_listed_with_the_modules_it_installs():
    # `python -m expreplay` lists every extra pyproject.toml defines (jax and all included),
    # and each extra's entry names a module of each distribution it installs.
    import importlib.metadata
    import re
    extras = _pyproject_extras()
    assert list(_extras.EXTRA_MODULES) == list(extras)
    provides = {}     # distribution (normalized) -> the top-level modules it installs
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            provides.setdefault(re.sub(r'[-_.]+', '-', dist).lower(), set()).add(module)
    for extra, requirements in extras.items():
        if extra == 'all':
            inner = re.match(r'expreplay\[(.*)\]$', requirements[0]).group(1).split(',')
            assert set(inner) == set(extras) - {'all'}
            assert set(_extras.EXTRA_MODULES['all']) == {
                m for e in inner for m in _extras.EXTRA_MODULES[e]}
            continue
        for requirement in requirements:
            dist = re.sub(r'[-_.]+', '-', re.match(r'[A-Za-z0-9._-]+', requirement).group()).lower()
            if dist not in provides:        # not installed here (envpool off Linux): can't map it
                continue
            assert provides[dist] & set(_extras.EXTRA_MODULES[extra]), (extra, requirement)
    lines = _info.report().splitlines()
    listed = lines[lines.index("extras (pip install 'expreplay[NAME]'):") + 1:]
    assert [line.split()[0] for line in listed] == list(extras)


def test_a_script_needing_an_extra_names_it_instead_of_the_bare_module():
    # The JAX examples import flax.linen themselves: require_extra before those imports says
    # which extra to install, not "No module named 'flax.linen'".
    out = run_python("""
        import sys
        sys.modules['flax'] = None                      # as if flax were not installed
        from expreplay._extras import require_extra
        require_extra('examples/dqn_atari_jax.py', 'atari')      # complete: nothing raised
        try:
            require_extra('examples/dqn_atari_jax.py', 'jax')
        except ImportError as err:
            print(err)
        else:
            print('imported')
    """)
    assert out.returncode == 0, out.stderr
    message = out.stdout.splitlines()[-1]
    assert message == ("examples/dqn_atari_jax.py needs the jax extra (missing: flax): "
                       "pip install 'expreplay[jax]'"), message
