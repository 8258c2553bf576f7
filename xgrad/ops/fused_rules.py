"""What a primitive's rules run as in an eager backward: one ``jax.jit`` of all of them per static signature
(NOTE [Fused eager rules] in ``registry.py``), and the device scalars its ops take for Python scalars (NOTE [Scalar
constants])."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from xgrad.bounded_cache import BoundedCache
from xgrad.engine.node import InputMetadata
from xgrad.engine.rules import RuleArgs
from xgrad.fast_compile import fast_compiler_options
from xgrad.grad_mode import _state as _grad_state
from xgrad.tensor import Tensor

if TYPE_CHECKING:
    from xgrad.ops.registry import Primitive

logger = logging.getLogger(__name__)

# NOTE [Scalar constants]
# A Python scalar passed to a jitted function is copied to the device on every call
# (about a third of a small op's dispatch). An op with a scalar operand (``x * 0.5``,
# and so the rule of such an op in every backward) takes it from a bounded cache of
# device scalars instead: ``jnp.asarray`` of a Python scalar is weakly typed, so jit
# gives it the same abstract value, the same promotion and the same executable as
# the scalar itself. Only with concrete operands: under a trace a scalar stays a
# literal of the program.
_MAX_DEVICE_SCALARS = 1024
_DEVICE_SCALARS: BoundedCache[tuple[Any, ...], Any] = BoundedCache(_MAX_DEVICE_SCALARS)


def device_scalar(value: Any) -> Any:
    # x64 decides the scalar's dtype; -0.0 == 0.0 as a key, so zeros key their sign too.
    x64 = jax.config.jax_enable_x64  # type: ignore[attr-defined]  # JAX's Config stub does not list its flags
    key = (type(value), value, x64) if value else (type(value), value, str(value), x64)
    array = _DEVICE_SCALARS.get(key)
    if array is None:
        if value != value:  # NaN never equals a key: pass it as it is
            return value
        array = _DEVICE_SCALARS[key] = jnp.asarray(value)
    return array


MAX_FUSED = 256  # signatures kept per primitive
UNFUSED = object()  # a signature whose rules stay op by op
_ARRAY = object()  # in a signature: an argument passed as an array
_SCALAR = object()  # in a signature: a Python float passed as a weakly typed scalar


# NOTE [Unmade zeros]
# A node with several outputs whose grads did not all arrive (cross_entropy's loss
# reached, its log-probabilities, count and weights not) runs its rules on zeros for the
# missing ones. Made by the engine, those zeros were a program of their own per shape and
# dtype, compiled again at every new batch size, and an argument of the fused rules. For
# fused rules the engine leaves them unmade instead (``incoming_grad(..., unmade=True)``:
# the output's ``InputMetadata`` in their place) and the rules' program makes them: one
# program fewer to compile per new shape, and XLA compiles what reads a constant zero
# (the loss rule's sum of ``g_logp``) as such. The arithmetic is the same, and the rules
# are compiled without the algebraic simplifier, so the bits are too (NaN and inf
# included: ``inf * 0`` is still computed). Rules that run op by op get the zeros made
# (``made_grads``), and so do outputs spread over several devices, whose zeros keep their
# placement. Which signatures fuse is decided on the rules' own ops, the zeros' not counted.


def fusion_signature(args: RuleArgs) -> tuple[Any, Any, list[Any]]:
    """The static key of a node's rules and their array arguments, or ``(None, ...)`` when they cannot be fused."""
    g, out, inputs, params, needed = args
    arrays: list[Any] = []
    signature: list[Any] = []
    for value in inputs:
        kind = type(value)
        if kind is Tensor or isinstance(value, Tensor):  # Parameters too: never a static value
            signature.append(_ARRAY)
            arrays.append(value._array)
        elif kind is float:
            signature.append(_SCALAR)
            arrays.append(device_scalar(value))
        else:
            signature.append(value)
    # What the rules get as ``out``: the output(s) saved, or only their metadata (shape and dtype).
    if isinstance(out, Tensor):
        out_signature: Any = ("array",)
        arrays.append(out._array)
    elif type(out) is InputMetadata:
        out_signature = ("metadata", out.shape, out.dtype)
    elif type(out) is tuple and out and isinstance(out[0], Tensor):
        out_signature = ("arrays", len(out))
        arrays.extend(o._array for o in out)
    elif type(out) is tuple:
        out_signature = ("metadatas", tuple((m.shape, m.dtype) for m in out))
    else:
        return None, None, arrays
    # What the rules get as ``g``: one array, or per output an array or the shape and dtype
    # of the zeros the program makes (NOTE [Unmade zeros]).
    if isinstance(g, Tensor):
        g_arrays: Any = g._array
        g_signature: Any = None
    else:
        g_arrays = tuple([None if type(gi) is InputMetadata else gi._array for gi in g])
        g_signature = tuple([(gi.shape, gi.dtype) if type(gi) is InputMetadata else None for gi in g])
    for a in arrays:
        if isinstance(a, jax.core.Tracer):
            return None, None, arrays
    if isinstance(g_arrays, jax.core.Tracer) or (type(g_arrays) is tuple and any(isinstance(a, jax.core.Tracer) for a in g_arrays)):
        return None, None, arrays
    try:
        key = (tuple(params.items()) if params else (), tuple(needed), tuple(signature), out_signature, g_signature)
        hash(key)
    except TypeError:  # unhashable params or constants (index arrays)
        return None, None, arrays
    return key, g_arrays, arrays


