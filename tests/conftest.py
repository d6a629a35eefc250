"""Shared test setup.

tensorpack 0.11 needs ``tf.layers``, which current TensorFlow provides only when
``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is first imported. Set it here, before any
test module can import TensorFlow, so the order in which pytest imports modules can not matter.
"""

import os

os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
