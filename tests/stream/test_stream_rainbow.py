"""ReplayStream with n-step returns, prioritized replay and a samples-per-insert rate limiter:
every batch checked against the scripted envs' logs."""

import numpy as np
import pytest

from expreplay import ReplayMemory
from expreplay.storage.memory import SampleBatch
from scripted_env import check_batch, decode
from test_stream import (EnvFactory, draw_logged_stream, kernels, make_stream,  # noqa: F401
                         our_threads, prefer, prefetch, take)

HISTORY = 3


def check_nstep_batch(batch, envs, n, gamma, layout='NHWC'):
    """Every transition of a SampleBatch against the envs' logs (all n-step fields)."""
    state, next_state = np.asarray(batch.state), np.asarray(batch.next_state)
    if layout == 'NHWC':
        state, next_state = np.moveaxis(state, -1, 1), np.moveaxis(next_state, -1, 1)
    for b in range(len(batch.action)):
        ids = [decode(f) for f in state[b]]
        env_id, ep, t = ids[-1]
        assert ids == [(env_id, ep, t - j) if t >= j else None for j in range(HISTORY - 1, -1, -1)]
        nxt = [decode(f) for f in next_state[b]]
        env_id2, ep2, tk = nxt[-1]
        assert (env_id2, ep2) == (env_id, ep), "the window left the episode"
        assert nxt == [(env_id, ep, tk - j) if tk >= j else None for j in range(HISTORY - 1, -1, -1)]
        k = tk - t
        assert 1 <= k <= n
        log = envs[env_id].transitions
        recs = [log[(ep, t + j)] for j in range(k)]
        assert batch.action[b] == recs[0][0]
        assert batch.reward[b] == pytest.approx(
            sum(gamma ** j * r[1] for j, r in enumerate(recs)), abs=1e-4)
        # Only the last step of the window may end the episode.
        assert not any(r[2] or r[3] for r in recs[:-1])
        terminated = bool(recs[-1][2])
        assert bool(batch.is_over[b]) == terminated
        assert batch.discount[b] == pytest.approx(0.0 if terminated else gamma ** k)
    return len(batch.action)


@pytest.mark.parametrize('layout', ['NHWC', 'NCHW'])
def test_n_step_stream_batches_are_right(layout, prefetch, kernels):
    factory = EnvFactory(episode_lengths=(7, 2, 12, 1), ends=('terminated', 'truncated'))
    with make_stream(factory, prefer(1), layout=layout, exploration=0.5, n_step=3,
                     gamma=0.9, prefetch=prefetch) as stream:
        batches = take(iter(stream), 60)
    for batch in batches:
        assert isinstance(batch, SampleBatch)
        assert np.all(batch.weights == 1)
        assert check_nstep_batch(batch, factory.envs, 3, 0.9, layout) == 16
    assert our_threads() == []


def test_prioritized_stream_with_a_beta_schedule_and_priority_feedback(prefetch, kernels):
    factory = EnvFactory(episode_lengths=(9, 4), ends=('terminated', 'truncated'))
    seen = []

    def beta(k):
        seen.append(k)
        return min(1.0, 0.4 + 0.01 * k)

    with make_stream(factory, prefer(0), exploration=0.3, prioritized=True, alpha=0.7,
                     beta=beta, n_step=2, gamma=0.95, prefetch=prefetch) as stream:
        assert stream.memory.prioritized and stream.memory.ring.priorities.alpha == 0.7
        batches = iter(stream)
        for _ in range(80):
            batch = next(batches)
            check_nstep_batch(batch, factory.envs, 2, 0.95)
            assert np.all((batch.weights > 0) & (batch.weights <= 1 + 1e-6))
            stream.update_priorities(batch.indices, np.abs(batch.reward) + 0.1)
    # Read once the stream is closed: the prefetch thread draws ahead until it is joined.
    stats = stream.stats()
    # beta(k) is asked once per batch drawn, in order (the prefetch thread draws ahead).
    assert seen == list(range(stats.batches_drawn))
    assert 80 <= stats.batches_drawn <= 80 + prefetch
    assert stats.stale_priority_updates == stream.memory.stale_priority_updates
    assert our_threads() == []


