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

import atexit
import heapq
import itertools
import logging
import os
import queue as queue_module
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.engine.anomaly import ANOMALY, with_forward_trace
from xgrad.engine.hooks import run_in_order
from xgrad.engine.node import Edge, GraphRoot, Node, current_task, sharding_of
from xgrad.grad_mode import _state as _grad_state
from xgrad.tensor import Tensor

__all__ = [
    "MAX_REENTRANT_DEPTH",
    "GraphTask",
    "InputBuffer",
    "ReadyQueue",
    "execute",
    "queue_callback",
    "set_multithreading_enabled",
]

logger = logging.getLogger(__name__)

MAX_REENTRANT_DEPTH = 60

# NOTE [Profiler hook]
# ``xgrad.autograd.profile()`` sets this to a function that times one node:
# ``profile_node(call_function, graph_task, fn, inputs) -> outputs``. When no profiler
# is active it is ``None`` and a node pays one global read for it.
profile_node: Callable[..., list[Any]] | None = None

# worker_device values, as in the reference engine: a user thread that is not
# running backward, a thread driving the CPU queue, or a JAX device's worker.
NO_DEVICE = "no-device"
CPU_DEVICE = "cpu-device"

ERR_BAD_FORK = (
    "Unable to handle autograd's threading in combination with fork-based multiprocessing: "
    "this process was forked after xgrad's autograd worker threads started, and a forked "
    "child has no such threads. Use the 'spawn' or 'forkserver' start method, or run "
    "backward in the parent only after forking."
)
ERR_CALLBACK_OUTSIDE = "Final callbacks can only be installed during backward pass."
ERR_INTERNAL = "xgrad internal error ({what}); please report a bug with the code that triggered it."


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.worker_device: Any = NO_DEVICE
        self.current_depth = 0
        self.total_depth = 0
        self.local_ready_queue: ReadyQueue | None = None
        self.multithreading_enabled = True


_tls = _ThreadState()


# -- ready queue ---------------------------------------------------------------------


class NodeTask:
    __slots__ = ("fn", "graph_task", "inputs", "is_shutdown")

    def __init__(
        self, graph_task: GraphTask | None, fn: Node | None, inputs: list[Tensor | None] | None, is_shutdown: bool = False
    ) -> None:
        self.graph_task = graph_task
        self.fn = fn
        self.inputs = inputs
        self.is_shutdown = is_shutdown


class ReadyQueue:
    """Priority queue of node tasks.

    Shutdown tasks pop first, then the empty tasks that wake a waiting owner, then
    the deepest reentrant graph task's nodes, and among those the latest created
    node (highest ``sequence_nr``), as the reference engine orders them.
    """

    __slots__ = ("_cv", "_heap", "_lock", "_tiebreak", "_waiting")

    def __init__(self) -> None:
        self._heap: list[tuple[Any, ...]] = []
        # A bare lock on the hot path; the condition (same lock) only when a thread must wait.
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._waiting = 0
        self._tiebreak = itertools.count().__next__

    def push(self, task: NodeTask, increment_outstanding: bool = True) -> None:
        if task.is_shutdown:
            key: tuple[int, ...] = (0, 0, 0)
        elif task.fn is None:
            key = (1, 0, 0)
        else:
            key = (2, -task.graph_task.reentrant_depth, -task.fn.sequence_nr)  # type: ignore[union-attr]
        if increment_outstanding and task.graph_task is not None:
            task.graph_task.increment_outstanding()
        with self._lock:
            heapq.heappush(self._heap, (key, self._tiebreak(), task))
            if self._waiting:
                self._cv.notify()

    def pop(self) -> NodeTask:
        with self._lock:
            while not self._heap:
                self._waiting += 1
                try:
                    self._cv.wait()
                finally:
                    self._waiting -= 1
            return heapq.heappop(self._heap)[2]

    def __len__(self) -> int:
        return len(self._heap)


# -- input buffer and graph task -----------------------------------------------------


class InputBuffer:
    """The gradients arriving at one node, summed per input slot.

    Only a node still waiting for some of its grads keeps one (in ``not_ready``); a
    ready node's task carries the summed grads, its ``buffer``, as a plain list.
    """

    __slots__ = ("buffer",)

    def __init__(self, size: int) -> None:
        self.buffer: list[Tensor | None] = [None] * size

    def add(self, pos: int, grad: Tensor | None) -> None:
        if grad is None:
            return
        old = self.buffer[pos]
        # Out of place: under create_graph the sum is recorded like any op.
        self.buffer[pos] = grad if old is None else old + grad


