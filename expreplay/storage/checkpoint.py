"""The replay memory's checkpoint file: what it holds, how it is written, read and checked.

Format (version 3): a zip archive of ``.npy`` entries, readable with ``numpy.load`` for
inspection. ``meta`` is a JSON document (as uint8 bytes): the format version, the memory's
configuration and its counters. Every other entry is a *table* listed in :data:`TABLES`:

- ``block`` tables have one row per block and are stored whole (they are small);
- ``queue`` tables are the free list and the eviction FIFO, as int64 block numbers;
- ``slot`` tables have one row per slot, and only the *written* slots are stored: block by
  block in block order, block ``b`` contributing its first ``block_fill[b]`` rows. A 15%-full
  memory writes 15% of its frames.

A table whose attribute is None on the memory is not part of its checkpoint: ``priority``
(the sum tree's leaves, ``(p + eps) ** alpha`` per slot) exists only for a prioritized
memory, whose ``meta`` also holds ``alpha``, ``priority_eps``, the running ``max_priority``
and the count of stale updates; a file says which by its ``prioritized`` setting, and a load
expects exactly the tables of the memory that setting builds. The tree's inner nodes are not
stored: they are a function of the leaves, rebuilt on load bit for bit, so a loaded memory
draws exactly as the saved one did.

The memory's extra per-step fields (``ReplayMemory(extra_fields=...)``) are ``slot`` tables
named ``extra.<field>``, after the registry's; ``meta['extra_fields']`` lists them in order as
``[name, dtype]`` pairs.

Version history: 2 had no priorities and no extra fields (its files load as uniform memories
without extra fields); 3 adds ``priority``, the prioritized settings and the extra fields.

To add a table (e.g. per-slot priorities): give ``ReplayMemory`` the array, add it to
:data:`TABLES` (a ``slot`` table's first axis is the slot), add its rules to :func:`validate`
if it has any, and bump :data:`VERSION`. To keep reading files of the previous version, list
the tables they lack in :data:`MISSING_IN_OLD_VERSIONS`: a memory loaded from such a file
keeps those tables as its constructor made them. ``tests/storage/test_checkpoint.py`` shows it.

Writing goes to a temporary file beside the target, locked while it is written, which is
renamed over the target only when complete (a killed save leaves the previous checkpoint). The
next save or load of the same path removes temporary files whose writer is gone.

Reading never trusts the file: entries are checked against the configuration before anything
is allocated, zip CRCs catch flipped bits, and the loaded tables are checked against the
memory's invariants (:func:`validate`) before the memory is handed out, so a crafted file can
not make the memory sample frames that do not form the transitions it claims.
"""

from __future__ import annotations

import json
import logging
import os
import time
import zipfile
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import numpy.lib.format as npy

from . import _slots as _mem   # the slot flags and block states
from .._checks import (check_bool, check_dtype, check_int, check_probability, check_real,
                       check_shape, format_bytes)
from ._atomic_file import atomic_write, remove_dead_temps
from ._checkpoint_checks import validate
from ._inputs import check_extra_fields

if TYPE_CHECKING:
    from .memory import ReplayMemory
    from .ring import BlockRing

__all__ = ['CheckpointError', 'TABLES', 'VERSION', 'MISSING_IN_OLD_VERSIONS', 'save', 'load',
           'expected_settings', 'format_bytes', 'remove_dead_temps', 'tables_of', 'validate']

logger = logging.getLogger('expreplay.storage.memory')

VERSION = 3

# name -> (attribute of the memory's BlockRing, kind). The one list of what a checkpoint holds.
TABLES = {
    'block_fill': ('block_fill', 'block'),
    'block_prev': ('block_prev', 'block'),
    'block_next': ('block_next', 'block'),
    'block_prev_intact': ('block_prev_intact', 'block'),
    'block_state': ('block_state', 'block'),
    'block_gen': ('block_gen', 'block'),
    'free': ('free', 'queue'),
    'retired': ('retired', 'queue'),
    'frames': ('frames', 'slot'),
    'action': ('action', 'slot'),
    'reward': ('reward', 'slot'),
    'epstep': ('epstep', 'slot'),
    'flags': ('flags', 'slot'),
    'priority': ('priority_leaves', 'slot'),     # prioritized memories only (None otherwise)
}
# Older versions still read -> the tables their files do not have (later additions).
MISSING_IN_OLD_VERSIONS = {2: ('priority',)}

