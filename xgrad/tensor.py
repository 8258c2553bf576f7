"""``Tensor``: a ``jax.Array`` plus the autograd state PyTorch users expect.

The array is the storage and decides dtype, device and sharding. Autograd state is a
handful of slots: ``grad_fn``/``_output_nr`` for a non-leaf, ``_requires_grad`` and a
weak reference to the ``AccumulateGrad`` for a leaf, the ``.grad``, hooks, and the
in-place ``_version`` counter. Ops and operators are attached by ``xgrad.ops``.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad import step_trace
from xgrad.engine.dual import LEVEL
from xgrad.grad_mode import _state as _grad_state
from xgrad.grad_mode import is_grad_enabled, no_grad
from xgrad.jax_internals import get_opaque_trace_state

if TYPE_CHECKING:
    from xgrad.engine.hooks import HookDict, RemovableHandle
    from xgrad.engine.node import AccumulateGrad, Node
    from xgrad.ops.views import ViewInfo

__all__ = ["Tensor", "can_cast", "is_differentiable_dtype", "torch_dtype_name"]


def is_tensor(x: Any) -> bool:
    """Whether ``x`` is a Tensor (the ``is_leaf`` of pytree walks that stop at Tensors)."""
    return isinstance(x, Tensor)


def is_differentiable_dtype(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


ERR_REQUIRES_GRAD_DTYPE = "Only Tensors of floating point and complex dtype can require gradients, got {dtype}"
ERR_NON_LEAF_REQUIRES_GRAD = (
    "you can only change requires_grad flags of leaf variables. If you want to use a computed "
    "variable in a subgraph that doesn't require differentiation use var_no_grad = var.detach()."
)
WARN_NON_LEAF_GRAD = (
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad "
    "attribute won't be populated during autograd.backward(). If you indeed want the .grad "
    "field to be populated for a non-leaf Tensor, use .retain_grad() on the non-leaf Tensor. "
    "If you access the non-leaf Tensor by mistake, make sure you access the leaf Tensor "
    "instead. See github.com/pytorch/pytorch/pull/30531 for more informations."
)
ERR_LEAF_INPLACE = "a leaf Variable that requires grad is being used in an in-place operation."
ERR_INFERENCE_INPLACE = (
    "Inplace update to inference tensor outside InferenceMode is not allowed.You can make a clone to get a normal "
    "tensor before doing inplace update.See https://github.com/pytorch/rfcs/pull/17 for more details."
)
ERR_NUMPY_REQUIRES_GRAD = "Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead."
ERR_DEEPCOPY_NON_LEAF = (
    "Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol at the moment."
)
ERR_NOT_ADDRESSABLE = (
    "{what}: this tensor of shape {shape} spans devices of other processes ({sharding}), so this process holds "
    "only part of its values. Gather it on every process with "
    "jax.experimental.multihost_utils.process_allgather(t.array, tiled=True), or read this process's parts "
    "from t.array.addressable_shards."
)


def _spans_other_processes(array: Any) -> bool:
    """Whether ``array`` has values this process does not hold (a replicated one it holds whole)."""
    if isinstance(array, jax.core.Tracer) or not isinstance(array, jax.Array):
        return False
    return not array.is_fully_addressable and not array.is_fully_replicated


def _in_compiled_step() -> bool:
    """Whether this context is tracing an ``xgrad.compile`` step (its tracers stand for eager values)."""
    return step_trace.current() is not None


def _converts_outside_jax(t: Tensor, array: Any) -> bool:
    """Whether converting ``t`` to an array would lose its gradient: JAX is not tracing it for
    the user (NOTE [Tensors that require grad become arrays])."""
    if not isinstance(array, jax.core.Tracer) or _in_compiled_step():
        return True
    # A jnp function is itself jitted: ``jnp.sin(t)`` converts ``t`` in the very trace
    # it entered from outside, where a user's transformation would have used it first.
    entered = getattr(t, "_entered_trace", None)
    return entered is not None and entered == get_opaque_trace_state(convention="xgrad")


def _user_site() -> str:
    """`` (at file:line)``: the innermost frame outside JAX and xgrad, for messages."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not (module.split(".")[0] in ("jax", "jaxlib", "xgrad") or module.startswith("numpy")):
            return f" (at {frame.f_code.co_filename}:{frame.f_lineno})"
        frame = frame.f_back
    return ""


def _index_str(index: tuple[slice, ...]) -> str:
    """``[0:2, :]``: where a shard sits in the whole array."""
    return "[" + ", ".join(f"{'' if s.start is None else s.start}:{'' if s.stop is None else s.stop}" for s in index) + "]"