class ExecInfo:
    """Whether a node must run for this task, and which of its input grads to capture."""

    __slots__ = ("captures", "needed")

    def __init__(self) -> None:
        self.needed = False
        self.captures: list[tuple[int, int]] | None = None  # (input_idx, output_idx)

    def should_execute(self) -> bool:
        return self.needed or self.captures is not None


class GraphTask:
    """All state of one ``backward``/``grad`` call."""

    __slots__ = (
        "captured_vars",
        "cpu_ready_queue",
        "create_graph",
        "dependencies",
        "device_queues",
        "done",
        "exception",
        "exec_info",
        "final_callbacks",
        "future_completed",
        "graph_roots",
        "has_error",
        "keep_graph",
        "mutex",
        "not_ready",
        "outstanding_tasks",
        "owner",
        "reentrant_depth",
    )

    def __init__(self, keep_graph: bool, create_graph: bool, reentrant_depth: int, cpu_ready_queue: ReadyQueue, graph_roots: list[Node]) -> None:
        self.keep_graph = keep_graph
        self.create_graph = create_graph
        self.reentrant_depth = reentrant_depth
        self.cpu_ready_queue = cpu_ready_queue
        self.graph_roots = graph_roots
        self.dependencies: dict[Node, int] = {}
        self.not_ready: dict[Node, InputBuffer] = {}
        self.exec_info: dict[Node, ExecInfo] = {}
        self.captured_vars: list[Tensor | None] = []
        self.outstanding_tasks = 0
        self.final_callbacks: list[Callable[[], None]] = []
        self.exception: BaseException | None = None
        self.has_error = False
        self.future_completed = False
        self.owner: Any = NO_DEVICE
        # The device workers' queues, or none when this task runs all on its CPU queue
        # (NOTE [Device threads]); set by prepare.
        self.device_queues: dict[Any, ReadyQueue] = _NO_DEVICE_QUEUES
        self.mutex = threading.Lock()
        # Set once the task is finished, post-processing included: the reference
        # engine's completed future.
        self.done = threading.Event()

    def increment_outstanding(self) -> None:
        with self.mutex:
            self.outstanding_tasks += 1

    def completed(self) -> bool:
        return self.outstanding_tasks == 0

    def init_to_execute(self, graph_root: Node, outputs: list[Edge], accumulate_grad: bool, min_topo_nr: int) -> None:
        """Mark ``needed`` every node on a path from the root to one of ``outputs``.

        The reference engine's iterative version of a recursive ``is_needed``: a frame
        per node on the stack, and a parent is updated once each child is finished.
        """
        exec_info = self.exec_info
        for output_idx, (node, input_nr) in enumerate(outputs):
            assert node is not None, "an input of grad/backward(inputs=) always has a gradient edge"
            info = exec_info.get(node)
            if info is None:
                info = exec_info[node] = ExecInfo()
            if accumulate_grad:
                info.needed = True
            else:
                if info.captures is None:
                    info.captures = []
                info.captures.append((input_nr, output_idx))
        self.captured_vars = [None] * (0 if accumulate_grad else len(outputs))

        def should_execute(fn: Node) -> bool:
            info = exec_info.get(fn)
            return info is not None and info.should_execute()

        seen: set[Node] = set()
        exec_info.setdefault(graph_root, ExecInfo())
        stack: list[list[Any]] = [[graph_root, 0]]
        while stack:
            frame = stack[-1]
            fn, edges = frame[0], frame[0].next_edges
            child = None
            while frame[1] < len(edges):
                candidate = edges[frame[1]].node
                frame[1] += 1
                if candidate is None:
                    continue
                if candidate in seen:
                    if should_execute(candidate):
                        exec_info.setdefault(fn, ExecInfo()).needed = True
                    continue
                seen.add(candidate)
                child = candidate
                break
            if child is not None:
                if child.topological_nr < min_topo_nr:
                    continue
                stack.append([child, 0])
            else:
                stack.pop()
                if should_execute(fn) and stack:
                    exec_info.setdefault(stack[-1][0], ExecInfo()).needed = True

    def set_exception(self, exc: BaseException, fn: Node | None) -> None:
        with self.mutex:
            if not self.has_error:
                self.has_error = True
                self.exception = with_forward_trace(exc, fn) if ANOMALY.enabled and fn is not None else exc

    def mark_as_completed_and_run_post_processing(self) -> None:
        with self.mutex:
            claimed = self.future_completed
            self.future_completed = True
        if claimed:
            # Another thread is finishing this task: return only once it has.
            self.done.wait()
            return
        try:
            if not self.has_error:
                self.exec_post_processing()
        except BaseException as exc:  # a final callback failed: the caller sees it
            if not self.has_error:
                self.has_error = True
                self.exception = exc
        finally:
            self.done.set()

    def exec_post_processing(self) -> None:
        if self.not_ready:
            raise RuntimeError("could not compute gradients for some functions")
        prev = current_task.graph_task
        current_task.graph_task = self
        try:
            # Callbacks may queue more callbacks: index, do not iterate.
            i = 0
            while i < len(self.final_callbacks):
                self.final_callbacks[i]()
                i += 1
        finally:
            current_task.graph_task = prev


