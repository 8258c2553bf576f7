"""``torch.nn.functional``'s losses beyond ``cross_entropy``: ``nll_loss``, the regression losses
(``mse_loss``, ``l1_loss``, ``smooth_l1_loss``, ``huber_loss``), ``binary_cross_entropy`` (a
primitive with PyTorch's clamped logs and its own rules), ``binary_cross_entropy_with_logits``
(a stable composite), ``kl_div``, ``cosine_similarity`` and the two margin losses.

Each takes PyTorch's deprecated ``size_average``/``reduce`` where PyTorch does and maps them to
``reduction`` with PyTorch's warning."""

from __future__ import annotations

import math
import warnings
from typing import Any

import jax.numpy as jnp

from xgrad.ops import shape_rules
from xgrad.ops._util import (
    as_array,
    canonical_dim,
    check_index_range,
    check_values,
    legacy_reduction,
    reduce_loss,
    refuse_none,
)
from xgrad.ops.autocast import autocast_op
from xgrad.ops.elementwise import abs, clamp, clamp_min, exp, log, log1p, maximum, softplus, where
from xgrad.ops.index import gather
from xgrad.ops.linalg import norm
from xgrad.ops.registry import _differentiable_dtype, defprim
from xgrad.ops.shape import broadcast_to
from xgrad.tensor import Tensor, torch_dtype_name

__all__ = [
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "cosine_embedding_loss", "cosine_similarity",
    "huber_loss", "kl_div", "l1_loss", "margin_ranking_loss", "mse_loss", "nll_loss", "smooth_l1_loss",
]


@autocast_op
def nll_loss(
    input: Tensor, target: Any, weight: Tensor | None = None, size_average: bool | None = None, ignore_index: int = -100,
    reduce: bool | None = None, reduction: str = "mean",
) -> Tensor:
    """``F.nll_loss``: minus the log-probability ``input`` picks at each class index ``target``.

    Args:
        input: log-probabilities ``(C,)``, ``(N, C)`` or ``(N, C, d1, ...)``.
        target: class indices ``()``, ``(N,)`` or ``(N, d1, ...)``.
        weight: a weight per class, ``(C,)``.
        ignore_index: targets equal to it add nothing (nor to the mean's denominator).
        reduction: ``"mean"`` (weighted by the picked classes' weights), ``"sum"`` or ``"none"``.

    >>> import xgrad
    >>> logp = xgrad.tensor([[-0.5, -1.0], [-2.0, -0.1]])
    >>> round(xgrad.nll_loss(logp, xgrad.tensor([0, 1])).item(), 4)
    0.3
    >>> round(xgrad.nll_loss(logp, xgrad.tensor([0, -100]), reduction="sum").item(), 4)
    0.5
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    refuse_none(target, "target", 2)
    target_array = jnp.asarray(as_array(target))
    if not jnp.issubdtype(target_array.dtype, jnp.integer):
        raise RuntimeError(f"expected scalar type Long but found {torch_dtype_name(target_array.dtype)}")
    shape_rules.check_float(input, "nll_loss_out_frame")
    if input.ndim == 0:
        raise RuntimeError("nll_loss: input must have a class dim, got a 0-dim tensor")
    class_dim = 1 if input.ndim > 1 else 0
    expected = input.shape[:class_dim] + input.shape[class_dim + 1 :]
    if target_array.shape != expected:
        if input.ndim > 1 and target_array.ndim and target_array.shape[0] != input.shape[0]:
            raise ValueError(f"Expected input batch_size ({input.shape[0]}) to match target batch_size ({target_array.shape[0]}).")
        raise RuntimeError(f"nll_loss: expected target of shape {list(expected)} for input of shape {list(input.shape)}, got {list(target_array.shape)}")
    n_classes = input.shape[class_dim]
    if weight is not None and weight.shape != (n_classes,):
        raise RuntimeError(f"weight tensor should be defined either for all {n_classes} classes or no classes but got weight tensor of shape: {list(weight.shape)}")
    check_index_range(target_array, n_classes, "Target {index} is out of bounds.", negative=False, ignore=ignore_index)
    valid = target_array != ignore_index
    safe = jnp.where(valid, target_array, 0)  # ignored positions pick class 0, then count 0
    picked = gather(input, class_dim, Tensor(jnp.expand_dims(safe, class_dim))).squeeze(class_dim)
    mask = valid.astype(input.dtype)
    per_item = weight[safe] * mask if weight is not None else Tensor(mask)
    # Selected, not multiplied by the mask: with every target ignored the mean is 0/0
    # (NaN, as PyTorch's) and its gradient inf, which the selection keeps from the
    # ignored positions, zero there as in PyTorch's backward (inf * 0 would be NaN).
    loss = where(Tensor(valid), -picked * per_item, 0.0)
    if reduction == "mean":
        return loss.sum() / per_item.sum()
    return reduce_loss(loss, reduction)


_LOG_FLOOR = -100.0  # PyTorch clamps BCE's logs here, so a probability of exactly 0 or 1 stays finite


def _bce_impl(x: Any, t: Any) -> Any:
    return -(t * jnp.maximum(jnp.log(x), _LOG_FLOOR) + (1 - t) * jnp.maximum(jnp.log1p(-x), _LOG_FLOOR))


_binary_cross_entropy = defprim(
    "binary_cross_entropy",
    _bce_impl,
    (
        # PyTorch's rule: (x - t) / max(x (1 - x), 1e-12), finite at x = 0 and x = 1.
        lambda g, out, x, t: g * (x - t) / maximum(x * (1 - x), 1e-12),
        lambda g, out, x, t: g * (clamp(log1p(-x), min=_LOG_FLOOR) - clamp(log(x), min=_LOG_FLOOR)),
    ),
)


def _outside_unit_interval(a: Any) -> Any:
    return ((a < 0) | (a > 1)).any()


def _bce_input_error() -> RuntimeError:
    return RuntimeError("all elements of input should be between 0 and 1")


def _bce_target_error() -> RuntimeError:
    return RuntimeError("all elements of target should be between 0 and 1")


@autocast_op
def binary_cross_entropy(
    input: Tensor, target: Any, weight: Tensor | None = None, size_average: bool | None = None,
    reduce: bool | None = None, reduction: str = "mean",
) -> Tensor:
    """``F.binary_cross_entropy`` on probabilities ``input`` in ``[0, 1]``; logs are clamped at -100 as in PyTorch.

    >>> import xgrad
    >>> round(xgrad.binary_cross_entropy(xgrad.tensor([0.5, 0.5]), xgrad.tensor([1.0, 0.0])).item(), 4)
    0.6931
    >>> xgrad.binary_cross_entropy(xgrad.tensor([0.0]), xgrad.tensor([1.0])).item()
    100.0
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    refuse_none(target, "target", 2)
    target = target if isinstance(target, Tensor) else Tensor(jnp.asarray(target, dtype=input.dtype))
    if target.shape != input.shape:
        raise ValueError(
            f"Using a target size ({target.shape}) that is different to the input size ({input.shape}) is deprecated. "
            "Please ensure they have the same size."
        )
    shape_rules.check_float(input, "binary_cross_entropy")
    check_values(_outside_unit_interval, input, _bce_input_error)
    check_values(_outside_unit_interval, target, _bce_target_error)
    loss = _binary_cross_entropy(input, target)
    if weight is not None:
        loss = loss * weight
    return reduce_loss(loss, reduction)


