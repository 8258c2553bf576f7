"""``Tensor``: a ``jax.Array`` plus the autograd state PyTorch users expect.

The array is the storage and decides dtype, device and sharding. Autograd state is a
handful of slots: ``grad_fn``/``_output_nr`` for a non-leaf, ``_requires_grad`` and a
weak reference to the ``AccumulateGrad`` for a leaf, the ``.grad``, hooks, and the
in-place ``_version`` counter. The class is written here; the methods of each other
concern live in their own module and are bound in the class body: the JAX boundary
(``jax_boundary``), in-place updates (``inplace``), conversion to values (``conversion``)
and PyTorch's layout, device and factory methods (``pytorch_methods``). Ops and
operators are attached by ``xgrad.ops``.
"""

from __future__ import annotations

import operator
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from xgrad.grad_mode import _state as _grad_state
from xgrad.missing_names import missing_attribute
from xgrad.step_trace import array_of, default_device
from xgrad.step_trace import current as _current_step
from xgrad.tensor import conversion, hook_kinds, inplace, jax_boundary, pytorch_methods
from xgrad.tensor.dtypes import ERR_REQUIRES_GRAD_DTYPE, default_float, is_differentiable_dtype

if TYPE_CHECKING:
    from xgrad.engine.hooks import HookDict, RemovableHandle
    from xgrad.engine.node import AccumulateGrad, Node
    from xgrad.ops.views import ViewInfo
    from xgrad.tensor.jax_boundary import _TensorMeta
    from xgrad.tensor.op_methods import TensorOpMethods  # what xgrad.ops attaches (NOTE [Op names come from OPS])
else:
    TensorOpMethods = object  # the stub's class only: the methods are attached to Tensor itself

__all__ = ["Tensor", "is_tensor"]


def legacy_constructor_array(data: Any, sizes: tuple[int, ...]) -> jax.Array:
    """The array of ``Tensor(data)`` / ``Tensor(*sizes)`` (PyTorch's legacy constructor)."""
    if type(data) is int:
        shape = (data, *sizes)
        if not all(type(n) is int and n >= 0 for n in shape):
            raise TypeError(f"Tensor(): sizes must be non-negative ints, got {shape}")
        return jnp.zeros(shape, default_float())
    if sizes:
        raise TypeError("Tensor(): pass either data (a list) or sizes (ints), and requires_grad= as a keyword")
    return jnp.asarray(data, dtype=default_float())


# The types of ``Tensor(data)``'s data that take PyTorch's legacy constructor (exact types: ``Tensor(True)`` does not).
# A set, not a tuple: ``in`` a tuple compares the array's type with each (0.02 µs of every tensor made).
_LEGACY_DATA = frozenset({list, tuple, int})


def is_tensor(x: Any) -> bool:
    """Whether ``x`` is a Tensor (the ``is_leaf`` of pytree walks that stop at Tensors)."""
    return isinstance(x, Tensor)


ERR_NON_LEAF_REQUIRES_GRAD = (
    "you can only change requires_grad flags of leaf variables. If you want to use a computed "
    "variable in a subgraph that doesn't require differentiation use var_no_grad = var.detach()."
)
ERR_IN_FUNC_TRANSFORM = (
    "You are attempting to call Tensor.{call}{also} inside of a function being transformed by an xgrad.func "
    "transform. This is unsupported: the transform differentiates its inputs itself. Use the xgrad.func transforms "
    "(grad, vjp, jacrev, jacfwd, hessian), or call {call} outside of the function being transformed instead."
)
ERR_ALSO_FUNCTIONAL = " (or perhaps using xgrad.autograd.functional.* APIs)"
WARN_NON_LEAF_GRAD = (
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad "
    "attribute won't be populated during autograd.backward(). If you indeed want the .grad "
    "field to be populated for a non-leaf Tensor, use .retain_grad() on the non-leaf Tensor. "
    "If you access the non-leaf Tensor by mistake, make sure you access the leaf Tensor "
    "instead. See help(xgrad.Tensor.retain_grad) and \"Leaves, non-leaves and .grad\" in xgrad's "
    "docs/migrating_from_pytorch.md."
)