# -- validation ----------------------------------------------------------------------


def _is_expandable_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts to ``target`` (so a grad of ``target`` sums down to it)."""
    if len(shape) > len(target):
        return False
    for s, t in zip(reversed(shape), reversed(target), strict=False):
        if s != t and s != 1:
            return False
    return True


def _device_str(sharding: Any) -> str:
    return ",".join(str(d) for d in sorted(sharding.device_set, key=lambda d: d.id))


def _error_text(producer: Any, note: str, msg: str) -> str:
    """An error of ``validate_outputs``: about the node (or node name) ``producer``, or bare for root grads."""
    if producer is None:
        return msg
    name = producer if isinstance(producer, str) else producer.name()
    return f"Function {name} returned an {msg}{note}"


def validate_outputs(edges: tuple[Edge, ...] | list[Edge], grads: list[Any], producer: Any = None, note: str = "") -> None:
    """Check ``grads`` against the metadata of the inputs they flow into, fixing what PyTorch fixes.

    A grad that only broadcasts is summed down, a grad of another float dtype is cast,
    a 0-dim grad on another device is moved; anything else raises, naming ``producer``
    (the node or its name; ``None`` for root grads) and adding ``note``. The message is
    made only then: this runs for every node.
    """
    if len(grads) != len(edges):
        raise RuntimeError(_error_text(producer, note, f"invalid number of gradients - expected {len(edges)}, but got {len(grads)}"))
    single_device = _devices.single_device
    for i, grad in enumerate(grads):  # indexing, not a zip: half the cost for a node's few grads
        if grad is None:
            continue
        node, input_nr = edges[i]
        if node is None:
            continue
        meta = node.input_metadata[input_nr]
        # The common case, an array that already fits, in a few compares: ``aval`` is
        # where an array's ``.shape`` and ``.dtype`` properties read from, at a third
        # of their cost, and the dtype is the very object the metadata took from it.
        if type(grad) is Tensor:
            aval = getattr(grad._array, "aval", None)
            if (
                aval is not None
                and aval.shape == meta.shape
                and aval.dtype is meta.dtype
                and (single_device or meta.sharding is None)
            ):
                continue
        grads[i] = _fit_gradient(i, grad, meta, producer, note)


def _fit_gradient(i: int, grad: Any, meta: Any, producer: Any, note: str) -> Tensor:
    """``grads[i]`` fitted to ``meta`` (the slow path of ``validate_outputs``), or raise."""
    if not isinstance(grad, Tensor):
        raise TypeError(_error_text(producer, note, f"invalid gradient at index {i} - expected a Tensor or None, got {type(grad).__name__}"))
    array = grad._array
    if array.shape != meta.shape:
        if not _is_expandable_to(meta.shape, array.shape):
            raise RuntimeError(
                _error_text(
                    producer,
                    note,
                    f"invalid gradient at index {i} - got {list(array.shape)} but expected shape "
                    f"compatible with {list(meta.shape)}"
                )
            )
        from xgrad.ops import sum_to

        grad = sum_to(grad, meta.shape)
    if grad._array.dtype != meta.dtype:
        if not jnp.issubdtype(grad._array.dtype, jnp.inexact):
            raise RuntimeError(
                _error_text(producer, note, f"invalid gradient at index {i} - expected dtype {meta.dtype} but got {grad._array.dtype}")
            )
        grad = grad.to(meta.dtype)
    sharding = meta.sharding
    # No sharding in the metadata: the compiled backward validates traced values,
    # which XLA places (and which have no .sharding to compare).
    if _devices.single_device or sharding is None:
        return grad
    # A traced gradient (``grad(..., is_grads_batched=True)`` under vmap, or a step
    # under ``xgrad.compile``) has no sharding to compare: XLA places it.
    grad_sharding = sharding_of(grad._array)
    if grad_sharding is None:
        return grad
    if grad_sharding is not sharding and grad_sharding != sharding and grad_sharding.device_set != sharding.device_set:
        if grad._array.ndim == 0 and len(sharding.device_set) == 1:
            from xgrad.ops import to_device

            return to_device(grad, next(iter(sharding.device_set)))
        raise RuntimeError(
            _error_text(
                producer,
                note,
                f"invalid gradient at index {i} - expected device {_device_str(sharding)} but got "
                f"{_device_str(grad_sharding)}"
            )
        )
    return grad


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
        and not fn.runs_user_code
        and not ANOMALY.enabled
    ):
        # Pure rules, no hook, no anomaly mode: nothing asks for the running node
        # (current_node(), the parent of nodes recorded under anomaly mode).
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
    # once. Reading the heap without its lock is safe under the GIL, and a push racing
    # the check is ordered after it, as it could have been anyway.
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
    # The first node made ready for this thread's queue, held back (NOTE [Next node
    # without the queue]); ``None`` again once a second one is pushed behind it.
    held: tuple[Node, list[Tensor | None]] | None = None
    pushed_local = False
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
                if held is None and not pushed_local:
                    held = (next_fn, next_inputs)
                    continue
                if held is not None:  # keep push order: the held node was ready first
                    graph_task.outstanding_tasks += 1
                    q.push(NodeTask(graph_task, *held), False)
                    held = None
                pushed_local = True
            graph_task.outstanding_tasks += 1  # under the mutex, where there is one
            q.push(NodeTask(graph_task, next_fn, next_inputs), False)
        if held is not None:
            heap = local_queue._heap
            if not heap or (2, -graph_task.reentrant_depth, -held[0].sequence_nr) < heap[0][0]:
                return held
            graph_task.outstanding_tasks += 1
            local_queue.push(NodeTask(graph_task, *held), False)
    finally:
        if mutex is not None:
            mutex.release()
    return None


# -- threads and queues --------------------------------------------------------------
#
# NOTE [Device threads]
# Every JAX device other than the default CPU device (each GPU; each extra host device
# when XLA splits the host) gets one long-lived worker thread with its own ReadyQueue,
# shared by all graph tasks and started, all together, on the first backward
# (``initialize_device_threads_pool``). A ready node goes to the queue of the device
# its inputs live on (``Node.device``); nodes on the default CPU device, nodes on
# sharded arrays (several devices) and every node of a task with multithreading
# disabled go to the task's ``cpu_ready_queue``, which the calling thread drives. The
# thread that finishes a task's last outstanding node runs its post-processing and,
# unless it is the owner, pushes an empty task onto the owner's queue so the owner
# wakes from ``pop`` and returns: no caller sleeps on a task someone else finished.


def _shutdown_wait_limit() -> float:
    raw = os.environ.get("XGRAD_AUTOGRAD_SHUTDOWN_WAIT_LIMIT", "10")
    try:
        return max(float(raw), 0.0)
    except ValueError:
        logger.warning("XGRAD_AUTOGRAD_SHUTDOWN_WAIT_LIMIT=%r is not a number of seconds; waiting 10", raw)
        return 10.0


class _DeviceThreads:
    """The per-device worker threads and the reentrant thread pool."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = False
        self.queues: dict[Any, ReadyQueue] = {}
        self.threads: list[threading.Thread] = []
        self.pool_tasks: queue_module.SimpleQueue[GraphTask | None] = queue_module.SimpleQueue()
        self.pool_workers = 0
        self.pool_idle = 0
        self.bad_fork = False
        # With one device in the process no gradient can be on the wrong one, so
        # validate_outputs skips the device check (set once the pool is initialized).
        self.single_device = False

    def initialize_device_threads_pool(self) -> None:
        """Start one worker per non-default device, once per process; refuse in a bad fork."""
        if self.bad_fork:
            raise RuntimeError(ERR_BAD_FORK)
        if self.started:
            return
        with self.lock:
            if self.started:
                return
            cpus = jax.local_devices(backend="cpu")
            others = [d for d in jax.local_devices() if d != cpus[0]]
            others += [d for d in cpus[1:] if d not in others]
            queues = {}
            for device in others:
                q = queues[device] = ReadyQueue()
                name = f"xgrad-autograd-{device.platform}:{device.id}"
                thread = threading.Thread(target=_device_thread_main, args=(device, q), name=name, daemon=True)
                self.threads.append(thread)
                thread.start()
            self.queues = queues
            self.single_device = not others
            self.started = True

    def add_thread_pool_task(self, graph_task: GraphTask) -> None:
        """Hand ``graph_task`` to an idle pool thread, starting one if none is idle."""
        with self.lock:
            spawn = self.pool_idle == 0
            if spawn:
                self.pool_workers += 1
                name = f"xgrad-autograd-reentrant-{self.pool_workers}"
            else:
                self.pool_idle -= 1
        self.pool_tasks.put(graph_task)
        if spawn:
            threading.Thread(target=_reentrant_thread_main, name=name, daemon=True).start()

    def shutdown(self) -> None:
        """Stop the workers at interpreter exit, waiting at most the configured limit for all of them."""
        if self.bad_fork or not self.started:
            return
        deadline = time.monotonic() + _shutdown_wait_limit()
        for q in self.queues.values():
            q.push(NodeTask(None, None, None, is_shutdown=True), increment_outstanding=False)
        for _ in range(self.pool_workers):
            self.pool_tasks.put(None)
        for thread in self.threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
            if thread.is_alive():
                logger.warning("autograd worker %s still busy at exit; not waiting for it", thread.name)


