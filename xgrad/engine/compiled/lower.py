"""Lowering: a walked graph's nodes become steps, and each step's phases run on traced or concrete values.

NOTE [Compiled backward], stage 3. ``_build_steps`` turns the walk's nodes into
``_Step``s (the static facts of each node, none of its values); ``run_phase`` runs one
of a step's phases (capture, pre-hooks, body, post-hooks, route): the eager engine's
per-node work, run on tracers inside a segment (``program.py``) or on concrete values
on the host between segments.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.engine.compiled.key import (
    ARG,
    ARG_TENSOR,
    CTX_BASE,
    HOOKS_FIELD,
    HOST,
    K_ACC,
    K_FUNC,
    K_PRIM,
    K_ROOT,
    RAW,
    SCALARS,
    TENSOR,
    TENSOR_RG,
    Walk,
    is_array,
)
from xgrad.engine.compiled.switch import TRACER_ERRORS, NotTraceable, state
from xgrad.engine.engine import call_post_hooks, call_pre_hooks, call_tensor_pre_hooks
from xgrad.engine.function import FunctionCtx, FunctionNode
from xgrad.engine.graph_task import InputBuffer
from xgrad.engine.node import NO_EDGE, AccumulateGrad, Edge, InputMetadata, Node
from xgrad.engine.rules import Aval, RuleArgs, RuleNode, Rules, incoming_grad
from xgrad.engine.saved import SavedTensor
from xgrad.engine.validate import validate_outputs
from xgrad.grad_mode import _state as _grad_state
from xgrad.tensor import Tensor


class _NodeView(Node):
    """What eager's hook runners and ``validate_outputs`` read from a node, without its saved state.

    A ``Node`` in type only: it stands in for one and is never part of a graph, so
    ``Node.__init__`` (sequence number, edges) does not run.
    """

    __slots__ = ("_name",)

    def __init__(self, name: str, input_metadata: tuple[Any, ...]) -> None:
        self._name = name
        self.input_metadata = input_metadata
        self._tensor_pre_hooks: Any = None
        self._pre_hooks: Any = None
        self._post_hooks: Any = None
        self._retains_grad_hooks: Any = None

    def name(self) -> str:
        return self._name

    def tensor_pre_hooks(self) -> Any:
        return self._tensor_pre_hooks


def _traced_metadata(meta: tuple[Any, ...]) -> tuple[Any, ...]:
    """Input metadata without shardings: inside a program XLA places the values."""
    if len(meta) == 1 and meta[0] is not None:  # most nodes: one output
        return (InputMetadata(meta[0].shape, meta[0].dtype, None),)
    return tuple(None if m is None else InputMetadata(m.shape, m.dtype, None) for m in meta)


class _FunctionRules(FunctionNode):
    """A custom Function's backward: ``FunctionNode.compute`` runs on it unchanged.

    It holds what ``compute`` reads, none of the graph: ``FunctionNode.__init__`` does not run.
    """

    __slots__ = ("_name",)

    def __init__(self, name: str, function: Any, input_is_tensor: tuple[bool, ...], n_edges: int, ctx: FunctionCtx) -> None:
        self._name = name
        self.function = function
        self.input_is_tensor = input_is_tensor
        self.next_edges = (NO_EDGE,) * n_edges  # only counted: the graph's nodes are not kept
        self.ctx = ctx

    def name(self) -> str:
        return self._name


class _Step:
    """One node of the program: the static facts its phases need, none of the graph's values.

    Every step has the fields up to ``host_body``; a step that runs has ``targets`` and
    ``edge_views``; the rest belong to one node kind (rule node, leaf, Function).
    """

    __slots__ = (
        "captures", "ctx_template", "edge_views", "function", "host_body", "kind", "leaf_sharding", "leaf_slot",
        "materialize", "meta", "n_saved_out", "name", "needs_input_grad", "num_outputs", "params", "pos", "post", "pre",
        "prim", "runs", "saved", "size", "targets",
    )

    pos: int
    kind: int
    name: str
    meta: tuple[Any, ...]
    size: int
    runs: bool
    captures: tuple[tuple[int, int], ...] | None
    pre: Any  # a traced hook view, ``HOST`` or ``None`` (``_hook_views``)
    post: Any
    leaf_slot: int  # a leaf's index among the program's leaves; -1 for other nodes
    host_body: bool
    targets: list[tuple[int, int] | None]
    edge_views: tuple[Edge, ...]
    prim: Rules  # rule nodes
    params: Any
    num_outputs: int
    n_saved_out: int
    saved: tuple[Any, ...]  # rule nodes and Functions
    leaf_sharding: Any  # leaves
    function: tuple[Any, tuple[bool, ...], int]  # Functions: (Function class, input_is_tensor, number of edges)
    needs_input_grad: tuple[bool, ...]
    materialize: bool
    ctx_template: list[tuple[str, Any]]


def _template(value: Any) -> Any:
    """``value`` with the entries ``freeze`` sent to ``flat`` replaced by markers."""
    if isinstance(value, Tensor):
        return ARG_TENSOR
    if is_array(value):
        return np.asarray(value) if value.dtype == np.bool_ else ARG
    cls = type(value)
    if cls is tuple or cls is list:
        return cls(_template(v) for v in value)
    if cls is dict:
        return {k: _template(v) for k, v in value.items()}
    if cls is slice:
        return slice(_template(value.start), _template(value.stop), _template(value.step))
    return value


def _fill(template: Any, values: Iterator[Any]) -> Any:
    if template is ARG:
        return next(values)
    if template is ARG_TENSOR:
        return Tensor(next(values))
    cls = type(template)
    if cls is tuple or cls is list:
        return cls(_fill(v, values) for v in template)
    if cls is dict:
        return {k: _fill(v, values) for k, v in template.items()}
    if cls is slice:
        return slice(_fill(template.start, values), _fill(template.stop, values), _fill(template.step, values))
    return template


def _saved_template(values: Any) -> tuple[Any, ...]:
    """Per saved value, what the program passes the rule: ``TENSOR``/``RAW`` inputs or a template."""
    out = []
    for s in values:
        cls = type(s)
        if cls is SavedTensor:
            out.append(TENSOR)
        elif cls is Tensor:
            out.append(TENSOR_RG if s.requires_grad else TENSOR)
        elif cls in SCALARS or cls is Aval:
            out.append(s)
        elif is_array(s):
            out.append(RAW)
        else:
            out.append(_template(s))
    return tuple(out)


def _hook_views(name: str, meta: tuple[Any, ...], key: Any) -> tuple[Any, Any]:
    """A node's two hook groups as traced views, ``HOST`` markers, or ``None`` (from its hooks key)."""
    if key is None:
        return None, None
    pre_key, post_key = key
    pre: Any = pre_key
    if pre_key is not HOST and pre_key is not None:
        tensor_pre, node_pre, retains = pre_key
        pre = _NodeView(name, meta)
        pre._tensor_pre_hooks = dict(enumerate(tensor_pre or ()))
        pre._pre_hooks = dict(enumerate(node_pre or ()))
        pre._retains_grad_hooks = retains
    post: Any = post_key
    if post_key is not HOST and post_key is not None:
        post = _NodeView(name, meta)
        post._post_hooks = dict(enumerate(post_key))
    return pre, post


