"""The op table's row type, and the ``Tensor`` methods that are not ops themselves.

# NOTE [Op names come from OPS]
# ``xgrad.ops.OPS`` lists every op once, with the ``Tensor`` methods and operators that
# call it. Everything else that names ops comes from it: the methods installed on
# ``Tensor`` (``install``), ``DIFFERENTIABLE_OPS`` (what the registry-driven tests cover),
# and, written out by ``python -m xgrad.ops.gen_tensor_stub`` because type checkers read
# only literals, ``xgrad.ops.__all__`` and the stub ``xgrad/tensor/op_methods.pyi`` that
# declares each method with its op's signature (``tests/test_tensor_stub.py`` checks
# both are fresh).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.engine.node import sharding_of
from xgrad.generator import generator_key
from xgrad.grad_mode import is_grad_enabled
from xgrad.ops.elementwise import astype, to_device, where
from xgrad.ops.shape import broadcast_to
from xgrad.tensor import Tensor
from xgrad.tensor.devices import resolve_device
from xgrad.tensor.dtypes import resolve_dtype

__all__ = ["Op", "differentiable_names", "exported_names", "install", "methods"]

@dataclass(frozen=True)
class Op:
    """One row of the op table (NOTE [Op names come from OPS]).

    Attributes:
        fn: the op; its ``__name__`` is its name in ``xgrad.ops`` and ``xgrad``.
        methods: space-separated names of the methods and operators that are ``fn(self, ...)``.
        reflected: reflected operators, ``fn(other, self)``.
        inplace: in-place methods: ``self`` takes the value (and history) of ``fn(self, ...)``.
        properties: read-only properties ``fn(self)``.
        differentiable: the registry-driven tests compare its gradients (``DIFFERENTIABLE_OPS``).
        exported: an ``xgrad.ops`` (and ``xgrad``) function; ``False`` for a method only.
        name: its name in ``xgrad.ops``, where that is not ``fn.__name__`` (an alias).
    """

    fn: Callable[..., Any]
    methods: str = ""
    reflected: str = ""
    inplace: str = ""
    properties: str = ""
    differentiable: bool = True
    exported: bool = True
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.fn.__name__)  # frozen: set once, here


def exported_names(table: tuple[Op, ...]) -> list[str]:
    return [op.name for op in table if op.exported]


def differentiable_names(table: tuple[Op, ...]) -> tuple[str, ...]:
    return tuple(op.name for op in table if op.exported and op.differentiable)


def methods(table: tuple[Op, ...]) -> Iterator[tuple[str, str, Op]]:
    """``(method name, kind, row)`` for every method of the table; ``kind`` is a field of ``Op``."""
    for op in table:
        for kind in ("methods", "reflected", "inplace", "properties"):
            for name in getattr(op, kind).split():
                yield name, kind, op


def _reflected(fn: Callable[..., Any]) -> Callable[[Tensor, Any], Any]:
    """The reflected operator: ``other <op> self``."""
    return lambda self, other: fn(other, self)


def _inplace(fn: Callable[..., Any]) -> Callable[..., Tensor]:
    def method(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        self._check_inplace()
        return self._rebind(fn(self._alias(), *args, **kwargs))

    method.__name__ = fn.__name__ + "_"
    method.__doc__ = f"In-place ``{fn.__name__}``: rebinds the storage and bumps ``_version``."
    return method


def _deferring(fn: Callable[..., Any], defer_to: tuple[type, ...]) -> Callable[..., Any]:
    """A binary operator that leaves ``defer_to``'s operands to their own (reflected) operators."""
    @functools.wraps(fn)  # ``__wrapped__``: the table's function
    def operator(self: Tensor, other: Any) -> Any:
        if isinstance(other, defer_to):
            return NotImplemented
        return fn(self, other)

    return operator


def install(table: tuple[Op, ...], defer_to: tuple[type, ...] = ()) -> None:
    """Attach the table's methods, operators and properties to ``Tensor``; its arithmetic operators
    return ``NotImplemented`` for a ``defer_to`` operand (a sparse tensor), which then answers."""
    for op in table:
        attached: dict[str, Any] = dict.fromkeys(op.methods.split(), op.fn)
        if op.reflected:
            attached.update(dict.fromkeys(op.reflected.split(), _reflected(op.fn)))
        for name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__matmul__", "__rmatmul__"):
            if defer_to and name in attached:
                attached[name] = _deferring(attached[name], defer_to)
        if op.inplace:
            # In place, the op without autocast's casts: PyTorch's lists hold out-of-place ops only.
            attached.update(dict.fromkeys(op.inplace.split(), _inplace(getattr(op.fn, "__wrapped__", op.fn))))
        attached.update(dict.fromkeys(op.properties.split(), property(op.fn)))
        for name, value in attached.items():
            setattr(Tensor, name, value)


