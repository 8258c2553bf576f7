"""The structural key of a backward graph: its two walks, the per-node keys, the structure fragments, ``refill``.

NOTE [Compiled backward], stage 2, says what each walk is for.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from xgrad.bounded_cache import BoundedCache
from xgrad.engine.compiled.switch import NotTraceable, PureHook
from xgrad.engine.function import FunctionCtx, FunctionNode
from xgrad.engine.node import ACCUMULATE_GRAD_SEQUENCE_NR, AccumulateGrad, GraphRoot, InputMetadata, Node
from xgrad.engine.rules import Aval, RuleNode
from xgrad.engine.saved import SavedTensor
from xgrad.tensor import Tensor
from xgrad.tensor.hook_kinds import (
    AFTER,
    BEFORE,
    KINDS,
    RECORDS,
    REPLACES_GRAD,
    HookKind,
    hooks_at,
    leaf_has_hooks,
    node_has_hooks,
)

# Node kinds, the first field of each node's key (-1: a node that is only captured).
K_CAPTURED, K_PRIM, K_ACC, K_ROOT, K_FUNC = -1, 0, 1, 2, 3
FIELDS = {
    K_CAPTURED: ("kind", "hooks", "exec_info"),
    K_PRIM: ("kind", "primitive", "params", "output shapes/dtypes", "saved values", "edges", "hooks", "exec_info"),
    K_ACC: ("kind", "leaf shape/dtype/sharding", "leaf .grad", "hooks", "exec_info"),
    K_ROOT: ("kind", "edges", "exec_info"),
    K_FUNC: ("kind", "Function", "output shapes/dtypes", "ctx attributes", "saved values", "edges", "hooks", "exec_info"),
}
TOP_FIELDS = ("create_graph", "accumulate into .grad", "number of inputs", "root input slot")
# Where a kind's key holds its hooks, and its edges (as discovery indices: a chunk's key drops them).
HOOKS_FIELD = {kind: fields.index("hooks") for kind, fields in FIELDS.items() if "hooks" in fields}
EDGES_FIELD = {kind: fields.index("edges") for kind, fields in FIELDS.items() if "edges" in fields}

SCALARS = frozenset((float, int, bool, complex, type(None), str))
HOST = "host"  # hooks key: a hook group with a hook that is not pure runs on the host
RAW = "raw array"  # saved-values key tag: a raw array argument, a program input
TENSOR = "tensor"  # saved-values / ctx key tag: a tensor, a program input
CTX_BASE = frozenset(FunctionCtx().__dict__)


class Walk:
    __slots__ = ("compile_seconds", "flat", "key", "nodes", "starts")

    def __init__(self, key: Any, nodes: list[Node], flat: list[Any], starts: list[int] | None) -> None:
        self.key = key
        self.nodes = nodes
        self.flat = flat
        self.starts = starts  # where each node's entries begin in ``flat`` (the schedule walk's; the structure walk has none)
        self.compile_seconds = 0.0  # this call's tracing and compiling, for the profiler's span


# NOTE [Hooks in the key]
# A node's hooks key is ``(before, after)``: the kinds that run before its rule and
# those that run after it (``phase`` in NOTE [Hook kinds]), each ``None`` (no hook),
# ``HOST`` (a hook not marked ``pure_hook``: the program splits there and the host runs
# that part of the node) or one entry per kind, in ``KEYED``'s order. Kinds that run
# after a leaf's ``.grad`` is written are not keyed: the compiled backward runs them on
# the host after the segment that writes it (``run.py``), whatever they are.
KEYED = tuple(tuple(kind for kind in KINDS if kind.phase == phase) for phase in (BEFORE, AFTER))


def _group_key(kind: HookKind, hooks: Any) -> Any:
    """Key of one kind's hooks at a node: the pure hooks themselves, or ``HOST`` if any is not pure.

    xgrad's own (``RECORDS``) are traced where they run: keyed by the inputs they record.
    """
    if not hooks:
        return None
    if kind.convention is RECORDS:
        return tuple(hooks)
    values = tuple(hooks.values())
    for v in values:
        if type(v[1] if kind.convention is REPLACES_GRAD else v) is not PureHook:
            return HOST
    return values


def _phase_key(kinds: tuple[HookKind, ...], node: Node) -> Any:
    keys = tuple(_group_key(kind, hooks_at(node, kind)) for kind in kinds)
    if any(key is HOST for key in keys):
        return HOST
    return keys if any(key is not None for key in keys) else None


def _hooks_key(node: Node) -> Any:
    """``(before, after)`` (NOTE [Hooks in the key]), ``None`` for a node without hooks."""
    if not node_has_hooks(node) and not (type(node) is AccumulateGrad and leaf_has_hooks(node.variable)):
        return None  # most nodes, and most accumulators: the hit path's walk asks each
    before, after = (_phase_key(kinds, node) for kinds in KEYED)
    return None if before is None and after is None else (before, after)


def _scalar_key(value: Any) -> tuple[Any, ...]:
    """A constant's key: its type (1, 1.0 and True are equal) and, for zeros, its sign (0.0 == -0.0)."""
    return (type(value), value) if value else (type(value), value, str(value))


