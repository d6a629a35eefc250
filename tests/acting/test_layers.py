"""The acting layer's shape: which of its modules import which (read statically, as
tests/test_layout.py reads the package: module-level and ``TYPE_CHECKING`` imports).

A module's floor is one above the highest floor of the acting modules it imports. The settings
records import no acting module and any floor may read them: they count as none. The runner is
on the first floor (the group imports it, never the reverse), the group's parts import no acting
module (the lanes know lanes, not runners: the group tells the runners), and the population, at
the top, is four floors up.
"""

import ast
import os

ACTING = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      'expreplay', 'acting')
MODULES = sorted(f[:-3] for f in os.listdir(ACTING) if f.endswith('.py') and f != '__init__.py')


def _imports(module):
    """The acting modules ``module`` imports when it is imported."""
    with open(os.path.join(ACTING, module + '.py')) as f:
        body = ast.parse(f.read()).body
    found = set()
    for node in body:
        stmts = [node]
        if isinstance(node, ast.If) and 'TYPE_CHECKING' in ast.unparse(node.test):
            stmts = node.body
        for stmt in stmts:
            if isinstance(stmt, ast.ImportFrom) and stmt.level == 1:
                if stmt.module:
                    found.add(stmt.module.split('.')[0])
                else:
                    found.update(alias.name for alias in stmt.names)
    return found & set(MODULES)


IMPORTS = {m: _imports(m) for m in MODULES}


# Data that every floor reads (frozen records of settings), standing on no floor.
RECORDS = {'settings'}


def _floor(module):
    return 1 + max((_floor(m) for m in IMPORTS[module] - RECORDS), default=0)


def test_the_settings_records_import_no_acting_module():
    assert all(not IMPORTS[r] for r in RECORDS)


def test_the_group_imports_the_runner_and_its_parts_import_no_acting_module():
    assert 'runner' in IMPORTS['group'] and not IMPORTS['runner'] - RECORDS
    parts = {'lanes', 'policy'}
    assert parts <= IMPORTS['group']
    assert all(not IMPORTS[p] for p in parts)
    assert not IMPORTS['simulator'] & {'group', 'runner'}     # it steps the groups it is handed


def test_the_acting_layer_stands_on_four_floors():
    floors = {m: _floor(m) for m in MODULES if m not in RECORDS}
    assert floors['population'] == max(floors.values()) == 4
    assert floors['group'] == 2 and floors['manager'] == 3
