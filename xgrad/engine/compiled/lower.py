"""Lowering: a walked graph becomes a program of steps and phases, split into jitted segments at host hooks.

NOTE [Compiled backward], stage 3. ``Program`` turns the walk's nodes into ``_Step``s
(the static facts of each node, none of its values) and the steps into phases
(capture, pre-hooks, body, post-hooks, route): the eager engine's per-node work,
run here on tracers. ``Segment`` is a maximal run of traced phases, or a chunk of a
long one (NOTE [Chunks]); ``Traced`` is a segment traced and jitted for one layout of
its inputs, and ``Variant`` a segment's use of one (chunks of equal structure share a
``Traced``). ``pretrace`` traces every segment before any runs.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal, jaxpr_as_fun

from xgrad.engine.compiled.cache import chunks, counters, insert, lookup
from xgrad.engine.compiled.key import (
    ARG,
    ARG_TENSOR,
    CTX_BASE,
    EDGES_FIELD,
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
from xgrad.engine.rules import Aval, RuleNode, Rules, incoming_grad, jax_op
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
    return step.prim.backward(g, out, inputs, params, [t is not None for t in step.targets])


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


# -- segments and their compiled variants --------------------------------------------

# NOTE [Chunks]
# A long graph compiled as one program costs seconds: JAX's tracing and lowering and
# XLA's compile all grow with the number of steps. So a segment of more than
# ``CHUNK_THRESHOLD`` steps is cut into chunks of at most ``CHUNK_STEPS`` steps, each an
# ordinary ``Segment`` (one mechanism: the host carries the grads in flight from one
# to the next, as across a hook). A cut falls between two steps, at the latest point
# in the second half of the window where the fewest grads are in flight, so the chunks
# of a repeating graph (a chain, a deep model's identical blocks) start at the same
# point of the repeat and have the same structure. A chunk takes in and gives back
# only the grads in flight to its own steps and to those it sends grads to; the rest
# (a long skip's grad, on its way to a far step) pass it by on the host.
# Each chunk is cached by that structure (``cache.chunks``, bounded, emptied by
# ``reset``): its steps' keys without the discovery indices of their edges, its edges
# as positions relative to its first step, its phases, whether it is first or last,
# and the layout and avals of its inputs. A chunk equal to one compiled before takes
# that one's ``Traced`` (its jaxpr and jitted callable) without tracing anything: the
# flat inputs and outputs line up, since every position and leaf slot in them differs
# by one offset and pytrees order dict keys by value; only the output pytree is
# renumbered (``Variant``). So a miss on a long chain costs the walk plus a few
# compiles, whatever its length; a hit costs one call per chunk. ``Program.hlo_text(i)``
# shows chunk ``i``; a cached ``Traced`` keeps the program it was traced in (its
# ``op`` retraces that segment under create_graph), none of a user's graph.

#: A segment with more steps than this is compiled in chunks (NOTE [Chunks]). Measured
#: on CPU (benchmarks/RESULTS.md): a program's compile grows faster than its number of
#: steps, and each chunk adds one call, about 60 µs, to a hit.
CHUNK_THRESHOLD = 1024
#: The most steps in one chunk.
CHUNK_STEPS = 256


def _chunk_cuts(steps: list[_Step], phases: list[tuple[int, int]]) -> list[int]:
    """Where chunks of ``phases`` start (indices into it, the first 0); NOTE [Chunks]."""
    first, last = phases[0][1], phases[-1][1]
    if last - first + 1 <= CHUNK_THRESHOLD:
        return [0]
    # In flight before step p: the grads sent to a slot at or after p by a step before it.
    opened: dict[tuple[int, int], int] = {}
    for op, pos in phases:
        if op == ROUTE:
            for target in steps[pos].targets:
                if target is not None and target not in opened:
                    opened[target] = pos
    change = [0] * (last - first + 2)
    for (tpos, _), source in opened.items():
        if tpos > source:
            change[source + 1 - first] += 1
            change[min(tpos, last) + 1 - first] -= 1
    in_flight = [0] * len(change)
    running = 0
    for i, c in enumerate(change):
        running += c
        in_flight[i] = running
    phase_of = {pos: j for j, (_, pos) in enumerate(phases) if j and phases[j - 1][1] != pos}
    cuts = [0]
    lo = first
    while last - lo + 1 > CHUNK_STEPS:
        best = None
        for pos in range(lo + CHUNK_STEPS, max(lo, lo + CHUNK_STEPS // 2 - 1), -1):  # never at lo: each chunk has a step
            if pos in phase_of and (best is None or in_flight[pos - first] < in_flight[best - first]):
                best = pos
        if best is None:  # no step starts in the window (cannot happen: segments hold whole runs of steps)
            break
        cuts.append(phase_of[best])
        lo = best
    return cuts


def _shift_live(live: Any, offset: int) -> Any:
    """Grads in flight (``Values.live``) with positions moved by ``offset``."""
    buffers, current = live
    return {pos + offset: g for pos, g in buffers.items()}, {pos + offset: c for pos, c in current.items()}


def _renumbered(tree: Any, shift: Callable[[Any], Any]) -> Any:
    """The pytree structure ``tree`` with its dict keys moved by ``shift``; its leaves keep their order."""
    n = tree.num_leaves
    leaves, moved = jax.tree_util.tree_flatten(shift(jax.tree_util.tree_unflatten(tree, list(range(n)))))
    if leaves != list(range(n)):
        raise AssertionError("renumbering a chunk's positions reordered its inputs or outputs")
    return moved


class Segment:
    """A run of traced phases between host hooks (or a chunk of one): one jitted program per input layout."""

    def __init__(self, program: Program, index: int, phases: list[tuple[int, int]], arg_lo: int, arg_hi: int,
                 chunked: bool) -> None:
        self.program = program
        self.index = index
        self.phases = phases
        self.arg_lo = arg_lo
        self.arg_hi = arg_hi
        steps = program.steps
        self.leaf_steps = [steps[pos] for op, pos in phases if op == BODY and steps[pos].kind == K_ACC]
        self.variants: dict[Any, Variant] = {}
        # Chunks are renumbered from their first step and first leaf (NOTE [Chunks]).
        self.base = phases[0][1] if phases else 0
        self.first_slot = self.leaf_steps[0].leaf_slot if self.leaf_steps else 0
        self.chunk_key: Any = None  # a chunk's structure, set once the program has all its segments
        self.chunked = chunked
        # A chunk's inputs and outputs in flight are the buffers of its own steps and of
        # the steps it sends grads to; others pass it by on the host, so that a grad on its
        # way to a far step (a long skip) does not make equal chunks differ.
        self.touches: frozenset[int] | None = None
        if chunked:
            targets = (t[0] for op, pos in phases if op == ROUTE for t in steps[pos].targets if t is not None)
            self.touches = frozenset((*(pos for _, pos in phases), *targets))

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == len(self.program.segments) - 1

    def split_live(self, live: Any) -> tuple[Any, dict[int, Any]]:
        """``live`` (``Values.live``) as what this segment takes in, and the buffers that pass it by."""
        if self.touches is None:
            return live, {}
        buffers, current = live
        touches = self.touches
        inside = {pos: g for pos, g in buffers.items() if pos in touches}
        return (inside, current), {pos: g for pos, g in buffers.items() if pos not in touches}

    def structure(self) -> tuple[Any, ...]:
        """This chunk's structure, positions relative to its first step (NOTE [Chunks])."""
        program = self.program
        steps = program.steps
        base = self.base
        per_step = []
        for pos in range(base, self.phases[-1][1] + 1):
            step = steps[pos]
            nkey = program.node_keys[pos]
            edges_field = EDGES_FIELD.get(step.kind)
            if edges_field is not None:
                nkey = nkey[:edges_field] + nkey[edges_field + 1:]
            edges: Any = None
            if step.runs:
                edges = tuple(
                    (None if t is None else (t[0] - base, t[1], steps[t[0]].size),
                     None if e.node is None else (e.node.name(), e.node.input_metadata[e.input_nr]))
                    for t, e in zip(step.targets, step.edge_views, strict=True)
                )
            per_step.append((nkey, step.meta, edges))
        root = (True, program.root_nr) if self.first else (False,)
        phases = tuple((op, pos - base) for op, pos in self.phases)
        return (root, self.last, program.create_graph, phases, tuple(per_step), self.arg_hi - self.arg_lo)

    def trace(self, flat: list[Any], layout: tuple[Any, ...]) -> tuple[list[Any], Any]:
        """The segment as a function of flat arrays; returns the flat outputs and their pytree."""
        counters.add("traces")
        n_saved, live_tree, n_live, n_roots, old_mask = layout
        args = iter(flat[:n_saved])
        live = jax.tree_util.tree_unflatten(live_tree, [Tensor(a) for a in flat[n_saved:n_saved + n_live]])
        roots = [Tensor(a) for a in flat[n_saved + n_live:n_saved + n_live + n_roots]]
        old_arrays = iter(flat[n_saved + n_live + n_roots:])
        old = {s.leaf_slot: Tensor(next(old_arrays)) for s, has in zip(self.leaf_steps, old_mask, strict=True) if has}
        values = Values.from_live(live)
        program = self.program
        steps = program.steps
        if self.first and program.root_nr >= 0:
            buf = InputBuffer(steps[0].size)
            buf.add(program.root_nr, roots[0])
            values.buffers[0] = buf
        for op, pos in self.phases:
            step = steps[pos]
            view = step.post if op == POST else step.pre
            if op == PRE and view._retains_grad_hooks:
                view = _retain_recorders(view, pos, values)
            run_phase(steps, step, op, view, values, args, roots, old)
        outputs = (
            None if self.last else values.live(),
            values.grads,
            values.captures,
            values.retained,
        )
        leaves, tree = jax.tree_util.tree_flatten(outputs, is_leaf=is_tensor)
        return [t._array for t in leaves], tree


