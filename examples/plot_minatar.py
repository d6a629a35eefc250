#!/usr/bin/env python
"""Learning curves of ``dqn_minatar.py`` runs, measured as the MinAtar paper does, beside its DQN.

    python examples/dqn_minatar.py --game breakout --seed 0 --returns runs/breakout_0.csv
    ...                                                     # one file per game and seed
    python examples/plot_minatar.py runs/*.csv --csv docs/minatar_curves.csv --png docs/minatar_curves.png

Each input is a ``--returns`` file (``frames,score`` per training episode) named
``<game>_<seed>.csv``. The paper's measure (Young & Tian 2019, its learning-curve figure, the
MinAtar repository's ``img/learning_curves.gif`` and ``examples/plot_return.py``) is the moving
average of the returns of the last 100 training episodes, plotted at the frame where the last of
them ended, averaged over runs. This script samples that moving average every ``--every`` frames
(the last value at or before each point) and writes rows ``game,seed,frames,score``; the plot
shows every seed, their mean, and the paper's DQN curve.

To compare variants of the agent (e.g. uniform replay against ``--prioritized --n-step 3``),
name the runs read with ``--variant`` and add curves written earlier with ``--curves
FILE=NAME``: the CSV then has a ``variant`` column and the plot one mean curve per variant::

    python examples/plot_minatar.py runs/per3/breakout_*.csv --variant per3 \
        --curves docs/minatar_curves.csv=uniform --games breakout --csv curves.csv --png curves.png

``PAPER_DQN`` was read off the paper's figure (the GIF in the MinAtar repository, 3038 px wide):
the DQN curve's pixels (the legend's blue), mapped through each panel's tick marks, the value at a
frame being the centre of the line's thickness in that pixel column. One pixel is ~7.2k frames
in every panel, and 0.043 points in Breakout, 0.45 in Space Invaders, 0.049 in Asterix, 0.12 in
Freeway and 0.051 in Seaquest; the line is 3-4 pixels thick. Where a curve climbs steeply a
pixel's error in x moves the reading by up to ~0.6 points (Breakout, first 100k frames), ~2
(Space Invaders, first 125k), ~0.25 (Asterix, 0.75M-1.25M) or ~0.9 (Freeway, 250k-600k);
elsewhere the curve's own jitter from one pixel to the next (~0.1 points, ~0.3 in Space
Invaders) is the larger error. The 5M frames tick lies under the panel's frame: the 5M values
are the mean of the last three visible columns (4.96M-4.99M).

Where other algorithms' curves lie over DQN's, the table has no point: Breakout before 80k
(the curve climbs hidden at 65k-79k), Space Invaders before 25k and at 230k-280k and
480k-540k, Asterix before 190k and at 2.96M-3.02M (its 3M value is read across that gap), and
Seaquest before 100k (only the line's upper edge shows there, every curve at ~0.5). Freeway's
curve is flat at 5.5 up to 250k because the paper's plotting script draws each run's first
100-episode average back to frame 0: Freeway's episodes last 2,501 frames, so that average ends
at ~250k, where its table starts.
"""

import argparse
import collections
import csv
import os
import re

import numpy as np

