"""``get_execution_order``: the order the single-threaded engine would run a backward's nodes in.

It builds the same ``GraphTask`` as a real call (``engine.prepare``: dependency
counts, ``exec_info``) and replays the scheduling without running any node: a node
becomes ready when its dependency count reaches zero, ready nodes pop highest
``sequence_nr`` first (one graph task, so the reentrant depth never differs), and
with ``exec_info`` only nodes on a path to an input are queued, and only the
``needed`` ones run.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from xgrad.engine.engine import prepare
from xgrad.engine.node import GraphRoot, Node, gradient_edge
from xgrad.tensor import Tensor

__all__ = ["get_execution_order"]


def _as_list(value: Tensor | Sequence[Tensor], what: str) -> list[Tensor]:
    tensors = [value] if isinstance(value, Tensor) else list(value)
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"{what} must be Tensors, got {type(t).__name__}")
        if not t.requires_grad:
            raise RuntimeError(f"element {i} of {what} does not require grad and does not have a grad_fn")
    return tensors


def get_execution_order(
    tensors: Tensor | Sequence[Tensor],
    inputs: Tensor | Sequence[Tensor] | None = None,
    *,
    accumulate_grad: bool = False,
) -> list[Node]:
    """The nodes a backward from ``tensors`` runs, in the order the engine runs them.

    The order is that of one thread (``set_multithreading_enabled(False)``, or every
    node on the default CPU device). The dummy root of a multi-root call is left out.

    Args:
        tensors: the roots, as for ``backward``/``grad``.
        inputs: restrict to nodes on a path to these tensors, as ``grad(tensors,
            inputs)`` does (their own ``AccumulateGrad`` nodes do not run).
        accumulate_grad: with ``inputs``, order ``backward(tensors, inputs=inputs)``
            instead, which runs the inputs' ``AccumulateGrad`` nodes.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> y = (x.exp() * x).sum()
    >>> [n.name() for n in xgrad.autograd.get_execution_order(y)]
    ['SumBackward', 'MulBackward', 'ExpBackward', 'AccumulateGrad']
    """
    roots = _as_list(tensors, "tensors")
    input_edges = [gradient_edge(t) for t in _as_list(inputs, "inputs")] if inputs is not None else []
    accumulate = accumulate_grad or inputs is None
    graph_task, graph_root, _ = prepare(
        [gradient_edge(t) for t in roots], [None] * len(roots), True, False, accumulate, input_edges  # type: ignore[list-item]
    )
    dependencies = dict(graph_task.dependencies)
    exec_info = graph_task.exec_info
    order: list[Node] = []
    # Equal sequence numbers (nodes made on different threads) pop first-in first-out.
    tiebreak = itertools.count().__next__
    ready: list[tuple[int, int, Node]] = [(-graph_root.sequence_nr, tiebreak(), graph_root)]
    queued: set[Node] = {graph_root}
    while ready:
        fn = heapq.heappop(ready)[2]
        if exec_info and not exec_info[fn].needed:
            continue
        if type(fn) is not GraphRoot:
            order.append(fn)
        for next_fn, _ in fn.next_edges:
            if next_fn is None:
                continue
            dependencies[next_fn] -= 1
            if exec_info:
                info = exec_info.get(next_fn)
                if info is None or not info.should_execute():
                    continue
            if dependencies[next_fn] == 0 and next_fn not in queued:
                queued.add(next_fn)
                heapq.heappush(ready, (-next_fn.sequence_nr, tiebreak(), next_fn))
    return order