class _TensorMeta:
    """A Tensor node's pytree metadata (NOTE [Tensor as a pytree]): ``requires_grad``,
    whether it has history, whether its array was a tracer when it was flattened (an
    output of a traced function) and whether it is a gradient (a ``.grad``, or what optax
    or ``tree_map`` built from one).
    """

    __slots__ = ("compiled", "grad_enabled", "has_history", "is_grad", "requires_grad", "traced")

    def __init__(self, requires_grad: bool, has_history: bool, traced: bool = False, is_grad: bool = False) -> None:
        self.requires_grad = requires_grad
        self.has_history = has_history
        self.traced = traced
        self.is_grad = is_grad
        # What a trace of it does depends on these (NOTE [Tensors that require grad become arrays]).
        self.grad_enabled = requires_grad and is_grad_enabled()
        self.compiled = self.grad_enabled and traced and _in_compiled_step()

    def _raises(self) -> bool:
        """Whether a trace that takes this tensor in raises (on its history, or converting it to an array)."""
        return self.compiled if self.traced else self.grad_enabled or self.has_history

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _TensorMeta):
            return False
        if self.traced and other.traced:  # outputs and carries inside a trace (lax.scan, cond branches)
            return self.compiled == other.compiled
        if self.traced or other.traced:  # a jitted function called both inside and outside a trace
            return self._raises() == other._raises()
        if self.has_history != other.has_history:
            return False
        if self.is_grad or other.is_grad:
            return True
        return self.requires_grad == other.requires_grad and self.grad_enabled == other.grad_enabled

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"Tensor(requires_grad={self.requires_grad})"


# NOTE [JAX boundary]
# A Tensor is a pytree of its array, so JAX transformations and ``jax.device_put`` see
# the array. Autograd history cannot cross a JAX boundary, and never silently:
# * A Tensor with history going into a transformation (an argument of jax.jit, vmap,
#   grad) raises when the transformation traces it: the traced function could not
#   reach the graph behind it. Its metadata keeps it out of jit caches traced for a
#   leaf (``_TensorMeta.__eq__``), so a cache hit never skips the error.
# * What a traced function returns comes out as Tensors without history: the graph
#   recorded inside the trace (for a ``backward()`` there) belongs to the trace.
# * A Tensor with history that comes back concrete from ``jax.device_put`` or a
#   ``tree_map`` (flattened outside any trace) raises instead of becoming a leaf whose
#   gradients go nowhere.
ERR_HISTORY_CROSSES_JAX = (
    "a Tensor with autograd history came out of jax.device_put or a tree_map, which would cut its graph. "
    "Use tensor.to(device) to move a tensor differentiably, xgrad.compile(fn) to jit xgrad code that records "
    "autograd, or tensor.detach() to drop the history first."
)
ERR_HISTORY_INTO_JAX = (
    "a Tensor with autograd history was passed into a JAX function or transformation (jnp.sin, jax.jit, jax.vmap, "
    "...){where}: JAX computes with its value only, so the gradient would stop there. Use the xgrad op of the same "
    "name (xgrad.sin(t) for jnp.sin(t)), wrap a JAX function with xgrad.from_jax(fn) to make it differentiable, "
    "transform xgrad code with xgrad.func or jit it with xgrad.compile(fn); or pass t.detach() for the value only."
)
# NOTE [Tensors that require grad become arrays]
# ``jnp.sin(t)`` converts ``t`` through ``__jax_array__`` and returns a plain array: no
# graph. On a tensor that requires grad, with grad mode on, that would lose the gradient
# at one missing ``xgrad.`` prefix, so it raises, as PyTorch's ``numpy()`` does. Inside a
# plain JAX transformation (the array is a tracer) the conversion is JAX's to
# differentiate and goes through; inside an ``xgrad.compile`` step it raises as in eager.
# A ``jax.Array`` on the left of an operator (``jnp_array * t``) converts the Tensor the
# same way: JAX's public protocol has no way to defer to the Tensor's reflected operator.
ERR_REQUIRES_GRAD_TO_JAX = (
    "Can't convert a Tensor that requires grad to a jax.Array: JAX would compute with its value only and the "
    "gradient would be lost{where}. Use the xgrad op of the same name on the Tensor (xgrad.sin(t) for jnp.sin(t); "
    "t * a rather than a * t for a jax.Array a), wrap a JAX function with xgrad.from_jax(fn) to make it "
    "differentiable, or use t.detach() (or xgrad.no_grad()) if you want the value only."
)


