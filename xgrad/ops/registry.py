"""The primitive registry: each op's forward and its backward rules, side by side.

# NOTE [Derivatives are data]
# A primitive is a ``jnp``/``lax`` forward plus one backward rule per argument (or
# one joint rule for all), registered once at import by ``defprim``. A rule is a pure
# function ``rule(g, out, *inputs, **params)`` of the incoming gradient, the values
# the primitive saved and its static parameters, written with xgrad ops so that a
# backward recorded under ``create_graph=True`` is itself differentiable. Inputs the
# primitive does not save reach the rule as an ``Aval`` (shape and dtype only).
# Rules may return gradients in the broadcast shape: ``validate_outputs`` sums them
# down to each input's shape, the one place un-broadcasting is written. The eager
# engine and the compiled lowering replay the same rules.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from xgrad.engine.anomaly import record_forward_trace
from xgrad.engine.node import NO_EDGE, InputMetadata, Node, gradient_edge
from xgrad.engine.saved import SavedTensor
from xgrad.grad_mode import _state as _grad_state
from xgrad.tensor import Tensor

__all__ = ["REGISTRY", "Aval", "Primitive", "PrimitiveNode", "bind", "defprim"]

Rule = Callable[..., Any]


class Aval(NamedTuple):
    """Shape and dtype of an input a primitive did not save."""

    shape: tuple[int, ...]
    dtype: Any

    @property
    def ndim(self) -> int:
        return len(self.shape)


class Primitive:
    """One differentiable op: forward ``impl`` and backward rules.

    >>> import xgrad
    >>> prim = xgrad.mul.primitive
    >>> prim.name, prim.node_name, len(prim.vjps)
    ('mul', 'MulBackward', 2)
    """

    __slots__ = ("_jitted", "impl", "jit", "joint_vjp", "name", "node_name", "num_outputs", "save", "save_out", "vjps")

    def __init__(
        self,
        name: str,
        impl: Callable[..., Any],
        vjps: Sequence[Rule | None] | None,
        joint_vjp: Rule | None,
        save: Sequence[int] | None,
        save_out: bool,
        num_outputs: int,
        jit: bool = True,
    ) -> None:
        self.name = name
        self.node_name = "".join(part.capitalize() for part in name.split("_")) + "Backward"
        self.impl = impl
        self.vjps = tuple(vjps) if vjps is not None else None
        self.joint_vjp = joint_vjp
        self.save = None if save is None else frozenset(save)
        self.save_out = save_out
        self.num_outputs = num_outputs
        self.jit = jit
        self._jitted: dict[Any, Callable[..., Any]] = {}

    def dispatch(self, arrays: list[Any], params: dict[str, Any]) -> Any:
        """Run the forward on arrays.

        # NOTE [Jitted dispatch]
        # Each primitive's forward runs as a ``jax.jit`` function, one per set of static
        # params: jit's C++ fast path dispatches about twice as fast as the ``jnp``
        # wrappers, and that cost is paid once per op in the forward and again for
        # every op a backward rule calls. Params that cannot be hashed (index arrays)
        # run the plain ``impl``.
        """
        if not self.jit:
            return self.impl(*arrays, **params)
        try:
            key = tuple(params.items()) if params else ()
            fn = self._jitted.get(key)
        except TypeError:
            return self.impl(*arrays, **params)
        if fn is None:
            fn = jax.jit(functools.partial(self.impl, **params)) if params else jax.jit(self.impl)
            self._jitted[key] = fn
        return fn(*arrays)

    def __repr__(self) -> str:
        return f"Primitive({self.name})"


REGISTRY: dict[str, Primitive] = {}


def defprim(
    name: str,
    impl: Callable[..., Any],
    vjp: Sequence[Rule | None] | None = None,
    *,
    joint_vjp: Rule | None = None,
    save: Sequence[int] | None = None,
    save_out: bool = False,
    num_outputs: int = 1,
    register: bool = True,
    jit: bool = True,
    doc: str | None = None,
) -> Callable[..., Any]:
    """Register a primitive and return the function that applies it to tensors.

    Args:
        name: registry name; the node is named ``<Name>Backward``.
        impl: the forward on arrays, ``impl(*arrays, **params)``.
        vjp: one rule per positional argument (``None`` for non-differentiable ones).
        joint_vjp: instead of ``vjp``, one rule returning a tuple of all input grads.
        save: indices of inputs the rules read (default: all of them).
        save_out: whether the rules read the output.
        num_outputs: number of arrays ``impl`` returns (a tuple when more than one).
        register: ``False`` for primitives made at run time (``from_jax``) that the
            registry-driven tests cannot know about.
        jit: dispatch the forward through ``jax.jit`` (NOTE [Jitted dispatch]); ``False``
            for forwards that are jitted already or must run eagerly (device moves).
        doc: the docstring of the returned function (summary and ``>>>`` example).

    >>> import jax.numpy as jnp, xgrad
    >>> twice = xgrad.defprim("twice_doc", lambda x: 2 * x, (lambda g, out, x: 2 * g,), save=(), register=False)
    >>> x = xgrad.tensor([1.0, 3.0], requires_grad=True)
    >>> twice(x).sum().backward()
    >>> x.grad.tolist()
    [2.0, 2.0]
    """
    if (vjp is None) == (joint_vjp is None):
        raise ValueError(f"primitive {name!r} needs exactly one of vjp= and joint_vjp=")
    if register and name in REGISTRY:
        raise ValueError(f"primitive {name!r} is already registered")
    prim = Primitive(name, impl, vjp, joint_vjp, save, save_out, num_outputs, jit)
    if register:
        REGISTRY[name] = prim

    def apply(*args: Any, **params: Any) -> Any:
        return bind(prim, args, params)

    apply.__name__ = name
    apply.__qualname__ = name
    apply.__doc__ = doc
    # Owned by the module that defined it (as namedtuple does), so doctest finds its example.
    apply.__module__ = sys._getframe(1).f_globals.get("__name__", apply.__module__)
    apply.primitive = prim  # type: ignore[attr-defined]
    return apply


ERR_DEVICES = "Expected all tensors to be on the same device, but found at least two devices, {a} and {b}!"


def _check_same_devices(tensors: list[Tensor], arrays: list[Any], positions: list[int]) -> None:
    """Raise if tensors sit on different devices; a 0-dim one is moved, as PyTorch allows scalars."""
    first = None
    for t in tensors:
        # Traced values (the compiled backward) have no sharding: XLA places them.
        sharding = getattr(t._array, "sharding", None)
        if sharding is not None and t._array.ndim:
            first = sharding
            break
    if first is None:
        return
    for t, pos in zip(tensors, positions, strict=True):
        sharding = getattr(t._array, "sharding", None)
        if sharding is None or sharding is first or sharding == first or sharding.device_set == first.device_set:
            continue
        if t._array.ndim == 0:
            arrays[pos] = jax.device_put(t._array, first)
            continue
        a = ",".join(str(d) for d in first.device_set)
        b = ",".join(str(d) for d in sharding.device_set)
        raise RuntimeError(ERR_DEVICES.format(a=a, b=b))


def bind(prim: Primitive, args: tuple[Any, ...], params: dict[str, Any]) -> Any:
    """Run ``prim`` on ``args`` and, when grad mode asks for it, record its node."""
    arrays = []
    needs_graph = False
    tensors = []
    positions = []
    for a in args:
        if type(a) is Tensor or isinstance(a, Tensor):
            positions.append(len(arrays))
            arrays.append(a._array)
            tensors.append(a)
            if not needs_graph and (a.grad_fn is not None or a._requires_grad):
                needs_graph = True
        else:
            arrays.append(a)
    if len(tensors) > 1:
        _check_same_devices(tensors, arrays, positions)
    out = prim.dispatch(arrays, params)
    if not (needs_graph and _grad_state.enabled):
        if prim.num_outputs == 1:
            return Tensor(out)
        return tuple(Tensor(o) for o in out)
    return _record(prim, args, params, out)


def _record(prim: Primitive, args: tuple[Any, ...], params: dict[str, Any], out: Any) -> Any:
    outs = (out,) if prim.num_outputs == 1 else tuple(out)
    edges = []
    saved: list[Any] = []
    save = prim.save
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            edges.append(gradient_edge(a) if a.requires_grad else NO_EDGE)
            if save is None or i in save:
                saved.append(SavedTensor(a, is_output=False))
            else:
                saved.append(Aval(a._array.shape, a._array.dtype))
        else:
            edges.append(NO_EDGE)
            saved.append(a)
    differentiable = [jnp.issubdtype(o.dtype, jnp.inexact) for o in outs]
    node = PrimitiveNode(prim, params, tuple(edges), tuple(InputMetadata.of(o) for o in outs), saved)
    results = tuple(
        Tensor._from_graph(o, node, i) if differentiable[i] else Tensor(o) for i, o in enumerate(outs)
    )
    if prim.save_out:
        node.saved_out = tuple(SavedTensor(r, is_output=True) for r in results)
    return results[0] if prim.num_outputs == 1 else results


def incoming_grad(num_outputs: int, grads: list[Tensor | None], metadata: Any) -> Any:
    """The rules' ``g``: the one gradient, or a tuple with missing ones as zeros; ``None`` if none arrived."""
    if num_outputs == 1:
        return grads[0]
    if all(gi is None for gi in grads):
        return None
    return tuple(
        gi if gi is not None else Tensor(jnp.zeros(m.shape, m.dtype, device=getattr(m, "sharding", None)))
        for gi, m in zip(grads, metadata, strict=True)
    )


