"""Resolution changes: ``PixelShuffle``, ``PixelUnshuffle``, ``Upsample`` and its fixed-mode forms
``UpsamplingNearest2d``, ``UpsamplingBilinear2d`` (``F.pixel_shuffle``, ``F.interpolate``)."""

from __future__ import annotations

from typing import Any

from xgrad import ops
from xgrad.nn.module import Module
from xgrad.tensor import Tensor


class PixelShuffle(Module):
    """``(*, C * r * r, H, W)`` to ``(*, C, H * r, W * r)`` (``F.pixel_shuffle``).

    >>> import xgrad
    >>> xgrad.nn.PixelShuffle(2)(xgrad.ones(1, 8, 3, 3)).shape
    (1, 2, 6, 6)
    """

    def __init__(self, upscale_factor: int) -> None:
        self.upscale_factor = upscale_factor

    def forward(self, x: Tensor) -> Tensor:
        return ops.pixel_shuffle(x, self.upscale_factor)

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """``(*, C, H * r, W * r)`` to ``(*, C * r * r, H, W)`` (``F.pixel_unshuffle``).

    >>> import xgrad
    >>> xgrad.nn.PixelUnshuffle(2)(xgrad.ones(1, 2, 6, 6)).shape
    (1, 8, 3, 3)
    """

    def __init__(self, downscale_factor: int) -> None:
        self.downscale_factor = downscale_factor

    def forward(self, x: Tensor) -> Tensor:
        return ops.pixel_unshuffle(x, self.downscale_factor)

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"


class Upsample(Module):
    """Resize ``(N, C, *spatial)`` input to ``size`` or by ``scale_factor`` (``F.interpolate``'s modes).

    >>> import xgrad
    >>> xgrad.nn.Upsample(scale_factor=2)(xgrad.ones(1, 1, 2, 3)).shape
    (1, 1, 4, 6)
    """

    def __init__(self, size: Any = None, scale_factor: Any = None, mode: str = "nearest", align_corners: bool | None = None,
                 recompute_scale_factor: bool | None = None) -> None:
        self.size, self.mode, self.align_corners = size, mode, align_corners
        self.scale_factor = float(scale_factor) if isinstance(scale_factor, (int, float)) else scale_factor
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, x: Tensor) -> Tensor:
        return ops.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                               recompute_scale_factor=self.recompute_scale_factor)

    def extra_repr(self) -> str:
        shown = f"scale_factor={self.scale_factor!r}" if self.scale_factor is not None else f"size={self.size!r}"
        return f"{shown}, mode={self.mode!r}"


class UpsamplingNearest2d(Upsample):
    """``Upsample`` with ``mode="nearest"`` on ``(N, C, H, W)`` input.

    >>> import xgrad
    >>> xgrad.nn.UpsamplingNearest2d(scale_factor=2)(xgrad.ones(1, 1, 1, 2)).shape
    (1, 1, 2, 4)
    """

    def __init__(self, size: Any = None, scale_factor: Any = None) -> None:
        super().__init__(size, scale_factor, mode="nearest")


class UpsamplingBilinear2d(Upsample):
    """``Upsample`` with ``mode="bilinear"`` and ``align_corners=True``, as PyTorch's.

    >>> import xgrad
    >>> xgrad.nn.UpsamplingBilinear2d(size=(3, 3))(xgrad.ones(1, 1, 2, 2)).shape
    (1, 1, 3, 3)
    """

    def __init__(self, size: Any = None, scale_factor: Any = None) -> None:
        super().__init__(size, scale_factor, mode="bilinear", align_corners=True)
