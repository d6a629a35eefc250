"""Real signals at random instants; run by test_interrupts.py in a child process (signals are
handled in a process's main thread, which pytest's workers may not own).

    python interrupted_runs.py RUNS SEED DIR [--double]
    python interrupted_runs.py --writes RUNS SEED DIR [--memory-in-thread]
    python interrupted_runs.py --latency sample|add_step SIGNALS SEED
    python interrupted_runs.py --slow-start

Each run builds a memory (uniform or prioritized, alternately) and a stream of one player
(stepped inline by this thread: the case where the signal lands in the memory's writes) or of
two players (simulator threads), with a checkpoint directory; a timer thread sends SIGINT or
SIGTERM (whose handler raises KeyboardInterrupt, as the examples install it) to the process at
a random instant of the fill or of the training loop (which feeds priorities back); with
``--double`` a second signal follows 0-5 ms later, usually inside the stop's close and save.
After the KeyboardInterrupt the script calls ``close()`` again, as a user would, waits until
every signal sent has raised its KeyboardInterrupt, and then checks: the checkpoint saved at
the stop loads (the load checks every invariant of the tables), it holds what the memory
holds, and no thread of the stream is left. One line of JSON per run: where the signal landed and what was found.

``--writes``: the memory's own calls in a tight loop of this thread (a writer's steps and
episode starts, prioritized draws, priority updates), a SIGINT at a random instant of each run,
the loop going on with the same writer after it (a notebook's next cell); after every run the
memory is saved and loaded (the load checks the invariants). Here nearly every instant is
inside the memory's code. The SIGINT handler is installed after the memory is built (with
``--memory-in-thread`` the memory is built in another thread): the library takes no part in
the handling, the memory's writes are consistent at every instant by themselves.

``--latency``: under a trace function (as under coverage or a debugger), SIGINTs at random
instants of a loop of ``memory.sample(32)`` or of ``writer.add_step``; one line per signal with
the seconds from its sending to its KeyboardInterrupt.

``--slow-start``: a two-player stream whose second ``get_player()`` call takes 4 s; a SIGINT
sent once the start is inside it. One line: the seconds from the signal to the
KeyboardInterrupt out of ``start()``, and the stream's threads alive then and after ``close()``.
"""

import json
import os
import random
import signal
import sys
import threading
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from expreplay import Population, ReplayMemory, ReplayStream, Sampling   # noqa: E402
from expreplay.stream import MemoryCheckpoint   # noqa: E402
from scripted_env import ScriptedEnv   # noqa: E402

STREAM_THREADS = ('SimulatorThread', 'InferenceThread', 'ReplayStream-prefetch',
                  'Population-start')


HANDLED = []     # the signals whose handler ran (two sent at once may arrive as one)
RAISING = [False]  # True from a run's first signal to the end of its stop


def stop_as_ctrl_c(signum, frame):
    """The handler of both signals (SIGTERM as the examples install it)."""
    if RAISING[0]:
        HANDLED.append(signum)
        raise KeyboardInterrupt


def q_values(states):
    return np.tile(np.arange(3, dtype=np.float32), (len(states), 1))


def build(run, directory):
    players = 1 if run % 4 < 2 else 2
    prioritized = run % 2 == 1
    memory = ReplayMemory(3000, (6,), 4, prioritized=prioritized, block_size=64)
    population = Population(lambda: ScriptedEnv(0, episode_lengths=(37, 5, 90)), players,
                            q_values, exploration=0.5, seed=run)
    sampling = Sampling(16, update_frequency=2, n_step=3 if prioritized else 1,
                        beta=0.4 if prioritized else None, seed=run)
    return ReplayStream(memory, population, sampling, init_memory_size=800, progress=False,
                        checkpoint_dir=directory)


def train(stream, batches):
    for k, batch in enumerate(stream):
        if stream.memory.prioritized:
            stream.update_priorities(batch.indices, np.abs(batch.reward) + 0.1)
        if k >= batches:
            break