class PrimitiveNode(Node):
    """The one node class for every primitive: it replays the primitive's rules."""

    __slots__ = ("params", "prim", "saved", "saved_out")

    def __init__(
        self,
        prim: Primitive,
        params: dict[str, Any],
        next_edges: tuple[Any, ...],
        input_metadata: tuple[InputMetadata, ...],
        saved: list[Any],
    ) -> None:
        super().__init__(next_edges, input_metadata)
        self.prim = prim
        self.params = params
        self.saved = saved
        self.saved_out: tuple[SavedTensor, ...] | None = None
        record_forward_trace(self)

    def name(self) -> str:
        return self.prim.node_name

    def unpack_saved(self) -> tuple[list[Any], Any]:
        """The rules' arguments: inputs (tensors, avals or constants) and the output."""
        inputs = [s.unpack(self) if type(s) is SavedTensor else s for s in self.saved]
        # Unsaved outputs reach the rules as their InputMetadata (shape, dtype, ndim).
        out: Any = self.input_metadata if self.saved_out is None else tuple(s.unpack(self) for s in self.saved_out)
        if self.prim.num_outputs == 1:
            out = out[0]
        return inputs, out

    def apply(self, grads: list[Tensor | None]) -> list[Tensor | None]:
        g = incoming_grad(self.prim.num_outputs, grads, self.input_metadata)
        if g is None:
            return [None] * len(self.next_edges)
        inputs, out = self.unpack_saved()
        return self.compute(g, out, inputs, self.needed_outputs())

    def compute(self, g: Any, out: Any, inputs: list[Any], needed: list[bool]) -> list[Tensor | None]:
        """The pure part of ``apply``: rules applied to given values (the compiled path calls it too)."""
        prim = self.prim
        params = self.params
        if prim.joint_vjp is not None:
            if not any(needed):
                return [None] * len(needed)
            return [gi if need else None for gi, need in zip(prim.joint_vjp(g, out, *inputs, **params), needed, strict=True)]
        return [
            rule(g, out, *inputs, **params) if need and rule is not None else None
            for rule, need in zip(prim.vjps, needed, strict=True)  # type: ignore[arg-type]
        ]

    def release_variables(self) -> None:
        # Avals and constants stay: a node that saved no tensor can run again, as in PyTorch.
        for s in self.saved:
            if type(s) is SavedTensor:
                s.release()
        if self.saved_out is not None:
            for s in self.saved_out:
                s.release()
