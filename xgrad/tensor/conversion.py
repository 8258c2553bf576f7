"""A ``Tensor``'s values leaving it: NumPy, Python scalars and lists, ``repr``, copies and pickles."""

from __future__ import annotations

import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad import step_trace
from xgrad.dual import LEVEL
from xgrad.jax_internals import concrete_value
from xgrad.step_trace import array_of
from xgrad.tensor import core

__all__ = [
    "deepcopy", "item", "numpy", "reduce_ex", "repr_extras", "tensor_format", "tensor_repr", "tensor_repr_text",
    "to_bool", "to_float", "to_index", "to_int", "to_numpy_array", "tolist",
]

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


def _index_str(index: tuple[slice, ...]) -> str:
    """``[0:2, :]``: where a shard sits in the whole array."""
    return "[" + ", ".join(f"{'' if s.start is None else s.start}:{'' if s.stop is None else s.stop}" for s in index) + "]"


def _check_addressable(self: core.Tensor, what: str) -> None:
    if _spans_other_processes(self._array):
        raise RuntimeError(ERR_NOT_ADDRESSABLE.format(what=what, shape=self.shape, sharding=self._array.sharding))


def to_numpy_array(self: core.Tensor, dtype: Any = None, copy: Any = None) -> np.ndarray:
    _check_addressable(self, "np.asarray(tensor)")
    out = np.asarray(self._array)
    return out.astype(dtype) if dtype is not None else out


def numpy(self: core.Tensor) -> np.ndarray:
    """The values as a NumPy array; raises for a tensor that requires grad, as PyTorch does.

    >>> import xgrad
    >>> xgrad.tensor([1.0, 2.0], requires_grad=True).detach().numpy()
    array([1., 2.], dtype=float32)
    """
    if self.requires_grad:
        raise RuntimeError(ERR_NUMPY_REQUIRES_GRAD)
    _check_addressable(self, "Tensor.numpy()")
    return np.asarray(self._array)


ERR_VALUE_UNDER_VMAP = (
    "vmap: It looks like you're calling {what} on a Tensor. We don't support vmap over calling {what} on a "
    "Tensor, please try to rewrite what you're doing with other operations."
)


# NOTE [Values under transforms]
# As under ``torch.func``'s ``grad``/``jvp``, a Tensor inside ``xgrad.func.grad``,
# ``jvp`` or ``jax.grad`` of concrete arrays has values: ``item()``, ``tolist()``,
# ``float()`` read the primal under JAX's tracers (they are not differentiable, as in
# PyTorch). Under ``vmap`` one lane has no value of its own: PyTorch's error. Under a
# trace without values (``jax.jit``, ``xgrad.compile``) JAX's tracer error stands:
# callers that fall back to eager catch it.
def _values(self: core.Tensor, what: str) -> Any:
    """The array whose values ``what`` reads: ``self``'s, or the primal under differentiation tracers."""
    _check_addressable(self, what)
    array = self._array
    if not isinstance(array, jax.core.Tracer):
        return array
    primal = concrete_value(array, through_vmap=False)
    if primal is not None:
        return primal
    if concrete_value(array) is not None:
        raise RuntimeError(ERR_VALUE_UNDER_VMAP.format(what=what.removeprefix("Tensor")))
    return array


def item(self: core.Tensor) -> Any:
    trace = step_trace.current()
    if trace is not None:
        printed = trace.printed_item(self, sys._getframe(1))
        if printed is not None:
            return printed
    array = _values(self, "Tensor.item()")
    size = array.size
    if size != 1:
        raise RuntimeError(f"a Tensor with {size} elements cannot be converted to Scalar")
    return array.item()


def tolist(self: core.Tensor) -> Any:
    return np.asarray(_values(self, "Tensor.tolist()")).tolist()


def to_float(self: core.Tensor) -> float:
    array = _values(self, "float(tensor)")
    _check_one_element(self)
    return float(array)


def to_int(self: core.Tensor) -> int:
    array = _values(self, "int(tensor)")
    _check_one_element(self)
    return int(array)


def _check_one_element(self: core.Tensor) -> None:
    if self._array.size != 1:
        raise ValueError("only one element tensors can be converted to Python scalars")


