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
# # Hooks and debugging
#
# Finding where a NaN comes from with anomaly mode, watching gradients with hooks,
# and timing the backward with the profiler.

# %%
import json

import numpy as np

import xgrad

# %% [markdown]
# ## Anomaly mode catches a NaN
# `sqrt` at 0 has an infinite derivative; times a zero gradient that is `0 * inf = nan`.
# Without anomaly mode the NaN lands silently in `.grad`:

# %%
x = xgrad.tensor([0.0, 1.0, 4.0], requires_grad=True)
mask = xgrad.tensor([0.0, 1.0, 1.0])
(x.sqrt() * mask).sum().backward()
print(x.grad)

# %% [markdown]
# Under `detect_anomaly()` the first node that returns NaN raises, and the error
# carries the traceback of the forward call that created that node:

# %%
x.grad = None
try:
    with xgrad.autograd.detect_anomaly():
        y = (x.sqrt() * mask).sum()
        y.backward()
except RuntimeError as err:
    message = str(err)
    print(message.splitlines()[0])
    print("...", message.splitlines()[-1])
assert message.startswith("Function 'SqrtBackward' returned nan values in its 0th output.")
assert "Traceback of forward call that caused the error" in message

# %% [markdown]
# The fix: keep the input away from the singular point.

# %%
x.grad = None
(x.clamp(min=1e-12).sqrt() * mask).sum().backward()
print(x.grad)
assert np.isfinite(x.grad.numpy()).all()

# %% [markdown]
# ## Watching gradients with hooks
# Tensor hooks see each gradient on its way; a post-accumulate-grad hook runs after a
# leaf's `.grad` was written (the place to log, clip or step an optimizer per
# parameter); node hooks see a backward node's inputs and outputs.

# %%
model = xgrad.nn.MLP([4, 16, 16, 1], activation=xgrad.nn.Tanh, key=0)
norms = {}
handles = [
    p.register_post_accumulate_grad_hook(lambda p, name=name: norms.__setitem__(name, float((p.grad * p.grad).sum().sqrt())))
    for name, p in model.named_parameters()
]
data = xgrad.randn(32, 4, key=xgrad.creation.next_key())
loss = xgrad.mse_loss(model(data), xgrad.zeros(32, 1))
calls = []
handles.append(loss.grad_fn.register_prehook(lambda grad_outputs: calls.append("pre") or None))
handles.append(loss.grad_fn.register_hook(lambda grad_inputs, grad_outputs: calls.append("post") or None))
loss.backward()
for name, norm in norms.items():
    print(f"{name:18s} |grad| = {norm:.4f}")
print("node hooks ran:", calls)
for handle in handles:
    handle.remove()

# %% [markdown]
# A hook that returns a tensor replaces the gradient. Here one hook on every parameter of
# the model clips each element of its gradient to ±`clip` as the backward computes it
# (`xgrad.nn.utils.clip_grad_norm_(model.parameters(), max_norm)` instead scales all the
# gradients together, after the backward, so that their joint norm is at most `max_norm`).

# %%
clip = 1e-3
handles = [p.register_hook(lambda g: g.clamp(-clip, clip)) for p in model.parameters()]
model.zero_grad()
xgrad.mse_loss(model(data), xgrad.zeros(32, 1)).backward()
for name, p in model.named_parameters():
    print(f"{name:18s} max |grad| after clipping = {float(p.grad.abs().max()):.5f}")
for handle in handles:
    handle.remove()

# %% [markdown]
# ## Profiling the backward
# `xgrad.autograd.profile()` times every node the engine runs (on every worker
# thread); `table()` sums them per node kind and `export_chrome_trace` writes a file
# for ui.perfetto.dev or `chrome://tracing`. Warm up first: the first backward of
# each shape compiles its ops, which would dominate the table.

# %%
for _ in range(2):  # the second one also warms up accumulating into an existing .grad
    xgrad.mse_loss(model(data), xgrad.zeros(32, 1)).backward()
model.zero_grad()
with xgrad.autograd.profile() as prof:
    for _ in range(3):
        xgrad.mse_loss(model(data), xgrad.zeros(32, 1)).backward()
print(prof.table(sort_by="total"))
prof.export_chrome_trace("backward_trace.json")
with open("backward_trace.json") as f:
    print(len(json.load(f)["traceEvents"]), "trace events written")