def is_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, np.ndarray))


def freeze(value: Any, flat: list[Any]) -> Any:
    """A hashable key for a static value; tensors and integer arrays go to ``flat``, keyed by shape and dtype.

    Boolean masks decide output shapes, so they are keyed (and later baked in) by value.
    ``refill`` takes the flat values back, case by case: a case added here is added there.
    """
    if isinstance(value, Tensor):
        flat.append(value._array)
        return (TENSOR, value.shape, value.dtype)
    if is_array(value):
        if value.dtype == np.bool_:
            return (RAW, "bool", value.shape, np.asarray(value).tobytes())
        flat.append(value)
        return (RAW, value.shape, value.dtype)
    cls = type(value)
    if cls is tuple or cls is list:
        return (cls, *(freeze(v, flat) for v in value))
    if cls is dict:
        return (dict, *((k, freeze(v, flat)) for k, v in value.items()))
    if cls is slice:
        return (slice, freeze(value.start, flat), freeze(value.stop, flat), freeze(value.step, flat))
    try:
        hash(value)
    except TypeError:
        raise NotTraceable(f"a static value of type {cls.__name__} cannot be keyed", "unhashable static value") from None
    return (cls, value)


def as_tensor(value: Any, requires_grad: bool = False) -> Tensor:
    """A flat value as the tensor it was keyed from (under create_graph the flat list holds the tensors themselves)."""
    return value if isinstance(value, Tensor) else Tensor(value, requires_grad=requires_grad)


def refill(value: Any, args: Iterator[Any], saved: bool = False) -> Any:
    """``value`` with the entries ``freeze`` sent to the flat list taken from ``args``, case for case.

    ``saved``: ``value`` is one saved value of a rule node, keyed by ``_saved_key``, whose cases differ in two:
    a boolean array is an input too, and a tensor keeps its ``requires_grad``.
    """
    if saved and type(value) is SavedTensor:
        return as_tensor(next(args))
    if isinstance(value, Tensor):
        return as_tensor(next(args), saved and value.requires_grad)
    if is_array(value):
        return next(args) if saved or value.dtype != np.bool_ else value
    cls = type(value)
    if cls is tuple or cls is list:
        return cls(refill(v, args) for v in value)
    if cls is dict:
        return {k: refill(v, args) for k, v in value.items()}
    if cls is slice:
        return slice(refill(value.start, args), refill(value.stop, args), refill(value.step, args))
    return value


def hashable_params(params: dict[str, Any]) -> tuple[tuple[str, Any], ...] | None:
    """``params``' items, their key as they are; ``None`` where one is unhashable: ``freeze`` keys them then."""
    items = tuple(params.items())
    try:
        hash(items)
    except TypeError:
        return None
    return items


