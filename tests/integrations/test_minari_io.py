"""Minari export / import: every observation, action, reward and ending survives the round trip."""

import os
import subprocess
import sys

import numpy as np
import pytest

minari = pytest.importorskip('minari')
gym = pytest.importorskip('gymnasium')

from expreplay import ReplayMemory  # noqa: E402
from expreplay.minari_io import export_minari, load_minari  # noqa: E402

# Minari nags (UserWarning) about metadata the tests do not need: author e-mail, permalink...
pytestmark = pytest.mark.filterwarnings('ignore::UserWarning:minari')


@pytest.fixture(autouse=True)
def minari_root(tmp_path, monkeypatch):
    """Keep every dataset under tmp_path: nothing reaches ~/.minari."""
    root = tmp_path / 'minari'
    monkeypatch.setenv('MINARI_DATASETS_PATH', str(root))
    return root


def random_frame(rng, shape, dtype):
    if np.dtype(dtype) == np.uint8:
        return rng.integers(0, 256, shape, dtype=np.uint8)   # noise: JPEG would not survive it
    return rng.standard_normal(shape).astype(dtype)


def write_episodes(mem, rng, num_episodes, lanes=2, num_actions=6, min_len=1, max_len=12):
    """Write episodes into ``lanes`` interleaved writers; return them in Minari's layout.

    Endings alternate terminated / truncated so both kinds are present. Returns the episodes in
    the order they were finished.
    """
    shape, dtype = mem.state_shape, mem.dtype
    writers = [mem.new_writer() for _ in range(lanes)]
    open_eps = [None] * lanes
    done = []
    started = 0
    while len(done) < num_episodes:
        lane = int(rng.integers(lanes))
        w, ep = writers[lane], open_eps[lane]
        if ep is None:
            if started == num_episodes:
                continue
            obs = random_frame(rng, shape, dtype)
            ep = open_eps[lane] = dict(observations=[obs], actions=[], rewards=[],
                                       length=int(rng.integers(min_len, max_len + 1)),
                                       truncated=bool(started % 2))
            started += 1
            w.start_episode(obs)
        a = int(rng.integers(num_actions))
        r = np.float32(rng.standard_normal())
        obs = random_frame(rng, shape, dtype)
        last = len(ep['actions']) + 1 == ep['length']
        term, trunc = last and not ep['truncated'], last and ep['truncated']
        w.add_step(a, r, obs, terminated=term, truncated=trunc)
        ep['observations'].append(obs)
        ep['actions'].append(a)
        ep['rewards'].append(r)
        if last:
            n = ep['length']
            done.append(dict(
                observations=np.stack(ep['observations']),
                actions=np.array(ep['actions'], np.int32),
                rewards=np.array(ep['rewards'], np.float32),
                terminations=np.arange(n) == n - 1 if not ep['truncated'] else np.zeros(n, bool),
                truncations=np.arange(n) == n - 1 if ep['truncated'] else np.zeros(n, bool)))
            open_eps[lane] = None
    for w in writers:
        w.close()
    return done


def key(episode):
    """Identify an episode by its content (observation bytes are random, so unique)."""
    return np.ascontiguousarray(episode['observations']).tobytes()


def assert_same_episodes(got, expected):
    got, expected = list(got), list(expected)
    assert sorted(map(key, got)) == sorted(map(key, expected))
    by_key = {key(e): e for e in expected}
    for ep in got:
        ref = by_key[key(ep)]
        for field in ('observations', 'actions', 'rewards', 'terminations', 'truncations'):
            np.testing.assert_array_equal(np.asarray(ep[field]), ref[field], err_msg=field)
        assert np.asarray(ep['observations']).dtype == ref['observations'].dtype


def as_dicts(dataset):
    return [dict(observations=e.observations, actions=e.actions, rewards=e.rewards,
                 terminations=e.terminations, truncations=e.truncations)
            for e in dataset.iterate_episodes()]


@pytest.mark.parametrize('shape, dtype', [((36, 36), np.uint8), ((4,), np.float32)],
                         ids=['uint8-image', 'float32-vector'])