@autocast_op
def binary_cross_entropy_with_logits(
    input: Tensor, target: Any, weight: Tensor | None = None, size_average: bool | None = None,
    reduce: bool | None = None, reduction: str = "mean", pos_weight: Tensor | None = None,
) -> Tensor:
    """``F.binary_cross_entropy_with_logits``: BCE of ``sigmoid(input)``, computed stably from the logits.

    ``pos_weight`` weighs the positive term (one weight per class, broadcast along the last dim).

    >>> import xgrad
    >>> round(xgrad.binary_cross_entropy_with_logits(xgrad.tensor([0.0]), xgrad.tensor([1.0])).item(), 4)
    0.6931
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    refuse_none(target, "target", 2)
    target = target if isinstance(target, Tensor) else Tensor(jnp.asarray(target, dtype=input.dtype))
    if target.shape != input.shape:
        raise ValueError(f"Target size ({target.shape}) must be the same as input size ({input.shape})")
    shape_rules.check_float(input, "log_sigmoid_cpu")
    # -log sigmoid(x) = softplus(-x) and -log(1 - sigmoid(x)) = x + softplus(-x).
    log_weight = 1.0 if pos_weight is None else (pos_weight - 1) * target + 1
    loss = (1 - target) * input + log_weight * softplus(-input, threshold=math.inf)
    if weight is not None:
        loss = loss * weight
    return reduce_loss(loss, reduction)


def _as_target(target: Any, input: Tensor) -> Tensor:
    return target if isinstance(target, Tensor) else Tensor(jnp.asarray(target, dtype=input.dtype))


def _warn_if_broadcast(input: Tensor, target: Tensor) -> None:
    # Shapes that cannot broadcast raise first: PyTorch would warn, then raise the same error.
    shape_rules.broadcast_shapes(input.shape, target.shape)
    if target.shape != input.shape:
        warnings.warn(
            f"Using a target size ({target.shape}) that is different to the input size ({input.shape}). This will "
            "likely lead to incorrect results due to broadcasting. Please ensure they have the same size.",
            UserWarning,
            stacklevel=3,
        )


def _reduce_weighted(loss: Tensor, weight: Tensor | None, input: Tensor, reduction: str) -> Tensor:
    """PyTorch's optional per-element ``weight`` of ``mse_loss``/``l1_loss``/``huber_loss``; its mean divides by the summed weights."""
    if weight is None:
        return reduce_loss(loss, reduction)
    if weight.shape != input.shape:
        raise ValueError("Weights and input must have the same size.")
    loss = loss * weight
    if reduction == "mean":
        return loss.sum() / weight.sum()
    return reduce_loss(loss, reduction)


