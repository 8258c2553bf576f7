"""Op specs for the 3-d and transposed convolutions, 3-d pools, pixel (un)shuffle, ``dropout3d``,
``feature_alpha_dropout`` and the margin and likelihood losses (part of ``OP_SPECS``).

The references use ``jax.lax``/``jnp`` alone: a transposed convolution is ``jax.vjp`` of the
forward convolution in its input (PyTorch's definition of it), the losses PyTorch's documented
formulas. Hinge losses are ``smooth=False``: finite differences would straddle their kinks.

>>> [s.name for s in layer_specs()][:2]
['conv3d', 'conv_transpose1d']
"""

from __future__ import annotations

import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import xgrad

__all__ = ["layer_specs"]

_KEY = jax.random.PRNGKey(5)
_SIGNS = np.array([[1.0, -1.0, -1.0], [1.0, 1.0, -1.0]])
_CLASSES = np.array([2, 0, 3])
_LABELS = np.array([[1, 3, -1, 0], [0, -1, 2, 2], [2, 1, 0, 3]])
_COUNTS = np.array([[0.0, 1.0, 3.0], [2.0, 0.0, 4.0]])
_LAYOUTS = {1: ("NCH", "OIH", "NCH"), 2: ("NCHW", "OIHW", "NCHW"), 3: ("NCDHW", "OIDHW", "NCDHW")}


def _ref_conv(x: Any, w: Any, stride: tuple[int, ...], pad: int, dilation: tuple[int, ...], groups: int) -> Any:
    n = x.ndim - 2
    return jax.lax.conv_general_dilated(x, w, stride, [(pad, pad)] * n, rhs_dilation=dilation,
                                        dimension_numbers=_LAYOUTS[n], feature_group_count=groups)


def _ref_conv_transpose(x: Any, w: Any, b: Any, stride: tuple[int, ...], pad: int, out_pad: tuple[int, ...],
                        dilation: tuple[int, ...], groups: int) -> Any:
    """The gradient in its input of the convolution whose output has ``x``'s shape, ``w`` as its OI* weight."""
    sizes = [(i - 1) * s - 2 * pad + d * (k - 1) + op + 1
             for i, s, d, k, op in zip(x.shape[2:], stride, dilation, w.shape[2:], out_pad, strict=True)]
    like = jnp.zeros((x.shape[0], w.shape[1] * groups, *sizes), x.dtype)
    _, vjp = jax.vjp(lambda z: _ref_conv(z, w, stride, pad, dilation, groups), like)
    return vjp(x)[0] + b.reshape((1, -1) + (1,) * len(sizes))


