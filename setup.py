"""Build of expreplay's optional C kernels; the package's metadata is in pyproject.toml.

Each kernel is optional: without a compiler (or with one that fails) the install still succeeds
and the module falls back to numpy. `python -m expreplay` says which kernels are active.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        # The sampler (the uniform draw, the n-step walk, both states in one pass);
        # fallback: numpy in expreplay/storage/memory.py and expreplay/storage/_gather.py.
        Extension('expreplay.storage._gather_ext', ['expreplay/storage/_gather_ext.c'], optional=True),
        # The write path (a single lane's add_step; an acting step's draws, state rows,
        # Q-value checks and store); fallback: numpy in expreplay/storage/writers.py and acting.py.
        Extension('expreplay.storage._acting_ext', ['expreplay/storage/_acting_ext.c'], optional=True),
        # The priority tree's descent and updates; fallback: numpy in expreplay/storage/priority.py,
        # a few numpy calls per tree level.
        Extension('expreplay.storage._tree_ext', ['expreplay/storage/_tree_ext.c'], optional=True),
    ],
)
