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
# # Testing your gradients
#
# You wrote an op with a hand-written backward. Is the backward right? `xgrad.testing`
# answers with three tools:
#
# - `gradcheck` / `gradgradcheck`: your analytical gradients against float64 finite differences;
# - `assert_grads_match`: the same function through xgrad (eager and compiled) and through `jax.grad`;
# - `xgrad.testing.strategies`: hypothesis strategies, including random programs built from the op table.

# %%
import jax

jax.config.update("jax_enable_x64", True)  # finite differences want float64

import numpy as np  # noqa: E402
from hypothesis import given  # noqa: E402

import xgrad  # noqa: E402
from xgrad.testing import GradcheckError, assert_grads_match, gradcheck, gradgradcheck  # noqa: E402
from xgrad.testing import strategies as xst  # noqa: E402

# %% [markdown]
# ## An op of our own: a numerically stable `log(1 + exp(x))`
#
# `softplus(x) = max(x, 0) + log1p(exp(-|x|))`, with derivative `sigmoid(x)`. We write it
# as an `autograd.Function` and, on purpose, first get the backward slightly wrong: we
# forget the minus sign in the derivative of `-|x|`.

# %%
class Softplus(xgrad.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return xgrad.maximum(x, 0.0) + (-x.abs()).exp().log1p()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        e = (-x.abs()).exp()
        return g * ((x > 0) + e / (1 + e))  # should be (x > 0) - sign(x) * e / (1 + e)


x = xgrad.tensor(np.array([-2.0, -0.5, 0.7, 3.0]), requires_grad=True)
try:
    gradcheck(Softplus.apply, [x])
except GradcheckError as err:
    print(err)

# %% [markdown]
# The message names the input and output, the worst element, and both values: the
# analytical gradient is off only at positive inputs (for negative ones `sign(x) = -1`
# hides the mistake, so a test with negative inputs alone would have passed). Fix the backward and check again,
# first and second order:

# %%
class FixedSoftplus(Softplus):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.sigmoid()


assert gradcheck(FixedSoftplus.apply, [x])
assert gradgradcheck(FixedSoftplus.apply, [x])
assert_grads_match(FixedSoftplus.apply, x.detach().numpy(), reference=jax.nn.softplus, modes=("eager", "jax"), order=2)

# %% [markdown]
# ## Property-based: random inputs and random programs
#
# A single input proves little. Let hypothesis draw shapes and values, including 0-dim
# tensors; a failure is shrunk to the smallest example and printed.

# %%
@xst.harness_settings(max_examples=10)
@given(xst.tensors(xst.shapes(0, 2, max_side=3)))
def test_softplus(t):
    gradcheck(FixedSoftplus.apply, [t])


test_softplus()

# %% [markdown]
# `programs()` draws whole computations: DAGs over the op table with shared
# subexpressions, fan-in and fan-out, every op kept in its domain. A program runs with
# `np=xgrad` or `np=jax.numpy` and prints as Python, so a failing one is easy to read.
# Here our op goes into random programs by wrapping them.

# %%
program = xst.programs(max_nodes=4).example()
print(program)


@xst.harness_settings(max_examples=8)
@given(xst.programs(max_nodes=4, smooth=True, max_side=2))
def test_softplus_in_programs(program):
    def with_softplus(np, *xs):
        out = program(np, *xs)
        return FixedSoftplus.apply(out) if np is xgrad else jax.nn.softplus(out)

    assert_grads_match(with_softplus, *program.inputs, modes=("eager", "jax"))


test_softplus_in_programs()

# %% [markdown]
# ## Invariants of any graph
#
# `xgrad.testing.invariants` checks what every graph must satisfy: hooks fire once and
# in PyTorch's order (`check_hooks` with `strategies.graphs_with_hooks()`), `grad(inputs=…)`
# equals what `backward()` accumulates, compiled equals eager, and `retain_graph` semantics.

# %%
from xgrad.testing import invariants  # noqa: E402

invariants.check_grad_matches_backward(lambda x: FixedSoftplus.apply(x) * x, x.detach().numpy())
invariants.check_retain_graph(lambda x: FixedSoftplus.apply(x) * x, x.detach().numpy())
print("all invariants hold")
