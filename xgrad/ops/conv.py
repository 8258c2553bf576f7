"""Volumetric and transposed convolutions: ``conv3d`` and ``conv_transpose1d/2d/3d``.

Both are primitives whose rules are ``jax.vjp`` of their forward (``vjp_of``), as
``conv2d``'s. A transposed convolution is the input gradient of a convolution; its
forward is written as one: the weight's ``(in, out / groups, *kernel)`` layout (PyTorch's)
regrouped to ``(out, in / groups, *kernel)`` and flipped, the input dilated by the stride,
and padded by ``dilation * (kernel - 1) - padding`` (plus ``output_padding`` after).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.ops.autocast import autocast_op
from xgrad.ops.jaxop import vjp_of
from xgrad.ops.linalg import _sizes
from xgrad.ops.registry import defprim
from xgrad.ops.shape_rules import _dtype, _kinds_differ, _shape
from xgrad.tensor import Tensor, torch_dtype_name

_LAYOUTS = {1: ("NCH", "OIH", "NCH"), 2: ("NCHW", "OIHW", "NCHW"), 3: ("NCDHW", "OIDHW", "NCDHW")}


def _conv_impl(x: Any, w: Any, stride: tuple[int, ...], padding: Any, dilation: tuple[int, ...], groups: int) -> Any:
    return jax.lax.conv_general_dilated(x, w, window_strides=stride, padding=padding, rhs_dilation=dilation,
                                        dimension_numbers=_LAYOUTS[x.ndim - 2], feature_group_count=groups)


def _transpose_impl(x: Any, w: Any, stride: tuple[int, ...], padding: tuple[int, ...], output_padding: tuple[int, ...],
                    dilation: tuple[int, ...], groups: int) -> Any:
    n = x.ndim - 2
    cin, cout_g, *kernel = w.shape
    regrouped = w.reshape(groups, cin // groups, cout_g, *kernel).swapaxes(1, 2).reshape(groups * cout_g, cin // groups, *kernel)
    flipped = jnp.flip(regrouped, axis=tuple(range(2, 2 + n)))
    pads = [(d * (k - 1) - p, d * (k - 1) - p + op) for k, p, op, d in zip(kernel, padding, output_padding, dilation, strict=True)]
    return jax.lax.conv_general_dilated(x, flipped, window_strides=(1,) * n, padding=pads, lhs_dilation=stride,
                                        rhs_dilation=dilation, dimension_numbers=_LAYOUTS[n], feature_group_count=groups)


def _check_conv(name: str, x: Any, w: Any, stride: Sequence[int], dilation: Sequence[int], groups: int) -> tuple[Any, Any]:
    """The checks every convolution shares (PyTorch's ``check_shape_forward``): ranks, dtypes, groups, stride, dilation."""
    xs, ws = _shape(x), _shape(w)
    n = len(stride)
    if len(xs) != n + 2:
        raise RuntimeError(f"Expected {n + 1}D (unbatched) or {n + 2}D (batched) input to {name}, but got input of size: {list(xs)}")
    if len(ws) != n + 2:
        raise RuntimeError(f"weight should have {n + 2} dimensions for {name}: got weight of size {list(ws)}")
    if _kinds_differ(_dtype(x), _dtype(w)):
        raise RuntimeError(f"expected scalar type {torch_dtype_name(_dtype(x))} but found {torch_dtype_name(_dtype(w))}")
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    if 0 in ws[2:]:
        raise RuntimeError(f"kernel size should be greater than zero, but got kernel size {list(ws[2:])}")
    if any(s <= 0 for s in stride):
        raise RuntimeError("non-positive stride is not supported")
    if any(d <= 0 for d in dilation):
        raise RuntimeError(f"dilation should be greater than zero, but got {list(dilation)}")
    return xs, ws


def _conv_rule(x: Any, w: Any, stride: tuple[int, ...], padding: Any, dilation: tuple[int, ...], groups: int) -> None:
    xs, ws = _check_conv("conv3d", x, w, stride, dilation, groups)
    if ws[0] % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but got "
                           f"weight of size {list(ws)} instead")
    if xs[1] != ws[1] * groups:
        raise RuntimeError(f"Given groups={groups}, weight of size {list(ws)}, expected input{list(xs)} to have "
                           f"{ws[1] * groups} channels, but got {xs[1]} channels instead")
    if not isinstance(padding, str):
        if any(p < 0 for pair in padding for p in pair):
            raise RuntimeError("negative padding is not supported")
        padded = [s + lo + hi for s, (lo, hi) in zip(xs[2:], padding, strict=True)]
        kernel = [(k - 1) * d + 1 for k, d in zip(ws[2:], dilation, strict=True)]
        if any(k > p for k, p in zip(kernel, padded, strict=True)):
            raise RuntimeError(f"Calculated padded input size per channel: {tuple(padded)}. Kernel size: {tuple(kernel)}. "
                               "Kernel size can't be greater than actual input size")


