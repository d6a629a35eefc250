"""Extra per-step fields through Minari: exported as the episodes' step
infos, loaded back from them, checked field by field against what was written."""

import numpy as np
import pytest

minari = pytest.importorskip('minari')
gym = pytest.importorskip('gymnasium')

from expreplay import ReplayMemory  # noqa: E402
from expreplay.minari_io import export_minari, load_minari  # noqa: E402
from test_memory import FRAME_SHAPE, decode, encode  # noqa: E402
from test_memory_extras import FIELDS, check_batch_extras, extras_of, write_lanes  # noqa: E402


@pytest.fixture(autouse=True)
def minari_root(tmp_path, monkeypatch):
    root = tmp_path / 'minari'
    monkeypatch.setenv('MINARI_DATASETS_PATH', str(root))
    return root


def filled(max_size=400, rounds=150, seed=0):
    mem = ReplayMemory(max_size, FRAME_SHAPE, 2, block_size=10, extra_fields=FIELDS)
    write_lanes(mem, 3, rounds, np.random.default_rng(seed))
    return mem


def test_export_writes_the_extras_as_step_infos_and_load_reads_them_back():
    mem = filled()
    episodes = list(mem.episodes())
    assert len(episodes) > 10
    dataset = export_minari(mem, 'test/extras-v0', action_space=gym.spaces.Discrete(7))
    exported = list(dataset.iterate_episodes())
    assert len(exported) == len(episodes)
    for ours, theirs in zip(episodes, exported):
        steps = len(ours['actions'])
        lane, ep, _ = decode(ours['observations'][0])
        for name, dtype in FIELDS.items():
            info = np.asarray(theirs.infos[name])
            want = np.array([extras_of(lane, ep, t)[name] for t in range(steps)], dtype)
            assert info.shape == (steps + 1,)
            np.testing.assert_array_equal(info[1:], want)          # step t -> infos[t + 1]
            assert info[0] == want[0]                              # the reset entry
            np.testing.assert_array_equal(ours['extras'][name], want)

    loaded = load_minari(dataset, history_len=2, extra_fields=FIELDS)
    assert loaded.extra_fields == mem.extra_fields
    again = list(loaded.episodes())
    assert len(again) == len(episodes)
    for a, b in zip(again, episodes):
        for name in FIELDS:
            np.testing.assert_array_equal(a['extras'][name], b['extras'][name])
    assert check_batch_extras(loaded, loaded.sample(64)) == 64


def test_a_memory_without_extra_fields_exports_no_infos():
    mem = ReplayMemory(100, FRAME_SHAPE, 2)
    w = mem.new_writer()
    w.start_episode(encode(0, 1, 0))
    w.add_step(0, 1.0, encode(0, 1, 1), terminated=True)
    dataset = export_minari(mem, 'test/plain-v0', action_space=gym.spaces.Discrete(2))
    infos = next(iter(dataset.iterate_episodes())).infos
    assert not infos
    assert load_minari(dataset, history_len=2).extra_fields == {}


def test_loading_fields_the_infos_lack_or_can_not_hold_names_the_field():
    mem = filled(rounds=60)
    dataset = export_minari(mem, 'test/extras-v1', action_space=gym.spaces.Discrete(7))
    with pytest.raises(ValueError, match=r"infos have no 'other'"):
        load_minari(dataset, history_len=2, extra_fields={'other': 'int8'})
    # segment values (up to ~2e5) do not fit int8
    with pytest.raises(ValueError, match=r"infos\['segment'\] has values"):
        load_minari(dataset, history_len=2, extra_fields={'segment': 'int8'})
    # a subset of the infos is fine; the other keys are ignored
    sub = load_minari(dataset, history_len=2, extra_fields={'lives': 'int8'})
    assert check_batch_extras(sub, sub.sample(32)) == 32
    target = ReplayMemory(1000, FRAME_SHAPE, 2, extra_fields={'lives': 'int8'})
    assert load_minari(dataset, target) is target and len(target) > 0
    with pytest.raises(ValueError, match='extra_fields configure a new memory'):
        load_minari(dataset, target, extra_fields={'lives': 'int8'})
