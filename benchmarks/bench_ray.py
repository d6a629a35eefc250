"""Ray actors benchmark: Pong stepped in Ray actors against the in-process default population.

Setup: Pong, grayscale 84x84 uint8 frames, frameskip 4, history 4 (the envs and
the Nature-DQN CNN of ``bench_population.py``; TensorFlow with its default threading), one
``ReplayMemory`` in this process, exploration ``--exploration`` (0.1), staleness 8 (the default of
``ExpReplay``/``ReplayStream``: ``2 * update_frequency`` with update_frequency 4).

Configurations, measured in the same run, interleaved (each round measures every one of them in
turn; figures are medians over rounds):

- ``in-process``: the default population: 8 single-env runners (one env each) through
  ``EnvRunnerManager(runners, 8)`` with its defaults (one pipelined simulator thread, batched
  inference). All 8 envs share this process's GIL.
- ``ray 1x(2x4)``: one ``EnvRunner`` over ``RayVectorEnv(make_env, 2, 4)``, which the acting
  layer drives through ``recv``/``send`` (an asynchronous engine): while one actor steps its 4
  envs, the learner predicts and stores the other's.
- ``ray 2x(1x4)``: two ``EnvRunner`` s, each over a ``RayVectorEnv(make_env, 1, 4)``, in the same
  manager (a simulator thread each).
- ``ray async 2x4``: the 2x4 env driven by a bare loop written in this script (recv, one
  forward pass, epsilon-greedy, per-env memory writes, send): a reference for the product's
  acting layer over the same transport.

Printed per configuration: steps/s written to the memory; for the Ray ones, the payload bytes per
transferred env step (frames, rewards, flags: what the actor returns, one array per actor and
step), the time per transferred env step (round trip from send to result, and that round trip
minus the actor's own env-stepping time: the transport's overhead), and the actors in flight (time
average: the summed round trips over the wall time).

The Ray instance is local (``ray.init(num_cpus=4)``: logical CPUs, so that both Ray
configurations' actors can exist at once; the machine's cores are what they are) and started and
stopped here; the actors import this directory's ``bench_population`` and this checkout's
``expreplay``. It stays on the loopback: its node's IP is 127.0.0.1 and its processes listen on
127.0.0.1 only (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set here before Ray is imported; see
docs/ray.md), and the benchmark stops if Ray's node is on another address.

Usage: python benchmarks/bench_ray.py [--repeats 5] [--seconds 3] [--warmup 1] [--quick]
"""

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

# Ray on the loopback, never the machine's network interface: Ray (on Linux) takes the interface's
# address as the node's IP, turns a 127.0.0.1 given to ray.init into it, and listens on all
# interfaces; with this switch (its default on macOS and Windows) it takes and keeps 127.0.0.1 and
# listens there only. Ray reads it when it is imported.
LOOPBACK = '127.0.0.1'
os.environ['RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'] = '0'

from bench_population import HISTORY, FRAME, load1, make_cnn, med  # noqa: E402
from bench_population import make_pong as make_pong_env  # noqa: E402


def make_pong(sticky):
    """The actors' make_env: a picklable callable (the env is built inside the actor)."""
    import functools
    return functools.partial(make_pong_env, sticky)