# frames -> the paper's DQN score (mean of 30 runs' 100-episode moving average), read off its figure.
# The same frames in every game, where its curve shows, plus a few where a straight line between
# them would miss a bend of the curve (Asterix 1.25M, Freeway 600k, Seaquest 2.5M and 3.5M).
PAPER_DQN = {
    'breakout': [(80_000, 3.8), (100_000, 4.4), (125_000, 5.0), (150_000, 5.3), (200_000, 6.1),
                 (250_000, 6.7), (300_000, 7.2), (400_000, 8.2), (500_000, 8.3), (750_000, 8.9),
                 (1_000_000, 9.3), (1_500_000, 9.4), (2_000_000, 9.6), (3_000_000, 9.8),
                 (4_000_000, 9.9), (4_500_000, 10.1), (5_000_000, 10.0)],
    'space_invaders': [(25_000, 6.7), (50_000, 8.8), (75_000, 12.4), (100_000, 16.5),
                       (125_000, 20.3), (150_000, 21.1), (200_000, 21.0), (300_000, 22.6),
                       (400_000, 26.3), (750_000, 28.2), (1_000_000, 32.7), (1_500_000, 38.9),
                       (2_000_000, 41.6), (3_000_000, 44.3), (4_000_000, 44.0), (4_500_000, 43.7),
                       (5_000_000, 43.2)],
    'asterix': [(200_000, 0.7), (250_000, 0.8), (300_000, 0.9), (400_000, 0.9), (500_000, 1.0),
                (750_000, 2.0), (1_000_000, 7.2), (1_250_000, 11.9), (1_500_000, 13.0),
                (2_000_000, 14.4), (3_000_000, 15.3), (4_000_000, 16.7), (4_500_000, 16.4),
                (5_000_000, 17.3)],
    'freeway': [(250_000, 5.5), (300_000, 10.8), (400_000, 23.4), (500_000, 34.5), (600_000, 40.9),
                (750_000, 45.4), (1_000_000, 47.8), (1_500_000, 50.4), (2_000_000, 50.7),
                (3_000_000, 50.2), (4_000_000, 49.9), (4_500_000, 50.0), (5_000_000, 50.2)],
    'seaquest': [(100_000, 0.5), (125_000, 0.6), (150_000, 0.6), (200_000, 0.7), (250_000, 0.8),
                 (300_000, 0.8), (400_000, 0.8), (500_000, 0.9), (750_000, 0.9), (1_000_000, 1.0),
                 (1_500_000, 2.1), (2_000_000, 4.9), (2_500_000, 8.9), (3_000_000, 13.0),
                 (3_500_000, 16.0), (4_000_000, 17.8), (4_500_000, 20.1), (5_000_000, 20.3)],
}
TITLES = {'breakout': 'Breakout', 'space_invaders': 'Space Invaders', 'asterix': 'Asterix',
          'freeway': 'Freeway', 'seaquest': 'Seaquest'}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('returns', nargs='+', help='--returns files of dqn_minatar.py, <game>_<seed>.csv')
    p.add_argument('--csv', help='write the sampled curves here (game,seed,frames,score[,variant])')
    p.add_argument('--variant', help='name of the variant the returns files are (adds a variant column)')
    p.add_argument('--curves', nargs='*', default=[], metavar='FILE=NAME',
                   help='curves an earlier --csv wrote, added as variant NAME (with --variant)')
    p.add_argument('--games', nargs='*', help='only these games')
    p.add_argument('--png', help='draw the curves here')
    p.add_argument('--window', type=int, default=100, help='episodes per moving average (paper: 100)')
    p.add_argument('--every', type=int, default=5_000, help='frames between curve points')
    return p.parse_args(argv)


def read_returns(path):
    with open(path, newline='') as f:
        rows = [(int(r['frames']), float(r['score'])) for r in csv.DictReader(f)]
    return np.array([r[0] for r in rows]), np.array([r[1] for r in rows])


