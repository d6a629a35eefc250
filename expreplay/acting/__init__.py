"""The acting layer's public names, in one import (as tensorpack's ``expreplay`` had them).

The layer itself lives in modules with one job each:

* :mod:`expreplay.acting.settings`: :class:`RunnerSettings` and :class:`ManagerSettings` (the
  typed settings of the runners and of their manager);
* :mod:`expreplay.acting.runner`: :class:`EnvRunner` (one environment and its counters);
* :mod:`expreplay.acting.group`: :class:`ActingGroup` (the one acting path: several runners'
  sub-envs stepped as one batch, their stepping state, and the env calls that start episodes),
  composing two parts that know no runner: :mod:`~expreplay.acting.policy` (the
  epsilon-greedy draws and Q-values) and :mod:`~expreplay.acting.lanes` (episodes and the
  memory writes);
* :mod:`expreplay.acting.inference`: :class:`InferenceThread` (the predictor in a thread of its own,
  merging the submissions of several simulator threads);
* :mod:`expreplay.acting.manager`: :class:`EnvRunnerManager` (which plans and builds the
  groups), made of
  :mod:`~expreplay.acting.window` (the staleness window), :mod:`~expreplay.acting.simulator` (the
  simulator threads), :mod:`~expreplay.acting.faults` (faults, restarts, the watchdog) and
  :mod:`~expreplay.acting.stats` (statistics);
* :mod:`expreplay.acting.envs`: the env adapters (gymnasium, old gym, vector envs, EnvPool, Ray);
* :mod:`expreplay.acting.starts`, :mod:`expreplay.acting.episodes` and
  :mod:`expreplay.acting.records`: how an episode starts, the schedulers that decide it, and the
  records of finished episodes;
* :mod:`expreplay.errors`: the exceptions.
"""

from .group import ActingGroup
from .runner import EnvRunner
from ..errors import CallTimeout, EnvError, ManagerClosed, PredictorError, RunnerError
from .inference import InferenceThread
from .manager import EnvRunnerManager
from .population import Population
from .settings import ManagerSettings, RunnerSettings

__all__ = ['EnvRunner', 'EnvRunnerManager', 'RunnerSettings', 'ManagerSettings', 'ActingGroup',
           'InferenceThread', 'RunnerError', 'EnvError', 'PredictorError', 'ManagerClosed',
           'CallTimeout']
