"""Reductions with PyTorch's ``dim``/``keepdim``, and ``sum_to`` (un-broadcasting)."""

from __future__ import annotations

import builtins
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from xgrad.ops import shape_rules
from xgrad.ops._util import canonical_dim, norm_axes
from xgrad.ops.autocast import autocast_op
from xgrad.ops.registry import _differentiable_dtype, defprim
from xgrad.tensor import Tensor, torch_dtype_name


def _keep(g: Tensor, x_ndim: int, axis: tuple[int, ...] | None, keepdims: bool) -> Tensor:
    """``g`` with the reduced axes put back as size 1, ready to broadcast against ``x``."""
    if keepdims or axis is None and g.ndim == x_ndim:
        return g
    if axis is None:
        return g.reshape((1,) * x_ndim)
    shape = list(g.shape)
    for a in axis:
        shape.insert(a, 1)
    return g.reshape(tuple(shape))


def _sum_grad(g: Tensor, out: Any, x: Any, axis: Any, keepdims: bool) -> Tensor:
    return _keep(g, x.ndim, axis, keepdims).broadcast_to(x.shape)


_sum = defprim("sum", lambda x, axis, keepdims: jnp.sum(x, axis=axis, keepdims=keepdims), (_sum_grad,), save=())


def _extremum_grad(g: Tensor, out: Tensor, x: Tensor, axis: Any, keepdims: bool) -> Tensor:
    # The gradient is shared evenly between tied extrema, as PyTorch's amax/amin do
    # (its scale_grad_by_count): a slice whose extremum is NaN matches no entry, so its
    # gradient is 0/0 = NaN throughout, as in PyTorch.
    mask = x.eq(_keep(out, x.ndim, axis, keepdims)).astype(g.dtype)
    count = mask.sum(dim=axis, keepdim=True)
    return _keep(g, x.ndim, axis, keepdims) * mask / count


_amax = defprim(
    "amax", lambda x, axis, keepdims: jnp.max(x, axis=axis, keepdims=keepdims), (_extremum_grad,), save_out=True,
    shape_rule=shape_rules.nonempty_reduction("amax"),
)
_amin = defprim(
    "amin", lambda x, axis, keepdims: jnp.min(x, axis=axis, keepdims=keepdims), (_extremum_grad,), save_out=True,
    shape_rule=shape_rules.nonempty_reduction("amin"),
)


def _evenly_distribute_grad(g: Tensor, out: Tensor, x: Tensor) -> Tensor:
    # PyTorch's evenly_distribute_backward for the full max()/min(): ties share the
    # gradient, and when the result is NaN the NaN entries are the ties.
    mask = ((x == out) | (x.isnan() & out.isnan())).astype(g.dtype)
    return g * mask / mask.sum()


_max_all = defprim("max", lambda x: jnp.max(x), (_evenly_distribute_grad,), save_out=True)
_min_all = defprim("min", lambda x: jnp.min(x), (_evenly_distribute_grad,), save_out=True)


def _logsumexp_grad(g: Tensor, out: Tensor, x: Tensor, axis: Any, keepdims: bool) -> Tensor:
    return _keep(g, x.ndim, axis, keepdims) * (x - _keep(out, x.ndim, axis, keepdims)).exp()


_logsumexp = defprim(
    "logsumexp",
    lambda x, axis, keepdims: jax.nn.logsumexp(x, axis=axis, keepdims=keepdims),
    (_logsumexp_grad,),
    save_out=True,
)


def _prod_grad(g: Tensor, out: Any, x: Tensor, axis: Any, keepdims: bool) -> Tensor:
    # jax's own rule for prod is exact where some x_j are zero; reuse it, differentiably.
    from xgrad.ops.jaxop import vjp_of

    return vjp_of("prod", _prod_impl, axis=axis, keepdims=keepdims)(g, x)


def _prod_impl(x: Any, axis: Any, keepdims: bool) -> Any:
    return jnp.prod(x, axis=axis, keepdims=keepdims)


_prod = defprim("prod", _prod_impl, (_prod_grad,))


def _cumsum_grad(g: Tensor, out: Any, x: Any, axis: int) -> Tensor:
    return g.flip(axis).cumsum(axis).flip(axis)


