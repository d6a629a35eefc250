"""A replay memory stays whole whatever instant a call of it is interrupted at.

The promise: an exception of any kind (a ``KeyboardInterrupt``, which no ``except Exception``
takes, or an ordinary one) raised at any point of a call that changes the memory (a writer's
step or episode start, ``LaneWriter`` and ``BatchWriter``, with the block claims and evictions
they make once the ring is full; ``update_priorities``; ``save``; ``restore``; ``load``) leaves
a memory

(a) whose invariants hold: the ring's I1-I7 (``expreplay.storage.ring``), checked as a load
    checks a file, and a prioritized memory's tree: a priority exactly for each sampleable
    transition (or queued to enter), none above the running maximum, its inner sums and minima
    those of its leaves; and a sample returns;
(b) whose save loads;
(c) that holds the calls before the interrupted one, and possibly that one too, never part of
    it: loaded from its save, it equals a twin memory given the same calls without the
    interrupted one, or one given it too (every stored step: its frame, history, action,
    reward, end, extras and priority; the counters; the complete episodes);
(d) whose locks the interrupted thread takes again at once, after which any other thread does
    too (a sampler is never left waiting);
(e) whose writers go on, the interrupted one included: a new episode in each of their lanes,
    then a new writer's, each stored whole, the memory still consistent, and no block left
    active once every writer is closed.

A save cut short leaves at its path the older checkpoint or the new one, whole, and no temporary
file after the path's next load; a restore cut short leaves the memory new (and it takes the
checkpoint then) or holding the checkpoint. Both hold on the C kernels' paths and on the numpy
path.

How (``fault_injection_helpers``): a seeded script of calls on a small memory (24 slots in
blocks of 4, so that the ring wraps and most late writes claim a block and evict one). Each
target call is run once with a tracer that counts its events in the library's code: every line
(the line after a C kernel call included, so each call is cut right before and right after it)
and every return (the callee done, its caller not yet). Then for each event a fresh memory is
built by running the script up to the target, the call is run with the tracer raising at that
event, and the checks above run in the interrupted thread, as the caller would go on; a thread
watching them fails a check that hangs instead of hanging. A memory left bit for bit like one
already checked (a twin, or the state an earlier event left) is not checked again.
"""

import os
import shutil
import tempfile

import pytest

from fault_injection_helpers import (KERNELS, Injected, InjectedError, inject_checkpoint_op,
                                     inject_writes)
from kernel_paths import PATHS, kernel_path

# The fast matrix: each writer on each path, uniform and prioritized (the LaneWriter's C step
# takes no extras, so a LaneWriter memory with extras runs the numpy step on both paths: it is
# in the slow matrix; a BatchWriter's C step takes them).
WRITES = [('lane', 'uniform'), ('lane', 'prioritized'), ('batch', 'uniform'),
          ('batch', 'prioritized+extras')]
ALL_KINDS = ['uniform', 'prioritized', 'extras', 'prioritized+extras']

# A call cut short can leave a zipfile.ZipFile of a save unclosed (its ``with`` exit skipped);
# its finalizer complains when it is collected, which is not what these tests check.
pytestmark = pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')


@pytest.fixture
def fault_dir(tmp_path):
    """Where the checks save: on a RAM file system when there is one, because a save syncs its
    file and its directory, which on a disk costs more than the rest of an injection point."""
    if not os.path.isdir('/dev/shm'):
        yield str(tmp_path)
        return
    path = tempfile.mkdtemp(prefix='expreplay-faults-', dir='/dev/shm')
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _on_path(path):
    """Skip unless the kernels the C path needs are in use (tests/kernel_paths.py)."""
    with kernel_path(path, *KERNELS):
        pass


def _assert_kept(results):
    assert results.points, "no injection point ran"
    assert not results.failures() and not results.aborted, "\n" + results.summary()


@pytest.mark.timeout(900)
@pytest.mark.parametrize('path', PATHS)
@pytest.mark.parametrize('writer,kind', WRITES)
def test_a_write_cut_short_anywhere_leaves_the_memory_whole(path, writer, kind, fault_dir):
    _on_path(path)
    _assert_kept(inject_writes(path, kind, writer, 0, fault_dir))


@pytest.mark.timeout(900)
@pytest.mark.parametrize('path', PATHS)
@pytest.mark.parametrize('op', ['save', 'restore', 'load'])
def test_a_save_restore_or_load_cut_short_anywhere_leaves_memory_and_file_whole(path, op,
                                                                               fault_dir):
    _on_path(path)
    _assert_kept(inject_checkpoint_op(path, op, 0, fault_dir))


def _every_fault(request):
    """The exhaustive runs (~13 minutes on one core) only with ``--every-fault``: the
    fast tests above cut every write path, save, restore and load at every point already."""
    if not request.config.getoption('--every-fault'):
        pytest.skip('exhaustive fault injection: run with --every-fault (~13 minutes on one core)')


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize('path', PATHS)
@pytest.mark.parametrize('writer', ['lane', 'batch'])
@pytest.mark.parametrize('kind', ALL_KINDS)
def test_every_call_of_a_script_cut_short_anywhere_leaves_the_memory_whole(path, writer, kind,
                                                                           fault_dir, request):
    """Every call of the script (samples included), not only those that cover its lines: run
    with ``--every-fault`` (the other tests cut every write path at every point already)."""
    _every_fault(request)
    _on_path(path)
    _assert_kept(inject_writes(path, kind, writer, 1, fault_dir, exhaustive=True))


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize('path', PATHS)
@pytest.mark.parametrize('writer,kind', WRITES)
def test_an_ordinary_exception_anywhere_in_a_write_leaves_the_memory_whole(path, writer, kind,
                                                                           fault_dir, request):
    """The fault as an exception the library's handlers may catch (and go on): run with
    ``--every-fault``."""
    _every_fault(request)
    _on_path(path)
    _assert_kept(inject_writes(path, kind, writer, 0, fault_dir, exc=InjectedError))


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize('path', PATHS)
@pytest.mark.parametrize('op', ['save', 'restore', 'load'])
def test_an_ordinary_exception_anywhere_in_a_save_restore_or_load(path, op, fault_dir, request):
    _every_fault(request)
    _on_path(path)
    _assert_kept(inject_checkpoint_op(path, op, 0, fault_dir, exc=InjectedError))


def test_the_injector_reaches_every_line_of_a_call_and_raises_a_keyboard_interrupt():
    """The harness itself: a fault is raised at the event it names, as a KeyboardInterrupt,
    and the counting run sees the same events the injected runs reach."""
    from fault_injection_helpers import Scenario, Tracer, lane_script
    script = lane_script('uniform', 0)
    counting = Tracer(record=True)
    scn = Scenario('numpy', 'uniform', 'lane', script, upto=3)
    counting.run(lambda: scn.apply(script[3]))
    assert counting.count > 10 and counting.fired is None
    assert {event for _, _, event in counting.sites} == {'line', 'return'}
    for i in (0, counting.count // 2, counting.count - 1):
        scn = Scenario('numpy', 'uniform', 'lane', script, upto=3)
        tracer = Tracer(fire_at=i)
        escaped = tracer.run(lambda: scn.apply(script[3]))
        assert tracer.fired == counting.sites[i]
        assert isinstance(escaped, Injected) and isinstance(escaped, KeyboardInterrupt)
