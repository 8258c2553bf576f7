"""``xgrad.from_jax(fn, trace=True)`` and ``xgrad.intermediates()``: hooks inside unmodified JAX models.

References: ``jax.grad`` of the same, unmodified function (Equinox, Flax linen and NNX
models), and for hooks that change a gradient, the same model with a ``jax.custom_vjp``
inserted at that point (through Flax's ``intercept_methods``, or Equinox's layers called
one by one).
"""

from __future__ import annotations

import equinox as eqx
import flax.linen as linen
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _backward_modes import eager_and_compiled  # noqa: F401  (a fixture)
from _helpers import as_tensors, grads_of
from flax import nnx

import xgrad

pytestmark = pytest.mark.usefixtures("eager_and_compiled")

X = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)


def assert_trees_close(actual, expected):
    expected = jax.tree_util.tree_leaves(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-12, atol=1e-12)


def scale_grad(factor):
    """A ``jax.custom_vjp`` identity that multiplies its cotangent by ``factor``."""

    @jax.custom_vjp
    def scale(x):
        return x

    scale.defvjp(lambda x: (x, None), lambda _, g: (factor * g,))
    return scale


class LinenMLP(linen.Module):
    @linen.compact
    def __call__(self, x):
        x = linen.tanh(linen.Dense(5)(x))
        return linen.Dense(2)(x)


class NnxMLP(nnx.Module):
    def __init__(self, rngs):
        self.first = nnx.Linear(3, 5, rngs=rngs)
        self.second = nnx.Linear(5, 2, rngs=rngs)

    def __call__(self, x):
        h = nnx.tanh(self.first(x))
        return self.second(h)


@pytest.fixture(scope="module")
def linen_model():
    model = LinenMLP()
    params = jax.jit(model.init)(jax.random.PRNGKey(0), X)

    def loss(params, x):
        return (model.apply(params, x) ** 2).sum()

    return model, params, loss, xgrad.from_jax(loss, trace=True)


@pytest.fixture(scope="module")
def eqx_model():
    model = eqx.filter_jit(lambda key: eqx.nn.MLP(3, 2, 5, 1, activation=jnp.tanh, key=key))(jax.random.PRNGKey(1))

    def loss(model, x):
        return (jax.vmap(model)(x) ** 2).sum()

    return model, loss, xgrad.from_jax(loss, trace=True)


@pytest.fixture(scope="module")
def nnx_model():
    graphdef, state = nnx.split(NnxMLP(nnx.Rngs(2)))

    def loss(state, x):
        return (nnx.merge(graphdef, state)(x) ** 2).sum()

    return state, loss, xgrad.from_jax(loss, trace=True)


