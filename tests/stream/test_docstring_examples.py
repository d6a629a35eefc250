"""The code examples of the stream's docstrings (``::`` blocks of replay_stream.py and
sampling.py) run as written, scaled down: the sizes they name are shrunk to a small scripted
stream, and the loop is cut after a few batches. A batch unpacked as the wrong format fails."""

import ast
import itertools
import textwrap

import numpy as np
import pytest

from expreplay import ReplayMemory as RealReplayMemory
from expreplay.stream import Population as RealPopulation
from expreplay.stream import ReplayStream as RealReplayStream
from expreplay.stream import Sampling as RealSampling
from expreplay.stream import replay_stream, sampling
from test_stream import HISTORY, EnvFactory, our_threads, prefer

BATCH = 16
BATCHES = 30      # batches a docstring's loop gets before the stream ends it


def examples(module):
    """``(where, code)`` of every ``::`` literal block of ``module``'s docstrings."""
    tree = ast.parse(open(module.__file__, encoding='utf-8').read())
    nodes = [tree] + [n for n in ast.walk(tree)
                      if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    found = []
    for node in nodes:
        doc = ast.get_docstring(node, clean=True)
        if not doc:
            continue
        lines = doc.splitlines()
        for i, line in enumerate(lines):
            if not line.rstrip().endswith('::'):
                continue
            block, j = [], i + 1
            while j < len(lines) and (not lines[j].strip() or lines[j].startswith((' ', '\t'))):
                block.append(lines[j])
                j += 1
            code = textwrap.dedent('\n'.join(block)).strip('\n')
            if code:
                found.append((f"{module.__name__}:{getattr(node, 'name', 'module')}", code))
    return found


EXAMPLES = examples(replay_stream) + examples(sampling)


class Learner:
    """The names a docstring's loop calls: checks what it is given is a batch's."""

    def __init__(self):
        self.calls = 0

    def train_on(self, state, action, reward, next_state, discount):
        assert state.shape == next_state.shape and state.shape[:2] == (BATCH, 6), next_state.shape
        assert action.shape == reward.shape == discount.shape == (BATCH,)
        assert np.issubdtype(action.dtype, np.integer)
        assert ((discount >= 0) & (discount <= 1)).all()
        self.calls += 1

    def q_next_max(self, next_state):
        assert next_state.shape[:2] == (BATCH, 6)
        return np.zeros(len(next_state), np.float32)

    def update(self, state, action, target, weights):
        assert state.shape[:2] == (BATCH, 6) and target.shape == weights.shape == (BATCH,)
        self.calls += 1


def scaled_namespace(learner):
    """The library's names, scaled down to the scripted env (6 numbers per frame)."""
    def ReplayMemory(max_size, state_shape, history_len=HISTORY, *args, **kwargs):
        return RealReplayMemory(600, (6,), history_len, *args, **kwargs)

    def Population(get_player, num_players=1, predictor=None, **kwargs):
        return RealPopulation(get_player, min(num_players, 2), predictor, **kwargs)

    def Sampling(batch_size, *args, **kwargs):
        return RealSampling(BATCH, *args, **kwargs)

    class ReplayStream(RealReplayStream):
        def __init__(self, memory, population, sampling, init_memory_size=0, **kwargs):
            super().__init__(memory, population, sampling, min(init_memory_size, 100),
                             progress=False, **kwargs)

        def __iter__(self):
            return itertools.islice(super().__iter__(), BATCHES)

    return dict(ReplayMemory=ReplayMemory, Population=Population, Sampling=Sampling,
                ReplayStream=ReplayStream, make_env=EnvFactory(), my_model=prefer(1),
                memory=ReplayMemory(None, None), population=Population(EnvFactory(), 2, prefer(1)),
                train_on=learner.train_on, q_next_max=learner.q_next_max, update=learner.update,
                np=np)


def test_the_docstrings_have_their_examples():
    where = [w for w, _ in EXAMPLES]
    assert where.count('expreplay.stream.replay_stream:module') == 2, where
    assert 'expreplay.stream.sampling:Sampling' in where, where


@pytest.mark.parametrize('where, code', EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_a_docstring_example_runs_on_the_default_batches(where, code):
    learner = Learner()
    exec(compile(code, where, 'exec'), scaled_namespace(learner))
    assert learner.calls == BATCHES, (where, learner.calls)
    assert our_threads() == []
