"""A stream resumed from its checkpoint keeps the memory its caller passed: the checkpoint is
loaded into that object, in place, or not at all, and a failed load leaves it as it was."""

import os

import numpy as np
import pytest

from expreplay import CheckpointError, ReplayMemory
from expreplay.storage.memory import load_into
from expreplay.stream import MemoryCheckpoint
from test_checkpoint import rewrite
from test_stream import HISTORY, EnvFactory, make_stream, take


def new_memory(**kwargs):
    return ReplayMemory(600, (6,), HISTORY, **kwargs)


@pytest.fixture
def saved(tmp_path):
    """A checkpoint directory holding a stream's memory, and its transitions."""
    with make_stream(EnvFactory(), memory=new_memory(), checkpoint_dir=tmp_path) as stream:
        take(iter(stream), 10)
    return tmp_path, len(stream.memory)


def test_the_checkpoint_is_loaded_into_the_memory_passed(saved):
    directory, transitions = saved
    memory = new_memory()
    with make_stream(EnvFactory(), memory=memory, checkpoint_dir=directory) as stream:
        assert stream.memory is memory and stream.resumed
        assert len(memory) == transitions
        take(iter(stream), 5)
        assert stream.fill_steps == 0
        assert len(memory) > transitions       # the players write into the caller's object


def test_a_memory_that_holds_transitions_is_refused_and_the_checkpoint_kept(saved):
    """Saving a non-new memory at close would replace the saved run: refused up front, the
    message naming the ways out, the checkpoint byte for byte as it was."""
    directory, transitions = saved
    path = os.path.join(directory, MemoryCheckpoint.FILENAME)
    before = open(path, 'rb').read()
    memory = new_memory()
    writer = memory.new_writer()
    writer.start_episode(np.zeros(6, np.uint8))
    for step in range(5):
        writer.add_step(0, 1.0, np.full(6, step, np.uint8))
    with pytest.raises(ValueError, match='not new') as err:
        make_stream(EnvFactory(), memory=memory, checkpoint_dir=directory)
    assert not isinstance(err.value, CheckpointError)
    for fix in ('new ReplayMemory', 'another checkpoint_dir', 'delete the file'):
        assert fix in str(err.value)
    assert len(memory) == 5 and open(path, 'rb').read() == before
    # A memory holding no transition but a first frame is not new either.
    memory = new_memory()
    memory.new_writer().start_episode(np.zeros(6, np.uint8))
    with pytest.raises(ValueError, match='not new'):
        make_stream(EnvFactory(), memory=memory, checkpoint_dir=directory)
    assert open(path, 'rb').read() == before


def test_a_checkpoint_of_other_settings_is_refused_naming_them(saved):
    directory, _ = saved
    memory = new_memory(block_size=HISTORY + 1)
    with pytest.raises(CheckpointError, match='block_size'):
        make_stream(EnvFactory(), memory=memory, checkpoint_dir=directory)
    assert len(memory) == 0 and memory.ring.untouched


def test_a_load_that_fails_part_way_leaves_the_memory_new(tmp_path):
    """The file's tables are read into the memory before the invariants are checked: a file
    that fails the check leaves the memory as new (its priorities too), and usable."""
    with make_stream(EnvFactory(), memory=new_memory(prioritized=True),
                     checkpoint_dir=tmp_path) as stream:
        take(iter(stream), 10)
    bad = rewrite(tmp_path / MemoryCheckpoint.FILENAME, tmp_path / 'bad.npz', meta_num_valid=3)
    memory = new_memory(prioritized=True)
    with pytest.raises(CheckpointError, match='metadata says 3'):
        memory.restore(bad)
    assert len(memory) == 0 and memory.ring.untouched and not memory.ring.flags.any()
    assert memory.ring.priorities.tree.total == 0
    with make_stream(EnvFactory(), memory=memory) as stream:     # fills and samples as new
        take(iter(stream), 5)
        assert stream.fill_steps > 0 and not stream.resumed


def test_restore_refuses_a_memory_a_writer_has_taken_a_block_of(saved):
    directory, _ = saved
    memory = new_memory()
    memory.new_writer().start_episode(np.zeros(6, np.uint8))
    assert len(memory) == 0
    with pytest.raises(ValueError, match='needs a new memory') as err:
        memory.restore(directory / MemoryCheckpoint.FILENAME)
    # A misuse, not a bad file: code that deletes files raising CheckpointError keeps this one.
    assert not isinstance(err.value, CheckpointError)


def test_load_into_is_restore(saved):
    """The function ``load_into(memory, path)`` (deprecated) is ``memory.restore(path)``."""
    directory, transitions = saved
    memory = new_memory()
    load_into(memory, directory / MemoryCheckpoint.FILENAME)
    assert len(memory) == transitions
    with pytest.raises(ValueError, match='needs a new memory'):
        load_into(memory, directory / MemoryCheckpoint.FILENAME)
