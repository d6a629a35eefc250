"""Build of expreplay's optional C kernels; the package's metadata is in pyproject.toml.

Each kernel is optional: without a compiler (or with one that fails) the install still succeeds
and the module falls back to numpy. `python -m expreplay` says which kernels are active;
expreplay/_kernels.py lists them.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        # The sampler (the uniform draw, the n-step walk, both states in one pass);
        # fallback: numpy in expreplay/storage/memory.py and expreplay/storage/_gather.py.
        Extension('expreplay.storage._gather_ext', ['expreplay/storage/_gather_ext.c'], optional=True),
        # The ring's common writes (a single lane's add_step and start_episode, a step of many
        # lanes); fallback: numpy in expreplay/storage/ring.py and writers.py.
        Extension('expreplay.storage._write_ext', ['expreplay/storage/_write_ext.c'], optional=True),
        # An acting step's draws, greedy actions, state rows and frame histories; fallback:
        # numpy in expreplay/acting/policy.py, envs/frames.py and lanes.py.
        Extension('expreplay.acting._acting_ext', ['expreplay/acting/_acting_ext.c'], optional=True),
        # The priority tree's descent and updates; fallback: numpy in expreplay/storage/priority.py,
        # a few numpy calls per tree level.
        Extension('expreplay.storage._tree_ext', ['expreplay/storage/_tree_ext.c'], optional=True),
    ],
)
