"""Pooling layers: ``MaxPool1d/2d/3d``, ``AvgPool1d/2d/3d``, ``AdaptiveAvgPool1d/2d/3d``, ``AdaptiveMaxPool2d/3d``.

Each holds its arguments as PyTorch's module does (``stride`` defaults to ``kernel_size``)
and calls the op of its name (``xgrad/ops/pooling.py``).
"""

from __future__ import annotations

from typing import Any

from xgrad import ops
from xgrad.nn.module import Module
from xgrad.tensor import Tensor


def _single(value: Any) -> tuple[int, ...]:
    """PyTorch's ``_single``: an int as a 1-tuple (the 1-d pools store their arguments so)."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


class _MaxPoolNd(Module):
    def __init__(
        self, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1, return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    fn: Any

    def forward(self, x: Tensor) -> Any:
        return type(self).fn(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode, self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"ceil_mode={self.ceil_mode}")


class MaxPool1d(_MaxPoolNd):
    """Max pooling over ``(N, C, L)`` or ``(C, L)`` input (``F.max_pool1d``).

    >>> import xgrad
    >>> xgrad.nn.MaxPool1d(2)(xgrad.tensor([[1.0, 3.0, 2.0, 0.0]])).tolist()
    [[3.0, 2.0]]
    """

    fn = staticmethod(ops.max_pool1d)


class MaxPool2d(_MaxPoolNd):
    """Max pooling over ``(N, C, H, W)`` or ``(C, H, W)`` input (``F.max_pool2d``).

    >>> import xgrad
    >>> xgrad.nn.MaxPool2d(2)(xgrad.arange(16.0).reshape(1, 4, 4)).tolist()
    [[[5.0, 7.0], [13.0, 15.0]]]
    """

    fn = staticmethod(ops.max_pool2d)


class MaxPool3d(_MaxPoolNd):
    """Max pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input (``F.max_pool3d``).

    >>> import xgrad
    >>> xgrad.nn.MaxPool3d(2)(xgrad.arange(8.0).reshape(1, 2, 2, 2)).flatten().tolist()
    [7.0]
    """

    fn = staticmethod(ops.max_pool3d)


class AvgPool1d(Module):
    """Average pooling over ``(N, C, L)`` or ``(C, L)`` input (``F.avg_pool1d``).

    >>> import xgrad
    >>> xgrad.nn.AvgPool1d(2)(xgrad.tensor([[1.0, 3.0, 2.0, 0.0]])).tolist()
    [[2.0, 1.0]]
    """

    def __init__(
        self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
    ) -> None:
        self.kernel_size = _single(kernel_size)
        self.stride = _single(stride if stride is not None else kernel_size)
        self.padding = _single(padding)
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, x: Tensor) -> Tensor:
        return ops.avg_pool1d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class _AvgPoolNd(Module):
    fn: Any

    def __init__(
        self, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.ceil_mode, self.count_include_pad = padding, ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, x: Tensor) -> Tensor:
        return type(self).fn(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                             self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(_AvgPoolNd):
    """Average pooling over ``(N, C, H, W)`` or ``(C, H, W)`` input (``F.avg_pool2d``).

    >>> import xgrad
    >>> xgrad.nn.AvgPool2d(2)(xgrad.arange(16.0).reshape(1, 4, 4)).tolist()
    [[[2.5, 4.5], [10.5, 12.5]]]
    """

    fn = staticmethod(ops.avg_pool2d)


class AvgPool3d(_AvgPoolNd):
    """Average pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input (``F.avg_pool3d``).

    >>> import xgrad
    >>> xgrad.nn.AvgPool3d(2)(xgrad.arange(8.0).reshape(1, 2, 2, 2)).flatten().tolist()
    [3.5]
    """

    fn = staticmethod(ops.avg_pool3d)


class _AdaptivePool(Module):
    def __init__(self, output_size: Any) -> None:
        self.output_size = output_size

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_AdaptivePool):
    """The mean over PyTorch's adaptive windows of ``(N, C, L)`` or ``(C, L)`` input (``F.adaptive_avg_pool1d``).

    >>> import xgrad
    >>> xgrad.nn.AdaptiveAvgPool1d(1)(xgrad.tensor([[1.0, 3.0, 2.0]])).tolist()
    [[2.0]]
    """

    def forward(self, x: Tensor) -> Tensor:
        return ops.adaptive_avg_pool1d(x, self.output_size)


class AdaptiveAvgPool2d(_AdaptivePool):
    """The mean over PyTorch's adaptive windows of ``(N, C, H, W)`` or ``(C, H, W)`` input (``F.adaptive_avg_pool2d``).

    >>> import xgrad
    >>> xgrad.nn.AdaptiveAvgPool2d((1, 1))(xgrad.ones(2, 3, 5, 5)).shape
    (2, 3, 1, 1)
    """

    def forward(self, x: Tensor) -> Tensor:
        return ops.adaptive_avg_pool2d(x, self.output_size)


class AdaptiveAvgPool3d(_AdaptivePool):
    """The mean over PyTorch's adaptive windows of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input (``F.adaptive_avg_pool3d``).

    >>> import xgrad
    >>> xgrad.nn.AdaptiveAvgPool3d(1)(xgrad.ones(2, 3, 2, 4, 4)).shape
    (2, 3, 1, 1, 1)
    """

    def forward(self, x: Tensor) -> Tensor:
        return ops.adaptive_avg_pool3d(x, self.output_size)


class _AdaptiveMaxPoolNd(_AdaptivePool):
    fn: Any

    def __init__(self, output_size: Any, return_indices: bool = False) -> None:
        super().__init__(output_size)
        self.return_indices = return_indices

    def forward(self, x: Tensor) -> Any:
        return type(self).fn(x, self.output_size, self.return_indices)


class AdaptiveMaxPool2d(_AdaptiveMaxPoolNd):
    """The maximum over PyTorch's adaptive windows (``F.adaptive_max_pool2d``).

    >>> import xgrad
    >>> xgrad.nn.AdaptiveMaxPool2d(1)(xgrad.arange(9.0).reshape(1, 3, 3)).tolist()
    [[[8.0]]]
    """

    fn = staticmethod(ops.adaptive_max_pool2d)


class AdaptiveMaxPool3d(_AdaptiveMaxPoolNd):
    """The maximum over PyTorch's adaptive windows of 3-d input (``F.adaptive_max_pool3d``).

    >>> import xgrad
    >>> xgrad.nn.AdaptiveMaxPool3d(1)(xgrad.arange(8.0).reshape(1, 2, 2, 2)).flatten().tolist()
    [7.0]
    """

    fn = staticmethod(ops.adaptive_max_pool3d)
