"""``Tensor``: a ``jax.Array`` plus the autograd state PyTorch users expect.

The array is the storage and decides dtype, device and sharding. Autograd state is a
handful of slots: ``grad_fn``/``_output_nr`` for a non-leaf, ``_requires_grad`` and a
weak reference to the ``AccumulateGrad`` for a leaf, the ``.grad``, hooks, and the
in-place ``_version`` counter. Ops and operators are attached by ``xgrad.ops``.
"""

from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.grad_mode import is_grad_enabled

if TYPE_CHECKING:
    from xgrad.engine.hooks import HookDict, RemovableHandle
    from xgrad.engine.node import AccumulateGrad, Node

__all__ = ["Tensor", "is_differentiable_dtype"]


# The module whose ``_operator_*`` functions implement ``jax.Array``'s operators.
_JAX_OPERATORS = "jax._src.numpy.array_methods"


def is_differentiable_dtype(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


ERR_REQUIRES_GRAD_DTYPE = "Only Tensors of floating point and complex dtype can require gradients, got {dtype}"
ERR_NON_LEAF_REQUIRES_GRAD = (
    "you can only change requires_grad flags of leaf variables. If you want to use a computed "
    "variable in a subgraph that doesn't require differentiation use var_no_grad = var.detach()."
)
ERR_LEAF_INPLACE = "a leaf Variable that requires grad is being used in an in-place operation."
# NOTE [JAX boundary]
# A Tensor is a pytree of its array, so JAX transformations and ``jax.device_put`` see
# the array. Autograd history cannot follow it out: a Tensor with a ``grad_fn`` that
# comes back concrete from ``jax.jit``/``vmap``, ``device_put`` or ``tree_map`` raises
# this error instead of becoming a leaf whose gradients go nowhere.
ERR_HISTORY_CROSSES_JAX = (
    "a Tensor with autograd history came out of a JAX transformation (jax.jit, jax.vmap, jax.grad), jax.device_put "
    "or a tree_map, which would cut its graph. Use xgrad.compile(fn) to jit xgrad code that records autograd, "
    "tensor.to(device) to move a tensor differentiably, or tensor.detach() to drop the history first."
)


@jax.tree_util.register_pytree_node_class
class Tensor:
    """An array with autograd: ``.grad``, ``.grad_fn``, ``.backward()`` and hooks.

    Create one with ``xgrad.tensor`` or a factory (``xgrad.zeros``, ``xgrad.randn``, …).

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
    >>> y = (x * x).sum()
    >>> y.backward()
    >>> x.grad.tolist()
    [2.0, 4.0, 6.0]
    """

    __slots__ = (
        "__weakref__",
        "_array",
        "_backward_hooks",
        "_grad",
        "_grad_accumulator",
        "_output_nr",
        "_post_accumulate_grad_hooks",
        "_requires_grad",
        "_retains_grad",
        "_version",
        "grad_fn",
    )

    __array_priority__ = 1000  # NumPy defers binary operators to Tensor

    if TYPE_CHECKING:
        # xgrad.ops attaches the op methods and operators at import; declare them for
        # the type checker.
        def __getattr__(self, name: str) -> Any: ...
        def __add__(self, other: Any) -> Tensor: ...
        def __radd__(self, other: Any) -> Tensor: ...
        def __sub__(self, other: Any) -> Tensor: ...
        def __rsub__(self, other: Any) -> Tensor: ...
        def __mul__(self, other: Any) -> Tensor: ...
        def __rmul__(self, other: Any) -> Tensor: ...
        def __truediv__(self, other: Any) -> Tensor: ...
        def __rtruediv__(self, other: Any) -> Tensor: ...
        def __pow__(self, other: Any) -> Tensor: ...
        def __rpow__(self, other: Any) -> Tensor: ...
        def __matmul__(self, other: Any) -> Tensor: ...
        def __rmatmul__(self, other: Any) -> Tensor: ...
        def __neg__(self) -> Tensor: ...
        def __abs__(self) -> Tensor: ...
        def __getitem__(self, index: Any) -> Tensor: ...
        def __setitem__(self, index: Any, value: Any) -> None: ...
        def __lt__(self, other: Any) -> Tensor: ...
        def __le__(self, other: Any) -> Tensor: ...
        def __gt__(self, other: Any) -> Tensor: ...
        def __ge__(self, other: Any) -> Tensor: ...
        def __and__(self, other: Any) -> Tensor: ...
        def __or__(self, other: Any) -> Tensor: ...
        def __invert__(self) -> Tensor: ...

    def __init__(self, array: Any, requires_grad: bool = False) -> None:
        self._array = array
        self.grad_fn: Node | None = None
        self._output_nr = 0
        self._grad: Tensor | None = None
        self._version = 0
        self._backward_hooks: HookDict | None = None
        self._post_accumulate_grad_hooks: HookDict | None = None
        self._grad_accumulator: weakref.ref[AccumulateGrad] | None = None
        self._retains_grad = False
        self._requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    @classmethod
    def _from_graph(cls, array: Any, grad_fn: Node, output_nr: int) -> Tensor:
        """An op output: a non-leaf that ``grad_fn`` produced at ``output_nr``."""
        t = cls(array)
        t.grad_fn = grad_fn
        t._output_nr = output_nr
        return t

    @classmethod
    def _attached(
        cls, array: Any, grad_fn: Node | None, output_nr: int, leaf_acc: AccumulateGrad | None, requires_grad: bool
    ) -> Tensor:
        """A new tensor holding ``array`` that sits where another tensor sat in the graph."""
        t = cls(array)
        t.grad_fn = grad_fn
        t._output_nr = output_nr
        if leaf_acc is not None:
            t._requires_grad = True
            t._grad_accumulator = weakref.ref(leaf_acc)
        elif grad_fn is None:
            t._requires_grad = requires_grad
        return t

    # -- pytree ----------------------------------------------------------------------
    def tree_flatten(self) -> tuple[tuple[Any], tuple[bool, bool]]:
        return (self._array,), (self.requires_grad, self.grad_fn is not None)

    @classmethod
    def tree_unflatten(cls, aux: tuple[bool, bool], children: tuple[Any]) -> Tensor:
        # JAX may unflatten with placeholder leaves, so no dtype checks here.
        requires_grad, has_history = aux
        array = children[0]
        if has_history and isinstance(array, jax.Array) and not isinstance(array, jax.core.Tracer):
            # A concrete value leaving jax.jit/vmap, jax.device_put or a tree_map: the
            # graph cannot come along, and a leaf that claims requires_grad would take
            # the gradients nobody reads (NOTE [JAX boundary]).
            raise RuntimeError(ERR_HISTORY_CROSSES_JAX)
        t = cls(array)
        t._requires_grad = requires_grad and not has_history
        return t

    # -- array attributes ------------------------------------------------------------
    @property
    def array(self) -> jax.Array:
        """The underlying ``jax.Array`` (no copy)."""
        return self._array

    @property
    def data(self) -> Tensor:
        return self.detach()

    @property
    def shape(self) -> tuple[int, ...]:
        return self._array.shape

    @property
    def ndim(self) -> int:
        return self._array.ndim

    @property
    def dtype(self) -> Any:
        return self._array.dtype

    @property
    def device(self) -> jax.Device:
        """The ``jax.Device`` holding the array (the first one, for a sharded array)."""
        devices = self._array.sharding._device_assignment
        return devices[0]

    @property
    def sharding(self) -> jax.sharding.Sharding:
        return self._array.sharding

    def dim(self) -> int:
        return self._array.ndim

    def size(self, dim: int | None = None) -> Any:
        return self._array.shape if dim is None else self._array.shape[dim]

    def numel(self) -> int:
        return int(self._array.size)

    def __len__(self) -> int:
        if self._array.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._array.shape[0]

    def __iter__(self) -> Any:
        # Without this Python iterates through __getitem__ until IndexError, and JAX
        # indexing clamps instead of raising, so the loop would never end.
        if self._array.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self._array.shape[0]))

    # -- autograd attributes ---------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self.grad_fn is not None or self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """Set whether autograd records ops on this leaf; returns ``self``."""
        if self.grad_fn is not None:
            if requires_grad:
                return self
            raise RuntimeError(ERR_NON_LEAF_REQUIRES_GRAD)
        if requires_grad and not is_differentiable_dtype(self._array.dtype):
            raise RuntimeError(ERR_REQUIRES_GRAD_DTYPE.format(dtype=self._array.dtype))
        self._requires_grad = bool(requires_grad)
        return self

    @property
    def grad(self) -> Tensor | None:
        """The gradient backward accumulated here (leaves, and non-leaves that retain grad)."""
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        # The engine writes ``_grad`` directly: validate_outputs already fitted its grads.
        if value is not None:
            self._check_assigned_grad(value)
        self._grad = value

    def _check_assigned_grad(self, value: Any) -> None:
        if not isinstance(value, Tensor):
            raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of type {type(value).__name__}")
        mine, theirs = self._array, value._array
        if theirs.dtype != mine.dtype:
            raise RuntimeError(f"assigned grad has data of a different type: expected {mine.dtype}, got {theirs.dtype}")
        if theirs.shape != mine.shape:
            raise RuntimeError(
                f"assigned grad has data of a different size: expected {list(mine.shape)}, got {list(theirs.shape)}"
            )
        if theirs.sharding.device_set != mine.sharding.device_set:
            raise RuntimeError(
                f"assigned grad has data located on a different device: expected {self.device}, got {value.device}"
            )

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    @property
    def output_nr(self) -> int:
        return self._output_nr

    # -- conversion ------------------------------------------------------------------
    def __jax_array__(self) -> jax.Array:
        """The array, for ``jnp`` functions: they see the value only, untracked.

        A ``jax.Array`` on the left of an operator (``jnp.ones(2) * t``) is the
        exception: the array's operator asks for this first; it gets the Tensor back,
        so it defers and the Tensor's reflected operator records the op.

        >>> import jax.numpy as jnp, xgrad
        >>> t = xgrad.tensor([1.0, 2.0], requires_grad=True)
        >>> (jnp.ones(2) * t).grad_fn.name(), type(jnp.sin(t)).__name__
        ('MulBackward', 'ArrayImpl')
        """
        caller = sys._getframe(1)
        if caller.f_code.co_name.startswith("_operator_") and caller.f_globals.get("__name__") == _JAX_OPERATORS:
            return self  # type: ignore[return-value]  # not an accepted operand: jax returns NotImplemented
        return self._array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.asarray(self._array)
        return out.astype(dtype) if dtype is not None else out

    def numpy(self) -> np.ndarray:
        return np.asarray(self._array)

    def item(self) -> Any:
        return self._array.item()

    def tolist(self) -> Any:
        return np.asarray(self._array).tolist()

    def __float__(self) -> float:
        return float(self._array)

    def __int__(self) -> int:
        return int(self._array)

    def __index__(self) -> int:
        return int(self._array.__index__())

    def __bool__(self) -> bool:
        return bool(self._array)

    def detach(self) -> Tensor:
        """A new leaf sharing the array, outside the graph."""
        return Tensor(self._array)

    def detach_(self) -> Tensor:
        self.grad_fn = None
        self._output_nr = 0
        self._requires_grad = False
        return self

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        body = np.array2string(np.asarray(self._array), separator=", ", prefix="tensor(")
        extras = []
        if self._array.dtype not in (jnp.float32, jnp.int32, jnp.bool_):
            extras.append(f"dtype={self._array.dtype}")
        if self.grad_fn is not None:
            extras.append(f"grad_fn=<{self.grad_fn.name()}>")
        elif self._requires_grad:
            extras.append("requires_grad=True")
        return "tensor(" + ", ".join([body, *extras]) + ")"

    # -- autograd entry points -------------------------------------------------------
    def backward(
        self,
        gradient: Any = None,
        retain_graph: bool | None = None,
        create_graph: bool = False,
        inputs: Any = None,
        compiled: bool | None = None,
    ) -> None:
        """Accumulate the gradient of this tensor into the ``.grad`` of the graph's leaves.

        Args:
            gradient: the gradient of some scalar w.r.t. this tensor; may be omitted for
                a one-element tensor (then it is 1).
            retain_graph: keep saved values for another backward (default: ``create_graph``).
            create_graph: record the backward itself, for higher-order gradients.
            inputs: accumulate only into these tensors' ``.grad``.
            compiled: run the backward as one cached ``jax.jit`` program (default: the
                ``xgrad.autograd.compiled`` switch).

        >>> import xgrad
        >>> x = xgrad.tensor(3.0, requires_grad=True)
        >>> (x ** 2).backward()
        >>> x.grad.item()
        6.0
        """
        from xgrad.engine.api import backward

        backward(self, gradient, retain_graph, create_graph, inputs=inputs, compiled=compiled)

    def register_hook(self, hook: Any) -> RemovableHandle:
        """Register ``hook(grad) -> Tensor | None``, called with this tensor's gradient.

        A non-``None`` return replaces the gradient. Works on leaves and non-leaves.

        >>> import xgrad
        >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
        >>> h = x.register_hook(lambda g: g * 10)
        >>> x.sum().backward(); x.grad.tolist()
        [10.0, 10.0]
        """
        from xgrad.engine.hooks import HookDict, add_hook

        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self.grad_fn is not None:
            return self.grad_fn.add_tensor_pre_hook(self._output_nr, hook)
        if self._backward_hooks is None:
            self._backward_hooks = HookDict()
        return add_hook(self._backward_hooks, (0, hook))

    def retain_grad(self) -> None:
        """Make a non-leaf keep its ``.grad`` after backward (a no-op on leaves).

        >>> import xgrad
        >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
        >>> y = x * 3; y.retain_grad()
        >>> y.sum().backward(); y.grad.tolist()
        [1.0, 1.0]
        """
        if not self.requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self.grad_fn is None or self._retains_grad:
            return
        self._retains_grad = True
        self._install_retains_grad_hook()

    def _install_retains_grad_hook(self) -> None:
        ref = weakref.ref(self)

        def retain(grad: Tensor) -> None:
            tensor = ref()
            if tensor is None or grad is None:
                return
            # Out of place, as PyTorch does, so the engine's buffer is never aliased.
            tensor._grad = Tensor(grad._array) if tensor._grad is None else Tensor(tensor._grad._array + grad._array)

        node = self.grad_fn
        assert node is not None
        if node._retains_grad_hooks is None:
            node._retains_grad_hooks = {}
        node._retains_grad_hooks[self._output_nr] = retain

    def register_post_accumulate_grad_hook(self, hook: Any) -> RemovableHandle:
        """Register ``hook(tensor)``, called after ``.grad`` of this leaf was updated.

        >>> import xgrad
        >>> x = xgrad.tensor([1.0], requires_grad=True)
        >>> seen = []
        >>> h = x.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.tolist()))
        >>> (x * 2).sum().backward(); seen
        [[2.0]]
        """
        from xgrad.engine.hooks import HookDict, add_hook

        if self.grad_fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self._post_accumulate_grad_hooks is None:
            self._post_accumulate_grad_hooks = HookDict()
        return add_hook(self._post_accumulate_grad_hooks, hook)

    # -- in-place plumbing -----------------------------------------------------------
    def _check_inplace(self) -> None:
        if self.grad_fn is None and self._requires_grad and is_grad_enabled():
            raise RuntimeError(ERR_LEAF_INPLACE)

    def _alias(self) -> Tensor:
        """A second handle on this tensor's value and graph position, for in-place ops.

        The out-of-place op runs on the alias, so what it saves keeps version 0 while
        ``self`` moves on; nodes that saved ``self`` itself see the bump and raise.
        """
        t = Tensor(self._array)
        t.grad_fn = self.grad_fn
        t._output_nr = self._output_nr
        t._requires_grad = self._requires_grad
        t._grad_accumulator = self._grad_accumulator
        if self.grad_fn is None and self._requires_grad:
            from xgrad.engine.node import grad_accumulator

            t._grad_accumulator = weakref.ref(grad_accumulator(self))
        return t

    def _rebind(self, result: Tensor) -> Tensor:
        """Take over ``result``'s value and history: the second half of an in-place op."""
        if result._array.shape != self._array.shape:
            raise RuntimeError(
                f"output with shape {list(self._array.shape)} doesn't match the broadcast shape "
                f"{list(result._array.shape)}"
            )
        array = result._array
        if array.dtype != self._array.dtype:
            array = array.astype(self._array.dtype)
        self._array = array
        self._version += 1
        if result.grad_fn is not None:
            if self._retains_grad and self.grad_fn is not None:
                # The retains-grad hook moves to the new grad_fn, as in PyTorch: .grad is the
                # gradient of the latest value. Other hooks stay with the old value.
                old_hooks = self.grad_fn._retains_grad_hooks
                if old_hooks:
                    old_hooks.pop(self._output_nr, None)
            self.grad_fn = result.grad_fn
            self._output_nr = result._output_nr
            if self._retains_grad:
                self._install_retains_grad_hook()
        return self
