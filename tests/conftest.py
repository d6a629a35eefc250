"""Shared test setup.

tensorpack 0.11 needs ``tf.layers``, which current TensorFlow provides only when
``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is first imported. Set it here, before any
test module can import TensorFlow, so the order in which pytest imports modules can not matter.
"""

import os

os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')

# numpy's OpenBLAS runs a matrix product on every core, its threads spinning while they wait for
# each other. When the other core is busy (a second test worker, a subprocess the test started,
# any other program), a product of the examples' small matrices can then take 30 times longer:
# a short MinAtar run took 1 s or 25-38 s from one run to the next. One thread per process
# makes the tests' times depend on their own work only. It must be set before numpy loads.
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')

# Every Ray the tests start (test_ray's local Ray and two-node cluster, the docs' Ray block, run
# in a subprocess that inherits this environment) stays on the loopback, 127.0.0.1. On Linux Ray
# takes the network interface's address as the node's IP, and ray.init() replaces a loopback
# _node_ip_address or cluster address by it; its GCS, raylets, workers and autoscaler monitor
# then listen on all interfaces. With RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (Ray's switch for
# multi-node clusters; 0 is its default on macOS and Windows) Ray takes 127.0.0.1 as the node's
# IP, keeps 127.0.0.1 where it is given, and its servers listen on 127.0.0.1 only. Ray reads it
# when it is imported: it is set here, before any test module can import ray (test_ray checks
# the nodes' addresses and the listening sockets).
os.environ['RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'] = '0'

import sys

# Test modules sit in sub-directories that mirror the package. The helpers they share sit
# here (scripted_env.py), and a few modules reuse another directory's helpers (the memory
# tests' frame encoding): put them all on the path, whichever directory pytest starts in.
_TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_TESTS] + sorted(os.path.join(_TESTS, d) for d in os.listdir(_TESTS)
                                 if os.path.isfile(os.path.join(_TESTS, d, '__init__.py')) is False
                                 and os.path.isdir(os.path.join(_TESTS, d)) and not d.startswith(('.', '_')))

import pytest

# Under pytest-xdist (`-n 2 --dist loadgroup`, the README's commands) the tests go to the
# workers one by one, except each group below, which one worker runs in collection order: the
# Ray tests, so that one local Ray runs at a time (the module's tests share it) and the docs'
# Ray block does not start a second; the --help tests, whose module fixture starts every script
# once. The groups are given by node id: xdist's own `xdist_group` mark has no effect under
# pytest 9 (xdist 3.8 renames the node id through an attribute pytest no longer reads).
# The scheduler below overrides xdist's LoadScopeScheduling._split_scope, not a public hook:
# the `test` extra pins pytest-xdist to the version it was written for.
WORKER_GROUPS = {
    'tests/integrations/test_ray.py::': 'ray',
    'tests/test_docs_snippets.py::test_python_block_runs[docs/ray.md:': 'ray',
    'tests/test_scripts_help.py::': 'scripts_help',
}


def worker_group(nodeid):
    """The group of the test ``nodeid`` (its own node id if it is in none)."""
    return next((group for prefix, group in WORKER_GROUPS.items() if nodeid.startswith(prefix)),
                nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue('dist') != 'loadgroup':
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return worker_group(nodeid)

    return GroupScheduling(config, log)


# The whole suite on one path, for a run that checks every test both ways (the README says how):
# ``--kernels numpy`` builds everything inside ``numpy_only()`` (the C-kernel parameters of the
# tests that run both paths, ``kernel_paths``, are skipped); ``--default-prefetch N`` gives every
# stream started without a ``prefetch`` argument a prefetch depth of N (0: drawn in the
# learner's ``next()``) instead of the one ``default_prefetch`` chooses.
def pytest_addoption(parser):
    group = parser.getgroup('expreplay')
    group.addoption('--kernels', choices=('built', 'numpy'), default='built',
                    help="'numpy': run every test on the numpy path, as without the C kernels")
    group.addoption('--default-prefetch', type=int, default=None, metavar='N',
                    help='the prefetch depth of every stream that is not given one')
    group.addoption('--every-fault', action='store_true',
                    help='also cut every call of the fault-injection scripts short at every '
                    'point, and with an ordinary exception (about 13 minutes on one core)')


@pytest.fixture(autouse=True)
def _suite_path(request, monkeypatch):
    depth = request.config.getoption('--default-prefetch')
    if depth is not None:
        if request.node.get_closest_marker('default_prefetch'):
            pytest.skip('checks the default prefetch rule, which --default-prefetch replaces')
        from expreplay.stream import replay_stream
        monkeypatch.setattr(replay_stream, 'default_prefetch', lambda population: depth)
    yield


@pytest.fixture(scope='session', autouse=True)
def _kernel_option(request):
    """``--kernels numpy``: the whole session inside the one switch (``kernel_paths``), so that
    also what module-scoped fixtures build takes the numpy path (an object keeps the path it
    was built with)."""
    if request.config.getoption('--kernels') == 'numpy':
        from kernel_paths import kernel_path
        with kernel_path('numpy'):
            yield
    else:
        yield
