"""xgrad with the JAX libraries themselves: Equinox, Flax and orbax (no imitations)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import xgrad
from xgrad import nn


def _as_tensors(tree):
    """The floating arrays of a pytree as leaves that require grad; everything else as is."""
    return jax.tree_util.tree_map(lambda a: xgrad.tensor(a, requires_grad=True) if eqx.is_inexact_array(a) else a, tree)


@pytest.mark.slow
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


@pytest.mark.slow
def test_from_jax_takes_a_flax_nnx_graphdef_and_state():
    from flax import nnx

    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    params = _as_tensors(state)
    x = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
    out = xgrad.from_jax(lambda g, s, x: jnp.sum(nnx.merge(g, s)(x) ** 2))(graphdef, params, xgrad.tensor(x))
    out.backward()
    expected = nnx.grad(lambda m, x: jnp.sum(m(x) ** 2))(model, x)
    got = [t.grad.array for t in jax.tree_util.tree_leaves(params, is_leaf=lambda t: isinstance(t, xgrad.Tensor))]
    for g, e in zip(got, jax.tree_util.tree_leaves(expected), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5)


def test_from_jax_names_a_bad_argument_by_its_path():
    op = xgrad.from_jax(lambda params, x: params["layers"][0]["w"] * x)

    class Foreign:  # an array of some other library
        def __array__(self, dtype=None, copy=None):
            return np.ones(2)

    with pytest.raises(TypeError, match=r"argument params\['layers'\]\[0\]\['w'\] is a .*Foreign, an array of another library"):
        op({"layers": [{"w": Foreign()}]}, xgrad.ones(2))


# -- nn.Module as a pytree --------------------------------------------------------------


def _model():
    return nn.Sequential(nn.Linear(3, 4, key=0, dtype=jnp.float64), nn.Tanh(), nn.Linear(4, 2, key=1, dtype=jnp.float64))


def _loss(model, x, y):
    return ((model(x) - y) ** 2).mean().array


def test_a_module_is_a_pytree_of_its_parameters_and_buffers():
    model = _model()
    x, y = np.linspace(-1, 1, 15).reshape(5, 3), np.linspace(0, 1, 10).reshape(5, 2)
    assert all(a is p.array for a, p in zip(jax.tree_util.tree_leaves(model), model.parameters(), strict=True))
    doubled = jax.tree_util.tree_map(lambda a: a * 2, model)
    assert type(doubled) is nn.Sequential and [n for n, _ in doubled.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert all(p.requires_grad and p.is_leaf for p in doubled.parameters())
    np.testing.assert_allclose(doubled[0].weight.detach().numpy(), 2 * model[0].weight.detach().numpy())
    assert jax.tree_util.tree_map(lambda a: a.shape, model)[0].weight == (4, 3)
    # jit, vmap and Equinox's filter_jit with the model as an argument (no constants captured)
    eager = model(xgrad.tensor(x)).detach().numpy()
    np.testing.assert_allclose(jax.jit(lambda m, x: m(x))(model, x).detach().numpy(), eager, rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(lambda m, r: m(r), in_axes=(None, 0))(model, x).detach().numpy(), eager, rtol=1e-12)
    np.testing.assert_allclose(eqx.filter_jit(lambda m, x: m(x))(model, x).detach().numpy(), eager, rtol=1e-12)
    # jax.grad gives a model-shaped tree of grads, equal to what backward accumulates
    grads = jax.grad(_loss)(model, x, y)
    assert type(grads) is nn.Sequential
    xgrad.mse_loss(model(xgrad.tensor(x)), y).backward()
    for g, p in zip(grads.parameters(), model.parameters(), strict=True):
        np.testing.assert_allclose(g.detach().numpy(), p.grad.detach().numpy(), rtol=1e-12)
    # optax on the model itself: an updated model, the old one untouched
    tx = optax.adam(0.1)
    state = tx.init(model)
    updates, state = tx.update(grads, state, model)
    new = optax.apply_updates(model, updates)
    assert type(new) is nn.Sequential and new is not model
    raw = [p.array for p in model.parameters()]
    raw_updates, _ = tx.update([g.array for g in grads.parameters()], tx.init(raw), raw)
    for p, e in zip(new.parameters(), optax.apply_updates(raw, raw_updates), strict=True):
        np.testing.assert_allclose(p.detach().numpy(), e, rtol=1e-12)
    xgrad.mse_loss(new(xgrad.tensor(x)), y).backward()  # the new model trains eagerly
    assert all(p.grad is not None for p in new.parameters())
    # eager mutation as before, and a jitted function of the model sees it
    f = jax.jit(_loss)
    before = float(f(model, x, y))
    with xgrad.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    assert float(f(model, x, y)) != before
    np.testing.assert_allclose(float(f(model, x, y)), float(_loss(model, xgrad.tensor(x), y)), rtol=1e-12)


def test_module_configuration_and_mode_are_static():
    model = nn.Sequential(nn.Linear(2, 3, key=0), nn.BatchNorm1d(3))
    x = np.random.default_rng(0).normal(size=(4, 2)).astype(np.float32)
    leaves = jax.tree_util.tree_leaves(model)
    assert len(leaves) == 4 + 3  # weight, bias, BN weight and bias; running mean, var and count
    f = jax.jit(lambda m, x: m(x))
    with pytest.raises(RuntimeError, match="modified in place inside it"):
        f(model, x)  # train mode writes the running statistics, which a plain jit would drop
    model.eval()  # another static value: traced again, with the running statistics
    evaluated = f(model, x).detach().numpy()
    np.testing.assert_allclose(evaluated, model(xgrad.tensor(x)).detach().numpy(), rtol=1e-6)
    train = model.train()(xgrad.tensor(x)).detach().numpy()  # batch statistics, eagerly
    assert not np.allclose(train, evaluated)


# -- orbax and xgrad.load for JAX code --------------------------------------------------
def test_orbax_saves_and_restores_a_state_dict_and_a_model(tmp_path):
    import orbax.checkpoint as ocp

    model = nn.Sequential(nn.Linear(3, 4, key=0), nn.BatchNorm1d(4))
    model(xgrad.ones(2, 3))  # running statistics move off their initial values
    checkpointer = ocp.StandardCheckpointer()
    state = model.state_dict()
    checkpointer.save(tmp_path / "state", state)
    checkpointer.save(tmp_path / "model", model)
    checkpointer.wait_until_finished()
    restored = checkpointer.restore(tmp_path / "state", state)
    assert set(restored) == set(state)
    for key, t in restored.items():
        assert isinstance(t, xgrad.Tensor) and t.dtype == state[key].dtype
        np.testing.assert_array_equal(t.detach().numpy(), state[key].detach().numpy())
    fresh = nn.Sequential(nn.Linear(3, 4, key=5), nn.BatchNorm1d(4))
    fresh.load_state_dict(restored)
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, model)
    back = checkpointer.restore(tmp_path / "model", abstract)
    assert type(back) is nn.Sequential and [n for n, _ in back.named_parameters()] == [n for n, _ in model.named_parameters()]
    for a, b, c in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(model), jax.tree_util.tree_leaves(fresh), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(np.asarray(c), np.asarray(b))
    x = xgrad.tensor(np.linspace(-1, 1, 6).reshape(2, 3).astype(np.float32))
    np.testing.assert_allclose(back(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-6)


def test_xgrad_load_gives_plain_arrays_for_jax_code(tmp_path):
    model = nn.Linear(2, 3, key=0)
    xgrad.save(model.state_dict(), tmp_path / "m.safetensors")
    params = xgrad.load(tmp_path / "m.safetensors", arrays=True)
    assert all(type(a) is type(jnp.zeros(1)) for a in params.values())
    np.testing.assert_array_equal(params["weight"], model.weight.detach().numpy())
    updates = jax.tree_util.tree_map(jnp.ones_like, params)
    assert set(optax.apply_updates(params, updates)) == {"weight", "bias"}
