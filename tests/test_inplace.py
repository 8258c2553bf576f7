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


# -- detach() and .data alias their tensor (NOTE [Detached aliases]) ------------------------


def test_inplace_on_detach_writes_the_tensor_and_bumps_the_shared_version():
    x = xgrad.tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x.sin()  # saves x
    d = x.detach()
    assert d.zero_() is d and not d.requires_grad
    assert x.tolist() == [0.0, 0.0] and x.requires_grad and x.is_leaf
    assert x._version == d._version == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_inplace_on_data_writes_the_tensor_without_a_version_bump():
    # PyTorch's optimizer and EMA idioms: p.data.mul_(...), ema.data.copy_(w).
    p = xgrad.tensor(np.array([1.0, 2.0]), requires_grad=True)
    ema = xgrad.tensor(np.array([0.0, 0.0]), requires_grad=True)
    p.data.mul_(0.5)
    ema.data.copy_(p)
    assert p.tolist() == [0.5, 1.0] and ema.tolist() == [0.5, 1.0]
    assert p._version == ema._version == 0 and p.is_leaf and ema.requires_grad
    (p * ema).sum().backward()  # both still leaves of the next graph
    np.testing.assert_allclose(p.grad.numpy(), [0.5, 1.0])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_alias_written_with_a_grad_requiring_value_records_on_the_alias(compiled):
    w = xgrad.tensor(np.array([1.0, 2.0]), requires_grad=True)
    z = w * 3.0
    b = xgrad.tensor(np.array([3.0, 4.0]), requires_grad=True)
    a = z.detach()
    a.mul_(b)  # z's value changes, outside z's graph; a now depends on b
    assert z.tolist() == [9.0, 24.0] and a.tolist() == [9.0, 24.0]
    (a * a).sum().backward(compiled=compiled)
    np.testing.assert_allclose(b.grad.numpy(), 2 * np.array([9.0, 24.0]) * np.array([3.0, 6.0]))
    assert w.grad is None  # the write through the alias is not part of z's graph


def test_alias_of_a_view_writes_through_to_the_base():
    m = xgrad.zeros(2, 3)
    m[1].data.fill_(7.0)
    m.T[0].detach().fill_(1.0)
    assert m.tolist() == [[1.0, 0.0, 0.0], [1.0, 7.0, 7.0]]


def test_alias_parts_from_a_tensor_given_another_value():
    # JAX arrays cannot share a buffer: once the tensor holds another array, the alias is its own.
    x = xgrad.tensor(np.array([1.0, 2.0]))
    d = x.detach()
    x.add_(1.0)
    d.mul_(10.0)
    assert x.tolist() == [2.0, 3.0] and d.tolist() == [10.0, 20.0]
