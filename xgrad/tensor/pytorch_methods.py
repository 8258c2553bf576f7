"""``Tensor`` methods PyTorch users reach for that are not ops: memory layout, devices,
dtypes (``type``, ``is_floating_point``), factories of new tensors like this one, and
the in-place random fills beyond ``uniform_``/``normal_``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.tensor import core
from xgrad.tensor.dtypes import DTYPES, torch_dtype_name

__all__ = [
    "LEGACY_TENSOR_TYPES", "bernoulli", "bernoulli_", "contiguous", "cpu", "cuda", "element_size", "exponential_",
    "is_complex", "is_contiguous", "is_cpu", "is_cuda", "is_floating_point", "is_mps", "is_pinned", "is_xpu", "multinomial",
    "new_empty", "new_full", "new_ones", "new_tensor", "new_zeros", "pin_memory", "random_", "t", "tensor_type", "type_as",
]


def contiguous(self: core.Tensor, memory_format: Any = None) -> core.Tensor:
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


def is_contiguous(self: core.Tensor, memory_format: Any = None) -> bool:
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


def element_size(self: core.Tensor) -> int:
    """Bytes per element.

    >>> import xgrad, jax.numpy as jnp
    >>> xgrad.zeros(2, dtype=jnp.float32).element_size()
    4
    """
    return int(self._array.dtype.itemsize)


def type_as(self: core.Tensor, other: core.Tensor) -> core.Tensor:
    """``self`` cast to ``other``'s dtype (differentiable, as ``to``)."""
    return self.to(other.dtype)


def placement_of(array: Any) -> Any:
    """Where a new tensor made like ``array`` goes: ``array``'s sharding, or ``None`` for a traced array.

    A traced array (inside ``xgrad.func``'s transforms, ``xgrad.compile``, ``jax.jit``) has
    no sharding to read; values made beside it are placed as the trace places them.
    """
    return None if isinstance(array, jax.core.Tracer) else array.sharding


def _device_set(self: core.Tensor) -> set[Any]:
    placement = placement_of(self._array)
    return {self.device} if placement is None else set(placement.device_set)


def is_cuda(self: core.Tensor) -> bool:
    """Whether the tensor is on a GPU (PyTorch's property); readable on traced tensors too.

    >>> import xgrad
    >>> xgrad.zeros(2).is_cuda
    False
    """
    return self.device.platform == "gpu"


def is_cpu(self: core.Tensor) -> bool:
    """Whether the tensor is on the CPU (PyTorch's property); readable on traced tensors too.

    >>> import xgrad
    >>> xgrad.zeros(2).is_cpu
    True
    """
    return self.device.platform == "cpu"


def cpu(self: core.Tensor) -> core.Tensor:
    """This tensor on the first CPU device (``self`` when it is on CPU already); differentiable."""
    if all(d.platform == "cpu" for d in _device_set(self)):
        return self
    return self.to(jax.devices("cpu")[0])


def cuda(self: core.Tensor, device: Any = None, non_blocking: bool = False) -> core.Tensor:
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
    if _device_set(self) == {target}:
        return self
    return self.to(target)


def is_mps(self: core.Tensor) -> bool:
    """``False``: JAX drives no Apple MPS device (PyTorch's property)."""
    return False


def is_xpu(self: core.Tensor) -> bool:
    """``False``: JAX drives no Intel XPU device (PyTorch's property)."""
    return False


def pin_memory(self: core.Tensor, device: Any = None) -> core.Tensor:
    """``self``: JAX stages host-to-device copies itself, so there is no page-locked copy to make.

    >>> import xgrad
    >>> x = xgrad.ones(2)
    >>> x.pin_memory() is x, x.is_pinned()
    (True, False)
    """
    return self


def is_pinned(self: core.Tensor, device: Any = None) -> bool:
    """``False``: xgrad makes no page-locked host copies (``pin_memory`` returns the tensor itself)."""
    return False


def _new_placement(self: core.Tensor, shape: tuple[int, ...]) -> Any:
    # This tensor's sharding fits only its own shape; other shapes go to its (first) device.
    placement = placement_of(self._array)
    if placement is None:
        return None
    return placement if tuple(shape) == self._array.shape else self.device