def run(players, predictor, memory, staleness, exploration, warmup, seconds, ray_envs=()):
    """steps/s written to ``memory`` by runners over ``players``; and the Ray traffic over the
    measured seconds: (steps/s, {stat: value})."""
    from expreplay import EnvRunner, EnvRunnerManager, RunnerSettings
    keep_players = RunnerSettings(close_player=False)
    runners = [EnvRunner(p, predictor, memory, HISTORY, settings=keep_players, index=i)
               for i, p in enumerate(players)]
    with EnvRunnerManager(runners, staleness) as mgr:
        deadline = time.perf_counter() + warmup
        while time.perf_counter() < deadline or min(r.steps for r in runners) == 0:
            mgr.step(exploration)
        s0 = [e.stats() for e in ray_envs]
        w0 = memory.num_steps_written
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            mgr.step(exploration)
        w1 = memory.num_steps_written
        t1 = time.perf_counter()
        s1 = [e.stats() for e in ray_envs]
    traffic = {}
    if ray_envs:
        d = {k: sum(getattr(b, k) - getattr(a, k) for a, b in zip(s0, s1)) for k in ('env_steps', 'bytes', 'round_trip', 'compute')}
        n = max(d['env_steps'], 1)
        traffic = dict(bytes_per_step=d['bytes'] / n, rtt_ms=d['round_trip'] / n * 1e3,
                       overhead_ms=(d['round_trip'] - d['compute']) / n * 1e3,
                       in_flight=d['round_trip'] / (t1 - t0),
                       restarts=sum(e.actor_restarts for e in ray_envs))
    return (w1 - w0) / (t1 - t0), traffic


