"""TensorFlow as tensorpack's DQN examples use it: the TF1 graph API, quiet at start-up.

``from tf_setup import tf`` gives ``tensorflow.compat.v1`` with eager execution off (tensorpack's
trainer runs a TF1 graph anyway) and tf-keras 2 behind ``tf.layers`` (``TF_USE_LEGACY_KERAS``,
set here before TensorFlow is imported). What TensorFlow prints at start-up that a user can do
nothing about (absl's notice, "no CUDA drivers" on a CPU machine, the CPU instruction notice) is
kept off the terminal; errors are not. Set ``TF_CPP_MIN_LOG_LEVEL`` to see everything.
"""

if __name__ == '__main__':   # a module the examples import, not a program: --help says so
    import module_help
    module_help.answer(__doc__, 'tf_setup.py', 'the tensorpack examples')

import logging
import os
import re
import sys
import tempfile

os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')   # tensorpack needs tf.layers (tf-keras 2)

# TensorFlow's start-up lines a user can do nothing about: absl's notice about logging before
# its initialisation, "no CUDA drivers" on a CPU machine (and its cuInit error), the CPU
# instruction notice and its continuation line. Other C++ messages at INFO and WARNING level
# printed during the import are dropped too; errors are not.
_TF_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IW]\d{4} \S+ +\d+ \S+:\d+\] .*"
    r"|E\d{4} \S+ +\d+ cuda_platform\.cc:\d+\] failed call to cuInit.*"
    r"|To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags\.)$")


def _import_tensorflow_quietly():
    """``import tensorflow``, with its start-up noise kept off the terminal.

    The noise comes from C++ before TensorFlow's own log level applies, so stderr (the file
    descriptor) is redirected into a temporary file during the import, and what is not noise
    is written back. ``TF_CPP_MIN_LOG_LEVEL`` (2 unless set) quiets what TensorFlow logs later;
    a user who sets it sees everything, unfiltered.
    """
    if 'tensorflow' in sys.modules or 'TF_CPP_MIN_LOG_LEVEL' in os.environ:
        import tensorflow
        return tensorflow
    os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode='w+b') as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow
            # Probing the devices now makes the CUDA platform report a missing driver here
            # (once), not in the middle of the training's first lines.
            tensorflow.config.list_physical_devices('GPU')
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors='replace').splitlines(True)
                    if not _TF_NOISE.match(line.rstrip('\n'))]
            sys.stderr.write(''.join(kept))
            sys.stderr.flush()
    # tensorflow.compat.v1's Python-side deprecation notices.
    tensorflow.get_logger().setLevel(logging.ERROR)
    return tensorflow


class _DropFreezeVariablesNotice(logging.Filter):
    # tensorpack's freeze_variables() warns once per target-network variable that the variable
    # getter returned a tf-keras variable; the variables are frozen all the same.
    def filter(self, record):
        return '[freeze_variables] variable getter did not return a Variable' not in str(record.msg)


tf = _import_tensorflow_quietly().compat.v1
tf.disable_eager_execution()   # a TF1 graph model, as tensorpack's trainer runs it anyway
logging.getLogger('tensorpack').addFilter(_DropFreezeVariablesNotice())
