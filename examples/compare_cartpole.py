#!/usr/bin/env python
"""CartPole learning comparison: uniform 1-step, PER, 3-step, PER + 3-step; N seeds each.

    python examples/compare_cartpole.py                          # 10 seeds x 4 configs
    python examples/compare_cartpole.py --seeds 0 1 2 --configs uniform per+3step

Each run is ``dqn_cartpole.py`` (Double DQN, the example's tuned hyperparameters) with
``--stop-score 475``: a greedy evaluation every ``--eval-every`` env steps, and the figure is the
env steps at the first evaluation whose 20-episode mean reached 475 (runs that never do within
``--steps`` count as not solved). Runs are appended to ``<out>.csv`` as they finish, and runs
already there are skipped, so an interrupted comparison resumes. At the end the script prints a
Markdown table (solved runs, median and quartiles of the env steps; an unsolved run counts as
the budget, so the median is an upper bound when any failed) and writes ``<out>.png``.

A run takes 1-5 minutes on a 2-core CPU: the full comparison is hours. Run it alone.
"""

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CONFIGS = {
    'uniform': [],
    'per': ['--prioritized'],
    '3step': ['--n-step', '3'],
    'per+3step': ['--prioritized', '--n-step', '3'],
}


def run_one(config, seed, steps, extra):
    with tempfile.TemporaryDirectory() as logdir:
        cmd = [sys.executable, os.path.join(HERE, 'dqn_cartpole.py'), '--seed', str(seed),
               '--stop-score', '475', '--steps', str(steps), '--logdir', logdir,
               *CONFIGS[config], *extra]
        env = dict(os.environ, TF_USE_LEGACY_KERAS='1', TF_CPP_MIN_LOG_LEVEL='2',
                   PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{config} seed {seed} failed:\n{proc.stderr[-3000:]}")
    solved = re.search(r'^solved at env steps (\d+)$', proc.stdout, re.M)
    final = re.search(r'^mean score ([\d.]+)$', proc.stdout, re.M)
    return (int(solved.group(1)) if solved else None), float(final.group(1))


def read_results(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [dict(config=r['config'], seed=int(r['seed']),
                     solved_at=int(r['solved_at']) if r['solved_at'] else None,
                     final_score=float(r['final_score'])) for r in csv.DictReader(f)]


def summarize(results, configs, budget):
    rows = []
    for config in configs:
        runs = [r for r in results if r['config'] == config]
        if not runs:
            continue
        steps = np.array([r['solved_at'] if r['solved_at'] is not None else budget for r in runs])
        solved = sum(r['solved_at'] is not None for r in runs)
        q1, med, q3 = np.percentile(steps, [25, 50, 75])
        rows.append((config, len(runs), solved, med, q1, q3))
    return rows


def plot(results, configs, budget, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, config in enumerate(configs):
        runs = [r for r in results if r['config'] == config]
        if not runs:
            continue
        steps = [r['solved_at'] if r['solved_at'] is not None else budget for r in runs]
        ax.boxplot([steps], positions=[i], widths=0.5)
        ax.scatter(np.full(len(steps), i) + np.linspace(-0.15, 0.15, len(steps)), steps, s=12,
                   c=['C0' if r['solved_at'] is not None else 'C3' for r in runs], zorder=3)
    ax.set_xticks(range(len(configs)), configs)
    ax.set_ylabel('env steps to a greedy mean of 475')
    ax.set_title('CartPole-v1, Double DQN (red: not solved within the budget)')
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--seeds', type=int, nargs='+', default=list(range(10)))
    p.add_argument('--configs', nargs='+', choices=list(CONFIGS), default=list(CONFIGS))
    p.add_argument('--steps', type=int, default=100_000, help='env-step budget per run')
    p.add_argument('--out', default=os.path.join(ROOT, 'docs', 'cartpole_comparison'),
                   help='writes <out>.csv and <out>.png')
    p.add_argument('extra', nargs=argparse.REMAINDER,
                   help='after --: more dqn_cartpole.py arguments for every run')
    args = p.parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ['--'] else args.extra
    path = args.out + '.csv'
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    results = read_results(path)
    done = {(r['config'], r['seed']) for r in results}
    for seed in args.seeds:                 # seed-major: a partial run compares like with like
        for config in args.configs:
            if (config, seed) in done:
                continue
            solved_at, final = run_one(config, seed, args.steps, extra)
            new = not os.path.exists(path)
            with open(path, 'a', newline='') as f:
                w = csv.writer(f)
                if new:
                    w.writerow(['config', 'seed', 'solved_at', 'final_score'])
                w.writerow([config, seed, '' if solved_at is None else solved_at, final])
            results.append(dict(config=config, seed=seed, solved_at=solved_at, final_score=final))
            print(f"{config:>10} seed {seed}: "
                  f"{'solved at %d env steps' % solved_at if solved_at else 'not solved'}, "
                  f"final greedy mean {final:.1f}", flush=True)
    print("\n| config | runs | solved | median env steps | quartiles |")
    print("|---|---|---|---|---|")
    for config, n, solved, med, q1, q3 in summarize(results, args.configs, args.steps):
        print(f"| {config} | {n} | {solved} | {med:,.0f} | {q1:,.0f} - {q3:,.0f} |")
    plot(results, args.configs, args.steps, args.out + '.png')
    print(f"\nwrote {path} and {args.out}.png")


if __name__ == '__main__':
    main()