def one_run(run, directory, delay, double, rng):
    stream = build(run, directory)
    signum = signal.SIGINT if rng.random() < 0.5 else signal.SIGTERM
    pid, sent = os.getpid(), 2 if double else 1

    def send():
        RAISING[0] = True
        os.kill(pid, signum)
        if double:
            time.sleep(rng.uniform(0, 0.005))     # the second signal 0-5 ms after the first
            os.kill(pid, signum)

    timer = threading.Timer(delay, send)
    state = dict(stage='stream', phase='done', caught=0)

    def proceed():
        # Each stage is marked done before it starts, so that an interrupt inside it moves on:
        # the stream's `with` closes it on the way out, and the stage after calls close() again.
        if state['stage'] == 'stream':
            state['stage'] = 'close'
            timer.start()         # here: a signal sent at once lands inside the try
            with stream:
                try:
                    train(stream, 300)
                finally:
                    state['phase'] = 'training' if stream.wait_ready(0) else 'fill'
        if state['stage'] == 'close':
            stream.close()      # a user's second close(), after a stop that raised
            state['stage'] = 'wait'
        timer.join()
        # Every signal was sent when the join returns; Python runs a handler still due at
        # the next call of this thread: this one, inside the try.
        os.getpid()
        RAISING[0] = False    # the checks below run undisturbed

    for _ in range(2 * sent + 2):
        try:
            proceed()
            break
        except KeyboardInterrupt:
            state['caught'] += 1
    problems = []
    handled = len(HANDLED)
    HANDLED.clear()
    if not handled:
        problems.append(f"{sent} signals sent, their handler never ran")
    path = os.path.join(directory, MemoryCheckpoint.FILENAME)
    loaded = None
    try:
        loaded = len(ReplayMemory.load(path))
        if loaded != len(stream.memory):
            problems.append(f"the checkpoint holds {loaded} transitions, the memory "
                            f"{len(stream.memory)}")
    except Exception as err:
        problems.append(f"{type(err).__name__}: {err}")
    alive = [t for t in threading.enumerate() if t.name.startswith(STREAM_THREADS)]
    return dict(run=run, phase=state['phase'], signal=int(signum), handled=handled,
                players=stream.population.num_players, prioritized=stream.memory.prioritized,
                problems=problems, loaded=loaded, in_memory=len(stream.memory),
                alive=[t.name for t in alive], where=where(alive),
                lock=repr(stream.memory.ring.lock.raw) if alive else None,
                idents={t.name: t.ident for t in threading.enumerate()} if alive else None)


def where(threads):
    """Each thread's innermost frames, for a report of what a thread left running waits for."""
    frames = sys._current_frames()
    out = {}
    for t in threads:
        stack = traceback.extract_stack(frames[t.ident]) if t.ident in frames else []
        out[t.name] = [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in stack[-6:]]
    return out


def write_until_interrupted(memory, writer, rng, step):
    """Steps, episode ends and prioritized draws with priority updates, until a signal."""
    frame = np.zeros(6, np.uint8)
    while True:
        step += 1
        frame[0] = step % 251
        if not writer.in_episode:   # a signal landed between an episode's end and the next start
            writer.start_episode(frame)
        end = rng.random() < 0.02
        writer.add_step(step % 3, 1.0, frame, terminated=end)
        if end:
            writer.start_episode(frame)
        if step % 8 == 0 and len(memory) >= 32:
            batch = memory.sample(32, n_step=3, beta=0.4)
            memory.update_priorities(batch.indices, np.abs(batch.reward) + 0.1)


def writes(runs, seed, root, in_thread):
    def build():
        memory = ReplayMemory(3000, (6,), 4, prioritized=True, block_size=64)
        writer = memory.new_writer()
        writer.start_episode(np.zeros(6, np.uint8))
        return memory, writer

    if in_thread:
        built = []
        builder = threading.Thread(target=lambda: built.append(build()))
        builder.start()
        builder.join()
        memory, writer = built[0]
    else:
        memory, writer = build()
    signal.signal(signal.SIGINT, stop_as_ctrl_c)     # the user's handler, after the memory
    rng, pid, step = random.Random(seed), os.getpid(), 0

    def send():
        RAISING[0] = True
        os.kill(pid, signal.SIGINT)

    for run in range(runs):
        timer = threading.Timer(rng.uniform(0, 0.003), send)
        try:
            timer.start()
            write_until_interrupted(memory, writer, rng, step)
        except KeyboardInterrupt:
            pass
        RAISING[0] = False
        timer.join()
        step = memory.num_steps_written
        problems = []
        path = os.path.join(root, 'memory.npz')
        try:
            memory.save(path)
            loaded = len(ReplayMemory.load(path))
            if loaded != len(memory):
                problems.append(f"the checkpoint holds {loaded}, the memory {len(memory)}")
        except Exception as err:
            problems.append(f"{type(err).__name__}: {err}")
        print(json.dumps(dict(run=run, phase='writes', handled=len(HANDLED),
                              problems=problems, alive=[])), flush=True)
        HANDLED.clear()
        if problems:     # the writer's memory is broken: the next runs would only repeat it
            return