# -- methods that are not ops --------------------------------------------------------
def to(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """``.to(device)``, ``.to(dtype)``, ``.to(device, dtype)``, ``.to(other)`` or keywords; each is differentiable."""
    target = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    for ignored in ("non_blocking", "copy", "memory_format"):  # no meaning for immutable jax.Arrays
        kwargs.pop(ignored, None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, Tensor):  # .to(other): other's dtype and device
            dtype, target = a.dtype, (sharding_of(a._array) if a.shape == self.shape else None) or a.device
        elif isinstance(a, str) or hasattr(a, "platform") or hasattr(a, "device_set"):
            target = a
        elif a is not None and not isinstance(a, bool):  # non_blocking/copy given positionally
            dtype = a
    out = self
    dtype = resolve_dtype(dtype, "Tensor.to")
    if dtype is not None and jnp.dtype(dtype) != self.dtype:
        out = astype(out, dtype=jnp.dtype(dtype))
    if target is not None:
        resolved = resolve_device(target)
        current = sharding_of(self._array)
        # A traced array (``current is None``) is where the step's inputs are (``Tensor.device``).
        if (resolved != self.device) if current is None else (resolved not in current.device_set and resolved != current):
            out = to_device(out, resolved)
    return out


def to_dtype(self: Tensor, dtype: Any) -> Tensor:
    """``self`` cast to ``dtype`` (differentiable); ``self`` itself when it has that dtype already."""
    return astype(self, dtype=jnp.dtype(dtype)) if jnp.dtype(dtype) != self.dtype else self


def to_float32(self: Tensor) -> Tensor:
    return to(self, jnp.float32)


def to_float64(self: Tensor) -> Tensor:
    return to(self, jnp.float64)


def to_float16(self: Tensor) -> Tensor:
    return to(self, jnp.float16)


def to_bfloat16(self: Tensor) -> Tensor:
    return to(self, jnp.bfloat16)


def to_int64(self: Tensor) -> Tensor:
    """int64 where x64 allows it, else int32 without a warning (indices work either way)."""
    return to(self, jax.dtypes.canonicalize_dtype(jnp.int64))


def to_int32(self: Tensor) -> Tensor:
    return to(self, jnp.int32)


def to_bool(self: Tensor) -> Tensor:
    return to(self, jnp.bool_)


def _overwrite(self: Tensor, value: Tensor) -> Tensor:
    """Replace every element of ``self`` by ``value`` (broadcast), in place.

    The old value gets a zero gradient, ``value`` the incoming one: recorded as a
    ``where`` that never picks the old value, so a non-leaf's history is cut exactly
    there even when ``value`` is a constant (as PyTorch's ``zero_``/``copy_`` do).
    """
    self._check_inplace()
    if not (is_grad_enabled() and (self.requires_grad or value.requires_grad)):
        return self._rebind(broadcast_to(value.to(self.dtype), self.shape))
    return self._rebind(where(jnp.zeros(self.shape, bool), self._alias(), value.to(self.dtype)))


def zero_(self: Tensor) -> Tensor:
    return _overwrite(self, Tensor(jnp.zeros((), self.dtype)))


def fill_(self: Tensor, value: Any) -> Tensor:
    return _overwrite(self, value if isinstance(value, Tensor) else Tensor(jnp.asarray(value, self.dtype)))


def copy_(self: Tensor, src: Any) -> Tensor:
    return _overwrite(self, src if isinstance(src, Tensor) else Tensor(jnp.asarray(src)))


def uniform_(self: Tensor, from_: float = 0.0, to: float = 1.0, *, generator: Any = None) -> Tensor:
    """Fill with draws from ``U(from_, to)`` in place (``generator``: see ``generator_key``)."""
    return _overwrite(self, Tensor(jax.random.uniform(generator_key(generator), self.shape, self.dtype, from_, to)))


def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0, *, generator: Any = None) -> Tensor:
    """Fill with draws from ``N(mean, std^2)`` in place (``generator``: see ``generator_key``)."""
    return _overwrite(self, Tensor(mean + std * jax.random.normal(generator_key(generator), self.shape, self.dtype)))
