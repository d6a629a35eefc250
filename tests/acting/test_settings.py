"""The acting settings records: checked when made (naming the field), frozen, given as
records only, and what a population is given is what its runners and manager act with."""

import contextlib
import dataclasses

import numpy as np
import pytest

from expreplay import (EnvRunner, EnvRunnerManager, ManagerSettings, Population, ReplayMemory,
                       RunnerSettings)
from acting_helpers import H, StepPredictor
from acting_helpers import no_thread_left_behind  # noqa: F401 (fixtures)
from scripted_env import ScriptedEnv


# ---------------------------------------------------------------------------- the records
@pytest.mark.parametrize('field,value,error', [
    ('life_loss_terminal', 'yes', TypeError),
    ('life_loss_terminal', 2, TypeError),
    ('num_actions', 0, ValueError),
    ('num_actions', 2.5, TypeError),
    ('close_player', None, TypeError),
])
def test_runner_settings_refuse_a_bad_value_naming_the_field(field, value, error):
    with pytest.raises(error, match=field):
        RunnerSettings(**{field: value})


@pytest.mark.parametrize('field,value,error', [
    ('simulator_threads', 0, ValueError),
    ('simulator_threads', 1.5, TypeError),
    ('simulator_threads', True, TypeError),
    ('max_inference_batch', 0, ValueError),
    ('max_restarts', -1, ValueError),
    ('close_timeout', -1, ValueError),
    ('close_timeout', float('nan'), ValueError),
    ('call_timeout', 0, ValueError),
    ('call_timeout', 'soon', TypeError),
    ('thread_context', 'nullcontext', TypeError),
])
def test_manager_settings_refuse_a_bad_value_naming_the_field(field, value, error):
    with pytest.raises(error, match=field):
        ManagerSettings(**{field: value})


def test_values_are_stored_normalised():
    runner = RunnerSettings(life_loss_terminal=np.bool_(True), num_actions=np.int64(4), close_player=0)
    assert (runner.life_loss_terminal, runner.num_actions, runner.close_player) == (True, 4, False)
    assert type(runner.life_loss_terminal) is bool and type(runner.num_actions) is int
    manager = ManagerSettings(simulator_threads=np.int32(2), close_timeout=60, call_timeout=float('inf'))
    assert type(manager.simulator_threads) is int and type(manager.close_timeout) is float
    assert manager.call_timeout == float('inf')


@pytest.mark.parametrize('record,misspelt', [(RunnerSettings, 'life_loss_terminals'),
                                             (ManagerSettings, 'max_restart')])
def test_a_misspelt_field_is_refused_by_name(record, misspelt):
    with pytest.raises(TypeError, match=misspelt):
        record(**{misspelt: 1})


def test_the_records_are_frozen_keyword_only_and_a_variant_is_checked_too():
    settings = ManagerSettings(close_timeout=60)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.close_timeout = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunnerSettings().life_loss_terminal = True
    with pytest.raises(TypeError):
        ManagerSettings(2)         # which setting would 2 be? keywords only
    variant = dataclasses.replace(settings, max_restarts=3)
    assert (variant.close_timeout, variant.max_restarts, settings.max_restarts) == (60.0, 3, 0)
    with pytest.raises(ValueError, match='max_restarts'):
        dataclasses.replace(settings, max_restarts=-1)


# ---------------------------------------------------------------------------- given as records only
@pytest.mark.parametrize('kwargs,words', [
    (dict(runner={'life_loss_terminal': True}),
     r"runner must be a RunnerSettings \(e\.g\. RunnerSettings\(life_loss_terminal=True\)\), got dict"),
    (dict(manager={'close_timeout': 60}),
     r"manager must be a ManagerSettings \(e\.g\. ManagerSettings\(close_timeout=60\)\), got dict"),
    (dict(manager=RunnerSettings()), 'manager must be a ManagerSettings.*got RunnerSettings'),
    (dict(runner=ManagerSettings()), 'runner must be a RunnerSettings.*got ManagerSettings'),
])
def test_a_population_refuses_anything_but_the_record(kwargs, words):
    built = []
    with pytest.raises(TypeError, match=words):
        Population(lambda: built.append(1), 2, **kwargs)
    assert built == []


def test_a_runner_and_a_manager_refuse_anything_but_the_record():
    mem = ReplayMemory(100, (6,), H)
    with pytest.raises(TypeError, match='settings must be a RunnerSettings.*got dict'):
        EnvRunner(ScriptedEnv(0), None, mem, H, settings={'life_loss_terminal': True})
    with pytest.raises(TypeError, match='life_loss_terminal'):      # not a keyword of its own
        EnvRunner(ScriptedEnv(0), None, mem, H, life_loss_terminal=True)
    runners = [EnvRunner(ScriptedEnv(i), None, mem, H, index=i) for i in range(2)]
    with pytest.raises(TypeError, match='settings must be a ManagerSettings.*got dict'):
        EnvRunnerManager(runners, 2, settings={'max_restarts': 1})
    with pytest.raises(TypeError, match='max_restarts'):
        EnvRunnerManager(runners, 2, max_restarts=1)
    with pytest.raises(ValueError, match='simulator_threads must be <= 2'):    # the manager's check
        EnvRunnerManager(runners, 2, settings=ManagerSettings(simulator_threads=3))


# ---------------------------------------------------------------------------- reaching the parts
@pytest.mark.parametrize('players', [1, 2])
def test_a_populations_settings_reach_its_runners_and_manager(players, no_thread_left_behind):
    runner = RunnerSettings(life_loss_terminal=True)
    manager = ManagerSettings(max_restarts=2, close_timeout=7.5, call_timeout=30.0,
                              thread_context=contextlib.nullcontext)
    envs = []

    def get_player():
        envs.append(ScriptedEnv(len(envs), episode_lengths=10 ** 6, lives=3, life_every=4))
        return envs[-1]

    population = Population(get_player, players, StepPredictor(life_every=4), exploration=0.5,
                            maximum_staleness=2, runner=runner, manager=manager)
    assert population.runner_settings is runner and population.manager_settings is manager
    assert population.close_timeout == 7.5                   # before start: the record's
    assert population.thread_context is (contextlib.nullcontext if players == 1 else None)
    memory = ReplayMemory(500, (6,), H)
    population.start(memory)
    try:
        for _ in range(40):
            population.step(population.exploration)
        population.wait_idle()
        built = population.manager
        assert built.settings is manager and population.close_timeout == 7.5
        assert (built.max_restarts, built.close_timeout, built.call_timeout) == (2, 7.5, 30.0)
        assert [r.settings for r in population.runners] == [runner] * players
        assert all(r.life_loss_terminal for r in population.runners)
    finally:
        population.close()
    # Each life lost ends an episode in the memory: 4 steps each, a game being 3 lives.
    episodes = list(memory.episodes())
    assert len(episodes) >= 40 // 4 - players
    assert all(len(e['actions']) == 4 and e['terminations'][-1] for e in episodes)


def test_the_defaults_are_the_records():
    population = Population(lambda: ScriptedEnv(0), 1)
    assert population.runner_settings == RunnerSettings()
    assert population.manager_settings == ManagerSettings()
    assert population.close_timeout == ManagerSettings().close_timeout == 5.0
