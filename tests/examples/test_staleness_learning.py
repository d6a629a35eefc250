"""examples/staleness_learning.py: a run's log and returns become a row of the study, scored over
the last 200k of its 1M frames; tune_staleness's learning lines name the nearest measured lag."""

import csv
import gzip
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, 'examples'))

import staleness_learning  # noqa: E402


def finished_run(directory, scores, mean_lag, max_lag, mean_age=1.0, max_age=1, players=4):
    """A run directory as the study's command leaves it: ``log.txt`` and ``returns.csv``;
    ``scores``: (frame, score) rows."""
    os.makedirs(directory)
    with open(os.path.join(directory, 'returns.csv'), 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['frames', 'score'])
        w.writerows(scores)
    with open(os.path.join(directory, 'log.txt'), 'w') as f:
        f.write(f"DQN (JAX) on MinAtar Breakout: 1000000 frames, seed 0, {players} players "
                "(staleness 64), cpu learner; filling 5000 frames at random first\n"
                f"training done: 1000000 frames, 123 games in 2000 s, mean request lag "
                f"{mean_lag} updates (max {max_lag}), acting weights' mean age {mean_age} "
                f"updates (max {max_age})\n")
    return str(directory)


def baseline(directory, game, seed, score):
    os.makedirs(directory, exist_ok=True)
    with gzip.open(os.path.join(directory, f'{game}_seed{seed}.csv.gz'), 'wt') as f:
        f.write('frames,score\n' + ''.join(f'{frame},{score}\n'
                                           for frame in range(50_000, 1_000_001, 50_000)))


def test_a_run_is_added_and_scored_over_its_last_200k_frames(tmp_path, capsys):
    data, base = str(tmp_path / 'data'), str(tmp_path / 'base')
    # Episodes before 800k score 100 and must not count; those in (800k, 1M] average 6.
    scores = [(400_000, 100.0), (800_000, 100.0), (850_000, 4.0), (900_000, 8.0), (1_000_000, 6.0)]
    run = finished_run(tmp_path / 'k64', scores, 61.5, 64)
    staleness_learning.main(['add', run, '--game', 'breakout', '--seed', '0', '--staleness', '64',
                             '--env-ms', '2', '--data', data])
    rows = staleness_learning.read_table(os.path.join(data, 'runs.csv'))
    assert [(r['game'], r['staleness'], r['players'], r['mean_lag'], r['max_lag']) for r in rows] \
        == [('breakout', '64', '4', '61.5', '64')]
    assert staleness_learning.window_score(os.path.join(data, rows[0]['returns'])) == (6.0, 3)

    # Added again (a rerun): its row is replaced, not doubled.
    staleness_learning.main(['add', run, '--game', 'breakout', '--seed', '0', '--staleness', '64',
                             '--env-ms', '2', '--data', data])
    assert len(staleness_learning.read_table(os.path.join(data, 'runs.csv'))) == 1
    # The same game, window and seed under a label is another run; a stop is taken off its time.
    staleness_learning.main(['add', run, '--game', 'breakout', '--seed', '0', '--staleness', '64',
                             '--env-ms', '2', '--data', data, '--label', 'shared',
                             '--stopped', '400'])
    rows = staleness_learning.read_table(os.path.join(data, 'runs.csv'))
    assert [(r['returns'], r['seconds']) for r in rows] == [
        ('breakout_k64_seed0.csv.gz', '2000'), ('breakout_k64_seed0_shared.csv.gz', '1600')]

    baseline(base, 'breakout', 0, 7.0)
    baseline(base, 'breakout', 1, 9.0)
    capsys.readouterr()
    staleness_learning.main(['report', '--data', data, '--baseline', base])
    out = capsys.readouterr().out
    assert '| breakout | 2 seeds | one player, inline | 1 | 1 | 0 | 1 | 8.00 (7.00-9.00) | |' in out
    assert '| breakout | 0 | 64 | 1 | not recorded | 61.5 (64) | 1.0 (1) | 6.00 (3) | 500 |' in out
    assert '| breakout | 0 | 64 | 1 | not recorded | 61.5 (64) | 1.0 (1) | 6.00 (3) | 625 |' in out  # labelled


def test_a_hand_over_run_is_named_and_reported_by_its_weights_age(tmp_path, capsys):
    data = str(tmp_path / 'data')
    run = finished_run(tmp_path / 'w10000', [(900_000, 5.0)], 0.0, 0, 5000.5, 10000, players=1)
    staleness_learning.main(['add', run, '--game', 'breakout', '--seed', '1',
                             '--weights-every', '10000', '--data', data])
    rows = staleness_learning.read_table(os.path.join(data, 'runs.csv'))
    assert [(r['returns'], r['staleness'], r['weights_every'], r['mean_age'], r['max_age'])
            for r in rows] == [('breakout_w10000_seed1.csv.gz', '', '10000', '5000.5', '10000')]
    capsys.readouterr()
    staleness_learning.main(['report', '--data', data, '--baseline', str(tmp_path / 'none')])
    out = capsys.readouterr().out
    assert ('| breakout | 1 | one player, inline | 10000 | not recorded | 0.0 (0) | 5000.5 (10000) '
            '| 5.00 (1) | 500 |') in out
    # The window's learning lines are about the request lag: a hand-over run is not one of them.
    assert staleness_learning.learning_cost(0.0, data, str(tmp_path / 'none')) == []


