"""PyTorch's legacy typed constructors: ``FloatTensor([1, 2])``, ``LongTensor(3)``, ``x.type(DoubleTensor)``.

Each makes an ``xgrad.Tensor`` of its dtype (data, or zeros of a shape); ``isinstance(x,
FloatTensor)`` asks whether ``x`` is a Tensor of that dtype, as PyTorch's does.

>>> import xgrad
>>> x = xgrad.LongTensor([1, 2])
>>> x.dtype, isinstance(x, xgrad.LongTensor), isinstance(x, xgrad.FloatTensor), xgrad.FloatTensor(2, 3).shape
(dtype('int64'), True, False, (2, 3))
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from xgrad.tensor import core
from xgrad.tensor.devices import resolve_device
from xgrad.tensor.pytorch_methods import LEGACY_TENSOR_TYPES

__all__ = [
    "BFloat16Tensor", "BoolTensor", "ByteTensor", "CharTensor", "DoubleTensor", "FloatTensor", "HalfTensor",
    "IntTensor", "LongTensor", "ShortTensor",
]


class _LegacyTypeMeta(type):
    dtype: Any

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, core.Tensor) and obj.dtype == jax.dtypes.canonicalize_dtype(cls.dtype)

    def __call__(cls, *args: Any, device: Any = None) -> Any:  # noqa: N805  (the class being called)
        dtype = jax.dtypes.canonicalize_dtype(cls.dtype)
        if len(args) == 1 and not isinstance(args[0], int):
            data = args[0]
            array = jnp.asarray(data._array if isinstance(data, core.Tensor) else data, dtype)
        elif args:
            array = jnp.zeros(core.legacy_constructor_array(args[0], tuple(args[1:])).shape, dtype)
        else:
            array = jnp.zeros((0,), dtype)
        if device is not None:
            array = jax.device_put(array, resolve_device(device))
        return core.Tensor(array)


def _legacy_type(name: str) -> Any:
    return _LegacyTypeMeta(name, (), {"dtype": LEGACY_TENSOR_TYPES[name].dtype, "__module__": "xgrad"})


FloatTensor = _legacy_type("FloatTensor")
DoubleTensor = _legacy_type("DoubleTensor")
HalfTensor = _legacy_type("HalfTensor")
BFloat16Tensor = _legacy_type("BFloat16Tensor")
LongTensor = _legacy_type("LongTensor")
IntTensor = _legacy_type("IntTensor")
ShortTensor = _legacy_type("ShortTensor")
CharTensor = _legacy_type("CharTensor")
ByteTensor = _legacy_type("ByteTensor")
BoolTensor = _legacy_type("BoolTensor")