@autocast_op
def mse_loss(
    input: Tensor, target: Any, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean",
    weight: Tensor | None = None,
) -> Tensor:
    """``F.mse_loss``: squared error; a ``weight`` per element makes the mean ``sum(w e) / sum(w)``.

    >>> import xgrad
    >>> xgrad.mse_loss(xgrad.tensor([1.0, 3.0]), xgrad.tensor([1.0, 1.0])).item()
    2.0
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    refuse_none(target, "target", 2)
    target = _as_target(target, input)
    if not _differentiable_dtype(target.dtype):
        shape_rules.check_float(input, "mse_cpu")  # PyTorch promotes a float target with an integer input
    _warn_if_broadcast(input, target)
    diff = input - target
    return _reduce_weighted(diff * diff, weight, input, reduction)


@autocast_op
def l1_loss(
    input: Tensor, target: Any, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean",
    weight: Tensor | None = None,
) -> Tensor:
    """``F.l1_loss``: absolute error (gradient 0 where input equals target).

    >>> import xgrad
    >>> xgrad.l1_loss(xgrad.tensor([1.0, 3.0]), xgrad.tensor([2.0, 1.0])).item()
    1.5
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    refuse_none(target, "target", 2)
    target = _as_target(target, input)
    _warn_if_broadcast(input, target)
    return _reduce_weighted(abs(input - target), weight, input, reduction)