_cumsum = defprim("cumsum", lambda x, axis: jnp.cumsum(x, axis=axis), (_cumsum_grad,), save=())


@autocast_op
def sum(x: Tensor, dim: Any = None, keepdim: bool = False, dtype: Any = None, *, axis: Any = None, keepdims: bool | None = None) -> Tensor:
    """Sum over ``dim`` (all dims when ``None``).

    >>> import xgrad
    >>> x = xgrad.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> xgrad.sum(x).item(), xgrad.sum(x, dim=0).tolist()
    (10.0, [4.0, 6.0])
    """
    dim, keepdim = _dims(dim, keepdim, axis, keepdims)
    if dtype is not None:
        x = x.to(dtype)
    return _sum(x, axis=_axes(dim, x), keepdims=keepdim)


@autocast_op
def mean(x: Tensor, dim: Any = None, keepdim: bool = False, *, axis: Any = None, keepdims: bool | None = None) -> Tensor:
    """Mean over ``dim`` (all dims when ``None``).

    >>> import xgrad
    >>> xgrad.mean(xgrad.tensor([[1.0, 2.0], [3.0, 4.0]]), dim=1).tolist()
    [1.5, 3.5]
    """
    if not _differentiable_dtype(x.dtype):  # JAX would average integers as floats
        raise RuntimeError(
            "mean(): could not infer output dtype. Input dtype must be either a floating point or complex dtype. "
            f"Got: {torch_dtype_name(x.dtype)}"
        )
    dim, keepdim = _dims(dim, keepdim, axis, keepdims)
    axes = _axes(dim, x)
    n = x.numel() if axes is None else _count(x.shape, axes)
    return _sum(x, axis=axes, keepdims=keepdim) / n




def _axes(dim: Any, x: Tensor) -> tuple[int, ...] | None:
    """``norm_axes``, with PyTorch's rule that dim 0 (or -1) of a 0-dim tensor reduces nothing."""
    axes = norm_axes(dim, x.ndim)
    return () if axes is not None and x.ndim == 0 else axes


def _dims(dim: Any, keepdim: bool, axis: Any, keepdims: bool | None) -> tuple[Any, bool]:
    """PyTorch's ``dim``/``keepdim`` or NumPy's ``axis``/``keepdims``, whichever was given."""
    if axis is not None:
        if dim is not None:
            raise TypeError("pass either dim= or axis=, not both")
        dim = axis
    return dim, keepdim if keepdims is None else keepdims