@jax.tree_util.register_pytree_node_class
class Tensor:
    """An array with autograd: ``.grad``, ``.grad_fn``, ``.backward()`` and hooks.

    Create one with ``xgrad.tensor`` or a factory (``xgrad.zeros``, ``xgrad.randn``, …);
    ``xgrad.Tensor([1.0, 2.0])`` (PyTorch's legacy constructor) takes a list of numbers.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
    >>> y = (x * x).sum()
    >>> y.backward()
    >>> x.grad.tolist()
    [2.0, 4.0, 6.0]
    """

    __slots__ = (
        "__weakref__",
        "_alias_of",
        "_array",
        "_backward_hooks",
        "_fw_grad",
        "_grad",
        "_entered_trace",
        "_grad_accumulator",
        "_inference",
        "_is_grad",
        "_output_nr",
        "_placeholder_meta",
        "_post_accumulate_grad_hooks",
        "_requires_grad",
        "_retains_grad",
        "_version",
        "_view",
        "_views",
        "grad_fn",
    )

    __array_priority__ = 1000  # NumPy defers binary operators to Tensor

    # Slots left unset on most tensors (read with ``getattr`` and a default).
    _entered_trace: Any  # the trace a requires-grad tensor entered from outside (NOTE [Tensors that require grad become arrays])
    _is_grad: bool  # a gradient: its pytree node matches its parameter's (NOTE [Tensor as a pytree])
    _placeholder_meta: _TensorMeta  # a placeholder's: the node it stands in (NOTE [Tensor as a pytree])

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
        if type(array) is list or type(array) is tuple:
            # PyTorch's legacy constructor ``torch.Tensor([1.0, 2.0])``: data in the default float dtype.
            array = jnp.asarray(array, dtype=jnp.result_type(float))
        self._array = array
        self._alias_of: tuple[Callable[[], Tensor | None], bool] | None = None
        self.grad_fn: Node | None = None
        self._output_nr = 0
        self._grad: Tensor | None = None
        self._version = 0
        self._backward_hooks: HookDict | None = None
        self._post_accumulate_grad_hooks: HookDict | None = None
        self._grad_accumulator: weakref.ref[AccumulateGrad] | None = None
        self._retains_grad = False
        self._requires_grad = False
        self._view: ViewInfo | None = None  # NOTE [Views write through]
        self._views: list[weakref.ref[Tensor]] | None = None
        # An inference tensor: made inside ``inference_mode()`` (NOTE [Inference tensors]).
        self._inference = _grad_state.inference
        self._fw_grad: tuple[Any, Tensor] | None = None  # NOTE [Dual levels] in engine/dual.py
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
    # NOTE [Tensor as a pytree]
    # A Tensor is a pytree node with one child, its array, so jax.tree_util, optax and
    # jax.device_put see the array inside. Three choices make trees of Tensors behave:
    # * ``requires_grad`` rides along as metadata (``_TensorMeta``), and two Tensor nodes
    #   compare equal when their flags agree or one of them is a gradient (a ``.grad``,
    #   or what was built from one). A tree of parameters and the tree of their grads or
    #   optax updates then have one structure, so ``optax.apply_updates(params, updates)``
    #   and ``tree_map(lambda p, g: ..., params, grads)`` work, and what they build takes
    #   the first tree's flags: the new parameters are leaves that require grad, ready for
    #   the next forward. A jit cache never serves a call on a tensor that requires grad
    #   from a trace made for one that does not (``jnp.sin(t.detach())`` before
    #   ``jnp.sin(t)``): NOTE [Tensors that require grad become arrays].
    # * Unflattening wraps array-likes (anything with ``shape`` and ``dtype``: arrays,
    #   tracers, ``ShapeDtypeStruct``) as Tensors. A tuple or list comes back bare, so
    #   ``tree_map(lambda p: p.shape, state_dict)`` gives shapes. Any other value (a
    #   string, a number, ``None``, a ``bool`` mask, a library's per-leaf object) stays in
    #   a Tensor node as a placeholder, so that ``tree_map`` keeps the tree's structure:
    #   libraries that build trees leaf by leaf and zip them together again
    #   (``eqx.partition``/``combine``, orbax's names and save arguments) rely on it.
    #   ``tree_leaves`` of such a tree gives the values themselves.
    # * History never crosses a JAX boundary silently: NOTE [JAX boundary].
    def tree_flatten(self) -> tuple[tuple[Any], _TensorMeta]:
        array = self._array
        placeholder_meta = getattr(self, "_placeholder_meta", None)
        if placeholder_meta is not None:
            return (array,), placeholder_meta
        meta = _TensorMeta(
            self.requires_grad, self.grad_fn is not None, isinstance(array, jax.core.Tracer), getattr(self, "_is_grad", False)
        )
        return (array,), meta

    @classmethod
    def tree_unflatten(cls, meta: _TensorMeta, children: tuple[Any]) -> Any:
        (child,) = children
        if isinstance(child, Tensor):
            return child
        if not (hasattr(child, "shape") and hasattr(child, "dtype")):
            if isinstance(child, (tuple, list)):
                return child
            placeholder = Tensor(child)  # in a tree a library builds leaf by leaf: it flattens as the original
            placeholder._placeholder_meta = meta
            return placeholder
        if meta.has_history:
            if isinstance(child, jax.core.Tracer):
                if not meta.traced:
                    raise RuntimeError(ERR_HISTORY_INTO_JAX.format(where=_user_site()))
            elif not meta.traced:
                raise RuntimeError(ERR_HISTORY_CROSSES_JAX)
            return Tensor(child)  # a traced function's output: its graph stayed in the trace
        # JAX may unflatten with abstract leaves: no dtype checks beyond the flag's own.
        t = Tensor(child)
        t._requires_grad = meta.requires_grad and is_differentiable_dtype(child.dtype)
        if meta.is_grad:
            t._is_grad = True
        if t._requires_grad and not meta.traced:
            # An argument of the trace it is unflattened in, never a constant it captured.
            t._entered_trace = get_opaque_trace_state(convention="xgrad")
        return t

    # -- array attributes ------------------------------------------------------------
    @property
    def array(self) -> jax.Array:
        """The underlying ``jax.Array`` (no copy)."""
        return self._array

    @property
    def data(self) -> Tensor:
        """The value outside the graph; in-place ops on it reach this tensor without bumping
        its version, as PyTorch's ``.data`` (NOTE [Detached aliases]).

        >>> import xgrad
        >>> p = xgrad.tensor([1.0, 2.0], requires_grad=True)
        >>> p.data.mul_(0.5) is not None, p.tolist(), p.requires_grad
        (True, [0.5, 1.0], True)
        """
        return self._detached_alias(shares_version=False)

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
        """The ``jax.Device`` holding the array (for a sharded array, the first one this process holds)."""
        sharding = self._array.sharding
        devices = sharding._device_assignment
        if len(devices) > 1 and not sharding.is_fully_addressable:
            return sharding._addressable_device_assignment[0]
        return devices[0]

    @property
    def sharding(self) -> jax.sharding.Sharding:
        return self._array.sharding

    def dim(self) -> int:
        return self._array.ndim

    def size(self, dim: int | None = None) -> Any:
        if dim is None:
            return self._array.shape
        from xgrad.ops._util import canonical_dim  # the ops import this module

        if self._array.ndim == 0:
            raise IndexError(f"dimension specified as {dim} but tensor has no dimensions")
        return self._array.shape[canonical_dim(dim, self._array.ndim)]

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
        """The gradient backward accumulated here (leaves, and non-leaves that retain grad).

        Reading it on a non-leaf that does not retain grad, before anything set it,
        warns as PyTorch does: backward never fills it.
        """
        grad = self._grad
        if grad is None:
            if self.grad_fn is not None and not self._retains_grad:
                warnings.warn(WARN_NON_LEAF_GRAD, UserWarning, stacklevel=2)
        else:
            grad._is_grad = True  # its pytree node matches its parameter's (NOTE [Tensor as a pytree])
        return grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        # The engine writes ``_grad`` directly: validate_outputs already fitted its grads.
        if value is not None:
            self._check_assigned_grad(value)
        self._grad = value

    @grad.deleter
    def grad(self) -> None:
        self._grad = None

    def _check_assigned_grad(self, value: Any) -> None:
        """PyTorch's checks on ``x.grad = value``, in its order: itself, type, device, size."""
        if not isinstance(value, Tensor):
            raise TypeError(f"assigned grad expected to be a Tensor or None but got grad of type {type(value).__name__}")
        if value is self:
            raise RuntimeError("can't assign Variable as its own grad")
        mine, theirs = self._array, value._array
        if theirs.dtype != mine.dtype:
            raise RuntimeError(f"assigned grad has data of a different type: expected {mine.dtype}, got {theirs.dtype}")
        if theirs.sharding.device_set != mine.sharding.device_set:
            raise RuntimeError(
                f"assigned grad has data located on a different device: expected {self.device}, got {value.device}"
            )
        if theirs.shape != mine.shape:
            raise RuntimeError(
                f"assigned grad has data of a different size: expected {list(mine.shape)}, got {list(theirs.shape)}"
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

        A tensor that requires grad raises instead while grad mode is on, outside a
        plain JAX transformation (NOTE [Tensors that require grad become arrays]).

        >>> import jax.numpy as jnp, xgrad
        >>> t = xgrad.tensor([1.0, 2.0], requires_grad=True)
        >>> type(jnp.sin(t.detach())).__name__
        'ArrayImpl'
        >>> jnp.sin(t)
        Traceback (most recent call last):
        ...
        RuntimeError: Can't convert a Tensor that requires grad to a jax.Array: ...
        """
        array = self._array
        if self.requires_grad and is_grad_enabled() and _converts_outside_jax(self, array):
            raise RuntimeError(ERR_REQUIRES_GRAD_TO_JAX.format(where=_user_site()))
        return array

    def _check_addressable(self, what: str) -> None:
        if _spans_other_processes(self._array):
            raise RuntimeError(ERR_NOT_ADDRESSABLE.format(what=what, shape=self.shape, sharding=self._array.sharding))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        self._check_addressable("np.asarray(tensor)")
        out = np.asarray(self._array)
        return out.astype(dtype) if dtype is not None else out

    def numpy(self) -> np.ndarray:
        """The values as a NumPy array; raises for a tensor that requires grad, as PyTorch does.

        >>> import xgrad
        >>> xgrad.tensor([1.0, 2.0], requires_grad=True).detach().numpy()
        array([1., 2.], dtype=float32)
        """
        if self.requires_grad:
            raise RuntimeError(ERR_NUMPY_REQUIRES_GRAD)
        self._check_addressable("Tensor.numpy()")
        return np.asarray(self._array)

    def item(self) -> Any:
        self._check_addressable("Tensor.item()")
        size = self._array.size
        if size != 1:
            raise RuntimeError(f"a Tensor with {size} elements cannot be converted to Scalar")
        return self._array.item()

    def tolist(self) -> Any:
        self._check_addressable("Tensor.tolist()")
        return np.asarray(self._array).tolist()

    def __float__(self) -> float:
        self._check_addressable("float(tensor)")
        self._check_one_element()
        return float(self._array)

    def __int__(self) -> int:
        self._check_addressable("int(tensor)")
        self._check_one_element()
        return int(self._array)

    def _check_one_element(self) -> None:
        if self._array.size != 1:
            raise ValueError("only one element tensors can be converted to Python scalars")

    def __index__(self) -> int:
        return int(self._array.__index__())

    def __bool__(self) -> bool:
        self._check_addressable("bool(tensor)")
        size = self._array.size
        if size != 1:
            raise RuntimeError(f"Boolean value of Tensor with {'no values' if size == 0 else 'more than one value'} is ambiguous")
        return bool(self._array)

    def detach(self) -> Tensor:
        """A new leaf sharing the array, outside the graph (NOTE [Detached aliases]).

        >>> import xgrad
        >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
        >>> d = x.detach()
        >>> d.requires_grad, d.zero_() is d, x.tolist(), x._version
        (False, True, [0.0, 0.0], 1)
        """
        return self._detached_alias(shares_version=True)

    # NOTE [Detached aliases]
    # In PyTorch ``detach()`` and ``.data`` share storage with the tensor, so an in-place
    # op on them (``p.data.mul_(0.5)``, ``p.detach().zero_()``, ``ema.data.copy_(w)``)
    # changes the tensor itself, outside the graph; ``detach()``'s write bumps the shared
    # version counter (a saved tensor then refuses backward), ``.data``'s does not. JAX
    # arrays are immutable, so the alias remembers its source instead: an in-place op on
    # an alias that still holds its source's array writes the new value into the source
    # under ``no_grad`` (through the source's own views, if it is one) and then takes it
    # itself. An alias whose source has since been given another value has parted from
    # it (the write stays on the alias): JAX cannot make the two share a buffer.
    def _detached_alias(self, shares_version: bool) -> Tensor:
        t = Tensor(self._array)
        # A view is held strongly (``m[1].data.fill_(7.0)``: nothing else keeps that view
        # alive, and it holds its base anyway); any other source weakly, so an alias of a
        # result never keeps that result's graph alive.
        source: Callable[[], Tensor | None] = weakref.ref(self) if self._view is None else (lambda: self)
        t._alias_of = (source, shares_version)
        t._inference = self._inference
        if shares_version:
            t._version = self._version
        return t

    def detach_(self) -> Tensor:
        if self._view is not None:
            raise RuntimeError("Can't detach views in-place. Use detach() instead.")
        self.grad_fn = None
        self._output_nr = 0
        self._requires_grad = False
        self._fw_grad = None  # detached in forward mode too, as in PyTorch
        return self

    __hash__ = object.__hash__

    # -- copying and pickling ----------------------------------------------------------
    def __deepcopy__(self, memo: dict[int, Any]) -> Tensor:
        """A new leaf with the same (immutable) array, ``requires_grad`` and a copy of ``.grad``, as PyTorch's.

        A non-leaf raises PyTorch's error: its graph cannot be copied.
        """
        if self.grad_fn is not None:
            raise RuntimeError(ERR_DEEPCOPY_NON_LEAF)
        new = Tensor(self._array)
        memo[id(self)] = new
        new._requires_grad = self._requires_grad
        new._inference = self._inference
        if self._grad is not None:
            new._grad = Tensor(self._grad._array)
        return new

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        """Pickle the values and ``requires_grad`` (not ``.grad`` nor the graph), as PyTorch does.

        >>> import pickle, xgrad
        >>> t = pickle.loads(pickle.dumps(xgrad.tensor([1.0, 2.0], requires_grad=True)))
        >>> t.tolist(), t.requires_grad, t.is_leaf
        ([1.0, 2.0], True, True)
        """
        self._check_addressable("pickle")
        return (_unpickle_tensor, (np.asarray(self._array), self.requires_grad))

    def is_inference(self) -> bool:
        """Whether this is an inference tensor: made inside ``xgrad.inference_mode()`` (NOTE [Inference tensors]).

        >>> import xgrad
        >>> with xgrad.inference_mode():
        ...     t = xgrad.ones(2)
        >>> t.is_inference(), xgrad.ones(2).is_inference()
        (True, False)
        """
        return self._inference

    def __repr__(self) -> str:
        extras = []
        if _spans_other_processes(self._array):
            # Only this process's parts can be printed; say what the whole is.
            array = self._array
            parts = [
                f"{shard.device} {_index_str(shard.index)}: "
                + np.array2string(np.asarray(shard.data), separator=", ", prefix="  ")
                for shard in array.addressable_shards
            ]
            body = f"shape={tuple(array.shape)}, dtype={array.dtype}, sharding={array.sharding}, local shards:\n  " + (
                "\n  ".join(parts)
            )
        else:
            body = np.array2string(np.asarray(self._array), separator=", ", prefix="tensor(")
            if self._array.dtype not in (jnp.float32, jnp.int32, jnp.bool_):
                extras.append(f"dtype={self._array.dtype}")
        if self.grad_fn is not None:
            extras.append(f"grad_fn=<{self.grad_fn.name()}>")
        elif self._requires_grad:
            extras.append("requires_grad=True")
        fw = self._fw_grad
        if fw is not None and fw[0] is LEVEL.current:
            extras.append(f"tangent={fw[1]!r}")
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
        from xgrad.engine.node import _check_arity

        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        _check_arity(hook, 1, "Tensor.register_hook expects hook(grad)")
        if self.grad_fn is not None:
            return self.grad_fn.add_tensor_pre_hook(self._output_nr, hook)
        if self._backward_hooks is None:
            self._backward_hooks = HookDict()
        return add_hook(self._backward_hooks, (0, hook), self)

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
        """Register ``hook(tensor) -> None``, called after ``.grad`` of this leaf was updated.

        A hook that returns a value raises ``RuntimeError`` ("Tensor post accumulate
        grad hooks should return None.").

        >>> import xgrad
        >>> x = xgrad.tensor([1.0], requires_grad=True)
        >>> seen = []
        >>> h = x.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.tolist()))
        >>> (x * 2).sum().backward(); seen
        [[2.0]]
        """
        from xgrad.engine.hooks import HookDict, add_hook
        from xgrad.engine.node import _check_arity

        if self.grad_fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        _check_arity(hook, 1, "Tensor.register_post_accumulate_grad_hook expects hook(tensor)")
        if self._post_accumulate_grad_hooks is None:
            self._post_accumulate_grad_hooks = HookDict()
        return add_hook(self._post_accumulate_grad_hooks, hook, self)

    # -- PyTorch conveniences: layout, devices, factories ------------------------------
    def contiguous(self, memory_format: Any = None) -> Tensor:
        """``self`` if its PyTorch strides are row-major, else a copy (recorded as a clone) that is.

        A view with other strides (a transpose) cannot be ``view``-ed to most shapes: its
        contiguous copy can, as in PyTorch.

        >>> import xgrad
        >>> x = xgrad.zeros(2, 3, 4).transpose(1, 2)
        >>> x.contiguous().view(2, 12).shape
        (2, 12)
        """
        if self._view is None or self.is_contiguous():
            return self
        from xgrad.ops.elementwise import clone

        return clone(self)

    def is_contiguous(self, memory_format: Any = None) -> bool:
        """Whether PyTorch's strides of this tensor are row-major (size-1 dims aside).

        >>> import xgrad
        >>> x = xgrad.zeros(2, 3)
        >>> x.is_contiguous(), x.T.is_contiguous()
        (True, False)
        """
        if self._view is None:
            return True
        from xgrad.ops.views import strides_of

        expected = 1
        for n, stride in zip(reversed(self.shape), reversed(strides_of(self)), strict=True):
            if n != 1 and stride != expected:
                return False
            expected *= n
        return True

    def element_size(self) -> int:
        """Bytes per element.

        >>> import xgrad, jax.numpy as jnp
        >>> xgrad.zeros(2, dtype=jnp.float32).element_size()
        4
        """
        return int(self._array.dtype.itemsize)

    def type_as(self, other: Tensor) -> Tensor:
        """``self`` cast to ``other``'s dtype (differentiable, as ``to``)."""
        return self.to(other.dtype)

    def cpu(self) -> Tensor:
        """This tensor on the first CPU device (``self`` when it is on CPU already); differentiable."""
        if all(d.platform == "cpu" for d in self._array.sharding.device_set):
            return self
        return self.to(jax.devices("cpu")[0])

    def cuda(self, device: Any = None, non_blocking: bool = False) -> Tensor:
        """This tensor on a GPU: ``device`` an index, a ``jax.Device`` or ``"cuda:N"`` (default the first GPU).

        Raises ``RuntimeError`` when JAX sees no GPU.
        """
        try:
            gpus = jax.devices("gpu")
        except RuntimeError:
            gpus = []
        if not gpus:
            platforms = sorted({d.platform for d in jax.devices()})
            raise RuntimeError(
                f"No CUDA GPUs are available: JAX sees only {', '.join(platforms)} devices. Install a GPU build of "
                "JAX (pip install 'xgrad[cuda12]') or keep the tensor where it is (.cpu(), .to(device))."
            )
        if isinstance(device, jax.Device):
            target = device
        else:
            index = int(str(device).rpartition(":")[2] or 0) if isinstance(device, str) else (device or 0)
            if not 0 <= index < len(gpus):
                raise RuntimeError(f"CUDA error: invalid device ordinal {index} (there are {len(gpus)} GPUs)")
            target = gpus[index]
        if self._array.sharding.device_set == {target}:
            return self
        return self.to(target)

    def _new_placement(self, shape: tuple[int, ...]) -> Any:
        # This tensor's sharding fits only its own shape; other shapes go to its (first) device.
        return self._array.sharding if tuple(shape) == self._array.shape else self.device

    def new_full(self, size: Any, fill_value: Any, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        """A new tensor of ``size`` filled with ``fill_value``, with this tensor's dtype and device by default.

        >>> import xgrad
        >>> xgrad.tensor([1, 2]).new_full((2, 2), 7).tolist()
        [[7, 7], [7, 7]]
        """
        from xgrad.creation import full

        shape = (size,) if isinstance(size, int) else tuple(size)
        placement = self._new_placement(shape) if device is None else device
        return full(shape, fill_value, dtype=self.dtype if dtype is None else dtype, device=placement, requires_grad=requires_grad)

    def new_zeros(self, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        """A new tensor of zeros, with this tensor's dtype and device by default.

        >>> import xgrad, jax.numpy as jnp
        >>> xgrad.zeros(1, dtype=jnp.float32).new_zeros(2, 3).dtype
        dtype('float32')
        """
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        return self.new_full(shape, 0, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_ones(self, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        """A new tensor of ones, with this tensor's dtype and device by default.

        >>> import xgrad
        >>> xgrad.tensor([1.0]).new_ones(2).tolist()
        [1.0, 1.0]
        """
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        return self.new_full(shape, 1, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_tensor(self, data: Any, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
        """A new leaf holding ``data`` (a Tensor's values are taken, not its graph), with this tensor's dtype and device by default.

        >>> import xgrad
        >>> xgrad.tensor([1.0]).new_tensor([2, 3]).tolist()
        [2.0, 3.0]
        """
        from xgrad.creation import tensor

        array = data._array if isinstance(data, Tensor) else jnp.asarray(data)
        placement = self._new_placement(array.shape) if device is None else device
        return tensor(array, dtype=self.dtype if dtype is None else dtype, device=placement, requires_grad=requires_grad)

    # -- in-place plumbing -----------------------------------------------------------
    def _check_inplace(self) -> None:
        if self._inference and not _grad_state.inference:
            raise RuntimeError(ERR_INFERENCE_INPLACE)
        if self._view is not None:
            self._view.check_writable(self)
        elif self.grad_fn is None and self._requires_grad and is_grad_enabled():
            raise RuntimeError(ERR_LEAF_INPLACE)

    def _alias(self) -> Tensor:
        """A second handle on this tensor's value and graph position, for in-place ops.

        The out-of-place op runs on the alias, so what it saves keeps version 0 while
        ``self`` moves on; nodes that saved ``self`` itself see the bump and raise. A
        view whose base has a graph is made afresh from the base (``views.view_alias``).
        """
        view = self._view
        if view is not None and _grad_state.enabled and view.base.requires_grad:
            from xgrad.ops.views import view_alias

            return view_alias(self)
        t = Tensor(self._array)
        t._inference = self._inference
        t.grad_fn = self.grad_fn
        t._output_nr = self._output_nr
        t._requires_grad = self._requires_grad
        t._grad_accumulator = self._grad_accumulator
        # Its tangent is an alias too: the in-place op's forward rule saves it, and the
        # tangent itself is then updated in place (NOTE [Dual levels]).
        fw = self._fw_grad
        t._fw_grad = None if fw is None else (fw[0], fw[1]._alias())
        if self.grad_fn is None and self._requires_grad:
            from xgrad.engine.node import grad_accumulator

            t._grad_accumulator = weakref.ref(grad_accumulator(self))
        return t

    def _rebind(self, result: Tensor) -> Tensor:
        """Take over ``result``'s value and history: the second half of an in-place op.

        On a view the new value is written through to its base, and every live view of
        that base is regenerated from it (NOTE [Views write through]).
        """
        if result._array.shape != self._array.shape:
            raise RuntimeError(
                f"output with shape {list(self._array.shape)} doesn't match the broadcast shape "
                f"{list(result._array.shape)}"
            )
        dtype = self._array.dtype
        if result._array.dtype != dtype:
            if not can_cast(result._array.dtype, dtype):
                raise RuntimeError(
                    f"result type {torch_dtype_name(result._array.dtype)} can't be cast to the desired output "
                    f"type {torch_dtype_name(dtype)}"
                )
            result = result.astype(dtype)
        if self._alias_of is not None and self._write_to_source(result):
            return self
        if self._view is not None:
            from xgrad.ops.views import write_through

            write_through(self, result)
            return self
        self._take_value(result)
        if self._views is not None:
            from xgrad.ops.views import regenerate_views

            regenerate_views(self)
        return self

    def _write_to_source(self, result: Tensor) -> bool:
        """Write a detached alias's new value into its source (NOTE [Detached aliases]).

        Returns False when the alias has parted from its source.
        """
        assert self._alias_of is not None
        get_source, shares_version = self._alias_of
        source = get_source()
        if source is None or source._array is not self._array:
            self._alias_of = None
            return False
        version = source._version
        written = Tensor(result._array)
        written._fw_grad = source._fw_grad  # the source keeps its own tangent (NOTE [Dual levels])
        with no_grad():
            source._rebind(written)
        if not shares_version:
            source._version = version
        self._take_value(result)  # the alias's own history, if the written value has one
        self._array = source._array
        if shares_version:
            self._version = source._version
        return True

    def _take_value(self, result: Tensor) -> None:
        """Hold ``result``'s array and, when it has one, its place in the graph; bump ``_version``."""
        self._array = result._array
        self._version += 1
        if self._fw_grad is not None or result._fw_grad is not None:
            self._take_tangent(result)
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


    def _take_tangent(self, result: Tensor) -> None:
        """The tangent follows the value of an in-place op (NOTE [Dual levels]).

        As in PyTorch, a dual tensor's tangent is updated in place (whoever holds it sees
        the new one), and one given a value without a tangent (``zero_``, ``copy_`` of a
        plain tensor) gets a zero tangent.
        """
        level = LEVEL.current
        old = self._fw_grad[1] if self._fw_grad is not None and self._fw_grad[0] is level else None
        new = result._fw_grad[1] if result._fw_grad is not None and result._fw_grad[0] is level else None
        if old is None or new is old:
            self._fw_grad = result._fw_grad if new is not None else None
            return
        if new is None:
            new = Tensor(jnp.zeros(old.shape, old.dtype))
        if old.grad_fn is None and old._requires_grad and is_grad_enabled():
            self._fw_grad = (level, new)  # a leaf that requires grad cannot be written in place
            return
        old._rebind(new)


def _unpickle_tensor(values: np.ndarray, requires_grad: bool) -> Tensor:
    return Tensor(jnp.asarray(values), requires_grad=requires_grad)


# PyTorch's names for dtypes, used in its error messages.
_TORCH_DTYPE_NAMES = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int64": "Long",
    "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool",
    "complex64": "ComplexFloat", "complex128": "ComplexDouble",
}


def torch_dtype_name(dtype: Any) -> str:
    """PyTorch's name of ``dtype`` (``Float``, ``Long``, …), for messages PyTorch users recognise.

    >>> import jax.numpy as jnp
    >>> torch_dtype_name(jnp.float32), torch_dtype_name(jnp.int64)
    ('Float', 'Long')
    """
    name = jnp.dtype(dtype).name
    return _TORCH_DTYPE_NAMES.get(name, name)


def _dtype_kind_rank(dtype: Any) -> int:
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return 3
    if jnp.issubdtype(dtype, jnp.floating):
        return 2
    if jnp.issubdtype(dtype, jnp.bool_):
        return 0
    return 1


def can_cast(from_dtype: Any, to_dtype: Any) -> bool:
    """PyTorch's ``can_cast`` for in-place results: never complex to real, float to int, or anything to bool.

    >>> import jax.numpy as jnp
    >>> can_cast(jnp.float64, jnp.float32), can_cast(jnp.float32, jnp.int64), can_cast(jnp.int32, jnp.float32)
    (True, False, True)
    """
    return _dtype_kind_rank(from_dtype) <= _dtype_kind_rank(to_dtype)
