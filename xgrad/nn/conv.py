"""Convolution layers: ``Conv1d/2d/3d`` and ``ConvTranspose1d/2d/3d``, with PyTorch's weight layouts and initialisation."""

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


def _triple(value: Any) -> tuple[int, int, int]:
    return (value,) * 3 if isinstance(value, int) else (int(value[0]), int(value[1]), int(value[2]))


def _conv_weights(
    key: Any, shape: tuple[int, ...], out_channels: int, bias: bool, dtype: Any,
) -> tuple[Tensor, Tensor | None]:
    """kaiming_uniform_(a=sqrt(5)) as PyTorch's reset_parameters: bound 1/sqrt(fan_in), for the bias too, fan_in
    the weight's ``shape[1] * prod(kernel)`` (an empty kernel has no fan-in: its weight is empty, and the bias, left
    alone by PyTorch, is zero)."""
    shape = check_nonnegative_shape(shape)
    fan_in = math.prod(shape[1:])
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
        self.weight, self.bias = _conv_weights(key, (out_channels, in_channels // groups, *self.kernel_size), out_channels,
                                               bias, dtype)

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
        self.weight, self.bias = _conv_weights(key, (out_channels, in_channels // groups, *self.kernel_size), out_channels,
                                               bias, dtype)

    def forward(self, x: Tensor) -> Tensor:
        return ops.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, groups={self.groups}, bias={self.bias is not None}")



class Conv3d(Module):
    """3-D convolution over NCDHW input with an OIDHW ``weight`` (``F.conv3d``), initialised as PyTorch does.

    Args as ``Conv2d``'s, each an int or a triple.

    >>> import xgrad
    >>> conv = xgrad.nn.Conv3d(2, 4, 3, padding=1, key=0)
    >>> conv(xgrad.ones(1, 2, 3, 4, 5)).shape, conv.weight.shape
    ((1, 4, 3, 4, 5), (4, 2, 3, 3, 3))
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
        groups: int = 1, bias: bool = True, padding_mode: str = "zeros", *, key: Any = None, dtype: Any = None,
    ) -> None:
        dtype = parameter_dtype(dtype)
        _check_conv_args(in_channels, out_channels, groups, padding, _triple(stride) != (1, 1, 1), padding_mode)
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.dilation = _triple(kernel_size), _triple(stride), _triple(dilation)
        self.padding = padding if isinstance(padding, str) else _triple(padding)
        self.weight, self.bias = _conv_weights(key, (out_channels, in_channels // groups, *self.kernel_size), out_channels,
                                               bias, dtype)

    def forward(self, x: Tensor) -> Tensor:
        return ops.conv3d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, groups={self.groups}, bias={self.bias is not None}")


class _ConvTransposeNd(Module):
    """A transposed convolution over ``dims`` spatial dims (``fn``): the weight layout, init and ``output_size``."""

    dims: int
    fn: Any

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1, padding: Any = 0,
        output_padding: Any = 0, groups: int = 1, bias: bool = True, dilation: Any = 1, padding_mode: str = "zeros", *,
        key: Any = None, dtype: Any = None,
    ) -> None:
        dtype = parameter_dtype(dtype)
        if isinstance(padding, str):
            raise ValueError(f'padding {padding!r} is not supported for transposed convolutions; give it as an int or a tuple')
        _check_conv_args(in_channels, out_channels, groups, padding, False, padding_mode)
        n = type(self).dims
        as_tuple = {1: _single, 2: _pair, 3: _triple}[n]
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.padding = as_tuple(kernel_size), as_tuple(stride), as_tuple(padding)
        self.output_padding, self.dilation = as_tuple(output_padding), as_tuple(dilation)
        self.weight, self.bias = _conv_weights(key, (in_channels, out_channels // groups, *self.kernel_size), out_channels,
                                               bias, dtype)

    def _output_padding(self, x: Tensor, output_size: Any) -> tuple[int, ...]:
        """PyTorch's ``_output_padding``: what ``output_size`` asks beyond the smallest output, checked to be in range."""
        if output_size is None:
            return self.output_padding
        n = type(self).dims
        wanted = [int(s) for s in output_size][-n:]
        if len(wanted) != n:
            raise ValueError(f"ConvTranspose{n}D: for {x.ndim}D input, output_size must have {n} or {n + 2} elements "
                             f"(got {len(list(output_size))})")
        smallest = [(size - 1) * s - 2 * p + d * (k - 1) + 1 for size, s, p, d, k in
                    zip(x.shape[-n:], self.stride, self.padding, self.dilation, self.kernel_size, strict=True)]
        for want, low, s in zip(wanted, smallest, self.stride, strict=True):
            if not low <= want < low + s:
                raise ValueError(f"requested an output size of {wanted}, but valid sizes range from {smallest} to "
                                 f"{[lo + st - 1 for lo, st in zip(smallest, self.stride, strict=True)]} (for an input of "
                                 f"{list(x.shape[-n:])})")
        return tuple(want - low for want, low in zip(wanted, smallest, strict=True))

    def forward(self, x: Tensor, output_size: Any = None) -> Tensor:
        return type(self).fn(x, self.weight, self.bias, self.stride, self.padding, self._output_padding(x, output_size),
                             self.groups, self.dilation)

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if any(self.padding):
            text += f", padding={self.padding}"
        if any(self.output_padding):
            text += f", output_padding={self.output_padding}"
        if any(d != 1 for d in self.dilation):
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text if self.bias is not None else text + ", bias=False"


class ConvTranspose2d(_ConvTransposeNd):
    """2-D transposed convolution (``F.conv_transpose2d``), the input gradient of a ``Conv2d``.

    The ``weight`` is ``(in_channels, out_channels / groups, kH, kW)``, PyTorch's layout (so its
    ``state_dict`` loads as is), initialised as PyTorch does (fan-in ``out_channels / groups * kH * kW``).
    ``forward(x, output_size)`` picks the ``output_padding`` that reaches ``output_size``, as PyTorch's.

    >>> import xgrad
    >>> up = xgrad.nn.ConvTranspose2d(4, 2, 4, stride=2, padding=1, key=0)
    >>> up(xgrad.ones(1, 4, 3, 3)).shape, up.weight.shape
    ((1, 2, 6, 6), (4, 2, 4, 4))
    """

    dims = 2
    fn = staticmethod(ops.conv_transpose2d)


class ConvTranspose1d(_ConvTransposeNd):
    """1-D transposed convolution (``F.conv_transpose1d``), weight ``(in_channels, out_channels / groups, K)``.

    >>> import xgrad
    >>> xgrad.nn.ConvTranspose1d(2, 3, 3, stride=2, key=0)(xgrad.ones(1, 2, 4)).shape
    (1, 3, 9)
    """

    dims = 1
    fn = staticmethod(ops.conv_transpose1d)


class ConvTranspose3d(_ConvTransposeNd):
    """3-D transposed convolution (``F.conv_transpose3d``), weight ``(in_channels, out_channels / groups, kD, kH, kW)``.

    >>> import xgrad
    >>> xgrad.nn.ConvTranspose3d(2, 3, 2, stride=2, key=0)(xgrad.ones(1, 2, 2, 2, 2)).shape
    (1, 3, 4, 4, 4)
    """

    dims = 3
    fn = staticmethod(ops.conv_transpose3d)