def _build_steps(walk: Walk) -> list[_Step]:
    nodes = walk.nodes
    position = {node: pos for pos, node in enumerate(nodes)}
    views_of: dict[Node, _NodeView] = {}
    steps = []
    leaf_slots = 0
    for pos, (node, nkey) in enumerate(zip(nodes, walk.key[4], strict=True)):
        step = _Step()
        step.pos = pos
        step.kind = nkey[0]
        step.name = node.name()
        step.meta = _traced_metadata(node.input_metadata)
        step.size = len(node.input_metadata)
        exec_key = nkey[-1]
        step.runs = exec_key is None or exec_key[0]
        step.captures = None if exec_key is None else exec_key[1]
        hooks_field = HOOKS_FIELD.get(step.kind)
        step.pre, step.post = _hook_views(step.name, step.meta, None if hooks_field is None else nkey[hooks_field])
        step.leaf_slot = -1
        step.host_body = False
        steps.append(step)
        if not step.runs:
            continue
        targets = []
        views = []
        for next_fn, input_nr in node.next_edges:
            target = position.get(next_fn) if next_fn is not None else None
            targets.append(None if target is None else (target, input_nr))
            view = None
            if next_fn is not None:
                view = views_of.get(next_fn)
                if view is None:  # one view per node, shared by the edges into it
                    view = views_of[next_fn] = _NodeView(next_fn.name(), _traced_metadata(next_fn.input_metadata))
            views.append(Edge(view, input_nr))
        step.targets = targets
        step.edge_views = tuple(views)
        if isinstance(node, RuleNode):  # K_PRIM
            step.prim = node.prim
            # Registered primitives that do not jit their forward are device moves: one XLA
            # program cannot move values between devices, so they run on the host.
            step.host_body = node.prim.host_only
            step.params = _template(node.params)
            step.num_outputs = node.prim.num_outputs
            step.n_saved_out = 0 if node.saved_out is None else len(node.saved_out)
            step.saved = _saved_template(node.saved if node.saved_out is None else (*node.saved, *node.saved_out))
        elif isinstance(node, AccumulateGrad):  # K_ACC
            step.leaf_slot = leaf_slots
            leaf_slots += 1
            sharding = node.input_metadata[0].sharding
            multi = isinstance(sharding, jax.sharding.NamedSharding) and len(sharding.device_set) > 1
            step.leaf_sharding = sharding if multi else None
        elif isinstance(node, FunctionNode):  # K_FUNC
            step.host_body = nkey[3] is HOST  # NOTE [Functions on the host]
            if step.host_body:
                continue
            ctx = node.ctx
            step.function = (node.function, node.input_is_tensor, len(node.next_edges))
            step.needs_input_grad = ctx.needs_input_grad
            step.materialize = ctx.materialize_grads
            step.ctx_template = [(attr, _template(v)) for attr, v in ctx.__dict__.items() if attr not in CTX_BASE]
            step.saved = _saved_template(node.unpack_saved())
    return steps