def test_the_learning_cost_names_the_run_of_the_nearest_lag(tmp_path):
    data, base = str(tmp_path / 'data'), str(tmp_path / 'base')
    for window, lag, score in [(4, 2.1, 8.0), (1024, 1000.0, 7.5), (16384, 16000.0, 3.0)]:
        run = finished_run(tmp_path / f'k{window}', [(900_000, score)], lag, window)
        staleness_learning.main(['add', run, '--game', 'breakout', '--seed', '0',
                                 '--staleness', str(window), '--env-ms', '2', '--data', data])
    baseline(base, 'breakout', 0, 8.0)
    lines = staleness_learning.learning_cost(700.0, data, base)
    assert lines == ["  breakout: at a request lag of 1000 updates (seed 0) DQN scored 7.50 over "
                     "800k-1M frames, against 8.00 (8.00-8.00, 1 seeds) with no lag (one "
                     "unpaired run: not a measured cost)"]
    assert 'at a request lag of 2 updates' in staleness_learning.learning_cost(0.0, data, base)[0]
    assert staleness_learning.learning_cost(1.0, str(tmp_path / 'none'), base) == []


def test_an_unfinished_run_is_refused(tmp_path):
    run = tmp_path / 'cut'
    os.makedirs(run)
    (run / 'log.txt').write_text("progress: 5000 frames (800/s)\n")
    (run / 'returns.csv').write_text("frames,score\n")
    with pytest.raises(SystemExit, match='not finished'):
        staleness_learning.main(['add', str(run), '--game', 'breakout', '--seed', '0',
                                 '--staleness', '4', '--env-ms', '2', '--data', str(tmp_path / 'd')])


def test_the_bootstrap_interval_and_the_detectable_effect_follow_the_seeds():
    assert staleness_learning.bootstrap_ci([-1.0] * 5) == (-1.0, -1.0)
    lo, hi = staleness_learning.bootstrap_ci([-3.0, -2.0, -2.5, -1.0, -3.5])
    assert -3.5 < lo < -2.4 < hi < -1.0
    # (t_0.975 + t_0.8 with 4 degrees of freedom) x SD / sqrt(5): SD 1 -> 3.717 / 2.236.
    diffs = [-2.0, -1.0, 0.0, 1.0, 2.0]
    sd = float(np.std(diffs, ddof=1))
    assert staleness_learning.detectable(diffs) == pytest.approx((2.7764 + 0.9410) * sd / 5 ** 0.5,
                                                                 rel=1e-3)
    assert staleness_learning.detectable([1.0]) is None


def test_a_hand_over_arm_is_paired_with_the_no_lag_runs_of_its_seeds(tmp_path, capsys):
    data, base = tmp_path / 'data', tmp_path / 'base'
    for seed, score in enumerate([8.0, 7.0, 7.5, 8.5, 8.0]):
        baseline(base, 'breakout', seed, score)
    for seed, score in enumerate([6.0, 5.0, 6.0, 6.5, 5.5, 1.0]):    # seed 5: no control
        run = finished_run(tmp_path / f'w{seed}', [(f, score) for f in range(50_000, 1_000_001,
                                                                          50_000)],
                           0.0, 0, 50000.0, 100000, players=1)
        staleness_learning.main(['add', run, '--game', 'breakout', '--seed', str(seed),
                                 '--weights-every', '100000', '--data', str(data)])
    window = finished_run(tmp_path / 'k', [(f, 1.0) for f in range(50_000, 1_000_001, 50_000)],
                          4096.0, 4096)
    staleness_learning.main(['add', window, '--game', 'breakout', '--seed', '0',
                             '--staleness', '4096', '--data', str(data)])
    rows, _ = staleness_learning.study(str(data), str(base))
    arms = staleness_learning.paired_arms(rows, staleness_learning.control_runs(rows, str(base)))
    assert len(arms) == 1                                  # the window's run has no control
    game, every, seeds, control, arm, diff, area = arms[0]
    assert (game, every, seeds) == ('breakout', 100000, [0, 1, 2, 3, 4])
    assert diff == pytest.approx([-2.0, -2.0, -1.5, -2.0, -2.5])
    assert area == pytest.approx(diff)                     # flat curves: the area is the score
    capsys.readouterr()
    staleness_learning.main(['report', '--data', str(data), '--baseline', str(base)])
    out = capsys.readouterr().out
    assert '| breakout | 100000 | 0, 1, 2, 3, 4 | 7.80 -> 5.80 | -2.00 [' in out


