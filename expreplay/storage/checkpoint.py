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

import collections
import glob
import json
import logging
import os
import socket
import threading
import time
import zipfile

import numpy as np
import numpy.lib.format as npy

try:
    import fcntl
except ImportError:      # not on Windows: liveness of a temporary file falls back to its pid
    fcntl = None

from . import _slots as _mem   # the slot flags and block states
from .._checks import check_dtype, check_int, check_real, check_shape, format_bytes  # noqa: F401
from ._inputs import check_extra_fields

logger = logging.getLogger('expreplay.storage.memory')

VERSION = 3

# name -> (attribute of ReplayMemory, kind). The one list of what a checkpoint holds.
TABLES = {
    'block_fill': ('_block_fill', 'block'),
    'block_prev': ('_block_prev', 'block'),
    'block_next': ('_block_next', 'block'),
    'block_prev_intact': ('_block_prev_intact', 'block'),
    'block_state': ('_block_state', 'block'),
    'block_gen': ('_block_gen', 'block'),
    'free': ('_free', 'queue'),
    'retired': ('_retired', 'queue'),
    'frames': ('_frames', 'slot'),
    'action': ('_action', 'slot'),
    'reward': ('_reward', 'slot'),
    'epstep': ('_epstep', 'slot'),
    'flags': ('_flags', 'slot'),
    'priority': ('_priority_leaves', 'slot'),     # prioritized memories only (None otherwise)
}
# Older versions still read -> the tables their files do not have (later additions).
MISSING_IN_OLD_VERSIONS = {2: ('priority',)}

_META_MAX_BYTES = 1 << 16
_TEMP_TAG = '.tmp-'


class CheckpointError(ValueError):
    """A replay memory checkpoint that can not be loaded: empty, truncated, corrupt, crafted,
    or of another configuration. The message names the file and what is wrong."""

    def __init__(self, path, problem):
        super().__init__(f"replay memory checkpoint {path!r}: {problem}")
        self.path = path
        self.problem = problem


# ------------------------------------------------------------------------------ temporary files
_live_lock = threading.Lock()
_live_temps = set()        # temporary files this process is writing now
_temp_counter = [0]


def _temp_path(path):
    with _live_lock:
        _temp_counter[0] += 1
        n = _temp_counter[0]
    return f"{path}{_TEMP_TAG}{socket.gethostname()}-{os.getpid()}-{n}"


