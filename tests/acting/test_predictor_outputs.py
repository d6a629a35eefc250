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
