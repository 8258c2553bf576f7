"""In-place ops on views, ported from PyTorch's test/test_autograd.py: the ``test_inplace_on_view_*``
family (and ``test_inplace_multiple_output_view_of_view``), ``test_tensor_hooks_inplace_over_view``
and the in-place part of ``test_autograd_python_custom_function_inplace``, with their values,
counts and message phrases; each runs with the eager and the compiled backward.

Not ported, as xgrad has no such ops: ``test_inplace_on_view_multi_output_unsafe``
(``unsafe_split``/``unsafe_chunk``), ``test_autograd_inplace_views_creation_meta`` (the in-place
view ops ``transpose_``, ``t_``, ``squeeze_``, ``unsqueeze_``, ``swapdims_``, ``as_strided_``) and
``test_autograd_inplace_views_cross_dtype`` (``view_as_real``).
"""

import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401
from xgrad.autograd import Function
from xgrad.testing import gradcheck, gradgradcheck

pytestmark = pytest.mark.usefixtures("eager_and_compiled")

MULTI_VIEW_ERR = "This view is the output of a function that returns multiple views."


def randn(*shape, requires_grad=False):
    rng = np.random.default_rng(sum(shape) + len(shape))
    return xgrad.tensor(rng.standard_normal(shape), dtype=jnp.float64, requires_grad=requires_grad)


def test_inplace_on_view_backprop_base():
    # modify view and back-prop through base
    root = randn(2, 2, requires_grad=True)
    x = root.clone()
    v1 = x.narrow(0, 0, 1)
    v1.mul_(2)
    x.sum().backward()
    assert root.grad.tolist() == [[2, 2], [1, 1]]


def test_inplace_on_view_backprop_view_of_view():
    # modify view and backprop through view-of-view
    root = randn(2, 2, requires_grad=True)
    x = root.clone()
    v1 = x.narrow(0, 0, 1)
    v2 = x.narrow(0, 0, 1)
    v1.mul_(2)
    v2.sum().backward()
    assert root.grad.tolist() == [[2, 2], [0, 0]]


def test_inplace_on_view_of_view():
    # modify view-of-view and backprop through base
    root = randn(2, 2, requires_grad=True)
    x = root.clone()
    v1 = x.narrow(0, 0, 1)
    v2 = v1.narrow(1, 1, 1)
    v2.mul_(2)
    x.sum().backward()
    assert root.grad.tolist() == [[1, 2], [1, 1]]


def test_inplace_on_view_then_no_grad():
    # an in-place op on a view of a non-leaf, then a look at the graph with grad disabled
    a = xgrad.ones(3, 1, dtype=jnp.float64, requires_grad=True)
    b = a * 2
    c = b.view_as(b)
    c[0][0] = 3
    with xgrad.no_grad():
        c.grad_fn  # noqa: B018
    c.sum().backward()
    assert a.grad.tolist() == [[0.0], [2.0], [2.0]]


def test_inplace_on_view_gradcheck():
    a = randn(4, 4, requires_grad=True)
    b = randn(2, 2, requires_grad=True)

    def func(root, b):
        x = root.clone()
        x.narrow(1, 2, 2).narrow(0, 1, 2).mul_(b)
        x.narrow(1, 0, 2).narrow(0, 1, 2).mul_(b)
        return x

    assert gradcheck(func, (a, b), fast_mode=True)  # one random direction: the full Jacobians take 15 s
    go = randn(4, 4, requires_grad=True)
    assert gradgradcheck(func, (a, b), (go,), fast_mode=True)


def test_inplace_on_view_multiple_outputs():
    root = xgrad.arange(9.0, dtype=jnp.float64).reshape(3, 3).requires_grad_()
    x = root.clone()
    v1 = x.unbind()
    with pytest.raises(RuntimeError):
        v1[0].mul_(2)


def test_inplace_on_view_of_multiple_output_view():
    a = randn(10, requires_grad=True).clone()
    b = a.unbind(0)
    c = b[0].view_as(b[0])
    with pytest.raises(RuntimeError):
        c.mul_(2)


def test_inplace_multiple_output_view_of_view():
    a = randn(10, requires_grad=True).clone()
    b = a.view_as(a)
    c = b.unbind(0)
    with pytest.raises(RuntimeError):
        c[0].mul_(2)


def test_inplace_on_view_makes_base_require_grad():
    a = randn(4, 4)
    b = randn(4, 2, requires_grad=True)

    def func(root, b):
        x = root.clone()
        assert not x.requires_grad
        x.narrow(1, 2, 2).mul_(b)
        assert x.requires_grad
        return x

    assert gradcheck(func, (a, b), fast_mode=True)  # one random direction: the full Jacobians take 15 s
    go = randn(4, 4, requires_grad=True)
    assert gradgradcheck(func, (a, b), (go,), fast_mode=True)


def test_inplace_on_view_backprop_view():
    # modify view and backprop through view
    a = xgrad.tensor([2.0, 5.0])
    b = xgrad.tensor([3.0], requires_grad=True)
    res = a.narrow(0, 1, 1).mul_(b)
    res.sum().backward()
    assert b.grad.tolist() == [5]
    with pytest.warns(UserWarning, match="not a leaf Tensor"):  # the write made ``a`` a non-leaf
        assert a.grad is None


