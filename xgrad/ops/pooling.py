"""Pooling over one, two or three spatial dims, as ``torch.nn.functional`` names it: ``max_pool1d/2d/3d``,
``avg_pool1d/2d/3d``, ``adaptive_avg_pool1d/2d/3d`` and ``adaptive_max_pool2d/3d``.

# NOTE [Max pooling picks one element]
# A max pool's gradient goes to one element per window, the one PyTorch picks: the first
# maximum in the window's row-major order (padding never wins). Each window is a row of a
# static table of flat input positions (built once per shape and arguments); one jitted
# program reads the windows and takes their first argmax, and the output is ``gather`` of
# the flattened input at those positions, so overlapping windows accumulate gradient
# through gather's rule (a scatter-add), at any order. The same table serves adaptive
# windows (PyTorch's start ``floor(i * L / out)`` and end ``ceil((i + 1) * L / out)``).
# Average pools are the ``window_sum`` primitive (``lax.reduce_window``; its rule is JAX's
# vjp of it) divided by PyTorch's divisor per window; adaptive averages are matmuls with a
# constant averaging matrix per spatial dim.

# NOTE [Pool gradients depend on the input]
# PyTorch's pool backwards (``max_pool2d_with_indices_backward``, ``avg_pool2d_backward``,
# ``_adaptive_avg_pool2d_backward``, ...) take the input and are differentiable in it with a
# zero derivative (``self: zeros_like(self)``): a gradient taken with ``create_graph=True``
# requires grad, and its own gradient in the input is zeros. The ops above are linear in the
# input once the windows are chosen, so their rules never read it; each pool's output goes
# through ``tie_to_input(out, x)`` (the output as it is), whose rule passes the incoming
# gradient on tied to ``x`` (``tie_to_input(g, x, backward=True)``): its derivative in ``x``
# is zeros. The forward tie gives ``x`` no gradient of its own (``None``, not zeros to add).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.ops import shape_rules
from xgrad.ops._util import constant_like
from xgrad.ops.autocast import autocast_op
from xgrad.ops.index import gather
from xgrad.ops.jaxop import vjp_of
from xgrad.ops.linalg import einsum
from xgrad.ops.registry import defprim
from xgrad.tensor import Tensor

__all__ = [
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool2d", "adaptive_max_pool3d",
    "avg_pool1d", "avg_pool2d", "avg_pool3d", "max_pool1d", "max_pool2d", "max_pool3d",
]


def _tie_grad_of_y(g: Tensor, out: Any, y: Any, x: Tensor, backward: bool = False) -> Tensor:
    return tie_to_input(g, x, backward=True)


def _tie_grad_of_x(g: Tensor, out: Any, y: Any, x: Any, backward: bool = False) -> Tensor | None:
    return Tensor(jnp.zeros(x.shape, x.dtype)) if backward else None


tie_to_input = defprim(
    "tie_to_input", lambda y, x, backward=False: y, (_tie_grad_of_y, _tie_grad_of_x),
    doc="""``y`` as it is; its gradient is tied to ``x`` (NOTE [Pool gradients depend on the input]).

    >>> import xgrad
    >>> from xgrad.ops.pooling import tie_to_input
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> (g,) = xgrad.autograd.grad(tie_to_input(x * 3, x).sum(), x, create_graph=True)
    >>> g.tolist(), g.requires_grad
    ([3.0, 3.0], True)
    """,
)


class PoolWithIndices(NamedTuple):
    values: Tensor
    indices: Tensor


def _ints(value: Any, n: int, what: str, name: str, allow_none: bool = False) -> tuple[int, ...]:
    """``value`` as ``n`` ints (one int is repeated), or PyTorch's error naming the argument."""
    if allow_none and (value is None or isinstance(value, Sequence) and len(value) == 0):
        return ()
    items = [value] if not isinstance(value, Sequence) else list(value)
    if len(items) == 1:
        items = items * n
    if len(items) != n or not all(hasattr(v, "__index__") and not isinstance(v, bool) for v in items):
        options = "a single int, or a tuple of two ints" if n == 2 else "a single int"
        omitted = "be omitted, " if allow_none else "be "
        raise RuntimeError(f"{name}: {what} must either {omitted}{options}")
    return tuple(operator.index(v) for v in items)


