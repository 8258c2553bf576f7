"""``xgrad.autograd.graph``: the graph's node types, gradient edges, saved-tensor hooks and
hooks over several tensors, as in ``torch.autograd.graph``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from xgrad.engine.api import GradientEdge
from xgrad.engine.hooks import RemovableHandle
from xgrad.engine.node import AccumulateGrad, Edge, GraphRoot, Node, current_task, gradient_edge
from xgrad.engine.saved import (
    allow_mutation_on_saved_tensors,
    disable_saved_tensors_hooks,
    save_on_cpu,
    saved_tensors_hooks,
)
from xgrad.tensor import Tensor

__all__ = [
    "AccumulateGrad", "Edge", "GradientEdge", "GraphRoot", "Node", "allow_mutation_on_saved_tensors", "current_node",
    "disable_saved_tensors_hooks", "get_gradient_edge", "register_multi_grad_hook", "save_on_cpu",
    "saved_tensors_hooks",
]


def get_gradient_edge(tensor: Tensor) -> GradientEdge:
    """The ``GradientEdge`` of ``tensor``: its ``grad_fn`` (or a leaf's ``AccumulateGrad``) and slot.

    >>> import xgrad
    >>> from xgrad.autograd.graph import get_gradient_edge
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> y = x * 2
    >>> edge = get_gradient_edge(y)
    >>> out = (y * y).sum()
    >>> xgrad.autograd.grad(out, edge)[0].tolist()  # d out / d y
    [4.0, 8.0]
    """
    if not tensor.requires_grad:
        raise RuntimeError("It is not possible to get the gradient edge for a Tensor that does not require gradients")
    edge = gradient_edge(tensor)
    return GradientEdge(edge.node, edge.input_nr)  # type: ignore[arg-type]


def current_node() -> Node | None:
    """The node the engine is running on this thread (``None`` outside backward).

    PyTorch's ``torch._C._current_autograd_node()``: useful in hooks and in a custom
    ``Function``'s backward.

    >>> import xgrad
    >>> from xgrad.autograd.graph import current_node
    >>> x = xgrad.tensor([1.0], requires_grad=True)
    >>> y = x.exp()
    >>> seen = []
    >>> h = y.grad_fn.register_prehook(lambda grads: seen.append(current_node().name()))
    >>> y.sum().backward(); seen, current_node()
    (['ExpBackward'], None)
    """
    return current_task.node  # type: ignore[no-any-return]


class _MultiHandle(RemovableHandle):
    """Removes every per-tensor hook of a multi-grad hook."""

    def __init__(self, handles: tuple[RemovableHandle, ...]) -> None:
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def __enter__(self) -> _MultiHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _will_execute(task: Any, node: Node) -> bool:
    """Whether ``node`` runs in ``task`` (PyTorch's ``_will_engine_execute_node``).

    It must be in the task's graph (reachable from its roots) and, when the task has
    ``exec_info``, on a path to what the task computes.
    """
    exec_info = task.exec_info
    if exec_info:
        info = exec_info.get(node)
        if info is None or not info.should_execute():
            return False
    seen = set(task.graph_roots)
    stack = list(seen)
    while stack:
        fn = stack.pop()
        if fn is node:
            return True
        for next_fn, _ in fn.next_edges:
            if next_fn is not None and next_fn not in seen:
                seen.add(next_fn)
                stack.append(next_fn)
    return False


def register_multi_grad_hook(
    tensors: Sequence[Tensor], fn: Callable[..., Any], *, mode: str = "all"
) -> RemovableHandle:
    """Register a hook over several tensors' gradients.

    With ``mode="all"``, ``fn(grads)`` is called once per backward, after the gradients
    of all the tensors this backward computes are known: ``grads`` has one entry per
    tensor, ``None`` for those the backward does not reach. With ``mode="any"``,
    ``fn(grad)`` is called once per backward, with the first of their gradients
    computed. Tensors that do not require grad are skipped. ``fn`` returns ``None``.

    Args:
        tensors: the tensors to watch.
        fn: the hook.
        mode: ``"all"`` or ``"any"``.

    >>> import xgrad
    >>> from xgrad.autograd.graph import register_multi_grad_hook
    >>> a = xgrad.tensor([1.0], requires_grad=True)
    >>> b = xgrad.tensor([2.0], requires_grad=True)
    >>> seen = []
    >>> h = register_multi_grad_hook((a, b), lambda grads: seen.append([g and g.tolist() for g in grads]))
    >>> (a * 3).sum().backward()
    >>> seen
    [[[3.0], None]]
    """
    if mode not in ("all", "any"):
        raise ValueError(f"Expects mode to be one of ('all', 'any') but got {mode}")
    lock = threading.Lock()
    tensors = tuple(tensors)
    if mode == "any":
        ran: dict[int, Any] = {}

        def wrapped(grad: Tensor) -> None:
            task = current_task.graph_task
            with lock:
                if ran.get(id(task)) is task:
                    return
                ran.clear()  # one task at a time is enough to remember: ids are reused
                ran[id(task)] = task
            fn(grad)

        return _MultiHandle(tuple(t.register_hook(wrapped) for t in tensors if t.requires_grad))

    nodes = [gradient_edge(t).node if t.requires_grad else None for t in tensors]
    # Per graph task: (the task, calls expected, calls so far, grads so far).
    pending: dict[int, list[Any]] = {}

    def inner(index: int) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            task = current_task.graph_task
            with lock:
                state = pending.get(id(task))
                if state is None or state[0] is not task:
                    expected = sum(1 for node in nodes if node is not None and _will_execute(task, node))
                    state = pending[id(task)] = [task, expected, 0, [None] * len(tensors)]
                state[3][index] = grad
                state[2] += 1
                done = state[2] == state[1]
                if done:
                    del pending[id(task)]
            if done:
                fn(state[3])

        return hook

    return _MultiHandle(tuple(t.register_hook(inner(i)) for i, t in enumerate(tensors) if t.requires_grad))