def _temp_owner(tmp, path):
    """(host or None, pid) of a temporary file's writer, or None if the name is not ours.

    Also parses the name of earlier versions (``<path>.tmp-<pid>-<thread id>``)."""
    parts = tmp[len(path) + len(_TEMP_TAG):].rsplit('-', 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return parts[0], int(parts[1])
    if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
        return None, int(parts[0])
    return None


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _writer_gone(tmp, host, pid):
    """True when nobody is writing ``tmp`` any more."""
    if tmp in _live_temps:
        return False
    if host is not None and host != socket.gethostname():
        return False                # another machine's save (shared filesystem): can't tell
    if pid == os.getpid():
        return True                 # ours, and not being written: a save that died with a
        #                             previous process of the same pid (containers reuse pids)
    if fcntl is None:
        return os.name == 'posix' and not _pid_alive(pid)
    # A writer holds an exclusive flock while it writes; the kernel drops it when the writer
    # dies, so a free lock means a dead save even if the pid was reused since.
    try:
        with open(tmp, 'rb') as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False
            return True
    except OSError:
        return False


def remove_dead_temps(path):
    """Remove the temporary files of saves of ``path`` whose writer has died. Returns them."""
    removed = []
    for tmp in glob.glob(glob.escape(path) + _TEMP_TAG + '*'):
        owner = _temp_owner(tmp, path)
        if owner is None or not _writer_gone(tmp, *owner):
            continue
        try:
            size = os.path.getsize(tmp)
            os.remove(tmp)
        except OSError:
            continue               # removed by someone else meanwhile
        removed.append(tmp)
        logger.warning("Removed %s (%s), left behind by a save of %s that did not finish.",
                       tmp, format_bytes(size), path)
    return removed


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


def tables_of(mem):
    """name -> (array, kind): the tables of :data:`TABLES` this memory has (its attribute is
    not None), in registry order, then its extra fields' slot tables."""
    out = {}
    for name, (attr, kind) in TABLES.items():
        arr = getattr(mem, attr)
        if arr is not None:
            out[name] = (arr, kind)
    for field, arr in mem._extras.items():
        out[EXTRA_PREFIX + field] = (arr, 'slot')
    return out


def _settings(mem):
    """The prioritized settings and state that go into ``meta``."""
    extra = dict(extra_fields=[[name, arr.dtype.str] for name, arr in mem._extras.items()])
    prio = mem._priorities
    if prio is None:
        return dict(prioritized=False, **extra)
    return dict(prioritized=True, alpha=prio.alpha, priority_eps=prio.eps,
                max_priority=prio.max_priority, stale_priority_updates=prio.stale_updates, **extra)


def _tables_to_write(mem):
    """name -> (dtype, shape, chunks) for every table the memory has. Caller holds the lock."""
    bs = mem.block_size
    written = [b for b in range(mem.num_blocks) if mem._block_fill[b]]
    rows = int(mem._block_fill.sum())
    active = np.flatnonzero(mem._block_state == _mem._ACTIVE)
    out = {}
    for name, (arr, kind) in tables_of(mem).items():
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
            chunks = [arr[b * bs:b * bs + int(mem._block_fill[b])] for b in written]   # views
            out[name] = (arr.dtype, (rows,) + arr.shape[1:], chunks)
    return out


def save(mem, path):
    """Write ``mem`` to ``path`` (write aside, lock, fsync, rename). Caller holds ``mem._lock``.

    Returns (size in bytes, seconds).
    """
    start = time.monotonic()
    remove_dead_temps(path)
    if mem._priorities is not None:
        mem._priorities.flush()       # steps published since the last sample enter the tree
    tmp = _temp_path(path)
    with _live_lock:
        _live_temps.add(tmp)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, 'wb') as f:
            if fcntl is not None:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            meta = dict(version=VERSION, max_size=mem.max_size, state_shape=list(mem.state_shape),
                        history_len=mem.history_len, dtype=mem.dtype.str,
                        block_size=mem.block_size, num_valid=mem._num_valid,
                        num_steps_written=mem._num_steps_written, **_settings(mem))
            meta_bytes = np.frombuffer(json.dumps(meta).encode(), np.uint8)
            with zipfile.ZipFile(f, 'w', zipfile.ZIP_STORED, allowZip64=True) as zf:
                _write_entry(zf, 'meta', np.uint8, meta_bytes.shape, [meta_bytes])
                for name, (dtype, shape, chunks) in _tables_to_write(mem).items():
                    _write_entry(zf, name, dtype, shape, chunks)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)      # while still locked: the name never shows an unlocked file
        _fsync_directory(os.path.dirname(os.path.abspath(path)))
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    finally:
        with _live_lock:
            _live_temps.discard(tmp)
    return os.path.getsize(path), time.monotonic() - start


def _fsync_directory(directory):
    # Makes the rename durable; not possible everywhere (Windows), and then not needed.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------ reading
class _Reader:
    """Reads the entries of one checkpoint, turning every failure into a CheckpointError."""

    def __init__(self, path, zf):
        self.path, self.zf = path, zf
        self.names = {info.filename: info for info in zf.infolist()}

    def fail(self, problem):
        raise CheckpointError(self.path, problem)

    def _open(self, name):
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
        fp, header = self._open(name)
        fp.close()
        return header

    def open(self, name, dtype, shape):
        """The entry ``name`` positioned at its data, after checking its dtype and shape."""
        fp, (got_shape, fortran, got_dtype) = self._open(name)
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


