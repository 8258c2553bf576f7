"""Contractions: ``matmul`` (rules in xgrad ops), ``einsum`` and ``conv2d`` (rules from jax.vjp)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.ops.jaxop import vjp_of
from xgrad.ops.registry import defprim
from xgrad.tensor import Tensor


def _matmul_x_grad(g: Tensor, out: Any, x: Any, y: Tensor) -> Tensor:
    if y.ndim == 1:  # (..., k) @ (k,) -> (...): g (...,) outer y
        return g.unsqueeze(-1) * y
    if x.ndim == 1:  # (k,) @ (..., k, n) -> (..., n)
        return (g.unsqueeze(-2) @ y.mT).sum_to((1, x.shape[0])).reshape(x.shape)
    return g @ y.mT


def _matmul_y_grad(g: Tensor, out: Any, x: Tensor, y: Any) -> Tensor:
    if x.ndim == 1:  # (k,) @ (..., k, n): x outer g
        if y.ndim == 1:
            return g * x
        return x.unsqueeze(-1) * g.unsqueeze(-2)
    if y.ndim == 1:  # (..., m, k) @ (k,) -> (..., m)
        return (x.mT @ g.unsqueeze(-1)).sum_to((y.shape[0], 1)).reshape(y.shape)
    if y.ndim == 2 and x.ndim > 2:
        # A batch against one matrix (x @ W): one GEMM over the flattened batch, rather
        # than a batched product summed down afterwards.
        return x.reshape(-1, x.shape[-1]).mT @ g.reshape(-1, g.shape[-1])
    return x.mT @ g


matmul = defprim("matmul", jnp.matmul, (_matmul_x_grad, _matmul_y_grad), doc="""Matrix product with NumPy's batching and 1-D rules.

    >>> import xgrad
    >>> a = xgrad.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> xgrad.matmul(a, xgrad.tensor([[1.0], [1.0]])).tolist()
    [[3.0], [7.0]]
    """)


def _einsum_impl(*operands: Any, subscripts: str) -> Any:
    return jnp.einsum(subscripts, *operands)


def _einsum_grad(g: Tensor, out: Any, *operands: Any, subscripts: str) -> Any:
    grads = vjp_of("einsum", _einsum_impl, subscripts=subscripts)(g, *operands)
    return grads if isinstance(grads, tuple) else (grads,)


_einsum = defprim("einsum", _einsum_impl, joint_vjp=_einsum_grad)


def einsum(subscripts: str, *operands: Tensor) -> Tensor:
    """Einstein summation, as ``jnp.einsum(subscripts, *operands)``.

    >>> import xgrad
    >>> a = xgrad.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> xgrad.einsum("ij,j->i", a, xgrad.tensor([1.0, 1.0])).tolist()
    [3.0, 7.0]
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return _einsum(*operands, subscripts=subscripts)


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _conv2d_impl(x: Any, w: Any, stride: tuple[int, int], padding: Any, dilation: tuple[int, int], groups: int) -> Any:
    return jax.lax.conv_general_dilated(
        x, w, window_strides=stride, padding=padding, rhs_dilation=dilation,
        dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=groups,
    )


def _conv2d_grad(g: Tensor, out: Any, x: Tensor, w: Tensor, **params: Any) -> Any:
    return vjp_of("conv2d", _conv2d_impl, **params)(g, x, w)


_conv2d = defprim("conv2d", _conv2d_impl, joint_vjp=_conv2d_grad)


def conv2d(
    input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1
) -> Tensor:
    """``F.conv2d`` on NCHW input and OIHW weight; ``padding`` an int, pair, ``"same"`` or ``"valid"``.

    >>> import xgrad
    >>> x = xgrad.ones(1, 1, 3, 3)
    >>> w = xgrad.ones(1, 1, 2, 2)
    >>> out = xgrad.conv2d(x, w)
    >>> out.shape, out.tolist()[0][0][0]
    ((1, 1, 2, 2), [4.0, 4.0])
    """
    if isinstance(padding, str):
        pad: Any = padding.upper()
    else:
        ph, pw = _pair(padding)
        pad = ((ph, ph), (pw, pw))
    out = _conv2d(input, weight, stride=_pair(stride), padding=pad, dilation=_pair(dilation), groups=groups)
    if bias is not None:
        out = out + bias.reshape((1, -1, 1, 1))
    return out
