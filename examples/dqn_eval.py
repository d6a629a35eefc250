"""Greedy evaluation of a Q-network: whole games played with argmax Q (or epsilon-greedy).

``evaluate`` plays a number of episodes in lockstep, one batched forward pass for all of them
per step; ``play_episode`` plays one, calling back on every frame (``dqn_atari.py --task play``
records videos with it). Both stack the last ``history`` frames exactly as the replay memory
builds the states the network trained on (:class:`HistoryStack`). A predictor is called as
tensorpack's are: ``predictor(states)[0]`` is the Q-values of a batch of states.
"""

if __name__ == '__main__':   # a module the examples import, not a program: --help says so
    import module_help
    module_help.answer(__doc__, 'dqn_eval.py', 'dqn_atari.py and dqn_cartpole.py')

import numpy as np


class HistoryStack:
    """Stacks the last ``history`` frames channels-last, zeros before the episode's start.

    This is exactly how the replay memory builds the states the network trained on, so the
    evaluator feeds the network what it knows.
    """

    def __init__(self, frame_shape, history, dtype):
        self.buf = np.zeros(tuple(frame_shape) + (history,), dtype)

    def reset(self, frame):
        self.buf[...] = 0
        self.buf[..., -1] = frame
        return self.buf

    def push(self, frame):
        self.buf[..., :-1] = self.buf[..., 1:]
        self.buf[..., -1] = frame
        return self.buf


def play_episode(env, predictor, history, *, epsilon=0.0, rng=None, seed=None, on_frame=None):
    """Play one episode; returns its score (sum of rewards, all lives).

    ``predictor(states)[0]`` gives the Q-values of a batch of states. ``epsilon`` > 0 takes a
    random action that often (evaluation usually uses 0.0 or 0.01-0.05 so that an agent
    stuck in a loop can not play forever).
    """
    rng = rng or np.random.default_rng()
    obs, _ = env.reset(seed=seed)
    obs = np.asarray(obs)
    stack = HistoryStack(obs.shape, history, obs.dtype)
    state = stack.reset(obs)
    score = 0.0
    while True:
        if epsilon > 0 and rng.random() < epsilon:
            action = int(env.action_space.sample())
        else:
            action = int(np.argmax(predictor(state[None])[0][0]))
        obs, reward, terminated, truncated, _ = env.step(action)
        score += float(reward)
        if on_frame is not None:
            on_frame(env)
        if terminated or truncated:
            return score
        state = stack.push(np.asarray(obs))


def evaluate(make_env, predictor, history, episodes, *, epsilon=0.0, seed=0, parallel=None,
             progress=False):
    """Scores of ``episodes`` episodes, played ``parallel`` at a time in lockstep.

    Each episode gets its own environment reset with seed ``seed + i``, so an evaluation is
    reproducible and two evaluations with different ``seed`` see different starts. Playing
    episodes in lockstep batches the Q-network's forward passes (one call for all of them),
    which is far cheaper than one call per state.
    """
    parallel = min(episodes, parallel or episodes)
    rng = np.random.default_rng(seed)
    envs = [make_env() for _ in range(parallel)]
    scores = []
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=episodes, desc='evaluating', dynamic_ncols=True)
    try:
        started = 0
        slots = []   # per env: [episode index, stack, state, score] or None when idle

        def start(k):
            nonlocal started
            obs, _ = envs[k].reset(seed=None if seed is None else seed + started)
            obs = np.asarray(obs)
            stack = HistoryStack(obs.shape, history, obs.dtype)
            started += 1
            return [stack, stack.reset(obs), 0.0]

        slots = [start(k) for k in range(parallel)]
        while any(s is not None for s in slots):
            live = [k for k, s in enumerate(slots) if s is not None]
            q = predictor(np.stack([slots[k][1] for k in live]))[0]
            for row, k in enumerate(live):
                if epsilon > 0 and rng.random() < epsilon:
                    action = int(envs[k].action_space.sample())
                else:
                    action = int(np.argmax(q[row]))
                obs, reward, terminated, truncated, _ = envs[k].step(action)
                slots[k][2] += float(reward)
                if terminated or truncated:
                    scores.append(slots[k][2])
                    if bar is not None:
                        bar.update(1)
                    slots[k] = start(k) if started < episodes else None
                else:
                    slots[k][1] = slots[k][0].push(np.asarray(obs))
    finally:
        for env in envs:
            env.close()
        if bar is not None:
            bar.close()
    return np.array(scores)