def _params_key(params: dict[str, Any], flat: list[Any]) -> Any:
    items = hashable_params(params)
    return items if items is not None else tuple((k, freeze(v, flat)) for k, v in params.items())


class _NeedsSchedule(Exception):
    """Raised by the one-pass walk where unpacking has effects, which happen in eager's order (NOTE [Compiled backward])."""


def _unpack(s: SavedTensor, node: Node, in_order: bool) -> Tensor:
    """``s.unpack(node)``; out of eager's order (``in_order`` false) only where it has no effect."""
    t = s._ref  # a Tensor exactly when the state is "input"
    if isinstance(t, Tensor) and t._version == s._saved_version:
        return t  # the common case, inline: a live input at its saved version
    if not in_order:
        original = s._current_tensor() if s._state == "output" else None
        if s._state != "output" or (original is not None and original._version != s._saved_version):
            raise _NeedsSchedule
    return s.unpack(node)


def _saved_key(values: Any, node: Node, flat: list[Any], keep_tensors: bool, in_order: bool) -> tuple[Any, ...]:
    """Key of a node's saved values, appending the unpacked ones to ``flat`` in order.

    ``keep_tensors`` (create_graph) keeps the unpacked tensors, which carry the graph.
    """
    key: list[Any] = []
    for s in values:
        cls = type(s)
        if cls is SavedTensor:
            t = s._ref
            if not isinstance(t, Tensor) or t._version != s._saved_version:
                t = _unpack(s, node, in_order)  # its common case is inline here: this is a per-node cost
            a = t._array
            flat.append(t if keep_tensors else a)
            aval = a.aval  # a jax.Array's own shape and dtype properties cost 5x more
            key.append(aval.shape)
            key.append(aval.dtype)
        elif cls in SCALARS:
            key.append(_scalar_key(s))
        elif cls is Aval:
            key.append(s)
        elif cls is Tensor:  # a Function's saved tensor, unpacked
            a = s._array
            flat.append(s if keep_tensors else a)
            key += (a.shape, a.dtype, s.requires_grad)
        elif is_array(s):
            flat.append(s)
            key += (RAW, s.shape, s.dtype)
        else:
            key.append(freeze(s, flat))
    return tuple(key)


def _ctx_key(ctx: FunctionCtx, name: str, flat: list[Any]) -> tuple[Any, ...]:
    """Key of what a Function's ``backward`` may read from ``ctx`` besides the saved tensors."""
    items = []
    for attr, value in ctx.__dict__.items():
        if attr in CTX_BASE:
            continue
        try:
            items.append((attr, freeze(value, flat)))
        except NotTraceable:
            raise NotTraceable(
                f"ctx.{attr} of {name} is a {type(value).__name__}, which cannot be keyed", "unhashable ctx attribute"
            ) from None
    return (ctx.materialize_grads, ctx.needs_input_grad, tuple(items))


def _function_saved(node: FunctionNode, in_order: bool) -> tuple[Tensor | None, ...]:
    if in_order:
        return node.unpack_saved()
    if node.saved is None:
        raise _NeedsSchedule  # freed: eager raises when it reaches the node
    return tuple(None if s is None else _unpack(s, node, False) for s in node.saved)


# NOTE [Functions on the host]
# A custom Function's backward is user Python: it may have side effects, call
# ``queue_callback``, run a backward of its own, or look at its saved tensors'
# identity, ``grad_fn`` and ``output_nr``; under ``create_graph`` it may apply other
# Functions whose own backward must be recorded. So, as eager, it runs on the host at
# its point, on concrete tensors, once per call: the program is split around it, as
# around a hook that is not pure. A backward marked ``pure_hook`` (traceable, no side
# effects) is traced into the program instead, and, as under ``jax.jit``, its Python
# body then runs only when traced; under ``create_graph`` every Function runs on the
# host, so the graph its backward records is eager's.


