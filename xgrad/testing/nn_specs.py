"""Op specs for pooling, group/batch/instance norm, conv1d and embedding's ``padding_idx``, with their references.

``xgrad.testing.op_specs`` adds ``nn_specs()`` to its table. The references are written
with ``jax.lax``/``jnp`` alone: pools as ``lax.reduce_window`` over explicitly padded input
(PyTorch's output size formula decides the padding), adaptive pools as a loop over
PyTorch's windows.

>>> [s.name for s in nn_specs()][:2]
['max_pool1d', 'max_pool2d']
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import xgrad

__all__ = ["nn_specs", "ref_avg_pool", "ref_max_pool"]


def _out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    return out - 1 if ceil_mode and (out - 1) * s >= size + p else out


def _window_padding(x: Any, kernel: Sequence[int], stride: Sequence[int], pad: Sequence[int], dilation: Sequence[int],
                    ceil_mode: bool) -> tuple[list[tuple[int, int]], list[int]]:
    """Per spatial dim: the (left, right) padding that holds every PyTorch window, and the output sizes."""
    out = [_out_size(*a, ceil_mode) for a in zip(x.shape[2:], kernel, stride, pad, dilation, strict=True)]
    right = [max((o - 1) * s + (k - 1) * d + 1 - n - p, 0)
             for o, s, k, d, n, p in zip(out, stride, kernel, dilation, x.shape[2:], pad, strict=True)]
    return [(0, 0), (0, 0), *zip(pad, right, strict=True)], out


def _crop(y: Any, out: Sequence[int]) -> Any:
    return y[(slice(None), slice(None), *(slice(0, o) for o in out))]


def ref_max_pool(x: Any, kernel: Sequence[int], stride: Sequence[int], pad: Sequence[int], dilation: Sequence[int],
                 ceil_mode: bool) -> Any:
    """PyTorch's max pool of ``(N, C, *spatial)`` input: the maximum over one strided slice of ``-inf``-padded
    input per kernel offset."""
    padding, out = _window_padding(x, kernel, stride, pad, dilation, ceil_mode)
    padded = jnp.pad(x, padding, constant_values=-jnp.inf)
    taps = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        starts = [o * d for o, d in zip(offset, dilation, strict=True)]
        taps.append(padded[(slice(None), slice(None), *(slice(a, a + (n - 1) * s + 1, s)
                                                         for a, n, s in zip(starts, out, stride, strict=True)))])
    return jnp.max(jnp.stack(taps), axis=0)


def ref_avg_pool(x: Any, kernel: Sequence[int], stride: Sequence[int], pad: Sequence[int], ceil_mode: bool,
                 count_include_pad: bool, divisor_override: int | None) -> Any:
    """PyTorch's average pool: window sums over zero padding, divided by the count of input (and pad) cells."""
    ones = (1,) * len(kernel)
    padding, out = _window_padding(x, kernel, stride, pad, ones, ceil_mode)
    window = lambda a: _crop(jax.lax.reduce_window(a, 0.0, jax.lax.add, (1, 1, *kernel), (1, 1, *stride), "VALID"), out)  # noqa: E731
    total = window(jnp.pad(x, padding))
    if divisor_override is not None:
        return total / divisor_override
    # The cells a window counts: the input's, plus the symmetric padding's when count_include_pad (never the ceil overflow).
    cells = jnp.ones((1, 1, *x.shape[2:]), x.dtype)
    if count_include_pad:
        cells = jnp.pad(cells, [(0, 0), (0, 0), *((p, p) for p in pad)], constant_values=1.0)
        overflow = [(0, 0), (0, 0), *((0, hi - p) for (_, hi), p in zip(padding[2:], pad, strict=True))]
        return total / window(jnp.pad(cells, [(lo, max(hi, 0)) for lo, hi in overflow]))
    return total / window(jnp.pad(cells, padding))


