"""``Tensor.unfold`` is a view, as in PyTorch: a write into its windows writes the base.

Values written by hand follow PyTorch's semantics; values and gradients of programs that
write through an unfold view are compared with the same program written functionally in
JAX (the windows as a stack of slices, ``x.at[idx]`` updates) and with float64 finite
differences, in eager and compiled backward.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401
from tests._helpers import assert_view_write_matches
from xgrad.testing import gradcheck

pytestmark = pytest.mark.usefixtures("eager_and_compiled")

OVERLAP = "more than one element of the written-to tensor refers to a single memory location"


def _windows(a, axis, size, step):
    """JAX's ``unfold``: the windows stacked along ``axis``, their elements as a new last dim."""
    starts = range(0, a.shape[axis] - size + 1, step)
    stacked = jnp.stack([jax.lax.slice_in_dim(a, s, s + size, axis=axis) for s in starts], axis=axis)
    return jnp.moveaxis(stacked, axis + 1, -1)


def _siblings_see_the_write(b, y):
    s, u = b[:, 1:4], b.unfold(1, 3, 3)  # made before the write: both see it
    b.unfold(1, 3, 1)[:, 2].mul_(y[:3])  # one of overlapping windows
    return s * u[:, 0]


def _siblings_see_the_write_ref(b, y):
    new = b.at[:, 2:5].multiply(y[:3])
    return new, new[:, 1:4] * _windows(new, 1, 3, 3)[:, 0]


def _base_write(b, y):
    w = b.unfold(1, 2, 1)
    b.mul_(y)
    return w


# name: (xgrad step on the intermediate b (2 x 6), returning the tensor to read after the
#        write; the same in JAX: (b, y) -> (new b, what is read))
CASES = {
    "all windows add_": (
        lambda b, y: b.unfold(1, 3, 3).add_(y.reshape(2, 3)),
        lambda b, y: (b + y, _windows(b + y, 1, 3, 3)),
    ),
    "unfold of a transposed base": (
        lambda b, y: b.T.unfold(0, 2, 2)[1].mul_(y[:2]),
        lambda b, y: (b.at[:, 2:4].multiply(y[:2]), b.at[:, 2:4].multiply(y[:2])[:, 2:4]),
    ),
    "unfold of an unfold": (
        lambda b, y: b.unfold(1, 4, 2).unfold(2, 2, 2)[:, 1].mul_(y[:4].reshape(2, 2)),
        lambda b, y: (b.at[:, 2:].multiply(y[:4]), b.at[:, 2:].multiply(y[:4])[:, 2:].reshape(2, 2, 2)),
    ),
    "view(-1) of an unfold": (
        lambda b, y: b.unfold(1, 2, 2).view(-1)[3:7].add_(y[:4]),
        lambda b, y: (b.reshape(-1).at[3:7].add(y[:4]).reshape(2, 6), b.reshape(-1)[3:7] + y[:4]),
    ),
    "one of overlapping windows mul_, sibling views see it": (_siblings_see_the_write, _siblings_see_the_write_ref),
    "base write regenerates the unfold": (_base_write, lambda b, y: (b * y, _windows(b * y, 1, 2, 1))),
}


@pytest.mark.parametrize("name", CASES)
def test_a_write_through_an_unfold_view_matches_the_functional_update(name):
    step, reference = CASES[name]
    assert_view_write_matches(step, reference, (2, 6), modes=("eager", "jax"))


def test_writes_through_unfold_views_pass_gradcheck():
    """Finite differences in float64, independent of any autograd, over several writes."""

    def fn(x, y):
        b = x * 1.5
        w = b.T.unfold(0, 3, 1)
        w[..., 0].mul_(y[:4].reshape(4, 1))  # the first elements of overlapping windows
        b.unfold(1, 2, 3)[1].add_(y[4:])
        return (b * x).sin().sum() + (w * w).sum()

    rng = np.random.default_rng(1)
    inputs = [xgrad.tensor(rng.standard_normal(shape), requires_grad=True) for shape in ((2, 6), (6,))]
    assert gradcheck(fn, inputs, fast_mode=True)