@autocast_op
def smooth_l1_loss(
    input: Tensor, target: Any, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean",
    beta: float = 1.0,
) -> Tensor:
    """``F.smooth_l1_loss``: ``0.5 d^2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 beta``; ``l1_loss`` at ``beta=0``.

    >>> import xgrad
    >>> xgrad.smooth_l1_loss(xgrad.tensor([0.5, 3.0]), xgrad.tensor([0.0, 0.0]), reduction="none").tolist()
    [0.125, 2.5]
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    refuse_none(target, "target", 2)
    target = _as_target(target, input)
    _warn_if_broadcast(input, target)
    diff = abs(input - target)
    if beta == 0.0:
        return reduce_loss(diff, reduction)
    return reduce_loss(where(diff < beta, diff * diff * (0.5 / beta), diff - 0.5 * beta), reduction)


@autocast_op
def huber_loss(
    input: Tensor, target: Any, reduction: str = "mean", delta: float = 1.0, weight: Tensor | None = None
) -> Tensor:
    """``F.huber_loss``: ``0.5 d^2`` where ``|d| < delta``, else ``delta (|d| - 0.5 delta)``.

    >>> import xgrad
    >>> xgrad.huber_loss(xgrad.tensor([0.5, 3.0]), xgrad.tensor([0.0, 0.0]), reduction="none", delta=2.0).tolist()
    [0.125, 4.0]
    """
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    refuse_none(target, "target", 2)
    target = _as_target(target, input)
    _warn_if_broadcast(input, target)
    diff = abs(input - target)
    loss = where(diff < delta, diff * diff * 0.5, (diff - 0.5 * delta) * delta)
    return _reduce_weighted(loss, weight, input, reduction)


@autocast_op
def kl_div(
    input: Tensor, target: Any, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean",
    log_target: bool = False,
) -> Tensor:
    """``F.kl_div``: ``target * (log target - input)`` for log-probabilities ``input``.

    Args:
        reduction: ``"batchmean"`` (the sum over the batch size: the KL divergence), ``"sum"``,
            ``"none"`` or ``"mean"`` (over every element, with PyTorch's warning that it is not the KL divergence).
        log_target: ``target`` holds log-probabilities too.

    >>> import xgrad
    >>> logq = xgrad.tensor([[0.5, 0.5]]).log()
    >>> xgrad.kl_div(logq, xgrad.tensor([[0.5, 0.5]]), reduction="batchmean").item()
    0.0
    """
    if size_average is not None or reduce is not None:
        reduction = legacy_reduction(size_average, reduce, reduction)
    elif reduction == "mean":
        warnings.warn(
            "reduction: 'mean' divides the total loss by both the batch size and the support size."
            "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
            "'mean' will be changed to behave the same as 'batchmean' in the next major release.",
            UserWarning,
            stacklevel=2,
        )
    if reduction not in ("mean", "sum", "none", "batchmean"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    refuse_none(target, "target", 2)
    target = _as_target(target, input)
    shape_rules.broadcast_shapes(target.shape, input.shape)  # in PyTorch's order, for its message
    if log_target:
        loss = exp(target) * (target - input)
    else:
        # xlogy(t, t): 0 where t is 0 (the log reads 1 there, so no NaN reaches the gradient).
        positive = target > 0
        loss = where(positive, target * log(where(positive, target, 1.0)), 0.0) - target * input
    if reduction == "batchmean":
        return loss.sum() / input.shape[0] if input.ndim else loss.sum()
    return reduce_loss(loss, reduction)


def _norm_for_cosine(x: Tensor, dim: int, eps: float) -> Tensor:
    """``||x||`` along ``dim`` with the value floored at ``eps``: PyTorch floors it outside autograd, so
    the gradient is that of the unfloored norm (the floor is a constant added to it here)."""
    length = norm(x, dim=dim, keepdim=True)
    return length + (clamp_min(length, eps) - length).detach()


@autocast_op
def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """``F.cosine_similarity``: ``sum(x1/max(|x1|, eps) * x2/max(|x2|, eps))`` along ``dim``, PyTorch's current formula.

    >>> import xgrad
    >>> xgrad.cosine_similarity(xgrad.tensor([[1.0, 0.0]]), xgrad.tensor([[1.0, 1.0]])).tolist()
    [0.7071067690849304]
    """
    shape = shape_rules.broadcast_shapes(x1.shape, x2.shape)
    for x in (x1, x2):
        if not _differentiable_dtype(x.dtype):
            raise RuntimeError(
                f"expected common dtype to be floating point, yet common dtype is {torch_dtype_name(x.dtype)}"
            )
    x1, x2 = broadcast_to(x1, shape), broadcast_to(x2, shape)
    axis = canonical_dim(dim, len(shape))
    return ((x1 / _norm_for_cosine(x1, axis, eps)) * (x2 / _norm_for_cosine(x2, axis, eps))).sum(dim=axis)


@autocast_op
def cosine_embedding_loss(
    input1: Tensor, input2: Tensor, target: Any, margin: float = 0.0, size_average: bool | None = None,
    reduce: bool | None = None, reduction: str = "mean",
) -> Tensor:
    """``F.cosine_embedding_loss``: ``1 - cos`` for target 1, ``max(0, cos - margin)`` for target -1.

    >>> import xgrad
    >>> x = xgrad.tensor([[1.0, 0.0]])
    >>> xgrad.cosine_embedding_loss(x, x, xgrad.tensor([1.0])).item()
    0.0
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    refuse_none(target, "target", 3)
    target = _as_target(target, input1)
    if target.ndim > 1:
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if input1.shape != input2.shape or input1.ndim != target.ndim + 1:
        expects = "0D target tensor expects 1D" if target.ndim == 0 else "1D target tensor expects 2D"
        raise RuntimeError(
            f"{expects} input tensors, but found inputs with sizes {list(input1.shape)} and {list(input2.shape)}."
        )
    axis = input1.ndim - 1
    # PyTorch's formula: |x1|^2 and |x2|^2 each get 1e-12 before the square root of their product.
    squares = ((input1 * input1).sum(dim=axis) + 1e-12) * ((input2 * input2).sum(dim=axis) + 1e-12)
    cos = (input1 * input2).sum(dim=axis) / squares.sqrt()
    shape_rules.broadcast_shapes(target.shape, cos.shape)  # in PyTorch's order, for its message
    loss = where(target == 1, 1 - cos, 0.0) + where(target == -1, clamp_min(cos - margin, 0.0), 0.0)
    return reduce_loss(loss, reduction)


@autocast_op
def margin_ranking_loss(
    input1: Tensor, input2: Tensor, target: Any, margin: float = 0.0, size_average: bool | None = None,
    reduce: bool | None = None, reduction: str = "mean",
) -> Tensor:
    """``F.margin_ranking_loss``: ``max(0, -target * (input1 - input2) + margin)``.

    >>> import xgrad
    >>> xgrad.margin_ranking_loss(xgrad.tensor([1.0]), xgrad.tensor([2.0]), xgrad.tensor([1.0])).item()
    1.0
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    refuse_none(target, "target", 3)
    target = _as_target(target, input1)
    if not input1.ndim == input2.ndim == target.ndim:
        raise RuntimeError(
            "margin_ranking_loss : All input tensors should have same dimension but got sizes: "
            f"input1: {input1.shape}, input2: {input2.shape}, target: {target.shape} "
        )
    shape_rules.broadcast_shapes(target.shape, shape_rules.broadcast_shapes(input1.shape, input2.shape))
    return reduce_loss(clamp_min(-target * (input1 - input2) + margin, 0.0), reduction)
