"""Saved tensors: what a node keeps for its backward, with version checks and hooks.

A ``SavedTensor`` remembers the tensor's ``_version`` at save time; unpacking a
tensor that an in-place op changed since then raises, as in PyTorch. Inside
``saved_tensors_hooks(pack, unpack)`` the saved value is ``pack(tensor)`` and backward
sees ``unpack(packed)``, re-attached to the original tensor's place in the graph.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from xgrad.engine.node import grad_accumulator
from xgrad.tensor import Tensor

if TYPE_CHECKING:
    from xgrad.engine.node import Node

__all__ = ["SavedTensor", "save_on_cpu", "saved_tensors_hooks"]

ERR_FREED = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward."
)

ERR_VERSION_HINT = (
    "Hint: enable anomaly detection to find the operation that failed to compute its "
    "gradient, with xgrad.autograd.set_detect_anomaly(True)."
)


class _HookStack(threading.local):
    def __init__(self) -> None:
        self.stack: list[tuple[Callable[[Tensor], Any], Callable[[Any], Tensor]]] = []


_hooks = _HookStack()


class saved_tensors_hooks:
    """Context manager: every tensor saved for backward inside it goes through ``pack``.

    Args:
        pack_hook: ``pack(tensor) -> object``, called when an op saves ``tensor``.
        unpack_hook: ``unpack(object) -> Tensor``, called when backward needs it; must
            return a tensor with the original's shape and dtype.

    Nested contexts use the innermost pair.

    >>> import xgrad
    >>> seen = []
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> with xgrad.autograd.graph.saved_tensors_hooks(lambda t: seen.append(1) or t, lambda t: t):
    ...     y = (x * x).sum()
    >>> y.backward(); len(seen)
    2
    """

    def __init__(self, pack_hook: Callable[[Tensor], Any], unpack_hook: Callable[[Any], Tensor]) -> None:
        self.pack_hook = pack_hook
        self.unpack_hook = unpack_hook

    def __enter__(self) -> saved_tensors_hooks:
        _hooks.stack.append((self.pack_hook, self.unpack_hook))
        return self

    def __exit__(self, *exc: object) -> None:
        _hooks.stack.pop()


class save_on_cpu(saved_tensors_hooks):
    """Keep saved arrays on the host CPU device and move them back when backward needs them.

    Args:
        pin_memory: accepted for PyTorch compatibility; JAX manages host buffers itself.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> with xgrad.autograd.graph.save_on_cpu():
    ...     y = (x.exp()).sum()
    >>> y.backward(); x.grad.tolist() == x.exp().tolist()
    True
    """

    def __init__(self, pin_memory: bool = False) -> None:
        cpu = jax.devices("cpu")[0]

        def pack(t: Tensor) -> tuple[Any, jax.Array]:
            return t._array.sharding, jax.device_put(t._array, cpu)

        def unpack(packed: tuple[Any, jax.Array]) -> Tensor:
            sharding, array = packed
            return Tensor(jax.device_put(array, sharding))

        super().__init__(pack, unpack)


def current_hooks() -> tuple[Callable[[Tensor], Any], Callable[[Any], Tensor]] | None:
    stack = _hooks.stack
    return stack[-1] if stack else None


class SavedTensor:
    """One tensor saved by a node: the value, its version, and where it sits in the graph."""

    __slots__ = ("_array", "_graph", "_output_nr", "_packed", "_ref", "_saved_version", "_state", "_unpack")

    # _state: "input" (strong ref), "output" (weak ref: a node must not keep its own
    # output alive), "hooked" (packed by saved-tensor hooks) or "freed".
    _ref: Tensor | weakref.ref[Tensor] | None  # the Tensor itself exactly in state "input"

    def __init__(self, tensor: Tensor, is_output: bool) -> None:
        self._saved_version = tensor._version
        self._output_nr = tensor._output_nr
        hooks = current_hooks()
        if hooks is not None:
            pack, self._unpack = hooks
            # Keep only what re-attaches the unpacked value to the graph, never the
            # data: that is what the hooks are for (offloading, recomputation).
            self._ref = weakref.ref(tensor)
            self._array = None
            if not is_output:
                leaf_acc = grad_accumulator(tensor) if tensor.grad_fn is None and tensor.requires_grad else None
                self._graph = (tensor.grad_fn, tensor._output_nr, leaf_acc, tensor.requires_grad)
            self._packed = pack(tensor)
            self._state = "hooked_output" if is_output else "hooked_input"
        elif is_output:
            self._ref = weakref.ref(tensor)
            self._array = tensor._array
            self._state = "output"
        else:
            self._ref = tensor
            self._state = "input"

    def _current_tensor(self) -> Tensor | None:
        ref = self._ref
        return ref() if isinstance(ref, weakref.ref) else ref

    def unpack(self, node: Node) -> Tensor:
        state = self._state
        if state == "freed":
            raise RuntimeError(ERR_FREED)
        original = self._current_tensor()
        if original is not None and original._version != self._saved_version:
            self._raise_version_error(original, node)
        if state == "input":
            return original  # type: ignore[return-value]
        if state == "output":
            if original is not None:
                return original
            return Tensor._from_graph(self._array, node, self._output_nr)
        unpacked = self._unpack(self._packed)
        if not isinstance(unpacked, Tensor):
            raise TypeError(
                f"Output of saved tensor unpack_hook expected to be a Tensor but got result of type "
                f"{type(unpacked).__name__}"
            )
        if state == "hooked_output":
            return Tensor._from_graph(unpacked._array, node, self._output_nr)
        grad_fn, output_nr, leaf_acc, requires_grad = self._graph
        return Tensor._attached(unpacked._array, grad_fn, output_nr, leaf_acc, requires_grad)

    def _raise_version_error(self, tensor: Tensor, node: Node) -> None:
        where = f", which is output {tensor._output_nr} of {tensor.grad_fn.name()}," if tensor.grad_fn else ""
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [{tensor.dtype} {list(tensor.shape)}]{where} is at version "
            f"{tensor._version}; expected version {self._saved_version} instead (saved by "
            f"{node.name()}). {ERR_VERSION_HINT}"
        )

    def release(self) -> None:
        self._state = "freed"
        self._ref = None
        self._array = None
        self._packed = None
        self._graph = None
