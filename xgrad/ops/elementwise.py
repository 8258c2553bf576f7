"""Elementwise primitives: arithmetic, transcendental functions, activations, comparisons.

Every rule is one line ``rule(g, out, *inputs, **params)`` in xgrad ops (NOTE
[Derivatives are data] in registry.py); broadcasting is undone by ``validate_outputs``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.engine.node import sharding_of
from xgrad.jax_internals import single_device_sharding
from xgrad.ops import shape_rules
from xgrad.ops._util import as_array, check_values, inplace_or_not, nondiff
from xgrad.ops.autocast import autocast_op
from xgrad.ops.registry import defprim
from xgrad.tensor import Tensor, torch_dtype_name
from xgrad.tensor.devices import resolve_device

_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _inexact(x: Any) -> Any:
    """``x`` in the default float dtype if it is an integer or bool array, as PyTorch promotes for ``sigmoid``/``rsqrt``."""
    return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.result_type(float))


# -- arithmetic ----------------------------------------------------------------------
add_primitive = defprim("add", jnp.add, (lambda g, out, x, y: g, lambda g, out, x, y: g), save=(), shape_rule=shape_rules.elementwise, doc="""Elementwise sum with broadcasting.

    >>> import xgrad
    >>> xgrad.add(xgrad.tensor([1.0, 2.0]), 1.0).tolist()
    [2.0, 3.0]
    """)
sub_primitive = defprim("sub", jnp.subtract, (lambda g, out, x, y: g, lambda g, out, x, y: -g), save=(), shape_rule=shape_rules.subtraction, doc="""Elementwise difference with broadcasting.

    >>> import xgrad
    >>> xgrad.sub(xgrad.tensor([3.0, 5.0]), xgrad.tensor([1.0, 2.0])).tolist()
    [2.0, 3.0]
    """)
mul = defprim("mul", jnp.multiply, (lambda g, out, x, y: g * y, lambda g, out, x, y: g * x), shape_rule=shape_rules.elementwise, doc="""Elementwise product with broadcasting.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> xgrad.mul(x, xgrad.tensor([3.0, 4.0])).sum().backward()
    >>> x.grad.tolist()
    [3.0, 4.0]
    """)


def add(input: Any, other: Any, /, *, alpha: Any = 1) -> Tensor:
    """Elementwise ``input + alpha * other`` with broadcasting (PyTorch's ``add``; ``alpha`` scales ``other``).

    >>> import xgrad
    >>> xgrad.add(xgrad.tensor([1.0, 2.0]), 1.0).tolist(), xgrad.tensor([1.0]).add(xgrad.tensor([2.0]), alpha=-0.5).tolist()
    ([2.0, 3.0], [0.0])
    """
    return add_primitive(input, other if alpha == 1 else mul(other, alpha))


def sub(input: Any, other: Any, /, *, alpha: Any = 1) -> Tensor:
    """Elementwise ``input - alpha * other`` with broadcasting (PyTorch's ``sub``; ``alpha`` scales ``other``).

    >>> import xgrad
    >>> xgrad.sub(xgrad.tensor([3.0, 5.0]), xgrad.tensor([1.0, 2.0])).tolist()
    [2.0, 3.0]
    """
    return sub_primitive(input, other if alpha == 1 else mul(other, alpha))


div = defprim("div", jnp.true_divide, (lambda g, out, x, y: g / y, lambda g, out, x, y: -g * x / (y * y)), shape_rule=shape_rules.elementwise, doc="""Elementwise true division with broadcasting.

    >>> import xgrad
    >>> xgrad.div(xgrad.tensor([1.0, 3.0]), 2.0).tolist()
    [0.5, 1.5]
    """)
neg = defprim("neg", jnp.negative, (lambda g, out, x: -g,), save=(), shape_rule=shape_rules.not_bool(
    "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to invert a mask, use the `~` or "
    "`logical_not()` operator instead."
), doc="""Elementwise negation.

    >>> import xgrad
    >>> xgrad.neg(xgrad.tensor([1.0, -2.0])).tolist()
    [-1.0, 2.0]
    """)
clone = defprim("clone", lambda x: jnp.array(x, copy=True), (lambda g, out, x: g,), save=(), doc="""A copy of ``x`` that stays in the graph (the gradient passes through).

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> y = xgrad.clone(x)
    >>> y is x, y.tolist()
    (False, [1.0, 2.0])
    """)


def _pow_base_grad(g: Tensor, out: Tensor, x: Any, y: Any) -> Tensor:
    # d/dx x**y = y x**(y-1), and 0 wherever y == 0 (even at x == 0), as PyTorch's pow_backward.
    if isinstance(y, (int, float)):
        return Tensor(jnp.zeros_like(g._array)) if y == 0 else g * y * x ** (y - 1)
    return where(y == 0, 0.0, g * y * x ** (y - 1))


def _pow_exponent_grad(g: Tensor, out: Tensor, x: Any, y: Any) -> Tensor:
    # d/dy x**y = x**y log x. At x == 0 PyTorch defines it as 0 for y >= 0 (by continuity)
    # and -inf for y < 0 (its limit as x -> +0). The log reads a safe base so that
    # double backward through the unselected branch stays finite.
    at_zero = where(y >= 0, 0.0, -math.inf)
    return g * where(x == 0, at_zero, out * log(where(x == 0, 1.0, x)))


_pow = defprim("pow", jnp.power, (_pow_base_grad, _pow_exponent_grad), save_out=True, shape_rule=shape_rules.elementwise)


def _is_integral(v: Any) -> bool:
    if isinstance(v, Tensor):
        return v.dtype.kind in "iu"  # not ``jnp.issubdtype``: this runs on every ``**``
    return isinstance(v, int) and not isinstance(v, bool)


def _negative_int_power() -> RuntimeError:
    return RuntimeError("Integers to negative integer powers are not allowed.")


@autocast_op
def pow(x: Any, y: Any) -> Tensor:
    """``x ** y`` elementwise; differentiable in both the base and the exponent.

    An integer base to a negative integer power raises, as in PyTorch (JAX would return garbage).

    >>> import xgrad
    >>> xgrad.pow(xgrad.tensor([2.0, 3.0]), 2.0).tolist()
    [4.0, 9.0]
    >>> xgrad.pow(xgrad.tensor([2, 3]), -1)
    Traceback (most recent call last):
    RuntimeError: Integers to negative integer powers are not allowed.
    """
    if _is_integral(x) and _is_integral(y):
        if isinstance(y, Tensor):
            check_values(_any_negative, y, _negative_int_power)
        elif y < 0:
            raise _negative_int_power()
    return _pow(x, y)


def _any_negative(a: Any) -> Any:
    return (a < 0).any()


# -- transcendental ------------------------------------------------------------------
exp = autocast_op(defprim("exp", jnp.exp, (lambda g, out, x: g * out,), save=(), save_out=True, doc="""Elementwise ``e ** x``.

    >>> import xgrad
    >>> xgrad.exp(xgrad.tensor([0.0])).tolist()
    [1.0]
    >>> print(f"{xgrad.exp(xgrad.tensor(1.0)).item():.4f}")
    2.7183
    """))
log = autocast_op(defprim("log", jnp.log, (lambda g, out, x: g / x,), doc="""Elementwise natural logarithm.

    >>> import xgrad
    >>> xgrad.log(xgrad.tensor([1.0])).tolist()
    [0.0]
    >>> print(f"{xgrad.log(xgrad.tensor(2.0)).item():.4f}")
    0.6931
    """))
log1p = autocast_op(defprim("log1p", jnp.log1p, (lambda g, out, x: g / (x + 1),), doc="""Elementwise ``log(1 + x)``, accurate for small ``x``.

    >>> import xgrad
    >>> print(f"{xgrad.log1p(xgrad.tensor(1.0)).item():.4f}")
    0.6931
    """))
expm1 = autocast_op(defprim("expm1", jnp.expm1, (lambda g, out, x: g * (out + 1),), save=(), save_out=True, doc="""Elementwise ``exp(x) - 1``, accurate for small ``x``.

    >>> import xgrad
    >>> xgrad.expm1(xgrad.tensor([0.0])).tolist()
    [0.0]
    >>> print(f"{xgrad.expm1(xgrad.tensor(1.0)).item():.4f}")
    1.7183
    """))
sqrt = defprim("sqrt", jnp.sqrt, (lambda g, out, x: g / (out * 2),), save=(), save_out=True, doc="""Elementwise square root.

    >>> import xgrad
    >>> xgrad.sqrt(xgrad.tensor([4.0, 9.0])).tolist()
    [2.0, 3.0]
    """)
rsqrt = autocast_op(defprim("rsqrt", lambda x: jax.lax.rsqrt(_inexact(x)), (lambda g, out, x: g * out * out * out * -0.5,), save=(), save_out=True, doc="""Elementwise reciprocal square root ``1 / sqrt(x)``.

    >>> import xgrad
    >>> xgrad.rsqrt(xgrad.tensor([4.0, 16.0])).tolist()
    [0.5, 0.25]
    """))
abs = defprim("abs", jnp.abs, (lambda g, out, x: g * sign(x),), shape_rule=shape_rules.not_bool_kernel("abs_cpu"), doc="""Elementwise absolute value; the gradient at 0 is 0.

    >>> import xgrad
    >>> xgrad.abs(xgrad.tensor([-1.5, 2.0])).tolist()
    [1.5, 2.0]
    """)
sign: Callable[..., Any] = defprim("sign", lambda x: x if x.dtype == jnp.bool_ else jnp.sign(x), (lambda g, out, x: g * 0,), save=(), doc="""Elementwise sign (-1, 0 or 1); its gradient is 0.

    >>> import xgrad
    >>> xgrad.sign(xgrad.tensor([-2.0, 0.0, 3.0])).tolist()
    [-1.0, 0.0, 1.0]
    """)
sin = defprim("sin", jnp.sin, (lambda g, out, x: g * cos(x),), doc="""Elementwise sine.

    >>> import xgrad
    >>> print(f"{xgrad.sin(xgrad.tensor(1.0)).item():.4f}")
    0.8415
    """)
cos: Callable[..., Any] = defprim("cos", jnp.cos, (lambda g, out, x: -g * sin(x),), doc="""Elementwise cosine.

    >>> import xgrad
    >>> xgrad.cos(xgrad.tensor([0.0])).tolist()
    [1.0]
    """)
tan = autocast_op(defprim("tan", jnp.tan, (lambda g, out, x: g * (out * out + 1),), save=(), save_out=True, doc="""Elementwise tangent.

    >>> import xgrad
    >>> print(f"{xgrad.tan(xgrad.tensor(1.0)).item():.4f}")
    1.5574
    """))
tanh = defprim("tanh", jnp.tanh, (lambda g, out, x: g * (1 - out * out),), save=(), save_out=True, doc="""Elementwise hyperbolic tangent.

    >>> import xgrad
    >>> print(f"{xgrad.tanh(xgrad.tensor(1.0)).item():.4f}")
    0.7616
    """)
erf = defprim("erf", jax.scipy.special.erf, (lambda g, out, x: g * exp(-(x * x)) * (2 / math.sqrt(math.pi)),), doc="""Elementwise error function.

    >>> import xgrad
    >>> print(f"{xgrad.erf(xgrad.tensor(1.0)).item():.4f}")
    0.8427
    """)

# -- activations (fused: one node each instead of a chain) ---------------------------
sigmoid = defprim("sigmoid", lambda x: jax.nn.sigmoid(_inexact(x)), (lambda g, out, x: g * out * (1 - out),), save=(), save_out=True, doc="""Elementwise logistic sigmoid ``1 / (1 + exp(-x))``.

    >>> import xgrad
    >>> xgrad.sigmoid(xgrad.tensor([0.0])).tolist()
    [0.5]
    """)
threshold_backward: Callable[..., Any] = defprim(
    "threshold_backward",
    lambda g, out: jnp.where(out > 0, g, jnp.zeros((), g.dtype)),
    # As PyTorch's: differentiable in ``out`` too, with a zero derivative, so that a gradient
    # of ``relu`` taken with ``create_graph=True`` requires grad as PyTorch's does.
    (lambda gg, o, g, out: threshold_backward(gg, out), lambda gg, o, g, out: gg * 0),
    shape_rule=shape_rules.elementwise,
    doc="""``relu``'s backward: ``g`` where ``out > 0``, else 0.

    >>> import xgrad
    >>> xgrad.ops.elementwise.threshold_backward(xgrad.tensor([1.0, 2.0]), xgrad.tensor([0.0, 3.0])).tolist()
    [0.0, 2.0]
    """,
)
_relu = defprim("relu", jax.nn.relu, (lambda g, out, x: threshold_backward(g, out),), save=(), save_out=True,
               shape_rule=shape_rules.not_bool("Boolean inputs not supported for relu"))


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """Elementwise ``max(x, 0)``; the gradient at 0 is 0. ``inplace=True`` rebinds ``input``.

    >>> import xgrad
    >>> xgrad.relu(xgrad.tensor([-1.0, 2.0])).tolist()
    [0.0, 2.0]
    """
    return inplace_or_not(_relu, input, inplace)


_silu = defprim("silu", jax.nn.silu, (lambda g, out, x: g * (sigmoid(x) * (1 + x * (1 - sigmoid(x)))),),
                shape_rule=shape_rules.float_only("silu_cpu"))


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    """Elementwise SiLU (swish), ``x * sigmoid(x)``. ``inplace=True`` rebinds ``input``.

    >>> import xgrad
    >>> print(f"{xgrad.silu(xgrad.tensor(1.0)).item():.4f}")
    0.7311
    """
    return inplace_or_not(_silu, input, inplace)


def _softplus_impl(x: Any, beta: float, threshold: float) -> Any:
    scaled = x * beta
    return jnp.where(scaled > threshold, x, jax.nn.softplus(scaled) / beta)


_softplus = defprim(
    "softplus",
    _softplus_impl,
    (lambda g, out, x, beta, threshold: where(x * beta > threshold, g, g * sigmoid(x * beta)),),
    shape_rule=shape_rules.float_only("softplus_cpu"),
)


@autocast_op
def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta * x)) / beta``, computed stably; ``x`` itself where ``beta * x > threshold``, as PyTorch.

    >>> import xgrad
    >>> print(f"{xgrad.softplus(xgrad.tensor(0.0)).item():.4f}")
    0.6931
    >>> xgrad.softplus(xgrad.tensor([30.0]), beta=2.0).tolist()
    [30.0]
    """
    return _softplus(input, beta=beta, threshold=threshold)


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


_gelu = defprim("gelu", _gelu_impl, (_gelu_grad,), shape_rule=shape_rules.float_only("GeluKernelImpl"))


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU; ``approximate="tanh"`` for the tanh approximation, as in PyTorch.

    >>> import xgrad
    >>> xgrad.gelu(xgrad.tensor([0.0])).tolist()
    [0.0]
    >>> print(f"{xgrad.gelu(xgrad.tensor(1.0)).item():.4f} {xgrad.gelu(xgrad.tensor(1.0), approximate='tanh').item():.4f}")
    0.8413 0.8412
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return _gelu(x, approximate=approximate == "tanh")


# -- selection -----------------------------------------------------------------------
def _tie_split(x: Any, y: Any) -> Any:
    # PyTorch's maximum/minimum rules: the gradient goes where x is not below y, split evenly
    # between equal operands; with a NaN operand neither comparison holds, so both get it whole.
    return where(x < y, 0.0, where(x == y, 0.5, 1.0))


maximum = defprim(
    "maximum",
    jnp.maximum,
    (lambda g, out, x, y: g * _tie_split(x, y), lambda g, out, x, y: g * _tie_split(y, x)),
    shape_rule=shape_rules.elementwise,
    doc="""Elementwise maximum; equal operands share the gradient evenly.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 4.0, 2.0], requires_grad=True)
    >>> xgrad.maximum(x, 2.0).sum().backward()
    >>> x.grad.tolist()
    [0.0, 1.0, 0.5]
    """,
)
minimum = defprim(
    "minimum",
    jnp.minimum,
    (lambda g, out, x, y: g * _tie_split(y, x), lambda g, out, x, y: g * _tie_split(x, y)),
    shape_rule=shape_rules.elementwise,
    doc="""Elementwise minimum; equal operands share the gradient evenly.

    >>> import xgrad
    >>> xgrad.minimum(xgrad.tensor([1.0, 4.0]), xgrad.tensor([3.0, 2.0])).tolist()
    [1.0, 2.0]
    """,
)
where_ = defprim(
    "where",
    jnp.where,
    (None, lambda g, out, c, x, y: where(c, g, 0.0), lambda g, out, c, x, y: where(c, 0.0, g)),
    save=(0,),
    shape_rule=shape_rules.elementwise,
)


def where(condition: Any, x: Any, y: Any) -> Tensor:
    """``x`` where ``condition`` holds, else ``y``; differentiable in ``x`` and ``y``.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, -2.0])
    >>> xgrad.where(x > 0, x, 0.0).tolist()
    [1.0, 0.0]
    """
    condition = as_array(condition)
    if jnp.result_type(condition) != jnp.bool_:  # JAX would take any nonzero as true
        raise RuntimeError(
            f"where expected condition to be a boolean tensor, but got a tensor with dtype {torch_dtype_name(jnp.result_type(condition))}"
        )
    return where_(condition, x, y)


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
    shape_rule=shape_rules.elementwise,
)


def clamp(x: Tensor, min: Any = None, max: Any = None) -> Tensor:
    """Clamp into ``[min, max]``; the gradient passes where ``min <= x <= max``.

    >>> import xgrad
    >>> xgrad.clamp(xgrad.tensor([-1.0, 0.5, 2.0]), min=0.0, max=1.0).tolist()
    [0.0, 0.5, 1.0]
    """
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    return clamp_(x, min, max)


# -- dtype and device ----------------------------------------------------------------
astype = defprim("astype", lambda x, dtype: x.astype(dtype), (lambda g, out, x, dtype: g.to(x.dtype),), save=(), doc="""``x`` cast to ``dtype``; the gradient is cast back to ``x``'s dtype.

    >>> import xgrad
    >>> import jax.numpy as jnp
    >>> xgrad.astype(xgrad.tensor([1.5]), dtype=jnp.float32).dtype
    dtype('float32')
    """)
to_device_: Callable[..., Any] = defprim(
    "to_device",
    lambda x, sharding, source: jax.device_put(x, sharding),
    (lambda g, out, x, sharding, source: to_device_(g, sharding=source, source=sharding),),
    save=(),
    jit=False,
)


def to_device(x: Tensor, device: Any) -> Tensor:
    """Move ``x`` to ``device`` (a ``jax.Device`` or ``Sharding``); the gradient moves back.

    >>> import xgrad
    >>> import jax
    >>> xgrad.to_device(xgrad.tensor([1.0]), jax.devices()[0]).tolist()
    [1.0]
    """
    target = resolve_device(device)
    if not isinstance(target, jax.sharding.Sharding):
        target = single_device_sharding(target)
    return to_device_(x, sharding=target, source=sharding_of(x._array))



def _with_sharding_constraint_backward(g: Tensor, out: Any, x: Any, sharding: Any, source: Any) -> Tensor:
    # JAX's transpose of a sharding constraint: the cotangent is constrained the same way.
    g = with_sharding_constraint_(g, sharding=sharding, source=None)
    if source is not None and source.device_set != sharding.device_set:
        g = to_device_(g, sharding=source, source=sharding)  # eagerly, a gradient lives where its input did
    return g


with_sharding_constraint_: Callable[..., Any] = defprim(
    "with_sharding_constraint",
    lambda x, sharding, source: jax.lax.with_sharding_constraint(x, sharding),
    (_with_sharding_constraint_backward,),
    save=(),
)


def with_sharding_constraint(x: Tensor, sharding: Any) -> Tensor:
    """``x`` laid out as ``sharding`` (a ``jax.sharding.Sharding``); its gradient is laid out the same way.

    What ``jax.lax.with_sharding_constraint`` is to arrays, in every mode: eagerly the
    result is placed so, and inside a compiled backward or ``xgrad.compile`` it is a
    constraint on XLA's partitioner, as under ``jax.jit``. Use it to ask for the FSDP
    pattern: constrain a weight sharded over ``data`` to be replicated where it is used,
    and its gradient comes back reduced onto the shards.

    >>> import jax, xgrad
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.sharding.Mesh(jax.devices()[:1], ("data",))
    >>> y = xgrad.with_sharding_constraint(xgrad.ones(4), NamedSharding(mesh, P("data")))
    >>> y.sharding.mesh.axis_names
    ('data',)
    """
    if not isinstance(sharding, jax.sharding.Sharding):
        raise TypeError(
            "with_sharding_constraint: sharding must be a jax.sharding.Sharding (for example "
            f"NamedSharding(mesh, PartitionSpec(...))), got {type(sharding).__name__}"
        )
    return with_sharding_constraint_(x, sharding=sharding, source=sharding_of(x._array))

# -- non-differentiable --------------------------------------------------------------
eq = nondiff(jnp.equal, "eq", '>>> xgrad.eq(xgrad.tensor([1.0, 2.0]), 2.0).tolist()\n[False, True]', shape_rules.elementwise, module=__name__)
ne = nondiff(jnp.not_equal, "ne", '>>> xgrad.ne(xgrad.tensor([1.0, 2.0]), 2.0).tolist()\n[True, False]', shape_rules.elementwise, module=__name__)
lt = nondiff(jnp.less, "lt", '>>> xgrad.lt(xgrad.tensor([1.0, 2.0]), 2.0).tolist()\n[True, False]', shape_rules.elementwise, module=__name__)
le = nondiff(jnp.less_equal, "le", '>>> xgrad.le(xgrad.tensor([1.0, 3.0]), 2.0).tolist()\n[True, False]', shape_rules.elementwise, module=__name__)
gt = nondiff(jnp.greater, "gt", '>>> xgrad.gt(xgrad.tensor([1.0, 3.0]), 2.0).tolist()\n[False, True]', shape_rules.elementwise, module=__name__)
ge = nondiff(jnp.greater_equal, "ge", '>>> xgrad.ge(xgrad.tensor([1.0, 2.0]), 2.0).tolist()\n[False, True]', shape_rules.elementwise, module=__name__)
logical_and = nondiff(jnp.logical_and, "logical_and", '>>> xgrad.logical_and(xgrad.tensor([True, True]), xgrad.tensor([True, False])).tolist()\n[True, False]', shape_rules.elementwise, module=__name__)
logical_or = nondiff(jnp.logical_or, "logical_or", '>>> xgrad.logical_or(xgrad.tensor([False, False]), xgrad.tensor([True, False])).tolist()\n[True, False]', shape_rules.elementwise, module=__name__)
logical_not = nondiff(jnp.logical_not, "logical_not", '>>> xgrad.logical_not(xgrad.tensor([True, False])).tolist()\n[False, True]', module=__name__)
logical_xor = nondiff(jnp.logical_xor, "logical_xor", '>>> xgrad.logical_xor(xgrad.tensor([True, True]), xgrad.tensor([True, False])).tolist()\n[False, True]', shape_rules.elementwise, module=__name__)
isnan = nondiff(jnp.isnan, "isnan", ">>> xgrad.isnan(xgrad.tensor([1.0, float('nan')])).tolist()\n[False, True]", module=__name__)
isfinite = nondiff(jnp.isfinite, "isfinite", ">>> xgrad.isfinite(xgrad.tensor([1.0, float('inf')])).tolist()\n[True, False]", module=__name__)
floor = nondiff(jnp.floor, "floor", '>>> xgrad.floor(xgrad.tensor([1.5, -1.5])).tolist()\n[1.0, -2.0]', module=__name__)
ceil = nondiff(jnp.ceil, "ceil", '>>> xgrad.ceil(xgrad.tensor([1.5, -1.5])).tolist()\n[2.0, -1.0]', module=__name__)
round = nondiff(jnp.round, "round", '>>> xgrad.round(xgrad.tensor([0.5, 1.5, 2.25])).tolist()\n[0.0, 2.0, 2.0]', module=__name__)


def clamp_min(x: Tensor, min: Any) -> Tensor:
    """``clamp(x, min=min)``.

    >>> import xgrad
    >>> xgrad.clamp_min(xgrad.tensor([-1.0, 2.0]), 0.0).tolist()
    [0.0, 2.0]
    """
    return clamp(x, min=min)


def clamp_max(x: Tensor, max: Any) -> Tensor:
    """``clamp(x, max=max)``.

    >>> import xgrad
    >>> xgrad.clamp_max(xgrad.tensor([-1.0, 2.0]), 0.0).tolist()
    [-1.0, 0.0]
    """
    return clamp(x, max=max)
