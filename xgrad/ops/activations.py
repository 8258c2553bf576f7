"""``torch.nn.functional``'s activations beyond ``relu``/``gelu``/``silu``/``softplus``/``sigmoid``.

Each is a short composite of primitives, written so that its gradient at the kinks is
PyTorch's (``hardtanh``'s is 0 at its bounds, ``leaky_relu``'s is the slope at 0, ...) and
no branch ``where`` leaves unselected can send a NaN into the gradient. ``inplace=True``
rebinds ``input`` as xgrad's in-place methods do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from xgrad.ops import shape_rules
from xgrad.ops._util import canonical_dim, inplace_or_not
from xgrad.ops.autocast import autocast_op
from xgrad.ops.elementwise import abs, exp, sigmoid, softplus, tanh, where
from xgrad.ops.nn import implicit_softmax_dim, softmax
from xgrad.ops.registry import defprim
from xgrad.ops.shape import reshape
from xgrad.tensor import Tensor, torch_dtype_name

__all__ = [
    "celu", "elu", "glu", "hardshrink", "hardsigmoid", "hardswish", "hardtanh", "leaky_relu", "logsigmoid", "mish",
    "prelu", "relu6", "selu", "softmin", "softshrink", "softsign", "tanhshrink", "threshold",
]

# SELU's constants (Klambauer et al. 2017), as PyTorch spells them.
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


# NOTE [Piecewise-linear activations]
# leaky_relu, threshold, hardtanh (relu6), hardsigmoid, hardshrink and softshrink are one
# primitive, ``piecewise_linear`` (``kind`` picks the function, ``a`` and ``b`` its two
# constants), whose rule is a second primitive, ``piecewise_linear_backward``: ``g`` times
# the slope at ``x``, as PyTorch's ``<op>_backward``. As PyTorch's derivatives.yaml, that
# backward is differentiable in ``x`` with a zero derivative (``self: zeros_like(grad)``):
# a gradient taken with ``create_graph=True`` requires grad, and its gradient in ``x``
# is zeros, not an error nor ``None``. hardsigmoid's backward has no derivative in
# PyTorch: differentiating it raises PyTorch's error. Slopes at the kinks are PyTorch's.
_PIECES: dict[str, tuple[Callable[[Any, float, float], Any], Callable[[Any, float, float], Any]]] = {
    # kind: (forward, slope), each of (x, a, b)
    "leaky_relu": (lambda x, a, b: jnp.where(x > 0, x, x * a), lambda x, a, b: jnp.where(x > 0, 1.0, a)),
    "threshold": (lambda x, a, b: jnp.where(x > a, x, b), lambda x, a, b: x > a),
    "hardtanh": (lambda x, a, b: jnp.where(x <= a, a, jnp.where(x >= b, b, x)), lambda x, a, b: (x > a) & (x < b)),
    "hardsigmoid": (
        lambda x, a, b: jnp.where(x <= -3.0, 0.0, jnp.where(x >= 3.0, 1.0, x / 6.0 + 0.5)),
        lambda x, a, b: jnp.where((x > -3.0) & (x < 3.0), 1.0 / 6.0, 0.0),
    ),
    "hardshrink": (lambda x, a, b: jnp.where((x >= -a) & (x <= a), 0.0, x), lambda x, a, b: (x < -a) | (x > a)),
    "softshrink": (
        lambda x, a, b: jnp.where(x > a, x - a, jnp.where(x < -a, x + a, 0.0)), lambda x, a, b: (x < -a) | (x > a),
    ),
}


def _piecewise_linear_impl(x: Any, kind: str, a: float, b: float) -> Any:
    return _PIECES[kind][0](x, a, b).astype(x.dtype)


def _piecewise_linear_backward_impl(g: Any, x: Any, kind: str, a: float, b: float) -> Any:
    slope = _PIECES[kind][1](x, a, b)
    # Selected, not multiplied: a zero slope gives 0 for an inf or NaN ``g``, as PyTorch's kernels.
    return jnp.where(slope != 0, g * jnp.asarray(slope, g.dtype), jnp.zeros((), g.dtype))


def _no_derivative(kind: str) -> None:
    if kind == "hardsigmoid":
        raise RuntimeError("derivative for aten::hardsigmoid_backward is not implemented")


def _backward_grad_of_g(gg: Tensor, out: Any, g: Any, x: Tensor, kind: str, a: float, b: float) -> Tensor:
    _no_derivative(kind)
    return piecewise_linear_backward(gg, x, kind=kind, a=a, b=b)


def _backward_grad_of_x(gg: Tensor, out: Any, g: Any, x: Any, kind: str, a: float, b: float) -> Tensor:
    _no_derivative(kind)
    return Tensor(jnp.zeros_like(gg.array))


piecewise_linear_backward: Callable[..., Any] = defprim(
    "piecewise_linear_backward", _piecewise_linear_backward_impl, (_backward_grad_of_g, _backward_grad_of_x),
    shape_rule=shape_rules.elementwise,
    doc="""The backward of ``piecewise_linear``: ``g`` times the slope at ``x`` (NOTE [Piecewise-linear activations]).

    >>> import xgrad
    >>> from xgrad.ops.activations import piecewise_linear_backward
    >>> piecewise_linear_backward(xgrad.tensor([2.0, 2.0]), xgrad.tensor([-1.0, 1.0]), kind="leaky_relu", a=0.5, b=0.0).tolist()
    [1.0, 2.0]
    """,
)

_piecewise_linear = defprim(
    "piecewise_linear", _piecewise_linear_impl,
    (lambda g, out, x, kind, a, b: piecewise_linear_backward(g, x, kind=kind, a=a, b=b),), save=(0,),
)


def _piece(kind: str, x: Tensor, a: float = 0.0, b: float = 0.0) -> Tensor:
    return _piecewise_linear(x, kind=kind, a=float(a), b=float(b))


def _leaky_relu(x: Tensor, negative_slope: float) -> Tensor:
    return _piece("leaky_relu", x, negative_slope)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """``x`` where positive, else ``negative_slope * x``; the gradient at 0 is the slope, as PyTorch's.

    >>> import xgrad
    >>> xgrad.leaky_relu(xgrad.tensor([-2.0, 3.0]), 0.5).tolist()
    [-1.0, 3.0]
    """
    shape_rules.check_float(input, "leaky_relu_cpu")
    return inplace_or_not(_leaky_relu, input, inplace, negative_slope)


def _elu_impl(x: Any, alpha: float, scale: float, input_scale: float) -> Any:
    # The exponential reads x only where x <= 0, so the branch left out for large x stays finite.
    negative = jnp.expm1(jnp.where(x > 0, 0.0, x) * input_scale) * (alpha * scale)
    return jnp.where(x > 0, x * scale, negative).astype(x.dtype)


def _elu_grad(g: Tensor, out: Any, x: Tensor, alpha: float, scale: float, input_scale: float) -> Tensor:
    # PyTorch's elu_backward: the slope is alpha * scale * input_scale * exp(x * input_scale)
    # for x <= 0, scale above. Its own derivative (elu_double_backward) is masked by x < 0:
    # the exponential reads x only there, so the second derivative at 0 is 0, not alpha.
    negative = exp(where(x < 0, x, 0.0) * input_scale) * (alpha * scale * input_scale)
    return g * where(x > 0, scale, negative)


_elu_primitive = defprim("elu", _elu_impl, (_elu_grad,), shape_rule=shape_rules.float_only("elu_cpu"))


def _elu(x: Tensor, alpha: float, scale: float = 1.0, input_scale: float = 1.0) -> Tensor:
    # The constants as Python floats (PyTorch's Scalars hold doubles): an alpha given as a
    # float32 number must not round 1 / alpha, nor lower a float64 input's precision.
    return _elu_primitive(x, alpha=float(alpha), scale=float(scale), input_scale=float(input_scale))


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``x`` where positive, else ``alpha * (exp(x) - 1)``.

    >>> import xgrad
    >>> [round(v, 4) for v in xgrad.elu(xgrad.tensor([-1.0, 2.0])).tolist()]
    [-0.6321, 2.0]
    """
    shape_rules.check_float(input, "elu_cpu")
    return inplace_or_not(_elu, input, inplace, alpha)