def to_index(self: core.Tensor) -> int:
    return int(self._array.__index__())


def to_bool(self: core.Tensor) -> bool:
    array = _values(self, "bool(tensor)")
    size = array.size
    if size != 1:
        raise RuntimeError(f"Boolean value of Tensor with {'no values' if size == 0 else 'more than one value'} is ambiguous")
    return bool(array)


def deepcopy(self: core.Tensor, memo: dict[int, Any]) -> core.Tensor:
    """A new leaf with the same (immutable) array, ``requires_grad`` and a copy of ``.grad``, as PyTorch's.

    A non-leaf raises PyTorch's error: its graph cannot be copied.
    """
    if self.grad_fn is not None:
        raise RuntimeError(ERR_DEEPCOPY_NON_LEAF)
    new = core.Tensor(array_of(self))
    memo[id(self)] = new
    new._requires_grad = self._requires_grad
    new._inference = self._inference
    if self._grad is not None:
        new._grad = core.Tensor(array_of(self._grad))
    return new


def reduce_ex(self: core.Tensor, protocol: Any) -> tuple[Any, ...]:
    """Pickle the values and ``requires_grad`` (not ``.grad`` nor the graph), as PyTorch does.

    >>> import pickle, xgrad
    >>> t = pickle.loads(pickle.dumps(xgrad.tensor([1.0, 2.0], requires_grad=True)))
    >>> t.tolist(), t.requires_grad, t.is_leaf
    ([1.0, 2.0], True, True)
    """
    _check_addressable(self, "pickle")
    return (_unpickle_tensor, (np.asarray(self._array), self.requires_grad))


def tensor_format(self: core.Tensor, format_spec: str) -> str:
    """A 0-dim tensor formats as its Python number (``f"{loss:.4f}"``), as in PyTorch; others as objects.

    >>> import xgrad
    >>> f"{xgrad.tensor(2.5):+.2f}"
    '+2.50'
    """
    trace = step_trace.current()
    if trace is not None and (self.ndim == 0 or not format_spec):
        # ``None``: formatted as its repr (``object.__format__`` with an empty spec is ``str``).
        text = trace.printed_text(self, format_spec if self.ndim == 0 else None, sys._getframe(1))
        if text is not None:
            return text
    if self.ndim == 0:
        return format(self.item(), format_spec)
    return object.__format__(self, format_spec)


def repr_extras(self: core.Tensor, dtype: bool = True) -> list[str]:
    """What a tensor's ``repr`` shows after its values: a dtype other than the defaults (with ``dtype``), its history
    or ``requires_grad``."""
    extras = []
    if dtype and self._array.dtype not in (jnp.float32, jnp.int32, jnp.bool_):
        extras.append(f"dtype={self._array.dtype}")
    if self.grad_fn is not None:
        extras.append(f"grad_fn=<{self.grad_fn.name()}>")
    elif self._requires_grad:
        extras.append("requires_grad=True")
    fw = self._fw_grad
    if fw is not None and fw[0] is LEVEL.current:
        extras.append(f"tangent={fw[1]!r}")
    return extras


def tensor_repr_text(values: np.ndarray, extras: list[str]) -> str:
    """``repr`` of a tensor holding ``values``, ``extras`` (``repr_extras``) after them."""
    body = np.array2string(values, separator=", ", prefix="tensor(")
    return "tensor(" + ", ".join([body, *extras]) + ")"


def tensor_repr(self: core.Tensor) -> str:
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
        return "tensor(" + ", ".join([body, *repr_extras(self, dtype=False)]) + ")"
    trace = step_trace.current()
    if trace is not None:
        text = trace.printed_text(self, None, sys._getframe(1))
        if text is not None:
            return text
    return tensor_repr_text(np.asarray(self._array), repr_extras(self))


def _unpickle_tensor(values: np.ndarray, requires_grad: bool) -> core.Tensor:
    return core.Tensor(jnp.asarray(values), requires_grad=requires_grad)


# Pickles name it ``xgrad.tensor._unpickle_tensor`` (re-exported there), a name that stays
# when the package's modules change.
_unpickle_tensor.__module__ = "xgrad.tensor"
