"""Watches of a stream's acting side: warnings for training loops that look right and learn nothing.

:class:`RandomPlayWatch` warns when the players never use the Q-function (epsilon left at 1.0);
:class:`FrozenPredictorWatch`, when the Q-function they use holds weights bound into it once
(``lambda s, p=params: net.apply(p, s)``). The stream calls :meth:`RandomPlayWatch.after_draw`
for every batch, which drives both.
"""

from __future__ import annotations

import functools
import sys
import types
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ['RandomPlayWatch', 'FrozenPredictorWatch', 'bound_weights',
           'RANDOM_PLAY_WARNING_BATCHES', 'RANDOM_PLAY_UNSET_WARNING_BATCHES',
           'FROZEN_PREDICTOR_WARNING_BATCHES']

# Batches drawn after the fill with every step at exploration 1.0 before the watch warns, when
# epsilon is a schedule or a number a training loop assigned: such loops may hold 1.0 well past
# the fill, e.g. tensorpack's DQN.py, whose epoch-based ScheduledHyperParamSetter keeps 1.0 for
# the whole first epoch (25,000 batches: 100k agent steps at update_frequency 4).
RANDOM_PLAY_WARNING_BATCHES = 30_000
# The same when epsilon is the number the Population was built with (1.0, its default) and
# nothing ever assigned another: no schedule exists to lower it, only a loop that has not
# assigned it yet, and loops assign it from their first batches.
RANDOM_PLAY_UNSET_WARNING_BATCHES = 1_000
# Batches drawn with one predictor whose bound weights never changed before the watch warns:
# twice the longest interval at which DQN loops commonly refresh the acting weights on purpose
# (a target network copied every 8-10k updates), so a loop that does so is never warned.
FROZEN_PREDICTOR_WARNING_BATCHES = 20_000


class RandomPlayWatch:
    """Counts the batches drawn while the population acts only at random (exploration 1.0,
    with a predictor set) and warns once (RuntimeWarning), naming the fix; it stops looking
    once a greedy action is possible. Also drives a :class:`FrozenPredictorWatch`.

    When: after :data:`RANDOM_PLAY_UNSET_WARNING_BATCHES` (1,000) batches if epsilon is the
    number the population was built with and was never assigned since (``Population``'s
    default 1.0 left as is: nothing will ever lower it), else after
    :data:`RANDOM_PLAY_WARNING_BATCHES` (30,000). The early rule can not be tripped by a
    schedule (DQN's usual ones hold 1.0 for the initial fill, then decay over 100k-1M steps),
    nor by a loop that assigns epsilon, even only 1.0 at first (tensorpack's
    ``ScheduledHyperParamSetter`` assigns it before training starts); the late rule waits past
    the longest hold at 1.0 of the usual setups. Two episodes must also have ended since the
    first batch, so that a loop that lowers epsilon at the end of each episode has done so.
    """

    def __init__(self, population: Any) -> None:
        self.population = population
        self.batches: int | None = 0     # None once done: warned, or greedy actions are taken
        self._episodes_at_start: int | None = None
        self.frozen = FrozenPredictorWatch(population)

    def after_draw(self) -> None:
        """Called by the drawing thread for every batch."""
        self.frozen.after_draw()
        if self.batches is None:
            return
        population = self.population
        if population.exploration < 1.0 or population.predictor is None:
            self.batches = None          # greedy actions are taken, or none can be
            return
        episodes = population.episode_totals.episodes
        if self._episodes_at_start is None:
            self._episodes_at_start = episodes
        self.batches += 1
        never_assigned = (population.exploration_schedule is None
                          and not population.exploration_assigned)
        due = RANDOM_PLAY_UNSET_WARNING_BATCHES if never_assigned else RANDOM_PLAY_WARNING_BATCHES
        if self.batches < due or episodes - self._episodes_at_start < 2:
            return
        self.batches = None
        how = ("epsilon is still the Population's exploration=1.0 and nothing assigned another"
               if never_assigned else "epsilon stayed at 1.0")
        warnings.warn(
            f"ReplayStream: {due} batches drawn since the initial fill and every step was taken "
            f"at exploration 1.0 ({how}): the players never use the predictor. Lower epsilon "
            "as the training goes, once with a schedule (Population(exploration=lambda steps: "
            "max(0.1, 1 - steps / 100_000))) or by assigning stream.exploration",
            RuntimeWarning, stacklevel=3)