_META_MAX_BYTES = 1 << 16


class CheckpointError(ValueError):
    """A replay memory checkpoint that can not be loaded: empty, truncated, corrupt, crafted,
    or of another configuration. The message names the file and what is wrong."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"replay memory checkpoint {path!r}: {problem}")
        self.path = path
        self.problem = problem


# ------------------------------------------------------------------------------ writing
def _write_entry(zf, name, dtype, shape, chunks):
    """One ``.npy`` entry of ``dtype`` and ``shape``, its data given as C-ordered ``chunks``."""
    with zf.open(name + '.npy', 'w', force_zip64=True) as fp:
        npy.write_array_header_2_0(fp, {'descr': npy.dtype_to_descr(np.dtype(dtype)),
                                        'fortran_order': False, 'shape': tuple(shape)})
        for chunk in chunks:
            if chunk.size:
                fp.write(np.ascontiguousarray(chunk).data.cast('B'))


EXTRA_PREFIX = 'extra.'


def tables_of(ring: BlockRing) -> dict[str, tuple[Any, str]]:
    """name -> (array, kind): the tables of :data:`TABLES` this ring has (its attribute is
    not None), in registry order, then its extra fields' slot tables."""
    out = {}
    for name, (attr, kind) in TABLES.items():
        arr = getattr(ring, attr)
        if arr is not None:
            out[name] = (arr, kind)
    for field, arr in ring.extras.items():
        out[EXTRA_PREFIX + field] = (arr, 'slot')
    return out


def _settings(ring):
    """The prioritized settings and state that go into ``meta``."""
    extra = dict(extra_fields=[[name, arr.dtype.str] for name, arr in ring.extras.items()])
    prio = ring.priorities
    if prio is None:
        return dict(prioritized=False, **extra)
    return dict(prioritized=True, alpha=prio.alpha, priority_eps=prio.eps,
                max_priority=prio.max_priority, stale_priority_updates=prio.stale_updates, **extra)


def _tables_to_write(ring):
    """name -> (dtype, shape, chunks) for every table the ring has. Caller holds the lock."""
    bs = ring.block_size
    written = [b for b in range(ring.num_blocks) if ring.block_fill[b]]
    rows = int(ring.block_fill.sum())
    active = np.flatnonzero(ring.block_state == _mem._ACTIVE)
    out = {}
    for name, (arr, kind) in tables_of(ring).items():
        if kind == 'block':
            if name == 'block_state':
                # Active blocks are saved retired (newest last), as after their writers' close().
                arr = np.where(arr == _mem._ACTIVE, _mem._RETIRED, arr).astype(arr.dtype)
            out[name] = (arr.dtype, arr.shape, [arr])
        elif kind == 'queue':
            arr = np.array(arr, np.int64)
            if name == 'retired':
                arr = np.concatenate([arr, active.astype(np.int64)])
            out[name] = (arr.dtype, arr.shape, [arr])
        else:
            chunks = [arr[b * bs:b * bs + int(ring.block_fill[b])] for b in written]   # views
            out[name] = (arr.dtype, (rows,) + arr.shape[1:], chunks)
    return out


def save(mem: ReplayMemory, path: str) -> int:
    """Write ``mem`` to ``path`` (:meth:`ReplayMemory.save`) under its ring's lock, and log it.
    Returns the file's size in bytes."""
    with mem.ring.lock:
        transitions = mem.ring.num_valid
        size, seconds = _save(mem, path)
    logger.info("Saved the replay memory (%d transitions) to %s: %s in %.2f s.",
                transitions, path, format_bytes(size), seconds)
    return size


