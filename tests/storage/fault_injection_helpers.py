"""The machinery of ``test_fault_injection.py``: scripted writes, a tracer that raises at a
chosen line of the library, and the checks run on the memory the fault left.

A *script* is a list of operations on one memory (a writer's call, a sample, a priority update,
a save or a load), made from a seed, so that running a prefix of it again gives the same memory
bit for bit. A *target* is one operation of it; its *injection points* are the events the
tracer sees while it runs: every ``line`` event, and every ``return`` event (the callee has
finished and the caller has not stored its result yet), of frames whose code lies in the
``expreplay`` package. The first line run after a C kernel call is one of them, so each kernel
call is cut off right before and right after it.
"""

from __future__ import annotations

import collections
import gc
import glob
import hashlib
import os
import queue
import shutil
import sys
import threading
import zipfile
from dataclasses import dataclass, field

import numpy as np

import expreplay
from expreplay import ReplayMemory, _kernels
from expreplay.storage import _atomic_file
from expreplay.storage._checkpoint_checks import validate
from expreplay.storage._slots import _ACTIVE, _HAS_ACTION, _RETIRED, _TERMINATED, _TRUNCATED, _VALID
from expreplay.storage.priority import SumMinTree
from kernel_paths import kernel_path

PACKAGE_DIR = os.path.dirname(os.path.abspath(expreplay.__file__)) + os.sep
REPO_DIR = os.path.dirname(PACKAGE_DIR.rstrip(os.sep)) + os.sep

# Small enough that the ring wraps every ~24 frames, so that most writes near the end of a
# script claim a block and evict one; block_size is history_len + 1, so that histories often
# reach into the previous block (the careful path, I4/I5).
SIZES = dict(max_size=24, state_shape=(4,), history_len=3, dtype='uint8', block_size=4)
KINDS = {
    'uniform': {},
    'prioritized': dict(prioritized=True, alpha=0.6),
    'extras': dict(extra_fields={'lives': 'int8'}),
    # the checkpoint scenarios: every table a checkpoint can hold
    'prioritized+extras': dict(prioritized=True, alpha=0.6, extra_fields={'lives': 'int8'}),
}
KERNELS = ('_write_ext', '_gather_ext', '_tree_ext')
# An injection point that makes no progress for this long is hung (a point takes milliseconds).
CALL_TIMEOUT = 20.0

CATEGORIES = {
    'a': 'broken invariant',
    'b': 'save fails or does not load',
    'c': 'content matches neither twin',
    'd': 'hang or lock left held',
    'e': 'later writes break the memory',
}


class Injected(KeyboardInterrupt):
    """The fault: what Ctrl-C raises, so that no ``except Exception`` takes it."""


class InjectedError(RuntimeError):
    """The fault as an ordinary exception, one the library may catch (it catches some
    RuntimeErrors, and turns any exception of a load into a CheckpointError)."""


class Broken(AssertionError):
    """A check found the memory broken (the message says how)."""


def _fail(problem):
    raise Broken(problem)


# ---------------------------------------------------------------------------------------- tracer
def site_name(site):
    filename, lineno, event = site
    return f"{os.path.relpath(filename, REPO_DIR)}:{lineno} ({event})"


class Tracer:
    """Counts the library's line and return events; raises ``exc`` at event ``fire_at``."""

    def __init__(self, fire_at=None, exc=Injected, record=False):
        self.fire_at, self.exc, self.record = fire_at, exc, record
        self.count = 0
        self.sites = []          # (filename, lineno, event) of each event, when recording
        self.lines = set()       # (filename, previous line, line): the arcs run, when recording
        self.fired = None        # the site the fault was raised at
        self._last = {}

    def _global(self, frame, event, arg):
        if frame.f_code.co_filename.startswith(PACKAGE_DIR):
            return self._local
        return None

    def _local(self, frame, event, arg):
        if event not in ('line', 'return'):
            return self._local
        site = (frame.f_code.co_filename, frame.f_lineno, event)
        if self.record:
            self.sites.append(site)
            key = id(frame)
            self.lines.add((site[0], self._last.get(key), site[1]))
            self._last[key] = site[1]
        if self.count == self.fire_at:
            self.fired = site
            self.count += 1
            raise self.exc(f"injected at {site_name(site)}")
        self.count += 1
        return self._local

    def run(self, fn):
        """``fn()`` traced; the fault (if it fires) is caught. Returns the exception that left
        ``fn`` after the fault (None when the library caught it and went on)."""
        escaped = None
        enabled = gc.isenabled()
        gc.disable()      # no finalizer of an earlier scenario runs (and counts) inside fn
        sys.settrace(self._global)
        try:
            fn()
        except BaseException as err:   # noqa: B036 - the fault, or what the library made of it
            if self.fired is None:
                raise
            escaped = err
        finally:
            sys.settrace(None)
            if enabled:
                gc.enable()
        return escaped


# ---------------------------------------------------------------------------------------- scripts
def encode(lane, episode, t):
    """A frame naming its (lane, episode, step); never the zeros of the padding."""
    return np.array([lane + 1, episode % 250 + 1, t % 250 + 1, 7], np.uint8)


