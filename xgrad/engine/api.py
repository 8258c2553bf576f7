"""``backward`` and ``grad``: argument handling in front of the engine."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.bounded_cache import BoundedCache
from xgrad.engine import engine, engine_ops
from xgrad.engine.node import Edge, Node, gradient_edge, sharding_of
from xgrad.engine.threads import set_multithreading_enabled
from xgrad.tensor import Tensor

__all__ = ["GradientEdge", "backward", "grad"]

ERR_NO_GRAD = "element {i} of tensors does not require grad and does not have a grad_fn"
ERR_INPUT_NO_GRAD = "One of the differentiated Tensors does not require grad"
ERR_UNUSED = (
    "One of the differentiated Tensors appears to not have been used in the graph. "
    "Set allow_unused=True if this is the desired behavior."
)
WARN_BACKWARD_CREATE_GRAPH = (
    "Using backward() with create_graph=True will create a reference cycle between the "
    "parameter and its gradient which can cause a memory leak. We recommend using "
    "autograd.grad when creating the graph to avoid this. If you have to use this function, "
    "make sure to reset the .grad fields of your parameters to None after use to break the "
    "cycle and avoid the leak."
)


class GradientEdge(NamedTuple):
    """Where the gradient of a tensor enters the graph: input ``output_nr`` of ``node``.

    ``xgrad.autograd.graph.get_gradient_edge(t)`` makes one; ``grad`` and ``backward``
    take it among their ``inputs`` (the gradient arriving there is returned).
    """

    node: Node
    output_nr: int


def _as_inputs(value: Any) -> tuple[Tensor | GradientEdge, ...]:
    """``inputs`` of ``grad``/``backward``: Tensors and GradientEdges."""
    if isinstance(value, (Tensor, GradientEdge)):
        return (value,)
    if isinstance(value, (list, tuple)):
        for v in value:
            if not isinstance(v, (Tensor, GradientEdge)):
                raise TypeError(f"inputs must be Tensors (or GradientEdges), got {type(v).__name__}")
        return tuple(value)
    raise TypeError(f"inputs must be a Tensor or a sequence of Tensors (or GradientEdges), got {type(value).__name__}")


def _input_edge(value: Tensor | GradientEdge) -> Edge:
    if isinstance(value, GradientEdge):
        return Edge(value.node, value.output_nr)
    return gradient_edge(value)


def _as_tensors(value: Any, what: str) -> tuple[Tensor, ...]:
    if isinstance(value, Tensor):
        return (value,)
    if isinstance(value, (list, tuple)):
        for v in value:
            if not isinstance(v, Tensor):
                raise TypeError(f"{what} must be Tensors, got {type(v).__name__}")
        return tuple(value)
    raise TypeError(f"{what} must be a Tensor or a sequence of Tensors, got {type(value).__name__}")


# The implicit root grads, one array per (shape, dtype, weak type, sharding): arrays are
# immutable, so every backward of a scalar loss can share its ``1``. (This dict's
# reference also keeps the compiled backward from donating one that became a ``.grad``.)
_MAX_ROOT_ONES = 256
_ROOT_ONES: BoundedCache[Any, jax.Array] = BoundedCache(_MAX_ROOT_ONES)


def _ones_like(array: jax.Array) -> jax.Array:
    """Ones shaped, typed and placed like ``array``, made once per kind of array."""
    if isinstance(array, jax.core.Tracer):
        # Under a trace (``xgrad.compile``, ``jax.jit``) the ones are part of the program:
        # a tracer has no concrete sharding, and a cached array would become a constant.
        return jnp.ones_like(array)
    key = (array.aval, array.sharding)
    ones = _ROOT_ONES.get(key)
    if ones is None:
        if array.aval.weak_type:  # a host array is never weakly typed
            ones = jax.jit(jnp.ones_like, out_shardings=array.sharding)(array)
        else:  # a copy from the host: unlike a jitted ``ones_like``, nothing to compile on the first backward
            ones = jax.device_put(np.ones(array.shape, array.dtype), array.sharding)
        ones = _ROOT_ONES.setdefault(key, ones)
    return ones


def _make_grads(outputs: Sequence[Tensor], grads: Sequence[Any]) -> list[Tensor]:
    """The root gradients: given ones checked against their outputs, implicit ones made."""
    if len(grads) != len(outputs):
        raise RuntimeError(f"got {len(outputs)} tensors and {len(grads)} gradients")
    result = []
    for i, (out, g) in enumerate(zip(outputs, grads, strict=True)):
        if g is None:
            # An output that does not require grad gets its error from _root_edges.
            if out.requires_grad and out._array.size != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            if out.requires_grad and not jnp.issubdtype(out._array.dtype, jnp.floating):
                raise RuntimeError(f"grad can be implicitly created only for real scalar outputs but got {out._array.dtype}")
            result.append(Tensor(_ones_like(out._array)))
            continue
        if isinstance(g, jax.Array):
            g = Tensor(jnp.asarray(g, dtype=out._array.dtype))
        elif not isinstance(g, Tensor):
            # Host data (lists, scalars, NumPy) is placed where the output lives.
            host, sharding = np.asarray(g, dtype=out._array.dtype), sharding_of(out._array)
            g = Tensor(jnp.asarray(host) if sharding is None else jax.device_put(host, sharding))  # traced: XLA places it
        if g._array.shape != out._array.shape:
            raise RuntimeError(
                f"Mismatch in shape: grad_output[{i}] has a shape of {list(g._array.shape)} and "
                f"output[{i}] has a shape of {list(out._array.shape)}."
            )
        result.append(g)
    return result


def _root_edges(outputs: Sequence[Tensor]) -> list[Edge]:
    edges = []
    for i, t in enumerate(outputs):
        if not t.requires_grad:
            raise RuntimeError(ERR_NO_GRAD.format(i=i))
        edges.append(gradient_edge(t))
    return edges


def _use_compiled(compiled: bool | None, root_grads: list[Tensor]) -> bool:
    if root_grads and isinstance(root_grads[0]._array, jax.core.Tracer):
        # Under a trace (xgrad.compile, jax.jit) the eager engine runs on tracers and
        # the trace itself is the compiled program.
        return False
    from xgrad.engine import compiled as compiled_module

    return compiled_module.is_enabled() if compiled is None else bool(compiled)


def backward(
    tensors: Tensor | Sequence[Tensor],
    grad_tensors: Any = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    inputs: Tensor | Sequence[Tensor] | None = None,
    compiled: bool | None = None,
) -> None:
    """Accumulate gradients of ``tensors`` into the ``.grad`` of the graph's leaves.

    Args:
        tensors: the roots of the backward.
        grad_tensors: one gradient per root (``None`` for one-element roots).
        retain_graph: keep saved values for another backward (default: ``create_graph``).
        create_graph: record the backward, for higher-order gradients.
        inputs: accumulate only into these tensors (non-leaves among them retain grad).
        compiled: run as one cached ``jax.jit`` program (default: the compiled switch).

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> xgrad.autograd.backward([(x * x).sum()])
    >>> x.grad.tolist()
    [2.0, 4.0]
    """
    roots = _as_tensors(tensors, "tensors")
    if grad_tensors is None:
        grads: Sequence[Any] = [None] * len(roots)
    elif isinstance(grad_tensors, (list, tuple)):
        grads = grad_tensors
    else:
        grads = [grad_tensors]
    input_edges: list[Edge] = []
    if inputs is not None:
        input_tensors = _as_inputs(inputs)
        if not input_tensors:
            raise RuntimeError("'inputs' argument to backward() cannot be empty.")
        for t in input_tensors:
            if isinstance(t, Tensor):
                if not t.requires_grad:
                    raise RuntimeError(ERR_INPUT_NO_GRAD)
                if t.grad_fn is not None:
                    t.retain_grad()
            input_edges.append(_input_edge(t))
    if retain_graph is None:
        retain_graph = create_graph
    if create_graph:
        warnings.warn(WARN_BACKWARD_CREATE_GRAPH, UserWarning, stacklevel=3)
    root_grads = _make_grads(roots, grads)
    edges = _root_edges(roots)
    if _use_compiled(compiled, root_grads):
        from xgrad.engine import compiled as compiled_module

        compiled_module.execute(edges, root_grads, retain_graph, create_graph, True, input_edges)
        return
    engine.execute(edges, root_grads, retain_graph, create_graph, True, input_edges)


def grad(
    outputs: Tensor | Sequence[Tensor],
    inputs: Tensor | Sequence[Tensor],
    grad_outputs: Any = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    allow_unused: bool | None = None,
    materialize_grads: bool = False,
    compiled: bool | None = None,
    is_grads_batched: bool = False,
) -> tuple[Tensor | None, ...]:
    """The gradients of ``outputs`` w.r.t. ``inputs``, returned instead of accumulated.

    Args:
        outputs: the roots.
        inputs: the tensors to differentiate with respect to.
        grad_outputs: one gradient per output (``None`` for one-element outputs).
        retain_graph: keep saved values (default: ``create_graph``).
        create_graph: record the backward, for higher-order gradients.
        allow_unused: return ``None`` for inputs the outputs do not depend on, instead
            of raising (default: ``materialize_grads``).
        materialize_grads: return zeros instead of ``None`` for unused inputs.
        compiled: run as one cached ``jax.jit`` program (default: the compiled switch).
        is_grads_batched: the first dim of every ``grad_outputs`` entry is a batch dim:
            the backward runs once for all of them, under ``jax.vmap``, and each
            returned gradient has that batch dim first (vector-Jacobian products of
            many vectors at once, such as a whole Jacobian).

    ``inputs`` may hold ``GradientEdge``s (``xgrad.autograd.graph.get_gradient_edge``):
    the gradient arriving at that edge is returned.

    >>> import xgrad
    >>> x = xgrad.tensor(3.0, requires_grad=True)
    >>> (g,) = xgrad.autograd.grad(x ** 3, x, create_graph=True)
    >>> g.item(), xgrad.autograd.grad(g, x)[0].item()
    (27.0, 18.0)
    """
    outs = _as_tensors(outputs, "outputs")
    ins = _as_inputs(inputs)
    if materialize_grads and allow_unused is False:
        raise ValueError(
            "Expected allow_unused to be True or not passed when materialize_grads=True, but got: allow_unused=False."
        )
    if allow_unused is None:
        allow_unused = materialize_grads
    if grad_outputs is None:
        grads: Sequence[Any] = [None] * len(outs)
    elif isinstance(grad_outputs, (list, tuple)):
        grads = grad_outputs
    else:
        grads = [grad_outputs]
    if retain_graph is None:
        retain_graph = create_graph
    if not ins:
        raise ValueError("grad requires non-empty inputs.")
    for t in ins:
        if isinstance(t, Tensor) and not t.requires_grad:
            raise RuntimeError(ERR_INPUT_NO_GRAD)
    input_edges = [_input_edge(t) for t in ins]
    if is_grads_batched:
        result = _batched_grads(outs, grads, input_edges, retain_graph, create_graph, _use_compiled(compiled, []))
    else:
        root_grads = _make_grads(outs, grads)
        edges = _root_edges(outs)
        if _use_compiled(compiled, root_grads):
            from xgrad.engine import compiled as compiled_module

            result = compiled_module.execute(edges, root_grads, retain_graph, create_graph, False, input_edges)
            result = [_on_device_of(t, g) for t, g in zip(ins, result, strict=True)]
        else:
            result = engine.execute(edges, root_grads, retain_graph, create_graph, False, input_edges)
    batch = (grads[0].shape[0],) if is_grads_batched else ()
    final: list[Tensor | None] = []
    if materialize_grads and any(g is None and isinstance(t, GradientEdge) for t, g in zip(ins, result, strict=True)):
        raise RuntimeError(ERR_MATERIALIZE_EDGE)
    for t, g in zip(ins, result, strict=True):
        if g is None:
            if materialize_grads:
                # PyTorch's ``zeros_like(input, requires_grad=create_graph)``.
                g = Tensor(_zeros_for(t, batch), requires_grad=create_graph)
            elif not allow_unused:
                raise RuntimeError(ERR_UNUSED)
        elif not create_graph and g.grad_fn is not None:
            g = g.detach()
        final.append(g)
    return tuple(final)


def _on_device_of(value: Tensor | GradientEdge, grad: Tensor | None) -> Tensor | None:
    """``grad`` where eager leaves it: on its input's devices (one compiled program runs on one device)."""
    if grad is None or not isinstance(value, Tensor):
        return grad
    want, have = sharding_of(value._array), sharding_of(grad._array)
    if want is None or have is None or have.device_set == want.device_set:  # traced (``xgrad.compile``): XLA places it
        return grad
    return grad.to(want)


