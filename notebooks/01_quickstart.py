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
# # xgrad quickstart
#
# xgrad gives JAX users PyTorch-style eager autograd: a `Tensor` wraps a `jax.Array`,
# every op records a backward node, and `.backward()` runs the recorded graph.
# This notebook covers tensors, `backward`, forward mode and Jacobians, hooks, `retain_grad`
# and a picture of the graph.

# %%

import jax
import jax.numpy as jnp
import numpy as np

import xgrad

# %% [markdown]
# ## Tensors
# A tensor's storage is a `jax.Array` (no copy either way); dtype, device and sharding are the array's.

# %%
x = xgrad.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
print(x)
print(x.shape, x.dtype, x.device, x.is_leaf)
print(type(x.array))
print(jnp.sin(x.detach()))  # jnp functions accept Tensors; one that requires grad must be detached first,
# or the gradient would be lost silently: use xgrad.sin(x) to keep it, as the next cell does

# %% [markdown]
# ## Backward
# Ops build the graph as they run; `backward()` accumulates into the leaves' `.grad`.

# %%
w = xgrad.tensor([0.5, -1.0, 2.0], requires_grad=True)
loss = ((x * w).tanh() + x.exp()).sum()
loss.backward()
print(loss.grad_fn, x.grad, w.grad, sep="\n")

# %% [markdown]
# The same gradients from `jax.grad` of the same function on plain arrays:

# %%
def f(x, w):
    return (jnp.tanh(x * w) + jnp.exp(x)).sum()


gx, gw = jax.grad(f, argnums=(0, 1))(x.array, w.array)
np.testing.assert_allclose(x.grad.detach().numpy(), gx, rtol=1e-5, atol=1e-7)  # float32: XLA may fuse differently
np.testing.assert_allclose(w.grad.detach().numpy(), gw, rtol=1e-5, atol=1e-7)
print("matches jax.grad")

# %% [markdown]
# Gradients accumulate across calls, as in PyTorch; clear them with `x.grad = None`.
# `xgrad.autograd.grad` returns gradients instead, and `create_graph=True` makes
# them differentiable for higher orders.

# %%
t = xgrad.tensor(2.0, requires_grad=True)
(dy,) = xgrad.autograd.grad(t**3, t, create_graph=True)
(d2y,) = xgrad.autograd.grad(dy, t)
print(dy.item(), d2y.item())  # 3 t^2 = 12, 6 t = 12

# %% [markdown]
# ## Forward mode, Jacobians and Hessian-vector products
# `xgrad.autograd.forward_ad` is PyTorch's forward-mode API: inside a `dual_level()`,
# `make_dual(x, v)` gives `x` a tangent and every op computes its output's tangent
# (the Jacobian-vector product) along with the value. `xgrad.autograd.functional` has
# PyTorch's `jacobian`, `hessian`, `vjp`, `jvp`, `hvp` and `vhp`. Here they take the
# Jacobian of a small model's output with respect to its input, and a Hessian-vector
# product of its loss two ways.

# %%
import xgrad.autograd.forward_ad as fwAD
from xgrad.autograd.functional import hvp, jacobian

net = xgrad.nn.MLP([3, 4, 2], activation=xgrad.nn.Tanh, key=1)
point = xgrad.tensor([0.5, -1.0, 2.0])
jac = jacobian(net, point)  # d net(point) / d point, shape (2, 3): one backward per output
jac_fwd = jacobian(net, point, vectorize=True, strategy="forward-mode")  # one vmapped forward pass
np.testing.assert_allclose(jac.numpy(), jac_fwd.numpy(), rtol=1e-5, atol=1e-6)
print(jac)


def loss_of(inp):
    return (net(inp) ** 2).sum()


v = xgrad.tensor([1.0, 0.0, -1.0])
_, hv = hvp(loss_of, point, v)  # PyTorch's double-backward trick
with fwAD.dual_level():  # forward over reverse: the tangent of the gradient is H v
    dual = fwAD.make_dual(point.detach().requires_grad_(), v)
    (g,) = xgrad.autograd.grad(loss_of(dual), dual)
    hv_fwd = fwAD.unpack_dual(g).tangent
np.testing.assert_allclose(hv.numpy(), hv_fwd.numpy(), rtol=1e-5, atol=1e-6)
print(hv)

# %% [markdown]
# ## Hooks and retain_grad
# `register_hook` sees (and may replace) a tensor's gradient; `retain_grad` keeps a
# non-leaf's `.grad`. Every `register_*` returns a handle with `.remove()`.

# %%
a = xgrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
h = a * 2
h.retain_grad()
seen = []
handle = h.register_hook(lambda g: seen.append(g.tolist()) or g * 10)
(h * h).sum().backward()
print("hook saw", seen, "| h.grad", h.grad.tolist(), "| a.grad", a.grad.tolist())
handle.remove()

# %% [markdown]
# ## The graph
# `grad_fn.next_functions` walks the graph by hand; `xgrad.viz.make_dot` draws it
# (leaves named after parameters, hooks marked in red, saved values in orange with
# `show_saved=True`). `xgrad.viz.show` puts it here, or in a file when this notebook runs as
# a script. Rendering needs the Graphviz `dot` binary (without it, the file holds the dot source).

# %%
model = xgrad.nn.MLP([3, 4, 2], key=0)
out = model(xgrad.ones(5, 3))
loss = xgrad.cross_entropy(out, [0, 1, 0, 1, 1])
print(loss.grad_fn.name(), [(fn.name() if fn else None, i) for fn, i in loss.grad_fn.next_functions])
dot = xgrad.viz.make_dot(loss, params=model.named_parameters(), show_saved=True)
xgrad.viz.show(dot, "quickstart_graph")  # inline here; run as a script, written to quickstart_graph.svg
