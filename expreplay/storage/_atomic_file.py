"""Writing a file atomically: beside its target, under a lock, renamed over it when complete.

A save writes ``<path>.tmp-<host>-<pid>-<n>``, holding an exclusive ``flock`` on it while it
writes, and renames it over ``path`` only when it is complete and synced, so a crash or kill
leaves the previous file intact. :func:`remove_dead_temps` removes the temporary files whose
writer is gone (the next save or load of the same path calls it).
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import logging
import os
import socket
from collections.abc import Iterator
from typing import IO

try:
    import fcntl
except ImportError:      # not on Windows: liveness of a temporary file falls back to its pid
    fcntl = None  # type: ignore[assignment]

from .._checks import format_bytes

logger = logging.getLogger('expreplay.storage.memory')

_TEMP_TAG = '.tmp-'

# Temporary files this process is writing now, for the liveness test of a system without
# flock. No lock guards these: next() of a count and a set's add and discard are single C
# calls, which no exception (a Ctrl-C) can cut part-way, and a lock held across an
# interruptible point could be left held.
_live_temps: set[str] = set()
_temp_counter = itertools.count(1)


def _temp_path(path):
    return f"{path}{_TEMP_TAG}{socket.gethostname()}-{os.getpid()}-{next(_temp_counter)}"


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
    if host is not None and host != socket.gethostname():
        return False                # another machine's save (shared filesystem): can't tell
    if fcntl is None:
        if tmp in _live_temps:
            return False
        if pid == os.getpid():
            return True             # ours, and not being written: a save that died with a
            #                         previous process of the same pid (containers reuse pids)
        return os.name == 'posix' and not _pid_alive(pid)
    # This process's own saves too: a save cut short where its clean-up could not run (an
    # exception as its generator yields) left its file; its flock went with the file object.
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


def remove_dead_temps(path: str) -> list[str]:
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



@contextlib.contextmanager
def atomic_write(path: str) -> Iterator[IO[bytes]]:
    """A binary file to write ``path``'s new content into; renamed over ``path`` (synced,
    while still locked) when the block ends without an exception, removed otherwise."""
    remove_dead_temps(path)
    tmp = _temp_path(path)
    _live_temps.add(tmp)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, 'wb') as f:
            if fcntl is not None:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            yield f
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
        _live_temps.discard(tmp)


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
