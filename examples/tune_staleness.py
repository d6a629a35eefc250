#!/usr/bin/env python
"""Choose num_parallel_players and maximum_staleness: measure throughput against request lag.

    python examples/tune_staleness.py --env ALE/Pong-v5 --players 1 2 4 --staleness 1 2 4 8 16
    python examples/tune_staleness.py --env CartPole-v1 --predictor mlp --train-ms 2
    python examples/tune_staleness.py --env cheap --predictor numpy --seconds 2   # no TF, seconds

The trade-off. After each batch the learner requests ``update_frequency`` environment steps;
the simulator threads execute them asynchronously, at most ``maximum_staleness`` requests
pending. A larger window lets acting overlap learning and lets several players act (and share
one batched forward pass) at once, so more steps per second reach the memory. The price is
lag: a request that waits behind others is executed after the learner has moved on, so the
transition it adds was asked for by an older learner (it is acted with the weights of when it
starts: what arrives late is the step, and the exploration its request carries). This script runs the real machinery
(``ReplayMemory``, ``EnvRunner``, ``EnvRunnerManager``) in a DQN-shaped loop for every
combination, measures, and writes ``staleness.csv`` (each combination's mean over
``--rounds`` rounds, with the spread), ``staleness_rounds.csv`` (every round) and
``staleness.png`` into ``--out-dir``.

What is measured, per combination, over ``--seconds`` after ``--warmup``:

* ``steps_per_sec``: transitions written into the replay memory per second.
* ``updates_per_sec``: learner updates (batches consumed) per second.
* ``request_lag``: when a step starts executing, how many step requests newer than it were
  already queued (0 = executed at once; at most ``maximum_staleness - 1``).
* ``update_lag``: when a step starts executing, how many learner updates happened since it
  was requested: how many predictor updates behind the newest request the acting step is
  (the library's own count, ``EnvRunnerManager.lags``: its ``request_lag``).
  The predictor reads the live weights when the step starts, so this lag delays the step and
  plays the exploration schedule late, but does not age the weights that act.

The learner: each update samples a real batch from the memory and then sleeps ``--train-ms``,
standing for the training step of a GPU learner (which, like a sleep, does not hold the GIL
or a CPU core). ``--train-ms 0`` measures how fast the population alone can go.

A single player is stepped inline in the learner's thread (no queue, no lag), so its
``maximum_staleness`` can not matter: it is measured once per round and shown as ``any``.
The rounds run the combinations in turn (round 1 of every combination, then round 2, ...), so
that a machine whose speed drifts during the sweep affects all of them alike; the spread of the
rounds (min to max) is in the CSV and drawn as error bars.

This measures the throughput side only. What lag costs learning is measured in
docs/staleness_learning.md (DQN on MinAtar to 1M frames, score against the measured request lag
and against the acting weights' age); the last lines printed give its result nearest to the
recommended combination's request lag.

The recommendation: the smallest window whose throughput is within the rounds' noise of the
best, i.e. whose fastest round reaches the slowest round of the fastest combination (one
player, no window at all, counts as the smallest; ties: the smaller update lag, fewer
players); the plot marks it. When several combinations are within that noise, the script
says so: their differences in throughput are not measured at this number of rounds, and the
pick rests on the lag alone. With one round there is no noise to go by: the pick is the
fastest. The sweep's time is printed before it starts and when it ends.
"""

import argparse
import csv
import itertools
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # the sibling example modules