def selu(input: Tensor, inplace: bool = False) -> Tensor:
    """``scale * elu(x, alpha)`` with SELU's fixed ``alpha`` and ``scale``.

    >>> import xgrad
    >>> round(xgrad.selu(xgrad.tensor(1.0)).item(), 4)
    1.0507
    """
    shape_rules.check_float(input, "elu_cpu")
    return inplace_or_not(_elu, input, inplace, _SELU_ALPHA, _SELU_SCALE)


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``.

    >>> import xgrad
    >>> [round(v, 4) for v in xgrad.celu(xgrad.tensor([-1.0, 2.0]), alpha=2.0).tolist()]
    [-0.7869, 2.0]
    """
    if alpha == 0:
        raise RuntimeError("ZeroDivisionError: alpha cannot be 0 for CELU")
    shape_rules.check_float(input, "elu_cpu")
    return inplace_or_not(_elu, input, inplace, alpha, 1.0, 1.0 / float(alpha))


def _hardtanh(x: Tensor, min_val: float, max_val: float) -> Tensor:
    # The gradient is 0 at the bounds too, as PyTorch's.
    return _piece("hardtanh", x, min_val, max_val)


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """``input`` clamped into ``[min_val, max_val]``; the gradient is 1 strictly inside, else 0.

    >>> import xgrad
    >>> xgrad.hardtanh(xgrad.tensor([-2.0, 0.5, 2.0])).tolist()
    [-1.0, 0.5, 1.0]
    """
    if max_val < min_val:
        raise ValueError("min_val cannot be greater than max_val")
    return inplace_or_not(_hardtanh, input, inplace, min_val, max_val)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """``hardtanh(input, 0, 6)``.

    >>> import xgrad
    >>> xgrad.relu6(xgrad.tensor([-1.0, 3.0, 7.0])).tolist()
    [0.0, 3.0, 6.0]
    """
    return inplace_or_not(_hardtanh, input, inplace, 0.0, 6.0)


def _hardswish(x: Tensor) -> Tensor:
    return where(x <= -3.0, 0.0, where(x >= 3.0, x, x * (x + 3.0) / 6.0))


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    """``x * relu6(x + 3) / 6``, with PyTorch's gradient (0 at -3, 1 at 3).

    >>> import xgrad
    >>> xgrad.hardswish(xgrad.tensor([-4.0, 0.0, 1.5, 4.0])).tolist()
    [0.0, 0.0, 1.125, 4.0]
    """
    shape_rules.check_float(input, "hardswish_cpu")
    return inplace_or_not(_hardswish, input, inplace)


def _hardsigmoid(x: Tensor) -> Tensor:
    return _piece("hardsigmoid", x)


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    """``relu6(x + 3) / 6``; the gradient is ``1/6`` strictly inside ``(-3, 3)``, else 0.

    >>> import xgrad
    >>> xgrad.hardsigmoid(xgrad.tensor([-4.0, 0.0, 4.0])).tolist()
    [0.0, 0.5, 1.0]
    """
    return inplace_or_not(_hardsigmoid, input, inplace)


def _mish(x: Tensor) -> Tensor:
    return x * tanh(softplus(x))


@autocast_op
def mish(input: Tensor, inplace: bool = False) -> Tensor:
    """``x * tanh(softplus(x))``.

    >>> import xgrad
    >>> round(xgrad.mish(xgrad.tensor(1.0)).item(), 4)
    0.8651
    """
    return inplace_or_not(_mish, input, inplace)


@autocast_op
def logsigmoid(input: Tensor) -> Tensor:
    """``log(sigmoid(x))``, computed stably as ``-softplus(-x)``.

    >>> import xgrad
    >>> round(xgrad.logsigmoid(xgrad.tensor(0.0)).item(), 4)
    -0.6931
    """
    shape_rules.check_float(input, "log_sigmoid_cpu")
    return -softplus(-input, threshold=float("inf"))


def softsign(input: Tensor) -> Tensor:
    """``x / (1 + |x|)``.

    >>> import xgrad
    >>> xgrad.softsign(xgrad.tensor([-1.0, 3.0])).tolist()
    [-0.5, 0.75]
    """
    return input / (abs(input) + 1)


def tanhshrink(input: Tensor) -> Tensor:
    """``x - tanh(x)``.

    >>> import xgrad
    >>> xgrad.tanhshrink(xgrad.tensor([0.0])).tolist()
    [0.0]
    """
    return input - tanh(input)


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """``x - lambd`` above ``lambd``, ``x + lambd`` below ``-lambd``, else 0.

    >>> import xgrad
    >>> xgrad.softshrink(xgrad.tensor([-2.0, 0.25, 1.0])).tolist()
    [-1.5, 0.0, 0.5]
    """
    if lambd < 0:
        largest = float(jnp.finfo(input.dtype).max)
        raise RuntimeError(
            f"lambda must be in range [0, {largest:g}] for input dtype {torch_dtype_name(input.dtype)}, but found {lambd:g}"
        )
    return _piece("softshrink", input, lambd)


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """``x`` where ``|x| > lambd``, else 0.

    >>> import xgrad
    >>> xgrad.hardshrink(xgrad.tensor([-2.0, 0.25, 1.0])).tolist()
    [-2.0, 0.0, 1.0]
    """
    return _piece("hardshrink", input, lambd)


def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """``x`` where ``x > threshold``, else ``value``.

    >>> import xgrad
    >>> xgrad.threshold(xgrad.tensor([0.5, 2.0]), 1.0, -1.0).tolist()
    [-1.0, 2.0]
    """
    return inplace_or_not(lambda x: _piece("threshold", x, threshold, value), input, inplace)


def glu(input: Tensor, dim: int = -1) -> Tensor:
    """Gated linear unit: ``a * sigmoid(b)`` for ``a, b`` the halves of ``input`` along ``dim``.

    >>> import xgrad
    >>> xgrad.glu(xgrad.tensor([[1.0, 2.0, 0.0, 0.0]])).tolist()
    [[0.5, 1.0]]
    """
    if input.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    axis = canonical_dim(dim, input.ndim)
    size = input.shape[axis]
    if size % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {axis} is size {size}")
    a, b = input.chunk(2, dim=axis)
    return a * sigmoid(b)


def softmin(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    """``softmax(-input, dim)``; ``dim=None`` picks PyTorch's implicit dim, with its warning.

    >>> import xgrad
    >>> xgrad.softmin(xgrad.tensor([0.0, 0.0]), dim=0).tolist()
    [0.5, 0.5]
    """
    if dim is None:
        dim = implicit_softmax_dim("softmin", input.ndim, _stacklevel)
    return softmax(-input if dtype is None else -input.to(dtype), dim)


@autocast_op
def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """``x`` where positive, else ``weight * x``, ``weight`` one slope or one per channel (dim 1).

    >>> import xgrad
    >>> xgrad.prelu(xgrad.tensor([[-2.0, 3.0]]), xgrad.tensor([0.25])).tolist()
    [[-0.5, 3.0]]
    """
    channels = input.shape[1] if input.ndim >= 2 else 1
    if weight.ndim > 1:
        raise RuntimeError(f"prelu: Expected `weight` to be a scalar or 1D tensor, but got: ndim = {weight.ndim}")
    if weight.numel() != 1 and weight.numel() != channels:
        raise RuntimeError(
            "Mismatch of parameter numbers and input channel size. Found parameter numbers = "
            f"{weight.numel()} and channel size = {channels}."
        )
    if weight.numel() != 1:  # one slope per channel, broadcast along the dims after dim 1
        weight = reshape(weight, (channels,) + (1,) * (input.ndim - 2))
    return where(input > 0, input, weight * input)
