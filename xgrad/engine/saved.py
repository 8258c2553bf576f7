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

from xgrad.engine.node import current_task, grad_accumulator, sharding_of
from xgrad.tensor import Tensor

if TYPE_CHECKING:
    from xgrad.engine.node import AccumulateGrad, Node

__all__ = [
    "SavedTensor", "allow_mutation_on_saved_tensors", "disable_saved_tensors_hooks", "save_on_cpu", "saved_tensors_hooks",
]

ERR_FREED = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward."
)

ERR_PACK_INPLACE = (
    "A saved tensors pack hook is modifying its input in place. Tensors provided as input to "
    "pack hook can not be modified by in-place operations as this can lead to unexpected "
    "side-effects. Please open an issue if you need to perform in-place operations on the "
    "input to a pack hook."
)

ERR_INFERENCE_SAVED = (
    "Inference tensors cannot be saved for backward. To work around you can make a clone to get a normal tensor "
    "and use it in autograd."
)

ERR_VERSION_HINT = (
    "Hint: enable anomaly detection to find the operation that failed to compute its "
    "gradient, with xgrad.autograd.set_detect_anomaly(True)."
)


class _HookStack(threading.local):
    def __init__(self) -> None:
        self.stack: list[saved_tensors_hooks] = []
        # Set by ``disable_saved_tensors_hooks``: entering hooks raises with it.
        self.disabled_message: str | None = None
        self.saver = "?"  # the op whose save a pack hook is running for (``saving_op``)


_hooks = _HookStack()


def saving_op() -> str:
    """Inside a pack hook: the name of the op (primitive or ``Function``) saving the tensor, ``"?"`` if unknown."""
    return _hooks.saver


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

    # Whether unpacking checks that the tensor was not modified in place since it was
    # saved: the hooks may return that very tensor (``allow_mutation_on_saved_tensors``
    # keeps the saved value instead, so it needs no check).
    checks_version = True

    def __init__(self, pack_hook: Callable[[Tensor], Any], unpack_hook: Callable[[Any], Tensor]) -> None:
        self.pack_hook = pack_hook
        self.unpack_hook = unpack_hook

    def __enter__(self) -> saved_tensors_hooks:
        if _hooks.disabled_message is not None:
            raise RuntimeError(_hooks.disabled_message)
        _hooks.stack.append(self)
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
            sharding = sharding_of(t._array)
            if sharding is None:  # traced (xgrad.compile, jax.jit): XLA places the program's values
                return None, t._array
            return sharding, jax.device_put(t._array, cpu)

        def unpack(packed: tuple[Any, jax.Array]) -> Tensor:
            sharding, array = packed
            return Tensor(array if sharding is None else jax.device_put(array, sharding))

        super().__init__(pack, unpack)


class disable_saved_tensors_hooks:
    """Context manager: saved-tensor hooks may not be used inside it.

    Entering ``saved_tensors_hooks`` (or ``save_on_cpu``, a non-reentrant checkpoint…)
    inside it raises ``RuntimeError(error_message)``, and so does entering it while such
    hooks are active. For features that cannot work with them.

    Args:
        error_message: the message of the ``RuntimeError``.

    >>> import xgrad
    >>> from xgrad.autograd.graph import disable_saved_tensors_hooks, save_on_cpu
    >>> with disable_saved_tensors_hooks("saved tensors default hooks are disabled"):
    ...     with save_on_cpu():
    ...         pass
    Traceback (most recent call last):
    RuntimeError: saved tensors default hooks are disabled
    """

    def __init__(self, error_message: str) -> None:
        self.error_message = error_message
        self._previous: str | None = None

    def __enter__(self) -> disable_saved_tensors_hooks:
        if _hooks.stack:
            raise RuntimeError(self.error_message)
        self._previous = _hooks.disabled_message
        _hooks.disabled_message = self.error_message
        return self

    def __exit__(self, *exc: object) -> None:
        _hooks.disabled_message = self._previous


class MutationContextError(AssertionError, RuntimeError):
    """A backward outside its ``allow_mutation_on_saved_tensors`` context: PyTorch raises an
    ``AssertionError`` there; it is a ``RuntimeError`` too, as xgrad's other errors."""


ERR_MUTATION_NESTED = "allow_mutation_on_saved_tensors contexts cannot be nested"
ERR_MUTATION_OUTSIDE = (
    "Trying to backward outside of the 'allow_mutation_on_saved_tensors' context in which the graph was "
    "originally recorded."
)


