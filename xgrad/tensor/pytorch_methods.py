"""``Tensor`` methods PyTorch users reach for that are not ops: memory layout, devices,
and factories of new tensors like this one."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from xgrad.tensor import core

__all__ = [
    "contiguous", "cpu", "cuda", "element_size", "is_contiguous", "new_full", "new_ones", "new_tensor",
    "new_zeros", "type_as",
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


def cpu(self: core.Tensor) -> core.Tensor:
    """This tensor on the first CPU device (``self`` when it is on CPU already); differentiable."""
    if all(d.platform == "cpu" for d in self._array.sharding.device_set):
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
    if self._array.sharding.device_set == {target}:
        return self
    return self.to(target)


def _new_placement(self: core.Tensor, shape: tuple[int, ...]) -> Any:
    # This tensor's sharding fits only its own shape; other shapes go to its (first) device.
    return self._array.sharding if tuple(shape) == self._array.shape else self.device


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
