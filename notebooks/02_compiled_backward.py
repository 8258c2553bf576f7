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
# # Compiled backward
#
# The eager engine runs one Python-dispatched node at a time. With the compiled
# switch, xgrad walks the same graph once, builds a structural key (node kinds,
# shapes, dtypes, shardings, hooks), and on a cache miss traces the whole backward
# into one `jax.jit` program; later backwards of the same structure run that
# program directly. Results, `.grad` accumulation and hooks are the same as eager.

# %%
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax

import xgrad
from xgrad.autograd import compiled

# %% [markdown]
# ## The switch
# Three equivalent ways: a context manager, a global setter, or a per-call argument.

# %%
model = xgrad.nn.MLP([8, 32, 32, 4], activation=xgrad.nn.Tanh, key=0)
x = xgrad.randn(16, 8, key=jax.random.key(1))
labels = np.arange(16) % 4


def grads(**backward_kwargs):
    model.zero_grad()
    xgrad.cross_entropy(model(x), labels).backward(**backward_kwargs)
    return [p.grad.numpy() for p in model.parameters()]


compiled.reset()
eager = grads()
with compiled.enable():
    in_context = grads()
per_call = grads(compiled=True)
for e, a, b in zip(eager, in_context, per_call, strict=True):
    np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(b, e, rtol=1e-4, atol=1e-6)
print("compiled gradients match eager")
stats = compiled.stats()
print(stats)
assert (stats["misses"], stats["hits"]) == (1, 1)

# %% [markdown]
# The first compiled backward was a miss (it traced and compiled); the second had the
# same structure and was a hit. A new batch size is a new structure, so one more compile:

# %%
x = xgrad.randn(32, 8, key=jax.random.key(2))
labels = np.arange(32) % 4
grads(compiled=True)
grads(compiled=True)
stats = compiled.stats()
print(stats)
assert (stats["misses"], stats["hits"]) == (2, 2)
print("why it recompiled:", stats["recompile_reasons"][-1])

# %% [markdown]
# ## Step time: eager vs compiled vs `jax.jit`
# One training step (forward, backward, optax Adam update) for MLPs of a few widths.
# `jax.jit(jax.value_and_grad)` of the same function on plain arrays is the floor: it
# also compiles the forward, which xgrad runs eagerly op by op.

# %%
def xgrad_step_time(width, compiled_backward, steps=10):
    net = xgrad.nn.MLP([64, width, width, 10], activation=xgrad.nn.Tanh, key=0)
    opt = xgrad.optim.Optax(net.parameters(), optax.adam(1e-3))
    data = xgrad.randn(64, 64, key=jax.random.key(0))
    target = np.arange(64) % 10

    def step():
        opt.zero_grad()
        xgrad.cross_entropy(net(data), target).backward(compiled=compiled_backward)
        opt.step()

    for _ in range(2):  # warm-up: compiles
        step()
    jax.block_until_ready(next(net.parameters()).array)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    jax.block_until_ready(next(net.parameters()).array)
    return (time.perf_counter() - start) / steps


def jax_step_time(width, steps=10):
    sizes = [64, width, width, 10]
    keys = jax.random.split(jax.random.key(0), len(sizes) - 1)
    params = [(jax.random.normal(k, (o, i)) / np.sqrt(i), jnp.zeros(o)) for k, i, o in zip(keys, sizes[:-1], sizes[1:], strict=True)]
    data = jax.random.normal(jax.random.key(0), (64, 64))
    target = jnp.arange(64) % 10
    transform = optax.adam(1e-3)

    def loss_fn(params):
        h = data
        for i, (w, b) in enumerate(params):
            h = h @ w.T + b
            if i < len(params) - 1:
                h = jnp.tanh(h)
        return optax.softmax_cross_entropy_with_integer_labels(h, target).mean()

    @jax.jit
    def step(params, state):
        loss, g = jax.value_and_grad(loss_fn)(params)
        updates, state = transform.update(g, state, params)
        return optax.apply_updates(params, updates), state

    state = transform.init(params)
    for _ in range(2):
        params, state = step(params, state)
    jax.block_until_ready(params)
    start = time.perf_counter()
    for _ in range(steps):
        params, state = step(params, state)
    jax.block_until_ready(params)
    return (time.perf_counter() - start) / steps


widths = [16, 128, 512]
times = {
    "xgrad eager": [xgrad_step_time(w, False) for w in widths],
    "xgrad compiled backward": [xgrad_step_time(w, True) for w in widths],
    "jax.jit(value_and_grad)": [jax_step_time(w) for w in widths],
}
for name, ts in times.items():
    print(f"{name:26s}", "  ".join(f"{t * 1e3:7.2f} ms" for t in ts))

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
for name, ts in times.items():
    ax.plot(widths, [t * 1e3 for t in ts], marker="o", label=name)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("hidden width")
ax.set_ylabel("ms per training step")
ax.set_title("MLP 64-w-w-10, batch 64")
ax.legend()
fig.tight_layout()
xgrad.viz.show(fig, "step_times")  # inline here; run as a script, written to step_times.png
