"""In-place ops: each bumps ``_version`` once and gives the gradients of its out-of-place twin."""

import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad.testing import assert_grads_match


def _inplace_on_intermediate(step):
    """An xgrad function applying ``step`` in place to an intermediate, checking the version bump."""

    def fn(x, v):
        y = x * 1.5
        before = y._version
        step(y, v)
        assert y._version == before + 1
        return (y * x).sin()

    return fn


CASES = {
    "add_": (lambda y, v: y.add_(v), lambda y, v: y + v),
    "sub_": (lambda y, v: y.sub_(v), lambda y, v: y - v),
    "mul_": (lambda y, v: y.mul_(v), lambda y, v: y * v),
    "div_": (lambda y, v: y.div_(v.exp()), lambda y, v: y / jnp.exp(v)),
    "exp_": (lambda y, v: y.exp_(), lambda y, v: jnp.exp(y)),
    "zero_": (lambda y, v: y.zero_(), lambda y, v: jnp.zeros_like(y)),
    "fill_": (lambda y, v: y.fill_(0.5), lambda y, v: jnp.full_like(y, 0.5)),
    "copy_ constant": (lambda y, v: y.copy_(np.arange(3.0)), lambda y, v: jnp.broadcast_to(jnp.arange(3.0), y.shape)),
    "copy_": (lambda y, v: y.copy_(v * 2), lambda y, v: jnp.broadcast_to(v * 2, y.shape)),
    "__iadd__": (lambda y, v: y.__iadd__(v), lambda y, v: y + v),
    "__imul__": (lambda y, v: y.__imul__(v), lambda y, v: y * v),
    "setitem slice": (lambda y, v: y.__setitem__((slice(None), 0), v[0]), lambda y, v: y.at[:, 0].set(v[0])),
    "setitem int array": (lambda y, v: y.__setitem__(np.array([1, 0]), v), lambda y, v: y.at[np.array([1, 0])].set(v)),
    "setitem mask": (lambda y, v: y.__setitem__(np.array([[True, False, True], [False, True, False]]), v[1]),
                     lambda y, v: y.at[np.array([[True, False, True], [False, True, False]])].set(v[1])),
}


@pytest.mark.parametrize("name", CASES)
def test_inplace_grads_match_out_of_place(name):
    step, reference = CASES[name]
    rng = np.random.default_rng(0)
    x, v = rng.standard_normal((2, 3)), rng.standard_normal(3)
    assert_grads_match(
        _inplace_on_intermediate(step), x, v,
        reference=lambda x, v: jnp.sin(reference(x * 1.5, v) * x), modes=("eager", "jax"), order=2,
    )


def test_modifying_a_saved_tensor_raises_naming_the_node_then_backward_works():
    x = xgrad.tensor(np.array([0.5, 1.0]), requires_grad=True)
    y = x * 2
    z = y.exp()  # saves its output
    w = z * 1.0
    z.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as info:
        w.sum().backward()
    assert "ExpBackward" in str(info.value) or "MulBackward" in str(info.value)
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])


def test_inplace_on_a_leaf_that_requires_grad_raises_unless_no_grad():
    x = xgrad.tensor(np.array([1.0, 2.0]), requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place operation"):
        x.add_(1.0)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        x[0] = 5.0
    assert x._version == 0
    with xgrad.no_grad():
        x.mul_(2.0)
        x[1] = 7.0
    assert x._version == 2 and x.is_leaf and x.grad_fn is None
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 14.0])


def test_inplace_shape_mismatch_is_an_error():
    y = xgrad.tensor(np.ones(3)) * 1.0
    with pytest.raises(RuntimeError, match=r"output with shape \[3\] doesn't match the broadcast shape \[2, 3\]"):
        y.add_(xgrad.tensor(np.ones((2, 3))))