def dense_output(name, change):
    """A Flax interceptor that applies ``change`` to the output of the Dense layer called ``name``."""

    def intercept(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        return change(out) if context.module.name == name and context.method_name == "__call__" else out

    return intercept


def test_linen_names_grads_and_a_hook_that_scales_a_layer_gradient_as_a_custom_vjp(linen_model):
    model, params, loss, traced = linen_model
    tensors = as_tensors(params)
    with xgrad.intermediates() as acts:
        out = traced(tensors, X)
    assert list(acts)[:3] == ["Dense_0", "LinenMLP", "Dense_1"]
    assert list(acts)[3].startswith("test_jax_trace.py:")
    np.testing.assert_allclose(out.item(), loss(params, X), rtol=1e-14)
    seen = []
    acts["Dense_0"].register_hook(lambda g: seen.append(g.shape) or 0.5 * g)
    for t in acts.values():
        t.retain_grad()  # retained gradients see what the hooks made of them
    out.backward()
    assert seen == [(4, 5)]

    def scaled(params, x):  # the reference: a custom_vjp that halves the cotangent at Dense_0's output
        with linen.intercept_methods(dense_output("Dense_0", scale_grad(0.5))):
            return loss(params, x)

    expected = jax.jit(jax.grad(scaled))(params, X)
    unmodified = jax.jit(jax.grad(loss))(params, X)
    assert_trees_close(grads_of(tensors), expected)
    np.testing.assert_allclose(expected["params"]["Dense_0"]["kernel"], 0.5 * unmodified["params"]["Dense_0"]["kernel"], rtol=1e-12)
    assert_trees_close(grads_of(tensors["params"]["Dense_1"]), unmodified["params"]["Dense_1"])

    # Per-layer gradients: d loss / d output = 2 * output; at Dense_0, by perturbing its output (then halved).
    np.testing.assert_allclose(acts["Dense_1"].grad.array, 2 * model.apply(params, X), rtol=1e-12)

    def perturbed(eps, x):
        with linen.intercept_methods(dense_output("Dense_0", lambda out: out + eps)):
            return loss(params, x)

    at_dense_0 = jax.jit(jax.grad(perturbed))(jnp.zeros((4, 5)), X)
    np.testing.assert_allclose(acts["Dense_0"].grad.array, 0.5 * at_dense_0, rtol=1e-12, atol=1e-14)


def test_equinox_grads_names_and_clipping_one_layer(eqx_model):
    model, loss, traced = eqx_model
    plain = as_tensors(model)
    plain_out = traced(plain, X)
    plain_out.backward()
    assert_trees_close(grads_of(plain), eqx.filter_jit(eqx.filter_grad(loss))(model, X))

    clipped = as_tensors(model)
    with xgrad.intermediates() as acts:
        out = traced(clipped, X)
    assert list(acts)[:3] == ["layers[0]", "MLP", "layers[1]"]
    acts["layers[0]"].register_hook(lambda g: g.clamp(-0.1, 0.1))
    out.backward()

    @jax.custom_vjp
    def clip_grad(x):
        return x

    clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))

    def reference(model, x):
        def one(x):  # eqx.nn.MLP.__call__, with the clip after the first layer
            return model.layers[1](model.activation(clip_grad(model.layers[0](x))))

        return (jax.vmap(one)(x) ** 2).sum()

    expected = eqx.filter_jit(eqx.filter_grad(reference))(model, X)
    assert_trees_close(grads_of(clipped), expected)
    assert not np.allclose(expected.layers[0].weight, grads_of(plain)[0])  # the clip mattered


def test_nnx_grads_equal_jax_grad_and_values_are_named_by_module_path(nnx_model):
    state, loss, traced = nnx_model
    tensors = as_tensors(state)
    with xgrad.intermediates() as acts:
        out = traced(tensors, X)
    assert list(acts)[:3] == ["first", "NnxMLP", "second"]
    out.backward()
    assert_trees_close(grads_of(tensors), jax.jit(jax.grad(loss))(state, X))


@pytest.mark.eager_engine
def test_anomaly_mode_inside_a_flax_model_names_the_module_and_the_line():
    class SqrtNet(linen.Module):
        @linen.compact
        def __call__(self, x):
            h = linen.Dense(3)(x)
            return jnp.sqrt(h * h * 0.0).sum()  # sqrt at 0: an infinite slope, times 0: NaN in backward

    model = SqrtNet()
    params = jax.jit(model.init)(jax.random.PRNGKey(0), X)
    traced = xgrad.from_jax(lambda p, x: model.apply(p, x), trace=True)
    with xgrad.autograd.detect_anomaly():
        out = traced(as_tensors(params), X)
        with pytest.raises(RuntimeError, match=r"Function '\w+Backward\[SqrtNet\]' returned nan values in its 0th output") as info:
            out.backward()
    assert "JAX equation" in str(info.value) and "test_jax_trace.py" in str(info.value)


