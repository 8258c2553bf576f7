"""PyTorch ops written with other xgrad ops: ``take``, ``vstack``, ``cov`` and in-place ``squeeze_``.

Their gradients are those of the ops they are made of.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from xgrad.ops.complex import conj
from xgrad.ops.elementwise import clamp_min
from xgrad.ops.index import getitem
from xgrad.ops.shape import cat, reshape, squeeze
from xgrad.tensor import Tensor

__all__ = ["cov", "squeeze_", "take", "vstack"]


def take(x: Tensor, index: Any) -> Tensor:
    """The entries of ``x`` read as one flat row at ``index`` (any shape; negative counts from the end).

    >>> import xgrad
    >>> xgrad.take(xgrad.tensor([[1.0, 2.0], [3.0, 4.0]]), xgrad.tensor([[0, 3], [-1, 1]])).tolist()
    [[1.0, 4.0], [4.0, 2.0]]
    """
    index_array = index._array if isinstance(index, Tensor) else jnp.asarray(index)
    if not jnp.issubdtype(index_array.dtype, jnp.integer):
        raise RuntimeError(f"take(): Expected a long tensor for index, but got {index_array.dtype}")
    return getitem(reshape(x, (-1,)), Tensor(index_array))


def vstack(tensors: Sequence[Tensor]) -> Tensor:
    """``tensors`` stacked as rows: 0-dim and 1-dim ones become rows of their own first.

    >>> import xgrad
    >>> xgrad.vstack([xgrad.tensor([1.0, 2.0]), xgrad.tensor([[3.0, 4.0]])]).tolist()
    [[1.0, 2.0], [3.0, 4.0]]
    """
    if isinstance(tensors, Tensor) or not len(tensors):
        raise RuntimeError("vstack expects a non-empty TensorList")
    return cat([reshape(t, (1, -1)) if t.ndim < 2 else t for t in tensors], 0)


def cov(x: Tensor, *, correction: int = 1, fweights: Tensor | None = None, aweights: Tensor | None = None) -> Tensor:
    """The covariance matrix of the rows of ``x`` (variables) over its columns (observations), as ``torch.cov``.

    ``fweights`` (integer repeat counts) and ``aweights`` (importance weights) weight the
    observations; ``correction`` is subtracted from their total weight (1: Bessel's).

    >>> import xgrad
    >>> xgrad.cov(xgrad.tensor([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])).tolist()
    [[1.0, -1.0], [-1.0, 1.0]]
    """
    if x.ndim > 2:
        raise ValueError(f"cov(): expected input to have two or fewer dimensions but got an input with {x.ndim} dimensions")
    rows = reshape(x, (1, -1)) if x.ndim < 2 else x
    observations = rows.shape[1]
    weights = None
    for name, w in (("fweights", fweights), ("aweights", aweights)):
        if w is None:
            continue
        if w.ndim > 1:
            raise ValueError(f"cov(): expected {name} to have one or fewer dimensions but got {name} with {w.ndim} dimensions")
        if w.numel() != observations:
            raise ValueError(f"cov(): expected {name} to have the same numel as there are observations in the input but "
                             f"got {w.numel()} != {observations}")
        weights = w if weights is None else weights * w
    if weights is None:
        total: Any = observations
        mean = rows.mean(1, keepdim=True)
        norm: Any = observations - correction
    else:
        total = weights.sum()
        mean = (rows * weights).sum(1, keepdim=True) / total
        if correction == 0:
            norm = total
        elif aweights is None:
            norm = total - correction
        else:
            norm = total - correction * (weights * aweights).sum() / total
    norm = clamp_min(norm, 0) if isinstance(norm, Tensor) else max(norm, 0)
    centered = rows - mean
    weighted = centered if weights is None else centered * weights
    out = (weighted @ conj(centered).mT) / norm
    return squeeze(out) if x.ndim < 2 else out


def squeeze_(x: Tensor, dim: Any = None) -> Tensor:
    """In-place ``squeeze``: ``x`` itself takes the squeezed shape (and history).

    Views and tensors with views keep their shapes tied to their base's, and a dual
    tensor's tangent would keep the old shape: those raise.

    >>> import xgrad
    >>> x = xgrad.zeros(1, 3, 1)
    >>> x.squeeze_(0) is x, x.shape
    (True, (3, 1))
    """
    x._check_inplace()
    if x._view is not None or x._views is not None or x._alias_of is not None or x._fw_grad is not None:
        raise RuntimeError(
            "squeeze_(): in-place squeeze of a view, of a tensor with views or of a dual tensor is not supported: "
            "use the out-of-place x = x.squeeze(...) instead"
        )
    x._take_value(squeeze(x._alias(), dim))
    return x