def test_batch_weight_norm_gives_every_batch_a_largest_weight_of_one(prefetch):
    factory = EnvFactory(episode_lengths=(9, 4), ends=('terminated', 'truncated'))
    rng = np.random.default_rng(0)
    with make_stream(factory, prefer(0), exploration=0.3, prioritized=True, beta=0.7,
                     weight_norm='batch', prefetch=prefetch) as stream:
        assert stream.sampling.weight_norm == 'batch'
        batches = iter(stream)
        spread = 0.0
        for _ in range(40):
            batch = next(batches)
            check_nstep_batch(batch, factory.envs, 1, 0.99)
            assert batch.weights.max() == pytest.approx(1.0)
            spread = max(spread, 1.0 - batch.weights.min())
            stream.update_priorities(batch.indices, rng.random(len(batch.indices)) + 1e-3)
    assert spread > 0.1          # the priorities differ, so the weights do: not all ones


@pytest.mark.parametrize('players,spi', [(1, 4.0), (3, 2.0),
                                         # 2 inserts per sample: 4800 steps, ~3 s
                                         pytest.param(2, 0.5, marks=pytest.mark.slow)])
def test_samples_per_insert_keeps_the_ratio(players, spi, prefetch):
    factory = EnvFactory()
    stream, memory = draw_logged_stream(factory, num_parallel_players=players,
                                        update_frequency=None, samples_per_insert=spi,
                                        maximum_staleness=5, init_memory_size=50,
                                        prefetch=prefetch)
    with stream:
        for k, batch in enumerate(stream, start=1):
            check_batch(batch, factory.envs, HISTORY)
            if prefetch:
                # Read the counts while the prefetch thread is idle (its buffer full), not
                # between its admitting a batch and counting it drawn.
                assert stream.prefetcher.wait_full(timeout=60)
            lim = stream.rate_limiter
            s = lim.stats()
            # Every batch drawn was admitted: the diff stays in the limiter's band.
            assert lim.min_diff <= s.diff <= lim.max_diff
            drawn = stream.stats().batches_drawn
            assert s.samples == 16 * drawn and k <= drawn <= k + prefetch
            if k == 150:
                break
        measured = stream.stats().samples_per_insert
    # At every draw, the transitions in the memory (past the fill's, of which at most
    # maximum_staleness were pending when it ended) carry the samples drawn so far, within
    # the limiter's buffer; and the requests did not run ahead of them by more than that.
    slack = lim.error_buffer + 16 + spi * (5 + 1)
    for written, _, k in memory.draws:
        inserted = written - stream.fill_steps
        assert abs(inserted * spi - 16 * k) <= slack, (k, inserted)
    assert measured == pytest.approx(spi, rel=0.15)
    assert our_threads() == []


@pytest.mark.parametrize('kwargs,error,name', [
    (dict(samples_per_insert=4.0), ValueError, 'update_frequency'),       # both given
    (dict(update_frequency=None), ValueError, 'update_frequency'),        # neither
    (dict(update_frequency=None, samples_per_insert=0.0), ValueError, 'samples_per_insert'),
    (dict(n_step=0), ValueError, 'n_step'),
    (dict(gamma=0.0), ValueError, 'gamma'),
    (dict(beta=1.5), ValueError, 'beta'),
    (dict(prioritized=True, alpha=2.0), ValueError, 'alpha'),
    (dict(prioritized='yes'), TypeError, 'prioritized'),
])
def test_bad_rainbow_arguments(kwargs, error, name):
    with pytest.raises(error, match=name):
        make_stream(EnvFactory(), **kwargs)