def _transpose_rule(x: Any, w: Any, stride: tuple[int, ...], padding: tuple[int, ...], output_padding: tuple[int, ...],
                    dilation: tuple[int, ...], groups: int) -> None:
    xs, ws = _check_conv(f"conv_transpose{len(stride)}d", x, w, stride, dilation, groups)
    if xs[1] != ws[0]:
        raise RuntimeError(f"Given transposed=1, weight of size {list(ws)}, expected input{list(xs)} to have {ws[0]} "
                           f"channels, but got {xs[1]} channels instead")
    if ws[0] % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but got "
                           f"weight of size {list(ws)} instead")
    if any(p < 0 for p in padding):
        raise RuntimeError("negative padding is not supported")
    if any(op >= s and op >= d for op, s, d in zip(output_padding, stride, dilation, strict=True)) or min(output_padding) < 0:
        raise RuntimeError(f"output padding must be smaller than either stride or dilation, but got output_padding: "
                           f"{list(output_padding)}, stride: {list(stride)}, dilation: {list(dilation)}")
    sizes = [(i - 1) * s - 2 * p + d * (k - 1) + op + 1
             for i, s, p, d, k, op in zip(xs[2:], stride, padding, dilation, ws[2:], output_padding, strict=True)]
    if min(sizes) <= 0:
        raise RuntimeError(f"Given input size per channel: {list(xs[2:])}. Calculated output size per channel: {sizes}. "
                           "Output size is too small")


def _conv_grad(g: Tensor, out: Any, x: Tensor, w: Tensor, **params: Any) -> Any:
    return vjp_of("conv3d", _conv_impl, **params)(g, x, w)


def _transpose_grad(g: Tensor, out: Any, x: Tensor, w: Tensor, **params: Any) -> Any:
    return vjp_of("conv_transpose", _transpose_impl, **params)(g, x, w)


_conv3d = defprim("conv3d", _conv_impl, joint_vjp=_conv_grad, shape_rule=_conv_rule)
_transposed_conv = defprim("conv_transpose", _transpose_impl, joint_vjp=_transpose_grad, shape_rule=_transpose_rule)


def _with_bias(out: Tensor, bias: Tensor | None, channels: int) -> Tensor:
    if bias is None:
        return out
    if bias.ndim != 1 or bias.shape[0] != channels:
        raise RuntimeError(f"expected bias to be 1-dimensional with {channels} elements, but got bias of size {list(bias.shape)}")
    return out + bias.reshape((1, -1) + (1,) * (out.ndim - 2))


def _batched(input: Tensor, n: int, run: Any) -> Tensor:
    """``run`` on ``input`` with a batch dim, which an unbatched ``(C, *spatial)`` input gets and loses again."""
    if input.ndim == n + 1:
        return run(input.unsqueeze(0)).squeeze(0)
    return run(input)


@autocast_op
def conv3d(
    input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1
) -> Tensor:
    """``F.conv3d`` on NCDHW (or unbatched CDHW) input and OIDHW weight; ``padding`` an int, triple, ``"same"`` or ``"valid"``.

    >>> import xgrad
    >>> xgrad.conv3d(xgrad.ones(1, 1, 3, 3, 3), xgrad.ones(1, 1, 2, 2, 2)).shape
    (1, 1, 2, 2, 2)
    """
    strides = _sizes(stride, 3, "stride")
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise RuntimeError(f"Invalid padding string: '{padding}'")
        if padding == "same" and strides != (1, 1, 1):
            raise RuntimeError("padding='same' is not supported for strided convolutions")
        pad: Any = padding.upper()
    else:
        pad = tuple((p, p) for p in _sizes(padding, 3, "padding"))
    dilations = _sizes(dilation, 3, "dilation")
    return _batched(input, 3, lambda x: _with_bias(_conv3d(x, weight, stride=strides, padding=pad, dilation=dilations,
                                                           groups=groups), bias, weight.shape[0]))


def _conv_transpose(n: int, input: Tensor, weight: Tensor, bias: Tensor | None, stride: Any, padding: Any,
                    output_padding: Any, groups: int, dilation: Any) -> Tensor:
    params = dict(stride=_sizes(stride, n, "stride"), padding=_sizes(padding, n, "padding"),
                  output_padding=_sizes(output_padding, n, "output_padding"), dilation=_sizes(dilation, n, "dilation"),
                  groups=groups)
    channels = weight.shape[1] * groups if weight.ndim == n + 2 else 0
    return _batched(input, n, lambda x: _with_bias(_transposed_conv(x, weight, **params), bias, channels))



@autocast_op
def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """``F.conv_transpose1d``: the input gradient of ``conv1d``, weight ``(in, out / groups, K)`` as PyTorch's.

    >>> import xgrad
    >>> xgrad.conv_transpose1d(xgrad.tensor([[[1.0, 2.0]]]), xgrad.tensor([[[1.0, 1.0]]])).tolist()
    [[[1.0, 3.0, 2.0]]]
    """
    return _conv_transpose(1, input, weight, bias, stride, padding, output_padding, groups, dilation)


@autocast_op
def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """``F.conv_transpose2d`` on NCHW input, weight ``(in, out / groups, kH, kW)`` as PyTorch's.

    >>> import xgrad
    >>> xgrad.conv_transpose2d(xgrad.ones(1, 2, 3, 3), xgrad.ones(2, 4, 4, 4), stride=2, padding=1).shape
    (1, 4, 6, 6)
    """
    return _conv_transpose(2, input, weight, bias, stride, padding, output_padding, groups, dilation)


@autocast_op
def conv_transpose3d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    """``F.conv_transpose3d`` on NCDHW input, weight ``(in, out / groups, kD, kH, kW)`` as PyTorch's.

    >>> import xgrad
    >>> xgrad.conv_transpose3d(xgrad.ones(1, 2, 2, 2, 2), xgrad.ones(2, 3, 2, 2, 2), stride=2).shape
    (1, 3, 4, 4, 4)
    """
    return _conv_transpose(3, input, weight, bias, stride, padding, output_padding, groups, dilation)
