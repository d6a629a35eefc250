"""The stream's watches: epsilon left at 1.0 (the players never use the predictor) is warned
about early when nothing can ever lower it, and weights bound into the predictor once
(``lambda s, p=params: ...``) are warned about, once, without alarming the loops that do it
right."""

import functools
import warnings

import numpy as np
import pytest

from expreplay.stream import watch
from test_stream import EnvFactory, make_stream, our_threads, prefer


def drawn(stream, n, between=None):
    """Draw ``n`` batches (calling ``between(k)`` after batch k); the RuntimeWarnings raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        batches = iter(stream)
        for k in range(n):
            next(batches)
            if between is not None:
                between(k)
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def random_play(messages):
    return [m for m in messages if 'exploration 1.0' in m]


def frozen(messages):
    return [m for m in messages if 'weights bound into it never changed' in m]


# ------------------------------------------------------------------------- random play
def test_epsilon_never_lowered_from_the_default_is_warned_after_1000_batches():
    # Population's default exploration 1.0, nothing assigned: nothing will ever lower it.
    assert watch.RANDOM_PLAY_UNSET_WARNING_BATCHES == 1_000
    with make_stream(EnvFactory(), prefer(1), num_parallel_players=1, prefetch=0) as stream:
        assert random_play(drawn(stream, 990)) == []
        messages = random_play(drawn(stream, 200))
    assert len(messages) == 1
    assert messages[0].startswith('ReplayStream: 1000 batches drawn since the initial fill')
    assert 'Population(exploration=lambda steps:' in messages[0]     # the fix
    assert 'stream.exploration' in messages[0]
    assert our_threads() == []


@pytest.mark.parametrize('how', ['schedule', 'assigned-before', 'assigned-each-batch'])
def test_a_schedule_or_an_assigned_epsilon_at_1_is_not_warned_early(monkeypatch, how):
    # A schedule holding 1.0 past the fill, or a loop assigning 1.0 for now (tensorpack's
    # epoch-based ScheduledHyperParamSetter assigns 1.0 before training, lowers it after the
    # first epoch): waited for up to RANDOM_PLAY_WARNING_BATCHES, not the early 1,000.
    monkeypatch.setattr(watch, 'RANDOM_PLAY_UNSET_WARNING_BATCHES', 20)
    monkeypatch.setattr(watch, 'RANDOM_PLAY_WARNING_BATCHES', 200)
    exploration = (lambda steps: 1.0) if how == 'schedule' else 1.0
    with make_stream(EnvFactory(), prefer(1), exploration=exploration, num_parallel_players=1,
                     prefetch=0) as stream:
        if how == 'assigned-before':
            stream.exploration = 1.0

        def assign(k):
            if how == 'assigned-each-batch':
                stream.exploration = 1.0
        assert random_play(drawn(stream, 150, assign)) == []
        messages = random_play(drawn(stream, 100, assign))
    assert len(messages) == 1 and messages[0].startswith('ReplayStream: 200 batches')


def test_the_late_rule_waits_past_tensorpacks_first_epoch_at_epsilon_1():
    # tensorpack's DQN.py: 25,000 batches per epoch, epsilon 1.0 for the first one.
    assert watch.RANDOM_PLAY_WARNING_BATCHES > 100_000 // 4


# ------------------------------------------------------------------------- frozen weights
W0 = np.float32([0.0, 1.0, 0.5])


def q_of(w, states):
    return np.tile(np.asarray(w, np.float32), (len(states), 1))


@pytest.fixture
def soon(monkeypatch):
    monkeypatch.setattr(watch, 'FROZEN_PREDICTOR_WARNING_BATCHES', 40)


def frozen_run(predictor, between=None, n=80, exploration=0.5):
    with make_stream(EnvFactory(), predictor, exploration=exploration, num_parallel_players=1,
                     prefetch=0) as stream:
        messages = frozen(drawn(stream, n, None if between is None else
                                (lambda k: between(stream, k))))
    assert our_threads() == []
    return messages


def test_weights_bound_as_a_default_argument_and_rebound_by_the_loop_warn_once(soon):
    w = W0.copy()

    def learn(stream, k):
        nonlocal w
        w = w + 0.01        # the learner's new weights: the predictor never sees them

    messages = frozen_run(lambda s, w=w: q_of(w, s), learn, n=200)
    assert len(messages) == 1
    message = messages[0]
    assert 'the same predictor for 40 batches' in message
    assert 'default argument w: 1 array, 3 numbers' in message          # what was found
    assert 'stream.predictor = lambda s, p=params' in message           # the fixes
    assert 'updated in place' in message


def test_weights_bound_by_functools_partial_warn(soon):
    assert len(frozen_run(functools.partial(q_of, W0.copy()))) == 1


def test_a_closure_over_weights_that_are_never_rebound_warns(soon):
    def make_predictor(params):
        return lambda s: q_of(params['w'], s)
    messages = frozen_run(make_predictor({'w': W0.copy(), 'b': W0.copy()}))
    assert len(messages) == 1 and 'closure variable params: 2 arrays, 6 numbers' in messages[0]


def test_jax_parameters_bound_as_a_default_argument_warn(soon):
    jax = pytest.importorskip('jax')
    params = {'w': jax.numpy.asarray(W0), 'b': jax.numpy.zeros(3)}

    def learn(stream, k):
        nonlocal params
        params = jax.tree_util.tree_map(lambda x: x + 0.01, params)

    apply = jax.jit(lambda p, s: p['w'] + p['b'] + 0.0 * s.sum())
    messages = frozen_run(lambda s, p=params: np.tile(np.asarray(apply(p, s[:1])), (len(s), 1)),
                          learn)
    assert len(messages) == 1 and 'default argument p: 2 arrays, 6 numbers' in messages[0]


def test_the_right_ways_to_give_new_weights_are_not_warned(soon):
    # 1. A new predictor with the new weights bound, assigned as they change (every 10 batches).
    w = W0.copy()

    def reassign(stream, k):
        nonlocal w
        w = w + 0.01
        if k % 10 == 0:
            stream.predictor = lambda s, w=w: q_of(w, s)
    assert frozen_run(lambda s, w=w: q_of(w, s), reassign) == []

    # 2. numpy weights bound once but updated in place.
    v = W0.copy()

    def in_place(stream, k):
        v[:] += 0.01
    assert frozen_run(lambda s, v=v: q_of(v, s), in_place) == []

    # 3. A closure over a variable the loop rebinds (the cell changes).
    params = {'w': W0.copy()}
    predictor = lambda s: q_of(params['w'], s)  # noqa: E731

    def rebind(stream, k):
        nonlocal params
        params = {'w': params['w'] + 0.01}
    assert frozen_run(predictor, rebind) == []

    # 4. An object whose __call__ reads weights the loop reassigns.
    class Greedy:
        def __init__(self):
            self.w = W0.copy()

        def __call__(self, s):
            return q_of(self.w, s)
    assert frozen_run(Greedy()) == []


def test_frozen_weights_are_not_warned_while_the_players_never_use_them(soon):
    # Epsilon 1.0: the predictor is not called (the random-play watch speaks for that).
    assert frozen_run(lambda s, w=W0.copy(): q_of(w, s), exploration=1.0) == []


def test_frozen_weights_wait_for_the_threshold():
    assert watch.FROZEN_PREDICTOR_WARNING_BATCHES == 20_000
    assert watch.bound_weights(lambda s, w=W0.copy(), eps=1e-3, xp=np, mask=np.int8([1, 0]): s)[0][0] \
        == 'default argument w'
    assert watch.bound_weights(lambda s, xp=np, mask=np.int8([1, 0]), eps=np.float32(1e-3): s) == []
