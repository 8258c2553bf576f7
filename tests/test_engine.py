"""Eager engine semantics: backward and grad arguments, accumulation, pruning, roots, higher order.

Every expected gradient comes from ``jax.grad``/``jax.vjp`` of the same function on arrays.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import xgrad
from tests._helpers import close
from xgrad import autograd
from xgrad.ops import defprim

# -- helpers ---------------------------------------------------------------------------------


def counting_sin():
    """``sin`` whose backward rule records each run: a side-effect counter for pruning."""
    runs = []

    def rule(g, out, x):
        runs.append(1)
        return g * xgrad.cos(x)

    return defprim("engine_test_sin", jnp.sin, [rule], register=False), runs


def f_np(np_, a, b):
    """The same function written against xgrad or jax.numpy."""
    h = np_.sin(a) * b
    return (np_.exp(h) + h * a).sum()


def arrays():
    return jnp.array([0.3, -0.7, 1.1]), jnp.array([0.5, 2.0, -1.0])


def leaves():
    a, b = arrays()
    return xgrad.tensor(a, requires_grad=True), xgrad.tensor(b, requires_grad=True)


# -- backward and .grad ---------------------------------------------------------------------


def test_backward_matches_jax_grad():
    a, b = leaves()
    f_np(xgrad, a, b).backward()
    ga, gb = jax.grad(lambda a, b: f_np(jnp, a, b), argnums=(0, 1))(*arrays())
    close(a.grad, ga)
    close(b.grad, gb)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("create_graph", [False, True], ids=["first-order", "create_graph"])
def test_grad_accumulates_in_place_unless_create_graph(compiled, create_graph):
    """PyTorch's test_accumulate_grad: ``x.grad`` taken before the second backward is
    the same tensor afterwards and holds the sum; under create_graph ``.grad`` becomes a
    new tensor and the old one keeps its value."""
    a, b = leaves()
    f_np(xgrad, a, b).backward(compiled=compiled)
    first = a.grad
    first_values = first.detach().numpy().copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # backward(create_graph=True)'s reference-cycle warning
        f_np(xgrad, a, b).backward(create_graph=create_graph, compiled=compiled)
    close(a.grad, 2 * first_values)
    if create_graph:
        assert a.grad is not first
        np.testing.assert_array_equal(first.detach().numpy(), first_values)
    else:
        assert a.grad is first
        close(first, 2 * first_values)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("create_graph", [False, True], ids=["first-order", "create_graph"])
def test_accumulate_grad_tensor_reference(compiled, create_graph):
    """PyTorch's test_accumulate_grad_tensor_reference (dense grads): an assigned
    ``.grad`` keeps its identity through backward exactly when create_graph is off."""
    params = xgrad.tensor([1.5, 1.5], requires_grad=True)
    params.grad = xgrad.tensor([1.5, 1.5])
    grad_saved = params.grad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        params.backward(xgrad.tensor([1.5, 1.5]), create_graph=create_graph, compiled=compiled)
    assert (grad_saved is params.grad) == (not create_graph)
    assert params.grad.tolist() == [3.0, 3.0]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_hook_holding_grad_sees_the_live_tensor(compiled):
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    held = []
    x.register_post_accumulate_grad_hook(lambda t: held.append(t.grad) if not held else None)
    for _ in range(3):
        (x * x).sum().backward(compiled=compiled)
    assert len(held) == 1 and held[0] is x.grad
    assert held[0].tolist() == [6.0, 12.0]
    assert held[0]._version == 2  # two in-place accumulations, as ``grad += new`` bumps it


def test_first_grad_does_not_alias_the_given_gradient():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    g = xgrad.tensor([3.0, 4.0])
    x.backward(g)  # a root that is itself a leaf
    assert x.grad is not g and x.grad.tolist() == [3.0, 4.0]
    x.backward(g)
    assert x.grad.tolist() == [6.0, 8.0] and g.tolist() == [3.0, 4.0]


def test_grad_matches_leaf_shape_dtype_and_device():
    cpu1 = jax.devices("cpu")[1]
    w = xgrad.tensor([[1.0, 2.0, 3.0]], dtype=jnp.float32, device=cpu1, requires_grad=True)
    x = xgrad.tensor(np.arange(6.0).reshape(2, 3), device=cpu1)
    (x * w.double()).sum().backward()  # w broadcasts along dim 0, and is cast up
    assert w.grad.shape == (1, 3) and w.grad.dtype == jnp.float32 and w.grad.device == cpu1
    assert w.grad.tolist() == [[3.0, 5.0, 7.0]]


def test_tensor_backward_arguments():
    a, b = leaves()
    y = jnp.array([1.0, -2.0, 0.5])
    out = xgrad.sin(a) * b
    out.backward(xgrad.tensor(y), retain_graph=True, inputs=[b])
    _, vjp = jax.vjp(lambda a, b: jnp.sin(a) * b, *arrays())
    ga, gb = vjp(y)
    assert a.grad is None
    close(b.grad, gb)
    out.backward(y)  # a jax.Array gradient
    close(a.grad, ga)


@pytest.mark.parametrize("as_grad", [lambda g: g, np.asarray, lambda g: xgrad.tensor(g), lambda g: g.tolist()])
def test_root_grads_given_as_arrays(as_grad):
    a, b = leaves()
    g = jnp.array([1.0, 2.0, 3.0])
    (ga,) = autograd.grad(xgrad.exp(a), a, grad_outputs=[as_grad(g)])
    close(ga, jnp.exp(arrays()[0]) * g)


def test_grad_returns_without_accumulating():
    a, b = leaves()
    ga, gb = autograd.grad(f_np(xgrad, a, b), [a, b])
    expected = jax.grad(lambda a, b: f_np(jnp, a, b), argnums=(0, 1))(*arrays())
    close(ga, expected[0])
    close(gb, expected[1])
    assert a.grad is None and b.grad is None
    assert ga.grad_fn is None and not ga.requires_grad


def test_grad_single_tensor_arguments_and_root_leaf():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    (g,) = autograd.grad(x, x, grad_outputs=xgrad.tensor([5.0, 6.0]))
    assert g.tolist() == [5.0, 6.0]
    (g,) = autograd.grad((x * x).sum(), x)
    assert g.tolist() == [2.0, 4.0]


def test_same_input_twice():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    g1, g2 = autograd.grad((x ** 3).sum(), [x, x])
    assert g1.tolist() == g2.tolist() == [3.0, 12.0]


def test_unused_inputs():
    a, b = leaves()
    unused = xgrad.tensor([1.0, 2.0], requires_grad=True)
    out = (a * a).sum()
    ga, gu = autograd.grad(out, [a, unused], allow_unused=True, retain_graph=True)
    assert gu is None
    close(ga, 2 * arrays()[0])
    ga, gu = autograd.grad(out, [a, unused], materialize_grads=True)
    assert gu.tolist() == [0.0, 0.0] and gu.dtype == unused.dtype
    assert unused.grad is None


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_grad_materialize_grads(compiled):
    """PyTorch's test_grad_materialize_grads: materialized zeros require grad, so a
    further ``grad`` of them with materialize_grads works (y = x * a is linear in x)."""
    x = xgrad.tensor(0.5, requires_grad=True)
    a = xgrad.tensor(1.0, requires_grad=True)
    y = x * a
    (dydx,) = autograd.grad(y, x, create_graph=True, compiled=compiled)
    assert dydx.item() == 1.0
    (d2ydx2_none,) = autograd.grad(dydx, x, create_graph=True, allow_unused=True, compiled=compiled)
    (d2ydx2,) = autograd.grad(dydx, x, create_graph=True, allow_unused=True, materialize_grads=True, compiled=compiled)
    (d3ydx3,) = autograd.grad(d2ydx2, x, materialize_grads=True, compiled=compiled)  # allow_unused implied
    assert d2ydx2_none is None
    assert d2ydx2.item() == 0.0 and d2ydx2.requires_grad
    assert d3ydx3.item() == 0.0
    with pytest.raises(ValueError, match="Expected allow_unused to be True or not passed when"):
        autograd.grad(y, x, allow_unused=False, materialize_grads=True, compiled=compiled)


# -- retain_graph and create_graph ----------------------------------------------------------------


def test_retain_graph_defaults_to_create_graph():
    x = xgrad.tensor([0.4, 0.9], requires_grad=True)
    y = (x.sin() * x).sum()
    autograd.grad(y, x, create_graph=True)
    autograd.grad(y, x)  # the graph was kept
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        autograd.grad(y, x)


def test_higher_order_matches_nested_jax_grad():
    def f(np_, x):
        return (np_.tanh(x) * np_.exp(x * 0.5) + x ** 3).sum()

    xs = jnp.array([0.2, -0.4, 0.9])
    x = xgrad.tensor(xs, requires_grad=True)
    (g1,) = autograd.grad(f(xgrad, x), x, create_graph=True)
    assert g1.grad_fn is not None
    (g2,) = autograd.grad(g1.sum(), x, create_graph=True)
    (g3,) = autograd.grad((g2 * g2).sum(), x)
    d1 = jax.grad(lambda v: f(jnp, v))
    d2 = jax.grad(lambda v: d1(v).sum())
    d3 = jax.grad(lambda v: (d2(v) ** 2).sum())
    close(g1, d1(xs))
    close(g2, d2(xs))
    close(g3, d3(xs))


def test_hessian_vector_product_through_two_inputs():
    a, b = leaves()
    v = jnp.array([1.0, -1.0, 0.5])
    ga, _ = autograd.grad(f_np(xgrad, a, b), [a, b], create_graph=True)
    (hvp_b,) = autograd.grad((ga * xgrad.tensor(v)).sum(), b)

    def grad_a(a, b):
        return jax.grad(lambda a: f_np(jnp, a, b))(a)

    expected = jax.grad(lambda b: (grad_a(arrays()[0], b) * v).sum())(arrays()[1])
    close(hvp_b, expected)


def test_backward_with_create_graph_warns_and_records_grad():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    with pytest.warns(UserWarning, match="create a reference cycle"):
        (x ** 3).sum().backward(create_graph=True)
    assert x.grad.grad_fn is not None
    (gg,) = autograd.grad(x.grad.sum(), x)
    assert gg.tolist() == [6.0, 12.0]
    x.grad = None


# -- inputs on backward ------------------------------------------------------------------------------


def test_backward_inputs_accumulates_only_into_them():
    a, b = leaves()
    f_np(xgrad, a, b).backward(inputs=[b])
    assert a.grad is None
    close(b.grad, jax.grad(lambda b: f_np(jnp, arrays()[0], b))(arrays()[1]))
    autograd.backward(f_np(xgrad, a, b), inputs=a)
    close(a.grad, jax.grad(lambda a: f_np(jnp, a, arrays()[1]))(arrays()[0]))


def test_backward_inputs_non_leaf_gets_its_grad():
    a, b = leaves()
    h = a * b
    (h.exp()).sum().backward(inputs=[h])
    assert h.retains_grad and a.grad is None and b.grad is None
    close(h.grad, jnp.exp(arrays()[0] * arrays()[1]))


# -- pruning and exec_info -----------------------------------------------------------------------


def test_nodes_leading_only_to_other_inputs_never_run():
    sin, runs = counting_sin()
    a, b = leaves()
    out = (sin(a) * b).sum()
    pre_hook_calls = []
    sin_node = out.grad_fn.next_functions[0][0].next_functions[0][0]
    assert sin_node.name() == "EngineTestSinBackward"
    sin_node.register_prehook(lambda grads: pre_hook_calls.append(1))
    (gb,) = autograd.grad(out, b, retain_graph=True)
    close(gb, jnp.sin(arrays()[0]))
    out.backward(inputs=[b], retain_graph=True)
    assert runs == [] and pre_hook_calls == [] and a.grad is None
    (ga,) = autograd.grad(out, a)
    assert runs == [1] and pre_hook_calls == [1]
    close(ga, jnp.cos(arrays()[0]) * arrays()[1])


def test_grad_of_a_non_leaf_captures_and_stops_there():
    sin, runs = counting_sin()
    a, b = leaves()
    h = sin(a)
    out = (h * b).sum()
    gh, gb = autograd.grad(out, [h, b])
    close(gh, arrays()[1])
    close(gb, jnp.sin(arrays()[0]))
    assert runs == [] and a.grad is None and b.grad is None
    with pytest.warns(UserWarning, match="not a leaf Tensor"):
        assert h.grad is None


def test_grad_inputs_below_and_above_each_other():
    a, b = leaves()
    h = a * b
    out = (h * h).sum()
    gh, ga = autograd.grad(out, [h, a])
    hs = arrays()[0] * arrays()[1]
    close(gh, 2 * hs)
    close(ga, 2 * hs * arrays()[1])


def test_execution_is_pruned_below_min_topological_nr():
    sin, runs = counting_sin()
    x = xgrad.tensor([0.1, 0.2], requires_grad=True)
    deep = sin(sin(sin(x)))  # topological_nr 3 above x
    mid = xgrad.tensor([1.0, 2.0], requires_grad=True)
    out = (deep * mid).sum()
    autograd.grad(out, mid, retain_graph=True)
    assert runs == []
    autograd.grad(out, x)
    assert len(runs) == 3


# -- several roots ------------------------------------------------------------------------------------


def test_multiple_roots_with_grad_tensors():
    a, b = leaves()
    y1 = a * b
    y2 = (a.exp()).sum()
    g1 = jnp.array([1.0, 0.0, -1.0])
    autograd.backward([y1, y2], grad_tensors=[xgrad.tensor(g1), None])
    A, B = arrays()
    close(a.grad, B * g1 + jnp.exp(A))
    close(b.grad, A * g1)


def test_the_same_root_twice_sums():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    autograd.backward([y, y])
    assert x.grad.tolist() == [4.0, 8.0]


def test_roots_mixing_leaf_and_non_leaf():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    (g,) = autograd.grad([x, (x * 3).sum()], [x], grad_outputs=[xgrad.tensor([1.0, 1.0]), None])
    assert g.tolist() == [4.0, 4.0]


# -- properties ---------------------------------------------------------------------------------------

UNARY = [
    ("sin", lambda np_, h: np_.sin(h)),
    ("tanh", lambda np_, h: np_.tanh(h)),
    ("square", lambda np_, h: h * h),
    ("scale", lambda np_, h: h * 1.5 - 0.25),
]
BINARY = [
    ("add", lambda np_, u, v: u + v),
    ("mul", lambda np_, u, v: u * v),
    ("sub", lambda np_, u, v: u - v),
]


@st.composite
def dags(draw, n_inputs=3):
    """A random DAG over ``n_inputs`` inputs: each step reuses earlier values (chains, diamonds, fan-in)."""
    steps = []
    n_values = n_inputs
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            steps.append(("u", draw(st.sampled_from(range(len(UNARY)))), draw(st.integers(0, n_values - 1))))
        else:
            i, j = draw(st.integers(0, n_values - 1)), draw(st.integers(0, n_values - 1))
            steps.append(("b", draw(st.sampled_from(range(len(BINARY)))), i, j))
        n_values += 1
    return steps


def run_dag(np_, steps, *inputs):
    values = list(inputs)
    for step in steps:
        if step[0] == "u":
            values.append(UNARY[step[1]][1](np_, values[step[2]]))
        else:
            values.append(BINARY[step[1]][1](np_, values[step[2]], values[step[3]]))
    return values[-1].sum()


INPUT_ARRAYS = (jnp.array([0.3, -0.5]), jnp.array([1.2, 0.4]), jnp.array([-0.8, 0.9]))


@given(steps=dags(), k=st.integers(1, 3))
def test_property_k_backwards_accumulate_k_times_one(steps, k):
    xs = [xgrad.tensor(a, requires_grad=True) for a in INPUT_ARRAYS]
    out = run_dag(xgrad, steps, *xs)
    for _ in range(k):
        out.backward(retain_graph=True)
    expected = jax.grad(lambda *a: run_dag(jnp, steps, *a), argnums=(0, 1, 2))(*INPUT_ARRAYS)
    for x, g in zip(xs, expected, strict=True):
        if x.grad is None:  # an input the output does not depend on
            np.testing.assert_array_equal(g, 0.0)
        else:
            np.testing.assert_allclose(x.grad.detach().numpy(), k * np.asarray(g), rtol=1e-12, atol=1e-12)


@given(steps=dags(), subset=st.sets(st.integers(0, 2), min_size=1))
def test_property_grad_of_a_subset_matches_backward(steps, subset):
    xs = [xgrad.tensor(a, requires_grad=True) for a in INPUT_ARRAYS]
    out = run_dag(xgrad, steps, *xs)
    chosen = sorted(subset)
    grads = autograd.grad(out, [xs[i] for i in chosen], retain_graph=True, materialize_grads=True)
    assert all(x.grad is None for x in xs)
    out.backward()
    for i, g in zip(chosen, grads, strict=True):
        full = xs[i].grad.detach().numpy() if xs[i].grad is not None else np.zeros(2)
        np.testing.assert_allclose(g.detach().numpy(), full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("host_grad", [[1.0, 2.0], np.array([1.0, 2.0])])
def test_host_root_grads_are_placed_on_the_output_device(host_grad):
    w = xgrad.tensor([3.0, 4.0], device=jax.devices("cpu")[1], requires_grad=True)
    (g,) = autograd.grad(w * 2, w, grad_outputs=[host_grad])
    assert g.device == w.device and g.tolist() == [2.0, 4.0]


# -- assigning and reading .grad ----------------------------------------------------------------


def test_assigning_grad_checks_as_pytorch():
    x = xgrad.tensor([1.0, 2.0], dtype=jnp.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^can't assign Variable as its own grad$"):
        x.grad = x
    with pytest.raises(RuntimeError, match="assigned grad has data of a different type"):
        x.grad = xgrad.tensor([1.0, 2.0], dtype=jnp.float32)
    with pytest.raises(RuntimeError, match="assigned grad has data of a different size"):
        x.grad = xgrad.tensor([1.0, 2.0, 3.0], dtype=jnp.float64)
    other = jax.devices("cpu")[1]
    with pytest.raises(RuntimeError, match="assigned grad has data located on a different device"):
        x.grad = xgrad.tensor([1.0, 2.0], dtype=jnp.float64, device=other)
    with pytest.raises(TypeError, match="assigned grad expected to be a Tensor or None"):
        x.grad = [1.0, 2.0]
    assert x.grad is None  # nothing was assigned
    g = xgrad.tensor([3.0, 4.0], dtype=jnp.float64)
    x.grad = g
    assert x.grad is g
    x.sum().backward()
    assert x.grad is g and g.tolist() == [4.0, 5.0]  # accumulated into the assigned tensor
    x.grad = None
    assert x.grad is None


def test_reading_grad_of_a_non_leaf_warns_as_pytorch():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2.0
    y.sum().backward(retain_graph=True)
    with pytest.warns(UserWarning) as record:
        assert y.grad is None
    assert len(record) == 1
    assert str(record[0].message).startswith(
        "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad attribute "
        "won't be populated during autograd.backward(). If you indeed want the .grad field to be populated "
        "for a non-leaf Tensor, use .retain_grad() on the non-leaf Tensor."
    )
    assert record[0].filename == __file__  # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert x.grad.tolist() == [2.0, 2.0]  # leaves: no warning
        assert xgrad.tensor([1.0]).grad is None  # a tensor that does not require grad is a leaf
        y.retain_grad()
        y.sum().backward()
        assert y.grad.tolist() == [1.0, 1.0]  # retained: no warning
        z = x * 3.0
        z.grad = xgrad.tensor([1.0, 1.0])  # set by hand: defined, so no warning
        assert z.grad is not None
