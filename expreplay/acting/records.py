"""Episode records: what became of each finished episode, a crash-safe log of them, totals.

:class:`EpisodeRecord` (one finished game, all lives), :class:`EpisodeLog` (appends records to
a JSONL file, one line each, crash-safe), :func:`read_episode_log`, and :class:`EpisodeTotals`
(running counters for monitors). The acting group builds a record with :func:`make_record` when
a game ends and hands it to the runner's scheduler and ``on_episode_end``.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from typing import Any, NamedTuple

import numpy as np

from .._checks import check_bool
from ..stats import EpisodeTotalsStats

__all__ = ['EpisodeRecord', 'EpisodeLog', 'read_episode_log', 'EpisodeTotals',
           'EPISODE_LOG_FILENAME', 'make_record']

EPISODE_LOG_FILENAME = 'episodes.jsonl'


class EpisodeRecord(NamedTuple):
    """What became of one finished episode (a game: all lives).

    Attributes:
        runner: the runner's index.
        env_index: the sub-environment (0 for a single env).
        episode: the game's index on that sub-environment (0 first; as passed to ``start``).
        seed: the seed of its reset, or None (unseeded, or an autoreset).
        start_kind: ``'reset'``, ``'restart'`` (from a :class:`RestartPoint`), ``'autoreset'``
            (a vector env reset it by itself), or a custom scheduler's kind.
        score: sum of the rewards (all lives; from the restart point for a restart).
        length: environment steps.
        terminated, truncated: how the game ended (the env's flags, not the training ones).
        life_losses: how many times ``info['lives']`` decreased (0 without lives).
        wall_time: seconds from the episode's start to its end.
        steps_per_sec: ``length / wall_time``: the rate this env was stepped at, including the
            time its runner waited for step requests and predictions.
        end_time: Unix time of the end.
        options: the reset options it was started with, or None.
        restored_from: the origin of the :class:`RestartPoint` of a restart, else None.
        frames: the memory's steps written when the record was made, the episode's last step
            included (a restored memory's count too, and the steps other players stored
            meanwhile): the env-step clock of a learning curve. A game of the initial fill
            ended at ``frames <= init_memory_size``. 0 in a log written before it was recorded.
    """
    runner: int
    env_index: int
    episode: int
    seed: int | None
    start_kind: str
    score: float
    length: int
    terminated: bool
    truncated: bool
    life_losses: int
    wall_time: float
    steps_per_sec: float
    end_time: float = 0.0
    options: dict[str, Any] | None = None
    restored_from: dict[str, Any] | None = None
    frames: int = 0

    def to_json(self) -> str:
        """One line of JSON (no newline); options that JSON can not hold are written as repr."""
        return json.dumps(self._asdict(), default=_json_fallback, allow_nan=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EpisodeRecord:
        """The record of a dict read back from a log (unknown keys are ignored)."""
        return cls(**{k: data[k] for k in cls._fields if k in data})


def _json_fallback(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return repr(value)


class EpisodeLog:
    """Appends :class:`EpisodeRecord` s to a JSONL file, one line per episode, crash-safe.

    Every record is written with one ``write`` call, flushed and (by default) ``fsync`` 'd
    before :meth:`write` returns, so a record that was handed over survives a crash or a
    ``SIGKILL`` of the process; at worst the last line is cut, which :func:`read_episode_log`
    skips. The file is opened for appending: a resumed run adds to the same log.

    Thread-safe (several runner threads write through one log). Use it as the runners'
    ``on_episode_end`` callback (it is callable). Records written after :meth:`close` are
    dropped: a simulator thread stuck in an env call may finish its episode after shutdown.

    Args:
        path: the file (its directory is created).
        fsync (bool): fsync after every record (a disk write per episode, which is cheap next
            to an episode's length; False leaves it to the OS: a crash of the process still
            loses nothing, a crash of the machine may).
    """

    def __init__(self, path: str | os.PathLike[str], fsync: bool = True) -> None:
        self.path = os.fspath(path)
        self.fsync = check_bool(fsync, 'fsync')
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        self._file: Any = open(self.path, 'a', encoding='utf-8')
        self._lock = threading.Lock()
        self.records_written = 0

    def write(self, record: EpisodeRecord | dict[str, Any]) -> bool:
        """Append one record (an :class:`EpisodeRecord` or a dict); True once it is on disk."""
        line = (record.to_json() if isinstance(record, EpisodeRecord)
                else json.dumps(record, default=_json_fallback)) + '\n'
        with self._lock:
            if self._file is None:
                return False
            self._file.write(line)
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
            self.records_written += 1
        return True

    __call__ = write

    @property
    def closed(self) -> bool:
        return self._file is None

    def close(self) -> None:
        """Close the file. Idempotent."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> EpisodeLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EpisodeLog({self.path!r})"


def read_episode_log(path: str | os.PathLike[str], as_dicts: bool = False) -> list[Any]:
    """The records of an episode log, oldest first.

    A last line without its newline (the process died while writing it) is skipped; any other
    line that is not a JSON object raises ValueError naming the line. ``as_dicts`` returns the
    parsed dicts instead of :class:`EpisodeRecord` s (e.g. for logs with extra keys).
    """
    with open(os.fspath(path), encoding='utf-8') as f:
        text = f.read()
    lines = text.split('\n')
    # The text after the last newline is a record cut by a crash (or '' when there is none).
    complete, out = lines[:-1], []
    for number, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {number} is not JSON: {err}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: line {number} is not a JSON object")
        out.append(data if as_dicts else EpisodeRecord.from_dict(data))
    return out


class EpisodeTotals:
    """Running totals over :class:`EpisodeRecord` s (a thread-safe ``on_episode_end`` callback).

    Read them with :meth:`snapshot`, all at one moment: an
    :class:`~expreplay.stats.EpisodeTotalsStats` (``episodes``, ``steps``, ``life_losses``,
    ``by_kind``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.episodes = 0
        self.steps = 0
        self.life_losses = 0
        self.by_kind: collections.Counter[str] = collections.Counter()

    def __call__(self, record: EpisodeRecord) -> None:
        with self._lock:
            self.episodes += 1
            self.steps += int(record.length)
            self.life_losses += int(record.life_losses)
            self.by_kind[record.start_kind] += 1

    def snapshot(self) -> EpisodeTotalsStats:
        """The totals now, as a frozen record (its ``as_dict()`` is the dict this returned
        before the records)."""
        with self._lock:
            return EpisodeTotalsStats(episodes=self.episodes, steps=self.steps,
                                      life_losses=self.life_losses, by_kind=dict(self.by_kind))


def make_record(runner: int, env_index: int, episode: int, seed: int | None, start_kind: str,
                score: float, length: int, terminated: bool, truncated: bool, life_losses: int,
                started_at: float, options: dict[str, Any] | None = None,
                restored_from: dict[str, Any] | None = None, *, frames: int) -> EpisodeRecord:
    """Build an :class:`EpisodeRecord` from the runner's counters (``started_at``: monotonic;
    ``frames``: the memory's steps written)."""
    # Floored so that steps_per_sec stays a finite float (valid JSON) for a zero-length clock tick.
    wall = max(time.monotonic() - started_at, 1e-9)
    return EpisodeRecord(
        runner=int(runner), env_index=int(env_index), episode=int(episode),
        seed=None if seed is None else int(seed), start_kind=str(start_kind), score=float(score),
        length=int(length), terminated=bool(terminated), truncated=bool(truncated),
        life_losses=int(life_losses), wall_time=wall,
        steps_per_sec=length / wall, end_time=time.time(),
        options=options, restored_from=restored_from, frames=int(frames))
