"""RayVectorEnv: env actors on a local Ray (started and stopped here), every transition checked.

The actors step :class:`scripted_env.ScriptedEnv`s whose frames say ``(env, episode, step)``. Each
build of an env (the first, and one per actor restart) numbers its episodes from ``GEN *
generation``, so an episode of a restarted actor can never be mistaken for one from before its
death. :class:`Truth` checks everything the driver receives against the script as it arrives
(NEXT_STEP autoreset, rewards of the actions sent, terminated/truncated ends, restarts) and keeps
the delivered steps, against which every sampled transition of the replay memory is then checked
with :func:`scripted_env.check_batch`.
"""

import functools
import ipaddress
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip('ray')
import gymnasium as gym                                           # noqa: E402
import psutil                                                     # noqa: E402
from ray.cluster_utils import Cluster                             # noqa: E402

from expreplay import ReplayMemory, RunnerSettings                # noqa: E402
from expreplay.ray import ActorFailedError, EnvBuildError, RayVectorEnv   # noqa: E402
from expreplay.acting import EnvRunner, EnvRunnerManager          # noqa: E402
from scripted_env import ScriptedEnv, ScriptedEnvError, check_batch, decode, reward_for   # noqa: E402

# Every test starts actor processes (and the module a local Ray, the last test a two-node
# cluster): seconds each, about two minutes in all on 2 cores. CI runs them. Under pytest-xdist
# one worker runs them, in order (conftest.WORKER_GROUPS): one Ray at a time, shared by the module.
pytestmark = pytest.mark.slow

GEN = 10000                    # episodes of build g are numbered from GEN * g (2 bytes: g <= 5)
LENGTHS = (5, 3, 8)
ENDS = ('terminated', 'truncated')
H = 3
LIFE_EVERY = 4                 # with lives=3 an episode (<= 8 steps) never runs out of lives
HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTS)


# ------------------------------------------------------------------------------ Ray itself
# Every Ray started here stays on the loopback: its nodes' IP is 127.0.0.1 and its processes
# listen on 127.0.0.1 only, never on the machine's network interface. conftest sets
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray is imported, which is what makes Ray (2.60) keep
# 127.0.0.1: without it ray.init() turns _node_ip_address='127.0.0.1' and a 127.0.0.1 cluster
# address into the interface's address (a Cluster whose nodes were given 127.0.0.1 then hangs:
# the driver dials its GCS on the interface, where it does not listen).
LOOPBACK = '127.0.0.1'


def _require_loopback():
    """Refuse to start Ray unless it will take the loopback as the node's IP."""
    assert not ray.is_initialized()
    ip = ray.util.get_node_ip_address()      # before ray.init: the IP a new node would take
    if ip != LOOPBACK:
        pytest.fail(f"Ray would start on {ip}, not {LOOPBACK}: is RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 "
                    f"set (tests/conftest.py) before ray is imported?")


def _is_loopback(ip):
    addr = ipaddress.ip_address(ip.split('%')[0])
    return addr.is_loopback or (addr.version == 6 and addr.ipv4_mapped is not None
                                and addr.ipv4_mapped.is_loopback)


def _ray_sockets():
    """(process name, pid, address, port) of every listening TCP socket and bound UDP socket of
    this process (the driver) and its descendants (Ray's GCS, raylets, workers, agents)."""
    out = []
    me = psutil.Process()
    for proc in [me] + me.children(recursive=True):
        try:
            name = proc.name()
            conns = proc.net_connections(kind='inet')
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and c.laddr):
                out.append((name, proc.pid, c.laddr.ip, c.laddr.port))
    return out


def assert_ray_on_loopback(num_nodes):
    """Ray's nodes, its GCS and every socket its processes listen on are on the loopback."""
    nodes = [n for n in ray.nodes() if n['Alive']]
    assert len(nodes) == num_nodes, nodes
    assert [n['NodeManagerAddress'] for n in nodes] == [LOOPBACK] * num_nodes, nodes
    assert ray.util.get_node_ip_address() == LOOPBACK
    gcs_host = ray.get_runtime_context().gcs_address.rsplit(':', 1)[0]
    assert gcs_host == LOOPBACK, ray.get_runtime_context().gcs_address
    sockets = _ray_sockets()
    names = {name for name, _, _, _ in sockets}
    assert {'gcs_server', 'raylet'} <= names, sockets          # the check sees Ray's servers
    outside = [s for s in sockets if not _is_loopback(s[2])]
    assert not outside, f"Ray listens off the loopback: {outside}"


