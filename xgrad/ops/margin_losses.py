"""The remaining ``torch.nn.functional`` losses, as composites of xgrad ops (their gradients are
those of PyTorch's formulas): the margin losses (``soft_margin_loss``, ``hinge_embedding_loss``,
``multi_margin_loss``, ``multilabel_margin_loss``, ``multilabel_soft_margin_loss``,
``triplet_margin_loss``, with ``pairwise_distance``) and the likelihood losses
``poisson_nll_loss`` and ``gaussian_nll_loss``."""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from xgrad.ops._util import as_array, check_values, constant_like, legacy_reduction, reduce_loss, refuse_none
from xgrad.ops.activations import logsigmoid
from xgrad.ops.autocast import autocast_op
from xgrad.ops.elementwise import clamp_min, exp, log, log1p, minimum, where
from xgrad.ops.index import gather
from xgrad.ops.linalg import norm
from xgrad.ops.losses import _as_target
from xgrad.tensor import Tensor

__all__ = [
    "gaussian_nll_loss", "hinge_embedding_loss", "multi_margin_loss", "multilabel_margin_loss",
    "multilabel_soft_margin_loss", "pairwise_distance", "poisson_nll_loss", "soft_margin_loss", "triplet_margin_loss",
]


@autocast_op
def soft_margin_loss(input: Tensor, target: Any, size_average: bool | None = None, reduce: bool | None = None,
                     reduction: str = "mean") -> Tensor:
    """``F.soft_margin_loss``: ``log(1 + exp(-target * input))``, targets ``1`` or ``-1``.

    >>> import xgrad
    >>> round(xgrad.soft_margin_loss(xgrad.tensor([0.0]), xgrad.tensor([1.0])).item(), 4)
    0.6931
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    refuse_none(target, "target", 2)
    return reduce_loss(log1p(exp(-_as_target(target, input) * input)), reduction)


@autocast_op
def hinge_embedding_loss(input: Tensor, target: Any, margin: float = 1.0, size_average: bool | None = None,
                         reduce: bool | None = None, reduction: str = "mean") -> Tensor:
    """``F.hinge_embedding_loss``: ``input`` where ``target`` is 1, ``max(0, margin - input)`` where it is -1.

    >>> import xgrad
    >>> xgrad.hinge_embedding_loss(xgrad.tensor([0.3, 0.3]), xgrad.tensor([1.0, -1.0]), reduction="none").tolist()
    [0.30000001192092896, 0.699999988079071]
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    refuse_none(target, "target", 2)
    target = _as_target(target, input)
    # PyTorch's sum of two masked terms: a target neither 1 nor -1 gets both.
    loss = where(target != 1, clamp_min(margin - input, 0.0), 0.0) + where(target != -1, input, 0.0)
    return reduce_loss(loss, reduction)


def _class_scores(input: Tensor, target: Any, name: str) -> tuple[Tensor, Tensor, bool]:
    """``input`` as ``(N, C)`` and ``target`` as ``(N, ...)``, and whether they came unbatched (PyTorch's checks)."""
    refuse_none(target, "target", 2)
    target = target if isinstance(target, Tensor) else Tensor(jnp.asarray(target))
    if input.ndim > 2:
        raise RuntimeError(f"{name}: Expected non-empty vector or matrix with optional 0-dim batch size, but got: "
                           f"{list(input.shape)}")
    unbatched = input.ndim <= 1
    return (input.reshape(1, -1), target.reshape(1, -1), True) if unbatched else (input, target, False)


