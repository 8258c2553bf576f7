"""The parameter mark: which Tensors are ``nn.Parameter``s, and where each was first set.

It lives with the Tensor, below every layer that asks (``nn`` marks and reads it, the
capture check in ``jax_capture`` names a parameter in its warning), so that asking never
imports ``nn``.

# NOTE [Parameter is a Tensor]
# ``Parameter(data)`` returns a plain leaf ``Tensor`` that requires grad and is marked as
# a parameter; ``isinstance(t, nn.Parameter)`` reads the mark. A real subclass would be
# its own pytree node type, so a tree of parameters and the tree of their grads (plain
# Tensors) would not match and ``optax.apply_updates(params, updates)`` or
# ``tx.update(grads, state, params)`` would fail on the structure (see NOTE [Tensor as a
# pytree] in tensor/jax_boundary.py). The mark is a weak registry by id, so a parameter that is
# dropped leaves nothing behind.
"""

from __future__ import annotations

import weakref
from typing import Any

from xgrad.tensor.core import Tensor

__all__ = ["is_parameter", "mark_parameter", "parameter_name"]

_PARAMETER_IDS: dict[int, weakref.ref[Tensor]] = {}
_PARAMETER_NAMES: dict[int, str] = {}  # ``Linear.weight``: where a parameter was first set, for messages


def _forget_parameter(key: int) -> None:
    _PARAMETER_IDS.pop(key, None)
    _PARAMETER_NAMES.pop(key, None)


def is_parameter(obj: Any) -> bool:
    """Whether ``obj`` is a Tensor marked as a parameter (what ``isinstance(obj, nn.Parameter)`` asks)."""
    ref = _PARAMETER_IDS.get(id(obj))
    return ref is not None and ref() is obj


def mark_parameter(t: Tensor, name: str | None = None) -> None:
    """Mark ``t`` as a parameter; ``name`` (``Linear.weight``) is kept if it is the first one given."""
    key = id(t)
    if not is_parameter(t):
        _PARAMETER_IDS[key] = weakref.ref(t, lambda _ref: _forget_parameter(key))
    if name is not None:
        _PARAMETER_NAMES.setdefault(key, name)


def parameter_name(t: Tensor) -> str | None:
    """``Linear.weight``: the class and attribute a parameter was first set on, ``None`` if unknown."""
    return _PARAMETER_NAMES.get(id(t)) if is_parameter(t) else None
