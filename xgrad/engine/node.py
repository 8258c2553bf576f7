"""The backward graph: ``Edge``, ``Node`` and the nodes every graph has.

A ``Node`` is one backward function. Its *inputs* are the gradients of the forward
op's outputs (one slot per output, described by ``input_metadata``); its *outputs*
are the gradients of the forward op's inputs, sent along ``next_edges``. The names
are PyTorch's, so ``next_functions``, ``sequence_nr`` and ``topological_nr`` mean
what a PyTorch user expects.

# NOTE [Hooks ordering]
# For a node about to run the engine calls, in order: the tensor pre-hooks of each
# input slot (``Tensor.register_hook``), the retains-grad hook of each slot
# (``Tensor.retain_grad``), the node pre-hooks (``Node.register_prehook``), the node
# itself, then the node post-hooks (``Node.register_hook``). ``AccumulateGrad`` reads
# its tensor pre-hooks from its leaf and runs the leaf's post-accumulate-grad hooks
# after ``.grad`` is written. This is PyTorch's order, the kinds' ranks in ``KINDS``
# (NOTE [Hook kinds] in ``xgrad/tensor/hook_kinds.py``).
"""

from __future__ import annotations

import inspect
import itertools
import threading
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import jax

from xgrad import step_trace
from xgrad.engine import engine_ops
from xgrad.engine.hooks import HookDict, RemovableHandle, add_hook, run_in_order
from xgrad.grad_mode import is_grad_enabled
from xgrad.tensor import Tensor
from xgrad.tensor.hook_kinds import POST, PRE, TENSOR

__all__ = ["AccumulateGrad", "Edge", "GraphRoot", "InputMetadata", "Node", "grad_accumulator", "sharding_of"]


def sharding_of(array: Any) -> Any:
    """``array.sharding``, or ``None`` for a traced value, which XLA places.

    Never ``getattr(tracer, "sharding", None)``: a tracer's ``AttributeError`` describes
    the whole trace so far, so that read costs time growing with the trace (milliseconds
    after a few thousand ops), which made long traces quadratic.

    >>> import jax.numpy as jnp
    >>> from xgrad.engine.node import sharding_of
    >>> sharding_of(jnp.ones(2)) is not None, sharding_of(3.0)
    (True, None)
    """
    if isinstance(array, jax.core.Tracer):
        return None
    return getattr(array, "sharding", None)


class Edge(NamedTuple):
    """Where a gradient goes: input slot ``input_nr`` of ``node`` (``None``: nowhere)."""

    node: Node | None
    input_nr: int


NO_EDGE = Edge(None, 0)


class InputMetadata(NamedTuple):
    """Shape, dtype and sharding of one node input: what a gradient sent there must match."""

    shape: tuple[int, ...]
    dtype: Any
    sharding: Any

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @staticmethod
    def of(array: Any) -> InputMetadata:
        return InputMetadata(array.shape, array.dtype, sharding_of(array))


class _SequenceCounter(threading.local):
    def __init__(self) -> None:
        self.next = itertools.count().__next__


_sequence = _SequenceCounter()


def next_sequence_nr() -> int:
    """Take a number from this thread's ``sequence_nr`` counter: nodes made after the call number above it."""
    return _sequence.next()


class _CurrentTask(threading.local):
    """The graph task and node this thread is running (set by the engine)."""

    graph_task: Any = None
    node: Any = None


current_task = _CurrentTask()


