"""``pixel_shuffle`` and ``pixel_unshuffle``: channels to space and back, as reshapes and a permutation."""

from __future__ import annotations

from xgrad.tensor import Tensor

__all__ = ["pixel_shuffle", "pixel_unshuffle"]


def _check(input: Tensor, factor: int, name: str, what: str) -> None:
    if input.ndim < 3:
        raise RuntimeError(f"{name} expects input to have at least 3 dimensions, but got input with {input.ndim} dimension(s)")
    if factor <= 0:
        raise RuntimeError(f"{name} expects a positive {what}, but got {factor}")


def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """``F.pixel_shuffle``: ``(*, C * r * r, H, W)`` to ``(*, C, H * r, W * r)``.

    >>> import xgrad
    >>> xgrad.pixel_shuffle(xgrad.arange(4.0).reshape(1, 4, 1, 1), 2).tolist()
    [[[[0.0, 1.0], [2.0, 3.0]]]]
    """
    r = upscale_factor
    _check(input, r, "pixel_shuffle", "upscale_factor")
    *batch, c, h, w = input.shape
    if c % (r * r):
        raise RuntimeError(f"pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of "
                           f"upscale_factor, but input.size(-3)={c} is not divisible by {r * r}")
    n = len(batch)
    x = input.reshape(*batch, c // (r * r), r, r, h, w)
    x = x.permute(*range(n), n, n + 3, n + 1, n + 4, n + 2)
    return x.reshape(*batch, c // (r * r), h * r, w * r)


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
    """``F.pixel_unshuffle``: ``(*, C, H * r, W * r)`` to ``(*, C * r * r, H, W)``, ``pixel_shuffle``'s inverse.

    >>> import xgrad
    >>> xgrad.pixel_unshuffle(xgrad.arange(4.0).reshape(1, 1, 2, 2), 2).flatten().tolist()
    [0.0, 1.0, 2.0, 3.0]
    """
    r = downscale_factor
    _check(input, r, "pixel_unshuffle", "downscale_factor")
    *batch, c, h, w = input.shape
    if h % r or w % r:
        raise RuntimeError(f"pixel_unshuffle expects height and width to be divisible by downscale_factor, but got "
                           f"height={h}, width={w} and downscale_factor={r}")
    n = len(batch)
    x = input.reshape(*batch, c, h // r, r, w // r, r)
    x = x.permute(*range(n), n, n + 2, n + 4, n + 1, n + 3)
    return x.reshape(*batch, c * r * r, h // r, w // r)
