"""The errors a :class:`~expreplay.ray.RayVectorEnv` raises for its actors."""

__all__ = ['ActorFailedError', 'EnvBuildError']


class ActorFailedError(RuntimeError):
    """An env actor failed past its restart budget (or could not be brought back in time).

    ``actor`` is the actor's index; the exception is chained to Ray's error (or the env's).
    """

    def __init__(self, message: str, actor: int) -> None:
        super().__init__(message)
        self.actor = actor


class EnvBuildError(ValueError):
    """``make_env`` failed (or built something that is not a usable env) inside an actor."""
