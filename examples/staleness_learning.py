#!/usr/bin/env python
"""What lag costs learning: DQN's score at 1M frames against the data's two measured lags.

    # one run per game, seed and setting, its log kept. The window: 4 players, one update
    # per call, a control without a fixed lag and an arm with one (the lag exact on any load):
    python examples/dqn_minatar_jax.py --game breakout --seed 0 --frames 1000000 --players 4 \\
        --updates-per-call 1 --returns runs/breakout_p4_seed0/returns.csv > runs/breakout_p4_seed0/log.txt
    python examples/dqn_minatar_jax.py --game breakout --seed 0 --frames 1000000 --players 4 \\
        --updates-per-call 1 --request-lag 65536 --returns runs/breakout_p4_r65536_seed0/returns.csv \\
        > runs/breakout_p4_r65536_seed0/log.txt
    # the hand-over: the paper's one player, the weights handed over every N updates:
    python examples/dqn_minatar_jax.py --game breakout --seed 0 --frames 1000000 \\
        --weights-every 10000 --returns runs/breakout_w10000_seed0/returns.csv \\
        > runs/breakout_w10000_seed0/log.txt
    # add each finished run to the study's table (its returns file is copied beside it, gzipped;
    # players, updates per call and a fixed lag are read from its log):
    python examples/staleness_learning.py add runs/breakout_p4_r65536_seed0 --game breakout --seed 0
    python examples/staleness_learning.py add runs/breakout_w10000_seed0 --game breakout --seed 0 \\
        --weights-every 10000 --data docs/data/staleness
    # the table and the plot, from the committed files only:
    python examples/staleness_learning.py report --data docs/data/staleness --png docs/staleness_learning.png
    # two sets of runs side by side, unpaired (e.g. the PyTorch example's seeds against JAX's):
    python examples/staleness_learning.py compare docs/data/minatar_torch/breakout_seed*.csv.gz \
        --against docs/data/minatar_jax/breakout_seed*.csv.gz

Two lags, both as ``dqn_minatar_jax.py`` reports them on its last line:

* the request lag (``--staleness``, ``maximum_staleness``): the learner updates between a
  step's request and its start, as ``examples/tune_staleness.py`` measures it (``update_lag``).
  It does not age the weights that act (a step reads them when it starts); it delays the step
  and plays the exploration its request carries that many frames late.
* the weights' age (``--weights-every``): the learner updates between the weights a greedy
  action is computed with and the learner's newest, which grows when the weights are handed to
  the players less often than after each update.

A fixed lag's arm is paired with the control of its game, players, updates per call and seed
(``paired_window_arms``), each hand-over arm with the one-player runs of its seeds. The first
window runs (``--staleness`` with ``--env-ms``, below) have no control: they are data, not a
cost. The window only makes request lag when the players are slower than the learner (otherwise
every request starts at once, whatever the window): a GPU learner's situation, not this CPU's,
where the JAX update is slower than MinAtar's env. ``--env-ms`` gives each player's env step a
sleep (the GIL released, no CPU used) standing for a slower emulator, so that the window fills;
with the library's default of one simulator thread for single-env players the sleeps add up
(4 players at 1.0 ms: at most ~1,000 steps/s), and the lag then comes close to the window. The
weights' age needs no such set-up: it is the hand-over's interval, whatever the machine.

The score is the mean return of the training episodes that ended in the last 200k frames
(800k-1M), the same window for every run; ``--baseline`` adds, as lag 0, the one-player runs of
``docs/data/minatar_jax`` (the paper's loop, the env stepped inline: no request waits, weights
handed over after each update) over the same window. ``report`` prints a Markdown table and
draws score against each lag (each run a point, the baseline's seeds as a band) and frames/s
against the window.
"""

import argparse
import csv
import glob
import gzip
import os
import re
import shutil

import numpy as np

