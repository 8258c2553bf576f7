"""Tensor factories, device names and the default random key.

Default dtypes (the rule, as PyTorch's where JAX's ``jax_enable_x64`` switch allows):

* Python floats, and lists/tuples of them, become ``float32`` (``DEFAULT_FLOAT``), with
  x64 on or off: ``tensor(1.0)``, ``full((2,), 1.5)``, ``arange(0.0, 1.0, 0.5)``,
  ``zeros``, ``ones``, ``eye``, ``rand`` and ``randn`` all agree. Python complex numbers
  become ``complex64``.
* Python ints become JAX's default integer: ``int64`` with x64 on (PyTorch's), ``int32``
  with it off. Python bools become ``bool``.
* NumPy and JAX arrays (and NumPy scalars) keep their dtype: ``tensor(np.float64 array)``
  is ``float64`` with x64 on. With x64 off JAX has no 64-bit types: a ``float64`` or
  ``complex128`` array becomes ``float32``/``complex64`` with a ``UserWarning`` naming
  ``jax_enable_x64`` (integers narrow silently, as in JAX: index arrays are routinely
  ``int64``).
* ``dtype=`` always wins; ``*_like`` factories keep the source's dtype.

>>> import xgrad
>>> xgrad.tensor(1.0).dtype, xgrad.full((2,), 1.5).dtype, xgrad.zeros(2).dtype
(dtype('float32'), dtype('float32'), dtype('float32'))
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.generator import manual_seed, next_key
from xgrad.ops._util import check_nonnegative_shape
from xgrad.tensor import Tensor

__all__ = [
    "DEFAULT_FLOAT", "arange", "eye", "full", "manual_seed", "ones", "ones_like", "rand", "randn", "tensor", "zeros", "zeros_like",
]


def resolve_device(device: Any) -> Any:
    """A ``jax.Device`` (or ``Sharding``) from a device, a sharding, or a name like ``"cpu:1"``/``"cuda"``."""
    if device is None or isinstance(device, (jax.Device, jax.sharding.Sharding)):
        return device
    if isinstance(device, str):
        platform, _, index = device.partition(":")
        platform = {"cuda": "gpu"}.get(platform, platform)
        try:
            devices = jax.devices(platform)
        except RuntimeError as exc:
            raise RuntimeError(f"unknown or unavailable device {device!r}: {exc}") from None
        i = int(index) if index else 0
        if i >= len(devices):
            raise RuntimeError(f"device {device!r} does not exist: there are {len(devices)} {platform} devices")
        return devices[i]
    raise TypeError(f"device must be a jax.Device, a Sharding or a string, got {type(device).__name__}")


def _place(array: Any, device: Any) -> Any:
    target = resolve_device(device)
    return array if target is None else jax.device_put(array, target)


DEFAULT_FLOAT = jnp.dtype(jnp.float32)

ERR_X64_NARROWED = (
    "xgrad.tensor: {src} data became {dst} because jax_enable_x64 is off (JAX has no 64-bit types then). "
    'Turn it on at startup with jax.config.update("jax_enable_x64", True), or pass dtype= to choose.'
)


def _python_dtype(value: Any) -> Any:
    """The dtype a Python float or complex scalar takes by the rule above; None to let JAX infer."""
    if isinstance(value, np.generic):  # np.float64 is a float subclass, but NumPy data keeps its dtype
        return None
    if isinstance(value, float):
        return DEFAULT_FLOAT
    if isinstance(value, complex):
        return jnp.dtype(jnp.complex64)
    return None


def _x64_enabled() -> bool:
    # Read through canonicalisation, so a scoped jax.enable_x64 counts as well as the flag.
    return bool(jax.dtypes.canonicalize_dtype(np.float64) == np.float64)


def _infer_array(data: Any) -> Any:
    """``data`` as a ``jax.Array`` under the default-dtype rule (module docstring)."""
    if isinstance(data, (list, tuple, float, int, complex)) and not isinstance(data, np.generic):
        host = np.asarray(data)
        if host.dtype == np.float64:
            return jnp.asarray(host, dtype=DEFAULT_FLOAT)
        if host.dtype == np.complex128:
            return jnp.asarray(host, dtype=jnp.complex64)
        return jnp.asarray(host)
    if isinstance(data, (np.ndarray, np.generic)) and data.dtype in (np.float64, np.complex128) and not _x64_enabled():
        narrow = jnp.dtype(jnp.float32 if data.dtype == np.float64 else jnp.complex64)
        warnings.warn(ERR_X64_NARROWED.format(src=data.dtype, dst=narrow), UserWarning, stacklevel=3)
        return jnp.asarray(data, dtype=narrow)
    return jnp.asarray(data)


def tensor(data: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A new leaf tensor from a list, scalar, NumPy array, ``jax.Array`` (no copy) or Tensor.

    Args:
        data: the values.
        dtype: a NumPy/JAX dtype; by default Python floats give ``float32`` and arrays
            keep theirs (the rule in this module's docstring).
        device: a ``jax.Device``, a ``Sharding`` or a name such as ``"cpu:1"``.
        requires_grad: whether autograd records ops on it.

    >>> import xgrad
    >>> xgrad.tensor([[1, 2], [3, 4]]).shape
    (2, 2)
    """
    if isinstance(data, Tensor):
        data = data._array
    if isinstance(data, jax.Array) and (dtype is None or data.dtype == dtype):
        array = data
    elif dtype is None:
        array = _infer_array(data)
    else:
        array = jnp.asarray(data, dtype=dtype)
    return Tensor(_place(array, device), requires_grad=requires_grad)


