"""Masks and orderings: ``masked_fill``, ``masked_select``, ``topk`` (composites whose
gradients follow the picked elements), and the non-differentiable ``nonzero``, ``any``,
``all``, ``argsort`` and ``one_hot``."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from xgrad.ops._util import as_array, canonical_dim, check_int, check_values, norm_axes
from xgrad.ops.elementwise import where
from xgrad.ops.index import gather
from xgrad.ops.shape import broadcast_to
from xgrad.ops.shape_rules import broadcast_shapes
from xgrad.tensor import Tensor

__all__ = ["all", "any", "argsort", "masked_fill", "masked_select", "nonzero", "one_hot", "topk"]


def _bool_mask(mask: Any, op: str) -> Any:
    array = jnp.asarray(as_array(mask))
    if array.dtype != jnp.bool_:
        raise RuntimeError(f"{op} only supports boolean masks, but got mask with dtype {array.dtype}")
    return array


def masked_fill(x: Tensor, mask: Any, value: Any) -> Tensor:
    """``x`` with ``value`` where the boolean ``mask`` is true (``x`` and ``mask`` broadcast together).

    The gradient reaches ``x`` where the mask is false, and a 0-dim tensor ``value``
    through the filled elements.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 2.0, 3.0])
    >>> xgrad.masked_fill(x, x > 1.5, 0.0).tolist()
    [1.0, 0.0, 0.0]
    """
    mask_array = _bool_mask(mask, "masked_fill_")
    if isinstance(value, Tensor):
        if value.ndim:
            raise RuntimeError(
                f"masked_fill_ only supports a 0-dimensional value tensor, but got tensor with {value.ndim} dimension(s)."
            )
        fill = value.to(x.dtype)
    else:
        fill = Tensor(jnp.asarray(value, dtype=x.dtype))
    # Out of place, x and mask broadcast together (as PyTorch's expand_outplace); the
    # in-place masked_fill_ then refuses a result larger than x.
    return where(mask_array, fill, x)


def masked_select(x: Tensor, mask: Any) -> Tensor:
    """The elements of ``x`` where ``mask`` is true, as a 1-D tensor (both broadcast first).

    The result's size depends on the mask's values; the gradient is scattered back to
    the selected positions.

    >>> import xgrad
    >>> x = xgrad.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> xgrad.masked_select(x, x > 2.5).tolist()
    [3.0, 4.0]
    """
    mask_array = _bool_mask(mask, "masked_select")
    shape = broadcast_shapes(x.shape, mask_array.shape)
    return broadcast_to(x, shape)[jnp.broadcast_to(mask_array, shape)]


def nonzero(x: Any, *, as_tuple: bool = False) -> Any:
    """Indices of the non-zero elements: an ``(n, ndim)`` integer tensor, or one 1-D tensor per dim.

    Non-differentiable (integer output).

    >>> import xgrad
    >>> xgrad.nonzero(xgrad.tensor([[0.0, 1.0], [2.0, 0.0]])).tolist()
    [[0, 1], [1, 0]]
    >>> [t.tolist() for t in xgrad.nonzero(xgrad.tensor([0.0, 3.0]), as_tuple=True)]
    [[1]]
    """
    array = jnp.asarray(as_array(x))
    if array.ndim == 0 and not as_tuple:  # as PyTorch: one row if the scalar is non-zero, no columns
        return Tensor(jnp.zeros((int(array != 0), 0), dtype=jnp.asarray(0).dtype))
    index = jnp.nonzero(jnp.atleast_1d(array))  # as_tuple treats a scalar as a 1-element vector
    if as_tuple:
        return tuple(Tensor(i) for i in index)
    return Tensor(jnp.stack(index, axis=1))


def _truth_reduction(fn: Any, x: Any, dim: Any, keepdim: bool) -> Tensor:
    array = jnp.asarray(as_array(x))
    axes = norm_axes(dim, array.ndim)
    if axes is not None and array.ndim == 0:
        axes = ()
    return Tensor(fn(array != 0, axis=axes, keepdims=keepdim))


def any(x: Any, dim: Any = None, keepdim: bool = False) -> Tensor:
    """Whether any element (along ``dim``) is non-zero; a boolean tensor, non-differentiable.

    >>> import xgrad
    >>> xgrad.any(xgrad.tensor([[0.0, 1.0], [0.0, 0.0]]), dim=1).tolist()
    [True, False]
    """
    return _truth_reduction(jnp.any, x, dim, keepdim)


def all(x: Any, dim: Any = None, keepdim: bool = False) -> Tensor:
    """Whether all elements (along ``dim``) are non-zero; a boolean tensor, non-differentiable.

    >>> import xgrad
    >>> xgrad.all(xgrad.tensor([[1.0, 1.0], [0.0, 1.0]]), dim=1).tolist()
    [True, False]
    """
    return _truth_reduction(jnp.all, x, dim, keepdim)


def argsort(x: Any, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """Indices that sort ``x`` along ``dim`` (ties keep their order; ``stable`` is always met).

    >>> import xgrad
    >>> xgrad.argsort(xgrad.tensor([3.0, 1.0, 2.0]), descending=True).tolist()
    [0, 2, 1]
    """
    array = jnp.asarray(as_array(x))
    if array.ndim == 0:
        canonical_dim(dim, 0)
        return Tensor(jnp.zeros((), dtype=jnp.asarray(0).dtype))
    return Tensor(jnp.argsort(array, axis=canonical_dim(dim, array.ndim), descending=descending, stable=True))


class TopK(NamedTuple):
    values: Tensor
    indices: Tensor


def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> TopK:
    """The ``k`` largest (or smallest) elements along ``dim`` and their indices.

    The values are differentiable (the gradient goes to the picked elements); ties
    keep their index order. ``sorted=False`` returns them sorted as well.

    >>> import xgrad
    >>> values, indices = xgrad.topk(xgrad.tensor([1.0, 4.0, 2.0, 3.0]), 2)
    >>> values.tolist(), indices.tolist()
    ([4.0, 3.0], [1, 3])
    """
    check_int(k, "topk", "k", 2)
    if x.dtype == jnp.bool_:
        raise RuntimeError("topk does not support bool dtypes on CPU")
    if x.ndim == 0:  # as a 1-element vector, then back to 0-dim
        canonical_dim(dim, 0)
        values, indices = topk(x.reshape(1), k, 0, largest, sorted)
        return TopK(values.reshape(()), indices.reshape(())) if k else TopK(values, indices)
    axis = canonical_dim(dim, x.ndim)
    if not 0 <= k <= x.shape[axis]:
        raise RuntimeError("selected index k out of range")
    order = jnp.argsort(as_array(x), axis=axis, descending=largest, stable=True)
    indices = Tensor(jnp.take(order, jnp.arange(k), axis=axis))
    return TopK(gather(x, axis, indices), indices)


def one_hot(x: Any, num_classes: int = -1) -> Tensor:
    """``F.one_hot``: a trailing dim of ``num_classes`` with a 1 at each class index (integer output).

    ``num_classes=-1`` infers it as the largest index plus one. Non-differentiable.

    >>> import xgrad
    >>> xgrad.one_hot(xgrad.tensor([0, 2])).tolist()
    [[1, 0, 0], [0, 0, 1]]
    """
    array = jnp.asarray(as_array(x))
    if not jnp.issubdtype(array.dtype, jnp.integer):
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if check_int(num_classes, "one_hot", "num_classes", 2) < -1:
        raise RuntimeError(f"num_classes should be -1 or non-negative, got {num_classes}")
    if array.size:  # value checks, eager's and compiled (a given num_classes keeps the shape static)
        check_values(lambda a: (a < 0).any(), array, lambda: RuntimeError("Class values must be non-negative."))
    if num_classes == -1:
        if not array.size:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        num_classes = int(array.max()) + 1
    elif array.size:
        check_values(
            lambda a: (a >= num_classes).any(), array, lambda: RuntimeError("Class values must be smaller than num_classes.")
        )
    int_dtype = jnp.asarray(0).dtype  # int64 with x64 on, as PyTorch's LongTensor
    return Tensor((array[..., None] == jnp.arange(num_classes)).astype(int_dtype))
