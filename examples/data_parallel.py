"""Data-parallel training over several processes with ``jax.distributed``.

Every process runs this same script with its own ``--process-id``. Each one loads only
its part of the global batch; the parameters are replicated over all devices of all
processes, and XLA inserts the all-reduce of the gradients into the backward. Two
processes with two CPU devices each, on one machine::

    export XLA_FLAGS=--xla_force_host_platform_device_count=2
    python examples/data_parallel.py --num-processes 2 --process-id 0 --coordinator 127.0.0.1:12355 &
    python examples/data_parallel.py --num-processes 2 --process-id 1 --coordinator 127.0.0.1:12355

On several hosts, run one process per host with the first host's address as
``--coordinator``. ``--num-processes 1`` (the default) trains in one process, on the same
global batch.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import xgrad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", default="127.0.0.1:12355", help="host:port of process 0")
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--eager", action="store_true", help="eager backward instead of the compiled one")
    parser.add_argument("--time", action="store_true", help="print the mean time of the steps after the first two")
    parser.add_argument("--float64", action="store_true")
    args = parser.parse_args()

    if args.num_processes > 1:
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                                   process_id=args.process_id, initialization_timeout=60)
    jax.config.update("jax_enable_x64", args.float64)
    dtype = np.float64 if args.float64 else np.float32

    # One mesh over every device of every process: the batch is split over it, the
    # parameters are on all of it.
    mesh = Mesh(np.array(jax.devices()), ("data",))
    batch = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())

    features, classes = 16, 4
    rng = np.random.default_rng(0)  # the same initial parameters in every process
    params = [
        xgrad.tensor((rng.normal(size=(features, args.hidden)) / 4).astype(dtype), device=replicated, requires_grad=True),
        xgrad.tensor(np.zeros(args.hidden, dtype), device=replicated, requires_grad=True),
        xgrad.tensor((rng.normal(size=(args.hidden, classes)) / 4).astype(dtype), device=replicated, requires_grad=True),
        xgrad.tensor(np.zeros(classes, dtype), device=replicated, requires_grad=True),
    ]
    w1, b1, w2, b2 = params
    optimizer = xgrad.optim.Optax(params, optax.sgd(0.5))

    def local_batch(step: int) -> tuple[xgrad.Tensor, xgrad.Tensor]:
        """This process's rows of the global batch of ``step``, made into global tensors."""
        data = np.random.default_rng(1000 + step)
        x = data.normal(size=(args.batch, features)).astype(dtype)
        labels = (x[:, :classes] * np.arange(1, classes + 1)).argmax(axis=1)  # a learnable rule
        rows = slice(jax.process_index() * args.batch // jax.process_count(),
                     (jax.process_index() + 1) * args.batch // jax.process_count())
        return (xgrad.tensor(jax.make_array_from_process_local_data(batch, x[rows])),
                xgrad.tensor(jax.make_array_from_process_local_data(batch, labels[rows])))

    times = []
    for step in range(args.steps):
        x, labels = local_batch(step)
        start = time.perf_counter()
        loss = xgrad.cross_entropy((x @ w1 + b1).tanh() @ w2 + b2, labels)
        optimizer.zero_grad()
        loss.backward(compiled=not args.eager)
        optimizer.step()
        value = loss.item()  # the loss is replicated: every process can read it
        times.append(time.perf_counter() - start)
        if jax.process_index() == 0:
            print(f"step {step} loss {value:.6f}")
    print(f"process {jax.process_index()} final loss {value:.12f}")
    if args.time and len(times) > 2:
        print(f"process {jax.process_index()} step time {1e3 * np.mean(times[2:]):.2f} ms")


if __name__ == "__main__":
    main()