def traced_function(function: Any) -> bool:
    """Whether a Function's backward is traced into the program: it is marked ``pure_hook``."""
    return type(getattr(function, "backward", None)) is PureHook


def _outputs_key(meta: tuple[InputMetadata, ...]) -> Any:
    """(shape, dtype) of each output of a node."""
    return meta[0][:2] if len(meta) == 1 else tuple(m[:2] for m in meta)


def _node_key(node: Node, edges_key: tuple[int, ...] | int, exec_key: Any, flat: list[Any], create_graph: bool,
              in_order: bool) -> tuple[Any, ...]:
    """One node's key (see ``FIELDS``), appending its saved arrays to ``flat``: the per-node work of both walks."""
    cls = type(node)
    hooks = _hooks_key(node) if cls is AccumulateGrad or node_has_hooks(node) else None
    if isinstance(node, RuleNode):
        saved_out = node.saved_out
        # The saved values go to ``flat`` before the params' arrays (``lower._rule_stand_in`` reads them so).
        saved = _saved_key(node.saved if saved_out is None else (*node.saved, *saved_out), node, flat, create_graph, in_order)
        params = _params_key(node.params, flat) if node.params else ()
        return (K_PRIM, node.prim, params, _outputs_key(node.input_metadata), saved, edges_key, hooks, exec_key)
    if isinstance(node, AccumulateGrad):
        grad = node.variable.grad
        grad_key = None if grad is None else (grad._array.shape, grad._array.dtype)
        return (K_ACC, node.input_metadata[0], grad_key, hooks, exec_key)
    if isinstance(node, FunctionNode):
        outputs = tuple(None if m is None else m[:2] for m in node.input_metadata)
        if create_graph or not traced_function(node.function):
            # Its backward runs on the host at its point (NOTE [Functions on the host]):
            # nothing of its ctx or saved tensors is keyed, and nothing is unpacked here.
            return (K_FUNC, node.function, outputs, HOST, (), edges_key, hooks, exec_key)
        ctx = _ctx_key(node.ctx, node.name(), flat)
        saved = _saved_key(_function_saved(node, in_order), node, flat, create_graph, in_order)
        return (K_FUNC, node.function, outputs, ctx, saved, edges_key, hooks, exec_key)
    if cls is GraphRoot:
        return (K_ROOT, edges_key, exec_key)
    raise NotTraceable(f"the graph has a node of kind {node.name()} that compiled backward does not know", "unknown node kind")


def walk_schedule(graph_task: Any, root: Node, create_graph: bool, accumulate_grad: bool, n_inputs: int, root_nr: int) -> Walk:
    """Replay the eager schedule; return the key, the nodes in run order and the flat saved values.

    Saved tensors are unpacked in eager's order, so unpack hooks and version checks
    behave as in eager. ``graph_task``'s dependency counts are used up.
    """
    dependencies = graph_task.dependencies
    exec_info = graph_task.exec_info
    order: dict[Node, int] = {root: 0}
    nodes: list[Node] = []
    node_keys: list[Any] = []
    flat: list[Any] = []
    starts: list[int] = []
    # Eager's ready queue: highest sequence_nr first, ties in push order. A node that
    # becomes ready while the queue is empty, alone, is next: it skips the heap.
    heap: list[tuple[int, int, Node]] = []
    pushed = 0
    ready: Node | None = root
    heappop, heappush = heapq.heappop, heapq.heappush
    add_node, add_key, add_start = nodes.append, node_keys.append, starts.append
    exec_key: Any = None
    while True:
        if ready is not None:
            node, ready = ready, None
        elif heap:
            node = heappop(heap)[2]
        else:
            break
        add_node(node)
        add_start(len(flat))
        if exec_info:
            info = exec_info[node]
            exec_key = (info.needed, None if info.captures is None else tuple(info.captures))
            if not info.needed:
                # Captured only: eager runs its tensor pre-hooks and stops there.
                add_key((K_CAPTURED, _hooks_key(node), exec_key))
                continue
        edges_key: list[int] = []
        add_edge = edges_key.append
        for next_fn, input_nr in node.next_edges:
            if next_fn is None:
                add_edge(-1)
                add_edge(0)
                continue
            i = order.get(next_fn)
            if i is None:
                i = order[next_fn] = len(order)
            add_edge(i)
            add_edge(input_nr)
            remaining = dependencies[next_fn] - 1
            if remaining:
                dependencies[next_fn] = remaining
                continue
            del dependencies[next_fn]
            if exec_info:
                next_info = exec_info.get(next_fn)
                if next_info is None or not next_info.should_execute():
                    continue
            if ready is None and not heap:
                ready = next_fn
                continue
            if ready is not None:  # a second ready node: both go through the heap, in push order
                heappush(heap, (-ready.sequence_nr, pushed, ready))
                pushed += 1
                ready = None
            heappush(heap, (-next_fn.sequence_nr, pushed, next_fn))
            pushed += 1
        add_key(_node_key(node, tuple(edges_key), exec_key, flat, create_graph, True))
    add_start(len(flat))
    return Walk((create_graph, accumulate_grad, n_inputs, root_nr, tuple(node_keys)), nodes, flat, starts)