TRACED = [0]    # the tracer's calls


def tracer(frame, event, arg):
    """A trace function of the kind coverage and debuggers set: called for every line."""
    TRACED[0] += 1
    return tracer


def latency(kind, signals, seed):
    memory = ReplayMemory(3000, (6,), 4, block_size=64)
    writer = memory.new_writer()
    frame = np.zeros(6, np.uint8)
    writer.start_episode(frame)
    for step in range(200):
        writer.add_step(step % 3, 1.0, frame)
    rng, pid = random.Random(seed), os.getpid()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for _ in range(signals):
        # Set again each time: Python unsets a trace function that raises, as it does when
        # the KeyboardInterrupt lands inside the trace function's own code.
        sys.settrace(tracer)
        TRACED[0] = 0
        sent = []

        def send():
            sent.append(time.monotonic())
            os.kill(pid, signal.SIGINT)

        timer = threading.Timer(rng.uniform(0.001, 0.02), send)
        caught = None
        try:
            timer.start()
            step = 0
            while True:
                if kind == 'sample':
                    memory.sample(32)
                else:
                    step += 1
                    writer.add_step(step % 3, 1.0, frame, terminated=step % 50 == 0)
                    if not writer.in_episode:
                        writer.start_episode(frame)
        except KeyboardInterrupt:
            caught = time.monotonic()
        sys.settrace(None)
        traced = TRACED[0]
        timer.join()
        if not writer.in_episode:     # the signal landed between an episode's end and start
            writer.start_episode(frame)
        print(json.dumps(dict(kind=kind, latency=caught - sent[0], traced=traced)), flush=True)


def slow_start():
    calls, inside = [], threading.Event()

    def get_player():
        calls.append(1)
        if len(calls) == 2:       # the first is the stream's check, the second the start's
            inside.set()
            time.sleep(4)         # a slow env constructor
        return ScriptedEnv(0)

    memory = ReplayMemory(1000, (6,), 4)
    population = Population(get_player, 2, q_values, exploration=1.0)
    stream = ReplayStream(memory, population, Sampling(16, 2), init_memory_size=100,
                          progress=False)
    sent = []

    def send():
        inside.wait(60)
        sent.append(time.monotonic())
        # At the main thread, as a terminal's Ctrl-C lands: a signal sent to the process from
        # this thread may be taken by this thread, and the main thread's sleep then runs out
        # before Python looks at it (a 4 s "latency" that is the kernel's pick, not the start's).
        signal.pthread_kill(main, signal.SIGINT)

    main = threading.main_thread().ident
    sender = threading.Thread(target=send)
    sender.start()
    caught = None
    try:
        stream.start()
    except KeyboardInterrupt:
        caught = time.monotonic()
    sender.join()
    alive = [t.name for t in threading.enumerate() if t.name.startswith(STREAM_THREADS)]
    stream.close()
    after = [t.name for t in threading.enumerate() if t.name.startswith(STREAM_THREADS)]
    print(json.dumps(dict(latency=None if caught is None else caught - sent[0],
                          alive=alive, alive_after_close=after)), flush=True)


def main():
    if sys.argv[1] == '--writes':
        return writes(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                      '--memory-in-thread' in sys.argv)
    if sys.argv[1] == '--latency':
        return latency(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    if sys.argv[1] == '--slow-start':
        return slow_start()
    runs, seed, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    double = '--double' in sys.argv
    signal.signal(signal.SIGINT, stop_as_ctrl_c)
    signal.signal(signal.SIGTERM, stop_as_ctrl_c)
    rng = random.Random(seed)
    # How long an uninterrupted run's fill and training take here, per kind of run.
    timing = {}
    for kind in range(4):
        stream = build(kind, os.path.join(root, f'timing{kind}'))
        start = time.perf_counter()
        stream.start()
        filled = time.perf_counter()
        train(stream, 300)
        timing[kind] = (filled - start, time.perf_counter() - filled)
        stream.close()
    for run in range(runs):
        fill, training = timing[run % 4]
        # Half the signals in the fill, half in the training loop.
        delay = rng.uniform(0, 0.8 * fill) if run % 8 < 4 else 1.3 * fill + rng.uniform(0, training)
        result = one_run(run, os.path.join(root, f"run{run}"), delay, double, rng)
        print(json.dumps(result), flush=True)


if __name__ == '__main__':
    main()
