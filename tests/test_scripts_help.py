"""Every script in benchmarks/ and examples/ answers ``--help`` from a clone (exit 0, a usage
line), and bench_population.py runs without the tensorpack reference, skipping its rows."""

import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(os.path.relpath(p, ROOT) for d in ('benchmarks', 'examples')
                 for p in glob.glob(os.path.join(ROOT, d, '*.py')))


def _env():
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))


@pytest.fixture(scope='module')
def helps(tmp_path_factory):
    """Every script's ``--help``, started at once (a few of them import TensorFlow first),
    from a directory outside the clone so that no script depends on the working directory."""
    cwd = tmp_path_factory.mktemp('elsewhere')
    procs = {s: subprocess.Popen([sys.executable, os.path.join(ROOT, s), '--help'], cwd=cwd,
                                 env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
             for s in SCRIPTS}
    results = {}
    try:
        for script, proc in procs.items():
            out, err = proc.communicate(timeout=150)
            results[script] = (proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def test_the_scripts_are_found():
    assert 'benchmarks/bench_population.py' in SCRIPTS and 'examples/numpy_stream.py' in SCRIPTS


@pytest.mark.parametrize('script', SCRIPTS)
def test_every_script_has_help(helps, script):
    rc, out, err = helps[script]
    assert rc == 0, err[-2000:]
    assert out.startswith('usage: '), out[:500]


def test_bench_population_without_the_reference_skips_its_rows(tmp_path):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'benchmarks', 'bench_population.py'),
         '--rows', 'machinery-1', 'vector-64', '--rounds', '1', '--seconds', '0.05',
         '--warmup', '0.01', '--memory-size', '2000'],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert 'skipping machinery-1' in out.stdout and '--reference PATH' in out.stdout
    table = [line for line in out.stdout.splitlines() if line.startswith('| ')]
    assert [line.split('|')[1].strip() for line in table[1:]] == ['vector-64', 'vector-64']