FIELDS = ['game', 'seed', 'players', 'staleness', 'env_ms', 'weights_every', 'updates_per_call',
          'request_lag', 'frames', 'seconds', 'mean_lag', 'max_lag', 'mean_age', 'max_age',
          'returns']
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, '..', 'docs', 'data', 'staleness')          # the committed study
BASELINE = os.path.join(HERE, '..', 'docs', 'data', 'minatar_jax')   # one-player runs: lag 0
LAST_LINE = re.compile(r"training done: (\d+) frames, \d+ games in (\d+) s, mean request lag "
                       r"([\d.]+) updates \(max (\d+)\), acting weights' mean age ([\d.]+) "
                       r"updates \(max (\d+)\)")
PLAYERS = re.compile(r': \d+ frames, seed \d+, (\d+) players?')
UPDATES_PER_CALL = re.compile(r', (\d+) updates? per call')
REQUEST_LAG = re.compile(r'request lag (\d+) updates, fixed')


def window_score(path, low=800_000, high=1_000_000):
    """Mean return of the episodes that ended in (low, high] frames, and their count."""
    with (gzip.open(path, 'rt') if path.endswith('.gz') else open(path)) as f:
        rows = [(int(r['frames']), float(r['score'])) for r in csv.DictReader(f)]
    scores = [s for frame, s in rows if low < frame <= high]
    return (float(np.mean(scores)) if scores else float('nan')), len(scores)


def curve_area(path, end=1_000_000, width=100_000):
    """The area under the learning curve: the mean over the ``width``-frame windows up to
    ``end`` of their episodes' mean return (each window counts once, however many episodes)."""
    return float(np.mean([window_score(path, low, low + width)[0]
                          for low in range(0, end, width)]))


def bootstrap_ci(diffs, resamples=10_000, seed=0):
    """A paired bootstrap 95% interval of the mean of ``diffs`` (one per seed): the seeds are
    drawn with replacement, the 2.5th and 97.5th percentiles of the resampled means."""
    diffs = np.asarray(diffs, float)
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), (resamples, len(diffs)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def detectable(diffs, power=0.8, alpha=0.05):
    """The smallest mean difference a paired two-sided t-test over these seeds would find with
    ``power`` at ``alpha``, for differences spread as ``diffs`` are: (t_{1-alpha/2} + t_power)
    x SD / sqrt(n), with n - 1 degrees of freedom; None under 2 seeds."""
    from scipy import stats
    n = len(diffs)
    if n < 2:
        return None
    df = n - 1
    return float((stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df))
                 * np.std(diffs, ddof=1) / np.sqrt(n))


# Fewer paired seeds give no interval (a bootstrap of 2-4 seeds has 3-35 distinct means: the
# seeds' own differences are shown instead) and no spread to size a detectable effect on.
MIN_SEEDS_FOR_CI = 5
MIN_SEEDS_FOR_SPREAD = 3


def _interval(diffs):
    """The mean difference with its paired bootstrap 95% CI, or with the seeds' differences."""
    if len(diffs) >= MIN_SEEDS_FOR_CI:
        lo, hi = bootstrap_ci(diffs)
        return f"{np.mean(diffs):+.2f} [{lo:+.2f}, {hi:+.2f}]"
    return f"{np.mean(diffs):+.2f} (seeds: {', '.join(f'{d:+.2f}' for d in diffs)})"


def paired_arms(rows, control):
    """Each hand-over arm against the no-lag runs of the same seeds: ``(game, weights_every,
    seeds, control scores, arm scores, score diffs, area diffs)``. The window's runs have no
    control of their own yet (the same players and updates per call without a window), so
    they are left out."""
    arms = {}
    for r in rows:
        if r['staleness'] or int(r.get('weights_every') or 1) == 1:
            continue
        seed = int(r['seed'])
        if seed in control.get(r['game'], {}):
            arms.setdefault((r['game'], int(r['weights_every'])), []).append(r)
    out = []
    for (game, every), runs in sorted(arms.items()):
        runs.sort(key=lambda r: int(r['seed']))
        seeds = [int(r['seed']) for r in runs]
        base = [control[game][s] for s in seeds]
        out.append((game, every, seeds, [b[0] for b in base], [r['score'] for r in runs],
                    [r['score'] - b[0] for r, b in zip(runs, base)],
                    [r['area'] - b[1] for r, b in zip(runs, base)]))
    return out


