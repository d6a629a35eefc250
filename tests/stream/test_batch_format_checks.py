"""``batch_format='tensorpack'`` where the 4-list can not carry what is asked (n-step returns,
prioritized replay) is refused, naming ``batch_format`` and why, instead of silently handing
out SampleBatch tuples to a loop that unpacks four items."""

import pytest

from expreplay import ReplayMemory
from expreplay.stream import Sampling
from test_stream import HISTORY, EnvFactory, make_stream, our_threads


def test_n_step_with_the_tensorpack_format_is_refused_when_the_sampling_is_built():
    with pytest.raises(ValueError, match=r"batch_format='tensorpack' can not carry n-step "
                       r"returns \(n_step=3\).*no discount.*batch_format='transitions'"):
        Sampling(32, 4, n_step=3, batch_format='tensorpack')
    Sampling(32, 4, n_step=3)                                  # the default format carries it
    Sampling(32, 4, n_step=1, batch_format='tensorpack')


def test_a_prioritized_memory_with_the_tensorpack_format_is_refused_before_any_batch():
    sampling = Sampling(16, 4, batch_format='tensorpack')
    with pytest.raises(ValueError, match=r"batch_format='tensorpack' can not carry prioritized "
                       r"replay.*no indices.*no importance weights.*batch_format='transitions'"):
        sampling.check_memory(ReplayMemory(100, (6,), HISTORY, prioritized=True))
    sampling.check_memory(ReplayMemory(100, (6,), HISTORY))
    Sampling(16, 4).check_memory(ReplayMemory(100, (6,), HISTORY, prioritized=True))


def test_a_stream_of_tensorpack_batches_from_a_prioritized_memory_hands_out_none():
    stream = None
    try:
        with pytest.raises(ValueError, match=r"batch_format='tensorpack'.*prioritized"):
            # Refused when the stream is built, or at the latest at the first draw.
            stream = make_stream(EnvFactory(), prioritized=True, batch_format='tensorpack',
                                 prefetch=0)
            next(iter(stream))
        if stream is not None:
            with pytest.raises(ValueError, match='batch_format'):
                stream.sample()
    finally:
        if stream is not None:
            stream.close()
    assert our_threads() == []
