# Type stub of the optional C kernel built from _write_ext.c (the ring's writes: see ring.py).
from typing import Any

import numpy as np

class Store:
    def __init__(self, ring_tables: tuple, writer_tables: tuple, fmt: str,
                 state_shape: tuple[int, ...], history_len: int, block_size: int,
                 ring: tuple[Any, np.ndarray, np.ndarray, list[int] | None, int]) -> None: ...
    def step(self, action: Any, reward: Any, frame: Any, terminated: Any,
             truncated: Any) -> int: ...
    def start(self, frame: Any) -> int: ...
    def steps(self, lanes: np.ndarray, actions: Any, frames: Any, rewards: Any,
              terminated: Any, truncated: Any) -> int: ...