ERR_MATERIALIZE_EDGE = "materialize_grads cannot be used when the given input is a GradientEdge"


def _zeros_for(value: Tensor | GradientEdge, batch: tuple[int, ...]) -> jax.Array:
    """Zeros shaped like the unused input tensor ``value``, after ``batch``."""
    assert isinstance(value, Tensor), "unused GradientEdges are refused before"
    like = value._array
    # A traced array has no placement of its own (``sharding_of`` is None): XLA places the zeros.
    return jnp.zeros(batch + like.shape, like.dtype, device=sharding_of(like) if not batch else None)


ERR_BATCHED_GRADS = (
    "grad(..., is_grads_batched=True) needs grad_outputs: one Tensor per output, whose first dim is the batch "
    "dim and whose other dims are the output's shape"
)


def _batched_grads(
    outs: Sequence[Tensor], grads: Sequence[Any], input_edges: list[Edge], retain_graph: bool, create_graph: bool,
    compiled: bool,
) -> list[Tensor | None]:
    """``grad`` with a batch dim in front of every grad_output: the backward runs under ``jax.vmap``.

    # NOTE [Batched grads]
    # The engine runs on tracers as well as on arrays (the compiled backward relies on
    # it), so one backward traced by ``jax.vmap`` over the grad_outputs' first dim gives
    # every row's vector-Jacobian product in one pass: the saved values stay unbatched,
    # the rules see batched gradients. vmap traces the function once, so the graph is
    # walked once and ``retain_graph`` keeps its usual meaning. Everything runs on the
    # calling thread (tracers must not cross to the device workers). With
    # ``create_graph`` the result must be differentiable, which a vmap trace cannot
    # leave behind: the rows then run one by one, recorded, and are stacked.
    """
    if any(g is None for g in grads) or len(grads) != len(outs):
        raise RuntimeError(ERR_BATCHED_GRADS)
    tensors = [g if isinstance(g, Tensor) else Tensor(jnp.asarray(g, dtype=out._array.dtype)) for g, out in zip(grads, outs, strict=True)]
    for i, (g, out) in enumerate(zip(tensors, outs, strict=True)):
        if g._array.ndim == 0 or g._array.shape[1:] != out._array.shape:
            raise RuntimeError(
                f"If `is_grads_batched=True`, we interpret the first dimension of each grad_output as the batch "
                f"dimension. The sizes of the remaining dimensions are expected to match the shape of "
                f"corresponding output, but a mismatch was detected: grad_output[{i}] has a shape of "
                f"{list(g._array.shape)} and output[{i}] has a shape of {list(out._array.shape)}."
            )
    sizes = {g._array.shape[0] for g in tensors}
    if len(sizes) != 1:
        raise RuntimeError(f"grad_outputs of is_grads_batched=True must share their first dim, got {sorted(sizes)}")
    (size,) = sizes
    edges = _root_edges(outs)
    if create_graph:
        rows = []
        for b in range(size):
            keep = retain_graph or b < size - 1
            rows.append(engine.execute(edges, [g[b] for g in tensors], keep, True, False, input_edges))
        stacked: list[Tensor | None] = []
        for column in zip(*rows, strict=True):
            present = [c for c in column if c is not None]
            if not present:
                stacked.append(None)
                continue
            like = present[0]
            filled = [c if c is not None else Tensor(jnp.zeros_like(like._array)) for c in column]
            stacked.append(engine_ops.stack(filled))
        return stacked

    def one_row(*arrays: jax.Array) -> list[jax.Array | None]:
        row = [Tensor(a) for a in arrays]
        with set_multithreading_enabled(False):
            if compiled:
                from xgrad.engine import compiled as compiled_module

                result = compiled_module.execute(edges, row, retain_graph, False, False, input_edges)
            else:
                result = engine.execute(edges, row, retain_graph, False, False, input_edges)
        return [None if r is None else r._array for r in result]

    batched = jax.vmap(one_row)(*(g._array for g in tensors))
    return [None if a is None else Tensor(a) for a in batched]
