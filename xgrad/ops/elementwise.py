"""Elementwise primitives: arithmetic, transcendental functions, activations, comparisons.

Every rule is one line ``rule(g, out, *inputs, **params)`` in xgrad ops (NOTE
[Derivatives are data] in registry.py); broadcasting is undone by ``validate_outputs``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.ops._util import as_array, nondiff
from xgrad.ops.registry import defprim
from xgrad.tensor import Tensor

_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


# -- arithmetic ----------------------------------------------------------------------
add = defprim("add", jnp.add, (lambda g, out, x, y: g, lambda g, out, x, y: g), save=())
sub = defprim("sub", jnp.subtract, (lambda g, out, x, y: g, lambda g, out, x, y: -g), save=())
mul = defprim("mul", jnp.multiply, (lambda g, out, x, y: g * y, lambda g, out, x, y: g * x))
div = defprim("div", jnp.true_divide, (lambda g, out, x, y: g / y, lambda g, out, x, y: -g * x / (y * y)))
neg = defprim("neg", jnp.negative, (lambda g, out, x: -g,), save=())
clone = defprim("clone", lambda x: jnp.array(x, copy=True), (lambda g, out, x: g,), save=())


def _pow_exponent_grad(g: Tensor, out: Tensor, x: Any, y: Any) -> Tensor:
    # d/dy x**y = x**y log x; define it as 0 where x == 0, as jax and PyTorch do.
    safe_log = where(x == 0, 0.0, log(where(x == 0, 1.0, x)))
    return g * out * safe_log


pow = defprim(
    "pow",
    jnp.power,
    (lambda g, out, x, y: g * y * x ** (y - 1), _pow_exponent_grad),
    save_out=True,
)

# -- transcendental ------------------------------------------------------------------
exp = defprim("exp", jnp.exp, (lambda g, out, x: g * out,), save=(), save_out=True)
log = defprim("log", jnp.log, (lambda g, out, x: g / x,))
log1p = defprim("log1p", jnp.log1p, (lambda g, out, x: g / (x + 1),))
expm1 = defprim("expm1", jnp.expm1, (lambda g, out, x: g * (out + 1),), save=(), save_out=True)
sqrt = defprim("sqrt", jnp.sqrt, (lambda g, out, x: g / (out * 2),), save=(), save_out=True)
rsqrt = defprim("rsqrt", jax.lax.rsqrt, (lambda g, out, x: g * out * out * out * -0.5,), save=(), save_out=True)
abs = defprim("abs", jnp.abs, (lambda g, out, x: g * sign(x),))
sign = defprim("sign", jnp.sign, (lambda g, out, x: g * 0,), save=())
sin = defprim("sin", jnp.sin, (lambda g, out, x: g * cos(x),))
cos = defprim("cos", jnp.cos, (lambda g, out, x: -g * sin(x),))
tan = defprim("tan", jnp.tan, (lambda g, out, x: g * (out * out + 1),), save=(), save_out=True)
tanh = defprim("tanh", jnp.tanh, (lambda g, out, x: g * (1 - out * out),), save=(), save_out=True)
erf = defprim("erf", jax.scipy.special.erf, (lambda g, out, x: g * exp(-(x * x)) * (2 / math.sqrt(math.pi)),))

# -- activations (fused: one node each instead of a chain) ---------------------------
sigmoid = defprim("sigmoid", jax.nn.sigmoid, (lambda g, out, x: g * out * (1 - out),), save=(), save_out=True)
relu = defprim("relu", jax.nn.relu, (lambda g, out, x: g * (out > 0),), save=(), save_out=True)
silu = defprim("silu", jax.nn.silu, (lambda g, out, x: g * (sigmoid(x) * (1 + x * (1 - sigmoid(x)))),))
softplus = defprim("softplus", jax.nn.softplus, (lambda g, out, x: g * sigmoid(x),))


def _gelu_impl(x: Any, approximate: bool) -> Any:
    return jax.nn.gelu(x, approximate=approximate)


def _gelu_grad(g: Tensor, out: Any, x: Tensor, approximate: bool) -> Tensor:
    if approximate:
        c = math.sqrt(2 / math.pi)
        inner = c * (x + 0.044715 * x * x * x)
        t = tanh(inner)
        return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x))
    cdf = 0.5 * (1 + erf(x / _SQRT_2))
    pdf = exp(-0.5 * x * x) * _INV_SQRT_2PI
    return g * (cdf + x * pdf)


_gelu = defprim("gelu", _gelu_impl, (_gelu_grad,))


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU; ``approximate="tanh"`` for the tanh approximation, as in PyTorch."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return _gelu(x, approximate=approximate == "tanh")


# -- selection -----------------------------------------------------------------------
def _tie_split(x: Any, y: Any) -> Any:
    # PyTorch splits the gradient evenly between equal operands of maximum/minimum.
    return (x > y) + (x == y) * 0.5


maximum = defprim(
    "maximum",
    jnp.maximum,
    (lambda g, out, x, y: g * _tie_split(x, y), lambda g, out, x, y: g * _tie_split(y, x)),
)
minimum = defprim(
    "minimum",
    jnp.minimum,
    (lambda g, out, x, y: g * _tie_split(y, x), lambda g, out, x, y: g * _tie_split(x, y)),
)
where_ = defprim(
    "where",
    jnp.where,
    (None, lambda g, out, c, x, y: where(c, g, 0.0), lambda g, out, c, x, y: where(c, 0.0, g)),
    save=(0,),
)


def where(condition: Any, x: Any, y: Any) -> Tensor:
    """``x`` where ``condition`` holds, else ``y``; differentiable in ``x`` and ``y``."""
    return where_(as_array(condition), x, y)


def _clamp_x_grad(g: Tensor, out: Any, x: Tensor, lo: Any, hi: Any) -> Tensor:
    inside = True
    if lo is not None:
        inside = (x >= lo) & inside
    if hi is not None:
        inside = (x <= hi) & inside
    return g * inside


clamp_ = defprim(
    "clamp",
    jnp.clip,
    (
        _clamp_x_grad,
        lambda g, out, x, lo, hi: g * (x < lo),
        lambda g, out, x, lo, hi: g * (x > hi),
    ),
)


def clamp(x: Tensor, min: Any = None, max: Any = None) -> Tensor:
    """Clamp into ``[min, max]``; the gradient passes where ``min <= x <= max``."""
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    return clamp_(x, min, max)


# -- dtype and device ----------------------------------------------------------------
astype = defprim("astype", lambda x, dtype: x.astype(dtype), (lambda g, out, x, dtype: g.to(x.dtype),), save=())
to_device_ = defprim(
    "to_device",
    lambda x, sharding, source: jax.device_put(x, sharding),
    (lambda g, out, x, sharding, source: to_device_(g, sharding=source, source=sharding),),
    save=(),
    jit=False,
)


def to_device(x: Tensor, device: Any) -> Tensor:
    """Move ``x`` to ``device`` (a ``jax.Device`` or ``Sharding``); the gradient moves back."""
    from xgrad.creation import resolve_device

    target = resolve_device(device)
    if not isinstance(target, jax.sharding.Sharding):
        target = jax.sharding.SingleDeviceSharding(target)
    return to_device_(x, sharding=target, source=x._array.sharding)


# -- non-differentiable --------------------------------------------------------------
eq = nondiff(jnp.equal, "eq")
ne = nondiff(jnp.not_equal, "ne")
lt = nondiff(jnp.less, "lt")
le = nondiff(jnp.less_equal, "le")
gt = nondiff(jnp.greater, "gt")
ge = nondiff(jnp.greater_equal, "ge")
logical_and = nondiff(jnp.logical_and, "logical_and")
logical_or = nondiff(jnp.logical_or, "logical_or")
logical_not = nondiff(jnp.logical_not, "logical_not")
logical_xor = nondiff(jnp.logical_xor, "logical_xor")
isnan = nondiff(jnp.isnan, "isnan")
isfinite = nondiff(jnp.isfinite, "isfinite")
floor = nondiff(jnp.floor, "floor")
ceil = nondiff(jnp.ceil, "ceil")
round = nondiff(jnp.round, "round")
