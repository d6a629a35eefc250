"""expreplay: threaded experience replay for DQN-family training."""

from setuptools import Extension, find_packages, setup

TENSORPACK = ['tensorflow==2.21.*', 'tf-keras==2.21.*', 'tensorpack==0.11']
ATARI = ['gymnasium>=1.0', 'ale-py>=0.12', 'opencv-python-headless']
# minari's HDF5 storage needs h5py (its [hdf5] extra) and imports PIL without requiring it;
# 0.5.4 is the first release that can store uint8 frames losslessly (jpeg_encoding=False).
MINARI = ['minari[hdf5]>=0.5.4,<0.6', 'pillow']
RAY = ['ray==2.60.*', 'gymnasium>=1.0']
TEST = ['pytest>=7', 'pytest-timeout', 'tqdm', 'matplotlib']
# EnvPool's wheels exist for Python >= 3.11 on Linux; elsewhere the extra installs nothing.
ENVPOOL = ['envpool>=1.2,<1.3; python_version >= "3.11" and sys_platform == "linux"']

setup(
    name='expreplay',
    version='0.1.0',
    description='Threaded, memory-frugal experience replay for DQN (tensorpack drop-in)',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['expreplay', 'expreplay.*']),
    python_requires='>=3.9',
    install_requires=['numpy>=1.24'],
    # Optional: the channels-last gather kernel. Without a compiler the install still
    # succeeds and expreplay._gather falls back to numpy (about 4x slower for NHWC).
    # Optional too: the common case of an acting step (draws, state rows, Q-value checks, the
    # store; expreplay/acting.py falls back to numpy, slower per step for a few lanes).
    # Optional too: the priority tree's descent and updates (expreplay/priority.py falls back
    # to numpy, a few numpy calls per tree level).
    ext_modules=[Extension('expreplay._gather_ext', ['expreplay/_gather_ext.c'], optional=True),
                 Extension('expreplay._acting_ext', ['expreplay/_acting_ext.c'], optional=True),
                 Extension('expreplay._tree_ext', ['expreplay/_tree_ext.c'], optional=True)],
    extras_require={
        'atari': ATARI,
        'tensorpack': TENSORPACK + ['tqdm'],
        'minari': MINARI,
        'ray': RAY,
        'test': TEST,
        'envpool': ENVPOOL,
        'all': ATARI + TENSORPACK + MINARI + RAY + ENVPOOL + TEST,
    },
    license='Apache-2.0',
)