def test_round_trip_keeps_every_step(shape, dtype):
    rng = np.random.default_rng(0)
    mem = ReplayMemory(2000, shape, history_len=4, dtype=dtype)
    written = write_episodes(mem, rng, num_episodes=20)
    assert_same_episodes(mem.episodes(), written)      # the memory itself holds them all

    dataset = export_minari(mem, 'expreplay/roundtrip-v0', author='tests')
    assert dataset.total_episodes == 20
    assert dataset.total_steps == sum(len(e['actions']) for e in written)
    assert dataset.action_space == gym.spaces.Discrete(int(max(e['actions'].max() for e in written)) + 1)
    assert dataset.observation_space.shape == shape and dataset.observation_space.dtype == dtype
    if dtype == np.uint8:
        # A uint8 [0, 255] Box of >= 32x32 is an image to Minari: stored raw, not as JPEG.
        assert (dataset.observation_space.low == 0).all() and (dataset.observation_space.high == 255).all()
    else:
        assert np.isinf(dataset.observation_space.low).all()
    assert_same_episodes(as_dicts(dataset), written)
    endings = [(bool(e['terminations'][-1]), bool(e['truncations'][-1])) for e in written]
    assert (True, False) in endings and (False, True) in endings

    # Reload from disk by id, into a fresh memory.
    loaded = load_minari('expreplay/roundtrip-v0', history_len=4)
    assert loaded.state_shape == shape and loaded.dtype == dtype
    assert_same_episodes(loaded.episodes(), written)
    # Every step is a sampleable transition; only terminated steps have isOver.
    assert len(loaded) == dataset.total_steps
    _, _, _, is_over = loaded.sample_batch(64, rng=np.random.default_rng(1))
    assert is_over.sum() > 0 and (~is_over).sum() > 0


def test_export_of_wrapped_memory_has_only_complete_episodes():
    rng = np.random.default_rng(2)
    mem = ReplayMemory(64, (3,), history_len=2, dtype=np.float32, block_size=4)
    written = write_episodes(mem, rng, num_episodes=60, lanes=3, min_len=3, max_len=9)
    complete = list(mem.episodes())
    # The memory wrapped: early episodes are gone, and some stored steps belong to cut ones.
    assert 0 < len(complete) < len(written)
    stored_steps = sum(len(e['actions']) for e in complete)
    assert mem.num_steps_written > 64 and stored_steps < 64

    dataset = export_minari(mem, 'wrapped-v0', action_space=gym.spaces.Discrete(6))
    exported = as_dicts(dataset)
    assert_same_episodes(exported, complete)
    # ... and each exported episode is a whole written episode, from its reset observation on.
    written_keys = {key(e) for e in written}
    assert all(key(e) in written_keys for e in exported)
    assert dataset.action_space == gym.spaces.Discrete(6)


def test_export_errors(minari_root):
    mem = ReplayMemory(100, (4,), history_len=2, dtype=np.float32)
    with pytest.raises(ValueError, match='no complete episode'):
        export_minari(mem, 'empty-v0')
    w = mem.new_writer()
    w.start_episode(np.zeros(4, np.float32))
    w.add_step(1, 1.0, np.ones(4, np.float32))        # running, not complete
    with pytest.raises(ValueError, match='no complete episode'):
        export_minari(mem, 'empty-v0', action_space=gym.spaces.Discrete(2))
    w.add_step(0, 1.0, np.ones(4, np.float32), terminated=True)

    for bad in ('no-version', 'bad id-v0', 'x/-v'):
        with pytest.raises(ValueError, match='dataset_id'):
            export_minari(mem, bad)
    assert not minari_root.exists() or not any(minari_root.rglob('metadata.json'))

    with pytest.raises(ValueError, match='action_space'):
        export_minari(mem, 'ok-v0', action_space=gym.spaces.Discrete(1))   # action 1 stored
    assert not (minari_root / 'ok-v0').exists()         # the partial dataset was removed
    with pytest.raises(TypeError, match='action_space'):
        export_minari(mem, 'ok-v0', action_space=gym.spaces.Box(-1, 1, (1,)))
    with pytest.raises(ValueError, match='observation_space'):
        export_minari(mem, 'ok-v0', observation_space=gym.spaces.Box(-1, 1, (5,)))

    export_minari(mem, 'ok-v0')
    with pytest.raises(ValueError, match='already exists'):
        export_minari(mem, 'ok-v0')
    assert minari.load_dataset('ok-v0').total_episodes == 1   # the existing one is untouched


def test_export_with_env_records_its_spec():
    env = gym.make('CartPole-v1')
    rng = np.random.default_rng(3)
    mem = ReplayMemory(200, (4,), history_len=2, dtype=np.float32)
    written = write_episodes(mem, rng, num_episodes=4, num_actions=2)
    dataset = export_minari(mem, 'cartpole/export-v0', env=env)
    assert dataset.env_spec.id == 'CartPole-v1'
    assert dataset.action_space == env.action_space
    assert_same_episodes(as_dicts(dataset), written)


