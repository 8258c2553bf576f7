"""One table of op specs: how to call each op on xgrad tensors and on plain arrays.

Every primitive in ``xgrad.ops.REGISTRY`` and every name in
``xgrad.ops.DIFFERENTIABLE_OPS`` has at least one ``OpSpec``. A spec pairs the xgrad
call with an independent reference written with ``jnp``/``jax`` alone, lists the
input shapes to try (broadcasting and 0-dim where the op allows them) and the
domain each input is drawn from. The registry-driven tests (``tests/test_ops.py``)
and ``xgrad.testing.strategies.programs`` both read this table.

>>> from xgrad.testing.op_specs import specs_for
>>> spec = specs_for("log")[0]
>>> spec.domains[0].lo > 0
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import xgrad
from xgrad.ops.registry import REGISTRY, bind
from xgrad.testing.nn_specs import nn_specs
from xgrad.testing.rnn_reference import reference_lstm, reference_recurrent

__all__ = ["OP_SPECS", "Domain", "OpSpec", "POSITIVE", "REAL", "UNIT", "ints", "specs_for", "uncovered_ops"]

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Domain:
    """Where an input's values come from.

    ``kind`` is ``"uniform"`` (floats in ``[lo, hi]``), ``"ties"`` (floats with repeated
    values, to exercise tie-breaking), ``"zeros"`` (uniform with some exact zeros),
    ``"ints"`` (integers in ``[lo, hi)``, not differentiated) or ``"bools"``.
    """

    kind: str = "uniform"
    lo: float = -2.0
    hi: float = 2.0

    @property
    def differentiable(self) -> bool:
        return self.kind in ("uniform", "ties", "zeros")

    def sample(self, rng: np.random.Generator, shape: Shape, dtype: Any = np.float64) -> np.ndarray:
        """Draw an array of ``shape`` from this domain."""
        if self.kind == "ints":
            return rng.integers(int(self.lo), int(self.hi), size=shape).astype(np.int32)
        if self.kind == "bools":
            return rng.random(shape) < 0.5
        if self.kind == "ties":
            return rng.integers(0, 3, size=shape).astype(dtype)
        values = rng.uniform(self.lo, self.hi, size=shape)
        if self.kind == "zeros":
            values = np.where(rng.random(shape) < 0.3, 0.0, values)
        return np.asarray(values, dtype=dtype)


REAL = Domain()
POSITIVE = Domain(lo=0.5, hi=2.0)
UNIT = Domain(lo=-0.9, hi=0.9)
BOOLS = Domain("bools")
TIES = Domain("ties")
WITH_ZEROS = Domain("zeros")


def ints(high: int, low: int = 0) -> Domain:
    """Integer indices in ``[low, high)``."""
    return Domain("ints", low, high)


@dataclass(frozen=True)
class OpSpec:
    """How to call one op and check it.

    Attributes:
        name: the registry / ``DIFFERENTIABLE_OPS`` name this spec covers.
        op: ``op(*tensors)`` with xgrad (static arguments are closed over).
        ref: ``ref(*arrays)`` with ``jnp``/``jax`` only: the independent reference.
        shapes: input shape variants, one shape per input in each.
        domains: one ``Domain`` per input.
        label: what distinguishes this spec from others of the same name.
        smooth: no kink near the sampled inputs, so finite differences apply.
        second_order: whether second derivatives are checked.
        expr: the op as a Python expression over ``np`` (``"np.exp({0})"``), the same
            in ``xgrad``, ``jax.numpy`` and NumPy, for ``programs()``; ``None`` keeps the
            op out of random programs.
    """

    name: str
    op: Callable[..., Any]
    ref: Callable[..., Any]
    shapes: tuple[tuple[Shape, ...], ...]
    domains: tuple[Domain, ...]
    label: str = ""
    smooth: bool = True
    second_order: bool = True
    expr: str | None = None

    @property
    def id(self) -> str:
        return f"{self.name}[{self.label}]" if self.label else self.name

    def sample(self, rng: np.random.Generator, variant: int = 0, dtype: Any = np.float64) -> tuple[np.ndarray, ...]:
        """Inputs for shape variant ``variant``, drawn from the domains."""
        return tuple(d.sample(rng, s, dtype) for d, s in zip(self.domains, self.shapes[variant], strict=True))


def _prim(name: str, **params: Any) -> Callable[..., Any]:
    """Call a registered primitive directly (for ones no public function exposes alone)."""
    prim = REGISTRY[name]
    return lambda *args: bind(prim, args, params)


# -- spec builders ---------------------------------------------------------------------
UNARY_SHAPES: tuple[tuple[Shape, ...], ...] = (((2, 3),), ((),))
BINARY_SHAPES: tuple[tuple[Shape, ...], ...] = (((2, 3), (2, 3)), ((2, 3), (3,)), ((), (2, 3)), ((2, 1), (1, 3)))


def _unary(name: str, op: Callable[..., Any], ref: Callable[..., Any], domain: Domain = REAL, **kw: Any) -> OpSpec:
    return OpSpec(name, op, ref, kw.pop("shapes", UNARY_SHAPES), (domain,), **kw)


def _binary(name: str, op: Callable[..., Any], ref: Callable[..., Any], domains: tuple[Domain, Domain] = (REAL, REAL), **kw: Any) -> OpSpec:
    return OpSpec(name, op, ref, kw.pop("shapes", BINARY_SHAPES), domains, **kw)


def _reduction(
    name: str, op: Callable[..., Any], ref: Callable[..., Any], domain: Domain = REAL, zero_dim: bool = True, **kw: Any
) -> list[OpSpec]:
    """All-dims, one dim, negative dim with keepdim, and several dims, plus 0-dim input."""
    cases = [
        ("all", {}, {}, ((2, 3),)),
        ("0d", {}, {}, ((),)),
        ("dim=1", {"dim": 1}, {"axis": 1}, ((2, 3),)),
        ("dim=-1,keepdim", {"dim": -1, "keepdim": True}, {"axis": -1, "keepdims": True}, ((2, 3, 2),)),
        ("dim=(0,2)", {"dim": (0, 2)}, {"axis": (0, 2)}, ((2, 3, 2),)),
    ]
    return [
        OpSpec(
            name,
            (lambda x, k=xk: op(x, **k)),
            (lambda x, k=rk: ref(x, **k)),
            (shapes,),
            (domain,),
            label=label,
            **kw,
        )
        for label, xk, rk, shapes in cases
        if zero_dim or shapes != ((),)
    ]


def _ref_var(x: Any, axis: Any = None, keepdims: bool = False, ddof: int = 1) -> Any:
    return jnp.var(x, axis=axis, keepdims=keepdims, ddof=ddof)


def _ref_layer_norm(x: Any, w: Any, b: Any, n: int = 1, eps: float = 1e-5) -> Any:
    axes = tuple(range(x.ndim - n, x.ndim))
    mu = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=axes, keepdims=True)
    return (x - mu) / jnp.sqrt(var + eps) * w + b


def _ref_cross_entropy(
    logits: Any, target: Any, reduction: str = "mean", smoothing: float = 0.0, ignore_index: int | None = None,
) -> Any:
    logp = jax.nn.log_softmax(logits, axis=-1)
    kept = jnp.ones(logits.shape[:-1], bool) if ignore_index is None else target != ignore_index
    if jnp.issubdtype(target.dtype, jnp.integer):
        q = (1 - smoothing) * jax.nn.one_hot(target, logits.shape[-1]) + smoothing / logits.shape[-1]
    else:
        q = target
    loss = -jnp.sum(q * logp, axis=-1) * kept
    # PyTorch's mean divides by the number of targets that are not ignored.
    return {"mean": lambda v: jnp.sum(v) / jnp.sum(kept), "sum": jnp.sum, "none": lambda v: v}[reduction](loss)


def _ref_scatter_add(x: Any, index: Any, src: Any, dim: int) -> Any:
    # out[..., k, ...] = x + sum_i [index_i == k] src_i along dim, via a one-hot contraction.
    onehot = jax.nn.one_hot(jnp.moveaxis(index, dim, -1), x.shape[dim], dtype=src.dtype)  # (..., m, K)
    moved = jnp.einsum("...mk,...m->...k", onehot, jnp.moveaxis(src, dim, -1))
    return x + jnp.moveaxis(moved, -1, dim)


def _ref_sum_to(x: Any, shape: Shape) -> Any:
    lead = x.ndim - len(shape)
    out = jnp.sum(x, axis=tuple(range(lead)))
    ones = tuple(i for i, s in enumerate(shape) if s == 1 and out.shape[i] != 1)
    return jnp.sum(out, axis=ones, keepdims=True)


def _ref_conv2d(x: Any, w: Any, b: Any = None, stride: int = 1, padding: int = 0, groups: int = 1) -> Any:
    out = jax.lax.conv_general_dilated(
        x, w, (stride, stride), [(padding, padding)] * 2,
        dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=groups,
    )
    return out if b is None else out + b[None, :, None, None]


def _setitem_op(index: Any) -> Callable[..., Any]:
    def op(x: Any, v: Any) -> Any:
        y = x.clone()
        y[index] = v
        return y

    return op


def _second_device() -> Any:
    devices = jax.devices()
    return devices[1] if len(devices) > 1 else devices[0]


def _replicated() -> Any:
    """Replicated on the default device, where the inputs are: a constraint any shape can take."""
    return jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",)), jax.sharding.PartitionSpec())


_DROPOUT_KEY = jax.random.PRNGKey(7)
_INT_INDEX = np.array([2, 0, 2])
_MASK = np.array([[True, False, True], [False, False, True]])
_GATHER_INDEX = np.array([[0, 2, 1, 0], [1, 1, 0, 2]])


# -- references for the ops PyTorch users reach for ------------------------------------
_NLL_TARGET_IGNORED = np.array([2, -100, 0, -100])
_NLL_WEIGHT = np.array([0.5, 2.0, 1.0])
_SDPA_MASK = np.array([[True, False, True, True, False], [True, True, False, True, True], [False, True, True, True, True]])
_SDPA_KEY = jax.random.PRNGKey(3)


def _ref_nll_loss(logp: Any, target: Any, weight: Any = None, ignore_index: int = -100, reduction: str = "mean") -> Any:
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    picked = jnp.take_along_axis(logp, jnp.expand_dims(safe, 1), axis=1).squeeze(1)
    w = (jnp.ones(logp.shape[1], logp.dtype) if weight is None else jnp.asarray(weight))[safe] * valid
    loss = -picked * w
    return {"mean": lambda v: jnp.sum(v) / jnp.sum(w), "sum": jnp.sum, "none": lambda v: v}[reduction](loss)


def _ref_bce(x: Any, t: Any, weight: Any = 1.0) -> Any:
    return jnp.mean(-(t * jnp.log(x) + (1 - t) * jnp.log(1 - x)) * weight)


def _ref_bce_logits(x: Any, t: Any, pos_weight: Any = 1.0) -> Any:
    p = jax.nn.sigmoid(x)
    return jnp.mean(-(pos_weight * t * jnp.log(p) + (1 - t) * jnp.log(1 - p)))


def _ref_sdpa(q: Any, k: Any, v: Any, mask: Any = None, causal: bool = False, scale: Any = None, keep: Any = None) -> Any:
    scores = q @ jnp.swapaxes(k, -1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        scores = jnp.where(np.tril(np.ones(scores.shape[-2:], bool)), scores, -jnp.inf)
    if mask is not None:
        scores = jnp.where(mask, scores, -jnp.inf) if mask.dtype == bool else scores + mask
    probs = jax.nn.softmax(scores, axis=-1)
    return (probs if keep is None else probs * keep) @ v


def _interp_matrix(n_in: int, n_out: int, mode: str, align_corners: bool = False, scale: float | None = None) -> np.ndarray:
    """Row ``o``: the weights output ``o`` gives the inputs, from PyTorch's coordinate formulas, one output at a time."""
    scale = n_in / n_out if scale is None else scale
    m = np.zeros((n_out, n_in))
    for o in range(n_out):
        if mode == "nearest":
            m[o, min(int(np.floor(o * scale)), n_in - 1)] = 1.0
            continue
        if align_corners:
            src = o * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            src = max(scale * (o + 0.5) - 0.5, 0.0)
        lo = min(int(np.floor(src)), n_in - 1)
        frac = src - lo
        m[o, lo] += 1 - frac
        m[o, min(lo + 1, n_in - 1)] += frac
    return m