def _check_arity(fn: Any, n: int, expected: str) -> None:
    """Raise at registration, not mid-backward, when ``fn`` cannot take ``n`` positional arguments."""
    if not callable(fn):
        raise TypeError(f"hook must be callable, got {type(fn).__name__}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return
    try:
        signature.bind(*([None] * n))
    except TypeError:
        raise TypeError(f"{expected}, but {fn!r} cannot be called with {n} positional argument{'s' * (n > 1)}") from None


def single_device(sharding: Any) -> Any:
    """The one device ``sharding`` places data on, ``None`` if it spans several."""
    devices = sharding.device_set
    if len(devices) == 1:
        for device in devices:  # faster than next(iter(...)): the engine asks per node
            return device
    return None


class Node:
    """A backward function in the recorded graph.

    Subclasses implement ``apply(grads) -> list`` with one gradient (or ``None``)
    per entry of ``next_edges``.
    """

    __slots__ = (
        "__weakref__",
        "_edges_needed",
        "_metadata",
        "_post_hooks",
        "_pre_hooks",
        "_retains_grad_hooks",
        "_tensor_pre_hooks",
        "input_metadata",
        "next_edges",
        "sequence_nr",
        "topological_nr",
    )

    sequence_nr: int
    topological_nr: int
    _edges_needed: tuple[bool, ...] | None

    #: Whether ``apply`` may run user code (a Function's backward, post-accumulate-grad
    #: hooks), which may ask for ``xgrad.autograd.graph.current_node()``; nodes that
    #: replay pure rules say ``False`` and spare the engine setting it.
    runs_user_code: ClassVar[bool] = True

    def __init__(
        self,
        next_edges: tuple[Edge, ...],
        input_metadata: tuple[InputMetadata, ...],
        sequence_nr: int | None = None,
        topological_nr: int | None = None,
    ) -> None:
        self.next_edges = next_edges
        self.input_metadata = input_metadata
        self.sequence_nr = _sequence.next() if sequence_nr is None else sequence_nr
        if topological_nr is None:  # one more than the highest of the nodes the edges lead to, 0 for none
            topological_nr = 0
            for edge in next_edges:
                node = edge.node
                if node is not None and node.topological_nr >= topological_nr:
                    topological_nr = node.topological_nr + 1
        self.topological_nr = topological_nr
        self._metadata: dict[str, Any] | None = None
        # Which next edges lead anywhere: given by primitives as they are recorded,
        # computed on first use for other nodes (``needed_outputs``).
        self._edges_needed: tuple[bool, ...] | None = None
        self._pre_hooks: HookDict | None = None
        self._post_hooks: HookDict | None = None
        self._tensor_pre_hooks: HookDict | None = None
        self._retains_grad_hooks: dict[int, Any] | None = None

    # -- what PyTorch users call -------------------------------------------------
    def name(self) -> str:
        return type(self).__name__

    @property
    def next_functions(self) -> tuple[tuple[Node | None, int], ...]:
        return tuple((e.node, e.input_nr) for e in self.next_edges)

    @property
    def metadata(self) -> dict[str, Any]:
        if self._metadata is None:
            self._metadata = {}
        return self._metadata

    @property
    def num_inputs(self) -> int:
        return len(self.input_metadata)

    def register_prehook(self, fn: Any) -> RemovableHandle:
        """Register ``fn(grad_outputs) -> tuple | None``, run before the node.

        ``grad_outputs`` is a tuple with one gradient (or ``None``) per node input; a
        non-``None`` return replaces it.
        """
        _check_arity(fn, 1, "Node.register_prehook expects fn(grad_outputs)")
        if self._pre_hooks is None:
            self._pre_hooks = HookDict(PRE)
        return add_hook(self._pre_hooks, fn, self)

    def register_hook(self, fn: Any) -> RemovableHandle:
        """Register ``fn(grad_inputs, grad_outputs) -> tuple | None``, run after the node.

        ``grad_inputs`` are the gradients the node computed (one per next edge),
        ``grad_outputs`` the ones it received; a non-``None`` return replaces
        ``grad_inputs``.
        """
        _check_arity(fn, 2, "Node.register_hook expects fn(grad_inputs, grad_outputs)")
        if self._post_hooks is None:
            self._post_hooks = HookDict(POST)
        return add_hook(self._post_hooks, fn, self)

    # -- engine interface ---------------------------------------------------------
    def apply(self, grads: list[Tensor | None]) -> list[Tensor | None]:
        raise NotImplementedError

    def release_variables(self) -> None:
        """Drop saved values after a backward that does not keep the graph."""

    def tensor_pre_hooks(self) -> HookDict | None:
        """Hooks ``(input_nr, fn)`` registered on the tensors this node's inputs belong to."""
        return self._tensor_pre_hooks

    def add_tensor_pre_hook(self, input_nr: int, fn: Any) -> RemovableHandle:
        if self._tensor_pre_hooks is None:
            self._tensor_pre_hooks = HookDict(TENSOR)
        return add_hook(self._tensor_pre_hooks, (input_nr, fn), self)

    def should_compute_output(self, i: int) -> bool:
        """Whether next edge ``i`` leads anywhere the current graph task needs."""
        node = self.next_edges[i].node
        if node is None:
            return False
        task = current_task.graph_task
        if task is not None and task.exec_info:
            info = task.exec_info.get(node)
            return info is not None and info.should_execute()
        return True

    def needed_outputs(self) -> Sequence[bool]:
        """``should_compute_output(i)`` for every next edge, reading the task's state once."""
        task = current_task.graph_task
        exec_info = task.exec_info if task is not None else None
        if not exec_info:
            # Without exec_info the answer depends on the edges alone: compute it once.
            needed = self._edges_needed
            if needed is None:
                needed = self._edges_needed = tuple(edge.node is not None for edge in self.next_edges)
            return needed
        needed_now: list[bool] = []
        for node, _ in self.next_edges:
            info = exec_info.get(node) if node is not None else None
            needed_now.append(info is not None and info.should_execute())
        return needed_now

    def device(self) -> Any:
        """The device this node runs on: that of its first input, ``None`` if sharded."""
        if not self.input_metadata:
            return None
        sharding = self.input_metadata[0].sharding
        return None if sharding is None else single_device(sharding)

    def __repr__(self) -> str:
        return f"<{self.name()} object at {id(self):#x}>"


class GraphRoot(Node):
    """The dummy root of a backward call with several roots: it emits the root grads."""

    __slots__ = ("outputs",)

    def __init__(self, root_edges: tuple[Edge, ...], grads: list[Tensor]) -> None:
        super().__init__(root_edges, ())
        self.outputs = grads

    def apply(self, grads: list[Tensor | None]) -> list[Tensor | None]:
        return list(self.outputs)

    def device(self) -> Any:
        for g in self.outputs:
            if g is not None:
                sharding = sharding_of(g._array)  # a traced grad (``xgrad.compile``) has none: the caller's queue
                return None if sharding is None else single_device(sharding)
        return None


# Accumulation into a shared leaf must not lose updates when several threads run
# backward at once; the critical section is one add, so one lock is enough.
_accumulate_lock = threading.Lock()


# NOTE [AccumulateGrad runs first]
# As in PyTorch, every ``AccumulateGrad`` has the highest sequence number, so it runs
# as soon as it is ready (its leaf's ``.grad`` and hooks are up to date before the
# rest of the backward), and accumulators ready at the same moment tie: the ready
# queue then keeps push order, which is the producer's edge order (with
# ``y = x * w``, ``x``'s hooks fire before ``w``'s). It takes no number from the
# thread's counter.
ACCUMULATE_GRAD_SEQUENCE_NR = 2**64 - 1  # PyTorch's UINT64_MAX

ERR_POST_ACCUMULATE_RESULT = "Tensor post accumulate grad hooks should return None."


class AccumulateGrad(Node):
    """The sink for a leaf tensor: adds the incoming gradient into ``variable.grad``."""

    __slots__ = ("variable",)

    def __init__(self, variable: Tensor) -> None:
        super().__init__((), (InputMetadata.of(variable._array),), ACCUMULATE_GRAD_SEQUENCE_NR)
        self.variable = variable

    def tensor_pre_hooks(self) -> HookDict | None:
        return self.variable._backward_hooks

    def apply(self, grads: list[Tensor | None]) -> list[Tensor | None]:
        new_grad = grads[0]
        if new_grad is None:
            return []
        var = self.variable
        create_graph = is_grad_enabled()
        new_grad = _on_leaf_sharding(new_grad, self.input_metadata[0].sharding, create_graph)
        # ``_grad``, not the validating ``grad`` setter: validate_outputs fitted new_grad.
        trace = step_trace.current()
        if trace is not None:  # NOTE [The step-trace seam]
            trace.grad_read(var)
        with _accumulate_lock:
            old = var._grad
            if old is None:
                if trace is not None:
                    trace.grad_write(var)
                # A detached wrapper: the caller's gradient tensor must not alias .grad.
                var._grad = new_grad if create_graph and new_grad.grad_fn is not None else Tensor(new_grad._array)
            elif create_graph:
                if trace is not None:
                    trace.grad_write(var)
                var._grad = old + new_grad
            else:
                if trace is not None:
                    trace.read(old)
                store_into_grad(old, old._array + new_grad._array)
        run_post_accumulate_grad_hooks(var)
        return []

    def __repr__(self) -> str:
        return f"<AccumulateGrad object at {id(self):#x}>"


def _on_leaf_sharding(grad: Tensor, sharding: Any, create_graph: bool) -> Tensor:
    """``grad`` placed on its leaf's multi-device ``sharding``, as the compiled backward places it.

    A rule's output may come back with another layout over the same devices (``P('model')``
    for a replicated bias); the leaf's ``.grad``, and so the optimizer step, must not drift.
    """
    if not isinstance(sharding, jax.sharding.NamedSharding) or len(sharding.device_set) < 2:
        return grad
    current = sharding_of(grad._array)
    if current is None or current == sharding or current.is_equivalent_to(sharding, grad._array.ndim):
        return grad
    if create_graph and grad.grad_fn is not None:
        return engine_ops.to_device(grad, sharding)
    return Tensor(jax.device_put(grad._array, sharding))


def store_into_grad(grad: Tensor, array: Any) -> None:
    """Write the accumulated ``array`` into the existing ``.grad`` tensor ``grad``, in place.

    PyTorch accumulates with ``grad += new_grad`` unless the backward records itself
    (``create_graph``, where ``.grad`` becomes a new tensor): a reference taken to
    ``.grad`` before a backward, or held by a hook, sees the sum. Like any in-place
    op here it rebinds the tensor's storage and bumps its version.
    """
    trace = step_trace.current()
    if trace is not None:
        trace.write(grad)
    grad._array = array
    grad._version += 1


def run_post_accumulate_grad_hooks(var: Tensor) -> None:
    """Call ``var``'s post-accumulate-grad hooks, after its ``.grad`` was written.

    Every hook collected runs; then any non-``None`` result raises, as in PyTorch.
    """
    hooks = var._post_accumulate_grad_hooks
    if not hooks:
        return
    returned = False
    for hook in run_in_order(hooks):
        if hook(var) is not None:
            returned = True
    if returned:
        raise RuntimeError(ERR_POST_ACCUMULATE_RESULT)


def grad_accumulator(tensor: Tensor) -> AccumulateGrad:
    """The leaf's ``AccumulateGrad``: one per leaf while any graph holds it."""
    ref = tensor._grad_accumulator
    acc = ref() if ref is not None else None
    if acc is None:
        acc = AccumulateGrad(tensor)
        tensor._grad_accumulator = weakref.ref(acc)
    return acc


def gradient_edge(tensor: Tensor) -> Edge:
    """The edge a gradient for ``tensor`` travels along."""
    if tensor.grad_fn is not None:
        return Edge(tensor.grad_fn, tensor._output_nr)
    return Edge(grad_accumulator(tensor), 0)
