"""``autograd.Function`` on a plain JAX transformation's tracers: a ``jax.custom_vjp`` (NOTE [Functions on JAX's AD]).

``engine/function.py`` holds the Function protocol and its eager node; this module holds
what the protocol becomes where JAX's AD differentiates, and the checks of a
``backward``'s results that both share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from xgrad import step_trace
from xgrad.dual import tangents_off
from xgrad.engine import engine_ops
from xgrad.grad_mode import _state as _grad_state
from xgrad.grad_mode import graph_off, no_grad
from xgrad.step_trace import array_of
from xgrad.tensor import Tensor
from xgrad.tensor.jax_boundary import identity_with_vjp

if TYPE_CHECKING:
    from xgrad.engine.function import Function, FunctionCtx

__all__ = ["apply_on_jax", "checked_grads", "on_jax_trace", "raises_when_differentiated"]

ERR_NUM_GRADS = "function {name} returned an incorrect number of gradients (expected {expected}, got {got})"
ERR_GRAD_FOR_NON_TENSOR = (
    "function {name} returned a gradient different than None at position {i}, but the corresponding "
    "forward input was not a Tensor"
)
ERR_ONCE_DIFFERENTIABLE = "trying to differentiate twice a function that was marked with @once_differentiable"


def checked_grads(result: Any, name: str, input_is_tensor: Sequence[bool]) -> list[Any]:
    """A ``backward``'s result as one gradient per forward input, checked as PyTorch checks it
    (trailing ``None``s beyond the inputs dropped)."""
    grads = list(result) if isinstance(result, tuple) else [result]
    expected = len(input_is_tensor)
    if len(grads) > expected and all(g is None for g in grads[expected:]):
        del grads[expected:]
    if len(grads) != expected:
        raise RuntimeError(ERR_NUM_GRADS.format(name=name, expected=expected, got=len(grads)))
    for i, g in enumerate(grads):
        if g is not None and not input_is_tensor[i]:
            raise RuntimeError(ERR_GRAD_FOR_NON_TENSOR.format(name=name, i=i))
    return grads


def on_jax_trace(args: Sequence[Any]) -> bool:
    """Whether a tensor among ``args`` is a plain JAX transformation's tracer (not an ``xgrad.compile`` step's)."""
    if step_trace.current() is not None:
        return False
    return any(isinstance(a, Tensor) and isinstance(a._array, jax.core.Tracer) for a in args)


ERR_DIRTY_ON_JAX = (
    "{name}.forward marked an input dirty (ctx.mark_dirty) under a JAX transformation (jax.grad, jax.jit, "
    "jax.vmap, xgrad.func): JAX arrays cannot be modified in place there. Return a new tensor instead of "
    "modifying the input, or run the step eagerly or under xgrad.compile."
)


# NOTE [Functions on JAX's AD]
# On a plain JAX transformation's tracers (``jax.grad(loss)(model)``, ``xgrad.func``,
# ``jax.jit``) a ``Function`` is a ``jax.custom_vjp``: JAX's AD calls the user's
# ``backward`` (after ``setup_context``/``forward``, with ``ctx.saved_tensors`` the
# residuals) instead of differentiating ``forward``, so a straight-through estimator
# gives eager's gradients on every route. A Function with ``jvp`` and no ``backward``
# is a ``jax.custom_jvp`` instead (forward mode, and reverse mode by JAX's transpose of
# it). The ``ctx`` stays on the Python side (its attributes are not JAX values); the
# tensors saved for backward are the residuals. ``needs_input_grad`` says which inputs
# JAX's AD is differentiating; an output no gradient reaches gives ``backward`` zeros,
# or ``None`` after ``ctx.set_materialize_grads(False)``; a ``None`` gradient is JAX's
# zero cotangent. The backward runs with recording off but JAX's AD on, so ``jax.grad``
# of ``jax.grad`` differentiates it as ``create_graph=True`` does, and
# ``once_differentiable`` raises there as in eager. Under ``jax.vmap``/``xgrad.func.vmap``
# JAX batches the forward and the backward (torch.func's ``generate_vmap_rule=True``).
# Non-differentiable outputs go through ``lax.stop_gradient``. Where xgrad records too
# (a tensor that requires grad, grad mode on), the outputs are one ``from_jax`` op
# whose backward is ``jax.vjp`` of the custom_vjp, so a ``backward()`` inside the
# trace runs the user's ``backward`` as well. xgrad's own Functions whose forward is
# the exact math (``_traced_in_step``: the reentrant checkpoint) are differentiated
# through their forward instead, as under ``xgrad.compile``.
def apply_on_jax(
    cls: type[Function], ctx: FunctionCtx, args: tuple[Any, ...], kwargs: dict[str, Any], separate_setup: bool,
    uses_backward: bool,
) -> Any:
    """``cls.apply(*args, **kwargs)`` on a plain JAX transformation's tracers: NOTE [Functions on JAX's AD].

    ``uses_backward``: whether the class has a ``backward`` (a custom_vjp), rather than
    only a ``jvp`` (a custom_jvp).
    """
    positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    ctx._on_jax = True
    layout: dict[str, Any] = {}  # what the forward returned besides its arrays (filled when it runs)

    def forward(arrays: tuple[Any, ...], perturbed: tuple[bool, ...]) -> tuple[Any, ...]:
        inner = list(args)
        needs = [False] * len(args)
        for i, array, p in zip(positions, arrays, perturbed, strict=True):
            t = Tensor(array)
            t._requires_grad = args[i]._requires_grad
            inner[i] = t
            needs[i] = p
        ctx.needs_input_grad = tuple(needs)
        with no_grad(), tangents_off():
            if separate_setup:
                output = cls.forward(*inner, **kwargs)
                cls.setup_context(ctx, tuple(inner), output)
            else:
                output = cls.forward(ctx, *inner, **kwargs)
        if ctx._dirty:
            raise RuntimeError(ERR_DIRTY_ON_JAX.format(name=cls.__name__))
        raw = output if isinstance(output, tuple) else (output,)
        non_diff = {id(t) for t in ctx._non_differentiable}
        layout["tuple"] = isinstance(output, tuple)
        layout["raw"] = [None if isinstance(o, Tensor) else o for o in raw]
        return tuple(
            jax.lax.stop_gradient(o._array) if id(o) in non_diff else o._array for o in raw if isinstance(o, Tensor)
        )

    def grads_in(result: Any) -> tuple[Any, ...]:
        """The user's gradients for the tensor inputs, checked as the eager node checks them."""
        results = checked_grads(result, f"{cls.__name__}Backward", [isinstance(a, Tensor) for a in args])
        out: list[Any] = []
        for i in positions:
            g, array = results[i], args[i]._array
            if g is None or not jnp.issubdtype(array.dtype, jnp.inexact):
                out.append(None)
                continue
            g = array_of(g) if isinstance(g, Tensor) else jnp.asarray(g)
            if g.shape != array.shape:
                g = array_of(engine_ops.sum_to(Tensor(g), array.shape))
            out.append(g.astype(array.dtype))
        return tuple(out)

    def grads_out(cotangents: tuple[Any, ...], avals: tuple[Any, ...]) -> list[Any]:
        """One gradient per forward output, as ``backward`` takes them (``None`` for non-tensors)."""
        it = iter(zip(cotangents, avals, strict=True))
        grads: list[Any] = []
        for o in layout["raw"]:
            if o is not None:
                grads.append(None)
                continue
            c, aval = next(it)
            if isinstance(c, jax.custom_derivatives.SymbolicZero) or c.dtype == jax.dtypes.float0:
                grads.append(Tensor(jnp.zeros(aval.shape, aval.dtype)) if ctx.materialize_grads else None)
            else:
                grads.append(Tensor(c))
        return grads

    tensors = [args[i] for i in positions]
    fn: Callable[..., tuple[Any, ...]]
    if uses_backward:

        @jax.custom_vjp
        def fn_vjp(*arrays: Any) -> tuple[Any, ...]:
            return forward(arrays, (False,) * len(arrays))

        def fwd(*primals: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            outs = forward(tuple(p.value for p in primals), tuple(p.perturbed for p in primals))
            saved = tuple(None if t is None else array_of(t) for t in ctx._to_save)
            ctx._to_save = ()
            layout["avals"] = tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs)
            return outs, saved

        def bwd(saved: tuple[Any, ...], cotangents: tuple[Any, ...]) -> tuple[Any, ...]:
            grads = grads_out(cotangents, layout["avals"])
            ctx._saved_values = tuple(None if a is None else Tensor(a) for a in saved)
            try:
                with graph_off():
                    return grads_in(cls.backward(ctx, *grads))
            finally:
                ctx._saved_values = None

        fn_vjp.defvjp(fwd, bwd, symbolic_zeros=True)
        fn = fn_vjp
    else:

        @jax.custom_jvp
        def fn_jvp(*arrays: Any) -> tuple[Any, ...]:
            return forward(arrays, (False,) * len(arrays))

        def jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            outs = forward(primals, (True,) * len(primals))
            ctx._saved_values = ctx._to_save_for_forward
            try:
                with graph_off(), tangents_off():
                    result = cls.jvp(ctx, *_tangents_in(args, positions, tangents))
            finally:
                ctx._saved_values = None
            results = result if isinstance(result, tuple) else (result,)
            tensor_results = [r for r, o in zip(results, layout["raw"], strict=False) if o is None]
            return outs, tuple(
                jnp.zeros_like(o) if r is None else array_of(r).astype(o.dtype) for r, o in zip(tensor_results, outs, strict=True)
            )

        fn_jvp.defjvp(jvp)
        fn = fn_jvp
    if _grad_state.enabled and any(t.requires_grad for t in tensors):
        outs = list(engine_ops.jax_function(fn, tensors))
    else:
        outs = [Tensor(a) for a in fn(*[t._array for t in tensors])]
    it = iter(outs)
    result = [next(it) if o is None else o for o in layout["raw"]]
    return tuple(result) if layout["tuple"] else result[0]


def _tangents_in(args: tuple[Any, ...], positions: list[int], tangents: tuple[Any, ...]) -> list[Any]:
    """One tangent per forward input, as ``jvp`` takes them (``None`` for non-tensors)."""
    full: list[Any] = [None] * len(args)
    for i, t in zip(positions, tangents, strict=True):
        full[i] = Tensor(t)
    return full


def _raise_at_differentiation(cotangents: tuple[Any, ...]) -> tuple[Any, ...]:
    raise RuntimeError(ERR_ONCE_DIFFERENTIABLE)


_identity_raising_when_differentiated = identity_with_vjp(_raise_at_differentiation)


def raises_when_differentiated(t: Tensor) -> Tensor:
    """``t``'s value, with an identity whose JAX derivative raises (as ``_DelayedError`` in eager)."""
    if not jnp.issubdtype(t._array.dtype, jnp.inexact):
        return t
    return Tensor(_identity_raising_when_differentiated(t._array)[0])
