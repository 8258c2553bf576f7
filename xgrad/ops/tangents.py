"""Forward-mode rules: every primitive's tangent is ``jax.jvp`` of its forward.

# NOTE [Tangents are jvp of the forward]
# A primitive declares its forward once (``defprim``); its forward-mode rule is derived
# from that forward, never written by hand: ``jax.jvp`` of ``impl`` at the primal inputs,
# along the inputs' tangents (inputs without one are constants of the rule). The rule
# runs as a ``from_jax`` op of the primals and the tangents, built once per primitive,
# static params and set of inputs with tangents and cached, so:
# * every op, and every op added later, has a forward rule (the registry's tests check
#   each against ``jax.jvp`` of the op's reference);
# * the tangent is itself recorded for reverse mode when grad mode is on and a primal or
#   a tangent requires grad (reverse over forward: the backward of the rule is ``jax.vjp``
#   of the jvp, NOTE [Backward of from_jax]);
# * a backward run inside a dual level (forward over reverse) propagates tangents through
#   the backward rules, which are ops like any other.
# The rule's own ops compute no tangents (one level, as in PyTorch). Params that hold
# arrays (integer indices) and float operands are arguments of the rule, not part of its
# cache key; other constants (ints, ``None``), slices and boolean masks (which decide
# output shapes) are keyed by value.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.dual import tangent_of, tangents_off
from xgrad.ops import registry
from xgrad.ops.jaxop import from_jax
from xgrad.ops.registry import bind
from xgrad.tensor import Tensor

__all__ = ["output_tangents"]

_PARAM_ARRAY = object()  # in a rule's key: a param leaf passed as an argument
_MAX_RULES = 4096
_rules: dict[Any, Any] = {}
_lock = threading.Lock()


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray))


def _hashable(leaf: Any) -> Any:
    if isinstance(leaf, slice):
        return ("slice", leaf.start, leaf.stop, leaf.step)
    return leaf


def _is_operand_param(leaf: Any) -> bool:
    # Boolean masks decide output shapes: they stay constants of the rule, keyed by value.
    return _is_array(leaf) and leaf.dtype != bool


class _Mask:
    """A boolean mask param, hashed by its value."""

    __slots__ = ("array", "key")

    def __init__(self, array: Any) -> None:
        self.array = np.asarray(array)
        self.key = (self.array.shape, self.array.tobytes())

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Mask) and self.key == other.key


def _split_params(params: dict[str, Any]) -> tuple[Any, list[Any], tuple[Any, ...]]:
    """``params`` as (structure, array leaves, static leaves with the arrays marked)."""
    leaves, tree = jax.tree_util.tree_flatten(params)
    arrays = [leaf for leaf in leaves if _is_operand_param(leaf)]
    static = tuple(
        _PARAM_ARRAY if _is_operand_param(leaf) else _Mask(leaf) if _is_array(leaf) else leaf for leaf in leaves
    )
    return tree, arrays, static


def _is_operand(a: Any) -> bool:
    """Whether a positional argument reaches the rule as an operand (else it is a static constant)."""
    return isinstance(a, Tensor) or type(a) is float or _is_array(a)


def _jvp_rule(prim: Any, tree: Any, static: tuple[Any, ...], constants: tuple[Any, ...], with_tangent: tuple[bool, ...]) -> Any:
    """``rule(param_arrays, operands, tangents) -> output tangents`` as a differentiable op."""
    impl = prim.impl
    num_outputs = prim.num_outputs
    moving = [i for i, m in enumerate(with_tangent) if m]

    def rule(param_arrays: list[Any], operands: list[Any], tangents: list[Any]) -> Any:
        it = iter(param_arrays)
        params = jax.tree_util.tree_unflatten(
            tree, [next(it) if s is _PARAM_ARRAY else s.array if isinstance(s, _Mask) else s for s in static]
        )
        ops = iter(operands)
        args = [next(ops) if c is _PARAM_ARRAY else c for c in constants]

        def forward(*primals: Any) -> Any:
            full = list(args)
            for i, p in zip(moving, primals, strict=True):
                full[i] = p
            return impl(*full, **params)

        primals = [args[i] for i in moving]
        # A tangent of another float dtype than its primal (PyTorch keeps it so) is taken as the primal's.
        tangents = [t.astype(p.dtype) if t.dtype != p.dtype else t for p, t in zip(primals, tangents, strict=True)]
        outs, out_tangents = jax.jvp(forward, primals, tangents)
        if num_outputs == 1:
            outs, out_tangents = (outs,), (out_tangents,)
        # Outputs that are not differentiable (integer, boolean) have no tangent.
        return tuple(
            t if jnp.issubdtype(o.dtype, jnp.inexact) else None for o, t in zip(outs, out_tangents, strict=True)
        )

    return from_jax(rule, name=f"{prim.name}_jvp")


def _tangents_of(args: Sequence[Any]) -> list[Tensor | None]:
    return [tangent_of(a) if isinstance(a, Tensor) else None for a in args]


def output_tangents(prim: Any, args: Sequence[Any], params: dict[str, Any]) -> tuple[Tensor | None, ...] | None:
    """The tangents of ``prim(*args, **params)``'s outputs at the live level; ``None`` when no input has one."""
    tangents: list[Tensor] = []
    with_tangent = []
    for a in args:
        t = tangent_of(a) if isinstance(a, Tensor) else None
        with_tangent.append(t is not None)
        if t is not None:
            tangents.append(t)
    if not tangents:
        return None
    if prim.host_only:
        # A device move (a registered primitive that runs outside jit) is linear, and one
        # XLA program cannot move values between devices: the tangent makes the same move.
        linear_args = [
            t if t is not None else Tensor(jnp.zeros_like(a._array)) if isinstance(a, Tensor) else a
            for a, t in zip(args, _tangents_of(args), strict=True)
        ]
        with tangents_off():
            moved = bind(prim, tuple(linear_args), params)
        return moved if isinstance(moved, tuple) else (moved,)
    tree, param_arrays, static = _split_params(params)
    constants = tuple(_PARAM_ARRAY if _is_operand(a) else a for a in args)
    # Python floats as weakly typed arrays: operands of the rule, not constants it is keyed by.
    operands = [jnp.asarray(a) if type(a) is float else a for a in args if _is_operand(a)]
    key: Any = (prim, tree, tuple(_hashable(s) for s in static), constants, tuple(with_tangent))
    try:
        rule = _rules.get(key)
    except TypeError:  # a param that cannot be hashed: a rule of its own, not cached
        key, rule = None, None
    if rule is None:
        rule = _jvp_rule(prim, tree, static, constants, tuple(with_tangent))
        if key is not None:
            with _lock:
                if len(_rules) >= _MAX_RULES:
                    _rules.clear()
                _rules[key] = rule
    with tangents_off():
        outs = rule(param_arrays, operands, tangents)
    return tuple(outs)


registry.tangent_rule = output_tangents  # bind's forward-mode rule for every primitive
