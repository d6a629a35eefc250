"""The Atari example's players: what steps the training games.

By default each player is ale-py's C++ vector env (``AtariVectorEnv``, ``--vector N`` games per
player): it steps its games in native threads that release the GIL. ale-py's single env holds
the GIL while it emulates (its ``act`` in every release from 0.10 to 0.12), so Python threads
that each step single envs take turns, and the learner, which needs the GIL too, waits for them;
``--vector 0`` asks for those single-env players all the same. ``--envpool N`` (EnvPool, C++ and
asynchronous) and ``--ray-actors N`` (envs in Ray actors, here or on a cluster) are one player
each.

With n-step or prioritized replay every step's reward is clipped to [-1, 1] before it is stored,
inside the engine where it has a switch (EnvPool's ``reward_clip``, ale-py's
``reward_clipping``), in the actors' own envs for Ray, and by a ``ClipReward`` wrapper only
around a single env: a wrapper around an engine would hide its asynchronous ``recv``/``send``
(the runner would then refuse an asynchronous EnvPool). The replay counts ``update_frequency``
in transitions stored, whatever the player, so nothing here scales it by the envs a step takes.
"""

if __name__ == '__main__':   # a module the examples import, not a program: --help says so
    import module_help
    module_help.answer(__doc__, 'atari_players.py', 'dqn_atari.py')

VECTOR_ENVS, VECTOR_PLAYERS, SINGLE_PLAYERS = 4, 2, 3   # the defaults: 2 x 4 games, or 3 games


def add_arguments(p):
    """The players' flags."""
    g = p.add_argument_group('the players (what steps the games)')
    g.add_argument('--vector', type=int, default=VECTOR_ENVS, metavar='N',
                   help=f"games per player in ale-py's C++ vector env (default {VECTOR_ENVS}): they "
                        "step in C++ threads that release the GIL, while Python threads stepping "
                        "single envs take turns (ale-py's act holds the GIL). 0: single-env players")
    g.add_argument('--players', type=int,
                   help=f'players (default: {VECTOR_PLAYERS} vector envs; {SINGLE_PLAYERS} single '
                        'envs with --vector 0)')
    g.add_argument('--simulator-threads', type=int, metavar='K',
                   help='threads stepping the players (default: one per vector env; 1 for single '
                        "envs, which overlaps one group's env steps with the other's forward pass)")
    g.add_argument('--envpool', type=int, default=0, metavar='N',
                   help='use one EnvPool of N envs instead (pip install envpool; Python >= 3.11), '
                        'asynchronous: the predictor runs on one half while EnvPool steps the other')
    g.add_argument('--ray-actors', type=int, default=0, metavar='N',
                   help='step the envs in N Ray actors (expreplay.RayVectorEnv, one player of N x '
                        '--envs-per-actor envs); the replay and the CNN stay in this process')
    g.add_argument('--envs-per-actor', type=int, default=4, metavar='K', help='envs per Ray actor')
    g.add_argument('--ray-address', metavar='ADDR',
                   help="a running Ray cluster's address (e.g. head-ip:6379; default: a local Ray)")
    g.add_argument('--maximum-staleness', type=int,
                   help='step requests that may be pending (default 2 x update frequency; see tune_staleness.py)')


def check_arguments(p, args):
    """Refuse impossible player counts; the number of players defaults by kind."""
    for flag in ('vector', 'players', 'envpool', 'ray_actors', 'envs_per_actor'):
        value = getattr(args, flag)
        if value is not None and value < (1 if flag in ('players', 'envs_per_actor') else 0):
            p.error(f"--{flag.replace('_', '-')} must be >= "
                    f"{1 if flag in ('players', 'envs_per_actor') else 0}, got {value}")
    if args.players is None:
        args.players = VECTOR_PLAYERS if args.vector else SINGLE_PLAYERS
    import gymnasium
    import atari_wrappers    # noqa: F401  (registers the ALE ids with gymnasium)
    spec = gymnasium.envs.registry.get(args.env)
    if spec is None or 'ale_py' not in str(spec.entry_point):
        p.error(f"--env {args.env} is not an Atari game of ale-py (e.g. ALE/Breakout-v5): this "
                "script preprocesses Atari frames. For CartPole run examples/dqn_cartpole.py, "
                "for MinAtar examples/dqn_minatar_jax.py")


def player_factory(args, single_env, clip):
    """``make_player`` for the players ``args`` ask for; ``single_env()`` makes one training game
    (``--vector 0``), ``clip``: clip every stored reward to [-1, 1]. Sets ``args.players`` to 1
    for the one-player engines (EnvPool, Ray)."""
    import atari_wrappers
    if args.envpool:
        # One player; a request receives (and stores) the steps of half its envs.
        def make_player():
            return atari_wrappers.make_envpool(args.env, args.envpool, sticky=args.sticky,
                                               seed=args.seed, reward_clip=clip)
        args.players = 1
        return make_player
    if args.ray_actors:
        return _ray_player(args, clip)
    if args.vector:
        def make_player():
            return atari_wrappers.make_vector_env(args.env, args.vector, sticky=args.sticky,
                                                  reward_clipping=clip)
        return make_player
    return single_env


def _ray_player(args, clip):
    # One player whose envs live in Ray actors (on this machine or a cluster's nodes). The
    # actors build their envs with atari_wrappers.make_env, shipped by value: the nodes need
    # expreplay[ray,atari] installed, not this examples directory.
    import atari_wrappers
    import ray

    import expreplay
    ray.cloudpickle.register_pickle_by_value(atari_wrappers)
    if not ray.is_initialized():
        ray.init(address=args.ray_address, include_dashboard=False)
    env_id, sticky, make_env = args.env, args.sticky, atari_wrappers.make_env

    def make():              # runs in the actor, where nothing has registered the ALE envs yet
        import ale_py
        import gymnasium
        gymnasium.register_envs(ale_py)
        env = make_env(env_id, sticky=sticky, max_episode_steps=None)
        return gymnasium.wrappers.ClipReward(env, -1.0, 1.0) if clip else env

    def make_player():
        return expreplay.RayVectorEnv(make, args.ray_actors, args.envs_per_actor)
    args.players = 1           # all the actors are one player's (one batched forward per step)
    return make_player
