"""The demo model's eager training step in a fresh process: the first steps, then the median step.

Self-contained (only ``xgrad.demo``'s model and batches), so that it runs against any
checkout for side-by-side figures:

    PYTHONPATH=/path/to/checkout python benchmarks/bench_eager_step.py

It prints the wall seconds of steps 1-3 (step 1 compiles each primitive; step 2 the
fused rules, NOTE [Fused eager rules]) and the median wall milliseconds of the
following steps. Each step ends when its parameters are ready.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import optax

import xgrad
from xgrad import demo
from xgrad.optim import Optax


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps after the first three")
    args = parser.parse_args()
    device = jax.devices()[0]
    batches = [(xgrad.tensor(x), y) for x, y in demo.make_batches(device)]
    model = demo.make_model(device)
    params = list(model.parameters())
    opt = Optax(params, optax.adam(1e-2))

    def step(i: int) -> float:
        start = time.perf_counter()
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        xgrad.cross_entropy(model(x), y).backward()
        opt.step()
        jax.block_until_ready(params[0].array)
        return time.perf_counter() - start

    first = [step(i) for i in range(3)]
    walls = [step(i) for i in range(3, 3 + args.steps)]
    print("steps 1-3 s:", " ".join(f"{f:.3f}" for f in first), f"| median ms {statistics.median(walls) * 1e3:.2f}")


if __name__ == "__main__":
    main()
