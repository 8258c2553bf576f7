"""xgrad with the JAX libraries themselves: Equinox, Flax and orbax (no imitations)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad


def _as_tensors(tree):
    """The floating arrays of a pytree as leaves that require grad; everything else as is."""
    return jax.tree_util.tree_map(lambda a: xgrad.tensor(a, requires_grad=True) if eqx.is_inexact_array(a) else a, tree)


def test_from_jax_takes_an_equinox_module_with_static_leaves():
    mlp = eqx.nn.MLP(3, 2, 4, 2, activation=jax.nn.softplus, key=jax.random.key(0))
    x = jnp.linspace(-1.0, 1.0, 3)
    params = _as_tensors(mlp)
    out = xgrad.from_jax(lambda m, x: jnp.sum(m(x) ** 2))(params, xgrad.tensor(x))
    out.backward()
    expected = eqx.filter_grad(lambda m, x: jnp.sum(m(x) ** 2))(mlp, x)
    tensors = [t for t in jax.tree_util.tree_leaves(params, is_leaf=lambda t: isinstance(t, xgrad.Tensor)) if isinstance(t, xgrad.Tensor)]
    expected_leaves = jax.tree_util.tree_leaves(eqx.filter(expected, eqx.is_inexact_array))
    assert len(tensors) == len(expected_leaves) == 6
    for g, e in zip([t.grad.array for t in tensors], expected_leaves, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out.item(), float(jnp.sum(mlp(x) ** 2)), rtol=1e-6)


def test_from_jax_names_a_bad_argument_by_its_path():
    op = xgrad.from_jax(lambda params, x: params["layers"][0]["w"] * x)

    class Foreign:  # an array of some other library
        def __array__(self, dtype=None, copy=None):
            return np.ones(2)

    with pytest.raises(TypeError, match=r"argument params\['layers'\]\[0\]\['w'\] is a .*Foreign, an array of another library"):
        op({"layers": [{"w": Foreign()}]}, xgrad.ones(2))