def lives_of(lane, episode, t):
    return (lane + episode + t) % 5 - 2


def lane_script(kind, seed, n_ops=60, num_lanes=2):
    """LaneWriter calls of ``num_lanes`` writers in random order (random episode lengths and
    ends, an episode now and then abandoned by a new start), and for a prioritized memory a
    sample and a priority update every few writes."""
    rng = np.random.default_rng(seed)
    ops, ep, t, length = [], [0] * num_lanes, [None] * num_lanes, [0] * num_lanes
    extras = 'extra_fields' in KINDS[kind]
    while len(ops) < n_ops:
        if KINDS[kind].get('prioritized') and len(ops) > 12 and rng.random() < 0.15:
            ops += [('sample', len(ops)), ('update', len(ops))]
            continue
        lane = int(rng.integers(num_lanes))
        if t[lane] is None or rng.random() < 0.04:
            ep[lane] += 1
            t[lane], length[lane] = 0, int(rng.integers(1, 10))
            ops.append(('start', lane, encode(lane, ep[lane], 0)))
            continue
        e, tt = ep[lane], t[lane]
        end = tt + 1 == length[lane]
        term = end and bool(rng.random() < 0.5)
        ops.append(('step', lane, (lane + e + tt) % 5, float((e + 2 * tt) % 7 - 3),
                    encode(lane, e, tt + 1), term, end and not term,
                    {'lives': lives_of(lane, e, tt)} if extras else None))
        t[lane] = None if end else tt + 1
    return ops


def batch_script(kind, seed, n_ops=40, num_lanes=3):
    """BatchWriter calls on random subsets of ``num_lanes`` lanes: a start of the subset's
    lanes outside an episode (now and then of lanes inside one), else a step of the subset,
    some lanes ending; for a prioritized memory a sample and a priority update now and then."""
    rng = np.random.default_rng(seed)
    ops, ep, t, length = [], [0] * num_lanes, [None] * num_lanes, [0] * num_lanes
    extras = 'extra_fields' in KINDS[kind]
    while len(ops) < n_ops:
        if KINDS[kind].get('prioritized') and len(ops) > 8 and rng.random() < 0.15:
            ops += [('sample', len(ops)), ('update', len(ops))]
            continue
        lanes = np.sort(rng.choice(num_lanes, int(rng.integers(1, num_lanes + 1)), replace=False))
        out = [int(lane) for lane in lanes if t[lane] is None]
        if out or rng.random() < 0.03:
            start = np.array(out or lanes.tolist(), np.int64)
            for lane in start.tolist():
                ep[lane] += 1
                t[lane], length[lane] = 0, int(rng.integers(1, 10))
            ops.append(('bstart', start, np.stack([encode(lane, ep[lane], 0)
                                                   for lane in start.tolist()])))
            continue
        lanes = lanes.astype(np.int64)
        at = [(lane, ep[lane], t[lane]) for lane in lanes.tolist()]
        ends = np.array([tt + 1 == length[lane] for lane, _, tt in at])
        term = ends & (rng.random(len(lanes)) < 0.5)
        ops.append(('bstep', lanes,
                    np.array([(lane + e + tt) % 5 for lane, e, tt in at], np.int64),
                    np.array([float((e + 2 * tt) % 7 - 3) for _, e, tt in at]),
                    np.stack([encode(lane, e, tt + 1) for lane, e, tt in at]),
                    term, ends & ~term,
                    {'lives': np.array([lives_of(*a) for a in at], np.int8)} if extras else None))
        for j, lane in enumerate(lanes.tolist()):
            t[lane] = None if ends[j] else t[lane] + 1
    return ops


OP_NAMES = {'start': 'LaneWriter.start_episode', 'step': 'LaneWriter.add_step',
            'bstart': 'BatchWriter.start_episodes', 'bstep': 'BatchWriter.add_steps',
            'sample': 'ReplayMemory.sample', 'update': 'ReplayMemory.update_priorities',
            'save': 'ReplayMemory.save', 'restore': 'ReplayMemory.restore',
            'load': 'ReplayMemory.load'}