class Traced:
    """A segment traced for one layout of its inputs, and jitted; chunks of equal structure share one.

    Traced once to a jaxpr: the inputs no equation reads are dropped, the data flow
    from inputs to outputs is kept (create_graph detaches outputs that need no graph),
    and the rest runs as ``jax.jit`` of the jaxpr.
    """

    __slots__ = ("base", "deps", "example", "first_slot", "fresh", "op", "out_avals", "out_tree", "plain", "used")

    def __init__(self, segment: Segment, avals: list[Any], layout: tuple[Any, ...]) -> None:
        self.example = avals  # the abstract inputs it was traced for
        self.fresh = True  # not yet called: its first call compiles
        self.base, self.first_slot = segment.base, segment.first_slot  # what its ``out_tree`` is numbered from
        trees: list[Any] = []

        def traced(*flat: Any) -> list[Any]:
            leaves, tree = segment.trace(list(flat), layout)
            trees.append(tree)
            return leaves

        with tracing():
            closed = jax.make_jaxpr(traced)(*avals)
        self.out_tree = trees[0]
        self.out_avals = closed.out_avals
        jaxpr = closed.jaxpr
        index = {v: i for i, v in enumerate(jaxpr.invars)}
        depends: dict[Any, frozenset[int]] = {v: frozenset((i,)) for v, i in index.items()}
        used: set[int] = set()
        for eqn in jaxpr.eqns:
            sources: frozenset[int] = frozenset()
            for v in eqn.invars:
                if not isinstance(v, Literal):
                    sources = sources | depends.get(v, frozenset())
                    if v in index:
                        used.add(index[v])
            for v in eqn.outvars:
                depends[v] = sources
        self.deps: list[frozenset[int]] = []
        for v in jaxpr.outvars:
            if isinstance(v, Literal):
                self.deps.append(frozenset())
                continue
            self.deps.append(depends.get(v, frozenset()))
            if v in index:
                used.add(index[v])
        self.used = sorted(used)
        run_all = jaxpr_as_fun(closed)
        n_in = len(avals)
        used_idx = tuple(self.used)

        def run(*used_args: Any) -> Any:
            full: list[Any] = [None] * n_in
            for i, a in zip(used_idx, used_args, strict=True):
                full[i] = a
            return run_all(*full)

        # No buffer is donated: the old ``.grad`` is a user-visible tensor that another
        # thread may read at any moment (measured in benchmarks/RESULTS.md: donating it
        # saved about 3% of an accumulating backward).
        self.plain = jax.jit(run)

        def program(*flat: Any) -> list[Any]:
            with tracing():
                return segment.trace(list(flat), layout)[0]

        self.op = jax_op(program, name="compiled")  # create_graph: the segment as one differentiable op


