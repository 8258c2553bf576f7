"""Per-device worker threads: multithreaded backward vs everything on the caller's thread.

Run: ``python benchmarks/bench_threads.py`` (add ``--quick`` for a short run). The host
is split into four XLA devices before JAX is imported.

1. Four independent branches, branch k on host device k: a chain of matmul+tanh layers
   on 256×256 float32, so every backward node does real work (the matmul's backward is
   two 256×256 matmuls). Backward wall time with ``set_multithreading_enabled`` on and off.
2. Engine bookkeeping per node with threads on: a chain of N elementwise ops on
   1-element tensors, on the caller's device, on one worker's device, and hopping to
   the next device at every op (each hop hands the gradient to another thread); each
   against the same backward computations as bare ``jnp`` calls (the floor).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"

import argparse  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _timing import median_seconds, table  # noqa: E402

import xgrad  # noqa: E402
from xgrad.autograd import set_multithreading_enabled  # noqa: E402

DEVICES = jax.devices()
SIZE = 256
N_CHAIN = 1000


def count_nodes(root: xgrad.Tensor) -> int:
    seen, stack = {root.grad_fn}, [root.grad_fn]
    while stack:
        for nxt, _ in stack.pop().next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return len(seen)


def branch_rows(repeats: int, layers: int) -> list[tuple[str, ...]]:
    key = jax.random.key(0)
    weights = []
    for k, device in enumerate(DEVICES):
        per_layer = []
        for layer in range(layers):
            w = jax.random.normal(jax.random.fold_in(key, k * layers + layer), (SIZE, SIZE), jnp.float32) / SIZE**0.5
            per_layer.append(xgrad.tensor(w, device=device, requires_grad=True))
        weights.append(per_layer)
    inputs = [xgrad.tensor(jax.random.normal(jax.random.fold_in(key, 99 + k), (SIZE, SIZE), jnp.float32), device=d) for k, d in enumerate(DEVICES)]
    leaves = [w for per_layer in weights for w in per_layer]

    def forward() -> xgrad.Tensor:
        total = None
        for h, per_layer in zip(inputs, weights, strict=True):
            for w in per_layer:
                h = (h @ w).tanh()
            s = h.sum().to(DEVICES[0])
            total = s if total is None else total + s
        jax.block_until_ready(total.array)
        return total

    def step(multithreading: bool) -> float:
        import time

        for w in leaves:
            w.grad = None
        loss = forward()
        start = time.perf_counter()
        with set_multithreading_enabled(multithreading):
            loss.backward()
        jax.block_until_ready([w.grad.array for w in leaves])
        return time.perf_counter() - start

    # Interleave the two modes so machine noise hits both alike.
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(repeats + 3):
        for mode in (True, False):
            elapsed = step(mode)
            if i >= 3:
                times[mode].append(elapsed)
    on, off = (sorted(times[m])[len(times[m]) // 2] for m in (True, False))
    nodes = count_nodes(forward())
    ms = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
    return [
        (f"threads on ({len(DEVICES) - 1} workers + caller)", ms(on), f"{on / off:.2f}x"),
        ("threads off (all on the caller)", ms(off), "1.00x"),
        (f"backward nodes per call: {nodes}", "", ""),
    ]


def chain_row(label: str, repeats: int, hop: bool, device_index: int) -> tuple[str, ...]:
    start_device = DEVICES[device_index]
    x = xgrad.tensor([0.5], device=start_device, requires_grad=True)

    def build() -> tuple[xgrad.Tensor, int]:
        y, nodes = x, 0
        for i in range(N_CHAIN):
            y = y * 1.0001
            nodes += 1
            if hop:
                y = y.to(DEVICES[(device_index + i + 1) % len(DEVICES)])
                nodes += 1
        return y.sum(), nodes

    loss, nodes = build()
    elapsed = []

    def run() -> None:
        import time

        nonlocal loss
        x.grad = None
        start = time.perf_counter()
        loss.backward()
        jax.block_until_ready(x.grad.array)
        elapsed.append(time.perf_counter() - start)
        loss, _ = build()

    for _ in range(3):
        run()
    elapsed.clear()
    for _ in range(repeats):
        run()
    engine = sorted(elapsed)[len(elapsed) // 2]

    # The floor: the nodes' computations (and, hopping, the transfers back) as bare jnp calls.
    placements = [DEVICES[(device_index + i) % len(DEVICES)] for i in range(N_CHAIN + 1)]

    def floor() -> None:
        g = jax.device_put(jnp.ones((1,), jnp.float32), placements[-1] if hop else start_device)
        for i in range(N_CHAIN, 0, -1):
            if hop:
                g = jax.device_put(g, placements[i - 1])
            g = jnp.multiply(g, 1.0001)
        jax.block_until_ready(g)

    bare = median_seconds(floor, repeats)
    us = lambda s: f"{s / nodes * 1e6:.2f}"  # noqa: E731
    return (label, str(nodes), us(engine), us(bare), us(engine - bare))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--layers", type=int, default=8, help="matmul+tanh layers per branch")
    args = parser.parse_args()
    repeats = 5 if args.quick else 30
    print(
        f"jax {jax.__version__}, {len(DEVICES)} host devices on {os.cpu_count()} CPU cores, "
        f"medians of {repeats} repeats\n"
    )
    print(f"Four independent branches, {args.layers} × (matmul {SIZE}×{SIZE} + tanh) each, one branch per device (ms per backward)\n")
    print(table(branch_rows(repeats, args.layers), ("what", "ms/backward", "vs threads off")))
    print(f"\nChain of N={N_CHAIN} elementwise ops on 1-element float32 tensors, threads on (µs per node)\n")
    rows = [
        chain_row("on the caller's device cpu:0", repeats, hop=False, device_index=0),
        chain_row("on cpu:1 (its worker thread)", repeats, hop=False, device_index=1),
        chain_row("hopping device at every op", repeats, hop=True, device_index=0),
    ]
    print(table(rows, ("chain", "nodes", "xgrad", "floor", "bookkeeping")))


if __name__ == "__main__":
    main()