def _save(mem, path):
    """Write ``mem`` to ``path`` (write aside, lock, fsync, rename). Caller holds the ring's
    lock. Returns (size in bytes, seconds)."""
    start = time.monotonic()
    ring = mem.ring
    if ring.priorities is not None:
        ring.priorities.flush()       # steps published since the last sample enter the tree
    with atomic_write(path) as f:
        meta = dict(version=VERSION, max_size=mem.max_size, state_shape=list(mem.state_shape),
                    history_len=mem.history_len, dtype=mem.dtype.str,
                    block_size=mem.block_size, num_valid=ring.num_valid,
                    num_steps_written=ring.num_steps_written, **_settings(ring))
        meta_bytes = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        with zipfile.ZipFile(f, 'w', zipfile.ZIP_STORED, allowZip64=True) as zf:
            _write_entry(zf, 'meta', np.uint8, meta_bytes.shape, [meta_bytes])
            for name, (dtype, shape, chunks) in _tables_to_write(ring).items():
                _write_entry(zf, name, dtype, shape, chunks)
    return os.path.getsize(path), time.monotonic() - start


# ------------------------------------------------------------------------------ reading
class _Reader:
    """Reads the entries of one checkpoint, turning every failure into a CheckpointError."""

    def __init__(self, path, zf):
        self.path, self.zf = path, zf
        self.names = {info.filename: info for info in zf.infolist()}

    def fail(self, problem):
        raise CheckpointError(self.path, problem)

    def open_entry(self, name):
        """The entry ``name`` positioned at its data, and its (shape, fortran, dtype)."""
        if name + '.npy' not in self.names:
            self.fail(f"it has no table {name!r} (not a complete checkpoint)")
        fp = self.zf.open(self.names[name + '.npy'])
        version = npy.read_magic(fp)
        if version == (1, 0):
            return fp, npy.read_array_header_1_0(fp)
        if version == (2, 0):
            return fp, npy.read_array_header_2_0(fp)
        fp.close()
        self.fail(f"table {name!r} has .npy format version {version}")

    def header(self, name):
        fp, header = self.open_entry(name)
        fp.close()
        return header

    def open(self, name, dtype, shape):
        """The entry ``name`` positioned at its data, after checking its dtype and shape."""
        fp, (got_shape, fortran, got_dtype) = self.open_entry(name)
        if fortran or got_dtype != np.dtype(dtype) or tuple(got_shape) != tuple(shape):
            fp.close()
            self.fail(f"table {name!r} holds {got_dtype} of shape {tuple(got_shape)}"
                      f"{' (Fortran order)' if fortran else ''}, expected {np.dtype(dtype)} "
                      f"of shape {tuple(shape)}")
        return fp

    def read_into(self, name, targets, dtype, shape):
        """Fill the C-contiguous arrays ``targets`` (in order) with the entry's data."""
        with self.open(name, dtype, shape) as fp:
            for target in targets:
                view = target.data.cast('B')
                if fp.readinto(view) != len(view):
                    self.fail(f"table {name!r} is truncated")
            if fp.read(1):     # reading to the end also checks the entry's CRC
                self.fail(f"table {name!r} has trailing data")

    def read(self, name, dtype, shape):
        out = np.empty(shape, dtype)
        self.read_into(name, [out], dtype, shape)
        return out


def expected_settings(**settings: Any) -> dict[str, Any]:
    """The settings :meth:`ReplayMemory.load` was given (None: any), checked and normalized as
    the constructor does, to compare with a file's."""
    def given(name, check):
        value = settings[name]
        return None if value is None else check(value)
    return dict(
        max_size=given('max_size', lambda v: check_int(v, 'max_size', 1, allow_float=True)),
        history_len=given('history_len',
                          lambda v: check_int(v, 'history_len', 1, allow_float=True)),
        state_shape=given('state_shape', lambda v: check_shape(v, 'state_shape')),
        dtype=given('dtype', lambda v: check_dtype(v, 'dtype').str),
        block_size=given('block_size', lambda v: check_int(v, 'block_size', 1, allow_float=True)),
        prioritized=given('prioritized', lambda v: check_bool(v, 'prioritized')),
        alpha=given('alpha', lambda v: check_probability(v, 'alpha')),
        priority_eps=given('priority_eps', lambda v: check_real(v, 'priority_eps')),
        extra_fields=given('extra_fields', lambda v: {
            name: dtype.name for name, dtype in check_extra_fields(v).items()}))


