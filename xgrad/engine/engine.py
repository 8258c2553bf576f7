"""The eager backward engine, modelled on PyTorch's C++ engine.

# NOTE [Engine overview]
# ``execute`` makes a fresh ``GraphTask`` per ``backward``/``grad`` call, counts each
# node's dependencies with an iterative walk from the root (``compute_dependencies``)
# and, when the caller named ``inputs``, marks which nodes lie on a path to one of
# them (``init_to_execute``, the walk cut at their minimum ``topological_nr``). Nodes
# whose dependencies reach zero go to a priority ``ReadyQueue``: the caller's own
# queue for the default CPU device, or the queue of the long-lived worker thread of
# their JAX device. Gradients arriving on the same input are summed in an
# ``InputBuffer``. ``evaluate_function`` runs the hooks and the node
# (NOTE [Hooks ordering] in node.py), ``validate_outputs`` fits each gradient to its
# destination, and the final callbacks run once the task has no outstanding work.
#
# NOTE [Reentrant backward]
# A backward started from inside a node (a checkpointed Function, say) runs on the
# same thread, reusing the thread's ready queue, with a higher reentrant depth so its
# nodes pop first. Past ``MAX_REENTRANT_DEPTH`` nested calls the new task moves to a
# pool thread that drives the same queue while the caller waits, so the Python stack
# never grows without bound. The pool thread takes the caller's place (its
# ``worker_device`` and ``total_depth``) and may itself nest ``MAX_REENTRANT_DEPTH``
# deep before handing on; idle pool threads are reused. A reentrant task keeps its
# parent's multithreading setting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from xgrad.engine.anomaly import ANOMALY
from xgrad.engine.graph_task import GraphTask, InputBuffer, NodeTask, ReadyQueue
from xgrad.engine.hooks import run_in_order
from xgrad.engine.node import AccumulateGrad, Edge, GraphRoot, Node, current_task
from xgrad.engine.threads import CPU_DEVICE, NO_DEVICE, _devices, _ready_queue_by_owner, _tls, ready_queue
from xgrad.engine.validate import validate_outputs
from xgrad.grad_mode import _state as _grad_state
from xgrad.tensor import Tensor
from xgrad.tensor.hook_kinds import leaf_has_hooks

__all__ = [
    "MAX_REENTRANT_DEPTH",
    "GraphTask",
    "InputBuffer",
    "ReadyQueue",
    "execute",
    "queue_callback",
]

MAX_REENTRANT_DEPTH = 60

# NOTE [Profiler hook]
# ``xgrad.autograd.profile()`` sets this to a function that times one node:
# ``profile_node(call_function, graph_task, fn, inputs) -> outputs``. When no profiler
# is active it is ``None`` and a node pays one global read for it.
profile_node: Callable[..., list[Any]] | None = None

_NO_KEY = (0, 0, 0)  # the held node's key before there is one

ERR_CALLBACK_OUTSIDE = "Final callbacks can only be installed during backward pass."
ERR_INTERNAL = "xgrad internal error ({what}); please report a bug with the code that triggered it."


# -- running one node ----------------------------------------------------------------


def call_tensor_pre_hooks(fn: Node, inputs: list[Tensor | None]) -> list[Tensor | None]:
    hooks = fn.tensor_pre_hooks()
    if hooks:
        for input_nr, hook in run_in_order(hooks):
            grad = inputs[input_nr]
            result = hook(grad)
            if result is not None:
                _check_hook_result(fn, input_nr, grad, result)
                inputs[input_nr] = result
    retains = fn._retains_grad_hooks
    if retains:
        for input_nr, hook in tuple(retains.items()):
            hook(inputs[input_nr])
    return inputs


def _check_hook_result(fn: Node, i: int, grad: Tensor | None, result: Any) -> None:
    if not isinstance(result, Tensor):
        raise TypeError(f"hook on the gradient of {fn.name()} input {i} must return a Tensor or None, got {type(result).__name__}")
    meta = fn.input_metadata[i]
    if result._array.shape != meta.shape:
        raise RuntimeError(
            f"hook on the gradient of {fn.name()} input {i} returned a gradient of shape "
            f"{list(result._array.shape)}, expected {list(meta.shape)}"
        )
    if result._array.dtype != meta.dtype:
        raise RuntimeError(
            f"hook on the gradient of {fn.name()} input {i} returned a gradient of dtype "
            f"{result._array.dtype}, expected {meta.dtype}"
        )
    if grad is None:
        raise RuntimeError(f"hook on the gradient of {fn.name()} input {i}: can't replace a None gradient with a non-None value")


def _as_hook_tuple(fn: Node, kind: str, value: Any, expected: int) -> list[Any]:
    if not isinstance(value, (tuple, list)) or len(value) != expected:
        got = len(value) if isinstance(value, (tuple, list)) else type(value).__name__
        raise RuntimeError(f"{kind} hook of {fn.name()} must return None or a tuple of {expected} gradients, got {got}")
    return list(value)


def call_pre_hooks(fn: Node, inputs: list[Tensor | None]) -> list[Tensor | None]:
    for hook in run_in_order(fn._pre_hooks):
        result = hook(tuple(inputs))
        if result is not None:
            inputs = _as_hook_tuple(fn, "pre", result, len(inputs))
    return inputs


def call_post_hooks(fn: Node, outputs: list[Tensor | None], inputs: list[Tensor | None]) -> list[Tensor | None]:
    for hook in run_in_order(fn._post_hooks):
        result = hook(tuple(outputs), tuple(inputs))
        if result is not None:
            outputs = _as_hook_tuple(fn, "post", result, len(outputs))
            # Replaced grads flow on like the node's own: fit or reject them the same way.
            validate_outputs(fn.next_edges, outputs, fn, " (from a post hook)")
    return outputs


def call_function(graph_task: GraphTask, fn: Node, inputs: list[Tensor | None]) -> list[Tensor | None]:
    """The node and its hooks (NOTE [Hooks ordering] in node.py), its grads validated."""
    if (
        fn._tensor_pre_hooks is None
        and fn._retains_grad_hooks is None
        and not fn._pre_hooks
        and not fn._post_hooks
        and (not fn.runs_user_code or (type(fn) is AccumulateGrad and not leaf_has_hooks(fn.variable)))
        and not ANOMALY.enabled
    ):
        # Pure rules (or an accumulator of a leaf without hooks), no hook, no anomaly
        # mode: nothing asks for the running node (current_node(), the parent of nodes
        # recorded under anomaly mode).
        outputs = fn.apply(inputs)
        validate_outputs(fn.next_edges, outputs, fn)
        return outputs
    prev_node = current_task.node  # a reentrant backward returns here: restore, do not clear
    current_task.node = fn  # xgrad.autograd.graph.current_node()
    try:
        if fn._tensor_pre_hooks is not None or fn._retains_grad_hooks is not None or type(fn).tensor_pre_hooks is not Node.tensor_pre_hooks:
            inputs = call_tensor_pre_hooks(fn, inputs)
        if fn._pre_hooks:
            inputs = call_pre_hooks(fn, inputs)
        outputs = fn.apply(inputs)
        validate_outputs(fn.next_edges, outputs, fn)
        if fn._post_hooks:
            outputs = call_post_hooks(fn, outputs, inputs)
    finally:
        current_task.node = prev_node
    return outputs


def evaluate_function(
    graph_task: GraphTask, fn: Node, inputs: list[Tensor | None], local_queue: ReadyQueue
) -> tuple[Node, list[Tensor | None]] | None:
    """Run ``fn`` and route its grads; return the node to run next on this thread without the queue, if any.

    # NOTE [Next node without the queue]
    # A node that makes a node ready for this thread's own queue usually makes the
    # node that queue would pop next (a chain, the last branch of a fan-in): when it
    # outranks everything queued, ``thread_main`` runs it directly, skipping the push,
    # the pop and the outstanding-task count, as if it had been pushed and popped at
    # once. Of several nodes made ready (a linear's input and its weight's and bias's
    # ``AccumulateGrad``), the one the queue would pop first is held back: each takes
    # its place among equal keys when it becomes ready, as a push would give it, so
    # the others are pushed and popped in the order they would have been. Reading
    # the heap without its lock is safe under the GIL, and a push racing the check is
    # ordered after it, as it could have been anyway.
    """
    exec_info = graph_task.exec_info
    if exec_info:
        info = exec_info[fn]
        if not info.needed:
            # Tensor pre-hooks run exactly once: here when the node itself will not run.
            inputs = call_tensor_pre_hooks(fn, list(inputs))
        if info.captures is not None:
            with graph_task.mutex:
                for input_idx, output_idx in info.captures:
                    graph_task.captured_vars[output_idx] = inputs[input_idx]
        if not info.needed:
            return None

    if profile_node is None:
        outputs = call_function(graph_task, fn, inputs)
    else:
        outputs = profile_node(call_function, graph_task, fn, inputs)  # NOTE [Profiler hook]
    if not graph_task.keep_graph:
        fn.release_variables()
    if not outputs:
        return None
    if ANOMALY.enabled and ANOMALY.check_nan:
        for i, out in enumerate(outputs):
            if out is not None and bool(jnp.isnan(out._array).any()):
                raise RuntimeError(f"Function '{fn.name()}' returned nan values in its {i}th output.")

    next_edges = fn.next_edges
    device_queues = graph_task.device_queues
    cpu_ready_queue = graph_task.cpu_ready_queue
    # The node made ready for this thread's queue that it would pop first, held back
    # (NOTE [Next node without the queue]), with its key and place among equal keys.
    held: tuple[Node, list[Tensor | None]] | None = None
    held_key: tuple[int, int, int] = _NO_KEY
    held_order = 0
    depth = -graph_task.reentrant_depth
    # Only a task spread over device workers runs its nodes on several threads at once.
    # Without device queues one thread at a time does (the caller, or the pool thread
    # standing in for it, NOTE [Reentrant backward]), and the lock would guard nothing.
    mutex = graph_task.mutex if device_queues else None
    if mutex is not None:
        mutex.acquire()  # not ``with``, which costs twice as much, on every node
    try:
        dependencies = graph_task.dependencies
        not_ready = graph_task.not_ready
        for i, output in enumerate(outputs):
            next_fn, input_nr = next_edges[i]
            if next_fn is None:
                continue
            remaining = dependencies.get(next_fn)
            if remaining is None:
                raise RuntimeError(ERR_INTERNAL.format(what=f"dependency not found for {next_fn.name()}"))
            is_ready = remaining == 1
            if is_ready:
                del dependencies[next_fn]
            else:
                dependencies[next_fn] = remaining - 1
            input_buffer = not_ready.get(next_fn)
            if input_buffer is None:
                if exec_info:
                    next_info = exec_info.get(next_fn)
                    if next_info is None or not next_info.should_execute():
                        continue
                size = len(next_fn.input_metadata)
                if not is_ready:
                    input_buffer = not_ready[next_fn] = InputBuffer(size)
                    input_buffer.buffer[input_nr] = output  # a fresh buffer: nothing to sum yet
                    continue
                # Ready at its first grad (every node of a chain): no buffer to keep, only the list.
                next_inputs: list[Tensor | None] = [None] * size
                next_inputs[input_nr] = output
            else:
                input_buffer.add(input_nr, output)
                if not is_ready:
                    continue
                del not_ready[next_fn]
                next_inputs = input_buffer.buffer
            q = ready_queue(cpu_ready_queue, next_fn, device_queues) if device_queues else cpu_ready_queue
            if q is local_queue:
                key = (2, depth, -next_fn.sequence_nr)
                order = q.next_order()
                if held is None:
                    held, held_key, held_order = (next_fn, next_inputs), key, order
                    continue
                graph_task.outstanding_tasks += 1  # under the mutex, where there is one
                if key < held_key:  # it pops before the held one, which goes to the queue
                    q.push_in_order(held_key, held_order, NodeTask(graph_task, *held))
                    held, held_key, held_order = (next_fn, next_inputs), key, order
                else:
                    q.push_in_order(key, order, NodeTask(graph_task, next_fn, next_inputs))
                continue
            graph_task.outstanding_tasks += 1
            q.push(NodeTask(graph_task, next_fn, next_inputs), False)
        if held is not None:
            heap = local_queue._heap
            top = heap[0] if heap else None
            if top is None or held_key < top[0] or (held_key == top[0] and held_order < top[1]):
                return held
            graph_task.outstanding_tasks += 1
            local_queue.push_in_order(held_key, held_order, NodeTask(graph_task, *held))
    finally:
        if mutex is not None:
            mutex.release()
    return None


def thread_main(graph_task: GraphTask | None, first: NodeTask | None = None) -> None:
    """Pop and run tasks until ``graph_task`` completes (forever for a device worker), ``first`` before any popped."""
    local_queue = _tls.local_ready_queue
    if local_queue is None:
        raise RuntimeError(ERR_INTERNAL.format(what="thread_main without a ready queue"))
    worker_device = _tls.worker_device
    prev_grad_mode = _grad_state.enabled
    prev_task = current_task.graph_task
    # A shutdown popped by a nested loop belongs to the worker's outermost loop.
    deferred_shutdown = None
    try:
        while graph_task is None or not graph_task.finished:
            if first is None:
                task = local_queue.pop()
            else:
                task, first = first, None
            if task.is_shutdown:
                if graph_task is None:
                    break
                deferred_shutdown = task
                continue
            local_task: GraphTask = task.graph_task  # type: ignore[assignment]
            fn, inputs = task.fn, task.inputs
            task = None  # type: ignore[assignment]
            if fn is not None and not local_task.has_error:
                _grad_state.enabled = local_task.create_graph
                current_task.graph_task = local_task
                try:
                    while True:  # NOTE [Next node without the queue]
                        following = evaluate_function(local_task, fn, inputs, local_queue)  # type: ignore[arg-type]
                        if following is None or local_task.has_error:
                            break
                        fn, inputs = following
                except BaseException as exc:
                    local_task.set_exception(exc, fn)
            fn = inputs = following = None  # type: ignore[assignment]  # drop the grads before waiting again
            if local_task.device_queues:
                with local_task.mutex:
                    local_task.outstanding_tasks -= 1
                    finished = local_task.outstanding_tasks == 0
            else:  # one thread at a time runs the task (see evaluate_function): no lock to take
                local_task.outstanding_tasks -= 1
                finished = local_task.outstanding_tasks == 0
            if finished:
                local_task.mark_as_completed_and_run_post_processing()
                owner = local_task.owner
                if worker_device != owner:
                    # Wake the owner: it may be blocked in pop() on its own queue.
                    _ready_queue_by_owner(local_task.cpu_ready_queue, owner).push(NodeTask(local_task, None, None))
    finally:
        _grad_state.enabled = prev_grad_mode
        current_task.graph_task = prev_task
        if deferred_shutdown is not None:
            local_queue.push(deferred_shutdown, increment_outstanding=False)


# -- entry point ---------------------------------------------------------------------


def compute_dependencies(root: Node, graph_task: GraphTask, min_topo_nr: int) -> None:
    """Count, for every node reachable from ``root``, the edges that lead into it."""
    dependencies = graph_task.dependencies
    get = dependencies.get
    stack = [root]
    while stack:
        fn = stack.pop()
        if fn.topological_nr < min_topo_nr:
            continue
        for next_fn, _ in fn.next_edges:
            if next_fn is not None:
                count = get(next_fn)
                if count is None:  # first seen: the dependency keys are the nodes in the graph
                    dependencies[next_fn] = 1
                    stack.append(next_fn)
                else:
                    dependencies[next_fn] = count + 1


def prepare(
    root_edges: list[Edge],
    root_grads: list[Tensor],
    keep_graph: bool,
    create_graph: bool,
    accumulate_grad: bool,
    outputs: list[Edge],
    dependencies: bool = True,
) -> tuple[GraphTask, Node, InputBuffer]:
    """Build the graph task for a call: root, dependencies and ``exec_info`` (not counted without ``dependencies``:
    a compiled backward's cache hit does not read them, NOTE [Compiled backward])."""
    if not _devices.started or _devices.bad_fork:
        _devices.initialize_device_threads_pool(thread_main)
    validate_outputs(root_edges, root_grads)
    if not accumulate_grad and not outputs:
        raise ValueError("grad requires non-empty inputs.")
    if _tls.local_ready_queue is None:
        _tls.local_ready_queue = ReadyQueue()
    reentrant = _tls.worker_device != NO_DEVICE
    graph_task = GraphTask(
        keep_graph,
        create_graph,
        _tls.total_depth + 1 if reentrant else 0,
        _tls.local_ready_queue,
        [e.node for e in root_edges],  # type: ignore[misc]
    )
    # A reentrant backward keeps its parent's choice (NOTE [Device threads]).
    parent = current_task.graph_task if reentrant else None
    if _tls.multithreading_enabled and (parent is None or parent.device_queues):
        graph_task.device_queues = _devices.queues
    if len(root_edges) == 1:
        graph_root: Node = root_edges[0].node  # type: ignore[assignment]
        input_buffer = InputBuffer(len(graph_root.input_metadata))
        input_buffer.add(root_edges[0].input_nr, root_grads[0])
    else:
        graph_root = GraphRoot(tuple(root_edges), root_grads)
        input_buffer = InputBuffer(0)
    if dependencies:
        min_topo_nr = min(e.node.topological_nr for e in outputs) if outputs else 0  # type: ignore[union-attr]
        compute_dependencies(graph_root, graph_task, min_topo_nr)
        if outputs:
            graph_task.init_to_execute(graph_root, outputs, accumulate_grad, min_topo_nr)
    return graph_task, graph_root, input_buffer


def execute(
    root_edges: list[Edge],
    root_grads: list[Tensor],
    keep_graph: bool,
    create_graph: bool,
    accumulate_grad: bool,
    outputs: list[Edge],
) -> list[Tensor | None]:
    """Run the backward of ``root_edges`` seeded with ``root_grads``; return captured grads."""
    graph_task, graph_root, input_buffer = prepare(root_edges, root_grads, keep_graph, create_graph, accumulate_grad, outputs)
    execute_with_graph_task(graph_task, graph_root, input_buffer)
    if graph_task.exception is not None:
        raise graph_task.exception
    return graph_task.captured_vars


def execute_with_graph_task(graph_task: GraphTask, graph_root: Node, input_buffer: InputBuffer) -> None:
    """Run ``graph_task`` to completion from this thread (NOTE [Reentrant backward])."""
    inputs = input_buffer.buffer
    q = ready_queue(graph_task.cpu_ready_queue, graph_root, graph_task.device_queues)
    if _tls.worker_device == NO_DEVICE:
        # A user thread: it becomes the driver of its CPU queue for the call.
        _tls.worker_device = CPU_DEVICE
        graph_task.owner = CPU_DEVICE
        root_task = NodeTask(graph_task, graph_root, inputs)
        first = None
        if q is graph_task.cpu_ready_queue and not len(q):
            # The root is what this thread's empty queue would pop first (NOTE [Next node
            # without the queue]); no other thread knows the task yet.
            graph_task.outstanding_tasks = 1
            first = root_task
        else:
            q.push(root_task)
        try:
            thread_main(graph_task, first)
        except BaseException as exc:  # interrupted while waiting: workers skip the rest
            graph_task.set_exception(exc, None)
            raise
        finally:
            _tls.worker_device = NO_DEVICE
        return
    graph_task.owner = _tls.worker_device
    q.push(NodeTask(graph_task, graph_root, inputs))
    if _tls.current_depth >= MAX_REENTRANT_DEPTH:
        # A fresh pool thread drives this thread's queue while this one waits.
        _devices.add_thread_pool_task(graph_task)
        graph_task.wait_done()
        return
    _tls.total_depth += 1
    _tls.current_depth += 1
    try:
        thread_main(graph_task)
    finally:
        _tls.current_depth -= 1
        _tls.total_depth -= 1


def queue_callback(callback: Callable[[], None]) -> None:
    """Run ``callback`` once the current backward's graph task finishes, before it returns.

    >>> import xgrad
    >>> calls = []
    >>> x = xgrad.tensor([1.0], requires_grad=True)
    >>> h = x.register_hook(lambda g: xgrad.autograd.queue_callback(lambda: calls.append("done")))
    >>> x.sum().backward(); calls
    ['done']
    """
    graph_task = current_task.graph_task
    if graph_task is None:
        raise RuntimeError(ERR_CALLBACK_OUTSIDE)
    with graph_task.mutex:
        graph_task.final_callbacks.append(callback)
