"""One backward call's bookkeeping: ``GraphTask``, its ``ReadyQueue`` of ``NodeTask``s, ``InputBuffer``, ``ExecInfo``."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from typing import Any

from xgrad import step_trace
from xgrad.engine.anomaly import ANOMALY, with_forward_trace
from xgrad.engine.node import Edge, Node, current_task
from xgrad.tensor import Tensor

__all__ = [
    "CPU_DEVICE", "NO_DEVICE", "ExecInfo", "GraphTask", "InputBuffer", "NodeTask", "ReadyQueue", "run_final_callbacks",
]

# worker_device values, as in the reference engine: a user thread that is not
# running backward, a thread driving the CPU queue, or a JAX device's worker.
NO_DEVICE = "no-device"
CPU_DEVICE = "cpu-device"


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
        self.push_in_order(key, self._tiebreak(), task)

    def push_in_order(self, key: tuple[int, ...], order: int, task: NodeTask) -> None:
        """Push ``task`` with its priority ``key`` and a place ``order`` among equal keys taken from ``next_order``."""
        with self._lock:
            heapq.heappush(self._heap, (key, order, task))
            if self._waiting:
                self._cv.notify()

    def next_order(self) -> int:
        """The place among equal keys of a task pushed now (the next ``push`` gets a later one)."""
        return self._tiebreak()

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


_NO_DEVICE_QUEUES: dict[Any, ReadyQueue] = {}


class GraphTask:
    """All state of one ``backward``/``grad`` call."""

    __slots__ = (
        "captured_vars",
        "cpu_ready_queue",
        "create_graph",
        "dependencies",
        "device_queues",
        "done_event",
        "exception",
        "exec_info",
        "final_callbacks",
        "finished",
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
        trace = step_trace.current()  # a backward traced in a compiled step queues its callbacks there
        self.final_callbacks: list[Callable[[], None]] = [] if trace is None else trace.final_callbacks()
        self.exception: BaseException | None = None
        self.has_error = False
        self.future_completed = False
        self.owner: Any = NO_DEVICE
        # The device workers' queues, or none when this task runs all on its CPU queue
        # (NOTE [Device threads]); set by prepare.
        self.device_queues: dict[Any, ReadyQueue] = _NO_DEVICE_QUEUES
        self.mutex = threading.Lock()
        # True once the task is finished, post-processing included: the reference
        # engine's completed future. The event to wait on is made only for a thread
        # that must wait (``wait_done``): most tasks end on the thread that runs them,
        # and an ``Event`` (a condition and two locks) was a tenth of a small backward's
        # fixed cost.
        self.finished = False
        self.done_event: threading.Event | None = None

    def wait_done(self) -> None:
        """Return once the task is finished (``finished``), post-processing included."""
        with self.mutex:
            if self.finished:
                return
            if self.done_event is None:
                self.done_event = threading.Event()
            event = self.done_event
        event.wait()

    def _set_done(self) -> None:
        with self.mutex:
            self.finished = True
            event = self.done_event
        if event is not None:
            event.set()

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
            self.wait_done()
            return
        try:
            if not self.has_error:
                self.exec_post_processing()
        except BaseException as exc:  # a final callback failed: the caller sees it
            if not self.has_error:
                self.has_error = True
                self.exception = exc
        finally:
            self._set_done()

    def exec_post_processing(self) -> None:
        if self.not_ready:
            raise RuntimeError("could not compute gradients for some functions")
        run_final_callbacks(self)


def run_final_callbacks(graph_task: Any) -> None:
    """Run ``graph_task``'s final callbacks (a ``GraphTask``'s, or the host stand-in's of one traced in a compiled
    step) as the current task: one that calls ``queue_callback`` queues on it."""
    prev = current_task.graph_task
    current_task.graph_task = graph_task
    try:
        # Callbacks may queue more callbacks: index, do not iterate.
        i = 0
        while i < len(graph_task.final_callbacks):
            graph_task.final_callbacks[i]()
            i += 1
    finally:
        current_task.graph_task = prev

