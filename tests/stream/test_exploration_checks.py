"""An exploration schedule that can not be called as ``exploration(steps)`` is refused where it
is given (Population(exploration=...), ``stream.exploration = ...``), naming ``exploration`` and
the expected signature, instead of a bare TypeError at the first step request."""

import functools

import pytest

from expreplay import Population
from test_stream import EnvFactory, make_stream, our_threads, prefer

WRONG_ARITY = [pytest.param(lambda: 0.1, id='no-argument'),
               pytest.param(lambda steps, total: 0.1, id='two-arguments'),
               pytest.param(functools.partial(lambda a, b, c: 0.1, 1), id='partial-of-two')]
EXPECTED = r"exploration must be a number in \[0, 1\] or a schedule of the steps stored.*" \
           r"can not be called as exploration\(steps\)"


@pytest.mark.parametrize('bad', WRONG_ARITY)
def test_a_schedule_of_the_wrong_arity_is_refused_by_the_population(bad):
    with pytest.raises(TypeError, match=EXPECTED):
        Population(EnvFactory(), 1, exploration=bad)


@pytest.mark.parametrize('bad', WRONG_ARITY)
def test_a_schedule_of_the_wrong_arity_is_refused_when_assigned_and_nothing_changes(bad):
    with make_stream(EnvFactory(), prefer(1), exploration=0.5, prefetch=0) as stream:
        with pytest.raises(TypeError, match=EXPECTED):
            stream.exploration = bad
        assert stream.exploration == 0.5 and stream.population.exploration_schedule is None
        next(iter(stream))                      # the stream goes on with the epsilon it had
    assert our_threads() == []


@pytest.mark.parametrize('good', [lambda steps: 0.25, lambda steps, scale=1.0: 0.25 * scale,
                                  lambda *args: 0.25, functools.partial(lambda a, s: a, 0.25)],
                         ids=['one', 'with-default', 'varargs', 'partial'])
def test_schedules_callable_with_the_steps_are_accepted(good):
    assert Population(EnvFactory(), 1, exploration=good).exploration == 0.25