from expreplay import EnvRunner, EnvRunnerManager, ManagerSettings, ReplayMemory  # noqa: E402
from staleness_learning import learning_cost  # noqa: E402


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--env', default='ALE/Pong-v5',
                   help="a gymnasium id ('ALE/...' ids get the DQN Atari preprocessing), or 'cheap': "
                        "a built-in env whose step costs --env-ms of sleep (no emulator, no GIL held)")
    p.add_argument('--vector', type=int, default=0, metavar='N',
                   help='ALE only: each player is an ale-py AtariVectorEnv of N sub-envs')
    p.add_argument('--env-ms', type=float, default=0.5, help="'cheap' env: milliseconds per step")
    p.add_argument('--players', type=int, nargs='+', default=[1, 2, 4],
                   help="values of num_parallel_players to try (a single player is stepped inline in "
                        "the learner's thread: no queue, no lag)")
    p.add_argument('--simulator-threads', default='auto', choices=['auto', 'one', 'per-player'],
                   help="auto (the manager's default): one pipelined thread for single envs, one "
                        "thread per player with --vector; 'one' / 'per-player' force either")
    p.add_argument('--staleness', type=int, nargs='+', default=[1, 2, 4, 8, 16],
                   help='values of maximum_staleness to try (step requests allowed to be pending)')
    p.add_argument('--predictor', choices=['auto', 'nature', 'mlp', 'numpy'], default='auto',
                   help='Q-network the runners call: the Nature CNN or the MLP of the examples '
                        '(tensorpack, random weights), or a numpy linear map (no TensorFlow); '
                        'auto: nature for image frames, mlp for vectors')
    p.add_argument('--train-ms', type=float, default=5.0,
                   help='simulated learner time per update, in ms (a GPU step; 0: population only)')
    p.add_argument('--update-frequency', type=int, default=4, help='step requests per learner update')
    p.add_argument('--batch-size', type=int, default=64, help='transitions sampled per update')
    p.add_argument('--history', type=int, help='frames per state (default: 4 for images, 1 for vectors)')
    p.add_argument('--exploration', type=float, default=0.1,
                   help='epsilon while measuring: the other steps need the predictor')
    p.add_argument('--memory-size', type=int, default=50_000, help='replay memory capacity')
    p.add_argument('--init-memory-size', type=int, default=1_000,
                   help='steps taken before measuring starts (the learner needs a batch to sample)')
    p.add_argument('--warmup', type=float, default=2.0, help='seconds run before each measurement')
    p.add_argument('--seconds', type=float, default=10.0, help='seconds measured per combination')
    p.add_argument('--rounds', type=int, default=3,
                   help='measure every combination this many times; the CSV and the plot show the '
                        'mean and the spread (min to max)')
    p.add_argument('--out-dir', default=os.path.join('train_log', 'tune_staleness'),
                   help='directory for staleness.csv, staleness_rounds.csv and staleness.png '
                        '(created if needed)')
    p.add_argument('--seed', type=int, default=0, help='seeds the envs, the runners and the sampling')
    return p


def parse_args(argv=None):
    return build_parser().parse_args(argv)


# ---------------------------------------------------------------------------- environments
class CheapEnv:
    """A gymnasium-style env with 4-float observations whose step sleeps ``step_ms``.

    Sleeping (instead of computing) stands for an emulator that releases the GIL, so that the
    measurement shows the machinery's overhead and its concurrency, not Python's.
    """

    def __init__(self, step_ms, episode_len=200):
        import gymnasium as gym
        self.observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.step_s, self.episode_len = step_ms / 1000, episode_len
        self._rng, self._t = np.random.default_rng(), 0

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t = 0
        return self._rng.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action):
        time.sleep(self.step_s)
        self._t += 1
        obs = self._rng.uniform(-1, 1, 4).astype(np.float32)
        return obs, 1.0, False, self._t >= self.episode_len, {}

    def close(self):
        pass


def env_factory(args):
    """(make_player, frame_shape, dtype, num_actions) for --env."""
    if args.env == 'cheap':
        return (lambda: CheapEnv(args.env_ms)), (4,), np.float32, 2
    if args.env.startswith('ALE/'):
        from atari_wrappers import FRAME_SHAPE, make_env, make_vector_env
        probe = make_env(args.env)
        n = probe.action_space.n
        probe.close()
        if args.vector:
            return (lambda: make_vector_env(args.env, args.vector)), FRAME_SHAPE, np.uint8, n
        return (lambda: make_env(args.env)), FRAME_SHAPE, np.uint8, n
    import gymnasium as gym
    probe = gym.make(args.env)
    shape, dtype, n = probe.observation_space.shape, probe.observation_space.dtype, probe.action_space.n
    probe.close()
    return (lambda: gym.make(args.env)), shape, dtype, n


# ---------------------------------------------------------------------------- predictors
def make_predictor(kind, frame_shape, history, dtype, num_actions, seed):
    """``predictor(states) -> [q_values]`` for states ``(n, *frame_shape, history)``."""
    if kind == 'auto':
        kind = 'nature' if len(frame_shape) >= 2 else 'mlp'
    if kind == 'numpy':
        w = np.random.default_rng(seed).standard_normal(
            (int(np.prod(frame_shape)) * history, num_actions)).astype(np.float32)
        return lambda states: [states.reshape(len(states), -1).astype(np.float32) @ w]
    from dqn_model import DQNModel
    from tensorpack import OfflinePredictor, PredictConfig
    model = DQNModel(frame_shape, history, 'Double', num_actions, network=kind, state_dtype=dtype)
    return OfflinePredictor(PredictConfig(model=model, input_names=['state'], output_names=['Qvalue']))


