"""Every ```python block of README.md and docs/*.md runs as is.

Each block runs in its own interpreter, in a fresh directory (files it writes land there; Minari
datasets too). A block that imports an optional package which is not installed is skipped,
naming it (CI installs every extra, so there every block runs). A block that can not run as is
must not be a python block: the docs show such code as ```text or ```diff.
"""

import ast
import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(ROOT, 'README.md')] + sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))
FENCE = re.compile(r'^```(\S*)\s*$')


def python_blocks(path):
    """(first line number, code) of every ```python block of a Markdown file."""
    blocks, lang, start, lines = [], None, 0, []
    with open(path, encoding='utf-8') as f:
        for number, line in enumerate(f, 1):
            m = FENCE.match(line.rstrip('\n'))
            if m and lang is None:
                lang, start, lines = m.group(1) or 'text', number + 1, []
            elif line.startswith('```') and lang is not None:
                if lang == 'python':
                    blocks.append((start, ''.join(lines)))
                lang = None
            elif lang is not None:
                lines.append(line)
    assert lang is None, f"{path}: a code block opened at line {start - 1} is not closed"
    return blocks


BLOCKS = [(os.path.relpath(path, ROOT), start, code)
          for path in DOCS for start, code in python_blocks(path)]


def imported_modules(code):
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split('.')[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split('.')[0])
    return names


def test_the_docs_have_python_blocks():
    files = {path for path, _, _ in BLOCKS}
    assert 'README.md' in files and len(BLOCKS) >= 10, files


# A block that starts Ray takes seconds to start it: slow, as the other tests of Ray actors (and
# run by their pytest-xdist worker, conftest.WORKER_GROUPS: one Ray at a time).
@pytest.mark.parametrize('path, start, code', [
    pytest.param(path, start, code, id=f'{path}:{start}',
                 marks=[pytest.mark.slow] if 'ray' in imported_modules(code) else [])
    for path, start, code in BLOCKS])
def test_python_block_runs(path, start, code, tmp_path):
    missing = sorted(m for m in imported_modules(code) if importlib.util.find_spec(m) is None)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''),
               MINARI_DATASETS_PATH=str(tmp_path / 'minari'), RAY_DEDUP_LOGS='0')
    script = tmp_path / 'snippet.py'
    script.write_text(code, encoding='utf-8')
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, (f"{path}, the block at line {start} failed:\n"
                                 f"{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
