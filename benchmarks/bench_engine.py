"""Eager engine overhead and an MLP step, measured side by side.

Run: ``python benchmarks/bench_engine.py`` (add ``--quick`` for a short run).

1. A chain of N elementwise ops on 1-element tensors: xgrad's eager backward per node,
   against the same backward rules dispatched directly as ``jnp`` calls with no engine
   (the floor); the difference is the engine's bookkeeping per node. The same rules
   through xgrad's own op dispatch with no engine are timed too, to split what is
   the engine from what is xgrad's op dispatch, and a chain whose rules dispatch
   nothing (``y + 1.0``) measures the engine alone. The four are timed in turns.
2. A 3-layer MLP (256→512→512→10, batch 64, tanh, cross-entropy): xgrad forward+backward
   vs ``jax.vjp`` applied op by op vs ``jax.jit(jax.grad)``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import jax
import jax.numpy as jnp
from _timing import interleaved, median_seconds, mul_chain, table

import xgrad

N = 1000


def chain_rows(repeats: int) -> list[tuple[str, ...]]:
    x = xgrad.tensor([0.5], requires_grad=True)

    def backward_seconds(loss: xgrad.Tensor) -> float:
        x.grad = None
        jax.block_until_ready(loss.array)  # the forward is dispatched asynchronously: not on this clock
        start = time.perf_counter()
        loss.backward()
        jax.block_until_ready(x.grad.array)
        return time.perf_counter() - start

    def eager() -> float:
        return backward_seconds(mul_chain(x, N))

    # The floor: the same rules (g * 1.0001 per node, then the sum's broadcast) as bare jnp calls.
    def floor() -> float:
        start = time.perf_counter()
        g = jnp.ones(())
        g = jnp.broadcast_to(jnp.reshape(g, (1,)), (1,))
        for _ in range(N):
            g = jnp.multiply(g, 1.0001)
        jax.block_until_ready(g)
        return time.perf_counter() - start

    # The same rules through xgrad's own op dispatch (Tensors, jitted primitives), no engine.
    g0 = xgrad.Tensor(jnp.ones((1,)))

    def xgrad_ops() -> float:
        start = time.perf_counter()
        g = g0
        with xgrad.no_grad():
            for _ in range(N):
                g = g * 1.0001
        jax.block_until_ready(g.array)
        return time.perf_counter() - start

    # A chain whose rules dispatch nothing (the grad of y + 1.0 is g itself): the engine alone.
    def add_chain() -> float:
        y = x
        for _ in range(N):
            y = y + 1.0
        return backward_seconds(y.sum())

    m = interleaved({"eager": eager, "floor": floor, "ops": xgrad_ops, "add": add_chain}, repeats)
    engine, bare, dispatch = m["eager"], m["floor"], m["ops"]
    per_node = lambda s: f"{s / N * 1e6:.2f}"  # noqa: E731
    return [
        ("xgrad eager backward", per_node(engine)),
        ("same rules as bare jnp calls (floor)", per_node(bare)),
        ("engine bookkeeping (difference)", per_node(engine - bare)),
        ("ratio eager / floor", f"{engine / bare:.2f}x"),
        ("same rules as xgrad op calls, no engine", per_node(dispatch)),
        ("eager minus xgrad op calls", per_node(engine - dispatch)),
        ("y + 1.0 chain: rules dispatch nothing", per_node(m["add"])),
    ]


def init_mlp(key: jax.Array, sizes: tuple[int, ...]) -> list[tuple[jax.Array, jax.Array]]:
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        key, k1 = jax.random.split(key)
        bound = 1 / fan_in**0.5
        params.append((jax.random.uniform(k1, (fan_in, fan_out), jnp.float32, -bound, bound), jnp.zeros(fan_out, jnp.float32)))
    return params


def mlp_loss(np, params, x, labels):  # noqa: ANN001  (written once for xgrad and jax.numpy)
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = np.tanh(h)
    return h


def jax_loss(params, x, labels):  # noqa: ANN001
    logits = mlp_loss(jnp, params, x, labels)
    logp = jax.nn.log_softmax(logits, axis=1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def vjp_op_by_op(params, x, labels):  # noqa: ANN001
    """Forward with ``jax.vjp`` per op, then the pullbacks in reverse: eager JAX's tape."""
    tape = []

    def run(fn, *args):  # noqa: ANN001, ANN202
        out, pullback = jax.vjp(fn, *args)
        tape.append(pullback)
        return out

    h = x
    for i, (w, b) in enumerate(params):
        h = run(jnp.matmul, h, w)
        h = run(jnp.add, h, b)
        if i < len(params) - 1:
            h = run(jnp.tanh, h)
    loss = run(lambda z: -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(z, axis=1), labels[:, None], axis=1)), h)
    g = (jnp.ones_like(loss),)
    for pullback in reversed(tape):
        g = pullback(g[0])
    return loss


def mlp_rows(repeats: int) -> list[tuple[str, ...]]:
    sizes = (256, 512, 512, 10)
    key = jax.random.key(0)
    params = init_mlp(key, sizes)
    x = jax.random.normal(jax.random.key(1), (64, 256), jnp.float32)
    labels = jax.random.randint(jax.random.key(2), (64,), 0, 10)
    xparams = [(xgrad.tensor(w, requires_grad=True), xgrad.tensor(b, requires_grad=True)) for w, b in params]
    xx, xlabels = xgrad.tensor(x), xgrad.tensor(labels)

    def xgrad_step() -> None:
        for w, b in xparams:
            w.grad = b.grad = None
        loss = xgrad.cross_entropy(mlp_loss(xgrad, xparams, xx, xlabels), xlabels)
        loss.backward()
        jax.block_until_ready([w.grad.array for w, _ in xparams])

    def vjp_step() -> None:
        jax.block_until_ready(vjp_op_by_op(params, x, labels))

    jitted = jax.jit(jax.grad(jax_loss))

    def jit_step() -> None:
        jax.block_until_ready(jitted(params, x, labels))

    t_x = median_seconds(xgrad_step, repeats)
    t_vjp = median_seconds(vjp_step, repeats)
    t_jit = median_seconds(jit_step, repeats)
    ms = lambda s: f"{s * 1e3:.3f}"  # noqa: E731
    return [
        ("xgrad eager forward+backward", ms(t_x), f"{t_x / t_jit:.2f}x"),
        ("jax.vjp op by op", ms(t_vjp), f"{t_vjp / t_jit:.2f}x"),
        ("jax.jit(jax.grad)", ms(t_jit), "1.00x"),
        ("xgrad eager / jax.vjp op by op", f"{t_x / t_vjp:.2f}x", ""),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    repeats = 5 if args.quick else 30
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, medians of {repeats} repeats\n")
    print(f"Chain of N={N} elementwise ops on 1-element tensors (µs per node)\n")
    print(table(chain_rows(repeats), ("what", "µs/node")))
    print("\nMLP 256→512→512→10, batch 64, tanh, cross-entropy (ms per step)\n")
    print(table(mlp_rows(repeats), ("what", "ms/step", "vs jit")))


if __name__ == "__main__":
    main()