def test_one_batch_type_whatever_the_settings():
    # The same SampleBatch fields from a plain 1-step uniform stream as from n-step and
    # prioritized ones: a training loop written for one works for the others.
    for settings in ({}, {'n_step': 3}, {'prioritized': True}):
        with make_stream(EnvFactory(), gamma=0.9, **settings) as stream:
            batch = next(iter(stream))
        assert isinstance(batch, SampleBatch), settings
        assert batch.state.shape == batch.next_state.shape == (16, 6, HISTORY)
    with make_stream(EnvFactory(), gamma=0.9) as stream:
        batch = next(iter(stream))
    np.testing.assert_array_equal(batch.weights, 1.0)
    np.testing.assert_allclose(batch.discount, np.where(batch.is_over, 0.0, 0.9))


def test_tensorpack_format_keeps_the_4_list():
    with make_stream(EnvFactory(), gamma=0.9, batch_format='tensorpack') as stream:
        batch = next(iter(stream))
    assert isinstance(batch, list) and len(batch) == 4
    assert batch[0].shape == (16, 6, HISTORY + 1)
    with pytest.raises(ValueError, match="batch_format='tensorpack' can not carry n-step"):
        make_stream(EnvFactory(), n_step=2, batch_format='tensorpack')   # no discount in it
    with pytest.raises(ValueError, match='batch_format'):
        make_stream(EnvFactory(), batch_format='comb')
    with make_stream(EnvFactory(), gamma=0.9) as stream:
        batch = next(iter(stream))
    with pytest.raises(ValueError, match='prioritized'):
        stream.update_priorities([0], [1.0])


def test_the_n_step_check_refuses_a_walk_off_by_one_and_a_bootstrapped_end():
    # The check every n-step batch above passes catches the defects a short learning run
    # can not tell from noise (tests/examples/test_dqn_minatar_jax.py): the walk stopped a
    # step short with the bootstrap still discounted by gamma^n, and a terminal window's
    # discount left at gamma^k.
    factory = EnvFactory(episode_lengths=(7, 2, 12, 1), ends=('terminated', 'truncated'))
    with make_stream(factory, prefer(1), exploration=0.5, n_step=3, gamma=0.9,
                     prefetch=0) as stream:
        take(iter(stream), 30)
    memory, rng = stream.memory, np.random.default_rng(0)
    good = memory.sample(64, n_step=3, gamma=0.9, rng=rng)
    assert check_nstep_batch(good, factory.envs, 3, 0.9) == 64
    short = memory.sample(64, n_step=2, gamma=0.9, rng=rng)
    short = short._replace(discount=short.discount * 0.9)
    with pytest.raises(AssertionError):
        check_nstep_batch(short, factory.envs, 3, 0.9)
    assert np.any(good.is_over)
    bootstrapped = good._replace(discount=np.where(good.is_over, 0.9, good.discount))
    with pytest.raises(AssertionError):
        check_nstep_batch(bootstrapped, factory.envs, 3, 0.9)


def test_priorities_fed_back_through_the_stream_shape_its_next_draws():
    # The learner's |TD| fed back to the stream decides what is drawn: once half of the
    # transitions drawn so far get priority 1 and the other half 1e-4, nearly every draw is
    # from the first half or the rest of the memory (a draw's indices are the memory's own
    # ids: no arithmetic on them). Ignored priorities would draw from the second half often,
    # inverted ones nearly always (none, against 13 ignored and 37 inverted
    # of these 48 draws).
    with make_stream(EnvFactory(), prefer(0), exploration=0.3, prioritized=True, beta=0.4,
                     num_parallel_players=1, prefetch=0, seed=3) as stream:
        batches = iter(stream)
        seen = np.unique(np.concatenate([batch.indices for batch in take(batches, 40)]))
        low = seen[len(seen) // 2:]
        stream.update_priorities(seen, np.where(np.isin(seen, low), 1e-4, 1.0))
        drawn = np.concatenate([next(batches).indices for _ in range(3)])
    assert len(low) > 50
    from_low = int(np.isin(drawn, low).sum())
    assert from_low <= 4, f"{from_low} of {len(drawn)} draws from the transitions given 1e-4"