_devices = _DeviceThreads()
atexit.register(_devices.shutdown)


def _after_fork_in_child() -> None:
    # The child has none of the parent's threads, and their queues' locks may be held.
    if _devices.threads or _devices.pool_workers:
        _devices.bad_fork = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def _device_thread_main(device: Any, q: ReadyQueue) -> None:
    _tls.worker_device = device
    _tls.local_ready_queue = q
    thread_main(None)


def _reentrant_thread_main() -> None:
    """A pool thread: drive the queue of each handed-over task's owner until that task completes."""
    while True:
        graph_task = _devices.pool_tasks.get()
        if graph_task is None:  # shutdown
            return
        _tls.worker_device = graph_task.owner
        _tls.local_ready_queue = _ready_queue_by_owner(graph_task.cpu_ready_queue, graph_task.owner)
        _tls.total_depth = graph_task.reentrant_depth
        thread_main(graph_task)
        graph_task = None
        with _devices.lock:
            _devices.pool_idle += 1


class set_multithreading_enabled:
    """Run nodes on their device's worker thread (``True``, the default) or all on the calling thread.

    Thread-local; takes effect at once and, used as a context manager, is restored on
    exit. A backward started inside a node inherits its task's setting.

    >>> import xgrad
    >>> with xgrad.autograd.set_multithreading_enabled(False):
    ...     xgrad.autograd.is_multithreading_enabled()
    False
    >>> xgrad.autograd.is_multithreading_enabled()
    True
    """

    def __init__(self, mode: bool) -> None:
        self.prev = _tls.multithreading_enabled
        _tls.multithreading_enabled = bool(mode)

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        _tls.multithreading_enabled = self.prev


