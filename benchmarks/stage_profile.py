"""Where a replay pipeline's CPU and GIL go, stage by stage: the instruments of ``bench_e2e.py --profile``.

Two instruments, used in separate rounds (each perturbs what the other measures):

* :class:`StageClock`: counters at the stage boundaries. The benchmark wraps the functions that
  begin a stage (the env's ``step``, ``LaneEpisodes.store``, ``Pacer.before_draw``...) from the
  outside, without editing the library; each wrapped call adds its thread's CPU time
  (``time.thread_time``) to its stage, less that of the wrapped calls nested in it, so every
  CPU second is counted once. What a thread spends outside every wrapped call (its loop, its
  locks and condition variables) is its *residual*, given to the stage the thread serves; the
  CPU of threads Python does not know (an engine's C++ threads) is the process's CPU less that of
  the Python threads.
* :func:`record_gil`: ``py-spy record --gil`` on this process: stacks sampled only while a
  thread holds the GIL. :func:`gil_stages` sorts each sample into a stage by the innermost frame
  of its stack that begins one (:data:`STAGE_FRAMES`); samples / rate is GIL-held time.

For pure Python, CPU time and GIL-held time are the same; they differ where C code releases the
GIL (opencv's resize, an engine's ``recv``, large numpy copies) or where a thread holding it
waits for nothing else (never, here).
"""

