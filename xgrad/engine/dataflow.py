"""Which inputs of a jaxpr traced from xgrad code each output depends on, as eager's ``requires_grad`` would see it.

# NOTE [Data flow as eager sees it]
# Eager decides ``requires_grad`` op by op: an xgrad primitive's result requires grad
# when any of its float inputs does, whatever its function reads (``relu``'s backward of
# an empty tensor reads nothing of ``relu``'s output, yet its result is in the graph);
# a ``from_jax`` op's output only when an input it reads does (the vjp of a linear
# function does not depend on the primals: NOTE [Outputs independent of the graph]).
# A jaxpr traced from xgrad code shows both kinds: a primitive's forward is one ``jit``
# equation named ``PRIMITIVE_JIT_PREFIX + name`` (NOTE [Jitted dispatch]), taken whole;
# any other nested ``jit`` (JAX's own ``jnp`` functions inside a ``from_jax`` op, a
# vjp's transposes) is followed inside. An integer or bool value depends on nothing, as
# an integer tensor never requires grad.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from xgrad.jax_internals import Literal

__all__ = ["PRIMITIVE_JIT_PREFIX", "output_deps"]

PRIMITIVE_JIT_PREFIX = "xgrad_"

_CALLS = ("pjit", "jit", "closed_call")
_NONE: frozenset[int] = frozenset()


def _inexact(aval: Any) -> bool:
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and bool(jnp.issubdtype(dtype, jnp.inexact))  # bfloat16's kind is "V"


def output_deps(jaxpr: Any) -> list[frozenset[int]]:
    """For each output of ``jaxpr``, the inputs it depends on (NOTE [Data flow as eager sees it])."""
    depends: dict[Any, frozenset[int]] = {v: frozenset((i,)) for i, v in enumerate(jaxpr.invars)}
    for eqn in jaxpr.eqns:
        ins = [_NONE if isinstance(v, Literal) or not _inexact(v.aval) else depends.get(v, _NONE) for v in eqn.invars]
        inner = eqn.params.get("jaxpr") if eqn.primitive.name in _CALLS else None
        if inner is not None and not str(eqn.params.get("name", "")).startswith(PRIMITIVE_JIT_PREFIX):
            outs = [_NONE.union(*(ins[j] for j in d)) for d in output_deps(getattr(inner, "jaxpr", inner))]
        else:  # a primitive of xgrad or of JAX: every output may depend on every input
            outs = [_NONE.union(*ins)] * len(eqn.outvars)
        for v, d in zip(eqn.outvars, outs, strict=True):
            depends[v] = d if _inexact(v.aval) else _NONE
    return [_NONE if isinstance(v, Literal) else depends.get(v, _NONE) for v in jaxpr.outvars]
