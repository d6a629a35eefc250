"""The replay memory's checkpoint file: what it holds, how it is written, read and checked.

Format (version 3): a zip archive of ``.npy`` entries, readable with ``numpy.load`` for
inspection. ``meta`` is a JSON document (as uint8 bytes): the format version, the memory's
configuration and its counters. Every other entry is a *table* of the ring's exported state
(:meth:`expreplay.storage.ring.BlockRing.state`, whose registry is
:data:`expreplay.storage.ring.TABLES`):

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

This module is the file format only: it knows no memory class and writes no table. Saving
writes the tables :meth:`~expreplay.storage.ring.BlockRing.state` exports; loading hands a
:class:`CheckpointSource` to :meth:`~expreplay.storage.ring.BlockRing.load_state`, which reads
the tables into the ring it belongs to and checks them, and :meth:`ReplayMemory.load` builds
the memory from the settings the source reads and checks.

To add a table (e.g. per-slot priorities): give the ring the array, add it to
:data:`expreplay.storage.ring.TABLES` (a ``slot`` table's first axis is the slot), add its
rules to :func:`~expreplay.storage._checkpoint_checks.validate` if it has any, and bump
:data:`VERSION`. To keep reading files of the previous version, list the tables they lack in
:data:`MISSING_IN_OLD_VERSIONS`: a memory loaded from such a file keeps those tables as its
constructor made them. ``tests/storage/test_checkpoint.py`` shows it.

Writing goes to a temporary file beside the target, locked while it is written, which is
renamed over the target only when complete (a killed save leaves the previous checkpoint). The
next save or load of the same path removes temporary files whose writer is gone.

Reading never trusts the file: entries are checked against the configuration before anything
is allocated, zip CRCs catch flipped bits, and the loaded tables are checked against the
memory's invariants (by the ring's ``load_state``) before the memory is handed out, so a crafted file can
not make the memory sample frames that do not form the transitions it claims.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

import numpy as np
import numpy.lib.format as npy

from .._checks import (check_bool, check_dtype, check_int, check_probability, check_real,
                       check_shape, format_bytes)
from ._atomic_file import atomic_write, remove_dead_temps
from ._inputs import check_extra_fields

__all__ = ['CheckpointError', 'CheckpointSource', 'VERSION', 'MISSING_IN_OLD_VERSIONS', 'write',
           'open_checkpoint', 'expected_settings', 'format_bytes', 'remove_dead_temps']

logger = logging.getLogger('expreplay.storage.memory')

VERSION = 3

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


def write(path: str, meta: Mapping[str, Any],
          tables: Mapping[str, tuple[np.dtype, tuple[int, ...], list[np.ndarray]]]) -> int:
    """Write a checkpoint to ``path`` (write aside, lock, fsync, rename) and log it: ``meta``
    (JSON-able settings and counters; ``version`` is added) and ``tables``, name -> (dtype,
    shape, C-ordered chunks), as :meth:`~expreplay.storage.ring.BlockRing.state` exports them.
    The caller keeps the tables still (holds the ring's lock). Returns the size in bytes."""
    start = time.monotonic()
    with atomic_write(path) as f:
        meta_bytes = np.frombuffer(json.dumps(dict(version=VERSION, **meta)).encode(), np.uint8)
        with zipfile.ZipFile(f, 'w', zipfile.ZIP_STORED, allowZip64=True) as zf:
            _write_entry(zf, 'meta', np.uint8, meta_bytes.shape, [meta_bytes])
            for name, (dtype, shape, chunks) in tables.items():
                _write_entry(zf, name, dtype, shape, chunks)
    size = os.path.getsize(path)
    logger.info("Saved the replay memory (%d transitions) to %s: %s in %.2f s.",
                meta.get('num_valid', 0), path, format_bytes(size), time.monotonic() - start)
    return size


# ------------------------------------------------------------------------------ reading
class CheckpointSource:
    """One open checkpoint: its settings and counters (read and checked from ``meta`` when it
    is opened) and its tables, read on demand by the ring's ``load_state`` (the interface
    documented there). Every failure is a :class:`CheckpointError` naming the file."""

    def __init__(self, path: str, zf: zipfile.ZipFile) -> None:
        self.path, self.zf = path, zf
        self.names = {info.filename: info for info in zf.infolist()}
        meta = _read_meta(self)
        version = meta.get('version')
        if version != VERSION and version not in MISSING_IN_OLD_VERSIONS:
            self.fail(f"unsupported checkpoint format version {version!r} (this expreplay reads "
                      f"{sorted({VERSION, *MISSING_IN_OLD_VERSIONS})})")
        self.version = version
        #: The tables this file's format version does not have (they keep their initial value).
        self.missing = tuple(MISSING_IN_OLD_VERSIONS.get(version, ()))
        try:
            config: dict[str, Any] = dict(
                max_size=check_int(meta.get('max_size'), 'max_size', 1),
                state_shape=check_shape(meta.get('state_shape'), 'state_shape'),
                history_len=check_int(meta.get('history_len'), 'history_len', 1),
                dtype=check_dtype(meta.get('dtype'), 'dtype').str,
                block_size=check_int(meta.get('block_size'), 'block_size', 1))
            config.update(_read_settings(meta))
            counters = dict(num_valid=check_int(meta.get('num_valid'), 'num_valid', 0),
                            num_steps_written=check_int(meta.get('num_steps_written'),
                                                        'num_steps_written', 0))
        except (TypeError, ValueError) as err:
            self.fail(f"bad metadata: {err}")
        for name in ('max_priority', 'stale_priority_updates'):
            if name in config:
                counters[name] = config.pop(name)
        #: The memory's settings: ``ReplayMemory``'s constructor arguments.
        self.settings = config
        #: ``num_valid``, ``num_steps_written`` (and a prioritized memory's ``max_priority``,
        #: ``stale_priority_updates``): what the ring's ``load_state`` takes.
        self.counters = counters

    def fail(self, problem: str) -> NoReturn:
        """Raise a :class:`CheckpointError` naming this file and ``problem``."""
        raise CheckpointError(self.path, problem)

    def check_settings(self, expected: Mapping[str, Any]) -> None:
        """Refuse a file whose settings differ from ``expected`` (None: any), naming each."""
        config = self.settings
        wrong = [f"{k}: checkpoint has {config.get(k)!r}, expected {v!r}"
                 for k, v in expected.items() if v is not None and config.get(k) != v
                 # alpha and priority_eps mean nothing when both memories are uniform
                 and not (k in ('alpha', 'priority_eps') and not config['prioritized']
                          and not expected.get('prioritized'))]
        if wrong:
            self.fail("does not match this memory: " + "; ".join(wrong))

    def check_tables(self, names: list[str]) -> None:
        """Refuse entries that are not the tables ``names`` (less :attr:`missing`) or meta."""
        tables = {name + '.npy' for name in names if name not in self.missing}
        unexpected = sorted(set(self.names) - tables - {'meta.npy'})
        if unexpected:
            self.fail(f"unexpected entries {unexpected} for format version {self.version}")

    def build(self, factory: Callable[[], Any]) -> Any:
        """``factory()`` (the memory's constructor on :attr:`settings`), its refusal of the
        settings reported as bad metadata."""
        try:
            return factory()
        except (TypeError, ValueError) as err:
            self.fail(f"bad metadata: {err}")

    def read_queue(self, name: str, max_len: int) -> np.ndarray:
        """The int64 queue table ``name`` (at most ``max_len`` entries)."""
        shape = self.header(name)[0]
        if len(shape) != 1 or not 0 <= shape[0] <= max_len:
            self.fail(f"inconsistent: table {name!r} has shape {shape} for {max_len} blocks")
        return self.read(name, np.int64, shape)

    def open_entry(self, name: str) -> tuple[Any, tuple[Any, bool, np.dtype]]:
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

    def header(self, name: str) -> tuple[Any, bool, np.dtype]:
        """The entry ``name``'s (shape, fortran, dtype)."""
        fp, header = self.open_entry(name)
        fp.close()
        return header

    def open(self, name: str, dtype: Any, shape: tuple[int, ...]) -> Any:
        """The entry ``name`` positioned at its data, after checking its dtype and shape."""
        fp, (got_shape, fortran, got_dtype) = self.open_entry(name)
        if fortran or got_dtype != np.dtype(dtype) or tuple(got_shape) != tuple(shape):
            fp.close()
            self.fail(f"table {name!r} holds {got_dtype} of shape {tuple(got_shape)}"
                      f"{' (Fortran order)' if fortran else ''}, expected {np.dtype(dtype)} "
                      f"of shape {tuple(shape)}")
        return fp

    def read_into(self, name: str, targets: list[np.ndarray], dtype: Any,
                  shape: tuple[int, ...]) -> None:
        """Fill the C-contiguous arrays ``targets`` (in order) with the entry's data."""
        with self.open(name, dtype, shape) as fp:
            for target in targets:
                view = target.data.cast('B')
                if fp.readinto(view) != len(view):
                    self.fail(f"table {name!r} is truncated")
            if fp.read(1):     # reading to the end also checks the entry's CRC
                self.fail(f"table {name!r} has trailing data")

    def read(self, name: str, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
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


@contextlib.contextmanager
def open_checkpoint(path: str) -> Iterator[CheckpointSource]:
    """The checkpoint at ``path`` as a :class:`CheckpointSource`, for the ``with`` block that
    builds a memory from it; any failure to parse it (there or in the block) is a
    :class:`CheckpointError` naming the file."""
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
    except MemoryError as err:
        raise CheckpointError(path, "its zip directory does not fit in RAM (corrupt?)") from err
    except Exception as err:   # BadZipFile, OSError, EOFError, NotImplementedError (a flipped version), ...
        raise CheckpointError(path, f"not a readable ReplayMemory checkpoint (truncated or "
                                    f"corrupt zip archive: {err})") from err
    with zf:
        try:
            yield CheckpointSource(path, zf)
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
