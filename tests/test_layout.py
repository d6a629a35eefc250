"""The package's shape: module and function sizes that keep each piece readable, and imports
that form no circle.

Read statically (the AST of every module under ``expreplay/``), so these checks import nothing.
A function counts from its ``def`` line to its last line (its docstring and
comments included: they are read too).
"""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, 'expreplay')

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _modules():
    """``{dotted name: (path, is_package)}`` for every Python module of the package."""
    found = {}
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if not d.startswith(('.', '__'))]
        for name in files:
            if name.endswith('.py'):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                is_package = parts[-1] == '__init__'
                if is_package:
                    parts = parts[:-1]
                found['.'.join(parts)] = (path, is_package)
    return found


MODULES = _modules()


def _tree(path):
    with open(path) as f:
        return ast.parse(f.read(), path)


def _span(node):
    return node.end_lineno - node.lineno + 1


def _oversized():
    too_long = []
    for name, (path, _) in sorted(MODULES.items()):
        tree = _tree(path)
        lines = len(open(path).read().splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f'module {name}: {lines} lines (at most {MAX_MODULE_LINES})')
        for node in ast.walk(tree):
            # Classes have no cap: a class is split by responsibility, never by a line count.
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and _span(node) > MAX_FUNCTION_LINES):
                too_long.append(f'function {name} {node.name}: {_span(node)} lines '
                                f'(at most {MAX_FUNCTION_LINES})')
    return too_long


def test_no_module_class_or_function_is_oversized():
    assert _oversized() == []


def _resolve(module, is_package, level, target):
    """The absolute name ``from <level dots><target> import ...`` refers to inside ``module``."""
    base = module.split('.')
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[:len(base) - (level - 1)]
    return '.'.join(base + ([target] if target else []))


def _imports(name, path, is_package):
    """The package modules ``name`` imports, wherever the import statement stands: at module
    level, under ``if TYPE_CHECKING:`` (a circle there is a circle in the design too), or
    inside a function (it runs later, which keeps a module light to import, but the
    dependency is the same: a circle hidden in a function is still a circle)."""
    out = set()
    for stmt in ast.walk(_tree(path)):
        if isinstance(stmt, ast.ImportFrom):
            if stmt.level:
                base = _resolve(name, is_package, stmt.level, stmt.module)
            else:
                base = stmt.module or ''
            for alias in stmt.names:
                sub = f'{base}.{alias.name}'
                out.add(sub if sub in MODULES else base)
        elif isinstance(stmt, ast.Import):
            out.update(alias.name for alias in stmt.names)
    # ``from . import _gather_ext`` (a compiled sub-module) names the module's own package: that
    # is not an import of the package's ``__init__``, which is already running.
    return {m for m in out if m in MODULES and m != name and m not in _parents(name)}


def _cycles():
    graph = {name: _imports(name, path, pkg) for name, (path, pkg) in MODULES.items()}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = 'open'
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 'open':
                cycles.append(' -> '.join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 'done'

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return cycles


def _parents(name):
    parts = name.split('.')
    return ['.'.join(parts[:i]) for i in range(1, len(parts))]


def test_no_import_circle_between_modules():
    assert _cycles() == []


def test_an_import_inside_a_function_or_for_type_checking_counts(tmp_path):
    source = tmp_path / 'sampling.py'
    source.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n"
                      "    from ..storage.memory import ReplayMemory\n"
                      "def build():\n"
                      "    from ..acting import population\n"
                      "    return population\n")
    assert _imports('expreplay.stream.sampling', str(source), False) == {
        'expreplay.storage.memory', 'expreplay.acting.population'}