class Scenario:
    """A memory, its writers and a script, built on one kernel path (``'C kernels'`` or
    ``'numpy'``), the script's first ``upto`` operations run."""

    def __init__(self, path, kind, writer, script, upto=0):
        self.path, self.kind, self.writer, self.script = path, kind, writer, script
        with kernel_path(path, *KERNELS):
            self.mem = ReplayMemory(**SIZES, **KINDS[kind])
            if writer == 'lane':
                self.writers = [self.mem.new_writer() for _ in range(2)]
            else:
                self.writers = [self.mem.new_batch_writer(3)]
        self.last_batch = None
        for op in script[:upto]:
            self.apply(op)

    def apply(self, op):
        """Run one operation of the script (the way the runners make these calls)."""
        mem, name = self.mem, op[0]
        if name == 'start':
            self.writers[op[1]].start_episode(op[2])
        elif name == 'step':
            _, lane, action, reward, frame, term, trunc, extras = op
            self.writers[lane].add_step(action, reward, frame, terminated=term, truncated=trunc,
                                        extras=extras)
        elif name == 'bstart':
            self.writers[0].start_episodes(op[1], op[2], checked=True)
        elif name == 'bstep':
            _, lanes, actions, rewards, frames, term, trunc, extras = op
            w = self.writers[0]
            # As expreplay.acting.lanes does: the kernel's common case, else the general path.
            if not w.try_add_steps(lanes, actions, rewards, frames, term, trunc, extras=extras):
                w.add_steps(lanes, actions, rewards, frames, term, trunc, checked=True,
                            extras=extras)
        elif name == 'sample':
            if len(mem) >= 4:
                self.last_batch = mem.sample(4, n_step=3, gamma=0.9, beta=0.5,
                                             rng=np.random.default_rng(op[1]))
        elif name == 'update':
            if self.last_batch is not None:
                prio = np.random.default_rng(op[1]).random(4) * 3.0
                mem.update_priorities(self.last_batch.indices, prio)
        else:
            raise ValueError(op)

    def new_writer(self, lanes):
        with kernel_path(self.path, *KERNELS):
            return self.mem.new_writer() if lanes is None else self.mem.new_batch_writer(lanes)


def label(op_name, before, after):
    """The row a target's results are counted in: the call, and whether it claimed a block
    (a block's generation grew) and evicted one (a claimed block held frames before).
    ``before``, ``after``: the ring's (block_gen, block_fill) around the call."""
    claimed = np.flatnonzero(after[0] != before[0])
    if not len(claimed):
        return OP_NAMES[op_name]
    if before[1][claimed].any():
        return OP_NAMES[op_name] + ' (claims a block, evicts)'
    return OP_NAMES[op_name] + ' (claims a block)'


def choose_targets(path, kind, writer, script, exhaustive=False):
    """The operations of ``script`` to cut short: every one (``exhaustive``), else the fewest
    that, taken in order, run every arc (pair of consecutive lines of a frame) that the
    script's writes and priority updates run, for each kind of call (the call, and whether it
    claims a block, whether it evicts one: see :func:`label`), so that each branch of each kind
    of write is cut at least once at each of its lines."""
    if exhaustive:
        return list(range(len(script)))
    ref = Scenario(path, kind, writer, script)
    seen, chosen = set(), []
    for i, op in enumerate(script):
        ring = ref.mem.ring
        before = ring.block_gen.copy(), ring.block_fill.copy()
        tracer = Tracer(record=True)
        tracer.run(lambda: ref.apply(op))
        arcs = {(label(op[0], before, (ring.block_gen, ring.block_fill)), arc)
                for arc in tracer.lines}
        # A sample only enters queued steps into the priority tree (a flush, which
        # update_priorities runs too); its hundreds of other lines check arguments and read.
        if op[0] != 'sample' and arcs - seen:
            chosen.append(i)
            seen |= arcs
    return chosen


# ---------------------------------------------------------------------------------------- checks
class _CheckpointView:
    """A live ring as its checkpoint would hold it (``BlockRing.state``: the writers' active
    blocks retired, newest last), for ``validate``, which checks a file's tables."""

    def __init__(self, ring):
        for name in ('num_blocks', 'block_size', 'history_len', 'num_slots', 'num_valid',
                     'block_fill', 'block_prev', 'block_next', 'block_prev_intact', 'block_gen',
                     'free', 'flags', 'epstep', 'reward', 'extras', 'history_index'):
            setattr(self, name, getattr(ring, name))
        active = np.flatnonzero(ring.block_state == _ACTIVE)
        self.block_state = np.where(ring.block_state == _ACTIVE, _RETIRED, ring.block_state)
        self.retired = collections.deque(list(ring.retired) + active.tolist())


def check_ring(mem):
    """The ring's invariants I1-I7 (what a load checks), then the distribution's, read under
    the memory's lock as every reader of the tables does."""
    with mem.ring.lock:
        validate(_CheckpointView(mem.ring), _fail)
        check_distribution(mem)


def check_distribution(mem):
    """A prioritized memory's tree: a priority exactly for the VALID slots (or the slot is
    queued to enter), within the running maximum, inner nodes the sums and minima of the leaves."""
    ring = mem.ring
    index = ring.priorities
    if index is None:
        return
    leaves = np.array(index.leaves)
    valid = (ring.flags[:ring.num_slots] & _VALID) != 0
    if not np.isfinite(leaves).all() or (leaves < 0).any():
        _fail("a priority that is negative or not finite")
    if ((leaves > 0) & ~valid).any():
        _fail(f"slots {np.flatnonzero((leaves > 0) & ~valid).tolist()} are not VALID but have a "
              "priority (they can be drawn)")
    unqueued = np.setdiff1d(np.flatnonzero(valid & (leaves == 0)), index.pending)
    if len(unqueued):
        _fail(f"VALID slots {unqueued.tolist()} have no priority and none is queued (they can "
              "never be drawn)")
    top = (index.max_priority + index.eps) ** index.alpha
    if leaves.max(initial=0.0) > top * (1 + 1e-12):
        _fail("a priority above the running maximum that new steps enter with")
    tree = index.tree
    with kernel_path('C kernels' if getattr(tree, '_ext', None) is not None else 'numpy'):
        rebuilt = SumMinTree(tree.capacity, tree.fanout)
    rebuilt.leaves[:] = leaves
    rebuilt.rebuild()
    for got, want in zip(tree.sum_levels, rebuilt.sum_levels):
        if not np.allclose(got, want, rtol=1e-9, atol=0):
            _fail("the priority tree's inner sums are not the sums of its leaves")
    for got, want in zip(tree.min_levels, rebuilt.min_levels):
        if not np.array_equal(got, want):
            _fail("the priority tree's inner minima are not the minima of its leaves")