def load(cls: type[ReplayMemory], path: str, expected: Mapping[str, Any]) -> ReplayMemory:
    """The memory saved in ``path``; ``expected``: configuration values that must match."""
    remove_dead_temps(path)
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise CheckpointError(path, f"can not be read: {err}") from err
    if size == 0:
        raise CheckpointError(path, "the file is empty (a save that never wrote anything?)")
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        raise CheckpointError(path, f"not a readable ReplayMemory checkpoint (truncated or "
                                    f"corrupt zip archive: {err})") from err
    with zf:
        reader = _Reader(path, zf)
        try:
            return _load(cls, reader, expected)
        except CheckpointError:
            raise
        except MemoryError as err:
            raise CheckpointError(path, "the memory it describes does not fit in RAM") from err
        except Exception as err:
            # Any other failure to parse the bytes (bad CRC, truncated entry, bad header...).
            raise CheckpointError(path, f"corrupt: {type(err).__name__}: {err}") from err


def _read_meta(reader):
    info = reader.names.get('meta.npy')
    if info is None:
        reader.fail("not a ReplayMemory checkpoint (no metadata)")
    if info.file_size > _META_MAX_BYTES:
        reader.fail(f"metadata of {info.file_size} bytes (corrupt)")
    fp, (shape, _, dtype) = reader.open_entry('meta')
    with fp:
        if dtype != np.uint8 or len(shape) != 1:
            reader.fail("metadata is not a byte string (corrupt)")
        raw = fp.read()
    if len(raw) != shape[0]:
        reader.fail("metadata is truncated")
    if raw.startswith(b"{'version': 1,"):
        reader.fail("it is in format 1 (every slot, written or not, as saved by earlier "
                    "expreplay versions), which this version no longer reads")
    try:
        meta = json.loads(raw.decode())
    except ValueError as err:
        reader.fail(f"metadata is not JSON (corrupt): {err}")
    if not isinstance(meta, dict):
        reader.fail("metadata is not a JSON object (corrupt)")
    return meta