# -- phases: the eager engine's per-node work, on traced or concrete values ------------


CAPTURE, PRE, BODY, POST, ROUTE = range(5)


class Values:
    """Gradients in flight inside a segment (or between segments, on the host)."""

    __slots__ = ("buffers", "captures", "current", "grads", "retained")

    def __init__(self) -> None:
        self.buffers: dict[int, InputBuffer] = {}
        self.current: dict[int, Any] = {}  # {pos: (outputs, inputs)} between a node's body and its routing
        self.grads: dict[int, Tensor] = {}
        self.captures: dict[int, Tensor] = {}
        self.retained: dict[tuple[int, int], Tensor] = {}

    def live(self) -> Any:
        """What flows on to the next segment, as a pytree with tensor (or ``None``) leaves."""
        return {pos: list(buf.buffer) for pos, buf in self.buffers.items()}, {
            pos: (list(outs), list(ins)) for pos, (outs, ins) in self.current.items()
        }

    @staticmethod
    def from_live(live: Any) -> Values:
        values = Values()
        buffers, current = live
        for pos, grads in buffers.items():
            buf = InputBuffer(len(grads))
            buf.buffer = list(grads)
            values.buffers[pos] = buf
        values.current = {pos: (list(outs), list(ins)) for pos, (outs, ins) in current.items()}
        return values


def run_phase(steps: list[_Step], step: _Step, op: int, view: Any, values: Values, args: Iterator[Any],
           roots: list[Tensor], old: dict[int, Tensor]) -> None:
    """Run one phase of ``step``; ``view`` is the node itself (host) or its traced hook view."""
    try:
        _phase_unchecked(steps, step, op, view, values, args, roots, old)
    except TRACER_ERRORS as exc:
        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        if op in (PRE, POST):
            raise NotTraceable(f"a hook marked pure_hook on {step.name} is not traceable ({detail})", "untraceable hook") from exc
        if step.kind == K_FUNC:
            raise NotTraceable(
                f"the backward of custom Function {step.function[0].__name__} is not traceable ({detail})",
                "untraceable Function",
            ) from exc
        raise NotTraceable(f"{step.name} is not traceable ({detail})", "untraceable node") from exc
    except NotTraceable as exc:
        if step.kind == K_FUNC and exc.kind == "reentrant backward" and op == BODY:
            raise NotTraceable(f"the backward of custom Function {step.function[0].__name__} {exc}", exc.kind) from exc
        raise


def _phase_unchecked(steps: list[_Step], step: _Step, op: int, view: Any, values: Values, args: Iterator[Any],
                     roots: list[Tensor], old: dict[int, Tensor]) -> None:
    pos = step.pos
    if op == CAPTURE:
        received = values.buffers[pos].buffer
        for input_idx, output_idx in step.captures or ():
            grad = received[input_idx]
            if grad is not None:
                values.captures[output_idx] = grad
        if not step.runs:
            del values.buffers[pos]
    elif op == PRE:
        pending = values.buffers[pos]
        if step.runs:
            pending.buffer = call_tensor_pre_hooks(view, pending.buffer)
            if view._pre_hooks:
                pending.buffer = call_pre_hooks(view, pending.buffer)
        else:
            pending.buffer = call_tensor_pre_hooks(view, list(pending.buffer))
    elif op == BODY:
        arrived = values.buffers.pop(pos, None)
        inputs = [] if arrived is None else arrived.buffer
        if step.kind == K_FUNC and step.host_body:  # the node itself, as eager runs it (NOTE [Functions on the host])
            outs = view.apply(inputs)
            validate_outputs(view.next_edges, outs, view)
        else:
            outs = _body(step, inputs, values, args, roots, old)
        # The received grads stay in flight only for post hooks (after a device move they
        # would pin the next segment to the old device).
        values.current[pos] = (outs, inputs if step.post is not None else [])
    elif op == POST:
        outs, ins = values.current[pos]
        values.current[pos] = (call_post_hooks(view, outs, ins), ins)
    else:
        outs, _ = values.current.pop(pos)
        buffers = values.buffers
        for out, target in zip(outs, step.targets, strict=True):
            if target is None:
                continue
            tpos, input_nr = target
            target_buffer = buffers.get(tpos)
            if target_buffer is None:
                target_buffer = buffers[tpos] = InputBuffer(steps[tpos].size)
            target_buffer.add(input_nr, out)