def content(mem):
    """What a memory holds, whatever its block layout: every step (from each written slot with
    an action: its frame, episode step, action, reward, end and VALID flags, next frame,
    history frames if VALID, extras, priority), its counters, and its complete episodes.
    Frames name their step (:func:`encode`), so two memories holding the same steps compare
    equal, and a step half written differs."""
    ring = mem.ring
    bs = ring.block_size
    written = np.concatenate([np.arange(b * bs, b * bs + int(ring.block_fill[b]))
                              for b in range(ring.num_blocks)]).astype(np.int64)
    acted = written[(ring.flags[written] & _HAS_ACTION) != 0]
    index = ring.priorities
    steps = []
    if len(acted):
        nxt = ring.next_slots(acted)
        hist = ring.history_index(acted)
        for j, s in enumerate(acted.tolist()):
            flags = int(ring.flags[s])
            steps.append((
                ring.frames[s].tobytes(), int(ring.epstep[s]), int(ring.action[s]),
                float(ring.reward[s]), flags & (_VALID | _TERMINATED | _TRUNCATED),
                ring.frames[nxt[j]].tobytes() if nxt[j] >= 0 else None,
                tuple(ring.frames[h].tobytes() for h in hist[j]) if flags & _VALID else (),
                tuple(int(arr[s]) for arr in ring.extras.values()),
                float(index.leaves[s]) if index is not None else None))
    steps.sort(key=repr)
    counters = dict(num_valid=ring.num_valid, num_steps_written=ring.num_steps_written)
    if index is not None:
        counters.update(max_priority=index.max_priority, stale=index.stale_updates)
    episodes = sorted(repr((e['observations'].tobytes(), e['actions'].tolist(),
                            e['rewards'].tolist(), e['terminations'].tolist(),
                            e['truncations'].tolist(),
                            {k: v.tolist() for k, v in e['extras'].items()}))
                      for e in mem.episodes())
    return dict(steps=steps, counters=counters, episodes=episodes)


def describe_difference(got, want):
    parts = []
    if got['counters'] != want['counters']:
        parts.append(' '.join(f"{k} {want['counters'].get(k)}->{v}"
                              for k, v in got['counters'].items()
                              if want['counters'].get(k) != v))
    g = collections.Counter(map(repr, got['steps']))
    w = collections.Counter(map(repr, want['steps']))
    if g != w:
        parts.append(f"steps +{sum((g - w).values())} -{sum((w - g).values())}")
    if got['episodes'] != want['episodes']:
        parts.append(f"episodes {len(want['episodes'])}->{len(got['episodes'])}")
    return ', '.join(parts) or 'equal'


def saved_content(mem, filename):
    """``mem`` saved to ``filename`` and loaded back: the loaded memory's :func:`content`."""
    mem.save(filename)
    return content(ReplayMemory.load(filename))


# ---------------------------------------------------------------------------------------- results
@dataclass
class Point:
    label: str          # the row: the operation (and whether it claimed/evicted a block)
    op_index: int
    event: int
    site: tuple
    problems: dict = field(default_factory=dict)    # category -> message


@dataclass
class Results:
    points: list = field(default_factory=list)
    aborted: str | None = None

    def failures(self):
        return [p for p in self.points if p.problems]

    def table(self):
        """{row label: [points, a, b, c, d, e]}."""
        rows = {}
        for p in self.points:
            row = rows.setdefault(p.label, [0, 0, 0, 0, 0, 0])
            row[0] += 1
            for k, cat in enumerate('abcde'):
                row[k + 1] += cat in p.problems
        return rows

    def summary(self, max_groups=25):
        lines = [f"{len(self.failures())} of {len(self.points)} injection points broke the "
                 "contract"]
        if self.aborted:
            lines.append(f"ABORTED: {self.aborted}")
        lines.append(f"{'operation':58s} {'points':>6s} " + ' '.join(f"({c})" for c in 'abcde'))
        for name, row in sorted(self.table().items()):
            lines.append(f"{name:58s} {row[0]:6d} " + ' '.join(f"{n:3d}" for n in row[1:]))
        lines.append("categories: " + '; '.join(f"({k}) {v}" for k, v in CATEGORIES.items()))
        groups = collections.defaultdict(list)
        for p in self.failures():
            for cat, msg in p.problems.items():
                groups[(cat, msg)].append(p)
        lines.append("failures, grouped (category, message: count, injection sites):")
        for (cat, msg), pts in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:max_groups]:
            sites = collections.Counter(site_name(p.site) for p in pts)
            where = ', '.join(f"{s} x{n}" if n > 1 else s for s, n in sites.most_common(6))
            more = f" (+{len(sites) - 6} more sites)" if len(sites) > 6 else ''
            lines.append(f"  ({cat}) {msg} [{len(pts)}]: {where}{more}")
        if len(groups) > max_groups:
            lines.append(f"  ... {len(groups) - max_groups} more groups")
        return '\n'.join(lines)