def is_window_control(r):
    """A run of several players with the stream's own window and no fixed lag: the control
    of the fixed-lag arms run with the same players and updates per call."""
    return (not r['staleness'] and not r.get('request_lag') and int(r['players'] or 1) > 1
            and int(r.get('weights_every') or 1) == 1)


def paired_window_arms(rows):
    """Each fixed request lag against the control runs of the same game, players, updates per
    call and seed: ``(game, request_lag, seeds, control scores, arm scores, score diffs, area
    diffs)``."""
    control = {(r['game'], r['players'], r['updates_per_call'], int(r['seed'])): r
               for r in rows if is_window_control(r)}
    arms = {}
    for r in rows:
        if not r.get('request_lag') or r['staleness']:
            continue
        base = control.get((r['game'], r['players'], r['updates_per_call'], int(r['seed'])))
        if base is not None:
            arms.setdefault((r['game'], int(r['request_lag'])), []).append((r, base))
    out = []
    for (game, lag), pairs in sorted(arms.items()):
        pairs.sort(key=lambda pair: int(pair[0]['seed']))
        out.append((game, lag, [int(r['seed']) for r, _ in pairs],
                    [b['score'] for _, b in pairs], [r['score'] for r, _ in pairs],
                    [r['score'] - b['score'] for r, b in pairs],
                    [r['area'] - b['area'] for r, b in pairs]))
    return out


def add(args):
    """Read one finished run's log, copy its returns (gzipped) and append its row."""
    with open(os.path.join(args.run, 'log.txt')) as f:
        log = f.read()
    done = LAST_LINE.findall(log)
    if not done:
        raise SystemExit(f"{args.run}: its log has no 'training done' line (not finished?)")
    frames, seconds, mean_lag, max_lag, mean_age, max_age = done[-1]
    seconds = int(seconds) - args.stopped
    if seconds <= 0:
        raise SystemExit(f"--stopped {args.stopped} is not less than the run's {seconds + args.stopped} s")
    players = PLAYERS.findall(log)
    per_call = UPDATES_PER_CALL.findall(log) or ([str(args.updates_per_call)]
                                                 if args.updates_per_call else [''])
    fixed = REQUEST_LAG.findall(log)
    os.makedirs(args.data, exist_ok=True)
    label = f"_{args.label}" if args.label else ''
    num_players = int(players[-1]) if players else 1
    setting = (f"_k{args.staleness}" if args.staleness else
               f"_p{num_players}" if num_players > 1 else '') + (
        f"_r{fixed[0]}" if fixed else '') + (
        f"_w{args.weights_every}" if args.weights_every > 1 else '')
    name = f"{args.game}{setting}_seed{args.seed}{label}.csv.gz"
    with open(os.path.join(args.run, 'returns.csv'), 'rb') as src, \
            gzip.open(os.path.join(args.data, name), 'wb') as dst:
        shutil.copyfileobj(src, dst)
    table = os.path.join(args.data, 'runs.csv')
    rows = read_table(table) if os.path.exists(table) else []
    rows = [r for r in rows if r['returns'] != name]      # a run added again replaces its row
    rows.append(dict(game=args.game, seed=args.seed, players=players[-1] if players else '',
                     staleness=args.staleness or '', env_ms=args.env_ms,
                     weights_every=args.weights_every, updates_per_call=per_call[0],
                     request_lag=fixed[0] if fixed else '', frames=frames, seconds=seconds,
                     mean_lag=mean_lag, max_lag=max_lag, mean_age=mean_age, max_age=max_age,
                     returns=name))
    with open(table, 'w', newline='') as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        w.writerows(rows)
    print(f"{name}: request lag {mean_lag} (max {max_lag}), weights' age {mean_age} (max "
          f"{max_age}), {int(frames) / int(seconds):.0f} frames/s")


def read_table(path):
    with open(path, newline='') as f:
        return list(csv.DictReader(f))


