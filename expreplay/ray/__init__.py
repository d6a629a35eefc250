"""Environment actors on Ray: a gymnasium ``VectorEnv`` whose sub-envs live in Ray actors.

:class:`RayVectorEnv` is an ordinary player for :class:`~expreplay.EnvRunner` (and everything built
on it): the replay memory and the Q-network stay in the learner's process (SEED-style: no weights
are shipped), and only observations, rewards and flags come back, one numpy array per actor and
step. Each actor steps ``envs_per_actor`` environments made by ``make_env`` inside the actor.

Two ways to drive it:

* sync (gymnasium): ``reset()``, ``step(actions)`` for all ``num_envs`` envs at once;
* async (EnvPool-style, ``is_async = True``): ``async_reset()``, then ``recv()`` returns the envs
  of the actors whose results are ready (with ``info['env_id']``) and ``send(actions, env_id)``
  sends their next actions, so a learner keeps several actors in flight and never waits on the
  slowest.

Both autoreset in NEXT_STEP mode: the step after an env's episode ended resets it, ignores its
action and returns its reset observation, reward 0, both flags False.

Faults: an actor whose process dies, whose env raises, whose node goes away, or that does not
answer within ``step_timeout``, is restarted by Ray (up to ``max_restarts`` times over its life);
its envs then come back with ``info['restarted']`` True and the first observation of a new
episode (the learner ends the interrupted episodes there: nothing bootstraps across the gap);
``actor_restarts`` counts the restarts. Past the budget, ``step``/``recv`` raise
:class:`ActorFailedError`, chained to Ray's (or the env's) error.

The pieces: :mod:`~expreplay.ray._host` runs inside an actor (its envs and their autoreset),
:mod:`~expreplay.ray._fleet` is the driver's side of the actors (starting them, requests in
flight, the restart and timeout policy), :mod:`~expreplay.ray.vector_env` the gymnasium API.

Ray is imported when this package is; ``import expreplay`` does not import it.
"""

from .._extras import extra_import_error

try:
    import gymnasium  # noqa: F401
    import ray  # noqa: F401
except ImportError as err:
    raise extra_import_error('RayVectorEnv', 'ray', err) from err

from .errors import ActorFailedError, EnvBuildError
from .vector_env import RayVectorEnv

__all__ = ['RayVectorEnv', 'ActorFailedError', 'EnvBuildError']