# The tables (and counters) each object owns: only its own module assigns them or calls a mutating method on
# them through another name (``ring.flags[...] = ...``, ``prio.max_priority = ...``,
# ``ring.retired.append(...)``). Its own ``self.<table>`` is its business; any other object's
# attribute of that name elsewhere is a write of the owner's table from outside.
OWNED_TABLES = {
    'expreplay.storage.ring': {
        'frames', 'action', 'reward', 'epstep', 'flags', 'extras', 'block_fill', 'block_prev',
        'block_next', 'block_prev_intact', 'block_state', 'block_gen', 'free', 'retired',
        'abandoned', 'counts'},
    'expreplay.storage.priority': {'max_priority', 'stale_updates', '_pending'},
    # A runner's state is its own (its counters: the group tells it, the runner counts); the
    # acting group owns the lane map and the stepping state, which no runner holds.
    'expreplay.acting.runner': {'steps', 'restarts', 'total_scores',
                                'episodes_started', 'adapter', 'player', 'num_envs',
                                'num_actions'},
    'expreplay.acting.group': {'inserted'},
}
_MUTATORS = {'append', 'appendleft', 'extend', 'extendleft', 'pop', 'popleft', 'clear', 'fill',
             'put', 'itemset', 'remove', 'insert', 'update', 'setdefault', 'sort', 'resize'}


def _owned_attribute(node):
    """The attribute ``node`` writes into, through subscripts (``x.t[i][j]`` -> ``x.t``), as
    (base, attr); None if ``node`` is not such a target or its base is ``self``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if not isinstance(node, ast.Attribute):
        return None
    if isinstance(node.value, ast.Name) and node.value.id == 'self':
        return None
    return ast.unparse(node.value), node.attr


def _foreign_writes(source, module):
    """``'module:line base.attr'`` for every write of a table :data:`OWNED_TABLES` gives to
    another module than ``module``."""
    foreign = {attr: owner for owner, attrs in OWNED_TABLES.items() for attr in attrs
               if owner != module}
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in _MUTATORS:
            targets = [node.func.value]
        for target in targets:
            for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                hit = _owned_attribute(t)
                if hit is not None and hit[1] in foreign:
                    found.append(f'{module}:{node.lineno} {hit[0]}.{hit[1]} '
                                 f'(owned by {foreign[hit[1]]})')
    return found


def _table_writes():
    found = []
    for name, (path, _) in sorted(MODULES.items()):
        with open(path) as f:
            found += _foreign_writes(f.read(), name)
    return found


def test_only_the_owner_writes_its_tables():
    assert _table_writes() == []


@pytest.mark.parametrize('line', [
    'ring.flags[slots] = 0', 'self._ring.block_fill[b] += 1', 'ring.extras[name][cur] = v',
    'prio.max_priority = 2.0', 'ring.retired.put(3, 4)', 'a, ring.counts[0] = 1, 2'])
def test_the_ownership_check_sees_a_foreign_write(line):
    assert len(_foreign_writes(line, 'expreplay.storage.writers')) == 1
    assert _foreign_writes('self.flags[0] = 1\nring.flags[0]', 'expreplay.acting.lanes') == []


def _kernel_switches():
    """Imports of a C kernel (a module named ``*_ext``) outside the registry
    ``expreplay._kernels``, and tests that switch a kernel off by patching a module instead of
    the registry's one switch (``numpy_only()``)."""
    found = []
    for name, (path, _) in sorted(MODULES.items()):
        if name == 'expreplay._kernels':
            continue
        for node in ast.walk(_tree(path)):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ''] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith('expreplay.') and node.value.endswith('_ext'):
                names = [node.value]
            if any(n.split('.')[-1].endswith('_ext') for n in names):
                found.append(f'{name}:{node.lineno} imports a kernel')
    tests = os.path.join(ROOT, 'tests')
    for folder, _, files in os.walk(tests):
        for file in files:
            if file.endswith('.py') and os.path.join(folder, file) != os.path.abspath(__file__):
                with open(os.path.join(folder, file)) as f:
                    for lineno, line in enumerate(f, 1):
                        if 'setattr(' in line and ("_ext'" in line or '_ext"' in line):
                            found.append(f'{file}:{lineno} patches a kernel')
    return found


def test_one_kernel_switch():
    assert _kernel_switches() == []


@pytest.mark.parametrize('checker', [_oversized, _cycles, _table_writes, _kernel_switches])
def test_the_checks_see_the_package(checker):
    # Guard against a check that passes because it read nothing.
    assert len(MODULES) > 20 and 'expreplay.storage.memory' in MODULES
    assert isinstance(checker(), list)
