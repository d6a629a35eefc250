"""expreplay: threaded experience replay for DQN-family training."""

from setuptools import Extension, find_packages, setup

TENSORPACK = ['tensorflow==2.21.*', 'tf-keras==2.21.*', 'tensorpack==0.11']
ATARI = ['gymnasium>=1.0', 'ale-py>=0.12', 'opencv-python-headless']
# minari's HDF5 storage needs h5py (its [hdf5] extra) and imports PIL without requiring it;
# 0.5.4 is the first release that can store uint8 frames losslessly (jpeg_encoding=False).
MINARI = ['minari[hdf5]>=0.5.4,<0.6', 'pillow']
RAY = ['ray==2.60.*', 'gymnasium>=1.0']
TEST = ['pytest>=7', 'pytest-timeout', 'tqdm', 'matplotlib']

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
    ext_modules=[Extension('expreplay._gather_ext', ['expreplay/_gather_ext.c'], optional=True)],
    extras_require={
        'atari': ATARI,
        'tensorpack': TENSORPACK + ['tqdm'],
        'minari': MINARI,
        'ray': RAY,
        'test': TEST,
        'all': ATARI + TENSORPACK + MINARI + RAY + TEST,
    },
    license='Apache-2.0',
)