# NOTE [Structure fragments]
# The hit path's walk must cost little per node. Most nodes are primitives without
# hooks, and most of such a node's key is fixed once it is recorded: primitive,
# params, output shapes/dtypes and what it saved (shapes/dtypes of tensors, constants,
# avals), with the number of its inputs, which fixes how many edges follow it in the
# key. ``_fragment`` interns that part to a small int, shared by every node with the
# same fragment together with the positions of its saved tensors
# (``RuleNode.structure``), so the walk appends an int and the node's edges, and
# the key hashes and compares as flat ints.
# Once a compiled backward has run in the process, primitives get their fragment as
# they are recorded (``RuleNode.on_record``); nodes recorded before then get it on
# their first walk. Ids are never reused: past ``MAX_FRAGMENTS`` the oldest entry
# goes, and a structure keyed with its old id only misses once more. Nodes with hooks,
# unhashable params or saved values with effects (hooked, freed), and every other kind
# of node, are keyed by ``_node_key`` as in the schedule walk.

MAX_FRAGMENTS = 1 << 16
fragments: BoundedCache[tuple[Any, ...], tuple[int, tuple[int, ...], bool]] = BoundedCache(MAX_FRAGMENTS)
_next_fragment = itertools.count().__next__
_NO_FRAGMENT = (-1, (), False)  # ``structure`` of a primitive node that ``_node_key`` keys


def _fragment(node: RuleNode) -> tuple[int, tuple[int, ...], bool]:
    """``(id, positions of saved tensors, whether outputs were saved)`` (NOTE [Structure fragments])."""
    items = hashable_params(node.params) if node.params else ()
    if items is None:
        return _NO_FRAGMENT
    n_inputs = len(node.saved)
    key: list[Any] = [node.prim, items, _outputs_key(node.input_metadata), n_inputs]
    gather = []
    saved_out = node.saved_out
    for i, s in enumerate(node.saved if saved_out is None else (*node.saved, *saved_out)):
        cls = type(s)
        if cls is SavedTensor:  # its shape and dtype, read without unpacking it
            ref = s._ref
            if isinstance(ref, Tensor):  # state "input"
                array = ref._array
            elif s._state == "output":
                array = s._array
            else:
                return _NO_FRAGMENT  # hooked or freed
            key.append((TENSOR, array.shape, array.dtype))  # tagged: an Aval of the same shape and dtype is an equal tuple
            if i < n_inputs:
                gather.append(i)
        elif cls in SCALARS:
            key.append(_scalar_key(s))
        elif cls is Aval:
            key.append(s)
        else:
            return _NO_FRAGMENT
    frozen = tuple(key)
    structure = fragments.get(frozen)
    if structure is None:
        structure = fragments.setdefault(frozen, (_next_fragment(), tuple(gather), saved_out is not None))
    return structure