def _pool_output_size(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """PyTorch's ``pooling_output_shape``: a last window must start inside the input or its left padding."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _spatial_input(x: Tensor, n: int, name: str, message: str) -> tuple[Tensor, bool]:
    """``x`` as ``(N, C, *spatial)`` and whether it came unbatched, ``(C, *spatial)``."""
    if x.ndim not in (n + 1, n + 2) or x.ndim == n + 2 and 0 in x.shape[1:] or x.ndim == n + 1 and 0 in x.shape:
        raise RuntimeError(message.format(name=name, shape=list(x.shape)))
    return (x.unsqueeze(0), True) if x.ndim == n + 1 else (x, False)


def _check_window(
    name: str, x: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...], pad: tuple[int, ...], dilation: tuple[int, ...],
    ceil_mode: bool,
) -> tuple[int, ...]:
    """PyTorch's ``pool2d_shape_check``; the output's spatial sizes."""
    if any(s == 0 for s in stride):
        raise RuntimeError("stride should not be zero")
    if any(k <= 0 for k in kernel):
        raise RuntimeError(f"kernel size should be greater than zero, but got {name}: kernel_size={list(kernel)}")
    if any(s < 0 for s in stride) or any(d <= 0 for d in dilation):
        raise RuntimeError(f"stride and dilation should be greater than zero, but got stride={list(stride)} and "
                           f"dilation={list(dilation)}")
    for k, p, d in zip(kernel, pad, dilation, strict=True):
        if p < 0 or p > ((k - 1) * d + 1) // 2:
            raise RuntimeError(f"pad should be at most half of effective kernel size, but got pad={p}, kernel_size={k} "
                               f"and dilation={d}")
    spatial = x.shape[2:]
    out = tuple(_pool_output_size(*args, ceil_mode) for args in zip(spatial, kernel, stride, pad, dilation, strict=True))
    if any(o < 1 for o in out):
        sizes = lambda dims: "x".join(map(str, (x.shape[1], *dims)))  # noqa: E731
        raise RuntimeError(f"Given input size: ({sizes(spatial)}). Calculated output size: ({sizes(out)}). Output size is too small")
    return out


# -- window tables (NOTE [Max pooling picks one element]) ------------------------------
def _strided_windows(size: int, out: int, kernel: int, stride: int, pad: int, dilation: int) -> np.ndarray:
    """``(out, kernel)`` input positions of each window along one dim; -1 where it reads padding."""
    pos = np.arange(out)[:, None] * stride - pad + np.arange(kernel)[None, :] * dilation
    return np.where((pos >= 0) & (pos < size), pos, -1)


def _adaptive_bounds(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's adaptive windows: ``[floor(i * size / out), ceil((i + 1) * size / out))``."""
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def _adaptive_windows(size: int, out: int) -> np.ndarray:
    start, end = _adaptive_bounds(size, out)
    width = int((end - start).max())
    pos = start[:, None] + np.arange(width)[None, :]
    return np.where(pos < end[:, None], pos, -1)


def _flat_table(per_dim: Sequence[np.ndarray], sizes: Sequence[int]) -> np.ndarray:
    """Per-dim window positions combined into ``(prod(out), prod(kernel))`` flat positions, row-major; -1 for padding."""
    table = np.zeros((1, 1), np.int64)
    for positions, size in zip(per_dim, sizes, strict=True):
        combined = table[:, None, :, None] * size + positions[None, :, None, :]
        invalid = (table[:, None, :, None] < 0) | (positions[None, :, None, :] < 0)
        table = np.where(invalid, -1, combined).reshape(table.shape[0] * positions.shape[0], -1)
    return table


@jax.jit
def _first_argmax(x: Any, table: Any) -> Any:
    """The flat position of each window's first maximum (NaN counts as the maximum, as PyTorch's)."""
    values = x[..., jnp.maximum(table, 0)]
    lowest = -jnp.inf if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.iinfo(x.dtype).min
    values = jnp.where(table >= 0, values, jnp.asarray(lowest, x.dtype))
    pick = jnp.argmax(values, axis=-1, keepdims=True)
    return jnp.take_along_axis(jnp.broadcast_to(table, values.shape), pick, axis=-1)[..., 0]


def _max_over_windows(x: Tensor, table: np.ndarray, out: tuple[int, ...]) -> PoolWithIndices:
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    index = Tensor(_first_argmax(flat.array, jnp.asarray(table)).astype(jax.dtypes.canonicalize_dtype(jnp.int64)))
    return PoolWithIndices(tie_to_input(gather(flat, 2, index).reshape(n, c, *out), x), index.reshape(n, c, *out))


def _finish(result: PoolWithIndices, unbatched: bool, return_indices: bool) -> Any:
    if unbatched:
        result = PoolWithIndices(result.values.squeeze(0), result.indices.squeeze(0))
    return result if return_indices else result.values


_MAX_POOL_INPUT = {
    1: "max_pool1d: Expected 2D or 3D (batch mode) tensor with optional 0 dim batch size for input, but got:{shape}",
    2: "non-empty 3D or 4D (batch mode) tensor expected for input",
    3: "non-empty 4D or 5D (batch mode) tensor expected for input",
}


def _max_pool(
    n_spatial: int, x: Tensor, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool,
    return_indices: bool,
) -> Any:
    name = f"max_pool{n_spatial}d"
    kernel = _ints(kernel_size, n_spatial, "kernel_size", name)
    strides = _ints(stride, n_spatial, "stride", name, allow_none=True) or kernel
    pad = _ints(padding, n_spatial, "padding", name)
    dil = _ints(dilation, n_spatial, "dilation", name)
    x, unbatched = _spatial_input(x, n_spatial, name, _MAX_POOL_INPUT[n_spatial])
    out = _check_window(name, x, kernel, strides, pad, dil, ceil_mode)
    table = _strided_table(x.shape[2:], out, kernel, strides, pad, dil)
    return _finish(_max_over_windows(x, table, out), unbatched, return_indices)


@functools.lru_cache(maxsize=256)
def _strided_table(
    sizes: tuple[int, ...], out: tuple[int, ...], kernel: tuple[int, ...], stride: tuple[int, ...], pad: tuple[int, ...],
    dilation: tuple[int, ...],
) -> np.ndarray:
    per_dim = [_strided_windows(*args) for args in zip(sizes, out, kernel, stride, pad, dilation, strict=True)]
    return _flat_table(per_dim, sizes)


def max_pool1d(
    input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """``F.max_pool1d`` over ``(N, C, L)`` or ``(C, L)`` input; ``stride`` defaults to ``kernel_size``.

    The gradient goes to the first maximum of each window (NOTE [Max pooling picks one element]).

    >>> import xgrad
    >>> xgrad.max_pool1d(xgrad.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]]), 2).tolist()
    [[3.0, 2.0]]
    """
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool2d(
    input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """``F.max_pool2d`` over ``(N, C, H, W)`` or ``(C, H, W)`` input; ``return_indices`` gives flat ``h * W + w`` indices.

    >>> import xgrad
    >>> x = xgrad.arange(16.0).reshape(1, 4, 4)
    >>> values, indices = xgrad.max_pool2d(x, 2, return_indices=True)
    >>> values.tolist(), indices.tolist()
    ([[[5.0, 7.0], [13.0, 15.0]]], [[[5, 7], [13, 15]]])
    """
    return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


def max_pool3d(
    input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """``F.max_pool3d`` over ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input; indices are flat ``(d * H + h) * W + w``.

    >>> import xgrad
    >>> xgrad.max_pool3d(xgrad.arange(8.0).reshape(1, 2, 2, 2), 2).flatten().tolist()
    [7.0]
    """
    return _max_pool(3, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)


# -- average pools ---------------------------------------------------------------------
def _window_sum_impl(x: Any, window: tuple[int, ...], strides: tuple[int, ...], padding: tuple[tuple[int, int], ...]) -> Any:
    # A concrete zero: JAX then knows the reduction as a window sum, with its transpose (the rule).
    return jax.lax.reduce_window(x, np.zeros((), x.dtype), jax.lax.add, window, strides, padding)


def _window_sum_grad(g: Tensor, out: Any, x: Any, **params: Any) -> Any:
    return vjp_of("window_sum", _window_sum_impl, **params)(g, x)


_window_sum = defprim("window_sum", _window_sum_impl, (_window_sum_grad,))


def _avg_divisor(size: int, out: int, kernel: int, stride: int, pad: int, count_include_pad: bool) -> np.ndarray:
    """PyTorch's divisor along one dim: the window clipped to the padded input, or to the input alone."""
    start = np.arange(out) * stride - pad
    end = np.minimum(start + kernel, size + pad)
    if count_include_pad:
        return end - start
    return np.minimum(end, size) - np.maximum(start, 0)


def _avg_pool(
    n_spatial: int, x: Tensor, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool, count_include_pad: bool,
    divisor_override: int | None,
) -> Tensor:
    name = f"avg_pool{n_spatial}d"
    kernel = _ints(kernel_size, n_spatial, "kernel_size", name)
    strides = _ints(stride, n_spatial, "stride", name, allow_none=True) or kernel
    pad = _ints(padding, n_spatial, "padding", name)
    message = ("Expected 2D or 3D (batch mode) tensor with optional 0 dim batch size for input" if n_spatial == 1
               else _MAX_POOL_INPUT[n_spatial])
    x, unbatched = _spatial_input(x, n_spatial, name, message)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise NotImplementedError(f"{name} of integer input is not supported (PyTorch truncates the mean); convert it "
                                  "with .float() first")
    ones = (1,) * n_spatial
    out = _check_window(name, x, kernel, strides, pad, ones, ceil_mode)
    if divisor_override is not None and divisor_override == 0:
        raise RuntimeError("divisor must be not zero")
    sizes = x.shape[2:]
    # The reduce_window padding: the left pad, and on the right what the last window needs (ceil_mode reaches past it).
    spans = [((o - 1) * s + k - size - p) for o, s, k, size, p in zip(out, strides, kernel, sizes, pad, strict=True)]
    window_padding = ((0, 0), (0, 0), *((p, max(span, 0)) for p, span in zip(pad, spans, strict=True)))
    summed = _window_sum(x, window=(1, 1, *kernel), strides=(1, 1, *strides), padding=window_padding)
    summed = summed[(slice(None), slice(None), *(slice(0, o) for o in out))]
    if divisor_override is not None:
        result = summed / float(divisor_override)
    else:
        divisor = np.ones((), np.float64)
        for args in zip(sizes, out, kernel, strides, pad, strict=True):
            divisor = np.multiply.outer(divisor, _avg_divisor(*args, count_include_pad))
        result = summed / constant_like(divisor, x)
    result = tie_to_input(result, x)
    return result.squeeze(0) if unbatched else result


def avg_pool1d(
    input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> Tensor:
    """``F.avg_pool1d`` over ``(N, C, L)`` or ``(C, L)`` input; zero padding counts in the mean unless ``count_include_pad=False``.

    >>> import xgrad
    >>> xgrad.avg_pool1d(xgrad.tensor([[1.0, 3.0, 2.0, 4.0]]), 2).tolist()
    [[2.0, 3.0]]
    """
    return _avg_pool(1, input, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


def avg_pool2d(
    input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
    count_include_pad: bool = True, divisor_override: int | None = None,
) -> Tensor:
    """``F.avg_pool2d`` over ``(N, C, H, W)`` or ``(C, H, W)`` input; ``divisor_override`` replaces every window's divisor.

    >>> import xgrad
    >>> xgrad.avg_pool2d(xgrad.arange(16.0).reshape(1, 4, 4), 2).tolist()
    [[[2.5, 4.5], [10.5, 12.5]]]
    """
    return _avg_pool(2, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@autocast_op
def avg_pool3d(
    input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
    count_include_pad: bool = True, divisor_override: int | None = None,
) -> Tensor:
    """``F.avg_pool3d`` over ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input, with ``avg_pool2d``'s options.

    >>> import xgrad
    >>> xgrad.avg_pool3d(xgrad.arange(8.0).reshape(1, 2, 2, 2), 2).flatten().tolist()
    [3.5]
    """
    return _avg_pool(3, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


# -- adaptive pools --------------------------------------------------------------------
def _adaptive_sizes(output_size: Any, sizes: tuple[int, ...], name: str) -> tuple[int, ...]:
    n = len(sizes)
    items = [output_size] if not isinstance(output_size, Sequence) else list(output_size)
    if n > 1 and len(items) == 1 and not isinstance(output_size, Sequence):
        items = items * n
    if len(items) != n:
        raise RuntimeError(f"{name}(): internal error: output_size.size() must be {n}")
    out = tuple(size if o is None else operator.index(o) for o, size in zip(items, sizes, strict=True))
    if any(o < 0 for o in out):
        raise RuntimeError(f"{name}(): elements of output_size must be greater than or equal to 0 but received {list(out)}")
    return out


def _adaptive_input(x: Tensor, n_spatial: int, name: str) -> tuple[Tensor, bool]:
    if x.ndim not in (n_spatial + 1, n_spatial + 2):
        if n_spatial == 1:
            raise RuntimeError(f"Expected 2 to 3 dimensions, but got {x.ndim}-dimensional tensor for argument #1 'self' "
                               f"(while checking arguments for {name})")
        raise RuntimeError(f"{name}(): Expected {n_spatial + 1}D or {n_spatial + 2}D tensor, but got {list(x.shape)}")
    return (x.unsqueeze(0), True) if x.ndim == n_spatial + 1 else (x, False)


def _averaging_matrix(size: int, out: int, like: Tensor) -> Tensor:
    start, end = _adaptive_bounds(size, out)
    cols = np.arange(size)[None, :]
    inside = (cols >= start[:, None]) & (cols < end[:, None])
    matrix = inside / np.maximum(end - start, 1)[:, None]
    return constant_like(matrix, like)


def _adaptive_avg_pool(x: Tensor, output_size: Any, n_spatial: int) -> Tensor:
    name = f"adaptive_avg_pool{n_spatial}d"
    x, unbatched = _adaptive_input(x, n_spatial, name)
    shape_rules.check_float(x, name)
    out = _adaptive_sizes(output_size, x.shape[2:], name)
    if n_spatial == 1:
        result = x @ _averaging_matrix(x.shape[2], out[0], x).mT
    elif n_spatial == 2:
        rows = _averaging_matrix(x.shape[2], out[0], x)
        result = rows @ x @ _averaging_matrix(x.shape[3], out[1], x).mT
    else:
        result = einsum("ncdhw,id,jh,kw->ncijk", x, *(_averaging_matrix(x.shape[d], out[d - 2], x) for d in (2, 3, 4)))
    result = tie_to_input(result, x)
    return result.squeeze(0) if unbatched else result


def adaptive_avg_pool1d(input: Tensor, output_size: Any) -> Tensor:
    """``F.adaptive_avg_pool1d``: the mean over PyTorch's adaptive windows of ``(N, C, L)`` or ``(C, L)`` input.

    >>> import xgrad
    >>> xgrad.adaptive_avg_pool1d(xgrad.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]]), 2).tolist()
    [[2.0, 4.0]]
    """
    return _adaptive_avg_pool(input, output_size, 1)


def adaptive_avg_pool2d(input: Tensor, output_size: Any) -> Tensor:
    """``F.adaptive_avg_pool2d`` over ``(N, C, H, W)`` or ``(C, H, W)`` input; ``None`` in ``output_size`` keeps that size.

    >>> import xgrad
    >>> xgrad.adaptive_avg_pool2d(xgrad.arange(16.0).reshape(1, 4, 4), 1).tolist()
    [[[7.5]]]
    """
    return _adaptive_avg_pool(input, output_size, 2)


@functools.lru_cache(maxsize=256)
def _adaptive_table(sizes: tuple[int, ...], out: tuple[int, ...]) -> np.ndarray:
    return _flat_table([_adaptive_windows(s, o) for s, o in zip(sizes, out, strict=True)], sizes)


def adaptive_avg_pool3d(input: Tensor, output_size: Any) -> Tensor:
    """``F.adaptive_avg_pool3d`` over ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input.

    >>> import xgrad
    >>> xgrad.adaptive_avg_pool3d(xgrad.arange(8.0).reshape(1, 2, 2, 2), 1).flatten().tolist()
    [3.5]
    """
    return _adaptive_avg_pool(input, output_size, 3)


def adaptive_max_pool2d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """``F.adaptive_max_pool2d``: the maximum over PyTorch's adaptive windows, its gradient to the first maximum.

    >>> import xgrad
    >>> xgrad.adaptive_max_pool2d(xgrad.arange(9.0).reshape(1, 3, 3), 2).tolist()
    [[[4.0, 5.0], [7.0, 8.0]]]
    """
    return _adaptive_max_pool(input, output_size, return_indices, 2)


def adaptive_max_pool3d(input: Tensor, output_size: Any, return_indices: bool = False) -> Any:
    """``F.adaptive_max_pool3d`` over ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input.

    >>> import xgrad
    >>> xgrad.adaptive_max_pool3d(xgrad.arange(8.0).reshape(1, 2, 2, 2), 1).flatten().tolist()
    [7.0]
    """
    return _adaptive_max_pool(input, output_size, return_indices, 3)


def _adaptive_max_pool(input: Tensor, output_size: Any, return_indices: bool, n_spatial: int) -> Any:
    name = f"adaptive_max_pool{n_spatial}d"
    x, unbatched = _adaptive_input(input, n_spatial, name)
    out = _adaptive_sizes(output_size, x.shape[2:], name)
    if 0 in x.shape[2:] or 0 in out:
        raise RuntimeError(f"{name}(): Expected input to have non-zero size for non-batch dimensions, but input has "
                           f"sizes {list(input.shape)} with dimension {x.shape.index(0)} being empty")
    table = _adaptive_table(tuple(x.shape[2:]), out)
    return _finish(_max_over_windows(x, table, out), unbatched, return_indices)
