"""Compiled backward: a whole backward graph run as cached ``jax.jit`` programs.

The package, one room per concern, in the order a call goes through them:

- ``switch.py``: ``enable``/``set_enabled``, ``pure_hook``, the fallback warning and error;
- ``key.py``: the walks, the structural key, the structure fragments (stage 2);
- ``cache.py``: the bounded program and chunk caches, ``stats``/``reset``, recompile reasons;
- ``lower.py``: steps, and one node run by the eager engine's code on traced or concrete values (stage 3);
- ``program.py``: segments and chunks of a program, tracing and jitting them (stage 3);
- ``run.py``: running a program, writing ``.grad`` (stage 4);
- this file: ``execute``, which ties them together, and the fallback to eager.

The engine meets node kinds only through ``Node`` and ``RuleNode`` (NOTE [Rule nodes]
in ``engine/rules.py``): nothing here imports ``xgrad.ops``.

# NOTE [Compiled backward]
# ``execute`` takes the same arguments as ``engine.execute`` and computes the same
# things, in four stages.
#
# 1. Prepare. ``engine.prepare`` builds the ``GraphTask`` exactly as for eager:
#    validated root grads, dependency counts, ``exec_info``. A call without
#    ``inputs`` first tries the hit path, which needs no dependency counts: it
#    validates the root grads and builds the task without them (``run.hit_task``).
# 2. Walk. The structural key: one tuple per node (``key._node_key``) with its kind,
#    primitive and static params, output and saved shapes/dtypes, constants, edges
#    (as indices in discovery order), hooks (pure ones by identity, others as a
#    marker), and ``exec_info``; plus the leaves' shardings and which leaves already
#    have a ``.grad``. The saved tensors are unpacked into one flat list of arrays.
#    Arrays inside params (integer index arrays) are keyed by shape and dtype and
#    become program inputs, never baked-in values; boolean masks decide output
#    shapes, so they are keyed by value. The shardings of saved arrays are left to
#    ``jax.jit``'s own dispatch cache, which keys on them anyway. Two walks build it:
#    - ``key.walk_structure`` (the hit path of a call without ``inputs``; its only
#      per-node Python): one pass in discovery order, no dependency counts, no
#      schedule. Eager's schedule (a node is ready when its dependency count reaches
#      zero; ready nodes pop highest ``sequence_nr`` first) is decided by the
#      structure and the relative order of the ``sequence_nr``s, so the key adds
#      their rank order. A hookless primitive node, most of any graph, adds only a
#      fragment id computed when it was recorded (NOTE [Structure fragments]) and its
#      edges. On a miss the program stores where this walk's nodes and
#      flat values sit in schedule order (``Program.hit_order``); a hit reorders
#      them with two C-level maps. It gives up, for the other walk, where the order
#      of unpacking is observable (an unpack hook, a failing version check, a freed
#      tensor: eager unpacks in schedule order) or where ranks do not decide the
#      schedule (equal ``sequence_nr``s, from nodes recorded on different threads).
#    - ``key.walk_schedule`` (misses, calls with ``inputs``, and what the first gives up on):
#      replays the eager schedule without running anything (with ``exec_info`` only
#      nodes on a path to an input are queued), unpacking in eager's order so
#      version checks and saved-tensor hooks behave as in eager. Its key is the one
#      recompile reasons are described from.
#    A lookup hashes the key once (``cache.CacheKey``).
# 3. Compile (a miss). Nothing of a node's work is written here a second time: the
#    program is the eager engine traced. ``program.Program`` keeps, per node in schedule
#    order, a ``lower.Step`` (where its grads go, whether it runs on the host), and each
#    traced step runs ``lower.run_node``: eager's captures, then ``engine.call_function``
#    (its hooks in eager's order, its ``apply``, ``validate_outputs``), then ``InputBuffer``
#    sums in arrival order, on a stand-in of the node whose saved values are the program's
#    inputs (NOTE [Stand-in nodes] in lower.py). Hooks that are not pure, a Function's
#    backward (NOTE [Functions on the host] in key.py) and device moves split the program:
#    each maximal run of traced steps is one segment, jitted on its own, and between
#    segments the host runs that node with the same ``run_node`` on concrete tensors, at
#    its point, in eager's order. Splitting was chosen over ``io_callback(ordered=True)``
#    by measurement (benchmarks/RESULTS.md: the split costs about 60 µs a hook and
#    nothing fixed, an ordered callback about 75 µs a hook and 0.25 ms per program that
#    has any, and it gathers sharded operands to one device). A long segment is cut into
#    chunks of at most ``program.CHUNK_STEPS`` steps, each cached by its own structure so
#    that a chunk that repeats (a chain, a deep model's identical blocks) is traced and
#    compiled once (NOTE [Chunks] in program.py). Each segment is traced once with
#    ``jax.make_jaxpr``; inputs no equation reads are dropped (a saved value whose rule
#    reads only its shape, say), and the rest run through ``jax.jit`` of the jaxpr. No
#    buffer is donated: the old ``.grad`` is a tensor another thread may be reading.
#    Inputs on several devices (leaves moved with ``.to()``) are put on one for the call,
#    and each ``.grad`` and grad in flight goes back to its device, as eager leaves it.
# 4. Run (a hit). Segment by segment: gather the used inputs from the flat list, call
#    the executable, write ``.grad`` (under the accumulate lock that eager uses, so
#    concurrent backwards into shared leaves are exact), retained grads and captured
#    grads, then the leaves' post-accumulate-grad hooks; at the end the final
#    callbacks, and unless ``retain_graph`` ``release_variables`` on every node that
#    ran and holds something to free (Functions, primitives that saved a tensor).
#
# ``create_graph=True`` runs each segment as one ``from_jax`` op over the saved
# tensors, root grads and old grads: one differentiable node whose backward is
# ``jax.vjp`` of the program. A backward inside a forward AD level runs the same way
# (under its own grad mode): the saved tensors carry tangents, and the op's outputs get
# theirs from ``jax.jvp`` of the program (NOTE [Tangents are jvp of the forward]). Outputs that depend on no input requiring grad (from
# the jaxpr's data flow) are detached, as eager's would have no ``grad_fn``.
# Under ``xgrad.autograd.profile()`` a compiled backward is one "CompiledBackward"
# span (from after the task is built to the end of the run), marked ``cache="hit"``/``"miss"``
# with the seconds it spent tracing and compiling.
# A custom Function's backward runs on the host at its point, on every call, as in
# eager (NOTE [Functions on the host] in key.py); one marked ``pure_hook`` is traced
# in, and then, as under ``jax.jit``, its Python body runs only when traced.
# A hook marked pure on a node that runs on the host runs there with it, on every
# call; before the first run it is traced once, so one that cannot be traced falls back
# as it would on a traced node.
# What cannot be traced (anomaly mode, unknown node kinds, a pure-marked Function
# backward or hook that concretizes a tracer or runs a backward of its own) falls
# back to eager with a one-time warning, or raises under ``fallback="error"``; a key
# that failed to trace is cached as a fallback (its reason only: no traceback, no
# graph) so it is not retried.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

from xgrad.dual import LEVEL
from xgrad.engine import engine
from xgrad.engine.anomaly import ANOMALY
from xgrad.engine.compiled.cache import (
    DEFAULT_CACHE_SIZE,
    RECOMPILE_WARNING_LIMIT,
    CacheKey,
    call_site,
    counters,
    insert,
    lookup,
    note_miss,
    reset,
    set_cache_size,
    stats,
    warned_reasons,
)
from xgrad.engine.compiled.key import Walk, hit_order, record_fragment, walk_schedule, walk_structure
from xgrad.engine.compiled.program import Program, pretrace
from xgrad.engine.compiled.run import hit_task, run_and_record
from xgrad.engine.compiled.switch import (
    ERR_FALLBACK,
    WARN_FALLBACK,
    CompiledFallbackError,
    CompiledFallbackWarning,
    HostHook,
    NotTraceable,
    PureHook,
    RecompileWarning,
    enable,
    host_hook,
    is_enabled,
    pure_hook,
    set_enabled,
    state,
)
from xgrad.engine.node import Edge, GraphRoot, Node, current_task
from xgrad.engine.rules import RuleNode
from xgrad.grad_mode import _state as _grad_state
from xgrad.tensor import Tensor

__all__ = [
    "DEFAULT_CACHE_SIZE", "RECOMPILE_WARNING_LIMIT", "CompiledFallbackError", "CompiledFallbackWarning", "HostHook",
    "PureHook", "RecompileWarning", "enable", "execute", "host_hook", "is_enabled", "pure_hook", "reset", "set_cache_size",
    "set_enabled", "stats",
]


def _compile(walk: Walk, roots: list[Tensor], graph_task: Any) -> Any:
    """The program for ``walk``'s structure, or the ``NotTraceable`` that stops it (cached too)."""
    note_miss(call_site(), walk.key)
    prev_task, current_task.graph_task = current_task.graph_task, graph_task  # the nodes traced read its exec_info
    try:
        program = Program(walk)
        pretrace(program, walk, roots)
    except NotTraceable as exc:
        # Cached, so the same structure is not traced again: a fresh exception, without
        # the traceback whose frames hold this call's graph.
        return NotTraceable(str(exc), exc.kind)
    finally:
        current_task.graph_task = prev_task
    return program


