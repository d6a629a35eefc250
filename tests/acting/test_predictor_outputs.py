"""A predictor's outputs that can not be read as Q-values: the error says what came and what to
return (a ``(n, num_actions)`` array, or tensorpack's ``[Q, ...]``)."""

import numpy as np
import pytest

from expreplay import ReplayMemory
from expreplay.acting import EnvRunner, EnvRunnerManager, PredictorError
from expreplay.acting.policy import as_q_values
from acting_helpers import H, step_until_raises
from acting_helpers import kernels, no_thread_left_behind  # noqa: F401 (fixtures)
from scripted_env import ScriptedEnv


def rows_of(n):
    """``list(q)``: a Python list of the Q-value array's rows."""
    return list(np.zeros((n, 3), np.float32))


def test_a_list_of_row_arrays_is_refused_naming_what_to_return():
    with pytest.raises(PredictorError) as info:
        as_q_values(rows_of(4))
    message = str(info.value)
    assert 'a Python list of 4 items whose first is ndarray of shape (3,)' in message
    assert 'list(q)' in message                              # what was returned
    assert 'one array of shape (n_states, num_actions)' in message   # what to return
    assert "[q, ...] as tensorpack's predictors do" in message
    # What is accepted stays accepted: the array, and tensorpack's [Q, ...].
    q = np.zeros((4, 3))
    assert as_q_values(q) is q and as_q_values([q, 'other output']) is q


@pytest.mark.parametrize('n_runners', [1, 3], ids=['inline', 'threads'])
def test_a_runner_whose_predictor_returns_list_of_rows_says_so(n_runners, kernels):
    mem = ReplayMemory(200, (6,), H)
    runners = [EnvRunner(ScriptedEnv(i), lambda s: rows_of(len(s)), mem, H, index=i)
               for i in range(n_runners)]
    with pytest.raises(PredictorError, match=r"whose first is ndarray of shape \(3,\) \(one row "
                       r"of Q-values per item, as list\(q\).*\(n_states, num_actions\)"):
        with EnvRunnerManager(runners, 2) as mgr:
            step_until_raises(mgr)


# PyTorch tensors: read as their values, whatever they carry (the policy imports no torch).
TORCH_OUTPUTS = {
    'tensor': lambda torch, q: torch.from_numpy(q),
    'requires-grad': lambda torch, q: torch.from_numpy(q).requires_grad_() * 1.0,
    'bfloat16': lambda torch, q: torch.from_numpy(q).to(torch.bfloat16),
    'tensorpack-list': lambda torch, q: [torch.from_numpy(q).requires_grad_(), 'other output'],
}


@pytest.mark.parametrize('kind', TORCH_OUTPUTS)
def test_a_torch_tensor_is_read_as_its_values(kind):
    torch = pytest.importorskip('torch', reason="the torch extra: pip install -e '.[torch]'")
    q = np.array([[0.5, 2.0, -1.0], [3.0, 0.25, 1.0]], np.float32)   # exact in bfloat16 too
    out = TORCH_OUTPUTS[kind](torch, q)
    got = as_q_values(out)
    assert isinstance(got, np.ndarray), type(got)
    np.testing.assert_array_equal(got, q)


def test_the_policy_module_does_not_import_torch():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, '-c', 'import sys, expreplay.acting.policy; '
                          'print("torch" in sys.modules)'], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == 'False', out.stderr[-2000:]


def grad_tracking_predictor(torch, greedy_action):
    """Q-values from a forward without ``no_grad`` (the tensor requires grad) that make
    ``greedy_action`` the greedy one for every state."""
    bias = torch.nn.Parameter(torch.zeros(3))

    def predict(states):
        q = torch.zeros(len(states), 3) + bias      # requires grad, as a module's output does
        return q + torch.nn.functional.one_hot(torch.tensor(greedy_action), 3).float()
    return predict


@pytest.mark.parametrize('n_runners', [1, 3], ids=['inline', 'threads'])
def test_runners_act_on_a_predictor_returning_a_tensor_that_requires_grad(n_runners, kernels):
    torch = pytest.importorskip('torch', reason="the torch extra: pip install -e '.[torch]'")
    mem = ReplayMemory(500, (6,), H)
    envs = [ScriptedEnv(i) for i in range(n_runners)]
    runners = [EnvRunner(env, grad_tracking_predictor(torch, 2), mem, H, index=i)
               for i, env in enumerate(envs)]
    with EnvRunnerManager(runners, 2) as mgr:
        for _ in range(60):
            mgr.step(0.0)       # greedy only: every action is the predictor's argmax
    actions = [t[0] for env in envs for t in env.transitions.values()]
    assert len(actions) >= 50 and set(actions) == {2}, (len(actions), sorted(set(actions)))


def test_a_stream_acts_on_a_predictor_returning_a_tensor_that_requires_grad():
    torch = pytest.importorskip('torch', reason="the torch extra: pip install -e '.[torch]'")
    from expreplay import Population, ReplayStream, Sampling
    env = ScriptedEnv(0)
    stream = ReplayStream(ReplayMemory(500, (6,), H),
                          Population(lambda: env, 1, grad_tracking_predictor(torch, 1),
                                     exploration=0.0),
                          Sampling(4, update_frequency=1), init_memory_size=10, progress=False)
    with stream:
        for i, _ in zip(range(20), stream):
            pass
    assert {t[0] for t in env.transitions.values()} == {1}
