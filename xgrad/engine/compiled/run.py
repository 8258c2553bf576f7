"""Running a compiled program, on a hit or a miss: NOTE [Compiled backward], stage 4."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import jax
import jax.numpy as jnp

from xgrad import profiler, step_trace
from xgrad.engine.compiled.cache import counters
from xgrad.engine.compiled.key import Walk
from xgrad.engine.compiled.lower import Step, Values, run_on_host
from xgrad.engine.compiled.program import Program, Segment, Traced, Variant
from xgrad.engine.graph_task import GraphTask
from xgrad.engine.node import _accumulate_lock, current_task, run_post_accumulate_grad_hooks, store_into_grad
from xgrad.grad_mode import _state as _grad_state
from xgrad.tensor import Tensor, is_tensor


def _one_device(arrays: list[Any]) -> Any:
    """The device of the first array that sits on one device."""
    for a in arrays:
        devices = a.devices() if isinstance(a, jax.Array) else ()
        if len(devices) == 1:
            return next(iter(devices))
    raise ValueError("no input of the compiled segment sits on a single device")


def _run_segment(segment: Segment, walk: Walk, live: Any, roots: list[Tensor], create_graph: bool, on_tensors: bool) -> Any:
    """Run one segment on the grads in flight (``Values.live``); return what it gives back.

    ``on_tensors``: run it as an op on the saved tensors (their graph under ``create_graph``,
    their tangents inside a dual level), not on bare arrays.
    """
    nodes = walk.nodes
    saved = walk.flat[segment.arg_lo:segment.arg_hi]
    live_in, passing = segment.split_live(live)
    live_leaves, live_tree = jax.tree_util.tree_flatten(live_in, is_leaf=is_tensor)
    leaves = [nodes[s.pos].variable for s in segment.leaf_steps]  # type: ignore[attr-defined]
    root_tensors = roots if segment.first else []
    trace = step_trace.current()
    if trace is not None:
        _show_trace(trace, leaves, [*live_leaves, *root_tensors])
    # Read, add and write .grad under eager's accumulate lock: concurrent backwards into
    # shared leaves stay exact. The program is dispatched asynchronously, so the lock is
    # held for the dispatch, not the computation.
    with _accumulate_lock if leaves else contextlib.nullcontext():
        old = [v._grad for v in leaves if v._grad is not None]
        tensors = [*saved, *live_leaves, *root_tensors, *old]
        start = time.perf_counter()
        variant = segment.variant(nodes, saved, live_tree, live_leaves, root_tensors, tuple(v._grad is not None for v in leaves), old)
        run_start = time.perf_counter() if variant.traced.fresh else 0.0
        outs = _run_differentiable(variant.traced, tensors) if on_tensors else _run_plain(variant, tensors)
        if variant.traced.fresh:  # the first call compiles: count it as compile time
            jax.block_until_ready([t._array for t in outs])
            variant.traced.fresh = False
            end = time.perf_counter()
            counters.add("compile_seconds", end - run_start)
            walk.compile_seconds += end - start
        live, grads, captures, retained = jax.tree_util.tree_unflatten(variant.out_tree, outs)
        for step, var in zip(segment.leaf_steps, leaves, strict=True):
            if step.pos in grads:
                _write_grad(var, grads[step.pos], variant, trace, create_graph, on_tensors)
    if variant.device is not None and live:  # ran on one of several devices: the grads in flight go where eager keeps them
        live = {pos: _on_input_devices(nodes[pos], gs) for pos, gs in live.items()}
    if passing:  # what went by this chunk goes on to the next (NOTE [Chunks])
        live.update(passing)
    return live, grads, captures, retained


def _show_trace(trace: Any, leaves: list[Tensor], tensors: list[Tensor]) -> None:
    """A step being traced finds the leaves, their grads and the tensors read here (NOTE [The step-trace seam])."""
    for t in [*leaves, *tensors]:
        trace.read(t)
    for v in leaves:
        trace.grad_read(v)
        if v._grad is not None:
            trace.read(v._grad)


def _write_grad(var: Tensor, grad: Tensor, variant: Variant, trace: Any, create_graph: bool, on_tensors: bool) -> None:
    """``var._grad`` from the program's new grad, as eager's AccumulateGrad writes it (the traced
    ``validate_outputs`` fitted its shape and dtype, and the program placed it with the leaf)."""
    if variant.device is not None:  # the segment ran on one of several devices
        grad = Tensor(jax.device_put(grad._array, var._array.sharding))
    old_grad = var._grad
    if trace is not None and (create_graph or old_grad is None):
        trace.grad_write(var)
    if create_graph:
        var._grad = grad
    elif old_grad is None:
        # As eager's: detached (inside a dual level the run's outputs carry tangents).
        var._grad = Tensor(grad._array) if on_tensors else grad
    else:
        store_into_grad(old_grad, grad._array)


def _run_plain(variant: Variant, tensors: list[Any]) -> list[Tensor]:
    """Run ``variant`` on the arrays it reads. Inputs on several devices (leaves moved with ``.to()``) are first put
    on one of them, as one XLA program runs on one device (NOTE [Compiled backward], stage 3)."""
    args = [t._array if isinstance(t, Tensor) else t for t in map(tensors.__getitem__, variant.traced.used)]
    if variant.shardings is None:
        # An uncommitted input (one JAX may move) gets no sharding: the program places it.
        variant.shardings = [
            a.sharding if isinstance(a, jax.Array) and not isinstance(a, jax.core.Tracer) and a.committed else None for a in args
        ]
    if variant.device is None:
        try:
            return [Tensor(a) for a in variant.traced.plain(*args)]
        except ValueError as exc:
            if "incompatible devices" not in str(exc):
                raise
            variant.device = _one_device(args)
    return [Tensor(a) for a in variant.traced.plain(*[jax.device_put(a, variant.device) for a in args])]


def _on_input_devices(node: Any, grads: list[Any]) -> list[Any]:
    """``grads`` on the devices of ``node``'s inputs: a host step sums them with others as eager does."""
    return [
        g if g is None or m is None or m.sharding is None else Tensor(jax.device_put(g._array, m.sharding))
        for g, m in zip(grads, node.input_metadata, strict=True)
    ]