# ---------------------------------------------------------------------------------------- drivers
def episode_key(observations, actions, rewards, terminations, truncations, extras):
    return repr((np.asarray(observations).tobytes(), list(actions), list(rewards),
                 list(terminations), list(truncations), extras))


def _episode_keys(mem):
    return {episode_key(e['observations'], e['actions'].tolist(), e['rewards'].tolist(),
                        e['terminations'].tolist(), e['truncations'].tolist(),
                        {k: v.tolist() for k, v in e['extras'].items()})
            for e in mem.episodes()}


def write_episodes(scn, writers, lane_ids, batch):
    """One terminated episode of two steps in each lane of ``writers`` (LaneWriters, or one
    BatchWriter when ``batch``), its frames naming ``lane_ids``; returns their keys."""
    extras_on = 'extra_fields' in KINDS[scn.kind]
    keys = []
    frames = {lane: [encode(lane, 222, t) for t in range(3)] for lane in lane_ids}
    actions, rewards = [1, 2], [0.5, -1.0]
    lives = {lane: [lives_of(lane, 222, t) for t in range(2)] for lane in lane_ids}
    if batch:
        (w,) = writers
        lanes = np.arange(len(lane_ids), dtype=np.int64)
        w.start_episodes(lanes, np.stack([frames[lane][0] for lane in lane_ids]), checked=True)
        for t in range(2):
            end = np.full(len(lanes), t == 1)
            ex = ({'lives': np.array([lives[lane][t] for lane in lane_ids], np.int8)}
                  if extras_on else None)
            args = (lanes, np.full(len(lanes), actions[t], np.int64),
                    np.full(len(lanes), rewards[t]),
                    np.stack([frames[lane][t + 1] for lane in lane_ids]), end, np.zeros_like(end))
            if not w.try_add_steps(*args, extras=ex):
                w.add_steps(*args, checked=True, extras=ex)
    else:
        for w, lane in zip(writers, lane_ids):
            w.start_episode(frames[lane][0])
            for t in range(2):
                w.add_step(actions[t], rewards[t], frames[lane][t + 1], terminated=t == 1,
                           extras={'lives': lives[lane][t]} if extras_on else None)
    for lane in lane_ids:
        keys.append(episode_key(np.stack(frames[lane]), actions,
                                [float(np.float32(r)) for r in rewards],
                                [False, True], [False, False],
                                {'lives': lives[lane]} if extras_on else {}))
    return keys


def continue_writing(scn):
    """After the fault: the writers whose memory it was go on (a new episode in each lane),
    close, and a new writer writes; the memory stays consistent, holds each of those episodes
    whole once written, and no block stays active once every writer is closed."""
    mem, batch = scn.mem, scn.writer == 'batch'
    keys = write_episodes(scn, scn.writers, list(range(10, 13 if batch else 12)), batch)
    check_ring(mem)
    if set(keys) - _episode_keys(mem):
        _fail("an episode the same writers wrote after the fault is not stored whole")
    for w in scn.writers:
        w.close()
    new = scn.new_writer(2 if batch else None)
    keys = write_episodes(scn, [new], [20, 21] if batch else [20], batch)
    new.close()
    check_ring(mem)
    if set(keys) - _episode_keys(mem):
        _fail("an episode a new writer wrote after the fault is not stored whole")
    active = np.flatnonzero(mem.ring.block_state == _ACTIVE)
    if len(active):
        _fail(f"blocks {active.tolist()} stay active with every writer closed: no writer holds "
              "them, so they are never retired nor evicted")


def _sample_and_check(mem, problems):
    """A sample returns, and then (every queued step entered) the tree holds exactly the
    VALID slots."""
    try:
        if len(mem) >= 4:
            mem.sample(4, n_step=3, gamma=0.9, beta=0.5 if mem.prioritized else None,
                       rng=np.random.default_rng(1))
        check_distribution(mem)
    except Broken as err:
        problems['a'] = f"after a sample: {err}"
    except Exception as err:
        problems['a'] = f"a sample raised {_first_line(err)}"


def _check_ring_into(mem, problems):
    try:
        check_ring(mem)
    except Broken as err:
        problems['a'] = str(err)
    except Exception as err:
        problems['a'] = f"checking the ring raised {_first_line(err)}"


def _save_load(mem, filename, problems):
    """``mem`` saved and loaded back: its content, or None (the problem recorded)."""
    try:
        mem.save(filename)
    except Exception as err:
        problems['b'] = f"save raised {_first_line(err)}"
        return None
    return _load(filename, problems)


def _load(filename, problems):
    try:
        return content(ReplayMemory.load(filename))
    except Exception as err:
        problems['b'] = f"the save does not load: {_first_line(err)}"
        return None


