"""xgrad's gradient semantics on JAX's AD against the same function written by hand.

Two losses of an MLP (3-256-256-1, tanh, batch 512 or ``--batch``, float32), each timed as a
``jax.jit(jax.grad)`` step two ways, in turns:

1. **stop-gradient**: a target from the same network under ``xgrad.no_grad()`` and a
   ``.detach()``ed baseline, written in xgrad and run on a model argument (``jax.grad``
   of the model), against ``lax.stop_gradient`` on a dict of arrays;
2. **hooked**: a gradient clamp registered on the first weight
   (``p.register_hook(lambda g: g.clamp(-0.1, 0.1))``) and a hook scaling the hidden
   activation's gradient, against the same two written as ``jax.custom_vjp`` identities.

A third pair, the plain loss with neither, shows what the model argument costs by
itself (its pytree's Python: flattening the model in, the gradient model out). So each
xgrad loss is also timed as the same program called on the model's arrays (the model
rebuilt from them inside the trace, its gradients returned as arrays): what the
stop-gradients and hooks cost, without the per-call pytree Python. Each call ends when
the gradients are ready; the medians are printed with their ratios to the one by hand.
The target is within 10 % (a ratio at most 1.10).

    python benchmarks/bench_one_meaning.py          # ~1 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _timing import interleaved, table

import xgrad
from xgrad import nn

SIZES = (3, 256, 256, 1)


def _model(hooked: bool) -> nn.Module:
    model = nn.MLP(list(SIZES), activation=nn.Tanh, key=0)
    if hooked:
        model[0].weight.register_hook(lambda g: g.clamp(-0.1, 0.1))
    return model


def _arrays(model: nn.Module) -> dict[str, jax.Array]:
    return {name: p.detach().array for name, p in model.named_parameters()}


def _mlp(params: dict[str, jax.Array], x: jax.Array, hidden: Callable[[jax.Array], jax.Array] = lambda h: h) -> jax.Array:
    h = jnp.tanh(x @ params["0.weight"].T + params["0.bias"])
    h = hidden(jnp.tanh(h @ params["2.weight"].T + params["2.bias"]))
    return h @ params["4.weight"].T + params["4.bias"]


def plain_xgrad(model: nn.Module, x: xgrad.Tensor) -> jax.Array:
    return (model(x) ** 2).mean().array


def plain_by_hand(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    return (_mlp(params, x) ** 2).mean()


def stop_gradient_xgrad(model: nn.Module, x: xgrad.Tensor) -> jax.Array:
    with xgrad.no_grad():
        target = model(x) * 0.5
    out = model(x)
    return ((out - target) ** 2).mean().array + (out * out.detach()).mean().array


def stop_gradient_by_hand(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    target = jax.lax.stop_gradient(_mlp(params, x)) * 0.5
    out = _mlp(params, x)
    return ((out - target) ** 2).mean() + (out * jax.lax.stop_gradient(out)).mean()


def _hooked_forward(model: nn.Module, x: xgrad.Tensor) -> xgrad.Tensor:
    h = model[1](model[0](x))
    h = model[3](model[2](h))
    h.register_hook(lambda g: g * 0.5)
    return model[4](h)


def hooked_xgrad(model: nn.Module, x: xgrad.Tensor) -> jax.Array:
    return (_hooked_forward(model, x) ** 2).mean().array


def _scaled_identity(scale: float) -> Callable[[jax.Array], jax.Array]:
    @jax.custom_vjp
    def identity(y: jax.Array) -> jax.Array:
        return y

    identity.defvjp(lambda y: (y, None), lambda _, g: (g * scale,))
    return identity


@jax.custom_vjp
def _clamped(w: jax.Array) -> jax.Array:
    return w


_clamped.defvjp(lambda w: (w, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))


def hooked_by_hand(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    params = {**params, "0.weight": _clamped(params["0.weight"])}
    return (_mlp(params, x, hidden=_scaled_identity(0.5)) ** 2).mean()


def _on_arrays(loss: Callable[..., jax.Array], model: nn.Module) -> tuple[Callable[..., Any], list[jax.Array]]:
    """``jax.jit(jax.grad(loss))`` taking and giving the model's arrays: the model is rebuilt in the trace."""
    leaves, treedef = jax.tree_util.tree_flatten(model)

    @jax.jit
    def step(leaves: list[jax.Array], x: jax.Array) -> list[jax.Array]:
        grads = jax.grad(loss)(jax.tree_util.tree_unflatten(treedef, leaves), xgrad.Tensor(x))
        return jax.tree_util.tree_leaves(grads)

    return step, leaves


def _timer(step: Callable[..., Any], *args: Any) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        jax.block_until_ready(step(*args))
        return time.perf_counter() - start

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--batch", type=int, default=512)
    args = parser.parse_args()
    x_np = np.random.default_rng(0).normal(size=(args.batch, SIZES[0])).astype(np.float32)
    x, x_array = xgrad.tensor(x_np), jnp.asarray(x_np)
    cases = {
        "plain (neither)": (plain_xgrad, plain_by_hand, False),
        "stop-gradient": (stop_gradient_xgrad, stop_gradient_by_hand, False),
        "hooked": (hooked_xgrad, hooked_by_hand, True),
    }
    timers: dict[str, Callable[[], float]] = {}
    for name, (ours, by_hand, hooked) in cases.items():
        model = _model(hooked)
        params = _arrays(model)
        ours_step, hand_step = jax.jit(jax.grad(ours)), jax.jit(jax.grad(by_hand))
        got = {n: g.detach().numpy() for n, g in ours_step(model, x).named_parameters()}
        want = hand_step(params, x_array)
        for n, g in got.items():  # the same gradients, or the timing means nothing
            np.testing.assert_allclose(g, want[n], rtol=2e-4, atol=1e-6, err_msg=f"{name}: {n}")
        arrays_step, leaves = _on_arrays(ours, model)
        for got_leaf, want_leaf in zip(arrays_step(leaves, x_array), jax.tree_util.tree_leaves(ours_step(model, x)), strict=True):
            np.testing.assert_allclose(np.asarray(got_leaf), np.asarray(want_leaf), rtol=1e-6, err_msg=name)
        timers[f"{name}: xgrad"] = _timer(ours_step, model, x)
        timers[f"{name}: on arrays"] = _timer(arrays_step, leaves, x_array)
        timers[f"{name}: by hand"] = _timer(hand_step, params, x_array)
    medians = interleaved(timers, repeats=args.repeats, warmup=5)
    rows = []
    for name in cases:
        ours_s, arrays_s, hand_s = (medians[f"{name}: {kind}"] for kind in ("xgrad", "on arrays", "by hand"))
        rows.append((
            name, f"{ours_s * 1e3:.3f}", f"{arrays_s * 1e3:.3f}", f"{hand_s * 1e3:.3f}",
            f"{ours_s / hand_s:.2f}x", f"{arrays_s / hand_s:.2f}x",
        ))
    print(
        f"jax {jax.__version__} on {jax.default_backend()}, batch {args.batch}, jax.jit(jax.grad) per call, "
        f"medians of {args.repeats}\n"
    )
    header = ("loss", "xgrad, model ms", "xgrad, arrays ms", "by hand ms", "model / by hand", "arrays / by hand")
    print(table(rows, header))


if __name__ == "__main__":
    main()