def record_fragment(node: RuleNode) -> None:
    node.structure = _fragment(node)


def walk_structure(root: Node, create_graph: bool, root_nr: int) -> Walk | None:
    """The hit path's walk, for a call without ``inputs``: one pass in discovery order (NOTE [Compiled backward]).

    Per node, a fragment id (NOTE [Structure fragments]) or ``_node_key``, then its edges:
    the target's discovery index where the edge leads to input 0 (most do), ``~index``
    and the input number otherwise, ``None`` where it leads nowhere. ``None`` where only
    ``walk_schedule`` may walk the graph: saved values with effects (``_NeedsSchedule``),
    equal ``sequence_nr``s, or a node it reports as not traceable.
    """
    index: dict[Node, int] = {root: 0}
    nodes: list[Node] = [root]
    key: list[Any] = []
    flat: list[Any] = []
    add_node, add_key, add_flat = nodes.append, key.append, flat.append
    try:
        for node in nodes:  # grows while iterating: breadth-first discovery
            fid = -1
            if isinstance(node, RuleNode) and not node_has_hooks(node):
                structure = node.structure
                if structure is None:
                    structure = node.structure = _fragment(node)
                fid, gather, saved_out = structure
                if fid >= 0:
                    add_key(fid)  # the fragment fixes the number of edges that follow
                    for k in gather:
                        s = node.saved[k]
                        t = s._ref
                        if not isinstance(t, Tensor) or t._version != s._saved_version:
                            t = _unpack(s, node, False)
                        add_flat(t if create_graph else t._array)
                    if saved_out and node.saved_out is not None:
                        for s in node.saved_out:
                            t = _unpack(s, node, False)
                            add_flat(t if create_graph else t._array)
            if fid < 0:
                # A tuple, unlike a fragment id; it counts the edges that follow.
                add_key(_node_key(node, len(node.next_edges), None, flat, create_graph, False))
            for next_fn, input_nr in node.next_edges:
                if next_fn is None:
                    add_key(None)
                    continue
                i = index.get(next_fn)
                if i is None:
                    i = index[next_fn] = len(nodes)
                    add_node(next_fn)
                if input_nr:
                    add_key(~i)
                    add_key(input_nr)
                else:
                    add_key(i)
    except (_NeedsSchedule, NotTraceable):
        return None
    sequence_nrs = [node.sequence_nr for node in nodes]
    # Accumulators share one number (NOTE [AccumulateGrad runs first] in node.py); their
    # ties are broken by push order, which the structure and the other ranks decide.
    n_accumulators = sequence_nrs.count(ACCUMULATE_GRAD_SEQUENCE_NR)
    if len(set(sequence_nrs)) + max(n_accumulators - 1, 0) < len(nodes):
        return None
    ranks = tuple(sorted(range(len(nodes)), key=sequence_nrs.__getitem__))
    return Walk((create_graph, root_nr, tuple(key), ranks), nodes, flat, None)


def hit_order(walk: Walk, structure: Walk) -> tuple[list[int], list[int]]:
    """Where ``walk``'s nodes and flat values (schedule order) sit in ``structure``'s (discovery order).

    A node has the same flat values in both walks, in the same order.
    """
    index = {node: i for i, node in enumerate(structure.nodes)}
    node_order = [index[node] for node in walk.nodes]
    counts = [0] * len(structure.nodes)
    for i, (lo, hi) in zip(node_order, itertools.pairwise(walk.starts), strict=True):  # type: ignore[arg-type]
        counts[i] = hi - lo
    starts = [0, *itertools.accumulate(counts)]
    return node_order, [k for i in node_order for k in range(starts[i], starts[i + 1])]
