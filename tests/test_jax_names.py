"""Names of the intermediates of unmodified JAX models under ``from_jax(fn, trace=True)``.

A value is named by the model's own structure: a Flax NNX module path (``layers.0``), a
Flax linen module path (``Dense_0``), an Equinox attribute path (``layers[0]``); the
outermost module's own computations by its class name; a line of the user's code only
where no module computed it. References: each layer called directly in JAX (the values),
and ``jax.grad`` of the model with a hand-written ``jax.custom_vjp`` at the hooked layer
(the gradients).
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
HERE = "test_jax_names.py:"


def assert_close(actual, expected):
    actual, expected = jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-12, atol=1e-14)


def scale_grad(x):
    """An identity whose vjp halves the cotangent: what the hook ``lambda g: 0.5 * g`` does by hand."""
    return _half(x)


@jax.custom_vjp
def _half(x):
    return x


_half.defvjp(lambda x: (x, None), lambda _, g: (0.5 * g,))


def run(traced, tree):
    """``traced(tree, X)`` on tensors, with its intermediates and a hook that halves the gradient at the second layer."""
    tensors = as_tensors(tree)
    with xgrad.intermediates() as acts:
        out = traced(tensors, X)
    return tensors, acts, out


def assert_library_lines_never_name(acts):
    assert all(HERE in name or ".py:" not in name for name in acts), list(acts)


# -- Flax NNX ------------------------------------------------------------------------


class NnxStack(nnx.Module):
    """Three ``nnx.Linear`` of which two have one shape: each its own name."""

    def __init__(self, rngs):
        self.layers = nnx.List([nnx.Linear(3, 5, rngs=rngs), nnx.Linear(5, 5, rngs=rngs), nnx.Linear(5, 2, rngs=rngs)])

    def __call__(self, x, hook_second=lambda h: h):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            x = hook_second(x) if i == 1 else x
            x = nnx.tanh(x) if i < 2 else x
        return x


@pytest.mark.parametrize("route", ["merge", "module"])
def test_nnx_layers_are_named_by_module_path_with_their_values_and_a_hook(route):
    model = NnxStack(nnx.Rngs(0))
    graphdef, state = nnx.split(model)

    def loss(state, x, hook_second=lambda h: h):
        return (nnx.merge(graphdef, state)(x, hook_second) ** 2).sum()

    if route == "merge":  # NNX's functional API: the module is made inside the function
        traced, tree = xgrad.from_jax(loss, trace=True), state
    else:  # the module itself is the argument (an NNX module is a pytree)
        traced, tree = xgrad.from_jax(lambda m, x: (m(x) ** 2).sum(), trace=True), model
    tensors, acts, out = run(traced, tree)
    assert list(acts)[:-1] == ["layers.0", "NnxStack", "layers.1", "NnxStack#2", "layers.2"]
    assert list(acts)[-1].startswith(HERE)
    assert_library_lines_never_name(acts)
    first = model.layers[0](X)
    second = model.layers[1](jnp.tanh(first))
    assert_close(acts["layers.0"].array, first)
    assert_close(acts["NnxStack"].array, jnp.tanh(first))
    assert_close(acts["layers.1"].array, second)
    assert_close(acts["layers.2"].array, model.layers[2](jnp.tanh(second)))

    acts["layers.1"].register_hook(lambda g: 0.5 * g)
    out.backward()
    expected = jax.jit(jax.grad(loss), static_argnums=2)(state, X, scale_grad)
    assert_close(grads_of(tensors), expected)
    unhooked = jax.jit(jax.grad(loss))(state, X)
    assert not np.allclose(expected["layers"][0]["kernel"][...], unhooked["layers"][0]["kernel"][...])


def test_nnx_sequential_names_its_layers_by_index():
    graphdef, state = nnx.split(nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(4, 4, rngs=nnx.Rngs(1))))
    traced = xgrad.from_jax(lambda s, x: nnx.merge(graphdef, s)(x).sum(), trace=True)
    _, acts, _ = run(traced, state)
    assert list(acts)[:3] == ["layers.0", "Sequential", "layers.2"]
    model = nnx.merge(graphdef, state)
    assert_close(acts["layers.2"].array, model.layers[2](jax.nn.relu(model.layers[0](X))))


# -- Flax linen -----------------------------------------------------------------------


class LinenStack(linen.Module):
    def setup(self):
        self.layers = [linen.Dense(5), linen.Dense(5)]

    def __call__(self, x, hook_second=lambda h: h):
        return self.layers[1](linen.tanh(self.layers[0](x)))


def second_dense(change):
    """A linen interceptor applying ``change`` to the output of ``layers_1``."""

    def intercept(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        return change(out) if context.module.name == "layers_1" and context.method_name == "__call__" else out

    return intercept


@pytest.mark.parametrize("named_call", [True, False], ids=["flax_profile", "no_flax_profile"])
def test_linen_layers_are_named_by_module_path_with_or_without_flax_profiling_names(named_call):
    model = LinenStack()
    params = jax.jit(model.init)(jax.random.PRNGKey(0), X)

    def loss(params, x):
        return (model.apply(params, x) ** 2).sum()

    with linen.override_named_call(named_call):
        tensors, acts, out = run(xgrad.from_jax(loss, trace=True), params)
    assert list(acts)[:-1] == ["layers_0", "LinenStack", "layers_1"]
    assert_library_lines_never_name(acts)
    dense = linen.Dense(5)
    first = dense.apply({"params": params["params"]["layers_0"]}, X)
    assert_close(acts["layers_0"].array, first)
    assert_close(acts["layers_1"].array, dense.apply({"params": params["params"]["layers_1"]}, jnp.tanh(first)))

    acts["layers_1"].register_hook(lambda g: 0.5 * g)
    out.backward()

    def hooked(params, x):
        with linen.intercept_methods(second_dense(scale_grad)):
            return loss(params, x)

    assert_close(grads_of(tensors), jax.jit(jax.grad(hooked))(params, X))


# -- Equinox --------------------------------------------------------------------------


class EqxPair(eqx.Module):
    """Two ``eqx.nn.Linear`` of one shape, and the first one called twice in a row."""

    first: eqx.nn.Linear
    second: eqx.nn.Linear

    def __call__(self, x, hook_second=lambda h: h):
        return hook_second(self.second(self.first(self.first(x))))


def test_equinox_custom_module_names_attributes_and_splits_back_to_back_calls():
    model = EqxPair(eqx.nn.Linear(3, 3, key=jax.random.PRNGKey(2)), eqx.nn.Linear(3, 3, key=jax.random.PRNGKey(3)))

    def loss(model, x, hook_second=lambda h: h):
        return (jax.vmap(lambda v: model(v, hook_second))(x) ** 2).sum()

    tensors, acts, out = run(xgrad.from_jax(loss, trace=True), model)
    assert list(acts)[:-1] == ["first", "first#2", "second"]
    assert_library_lines_never_name(acts)
    once = jax.vmap(model.first)(X)
    twice = jax.vmap(model.first)(once)
    assert_close(acts["first"].array, once)
    assert_close(acts["first#2"].array, twice)
    assert_close(acts["second"].array, jax.vmap(model.second)(twice))

    acts["second"].register_hook(lambda g: 0.5 * g)
    out.backward()
    expected = eqx.filter_jit(eqx.filter_grad(loss))(model, X, scale_grad)
    assert_close(grads_of(tensors), expected)


@pytest.mark.parametrize("route", ["argument", "combine", "filter_vmap"])
def test_equinox_mlp_layers_are_named_by_attribute_path(route):
    model = eqx.nn.MLP(3, 2, 5, 2, activation=jnp.tanh, key=jax.random.PRNGKey(1))
    params, static = eqx.partition(model, eqx.is_array)

    def loss(params, x, hook_second=lambda h: h):
        mlp = eqx.combine(params, static)

        def one(v):  # eqx.nn.MLP.__call__, with ``hook_second`` after the second layer
            h = jnp.tanh(mlp.layers[0](v))
            return mlp.layers[2](jnp.tanh(hook_second(mlp.layers[1](h))))

        return (jax.vmap(one)(x) ** 2).sum()

    call = {
        "argument": lambda m, x: (jax.vmap(m)(x) ** 2).sum(),
        "combine": lambda p, x: (jax.vmap(eqx.combine(p, static))(x) ** 2).sum(),
        "filter_vmap": lambda m, x: (eqx.filter_vmap(m)(x) ** 2).sum(),
    }[route]
    tensors, acts, out = run(xgrad.from_jax(call, trace=True), params if route == "combine" else model)
    assert list(acts)[:-1] == ["layers[0]", "MLP", "layers[1]", "MLP#2", "layers[2]"]
    assert_library_lines_never_name(acts)
    first = jax.vmap(model.layers[0])(X)
    assert_close(acts["layers[0]"].array, first)
    assert_close(acts["layers[1]"].array, jax.vmap(model.layers[1])(jnp.tanh(first)))

    acts["layers[1]"].register_hook(lambda g: 0.5 * g)
    out.backward()
    assert_close(grads_of(tensors), eqx.filter_jit(eqx.filter_grad(loss))(params, X, scale_grad))


def test_modules_in_a_container_are_named_by_their_path_in_the_argument():
    models = {"enc": EqxPair(eqx.nn.Linear(3, 3, key=jax.random.PRNGKey(4)), eqx.nn.Linear(3, 3, key=jax.random.PRNGKey(5)))}
    _, acts, _ = run(xgrad.from_jax(lambda d, x: jax.vmap(d["enc"])(x).sum(), trace=True), models)
    assert list(acts)[:-1] == ["['enc'].first", "['enc'].first#2", "['enc'].second"]


# -- No module: the user's line -------------------------------------------------------


def test_library_code_outside_a_module_call_is_named_by_the_users_line_and_names_are_deterministic():
    embed = nnx.Embed(4, 3, rngs=nnx.Rngs(0))

    def attend(embed, x):
        return embed.attend(x).sum()  # a method other than __call__: no module scope, computed in Flax's file

    def names():
        _, acts, _ = run(xgrad.from_jax(attend, trace=True), embed)
        return list(acts)

    first = names()
    assert first == [f"{HERE}{attend.__code__.co_firstlineno + 1} ({attend.__qualname__})"]
    assert names() == first


def test_the_libraries_classes_are_left_as_they_were_even_when_the_function_raises():
    calls = {cls: cls.__dict__["__call__"] for cls in (eqx.nn.Linear, eqx.nn.MLP, nnx.Linear, EqxPair, NnxStack)}
    model = eqx.nn.Linear(3, 3, key=jax.random.PRNGKey(6))

    def fails(model, x):
        jax.vmap(model)(x)
        raise ValueError("inside fn")

    with pytest.raises(ValueError, match="inside fn"):
        xgrad.from_jax(fails, trace=True)(as_tensors(model), X)
    assert {cls: cls.__dict__["__call__"] for cls in calls} == calls