def _fallback(exc: NotTraceable, args: tuple[Any, ...]) -> list[Tensor | None]:
    reason = str(exc)
    with counters.lock:
        counters.fallbacks[exc.kind] += 1
        first = reason not in warned_reasons
        warned_reasons.add(reason)
    if state.fallback == "error":
        raise CompiledFallbackError(ERR_FALLBACK.format(reason=reason)) from None
    if first:
        warnings.warn(WARN_FALLBACK.format(reason=reason), CompiledFallbackWarning, stacklevel=4)
    return engine.execute(*args)


def _root_node(root_edges: list[Edge], root_grads: list[Tensor]) -> Node:
    """The node a backward starts from: the one root's, or a ``GraphRoot`` over several (as ``engine.prepare``)."""
    if len(root_edges) > 1:
        return GraphRoot(tuple(root_edges), root_grads)
    node = root_edges[0].node
    assert node is not None, "backward and grad pass only edges of tensors that have a graph"
    return node


# NOTE [Nested compiled backwards]
# A custom Function's backward runs on the host inside a compiled backward, and may
# start a backward of its own (a reentrant backward), compiled too: each level adds
# the compiled path's frames to the Python stack. As the eager engine does past
# ``MAX_REENTRANT_DEPTH`` (NOTE [Reentrant backward]), past ``MAX_NESTED_DEPTH`` nested
# calls on one thread the next one runs on a fresh thread, with this thread's grad mode
# and compiled switch, while this one waits: the stack never grows without bound.
MAX_NESTED_DEPTH = 20


