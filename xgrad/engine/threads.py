"""The per-device worker threads, the reentrant thread pool and the thread-local engine state (NOTE [Device threads])."""

from __future__ import annotations

import atexit
import logging
import os
import queue as queue_module
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

from xgrad.engine.graph_task import CPU_DEVICE, NO_DEVICE, GraphTask, NodeTask, ReadyQueue
from xgrad.engine.node import Node

logger = logging.getLogger(__name__)

ERR_BAD_FORK = (
    "Unable to handle autograd's threading in combination with fork-based multiprocessing: "
    "this process was forked after xgrad's autograd worker threads started, and a forked "
    "child has no such threads. Use the 'spawn' or 'forkserver' start method, or run "
    "backward in the parent only after forking."
)


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.worker_device: Any = NO_DEVICE
        self.current_depth = 0
        self.total_depth = 0
        self.local_ready_queue: ReadyQueue | None = None
        self.multithreading_enabled = True


_tls = _ThreadState()


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
        self.thread_main: Callable[[GraphTask | None], None] | None = None  # set when the pool starts
        self.queues: dict[Any, ReadyQueue] = {}
        self.threads: list[threading.Thread] = []
        self.pool_tasks: queue_module.SimpleQueue[GraphTask | None] = queue_module.SimpleQueue()
        self.pool_workers = 0
        self.pool_idle = 0
        self.bad_fork = False
        # With one device in the process no gradient can be on the wrong one, so
        # validate_outputs skips the device check (set once the pool is initialized).
        self.single_device = False

    def initialize_device_threads_pool(self, thread_main: Callable[[GraphTask | None], None]) -> None:
        """Start one worker per non-default device, once per process; refuse in a bad fork.

        ``thread_main`` is the engine's loop (``engine.thread_main``), which every worker
        and pool thread runs.
        """
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
            self.thread_main = thread_main
            queues = {}
            for device in others:
                q = queues[device] = ReadyQueue()
                name = f"xgrad-autograd-{device.platform}:{device.id}"
                thread = threading.Thread(target=_device_thread_main, args=(device, q, thread_main), name=name, daemon=True)
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
            threading.Thread(target=_reentrant_thread_main, args=(self.thread_main,), name=name, daemon=True).start()

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


def _device_thread_main(device: Any, q: ReadyQueue, thread_main: Callable[[GraphTask | None], None]) -> None:
    _tls.worker_device = device
    _tls.local_ready_queue = q
    thread_main(None)


def _reentrant_thread_main(thread_main: Callable[[GraphTask | None], None]) -> None:
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


def ready_queue(cpu_ready_queue: ReadyQueue, fn: Node, device_queues: dict[Any, ReadyQueue]) -> ReadyQueue:
    """The queue ``fn`` runs from: its device worker's, or the task's CPU queue."""
    if device_queues:
        return device_queues.get(fn.device(), cpu_ready_queue)
    return cpu_ready_queue


def _ready_queue_by_owner(cpu_ready_queue: ReadyQueue, owner: Any) -> ReadyQueue:
    if owner == CPU_DEVICE or owner == NO_DEVICE:
        return cpu_ready_queue
    return _devices.queues[owner]

