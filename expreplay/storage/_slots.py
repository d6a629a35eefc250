"""The replay memory's slot flags and block states, shared by the ring
(:mod:`expreplay.storage.memory`), its writers (:mod:`expreplay.storage.writers`) and its checkpoint format."""

# Slot flags.
_VALID = 1        # the transition from this slot can be sampled (I3)
_TERMINATED = 2   # the step from this slot ended the episode in a terminal state
_TRUNCATED = 4    # the step from this slot ended the episode by truncation (bootstraps)
_HAS_ACTION = 8   # an action was taken from this slot's frame

# Block states (I1).
_FREE, _ACTIVE, _RETIRED = 0, 1, 2
