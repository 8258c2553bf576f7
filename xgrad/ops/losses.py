"""Losses beyond ``cross_entropy``/``mse_loss``: ``nll_loss``, ``binary_cross_entropy`` (a
primitive with PyTorch's clamped logs and its own rules) and
``binary_cross_entropy_with_logits`` (a stable composite)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from xgrad.ops import shape_rules
from xgrad.ops._util import as_array, check_index_range, check_values, reduce_loss
from xgrad.ops.elementwise import clamp, log, log1p, maximum, softplus
from xgrad.ops.index import gather
from xgrad.ops.registry import defprim
from xgrad.tensor import Tensor

__all__ = ["binary_cross_entropy", "binary_cross_entropy_with_logits", "nll_loss"]


def nll_loss(
    input: Tensor, target: Any, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean"
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
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    target_array = jnp.asarray(as_array(target))
    if not jnp.issubdtype(target_array.dtype, jnp.integer):
        raise RuntimeError(f"expected scalar type Long but found {target_array.dtype}")
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
    loss = -picked * per_item
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


def binary_cross_entropy(input: Tensor, target: Any, weight: Tensor | None = None, reduction: str = "mean") -> Tensor:
    """``F.binary_cross_entropy`` on probabilities ``input`` in ``[0, 1]``; logs are clamped at -100 as in PyTorch.

    >>> import xgrad
    >>> round(xgrad.binary_cross_entropy(xgrad.tensor([0.5, 0.5]), xgrad.tensor([1.0, 0.0])).item(), 4)
    0.6931
    >>> xgrad.binary_cross_entropy(xgrad.tensor([0.0]), xgrad.tensor([1.0])).item()
    100.0
    """
    target = target if isinstance(target, Tensor) else Tensor(jnp.asarray(target, dtype=input.dtype))
    if target.shape != input.shape:
        raise ValueError(
            f"Using a target size ({target.shape}) that is different to the input size ({input.shape}) is deprecated. "
            "Please ensure they have the same size."
        )
    shape_rules.check_float(input, "binary_cross_entropy")
    check_values(_outside_unit_interval, input, _bce_input_error)
    loss = _binary_cross_entropy(input, target)
    if weight is not None:
        loss = loss * weight
    return reduce_loss(loss, reduction)


def binary_cross_entropy_with_logits(
    input: Tensor, target: Any, weight: Tensor | None = None, reduction: str = "mean", pos_weight: Tensor | None = None
) -> Tensor:
    """``F.binary_cross_entropy_with_logits``: BCE of ``sigmoid(input)``, computed stably from the logits.

    ``pos_weight`` weighs the positive term (one weight per class, broadcast along the last dim).

    >>> import xgrad
    >>> round(xgrad.binary_cross_entropy_with_logits(xgrad.tensor([0.0]), xgrad.tensor([1.0])).item(), 4)
    0.6931
    """
    target = target if isinstance(target, Tensor) else Tensor(jnp.asarray(target, dtype=input.dtype))
    if target.shape != input.shape:
        raise ValueError(f"Target size ({target.shape}) must be the same as input size ({input.shape})")
    shape_rules.check_float(input, "log_sigmoid_cpu")
    # -log sigmoid(x) = softplus(-x) and -log(1 - sigmoid(x)) = x + softplus(-x).
    log_weight = 1.0 if pos_weight is None else (pos_weight - 1) * target + 1
    loss = (1 - target) * input + log_weight * softplus(-input)
    if weight is not None:
        loss = loss * weight
    return reduce_loss(loss, reduction)
