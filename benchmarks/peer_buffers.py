"""Peer replay buffers for ``bench_memory.py``, filled with given data and sampled the way their
users sample them: Flashbax (JAX, on the CPU) and cpprb. Each builder returns a callable that
draws one batch (its result ready: JAX's asynchronous dispatch is waited for), or raises
ImportError when the library is not installed (``pip install flashbax`` / ``pip install cpprb``;
benchmark-only dependencies).

Flashbax's buffers are pure functions of a state; the state is built here already full (the
``experience`` arrays and the ring's position, fields of its documented ``TrajectoryBufferState``)
instead of by 500k jitted ``add`` calls, which would measure nothing a sample depends on.
``sample`` is jitted and called from a Python loop with a new key per call, as Flashbax's own
benchmarks do.
"""

if __name__ == '__main__':
    # A module a benchmark imports, not a program: --help says so.
    import argparse
    argparse.ArgumentParser(
        description=__doc__, epilog='This module is imported by benchmarks/bench_memory.py; run that.',
        formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    raise SystemExit('peer_buffers.py is imported by benchmarks/bench_memory.py; run '
                     'bench_memory.py --peers (--help for its options).')


import numpy as np

__all__ = ['flashbax_flat', 'flashbax_sequences', 'cpprb_transitions']


def _full_state(buffer, experience):
    """A state of ``buffer`` holding ``experience`` (leaves ``(1, T, ...)``: one add row, T
    steps), the ring full. Built directly: ``buffer.init`` would allocate a second buffer of
    zeros first. Its position fields have the dtypes ``init`` gives them (int32, bool)."""
    import jax
    import jax.numpy as jnp
    from flashbax.buffers.trajectory_buffer import TrajectoryBufferState
    return TrajectoryBufferState(experience=jax.tree_util.tree_map(jnp.asarray, experience),
                                 current_index=jnp.asarray(0, jnp.int32),
                                 is_full=jnp.asarray(True))


def _sampler(buffer, state, calls, seed=0):
    """A callable drawing one batch per call with a fresh key (keys split ahead: ``calls``)."""
    import jax
    sample = jax.jit(buffer.sample)
    keys = iter(list(jax.random.split(jax.random.PRNGKey(seed), calls)))
    jax.block_until_ready(sample(state, next(keys)))     # compiled before the rounds

    def draw():
        return jax.block_until_ready(sample(state, next(keys)))
    return draw


def flashbax_flat(frames, steps, batch_size, calls, stack=None):
    """Flashbax's flat buffer (``make_flat_buffer``) of ``steps`` steps: step t's observation is
    ``frames[t % len(frames)]``, or with ``stack`` the ``stack`` frames ``t .. t + stack - 1``
    stacked on a last axis (an env wrapper's frame stack); int32 actions, float32 rewards, bool
    dones. A batch is ``batch_size`` transitions, the observations of steps t and t + 1
    (``experience.first`` / ``.second``). The observations are made in JAX's memory from
    ``frames`` (no full copy on the host)."""
    import flashbax as fbx
    import jax.numpy as jnp
    source = jnp.asarray(frames)
    if stack:
        obs = jnp.stack([source[i:i + steps] for i in range(stack)], axis=-1)
    else:
        obs = jnp.take(source, jnp.arange(steps) % len(frames), axis=0)
    buffer = fbx.make_flat_buffer(max_length=steps, min_length=2, sample_batch_size=batch_size)
    experience = {'obs': obs[None], 'action': np.zeros((1, steps), np.int32),
                  'reward': np.zeros((1, steps), np.float32), 'done': np.zeros((1, steps), bool)}
    del source, obs
    return _sampler(buffer, _full_state(buffer, experience), calls)


def flashbax_sequences(frames, sequence_length, batch_size, calls):
    """Flashbax's trajectory buffer holding single ``frames`` (``(T, H, W)``), sampled as
    ``batch_size`` runs of ``sequence_length`` consecutive frames (``(B, L, H, W)``): frames
    stored once, a state and its next state cut from one run by the learner. Runs cross
    episode ends: masking them is left to the user."""
    import flashbax as fbx
    t = len(frames)
    buffer = fbx.make_trajectory_buffer(
        add_batch_size=1, sample_batch_size=batch_size, sample_sequence_length=sequence_length,
        period=1, min_length_time_axis=sequence_length, max_length_time_axis=t)
    return _sampler(buffer, _full_state(buffer, {'obs': frames[None]}), calls)


def cpprb_transitions(frames, steps, batch_size, episode_ends):
    """cpprb's ``ReplayBuffer`` with ``next_of='obs'`` (each observation stored once) of
    ``steps`` steps, step t's observation ``frames[t % len(frames)]`` and its next one the
    following frame, episodes ending at ``episode_ends``; a batch is ``sample(batch_size)``."""
    import cpprb
    rb = cpprb.ReplayBuffer(steps, {'obs': {'shape': frames.shape[1:], 'dtype': frames.dtype},
                                    'act': {'dtype': np.int32}, 'rew': {}, 'done': {}},
                            next_of='obs')
    start = 0
    for end in list(episode_ends) + [steps]:
        for lo in range(start, end, 4096):       # chunks: a whole episode's copies are large
            hi = min(end, lo + 4096)
            idx = np.arange(lo, hi + 1) % len(frames)
            rb.add(obs=frames[idx[:-1]], next_obs=frames[idx[1:]], act=np.zeros(hi - lo, np.int32),
                   rew=np.zeros(hi - lo), done=np.zeros(hi - lo))
        if end > start:
            rb.on_episode_end()
        start = end

    def draw():
        return rb.sample(batch_size)
    return draw