def cartpole_like_dataset(dataset_id, lengths, endings, action_space=None):
    """A dataset made with Minari alone (no expreplay), CartPole-like: Box(4) float32, Discrete(2)."""
    from minari.data_collector import EpisodeBuffer

    rng = np.random.default_rng(4)
    buffers = []
    for n, ending in zip(lengths, endings):
        buffers.append(EpisodeBuffer(
            observations=rng.standard_normal((n + 1, 4)).astype(np.float32),
            actions=rng.integers(0, 2, n),                      # int64, as Minari's collector
            rewards=np.ones(n),                                 # float64
            terminations=np.arange(n) == n - 1 if ending == 'terminated' else np.zeros(n, bool),
            truncations=np.arange(n) == n - 1 if ending == 'truncated' else np.zeros(n, bool)))
    obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    return minari.create_dataset_from_buffers(
        dataset_id, buffers, observation_space=obs_space,
        action_space=action_space or gym.spaces.Discrete(2), algorithm_name='hand-made')


def test_load_dataset_made_with_minari():
    dataset = cartpole_like_dataset('handmade/cartpole-v0', [5, 8, 3], ['terminated', 'truncated', 'terminated'])
    expected = as_dicts(dataset)
    mem = load_minari(dataset, history_len=2)
    assert mem.state_shape == (4,) and mem.dtype == np.float32
    assert mem.max_size >= dataset.total_steps + dataset.total_episodes
    assert len(mem) == 16
    got = list(mem.episodes())
    assert_same_episodes(got, [dict(e, actions=e['actions'].astype(np.int32),
                                    rewards=e['rewards'].astype(np.float32)) for e in expected])
    # Sampled transitions: isOver exactly on the terminated last steps; the truncated
    # episode's last step bootstraps (isOver False) to its true final observation.
    finals = {e['observations'][-1].tobytes(): bool(e['terminations'][-1]) for e in expected}
    seen = set()
    rng = np.random.default_rng(5)
    for _ in range(30):
        comb, action, reward, is_over = mem.sample_batch(16, rng=rng)
        assert (reward == 1).all() and set(action.tolist()) <= {0, 1}
        for nxt, over in zip(comb[..., -1], is_over):
            assert over == finals.get(nxt.tobytes(), False)
            if nxt.tobytes() in finals:
                seen.add(nxt.tobytes())
    assert seen == set(finals)


def test_load_into_existing_memory_appends_and_checks_fit():
    dataset = cartpole_like_dataset('handmade/append-v0', [4, 6], ['terminated', 'truncated'])
    rng = np.random.default_rng(6)
    mem = ReplayMemory(500, (4,), history_len=3, dtype=np.float32)
    own = write_episodes(mem, rng, num_episodes=3, num_actions=2)
    assert load_minari(dataset, mem) is mem
    got = list(mem.episodes())
    assert len(got) == 5
    assert_same_episodes([e for e in got if key(e) in {key(o) for o in own}], own)

    with pytest.raises(ValueError, match='memory has state_shape'):
        load_minari(dataset, ReplayMemory(100, (5,), history_len=2, dtype=np.float32))
    with pytest.raises(ValueError, match='memory has dtype'):
        load_minari(dataset, ReplayMemory(100, (4,), history_len=2, dtype=np.uint8))
    with pytest.raises(ValueError, match='max_size, dtype and extra_fields'):
        load_minari(dataset, mem, max_size=10)


def test_load_longer_than_memory_keeps_the_latest_episodes():
    lengths = [10] * 12
    dataset = cartpole_like_dataset('handmade/long-v0', lengths, ['terminated'] * 12)
    expected = as_dicts(dataset)
    mem = load_minari(dataset, max_size=40, history_len=2)
    got = list(mem.episodes())
    assert 0 < len(got) < 12
    # Oldest-first eviction: what remains is the dataset's tail, in order.
    tail = expected[-len(got):]
    for g, e in zip(got, tail):
        np.testing.assert_array_equal(g['observations'], e['observations'])


def test_load_rejects_non_discrete_actions():
    dataset = cartpole_like_dataset('handmade/box-actions-v0', [3], ['terminated'],
                                    action_space=gym.spaces.Box(-1, 1, (1,), np.float32))
    with pytest.raises(TypeError, match='action_space'):
        load_minari(dataset)
    with pytest.raises(TypeError, match='dataset_or_id'):
        load_minari(42)
    with pytest.raises(FileNotFoundError):
        load_minari('handmade/missing-v0')


def test_import_is_lazy_and_missing_minari_says_how_to_install():
    code = ("import sys, expreplay, expreplay.minari_io\n"
            "assert 'minari' not in sys.modules, 'minari imported eagerly'\n"
            "sys.modules['minari'] = None\n"            # as if it were not installed
            "import numpy as np\n"
            "from expreplay import ReplayMemory\n"
            "try:\n"
            "    expreplay.minari_io.export_minari(ReplayMemory(10, (2,), 2), 'x-v0')\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr
    assert "pip install 'expreplay[minari]'" in out.stdout