def _count(shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
    n = 1
    for a in axes:
        n *= shape[a]
    return n


@autocast_op
def var(
    x: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, *, correction: int | None = None,
    axis: Any = None, keepdims: bool | None = None, ddof: int | None = None,
) -> Tensor:
    """Variance over ``dim``; ``correction`` (default 1, Bessel's) as in PyTorch.

    NumPy's ``axis``/``keepdims``/``ddof`` work too; ``ddof`` defaults to 0 as in NumPy
    when ``axis`` is given.

    >>> import xgrad
    >>> xgrad.var(xgrad.tensor([1.0, 2.0, 3.0])).item()
    1.0
    """
    if not _differentiable_dtype(x.dtype):
        raise RuntimeError("std and var only support floating point and complex dtypes")
    if correction is None and (axis is not None or ddof is not None):
        correction = 0 if ddof is None else ddof
    dim, keepdim = _dims(dim, keepdim, axis, keepdims)
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    axes = _axes(dim, x)
    n = x.numel() if axes is None else _count(x.shape, axes)
    centered = x - mean(x, dim=axes, keepdim=True)
    return _sum(centered * centered, axis=axes, keepdims=keepdim) / builtins.max(n - correction, 0)


def _std_of_var_grad(g: Tensor, out: Tensor, v: Any) -> Tensor:
    # PyTorch's std_backward: 0 where the result is 0 (a constant slice), not g / 0.
    from xgrad.ops.elementwise import where

    return where(out == 0, 0.0, g / (out * 2))


# The square root that ends ``std``, with PyTorch's gradient at 0.
_std_of_var = defprim("std", jnp.sqrt, (_std_of_var_grad,), save=(), save_out=True)


@autocast_op
def std(
    x: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False, *, correction: int | None = None,
    axis: Any = None, keepdims: bool | None = None, ddof: int | None = None,
) -> Tensor:
    """Standard deviation over ``dim``; ``correction`` (and the NumPy keywords) as in ``var``.

    >>> import xgrad
    >>> xgrad.std(xgrad.tensor([1.0, 3.0]), correction=0).item()
    1.0
    """
    return _std_of_var(var(x, dim, unbiased, keepdim, correction=correction, axis=axis, keepdims=keepdims, ddof=ddof))


@autocast_op
def prod(x: Tensor, dim: Any = None, keepdim: bool = False, *, axis: Any = None, keepdims: bool | None = None) -> Tensor:
    """Product over ``dim`` (all dims when ``None``); exact gradients with zeros.

    >>> import xgrad
    >>> x = xgrad.tensor([2.0, 0.0, 3.0], requires_grad=True)
    >>> xgrad.prod(x).backward()
    >>> x.grad.tolist()
    [0.0, 6.0, 0.0]
    """
    dim, keepdim = _dims(dim, keepdim, axis, keepdims)
    return _prod(x, axis=_axes(dim, x), keepdims=keepdim)


def amax(x: Tensor, dim: Any = None, keepdim: bool = False, *, axis: Any = None, keepdims: bool | None = None) -> Tensor:
    """Maximum over ``dim``; ties share the gradient evenly.

    >>> import xgrad
    >>> xgrad.amax(xgrad.tensor([[1.0, 3.0], [4.0, 2.0]]), dim=1).tolist()
    [3.0, 4.0]
    """
    dim, keepdim = _dims(dim, keepdim, axis, keepdims)
    return _amax(x, axis=_axes(dim, x), keepdims=keepdim)


def amin(x: Tensor, dim: Any = None, keepdim: bool = False, *, axis: Any = None, keepdims: bool | None = None) -> Tensor:
    """Minimum over ``dim``; ties share the gradient evenly.

    >>> import xgrad
    >>> xgrad.amin(xgrad.tensor([[1.0, 3.0], [4.0, 2.0]]), dim=1).tolist()
    [1.0, 2.0]
    """
    dim, keepdim = _dims(dim, keepdim, axis, keepdims)
    return _amin(x, axis=_axes(dim, x), keepdims=keepdim)


class MaxMin(NamedTuple):
    values: Tensor
    indices: Tensor


def _extremum_with_indices(x: Tensor, dim: int, keepdim: bool, arg: Any, name: str) -> MaxMin:
    # The whole gradient goes to the selected index (PyTorch's value_selecting_reduction_backward).
    from xgrad.ops.index import _gather

    axis = canonical_dim(dim, x.ndim)
    if x.ndim == 0:
        idx = Tensor(jnp.zeros((), int))
        return MaxMin(_gather(x, idx, dim=0), idx)
    if x.shape[axis] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {axis} to have non-zero size.")
    idx = Tensor(jnp.expand_dims(arg(x._array, axis=axis), axis))
    values = _gather(x, idx, dim=axis)
    if not keepdim:
        values = values.squeeze(axis)
        idx = idx.squeeze(axis)
    return MaxMin(values, idx)


def _check_nonempty(x: Tensor, name: str) -> None:
    if x.numel() == 0:
        raise RuntimeError(
            f"{name}(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument."
        )


def max(x: Tensor, dim: int | None = None, keepdim: bool = False, *, axis: Any = None, keepdims: bool | None = None) -> Any:
    """With ``dim``: ``(values, indices)``, the gradient to the chosen index; without: ``amax``;
    with a tensor in place of ``dim``: the elementwise ``maximum``.

    NumPy's ``axis=``/``keepdims=`` give ``jnp.max``'s result instead: the values alone.

    >>> import xgrad
    >>> values, indices = xgrad.max(xgrad.tensor([[1.0, 3.0], [4.0, 2.0]]), dim=1)
    >>> values.tolist(), indices.tolist()
    ([3.0, 4.0], [1, 0])
    """
    if axis is not None or keepdims is not None:
        return amax(x, dim, keepdim, axis=axis, keepdims=keepdims)
    if isinstance(dim, Tensor):  # max(input, other): PyTorch's elementwise maximum
        from xgrad.ops.elementwise import maximum

        return maximum(x, dim)
    if dim is None:
        _check_nonempty(x, "max")
        return _max_all(x)
    return _extremum_with_indices(x, dim, keepdim, jnp.argmax, "max")


def min(x: Tensor, dim: int | None = None, keepdim: bool = False, *, axis: Any = None, keepdims: bool | None = None) -> Any:
    """With ``dim``: ``(values, indices)``, the gradient to the chosen index; without: ``amin``;
    with a tensor in place of ``dim``: the elementwise ``minimum``.

    NumPy's ``axis=``/``keepdims=`` give ``jnp.min``'s result instead: the values alone.

    >>> import xgrad
    >>> values, indices = xgrad.min(xgrad.tensor([[1.0, 3.0], [4.0, 2.0]]), dim=1)
    >>> values.tolist(), indices.tolist()
    ([1.0, 2.0], [0, 1])
    """
    if axis is not None or keepdims is not None:
        return amin(x, dim, keepdim, axis=axis, keepdims=keepdims)
    if isinstance(dim, Tensor):  # min(input, other): PyTorch's elementwise minimum
        from xgrad.ops.elementwise import minimum

        return minimum(x, dim)
    if dim is None:
        _check_nonempty(x, "min")
        return _min_all(x)
    return _extremum_with_indices(x, dim, keepdim, jnp.argmin, "min")


@autocast_op
def logsumexp(x: Tensor, dim: Any = None, keepdim: bool = False, *, axis: Any = None, keepdims: bool | None = None) -> Tensor:
    """``log(sum(exp(x)))`` over ``dim``, computed stably.

    >>> import xgrad
    >>> round(xgrad.logsumexp(xgrad.tensor([0.0, 0.0])).item(), 4)
    0.6931
    """
    dim, keepdim = _dims(dim, keepdim, axis, keepdims)
    return _logsumexp(x, axis=_axes(dim, x), keepdims=keepdim)


@autocast_op
def cumsum(x: Tensor, dim: int) -> Tensor:
    """Cumulative sum along ``dim``.

    >>> import xgrad
    >>> xgrad.cumsum(xgrad.tensor([1.0, 2.0, 3.0]), dim=0).tolist()
    [1.0, 3.0, 6.0]
    """
    axis = canonical_dim(dim, x.ndim)
    if x.ndim == 0:
        return _cumsum(x.reshape(1), axis=0).reshape(())
    return _cumsum(x, axis=axis)


def sum_to(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum ``x`` down to ``shape``, undoing a broadcast (the one place this is written).

    >>> import xgrad
    >>> xgrad.sum_to(xgrad.ones(2, 3), (1, 3)).tolist()
    [[2.0, 2.0, 2.0]]
    """
    shape = tuple(shape)
    if x.shape == shape:
        return x
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape) if s == 1 and x.shape[i + lead] != 1)
    out = _sum(x, axis=axes, keepdims=True) if axes else x
    return out.reshape(shape)


def _arg_axis(dim: int | None, x: Tensor, name: str) -> int | None:
    """``dim`` checked for ``argmax``/``argmin`` (``None`` for a 0-dim input: its only element)."""
    if x.dtype == jnp.bool_:
        raise RuntimeError(f"{name}(): does not support bool input")
    if dim is None:
        _check_nonempty(x, name)
        return None
    axis = canonical_dim(dim, x.ndim)
    if x.ndim and x.shape[axis] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {axis} to have non-zero size.")
    return axis if x.ndim else None


def argmax(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the maximum (non-differentiable).

    >>> import xgrad
    >>> xgrad.argmax(xgrad.tensor([[1.0, 3.0], [4.0, 2.0]]), dim=1).tolist()
    [1, 0]
    """
    return Tensor(jnp.argmax(x._array, axis=_arg_axis(dim, x, "argmax"), keepdims=keepdim))


def argmin(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the minimum (non-differentiable).

    >>> import xgrad
    >>> xgrad.argmin(xgrad.tensor([[1.0, 3.0], [4.0, 2.0]]), dim=1).tolist()
    [0, 1]
    """
    return Tensor(jnp.argmin(x._array, axis=_arg_axis(dim, x, "argmin"), keepdims=keepdim))
