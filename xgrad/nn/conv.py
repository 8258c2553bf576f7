"""Convolution layers: ``Conv1d``, ``Conv2d``."""

from __future__ import annotations

import math
from typing import Any

import jax

from xgrad import ops
from xgrad.nn.init import prng_key
from xgrad.nn.module import Module, Parameter
from xgrad.ops._util import check_nonnegative_shape
from xgrad.tensor import Tensor
from xgrad.tensor.dtypes import parameter_dtype


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _single(value: Any) -> tuple[int]:
    return (value,) if isinstance(value, int) else (int(value[0]),)


def _conv_weights(
    key: Any, out_channels: int, in_per_group: int, kernel: tuple[int, ...], bias: bool, dtype: Any,
) -> tuple[Tensor, Tensor | None]:
    """kaiming_uniform_(a=sqrt(5)) as PyTorch's reset_parameters: bound 1/sqrt(fan_in), for the bias too
    (an empty kernel has no fan-in: its weight is empty, and the bias, left alone by PyTorch, is zero)."""
    shape = check_nonnegative_shape((out_channels, in_per_group, *kernel))
    fan_in = in_per_group * math.prod(kernel)
    bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
    k_weight, k_bias = jax.random.split(prng_key(key))
    weight = Parameter(jax.random.uniform(k_weight, shape, dtype, -bound, bound))
    return weight, Parameter(jax.random.uniform(k_bias, (out_channels,), dtype, -bound, bound)) if bias else None


def _check_conv_args(in_channels: int, out_channels: int, groups: int, padding: Any, strided: bool, padding_mode: str) -> None:
    if groups <= 0:
        raise ValueError("groups must be a positive integer")
    if in_channels % groups:
        raise ValueError("in_channels must be divisible by groups")
    if out_channels % groups:
        raise ValueError("out_channels must be divisible by groups")
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(f"Invalid padding string {padding!r}, should be one of {{'same', 'valid'}}")
        if padding == "same" and strided:
            raise ValueError("padding='same' is not supported for strided convolutions")
    if padding_mode != "zeros":
        raise ValueError(f"only padding_mode='zeros' is supported, got {padding_mode!r}; pad the input with xgrad.pad first")


class Conv1d(Module):
    """1-D convolution over ``(N, C, L)`` input with an ``(O, C / groups, K)`` ``weight`` (``F.conv1d``), initialised as PyTorch does.

    Args as ``Conv2d``'s, each an int (or a 1-tuple).

    >>> import xgrad
    >>> conv = xgrad.nn.Conv1d(3, 4, 3, padding=1, key=0)
    >>> conv(xgrad.ones(2, 3, 5)).shape, conv.weight.shape
    ((2, 4, 5), (4, 3, 3))
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
        groups: int = 1, bias: bool = True, padding_mode: str = "zeros", *, key: Any = None, dtype: Any = None,
    ) -> None:
        dtype = parameter_dtype(dtype)
        _check_conv_args(in_channels, out_channels, groups, padding, _single(stride) != (1,), padding_mode)
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.dilation = _single(kernel_size), _single(stride), _single(dilation)
        self.padding = padding if isinstance(padding, str) else _single(padding)
        self.weight, self.bias = _conv_weights(key, out_channels, in_channels // groups, self.kernel_size, bias, dtype)

    def forward(self, x: Tensor) -> Tensor:
        return ops.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        # PyTorch's: the arguments that differ from their defaults.
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,):
            text += f", padding={self.padding}"
        if self.dilation != (1,):
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text if self.bias is not None else text + ", bias=False"


class Conv2d(Module):
    """2-D convolution over NCHW input with an OIHW ``weight`` (``F.conv2d``), initialised as PyTorch does.

    Args:
        in_channels, out_channels: channel counts.
        kernel_size, stride, dilation: an int or a pair.
        padding: an int, a pair, ``"same"`` or ``"valid"`` (zeros padding).
        groups: channel groups; both channel counts must divide by it.
        bias: whether to add a bias.
        key: a ``jax.random`` key or int seed (the default key when ``None``).

    >>> import xgrad
    >>> conv = xgrad.nn.Conv2d(3, 4, 3, padding=1, key=0)
    >>> conv(xgrad.ones(2, 3, 5, 5)).shape, conv.weight.shape
    ((2, 4, 5, 5), (4, 3, 3, 3))
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
        groups: int = 1, bias: bool = True, padding_mode: str = "zeros", *, key: Any = None, dtype: Any = None,
    ) -> None:
        dtype = parameter_dtype(dtype)
        _check_conv_args(in_channels, out_channels, groups, padding, _pair(stride) != (1, 1), padding_mode)
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.dilation = _pair(kernel_size), _pair(stride), _pair(dilation)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        self.weight, self.bias = _conv_weights(key, out_channels, in_channels // groups, self.kernel_size, bias, dtype)

    def forward(self, x: Tensor) -> Tensor:
        return ops.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, groups={self.groups}, bias={self.bias is not None}")