def _shape(shape: tuple[Any, ...]) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return check_nonnegative_shape(shape)


def zeros(*shape: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor of zeros (float32 unless ``dtype`` says otherwise).

    >>> import xgrad
    >>> xgrad.zeros(2, 3).shape, xgrad.zeros(2).tolist()
    ((2, 3), [0.0, 0.0])
    """
    return Tensor(_place(jnp.zeros(_shape(shape), dtype or jnp.float32), device), requires_grad=requires_grad)


def ones(*shape: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor of ones (float32 unless ``dtype`` says otherwise).

    >>> import xgrad
    >>> xgrad.ones(2).tolist(), xgrad.ones((2, 2)).shape
    ([1.0, 1.0], (2, 2))
    """
    return Tensor(_place(jnp.ones(_shape(shape), dtype or jnp.float32), device), requires_grad=requires_grad)


def full(shape: Any, fill_value: Any, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor filled with ``fill_value``.

    >>> import xgrad
    >>> xgrad.full((2,), 1.5).tolist()
    [1.5, 1.5]
    """
    shape = _shape((shape,))
    if dtype is None:
        dtype = _python_dtype(fill_value)
    return Tensor(_place(jnp.full(shape, fill_value, dtype), device), requires_grad=requires_grad)


def arange(start: Any, end: Any = None, step: Any = 1, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """``start, start + step, …`` below ``end`` (``0..start`` when ``end`` is omitted).

    >>> import xgrad
    >>> xgrad.arange(3).tolist(), xgrad.arange(1.0, 2.0, 0.5).tolist()
    ([0, 1, 2], [1.0, 1.5])
    """
    if dtype is None and any(_python_dtype(v) == DEFAULT_FLOAT for v in (start, end, step)):
        dtype = DEFAULT_FLOAT
    if end is None:
        start, end = 0, start
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if (end - start) * step < 0:
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    array = jnp.arange(start, end, step, dtype=dtype)
    return Tensor(_place(array, device), requires_grad=requires_grad)


def eye(n: int, m: int | None = None, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """The ``n × m`` identity matrix.

    >>> import xgrad
    >>> xgrad.eye(2).tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    if n < 0 or m is not None and m < 0:
        raise RuntimeError(f"n and m must be greater or equal to 0, got n={n}, m={m}")
    return Tensor(_place(jnp.eye(n, m, dtype=dtype or jnp.float32), device), requires_grad=requires_grad)


def _check_like(name: str, t: Any) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}(): argument 'input' (position 1) must be Tensor, not {type(t).__name__}")


def zeros_like(t: Tensor, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """Zeros with ``t``'s shape, dtype and placement.

    >>> import xgrad
    >>> xgrad.zeros_like(xgrad.tensor([1.0, 2.0])).tolist()
    [0.0, 0.0]
    """
    _check_like("zeros_like", t)
    return Tensor(jnp.zeros_like(t._array, dtype=dtype), requires_grad=requires_grad)


def ones_like(t: Tensor, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """Ones with ``t``'s shape, dtype and placement.

    >>> import xgrad
    >>> xgrad.ones_like(xgrad.tensor([1.0, 2.0])).tolist()
    [1.0, 1.0]
    """
    _check_like("ones_like", t)
    return Tensor(jnp.ones_like(t._array, dtype=dtype), requires_grad=requires_grad)


def randn(*shape: Any, key: Any = None, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Standard normal samples; ``key`` a ``jax.random`` key (the default key when omitted).

    >>> import xgrad
    >>> import jax
    >>> xgrad.randn(2, 3, key=jax.random.key(0)).shape
    (2, 3)
    """
    key = next_key() if key is None else key
    array = jax.random.normal(key, _shape(shape), dtype or jnp.float32)
    return Tensor(_place(array, device), requires_grad=requires_grad)


def rand(*shape: Any, key: Any = None, dtype: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Uniform samples in ``[0, 1)``; ``key`` a ``jax.random`` key (the default key when omitted).

    >>> import xgrad
    >>> import jax
    >>> x = xgrad.rand(4, key=jax.random.key(0))
    >>> x.shape, all(0.0 <= v < 1.0 for v in x.tolist())
    ((4,), True)
    """
    key = next_key() if key is None else key
    array = jax.random.uniform(key, _shape(shape), dtype or jnp.float32)
    return Tensor(_place(array, device), requires_grad=requires_grad)
