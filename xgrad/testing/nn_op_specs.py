"""Op specs for ``torch.nn.functional``'s activations, dropout variants and losses (part of ``OP_SPECS``).

Each reference is written with ``jnp``/``jax.nn`` alone, from PyTorch's documented formula.
Piecewise functions are ``smooth=False``: finite differences would straddle their kinks.

>>> from xgrad.testing.op_specs import specs_for
>>> [spec.label for spec in specs_for("huber_loss")]
['delta=0.8, weight']
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import xgrad
from xgrad.testing.op_specs import BINARY_SHAPES, POSITIVE, REAL, UNARY_SHAPES, Domain, OpSpec, _prim

__all__ = ["activation_and_loss_specs"]

WIDE = Domain(lo=-4.0, hi=4.0)
_DROPOUT_KEY = jax.random.PRNGKey(11)
_SIGNS = np.array([1.0, -1.0, 1.0, -1.0])
_TARGET_WITH_ZEROS = np.array([[0.0, 0.3, 0.7], [0.5, 0.0, 0.5]])


def _unary(name: str, op: Any, ref: Any, domain: Domain = REAL, **kw: Any) -> OpSpec:
    return OpSpec(name, op, ref, kw.pop("shapes", UNARY_SHAPES), (domain,), **kw)


def _ref_softshrink(x: Any, lambd: float) -> Any:
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, 0.0))


def _ref_cosine(x1: Any, x2: Any, axis: int, eps: float = 1e-8) -> Any:
    n1 = jnp.maximum(jnp.linalg.norm(x1, axis=axis, keepdims=True), eps)
    n2 = jnp.maximum(jnp.linalg.norm(x2, axis=axis, keepdims=True), eps)
    return jnp.sum(x1 / n1 * (x2 / n2), axis=axis)


def _ref_cosine_embedding(x1: Any, x2: Any, target: Any, margin: float) -> Any:
    cos = jnp.sum(x1 * x2, -1) / jnp.sqrt((jnp.sum(x1 * x1, -1) + 1e-12) * (jnp.sum(x2 * x2, -1) + 1e-12))
    return jnp.mean(jnp.where(target == 1, 1 - cos, jnp.maximum(cos - margin, 0.0)))


def _ref_kl(x: Any, t: Any, log_target: bool = False) -> Any:
    pointwise = jnp.exp(t) * (t - x) if log_target else jax.scipy.special.xlogy(t, t) - t * x
    return jnp.sum(pointwise) / x.shape[0]


def _ref_alpha_dropout(x: Any, p: float = 0.3) -> Any:
    saturation = -1.7580993408473766  # SELU's limit at -inf
    keep = jax.random.bernoulli(_DROPOUT_KEY, 1 - p, x.shape)
    a = ((1 - p) * (1 + p * saturation**2)) ** -0.5
    return a * jnp.where(keep, x, saturation) - a * p * saturation


def _activation_specs() -> list[OpSpec]:
    X = xgrad
    return [
        _unary("softmin", lambda x: X.softmin(x, dim=1), lambda x: jax.nn.softmax(-x, axis=1), shapes=(((2, 3),),)),
        _unary("leaky_relu", lambda x: X.leaky_relu(x, 0.2), lambda x: jax.nn.leaky_relu(x, 0.2), smooth=False),
        _unary("elu", lambda x: X.elu(x, 1.5), lambda x: jax.nn.elu(x, 1.5), smooth=False),
        _unary("selu", X.selu, jax.nn.selu, smooth=False),
        _unary("celu", lambda x: X.celu(x, 2.0), lambda x: jax.nn.celu(x, 2.0), smooth=False),
        _unary("relu6", X.relu6, jax.nn.relu6, Domain(lo=-2.0, hi=8.0), smooth=False),
        _unary("hardtanh", lambda x: X.hardtanh(x, -1.0, 1.5), lambda x: jnp.clip(x, -1.0, 1.5), smooth=False),
        _unary("hardswish", X.hardswish, jax.nn.hard_swish, WIDE, smooth=False),
        # No second order: PyTorch's hardsigmoid_backward has no derivative (differentiating it raises).
        _unary("hardsigmoid", X.hardsigmoid, jax.nn.hard_sigmoid, WIDE, smooth=False, second_order=False),
        _unary("mish", X.mish, lambda x: x * jnp.tanh(jnp.logaddexp(0.0, x))),
        _unary("logsigmoid", X.logsigmoid, jax.nn.log_sigmoid),
        _unary("softsign", X.softsign, jax.nn.soft_sign, smooth=False),
        _unary("tanhshrink", X.tanhshrink, lambda x: x - jnp.tanh(x)),
        _unary("softshrink", lambda x: X.softshrink(x, 0.7), lambda x: _ref_softshrink(x, 0.7), smooth=False),
        _unary("hardshrink", lambda x: x.hardshrink(0.7), lambda x: jnp.where(jnp.abs(x) > 0.7, x, 0.0), smooth=False),
        _unary("threshold", lambda x: X.threshold(x, 0.5, -1.0), lambda x: jnp.where(x > 0.5, x, -1.0), smooth=False),
        _unary("softplus", lambda x: X.softplus(x, beta=2.0, threshold=1.0),
               lambda x: jnp.where(2.0 * x > 1.0, x, jnp.logaddexp(0.0, 2.0 * x) / 2.0), label="beta, threshold",
               smooth=False),
        # The primitives behind the activations above (NOTE [Piecewise-linear activations]) and the pools' tie.
        _unary("piecewise_linear", _prim("piecewise_linear", kind="hardtanh", a=-1.0, b=1.5),
               lambda x: jnp.clip(x, -1.0, 1.5), smooth=False),
        OpSpec("piecewise_linear_backward", _prim("piecewise_linear_backward", kind="leaky_relu", a=0.2, b=0.0),
               lambda g, x: jnp.where(x > 0, g, 0.2 * g), BINARY_SHAPES[:1], (REAL, REAL), smooth=False),
        _unary("elu", _prim("elu", alpha=1.5, scale=2.0, input_scale=0.5), lambda x: jnp.where(x > 0, 2.0 * x, 3.0 * jnp.expm1(0.5 * x)),
               smooth=False, label="primitive"),
        OpSpec("tie_to_input", _prim("tie_to_input"), lambda y, x: y, (((2, 3), (4,)),), (REAL, REAL)),
        _unary("glu", lambda x: X.glu(x, 1), lambda x: jax.nn.glu(x, axis=1), shapes=(((2, 4),), ((2, 6, 3),))),
        OpSpec("prelu", X.prelu, lambda x, w: jnp.where(x > 0, x, w[:, None] * x), (((2, 3, 4), (3,)),), (REAL, POSITIVE),
               label="per channel", smooth=False),
        OpSpec("prelu", lambda x, w: x.prelu(w), lambda x, w: jnp.where(x > 0, x, w * x), (((2, 3), (1,)),),
               (REAL, POSITIVE), label="one slope", smooth=False),
        _unary("dropout1d", lambda x: X.dropout1d(x, 0.3, key=_DROPOUT_KEY),
               lambda x: x * jax.random.bernoulli(_DROPOUT_KEY, 0.7, (2, 3, 1)) / 0.7, shapes=(((2, 3, 4),),)),
        _unary("dropout2d", lambda x: X.dropout2d(x, 0.3, key=_DROPOUT_KEY),
               lambda x: x * jax.random.bernoulli(_DROPOUT_KEY, 0.7, (2, 3, 1, 1)) / 0.7, shapes=(((2, 3, 2, 2),),)),
        _unary("alpha_dropout", lambda x: X.alpha_dropout(x, 0.3, True, key=_DROPOUT_KEY), _ref_alpha_dropout,
               shapes=(((4, 5),),)),
    ]


def _loss_specs() -> list[OpSpec]:
    X = xgrad
    same = BINARY_SHAPES[:1]
    return [
        OpSpec("mse_loss", lambda x, y, w: X.mse_loss(x, y, weight=w),
               lambda x, y, w: jnp.sum(w * (x - y) ** 2) / jnp.sum(w), (((2, 3),) * 3,), (REAL, REAL, POSITIVE),
               label="weight"),
        OpSpec("l1_loss", X.l1_loss, lambda x, y: jnp.mean(jnp.abs(x - y)), same, (REAL, REAL)),
        OpSpec("l1_loss", lambda x, y, w: X.l1_loss(x, y, reduction="sum", weight=w),
               lambda x, y, w: jnp.sum(w * jnp.abs(x - y)), (((2, 3),) * 3,), (REAL, REAL, POSITIVE), label="sum, weight"),
        OpSpec("smooth_l1_loss", lambda x, y: X.smooth_l1_loss(x, y, beta=0.5),
               lambda x, y: jnp.mean(jnp.where(jnp.abs(x - y) < 0.5, (x - y) ** 2 / 1.0, jnp.abs(x - y) - 0.25)),
               same, (REAL, REAL), label="beta=0.5", smooth=False),
        OpSpec("smooth_l1_loss", lambda x, y: X.smooth_l1_loss(x, y, reduction="none", beta=0.0),
               lambda x, y: jnp.abs(x - y), same, (REAL, REAL), label="beta=0 is l1"),
        OpSpec("huber_loss", lambda x, y, w: X.huber_loss(x, y, delta=0.8, weight=w),
               lambda x, y, w: jnp.sum(w * jnp.where(jnp.abs(x - y) < 0.8, 0.5 * (x - y) ** 2, 0.8 * (jnp.abs(x - y) - 0.4)))
               / jnp.sum(w), (((2, 3),) * 3,), (REAL, REAL, POSITIVE), label="delta=0.8, weight", smooth=False),
        OpSpec("kl_div", lambda x, t: X.kl_div(x, t, reduction="batchmean"), _ref_kl, (((2, 3), (2, 3)),),
               (REAL, POSITIVE), label="batchmean"),
        OpSpec("kl_div", lambda x, t: X.kl_div(x, t, reduction="sum", log_target=True),
               lambda x, t: _ref_kl(x, t, log_target=True) * x.shape[0], (((2, 3), (2, 3)),), (REAL, REAL),
               label="log_target, sum"),
        _unary("kl_div", lambda x: X.kl_div(x, X.tensor(_TARGET_WITH_ZEROS), reduction="batchmean"),
               lambda x: _ref_kl(x, _TARGET_WITH_ZEROS), label="zeros in target", shapes=(((2, 3),),)),
        OpSpec("cosine_similarity", X.cosine_similarity, lambda a, b: _ref_cosine(a, b, 1), (((3, 4), (3, 4)),),
               (REAL, REAL)),
        OpSpec("cosine_similarity", lambda a, b: X.cosine_similarity(a, b, dim=-1), lambda a, b: _ref_cosine(a, b, -1),
               (((2, 3), (3,)),), (REAL, REAL), label="broadcast, dim=-1"),
        OpSpec("cosine_embedding_loss", lambda a, b: X.cosine_embedding_loss(a, b, X.tensor(_SIGNS), margin=0.1),
               lambda a, b: _ref_cosine_embedding(a, b, _SIGNS, 0.1), (((4, 3), (4, 3)),), (REAL, REAL), smooth=False),
        OpSpec("margin_ranking_loss", lambda a, b: X.margin_ranking_loss(a, b, X.tensor(_SIGNS), margin=0.2),
               lambda a, b: jnp.mean(jnp.maximum(-_SIGNS * (a - b) + 0.2, 0.0)), (((4,), (4,)),), (REAL, REAL),
               smooth=False),
    ]


def activation_and_loss_specs() -> list[OpSpec]:
    """The specs of this module, in the order ``OP_SPECS`` lists them."""
    return _activation_specs() + _loss_specs()