def _compare(got, twins, problems):
    if got is None or any(got == t for t in twins.values()):
        return
    problems['c'] = '; '.join(f"vs {name}: {describe_difference(got, t)}"
                              for name, t in twins.items())
    before, after = twins.get('before'), twins.get('after')
    if before is not None and after is not None and _only_evicted(got, before, after):
        problems['c'] = ("the write's block claim evicted what the write evicts, but none of its "
                         "steps is stored (" + problems['c'] + ")")


def _only_evicted(got, before, after):
    """``got`` is the twin after the write without the write's own steps (those taken from a
    frame no step of the twin before was taken from): the write's eviction took effect, its
    steps did not."""
    taken_before = {step[0] for step in before['steps']}
    own = [step for step in after['steps'] if step[0] not in taken_before]
    rest = collections.Counter(map(repr, after['steps'])) - collections.Counter(map(repr, own))
    return (collections.Counter(map(repr, got['steps'])) == rest
            and got['counters']['num_steps_written'] == before['counters']['num_steps_written'])


def after_write_fault(scn, twins, filename, same_memory=False):
    """The checks after a write was cut short, in the thread it interrupted (the memory's
    own checks are skipped when it is bit for bit a twin's, which passed them)."""
    problems = {}
    if not same_memory:
        _check_ring_into(scn.mem, problems)
        if 'a' not in problems:
            _sample_and_check(scn.mem, problems)
        _compare(_save_load(scn.mem, filename, problems), twins, problems)
    if 'a' not in problems:
        try:
            continue_writing(scn)
        except Broken as err:
            problems['e'] = str(err)
        except Exception as err:
            problems['e'] = f"a later write raised {_first_line(err)}"
    return problems




# ---------------------------------------------------------------------------------------- running
class Aborted(Exception):
    """The injection can not go on (a thread is left blocked)."""


def _first_line(err):
    return f"{type(err).__name__}: {err}".splitlines()[0][:300]


def drive(results, loop):
    """``loop(results)`` (every injection point of a test) in a thread of its own, which the
    caller's thread watches: a point that makes no progress for :data:`CALL_TIMEOUT` seconds is
    hung (it is marked (d) and the rest aborted; its thread is left behind, blocked)."""
    box = {}

    def target():
        try:
            loop(results)
        except Aborted as err:
            results.aborted = str(err)
        except BaseException as err:   # noqa: B036 - handed to the caller
            box['error'] = err
    t = threading.Thread(target=target, daemon=True)
    t.start()
    done = -1
    while t.is_alive():
        t.join(CALL_TIMEOUT)
        if t.is_alive() and len(results.points) == done:
            if results.points:
                results.points[-1].problems['d'] = (f"a call after the fault hangs "
                                                    f"({CALL_TIMEOUT} s)")
            results.aborted = f"hung after {done} points"
            return
        done = len(results.points)
    if 'error' in box:
        raise box['error']


# The module-level locks of the code a fault can land in (the kernel registry): a hold left
# there stops every memory built later.
MODULE_LOCKS = {'expreplay._kernels._lock': _kernels._lock}


def retake_locks(mem, problems):
    """(d), in the thread the fault interrupted: its next call takes every lock at once. A hold
    it can not take is recorded, then given back so that the checks can go on."""
    locks = dict(MODULE_LOCKS)
    if mem is not None:
        locks['the memory lock (ring.lock)'] = mem.ring.lock
    held = []
    for name, lock in locks.items():
        if lock.acquire(blocking=False):
            lock.release()
            continue
        held.append(name)
        try:
            lock.release()
        except RuntimeError as err:
            raise Aborted(f"{name} is held and can not be given back: {err}") from err
    if held:
        problems['d'] = ("left held, the interrupted thread's next call can not take it: "
                         + ', '.join(held))


class _Prober:
    """A thread that tries locks for the checks: "can another thread take it now?" (one
    thread for the whole run: starting one per check costs more than the check)."""

    def __init__(self):
        self._requests = queue.Queue()
        self._thread = None

    def _serve(self):
        while True:
            lock, box, done = self._requests.get()
            if lock.acquire(blocking=False):
                lock.release()
                box.append(True)
            done.set()

    def can_take(self, lock):
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._serve, daemon=True,
                                            name='fault-injection-prober')
            self._thread.start()
        box, done = [], threading.Event()
        self._requests.put((lock, box, done))
        if not done.wait(CALL_TIMEOUT):
            raise Aborted("the lock prober is stuck")
        return bool(box)


_prober = _Prober()


def other_threads_can_lock(mem, problems):
    """(d): once the interrupted thread has called the memory again, another thread (a
    sampler's) takes the memory's lock at once."""
    if not _prober.can_take(mem.ring.lock):
        problems.setdefault('d', "the memory lock stays held for other threads after the "
                                 "interrupted thread called the memory again")