def new_full(self: core.Tensor, size: Any, fill_value: Any, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> core.Tensor:
    """A new tensor of ``size`` filled with ``fill_value``, with this tensor's dtype and device by default.

    >>> import xgrad
    >>> xgrad.tensor([1, 2]).new_full((2, 2), 7).tolist()
    [[7, 7], [7, 7]]
    """
    from xgrad.creation import full

    shape = (size,) if isinstance(size, int) else tuple(size)
    placement = _new_placement(self, shape) if device is None else device
    return full(shape, fill_value, dtype=self.dtype if dtype is None else dtype, device=placement, requires_grad=requires_grad)


def new_zeros(self: core.Tensor, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> core.Tensor:
    """A new tensor of zeros, with this tensor's dtype and device by default.

    >>> import xgrad, jax.numpy as jnp
    >>> xgrad.zeros(1, dtype=jnp.float32).new_zeros(2, 3).dtype
    dtype('float32')
    """
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    return self.new_full(shape, 0, dtype=dtype, device=device, requires_grad=requires_grad)


def new_ones(self: core.Tensor, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> core.Tensor:
    """A new tensor of ones, with this tensor's dtype and device by default.

    >>> import xgrad
    >>> xgrad.tensor([1.0]).new_ones(2).tolist()
    [1.0, 1.0]
    """
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    return self.new_full(shape, 1, dtype=dtype, device=device, requires_grad=requires_grad)


def new_tensor(self: core.Tensor, data: Any, *, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> core.Tensor:
    """A new leaf holding ``data`` (a Tensor's values are taken, not its graph), with this tensor's dtype and device by default.

    >>> import xgrad
    >>> xgrad.tensor([1.0]).new_tensor([2, 3]).tolist()
    [2.0, 3.0]
    """
    from xgrad.creation import tensor

    array = data._array if isinstance(data, core.Tensor) else jnp.asarray(data)
    placement = _new_placement(self, array.shape) if device is None else device
    return tensor(array, dtype=self.dtype if dtype is None else dtype, device=placement, requires_grad=requires_grad)


def new_empty(self: core.Tensor, *size: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> core.Tensor:
    """``new_zeros``: a ``jax.Array`` always holds values, so PyTorch's uninitialised memory is zeros here."""
    return new_zeros(self, *size, dtype=dtype, device=device, requires_grad=requires_grad)


def is_floating_point(self: core.Tensor) -> bool:
    """Whether the dtype is a real floating one (``float16``, ``bfloat16``, ``float32``, ``float64``).

    >>> import xgrad
    >>> xgrad.zeros(1).is_floating_point(), xgrad.arange(2).is_floating_point()
    (True, False)
    """
    return bool(jnp.issubdtype(self.dtype, jnp.floating))


def is_complex(self: core.Tensor) -> bool:
    return bool(jnp.issubdtype(self.dtype, jnp.complexfloating))


#: PyTorch's legacy tensor type names (``"torch.FloatTensor"``) and their dtypes.
LEGACY_TENSOR_TYPES = {
    f"{name}Tensor": DTYPES[dtype] for name, dtype in (
        ("Float", "float32"), ("Double", "float64"), ("Half", "float16"), ("BFloat16", "bfloat16"), ("Long", "int64"),
        ("Int", "int32"), ("Short", "int16"), ("Char", "int8"), ("Byte", "uint8"), ("Bool", "bool"),
    )
}


def tensor_type(self: core.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
    """``type()``: PyTorch's type name (``"torch.FloatTensor"``); ``type(dtype)``: ``self`` cast (differentiable).

    ``dtype`` is a dtype, a legacy type (``xgrad.LongTensor``) or its name (``"torch.DoubleTensor"``).

    >>> import xgrad
    >>> x = xgrad.zeros(2)
    >>> x.type(), x.type("torch.LongTensor").dtype, x.type(xgrad.float16).dtype
    ('torch.FloatTensor', dtype('int64'), dtype('float16'))
    """
    if dtype is None:
        return f"torch.{torch_dtype_name(self.dtype)}Tensor"
    if isinstance(dtype, str) and not dtype.startswith(("torch.", "xgrad.")):
        dtype = np.dtype(dtype)
    elif isinstance(dtype, (str, type)) and not isinstance(dtype, np.dtype):
        name = dtype.rpartition(".")[2] if isinstance(dtype, str) else getattr(dtype, "__name__", "")
        if name not in LEGACY_TENSOR_TYPES:
            raise ValueError(f"invalid type: {dtype!r}")
        dtype = LEGACY_TENSOR_TYPES[name]
    return self.to(dtype)


def _fill(self: core.Tensor, array: Any) -> core.Tensor:
    from xgrad.ops.tensor_methods import _overwrite

    return _overwrite(self, core.Tensor(array))


def bernoulli_(self: core.Tensor, p: Any = 0.5, *, generator: Any = None) -> core.Tensor:
    """Fill with 1 with probability ``p`` (a number or a tensor of them), else 0, in place.

    >>> import xgrad
    >>> xgrad.zeros(3).bernoulli_(1.0).tolist()
    [1.0, 1.0, 1.0]
    """
    from xgrad.generator import generator_key

    probs = jnp.broadcast_to(jnp.asarray(p._array if isinstance(p, core.Tensor) else p), self.shape)
    return _fill(self, jax.random.bernoulli(generator_key(generator), probs).astype(self.dtype))


def random_(self: core.Tensor, from_: int = 0, to: int | None = None, *, generator: Any = None) -> core.Tensor:
    """Fill with integers uniform in ``[from_, to)``; ``random_(to)`` is ``[0, to)``; with no bound,
    ``[0, 2**mantissa]`` for floats and the dtype's range for integers, as PyTorch's.

    >>> import xgrad
    >>> x = xgrad.zeros(50).random_(3, 5)
    >>> sorted(set(x.tolist()))
    [3.0, 4.0]
    """
    from xgrad.generator import generator_key

    if to is None and from_ != 0:
        from_, to = 0, from_
    if to is None:
        if jnp.issubdtype(self.dtype, jnp.floating):
            to = 2 ** (jnp.finfo(self.dtype).nmant + 1) + 1
        elif self.dtype == jnp.bool_:
            to = 2
        else:
            to = int(jnp.iinfo(self.dtype).max) + 1
    if not from_ < to:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={from_} >= to={to}")
    wide = jax.dtypes.canonicalize_dtype(jnp.int64)
    draws = jax.random.randint(generator_key(generator), self.shape, from_, min(to, int(jnp.iinfo(wide).max)), wide)
    return _fill(self, draws.astype(self.dtype))


def exponential_(self: core.Tensor, lambd: float = 1.0, *, generator: Any = None) -> core.Tensor:
    """Fill with draws from the exponential distribution of rate ``lambd``, in place.

    >>> import xgrad
    >>> bool((xgrad.zeros(10).exponential_(2.0) > 0).all())
    True
    """
    from xgrad.generator import generator_key

    if lambd <= 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    return _fill(self, jax.random.exponential(generator_key(generator), self.shape, self.dtype) / lambd)


def bernoulli(self: core.Tensor, p: Any = None, *, generator: Any = None) -> core.Tensor:
    """``xgrad.bernoulli(self, p)``."""
    from xgrad.creation import bernoulli

    return bernoulli(self, p, generator=generator)


def multinomial(self: core.Tensor, num_samples: int, replacement: bool = False, *, generator: Any = None) -> core.Tensor:
    """``xgrad.multinomial(self, num_samples, replacement)``."""
    from xgrad.creation import multinomial

    return multinomial(self, num_samples, replacement, generator=generator)


def t(self: core.Tensor) -> core.Tensor:
    """The transpose of a matrix; a 0-D or 1-D tensor as it is (differentiable, a view), as PyTorch's.

    >>> import xgrad
    >>> xgrad.tensor([[1, 2]]).t().tolist(), xgrad.tensor([1, 2]).t().tolist()
    ([[1], [2]], [1, 2])
    """
    if self.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {self.ndim}D")
    return self.transpose(0, 1) if self.ndim == 2 else self