def _is_float_array(value: Any) -> bool:
    """A numpy or JAX array of floats (weights; not a mask, an index table, a scalar)."""
    if isinstance(value, np.ndarray):
        return value.dtype.kind == 'f' and value.size > 1
    module = type(value).__module__.partition('.')[0]
    if module not in ('jax', 'jaxlib'):
        return False
    try:
        return np.dtype(value.dtype).kind == 'f' and int(value.size) > 1
    except Exception:        # a dtype numpy does not know (bfloat16 is known to it via ml_dtypes)
        return False


def _array_leaves(value: Any, budget: int = 10_000) -> list[Any]:
    """The float arrays in ``value``: itself, or the leaves of a pytree (dicts, lists, tuples,
    and with JAX loaded whatever ``jax.tree_util`` flattens: flax structs, FrozenDicts)."""
    if _is_float_array(value):
        return [value]
    if isinstance(value, (str, bytes, int, float, complex, bool, type(None))):
        return []
    jax = sys.modules.get('jax')
    leaves: list[Any] = []
    if jax is not None:
        try:
            leaves = jax.tree_util.tree_leaves(value)
        except Exception:
            leaves = []
        if len(leaves) == 1 and leaves[0] is value:
            return []                 # not a container JAX knows: an opaque object
        return [leaf for leaf in leaves[:budget] if _is_float_array(leaf)]
    stack, found = [value], []
    while stack and budget > 0:
        item = stack.pop()
        budget -= 1
        if _is_float_array(item):
            found.append(item)
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return found


def _bound_values(predictor: Any) -> list[tuple[str, Any, Any]]:
    """``(description, value, cell)`` of what ``predictor`` has bound into itself: its default
    arguments, a ``functools.partial``'s arguments, its closure's cells (``cell`` set: the value
    may be rebound there), following ``__wrapped__`` (``jax.jit``, decorators) and bound methods."""
    found: list[tuple[str, Any, Any]] = []
    seen: set[int] = set()
    fn = predictor
    for _ in range(8):
        if fn is None or id(fn) in seen:
            break
        seen.add(id(fn))
        if isinstance(fn, functools.partial):
            found += [(f"functools.partial argument {k}", v, None) for k, v in enumerate(fn.args)]
            found += [(f"functools.partial argument {k}", v, None) for k, v in fn.keywords.items()]
            fn = fn.func
            continue
        func = getattr(fn, '__func__', fn)          # a bound method: its function
        code = getattr(func, '__code__', None)
        if isinstance(code, types.CodeType):
            defaults = getattr(func, '__defaults__', None) or ()
            names = code.co_varnames[code.co_argcount - len(defaults):code.co_argcount]
            found += [(f"default argument {n}", v, None) for n, v in zip(names, defaults)]
            found += [(f"default argument {n}", v, None)
                      for n, v in (getattr(func, '__kwdefaults__', None) or {}).items()]
            for name, cell in zip(code.co_freevars, getattr(func, '__closure__', None) or ()):
                try:
                    found.append((f"closure variable {name}", cell.cell_contents, cell))
                except ValueError:                   # an empty cell
                    pass
        fn = getattr(fn, '__wrapped__', None)
    return found


def bound_weights(predictor: Any) -> list[tuple[str, list[Any], Any]]:
    """What ``predictor`` holds bound into itself that looks like weights: ``(description,
    float arrays, cell)`` per default argument, partial argument or closure variable holding
    float arrays (numpy or JAX, alone or in a pytree). Empty for a callable object (it reads
    its attributes at every call), for a function reading globals, and for anything that can
    not be looked into (a watch never fails the stream)."""
    out = []
    try:
        for what, value, cell in _bound_values(predictor):
            leaves = _array_leaves(value)
            if leaves:
                out.append((what, leaves, cell))
    except Exception:
        return []
    return out


def _fingerprint(leaf: Any) -> Any:
    """Something that changes when a numpy array is updated in place (a strided sample of its
    values); None for JAX arrays, which can not be (their identity says it all)."""
    if not isinstance(leaf, np.ndarray):
        return None
    return leaf.flat[np.linspace(0, leaf.size - 1, min(leaf.size, 64)).astype(np.intp)].tobytes()