def load(cls, path, expected):
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
    fp, (shape, _, dtype) = reader._open('meta')
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
        config = dict(
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
    tables = {name: t for name, t in tables_of(mem).items() if name not in missing}
    unexpected = sorted(set(reader.names) - {name + '.npy' for name in tables} - {'meta.npy'})
    if unexpected:
        reader.fail(f"unexpected entries {unexpected} for format version {version}")

    for name, (target, kind) in tables.items():
        if kind == 'block':
            reader.read_into(name, [target], target.dtype, target.shape)
    fill = mem._block_fill
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
    mem._free = collections.deque(int(b) for b in queues['free'])
    mem._retired = collections.deque(int(b) for b in queues['retired'])
    mem._num_valid = num_valid
    mem._num_steps_written = num_steps_written
    prio = mem._priorities
    if prio is not None:
        prio.max_priority = config['max_priority']
        prio.stale_updates = config['stale_priority_updates']
    validate(mem, reader.fail)
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


# ------------------------------------------------------------------------------ consistency
def validate(mem, fail, chunk=1 << 18):
    """Check the loaded tables against the memory's invariants (memory.py, I1-I6).

    Calls ``fail(problem)`` (which raises) at the first violation. What a file may contain is
    what sampling relies on, for every written slot, not only the VALID ones:

    - flags are only the known bits; an episode end (TERMINATED / TRUNCATED) is a step, so it
      is only set with HAS_ACTION; a VALID slot has HAS_ACTION;
    - a slot with HAS_ACTION (an n-step window walks on from any such slot, VALID or not) has
      its next frame stored and written: the next slot of its block, or the first of the
      block its ``block_next`` names, which links back; that frame is the next step of the
      same episode (``epstep + 1``);
    - the frame after a step that ended its episode is the episode's final frame: no action
      was taken from it (so no window runs past an episode's end);
    - a VALID slot's history frames are stored and consecutive steps of its episode;
    - rewards are finite (a NaN or inf reward would poison every n-step sum it enters), and so
      are the values of float extra fields (the writers refuse both);
    - a prioritized memory's tree holds exactly the VALID slots, with finite values within the
      bound that keeps its sums finite (:meth:`expreplay.storage.priority.PriorityIndex.check_priorities`),
      and so is its running maximum priority.
    """
    nb, bs, hl = mem.num_blocks, mem.block_size, mem.history_len
    fill, prev, nxt = mem._block_fill, mem._block_prev, mem._block_next
    state, intact = mem._block_state, mem._block_prev_intact
    free = np.array(mem._free, np.int64)
    retired = np.array(mem._retired, np.int64)

    # I1: every block is free or retired (nothing is active in a file), exactly once.
    listed = np.concatenate([free, retired])
    if len(listed) != nb or listed.min(initial=0) < 0 or listed.max(initial=0) >= nb \
            or len(np.unique(listed)) != nb:
        fail("inconsistent: the free and retired lists are not a partition of the blocks")
    if (state[free] != _mem._FREE).any() or (state[retired] != _mem._RETIRED).any():
        fail("inconsistent: block_state disagrees with the free and retired lists")
    if fill[free].any():
        fail("inconsistent: a free block holds written slots")
    if (prev < -1).any() or (prev >= nb).any() or (nxt < -1).any() or (nxt >= nb).any():
        fail("inconsistent: block links outside the block range")
    if (prev[free] != -1).any() or (nxt[free] != -1).any():
        fail("inconsistent: a free block is linked into a lane")
    if (mem._block_gen < 0).any():
        fail("inconsistent: negative block generation")

    # Lane links (I5, I6): a linked predecessor links back, is full, and retires earlier.
    position = np.full(nb, -1, np.int64)
    position[retired] = np.arange(len(retired))
    linked = np.flatnonzero(prev >= 0)
    p = prev[linked]
    if (nxt[p] != linked).any() or (fill[p] != bs).any() or (position[p] >= position[linked]).any():
        fail("inconsistent: a lane's block links do not form a chain of full blocks in "
             "eviction order")
    used = np.flatnonzero(state != _mem._FREE)
    if (intact[used] != (prev[used] >= 0)).any():
        fail("inconsistent: block_prev_intact disagrees with block_prev")

    # Slots. Written ones only: the others were not loaded and are zeros.
    offsets = np.arange(bs)
    written = (offsets[None, :] < fill[:, None]).reshape(-1)
    flags = mem._flags[:mem.num_slots]
    epstep = mem._epstep
    if (flags[~written] != 0).any():
        fail("inconsistent: flags set on unwritten slots")
    w_flags = flags[written]
    known = _mem._VALID | _mem._TERMINATED | _mem._TRUNCATED | _mem._HAS_ACTION
    if (w_flags & ~np.uint8(known)).any():
        fail("inconsistent: unknown slot flags")
    if (epstep[written] < 0).any():
        fail("inconsistent: negative episode step")
    valid_flags = (w_flags & _mem._VALID) != 0
    acted = (w_flags & _mem._HAS_ACTION) != 0
    if (valid_flags & ~acted).any():
        fail("inconsistent: a slot is marked valid but no action was taken from it")
    if (((w_flags & (_mem._TERMINATED | _mem._TRUNCATED)) != 0) & ~acted).any():
        fail("inconsistent: a slot is marked as an episode's end but no action was taken from it")
    count = int(np.count_nonzero(valid_flags))
    if count != mem._num_valid:
        fail(f"inconsistent: {count} slots are marked valid, the metadata says {mem._num_valid}")
    if not np.isfinite(mem._reward[:mem.num_slots][written]).all():
        fail("inconsistent: a reward that is NaN or infinite")
    for name, arr in mem._extras.items():
        if arr.dtype.kind == 'f' and not np.isfinite(arr[written]).all():
            fail(f"inconsistent: extra field {name!r} holds a NaN or infinite value")

    if mem._priorities is not None:
        # Exactly the valid slots are in the tree (written slots only were loaded; the
        # others are zeros), with finite positive values: the draw relies on both.
        leaves = mem._priorities.tree.leaves
        if not np.isfinite(leaves).all() or (leaves < 0).any():
            fail("inconsistent: priorities that are negative or not finite")
        if leaves.max(initial=0.0) > mem._priorities.max_value \
                or mem._priorities.max_priority > mem._priorities.priority_bound:
            fail(f"inconsistent: priorities above the bound that keeps the priority tree's sums "
                 f"finite (tree values <= {mem._priorities.max_value:.4g})")
        if ((leaves > 0) != ((flags & _mem._VALID) != 0)).any():
            fail("inconsistent: the priority table disagrees with the valid slots")

    _validate_steps(mem, fail, chunk)
    valid = np.flatnonzero(flags & _mem._VALID)
    for lo in range(0, len(valid), chunk):
        slots = valid[lo:lo + chunk]
        block, offset = np.divmod(slots, bs)
        # The history: within the block, or in the intact previous block (I4, I5).
        reach = np.minimum(epstep[slots], hl - 1)
        needs_prev = reach > offset
        if (needs_prev & ((prev[block] < 0) | ~intact[block])).any():
            fail("inconsistent: a valid slot's history reaches into a block that is not stored")
        index = mem._frame_index(slots)[:, :hl]
        back = np.arange(hl - 1, -1, -1)
        real = back[None, :] <= epstep[slots][:, None]
        want = epstep[slots][:, None] - back[None, :]
        got = epstep[np.where(real, index, 0)]
        if (real & (got != want)).any():
            fail("inconsistent: a valid slot's history frames are not consecutive steps of "
                 "its episode")


def _validate_steps(mem, fail, chunk):
    """Every slot with an action leads to the next frame of its episode (see :func:`validate`)."""
    bs, fill, prev, nxt = mem.block_size, mem._block_fill, mem._block_prev, mem._block_next
    flags, epstep = mem._flags[:mem.num_slots], mem._epstep
    acted = np.flatnonzero(flags & _mem._HAS_ACTION)     # only written slots have flags (checked)
    for lo in range(0, len(acted), chunk):
        slots = acted[lo:lo + chunk]

        def check(bad, problem):
            if bad.any():
                who = "valid slot's" if (flags[slots[bad]] & _mem._VALID).any() else "step's"
                fail(f"inconsistent: a {who} {problem}")
        block, offset = np.divmod(slots, bs)
        # The next frame: the next slot of the block, or the first of the next block (I4).
        last = offset + 1 == bs
        nblock = np.where(last, nxt[block], block)
        check((nblock < 0) | (last & (prev[np.maximum(nblock, 0)] != block)),
              "next frame is not stored (no next block)")
        noff = np.where(last, 0, offset + 1)
        check(noff >= fill[nblock], "next frame is not written")
        nslot = nblock * bs + noff
        check(epstep[nslot] != epstep[slots] + 1, "next frame is not the next step of its episode")
        ended = (flags[slots] & (_mem._TERMINATED | _mem._TRUNCATED)) != 0
        check(ended & ((flags[nslot] & _mem._HAS_ACTION) != 0),
              "step ended its episode, but an action was taken from the episode's final frame")