def test_inplace_on_view_modify_base():
    # an in-place op on a base that makes it require grad makes its earlier views require grad too
    r = xgrad.ones(1, dtype=jnp.float64, requires_grad=True)

    def fn(r):
        x = xgrad.ones(5, dtype=jnp.float64)
        v = x.select(0, 1)
        assert not v.requires_grad and v.grad_fn is None
        x.add_(r)  # v now depends on r through the in-place op on x
        assert v.requires_grad
        return v

    assert gradcheck(fn, (r,))
    assert gradgradcheck(fn, (r,))


class PyAdd(Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.mark_dirty(x)
        x.add_(y)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, grad


def test_inplace_on_view_python():
    # in-place changes made by a custom Function to a view of its input (mark_dirty)
    a = randn(4, 4, requires_grad=True)
    b = randn(2, 2, requires_grad=True)

    def func(root, b):
        x = root.clone()
        PyAdd.apply(x.narrow(1, 2, 2).narrow(0, 1, 2), b)
        PyAdd.apply(x.narrow(1, 0, 2).narrow(0, 1, 2), b)
        return x

    assert gradcheck(func, (a, b), fast_mode=True)  # one random direction: the full Jacobians take 15 s
    go = randn(4, 4, requires_grad=True)
    assert gradgradcheck(func, (a, b), (go,), fast_mode=True)


def test_mark_dirty_of_a_view_gives_the_added_tensor_its_gradient():
    a = xgrad.ones(4, requires_grad=True)
    b = xgrad.ones(2, requires_grad=True)
    x = a.clone()
    out = PyAdd.apply(x.narrow(0, 1, 2), b)
    assert out.tolist() == [2.0, 2.0] and x.tolist() == [1.0, 2.0, 2.0, 1.0]
    (x * xgrad.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    assert b.grad.tolist() == [2.0, 3.0]
    assert a.grad.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_inplace_on_view_non_contig():
    root = xgrad.ones(2, 3, 2).select(2, 1).T.requires_grad_(True)
    x = root.clone()
    v1 = x.narrow(0, 0, 1)
    v2 = v1.narrow(1, 1, 1)
    v2.mul_(2)
    x.sum().backward()
    assert root.grad.tolist() == [[1, 2], [1, 1], [1, 1]]


@pytest.mark.parametrize(
    "f", [lambda t: t.split(1), lambda t: t.split((1, 1, 1)), lambda t: t.chunk(3)], ids=["split", "split_with_sizes", "chunk"]
)
def test_inplace_on_view_multi_output_safe(f):
    a = randn(3, 3, requires_grad=True)
    b = a + a
    s1, s2, s3 = f(b)
    with pytest.raises(RuntimeError, match=MULTI_VIEW_ERR):
        s1.mul_(s2)


def test_inplace_on_view_undefined_grad_output():
    a = xgrad.tensor([1.0], requires_grad=True)
    c = a.clone()
    v = c[:]
    b = xgrad.tensor(1.0, requires_grad=True)

    class InplaceFunc(Function):
        @staticmethod
        def forward(ctx, x, other):
            ctx.mark_dirty(x)
            return x.mul_(2)

        @staticmethod
        def backward(ctx, grad):
            return grad * 2, None

    out = InplaceFunc.apply(v, b)
    out.backward()
    assert b.grad is None
    assert a.grad.item() == 2


def test_tensor_hooks_inplace_over_view():
    count = [0]

    def fn0(grad):
        pytest.fail("a hook registered on a view before an in-place op on it fired")

    def fn1(grad):
        pytest.fail("a hook registered on a view before an in-place op on another view of its base fired")

    def fn2(grad):
        count[0] += 1
        assert grad.tolist() == [1.0]

    base = xgrad.tensor([1.0], requires_grad=True).clone()
    view = base[:]
    view2 = base[:]
    view.register_hook(fn0)
    view2.register_hook(fn1)
    view.mul_(2)
    view2.grad_fn  # noqa: B018
    view2.register_hook(fn2)
    (view + view2).sum().backward()
    # the hooks registered on the views before the in-place op stay with their old grad_fn
    assert count[0] == 1


def test_custom_function_inplace_on_a_view_input():
    # test_autograd_python_custom_function_inplace: the dirty input may be a view when
    # the Function returns one tensor, never when it returns more
    bw_called = [0]

    class MyAdder(Function):
        @staticmethod
        def forward(ctx, a, b):
            a.add_(b)
            ctx.mark_dirty(a)
            return a

        @staticmethod
        def backward(ctx, grad):
            bw_called[0] += 1
            return grad, grad

    class MyBadAdder(Function):
        @staticmethod
        def forward(ctx, a, b):
            a.add_(b)
            ctx.mark_dirty(a)
            return a, a + b

        @staticmethod
        def backward(ctx, ga, gab):
            bw_called[0] += 1
            return ga + gab, ga + gab

    a = xgrad.ones(2, requires_grad=True)
    b = xgrad.ones(2, requires_grad=True)
    c = MyAdder.apply(a.clone().view_as(a), b)
    c.sum().backward()
    assert bw_called[0] == 1
    with pytest.raises(RuntimeError, match="your Function modifies inplace an input that is a view of another Tensor"):
        MyBadAdder.apply(a.clone().view_as(a), b)