def _ref_adaptive(x: Any, out: Sequence[int], reduce: Any) -> Any:
    """PyTorch's adaptive windows ``[floor(i * n / out), ceil((i + 1) * n / out))``, one output at a time."""
    def bounds(n: int, o: int) -> list[tuple[int, int]]:
        return [((i * n) // o, -((-(i + 1) * n) // o)) for i in range(o)]

    if len(out) == 1:
        return jnp.stack([reduce(x[..., a:b], axis=-1) for a, b in bounds(x.shape[-1], out[0])], axis=-1)
    rows = [jnp.stack([reduce(x[..., a:b, c:d], axis=(-2, -1)) for c, d in bounds(x.shape[-1], out[1])], axis=-1)
            for a, b in bounds(x.shape[-2], out[0])]
    return jnp.stack(rows, axis=-2)


def _ref_normalize(x: Any, axes: tuple[int, ...], w: Any = None, b: Any = None) -> Any:
    mu = jnp.mean(x, axis=axes, keepdims=True)
    y = (x - mu) / jnp.sqrt(jnp.mean((x - mu) ** 2, axis=axes, keepdims=True) + 1e-5)
    per_channel = (1, -1) + (1,) * (x.ndim - 2)
    if w is not None:
        y = y * w.reshape(per_channel)
    return y if b is None else y + b.reshape(per_channel)


def _ref_group_norm(x: Any, w: Any, b: Any, groups: int) -> Any:
    grouped = _ref_normalize(x.reshape(x.shape[0], groups, -1), (2,))
    return grouped.reshape(x.shape) * w.reshape(1, -1, 1) + b.reshape(1, -1, 1)


def _ref_conv1d(x: Any, w: Any, b: Any, stride: int, padding: int, dilation: int, groups: int) -> Any:
    y = jax.lax.conv_general_dilated(x, w, (stride,), [(padding, padding)], rhs_dilation=(dilation,),
                                     dimension_numbers=("NCH", "OIH", "NCH"), feature_group_count=groups)
    return y + b[None, :, None]


_PADDING_INDEX = np.array([[1, 3, 1], [0, 1, 4]])


def nn_specs() -> list[Any]:
    """The specs, for ``op_specs``'s table (which calls this while it builds: hence the import here)."""
    from xgrad.testing.op_specs import POSITIVE, REAL, OpSpec, _prim

    X = xgrad
    return [
        OpSpec("max_pool1d", lambda x: X.max_pool1d(x, 3, 2, 1), lambda x: ref_max_pool(x, (3,), (2,), (1,), (1,), False),
               (((2, 2, 7),),), (REAL,)),
        OpSpec("max_pool2d", lambda x: X.max_pool2d(x, 3, 1), lambda x: ref_max_pool(x, (3, 3), (1, 1), (0, 0), (1, 1), False),
               (((1, 2, 4, 5),),), (REAL,), label="overlapping windows"),
        OpSpec("max_pool2d", lambda x: X.max_pool2d(x, (3, 2), (2, 1), 1, (1, 2), ceil_mode=True),
               lambda x: ref_max_pool(x, (3, 2), (2, 1), (1, 1), (1, 2), True), (((1, 2, 6, 5),),), (REAL,),
               label="padding, dilation, ceil_mode"),
        OpSpec("avg_pool1d", lambda x: X.avg_pool1d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
               lambda x: ref_avg_pool(x, (3,), (2,), (1,), True, False, None), (((2, 2, 8),),), (REAL,)),
        OpSpec("avg_pool2d", lambda x: X.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
               lambda x: ref_avg_pool(x, (3, 3), (2, 2), (1, 1), True, True, None), (((1, 2, 6, 5),),), (REAL,)),
        OpSpec("avg_pool2d", lambda x: X.avg_pool2d(x, 2, 1, divisor_override=3),
               lambda x: ref_avg_pool(x, (2, 2), (1, 1), (0, 0), False, True, 3), (((1, 2, 3, 4),),), (REAL,),
               label="divisor_override"),
        OpSpec("window_sum", _prim("window_sum", window=(1, 1, 2, 3), strides=(1, 1, 2, 1), padding=((0, 0), (0, 0), (1, 0), (0, 2))),
               lambda x: jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 1, 2, 3), (1, 1, 2, 1), ((0, 0), (0, 0), (1, 0), (0, 2))),
               (((1, 2, 4, 4),),), (REAL,)),
        OpSpec("adaptive_avg_pool1d", lambda x: X.adaptive_avg_pool1d(x, 3), lambda x: _ref_adaptive(x, (3,), jnp.mean),
               (((2, 2, 7),),), (REAL,)),
        OpSpec("adaptive_avg_pool2d", lambda x: X.adaptive_avg_pool2d(x, (3, 2)), lambda x: _ref_adaptive(x, (3, 2), jnp.mean),
               (((1, 2, 7, 5),), ((2, 1, 4, 3),)), (REAL,)),
        OpSpec("adaptive_max_pool2d", lambda x: X.adaptive_max_pool2d(x, (3, 4)), lambda x: _ref_adaptive(x, (3, 4), jnp.max),
               (((1, 2, 7, 5),),), (REAL,)),
        OpSpec("group_norm", lambda x, w, b: X.group_norm(x, 2, w, b), lambda x, w, b: _ref_group_norm(x, w, b, 2),
               (((2, 4, 3), (4,), (4,)),), (REAL, REAL, REAL)),
        OpSpec("batch_norm", lambda x, w, b: X.batch_norm(x, None, None, w, b, training=True),
               lambda x, w, b: _ref_normalize(x, (0, 2), w, b), (((3, 2, 4), (2,), (2,)),), (REAL, REAL, REAL),
               second_order=False),
        OpSpec("batch_norm", lambda x, m, v: X.batch_norm(x, m, v), lambda x, m, v: (x - m) / jnp.sqrt(v + 1e-5),
               (((3, 2), (2,), (2,)),), (REAL, REAL, POSITIVE), label="running statistics", second_order=False),
        OpSpec("instance_norm", lambda x, w, b: X.instance_norm(x, weight=w, bias=b),
               lambda x, w, b: _ref_normalize(x, (2,), w, b), (((2, 3, 4), (3,), (3,)),), (REAL, REAL, REAL),
               second_order=False),
        OpSpec("conv1d", lambda x, w, b: X.conv1d(x, w, b, stride=2, padding=1, dilation=2, groups=2),
               lambda x, w, b: _ref_conv1d(x, w, b, 2, 1, 2, 2), (((2, 4, 7), (4, 2, 3), (4,)),), (REAL, REAL, REAL),
               second_order=False),  # conv2d's rules, checked to second order there
        OpSpec("embedding", lambda w: X.embedding(X.tensor(_PADDING_INDEX), w, padding_idx=1),
               lambda w: jnp.where((_PADDING_INDEX == 1)[..., None], jax.lax.stop_gradient(w[_PADDING_INDEX]), w[_PADDING_INDEX]),
               (((5, 3),),), (REAL,), label="padding_idx", smooth=False),  # by design not the derivative of the forward
    ]