def study(data=DATA, baseline_dir=BASELINE):
    """The study's runs (rows of ``runs.csv`` with their ``score``, ``episodes`` and ``rate``)
    and the lag-0 baseline, ``{game: [score of each one-player seed]}``."""
    rows = read_table(os.path.join(data, 'runs.csv'))
    for r in rows:
        r['score'], r['episodes'] = window_score(os.path.join(data, r['returns']))
        r['area'] = curve_area(os.path.join(data, r['returns']))
        r['rate'] = int(r['frames']) / int(r['seconds'])
    baseline = {}
    for game, seeds in control_runs(rows, baseline_dir).items():
        baseline[game] = [score for score, _ in seeds.values()]
    return rows, baseline


def control_runs(rows, baseline_dir=BASELINE):
    """The no-lag runs of the games in ``rows``: ``{game: {seed: (score, area)}}``."""
    control = {}
    for path in sorted(glob.glob(os.path.join(baseline_dir, '*_seed*.csv.gz'))):
        game, seed = re.match(r'(.+)_seed(\d+)\.csv\.gz', os.path.basename(path)).groups()
        if any(r['game'] == game for r in rows):
            control.setdefault(game, {})[int(seed)] = (window_score(path)[0], curve_area(path))
    return control


def learning_cost(lag, data=DATA, baseline_dir=BASELINE):
    """Lines saying what the study measured nearest to a request lag of ``lag`` updates, game
    by game (``examples/tune_staleness.py`` prints them beside its throughput): the fixed-lag
    arm nearest to it against its paired controls, with its CI from 5 seeds (fewer: the seeds'
    own differences); a game without such an arm gets its nearest confounded window run, said
    to be data and not a cost."""
    if not os.path.exists(os.path.join(data, 'runs.csv')):
        return []
    rows, baseline = study(data, baseline_dir)
    paired = {}
    for game, arm_lag, seeds, base, arm, diff, _ in paired_window_arms(rows):
        paired.setdefault(game, []).append((arm_lag, seeds, base, arm, diff))
    window_runs = [r for r in rows if r['staleness']]
    lines = []
    for game in sorted({r['game'] for r in rows if r['staleness'] or r.get('request_lag')}):
        if game in paired:
            arm_lag, seeds, base, arm, diff = min(
                paired[game], key=lambda a: abs(np.log1p(a[0]) - np.log1p(lag)))
            lines.append(f"  {game}: a fixed request lag of {arm_lag} updates changed DQN's score "
                         f"over 800k-1M frames by {_interval(diff)} ({len(seeds)} paired seeds, "
                         f"{np.mean(base):.2f} -> {np.mean(arm):.2f})")
            continue
        near = min((r for r in window_runs if r['game'] == game),
                   key=lambda r: abs(np.log1p(float(r['mean_lag'])) - np.log1p(lag)))
        base = baseline.get(game)
        lines.append(f"  {game}: at a request lag of {float(near['mean_lag']):.0f} updates (seed "
                     f"{near['seed']}) DQN scored {near['score']:.2f} over 800k-1M frames" + (
                         f", against {np.mean(base):.2f} ({min(base):.2f}-{max(base):.2f}, "
                         f"{len(base)} seeds) with no lag" if base else '')
                     + " (one unpaired run: not a measured cost)")
    return lines


def age(r):
    """A run's mean weights' age in updates; 1 where it was not measured (handed over after
    each update, the default)."""
    return float(r['mean_age']) if r.get('mean_age') else 1.0


