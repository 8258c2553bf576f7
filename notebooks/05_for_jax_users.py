# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # xgrad for JAX users
#
# PyTorch-style hooks inside Equinox and Flax models you do not change, per-example
# gradients with `xgrad.func`, property tests of a `jax.custom_vjp`, and sharded
# tensors. The guide is `docs/for_jax_users.md`.

# %%
import equinox as eqx
import flax.linen as linen
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given

import xgrad
from xgrad.testing import assert_grads_match, gradcheck
from xgrad.testing import strategies as xst

x = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)


def as_tensors(tree):
    """The model's arrays as leaf Tensors that require grad; everything else as it is."""
    return jax.tree_util.tree_map(lambda a: xgrad.tensor(a, requires_grad=True) if eqx.is_inexact_array(a) else a, tree)


# %% [markdown]
# ## Hooks inside a Flax model
# `from_jax(fn, trace=True)` runs the model's jaxpr equation by equation as xgrad nodes;
# `xgrad.intermediates()` collects each module's output under its name.

# %%
class MLP(linen.Module):
    @linen.compact
    def __call__(self, x):
        x = linen.tanh(linen.Dense(8)(x))
        return linen.Dense(2)(x)


model = MLP()
params = jax.jit(model.init)(jax.random.key(0), x)


def loss(params, x):
    return jnp.sum(model.apply(params, x) ** 2)


traced_loss = xgrad.from_jax(loss, trace=True)
tparams = as_tensors(params)
with xgrad.intermediates() as acts:
    out = traced_loss(tparams, x)
print(list(acts))

for t in acts.values():
    t.retain_grad()
acts["Dense_0"].register_hook(lambda g: 0.5 * g)  # halve the gradient through the first layer
out.backward()
print({name: round(float(jnp.linalg.norm(t.grad.array)), 4) for name, t in acts.items()})

# The parameter gradients are JAX's; the hook halved the first layer's, as a custom_vjp would.
reference = jax.jit(jax.grad(loss))(params, x)["params"]
print(np.allclose(tparams["params"]["Dense_1"]["kernel"].grad.array, reference["Dense_1"]["kernel"]),
      np.allclose(tparams["params"]["Dense_0"]["kernel"].grad.array, 0.5 * reference["Dense_0"]["kernel"]))

# %% [markdown]
# ## Clipping one layer of an Equinox model
# Equinox layers are named by their attribute path in the model: `layers[0]`, `layers[1]`.

# %%
mlp = eqx.filter_jit(lambda key: eqx.nn.MLP(3, 2, 8, 1, activation=jnp.tanh, key=key))(jax.random.key(1))
eqx_loss = xgrad.from_jax(lambda m, x: jnp.sum(jax.vmap(m)(x) ** 2), trace=True)
tmlp = as_tensors(mlp)
with xgrad.intermediates() as acts:
    out = eqx_loss(tmlp, x)
print(list(acts))
acts["layers[0]"].register_hook(lambda g: g.clamp(-0.05, 0.05))
out.backward()
print(tmlp.layers[0].weight.grad.array.round(3))

# %% [markdown]
# ## Property-testing a `jax.custom_vjp`
# The checks take a function of arrays: `gradcheck` compares its rule with finite
# differences, `assert_grads_match` with JAX's autodiff of the function it wraps.

# %%
@jax.custom_vjp
def softplus(x):
    return jnp.logaddexp(x, 0.0)


softplus.defvjp(lambda x: (softplus(x), x), lambda x, g: (g * jax.nn.sigmoid(x),))
print(gradcheck(softplus, (np.linspace(-3.0, 3.0, 7),)))


@xst.harness_settings(max_examples=5, database=None)
@given(xst.tensors(shape=(5,), lo=-30.0, hi=30.0, kinks=(0.0,)))
def test_softplus_rule(t):
    assert_grads_match(softplus, t, modes=("eager", "jax"))


test_softplus_rule()
print("softplus's rule agrees with autodiff")

# %% [markdown]
# ## Per-example gradients with `xgrad.func`
# `vmap(grad(loss), in_dims=(None, 0, 0))`, as in `torch.func`.

# %%
from xgrad import func, nn  # noqa: E402

net = nn.MLP([3, 8, 2], activation=nn.Tanh, key=0)


def example_loss(p, xi, yi):
    return ((func.functional_call(net, p, (xi[None],)) - yi[None]) ** 2).mean()


xs, ys = xgrad.tensor(np.asarray(x)), xgrad.tensor(np.ones((4, 2), np.float32))
per_example = func.vmap(func.grad(example_loss), in_dims=(None, 0, 0))(dict(net.named_parameters()), xs, ys)
print({k: tuple(v.shape) for k, v in per_example.items()})

# %% [markdown]
# ## Modules are pytrees: `jax.grad`, optax, orbax
# An `xgrad.nn.Module` goes through JAX's tools as an Equinox module does.

# %%
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402


def mse(m, xi, yi):
    return ((m(xi) - yi) ** 2).mean().array


grads = jax.jit(jax.grad(mse))(net, xs, ys)  # an MLP-shaped tree of gradients
tx = optax.adam(1e-2)
opt_state = tx.init(net)
updates, opt_state = tx.update(grads, opt_state, net)
net = optax.apply_updates(net, updates)  # an MLP again
print(type(net).__name__, float(mse(net, xs, ys)))

with tempfile.TemporaryDirectory() as tmp:
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(Path(tmp) / "state", net.state_dict())
    ckpt.wait_until_finished()
    restored = ckpt.restore(Path(tmp) / "state", net.state_dict())
print(sorted(restored))

# %% [markdown]
# ## Sharding
# A Tensor keeps its array's sharding, and gradients come back with it.

# %%
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
w = xgrad.tensor(jax.device_put(jnp.ones((len(jax.devices()) * 2, 3)), rows), requires_grad=True)
(w.tanh() * 2).sum().backward()
print(w.grad.sharding.is_equivalent_to(w.sharding, w.ndim))