def test_writes_into_a_window_change_the_base():
    x = xgrad.arange(6.0) * 1.0
    w = x.unfold(0, 2, 2)
    w[1].fill_(-1.0)
    assert x.tolist() == [0.0, 1.0, -1.0, -1.0, 4.0, 5.0]
    w[:, 0].add_(xgrad.tensor([10.0, 20.0, 30.0]))
    assert x.tolist() == [10.0, 1.0, 19.0, -1.0, 34.0, 5.0]
    assert w.tolist() == [[10.0, 1.0], [19.0, -1.0], [34.0, 5.0]]
    assert x._version == w._version == 2


def test_a_window_written_gets_its_gradient_from_the_base():
    root = xgrad.tensor(np.arange(6.0), requires_grad=True)
    x = root.clone()
    x.unfold(0, 2, 2)[1].mul_(3.0)
    x.sum().backward()
    assert root.grad.tolist() == [1.0, 1.0, 3.0, 3.0, 1.0, 1.0]


def test_overlapping_windows_add_their_gradients():
    root = xgrad.tensor(np.arange(6.0), requires_grad=True)
    root.unfold(0, 3, 1).sum().backward()  # element i is in min(i + 1, 6 - i, 3, 4) windows
    assert root.grad.tolist() == [1.0, 2.0, 3.0, 3.0, 2.0, 1.0]


def test_layout_is_pytorchs():
    x = xgrad.zeros(3, 4)
    assert x.unfold(1, 2, 2).is_contiguous()  # strides (4, 2, 1)
    assert not x.unfold(1, 2, 1).is_contiguous()  # strides (4, 1, 1)
    assert not x.unfold(0, 2, 1).is_contiguous()  # shape (2, 4, 2), strides (4, 1, 4)
    with pytest.raises(RuntimeError, match="view size is not compatible with input tensor's size and stride"):
        x.unfold(1, 2, 1).view(-1)
    copy = x.unfold(1, 2, 1).reshape(-1)  # a copy, as PyTorch's reshape here
    copy.fill_(1.0)
    assert x.tolist() == np.zeros((3, 4)).tolist()


@pytest.mark.parametrize("grad_mode", [True, False], ids=["grad", "no_grad"])
def test_writing_overlapping_windows_raises_and_changes_nothing(grad_mode):
    x = xgrad.arange(8.0) * 1.0
    w = x.unfold(0, 2, 1)
    with xgrad.set_grad_enabled(grad_mode), pytest.raises(RuntimeError, match=OVERLAP):
        w.mul_(2.0)
    with pytest.raises(RuntimeError, match=OVERLAP):
        x.unfold(0, 3, 2)[:, ::2].zero_()  # strides (2, 2): base element 2 is [0, 1] and [1, 0]
    assert x.tolist() == np.arange(8.0).tolist() and x._version == 0
    x.unfold(0, 4, 2)[:, ::3].zero_()  # strides (2, 3): interleaved, yet no element repeats
    assert x.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 6.0, 0.0]
    x.unfold(0, 8, 1).mul_(2.0)  # one window: step < size, yet no element repeats
    assert x.tolist() == [0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 12.0, 0.0]


def test_an_unfold_of_a_leaf_that_requires_grad_cannot_be_written_but_under_no_grad():
    p = xgrad.tensor(np.arange(6.0), requires_grad=True)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad is being used in an in-place operation."):
        p.unfold(0, 2, 2)[1].mul_(2.0)
    assert p.tolist() == np.arange(6.0).tolist() and p._version == 0
    with xgrad.no_grad():
        p.unfold(0, 3, 3)[1].zero_()
    assert p.tolist() == [0.0, 1.0, 2.0, 0.0, 0.0, 0.0] and p.is_leaf
    (p * p).sum().backward()
    assert p.grad.tolist() == [0.0, 2.0, 4.0, 0.0, 0.0, 0.0]


def test_a_saved_base_detects_a_write_through_an_unfold_view():
    x = xgrad.tensor([0.5, 1.0, 1.5, 2.0], requires_grad=True)
    b = x.sin()
    out = b * b  # saves b
    b.unfold(0, 2, 2)[0].mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