if __name__ == '__main__':
    # A module a benchmark imports, not a program: --help says so.
    import argparse
    argparse.ArgumentParser(
        description=__doc__, epilog='This module is imported by benchmarks/bench_e2e.py; run that.',
        formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    raise SystemExit('stage_profile.py is imported by benchmarks/bench_e2e.py; run '
                     'bench_e2e.py --profile (--help for its options).')


import collections
import functools
import os
import re
import subprocess
import sys
import threading
import time

__all__ = ['StageClock', 'record_gil', 'gil_stages', 'gil_functions', 'STAGE_FRAMES', 'THREAD_STAGES']

# What a thread's residual (its CPU outside every wrapped call) is counted as, by thread name.
THREAD_STAGES = {'MainThread': 'learner loop (benchmark)', 'ReplayStream-prefetch': 'hand-over',
                 'InferenceThread': 'predictor hand-off', 'SimulatorThread': 'acting'}
NATIVE = 'env step: engine threads (C++)'

# py-spy frames ``function (file:line)`` that begin a stage: (file name, function or None for
# any function of the file, stage). The innermost frame of a stack that matches decides.
STAGE_FRAMES = [
    # the requests the pacer makes wait in the window: pacing, not acting
    ('window.py', 'accept', 'pace'),
    ('window.py', 'wait_idle', 'pace'),
    ('manager.py', 'step', 'pace'),
    ('population.py', 'step', 'pace'),
    ('simulator.py', None, 'acting'),
    ('window.py', None, 'acting'),
    ('group.py', None, 'acting'),
    ('lanes.py', 'store', 'write'),
    ('lanes.py', 'store_fast', 'write'),
    ('lanes.py', 'start', 'write'),
    ('writers.py', None, 'write'),
    ('inference.py', None, 'predictor hand-off'),
    ('bench_e2e.py', 'predictor', 'predictor (simulated, off-CPU)'),
    ('bench_e2e.py', 'measure', 'learner loop (benchmark)'),
    ('bench_e2e.py', 'learner', 'learner loop (benchmark)'),
    ('prefetch.py', None, 'hand-over'),
    ('pacing.py', None, 'pace'),
    ('sampling.py', 'draw', 'draw'),
    ('atari_wrappers.py', None, 'env step'),
    ('vector_env.py', None, 'env step'),
    ('gymnasium', None, 'env step'),
    ('ale_py', None, 'env step'),
]


class StageClock:
    """CPU seconds per stage, from wrapped calls (see the module docstring). Off until
    :meth:`start`; a wrapped call costs one flag test while off."""

    def __init__(self):
        self.on = False
        self._local = threading.local()
        self._tables = []          # [(thread ident, {stage: cpu seconds})]
        self._lock = threading.Lock()
        self._thread0 = self._process0 = None

    def wrap(self, fn, stage):
        """``fn`` counting its calls' CPU as ``stage``."""
        clock = self

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if not clock.on:
                return fn(*args, **kwargs)
            return clock._timed(stage, fn, args, kwargs)
        return timed

    def patch(self, owner, name, stage):
        """Replace ``owner.name`` (a class's method or an object's) by its wrapped self."""
        setattr(owner, name, self.wrap(getattr(owner, name), stage))

    def _table(self):
        local = self._local
        table = getattr(local, 'table', None)
        if table is None:
            table = local.table = collections.defaultdict(float)
            local.stack = []
            with self._lock:
                self._tables.append((threading.get_ident(), table))
        return table, local.stack

    def _timed(self, stage, fn, args, kwargs):
        table, stack = self._table()
        stack.append(0.0)                       # CPU of the wrapped calls nested in this one
        c0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            c = time.thread_time() - c0
            nested = stack.pop()
            table[stage] += c - nested
            if stack:
                stack[-1] += c

    # ------------------------------------------------------------------ a measured span
    def start(self):
        """Clear the counters and begin counting (the threads' CPU clocks read now)."""
        with self._lock:
            for _, table in self._tables:
                table.clear()
        self._thread0 = _threads_cpu()
        self._process0 = time.process_time()
        self.on = True

    def stop(self):
        """Stop counting; ``{stage: CPU seconds}`` over the span, residuals included, and the
        process's CPU seconds."""
        self.on = False
        process = time.process_time() - self._process0
        threads1 = _threads_cpu()
        out = collections.defaultdict(float)
        by_thread = collections.defaultdict(float)
        with self._lock:
            tables = list(self._tables)
        for ident, table in tables:
            for stage, cpu in table.items():
                out[stage] += cpu
                by_thread[ident] += cpu
        python = 0.0
        for ident, (name, cpu1) in threads1.items():
            cpu = cpu1 - self._thread0.get(ident, (name, 0.0))[1]
            python += cpu
            out[_thread_stage(name)] += cpu - by_thread.get(ident, 0.0)
        out[NATIVE] += max(process - python, 0.0)
        return dict(out), process


def _thread_stage(name):
    for prefix, stage in THREAD_STAGES.items():
        if name.startswith(prefix):
            return stage
    return f'other thread ({name})'


def _threads_cpu():
    """``{ident: (name, CPU seconds)}`` of this process's live Python threads."""
    out = {}
    for t in threading.enumerate():
        try:
            out[t.ident] = (t.name, time.clock_gettime(time.pthread_getcpuclockid(t.ident)))
        except (OSError, TypeError):     # the thread ended meanwhile
            pass
    return out


# ---------------------------------------------------------------------------- py-spy
def record_gil(seconds, rate, path):
    """Start ``py-spy record --gil`` on this process for ``seconds`` at ``rate`` samples/s
    into ``path`` (raw, one line per distinct stack); returns the process to ``wait()`` on,
    or None with the reason printed when py-spy is missing or refused (it needs ptrace:
    root, or ``kernel.yama.ptrace_scope`` 0)."""
    exe = os.path.join(os.path.dirname(sys.executable), 'py-spy')
    if not os.path.exists(exe):
        print("py-spy is not installed (pip install py-spy): no GIL column", file=sys.stderr)
        return None
    # --nonblocking: the process is not paused at each sample (a paused pipeline's threads
    # would bunch up behind the samples).
    return subprocess.Popen([exe, 'record', '--gil', '--nonblocking', '--threads', '--rate',
                             str(rate), '--duration', str(int(seconds)), '--format', 'raw',
                             '-o', path, '--pid', str(os.getpid())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _samples(path):
    """``(thread name, frames outermost first, count)`` of each line of py-spy's raw output."""
    with open(path) as f:
        text = f.read()
    # A frame's name may hold newlines (py-spy sometimes reads a module's docstring as its
    # name), so a sample is a line that starts with its thread and the lines that follow it.
    if not text.strip():
        return
    for line in re.split(r'\n(?=thread \()', text.strip('\n')):
        stack, _, count = line.replace('\n', ' ').rpartition(' ')
        frames = stack.split(';')
        thread = ''
        if frames and frames[0].startswith('thread'):    # --threads: 'thread (tid): name'
            thread = frames.pop(0).split(': ', 1)[-1]
        yield thread, frames, int(count)


def gil_stages(path, rate):
    """``{stage: GIL-held seconds}`` from py-spy's raw output at ``path`` sampled at ``rate``."""
    out = collections.defaultdict(float)
    for thread, frames, count in _samples(path):
        out[_frames_stage(frames, thread)] += count / rate
    return dict(out)


def gil_functions(path, rate):
    """``{(stage, function): GIL-held seconds}`` from py-spy's raw output: each sample goes to
    the innermost frame of the library (``expreplay/``) in its stack, the function whose own
    code, or the numpy and threading calls it makes, held the GIL; a stack without one to its
    innermost frame."""
    out = collections.defaultdict(float)
    for thread, frames, count in _samples(path):
        ours = [fr for fr in frames if 'expreplay/' in fr]
        func, _, where = (ours or frames or ['?'])[-1].partition(' (')
        name = f"{func} ({os.path.basename(where.rsplit(':', 1)[0])})"
        out[(_frames_stage(frames, thread), name)] += count / rate
    return dict(out)


def _frames_stage(frames, thread):
    for frame in reversed(frames):          # innermost first
        func, _, where = frame.partition(' (')
        func = func.rsplit('.', 1)[-1]      # py-spy names methods Class.method
        for file_part, name, stage in STAGE_FRAMES:
            if file_part in where and (name is None or func == name):
                return stage
    return _thread_stage(thread)