@autocast_op
def multi_margin_loss(input: Tensor, target: Any, p: int = 1, margin: float = 1.0, weight: Tensor | None = None,
                      size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean") -> Tensor:
    """``F.multi_margin_loss``: ``sum_{i != y} max(0, margin - x[y] + x[i])^p / C`` per sample, ``p`` 1 or 2.

    >>> import xgrad
    >>> round(xgrad.multi_margin_loss(xgrad.tensor([[0.1, 0.2, 0.4]]), xgrad.tensor([2])).item(), 4)
    0.5
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    if p not in (1, 2):
        raise ValueError("only p == 1 and p == 2 supported")
    x, t, unbatched = _class_scores(input, target, "multi_margin_loss")
    t = t.reshape(-1)
    if t.shape[0] != x.shape[0]:
        raise RuntimeError(f"inconsistent target size, expected {x.shape[0]} but got {list(t.shape)}")
    classes = x.shape[1]
    check_values(lambda a: ((a < 0) | (a >= classes)).any(), t, lambda: IndexError(f"target out of range: classes {classes}"))
    picked = gather(x, 1, t.unsqueeze(1))
    margins = clamp_min(margin - picked + x, 0.0)
    if p == 2:
        margins = margins * margins
    if weight is not None:
        margins = margins * weight[t].unsqueeze(1)
    others = Tensor(jnp.arange(classes)[None, :] != as_array(t)[:, None])
    loss = where(others, margins, 0.0).sum(dim=1) / classes
    return reduce_loss(loss.reshape(()) if unbatched else loss, reduction)


@autocast_op
def multilabel_margin_loss(input: Tensor, target: Any, size_average: bool | None = None, reduce: bool | None = None,
                           reduction: str = "mean") -> Tensor:
    """``F.multilabel_margin_loss``: the hinge ``max(0, 1 - (x[j] - x[i])) / C`` summed over each target class ``j``
    and each non-target class ``i``; ``target`` lists class indices, ended by the first ``-1``.

    >>> import xgrad
    >>> x = xgrad.tensor([[0.1, 0.2, 0.4, 0.8]])
    >>> round(xgrad.multilabel_margin_loss(x, xgrad.tensor([[3, 0, -1, 1]])).item(), 4)
    0.85
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    x, t, unbatched = _class_scores(input, target, "multilabel_margin_loss")
    if t.shape != x.shape:
        raise RuntimeError(f"inconsistent target size: {list(t.shape)} for input of size: {list(input.shape)}")
    classes = x.shape[1]
    check_values(lambda a: ((a < -1) | (a >= classes)).any(), t,
                 lambda: RuntimeError(f"multilabel_margin_loss: target values must lie in [-1, {classes - 1}]"))
    indices = jnp.asarray(as_array(t), jnp.int32)
    listed = jnp.cumprod(indices != -1, axis=1).astype(bool)  # the targets before the first -1
    chosen = jnp.where(listed, indices, 0)
    is_target = (jnp.arange(classes)[None, None, :] == chosen[:, :, None]) & listed[:, :, None]
    non_target = Tensor(~is_target.any(axis=1))
    hinge = clamp_min(1.0 - gather(x, 1, Tensor(chosen)).unsqueeze(2) + x.unsqueeze(1), 0.0)
    loss = where(Tensor(listed)[:, :, None] & non_target[:, None, :], hinge, 0.0).sum(dim=(1, 2)) / classes
    return reduce_loss(loss.reshape(()) if unbatched else loss, reduction)


def multilabel_soft_margin_loss(input: Tensor, target: Any, weight: Tensor | None = None, size_average: bool | None = None,
                                reduce: bool | None = None, reduction: str = "mean") -> Tensor:
    """``F.multilabel_soft_margin_loss``: the mean over classes of each class's logistic loss, targets 0 or 1.

    >>> import xgrad
    >>> round(xgrad.multilabel_soft_margin_loss(xgrad.tensor([[0.0, 0.0]]), xgrad.tensor([[1.0, 0.0]])).item(), 4)
    0.6931
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    refuse_none(target, "target", 2)
    target = _as_target(target, input)
    loss = -(target * logsigmoid(input) + (1 - target) * logsigmoid(-input))
    if weight is not None:
        loss = loss * weight
    return reduce_loss(loss.sum(dim=input.ndim - 1) / input.shape[-1], reduction)


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    """``F.pairwise_distance``: the ``p``-norm of ``x1 - x2 + eps`` along the last dim.

    >>> import xgrad
    >>> round(xgrad.pairwise_distance(xgrad.tensor([[3.0, 0.0]]), xgrad.tensor([[0.0, 4.0]])).item(), 4)
    5.0
    """
    return norm(x1 - x2 + eps, p, dim=max(x1.ndim, x2.ndim) - 1, keepdim=keepdim)


@autocast_op
def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0, p: float = 2,
                        eps: float = 1e-6, swap: bool = False, size_average: bool | None = None, reduce: bool | None = None,
                        reduction: str = "mean") -> Tensor:
    """``F.triplet_margin_loss``: ``max(0, margin + d(a, p) - d(a, n))`` with ``pairwise_distance``; ``swap`` takes
    the smaller of ``d(a, n)`` and ``d(p, n)``.

    >>> import xgrad
    >>> a = xgrad.tensor([[0.0, 0.0]])
    >>> round(xgrad.triplet_margin_loss(a, a + 1, a + 2).item(), 4)
    0.0
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    if not anchor.ndim == positive.ndim == negative.ndim:
        raise RuntimeError(f"The anchor, positive, and negative tensors are expected to have the same number of "
                           f"dimensions, but got: anchor {anchor.ndim}D, positive {positive.ndim}D, and negative "
                           f"{negative.ndim}D inputs")
    to_positive = pairwise_distance(anchor, positive, p, eps)
    to_negative = pairwise_distance(anchor, negative, p, eps)
    if swap:
        to_negative = minimum(to_negative, pairwise_distance(positive, negative, p, eps))
    return reduce_loss(clamp_min(margin + to_positive - to_negative, 0.0), reduction)


@autocast_op
def poisson_nll_loss(input: Tensor, target: Any, log_input: bool = True, full: bool = False,
                     size_average: bool | None = None, eps: float = 1e-8, reduce: bool | None = None,
                     reduction: str = "mean") -> Tensor:
    """``F.poisson_nll_loss``: ``exp(input) - target * input`` (``log_input``), else ``input - target * log(input + eps)``;
    ``full`` adds Stirling's term where ``target > 1``.

    >>> import xgrad
    >>> round(xgrad.poisson_nll_loss(xgrad.tensor([0.0]), xgrad.tensor([2.0])).item(), 4)
    1.0
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    refuse_none(target, "target", 2)
    target = _as_target(target, input)
    loss = exp(input) - target * input if log_input else input - target * log(input + eps)
    if full:
        stirling = target * log(target) - target + 0.5 * log(2 * math.pi * target)
        loss = loss + where(target > 1, stirling, 0.0)
    return reduce_loss(loss, reduction)


def gaussian_nll_loss(input: Tensor, target: Any, var: Any, full: bool = False, eps: float = 1e-6,
                      reduction: str = "mean") -> Tensor:
    """``F.gaussian_nll_loss``: ``0.5 * (log(var) + (input - target)^2 / var)``, ``var`` clamped to ``eps`` in value only
    (its gradient passes the clamp, as PyTorch's ``no_grad`` clamp does); ``full`` adds ``0.5 * log(2 pi)``.

    >>> import xgrad
    >>> round(xgrad.gaussian_nll_loss(xgrad.tensor([1.0]), xgrad.tensor([0.0]), xgrad.tensor([1.0])).item(), 4)
    0.5
    """
    refuse_none(target, "target", 2)
    target = _as_target(target, input)
    var = var if isinstance(var, Tensor) else constant_like(np.full(input.shape, var), input)
    if var.shape != input.shape:
        if input.shape[:-1] == var.shape:  # one variance per sample: homoscedastic over the last dim
            var = var.unsqueeze(-1)
        elif not (input.shape[:-1] == var.shape[:-1] and var.shape[-1] == 1):
            raise ValueError(f"var is of incorrect size: {list(var.shape)} for input of size {list(input.shape)}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    check_values(lambda a: (a < 0).any(), var, lambda: ValueError("var has negative entry/entries"))
    var = var + (clamp_min(var, eps) - var).detach()
    loss = 0.5 * (log(var) + (input - target) ** 2 / var)
    if full:
        loss = loss + 0.5 * math.log(2 * math.pi)
    return reduce_loss(loss, reduction)