def moving_average_curve(frames, scores, window, every):
    """(points, values): the mean of the last ``window`` episodes ended by each point."""
    if len(scores) < window:
        return np.array([], int), np.array([])
    averages = np.convolve(scores, np.ones(window) / window, mode='valid')   # ends at episode window-1..
    ends = frames[window - 1:]
    points = np.arange(every * -(-ends[0] // every), ends[-1] + 1, every)
    latest = np.searchsorted(ends, points, side='right') - 1    # last average ended at or before
    return points, averages[latest]


def load_runs(paths, window, every, variant=None):
    """{game: {variant: {seed: (points, values)}}} from files named <game>_<seed>.csv."""
    runs = collections.defaultdict(lambda: collections.defaultdict(dict))
    for path in paths:
        match = re.fullmatch(r'(.+)_(\d+)\.csv', os.path.basename(path))
        if not match:
            raise SystemExit(f"{path}: expected a file named <game>_<seed>.csv")
        curve = moving_average_curve(*read_returns(path), window, every)
        runs[match.group(1)][variant][int(match.group(2))] = curve
    return runs


def load_curves(path, variant, runs):
    """Add the curves of an earlier ``--csv`` (its own variant column ignored) to ``runs``."""
    rows = collections.defaultdict(list)
    with open(path, newline='') as f:
        for r in csv.DictReader(f):
            rows[r['game'], int(r['seed'])].append((int(r['frames']), float(r['score'])))
    for (game, seed), points in rows.items():
        frames, scores = zip(*sorted(points))
        runs[game][variant][seed] = (np.array(frames), np.array(scores))


def write_csv(runs, path):
    with_variant = any(v is not None for game in runs.values() for v in game)
    with open(path, 'w', newline='') as f:
        out = csv.writer(f)
        out.writerow(['game', 'seed', 'frames', 'score'] + (['variant'] if with_variant else []))
        for game in sorted(runs):
            for variant in sorted(runs[game], key=str):
                for seed in sorted(runs[game][variant]):
                    for frames, score in zip(*runs[game][variant][seed]):
                        out.writerow([game, seed, int(frames), f"{score:.3f}"]
                                     + ([variant] if with_variant else []))


def seed_mean(curves):
    """(points, mean over seeds) at the points every seed reached."""
    common = set.intersection(*(set(points.tolist()) for points, _ in curves.values()))
    common = np.array(sorted(common), int)
    values = [v[np.isin(p, common)] for p, v in curves.values()]
    return common, np.mean(values, axis=0)


def plot(runs, path, window):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    games = sorted(runs)
    cols = min(len(games), 3)                 # rows of three panels: five games stay legible
    rows = -(-len(games) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[len(games):]:
        ax.set_visible(False)
    for ax, game in zip(axes.flat, games):
        variants = runs[game]
        for colour, (variant, curves) in enumerate(sorted(variants.items(), key=lambda v: str(v[0]))):
            several = len(variants) > 1
            for seed, (points, values) in sorted(curves.items()):
                # One variant: a colour and a legend entry per seed; several: each variant's
                # seeds thin in its colour, one legend entry for the variant.
                ax.plot(points / 1e3, values, lw=0.8, alpha=0.5,
                        label='_nolegend_' if several else f'seed {seed}',
                        color=f'C{colour}' if several else None)
            points, mean = seed_mean(curves)
            # The seeds named: a table of some of them then reads against the right curve.
            seeds = ', '.join(str(seed) for seed in sorted(curves))
            name = f"mean of seed{'s' if len(curves) > 1 else ''} {seeds}" + (
                ' (to the last frame all reached)' if len(curves) > 1 else '')
            ax.plot(points / 1e3, mean, lw=2.2, color=f'C{colour}',
                    label=f"{variant}: {name}" if several else name)
        reached = max(p[-1] for curves in variants.values() for p, _ in curves.values())
        paper = [(f, s) for f, s in PAPER_DQN.get(game, []) if f <= 1.5 * reached]
        if paper:
            f, s = zip(*paper)
            ax.plot(np.array(f) / 1e3, s, 'ks--', ms=4, lw=1, label="paper's DQN (read off its figure)")
        ax.set_title(TITLES.get(game, game))
        ax.set_xlabel('frames (thousands)')
        ax.set_ylabel(f'mean return of the last {window} training episodes')
        ax.grid(alpha=0.3)
        # Lower right: the curves rise from the lower left, and the text reads their upper part.
        ax.legend(fontsize=7, loc='lower right')
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    args = parse_args(argv)
    if args.curves and not args.variant:
        raise SystemExit('--curves adds variants: name the returns files\' one with --variant')
    runs = load_runs(args.returns, args.window, args.every, args.variant)
    for spec in args.curves:
        path, _, name = spec.rpartition('=')
        load_curves(path, name, runs)
    if args.games:
        runs = {game: runs[game] for game in args.games if game in runs}
    if args.csv:
        write_csv(runs, args.csv)
    if args.png:
        plot(runs, args.png, args.window)
    for game in sorted(runs):
        for variant, curves in sorted(runs[game].items(), key=lambda v: str(v[0])):
            points, mean = seed_mean(curves)
            if len(points):
                name = '' if variant is None else f' ({variant})'
                print(f"{game}{name}: {len(curves)} seeds, mean {mean[-1]:.2f} at {points[-1]} frames")


if __name__ == '__main__':
    main()