def is_multithreading_enabled() -> bool:
    """Whether backward calls from this thread use the per-device worker threads.

    >>> import xgrad
    >>> xgrad.autograd.is_multithreading_enabled()
    True
    """
    return _tls.multithreading_enabled


_NO_DEVICE_QUEUES: dict[Any, ReadyQueue] = {}


def ready_queue(cpu_ready_queue: ReadyQueue, fn: Node, device_queues: dict[Any, ReadyQueue]) -> ReadyQueue:
    """The queue ``fn`` runs from: its device worker's, or the task's CPU queue."""
    if device_queues:
        return device_queues.get(fn.device(), cpu_ready_queue)
    return cpu_ready_queue


def _ready_queue_by_owner(cpu_ready_queue: ReadyQueue, owner: Any) -> ReadyQueue:
    if owner == CPU_DEVICE or owner == NO_DEVICE:
        return cpu_ready_queue
    return _devices.queues[owner]


def thread_main(graph_task: GraphTask | None) -> None:
    """Pop and run tasks until ``graph_task`` completes (forever for a device worker)."""
    local_queue = _tls.local_ready_queue
    if local_queue is None:
        raise RuntimeError(ERR_INTERNAL.format(what="thread_main without a ready queue"))
    worker_device = _tls.worker_device
    prev_grad_mode = _grad_state.enabled
    prev_task = current_task.graph_task
    # A shutdown popped by a nested loop belongs to the worker's outermost loop.
    deferred_shutdown = None
    try:
        while graph_task is None or not graph_task.done.is_set():
            task = local_queue.pop()
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
            with local_task.mutex:
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
) -> tuple[GraphTask, Node, InputBuffer]:
    """Build the graph task for a call: root, dependencies and ``exec_info``."""
    _devices.initialize_device_threads_pool()
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
    min_topo_nr = min((e.node.topological_nr for e in outputs), default=0)  # type: ignore[union-attr]
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
        q.push(NodeTask(graph_task, graph_root, inputs))
        try:
            thread_main(graph_task)
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
        graph_task.done.wait()
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
