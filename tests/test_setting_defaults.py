"""Every setting's default is written in one place.

A setting taken by two callables (``gamma`` by ``Sampling`` and ``ReplayMemory.sample``,
``layout`` by the sampling and the memory, ``close_timeout`` by a population's manager...) has
its default in one signature or settings record, the others taking None for "not given". Two
signatures that both spell out a default for the same name would drift apart, as they did.
"""

import collections
import dataclasses
import importlib
import inspect
import pkgutil

import pytest

import expreplay
from expreplay import DrawSettings, ReplayMemory
from expreplay.stream.sampling import Sampling

# Modules of records of figures, not settings: their fields' zeros mean "nothing counted yet".
FIGURES = {'expreplay.stats'}
# Names that two callables share for different things, each default said once for its thing.
DIFFERENT_THINGS = {
    # RayVectorEnv passes Ray's own actor option (restarts of a remote process); the manager's
    # is how often a runner's env is rebuilt after it raised.
    'max_restarts',
    # The count of a call (ticks, inserts, samples): "one" unless told, not a setting.
    'n',
}
# Modules whose import needs what the CI machine has but `import expreplay` does not
# (TensorFlow and tensorpack, Ray, Minari): scanned when they import.
OPTIONAL = {'expreplay.tensorpack_io', 'expreplay.ray', 'expreplay.minari_io'}


def _public_callables():
    """(qualified name, callable) of every public function, method and dataclass of the package."""
    for info in pkgutil.walk_packages(expreplay.__path__, 'expreplay.'):
        name = info.name
        if any(part.startswith('_') for part in name.split('.')[1:]) or name in FIGURES:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:
            if any(name.startswith(o) for o in OPTIONAL):
                continue
            raise
        for attr, obj in vars(module).items():
            if attr.startswith('_') or getattr(obj, '__module__', None) != name:
                continue
            if inspect.isclass(obj):
                if dataclasses.is_dataclass(obj):
                    yield f'{name}.{attr}', obj           # its fields (its __init__'s defaults)
                for method, fn in vars(obj).items():
                    if dataclasses.is_dataclass(obj) and method == '__init__':
                        continue
                    if inspect.isfunction(fn) and (method == '__init__' or not method.startswith('_')):
                        yield f'{name}.{attr}.{method}', fn
            elif inspect.isfunction(obj):
                yield f'{name}.{attr}', obj


def _defaults():
    """parameter name -> {callable: repr of its default}, for defaults that say a value (not
    None or a bare ``object()`` sentinel, which read "not given"; not a bool flag's
    False/True, whose meaning is the name's)."""
    found = collections.defaultdict(dict)
    for where, fn in _public_callables():
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            continue
        for p in params:
            default = p.default
            if (default is inspect.Parameter.empty or default is None or isinstance(default, bool)
                    or type(default) is object):
                continue
            found[p.name][where] = repr(default)
    return found


def test_no_setting_has_its_default_written_in_two_signatures():
    twice = {name: places for name, places in _defaults().items()
             if len(places) > 1 and name not in DIFFERENT_THINGS}
    assert twice == {}, "defaults written more than once: " + repr(twice)


def test_the_scan_finds_a_default_written_twice():
    """The check above would fail: a second signature defaulting gamma is found."""
    def sample_like(batch_size, gamma=0.99):
        return batch_size, gamma

    sample_like.__module__ = 'expreplay.storage.draw'
    import expreplay.storage.draw as draw_module
    draw_module.sample_like = sample_like
    try:
        found = _defaults()['gamma']
        assert 'expreplay.storage.draw.sample_like' in found
        assert 'expreplay.storage.draw.DrawSettings' in found
    finally:
        del draw_module.sample_like


def test_the_sampling_and_the_memory_read_the_draw_defaults_from_one_record():
    defaults = DrawSettings()
    sampling = Sampling(32, 4)
    assert sampling.draw_settings == defaults
    assert (sampling.n_step, sampling.gamma, sampling.layout, sampling.weight_norm) == (
        defaults.n_step, defaults.gamma, defaults.layout, defaults.weight_norm)
    memory = ReplayMemory(100, (3,), 2)
    import numpy as np
    w = memory.new_writer()
    w.start_episode(np.zeros(3, np.uint8))
    for t in range(20):
        w.add_step(0, 1.0, np.full(3, t, np.uint8))
    rng = np.random.default_rng(0)
    by_default = memory.sample(4, rng=np.random.default_rng(0))
    by_record = memory.draw(4, DrawSettings(), rng=rng)
    for a, b in zip(by_default, by_record):
        np.testing.assert_array_equal(a, b)
    # One gamma given: the others keep the record's defaults.
    assert Sampling(32, 4, gamma=0.9).draw_settings == dataclasses.replace(defaults, gamma=0.9)


@pytest.mark.parametrize('kwargs, error, match', [
    (dict(n_step=0), ValueError, 'n_step'),
    (dict(n_step=2.0), TypeError, 'n_step'),
    (dict(gamma=0.0), ValueError, 'gamma'),
    (dict(gamma='0.9'), TypeError, 'gamma'),
    (dict(layout='NWHC'), ValueError, 'layout'),
    (dict(weight_norm='max'), ValueError, 'weight_norm'),
])
def test_draw_settings_refuse_bad_values_naming_them_wherever_given(kwargs, error, match):
    with pytest.raises(error, match=match):
        DrawSettings(**kwargs)
    with pytest.raises(error, match=match):
        Sampling(32, 4, **kwargs)
    with pytest.raises(TypeError, match='weightnorm'):
        DrawSettings(weightnorm='batch')           # a misspelt setting is named
    with pytest.raises(dataclasses.FrozenInstanceError):
        DrawSettings().gamma = 0.5
