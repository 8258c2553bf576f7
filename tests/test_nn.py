"""xgrad.nn modules and the Optax optimizer, against plain JAX/optax on the same arrays."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import xgrad
from xgrad import nn
from xgrad.optim import Optax


def test_linear_matches_jax_and_pytorch_init_bounds():
    layer = nn.Linear(5, 3, key=1, dtype=jnp.float64)
    assert layer.weight.shape == (3, 5) and layer.bias.shape == (3,)
    bound = 1 / np.sqrt(5)
    assert np.all(np.abs(layer.weight.numpy()) <= bound) and np.all(np.abs(layer.bias.numpy()) <= bound)
    assert layer.weight.is_leaf and layer.weight.requires_grad
    x = np.random.default_rng(0).normal(size=(4, 5))
    out = layer(xgrad.tensor(x))
    np.testing.assert_allclose(out.numpy(), x @ layer.weight.numpy().T + layer.bias.numpy(), rtol=1e-12)


def test_same_key_same_init_and_default_key_differs():
    a, b = nn.Linear(3, 3, key=7), nn.Linear(3, 3, key=7)
    np.testing.assert_array_equal(a.weight.numpy(), b.weight.numpy())
    c, d = nn.Linear(3, 3), nn.Linear(3, 3)
    assert not np.array_equal(c.weight.numpy(), d.weight.numpy())


def test_mlp_parameter_discovery_and_grads_match_jax_grad():
    model = nn.MLP([3, 4, 2], activation=nn.Tanh, key=0, dtype=jnp.float64)
    names = [n for n, _ in model.named_parameters()]
    assert names == ["layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"]
    assert len(model.parameters()) == 4
    x = np.random.default_rng(1).normal(size=(6, 3))
    labels = np.array([0, 1, 1, 0, 1, 0])
    xgrad.ops.cross_entropy(model(xgrad.tensor(x)), labels).backward()

    def loss(params):
        w0, b0, w1, b1 = params
        logits = jnp.tanh(x @ w0.T + b0) @ w1.T + b1
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(6), labels])

    expected = jax.grad(loss)([p.array for p in model.parameters()])
    for p, g in zip(model.parameters(), expected, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-10, atol=1e-12)
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_shared_parameter_listed_once():
    shared = nn.Linear(2, 2, key=0)
    net = nn.Sequential(shared, nn.ReLU(), shared)
    assert len(net.parameters()) == 2


def test_state_dict_round_trip_and_errors():
    src, dst = nn.MLP([2, 3, 1], key=0), nn.MLP([2, 3, 1], key=1)
    state = src.state_dict()
    assert all(t.grad_fn is None and not t.requires_grad for t in state.values())
    weight_before = dst.parameters()[0]
    dst.load_state_dict(state)
    assert dst.parameters()[0] is weight_before  # loaded in place, still a leaf requiring grad
    assert weight_before.requires_grad and weight_before._version == 1
    for (n1, p1), (n2, p2) in zip(src.named_parameters(), dst.named_parameters(), strict=True):
        assert n1 == n2
        np.testing.assert_array_equal(p1.numpy(), p2.numpy())
    with pytest.raises(RuntimeError, match=r"missing keys \['layers.2.bias'\]"):
        dst.load_state_dict({k: v for k, v in state.items() if k != "layers.2.bias"})
    with pytest.raises(RuntimeError, match="size mismatch for layers.0.weight"):
        dst.load_state_dict({**state, "layers.0.weight": xgrad.zeros(5, 5)})


def test_layer_norm_embedding_match_references():
    ln = nn.LayerNorm(4, dtype=jnp.float64)
    x = np.random.default_rng(2).normal(size=(3, 4))
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(ln(xgrad.tensor(x)).numpy(), (x - mu) / np.sqrt(var + 1e-5), rtol=1e-10)
    assert [n for n, _ in ln.named_parameters()] == ["weight", "bias"]
    emb = nn.Embedding(10, 3, key=0)
    idx = np.array([[1, 2], [9, 1]])
    out = emb(idx)
    np.testing.assert_array_equal(out.numpy(), emb.weight.numpy()[idx])
    out.sum().backward()
    assert emb.weight.grad.numpy()[1].tolist() == [2.0, 2.0, 2.0] and emb.weight.grad.numpy()[0].tolist() == [0.0] * 3


def test_dropout_train_and_eval():
    model = nn.Sequential(nn.Dropout(0.5, key=0))
    x = xgrad.ones(1000)
    y = model(x).numpy()
    assert set(np.unique(y)) <= {0.0, 2.0} and 300 < (y == 0).sum() < 700
    assert not np.array_equal(y, model(x).numpy())  # each call draws a fresh mask
    model.eval()
    assert not model.layers[0].training
    assert model(x) is x
    with pytest.raises(ValueError, match="dropout probability"):
        nn.Dropout(1.5)


@pytest.mark.parametrize("activation, reference", [
    (nn.ReLU, jax.nn.relu), (nn.Tanh, jnp.tanh), (nn.GELU, lambda v: jax.nn.gelu(v, approximate=False)),
    (nn.SiLU, jax.nn.silu), (nn.Sigmoid, jax.nn.sigmoid),
])
def test_activations(activation, reference):
    x = np.linspace(-3, 3, 7)
    np.testing.assert_allclose(activation()(xgrad.tensor(x)).numpy(), reference(x), rtol=1e-10)


@pytest.mark.parametrize("make_transform", [lambda: optax.sgd(0.1, momentum=0.9), lambda: optax.adam(1e-2)], ids=["sgd", "adam"])
def test_optax_steps_equal_optax_on_jax_arrays(make_transform):
    model = nn.MLP([3, 5, 2], key=0, dtype=jnp.float64)
    x = np.random.default_rng(3).normal(size=(8, 3))
    y = np.random.default_rng(4).normal(size=(8, 2))

    def loss_fn(params):
        w0, b0, w1, b1 = params
        return jnp.mean((jax.nn.relu(x @ w0.T + b0) @ w1.T + b1 - y) ** 2)

    ref_params = [p.array for p in model.parameters()]
    transform = make_transform()
    ref_state = transform.init(ref_params)
    opt = Optax(model.parameters(), make_transform())
    params_before = model.parameters()
    for _ in range(3):
        opt.zero_grad()
        xgrad.ops.mse_loss(model(xgrad.tensor(x)), y).backward()
        opt.step()
        updates, ref_state = transform.update(jax.grad(loss_fn)(ref_params), ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, updates)
    assert model.parameters() == params_before  # the same tensors, updated in place
    for p, ref in zip(model.parameters(), ref_params, strict=True):
        assert p.is_leaf and p.requires_grad
        np.testing.assert_allclose(p.numpy(), ref, rtol=1e-10, atol=1e-12)


def test_optax_with_named_params_and_missing_grad():
    a = xgrad.tensor([1.0, 2.0], requires_grad=True)
    b = xgrad.tensor([3.0], requires_grad=True)
    opt = Optax({"a": a, "b": b}, optax.sgd(1.0))
    (a * a).sum().backward()
    opt.step()
    assert a.tolist() == [-1.0, -2.0] and b.tolist() == [3.0]  # b had no grad: a zero step


def test_optax_rejects_bad_params():
    with pytest.raises(ValueError, match="empty parameter list"):
        Optax([], optax.sgd(0.1))
    x = xgrad.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match="non-leaf"):
        Optax([x * 2], optax.sgd(0.1))
    with pytest.raises(TypeError, match="parameter 0 is a ndarray"):
        Optax([np.ones(2)], optax.sgd(0.1))
    with pytest.raises(ValueError, match="more than once"):
        Optax([x, x], optax.sgd(0.1))


def test_step_after_backward_uses_new_values():
    # In-place updates must invalidate graphs that saved the old value, as in PyTorch.
    w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    opt = Optax([w], optax.sgd(0.1))
    loss = (w * w).sum()
    loss.backward(retain_graph=True)
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    opt.zero_grad()
    (w * w).sum().backward()  # and the next backward works
    np.testing.assert_allclose(w.grad.numpy(), 2 * w.numpy())