def _load(cls, reader, expected):
    meta = _read_meta(reader)
    version = meta.get('version')
    if version != VERSION and version not in MISSING_IN_OLD_VERSIONS:
        reader.fail(f"unsupported checkpoint format version {version!r} (this expreplay reads "
                    f"{sorted({VERSION, *MISSING_IN_OLD_VERSIONS})})")
    try:
        config: dict[str, Any] = dict(
            max_size=check_int(meta.get('max_size'), 'max_size', 1),
            state_shape=check_shape(meta.get('state_shape'), 'state_shape'),
            history_len=check_int(meta.get('history_len'), 'history_len', 1),
            dtype=check_dtype(meta.get('dtype'), 'dtype').str,
            block_size=check_int(meta.get('block_size'), 'block_size', 1))
        config.update(_read_settings(meta))
        num_valid = check_int(meta.get('num_valid'), 'num_valid', 0)
        num_steps_written = check_int(meta.get('num_steps_written'), 'num_steps_written', 0)
    except (TypeError, ValueError) as err:
        reader.fail(f"bad metadata: {err}")
    wrong = [f"{k}: checkpoint has {config.get(k)!r}, expected {v!r}"
             for k, v in expected.items() if v is not None and config.get(k) != v
             # alpha and priority_eps mean nothing when both memories are uniform
             and not (k in ('alpha', 'priority_eps') and not config['prioritized']
                      and not expected.get('prioritized'))]
    if wrong:
        reader.fail("does not match this memory: " + "; ".join(wrong))

    # The block tables bound everything else; check their sizes before building the memory
    # (whose frames a crafted configuration could make huge).
    bs, max_size = config['block_size'], config['max_size']
    num_blocks = max(2, -(-max_size // bs)) if bs <= max_size else None
    if num_blocks is None:
        reader.fail(f"bad metadata: block_size ({bs}) > max_size ({max_size})")
    reader.open('block_fill', np.int64, (num_blocks,)).close()   # fails naming what is wrong
    kwargs = {k: config[k] for k in ('prioritized', 'alpha', 'priority_eps', 'extra_fields')
              if k in config}
    try:
        mem = cls(max_size, config['state_shape'], config['history_len'], config['dtype'],
                  block_size=bs, **kwargs)
    except (TypeError, ValueError) as err:
        reader.fail(f"bad metadata: {err}")

    # The tables this memory has, less those its file's version did not know.
    missing = set(MISSING_IN_OLD_VERSIONS.get(version, ()))
    ring = mem.ring
    tables = {name: t for name, t in tables_of(ring).items() if name not in missing}
    unexpected = sorted(set(reader.names) - {name + '.npy' for name in tables} - {'meta.npy'})
    if unexpected:
        reader.fail(f"unexpected entries {unexpected} for format version {version}")

    for name, (target, kind) in tables.items():
        if kind == 'block':
            reader.read_into(name, [target], target.dtype, target.shape)
    fill = ring.block_fill
    if fill.min() < 0 or fill.max() > bs:
        reader.fail(f"inconsistent: block_fill outside [0, {bs}]")
    queues = {}
    for name, (_, kind) in tables.items():
        if kind == 'queue':
            shape = reader.header(name)[0]
            if len(shape) != 1 or not 0 <= shape[0] <= mem.num_blocks:
                reader.fail(f"inconsistent: table {name!r} has shape {shape} for "
                            f"{mem.num_blocks} blocks")
            queues[name] = reader.read(name, np.int64, shape)
    rows = int(fill.sum())
    starts = [(b, int(fill[b])) for b in range(mem.num_blocks) if fill[b]]
    for name, (arr, kind) in tables.items():
        if kind == 'slot':
            reader.read_into(name, [arr[b * bs:b * bs + n] for b, n in starts], arr.dtype,
                             (rows,) + arr.shape[1:])
    ring.restore(queues['free'], queues['retired'], num_valid, num_steps_written)
    prio = ring.priorities
    if prio is not None:
        prio.max_priority = config['max_priority']
        prio.stale_updates = config['stale_priority_updates']
    validate(ring, reader.fail)
    if prio is not None:
        prio.tree.rebuild()
    return mem


def _read_settings(meta):
    """The prioritized settings and extra fields of ``meta`` (a file without them is of a
    uniform memory without extra fields)."""
    pairs = meta.get('extra_fields', [])
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise ValueError(f"extra_fields must be a list of [name, dtype] pairs, got {pairs!r}")
    if len({name for name, _ in pairs if isinstance(name, str)}) != len(pairs):
        raise ValueError(f"extra_fields must name distinct fields, got {pairs!r}")
    extra_fields = {name: dtype.name for name, dtype in check_extra_fields(dict(pairs)).items()}
    prioritized = meta.get('prioritized', False)
    if not isinstance(prioritized, bool):
        raise ValueError(f"prioritized must be a bool, got {prioritized!r}")
    if not prioritized:
        return dict(prioritized=False, extra_fields=extra_fields)
    return dict(prioritized=True, extra_fields=extra_fields,
                alpha=check_real(meta.get('alpha'), 'alpha'),
                priority_eps=check_real(meta.get('priority_eps'), 'priority_eps'),
                max_priority=check_real(meta.get('max_priority'), 'max_priority', minimum=0.0),
                stale_priority_updates=check_int(meta.get('stale_priority_updates'),
                                                 'stale_priority_updates', 0))
