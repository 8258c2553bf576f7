"""PyTorch's autograd-core behaviours that xgrad once got wrong: unpack hooks and
``current_node()``, materialized grads, grads on several devices, the first backward against
later ones, nested compiled backwards, and the Tensor protocol (``del x.grad``, pickle,
deepcopy, legacy Functions). PyTorch's tests are named where they are ported."""

import copy
import pickle

import jax
import numpy as np
import pytest

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401
from xgrad.autograd import Function
from xgrad.autograd.graph import current_node, saved_tensors_hooks
from xgrad.ops.registry import REGISTRY

inf, nan = float("inf"), float("nan")


@pytest.mark.usefixtures("eager_and_compiled")
def test_current_node_inside_an_unpack_hook_is_the_node_that_unpacks():
    seen = []

    def unpack(t):
        seen.append(current_node())
        return t

    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    with saved_tensors_hooks(lambda t: t, unpack):
        y = x.exp()
    y.sum().backward()
    assert seen == [y.grad_fn]
    assert current_node() is None


@pytest.mark.usefixtures("eager_and_compiled")
def test_unused_grad_requires_grad_with_materialize():
    # PyTorch's test_unused_grad_requires_grad_with_materialize
    x = xgrad.ones(10, requires_grad=True)
    y = xgrad.ones(10, requires_grad=True)
    z = (x**2).sum()
    g = xgrad.autograd.grad(z, (x, y), allow_unused=True, materialize_grads=True, create_graph=False)
    assert not g[0].requires_grad
    assert not g[1].requires_grad
    assert g[1].tolist() == [0.0] * 10


@pytest.mark.usefixtures("eager_and_compiled")
def test_an_unused_second_derivative_is_none():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    w = xgrad.tensor([3.0, 4.0], requires_grad=True)
    (dydx,) = xgrad.autograd.grad((x * w).sum(), x, create_graph=True)
    assert dydx.tolist() == [3.0, 4.0] and dydx.requires_grad
    assert xgrad.autograd.grad(dydx.sum(), x, create_graph=True, allow_unused=True) == (None,)
    (d2,) = xgrad.autograd.grad(dydx.sum(), w, create_graph=True)
    assert d2.tolist() == [1.0, 1.0]


@pytest.mark.usefixtures("eager_and_compiled")
def test_grad_of_leaves_on_several_devices_comes_back_on_each_leafs_device():
    first, second = jax.devices()[:2]  # the test session splits the host in two
    a = xgrad.tensor([1.0, 2.0], requires_grad=True, device=first)
    b = xgrad.tensor([3.0], requires_grad=True, device=second)
    out = (a * 2).sum() + (b * 3).sum().to(first)
    ga, gb = xgrad.autograd.grad(out, (a, b))
    assert ga.device == first and gb.device == second
    assert ga.tolist() == [2.0, 2.0] and gb.tolist() == [3.0]


@pytest.mark.parametrize(
    "f",
    [lambda x: x.amax(1), lambda x: x.amin(1), lambda x: x.max(), lambda x: x.tanh(), lambda x: x.log_softmax(1)],
    ids=["amax", "amin", "max", "tanh", "log_softmax"],
)
@pytest.mark.parametrize("g", [1.0, inf, nan])
def test_first_eager_backward_gives_the_same_bits_as_later_ones(f, g):
    # The first node of a signature used to run its rules op by op and later ones one
    # fused jitted call, whose simplified arithmetic turned inf * 0 into 0.
    def grad(create_graph=False):
        x = xgrad.tensor([[0.0, 0.0, 2.0], [nan, 1.0, -inf]], requires_grad=True)
        y = f(x)
        (gx,) = xgrad.autograd.grad(y, x, xgrad.full(y.shape, g), create_graph=create_graph)
        return np.asarray(gx.detach().array)

    for prim in REGISTRY.values():
        prim._fused.clear()
    first, second, third = grad(), grad(), grad()
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(first, third)
    # Rules run op by op (create_graph) agree where NaN and inf appear, and on finite
    # values up to the rounding of a contracted multiply-add.
    recorded = grad(create_graph=True)
    np.testing.assert_array_equal(np.isnan(recorded), np.isnan(first))
    np.testing.assert_allclose(recorded, first, rtol=1e-6)


class DeepReentrant(Function):
    @staticmethod
    def forward(ctx, x):
        with xgrad.enable_grad():
            ctx.x = xgrad.tensor(x.detach().array, requires_grad=True)
            ctx.x = ctx.x - 1
        return ctx.x.detach()

    @staticmethod
    def backward(ctx, x):
        if ctx.x < 0:
            return x
        with xgrad.enable_grad():
            DeepReentrant.apply(ctx.x).sum().backward()
        return x


@pytest.mark.usefixtures("eager_and_compiled")
def test_deep_reentrant():
    # PyTorch's test_deep_reentrant at its second depth, 200 (2000 takes 15 s here): deep
    # enough that a compiled backward that nests on one thread hits RecursionError.
    v = xgrad.tensor(200.0, requires_grad=True)
    DeepReentrant.apply(v).sum().backward()
    assert v.grad.item() == 1.0
    v2 = xgrad.tensor(30.0, requires_grad=True)  # and again, reusing the threads
    DeepReentrant.apply(v2).sum().backward()
    assert v2.grad.item() == 1.0


def test_numpy_of_a_tensor_that_requires_grad_raises():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    for t in (x, x * 2):
        with pytest.raises(RuntimeError, match=r"Can't call numpy\(\) on Tensor that requires grad. Use tensor.detach\(\).numpy\(\) instead."):
            t.numpy()
        assert t.detach().numpy().tolist() == t.tolist()


def test_del_grad():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    (x * 2).sum().backward()
    assert x.grad is not None
    del x.grad
    assert x.grad is None


def test_tensors_pickle_values_and_requires_grad():
    x = xgrad.tensor([[1.0, 2.0]], requires_grad=True)
    (x * 2).sum().backward()
    for t in (x, xgrad.tensor([1, 2]), x * 3):
        back = pickle.loads(pickle.dumps(t))
        assert back.tolist() == t.tolist() and back.dtype == t.dtype
        assert back.requires_grad == t.requires_grad and back.is_leaf and back.grad is None


def test_deepcopy_copies_a_leaf_and_its_grad_and_refuses_a_non_leaf():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    (x * 2).sum().backward()
    c = copy.deepcopy(x)
    assert c is not x and c.tolist() == x.tolist() and c.requires_grad and c.grad.tolist() == [2.0, 2.0]
    with pytest.raises(RuntimeError, match="Only Tensors created explicitly by the user"):
        copy.deepcopy(x * 2)


def test_legacy_function_deprecation_exception():
    # PyTorch's test_legacy_function_deprecation_exception
    class MyFunction(Function):
        def forward(self, x):
            return x

        def backward(self, grad_output):
            return grad_output

    with pytest.raises(RuntimeError, match="Legacy autograd function with non-static forward method is deprecated"):
        MyFunction()(xgrad.randn(3, 4))