def _shift_outputs(outputs: Any, offset: int, slot_offset: int) -> Any:
    live, grads, captures, retained = outputs
    return (
        None if live is None else _shift_live(live, offset),
        {slot + slot_offset: g for slot, g in grads.items()},
        captures,  # numbered by the call's outputs, which the chunk's key holds
        {(pos + offset, nr): g for (pos, nr), g in retained.items()},
    )


class Variant:
    """A segment's compiled program for one layout of its inputs: a ``Traced``, its outputs numbered for this segment."""

    __slots__ = ("device", "out_tree", "shardings", "traced")

    def __init__(self, traced: Traced, segment: Segment) -> None:
        self.traced = traced
        self.device: Any = None  # set when its inputs sit on several devices: where it runs
        self.shardings: list[Any] | None = None  # of the used inputs, from the first call (for ``hlo_text``)
        offset, slot_offset = segment.base - traced.base, segment.first_slot - traced.first_slot
        self.out_tree = traced.out_tree
        if offset or slot_offset:  # a chunk compiled elsewhere (NOTE [Chunks])
            self.out_tree = _renumbered(traced.out_tree, lambda out: _shift_outputs(out, offset, slot_offset))


class Program:
    """The compiled form of one graph structure: its steps, and its segments split at host hooks."""

    def __init__(self, walk: Walk) -> None:
        key = walk.key
        self.create_graph = key[0]
        self.root_nr = key[3]
        self.node_keys = key[4]
        # Calls without inputs find the program by ``walk_structure``'s key: where that
        # walk's nodes and flat values sit in this program's order (set on the miss).
        self.hit_order: tuple[list[int], list[int]] | None = None
        self.steps = _build_steps(walk)
        # The nodes whose release_variables frees something: Functions, and primitives that
        # saved a tensor (avals and constants stay; the other kinds hold nothing).
        self.released = [
            s.pos for s in self.steps if s.runs and (s.kind == K_FUNC or (s.kind == K_PRIM and any(v is TENSOR for v in s.saved)))
        ]
        self.items: list[Any] = []  # segments, with host phases (op, pos) between them
        self.segments: list[Segment] = []
        phases: list[tuple[int, int]] = []
        args_at: list[int] = []  # per phase, where its step's saved values start among the flat inputs
        arg = 0
        starts = walk.starts
        assert starts is not None, "a program is built from the schedule walk"
        for step in self.steps:
            ops = []
            if step.captures is not None and step.runs:
                ops.append(CAPTURE)  # eager captures a running node's grads before its hooks
            if step.pre is not None:
                ops.append(PRE)
            if not step.runs:
                ops.append(CAPTURE)
            else:
                ops.append(BODY)
                if step.post is not None:
                    ops.append(POST)
                ops.append(ROUTE)
            for op in ops:
                if (op == PRE and step.pre is HOST) or (op == POST and step.post is HOST) or (op == BODY and step.host_body):
                    self._add_segments(phases, args_at, arg)
                    phases, args_at = [], []
                    self.items.append((op, step.pos))
                else:
                    phases.append((op, step.pos))
                    args_at.append(arg)
                    if op == BODY:
                        arg += starts[step.pos + 1] - starts[step.pos]
        self._add_segments(phases, args_at, arg)
        for segment in self.segments:
            if segment.chunked:
                segment.chunk_key = segment.structure()

    def _add_segments(self, phases: list[tuple[int, int]], args_at: list[int], hi: int) -> None:
        """One segment for a run of traced phases, or its chunks if it is long (NOTE [Chunks])."""
        cuts = _chunk_cuts(self.steps, phases) if phases else [0]
        ends = [*cuts[1:], len(phases)]
        for lo, end in zip(cuts, ends, strict=True):
            segment = Segment(
                self, len(self.segments), phases[lo:end], args_at[lo] if phases else hi, args_at[end] if end < len(phases) else hi,
                len(cuts) > 1,
            )
            self.segments.append(segment)
            self.items.append(segment)

    def hlo_text(self, segment: int = 0) -> str:
        """The compiled HLO of one segment's first variant, for the input shardings it ran with.

        So it shows the collectives XLA runs (a sharded batch's all-reduce, say). A long
        graph's segments are its chunks (NOTE [Chunks]): ``segment`` picks one, and
        chunks of equal structure show the same program.
        """
        variant = next(iter(self.segments[segment].variants.values()))
        traced = variant.traced
        args = [traced.example[i] for i in traced.used]
        if variant.shardings is not None:
            args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(args, variant.shardings, strict=True)]
        text = traced.plain.lower(*args).compile().as_text()
        if text is None:
            raise RuntimeError("this backend gives no HLO text")
        return text


