"""Dtype rules of ``Tensor``: which dtypes are differentiable, which casts an in-place
result may take, and PyTorch's names for dtypes in messages."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

__all__ = ["ERR_REQUIRES_GRAD_DTYPE", "can_cast", "is_differentiable_dtype", "torch_dtype_name"]

ERR_REQUIRES_GRAD_DTYPE = "Only Tensors of floating point and complex dtype can require gradients, got {dtype}"


def is_differentiable_dtype(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


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