class allow_mutation_on_saved_tensors(saved_tensors_hooks):
    """Context manager: tensors saved for backward inside it may be modified in place.

    Backward then uses the values as they were when saved (PyTorch clones a tensor on
    its first mutation; a ``jax.Array`` is immutable, so keeping it is the clone). The
    backward must run inside the same context.

    >>> import xgrad
    >>> from xgrad.autograd.graph import allow_mutation_on_saved_tensors
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> with allow_mutation_on_saved_tensors():
    ...     y = x * 1.0
    ...     z = (y * y).sum()
    ...     _ = y.mul_(10.0)
    ...     z.backward()
    >>> x.grad.tolist()
    [2.0, 4.0]
    """

    checks_version = False

    def __init__(self) -> None:
        self.closed = False
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> allow_mutation_on_saved_tensors:
        if any(isinstance(hooks, allow_mutation_on_saved_tensors) for hooks in _hooks.stack):
            raise RuntimeError(ERR_MUTATION_NESTED)
        super().__enter__()
        return self

    @staticmethod
    def _pack(t: Tensor) -> Any:
        return t._array

    def _unpack(self, array: Any) -> Tensor:
        if self.closed:
            raise MutationContextError(ERR_MUTATION_OUTSIDE)
        return Tensor(array)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.closed = True


def _call_unpack_hook(unpack: Callable[[Any], Tensor], packed: Any) -> Any:
    """``unpack(packed)``, leaving the thread's saved-tensor hooks as they were before it.

    PyTorch runs every node under the hooks state of the moment its backward started
    and restores the caller's state afterwards, so an unpack hook that exits its own
    context (or enters one) changes nothing outside the node: no pop from an empty
    stack later, and no hooks left behind to pack every later saved tensor.
    """
    stack, disabled = list(_hooks.stack), _hooks.disabled_message
    try:
        return unpack(packed)
    finally:
        _hooks.stack[:] = stack
        _hooks.disabled_message = disabled


class _Gone:
    __slots__ = ("__weakref__",)


# The ``_ref`` of a saved tensor whose version is not checked: a reference that is dead at once.
_NO_TENSOR: weakref.ref[Any] = weakref.ref(_Gone())