# ---------------------------------------------------------------------------- the measurement
class LagProbe:
    """Counts step requests as the learner issues them and as the runners start them.

    Requests are taken first-in first-out, so the k-th step started is the k-th requested:
    the requests issued after it are the queue behind it, and the learner version recorded at
    its issue gives the updates it lagged.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.issued = 0           # requests the learner issued
        self.accepted = 0         # requests the manager accepted (queued or running)
        self.started = 0
        self.measuring = False
        self.request_lags = []

    def issue(self):
        with self.lock:
            self.issued += 1

    def accept(self):
        with self.lock:
            self.accepted += 1

    def start(self):
        with self.lock:
            k = self.started
            self.started += 1
            if self.measuring and k < self.issued:
                # The learner counts an acceptance just after the manager queued it, so a
                # thread that starts the newest request at once may see -1: that is 0.
                self.request_lags.append(max(0, self.accepted - k - 1))


class Probed:
    """A player that tells the probe when it starts a requested step (its env step)."""

    def __init__(self, player, probe):
        self._player, self._probe = player, probe

    def __getattr__(self, name):
        return getattr(self._player, name)

    def reset(self, **kwargs):
        return self._player.reset(**kwargs)

    def step(self, action):
        self._probe.start()
        return self._player.step(action)


def measure(args, make_player, frame_shape, dtype, history, predictor, players, staleness):
    """Run one combination; returns a dict of figures."""
    memory = ReplayMemory(args.memory_size, frame_shape, history, dtype)
    probe = LagProbe()
    runners = [EnvRunner(Probed(make_player(), probe), predictor, memory, history, seed=args.seed,
                         index=i) for i in range(players)]
    rng = np.random.default_rng(args.seed)
    threads = {'auto': None, 'one': 1, 'per-player': players}[args.simulator_threads]
    with EnvRunnerManager(runners, staleness, settings=ManagerSettings(simulator_threads=threads)) as manager:
        # Fill with the measuring epsilon, so that the predictor is warm too.
        while memory.num_steps_written < max(args.init_memory_size, args.batch_size):
            probe.issue()
            manager.step(args.exploration)
            probe.accept()

        def run(seconds):
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                memory.sample_batch(args.batch_size, rng=rng)   # the learner's data
                if args.train_ms:
                    time.sleep(args.train_ms / 1000)             # ... and its update
                manager.lags.count_updates()                     # the library counts the lag
                for _ in range(args.update_frequency):
                    probe.issue()
                    manager.step(args.exploration)
                    probe.accept()

        run(args.warmup)
        steps0, lags0 = memory.num_steps_written, manager.lags.figures()
        probe.measuring = True
        t0 = time.monotonic()
        run(args.seconds)
        elapsed = time.monotonic() - t0
        probe.measuring = False
        lags1 = manager.lags.figures()
        steps, updates = memory.num_steps_written - steps0, lags1.updates - lags0.updates
        stats = manager.stats()
    req = np.array(probe.request_lags or [0])
    upd_mean, upd_max = _measured_lag(lags0.request_lag, lags1.request_lag)
    return dict(players=players, maximum_staleness=staleness,
                steps_per_sec=steps / elapsed, updates_per_sec=updates / elapsed,
                request_lag_mean=req.mean(), request_lag_max=int(req.max()),
                update_lag_mean=upd_mean, update_lag_max=upd_max,
                mean_inference_batch=stats.mean_inference_batch or 0.0,
                seconds=elapsed)


def _measured_lag(before, after):
    """The mean update lag of the requests started between two of the library's figures, and
    the largest since the first update (the warm-up's included: the figures keep no window)."""
    count = after.count - before.count
    if count <= 0:
        return 0.0, 0
    total = (after.mean or 0.0) * after.count - (before.mean or 0.0) * before.count
    return total / count, int(after.max or 0)


ROUND_FIELDS = ['round', 'players', 'maximum_staleness', 'steps_per_sec', 'updates_per_sec',
                'request_lag_mean', 'request_lag_max', 'update_lag_mean', 'update_lag_max',
                'mean_inference_batch', 'seconds']
# Summary columns: the mean over the rounds, with min and max of the two that decide.
FIELDS = ['players', 'maximum_staleness', 'rounds', 'steps_per_sec', 'steps_per_sec_min',
          'steps_per_sec_max', 'updates_per_sec', 'request_lag_mean', 'request_lag_max',
          'update_lag_mean', 'update_lag_mean_min', 'update_lag_mean_max', 'update_lag_max',
          'mean_inference_batch', 'seconds']


def combinations(players, staleness):
    """(players, maximum_staleness) pairs to measure; one player once, as (1, None)."""
    out = []
    for p, s in itertools.product(dict.fromkeys(players), dict.fromkeys(staleness)):
        pair = (p, None) if p == 1 else (p, s)
        if pair not in out:
            out.append(pair)
    return out


def summarize(measured):
    """One row per combination from its rounds: means, the spread, the worst lags."""
    rows = []
    for (players, staleness), rs in measured.items():
        row = dict(players=players, maximum_staleness=staleness, rounds=len(rs))
        for f in ('steps_per_sec', 'updates_per_sec', 'request_lag_mean', 'update_lag_mean',
                  'mean_inference_batch', 'seconds'):
            row[f] = float(np.mean([r[f] for r in rs]))
        for f in ('steps_per_sec', 'update_lag_mean'):
            row[f + '_min'] = float(min(r[f] for r in rs))
            row[f + '_max'] = float(max(r[f] for r in rs))
        for f in ('request_lag_max', 'update_lag_max'):
            row[f] = int(max(r[f] for r in rs))
        rows.append(row)
    return rows


def recommend(rows):
    """``(pick, best, within)``: the smallest window whose fastest round reaches the slowest
    round of the fastest combination (``best``), and all the combinations that do (see the
    module docstring)."""
    best = max(rows, key=lambda r: r['steps_per_sec'])
    within = [r for r in rows if r['steps_per_sec_max'] >= best['steps_per_sec_min']]
    pick = min(within, key=lambda r: (r['maximum_staleness'] or 0, r['update_lag_mean'],
                                      r['players']))
    return pick, best, within


def _label(players):
    return f'{players} player{"s" if players > 1 else ""}' + (' (inline, any staleness)' if players == 1 else '')


def plot(rows, path, title, recommended):
    """Throughput and lag against maximum_staleness, one line per player count, the rounds'
    spread as error bars and the recommendation marked; saves ``path``, returns the figure."""
    import matplotlib
    matplotlib.use('Agg')   # no display needed
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    ticks = sorted({r['maximum_staleness'] for r in rows if r['maximum_staleness'] is not None}) or [1]
    panels = ((ax1, 'steps_per_sec'), (ax2, 'update_lag_mean'))
    for p in sorted({r['players'] for r in rows}):
        rs = sorted((r for r in rows if r['players'] == p), key=lambda r: r['maximum_staleness'] or 0)
        for ax, f in panels:
            if p == 1:   # one measurement, valid for every window: a flat line
                x = ticks
                y = [rs[0][f]] * len(x)
                err = [[rs[0][f] - rs[0][f + '_min']] * len(x), [rs[0][f + '_max'] - rs[0][f]] * len(x)]
                ax.errorbar(x, y, yerr=err, fmt='--', capsize=3, label=_label(p))
            else:
                x = [r['maximum_staleness'] for r in rs]
                y = [r[f] for r in rs]
                err = [[r[f] - r[f + '_min'] for r in rs], [r[f + '_max'] - r[f] for r in rs]]
                ax.errorbar(x, y, yerr=err, fmt='o-', capsize=3, label=_label(p))
    rec_x = recommended['maximum_staleness'] or ticks[0]
    for ax, f in panels:
        ax.plot([rec_x], [recommended[f]], marker='*', markersize=18, color='gold',
                markeredgecolor='black', linestyle='none', zorder=5)
        right = rec_x == ticks[-1] and len(ticks) > 1     # keep the label inside the axes
        ax.annotate(f"recommended:\n{recommended['players']} player(s), staleness "
                    f"{recommended['maximum_staleness'] or 'any'}",
                    (rec_x, recommended[f]), textcoords='offset points',
                    xytext=(-12 if right else 12, -24), ha='right' if right else 'left', fontsize=8)
        ax.set_xscale('log', base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel('maximum_staleness (step requests allowed pending)')
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    rounds = max(r['rounds'] for r in rows)
    ax1.set_ylabel('environment steps into the memory per second')
    ax1.set_title(f'throughput (mean of {rounds} rounds; bars: min-max)', fontsize=10)
    ax2.set_ylabel('update lag (learner updates since the request, mean)')
    ax2.set_title('request lag', fontsize=10)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return fig


def _format(row, fields, widths):
    cells = []
    for f in fields:
        v = row[f]
        if v is None:
            v = 'any'
        cells.append(f'{v:{widths[f]}.2f}' if isinstance(v, float) else f'{v:>{widths[f]}}')
    return ' '.join(cells)


def write_csv(path, fields, rows):
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: 'any' if row[k] is None else row[k] for k in fields})