def fingerprint(mem, writers=()):
    """A digest of everything the memory and its writers hold, walked generically through the
    library's objects (every array, counter and journal; a container of the library's by its
    items), but the sampler's scratch buffers and the garbage rows of the slot tables (slots
    not written, I2; their flags are kept). Read under the memory's lock. Equal digests: the
    same memory, as far as anything can read it."""
    h = hashlib.blake2b(digest_size=20)
    ring = mem.ring
    seen = {id(mem.sampler)}
    bs = ring.block_size
    written = (np.arange(bs)[None, :] < ring.block_fill[:, None]).reshape(-1)
    garbage_rows = {id(arr) for name, arr, kind in ring.tables()
                    if kind == 'slot' and name != 'flags'}

    def walk(x):
        if isinstance(x, np.ndarray):
            if id(x) in garbage_rows:
                x = np.concatenate([x[:ring.num_slots][written].reshape(-1),
                                    x[ring.num_slots:].reshape(-1)])
            h.update(f"{x.dtype.str}{x.shape}".encode())
            h.update(np.ascontiguousarray(x).tobytes())
        elif x is None or isinstance(x, (bool, int, float, str, bytes, np.generic)):
            h.update(repr(x).encode())
        elif id(x) in seen:
            h.update(b'@')
        else:
            seen.add(id(x))
            cls = type(x)
            h.update(cls.__name__.encode())
            ours = (cls.__module__ or '').startswith('expreplay')
            if isinstance(x, (list, tuple, collections.deque)) or (
                    ours and hasattr(x, '__iter__') and hasattr(x, '__len__')):
                for v in list(x):
                    walk(v)
            elif isinstance(x, dict):
                for k, v in x.items():
                    walk(k)
                    walk(v)
            elif isinstance(x, (set, frozenset)):
                h.update(repr(sorted(map(repr, x))).encode())
            elif ours:
                for klass in cls.__mro__:
                    for name in getattr(klass, '__slots__', ()):
                        walk(getattr(x, name, None))
                if hasattr(x, '__dict__'):
                    walk(vars(x))
            h.update(b')')
    with ring.lock:
        walk(mem)
        walk(list(writers))
    return h.digest()


def run_point(results, lbl, op_index, event, expected_site, build, exc, checks, key, memo):
    """One injection point, in the thread the fault interrupts (as a caller would go on):
    ``build()`` gives ``(memory, writers, call)``; ``call`` runs with the fault at ``event``;
    then the locks; then ``checks(memory, writers)``, unless ``key(memory, writers)`` (a digest
    of all that the checks read) is in ``memo``: a state checked before (or a twin's, which
    passed every check without a fault) has the outcome it had."""
    point = Point(lbl, op_index, event, expected_site)
    results.points.append(point)
    mem, writers, call = build()
    tracer = Tracer(fire_at=event, exc=exc)
    tracer.run(call)
    assert tracer.fired == expected_site, "the script is not deterministic"
    retake_locks(mem, point.problems)
    if mem is not None:
        other_threads_can_lock(mem, point.problems)
    state = key(mem, writers)
    if state not in memo:
        memo[state] = checks(mem, writers)
    point.problems.update(memo[state])


def zip_signature(filename):
    """What a checkpoint file holds, by its entries' names, sizes and CRCs (its bytes also
    hold the time it was written)."""
    try:
        with zipfile.ZipFile(filename) as zf:
            return tuple((i.filename, i.file_size, i.CRC) for i in zf.infolist())
    except FileNotFoundError:
        return 'missing'
    except Exception as err:
        return f"unreadable {os.path.getsize(filename)} {err}"


def inject_writes(path, kind, writer, seed, tmpdir, exc=Injected, exhaustive=False):
    """Cut every target of the ``writer`` script at each of its injection points."""
    results = Results()
    script = (lane_script if writer == 'lane' else batch_script)(kind, seed)
    filename = os.path.join(tmpdir, 'mem.npz')

    def scenario(upto):
        return Scenario(path, kind, writer, script, upto=upto)

    def loop(results):
        for k in choose_targets(path, kind, writer, script, exhaustive):
            op = script[k]
            ref = scenario(k)
            before = ref.mem.ring.block_gen.copy(), ref.mem.ring.block_fill.copy()
            # The twins' states, with their writers and alone: they pass every check.
            memo = {fingerprint(ref.mem, ref.writers): {}}
            twin_memories = {fingerprint(ref.mem)}
            counting = Tracer(record=True)
            counting.run(lambda: ref.apply(op))
            memo[fingerprint(ref.mem, ref.writers)] = {}
            twin_memories.add(fingerprint(ref.mem))
            lbl = label(op[0], before, (ref.mem.ring.block_gen, ref.mem.ring.block_fill))
            twins = {}
            for name, upto in (('before', k), ('after', k + 1)):
                try:
                    check_ring(scenario(upto).mem)
                    continue_writing(scenario(upto))
                except Broken as err:
                    raise AssertionError(f"without a fault, {name} {OP_NAMES[op[0]]} "
                                         f"(op {k}): {err}") from err
                twins[name] = saved_content(scenario(upto).mem, filename)

            def build():
                scn = scenario(k)
                return scn.mem, scn.writers, lambda: scn.apply(op)

            def checks(mem, writers):
                scn = Scenario.__new__(Scenario)
                scn.__dict__.update(path=path, kind=kind, writer=writer, mem=mem, writers=writers)
                # A twin's memory with other writers: only the writes after the fault tell.
                return after_write_fault(scn, twins, filename, fingerprint(mem) in twin_memories)
            for i in range(counting.count):
                run_point(results, lbl, k, i, counting.sites[i], build, exc, checks,
                          fingerprint, memo)

    drive(results, loop)
    return results


