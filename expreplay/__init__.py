"""expreplay: a threaded experience-replay population module for DQN-family training.

``import expreplay`` loads numpy only. The tensorpack integration (:class:`ExpReplay`) imports
TensorFlow and tensorpack when it is first touched; :class:`RayVectorEnv` imports Ray likewise.
An integration whose extra is not installed raises ImportError naming the extra to install.
:func:`info` (or ``python -m expreplay``) reports the version, the active optional C kernels and
the importable extras.
"""

import importlib

from .storage import CheckpointError, DrawSettings, Experience, LaneWriter, ReplayMemory

__version__ = '0.1.0'

# name -> module that defines it; imported on first use (PEP 562), so that importing the
# package never pulls in TensorFlow, and the runner machinery only when it is used.
_LAZY = {
    'EnvRunner': '.acting',
    'EnvRunnerManager': '.acting',
    'RunnerSettings': '.acting',
    'ManagerSettings': '.acting',
    'ExpReplay': '.tensorpack_io',
    'MemoryCheckpoints': '.tensorpack_io',
    'ReplayStream': '.stream',
    'Sampling': '.stream',
    'MemoryCheckpoint': '.stream',
    'Population': '.acting.population',
    'EpisodeStart': '.acting.episodes',
    'ProceduralSeeds': '.acting.episodes',
    'FixedSeed': '.acting.episodes',
    'SeedList': '.acting.episodes',
    'Curriculum': '.acting.episodes',
    'RestartPool': '.acting.episodes',
    'EpisodeRecord': '.acting.episodes',
    'EpisodeLog': '.acting.episodes',
    'read_episode_log': '.acting.episodes',
    'export_minari': '.minari_io',
    'load_minari': '.minari_io',
    'RayVectorEnv': '.ray',
    'info': '._info',
    'require_extra': '._extras',
}

__all__ = ['CheckpointError', 'DrawSettings', 'Experience', 'LaneWriter', 'ReplayMemory'] + list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