def main(argv=None):
    args = parse_args(argv)
    if args.rounds < 1:
        raise SystemExit('--rounds must be >= 1')
    make_player, frame_shape, dtype, num_actions = env_factory(args)
    history = args.history or (4 if len(frame_shape) >= 2 else 1)
    if args.predictor == 'auto':
        args.predictor = 'nature' if len(frame_shape) >= 2 else 'mlp'
    predictor = make_predictor(args.predictor, frame_shape, history, dtype, num_actions, args.seed)
    pairs = combinations(args.players, args.staleness)
    if any(p == 1 for p, _ in pairs) and len(set(args.staleness)) > 1:
        print("1 player is stepped inline (no queue): measured once, for any maximum_staleness")
    # Each measurement: its fill (about a second), the warm-up and the measured seconds.
    estimate = len(pairs) * args.rounds * (1.0 + args.warmup + args.seconds)
    print(f"{len(pairs)} combinations x {args.rounds} rounds: about {estimate / 60:.1f} minutes")
    started = time.monotonic()
    widths = {f: max(len(f), 8) for f in ROUND_FIELDS}
    print(' '.join(f'{f:>{widths[f]}}' for f in ROUND_FIELDS))
    measured = {pair: [] for pair in pairs}
    all_rounds = []
    for k in range(args.rounds):
        for players, staleness in pairs:
            # One player never queues a request, whatever the window: 1 will do.
            row = measure(args, make_player, frame_shape, dtype, history, predictor, players,
                          staleness or 1)
            row.update(round=k, maximum_staleness=staleness)
            measured[(players, staleness)].append(row)
            all_rounds.append(row)
            print(_format(row, ROUND_FIELDS, widths), flush=True)
    rows = summarize(measured)
    os.makedirs(args.out_dir, exist_ok=True)
    csv_path = os.path.join(args.out_dir, 'staleness.csv')
    rounds_path = os.path.join(args.out_dir, 'staleness_rounds.csv')
    png_path = os.path.join(args.out_dir, 'staleness.png')
    write_csv(csv_path, FIELDS, rows)
    write_csv(rounds_path, ROUND_FIELDS, all_rounds)
    rec, best, within = recommend(rows)
    title = (f"{args.env}{f' x{args.vector}' if args.vector else ''}, predictor {args.predictor}, "
             f"learner {args.train_ms:g} ms/update, update_frequency {args.update_frequency}")
    import matplotlib.pyplot as plt
    plt.close(plot(rows, png_path, title, rec))
    if args.rounds > 1:
        print(f"over {args.rounds} rounds (mean, min-max):")
        widths = {f: max(len(f), 8) for f in FIELDS}
        print(' '.join(f'{f:>{widths[f]}}' for f in FIELDS))
        for row in rows:
            print(_format(row, FIELDS, widths))
    print(f"wrote {csv_path}, {rounds_path} and {png_path}; the sweep took "
          f"{(time.monotonic() - started) / 60:.1f} minutes")
    print(f"recommendation: num_parallel_players={rec['players']} "
          f"maximum_staleness={rec['maximum_staleness'] or 'any'}: "
          f"{rec['steps_per_sec']:.0f} steps/s (rounds {rec['steps_per_sec_min']:.0f}-"
          f"{rec['steps_per_sec_max']:.0f}; the best {best['steps_per_sec']:.0f}, rounds "
          f"{best['steps_per_sec_min']:.0f}-{best['steps_per_sec_max']:.0f}), request lag "
          f"{rec['update_lag_mean']:.2f} updates on average (max {rec['update_lag_max']}), "
          f"{rec['request_lag_mean']:.2f} queued requests")
    if args.rounds == 1:
        print("one round: no noise measured, the pick is the fastest (use --rounds 3 to tell "
              "throughput from noise)")
    elif len(within) > 1:
        names = ', '.join(f"{r['players']} x {r['maximum_staleness'] or 'any'}" for r in within)
        print(f"within the rounds' noise of the best: {names} (players x window): their "
              f"throughputs are not told apart by {args.rounds} rounds; the smallest window "
              "among them is picked, for its lag")
    cost = learning_cost(rec['update_lag_mean'])
    if cost:
        print("the study's run nearest such a lag (DQN on MinAtar, docs/staleness_learning.md):")
        print('\n'.join(cost))
    return rows, rec


if __name__ == '__main__':
    main()
