"""``scaled_dot_product_attention``: one fused primitive with its own backward rule.

# NOTE [Fused attention]
# ``softmax(q @ k^T * scale + mask) @ v`` as a composite records five or six nodes and
# saves the (L, S) probabilities of each; as one primitive it records one node that
# saves q, k, v (and the mask) and recomputes the probabilities in its rule, as flash
# attention's backward does; the rule is one jitted call (``_sdpa_backward``) whose own
# gradient is ``jax.vjp`` of it, so ``create_graph=True`` differentiates it again. Dropout is a keep-mask (already scaled by 1/(1-p)) passed as
# a constant input, drawn from a ``jax.random`` key outside the primitive, so the rule
# replays exactly the forward's mask.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.generator import next_key
from xgrad.ops import shape_rules
from xgrad.ops._util import as_array
from xgrad.ops.autocast import autocast_op
from xgrad.ops.jaxop import from_jax
from xgrad.ops.registry import defprim
from xgrad.tensor import Tensor

__all__ = ["scaled_dot_product_attention"]


def _causal(length: int, source: int) -> Any:
    # Top-left aligned, as PyTorch's ``ones(L, S).tril()``.
    return jnp.tril(jnp.ones((length, source), dtype=bool))


def _scores(q: Any, k: Any, mask: Any, scale: float, is_causal: bool) -> Any:
    scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2)) * scale
    if is_causal:
        scores = jnp.where(_causal(*scores.shape[-2:]), scores, -jnp.inf)
    if mask is not None:
        scores = jnp.where(mask, scores, -jnp.inf) if mask.dtype == jnp.bool_ else scores + mask
    return scores


def _sdpa_impl(q: Any, k: Any, v: Any, mask: Any, keep: Any, scale: float, is_causal: bool) -> Any:
    probs = jax.nn.softmax(_scores(q, k, mask, scale, is_causal), axis=-1)
    if keep is not None:
        probs = probs * keep
    return jnp.matmul(probs, v)


def _sdpa_backward_impl(g: Any, q: Any, k: Any, v: Any, mask: Any, keep: Any, *, scale: float, is_causal: bool) -> Any:
    """The gradients of q, k, v and of the scores (the float mask's gradient), in one XLA call."""
    probs = jax.nn.softmax(_scores(q, k, mask, scale, is_causal), axis=-1)
    grad_probs = jnp.matmul(g, jnp.swapaxes(v, -1, -2))
    if keep is not None:
        grad_v = jnp.matmul(jnp.swapaxes(probs * keep, -1, -2), g)
        grad_probs = grad_probs * keep
    else:
        grad_v = jnp.matmul(jnp.swapaxes(probs, -1, -2), g)
    grad_scores = probs * (grad_probs - jnp.sum(grad_probs * probs, axis=-1, keepdims=True))
    grad_q = jnp.matmul(grad_scores, k) * scale
    grad_k = jnp.matmul(jnp.swapaxes(grad_scores, -1, -2), q) * scale
    return grad_q, grad_k, grad_v, grad_scores


# The rule is one op: the backward formulas above as one jitted call (written in xgrad
# ops as a chain, the rule cost more dispatches than the five-node composite's backward).
# Being a ``from_jax`` op, its own gradient is ``jax.vjp`` of those formulas, so
# ``create_graph=True`` differentiates it to any order.
_sdpa_backward = from_jax(_sdpa_backward_impl, name="scaled_dot_product_attention_backward")


def _sdpa_grad(g: Tensor, out: Any, q: Tensor, k: Tensor, v: Tensor, mask: Any, keep: Any, scale: float, is_causal: bool) -> tuple[Any, ...]:
    grad_q, grad_k, grad_v, grad_scores = _sdpa_backward(g, q, k, v, mask, keep, scale=scale, is_causal=is_causal)
    float_mask = mask is not None and mask.dtype != jnp.bool_
    return grad_q, grad_k, grad_v, grad_scores if float_mask else None, None


_sdpa = defprim("scaled_dot_product_attention", _sdpa_impl, joint_vjp=_sdpa_grad, shape_rule=shape_rules.attention)


@autocast_op
def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    dropout_key: Any = None,
) -> Tensor:
    """``F.scaled_dot_product_attention``: ``softmax(query @ key^T * scale + mask) @ value``, one node.

    Args:
        query, key, value: ``(..., L, E)``, ``(..., S, E)``, ``(..., S, Ev)``.
        attn_mask: a boolean mask (``True`` takes part) or a float bias, broadcastable to
            ``(..., L, S)``; a float bias gets a gradient.
        dropout_p: dropout on the attention weights.
        is_causal: a top-left-aligned causal mask (not together with ``attn_mask``).
        scale: defaults to ``1 / sqrt(E)``.
        enable_gqa: let ``key``/``value`` have fewer heads (dim -3) than ``query``.
        dropout_key: a ``jax.random`` key for dropout; the module default key is split
            when omitted, as ``xgrad.dropout`` does.

    >>> import xgrad
    >>> q = k = v = xgrad.ones(1, 2, 4)
    >>> xgrad.scaled_dot_product_attention(q, k, v, is_causal=True).shape
    (1, 2, 4)
    """
    if query.ndim < 2 or key.ndim < 2 or value.ndim < 2:
        raise RuntimeError("scaled_dot_product_attention: query, key and value must have at least 2 dims")
    if not query.dtype == key.dtype == value.dtype:
        raise RuntimeError(
            "Expected query, key, and value to have the same dtype, but got query.dtype: "
            f"{query.dtype} key.dtype: {key.dtype} and value.dtype: {value.dtype} instead."
        )
    if is_causal and attn_mask is not None:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
    if enable_gqa and key.ndim >= 3 and key.shape[-3] != query.shape[-3]:
        if query.shape[-3] % key.shape[-3] or query.shape[-3] % value.shape[-3]:
            raise RuntimeError("scaled_dot_product_attention: the number of query heads must be a multiple of key/value heads")
        key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
        value = value.repeat_interleave(query.shape[-3] // value.shape[-3], dim=-3)
    mask = attn_mask
    if mask is not None and not isinstance(mask, Tensor):
        mask = jnp.asarray(mask)
    if mask is not None and as_array(mask).dtype == jnp.bool_:
        mask = as_array(mask)  # a constant: no gradient, and the rule reads it as an array
    keep = None
    if dropout_p > 0.0:
        shape = shape_rules.broadcast_shapes(query.shape[:-1] + (key.shape[-2],), key.shape[:-2] + (1, 1))
        draw_key = next_key() if dropout_key is None else dropout_key
        keep = jax.random.bernoulli(draw_key, 1.0 - dropout_p, shape).astype(query.dtype) / (1.0 - dropout_p) if dropout_p < 1.0 else jnp.zeros(shape, query.dtype)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    return _sdpa(query, key, value, mask, keep, scale=scale, is_causal=bool(is_causal))