class _Nesting(threading.local):
    depth = 0


_nesting = _Nesting()


def _on_fresh_thread(args: tuple[Any, ...]) -> list[Tensor | None]:
    """``execute(*args)`` on a new thread that starts with this one's modes; its result or its exception."""
    modes = (_grad_state.enabled, _grad_state.inference, state.enabled, state.fallback)
    outcome: list[Any] = []

    def run() -> None:
        _grad_state.enabled, _grad_state.inference, state.enabled, state.fallback = modes
        try:
            outcome.append((True, execute(*args)))
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="xgrad-nested-compiled-backward", daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def execute(
    root_edges: list[Edge],
    root_grads: list[Tensor],
    keep_graph: bool,
    create_graph: bool,
    accumulate_grad: bool,
    outputs: list[Edge],
) -> list[Tensor | None]:
    """``engine.execute``, compiled: the same arguments, effects and return value (NOTE [Compiled backward])."""
    args = (root_edges, root_grads, keep_graph, create_graph, accumulate_grad, outputs)
    if _nesting.depth >= MAX_NESTED_DEPTH:  # NOTE [Nested compiled backwards]
        return _on_fresh_thread(args)
    _nesting.depth += 1
    try:
        return _execute(args)
    finally:
        _nesting.depth -= 1


def _execute(args: tuple[Any, ...]) -> list[Tensor | None]:
    root_edges, root_grads, keep_graph, create_graph, accumulate_grad, outputs = args
    # Inside a dual level the saved tensors carry tangents: the program runs as an op on
    # them, as under create_graph, and its outputs' tangents are jax.jvp of the program.
    on_tensors = create_graph or LEVEL.current is not None
    if state.tracing:
        raise NotTraceable("it runs a backward of its own (a reentrant backward)", "reentrant backward")
    if ANOMALY.enabled:
        return _fallback(NotTraceable("anomaly mode is on", "anomaly mode"), args)
    if RuleNode.on_record is None:
        RuleNode.on_record = record_fragment
    root_nr = root_edges[0].input_nr if len(root_edges) == 1 else -1
    structure = None
    if not outputs:
        root = _root_node(root_edges, root_grads)
        structure = walk_structure(root, on_tensors, root_nr)
    cache_key = None
    if structure is not None:
        cache_key = CacheKey(structure.key)
        program = lookup(cache_key)
        if program is not None:
            graph_task = hit_task(root_edges, root_grads, keep_graph, create_graph)
            start = time.perf_counter()
            if isinstance(program, NotTraceable):
                return _fallback(program, args)
            counters.add("hits")
            node_order, flat_order = program.hit_order
            walk = Walk(
                structure.key, list(map(structure.nodes.__getitem__, node_order)),
                list(map(structure.flat.__getitem__, flat_order)), None,
            )
            return run_and_record(program, walk, graph_task, root_grads, keep_graph, create_graph, 0, start, True)
        graph_task = engine.prepare(*args)[0]
        graph_root = root
    else:
        graph_task, graph_root, _ = engine.prepare(*args)
    start = time.perf_counter()
    # The walk unpacks saved tensors: their unpack hooks see this task as current, as in
    # eager (a checkpoint recomputes once per graph task).
    prev_task, current_task.graph_task = current_task.graph_task, graph_task
    try:
        walk = walk_schedule(graph_task, graph_root, on_tensors, accumulate_grad, len(outputs), root_nr)
    except NotTraceable as exc:
        return _fallback(exc, args)
    finally:
        current_task.graph_task = prev_task
    if cache_key is None:
        cache_key = CacheKey(walk.key)
        program = lookup(cache_key)
    else:
        program = None
    hit = program is not None
    if not hit:
        compile_start = time.perf_counter()
        program = _compile(walk, root_grads, graph_task)
        if structure is not None and not isinstance(program, NotTraceable):
            program.hit_order = hit_order(walk, structure)
        program = insert(cache_key, program)
        walk.compile_seconds += time.perf_counter() - compile_start
    elif not isinstance(program, NotTraceable):
        counters.add("hits")
    if isinstance(program, NotTraceable):
        return _fallback(program, args)
    n_captured = 0 if accumulate_grad else len(outputs)
    return run_and_record(program, walk, graph_task, root_grads, keep_graph, create_graph, n_captured, start, hit)
