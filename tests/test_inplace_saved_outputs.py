"""In-place writes to a tensor whose node saved it as its output (``exp_``, ``sigmoid_``,
``tanh_``, ``relu_``: their rules read the output) are detected at backward, as PyTorch's
version counter detects them (NOTE [In-place results are saved as the tensor]).

Each case runs with the eager engine, the compiled backward and inside ``xgrad.compile``.
"""

import warnings

import numpy as np
import pytest

import xgrad
import xgrad.nn.functional as F
from xgrad.engine.compiled import RecompileWarning

MODES = ["eager", "compiled", "xgrad.compile"]
X = np.array([0.5, -1.0, 2.0, 0.3])
MODIFIED = "one of the variables needed for gradient computation has been modified by an inplace operation"


def _run(build, mode):
    """``build(x)``'s output summed and differentiated; returns ``x.grad``."""
    def step(x):
        out = build(x)
        out.sum().backward(compiled=mode == "compiled")
        return x.grad

    x = xgrad.tensor(X, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecompileWarning)  # every case is a new graph
        return xgrad.compile(step)(x) if mode == "xgrad.compile" else step(x)


def _exp_then_add(x):
    y = x * 1.0
    y.exp_()
    y.add_(1.0)
    return y


def _sigmoid_then_mul(x):
    y = x * 1.0
    y.sigmoid_()
    y.mul_(2.0)
    return y


def _relu_inplace_then_mul(x):
    y = F.relu(x * 1.0, inplace=True)
    y.mul_(2.0)
    return y


def _tanh_then_write_a_view(x):
    y = x * 1.0
    y.tanh_()
    y[0:2].add_(1.0)
    return y


def _exp_of_a_dropped_view_then_write_the_base(x):
    y = x * 1.0
    y.unsqueeze(0).exp_()  # the view is gone by the backward; its base's version is not
    y.add_(1.0)
    return y


def _exp_of_a_view_then_write_the_view(x):
    y = x * 1.0
    v = y.view(2, 2)
    v.exp_()
    v.add_(1.0)
    return y


CASES = [_exp_then_add, _sigmoid_then_mul, _relu_inplace_then_mul, _tanh_then_write_a_view,
         _exp_of_a_dropped_view_then_write_the_base, _exp_of_a_view_then_write_the_view]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("build", CASES, ids=[c.__name__.strip("_") for c in CASES])
def test_writing_a_tensor_whose_inplace_op_saved_it_raises_at_backward(build, mode):
    with pytest.raises(RuntimeError, match=MODIFIED):
        _run(build, mode)


def _exp_then_read(x):
    y = x * 1.0
    y.exp_()
    return y * 2.0


def _exp_of_a_view_then_read_the_base(x):
    y = x * 1.0
    y.view(2, 2).exp_()
    return y * y


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("build", "want"), [
    (_exp_then_read, 2.0 * np.exp(X)),  # d/dx 2 exp(x)
    (_exp_of_a_view_then_read_the_base, 2.0 * np.exp(2.0 * X)),  # d/dx exp(x)^2
], ids=["exp_then_read", "exp_of_a_view_then_read_the_base"])
def test_reading_the_tensor_after_its_inplace_op_still_differentiates(build, want, mode):
    np.testing.assert_allclose(np.asarray(_run(build, mode)), want, rtol=1e-12)


def test_a_write_through_data_is_not_seen_as_in_pytorch():
    # ``.data`` shares the value but not the version counter: PyTorch's backward then reads
    # the new value without an error (exp's rule reads its output: the doubled exp).
    x = xgrad.tensor(X, requires_grad=True)
    y = x * 1.0
    y.exp_()
    y.data.mul_(2.0)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2.0 * np.exp(X), rtol=1e-12)
