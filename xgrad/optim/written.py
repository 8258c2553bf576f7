"""``WrittenArrays``: which arrays an optimizer's last step left in its parameters and state (NOTE [Unmoved parameters]).

# NOTE [Unmoved parameters]
# Before each update an optimizer moves its state to where its parameters are now (a
# ``module.to`` since the last step), which compares shardings in Python: for a small
# model a fifth of the step. A parameter whose array and state arrays are still the very
# ones the last step wrote cannot have moved, so the optimizers remember those arrays
# and compare identities first. The references are weak: a parameter moved off a device
# frees its old arrays as it would without the optimizer.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Sequence
from typing import Any

__all__ = ["WrittenArrays"]


class WrittenArrays:
    """Weak references to the arrays last written for each key (a parameter, or a whole optimizer).

    >>> import jax.numpy as jnp
    >>> from xgrad.optim.written import WrittenArrays
    >>> written, a, b = WrittenArrays(), jnp.ones(2), jnp.zeros(2)
    >>> written.record("w", [a, b]); written.unchanged("w", [a, b]), written.unchanged("w", [a, a + 0])
    (True, False)
    """

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: dict[Hashable, tuple[weakref.ref[Any], ...]] = {}

    def record(self, key: Hashable, arrays: Sequence[Any]) -> None:
        self._refs[key] = tuple(weakref.ref(a) for a in arrays)

    def unchanged(self, key: Hashable, arrays: Sequence[Any]) -> bool:
        """Whether ``arrays`` are, one for one, the arrays last recorded for ``key``."""
        refs = self._refs.get(key)
        if refs is None or len(refs) != len(arrays):
            return False
        for ref, array in zip(refs, arrays, strict=True):
            if ref() is not array:
                return False
        return True
