"""Tensor as a pytree (NOTE [Tensor as a pytree] in xgrad/tensor/jax_boundary.py): tree_map, raw optax, jax transforms."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import xgrad
from xgrad import nn


def test_tree_map_to_shapes_gives_shapes_and_other_values_keep_the_structure():
    model = nn.Sequential(nn.Linear(3, 4, key=0), nn.ReLU(), nn.Linear(4, 2, key=1))
    shapes = jax.tree_util.tree_map(lambda p: p.shape, model.state_dict())
    assert shapes == {"0.weight": (4, 3), "0.bias": (4,), "2.weight": (2, 4), "2.bias": (2,)}
    names = jax.tree_util.tree_map(lambda p: p.dtype.name, {"w": model[0].weight})  # other values keep the structure
    assert jax.tree_util.tree_structure(names) == jax.tree_util.tree_structure({"w": model[0].weight})
    assert jax.tree_util.tree_leaves(names) == ["float32"]
    total = sum(jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda p: p.size, model.state_dict())))
    assert total == 4 * 3 + 4 + 2 * 4 + 2
    doubled = jax.tree_util.tree_map(lambda a: a * 2, model.state_dict())  # arrays still come back as Tensors
    assert all(isinstance(t, xgrad.Tensor) for t in doubled.values())


def test_params_and_grads_have_one_structure_and_raw_optax_works():
    model = nn.MLP([3, 5, 2], key=0, dtype=jnp.float64)
    x = np.random.default_rng(0).normal(size=(4, 3))
    params = dict(model.named_parameters())
    xgrad.mse_loss(model(xgrad.tensor(x)), np.zeros((4, 2))).backward()
    grads = {name: p.grad for name, p in params.items()}
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(grads)
    tx = optax.adamw(0.1, weight_decay=0.1)
    state = tx.init(params)
    updates, state = tx.update(grads, state, params)
    new_params = optax.apply_updates(params, updates)
    # the same step on plain arrays
    raw = {k: v.array for k, v in params.items()}
    raw_updates, _ = tx.update({k: g.array for k, g in grads.items()}, tx.init(raw), raw)
    expected = optax.apply_updates(raw, raw_updates)
    for name, t in new_params.items():
        assert isinstance(t, xgrad.Tensor) and t.is_leaf and t.requires_grad  # ready for the next forward
        np.testing.assert_allclose(t.detach().numpy(), expected[name], rtol=1e-12)
    # and they train: a functional loop with raw optax
    model.load_state_dict(new_params)
    assert all(np.array_equal(p.detach().numpy(), new_params[n].detach().numpy()) for n, p in model.named_parameters())


def test_jax_transforms_still_see_the_array():
    x = xgrad.tensor(np.arange(3.0), requires_grad=True)
    (leaf,) = jax.tree_util.tree_leaves({"x": x})
    assert leaf is x.array
    assert float(jax.jit(lambda t: jnp.sum(t.array * 2))(x)) == 6.0
    spec = jax.eval_shape(lambda t: t, x)
    assert isinstance(spec, xgrad.Tensor) and spec.shape == (3,)
    moved = jax.device_put({"x": x}, jax.devices("cpu")[1])["x"]
    assert isinstance(moved, xgrad.Tensor) and moved.device == jax.devices("cpu")[1] and moved.requires_grad
    grads = jax.grad(lambda t: jnp.sum(t.array ** 2))(x)
    assert isinstance(grads, xgrad.Tensor) and grads.tolist() == [0.0, 2.0, 4.0]
    ints = jax.tree_util.tree_map(lambda a: a.astype(jnp.int32), x)  # an integer Tensor cannot require grad
    assert ints.dtype == jnp.int32 and not ints.requires_grad


def test_a_jitted_model_sees_every_change_between_calls() -> None:
    """A module's flatten reuses what it found while its attributes are the same objects
    (NOTE [Flatten plans]): each change below must still reach the next call, checked
    against eager's gradient of the model as it is then."""
    model = nn.Sequential(nn.Linear(3, 4, key=0), nn.Tanh(), nn.Linear(4, 4, key=1), nn.Linear(4, 4, key=2))
    x = xgrad.tensor(np.linspace(-1, 1, 12).reshape(4, 3).astype(np.float32))
    step = jax.jit(jax.grad(lambda m, x: (m(x) ** 2).sum().array))

    def check() -> None:
        grads = dict(step(model, x).named_parameters(remove_duplicate=False))
        for p in model.parameters():
            p.grad = None
        (model(x) ** 2).sum().backward()
        for name, p in model.named_parameters(remove_duplicate=False):
            want = np.zeros(p.shape, np.float32) if p.grad is None else p.grad.numpy()
            np.testing.assert_allclose(np.asarray(grads[name].detach().numpy()), want, rtol=1e-5, atol=1e-7, err_msg=name)

    check()
    with xgrad.no_grad():
        model[0].weight.mul_(0.5)  # an in-place update, as an optimizer's
    check()
    model[0].bias = nn.Parameter(xgrad.ones(4))  # a replaced parameter
    check()
    model[2].weight.requires_grad_(False)  # frozen: no gradient
    check()
    model[2].weight.requires_grad_(True)
    model[0].weight.register_hook(lambda g: g * 3.0)  # a hook registered after the first call
    check()
    model[3].weight = model[2].weight  # tied after the first call: one leaf, the sum of both uses
    assert len(jax.tree_util.tree_leaves(model)) == 5  # six Tensors, one of them twice
    check()
    model[1] = nn.ReLU()  # a replaced submodule
    check()
    handle = model[2].register_forward_hook(lambda module, args, out: out * 2.0)  # a module hook since
    check()
    handle.remove()
    check()