class SavedTensor:
    """One tensor saved by a node: the value, its version, and where it sits in the graph."""

    __slots__ = ("_array", "_fw_grad", "_graph", "_output_nr", "_packed", "_ref", "_saved_version", "_state", "_unpack")

    # _state: "input" (strong ref), "output" (weak ref: a node must not keep its own
    # output alive), "view_output" (an output a view took in place: a weak ref to the
    # view's base for the version, the value from ``_array``), "hooked_input" /
    # "hooked_output" (packed by saved-tensor hooks) or "freed".
    _ref: Tensor | weakref.ref[Tensor] | None  # the Tensor itself exactly in state "input"
    _graph: tuple[Node | None, int, AccumulateGrad | None, bool] | None  # hooked inputs: where they sit in the graph
    _unpack: Callable[[Any], Tensor] | None  # the unpack hook, while hooked

    def __init__(self, tensor: Tensor, is_output: bool, saver: str = "?") -> None:
        if tensor._inference:
            raise RuntimeError(ERR_INFERENCE_SAVED)
        self._saved_version = tensor._version
        stack = _hooks.stack  # the innermost hooks are the last; every recorded op saves its inputs here
        if not stack and not is_output:
            # A plain input comes back as the tensor itself: no output number or tangent to keep.
            self._ref = tensor
            self._state = "input"
            return
        self._output_nr = tensor._output_nr
        # The tangent comes back with a value rebuilt on unpack (NOTE [Dual levels]).
        self._fw_grad = tensor._fw_grad
        if stack:
            hooks = stack[-1]
            pack, self._unpack = hooks.pack_hook, hooks.unpack_hook
            # Keep only what re-attaches the unpacked value to the graph, never the
            # data: that is what the hooks are for (offloading, recomputation).
            self._ref = weakref.ref(tensor) if hooks.checks_version else _NO_TENSOR
            self._array = None
            if not is_output:
                leaf_acc = grad_accumulator(tensor) if tensor.grad_fn is None and tensor.requires_grad else None
                self._graph = (tensor.grad_fn, tensor._output_nr, leaf_acc, tensor.requires_grad)
            outer, _hooks.saver = _hooks.saver, saver
            try:
                self._packed = pack(tensor)
            finally:
                _hooks.saver = outer
            if tensor._version != self._saved_version:
                raise RuntimeError(ERR_PACK_INPLACE)
            self._state = "hooked_output" if is_output else "hooked_input"
        else:
            self._ref = weakref.ref(tensor)
            self._array = tensor._array
            self._state = "output"

    def _current_tensor(self) -> Tensor | None:
        ref = self._ref
        return ref() if isinstance(ref, weakref.ref) else ref

    def check_version(self, node: Node) -> Tensor | None:
        """The saved tensor itself where it is still alive, after checking that nothing changed it in place since."""
        if self._state == "freed":
            raise RuntimeError(ERR_FREED)
        original = self._current_tensor()
        if original is not None and original._version != self._saved_version:
            self._raise_version_error(original, node)
        return original

    def unpack(self, node: Node) -> Tensor:
        original = self.check_version(node)
        state = self._state
        if state == "input":
            return original  # type: ignore[return-value]
        if state == "output" and original is not None:
            return original
        if state in ("output", "view_output"):
            return self._with_tangent(Tensor._from_graph(self._array, node, self._output_nr))
        assert self._unpack is not None, "a hooked saved tensor keeps its unpack hook until released"
        # The hook runs as part of ``node``: ``current_node()`` inside it is that node.
        previous, current_task.node = current_task.node, node
        try:
            unpacked = _call_unpack_hook(self._unpack, self._packed)
        finally:
            current_task.node = previous
        if not isinstance(unpacked, Tensor):
            raise TypeError(
                f"Output of saved tensor unpack_hook expected to be a Tensor but got result of type "
                f"{type(unpacked).__name__}"
            )
        if state == "hooked_output":
            return self._with_tangent(Tensor._from_graph(unpacked._array, node, self._output_nr))
        assert self._graph is not None, "a hooked input keeps where it sits in the graph"
        grad_fn, output_nr, leaf_acc, requires_grad = self._graph
        if grad_fn is None and not requires_grad and not unpacked.requires_grad:
            return unpacked  # nothing to re-attach: the hook's tensor itself, as PyTorch returns it
        return self._with_tangent(Tensor._attached(unpacked._array, grad_fn, output_nr, leaf_acc, requires_grad))

    def follow(self, result: Tensor, tensor: Tensor) -> None:
        """``tensor`` took the saved output ``result``'s value and place (NOTE [In-place results are saved as the tensor])."""
        if self._state not in ("output", "hooked_output") or self._current_tensor() is not result:
            return
        view = tensor._view
        if view is None:
            self._ref = weakref.ref(tensor)
        else:
            # The base's version, which every write to the base or a view of it moves: the
            # view itself may be gone by the backward (PyTorch's shares the base's counter).
            self._ref = weakref.ref(view.base)
            if self._state == "output":
                self._state = "view_output"  # the value comes back from the saved array
        self._saved_version = self._current_tensor()._version  # type: ignore[union-attr]

    def _with_tangent(self, t: Tensor) -> Tensor:
        t._fw_grad = self._fw_grad
        return t

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
        self._unpack = None  # the hook may hold the graph (a checkpoint's recomputation does)
        self._fw_grad = None


# NOTE [In-place results are saved as the tensor]
# An in-place op runs out of place on an alias (``inplace.alias``) and the tensor then takes
# the result's value and history. A node that saved that result as its output (``exp_``,
# ``sigmoid_``, ``relu_``: their rules read the output) would hold a result no one else
# keeps: its weak reference dies, and a later in-place write to the tensor went unseen,
# where PyTorch, whose in-place op saves the tensor itself, raises at backward. So the
# saved output follows the tensor: its version is checked against the tensor's from then on
# (for a view, the view's, which moves with every write to its base).
def follow_inplace(result: Tensor, tensor: Tensor) -> None:
    """Point the saved copies of ``result`` in its node at ``tensor``, which took ``result``'s value in place."""
    node = result.grad_fn
    for saved in (getattr(node, "saved_out", None) or (), getattr(node, "saved", None) or ()):
        for s in saved:
            if type(s) is SavedTensor:
                s.follow(result, tensor)