@pytest.mark.eager_engine
def test_profiler_and_graph_picture_show_nodes_by_name(linen_model):
    _, params, _, traced = linen_model
    out = traced(as_tensors(params), X)
    with xgrad.autograd.profile() as prof:
        out.backward(retain_graph=True)
    names = [row.name for row in prof.key_averages()]
    assert "DotGeneralBackward[Dense_0]" in names and "AddBackward[Dense_1]" in names
    assert "DotGeneralBackward[Dense_1]" in xgrad.viz.make_dot(out).source


def test_nested_jit_custom_vjp_scan_and_remat_stay_single_nodes_with_jax_gradients():
    @jax.custom_vjp
    def odd_square(x):  # a custom rule that is not the true derivative: JAX's grad uses it, so must xgrad
        return x * x

    odd_square.defvjp(lambda x: (x * x, x), lambda x, g: (3.0 * x * g,))

    @jax.jit
    def inner(x):
        return jnp.sin(x) * 2.0

    def body(carry, x):
        return carry * jnp.cos(x) + x, carry

    def fn(x, w):
        y = inner(x) + odd_square(w)
        carry, ys = jax.lax.scan(body, y[0], y)
        z = jax.checkpoint(lambda v: jnp.exp(v).sum())(ys)
        values, indices = jax.lax.top_k(y, 2)  # one equation, a float and an integer output
        return carry + z + values.sum() + indices.sum()

    x, w = jnp.array([0.1, 0.5, -0.3]), jnp.array([1.0, 2.0, 0.5])
    traced = xgrad.from_jax(fn, trace=True)
    xt, wt = xgrad.tensor(x, requires_grad=True), xgrad.tensor(w, requires_grad=True)
    out = traced(xt, wt)
    names = {node.name().split("[")[0] for node in _nodes(out)}
    assert {"JitInnerBackward", "CustomVjpCallBackward", "ScanBackward", "TopKBackward"} <= names
    assert any(n.startswith("Remat") for n in names)  # jax.checkpoint's primitive
    out.backward()
    gx, gw = jax.jit(jax.grad(fn, argnums=(0, 1)))(x, w)
    np.testing.assert_allclose(xt.grad.array, gx, rtol=1e-12)
    np.testing.assert_allclose(wt.grad.array, gw, rtol=1e-12)


def _nodes(tensor):
    seen, stack = {}, [tensor.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen[id(fn)] = fn
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return list(seen.values())


def test_second_order_gradients_and_one_trace_per_signature():
    def fn(x, scale):  # ``scale`` is a Python float: static
        with jax.named_scope("block"):
            return (jnp.sin(x) * x).sum() * scale

    traced = xgrad.from_jax(fn, trace=True)
    x = jnp.array([0.3, -0.7])
    xt = xgrad.tensor(x, requires_grad=True)
    (g,) = xgrad.autograd.grad(traced(xt, 2.0), xt, create_graph=True)
    (gg,) = xgrad.autograd.grad(g.sum(), xt)
    np.testing.assert_allclose(g.array, 2.0 * (jnp.sin(x) + x * jnp.cos(x)), rtol=1e-12)
    np.testing.assert_allclose(gg.array, 2.0 * (2 * jnp.cos(x) - x * jnp.sin(x)), rtol=1e-12)
    traced(xt, 2.0)
    assert len(traced.programs) == 1
    traced(xt, 3.0)
    traced(xgrad.tensor([1.0, 2.0, 3.0]), 2.0)
    assert len(traced.programs) == 3
    with xgrad.no_grad():
        assert traced(xt, 2.0).grad_fn is None


def test_collection_counts_calls_across_a_block_and_blocks_nest():
    traced = xgrad.from_jax(lambda x: jnp.sin(x).sum(), trace=True)
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    with xgrad.intermediates() as outer:
        traced(x)
        with xgrad.intermediates() as inner:
            traced(x)
        traced(x)
    (name,) = inner
    assert list(outer) == [name, f"{name}#2"]
    assert repr(inner) == f"Intermediates({{{name!r}: [] float32}})"
