"""Ops from JAX functions: ``from_jax(fn)``, whose backward is ``jax.vjp`` of ``fn``.

# NOTE [Backward of from_jax]
# The backward of a ``from_jax`` op is itself a ``from_jax`` op (the vjp of ``fn``
# as a function of the primals and the cotangents), so ``create_graph=True`` gives
# gradients of any order with no hand-written rule. Primitives whose derivative is
# best left to JAX (einsum, conv, prod) reuse the same construction via ``vjp_of``.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.engine.dataflow import output_deps
from xgrad.engine.rules import register_jax_op
from xgrad.ops.registry import Primitive, bind, defprim
from xgrad.tensor import Tensor, is_tensor

__all__ = ["from_jax", "jax_function", "vjp_of"]


def _freeze(value: Any) -> Any:
    """A hashable stand-in for a static keyword argument."""
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return id(value)
    return value


def _differentiable(x: Any) -> bool:
    return isinstance(x, Tensor) and jnp.issubdtype(x.dtype, jnp.inexact)


_lock = threading.Lock()


class _JaxFunction:
    """``fn`` as a family of primitives, one per input structure and static kwargs."""

    def __init__(self, fn: Callable[..., Any], name: str, deps: list[frozenset[int]] | None = None) -> None:
        self.fn = fn
        self.name = name
        self.deps = deps  # which inputs each output depends on, when the caller knows better than the jaxpr
        self.primitives: dict[Any, tuple[Primitive, Any, list[frozenset[int]]]] = {}
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **static: Any) -> Any:
        flat, in_tree = jax.tree_util.tree_flatten(args, is_leaf=is_tensor)
        dynamic = [_is_array(x) for x in flat]
        if not all(dynamic):
            _check_static(self.fn, args, flat, dynamic)
        key = (
            in_tree,
            _freeze(static),
            tuple(_differentiable(x) if d else _freeze(x) for x, d in zip(flat, dynamic, strict=True)),
        )
        entry = self.primitives.get(key)
        if entry is None:
            entry = self._make_primitive(flat, dynamic, in_tree, static)
            with _lock:
                self.primitives.setdefault(key, entry)
        prim, out_tree, deps = entry
        inputs = tuple(x for x, d in zip(flat, dynamic, strict=True) if d)
        outs = bind(prim, inputs, {})
        outs = outs if prim.num_outputs > 1 else (outs,)
        if any(o.grad_fn is not None for o in outs):
            outs = _detach_independent(outs, inputs, deps)
        return jax.tree_util.tree_unflatten(out_tree, outs)

    def _make_primitive(self, flat: list[Any], dynamic: list[bool], in_tree: Any,
                        static: dict[str, Any]) -> tuple[Primitive, Any, list[frozenset[int]]]:
        fn = self.fn
        template = [None if d else x for x, d in zip(flat, dynamic, strict=True)]  # the static leaves
        slots = [i for i, d in enumerate(dynamic) if d]

        def call_flat(*flat_arrays: Any) -> Any:
            leaves = list(template)
            for i, a in zip(slots, flat_arrays, strict=True):
                leaves[i] = a
            return fn(*jax.tree_util.tree_unflatten(in_tree, leaves), **static)

        arrays = [flat[i]._array if isinstance(flat[i], Tensor) else flat[i] for i in slots]
        closed, out_shape = jax.make_jaxpr(call_flat, return_shape=True)(*arrays)
        deps = output_deps(closed.jaxpr) if self.deps is None else self.deps
        out_leaves, out_tree = jax.tree_util.tree_flatten(out_shape)
        num_outputs = len(out_leaves)
        diff_mask = tuple(_differentiable(flat[i]) for i in slots)

        # jit: one trace per input signature instead of one per call (jax.vjp traces).
        @jax.jit
        def impl(*flat_arrays: Any) -> Any:
            leaves = jax.tree_util.tree_leaves(call_flat(*flat_arrays))
            return tuple(leaves) if num_outputs > 1 else leaves[0]

        vjp_op = _vjp_function(impl, self.name, diff_mask, num_outputs)

        def joint_vjp(g: Any, out: Any, *inputs: Any) -> tuple[Any, ...]:
            cotangents = g if num_outputs > 1 else (g,)
            return _scatter_grads(vjp_op(*inputs, *cotangents), diff_mask)

        apply = defprim(self.name, impl, joint_vjp=joint_vjp, num_outputs=num_outputs, register=False, jit=False)
        return apply.primitive, out_tree, deps  # type: ignore[attr-defined]


# NOTE [Outputs independent of the graph]
# An output of a ``from_jax`` op that depends on no input requiring grad (by the jaxpr's
# data flow) leaves the graph, as eager's ops would give it no ``grad_fn``: the vjp of a
# linear function (the double-backward trick, a compiled backward recorded under
# ``create_graph``) does not depend on the primals, and must not claim to.
def _detach_independent(outs: tuple[Tensor, ...], inputs: tuple[Any, ...], deps: list[frozenset[int]]) -> tuple[Tensor, ...]:
    """``outs`` with those that depend on no input requiring grad detached (NOTE [Outputs independent of the graph])."""
    requires = [isinstance(x, Tensor) and x.requires_grad for x in inputs]
    result = []
    for o, d in zip(outs, deps, strict=True):
        if o.grad_fn is not None and not any(requires[i] for i in d):
            detached = Tensor(o._array)
            detached._fw_grad = o._fw_grad
            o = detached
        result.append(o)
    return tuple(result)


def _is_array(x: Any) -> bool:
    """A leaf ``from_jax`` passes as an input (differentiable when a floating Tensor); any other leaf is static."""
    return isinstance(x, (Tensor, jax.Array, np.ndarray, np.generic))


def _check_static(fn: Callable[..., Any], args: tuple[Any, ...], flat: list[Any], dynamic: list[bool]) -> None:
    """Raise on a static leaf that is an array of some other library: it must not become a constant unseen."""
    for x, d in zip(flat, dynamic, strict=True):
        if not d and (hasattr(x, "__jax_array__") or hasattr(x, "__array__") or hasattr(x, "__array_interface__")):
            break
    else:
        return
    paths = jax.tree_util.tree_flatten_with_path(args, is_leaf=is_tensor)[0]
    names = _argument_names(fn, len(args))
    for (path, x), d in zip(paths, dynamic, strict=True):
        if not d and (hasattr(x, "__jax_array__") or hasattr(x, "__array__") or hasattr(x, "__array_interface__")):
            where = names[path[0].idx] + jax.tree_util.keystr(path[1:])  # type: ignore[attr-defined]
            raise TypeError(
                f"from_jax: argument {where} is a {type(x).__module__}.{type(x).__qualname__}, an array of another "
                "library: an xgrad op takes Tensors and jax.Arrays as inputs, and every other leaf as a static value. "
                f"Convert it with xgrad.tensor(...) (or jnp.asarray(...)) first."
            )


def _argument_names(fn: Callable[..., Any], n: int) -> list[str]:
    """What the user calls positional argument ``i``: its parameter name, else ``args[i]``."""
    try:
        params = [
            p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"args[{i}]" for i in range(n)]


def _vjp_function(impl: Callable[..., Any], name: str, diff_mask: tuple[bool, ...], num_outputs: int) -> _JaxFunction:
    """The vjp of ``impl`` w.r.t. its differentiable inputs, as another ``from_jax`` op."""
    n_in = len(diff_mask)

    def vjp(*args: Any) -> tuple[Any, ...]:
        primals, cotangents = args[:n_in], args[n_in:]
        diff_idx = [i for i, d in enumerate(diff_mask) if d]

        def of_diff(*diff_args: Any) -> Any:
            full = list(primals)
            for i, a in zip(diff_idx, diff_args, strict=True):
                full[i] = a
            return impl(*full)

        _, pullback = jax.vjp(of_diff, *(primals[i] for i in diff_idx))
        ct = tuple(cotangents) if num_outputs > 1 else cotangents[0]
        return tuple(pullback(ct))

    return _JaxFunction(vjp, name.removesuffix("_vjp") + "_vjp")


def _scatter_grads(diff_grads: Any, diff_mask: tuple[bool, ...]) -> tuple[Any, ...]:
    grads = iter(diff_grads if isinstance(diff_grads, tuple) else (diff_grads,))
    return tuple(next(grads) if d else None for d in diff_mask)


def from_jax(fn: Callable[..., Any], name: str | None = None, *, trace: bool = False) -> Callable[..., Any]:
    """Turn a JAX-traceable function of arrays into an xgrad op.

    The op takes what ``fn`` takes, with Tensors where ``fn`` takes arrays: any pytrees
    (an Equinox module, a dict of parameters). As ``eqx.filter_jit`` does, it splits
    their leaves: Tensors and arrays are the op's inputs (floating Tensors
    differentiable), every other leaf (an activation function, an int) is static, as
    are keyword arguments; each new static value makes a new primitive. The backward is
    ``jax.vjp`` of ``fn``, itself an op, so gradients of any order work.

    Args:
        fn: a function of arrays (pytrees in and out) that ``jax.vjp`` can trace.
        name: the op's name (nodes show ``<Name>Backward``); default ``fn.__name__``.
        trace: run ``fn`` equation by equation as xgrad nodes instead of as one node, so
            that hooks, anomaly mode, the profiler and ``xgrad.viz`` see inside it, and
            ``xgrad.intermediates()`` collects its intermediate values by name (NOTE
            [Traced from_jax] in ``xgrad/ops/jaxtrace.py``). Arrays and Tensors in the
            arguments are inputs; any other leaf (an activation function, an int) is static.

    >>> import xgrad, jax.numpy as jnp
    >>> cube = xgrad.ops.from_jax(lambda x: x ** 3, name="cube")
    >>> x = xgrad.tensor(2.0, requires_grad=True)
    >>> (g,) = xgrad.autograd.grad(cube(x), x, create_graph=True)
    >>> g.item(), xgrad.autograd.grad(g, x)[0].item()
    (12.0, 12.0)
    >>> layer = {"w": xgrad.tensor([1.0, 2.0], requires_grad=True), "act": jnp.tanh, "scale": 3}
    >>> y = xgrad.from_jax(lambda p, x: p["act"](p["w"] * x) * p["scale"])(layer, xgrad.tensor(0.0))
    >>> y.sum().backward(); layer["w"].grad.tolist()
    [0.0, 0.0]
    """
    name = name or getattr(fn, "__name__", "from_jax").strip("<>")
    if trace:
        from xgrad.ops.jaxtrace import TracedJaxFunction  # it builds on this module

        return TracedJaxFunction(fn, name)
    return _JaxFunction(fn, name)


def jax_function(fn: Callable[..., Any], tensors: Sequence[Tensor]) -> tuple[Tensor, ...]:
    """``fn(*arrays) -> tuple of arrays`` applied to ``tensors`` as one op (NOTE [Functions on JAX's AD])."""
    outs = _JaxFunction(fn, getattr(fn, "__name__", "jax_function"))(*tensors)
    return outs if isinstance(outs, tuple) else (outs,)


_vjp_cache: dict[Any, _JaxFunction] = {}


def vjp_of(name: str, impl: Callable[..., Any], **params: Any) -> Callable[..., Any]:
    """``f(g, *inputs) -> grads``: the vjp of ``impl(*inputs, **params)`` as a differentiable op.

    For a primitive whose rule is best left to JAX; all inputs are treated as
    differentiable when they are float tensors.
    """

    def bound(g: Tensor, *inputs: Any) -> Any:  # a tuple of grads, or the grad when one input
        mask = tuple(_differentiable(x) for x in inputs)
        key = (impl, _freeze(params), mask)
        op = _vjp_cache.get(key)
        if op is None:
            op = _vjp_function(functools.partial(impl, **params), name, mask, 1)
            with _lock:
                _vjp_cache.setdefault(key, op)
        grads = op(*inputs, g)
        grads = grads if isinstance(grads, tuple) else (grads,)
        full = _scatter_grads(grads, mask)
        return full if len(full) > 1 else full[0]

    return bound


def _program_op(fn: Callable[..., Any], name: str, deps: list[frozenset[int]]) -> _JaxFunction:
    """A compiled backward segment as one op, its outputs' dependencies given by the segment's ops."""
    return _JaxFunction(fn, name, deps)


register_jax_op(_program_op)  # the compiled backward runs create_graph segments as from_jax ops (NOTE [Rule nodes])