@jax.tree_util.register_pytree_node_class
class Tensor(TensorOpMethods):
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
        "_conj_bit",
        "_cut_site",
        "_fw_grad",
        "_grad",
        "_entered_trace",
        "_grad_accumulator",
        "_inference",
        "_is_grad",
        "_jax_hooks",
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
    _conj_bit: bool  # made by ``conj()`` of a complex tensor (NOTE [The conjugate bit])
    _entered_trace: Any  # the trace a requires-grad tensor entered from outside (NOTE [Tensors that require grad become arrays])
    _is_grad: bool  # a gradient: its pytree node matches its parameter's (NOTE [Tensor as a pytree])
    _jax_hooks: tuple[Any, list[Any]]  # the array before its hooks, and the hooks (NOTE [Hooks on JAX's AD])
    _placeholder_meta: _TensorMeta  # a placeholder's: the node it stands in (NOTE [Tensor as a pytree])

    def __init__(self, array: Any = (), *sizes: int, requires_grad: bool = False) -> None:
        if sizes or type(array) in _LEGACY_DATA:
            # PyTorch's legacy constructor: ``torch.Tensor([1.0, 2.0])`` (data) or ``torch.Tensor(2, 3)``
            # (a shape; zeros here, uninitialised there), in the default float dtype.
            array = legacy_constructor_array(array, sizes)
        self._fill(array)
        if requires_grad:
            self.requires_grad_(True)

    def _fill(self, array: Any) -> Tensor:
        """Set every field of a new tensor holding ``array``, and return it.

        # NOTE [Op outputs made without the type's call]
        # ``Tensor(array)`` reaches ``__init__`` through the type's call, and ``__init__``
        # takes ``*sizes`` (PyTorch's legacy constructor): CPython makes that call through C,
        # without its fast path for Python functions. ``bind`` makes every op output as
        # ``Tensor._fill(object.__new__(Tensor), array)``, the same fields set by the same
        # code: 0.10-0.15 µs less per recorded op (NOTE [Recording cost] in xgrad/ops/registry.py).
        """
        self._array = array
        # (the source, whether the version is shared, the (source's, alias's) arrays when made or last written)
        self._alias_of: tuple[Callable[[], Tensor | None], bool, tuple[Any, Any]] | None = None
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
        self._fw_grad: tuple[Any, Tensor] | None = None  # NOTE [Dual levels] in xgrad/dual.py
        # Where a plain JAX transformation made this output (NOTE [Outputs of JAX transformations]).
        # Set, not left unset with the slots below: every recorded op reads it from its
        # inputs that need no grad (as an attribute: every tensor has it), where an unset
        # slot read with a default costs 1-2 µs (the slot's AttributeError, then
        # ``__getattr__``'s), a fifth of a recording.
        self._cut_site: str | None = None
        trace = _current_step()
        if trace is not None:  # made inside a traced step: none of its state (NOTE [The step-trace seam])
            trace.made(self)
        return self

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

    # -- pytree (NOTE [Tensor as a pytree] in jax_boundary.py) --------------------------
    tree_flatten = jax_boundary.tree_flatten

    @classmethod
    def tree_unflatten(cls, meta: _TensorMeta, children: tuple[Any]) -> Any:
        return jax_boundary.tree_unflatten(meta, children)

    # -- array attributes ------------------------------------------------------------
    @property
    def array(self) -> jax.Array:
        """The underlying ``jax.Array`` (no copy)."""
        return array_of(self)

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

    if TYPE_CHECKING:

        @property
        def shape(self) -> tuple[int, ...]: ...

        @property
        def ndim(self) -> int: ...

        @property
        def dtype(self) -> Any: ...

    else:
        # The array's, read by a C getter: a Python property's call costs as much as the read,
        # and ops read shapes on every call (``linear``'s checks, NOTE [Recording cost]).
        shape = property(operator.attrgetter("_array.shape"))
        ndim = property(operator.attrgetter("_array.ndim"))
        dtype = property(operator.attrgetter("_array.dtype"))

    @property
    def device(self) -> jax.Device:
        """The ``jax.Device`` holding the array (for a sharded array, the first one this process holds).

        A traced array (``xgrad.compile``, ``jax.jit``) is placed by XLA: its device is the
        one the step's inputs are on, or JAX's default device.
        """
        array = self._array
        if isinstance(array, jax.core.Tracer):
            trace = _current_step()
            return default_device() if trace is None else trace.device()
        sharding = array.sharding
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
        if getattr(self, "_placeholder_meta", None) is not None:
            raise TypeError(jax_boundary.ERR_PLACEHOLDER_LEN)
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
        if requires_grad and _grad_state.transform is not None and isinstance(self._array, jax.core.Tracer):
            raise RuntimeError(ERR_IN_FUNC_TRANSFORM.format(call="requires_grad_()", also=ERR_ALSO_FUNCTIONAL))
        trace = _current_step()
        if trace is not None:
            trace.write(self)
        self._requires_grad = bool(requires_grad)
        return self

    @property
    def grad(self) -> Tensor | None:
        """The gradient backward accumulated here (leaves, and non-leaves that retain grad).

        Reading it on a non-leaf that does not retain grad, before anything set it,
        warns as PyTorch does: backward never fills it.
        """
        trace = _current_step()
        if trace is not None:
            trace.grad_read(self)
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
        trace = _current_step()
        if trace is not None:
            trace.grad_write(self)
        self._grad = value

    @grad.deleter
    def grad(self) -> None:
        trace = _current_step()
        if trace is not None:
            trace.grad_write(self)
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
        # A traced array has no sharding to read (``zero_grad(set_to_none=False)`` in a compiled step).
        traced = isinstance(theirs, jax.core.Tracer) or isinstance(mine, jax.core.Tracer)
        if not traced and theirs.sharding.device_set != mine.sharding.device_set:
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
    __jax_array__ = jax_boundary.JaxArrayProtocol()
    __array__ = conversion.to_numpy_array
    numpy = conversion.numpy
    item = conversion.item
    tolist = conversion.tolist
    __float__ = conversion.to_float
    __int__ = conversion.to_int
    __index__ = conversion.to_index
    __bool__ = conversion.to_bool
    __repr__ = conversion.tensor_repr
    __format__ = conversion.tensor_format

    def detach(self) -> Tensor:
        """A new leaf sharing the array, outside the graph (NOTE [Detached aliases]).

        >>> import xgrad
        >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
        >>> d = x.detach()
        >>> d.requires_grad, d.zero_() is d, x.tolist(), x._version
        (False, True, [0.0, 0.0], 1)
        """
        return self._detached_alias(shares_version=True)

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
    __deepcopy__ = conversion.deepcopy
    __reduce_ex__ = conversion.reduce_ex

    def is_inference(self) -> bool:
        """Whether this is an inference tensor: made inside ``xgrad.inference_mode()`` (NOTE [Inference tensors]).

        >>> import xgrad
        >>> with xgrad.inference_mode():
        ...     t = xgrad.ones(2)
        >>> t.is_inference(), xgrad.ones(2).is_inference()
        (True, False)
        """
        return self._inference

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
        from xgrad.engine.hooks import HookDict, RemovableHandle, add_hook
        from xgrad.engine.node import _check_arity

        on_jax = isinstance(self._array, jax.core.Tracer) and _current_step() is None
        # On JAX's tracers any floating tensor may be differentiated (by ``jax.grad`` or
        # ``xgrad.func``), whatever xgrad's own flag says (NOTE [Hooks on JAX's AD]).
        if not self.requires_grad and not (on_jax and is_differentiable_dtype(self._array.dtype)):
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        _check_arity(hook, 1, "Tensor.register_hook expects hook(grad)")
        if on_jax:
            base, hooks = getattr(self, "_jax_hooks", (self._array, []))
            hooks.append(hook)
            self._jax_hooks = (base, hooks)
            self._array = jax_boundary.hook_on_jax(base, tuple(hooks))
            if not self.requires_grad:
                return RemovableHandle(HookDict(hook_kinds.TENSOR))  # JAX's AD alone sees this tensor's gradient
        if self.grad_fn is not None:
            return self.grad_fn.add_tensor_pre_hook(self._output_nr, hook)
        if self._backward_hooks is None:
            self._backward_hooks = HookDict(hook_kinds.TENSOR)
        return add_hook(self._backward_hooks, (0, hook), self)

    def retain_grad(self) -> None:
        """Make a non-leaf keep its ``.grad`` after backward (a no-op on leaves).

        >>> import xgrad
        >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
        >>> y = x * 3; y.retain_grad()
        >>> y.sum().backward(); y.grad.tolist()
        [1.0, 1.0]
        """
        if _grad_state.transform is not None and isinstance(self._array, jax.core.Tracer):
            raise RuntimeError(ERR_IN_FUNC_TRANSFORM.format(call="retain_grad()", also=""))
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
            trace = _current_step()
            if trace is not None:
                trace.grad_write(tensor)
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
            self._post_accumulate_grad_hooks = HookDict(hook_kinds.POST_ACCUMULATE)
        return add_hook(self._post_accumulate_grad_hooks, hook, self)

    if not TYPE_CHECKING:  # for type checkers a missing attribute stays an error, not ``Any``

        def __getattr__(self, name: str) -> Any:  # reached only for an attribute Tensor does not have
            if name[:1] == "_":  # an unset slot read with a default (``_conj_bit``, ...): no PyTorch name
                raise AttributeError(name)
            raise missing_attribute("torch.Tensor", "'Tensor' object", name, self)

    # -- PyTorch conveniences: layout, devices, factories ------------------------------
    contiguous = pytorch_methods.contiguous
    is_contiguous = pytorch_methods.is_contiguous
    element_size = pytorch_methods.element_size
    type_as = pytorch_methods.type_as
    cpu = pytorch_methods.cpu
    is_cpu = property(pytorch_methods.is_cpu)
    is_cuda = property(pytorch_methods.is_cuda)
    cuda = pytorch_methods.cuda
    is_mps = property(pytorch_methods.is_mps)
    is_xpu = property(pytorch_methods.is_xpu)
    pin_memory = pytorch_methods.pin_memory
    is_pinned = pytorch_methods.is_pinned
    new_full = pytorch_methods.new_full
    new_zeros = pytorch_methods.new_zeros
    new_ones = pytorch_methods.new_ones
    new_tensor = pytorch_methods.new_tensor
    new_empty = pytorch_methods.new_empty
    is_floating_point = pytorch_methods.is_floating_point
    is_complex = pytorch_methods.is_complex
    type = pytorch_methods.tensor_type
    bernoulli_ = pytorch_methods.bernoulli_
    random_ = pytorch_methods.random_
    exponential_ = pytorch_methods.exponential_
    bernoulli = pytorch_methods.bernoulli
    multinomial = pytorch_methods.multinomial
    t = pytorch_methods.t

    # -- in-place plumbing -----------------------------------------------------------
    _check_inplace = inplace.check_inplace
    _alias = inplace.alias
    _rebind = inplace.rebind
    _write_to_source = inplace.write_to_source
    _take_value = inplace.take_value
    _take_tangent = inplace.take_tangent
    _detached_alias = inplace.detached_alias
