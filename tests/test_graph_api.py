"""``xgrad.autograd.graph`` beyond hooks, as ``torch.autograd.graph``: multi-grad hooks, gradient
edges, disabling saved-tensor hooks, mutation of saved tensors, the current node, and
``grad(..., is_grads_batched=True)``.

Expected behaviour is PyTorch's (test_autograd.py: test_multi_grad_all_hooks,
test_multi_grad_any_hooks, test_gradient_edge_*, test_disabling_saved_tensor_hooks,
test_allow_mutation_on_saved_tensors, test_current_node, test_grad_batched_grad);
batched gradients are checked against a loop over rows and ``jax.jacrev``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad.autograd import compiled
from xgrad.autograd.graph import (
    GradientEdge,
    allow_mutation_on_saved_tensors,
    current_node,
    disable_saved_tensors_hooks,
    get_gradient_edge,
    register_multi_grad_hook,
    save_on_cpu,
    saved_tensors_hooks,
)
from xgrad.utils import checkpoint

FLAGS = pytest.mark.parametrize("flag", [False, True], ids=["eager", "compiled"])


@pytest.fixture(autouse=True)
def fresh_cache():
    compiled.reset()
    yield
    compiled.reset()


def four_leaves():
    return [xgrad.tensor([0.5 + i, 1.0 - i], requires_grad=True) for i in range(4)]


# -- register_multi_grad_hook ------------------------------------------------------------


@FLAGS
def test_multi_grad_hook_all_is_called_once_with_none_for_tensors_not_reached(flag):
    t1, t2, t3, t4 = four_leaves()
    calls = []
    handle = register_multi_grad_hook((t1, t2, t3, t4), lambda grads: calls.append([None if g is None else g.tolist() for g in grads]))
    out = t2 * t3
    out.sum().backward(inputs=(t2, t3), retain_graph=True, compiled=flag)
    assert calls == [[None, t3.tolist(), t2.tolist(), None]]
    out.sum().backward(inputs=(t1, t4), retain_graph=True, compiled=flag)  # none of them is reached
    assert len(calls) == 1
    out.sum().backward(inputs=(t1, t3), retain_graph=True, compiled=flag)
    assert calls[-1] == [None, None, t2.tolist(), None]
    (t1 * t4).sum().backward(compiled=flag)
    assert calls[-1] == [t4.tolist(), None, None, t1.tolist()]
    handle.remove()
    (t1 * t4).sum().backward(compiled=flag)
    assert len(calls) == 3


@FLAGS
def test_multi_grad_hook_all_on_non_leaves_and_with_grad(flag):
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    a, b = x * 2, x.exp()
    c = x * 5  # hooked but not on the path to the output
    calls = []
    register_multi_grad_hook((a, b, c), lambda grads: calls.append(grads))
    (a * b).sum().backward(compiled=flag)
    (grads,) = calls
    np.testing.assert_allclose(grads[0].detach().numpy(), np.exp([1.0, 2.0]))
    np.testing.assert_allclose(grads[1].detach().numpy(), [2.0, 4.0])
    assert grads[2] is None
    a2, b2 = x * 2, x * 3
    register_multi_grad_hook((a2, b2), lambda grads: calls.append(grads))
    (g,) = xgrad.autograd.grad((a2 * b2).sum(), x, compiled=flag)
    assert len(calls) == 2 and calls[1][0].tolist() == b2.tolist() and calls[1][1].tolist() == a2.tolist()
    np.testing.assert_allclose(g.detach().numpy(), [12.0, 24.0])


@FLAGS
def test_multi_grad_hook_any_is_called_once_with_the_first_grad(flag):
    t1, t2, t3, t4 = four_leaves()
    calls = []
    register_multi_grad_hook((t1, t2, t3, t4), lambda g: calls.append(g.tolist()), mode="any")
    out = (t2 * t3).sum()
    out.backward(retain_graph=True, compiled=flag)
    assert len(calls) == 1 and calls[0] in (t3.tolist(), t2.tolist())
    out.backward(compiled=flag)
    assert len(calls) == 2


def test_multi_grad_hook_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="Expects mode to be one of"):
        register_multi_grad_hook(four_leaves(), lambda g: None, mode="some")


# -- GradientEdge --------------------------------------------------------------------------


@FLAGS
def test_grad_with_respect_to_a_gradient_edge_of_a_non_leaf(flag):
    a = xgrad.tensor(1.0, dtype=jnp.float64, requires_grad=True)
    b = a.sin()
    c = b.cos()
    edge = get_gradient_edge(b)
    assert isinstance(edge, GradientEdge) and edge.node is b.grad_fn and edge.output_nr == 0
    (gb,) = xgrad.autograd.grad(c, edge, retain_graph=True, compiled=flag)
    np.testing.assert_allclose(gb.item(), -np.sin(np.sin(1.0)))
    (ga, gb2) = xgrad.autograd.grad(c, (a, edge), compiled=flag)
    np.testing.assert_allclose(ga.item(), -np.sin(np.sin(1.0)) * np.cos(1.0))
    np.testing.assert_allclose(gb2.item(), gb.item())


@FLAGS
def test_a_gradient_edge_outlives_its_tensor(flag):
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)

    def block():
        t = x * 2  # dropped when block returns; its edge stays usable
        return (t * t).sum(), get_gradient_edge(t)

    out, edge = block()
    (g,) = xgrad.autograd.grad(out, [edge], compiled=flag)
    np.testing.assert_allclose(g.detach().numpy(), [4.0, 8.0])


def test_gradient_edge_of_a_leaf_and_as_backward_input():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    w = xgrad.tensor([3.0, 4.0], requires_grad=True)
    edge = get_gradient_edge(x)
    assert edge.node.variable is x
    (x * w).sum().backward(inputs=[edge])
    assert x.grad.tolist() == [3.0, 4.0] and w.grad is None
    # PyTorch cannot make zeros for an unused edge: it raises rather than guess.
    with pytest.raises(RuntimeError, match="materialize_grads cannot be used when the given input is a GradientEdge"):
        xgrad.autograd.grad((w * 2).sum(), edge, materialize_grads=True)
    assert xgrad.autograd.grad((w * 2).sum(), edge, allow_unused=True) == (None,)
    with pytest.raises(RuntimeError, match="It is not possible to get the gradient edge for a Tensor that does not require gradients"):
        get_gradient_edge(xgrad.tensor([1.0]))


# -- saved-tensor hooks: disabling and mutation --------------------------------------------


def test_disable_saved_tensors_hooks():
    with disable_saved_tensors_hooks("error message"):
        with pytest.raises(RuntimeError, match="error message"):
            with saved_tensors_hooks(lambda t: t, lambda t: t):
                pass
        with pytest.raises(RuntimeError, match="error message"):
            checkpoint(lambda t: t.sin(), xgrad.tensor([1.0], requires_grad=True), use_reentrant=False)
        # Saving without hooks still works.
        x = xgrad.tensor([1.0, 2.0], requires_grad=True)
        (x * x).sum().backward()
        assert x.grad.tolist() == [2.0, 4.0]
    with saved_tensors_hooks(lambda t: t, lambda t: t):
        pass  # enabled again
    with saved_tensors_hooks(lambda t: t, lambda t: t):
        with pytest.raises(RuntimeError, match="error message"):
            with disable_saved_tensors_hooks("error message"):
                pass


def test_disable_saved_tensors_hooks_nests():
    with disable_saved_tensors_hooks("outer"):
        with disable_saved_tensors_hooks("inner"):
            with pytest.raises(RuntimeError, match="inner"):
                with save_on_cpu():
                    pass
        with pytest.raises(RuntimeError, match="outer"):
            with save_on_cpu():
                pass


@FLAGS
def test_allow_mutation_on_saved_tensors(flag):
    a = xgrad.tensor(np.linspace(0.1, 0.6, 6).reshape(2, 3), requires_grad=True)
    with allow_mutation_on_saved_tensors():
        b = a * 1.0
        out = (b ** 2).sum() + b.exp().sum()  # pow saves b; exp saves its output
        b.sin_()
        b[0].mul_(3.0)  # through a view too
        out.backward(compiled=flag)
    np.testing.assert_allclose(a.grad.detach().numpy(), 2 * a.detach().numpy() + np.exp(a.detach().numpy()))
    # Without the context the same mutation is caught.
    b = a * 1.0
    out = (b ** 2).sum()
    b.sin_()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(compiled=flag)


def test_allow_mutation_backward_outside_the_context_raises():
    a = xgrad.tensor([1.0, 2.0], requires_grad=True)
    with allow_mutation_on_saved_tensors():
        b = a * 1.0
        out = (b * b).sum()
    with pytest.raises(RuntimeError, match="Trying to backward outside of the 'allow_mutation_on_saved_tensors' context"):
        out.backward()


# -- current_node ----------------------------------------------------------------------------


def test_current_node_in_hooks_and_function_backward():
    seen = []

    class Square(xgrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            seen.append(("function", current_node()))
            # A reentrant backward inside: the outer node is current again afterwards.
            inner = xgrad.tensor([1.0], requires_grad=True)
            with xgrad.enable_grad():
                (inner.exp() * 1.0).sum().backward()
            seen.append(("after inner", current_node()))
            (x,) = ctx.saved_tensors
            return 2 * x * g

    x = xgrad.tensor([3.0], requires_grad=True)
    y = Square.apply(x)
    z = y.sin()
    y.register_hook(lambda g: seen.append(("tensor hook", current_node())))
    z.grad_fn.register_hook(lambda gi, go: seen.append(("post hook", current_node())))
    assert current_node() is None
    z.sum().backward()
    assert current_node() is None
    assert seen == [("post hook", z.grad_fn), ("tensor hook", y.grad_fn), ("function", y.grad_fn), ("after inner", y.grad_fn)]


# -- is_grads_batched ------------------------------------------------------------------------


def _two_outputs(x, w):
    return (x * w).sin(), (x.exp() * w[0]).sum()


@FLAGS
def test_batched_grads_match_a_loop_over_rows_and_jacrev(flag):
    rng = np.random.default_rng(0)
    x = xgrad.tensor(rng.standard_normal(3), requires_grad=True)
    w = xgrad.tensor(rng.standard_normal(3), requires_grad=True)
    unused = xgrad.tensor([1.0, 2.0], requires_grad=True)
    y1, y2 = _two_outputs(x, w)
    v1, v2 = rng.standard_normal((4, 3)), rng.standard_normal(4)
    gx, gw, gu = xgrad.autograd.grad(
        (y1, y2), (x, w, unused), (xgrad.tensor(v1), xgrad.tensor(v2)), retain_graph=True, allow_unused=True,
        is_grads_batched=True, compiled=flag,
    )
    assert gu is None and gx.shape == (4, 3) and gw.shape == (4, 3)
    for b in range(4):
        rx, rw = xgrad.autograd.grad((y1, y2), (x, w), (xgrad.tensor(v1[b]), xgrad.tensor(v2[b])), retain_graph=True)
        np.testing.assert_allclose(gx.detach().numpy()[b], rx.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(gw.detach().numpy()[b], rw.detach().numpy(), rtol=1e-12)
    (jac,) = xgrad.autograd.grad(y1, x, xgrad.tensor(np.eye(3)), is_grads_batched=True, compiled=flag, retain_graph=True)
    np.testing.assert_allclose(jac.detach().numpy(), jax.jacrev(lambda a: jnp.sin(a * w.array))(x.array), rtol=1e-12)
    (zeros,) = xgrad.autograd.grad(y1, unused, xgrad.tensor(np.eye(3)), is_grads_batched=True, materialize_grads=True)
    assert zeros.shape == (3, 2) and not zeros.detach().numpy().any()


def test_batched_grads_with_create_graph_are_differentiable():
    x = xgrad.tensor([0.3, 0.7], requires_grad=True)
    y = x.sin() * x
    (jac,) = xgrad.autograd.grad(y, x, xgrad.tensor(np.eye(2)), is_grads_batched=True, create_graph=True)
    expected = jax.jacrev(lambda a: jnp.sin(a) * a)(x.array)
    np.testing.assert_allclose(jac.detach().numpy(), expected, rtol=1e-12)
    (hess_trace,) = xgrad.autograd.grad(jac.sum(), x)
    reference = jax.grad(lambda a: jax.jacrev(lambda b: jnp.sin(b) * b)(a).sum())(x.array)
    np.testing.assert_allclose(hess_trace.detach().numpy(), reference, rtol=1e-12)


def test_batched_grads_check_their_shapes():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    with pytest.raises(RuntimeError, match=r"grad_output\[0\] has a shape of \[3, 3\] and output\[0\] has a shape of \[2\]"):
        xgrad.autograd.grad(y, x, xgrad.tensor(np.ones((3, 3))), is_grads_batched=True)
    with pytest.raises(RuntimeError, match="needs grad_outputs"):
        xgrad.autograd.grad(y.sum(), x, is_grads_batched=True)
    (g,) = xgrad.autograd.grad(y, x, xgrad.tensor(np.ones((5, 2))), is_grads_batched=True)  # the next call works
    assert g.tolist() == [[2.0, 2.0]] * 5


def test_nodes_recorded_by_a_backward_under_anomaly_mode_know_the_running_node():
    """The engine tracks the running node for anomaly mode's parents too, also for rule nodes without hooks."""
    x = xgrad.tensor([0.5, 1.0], dtype=jnp.float64, requires_grad=True)
    with xgrad.autograd.detect_anomaly():
        y = x.sin()
        (g,) = xgrad.autograd.grad(y.sum(), x, create_graph=True)
    assert g.grad_fn.metadata.get("parent_") is y.grad_fn
