"""``ctc_loss``: the connectionist temporal classification loss, a primitive with PyTorch's gradient.

# NOTE [CTC loss gradient]
# The forward is the alpha recursion over the blank-extended targets in log space (a
# ``lax.scan`` over time, frozen past each sequence's input length). PyTorch's backward does
# not return the derivative of the loss in ``log_probs``: it returns that derivative plus
# ``exp(log_probs)`` at every time step within the input length (the gradient in the
# logits when ``log_probs`` is a ``log_softmax``, for which the two agree after
# ``log_softmax``'s backward). The forward here adds ``exp(log_probs) - stop_gradient(exp(log_probs))``
# (zero) summed inside each input length, so that its ``jax.vjp`` (the rule) is PyTorch's gradient and
# its ``jax.jvp`` (the forward-mode rule, NOTE [Tangents are jvp of the forward]) the transpose of it.
# Alignments that cannot exist (a
# target longer than its input allows) have an infinite loss and a zero gradient, which
# ``zero_infinity=True`` keeps and turns the loss to zero.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.ops._util import as_array, check_values, reduce_loss
from xgrad.ops.autocast import autocast_op
from xgrad.ops.elementwise import isfinite, where
from xgrad.ops.jaxop import vjp_of
from xgrad.ops.registry import defprim
from xgrad.tensor import Tensor

__all__ = ["ctc_loss"]


def _logaddexp(a: Any, b: Any) -> Any:
    """``log(exp(a) + exp(b))`` whose gradient is zero, not NaN, where both are ``-inf``."""
    top = jnp.maximum(a, b)
    finite_top = jnp.where(jnp.isfinite(top), top, 0.0)
    total = jnp.exp(a - finite_top) + jnp.exp(b - finite_top)
    positive = total > 0
    return jnp.where(positive, finite_top + jnp.log(jnp.where(positive, total, 1.0)), -jnp.inf)


def _ctc_impl(log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any, blank: int) -> Any:
    """Per sequence ``-log p(target | log_probs)``: ``log_probs`` ``(T, N, C)``, ``targets`` ``(N, S)`` padded."""
    steps, batch, _ = log_probs.shape
    width = 2 * targets.shape[1] + 1
    extended = jnp.full((batch, width), blank, targets.dtype).at[:, 1::2].set(targets)
    # a step from s - 2 skips a blank between two different labels
    skip = jnp.concatenate([jnp.zeros((batch, 2), bool), (extended[:, 2:] != blank) & (extended[:, 2:] != extended[:, :-2])],
                           axis=1)
    emit = jnp.take_along_axis(log_probs, jnp.broadcast_to(extended[None], (steps, batch, width)), axis=2)  # (T, N, 2S+1)
    minus_inf = jnp.full((batch, 1), -jnp.inf, log_probs.dtype)
    first = jnp.where(jnp.arange(width)[None, :] < jnp.where(target_lengths > 0, 2, 1)[:, None], emit[0], -jnp.inf)

    def step(alpha: Any, inputs: Any) -> tuple[Any, None]:
        t, emitted = inputs
        shifted1 = jnp.concatenate([minus_inf, alpha[:, :-1]], axis=1)
        shifted2 = jnp.where(skip, jnp.concatenate([minus_inf, minus_inf, alpha[:, :-2]], axis=1), -jnp.inf)
        new = _logaddexp(_logaddexp(alpha, shifted1), shifted2) + emitted
        return jnp.where((t < input_lengths)[:, None], new, alpha), None

    alpha, _ = jax.lax.scan(step, first, (jnp.arange(1, steps), emit[1:]))
    last = jnp.take_along_axis(alpha, (2 * target_lengths)[:, None], axis=1)[:, 0]
    before_last = jnp.take_along_axis(alpha, jnp.maximum(2 * target_lengths - 1, 0)[:, None], axis=1)[:, 0]
    probs = jnp.exp(log_probs)
    inside = (jnp.arange(steps)[:, None] < input_lengths[None, :])[:, :, None]
    pytorchs_term = jnp.sum(jnp.where(inside, probs - jax.lax.stop_gradient(probs), 0.0), axis=(0, 2))  # zero
    return pytorchs_term - _logaddexp(last, jnp.where(target_lengths > 0, before_last, -jnp.inf))


def _ctc_grad(g: Tensor, out: Any, *inputs: Any, blank: int) -> Any:
    return vjp_of("ctc_loss", _ctc_impl, blank=blank)(g, *inputs)


def _ctc_rule(log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any, blank: int) -> None:
    steps, batch, classes = log_probs.shape
    if not 0 <= blank < classes:
        raise RuntimeError(f"blank must be in label range: blank {blank} for {classes} classes")
    for name, lengths in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        if tuple(lengths.shape) != (batch,):
            raise RuntimeError(f"{name} must be of size batch_size {batch}, got {list(lengths.shape)}")


_ctc = defprim("ctc_loss", _ctc_impl, joint_vjp=_ctc_grad, shape_rule=_ctc_rule)


def _lengths(value: Any) -> Tensor:
    return Tensor(jnp.asarray(as_array(value) if isinstance(value, Tensor) else value, jnp.int32).reshape(-1))


@autocast_op
def ctc_loss(log_probs: Tensor, targets: Any, input_lengths: Any, target_lengths: Any, blank: int = 0,
             reduction: str = "mean", zero_infinity: bool = False) -> Tensor:
    """``F.ctc_loss``: ``-log`` of the probability of each target over all alignments of ``log_probs``
    ``(T, N, C)`` (or ``(T, C)``); ``targets`` padded ``(N, S)`` or concatenated ``(sum(target_lengths),)``.
    ``"mean"`` divides each loss by its target length, then averages. The gradient is PyTorch's
    (NOTE [CTC loss gradient]).

    >>> import xgrad
    >>> log_probs = xgrad.tensor([[[0.5, 0.5]], [[0.5, 0.5]]]).log()
    >>> round(xgrad.ctc_loss(log_probs, xgrad.tensor([[1]]), [2], [1], reduction="sum").item(), 4)
    0.2877
    """
    unbatched = log_probs.ndim == 2
    if log_probs.ndim not in (2, 3):
        raise RuntimeError(f"ctc_loss expects log_probs of 2 or 3 dimensions (T, C) or (T, N, C), got {list(log_probs.shape)}")
    if unbatched:
        log_probs = log_probs.unsqueeze(1)
    input_lengths, target_lengths = _lengths(input_lengths), _lengths(target_lengths)
    target_array = as_array(targets) if isinstance(targets, Tensor) else np.asarray(targets)
    if unbatched:
        target_array = jnp.asarray(target_array).reshape(1, -1)
    elif target_array.ndim == 1:  # concatenated targets: split at the (concrete) target lengths and padded
        pieces = np.split(np.asarray(target_array), np.cumsum(np.asarray(target_lengths._array))[:-1])
        padded = np.zeros((len(pieces), max(len(p) for p in pieces)), np.int64)
        for row, piece in zip(padded, pieces, strict=True):
            row[: len(piece)] = piece
        target_array = padded
    targets = Tensor(jnp.asarray(target_array, jnp.int32))
    check_values(lambda a: ((a > targets.shape[1]) | (a < 0)).any(), target_lengths,
                 lambda: RuntimeError(f"target_lengths must lie in [0, {targets.shape[1]}] (the targets' padded length)"))
    check_values(lambda a: ((a > log_probs.shape[0]) | (a < 0)).any(), input_lengths,
                 lambda: RuntimeError(f"input_lengths must lie in [0, {log_probs.shape[0]}] (the inputs' length)"))
    losses = _ctc(log_probs, targets, input_lengths, target_lengths, blank=blank)
    if zero_infinity:
        losses = where(isfinite(losses), losses, 0.0)
    if reduction == "mean":
        return (losses / target_lengths.clamp_min(1).to(losses.dtype)).mean()
    return reduce_loss(losses.squeeze(0) if unbatched else losses, reduction)