def test_a_run_s_updates_per_call_and_fixed_request_lag_are_read_from_its_log(tmp_path):
    data = str(tmp_path / 'data')
    run = finished_run(tmp_path / 'r', [(900_000, 5.0)], 4096.0, 4096)
    log = os.path.join(run, 'log.txt')
    text = open(log).read().replace('(staleness 64)', '(staleness 4200, request lag 4096 updates, '
                                    'fixed), 1 update per call')
    open(log, 'w').write(text)
    staleness_learning.main(['add', run, '--game', 'breakout', '--seed', '0', '--data', data])
    old = finished_run(tmp_path / 'old', [(900_000, 5.0)], 0.0, 0, 50.0, 100, players=1)
    staleness_learning.main(['add', old, '--game', 'breakout', '--seed', '1', '--weights-every',
                             '100', '--updates-per-call', '1', '--data', data])
    rows = staleness_learning.read_table(os.path.join(data, 'runs.csv'))
    assert [(r['updates_per_call'], r['request_lag']) for r in rows] == [('1', '4096'), ('1', '')]


def fixed_lag_run(directory, score, seed, request_lag=None, per_call=1):
    """A 4-player run of the window's controlled design: ``request_lag`` None is its control."""
    lag = '' if request_lag is None else f', request lag {request_lag} updates, fixed'
    run = finished_run(directory, [(f, score) for f in range(50_000, 1_000_001, 50_000)],
                       float(request_lag or 0), request_lag or 0)
    log = os.path.join(run, 'log.txt')
    text = open(log).read().replace('(staleness 64)', f'(staleness 64{lag}), {per_call} update'
                                    f'{"s" if per_call > 1 else ""} per call')
    open(log, 'w').write(text.replace('seed 0', f'seed {seed}'))
    return run


def test_a_fixed_lag_arm_is_paired_with_the_control_of_its_players_and_seed(tmp_path, capsys):
    data = str(tmp_path / 'data')
    add = ['--game', 'breakout', '--data', data]
    for seed, (control, lagged) in enumerate([(8.0, 7.0), (7.0, 6.5), (6.0, 6.0)]):
        staleness_learning.main(['add', fixed_lag_run(tmp_path / f'c{seed}', control, seed),
                                 '--seed', str(seed)] + add)
        staleness_learning.main(['add', fixed_lag_run(tmp_path / f'r{seed}', lagged, seed, 65536),
                                 '--seed', str(seed)] + add)
    # Not paired: a lag without a control of the same seed, or of the same updates per call.
    staleness_learning.main(['add', fixed_lag_run(tmp_path / 'r9', 1.0, 9, 65536),
                             '--seed', '9'] + add)
    staleness_learning.main(['add', fixed_lag_run(tmp_path / 'r4', 1.0, 0, 4096, per_call=4),
                             '--seed', '0'] + add)
    names = sorted(os.listdir(data))
    assert 'breakout_p4_seed0.csv.gz' in names and 'breakout_p4_r65536_seed0.csv.gz' in names
    rows, _ = staleness_learning.study(data, str(tmp_path / 'no_baseline'))
    arms = staleness_learning.paired_window_arms(rows)
    assert [(game, lag, seeds) for game, lag, seeds, *_ in arms] == [('breakout', 65536, [0, 1, 2])]
    *_, diff, area = arms[0]
    assert diff == pytest.approx([-1.0, -0.5, 0.0]) and area == pytest.approx(diff)
    lines = staleness_learning.learning_cost(50_000, data, str(tmp_path / 'no_baseline'))
    assert lines == ["  breakout: a fixed request lag of 65536 updates changed DQN's score over "
                     "800k-1M frames by -0.50 (seeds: -1.00, -0.50, +0.00) (3 paired seeds, "
                     "7.00 -> 6.50)"]
    capsys.readouterr()
    staleness_learning.main(['report', '--data', data, '--baseline', str(tmp_path / 'none')])
    out = capsys.readouterr().out
    assert '| breakout | 65536 | 0, 1, 2 | 7.00 -> 6.50 | -0.50 (seeds: ' in out
    assert "| breakout | 0 | 4 players, the stream's |" in out


def test_two_sets_of_runs_are_compared_unpaired(tmp_path, capsys):
    """Each run's score over its last 200k frames, and the difference of the two sets' means
    with an interval that holds it (the runs spread, so the interval is not a point)."""
    for seed, score in enumerate((7.0, 7.4)):
        baseline(tmp_path / 'torch', 'breakout', seed, score)
    for seed, score in enumerate((8.0, 8.2, 8.6)):
        baseline(tmp_path / 'jax', 'breakout', seed, score)
    staleness_learning.main(['compare', *sorted(map(str, (tmp_path / 'torch').iterdir())),
                             '--against', *sorted(map(str, (tmp_path / 'jax').iterdir()))])
    out = capsys.readouterr().out
    assert '| runs | breakout_seed1.csv.gz | 7.40 (4) |' in out
    assert '| against | breakout_seed2.csv.gz | 8.60 (4) |' in out
    line = next(x for x in out.splitlines() if x.startswith('score, 800k-1M'))
    assert 'runs 7.20' in line and 'against 8.27' in line and 'difference -1.07' in line
    lo, hi = (float(v) for v in line.split('CI ')[1].split(']')[0].split(', '))
    assert lo < -1.07 < hi and lo < hi < 0
