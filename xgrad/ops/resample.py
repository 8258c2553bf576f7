"""``interpolate``: nearest, (bi/tri)linear and area resizing of ``(N, C, *spatial)`` input.

Both modes are separable composites: nearest is one index per spatial dim (its
gradient is scattered back by indexing's rule), linear is two indexed reads and a
blend per dim. Source coordinates follow PyTorch's formulas exactly (half-pixel
centres unless ``align_corners=True``; ``1/scale_factor`` as the scale when given).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from xgrad.ops import shape_rules
from xgrad.ops._util import check_int, constant_like
from xgrad.ops.autocast import autocast_op
from xgrad.ops.pooling import adaptive_avg_pool1d, adaptive_avg_pool2d
from xgrad.tensor import Tensor

__all__ = ["interpolate"]

_LINEAR_MODES = {"linear": 1, "bilinear": 2, "trilinear": 3}
_MODES = ("nearest", "nearest-exact", "area", *_LINEAR_MODES)


def _per_dim(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, Sequence):
        if len(value) != n:
            raise ValueError(
                f"Input and {name} must have the same number of spatial dimensions, but got input with spatial "
                f"dimensions of {n} and {name} of length {len(value)}."
            )
        return list(value)
    return [value] * n


def _linear_source(out_size: int, in_size: int, scale: float, align_corners: bool) -> np.ndarray:
    """PyTorch's ``area_pixel_compute_source_index`` for every output index."""
    dst = np.arange(out_size, dtype=np.float64)
    if align_corners:
        return dst * ((in_size - 1) / (out_size - 1) if out_size > 1 else 0.0)
    return np.maximum(scale * (dst + 0.5) - 0.5, 0.0)


def _take(x: Tensor, axis: int, index: np.ndarray) -> Tensor:
    return x[(slice(None),) * axis + (index,)]


def _check_sizes(in_sizes: Sequence[int], out_sizes: Sequence[int]) -> None:
    if any(s <= 0 for s in (*in_sizes, *out_sizes)):
        names = "DHW"[-len(in_sizes):]
        show = lambda sizes: ", ".join(f"{n}: {s}" for n, s in zip(names, sizes, strict=True))  # noqa: E731
        raise RuntimeError(
            f"Input and output sizes should be greater than 0, but got input ({show(in_sizes)}) output ({show(out_sizes)})"
        )


@autocast_op
def interpolate(
    input: Tensor,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> Tensor:
    """``F.interpolate`` on ``(N, C, *spatial)`` input: modes ``nearest``, ``nearest-exact``, ``linear``, ``bilinear``,
    ``trilinear`` and ``area`` (adaptive average pooling to the output size, 1 or 2 spatial dims).

    Args:
        size: the output spatial size (an int or one per spatial dim).
        scale_factor: multiplier of each spatial size (the output size is floored);
            also the coordinate scale, unless ``recompute_scale_factor=True``.
        align_corners: for the linear modes, map corner pixels' centres onto each
            other (``True``) or use half-pixel centres (``False``, the default).

    >>> import xgrad
    >>> x = xgrad.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    >>> xgrad.interpolate(x, scale_factor=2, mode="bilinear")[0, 0, 0].tolist()
    [1.0, 1.25, 1.75, 2.0]
    >>> xgrad.interpolate(x, size=(1, 4))[0, 0].tolist()
    [[1.0, 1.0, 2.0, 2.0]]
    """
    if mode not in _MODES:
        raise NotImplementedError(f"interpolate: mode {mode!r} is not supported; use one of {', '.join(_MODES)}")
    if antialias:
        raise NotImplementedError("interpolate: antialias=True is not supported")
    shape_rules.check_float(input, f"upsample_{mode.replace('-', '_')}{max(input.ndim - 2, 1)}d_channels_last")
    n_spatial = input.ndim - 2
    if n_spatial < 1:
        raise ValueError(f"interpolate expects (N, C, *spatial) input with at least 3 dims, got {input.ndim}D")
    if mode in _LINEAR_MODES:
        if _LINEAR_MODES[mode] != n_spatial:
            raise NotImplementedError(f"Got {input.ndim}D input, but {mode} mode needs {_LINEAR_MODES[mode] + 2}D input")
    elif align_corners is not None:
        raise ValueError(
            "align_corners option can only be set with the interpolating modes: linear | bilinear | bicubic | trilinear"
        )
    if (size is None) == (scale_factor is None):
        raise ValueError("only one of size or scale_factor should be defined" if size is not None
                         else "either size or scale_factor should be defined")
    in_sizes = input.shape[2:]
    if size is not None:
        out_sizes = [check_int(s, "interpolate", "size", 2) for s in _per_dim(size, n_spatial, "size")]
        _check_sizes(in_sizes, out_sizes)
        scales = [i / o for i, o in zip(in_sizes, out_sizes, strict=True)]
    else:
        factors = [float(f) for f in _per_dim(scale_factor, n_spatial, "scale_factor")]
        out_sizes = [math.floor(i * f) for i, f in zip(in_sizes, factors, strict=True)]
        if recompute_scale_factor:
            scales = [i / o for i, o in zip(in_sizes, out_sizes, strict=True)]
        else:
            scales = [1.0 / f for f in factors]
    _check_sizes(in_sizes, out_sizes)
    if mode == "area":
        if n_spatial > 2:
            raise NotImplementedError("interpolate: mode 'area' takes 1 or 2 spatial dims here (no adaptive_avg_pool3d)")
        return (adaptive_avg_pool1d if n_spatial == 1 else adaptive_avg_pool2d)(input, out_sizes)
    out = input
    for d, (n_in, n_out, scale) in enumerate(zip(in_sizes, out_sizes, scales, strict=True)):
        axis = 2 + d
        if mode in ("nearest", "nearest-exact"):
            offset = 0.5 if mode == "nearest-exact" else 0.0
            src = np.minimum(np.floor((np.arange(n_out) + offset) * scale).astype(np.int64), n_in - 1)
            out = _take(out, axis, src)
            continue
        pos = _linear_source(n_out, n_in, scale, bool(align_corners))
        lo = np.minimum(np.floor(pos).astype(np.int64), n_in - 1)
        hi = np.minimum(lo + 1, n_in - 1)
        frac_shape = (n_out,) + (1,) * (input.ndim - 1 - axis)
        frac = constant_like((pos - lo).reshape(frac_shape), input)
        out = _take(out, axis, lo) * (1 - frac) + _take(out, axis, hi) * frac
    return out
