"""Second derivatives of activations and pools at and around their kinks, as PyTorch's
derivatives.yaml gives them: ``elu_double_backward`` (masked by ``x < 0``, so 0 at 0), the
piecewise-linear backwards and pool backwards differentiable in their input with a zero
derivative (``self: zeros_like(grad)``: zeros, never ``None`` nor an error), and
``hardsigmoid_backward``, which has no derivative (differentiating it raises).

Each runs eagerly, with the second backward compiled (``backward(compiled=True)``) and
inside ``xgrad.compile``.
"""

import warnings

import jax
import numpy as np
import pytest

import xgrad
import xgrad.nn.functional as F
from xgrad.engine.compiled import RecompileWarning

MODES = ["eager", "compiled", "xgrad.compile"]
KINKS = np.array([-3.0, -1.5, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 1.5, 3.0])


def _first_and_second(fn, x, mode):
    """``d sum(fn(x)) / dx`` (with ``create_graph``) and the gradient of its sum."""
    def step(x):
        (first,) = xgrad.autograd.grad(fn(x).sum(), [x], create_graph=True)
        if mode == "compiled":
            first.sum().backward(compiled=True)
            second = x.grad
        else:
            (second,) = xgrad.autograd.grad(first.sum(), [x], allow_unused=True)
        return first.detach(), second, first.requires_grad

    leaf = xgrad.tensor(x, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecompileWarning)  # every case is a new graph
        return xgrad.compile(step, fallback="error")(leaf) if mode == "xgrad.compile" else step(leaf)


def _elu_reference(x, alpha, scale, input_scale):
    """PyTorch's elu_backward slope and elu_double_backward (its ``x < 0`` mask), in NumPy."""
    first = np.where(x > 0, scale, alpha * scale * input_scale * np.exp(x * input_scale))
    second = np.where(x < 0, alpha * scale * input_scale**2 * np.exp(x * input_scale), 0.0)
    return first, second


SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
ELUS = {
    "elu": (lambda x: F.elu(x, 0.7), (0.7, 1.0, 1.0)),
    "celu": (lambda x: F.celu(x, 1.3), (1.3, 1.0, 1 / 1.3)),
    "selu": (F.selu, (SELU_ALPHA, SELU_SCALE, 1.0)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(ELUS))
def test_elu_family_second_derivative_is_pytorchs_and_zero_at_zero(name, mode):
    fn, constants = ELUS[name]
    first, second, _ = _first_and_second(fn, KINKS, mode)
    want_first, want_second = _elu_reference(KINKS, *constants)
    np.testing.assert_allclose(first.numpy(), want_first, rtol=1e-13)
    np.testing.assert_allclose(second.numpy(), want_second, rtol=1e-13, atol=0)
    assert second.numpy()[KINKS == 0.0] == 0.0


def test_celu_alpha_held_in_float32_keeps_float64_precision():
    # PyTorch's Scalar holds the float32 alpha as a double and takes 1 / alpha in double.
    assert jax.config.jax_enable_x64
    alpha = np.float32(0.3)
    x = np.array([-2.0, -0.7, -1e-3, 0.5])
    want = np.where(x > 0, x, float(alpha) * np.expm1(x / float(alpha)))
    got = F.celu(xgrad.tensor(x), alpha)
    assert got.dtype == xgrad.float64
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-15, atol=1e-17)


# Piecewise-linear in x once the kink side or the window is chosen: the second derivative is
# zeros (PyTorch: ``self: zeros_like(grad)``), and the first gradient requires grad.
PIECEWISE_LINEAR = {
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "threshold": lambda x: F.threshold(x, 0.5, -2.0),
    "hardtanh": lambda x: F.hardtanh(x, -1.0, 1.5),
    "relu6": lambda x: F.relu6(x * 3.0),
    "hardshrink": lambda x: F.hardshrink(x, 0.5),
    "softshrink": lambda x: F.softshrink(x, 0.5),
    "max_pool1d": lambda x: F.max_pool1d(x.reshape(1, 2, 5), 2, 1),
    "max_pool2d": lambda x: F.max_pool2d(x.reshape(1, 1, 2, 5), 2, 1),
    "adaptive_max_pool2d": lambda x: F.adaptive_max_pool2d(x.reshape(1, 1, 2, 5), (1, 2)),
    "avg_pool2d": lambda x: F.avg_pool2d(x.reshape(1, 1, 2, 5), 2, 1),
    "adaptive_avg_pool2d": lambda x: F.adaptive_avg_pool2d(x.reshape(1, 1, 2, 5), 1),
}
# The slopes PyTorch's backward kernels take at each input of KINKS (kinks included).
SLOPES = {
    "leaky_relu": np.where(KINKS > 0, 1.0, 0.1),
    "threshold": (KINKS > 0.5) * 1.0,
    "hardtanh": ((KINKS > -1.0) & (KINKS < 1.5)) * 1.0,
    "relu6": ((KINKS * 3 > 0) & (KINKS * 3 < 6)) * 3.0,
    "hardshrink": ((KINKS < -0.5) | (KINKS > 0.5)) * 1.0,
    "softshrink": ((KINKS < -0.5) | (KINKS > 0.5)) * 1.0,
}


# Average pools under xgrad.compile read a tracer's sharding today (a fault of its own).
PIECEWISE_CASES = [(name, mode) for name in sorted(PIECEWISE_LINEAR) for mode in MODES
                   if not (name.startswith(("avg", "adaptive_avg")) and mode == "xgrad.compile")]


@pytest.mark.parametrize(("name", "mode"), PIECEWISE_CASES)
def test_piecewise_linear_ops_have_zero_second_derivatives_not_none(name, mode):
    first, second, first_requires_grad = _first_and_second(PIECEWISE_LINEAR[name], KINKS, mode)
    if name in SLOPES:
        np.testing.assert_array_equal(first.numpy(), SLOPES[name])
    assert first_requires_grad
    assert second is not None, "PyTorch's second gradient is zeros, not None"
    np.testing.assert_array_equal(second.numpy(), np.zeros_like(KINKS))


@pytest.mark.parametrize("mode", MODES)
def test_hardsigmoid_has_no_second_derivative_as_in_pytorch(mode):
    # The first derivative: 1/6 strictly inside (-3, 3), 0 at and beyond, and it requires grad.
    x = xgrad.tensor(KINKS, requires_grad=True)
    (first,) = xgrad.autograd.grad(F.hardsigmoid(x).sum(), [x], create_graph=True)
    assert first.requires_grad
    np.testing.assert_allclose(first.detach().numpy(), ((KINKS > -3) & (KINKS < 3)) / 6.0, rtol=1e-15)
    with pytest.raises(RuntimeError, match="derivative for aten::hardsigmoid_backward is not implemented"):
        _first_and_second(F.hardsigmoid, KINKS, mode)