def run_async(env, predictor, memory, exploration, warmup, seconds, seed=0):
    """A bare learner loop over the async API (recv -> one forward pass for the envs received ->
    epsilon-greedy -> memory -> send), as an acting layer driving send/recv would run it: what
    the transport gives with actors kept in flight. Returns (steps/s, traffic)."""
    rng = np.random.default_rng(seed)
    n = env.num_envs
    hist = np.zeros((n,) + FRAME + (HISTORY,), np.uint8)
    writers = [memory.new_writer() for _ in range(n)]
    actions = np.zeros(n, np.int64)
    starting = np.ones(n, bool)
    num_actions = env.single_action_space.n
    env.async_reset()
    t_end_warm = time.perf_counter() + warmup
    measuring, w0, t0, s0 = False, 0, 0.0, None
    while True:
        now = time.perf_counter()
        if not measuring and now >= t_end_warm:
            measuring, w0, t0, s0 = True, memory.num_steps_written, now, env.stats()
        elif measuring and now >= t0 + seconds:
            break
        obs, reward, term, trunc, info = env.recv()
        ids = info['env_id']
        new = starting[ids] | info['restarted']
        for k, i in enumerate(ids):
            if new[k]:
                writers[i].start_episode(obs[k])
                hist[i] = 0
            else:
                writers[i].add_step(actions[i], reward[k], obs[k], term[k], trunc[k])
            hist[i, ..., :-1] = hist[i, ..., 1:]
            hist[i, ..., -1] = obs[k]
        starting[ids] = term | trunc
        q = predictor(hist[ids])[0]
        act = np.argmax(q, axis=1)
        explore = rng.random(len(ids)) < exploration
        act[explore] = rng.integers(0, num_actions, int(explore.sum()))
        actions[ids] = act
        env.send(act, ids)
    w1, t1, s1 = memory.num_steps_written, time.perf_counter(), env.stats()
    for w in writers:
        w.close()
    d = {k: getattr(s1, k) - getattr(s0, k) for k in ('env_steps', 'bytes', 'round_trip', 'compute')}
    m = max(d['env_steps'], 1)
    return (w1 - w0) / (t1 - t0), dict(bytes_per_step=d['bytes'] / m, rtt_ms=d['round_trip'] / m * 1e3,
                                       overhead_ms=(d['round_trip'] - d['compute']) / m * 1e3,
                                       in_flight=d['round_trip'] / (t1 - t0), restarts=env.actor_restarts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--repeats', type=int, default=5, help='rounds (figures are medians over rounds)')
    ap.add_argument('--seconds', type=float, default=3.0, help='seconds measured per figure')
    ap.add_argument('--warmup', type=float, default=1.0, help='seconds run before each figure')
    ap.add_argument('--exploration', type=float, default=0.1)
    ap.add_argument('--staleness', type=int, default=8)
    ap.add_argument('--memory-size', type=int, default=100_000)
    ap.add_argument('--sticky', type=float, default=0.25)
    ap.add_argument('--quick', action='store_true', help='smoke run: 2 rounds of 1 s')
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.seconds, args.warmup = 2, 1.0, 0.5

    # The actors' processes import bench_population (make_env) and this checkout's expreplay.
    os.environ['PYTHONPATH'] = os.pathsep.join([ROOT, HERE] + [p for p in [os.environ.get('PYTHONPATH')] if p])
    import ray
    from expreplay import ReplayMemory
    from expreplay.ray import RayVectorEnv

    print(f"bench_ray: Pong {FRAME[0]}x{FRAME[1]} grayscale, frameskip 4, history {HISTORY}, Nature CNN "
          f"on the learner (TF default threading); exploration {args.exploration:g}, "
          f"staleness {args.staleness}; {os.cpu_count()} cores; load {load1():.2f}", flush=True)
    ray.init(address='local', num_cpus=4, include_dashboard=False, log_to_driver=False,
             _node_ip_address=LOOPBACK)
    singles, envs = [], []
    try:
        nodes = [n['NodeManagerAddress'] for n in ray.nodes()]
        if nodes != [LOOPBACK]:
            raise SystemExit(f"bench_ray: Ray's node is on {nodes}, not the loopback {LOOPBACK}")
        singles = [make_pong_env(args.sticky) for _ in range(8)]
        predictor = make_cnn(singles[0].action_space.n)
        memory = ReplayMemory(args.memory_size, FRAME, HISTORY)
        t = time.perf_counter()
        one = RayVectorEnv(make_pong(args.sticky), 2, 4)
        two = [RayVectorEnv(make_pong(args.sticky), 1, 4) for _ in range(2)]
        envs = [one] + two
        print(f"actors up in {time.perf_counter() - t:.1f} s", flush=True)
        configs = [('in-process 8x1', singles, ()), ('ray 1x(2x4)', [one], [one]), ('ray 2x(1x4)', two, two),
                   ('ray async 2x4', None, [one])]
        res = {name: [] for name, _, _ in configs}
        for rnd in range(args.repeats):
            line = []
            for name, players, ray_envs in configs:
                if players is None:
                    rate, traffic = run_async(one, predictor, memory, args.exploration, args.warmup,
                                              args.seconds, seed=rnd)
                else:
                    rate, traffic = run(players, predictor, memory, args.staleness, args.exploration,
                                        args.warmup, args.seconds, ray_envs)
                res[name].append((rate, traffic))
                line.append(f"{name}: {rate:.0f}")
            print(f"round {rnd + 1}/{args.repeats} (load {load1():.2f}): " + '   '.join(line), flush=True)
        base = med([r for r, _ in res['in-process 8x1']])
        print(f"\nFigures: medians over {args.repeats} rounds of {args.seconds:g} s, interleaved.")
        print(f"{'configuration':>16} {'steps/s':>8} {'vs in-process':>14} {'bytes/step':>11} "
              f"{'ms/step rtt':>12} {'ms/step ovh':>12} {'in flight':>10}")
        for name, players, ray_envs in configs:
            rates = [r for r, _ in res[name]]
            ratio = med([r / b for (r, _), (b, _) in zip(res[name], res['in-process 8x1'])])
            row = f"{name:>16} {med(rates):>8.0f} {ratio:>14.2f}"
            if ray_envs:
                tr = [t for _, t in res[name]]
                row += (f" {med([t['bytes_per_step'] for t in tr]):>11.0f} {med([t['rtt_ms'] for t in tr]):>12.3f}"
                        f" {med([t['overhead_ms'] for t in tr]):>12.3f} {med([t['in_flight'] for t in tr]):>10.2f}")
            print(row)
        restarts = sum(e.actor_restarts for e in envs)
        print(f"\nin-process median {base:.0f} steps/s; actor restarts during the run: {restarts}")
        return 0
    finally:
        for e in envs:
            e.close()
        for e in singles:
            e.close()
        ray.shutdown()


if __name__ == '__main__':
    sys.exit(main())