def _ref_pixel_shuffle(x: Any, r: int) -> Any:
    n, c, h, w = x.shape
    return x.reshape(n, c // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, c // (r * r), h * r, w * r)


def _ref_multi_margin(x: Any, p: int) -> Any:
    picked = x[np.arange(3), _CLASSES][:, None]
    hinge = jnp.maximum(1.0 - picked + x, 0.0) ** p
    return jnp.mean(jnp.sum(jnp.where(np.arange(4)[None, :] != _CLASSES[:, None], hinge, 0.0), axis=1) / 4)


def _ref_multilabel_margin(x: Any) -> Any:
    total: Any = 0.0
    for row, labels in enumerate(_LABELS):
        listed = list(labels[: list(labels).index(-1)]) if -1 in labels else list(labels)
        for j in listed:
            for i in set(range(4)) - set(listed):
                total = total + jnp.maximum(1.0 - x[row, j] + x[row, i], 0.0)
    return total / 4 / len(_LABELS)


def _ref_adaptive3d(x: Any, out: tuple[int, int, int], reduce: Any) -> Any:
    """PyTorch's adaptive windows ``[floor(i * n / out), ceil((i + 1) * n / out))`` along each of three dims."""
    windows = [[((i * n) // o, -((-(i + 1) * n) // o)) for i in range(o)] for n, o in zip(x.shape[2:], out, strict=True)]
    cells = [reduce(x[:, :, a:b, c:d, e:f], axis=(2, 3, 4))
             for (a, b), (c, d), (e, f) in itertools.product(*windows)]
    return jnp.stack(cells, axis=-1).reshape(*x.shape[:2], *out)


_CTC_TARGETS = np.array([[1, 2], [2, 2]])
_CTC_INPUT_LENGTHS = np.array([4, 3])
_CTC_TARGET_LENGTHS = np.array([2, 2])


def _ref_ctc(log_probs: Any) -> Any:
    """PyTorch's ``ctc_loss`` (mean reduction) as the forward algorithm written out per sequence and step, plus
    ``exp(log_probs) - stop_gradient(exp(log_probs))`` inside each input length: the value stays, and the
    gradient gains ``exp(log_probs)``, as PyTorch's does (NOTE [CTC loss gradient])."""
    total: Any = 0.0
    for b, (labels, steps, length) in enumerate(zip(_CTC_TARGETS, _CTC_INPUT_LENGTHS, _CTC_TARGET_LENGTHS, strict=True)):
        extended = [0]
        for label in labels[:length]:
            extended += [int(label), 0]
        # log(0) as a finite -1e30, so an unreachable state's gradient is zero rather than NaN
        alpha = [log_probs[0, b, extended[0]], log_probs[0, b, extended[1]]] + [-1e30] * (len(extended) - 2)
        for t in range(1, steps):
            alpha = [jax.nn.logsumexp(jnp.stack(
                [alpha[s]] + ([alpha[s - 1]] if s >= 1 else [])
                + ([alpha[s - 2]] if s >= 2 and extended[s] != 0 and extended[s] != extended[s - 2] else [])))
                + log_probs[t, b, extended[s]] for s in range(len(extended))]
        nll = -jnp.logaddexp(alpha[-1], alpha[-2])
        inside = jnp.exp(log_probs[:steps, b])
        total = total + (nll + jnp.sum(inside - jax.lax.stop_gradient(inside))) / length
    return total / len(_CTC_TARGETS)


def _distance(a: Any, b: Any, p: float) -> Any:
    return jnp.sum(jnp.abs(a - b + 1e-6) ** p, axis=-1) ** (1 / p)


def layer_specs() -> list[Any]:
    """The specs, for ``op_specs``'s table (which calls this while it builds: hence the import here)."""
    from xgrad.testing.nn_specs import ref_avg_pool, ref_max_pool
    from xgrad.testing.op_specs import POSITIVE, REAL, OpSpec, _prim, ints

    X = xgrad
    three = (REAL, REAL, REAL)
    return [
        OpSpec("conv3d", lambda x, w, b: X.conv3d(x, w, b, stride=(1, 2, 1), padding=1, dilation=(2, 1, 1), groups=2),
               lambda x, w, b: _ref_conv(x, w, (1, 2, 1), 1, (2, 1, 1), 2) + b.reshape(1, -1, 1, 1, 1),
               (((1, 4, 4, 3, 3), (2, 2, 2, 2, 2), (2,)),), three),
        OpSpec("conv_transpose1d", lambda x, w, b: X.conv_transpose1d(x, w, b, 2, 1, 1, 2, 2),
               lambda x, w, b: _ref_conv_transpose(x, w, b, (2,), 1, (1,), (2,), 2), (((2, 4, 3), (4, 1, 3), (2,)),), three),
        OpSpec("conv_transpose2d", lambda x, w, b: X.conv_transpose2d(x, w, b, (2, 1), 1, (1, 0), 1, (1, 2)),
               lambda x, w, b: _ref_conv_transpose(x, w, b, (2, 1), 1, (1, 0), (1, 2), 1),
               (((1, 2, 3, 3), (2, 3, 3, 2), (3,)),), three),
        OpSpec("conv_transpose3d", lambda x, w, b: X.conv_transpose3d(x, w, b, 2),
               lambda x, w, b: _ref_conv_transpose(x, w, b, (2, 2, 2), 0, (0, 0, 0), (1, 1, 1), 1),
               (((1, 2, 2, 2, 1), (2, 2, 2, 1, 2), (2,)),), three, second_order=False),
        OpSpec("conv_transpose", _prim("conv_transpose", stride=(1, 2), padding=(0, 1), output_padding=(0, 1),
                                       dilation=(2, 1), groups=1),
               lambda x, w: _ref_conv_transpose(x, w, jnp.zeros(2), (1, 2), 0, (0, 1), (2, 1), 1)[..., 1:-1],
               (((1, 2, 3, 2), (2, 2, 2, 3)),), (REAL, REAL), label="the primitive, unbatched bias-free"),
        OpSpec("sparse_to_dense", lambda v, i: _prim("sparse_to_dense", shape=(3, 3))(v, i),
               lambda v, i: jnp.zeros((3, 3), v.dtype).at[i[:, 0], i[:, 1]].add(v), (((5,), (5, 2)),), (REAL, ints(3)),
               label="repeated indices add"),
        OpSpec("sparse_matmul", lambda v, i, d: _prim("sparse_matmul", shape=(3, 4))(v, i, d),
               lambda v, i, d: jnp.zeros((3, 4), v.dtype).at[i[:, 0], i[:, 1]].add(v) @ d,
               (((5,), (5, 2), (4, 2)),), (REAL, ints(3), REAL)),
        OpSpec("ctc_loss", lambda x: X.ctc_loss(x, X.tensor(_CTC_TARGETS), X.tensor(_CTC_INPUT_LENGTHS),
                                                X.tensor(_CTC_TARGET_LENGTHS)),
               _ref_ctc, (((4, 2, 3),),), (REAL,), smooth=False, second_order=False),  # by design not the derivative
        OpSpec("max_pool3d", lambda x: X.max_pool3d(x, 2, (1, 2, 1), 1),
               lambda x: ref_max_pool(x, (2, 2, 2), (1, 2, 1), (1, 1, 1), (1, 1, 1), False), (((1, 2, 3, 4, 3),),), (REAL,)),
        OpSpec("avg_pool3d", lambda x: X.avg_pool3d(x, 2, 1, 1, count_include_pad=False),
               lambda x: ref_avg_pool(x, (2, 2, 2), (1, 1, 1), (1, 1, 1), False, False, None), (((1, 2, 3, 2, 3),),),
               (REAL,)),
        OpSpec("adaptive_avg_pool3d", lambda x: X.adaptive_avg_pool3d(x, (2, 1, 3)),
               lambda x: _ref_adaptive3d(x, (2, 1, 3), jnp.mean), (((1, 2, 3, 2, 5),),), (REAL,)),
        OpSpec("adaptive_max_pool3d", lambda x: X.adaptive_max_pool3d(x, 2),
               lambda x: _ref_adaptive3d(x, (2, 2, 2), jnp.max), (((1, 2, 3, 3, 4),),), (REAL,)),
        OpSpec("pixel_shuffle", lambda x: X.pixel_shuffle(x, 2), lambda x: _ref_pixel_shuffle(x, 2), (((2, 8, 2, 3),),),
               (REAL,)),
        OpSpec("pixel_unshuffle", lambda x: X.pixel_unshuffle(x, 2),
               lambda x: jax.vjp(lambda z: _ref_pixel_shuffle(z, 2), jnp.zeros((2, 8, 2, 3), x.dtype))[1](x)[0],
               (((2, 2, 4, 6),),), (REAL,)),
        OpSpec("dropout3d", lambda x: X.dropout3d(x, 0.3, key=_KEY),
               lambda x: x * jax.random.bernoulli(_KEY, 0.7, (2, 3, 1, 1, 1)) / 0.7, (((2, 3, 2, 1, 2),),), (REAL,)),
        OpSpec("feature_alpha_dropout", lambda x: X.feature_alpha_dropout(x, 0.3, True, key=_KEY),
               lambda x: _ref_feature_alpha_dropout(x, 0.3), (((2, 3, 2),),), (REAL,)),
        OpSpec("soft_margin_loss", lambda x: X.soft_margin_loss(x, X.tensor(_SIGNS)),
               lambda x: jnp.mean(jnp.log1p(jnp.exp(-_SIGNS * x))), (((2, 3),),), (REAL,)),
        OpSpec("hinge_embedding_loss", lambda x: X.hinge_embedding_loss(x, X.tensor(_SIGNS), 0.5, reduction="sum"),
               lambda x: jnp.sum(jnp.where(_SIGNS == 1, x, jnp.maximum(0.5 - x, 0.0))), (((2, 3),),), (REAL,),
               smooth=False),
        OpSpec("multi_margin_loss", lambda x: X.multi_margin_loss(x, X.tensor(_CLASSES), p=2),
               lambda x: _ref_multi_margin(x, 2), (((3, 4),),), (REAL,), smooth=False),
        OpSpec("multilabel_margin_loss", lambda x: X.multilabel_margin_loss(x, X.tensor(_LABELS)), _ref_multilabel_margin,
               (((3, 4),),), (REAL,), smooth=False),
        OpSpec("multilabel_soft_margin_loss", lambda x, w: X.multilabel_soft_margin_loss(x, X.tensor((_SIGNS > 0) * 1.0), w),
               lambda x, w: jnp.mean(jnp.mean(-w * jnp.where(_SIGNS > 0, jax.nn.log_sigmoid(x), jax.nn.log_sigmoid(-x)),
                                              axis=1)), (((2, 3), (3,)),), (REAL, POSITIVE)),
        OpSpec("pairwise_distance", lambda a, b: X.pairwise_distance(a, b, 3.0), lambda a, b: _distance(a, b, 3.0),
               (((2, 4), (2, 4)),), (REAL, REAL), smooth=False),
        OpSpec("triplet_margin_loss", lambda a, p, n: X.triplet_margin_loss(a, p, n, margin=3.0, swap=True),
               lambda a, p, n: jnp.mean(jnp.maximum(3.0 + _distance(a, p, 2) - jnp.minimum(_distance(a, n, 2),
                                                                                          _distance(p, n, 2)), 0.0)),
               (((3, 4), (3, 4), (3, 4)),), three, smooth=False),
        OpSpec("poisson_nll_loss", lambda x: X.poisson_nll_loss(x, X.tensor(_COUNTS), log_input=False, full=True),
               lambda x: jnp.mean(x - _COUNTS * jnp.log(x + 1e-8) + np.where(
                   _COUNTS > 1, _COUNTS * np.log(np.maximum(_COUNTS, 1)) - _COUNTS + 0.5 * np.log(2 * np.pi * np.maximum(_COUNTS, 1)), 0.0)),
               (((2, 3),),), (POSITIVE,)),
        OpSpec("gaussian_nll_loss", lambda x, t, v: X.gaussian_nll_loss(x, t, v, full=True),
               lambda x, t, v: jnp.mean(0.5 * (jnp.log(v[:, None]) + (x - t) ** 2 / v[:, None]) + 0.5 * np.log(2 * np.pi)),
               (((2, 3), (2, 3), (2,)),), (REAL, REAL, POSITIVE)),
    ]


def _ref_feature_alpha_dropout(x: Any, p: float) -> Any:
    saturation = -1.7580993408473766  # SELU's limit at -inf
    keep = jax.random.bernoulli(_KEY, 1 - p, (2, 3, 1))
    a = ((1 - p) * (1 + p * saturation**2)) ** -0.5
    return a * jnp.where(keep, x, saturation) - a * p * saturation