# XLA's algebraic simplifier rewrites float arithmetic in ways that change NaN and inf
# (NOTE [Fused eager rules]); the fused rules are compiled without it, and fast (NOTE [Fast compiles]).
_NO_ALGEBRAIC_SIMPLIFIER = {"xla_disable_hlo_passes": "algsimp"}


def fuse(prim: Primitive, key: Any, params: dict[str, Any], g_arrays: Any, arrays: list[Any]) -> Any:
    """One ``jax.jit`` of ``prim``'s rules for the signature ``key``, or ``UNFUSED`` (NOTE [Fused eager rules]).

    The rules are traced once, by the jit itself, on the first node's values to count their ops.
    """
    _, needed, signature, out_signature, g_signature = key

    def rules(g_arrays: Any, arrays: list[Any]) -> list[Any]:
        it = iter(arrays)
        inputs = [Tensor(next(it)) if s is _ARRAY else next(it) if s is _SCALAR else s for s in signature]
        kind = out_signature[0]
        if kind == "array":
            out: Any = Tensor(next(it))
        elif kind == "arrays":
            out = tuple(Tensor(next(it)) for _ in range(out_signature[1]))
        elif kind == "metadata":
            out = InputMetadata(out_signature[1], out_signature[2], None)
        else:
            out = tuple(InputMetadata(shape, dtype, None) for shape, dtype in out_signature[1])
        if type(g_arrays) is not tuple:
            g: Any = Tensor(g_arrays)
        else:
            g = tuple([Tensor(jnp.zeros(*zeros) if a is None else a) for a, zeros in zip(g_arrays, g_signature, strict=True)])
        previous = _grad_state.enabled
        _grad_state.enabled = False  # a retrace may happen outside the engine's no-grad backward
        try:
            grads = prim.backward(RuleArgs(g, out, inputs, params, needed))
        finally:
            _grad_state.enabled = previous
        return [None if gi is None else gi._array for gi in grads]

    fused = jax.jit(rules, compiler_options={**fast_compiler_options(), **_NO_ALGEBRAIC_SIMPLIFIER})
    try:
        # jit's own trace: the first call reuses it instead of tracing the rules again.
        traced = fused.trace(g_arrays, arrays)
    except Exception:  # noqa: BLE001 - untraceable rules run op by op, which raises any real error
        logger.debug("%s: its rules cannot be traced as one program; they run op by op", prim.node_name, exc_info=True)
        return UNFUSED
    if len(traced.jaxpr.jaxpr.eqns) - _zeros_ops(g_signature) < 2:  # one op or none: fusing would save no dispatch
        return UNFUSED
    return fused


def _zeros_ops(g_signature: Any) -> int:
    """How many of a fused trace's ops make its unmade zeros: the rules' own ops decide whether to fuse."""
    unmade = [zeros for zeros in g_signature or () if zeros is not None]
    return len(jax.make_jaxpr(lambda: [jnp.zeros(*zeros) for zeros in unmade])().eqns) if unmade else 0
