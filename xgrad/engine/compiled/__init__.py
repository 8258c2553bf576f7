"""Compiled backward: a whole backward graph run as cached ``jax.jit`` programs.

This file holds ``execute`` and the fallback to eager; the engine map (``xgrad/engine/README.md``)
names the package's other rooms, one concern each. Node kinds are met only through ``Node``
and ``RuleNode`` (NOTE [Rule nodes]): nothing here imports ``xgrad.ops``.

# NOTE [Compiled backward]
# ``execute`` takes ``engine.execute``'s arguments and has its effects, in four stages.
#
# 1. Prepare. ``engine.prepare`` builds the ``GraphTask`` as for eager (validated root
#    grads, ``exec_info``); a call without ``inputs`` leaves the dependency counts until
#    a miss needs them: the hit path does not read them.
# 2. Walk (``key.py``). The structural key: per node its kind, primitive and static
#    params, output and saved shapes/dtypes, constants, edges (indices in discovery
#    order), hooks (pure ones by identity, others as a marker) and ``exec_info``; plus
#    the leaves' shardings and which leaves have a ``.grad``. Saved tensors are unpacked
#    into one flat list of arrays. Arrays in params (index arrays) are keyed by shape and
#    dtype and become inputs, never baked in; boolean masks decide output shapes, so are
#    keyed by value. Saved arrays' shardings are left to ``jax.jit``'s dispatch cache,
#    which keys on them anyway. Two walks build it:
#    - ``walk_structure`` (the hit path of a call without ``inputs``, its only per-node
#      Python): one pass in discovery order, no dependency counts, no schedule. Eager's
#      schedule (ready at dependency count zero, highest ``sequence_nr`` first) is decided
#      by the structure and the ranks of the ``sequence_nr``s, so the key adds the ranks.
#      A hookless primitive node adds only a fragment id made when it was recorded (NOTE
#      [Structure fragments]) and its edges. A miss stores where this walk's nodes and
#      flat values sit in schedule order (``Program.hit_order``); a hit reorders them with
#      two C-level maps. It gives up where the order of unpacking is observable (an
#      unpack hook, a failing version check, a freed tensor: eager unpacks in schedule
#      order) or ranks do not decide the schedule (equal ``sequence_nr``s, from threads).
#    - ``walk_schedule`` (misses, calls with ``inputs``, what the first gives up on):
#      replays eager's schedule without running anything (with ``exec_info``, only nodes
#      on a path to an input), unpacking in eager's order, so version checks and
#      saved-tensor hooks behave as in eager. Recompile reasons are described from its key.
# 3. Compile (a miss). The program is the eager engine traced: per node in schedule
#    order a ``lower.Step``, and ``lower.run_node`` runs eager's captures, its
#    ``call_function`` (hooks in eager's order, ``apply``, ``validate_outputs``) and
#    ``InputBuffer`` sums on a stand-in whose saved values are the program's inputs (NOTE
#    [Stand-in nodes]). Hooks that are not pure, a Function's backward (NOTE [Functions on
#    the host]) and device moves split the program: each maximal run of traced steps is
#    one segment, jitted alone, and between segments the host runs that node with the
#    same ``run_node`` on the real tensors, at its point, in eager's order. Chosen over an
#    ordered ``io_callback`` by measurement (benchmarks/RESULTS.md: the split costs ~60 µs
#    a hook and nothing fixed, the callback ~75 µs a hook and 0.25 ms per program that has
#    any, and it gathers sharded operands to one device); so a host step needs none of
#    NOTE [Host calls]'s pieces: no tensor holds a traced value there, a hook's result
#    and exception are eager's own. A long segment is cut into chunks, each cached by its
#    own structure, so a repeating one is compiled once (NOTE [Chunks]). A segment is
#    traced once to a jaxpr; inputs no equation reads are dropped. No buffer is donated:
#    the old ``.grad`` is a tensor another thread may be reading. Inputs on several
#    devices (leaves moved with ``.to()``) are put on one, and each ``.grad`` and grad in
#    flight goes back to its device, as eager leaves it.
# 4. Run (``run.py``). Per segment: gather its used inputs, call it, write ``.grad``
#    (under eager's accumulate lock, so concurrent backwards into shared leaves are
#    exact), retained and captured grads, then the leaves' post-accumulate-grad hooks;
#    at the end the final callbacks and, unless ``retain_graph``, ``release_variables``
#    on the nodes that ran and hold something.
#
# ``create_graph=True`` runs each segment as one ``from_jax`` op over the saved tensors,
# root grads and old grads, whose backward is ``jax.vjp`` of the program; inside a forward
# AD level it runs the same way, its outputs' tangents ``jax.jvp`` of the program (NOTE
# [Tangents are jvp of the forward]). Outputs that depend on no input requiring grad (the
# jaxpr's data flow) are detached, as eager's would have no ``grad_fn``. Under
# ``xgrad.autograd.profile()`` a call is one "CompiledBackward" span, ``cache="hit"`` or
# ``"miss"``, with its tracing and compiling seconds. A Function's backward marked
# ``pure_hook`` is traced in, its Python then run only when traced, as under ``jax.jit``;
# a pure hook on a node that runs on the host runs there at every call, after being traced
# once so that one that cannot be traced falls back as on a traced node. What cannot be
# traced (anomaly mode, unknown node kinds, a pure-marked hook or backward that
# concretizes a tracer or runs a backward of its own) falls back to eager with a one-time
# warning, or raises under ``fallback="error"``; the key is cached as a fallback (its
# reason only, no traceback holding the graph), so it is not traced again.
"""