def _run_differentiable(traced: Traced, tensors: list[Any]) -> list[Tensor]:
    """Run a segment as one differentiable ``from_jax`` op; an output that depends on no input requiring grad is
    detached, as eager's would have no ``grad_fn``."""
    if not traced.deps:
        return []
    return list(traced.op(*[x if isinstance(x, Tensor) else Tensor(jnp.asarray(x)) for x in map(tensors.__getitem__, traced.used)]))


def run_program(program: Program, walk: Walk, graph_task: GraphTask, roots: list[Tensor], start: float,
                hit: bool) -> list[Tensor | None]:
    """Run ``program`` on ``walk``'s values: its segments, the host steps between them, then the final callbacks and
    the release of saved values; return the captured grads. ``start``: when the call began, for the profiler."""
    nodes, starts = walk.nodes, program.starts
    captured = graph_task.captured_vars
    # The grads in flight pass from segment to segment as a pytree (``Values.live``), and
    # become ``Values`` only for host steps: chunks follow each other without any.
    live: Any = {}
    values: Values | None = None
    create_graph = graph_task.create_graph
    prev_grad_mode, prev_task = _grad_state.enabled, current_task.graph_task
    _grad_state.enabled = create_graph
    current_task.graph_task = graph_task  # so hooks can queue_callback
    try:
        for item in program.items:
            if type(item) is Step:  # a host step: the eager engine's node (or its pre-hooks) on concrete values
                if values is None:
                    values = Values(live)
                run_on_host(item, nodes[item.pos], values, walk.flat[starts[item.pos]:starts[item.pos + 1]])
                captures, values.captures = values.captures, {}
            else:
                if values is not None:
                    live, values = values.live(), None
                live, grads, captures, retained = _run_segment(item, walk, live, roots, create_graph, program.create_graph)
                for (pos, nr), grad in retained.items():
                    retain = (nodes[pos]._retains_grad_hooks or {}).get(nr)
                    if retain is not None:
                        retain(grad)
                for step in item.leaf_steps:
                    if step.pos in grads:
                        run_post_accumulate_grad_hooks(nodes[step.pos].variable)  # type: ignore[attr-defined]
            for i, grad in captures.items():
                captured[i] = grad
    finally:
        _grad_state.enabled = prev_grad_mode
        current_task.graph_task = prev_task
    if not graph_task.keep_graph:
        for pos in program.released:
            nodes[pos].release_variables()
    graph_task.exec_post_processing()
    if profiler.is_active():  # one span per compiled backward (the profiler's node timer never runs here)
        profiler.record(
            "CompiledBackward", start, time.perf_counter(), cache="hit" if hit else "miss", compile_seconds=walk.compile_seconds
        )
    return captured