def _temps(filename):
    return glob.glob(glob.escape(filename) + '.tmp-*')


def inject_checkpoint_op(path, op_name, seed, tmpdir, exc=Injected):
    """Cut ``mem.save`` (over an older checkpoint of the memory), ``mem.restore`` (into a new
    memory) or ``ReplayMemory.load`` at each of its injection points."""
    results = Results()
    kind = 'prioritized+extras'
    script = lane_script(kind, seed, n_ops=45)     # the ring wrapped, priorities updated
    old, full = os.path.join(tmpdir, 'old.npz'), os.path.join(tmpdir, 'full.npz')
    target, spare = os.path.join(tmpdir, 'target.npz'), os.path.join(tmpdir, 'spare.npz')
    c_old = saved_content(Scenario(path, kind, 'lane', script, upto=20).mem, old)
    c_full = saved_content(Scenario(path, kind, 'lane', script, upto=len(script)).mem, full)
    with kernel_path(path, *KERNELS):
        c_new = content(ReplayMemory(**SIZES, **KINDS[kind]))

    def new_memory():
        with kernel_path(path, *KERNELS):
            return ReplayMemory(**SIZES, **KINDS[kind])

    def build():
        # What an earlier point's fault left beside the files goes (it was checked then), so
        # that every run of the call takes the same lines.
        for tmp in _temps(target) + _temps(full):
            os.remove(tmp)
        _atomic_file._live_temps.difference_update(
            name for name in list(_atomic_file._live_temps) if name.startswith(tmpdir))
        if op_name == 'save':
            shutil.copyfile(old, target)
            scn = Scenario(path, kind, 'lane', script, upto=len(script))
            return scn.mem, scn.writers, lambda: scn.mem.save(target)
        if op_name == 'restore':
            mem = new_memory()
            return mem, [], lambda: mem.restore(full)
        return None, [], lambda: ReplayMemory.load(full)

    def after_save(mem, _):
        problems = {}
        _check_ring_into(mem, problems)
        # The cut-short save's objects collected first, as they are once the exception is
        # handled: a file object still alive (the traceback can hold the save's frame) holds
        # its lock, and a temporary file a live writer holds is not a dead save's.
        gc.collect()
        # The file at the path: the older checkpoint or the new one, whole.
        _compare(_load(target, problems), {'older file': c_old, 'new file': c_full}, problems)
        if _temps(target):
            problems['b'] = "a temporary file is left beside the checkpoint after its next load"
        # The memory itself: what its save was to write.
        _compare(_save_load(mem, spare, problems), {'the memory': c_full}, problems)
        return problems

    def after_restore(mem, _):
        problems = {}
        _check_ring_into(mem, problems)
        if 'a' in problems:
            return problems
        _sample_and_check(mem, problems)
        if mem.ring.untouched:
            # Left new: it must be new in every table, and take the checkpoint now.
            got = content(mem)
            if got != c_new:
                problems['c'] = f"left 'new' but not empty: {describe_difference(got, c_new)}"
            try:
                mem.restore(full)
            except Exception as err:
                problems['b'] = f"restoring again raised {_first_line(err)}"
        _compare(_save_load(mem, spare, problems), {'new memory': c_new, 'checkpoint': c_full},
                 problems)
        scn = Scenario.__new__(Scenario)
        scn.__dict__.update(path=path, kind=kind, writer='lane', mem=mem)
        try:
            scn.writers = [scn.new_writer(None) for _ in range(2)]
            continue_writing(scn)
        except Broken as err:
            problems['e'] = str(err)
        except Exception as err:
            problems['e'] = f"a later write raised {_first_line(err)}"
        return problems

    def after_load(*_):
        problems = {}
        _compare(_load(full, problems), {'checkpoint': c_full}, problems)
        if _temps(full):
            problems['b'] = "a temporary file is left beside the checkpoint"
        return problems

    checks = {'save': after_save, 'restore': after_restore, 'load': after_load}[op_name]

    def key(mem, writers):
        files = (zip_signature(target), zip_signature(full), bool(_temps(target) + _temps(full)),
                 len(_atomic_file._live_temps))
        return files if mem is None else (fingerprint(mem, writers), files)
    memo = {}
    if op_name == 'restore':
        # A new memory, or the memory the checkpoint holds: the twins.
        twin = new_memory()
        memo[key(twin, [])] = {}
        twin.restore(full)
        memo[key(twin, [])] = {}

    def loop(results):
        _, _, call = build()
        counting = Tracer(record=True)
        counting.run(call)
        for i in range(counting.count):
            run_point(results, OP_NAMES[op_name], 0, i, counting.sites[i], build, exc, checks,
                      key, memo)

    drive(results, loop)
    return results