def _body(step: _Step, inputs: list[Any], values: Values, args: Iterator[Any], roots: list[Tensor],
          old: dict[int, Tensor]) -> list[Any]:
    kind = step.kind
    if kind == K_ACC:
        new = inputs[0]
        if new is not None:
            previous = old.get(step.leaf_slot)
            value = new._array if previous is None else previous._array + new._array
            if step.leaf_sharding is not None:
                value = jax.lax.with_sharding_constraint(value, step.leaf_sharding)
            values.grads[step.leaf_slot] = Tensor(value)
        return []
    if kind == K_ROOT:
        outs = list(roots)
    elif kind == K_PRIM:
        outs = _prim_body(step, inputs, args)
    else:
        outs = _function_body(step, inputs, args)
    validate_outputs(step.edge_views, outs, step.name)
    return outs


def _saved_values(template: tuple[Any, ...], args: Iterator[Any]) -> list[Any]:
    values = []
    for s in template:
        if s is TENSOR:
            values.append(Tensor(next(args)))
        elif s is TENSOR_RG:
            values.append(Tensor(next(args), requires_grad=True))
        elif s is RAW:
            values.append(next(args))
        else:
            values.append(_fill(s, args))
    return values


def _prim_body(step: _Step, grads: list[Any], args: Iterator[Any]) -> list[Any]:
    """A rule node's ``apply`` on given values: the same rules, through the same ``Rules.backward``."""
    params = _fill(step.params, args)
    values = _saved_values(step.saved, args)
    n_out = step.n_saved_out
    inputs = values[:len(values) - n_out]
    g = incoming_grad(step.num_outputs, grads, step.meta)
    if g is None:
        return [None] * len(step.targets)
    out: Any = tuple(values[len(values) - n_out:]) if n_out else step.meta
    if step.num_outputs == 1:
        out = out[0]
    return step.prim.backward(RuleArgs(g, out, inputs, params, [t is not None for t in step.targets]))


def _function_body(step: _Step, grads: list[Any], args: Iterator[Any]) -> list[Any]:
    """``FunctionNode.apply`` on given values: the user's ``backward``, through the same ``compute``."""
    ctx = FunctionCtx()
    ctx.needs_input_grad = step.needs_input_grad
    ctx.materialize_grads = step.materialize
    for attr, template in step.ctx_template:
        setattr(ctx, attr, _fill(template, args))
    saved = tuple(_saved_values(step.saved, args))
    if step.materialize:
        grads = [
            Tensor(jnp.zeros(m.shape, m.dtype)) if g is None and m is not None else g
            for g, m in zip(grads, step.meta, strict=True)
        ]
    return _FunctionRules(step.name, *step.function, ctx).compute(grads, saved)


def _retain_recorders(view: _NodeView, pos: int, values: Values) -> _NodeView:
    """A copy of ``view`` whose retains-grad hooks record the traced grad as a program output."""
    recorder = _NodeView(view._name, view.input_metadata)
    recorder._tensor_pre_hooks = view._tensor_pre_hooks
    recorder._pre_hooks = view._pre_hooks

    def record(nr: int) -> Callable[[Any], None]:
        def retain(grad: Any) -> None:
            if grad is not None:
                values.retained[(pos, nr)] = grad

        return retain

    recorder._retains_grad_hooks = {nr: record(nr) for nr in view._retains_grad_hooks}
    return recorder


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    """While tracing: record no graph, and send nested backwards to ``execute`` (which refuses them)."""
    prev = (state.tracing, state.enabled, _grad_state.enabled)
    state.tracing, state.enabled, _grad_state.enabled = True, True, False
    try:
        yield
    finally:
        state.tracing, state.enabled, _grad_state.enabled = prev

