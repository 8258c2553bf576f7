"""Convolution layers: ``Conv2d``."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from xgrad import ops
from xgrad.nn.init import prng_key
from xgrad.nn.module import Module, Parameter
from xgrad.tensor import Tensor


def _pair(value: Any) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


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
        groups: int = 1, bias: bool = True, padding_mode: str = "zeros", *, key: Any = None, dtype: Any = jnp.float32,
    ) -> None:
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by groups ({groups})")
        if padding_mode != "zeros":
            raise ValueError(f"Conv2d supports padding_mode='zeros' only, got {padding_mode!r}; pad the input with xgrad.pad first")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.dilation = _pair(kernel_size), _pair(stride), _pair(dilation)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        kh, kw = self.kernel_size
        # kaiming_uniform_(a=sqrt(5)) as PyTorch's reset_parameters: bound 1/sqrt(fan_in), for the bias too.
        bound = 1.0 / math.sqrt(in_channels // groups * kh * kw)
        k_weight, k_bias = jax.random.split(prng_key(key))
        self.weight = Parameter(jax.random.uniform(k_weight, (out_channels, in_channels // groups, kh, kw), dtype, -bound, bound))
        self.bias = Parameter(jax.random.uniform(k_bias, (out_channels,), dtype, -bound, bound)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return ops.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, groups={self.groups}, bias={self.bias is not None}")