from __future__ import annotations

import concurrent.futures
import time
import warnings
from typing import Any

from xgrad.dual import LEVEL
from xgrad.engine import engine
from xgrad.engine.anomaly import ANOMALY
from xgrad.engine.compiled.cache import CacheKey, call_site, counters, insert, lookup, note_miss
from xgrad.engine.compiled.key import Walk, hit_order, record_fragment, walk_schedule, walk_structure
from xgrad.engine.compiled.program import Program, pretrace
from xgrad.engine.compiled.run import run_program
from xgrad.engine.compiled.switch import (
    ERR_FALLBACK,
    WARN_FALLBACK,
    CompiledFallbackError,
    CompiledFallbackWarning,
    NotTraceable,
    RecompileWarning,
    is_enabled,
    state,
)
from xgrad.engine.node import Edge, current_task
from xgrad.engine.rules import RuleNode
from xgrad.grad_mode import _state as _grad_state
from xgrad.tensor import Tensor

# ``xgrad.autograd.compiled`` holds the public names; the engine calls ``execute`` and ``is_enabled`` here, and
# ``xgrad.testing`` takes ``RecompileWarning``.
__all__ = ["RecompileWarning", "execute", "is_enabled"]


def _compile(walk: Walk, roots: list[Tensor], structure: Walk | None) -> Program | NotTraceable:
    """The program for ``walk``'s structure, or the ``NotTraceable`` that stops it (cached too)."""
    start = time.perf_counter()
    note_miss(call_site(), walk.key)
    try:
        program = Program(walk)
        pretrace(program, walk, roots)
    except NotTraceable as exc:  # to be cached: a fresh one, without the traceback whose frames hold this graph
        return NotTraceable(str(exc), exc.kind)
    if structure is not None:
        program.hit_order = hit_order(walk, structure)
    walk.compile_seconds += time.perf_counter() - start
    return program


def _fallback(exc: NotTraceable, args: tuple[Any, ...]) -> list[Tensor | None]:
    reason = str(exc)
    with counters.lock:
        counters.fallbacks[exc.kind] += 1
        first = reason not in counters.warned_reasons
        counters.warned_reasons.add(reason)
    if state.fallback == "error":
        raise CompiledFallbackError(ERR_FALLBACK.format(reason=reason)) from None
    if first:
        warnings.warn(WARN_FALLBACK.format(reason=reason), CompiledFallbackWarning, stacklevel=4)
    return engine.execute(*args)


# NOTE [Nested compiled backwards]
# A custom Function's backward runs on the host inside a compiled backward, and may
# start a backward of its own (a reentrant backward), compiled too: each level adds
# the compiled path's frames to the Python stack. As the eager engine does past
# ``MAX_REENTRANT_DEPTH`` (NOTE [Reentrant backward]), past ``MAX_NESTED_DEPTH`` nested
# calls on one thread the next one runs on a fresh thread, with this thread's grad mode
# and compiled switch, while this one waits: the stack never grows without bound.
MAX_NESTED_DEPTH = 20


def _on_fresh_thread(args: tuple[Any, ...]) -> list[Tensor | None]:
    """``execute(*args)`` on a new thread that starts with this one's modes; its result, or its exception raised here."""
    modes = (_grad_state.enabled, _grad_state.inference, state.enabled, state.fallback)

    def run() -> list[Tensor | None]:
        _grad_state.enabled, _grad_state.inference, state.enabled, state.fallback = modes
        return execute(*args)

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="xgrad-nested-compiled-backward") as pool:
        return pool.submit(run).result()


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
    if state.depth >= MAX_NESTED_DEPTH:  # NOTE [Nested compiled backwards]
        return _on_fresh_thread(args)
    state.depth += 1
    try:
        return _execute(args)
    finally:
        state.depth -= 1


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
    graph_task, graph_root, _ = engine.prepare(
        root_edges, root_grads, keep_graph, create_graph, accumulate_grad, outputs, dependencies=bool(outputs)
    )  # a hit reads no dependency count
    start = time.perf_counter()
    structure = None if outputs else walk_structure(graph_root, on_tensors, root_nr)
    program = None
    if structure is not None:
        cache_key = CacheKey(structure.key)
        program = lookup(cache_key)
        if type(program) is Program:  # this walk's nodes and values, in the program's order
            node_order, flat_order = program.hit_order
            walk = Walk(
                structure.key, list(map(structure.nodes.__getitem__, node_order)),
                list(map(structure.flat.__getitem__, flat_order)), None,
            )
    hit = program is not None
    if program is None:
        if not outputs:
            engine.compute_dependencies(graph_root, graph_task, 0)
        # The walk unpacks saved tensors and the trace runs nodes that read ``exec_info``: they see this task as
        # current, as in eager (a checkpoint recomputes once per graph task).
        prev_task, current_task.graph_task = current_task.graph_task, graph_task
        try:
            walk = walk_schedule(graph_task, graph_root, on_tensors, accumulate_grad, len(outputs), root_nr)
            if structure is None:
                cache_key = CacheKey(walk.key)
                program = lookup(cache_key)
            hit = program is not None
            if program is None:
                program = insert(cache_key, _compile(walk, root_grads, structure))
        except NotTraceable as exc:  # the walk's: not cached
            program = exc
        finally:
            current_task.graph_task = prev_task
    if isinstance(program, NotTraceable):
        return _fallback(program, args)
    if hit:
        counters.add("hits")
    return run_program(program, walk, graph_task, root_grads, start, hit)