@pytest.fixture(scope='module', autouse=True)
def worker_path():
    """Actor processes import this module, scripted_env and this checkout's expreplay."""
    old = os.environ.get('PYTHONPATH')
    os.environ['PYTHONPATH'] = os.pathsep.join([ROOT, TESTS, HERE] + ([old] if old else []))
    yield
    if ray.is_initialized():
        ray.shutdown()
    if old is None:
        del os.environ['PYTHONPATH']
    else:
        os.environ['PYTHONPATH'] = old


_mode = {'kind': None}


@pytest.fixture
def local_ray(worker_path):
    if _mode['kind'] != 'local' or not ray.is_initialized():
        if ray.is_initialized():
            ray.shutdown()
        # address='local': a new instance of our own, never a cluster another process started here.
        _require_loopback()
        ray.init(address='local', num_cpus=2, include_dashboard=False, log_to_driver=False,
                 _node_ip_address=LOOPBACK)
        _mode['kind'] = 'local'
    yield
    # Nothing of a test may outlive it: no placement group left (actors are checked per test).
    live = [pg for pg in ray.util.placement_group_table().values() if pg['state'] != 'REMOVED']
    assert not live, live


# ------------------------------------------------------------------------------ scripted actors
def _claim_generation(build_dir, index):
    """The next build number of env ``index`` (0 first): a file created exclusively per build."""
    gen = 0
    while True:
        try:
            os.close(os.open(os.path.join(build_dir, f'{index}-{gen}'), os.O_CREAT | os.O_EXCL))
            return gen
        except FileExistsError:
            gen += 1


def _hang_hook(at_step, env, action):
    if env.steps_taken + 1 == at_step:
        threading.Event().wait()      # a hung env: never answers (the actor is killed)


