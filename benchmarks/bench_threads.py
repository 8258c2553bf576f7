"""Per-device worker threads: multithreaded backward vs everything on the caller's thread.

Run: ``python benchmarks/bench_threads.py`` (add ``--quick`` for a short run). The host
is split into four XLA devices before JAX is imported.

1. Four independent branches, branch k on host device k: a chain of matmul+tanh layers
   on 256×256 float32, so every backward node does real work (the matmul's backward is
   two 256×256 matmuls). Backward wall time with ``set_multithreading_enabled`` on and off.
2. Engine bookkeeping per node: a chain of N backward nodes that do no work, all on the
   caller's device, all on one worker's device, or each on the next device (every edge
   hands the gradient to another thread).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _timing import table  # noqa: E402

import xgrad  # noqa: E402
from xgrad.autograd import set_multithreading_enabled  # noqa: E402
from xgrad.engine.engine import execute  # noqa: E402
from xgrad.engine.node import Edge, InputMetadata, Node  # noqa: E402
from xgrad.tensor import Tensor  # noqa: E402

DEVICES = jax.devices()
SIZE = 256
N_CHAIN = 2000


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


class PassThrough(Node):
    """A backward node with no work of its own, scheduled on ``placement``'s queue.

    Its input metadata names no sharding, so the gradient (one array that never moves)
    passes validation wherever the node runs: what is timed is the engine alone,
    including each handoff to another device's thread.
    """

    __slots__ = ("placement",)

    def __init__(self, next_node: Node | None, placement: jax.Device) -> None:
        super().__init__((Edge(next_node, 0),) if next_node is not None else (), (InputMetadata((1,), np.dtype(np.float32), None),))
        self.placement = placement

    def device(self) -> jax.Device:
        return self.placement

    def apply(self, grads: list[Tensor | None]) -> list[Tensor | None]:
        return list(grads) if self.next_edges else []


def chain_row(label: str, repeats: int, devices: list[jax.Device], multithreading: bool) -> tuple[str, ...]:
    """Engine time per node of a chain of ``PassThrough`` nodes placed round-robin on ``devices``."""
    node = None
    for i in range(N_CHAIN):  # node i feeds node i - 1; the root is the last one made
        node = PassThrough(node, devices[i % len(devices)])
    root, root_grad = Edge(node, 0), Tensor(jnp.ones((1,), jnp.float32))

    def backward() -> None:
        with set_multithreading_enabled(multithreading):
            execute([root], [root_grad], True, False, True, [])

    for _ in range(3):
        backward()
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        backward()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    us = lambda ts: f"{statistics.median(ts) / N_CHAIN * 1e6:.2f}"  # noqa: E731
    return (label, "on" if multithreading else "off", us(wall), us(cpu))


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
    print(f"\nEngine bookkeeping: a chain of N={N_CHAIN} no-op nodes (µs per node)\n")
    rows = [
        chain_row("all on cpu:0 (the caller)", repeats, DEVICES[:1], True),
        chain_row("all on cpu:1 (its worker)", repeats, DEVICES[1:2], True),
        chain_row("all on cpu:1", repeats, DEVICES[1:2], False),
        chain_row("next device at every node", repeats, DEVICES, True),
        chain_row("next device at every node", repeats, DEVICES, False),
    ]
    print(table(rows, ("chain", "threads", "wall µs/node", "CPU µs/node (all threads)")))


if __name__ == "__main__":
    main()