# -- running a program ---------------------------------------------------------------


# -- compiling: trace every segment before any runs -------------------------------


def is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def array_of(x: Any) -> Any:
    return x._array if isinstance(x, Tensor) else x


def abstract(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def compile_variant(segment: Segment, avals: list[Any], layout: tuple[Any, ...], signature: Any) -> Variant:
    """``segment``'s program for this layout of its inputs: traced now, or a chunk of equal structure's."""
    start = time.perf_counter()
    if segment.chunk_key is None:
        traced = _trace(segment, avals, layout)
    else:
        n_saved, live_tree, n_live, n_roots, old_mask = layout
        relative_live = _renumbered(live_tree, lambda live: _shift_live(live, -segment.base))
        key = (segment.chunk_key, relative_live, n_saved, n_live, n_roots, old_mask, tuple((a.shape, a.dtype) for a in avals))
        traced = lookup(key, chunks)
        if traced is None:
            traced = insert(key, _trace(segment, avals, layout), chunks)
            counters.add("chunk_compiles")
        else:
            counters.add("chunk_reuses")
    counters.add("compile_seconds", time.perf_counter() - start)
    return segment.variants.setdefault(signature, Variant(traced, segment))


def _trace(segment: Segment, avals: list[Any], layout: tuple[Any, ...]) -> Traced:
    traced = Traced(segment, avals, layout)
    counters.add("compiles")
    return traced


def pretrace(program: Program, walk: Walk, roots: list[Tensor]) -> None:
    """Trace every segment before any runs, so nothing traceable fails halfway through a backward.

    Each segment's live inputs are the previous one's live outputs (host hooks keep
    shapes and dtypes: eager checks what they return); old ``.grad``s come from the key.
    """
    live: Any = Values().live()  # the grads in flight, abstract
    for item in program.items:
        if type(item) is tuple:
            op, pos = item
            if op == BODY:  # a device move on the host: find what it leaves behind, abstractly
                live = _host_body_avals(program, pos, live)
            continue
        segment = item
        live_in, passing = segment.split_live(live)
        live_avals, live_tree = jax.tree_util.tree_flatten(live_in)
        saved = [abstract(array_of(x).shape, array_of(x).dtype) for x in walk.flat[segment.arg_lo:segment.arg_hi]]
        old_keys = [program.node_keys[s.pos][2] for s in segment.leaf_steps]
        old_mask = tuple(k is not None for k in old_keys)
        old_avals = tuple(k for k in old_keys if k is not None)
        root_avals = [abstract(r._array.shape, r._array.dtype) for r in roots] if segment.first else []
        layout = (len(saved), live_tree, len(live_avals), len(root_avals), old_mask)
        avals = [*saved, *live_avals, *root_avals, *(abstract(*a) for a in old_avals)]
        signature = (live_tree, old_mask, tuple((a.shape, a.dtype) for a in live_avals), old_avals)
        variant = compile_variant(segment, avals, layout, signature)
        out = [abstract(a.shape, a.dtype) for a in variant.traced.out_avals]
        live_out = jax.tree_util.tree_unflatten(variant.out_tree, out)[0]
        if live_out is not None:
            live = live_out
            live[0].update(passing)


def _host_body_avals(program: Program, pos: int, live: Any) -> Any:
    """The grads in flight after a host body (a device move), abstractly, from those before it."""
    step = program.steps[pos]
    live_avals, live_tree = jax.tree_util.tree_flatten(live)

    def body(*arrays: Any) -> Any:
        live = jax.tree_util.tree_unflatten(live_tree, [Tensor(a) for a in arrays])
        values = Values.from_live(live)
        if step.kind == K_FUNC:
            # The user's backward is not called here: assume a grad for every edge, fitted
            # as validate_outputs fits it. A call that returns None somewhere gives the next
            # segment another input layout, compiled when it first runs.
            arrived = values.buffers.pop(pos, None)
            outs: list[Tensor | None] = []
            for view in step.edge_views:
                meta = None if view.node is None else view.node.input_metadata[view.input_nr]
                outs.append(None if meta is None else Tensor(jnp.zeros(meta.shape, meta.dtype)))
            values.current[pos] = (outs, [] if arrived is None or step.post is None else arrived.buffer)
        else:
            run_phase(program.steps, step, BODY, None, values, iter(()), [], {})
        return jax.tree_util.tree_map(array_of, values.live(), is_leaf=is_tensor)

    with tracing():
        out = jax.eval_shape(body, *live_avals)
    return jax.tree_util.tree_map(lambda a: abstract(a.shape, a.dtype), out)
