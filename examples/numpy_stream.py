#!/usr/bin/env python
"""The framework-free replay stream, with a linear Q-function in plain numpy.

No TensorFlow, no PyTorch: ``ReplayStream`` runs the environments in simulator threads, fills the
replay memory, and hands out numpy batches; the learner here is a linear Q-function trained by
semi-gradient Q-learning. Swap ``LinearQ`` for a PyTorch / JAX / Keras model and keep the loop.

    python examples/numpy_stream.py --steps 3000

It plays CartPole-v1 (gymnasium) and prints, every few hundred updates, the mean score of the
games the runners finished and the stream's statistics. A linear Q-function does not master
CartPole; the point is the plumbing: the loop below is all a trainer needs.
"""

import argparse
import threading

import gymnasium as gym
import numpy as np

from expreplay import Population, ReplayMemory, ReplayStream, Sampling


class LinearQ:
    """Q(s, a) = w_a . [s, 1] over the stacked history, with a frozen copy as the target network."""

    def __init__(self, state_size, num_actions, lr, seed=0):
        rng = np.random.default_rng(seed)
        self.w = rng.normal(0, 0.01, (state_size + 1, num_actions)).astype(np.float32)
        self.target_w = self.w.copy()
        self.lr = lr
        # The runners read the weights from another thread while we update them: swap whole
        # arrays under a lock rather than mutating in place under a reader.
        self._lock = threading.Lock()

    @staticmethod
    def features(states):
        flat = states.reshape(len(states), -1).astype(np.float32)
        return np.concatenate([flat, np.ones((len(flat), 1), np.float32)], axis=1)

    def __call__(self, states):
        """The predictor the stream calls: states (n, 4, history) -> Q-values (n, actions)."""
        with self._lock:
            w = self.w
        return self.features(states) @ w

    def train(self, batch):
        """One semi-gradient Q-learning step on a batch; returns the mean squared TD error.

        ``batch.discount`` is gamma, or 0 where the episode terminated (the stream's gamma)."""
        x, action = self.features(batch.state), batch.action
        target = batch.reward + batch.discount * (self.features(batch.next_state) @ self.target_w).max(1)
        td = target - (x @ self.w)[np.arange(len(action)), action]
        grad = np.zeros_like(self.w)
        np.add.at(grad.T, action, td[:, None] * x)      # d/dw of -0.5 * td^2, per taken action
        with self._lock:
            self.w = self.w + self.lr * grad / len(action)
        return float(np.mean(td ** 2))

    def update_target(self):
        self.target_w = self.w.copy()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--steps', type=int, default=3000, help='training updates (batches)')
    parser.add_argument('--players', type=int, default=2, help='environments, one thread each')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()

    history = 2
    q = LinearQ(state_size=4 * history, num_actions=2, lr=1e-3, seed=args.seed)
    # CartPole's observations are 4 floats: a float32 memory of 4-vectors, 2 per state.
    stream = ReplayStream(
        ReplayMemory(20_000, (4,), history, 'float32'),
        # Epsilon: 1 during the fill, then falls linearly to 0.05 over the first half of the
        # run's env steps (4 per update); given once, as a schedule of the steps stored.
        Population(lambda: gym.make('CartPole-v1'), args.players, q, seed=args.seed,
                   exploration=lambda steps: max(0.05, 1.0 - max(0, steps - 1_000) / (2 * args.steps))),
        Sampling(batch_size=32, update_frequency=4, gamma=0.99, seed=args.seed),
        init_memory_size=1_000)

    # The context manager closes the stream: every simulator thread is joined on the way out.
    with stream:
        for step, batch in enumerate(stream):
            loss = q.train(batch)
            if step % 200 == 0:
                q.update_target()
            if step % 500 == 0 or step == args.steps:
                stats = stream.stats()
                stream.reset_stats()
                score = 'n/a' if stats.mean_score is None else f"{stats.mean_score:.1f}"
                print(f"update {step:5d}  loss {loss:8.4f}  exploration {stream.exploration:.2f}  "
                      f"games {stats.games:3d}  mean score {score:>5}  "
                      f"env steps/s {stats.steps_per_sec:7.0f}  memory {stats.memory_transitions}")
            if step == args.steps:
                break


if __name__ == '__main__':
    main()
