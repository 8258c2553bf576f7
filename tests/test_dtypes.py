"""Dtypes: forward and backward keep float16/bfloat16/float32/float64, and promotion follows jnp."""

import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad.testing import assert_grads_match
from xgrad.testing.op_specs import specs_for

TOLERANCE = {"float16": (2e-3, 2e-2), "bfloat16": (2e-2, 1e-1), "float32": (1e-5, 1e-4), "float64": (1e-10, 1e-9)}
OPS = ["add", "div", "exp", "tanh", "matmul", "sum", "mean", "softmax", "layer_norm", "getitem"]
CASES = [(name, dtype) for name in OPS for dtype in TOLERANCE]


@pytest.mark.parametrize("name, dtype", CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_forward_and_backward_keep_the_dtype(name, dtype):
    spec = specs_for(name)[0]
    inputs = spec.sample(np.random.default_rng(0), 0)
    inputs = [x.astype(jnp.dtype(dtype)) if np.issubdtype(x.dtype, np.floating) else x for x in inputs]
    atol, rtol = TOLERANCE[dtype]
    # assert_grads_match also requires equal dtypes: outputs as jnp's, gradients as the inputs'.
    assert_grads_match(spec.op, *inputs, reference=spec.ref, modes=("eager", "jax"), atol=atol, rtol=rtol)


def test_gradients_have_their_input_dtypes():
    x = xgrad.tensor(np.ones(3), dtype=jnp.bfloat16, requires_grad=True)
    y = xgrad.tensor(np.ones(3), dtype=jnp.float32, requires_grad=True)
    out = x * y
    assert out.dtype == jnp.float32
    out.sum().backward()
    assert x.grad.dtype == jnp.bfloat16 and y.grad.dtype == jnp.float32


PAIRS = [("float32", "float64"), ("float16", "float32"), ("bfloat16", "float16"), ("int32", "float32"),
         ("float16", "python float"), ("int32", "python float"), ("bool", "float16")]


@pytest.mark.parametrize("a_dtype, b_dtype", PAIRS)
@pytest.mark.parametrize("op", ["add", "mul", "sub", "div", "maximum", "where"])
def test_type_promotion_follows_jnp(a_dtype, b_dtype, op):
    a = np.array([1.0, 2.0, 0.0]).astype(a_dtype)
    b = 1.5 if b_dtype == "python float" else np.array([0.5, 3.0, 1.0]).astype(b_dtype)
    jnp_b = b if isinstance(b, float) else jnp.asarray(b)
    x_b = b if isinstance(b, float) else xgrad.tensor(b)
    if op == "sub" and "bool" in (a_dtype, b_dtype):  # PyTorch refuses a bool operand of subtraction
        with pytest.raises(RuntimeError, match="^Subtraction, the `-` operator, with a bool tensor is not supported"):
            xgrad.sub(xgrad.tensor(a), x_b)
        return
    if op == "where":
        expected = jnp.where(jnp.asarray([True, False, True]), jnp.asarray(a), jnp_b)
        got = xgrad.where(xgrad.tensor(np.array([True, False, True])), xgrad.tensor(a), x_b)
    else:
        expected = getattr(jnp, {"sub": "subtract", "div": "true_divide", "mul": "multiply"}.get(op, op))(jnp.asarray(a), jnp_b)
        got = getattr(xgrad, op)(xgrad.tensor(a), x_b)
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got.detach().numpy().astype(np.float64), np.asarray(expected, np.float64))


def test_astype_round_trip_is_differentiable():
    x = xgrad.tensor(np.array([0.25, -1.5]), requires_grad=True)
    y = x.half().float().double()
    assert y.dtype == jnp.float64 and y.grad_fn is not None
    (y * y).sum().backward()
    assert x.grad.dtype == jnp.float64
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.array([0.25, -1.5]))