class MakeScripted:
    """``make_env`` for the actors: ScriptedEnv(index) numbering its episodes from GEN * build.

    ``hang_at`` / ``fail_at``: ``{generation: step}``: builds of that generation hang in / raise
    from that step call. ``vector``: build the actor's envs as one NEXT_STEP SyncVectorEnv of
    ``vector`` envs (make_env then gets the actor's first index).
    """

    def __init__(self, build_dir, hang_at=None, fail_at=None, vector=0, fail_build=False, lives=None):
        self.build_dir = str(build_dir)
        self.lives = lives
        self.hang_at, self.fail_at = hang_at or {}, fail_at or {}
        self.vector = vector
        self.fail_build = fail_build

    def build(self, index):
        if self.fail_build:
            raise ScriptedEnvError(f"scripted build failure of env {index}")
        gen = _claim_generation(self.build_dir, index)
        hook = functools.partial(_hang_hook, self.hang_at[gen]) if gen in self.hang_at else None
        env = ScriptedEnv(index, episode_lengths=LENGTHS, ends=ENDS, step_hook=hook,
                          fail_at_step=self.fail_at.get(gen), lives=self.lives, life_every=LIFE_EVERY)
        env.episode = GEN * gen - 1          # its first reset starts episode GEN * gen
        return env

    def __call__(self, index):
        if self.vector:
            return gym.vector.SyncVectorEnv([functools.partial(self.build, index + j) for j in range(self.vector)],
                                            autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
        return self.build(index)


class Oracle:
    """What check_batch needs of an env: the steps it delivered."""

    lives = None
    life_every = 4

    def __init__(self, env_id):
        self.env_id = env_id
        self.transitions = {}


class Truth:
    """Checks every result the driver receives against the script, as it arrives."""

    def __init__(self, num_envs, lives=None):
        self.n = num_envs
        self.lives = lives                # the envs' starting lives, when they report lives
        self.ep = [None] * num_envs
        self.t = [0] * num_envs
        self.ended = [False] * num_envs
        self.envs = {i: Oracle(i) for i in range(num_envs)}
        self.delivered = 0
        self.restarts = [0] * num_envs

    def reset(self, env_ids, obs, info):
        for k, i in enumerate(env_ids):
            got = decode(obs[k])
            if info['restarted'][k]:
                self._restart(i, got)
                continue
            want_ep = 0 if self.ep[i] is None else self.ep[i] + 1
            assert got == (i, want_ep, 0), f"env {i}: reset gave {got}, expected {(i, want_ep, 0)}"
            self.ep[i], self.t[i], self.ended[i] = want_ep, 0, False
            self._check_lives(i, k, info)

    def _restart(self, i, got):
        assert got[0] == i and got[2] == 0 and got[1] % GEN == 0, f"env {i}: restart gave {got}"
        assert self.ep[i] is None or got[1] // GEN > self.ep[i] // GEN, \
            f"env {i}: after a restart episode {got[1]}, not a new build's (was {self.ep[i]})"
        self.ep[i], self.t[i], self.ended[i] = got[1], 0, False
        self.restarts[i] += 1

    def step(self, env_ids, actions, obs, reward, term, trunc, info):
        assert len(env_ids) == len(obs) == len(reward) == len(term) == len(trunc)
        for k, i in enumerate(env_ids):
            got = decode(obs[k])
            assert got[0] == i, f"slot {k}: frame of env {got[0]} returned as env {i}"
            if info['restarted'][k]:
                assert reward[k] == 0 and not term[k] and not trunc[k]
                self._restart(i, got)
            elif self.ended[i]:            # NEXT_STEP: the env's reset, its action ignored
                assert got == (i, self.ep[i] + 1, 0), f"env {i}: autoreset gave {got}"
                assert reward[k] == 0 and not term[k] and not trunc[k]
                self.ep[i], self.t[i], self.ended[i] = got[1], 0, False
            else:
                ep, t = self.ep[i], self.t[i]
                assert got == (i, ep, t + 1), f"env {i}: got {got} after {(i, ep, t)}"
                a = int(actions[k])
                assert reward[k] == reward_for(t, a), (i, ep, t, a, reward[k])
                length, end = LENGTHS[ep % len(LENGTHS)], ENDS[ep % len(ENDS)]
                assert bool(term[k]) == (t + 1 == length and end == 'terminated'), (i, ep, t)
                assert bool(trunc[k]) == (t + 1 == length and end == 'truncated'), (i, ep, t)
                self.envs[i].transitions[(ep, t)] = (a, float(reward[k]), bool(term[k]), bool(trunc[k]), None)
                self.t[i], self.ended[i] = t + 1, bool(term[k] or trunc[k])
                self.delivered += 1
            self._check_lives(i, k, info)

    def _check_lives(self, i, k, info):
        if self.lives is not None:
            assert info['_lives'][k] and info['lives'][k] == self.lives - self.t[i] // LIFE_EVERY, \
                (i, self.ep[i], self.t[i], info['lives'][k])


class Recorder(gym.vector.VectorWrapper):
    """Checks what passes between an EnvRunner and the RayVectorEnv (the sync API)."""

    def __init__(self, env):
        super().__init__(env)
        self.truth = Truth(env.num_envs)

    def reset(self, **kw):
        obs, info = self.env.reset(**kw)
        self.truth.reset(range(self.num_envs), obs, info)
        return obs, info

    def step(self, actions):
        out = self.env.step(actions)
        self.truth.step(range(self.num_envs), actions, *out)
        return out


class Sampler(threading.Thread):
    """Samples the memory while it is written and checks every transition; join() re-raises."""

    def __init__(self, mem, truth):
        super().__init__(name='test-sampler', daemon=True)
        self.mem, self.truth = mem, truth
        self.stop = threading.Event()
        self.checked = 0
        self.error = None

    def run(self):
        rng = np.random.default_rng(1)
        try:
            while not self.stop.is_set():
                if len(self.mem) >= 64:
                    # Check only steps already delivered: a sample can not be ahead of the Truth,
                    # which sees each result before the driver writes it.
                    self.checked += check_batch(self.mem.sample_batch(16, rng=rng), self.truth.envs, H)
                self.stop.wait(0.005)     # pace: leave the driver the GIL most of the time
        except BaseException as exc:      # re-raised in join
            self.error = exc

    def join(self, timeout=None):
        self.stop.set()
        super().join(timeout)
        assert not self.is_alive()
        if self.error is not None:
            raise self.error


class AsyncDriver:
    """A minimal learner over the async API: recv -> write the memory -> send random actions.

    The memory side is what the acting layer does with the contract: a reset or restarted env
    starts a new episode in its lane (an interrupted episode is abandoned there, nothing
    bootstraps across the gap), any other result is a step of the action sent.
    """

    def __init__(self, env, mem, seed=0):
        self.env, self.truth = env, Truth(env.num_envs)
        self.writers = [mem.new_writer() for _ in range(env.num_envs)]
        self.actions = np.zeros(env.num_envs, np.int64)
        self.starting = np.ones(env.num_envs, bool)
        self.rng = np.random.default_rng(seed)
        self.restarted_seen = np.zeros(env.num_envs, np.int64)
        self.recvs = []

    def start(self):
        self.env.async_reset()
        self.awaiting_reset = np.ones(self.env.num_envs, bool)

    def round(self):
        obs, reward, term, trunc, info = self.env.recv()
        ids = info['env_id']
        self.recvs.append(ids)
        # One recv may bring several actors: some answering async_reset, others a step.
        fresh = self.awaiting_reset[ids]
        if fresh.any():
            self.truth.reset(ids[fresh], obs[fresh], _select(info, fresh))
        if not fresh.all():
            s = ~fresh
            self.truth.step(ids[s], self.actions[ids[s]], obs[s], reward[s], term[s], trunc[s], _select(info, s))
        self.awaiting_reset[ids] = False
        starting = self.starting[ids] | info['restarted']
        for k, i in enumerate(ids):
            if starting[k]:
                self.writers[i].start_episode(obs[k])
            else:
                self.writers[i].add_step(self.actions[i], reward[k], obs[k], term[k], trunc[k])
        self.restarted_seen[ids] += info['restarted']
        self.starting[ids] = term | trunc
        self.actions[ids] = self.rng.integers(0, 3, len(ids))
        self.env.send(self.actions[ids], ids)


def _select(info, mask):
    """The per-env entries of a batched info for the envs in ``mask``."""
    return {k: v[mask] if isinstance(v, np.ndarray) and len(v) == len(mask) else v for k, v in info.items()}


def scripted_env(tmp_path, num_actors, envs_per_actor, **kw):
    make_kw = {k: kw.pop(k) for k in ('hang_at', 'fail_at', 'vector', 'fail_build', 'lives') if k in kw}
    return RayVectorEnv(MakeScripted(tmp_path, **make_kw), num_actors, envs_per_actor, **kw)


def actor_pids_gone(pids):
    return not [p for _, p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != 'zombie']


# ------------------------------------------------------------------------------ tests
def test_ray_stays_on_the_loopback(local_ray):
    """The local Ray of these tests never uses the machine's network interface: its node, its
    GCS, the node IP its tasks see, and every socket its processes listen on are on 127.0.0.1."""
    @ray.remote(num_cpus=0)
    def node_ip():
        return ray.util.get_node_ip_address()

    assert ray.get(node_ip.remote(), timeout=60) == LOOPBACK
    assert_ray_on_loopback(1)


@pytest.mark.parametrize('vector', [False, True], ids=['envs', 'vector-env'])
def test_sync_api_every_step_checked(local_ray, tmp_path, vector):
    # The vector-env variant's envs report lives (batched by gymnasium with an '_lives' mask).
    lives = 3 if vector else None
    env = scripted_env(tmp_path, 2, 3, vector=3 if vector else 0, lives=lives, step_timeout=30)
    try:
        assert isinstance(env, gym.vector.VectorEnv) and env.num_envs == 6
        assert env.metadata['autoreset_mode'] == gym.vector.AutoresetMode.NEXT_STEP
        assert env.single_observation_space == gym.spaces.Box(0, 255, (6,), np.uint8)
        assert env.observation_space.shape == (6, 6) and env.action_space.shape == (6,)
        truth = Truth(6, lives=lives)
        obs, info = env.reset(seed=7)
        assert ('lives' in info) == vector
        assert obs.dtype == np.uint8 and obs.shape == (6, 6)
        truth.reset(range(6), obs, info)
        rng = np.random.default_rng(0)
        for _ in range(40):
            actions = rng.integers(0, 3, 6)
            out = env.step(actions)
            truth.step(range(6), actions, *out)
        assert truth.delivered == sum(len(e.transitions) for e in truth.envs.values()) > 150
        ended = [rec for e in truth.envs.values() for rec in e.transitions.values()]
        assert any(r[2] for r in ended) and any(r[3] for r in ended)   # both kinds of end
        assert env.actor_restarts == 0
        with pytest.raises(ValueError, match='actions'):
            env.step(np.zeros(5, int))
    finally:
        env.close()


def test_async_api_keeps_actors_in_flight_and_every_step_checked(local_ray, tmp_path):
    env = scripted_env(tmp_path, 2, 2, step_timeout=30)
    mem = ReplayMemory(400, (6,), H, block_size=8)
    try:
        drv = AsyncDriver(env, mem)
        drv.start()
        sampler = Sampler(mem, drv.truth)
        sampler.start()
        for _ in range(150):
            drv.round()
        sampler.join()
        assert sampler.checked > 0
        assert env.stats().mean_in_flight > 1      # recv waited with both actors out
        # Whole actors' sets only, global ids.
        assert all(len(ids) % 2 == 0 and set(ids) <= set(range(4)) for ids in drv.recvs)
        assert mem.num_steps_written == drv.truth.delivered > 200
        n = check_batch(mem.sample_batch(64, rng=np.random.default_rng(2)), drv.truth.envs, H)
        assert n == 64
        with pytest.raises(RuntimeError, match='in flight'):
            env.send(np.zeros(len(drv.recvs[-1]), int), drv.recvs[-1])   # already sent by the driver
        with pytest.raises(ValueError, match='whole actors'):
            env.send(np.zeros(1, int), [1])
    finally:
        env.close()


def test_numpy_patched_msgpack_in_the_driver(local_ray, tmp_path, monkeypatch):
    """tensorpack runs msgpack_numpy.patch() on import; Ray serialises through msgpack."""
    import msgpack
    msgpack_numpy = pytest.importorskip('msgpack_numpy')
    for name in ('Packer', 'Unpacker', 'load', 'loads', 'dump', 'dumps', 'pack', 'packb', 'unpack', 'unpackb'):
        monkeypatch.setattr(msgpack, name, getattr(msgpack_numpy, name if name[0].islower() else name))
    env = scripted_env(tmp_path, 1, 2, step_timeout=30)
    truth = Truth(2)
    try:
        truth.reset(range(2), *env.reset())
        for a in ([1, 2], [0, 1], [2, 2]):
            truth.step(range(2), np.array(a), *env.step(np.array(a)))
        assert truth.delivered == 6
    finally:
        env.close()


def test_env_runner_end_to_end_sync_path(local_ray, tmp_path):
    """The current acting layer takes RayVectorEnv as a NEXT_STEP vector env."""
    env = scripted_env(tmp_path, 2, 2, step_timeout=30)
    rec = Recorder(env)
    mem = ReplayMemory(300, (6,), H, block_size=8)
    rng = np.random.default_rng(3)
    predictor = lambda states: [rng.random((len(states), 3))]   # noqa: E731
    runner = EnvRunner(rec, predictor, mem, H, settings=RunnerSettings(close_player=False), seed=11)
    try:
        with EnvRunnerManager([runner], maximum_staleness=1) as mgr:
            for _ in range(120):
                mgr.step(0.3)
        assert mem.num_steps_written == rec.truth.delivered > 300
        b = np.random.default_rng(0)
        assert sum(check_batch(mem.sample_batch(64, rng=b), rec.truth.envs, H) for _ in range(10)) == 640
        assert len(runner.total_scores) > 20
    finally:
        env.close()


def test_killed_actors_restarted_flagged_counted_nothing_torn(local_ray, tmp_path):
    env = scripted_env(tmp_path, 2, 2, step_timeout=30, max_restarts=2)
    mem = ReplayMemory(500, (6,), H, block_size=8)
    try:
        drv = AsyncDriver(env, mem)
        drv.start()
        sampler = Sampler(mem, drv.truth)
        sampler.start()
        for _ in range(30):
            drv.round()
        pids0 = env.actor_pids()
        ray.kill(env.actor_handles()[0], no_restart=False)          # through Ray
        while drv.restarted_seen[:2].sum() == 0:
            drv.round()
        assert drv.restarted_seen.tolist() == [1, 1, 0, 0] and env.actor_restarts == 1
        for _ in range(30):
            drv.round()
        os.kill(pids0[1][1], signal.SIGKILL)                         # the process, by pid
        while drv.restarted_seen[2:].sum() == 0:
            drv.round()
        for _ in range(30):
            drv.round()
        sampler.join()
        assert drv.restarted_seen.tolist() == [1, 1, 1, 1]
        assert env.actor_restarts == 2 and drv.truth.restarts == [1, 1, 1, 1]
        pids1 = env.actor_pids()
        assert pids1[0][1] != pids0[0][1] and pids1[1][1] != pids0[1][1]
        # Every delivered step is in the memory, every sample is true (none spans a restart).
        assert mem.num_steps_written == drv.truth.delivered
        assert sampler.checked > 0
        for s in range(10):
            check_batch(mem.sample_batch(64, rng=np.random.default_rng(s)), drv.truth.envs, H)
        pids = env.actor_pids()
    finally:
        env.close()
    assert actor_pids_gone(pids + pids0)


def test_sync_step_reports_a_restart(local_ray, tmp_path):
    env = scripted_env(tmp_path, 2, 2, step_timeout=30)
    truth = Truth(4)
    try:
        truth.reset(range(4), *env.reset())
        actions = np.array([0, 1, 2, 1])
        for _ in range(3):
            truth.step(range(4), actions, *env.step(actions))
        os.kill(env.actor_pids()[0][1], signal.SIGKILL)
        out = env.step(actions)
        assert out[4]['restarted'].tolist() == [True, True, False, False]
        truth.step(range(4), actions, *out)
        for _ in range(3):
            truth.step(range(4), actions, *env.step(actions))
        assert env.actor_restarts == 1 and truth.restarts == [1, 1, 0, 0]
    finally:
        env.close()


def test_death_past_max_restarts_raises_naming_the_actor(local_ray, tmp_path):
    env = scripted_env(tmp_path, 2, 1, step_timeout=30, max_restarts=0)
    try:
        env.reset()
        pids = env.actor_pids()
        os.kill(pids[1][1], signal.SIGKILL)
        with pytest.raises(ActorFailedError, match='actor 1 ') as ei:
            for _ in range(3):
                env.step(np.zeros(2, int))
        assert ei.value.actor == 1
        assert isinstance(ei.value.__cause__, ray.exceptions.RayActorError)
        assert env.actor_restarts == 0
    finally:
        env.close()
    assert actor_pids_gone(pids)


def test_hang_is_a_death_and_a_crash_past_the_budget_raises_chained(local_ray, tmp_path):
    # Build 0 of actor 0's envs hangs at its 4th step; build 1 raises at its 2nd.
    env = scripted_env(tmp_path, 2, 1, step_timeout=1.0, max_restarts=1,
                       hang_at={0: 4}, fail_at={1: 2})
    truth = Truth(2)
    try:
        truth.reset(range(2), *env.reset())
        t0 = time.monotonic()
        restarted = None
        for _ in range(6):
            out = env.step(np.ones(2, int))
            truth.step(range(2), np.ones(2, int), *out)
            if out[4]['restarted'].any():
                restarted = out[4]['restarted'].tolist()
                break
        assert restarted == [True, True]   # both envs' build 0 hung at the same step
        assert env.actor_restarts == 2
        assert time.monotonic() - t0 < 20
        with pytest.raises(ActorFailedError, match='actor [01]') as ei:
            for _ in range(3):
                env.step(np.ones(2, int))
        assert isinstance(ei.value.__cause__, ScriptedEnvError)
        assert 'max_restarts=1' in str(ei.value)
    finally:
        env.close()


def test_close_leaves_no_actor_process_and_is_idempotent(local_ray, tmp_path):
    env = scripted_env(tmp_path, 2, 1, step_timeout=30)
    env.reset()
    pids = env.actor_pids()
    assert all(psutil.pid_exists(p) for _, p in pids)
    env.close()
    assert actor_pids_gone(pids)
    env.close()
    with pytest.raises(RuntimeError, match='closed'):
        env.step(np.zeros(2, int))


def test_bad_arguments_clear_errors_at_construction(local_ray, tmp_path):
    with pytest.raises(ValueError, match='num_actors'):
        RayVectorEnv(MakeScripted(tmp_path), 0, 2)
    with pytest.raises(ValueError, match='envs_per_actor'):
        RayVectorEnv(MakeScripted(tmp_path), 1, 0)
    with pytest.raises(TypeError, match='make_env'):
        RayVectorEnv('ALE/Pong-v5', 1, 1)
    with pytest.raises(ValueError, match='placement'):
        RayVectorEnv(MakeScripted(tmp_path), 1, 1, placement='EVERYWHERE')
    with pytest.raises(ValueError, match='num_cpus_per_actor'):
        RayVectorEnv(MakeScripted(tmp_path), 1, 1, num_cpus_per_actor=0)
    with pytest.raises(EnvBuildError, match='actor 0.*scripted build failure') as ei:
        RayVectorEnv(MakeScripted(tmp_path, fail_build=True), 1, 2)
    assert isinstance(ei.value.__cause__, ScriptedEnvError)
    with pytest.raises(EnvBuildError, match='vector env of 3 envs'):
        RayVectorEnv(MakeScripted(tmp_path, vector=3), 1, 2)
    with pytest.raises(EnvBuildError, match='not an env'):
        RayVectorEnv(lambda i: 42, 1, 1)


class AsyncRecorder:
    """Checks what passes between an EnvRunner and the RayVectorEnv on the async API."""

    def __init__(self, env):
        self.env, self.truth = env, Truth(env.num_envs)
        self.actions = np.zeros(env.num_envs, np.int64)
        self.awaiting_reset = np.ones(env.num_envs, bool)
        self.restarted_seen = np.zeros(env.num_envs, np.int64)

    def __getattr__(self, name):     # num_envs, spaces, metadata, is_async, actor_restarts, ...
        return getattr(self.env, name)

    def async_reset(self):
        self.awaiting_reset[:] = True
        self.env.async_reset()

    def recv(self):
        obs, reward, term, trunc, info = out = self.env.recv()
        ids = info['env_id']
        fresh = self.awaiting_reset[ids]
        if fresh.any():
            self.truth.reset(ids[fresh], obs[fresh], _select(info, fresh))
        if not fresh.all():
            s = ~fresh
            self.truth.step(ids[s], self.actions[ids[s]], obs[s], reward[s], term[s], trunc[s], _select(info, s))
        self.awaiting_reset[ids] = False
        self.restarted_seen[ids] += info['restarted']
        return out

    def send(self, actions, env_id):
        self.actions[env_id] = actions
        self.env.send(actions, env_id)


def test_env_runner_async_path_through_a_killed_actor_loses_and_tears_nothing(local_ray, tmp_path):
    """The product's acting layer on the async API: an actor killed mid-run is restarted, its
    envs start new episodes in the memory, every delivered step is stored and every sample is
    true (none bootstraps across the restart)."""
    env = scripted_env(tmp_path, 2, 2, step_timeout=30, max_restarts=2)
    rec = AsyncRecorder(env)
    mem = ReplayMemory(400, (6,), H, block_size=8)
    rng = np.random.default_rng(5)
    runner = EnvRunner(rec, lambda states: rng.random((len(states), 3)), mem, H,
                       settings=RunnerSettings(close_player=False))
    assert runner.is_async
    try:
        with EnvRunnerManager([runner], maximum_staleness=1) as mgr:
            for _ in range(40):
                mgr.step(0.3)
            ray.kill(env.actor_handles()[0], no_restart=False)
            for _ in range(2000):
                mgr.step(0.3)
                if rec.restarted_seen[:2].all():
                    break
            assert rec.restarted_seen[:2].tolist() == [1, 1] and env.actor_restarts == 1
            for _ in range(40):
                mgr.step(0.3)
            stats = mgr.stats()
        assert stats.actor_restarts == 1
        assert mem.num_steps_written == rec.truth.delivered == runner.steps
        b = np.random.default_rng(0)
        assert sum(check_batch(mem.sample_batch(64, rng=b), rec.truth.envs, H) for _ in range(10)) == 640
    finally:
        env.close()


class _OddOutputs(gym.Env):
    """Steps return what a careless env might: an integer reward float32 can not hold, or a
    string flag."""
    observation_space = gym.spaces.Box(0, 255, (6,), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, kind):
        self.kind = kind

    def reset(self, *, seed=None, options=None):
        return np.zeros(6, np.uint8), {}

    def step(self, action):
        if self.kind == 'reward':
            return np.zeros(6, np.uint8), 16_777_217, False, False, {}
        return np.zeros(6, np.uint8), 0.0, 'False', False, {}


@pytest.mark.parametrize('kind, match', [('reward', '16777217'), ('flag', 'terminated')])
def test_an_actor_refuses_what_the_in_process_players_refuse(local_ray, kind, match):
    # The actor applies the env-output rules where the values are first seen: a cast to
    # float32 / bool there would round 16777217 to 16777216 and read 'False' as True unseen.
    env = RayVectorEnv(functools.partial(_OddOutputs, kind), 1, 1, step_timeout=30, max_restarts=0)
    try:
        env.reset()
        with pytest.raises(ActorFailedError) as ei:
            env.step(np.zeros(1, int))
        chain, err = [], ei.value
        while err is not None:
            chain.append(str(err))
            err = err.__cause__
        assert any(match in text for text in chain), chain
    finally:
        env.close()


# A cluster of two nodes replaces the local Ray: last, so that the tests before it share one.

@pytest.fixture
def two_nodes(worker_path):
    if ray.is_initialized():
        ray.shutdown()
    _mode['kind'] = 'cluster'
    _require_loopback()
    cluster = Cluster(initialize_head=True, head_node_args={'num_cpus': 2, 'include_dashboard': False,
                                                            'node_ip_address': LOOPBACK})
    try:
        worker = cluster.add_node(num_cpus=2, node_ip_address=LOOPBACK)
        assert cluster.address.rsplit(':', 1)[0] == LOOPBACK, cluster.address
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        assert_ray_on_loopback(2)
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()
        _mode['kind'] = None


def test_node_removed_actors_restart_on_the_other(two_nodes, tmp_path):
    cluster, worker = two_nodes
    env = scripted_env(tmp_path, 2, 2, step_timeout=60, placement='SPREAD')
    mem = ReplayMemory(500, (6,), H, block_size=8)
    try:
        nodes = env.actor_nodes()
        assert sorted(nodes) == sorted([cluster.head_node.node_id, worker.node_id])   # spread
        lost = nodes.index(worker.node_id)
        drv = AsyncDriver(env, mem)
        drv.start()
        sampler = Sampler(mem, drv.truth)
        sampler.start()
        for _ in range(40):
            drv.round()
        delivered_before = drv.truth.delivered
        cluster.remove_node(worker)
        while drv.restarted_seen.sum() == 0:
            drv.round()
        for _ in range(40):
            drv.round()
        sampler.join()
        want = [0, 0, 0, 0]
        want[2 * lost] = want[2 * lost + 1] = 1
        assert drv.restarted_seen.tolist() == want and env.actor_restarts == 1
        assert env.actor_nodes() == [cluster.head_node.node_id] * 2
        assert mem.num_steps_written == drv.truth.delivered > delivered_before
        for s in range(10):
            check_batch(mem.sample_batch(64, rng=np.random.default_rng(s)), drv.truth.envs, H)
    finally:
        env.close()