def report(args):
    rows, baseline = study(args.data, args.baseline)
    rows.sort(key=lambda r: (r['game'], int(r.get('weights_every') or 1), float(r['mean_lag']),
                             int(r['seed'])))
    print("| game | seed | window | weights every | updates per call | request lag, mean (max) | "
          "weights' age, mean (max) | score, 800k-1M (episodes) | frames/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for game, scores in baseline.items():
        print(f"| {game} | {len(scores)} seeds | one player, inline | 1 | 1 | 0 | 1 | "
              f"{np.mean(scores):.2f} ({min(scores):.2f}-{max(scores):.2f}) | |")
    for r in rows:
        window = r['staleness'] or (f"{r['players']} players, the stream's"
                                    if int(r['players'] or 1) > 1 else 'one player, inline')
        weights_age = f"{age(r):.1f} ({r['max_age']})" if r.get('mean_age') else 'not measured'
        window += f" (fixed lag {r['request_lag']})" if r.get('request_lag') else ''
        print(f"| {r['game']} | {r['seed']} | {window} | {r.get('weights_every') or 1} | "
              f"{r.get('updates_per_call') or 'not recorded'} | "
              f"{float(r['mean_lag']):.1f} ({r['max_lag']}) | {weights_age} | "
              f"{r['score']:.2f} ({r['episodes']}) | {r['rate']:.0f} |")
    print()
    print("| game | weights every | paired seeds | score, 800k-1M: no lag -> arm | difference "
          "[95% CI] | area under the curve, 0-1M: difference [95% CI] | smallest difference "
          "detectable (80% power) |")
    print("|---|---|---|---|---|---|---|")
    for game, every, seeds, base, arm, diff, area in paired_arms(rows, control_runs(rows, args.baseline)):
        mde = detectable(diff) if len(seeds) >= MIN_SEEDS_FOR_SPREAD else None
        print(f"| {game} | {every} | {', '.join(map(str, seeds))} | {np.mean(base):.2f} -> "
              f"{np.mean(arm):.2f} | {_interval(diff)} | {_interval(area)} | "
              f"{'-' if mde is None else f'{mde:.2f}'} |")
    window_arms = paired_window_arms(rows)
    if window_arms:
        print()
        print("| game | fixed request lag | paired seeds | score, 800k-1M: control -> arm | "
              "difference [95% CI] | area under the curve, 0-1M: difference [95% CI] | "
              "smallest difference detectable (80% power) |")
        print("|---|---|---|---|---|---|---|")
        for game, lag, seeds, base, arm, diff, area in window_arms:
            mde = detectable(diff) if len(seeds) >= MIN_SEEDS_FOR_SPREAD else None
            print(f"| {game} | {lag} | {', '.join(map(str, seeds))} | {np.mean(base):.2f} -> "
                  f"{np.mean(arm):.2f} | {_interval(diff)} | {_interval(area)} | "
                  f"{'-' if mde is None else f'{mde:.2f}'} |")
    if args.png:
        plot(rows, baseline, args.png)


def plot(rows, baseline, png):
    """Per game: score against the request lag (the window's runs) and against the weights'
    age (the hand-over's runs); then frames/s against the window."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    games = sorted({r['game'] for r in rows})
    fig, axes = plt.subplots(1, len(games) + 1, figsize=(4.5 * (len(games) + 1), 3.6))
    for ax, game in zip(axes, games):
        own = [r for r in rows if r['game'] == game]
        if game in baseline:
            lo, hi = min(baseline[game]), max(baseline[game])
            ax.axhspan(lo, hi, color='0.85', label=f"no lag ({len(baseline[game])} seeds)")
        for seed in sorted({r['seed'] for r in own}):
            window = [(float(r['mean_lag']), r['score']) for r in own
                      if r['seed'] == seed and (r['staleness'] or r.get('request_lag')
                                                or is_window_control(r))]
            handover = [(age(r), r['score']) for r in own
                        if r['seed'] == seed and int(r.get('weights_every') or 1) > 1]
            if window:
                ax.plot(*zip(*window), 'o', label=f"request lag, seed {seed}")
            if handover:
                ax.plot(*zip(*handover), 's', label=f"weights' age, seed {seed}")
        ax.set_xscale('symlog', linthresh=1)
        ax.set_xlabel('mean lag (learner updates)')
        ax.set_ylabel('mean return, 800k-1M frames')
        ax.set_title(game)
        ax.legend(fontsize=7, loc='lower left')
    ax = axes[-1]
    for game in games:
        pts = sorted((int(r['staleness']), r['rate']) for r in rows
                     if r['game'] == game and r['staleness'])
        if pts:
            ax.plot(*zip(*pts), 'o', label=game)
    ax.set_xscale('log')
    ax.set_xlabel('maximum_staleness (step requests pending)')
    ax.set_ylabel('frames/s (whole run)')
    ax.set_title('throughput (--env-ms players)')
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


def two_sample_ci(a, b, resamples=10_000, seed=0):
    """A bootstrap 95% interval of ``mean(a) - mean(b)``, each set's runs drawn with
    replacement within the set (unpaired runs: no seed is matched to another)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    rng = np.random.default_rng(seed)
    diffs = (a[rng.integers(0, len(a), (resamples, len(a)))].mean(axis=1)
             - b[rng.integers(0, len(b), (resamples, len(b)))].mean(axis=1))
    return float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))