def _ref_interpolate(x: Any, size: tuple[int, int], mode: str, align_corners: bool = False, scales: Any = (None, None)) -> Any:
    mh = _interp_matrix(x.shape[2], size[0], mode, align_corners, scales[0])
    mw = _interp_matrix(x.shape[3], size[1], mode, align_corners, scales[1])
    return jnp.einsum("oh,nchw,pw->ncop", mh.astype(x.dtype), x, mw.astype(x.dtype))


def _build_specs() -> list[OpSpec]:
    X = xgrad
    specs: list[OpSpec] = []
    add = specs.append

    # -- arithmetic --------------------------------------------------------------------
    add(_binary("add", X.add, jnp.add, expr="{0} + {1}"))
    add(_binary("sub", X.sub, jnp.subtract, expr="{0} - {1}"))
    add(_binary("add", lambda a, b: X.add(a, b, alpha=-0.5), lambda a, b: a - 0.5 * b, label="alpha"))
    add(_binary("sub", lambda a, b: a.sub(b, alpha=2.0), lambda a, b: a - 2.0 * b, label="alpha"))
    add(_binary("mul", X.mul, jnp.multiply, expr="{0} * {1}"))
    add(_binary("div", X.div, jnp.divide, (REAL, POSITIVE), expr="{0} / {1}"))
    add(_unary("neg", X.neg, jnp.negative, expr="-{0}"))
    add(_binary("pow", X.pow, jnp.power, (POSITIVE, REAL), label="tensor exponent"))
    add(_unary("pow", lambda x: x**2, lambda x: x**2, label="x**2", expr="{0} ** 2"))
    add(_unary("pow", lambda x: 2.0**x, lambda x: 2.0**x, label="2**x"))
    add(_unary("clone", X.clone, lambda x: x))
    add(_unary("conj", X.conj, jnp.conj))
    add(_unary("conj_physical", X.conj_physical, jnp.conj))
    add(_unary("resolve_conj", lambda x: X.resolve_conj(X.conj(x)), jnp.conj))
    # -- transcendental ----------------------------------------------------------------
    add(_unary("exp", X.exp, jnp.exp, Domain(lo=-3, hi=3), expr="np.exp({0})"))
    add(_unary("log", X.log, jnp.log, POSITIVE, expr="np.log({0})"))
    add(_unary("log1p", X.log1p, jnp.log1p, UNIT, expr="np.log1p({0})"))
    add(_unary("expm1", X.expm1, jnp.expm1, Domain(lo=-3, hi=3), expr="np.expm1({0})"))
    add(_unary("sqrt", X.sqrt, jnp.sqrt, POSITIVE, expr="np.sqrt({0})"))
    add(_unary("rsqrt", X.rsqrt, jax.lax.rsqrt, POSITIVE))
    add(_unary("abs", X.abs, jnp.abs, Domain(lo=0.2, hi=2.0), label="positive"))
    add(_unary("abs", X.abs, jnp.abs, Domain(lo=-2.0, hi=-0.2), label="negative"))
    add(_unary("abs", X.abs, jnp.abs, label="any sign", smooth=False, expr="np.abs({0})"))
    add(_unary("sign", X.sign, jnp.sign))
    add(_unary("sin", X.sin, jnp.sin, expr="np.sin({0})"))
    add(_unary("cos", X.cos, jnp.cos, expr="np.cos({0})"))
    add(_unary("tan", X.tan, jnp.tan, Domain(lo=-1.2, hi=1.2), expr="np.tan({0})"))
    add(_unary("tanh", X.tanh, jnp.tanh, expr="np.tanh({0})"))
    add(_unary("erf", X.erf, jax.scipy.special.erf))
    # -- activations -------------------------------------------------------------------
    add(_unary("sigmoid", X.sigmoid, jax.nn.sigmoid))
    add(_unary("relu", X.relu, jax.nn.relu, Domain(lo=0.1, hi=2.0), label="positive"))
    add(_unary("relu", X.relu, jax.nn.relu, Domain(lo=-2.0, hi=-0.1), label="negative"))
    add(OpSpec("threshold_backward", _prim("threshold_backward"), lambda g, o: jnp.where(o > 0, g, 0.0), BINARY_SHAPES[:2],
               (REAL, REAL)))
    add(_unary("gelu", X.gelu, lambda x: jax.nn.gelu(x, approximate=False)))
    add(_unary("gelu", lambda x: X.gelu(x, approximate="tanh"), lambda x: jax.nn.gelu(x, approximate=True), label="tanh"))
    add(_unary("silu", X.silu, jax.nn.silu))
    add(_unary("softplus", X.softplus, jax.nn.softplus))
    # -- selection ---------------------------------------------------------------------
    add(_binary("maximum", X.maximum, jnp.maximum, expr="np.maximum({0}, {1})"))
    add(_binary("minimum", X.minimum, jnp.minimum, expr="np.minimum({0}, {1})"))
    add(_binary("maximum", X.maximum, jnp.maximum, (TIES, TIES), label="ties", smooth=False, shapes=(((2, 3), (2, 3)),)))
    add(OpSpec("where", X.where, jnp.where, (((2, 3), (2, 3), (2, 3)), ((2, 3), (3,), ())), (BOOLS, REAL, REAL)))
    add(OpSpec("where", lambda x, y: X.where(x > y, x, y), lambda x, y: jnp.where(x > y, x, y), BINARY_SHAPES[:2],
               (REAL, REAL), label="x > y", expr="np.where({0} > {1}, {0}, {1})"))
    add(OpSpec("clamp", X.clamp, jnp.clip, (((2, 3), (2, 3), (2, 3)), ((2, 3), (3,), ())),
               (REAL, Domain(lo=-1.5, hi=-0.5), Domain(lo=0.5, hi=1.5)), label="tensor bounds"))
    add(_unary("clamp", lambda x: X.clamp(x, min=-0.5), lambda x: jnp.clip(x, -0.5), label="min only"))
    add(_unary("clamp", lambda x: X.clamp(x, max=0.5), lambda x: jnp.clip(x, None, 0.5), label="max only"))
    # -- dtype and device --------------------------------------------------------------
    # smooth=False: the float32 forward is too coarse for float64 finite differences.
    add(_unary("astype", lambda x: x.astype(jnp.float32), lambda x: x.astype(jnp.float32), smooth=False))
    add(_unary("to_device", lambda x: X.to_device(x, _second_device()), lambda x: jax.device_put(x, _second_device())))
    add(_unary("with_sharding_constraint", lambda x: X.with_sharding_constraint(x, _replicated()),
               lambda x: jax.lax.with_sharding_constraint(x, _replicated())))
    # -- reductions --------------------------------------------------------------------
    specs += _reduction("sum", X.sum, jnp.sum, expr="np.sum({0}, axis=-1, keepdims=True)")
    add(_unary("sum", lambda x: X.sum(x, dim=-1), lambda x: x, label="0-dim, dim=-1", shapes=(((),),)))
    add(_unary("amax", lambda x: X.amax(x, dim=0, keepdim=True), lambda x: x, label="0-dim, dim=0", shapes=(((),),)))
    specs += _reduction("mean", X.mean, jnp.mean, expr="np.mean({0}, axis=0, keepdims=True)")
    specs += _reduction("var", X.var, _ref_var, zero_dim=False)  # one element: n - 1 = 0
    specs += _reduction("std", X.std, lambda x, **k: jnp.sqrt(_ref_var(x, **k)), zero_dim=False)
    specs += _reduction("prod", X.prod, jnp.prod)
    specs += _reduction("amax", X.amax, jnp.max)
    specs += _reduction("amin", X.amin, jnp.min)
    specs += _reduction("logsumexp", X.logsumexp, jax.scipy.special.logsumexp)
    add(_unary("cov", X.cov, jnp.cov, shapes=(((2, 4),), ((4,),))))
    add(OpSpec("cov", lambda x, f, a: X.cov(x, correction=0, fweights=f, aweights=a),
               lambda x, f, a: jnp.cov(x, bias=True, fweights=f, aweights=a), (((2, 4), (4,), (4,)),), (REAL, ints(3, 1), POSITIVE),
               label="weights, correction=0"))
    add(OpSpec("cov", lambda x, a: X.cov(x, aweights=a), lambda x, a: jnp.cov(x, aweights=a), (((3, 5), (5,)),), (REAL, POSITIVE),
               label="aweights"))
    add(_unary("var", lambda x: X.var(x, dim=1, correction=0), lambda x: jnp.var(x, axis=1), label="correction=0",
               shapes=(((2, 3),),)))
    add(_unary("prod", lambda x: X.prod(x, dim=1), lambda x: jnp.prod(x, axis=1), WITH_ZEROS, label="zeros",
               shapes=(((3, 4),),)))
    add(_unary("amax", X.amax, jnp.max, TIES, label="ties", smooth=False, shapes=(((2, 3),),)))
    add(_unary("amin", lambda x: X.amin(x, dim=0), lambda x: jnp.min(x, axis=0), TIES, label="ties dim=0",
               smooth=False, shapes=(((3, 3),),)))
    add(_unary("max", X.max, jnp.max, label="all", shapes=(((2, 3),), ((),))))
    add(_unary("max", X.max, jnp.max, TIES, label="all, ties", smooth=False, shapes=(((2, 3),),)))
    add(_unary("min", X.min, jnp.min, TIES, label="all, ties", smooth=False, shapes=(((3, 2),),)))
    add(_unary("max", lambda x: X.max(x, dim=1).values, lambda x: jnp.max(x, axis=1), label="dim=1", shapes=(((2, 3),),)))
    add(_unary("max", lambda x: X.max(x, dim=0, keepdim=True).values, lambda x: jnp.max(x, axis=0, keepdims=True),
               label="dim=0,keepdim", shapes=(((3, 2),),)))
    add(_unary("min", X.min, jnp.min, label="all", shapes=(((2, 3),), ((),))))
    add(_unary("min", lambda x: X.min(x, dim=-1).values, lambda x: jnp.min(x, axis=-1), label="dim=-1", shapes=(((2, 3),),)))
    add(_unary("cumsum", lambda x: X.cumsum(x, 1), lambda x: jnp.cumsum(x, axis=1), shapes=(((2, 3),), ((2, 4, 2),))))
    add(_unary("cumsum", lambda x: X.cumsum(x, 0), lambda x: jnp.cumsum(x, axis=0), label="dim=0", shapes=(((4,),),)))
    add(_unary("sum_to", lambda x: X.sum_to(x, (3, 1)), lambda x: _ref_sum_to(x, (3, 1)), shapes=(((2, 3, 4),), ((3, 4),))))
    add(_unary("sum_to", lambda x: X.sum_to(x, (2, 3)), lambda x: x, label="same shape", shapes=(((2, 3),),)))
    # -- nn ----------------------------------------------------------------------------
    add(_unary("softmax", lambda x: X.softmax(x, -1), lambda x: jax.nn.softmax(x, axis=-1), shapes=(((3,),), ((2, 4),))))
    add(_unary("softmax", lambda x: X.softmax(x, dim=0), lambda x: jax.nn.softmax(x, axis=0), label="dim=0", shapes=(((3, 2),),)))
    add(_unary("log_softmax", lambda x: X.log_softmax(x, -1), lambda x: jax.nn.log_softmax(x, axis=-1),
               shapes=(((3,),), ((2, 4),))))
    add(_unary("log_softmax", lambda x: X.log_softmax(x, dim=0), lambda x: jax.nn.log_softmax(x, axis=0), label="dim=0",
               shapes=(((3, 2),),)))
    for reduction in ("mean", "sum", "none"):
        add(OpSpec("cross_entropy", lambda x, t, r=reduction: X.cross_entropy(x, t, reduction=r),
                   lambda x, t, r=reduction: _ref_cross_entropy(x, t, r), (((4, 3), (4,)),), (REAL, ints(3)),
                   label=f"class indices, {reduction}"))
    add(OpSpec("cross_entropy", lambda x, t: X.cross_entropy(x, t, label_smoothing=0.1),
               lambda x, t: _ref_cross_entropy(x, t, smoothing=0.1), (((4, 3), (4,)),), (REAL, ints(3)), label="label_smoothing"))
    add(OpSpec("cross_entropy", lambda x, t: X.cross_entropy(x, t, ignore_index=-1, label_smoothing=0.2),
               lambda x, t: _ref_cross_entropy(x, t, smoothing=0.2, ignore_index=-1), (((8, 3), (8,)),),
               (REAL, ints(3, low=-1)), label="ignore_index"))
    add(OpSpec("cross_entropy", X.cross_entropy, lambda x, t: _ref_cross_entropy(jnp.moveaxis(x, 1, -1), t),
               (((2, 3, 4), (2, 4)),), (REAL, ints(3)), label="(N, C, d) class dim 1"))
    add(OpSpec("cross_entropy", X.cross_entropy, _ref_cross_entropy, (((4, 3), (4, 3)),), (REAL, Domain(lo=0, hi=1)),
               label="probabilities"))
    add(_binary("mse_loss", X.mse_loss, lambda x, y: jnp.mean((x - y) ** 2), shapes=BINARY_SHAPES[:1]))
    add(_binary("mse_loss", lambda x, y: X.mse_loss(x, y, reduction="sum"), lambda x, y: jnp.sum((x - y) ** 2),
                label="sum", shapes=BINARY_SHAPES[:1]))
    add(_binary("mse_loss", lambda x, y: X.mse_loss(x, y, reduction="none"), lambda x, y: (x - y) ** 2, label="none",
                shapes=BINARY_SHAPES[:1]))
    add(OpSpec("layer_norm", lambda x, w, b: X.layer_norm(x, (4,), w, b), _ref_layer_norm, (((3, 4), (4,), (4,)),),
               (REAL, REAL, REAL)))
    add(OpSpec("layer_norm", lambda x, w, b: X.layer_norm(x, (2, 3), w, b), lambda x, w, b: _ref_layer_norm(x, w, b, 2),
               (((2, 2, 3), (2, 3), (2, 3)),), (REAL, REAL, REAL), label="2 dims"))
    add(_unary("dropout", lambda x: X.dropout(x, 0.3, key=_DROPOUT_KEY),
               lambda x: x * jax.random.bernoulli(_DROPOUT_KEY, 0.7, x.shape) / 0.7, shapes=(((4, 5),),)))
    # -- shape -------------------------------------------------------------------------
    add(_unary("reshape", lambda x: X.reshape(x, (3, -1)), lambda x: jnp.reshape(x, (3, -1)), shapes=(((2, 3),), ((6,),))))
    add(_unary("reshape", lambda x: x.reshape(()), lambda x: jnp.reshape(x, ()), label="to 0-dim", shapes=(((1, 1),),)))
    add(_unary("view", lambda x: x.view(4, 3), lambda x: jnp.reshape(x, (4, 3)), shapes=(((2, 6),),)))
    add(_unary("flatten", X.flatten, jnp.ravel, shapes=(((2, 3, 2),), ((),))))
    add(_unary("flatten", lambda x: X.flatten(x, 1), lambda x: jnp.reshape(x, (2, -1)), label="start_dim=1",
               shapes=(((2, 3, 2),),)))
    add(_unary("squeeze", X.squeeze, jnp.squeeze, shapes=(((1, 3, 1),),)))
    add(_unary("squeeze", lambda x: X.squeeze(x, 0), lambda x: jnp.squeeze(x, 0), label="dim=0", shapes=(((1, 3, 1),),)))
    add(_unary("unsqueeze", lambda x: X.unsqueeze(x, -1), lambda x: jnp.expand_dims(x, -1), shapes=(((2, 3),), ((),))))
    add(_unary("transpose", lambda x: X.transpose(x, 0, 2), lambda x: jnp.swapaxes(x, 0, 2), shapes=(((2, 3, 4),),)))
    add(_unary("permute", lambda x: X.permute(x, 2, 0, 1), lambda x: jnp.transpose(x, (2, 0, 1)), shapes=(((2, 3, 4),),)))
    add(_unary("expand", lambda x: X.expand(x, 2, -1, 3), lambda x: jnp.broadcast_to(x, (2, 4, 3)), shapes=(((4, 1),),)))
    add(_unary("broadcast_to", lambda x: X.broadcast_to(x, (2, 3, 4)), lambda x: jnp.broadcast_to(x, (2, 3, 4)),
               shapes=(((3, 1),), ((),), ((4,),))))
    add(_unary("T", X.T, lambda x: x.T, shapes=(((2, 3),), ((2, 3, 4),), ((),))))
    add(_unary("mT", X.mT, lambda x: jnp.swapaxes(x, -1, -2), shapes=(((2, 3),), ((2, 3, 4),))))
    add(_unary("transpose", lambda x: x.permute(1, 0, 2).reshape(3, 8), lambda x: jnp.transpose(x, (1, 0, 2)).reshape(3, 8),
               label="composed", shapes=(((2, 3, 4),),)))
    cat_shapes = (((2, 3), (1, 3), (4, 3)),)
    add(OpSpec("cat", lambda *xs: X.cat(xs), lambda *xs: jnp.concatenate(xs), cat_shapes, (REAL,) * 3))
    add(OpSpec("vstack", lambda a, b, c: X.vstack([a, b, c]), lambda a, b, c: jnp.vstack([a, b, c]),
               (((3,), (2, 3), (1, 3)),), (REAL,) * 3))
    add(OpSpec("concatenate", lambda a, b: X.concatenate([a, b], dim=-1), lambda a, b: jnp.concatenate([a, b], axis=-1),
               (((2, 3), (2, 1)),), (REAL, REAL)))
    add(OpSpec("stack", lambda a, b: X.stack([a, b], dim=1), lambda a, b: jnp.stack([a, b], axis=1),
               (((2, 3), (2, 3)),), (REAL, REAL)))
    add(OpSpec("stack", lambda a, b: X.stack([a, b]), lambda a, b: jnp.stack([a, b]), (((), ()),), (REAL, REAL), label="0-dim"))
    add(_unary("split", lambda x: X.split(x, 2, dim=1), lambda x: tuple(jnp.split(x, [2, 4], axis=1)), shapes=(((2, 5),),)))
    add(_unary("split", lambda x: X.split(x, [1, 3]), lambda x: tuple(jnp.split(x, [1])), label="sizes", shapes=(((4, 2),),)))
    add(_unary("chunk", lambda x: X.chunk(x, 3), lambda x: tuple(jnp.array_split(x, 3)), shapes=(((6, 2),),)))
    add(_unary("pad", lambda x: X.pad(x, (1, 2)), lambda x: jnp.pad(x, ((0, 0), (1, 2))), shapes=(((2, 3),),)))
    add(_unary("pad", lambda x: X.pad(x, (1, 0, 0, 2), value=1.5), lambda x: jnp.pad(x, ((0, 2), (1, 0)), constant_values=1.5),
               label="2 dims, value", shapes=(((2, 3),),)))
    add(_unary("pad", lambda x: X.pad(x, (-1, 2, 1, -2), value=0.5), lambda x: jnp.pad(x[:1, 1:], ((1, 0), (0, 2)), constant_values=0.5),
               label="negative widths crop", shapes=(((3, 4),),)))
    add(_unary("flip", lambda x: X.flip(x, (0, -1)), lambda x: jnp.flip(x, (0, -1)), shapes=(((2, 3),),)))
    add(_unary("roll", lambda x: X.roll(x, 1, 1), lambda x: jnp.roll(x, 1, 1), shapes=(((2, 3),),)))
    add(_unary("roll", lambda x: X.roll(x, 2), lambda x: jnp.roll(x, 2), label="flat", shapes=(((2, 3),),)))
    add(_unary("tril", X.tril, jnp.tril, shapes=(((3, 3),), ((2, 3, 4),))))
    add(_unary("tril", lambda x: X.tril(x, -1), lambda x: jnp.tril(x, -1), label="k=-1", shapes=(((3, 4),),)))
    add(_unary("triu", lambda x: X.triu(x, 1), lambda x: jnp.triu(x, 1), shapes=(((3, 3),), ((2, 3, 4),))))
    # -- indexing ----------------------------------------------------------------------
    add(_unary("getitem", lambda x: x[1:, ::2], lambda x: x[1:, ::2], label="slices", shapes=(((3, 4),),)))
    add(_unary("getitem", lambda x: x[None, ..., 1], lambda x: x[None, ..., 1], label="None, ellipsis", shapes=(((2, 3),),)))
    add(_unary("getitem", lambda x: x[1], lambda x: x[1], label="int", shapes=(((3,),), ((3, 2),))))
    add(_unary("getitem", lambda x: x[_INT_INDEX], lambda x: x[_INT_INDEX], label="int array, repeats", shapes=(((3, 2),),)))
    add(_unary("getitem", lambda x: x[xgrad.tensor(_INT_INDEX), 1], lambda x: x[_INT_INDEX, 1], label="tensor index",
               shapes=(((3, 2),),)))
    add(_unary("getitem", lambda x: x[[0, 1], [2, 2]], lambda x: x[jnp.array([0, 1]), jnp.array([2, 2])],
               label="list indices", shapes=(((2, 3),),)))
    add(_unary("getitem", lambda x: x[_MASK], lambda x: x[_MASK], label="bool mask", shapes=(((2, 3),),)))
    add(_unary("index_scatter", _prim("index_scatter", index=_INT_INDEX, shape=(3, 2)),
               lambda g: jnp.zeros((3, 2), g.dtype).at[_INT_INDEX].add(g), shapes=(((3, 2),),)))
    add(OpSpec("index_put", _setitem_op((slice(None), 1)), lambda x, v: x.at[:, 1].set(v),
               (((3, 2), (3,)), ((3, 2), ())), (REAL, REAL), label="slice"))
    add(OpSpec("index_put", _setitem_op(_MASK), lambda x, v: x.at[_MASK].set(v), (((2, 3), ()),), (REAL, REAL), label="mask"))
    add(OpSpec("gather", lambda x, i: X.gather(x, 1, i), lambda x, i: jnp.take_along_axis(x, i, 1),
               (((2, 3), (2, 4)),), (REAL, ints(3))))
    add(OpSpec("gather", lambda x, i: X.gather(x, 0, i), lambda x, i: jnp.take_along_axis(x, i, 0),
               (((3, 2), (4, 2)),), (REAL, ints(3)), label="dim=0"))
    add(OpSpec("scatter_add", lambda x, i, s: X.scatter_add(x, 1, i, s), lambda x, i, s: _ref_scatter_add(x, i, s, 1),
               (((2, 3), (2, 4), (2, 4)),), (REAL, ints(3), REAL)))
    add(OpSpec("scatter_add", lambda x, i, s: X.scatter_add(x, 0, i, s), lambda x, i, s: _ref_scatter_add(x, i, s, 0),
               (((3, 2), (4, 2), (4, 2)),), (REAL, ints(3), REAL), label="dim=0"))
    add(OpSpec("index_select", lambda x, i: X.index_select(x, 1, i), lambda x, i: jnp.take(x, i, axis=1),
               (((2, 3), (4,)),), (REAL, ints(3))))
    add(OpSpec("take", X.take, lambda x, i: jnp.take(x.reshape(-1), i), (((2, 3), (2, 2)), ((4,), ())), (REAL, ints(4))))
    add(OpSpec("embedding", lambda i, w: X.embedding(i, w), lambda i, w: jnp.take(w, i, axis=0),
               (((2, 3), (5, 4)),), (ints(5), REAL)))
    add(_unary("sort", lambda x: X.sort(x).values, lambda x: jnp.sort(x, axis=-1), shapes=(((2, 4),), ((5,),))))
    add(_unary("sort", lambda x: X.sort(x, dim=0, descending=True).values, lambda x: -jnp.sort(-x, axis=0),
               label="dim=0, descending", shapes=(((3, 2),),)))
    # -- contractions ------------------------------------------------------------------
    matmul_shapes = (
        ((3, 4), (4, 2)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,)), ((2, 1, 3, 4), (3, 4, 2)), ((4,), (2, 4, 3)),
        ((2, 3, 4), (4,)),
    )
    add(OpSpec("matmul", X.matmul, jnp.matmul, matmul_shapes, (REAL, REAL)))
    add(OpSpec("matmul", X.matmul, jnp.matmul, (((3, 3), (3, 3)),), (REAL, REAL), label="square", expr="{0} @ {1}"))
    for subscripts, shapes in (("ij,jk->ik", ((2, 3), (3, 4))), ("bij,bjk->bik", ((2, 2, 3), (2, 3, 2))),
                               ("i,i->", ((3,), (3,))), ("ii->i", ((3, 3),)), ("ij->ji", ((2, 3),))):
        add(OpSpec("einsum", lambda *xs, s=subscripts: X.einsum(s, *xs), lambda *xs, s=subscripts: jnp.einsum(s, *xs),
                   (shapes,), (REAL,) * len(shapes), label=subscripts))
    add(OpSpec("conv2d", X.conv2d, _ref_conv2d, (((1, 2, 5, 5), (3, 2, 3, 3)),), (REAL, REAL)))
    add(OpSpec("conv2d", lambda x, w, b: X.conv2d(x, w, b, stride=2, padding=1),
               lambda x, w, b: _ref_conv2d(x, w, b, stride=2, padding=1),
               (((2, 2, 5, 4), (2, 2, 3, 3), (2,)),), (REAL, REAL, REAL), label="bias, stride, padding"))
    add(OpSpec("conv2d", lambda x, w: X.conv2d(x, w, groups=2), lambda x, w: _ref_conv2d(x, w, groups=2),
               (((1, 4, 4, 4), (2, 2, 3, 3)),), (REAL, REAL), label="groups"))
    add(OpSpec("conv2d", lambda x, w: X.conv2d(x, w, padding="same", dilation=(2, 1)),
               lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", rhs_dilation=(2, 1),
                                                         dimension_numbers=("NCHW", "OIHW", "NCHW")),
               (((2, 2, 6, 5), (3, 2, 2, 3)),), (REAL, REAL), label="same padding, dilation"))
    # -- Tensor methods and functions PyTorch users reach for ---------------------------
    add(_unary("clamp_min", lambda x: X.clamp_min(x, -0.5), lambda x: jnp.maximum(x, -0.5)))
    add(_unary("clamp_max", lambda x: x.clamp_max(0.5), lambda x: jnp.minimum(x, 0.5)))
    add(OpSpec("masked_fill", lambda x, m: X.masked_fill(x, m, -1.5), lambda x, m: jnp.where(m, -1.5, x),
               (((2, 3), (2, 3)), ((2, 3), (3,))), (REAL, BOOLS)))
    add(OpSpec("masked_fill", lambda x, m, v: x.masked_fill(m, v), lambda x, m, v: jnp.where(m, v, x),
               (((2, 3), (2, 3), ()),), (REAL, BOOLS, REAL), label="tensor value"))
    add(_unary("masked_select", lambda x: X.masked_select(x, X.tensor(_MASK)), lambda x: x[_MASK], shapes=(((2, 3),),)))
    add(_unary("masked_select", lambda x: x.masked_select(X.tensor(_MASK[1])), lambda x: x[np.broadcast_to(_MASK[1], (2, 3))],
               label="broadcast mask", shapes=(((2, 3),),)))
    add(_unary("topk", lambda x: X.topk(x, 2).values, lambda x: jax.lax.top_k(x, 2)[0], shapes=(((2, 4),), ((5,),))))
    add(_unary("topk", lambda x: x.topk(2, dim=0, largest=False).values, lambda x: -jax.lax.top_k(-x.T, 2)[0].T,
               label="dim=0, smallest", shapes=(((3, 2),),)))
    add(_unary("norm2", lambda x: X.norm(x, dim=1), lambda x: jnp.linalg.norm(x, axis=1), shapes=(((2, 3),),)))
    add(_unary("norm", X.norm, lambda x: jnp.linalg.norm(x.ravel()), label="fro, all", shapes=(((2, 3),), ((4,),))))
    add(_unary("norm", lambda x: x.norm(2, dim=-1, keepdim=True), lambda x: jnp.linalg.norm(x, axis=-1, keepdims=True),
               label="p=2, keepdim", shapes=(((2, 3),),)))
    add(_unary("norm", lambda x: x.norm(1, dim=0), lambda x: jnp.sum(jnp.abs(x), axis=0), Domain(lo=0.2, hi=2.0),
               label="p=1", shapes=(((2, 3),),)))
    add(_unary("norm", lambda x: x.norm(float("inf"), dim=1), lambda x: jnp.max(jnp.abs(x), axis=1), label="p=inf",
               shapes=(((2, 3),),)))
    add(_unary("norm", lambda x: x.norm(3), lambda x: jnp.sum(jnp.abs(x) ** 3) ** (1 / 3), Domain(lo=0.2, hi=2.0),
               label="p=3", shapes=(((2, 3),),)))
    add(OpSpec("outer", X.outer, jnp.outer, (((3,), (4,)),), (REAL, REAL)))
    add(OpSpec("bmm", X.bmm, jnp.matmul, (((2, 3, 4), (2, 4, 2)),), (REAL, REAL)))
    add(OpSpec("mm", X.mm, jnp.matmul, (((2, 3), (3, 4)),), (REAL, REAL)))
    add(OpSpec("baddbmm", lambda i, a, b: X.baddbmm(i, a, b, beta=0.5, alpha=2.0), lambda i, a, b: 0.5 * i + 2.0 * (a @ b),
               (((2, 3, 2), (2, 3, 4), (2, 4, 2)), ((3, 2), (2, 3, 4), (2, 4, 2))), (REAL, REAL, REAL)))
    add(OpSpec("baddbmm", lambda i, a, b: i.baddbmm(a, b, beta=0), lambda i, a, b: a @ b + 0 * i,
               (((2, 3, 2), (2, 3, 4), (2, 4, 2)),), (REAL, REAL, REAL), label="beta=0"))
    add(_unary("repeat", lambda x: x.repeat(2, 1, 2), lambda x: jnp.tile(x, (2, 1, 2)), shapes=(((2, 3),),)))
    add(_unary("repeat", lambda x: X.repeat(x, (3,)), lambda x: jnp.tile(x, 3), label="0-dim", shapes=(((),),)))
    add(_unary("repeat_interleave", lambda x: x.repeat_interleave(2, dim=1), lambda x: jnp.repeat(x, 2, axis=1),
               shapes=(((2, 3),),)))
    add(_unary("repeat_interleave", lambda x: X.repeat_interleave(x, 3), lambda x: jnp.repeat(x.ravel(), 3), label="flat",
               shapes=(((2, 2),),)))
    add(_unary("repeat_interleave", lambda x: X.repeat_interleave(x, X.tensor(np.array([1, 0, 2])), dim=-1),
               lambda x: jnp.repeat(x, np.array([1, 0, 2]), axis=-1), label="tensor repeats", shapes=(((2, 3),),)))
    add(_unary("unbind", lambda x: x.unbind(1), lambda x: tuple(jnp.moveaxis(x, 1, 0)), shapes=(((2, 3),), ((3, 2, 2),))))
    add(_unary("unbind", X.unbind, lambda x: (x[0],), label="one slice", shapes=(((1, 3),),)))
    add(_unary("narrow", lambda x: x.narrow(1, 1, 2), lambda x: x[:, 1:3], shapes=(((2, 4),),)))
    add(_unary("narrow", lambda x: X.narrow(x, 0, -2, 2), lambda x: x[-2:], label="negative start", shapes=(((3, 2),),)))
    add(_unary("select", lambda x: x.select(0, -1), lambda x: x[-1], shapes=(((3, 2),),)))
    add(_unary("select", lambda x: X.select(x, 1, 2), lambda x: x[:, 2], label="dim=1", shapes=(((2, 3),),)))
    add(_unary("movedim", lambda x: X.movedim(x, (0, 1), (2, 0)), lambda x: jnp.moveaxis(x, (0, 1), (2, 0)),
               shapes=(((2, 3, 4),),)))
    add(_unary("movedim", lambda x: x.movedim(-1, 0), lambda x: jnp.moveaxis(x, -1, 0), label="one dim", shapes=(((2, 3),),)))
    add(_unary("diag", X.diag, jnp.diag, label="vector", shapes=(((3,),),)))
    add(_unary("diag", lambda x: X.diag(x, -1), lambda x: jnp.diag(x, -1), label="vector, diagonal=-1", shapes=(((2,),),)))
    add(_unary("diag", lambda x: x.diag(1), lambda x: jnp.diag(x, 1), label="matrix, diagonal=1", shapes=(((3, 4),), ((4, 2),))))
    add(_unary("unfold", lambda x: x.unfold(1, 2, 1), lambda x: jnp.stack([x[:, i : i + 2] for i in range(4)], axis=1),
               shapes=(((2, 5),),)))
    add(_unary("unfold", lambda x: x.unfold(0, 2, 2), lambda x: jnp.stack([x[i : i + 2] for i in (0, 2)], axis=0).swapaxes(1, 2),
               label="step 2", shapes=(((5, 3),),)))
    add(_unary("expand_as", lambda x: x.expand_as(X.zeros(2, 3, 4)), lambda x: jnp.broadcast_to(x, (2, 3, 4)),
               shapes=(((3, 1),), ((),))))
    add(_unary("view_as", lambda x: x.view_as(X.zeros(3, 2)), lambda x: x.reshape(3, 2), shapes=(((2, 3),),)))
    add(_unary("reshape_as", lambda x: X.reshape_as(x, X.zeros(6)), jnp.ravel, shapes=(((2, 3),),)))
    add(OpSpec("linear", X.linear, lambda x, w, b: x @ w.T + b, (((2, 3), (4, 3), (4,)), ((3,), (4, 3), (4,))),
               (REAL, REAL, REAL)))
    add(OpSpec("linear", X.linear, lambda x, w: x @ w.T, (((2, 5, 3), (4, 3)),), (REAL, REAL), label="no bias"))
    add(_unary("normalize", X.normalize, lambda x: x / jnp.linalg.norm(x, axis=1, keepdims=True), shapes=(((2, 3),),)))
    add(_unary("normalize", lambda x: X.normalize(x, p=1, dim=0), lambda x: x / jnp.sum(jnp.abs(x), axis=0, keepdims=True),
               Domain(lo=0.2, hi=2.0), label="p=1, dim=0", shapes=(((3, 2),),)))
    for reduction in ("mean", "sum", "none"):
        add(OpSpec("nll_loss", lambda x, t, r=reduction: X.nll_loss(x, t, reduction=r),
                   lambda x, t, r=reduction: _ref_nll_loss(x, t, reduction=r), (((4, 3), (4,)),), (REAL, ints(3)),
                   label=reduction))
    add(_unary("nll_loss", lambda x: X.nll_loss(x, X.tensor(_NLL_TARGET_IGNORED), weight=X.tensor(_NLL_WEIGHT)),
               lambda x: _ref_nll_loss(x, _NLL_TARGET_IGNORED, _NLL_WEIGHT), label="weight, ignore_index", shapes=(((4, 3),),)))
    add(OpSpec("nll_loss", lambda x, t: X.nll_loss(x, t),
               lambda x, t: _ref_nll_loss(jnp.moveaxis(x, 1, -1).reshape(-1, 3), t.reshape(-1)),
               (((2, 3, 4), (2, 4)),), (REAL, ints(3)), label="(N, C, d)"))
    probs = Domain(lo=0.05, hi=0.95)
    add(OpSpec("binary_cross_entropy", X.binary_cross_entropy, _ref_bce, (((2, 3), (2, 3)), ((4,), (4,))), (probs, Domain(lo=0, hi=1))))
    add(OpSpec("binary_cross_entropy", lambda x, t, w: X.binary_cross_entropy(x, t, weight=w), _ref_bce,
               (((2, 3), (2, 3), (3,)),), (probs, Domain(lo=0, hi=1), POSITIVE), label="weight"))
    add(OpSpec("binary_cross_entropy_with_logits", X.binary_cross_entropy_with_logits, _ref_bce_logits,
               (((2, 3), (2, 3)),), (REAL, Domain(lo=0, hi=1))))
    add(OpSpec("binary_cross_entropy_with_logits", lambda x, t, pw: X.binary_cross_entropy_with_logits(x, t, pos_weight=pw),
               _ref_bce_logits, (((2, 3), (2, 3), (3,)),), (REAL, Domain(lo=0, hi=1), POSITIVE), label="pos_weight"))
    qkv = ((2, 3, 4), (2, 5, 4), (2, 5, 3))
    sdpa = X.scaled_dot_product_attention
    add(OpSpec("scaled_dot_product_attention", sdpa, _ref_sdpa, (qkv, ((2, 2, 3, 4), (2, 1, 5, 4), (1, 2, 5, 3))),
               (REAL, REAL, REAL)))
    add(OpSpec("scaled_dot_product_attention", lambda q, k, v: sdpa(q, k, v, attn_mask=X.tensor(_SDPA_MASK), scale=0.3),
               lambda q, k, v: _ref_sdpa(q, k, v, _SDPA_MASK, scale=0.3), (qkv,), (REAL, REAL, REAL), label="bool mask, scale"))
    add(OpSpec("scaled_dot_product_attention", lambda q, k, v, m: sdpa(q, k, v, attn_mask=m), _ref_sdpa,
               (qkv + ((3, 5),),), (REAL, REAL, REAL, REAL), label="float mask"))
    add(OpSpec("scaled_dot_product_attention", lambda q, k, v: sdpa(q, k, v, is_causal=True),
               lambda q, k, v: _ref_sdpa(q, k, v, causal=True), (qkv,), (REAL, REAL, REAL), label="causal"))
    keep = jax.random.bernoulli(_SDPA_KEY, 0.75, (2, 3, 5)) / 0.75
    add(OpSpec("scaled_dot_product_attention", lambda q, k, v: sdpa(q, k, v, dropout_p=0.25, dropout_key=_SDPA_KEY),
               lambda q, k, v: _ref_sdpa(q, k, v, keep=keep), (qkv,), (REAL, REAL, REAL), label="dropout"))
    add(_unary("interpolate", lambda x: X.interpolate(x, size=(5, 3)), lambda x: _ref_interpolate(x, (5, 3), "nearest"),
               label="nearest", shapes=(((1, 2, 3, 4),),)))
    add(_unary("interpolate", lambda x: X.interpolate(x, scale_factor=2, mode="bilinear"),
               lambda x: _ref_interpolate(x, (6, 8), "bilinear", scales=(0.5, 0.5)), label="bilinear", shapes=(((1, 2, 3, 4),),)))
    add(_unary("interpolate", lambda x: X.interpolate(x, size=(2, 3), mode="bilinear"),
               lambda x: _ref_interpolate(x, (2, 3), "bilinear"), label="bilinear, down", shapes=(((2, 1, 3, 4),),)))
    add(_unary("interpolate", lambda x: X.interpolate(x, size=(5, 2), mode="bilinear", align_corners=True),
               lambda x: _ref_interpolate(x, (5, 2), "bilinear", align_corners=True), label="bilinear, align_corners",
               shapes=(((1, 2, 3, 4),),)))
    # One direction of one recurrent layer: x (T, B, I), h0 (B, H), weights with G gates of H rows. Few
    # specs, one second-order: each compiles a scan, its vjp and its jvp (tests/test_rnn.py covers the rest).
    def scan_shapes(gates: int, bias: bool, lstm: bool = False) -> tuple[tuple[Shape, ...], ...]:
        states = ((2, 4),) * (2 if lstm else 1)
        return (((3, 2, 3), *states, (gates * 4, 3), (gates * 4, 4), *(((gates * 4,),) * 2 if bias else ())),)

    for mode, gates, reverse, bias in (("rnn_tanh", 1, False, True), ("rnn_relu", 1, True, False), ("gru", 3, True, True)):
        scan = _prim("recurrent_scan", mode=mode, reverse=reverse)
        add(OpSpec("recurrent_scan", (lambda *a, f=scan: f(*a, *(None,) * (6 - len(a)))),
                   (lambda *a, m=mode, r=reverse: reference_recurrent(*a, mode=m, reverse=r)),
                   scan_shapes(gates, bias), (UNIT,) * (6 if bias else 4), label=f"{mode}, reverse={reverse}, bias={bias}",
                   smooth=mode != "rnn_relu", second_order=mode == "rnn_tanh"))
    lstm = _prim("lstm_scan", reverse=True)
    add(OpSpec("lstm_scan", lambda *a: lstm(*a, None), lambda *a: reference_lstm(*a, reverse=True), scan_shapes(4, True, lstm=True), (UNIT,) * 7,
               label="reverse", second_order=False))
    # Imported here: that module builds on this one's OpSpec and domains.
    from xgrad.testing.nn_op_specs import activation_and_loss_specs

    specs += activation_and_loss_specs()
    specs += nn_specs()  # pooling, norms, conv1d, embedding options (xgrad/testing/nn_specs.py)
    from xgrad.testing.layer_specs import layer_specs

    specs += layer_specs()  # 3-d and transposed convs, 3-d pools, pixel shuffle, margin losses
    return specs


OP_SPECS: tuple[OpSpec, ...] = tuple(_build_specs())


def specs_for(name: str) -> list[OpSpec]:
    """The specs that cover op ``name``."""
    return [s for s in OP_SPECS if s.name == name]


def uncovered_ops(names: Sequence[str] | None = None) -> list[str]:
    """Registry primitives and ``DIFFERENTIABLE_OPS`` names that have no spec.

    >>> uncovered_ops()
    []
    """
    if names is None:
        names = sorted(set(REGISTRY) | set(xgrad.ops.DIFFERENTIABLE_OPS))
    covered = {s.name for s in OP_SPECS}
    return [n for n in names if n not in covered]
