"""``xgrad.testing`` on plain JAX functions (a ``jax.custom_vjp``), its input errors, and the tensor strategy's options."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import find, given, settings

import xgrad
from xgrad.testing import GradcheckError, GradientMismatch, assert_grads_match, gradcheck, gradgradcheck
from xgrad.testing import strategies as xst


def softplus_with(rule):
    @jax.custom_vjp
    def softplus(x):
        return jnp.logaddexp(x, 0.0)

    softplus.defvjp(lambda x: (softplus(x), x), lambda x, g: (g * rule(x),))
    return softplus


GOOD = softplus_with(jax.nn.sigmoid)
BAD = softplus_with(lambda x: jax.nn.sigmoid(2 * x))  # a wrong derivative
X = np.linspace(-2.0, 2.0, 5)


def test_gradcheck_and_gradgradcheck_take_a_custom_vjp_and_check_its_rule():
    assert gradcheck(GOOD, (X,))
    assert gradgradcheck(GOOD, (X,))
    with pytest.raises(GradcheckError, match="Jacobian mismatch"):
        gradcheck(BAD, (X,))
    assert gradcheck(lambda x, y: jnp.sin(x) * jnp.cos(y), (X, xgrad.tensor(X, requires_grad=True)))  # plain jnp code


def test_assert_grads_match_compares_a_custom_vjp_with_autodiff_of_what_it_wraps():
    assert_grads_match(GOOD, X, modes=("eager", "jax"))
    with pytest.raises(GradientMismatch, match="eager vs jax disagree on the gradient w.r.t. input 0"):
        assert_grads_match(BAD, X, modes=("eager", "jax"))
    assert_grads_match(lambda x, y: jnp.tanh(x) * y, X, X, modes=("eager", "jax"))  # a function of arrays


def test_wrong_arguments_say_what_is_accepted():
    with pytest.raises(TypeError, match="gradcheck: inputs must be a Tensor, an array .* got dict"):
        gradcheck(GOOD, {"x": X})
    with pytest.raises(TypeError, match="gradgradcheck: fn must be a function of xgrad Tensors .* got str"):
        gradgradcheck("softplus", (X,))
    with pytest.raises(TypeError, match="gradcheck: fn must be .* got a function that returned NoneType"):
        gradcheck(lambda x: None, (X,))
    with pytest.raises(TypeError, match="assert_grads_match: fn must be fn\\(np, \\*xs\\).* takes neither 1 nor 2"):
        assert_grads_match(lambda a, b, c: a, X)
    with pytest.raises(TypeError, match="assert_grads_match: inputs must be arrays .* got str"):
        assert_grads_match(GOOD, "x")


def test_tensors_draw_float32_without_x64_and_no_warning():
    seen = []
    with jax.enable_x64(False):

        @settings(max_examples=5, database=None)
        @given(xst.tensors(shape=(2,)), xst.dtypes())
        def draw(x, dtype):
            seen.append((x.dtype, dtype))

        draw()  # warnings are errors in this suite
    assert {d for d, _ in seen} == {jnp.dtype(jnp.float32)}
    assert jnp.dtype(jnp.float64) not in {d for _, d in seen}


def test_tensors_range_options_reach_kinks_and_overflow():
    kink = find(xst.tensors(shape=(3,), kinks=(0.0,)), lambda x: bool((x.array == 0).all()), settings=settings(database=None))
    assert kink.tolist() == [0.0, 0.0, 0.0]
    overflowing = find(xst.tensors(shape=(), dtype=jnp.float32, lo=80.0, hi=None), lambda x: bool(jnp.isinf(jnp.exp(x.array))),
                       settings=settings(database=None))
    assert overflowing.dtype == jnp.float32 and overflowing.item() > 88.0  # exp overflows float32 past 88.7
    bounded = find(xst.tensors(shape=(4,), lo=1.0, hi=2.0), lambda x: True, settings=settings(database=None))
    assert bool(((bounded.array >= 1.0) & (bounded.array <= 2.0)).all())