def two_sample_detectable(a, b, power=0.8, alpha=0.05):
    """The smallest difference of means a two-sided two-sample t-test (pooled SD) of these set
    sizes would find with ``power`` at ``alpha``, for runs spread as these are; None when the
    runs can not give a pooled SD."""
    from scipy import stats
    n1, n2 = len(a), len(b)
    df = n1 + n2 - 2
    if n1 < 1 or n2 < 1 or df < 1:
        return None
    pooled = np.sqrt(((n1 - 1) * np.var(a, ddof=1 if n1 > 1 else 0)
                      + (n2 - 1) * np.var(b, ddof=1 if n2 > 1 else 0)) / df)
    return float((stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df))
                 * pooled * np.sqrt(1 / n1 + 1 / n2))


def compare(args):
    """Print each run's score (800k-1M) and area (0-1M), then the two sets' difference."""
    sets = {'runs': sorted(args.runs), 'against': sorted(args.against)}
    figures = {}
    print("| set | returns file | score, 800k-1M (episodes) | area under the curve, 0-1M |")
    print("|---|---|---|---|")
    for name, files in sets.items():
        figures[name] = []
        for path in files:
            score, episodes = window_score(path)
            area = curve_area(path)
            figures[name].append((score, area))
            print(f"| {name} | {os.path.basename(path)} | {score:.2f} ({episodes}) | {area:.2f} |")
    for i, what in enumerate(('score, 800k-1M', 'area, 0-1M')):
        a = [f[i] for f in figures['runs']]
        b = [f[i] for f in figures['against']]
        lo, hi = two_sample_ci(a, b)
        smallest = two_sample_detectable(a, b)
        print(f"{what}: runs {np.mean(a):.2f} (range {min(a):.2f}-{max(a):.2f}, {len(a)} runs), "
              f"against {np.mean(b):.2f} (range {min(b):.2f}-{max(b):.2f}, {len(b)} runs): "
              f"difference {np.mean(a) - np.mean(b):+.2f} [bootstrap 95% CI {lo:+.2f}, {hi:+.2f}]"
              + (f", smallest difference detectable (80% power) {smallest:.2f}"
                 if smallest is not None else ""))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest='command', required=True)
    a = sub.add_parser('add', help="add a finished run (a directory with log.txt and returns.csv)")
    a.add_argument('run')
    a.add_argument('--game', required=True)
    a.add_argument('--seed', type=int, required=True)
    a.add_argument('--staleness', type=int, help="the run's --staleness (none: one player)")
    a.add_argument('--env-ms', type=float, default=0.0, help="the run's --env-ms")
    a.add_argument('--weights-every', type=int, default=1, help="the run's --weights-every")
    a.add_argument('--updates-per-call', type=int,
                   help="the run's --updates-per-call, for a log that does not say it (logs "
                        "written before the example printed it)")
    a.add_argument('--label', default='',
                   help="tells a run apart from another of the same game, setting and seed (e.g. "
                        "'shared' for one that shared the machine): added to its file's name")
    a.add_argument('--stopped', type=int, default=0, metavar='S',
                   help="seconds the run was stopped (kill -STOP, e.g. for a benchmark), taken "
                        "off its time")
    a.add_argument('--data', default=DATA)
    r = sub.add_parser('report', help='the table (Markdown) and, with --png, the plot')
    r.add_argument('--data', default=DATA)
    r.add_argument('--baseline', default=BASELINE,
                   help="one-player runs' returns files <game>_seed<S>.csv.gz (lag 0)")
    r.add_argument('--png')
    c = sub.add_parser('compare', help="two sets of returns files side by side (unpaired)")
    c.add_argument('runs', nargs='+', help='returns files (frames,score), e.g. one per seed')
    c.add_argument('--against', nargs='+', required=True, help='the returns files compared with')
    args = p.parse_args(argv)
    {'add': add, 'report': report, 'compare': compare}[args.command](args)


if __name__ == '__main__':
    main()
