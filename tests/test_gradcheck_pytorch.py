"""PyTorch's gradcheck tests (test/test_autograd.py: test_gradcheck_*), eager and compiled.

Their values, messages and raise/return behaviour are PyTorch's; the sparse, MKLDNN and
complex variants have no xgrad counterpart and are left out.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401  (a fixture)
from xgrad.autograd import Function
from xgrad.testing import GradcheckError, gradcheck, gradgradcheck

pytestmark = pytest.mark.usefixtures("eager_and_compiled")  # every test, eager and compiled

FAST_MODES = pytest.mark.parametrize("fast_mode", [True, False], ids=["fast", "slow"])
NOT_DOUBLE = "Input #0 requires gradient and is not a double precision"


def double(*shape, fill=None):
    values = np.full(shape, fill) if fill is not None else np.random.default_rng(0).random(shape)
    return xgrad.tensor(values, dtype="float64", requires_grad=True)


def test_gradcheck_is_a_runtime_error():
    assert issubclass(GradcheckError, RuntimeError)


@FAST_MODES
def test_gradcheck_single_input(fast_mode):
    def f(inp):
        return inp.mul(5)

    assert gradcheck(f, double(10), fast_mode=fast_mode)
    assert gradgradcheck(f, double(10), fast_mode=fast_mode)


def test_unrelated_inputs():
    # grad(grad)check runs even with an unrelated (but differentiable) input
    def my_function(x, y):
        return x * x

    x, y = double(10), double(10)
    assert gradcheck(my_function, (x, y))
    assert gradgradcheck(my_function, (x, y))


class NonDetFunc(Function):
    @staticmethod
    def forward(ctx, x, jitter=0.0):
        ctx._jitter = jitter
        return x

    @staticmethod
    def backward(ctx, grad_out):
        noise = xgrad.tensor(np.random.default_rng().random(grad_out.shape))
        return NonDetFunc.apply(grad_out, ctx._jitter) * (1 + noise * ctx._jitter), None


@FAST_MODES
def test_gradcheck_nondeterministic(fast_mode):
    inp = xgrad.tensor(np.random.default_rng(1).standard_normal((5, 5)), requires_grad=True)
    assert gradcheck(lambda x: NonDetFunc.apply(x, 0.0), inp, fast_mode=fast_mode)
    with pytest.raises(RuntimeError, match="Backward is not reentrant"):
        gradcheck(lambda x: NonDetFunc.apply(x, 1e-6), inp, fast_mode=fast_mode)
    with pytest.raises(RuntimeError, match="Backward is not reentrant"):
        gradgradcheck(lambda x: NonDetFunc.apply(x, 1e-12), inp, fast_mode=fast_mode)
    assert gradcheck(lambda x: NonDetFunc.apply(x, 0.0), inp, nondet_tol=1e-5, fast_mode=fast_mode)
    assert gradcheck(lambda x: NonDetFunc.apply(x, 1e-6), inp, nondet_tol=1e-5, fast_mode=fast_mode)
    assert gradgradcheck(lambda x: NonDetFunc.apply(x, 1e-12), inp, nondet_tol=1e-5, fast_mode=fast_mode)


@FAST_MODES
def test_gradcheck_validates_inputs(fast_mode):
    # none of the inputs require grad: raises even with raise_exception=False
    x = xgrad.rand(10)
    with pytest.raises(ValueError, match="at least one input tensor to require gradient"):
        gradcheck(lambda x: x, (x,), raise_exception=False, fast_mode=fast_mode)
    # a warning when an input is not double precision
    x = xgrad.ones(1, requires_grad=True)
    with pytest.warns(UserWarning, match=NOT_DOUBLE):
        assert gradcheck(lambda x: x, (x,), atol=1e-1, fast_mode=fast_mode)


@FAST_MODES
def test_gradcheck_check_no_differentiable_outputs(fast_mode):
    # No output is differentiable, but the numerical gradient is not zero
    x = double(1, fill=1.0)
    with pytest.raises(RuntimeError, match="Numerical gradient for function expected to be zero"):
        gradcheck(lambda x: x.detach() * 1.0, x, fast_mode=fast_mode)
    assert not gradcheck(lambda x: x.detach() * 1.0, x, raise_exception=False, fast_mode=fast_mode)
    # PyTorch also passes a function with no outputs at all (``lambda x: ()``); xgrad's
    # gradcheck raises TypeError for it, taking it for a function of jax.Arrays gone wrong.


@FAST_MODES
def test_gradcheck_backward_mul_by_grad_output(fast_mode):
    # a backward not multiplied by grad_output
    def fn2(x):
        y = x.clone()
        y.register_hook(lambda x: x + 1e-2)
        return y

    x = double(1, fill=1.0)
    with pytest.raises(RuntimeError, match="backward not multiplied by grad_output"):
        gradcheck(fn2, (x,), atol=1e-1, fast_mode=fast_mode)
    assert not gradcheck(fn2, (x,), atol=1e-1, raise_exception=False, fast_mode=fast_mode)


@FAST_MODES
def test_gradcheck_undefined_grad(fast_mode):
    # a RuntimeError raised while running backward with an undefined output grad
    def fn(x):
        def hook(x):
            if x is None:
                raise RuntimeError("x is undefined")

        y = x.clone()
        y.register_hook(hook)
        return y

    x = double(1, fill=1.0)
    with pytest.warns(UserWarning, match="Backwards compatibility: New undefined gradient support checking feature"):
        with pytest.raises(RuntimeError, match="Expected backward function to handle undefined output grads"):
            gradcheck(fn, (x,), fast_mode=fast_mode)
        assert not gradcheck(fn, (x,), raise_exception=False, fast_mode=fast_mode)
    assert gradcheck(fn, (x,), check_undefined_grad=False, fast_mode=fast_mode)


@FAST_MODES
def test_gradcheck_jacobian_mismatch(fast_mode):
    def fn(x):
        y = x.clone()
        y.register_hook(lambda x: x + 1e-2)
        return y

    x = xgrad.ones(2, 2, requires_grad=True)
    with pytest.warns(UserWarning, match=NOT_DOUBLE):
        with pytest.raises(RuntimeError, match="Jacobian mismatch for output 0 with respect to input 0"):
            gradcheck(fn, (x,), fast_mode=fast_mode)
        assert not gradcheck(fn, (x,), raise_exception=False, fast_mode=fast_mode)


@FAST_MODES
def test_gradcheck_output_shape_or_dtype_depend_on_values(fast_mode):
    def fn(x):
        if bool(xgrad.all(x >= 1)):
            return xgrad.cat([x, x])
        return x

    a = double(1, fill=1.0)
    with pytest.raises(AssertionError, match="return outputs with the same shape when inputs are perturbed"):
        assert gradcheck(fn, (a,), fast_mode=fast_mode)

    def fn2(x):
        if bool(xgrad.all(x >= 1)):
            return x.to(jnp.float32)
        return x

    with pytest.raises(AssertionError, match="return outputs with the same dtype when inputs are perturbed"):
        assert gradcheck(fn2, (a,), fast_mode=fast_mode)


@FAST_MODES
def test_gradcheck_custom_error(fast_mode):
    def fn(x):
        y = x.clone()
        y.register_hook(lambda x: x + 1e-2)
        return y

    x = double(2, 2, fill=1.0)
    with pytest.raises(GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0"):
        gradcheck(fn, (x,), fast_mode=fast_mode)
    with pytest.raises(RuntimeError, match="Jacobian mismatch for output 0 with respect to input 0"):
        gradcheck(fn, (x,), fast_mode=fast_mode)
    assert not gradcheck(fn, (x,), raise_exception=False, fast_mode=fast_mode)

    def fn2(x):
        raise RuntimeError("Not a GradcheckError!")

    # with raise_exception=False, errors that are not GradcheckErrors still propagate
    with pytest.raises(RuntimeError, match="Not a GradcheckError!"):
        gradcheck(fn2, (x,), fast_mode=fast_mode, raise_exception=False)