class _Snapshot:
    """The weights bound into one predictor, as they were when it was first seen."""

    def __init__(self, bound: list[tuple[str, list[Any], Any]]) -> None:
        self.bound = [(what, cell, [self._ref(leaf) for leaf in leaves],
                       [_fingerprint(leaf) for leaf in leaves])
                      for what, leaves, cell in bound]

    @staticmethod
    def _ref(leaf: Any) -> Any:
        try:
            return weakref.ref(leaf)       # keeps no replaced weights alive
        except TypeError:
            return lambda leaf=leaf: leaf

    def unchanged(self) -> bool:
        """Whether every bound array is the same object with the same values now."""
        try:
            return self._unchanged()
        except Exception:
            return False

    def _unchanged(self) -> bool:
        for what, cell, refs, prints in self.bound:
            if cell is not None:               # a closure variable may have been rebound
                try:
                    leaves = _array_leaves(cell.cell_contents)
                except ValueError:
                    return False
                if len(leaves) != len(refs) or any(r() is not leaf for r, leaf in zip(refs, leaves)):
                    return False
            for ref, fingerprint in zip(refs, prints):
                leaf = ref()
                if leaf is None or (fingerprint is not None and _fingerprint(leaf) != fingerprint):
                    return False
        return True

    def describe(self) -> str:
        parts = []
        for what, _, refs, _ in self.bound:
            leaves = [r() for r in refs]
            numbers = sum(int(np.size(leaf)) for leaf in leaves if leaf is not None)
            parts.append(f"its {what}: {len(refs)} array{'s' if len(refs) > 1 else ''}, "
                         f"{numbers:,} numbers")
        return '; '.join(parts)


class FrozenPredictorWatch:
    """Warns once (RuntimeWarning) when the players act with weights bound into the predictor
    once, e.g. ``lambda s, p=params: net.apply(p, s)`` in a JAX loop that then rebinds
    ``params``: a default argument (or ``functools.partial``) keeps the arrays of that moment,
    and the players act with the first weights forever.

    No check can tell this from a policy fixed on purpose at the moment the predictor is given:
    ``stream.predictor = lambda s, p=params: ...`` assigned after every update is the fix, and its
    first assignment looks the same. So the rule waits: it warns when the same predictor object,
    holding float arrays (numpy or JAX) in its default arguments, partial arguments or closure
    variables, has been in use for :data:`FROZEN_PREDICTOR_WARNING_BATCHES` (20,000) batches
    with greedy actions being taken, and those arrays are still the same objects with the same
    values (a closure variable the loop rebinds, or numpy weights updated in place, are
    changes). It can not see weights a callable object reads from its attributes (the other
    fix), nor those a ``jax.jit`` captured from globals at its first trace. What it can still
    take for a mistake: a policy meant to stay fixed while the stream feeds a learner, or
    float constants bound beside weights read live; the message names what it found.
    """

    def __init__(self, population: Any) -> None:
        self.population = population
        self.done = False
        self._predictor: Any = None
        self._snapshot: _Snapshot | None = None
        self.batches = 0

    def after_draw(self) -> None:
        """Called by the drawing thread for every batch."""
        if self.done:
            return
        population = self.population
        predictor = population.predictor
        if predictor is not self._predictor:
            self._predictor, self.batches = predictor, 0
            bound = bound_weights(predictor) if predictor is not None else []
            self._snapshot = _Snapshot(bound) if bound else None
        if self._snapshot is None:
            return
        self.batches += 1
        if self.batches < FROZEN_PREDICTOR_WARNING_BATCHES or population.exploration >= 1.0:
            return
        snapshot, self._snapshot = self._snapshot, None     # looked at once per predictor
        if not snapshot.unchanged():
            return
        self.done = True
        warnings.warn(
            f"ReplayStream: the players have acted with the same predictor for "
            f"{FROZEN_PREDICTOR_WARNING_BATCHES} batches, and the weights bound into it never "
            f"changed ({snapshot.describe()}): a default argument (lambda s, p=params: "
            "net.apply(p, s)), a functools.partial or a closure keeps the arrays it was given, "
            "so the players still act with those weights whatever the learner learned since. "
            "Give them the new weights as they change: assign stream.predictor = lambda s, "
            "p=params: net.apply(p, s) after each update (or every few), or read the weights "
            "from an object updated in place (a predictor object whose __call__ reads "
            "self.params, which the training loop reassigns). If this policy is meant to stay "
            "fixed, ignore this warning.", RuntimeWarning, stacklevel=4)
