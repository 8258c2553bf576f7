"""Where the demo MLP's eager step spends its time, phase by phase, and the optimizers' step alone.

1. The demo step (2-64-64-3, tanh, batch 128, cross-entropy, ``Optax`` Adam) split into
   ``zero_grad``, the model's forward, the loss, ``backward`` and ``opt.step``: process µs per
   step for each, medians of the rounds.
2. The backward alone: the same graph's ``backward(retain_graph=True)`` again and again (the
   grads cleared between), process µs per backward.
3. ``xgrad.optim.Adam`` and ``SGD`` (momentum) stepping the demo model's parameters from fixed
   grads: process µs per ``step``.

    PYTHONPATH=<checkout> python benchmarks/bench_eager_phases.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax
import numpy as np
import optax

import xgrad
from xgrad import demo
from xgrad.optim import Optax

ROUNDS = 7


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    """Median over ``ROUNDS`` rounds of the process µs per call of ``fn``."""
    results = []
    for _ in range(ROUNDS):
        start = time.process_time()
        for _ in range(calls):
            fn()
        results.append((time.process_time() - start) / calls * 1e6)
    return statistics.median(results)


def main() -> None:
    device = jax.devices()[0]
    model = demo.make_model(device)
    params = list(model.parameters())
    batches = [(xgrad.tensor(np.asarray(x)), xgrad.tensor(np.asarray(y))) for x, y in demo.make_batches(device)]
    opt = Optax(params, optax.adam(demo.LEARNING_RATE))
    clock = time.process_time
    phases = ("zero_grad", "forward", "loss", "backward", "step")

    def step(i: int) -> np.ndarray:
        x, y = batches[i % len(batches)]
        t0 = clock()
        opt.zero_grad()
        t1 = clock()
        out = model(x)
        t2 = clock()
        loss = xgrad.cross_entropy(out, y)
        t3 = clock()
        loss.backward()
        t4 = clock()
        opt.step()
        t5 = clock()
        return np.array([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4])

    for i in range(30):
        step(i)
    rounds = []
    for _ in range(ROUNDS):
        total = sum((step(i) for i in range(300)), np.zeros(len(phases)))
        rounds.append(total / 300 * 1e6)
    medians = np.median(np.array(rounds), axis=0)
    print("demo step, process µs per step (median of rounds):")
    print("  " + "  ".join(f"{name} {value:.1f}" for name, value in zip(phases, medians, strict=True)) + f"  total {medians.sum():.1f}")

    x, y = batches[0]
    loss = xgrad.cross_entropy(model(x), y)

    def backward() -> None:
        for p in params:
            p.grad = None
        loss.backward(retain_graph=True)

    for _ in range(50):
        backward()
    print(f"backward of the same graph (retain_graph), process µs: {per_call_us(backward, 500):.1f}")

    line = []
    for name, kwargs in (("Adam", {"lr": 1e-3}), ("SGD", {"lr": 1e-3, "momentum": 0.9})):
        optimizer = getattr(xgrad.optim, name)(params, **kwargs)
        for _ in range(30):
            optimizer.step()
        line.append(f"{name} {per_call_us(lambda o=optimizer: (o.step(), jax.block_until_ready(params[0].array)), 500):.1f}")
    print("xgrad.optim step of the demo's parameters, process µs: " + ", ".join(line))


if __name__ == "__main__":
    main()
