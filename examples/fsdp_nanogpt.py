"""nanoGPT fully sharded (FSDP): parameters, gradients, Adam's state and the batch split over a mesh.

The model is ``examples/nanogpt.py``'s, unchanged. ``xgrad.distributed.shard_module``
places its parameters by a rule (``fsdp("data")``: each tensor split over the ``data``
axis), the optimizer (built before) follows, and the batch is split over the same axis.
Then the training step is ordinary PyTorch-style code under ``xgrad.compile``: XLA gathers
each weight where it is used and reduces each gradient back onto its shards (ZeRO-3),
which ``xgrad.distributed.collective_stats`` shows next to ``jax.jit``'s for the same loss.
Layouts: ``dp`` (parameters replicated), ``fsdp``, and ``2d`` (``fsdp`` over ``data`` and
the MLP's weights split over ``model`` as well)::

    python examples/fsdp_nanogpt.py --layout fsdp --steps 20

On a CPU the host is split into four devices (``XLA_FLAGS``) unless already set.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import xgrad
from xgrad.distributed import collective_stats, fsdp, shard_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nanogpt  # noqa: E402  (the example next to this one)

LAYOUTS = ("dp", "fsdp", "2d")


def make_mesh(layout: str) -> Mesh:
    devices = np.array(jax.devices())
    if layout == "2d":
        return Mesh(devices.reshape(len(devices) // 2, 2), ("data", "model"))
    return Mesh(devices, ("data",))


def place(model: xgrad.nn.Module, mesh: Mesh, layout: str) -> None:
    if layout == "dp":
        shard_module(model, mesh, [])  # everything replicated
        return
    sharded = fsdp("data")
    if layout == "fsdp":
        shard_module(model, mesh, sharded)
        return

    def rule(name: str, t: xgrad.Tensor, mesh: Mesh) -> P:  # Megatron-style MLP over "model", the rest FSDP
        if name.endswith("mlp.c_fc.weight"):
            return P("model", "data")
        if name.endswith("mlp.c_proj.weight"):
            return P("data", "model")
        return sharded(name, t, mesh)  # type: ignore[call-arg]

    rule.needs_mesh = True  # type: ignore[attr-defined]
    shard_module(model, mesh, rule)


def setup(layout: str, config: nanogpt.GPTConfig, batch_size: int, seed: int = 0) -> tuple[Any, Any, Any]:
    """The sharded model, its AdamW (built before placing, as a PyTorch program would) and a batch source."""
    chars = sorted(set(nanogpt.TEXT))
    data = np.array([chars.index(c) for c in nanogpt.TEXT], dtype=np.int32)
    config.vocab_size = len(chars)
    xgrad.manual_seed(seed)
    model = nanogpt.GPT(config)
    optimizer = xgrad.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    mesh = make_mesh(layout)
    place(model, mesh, layout)
    batch = NamedSharding(mesh, P("data"))
    rng = np.random.default_rng(seed)

    def next_batch() -> tuple[xgrad.Tensor, xgrad.Tensor]:
        x, y = nanogpt.get_batch(data, config.block_size, batch_size, rng)
        return xgrad.tensor(jax.device_put(x.array, batch)), xgrad.tensor(jax.device_put(y.array, batch))

    return model, optimizer, next_batch


def training_step(model: xgrad.nn.Module, optimizer: Any) -> Any:
    def step(x: xgrad.Tensor, y: xgrad.Tensor) -> xgrad.Tensor:
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    return step


def communication(layout: str, config: nanogpt.GPTConfig, batch_size: int) -> dict[str, dict[str, tuple[int, int]]]:
    """Collectives of one training step: ``xgrad.compile``'s and ``jax.jit``'s of the same loss, shardings and AdamW."""
    model, optimizer, next_batch = setup(layout, config, batch_size)
    x, y = next_batch()
    step = xgrad.compile(training_step(model, optimizer), fallback="error")
    ours = collective_stats(step.lower(x, y).compile())
    params = {name: p.array for name, p in model.named_parameters()}
    buffers = {name: b.array for name, b in model.named_buffers()}

    def loss(params: dict[str, jax.Array], buffers: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
        return xgrad.func.functional_call(model, {**params, **buffers}, (xgrad.tensor(x), xgrad.tensor(y)))[1].array

    adamw = optax.adamw(3e-3, b1=0.9, b2=0.95, weight_decay=0.1)

    def jax_step(params: Any, buffers: Any, state: Any, x: jax.Array, y: jax.Array) -> Any:
        value, grads = jax.value_and_grad(loss)(params, buffers, x, y)
        updates, state = adamw.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    shardings = jax.tree.map(lambda a: a.sharding, params)
    state = jax.jit(adamw.init, out_shardings=None)(params)
    jitted = jax.jit(jax_step, out_shardings=(shardings, None, None))
    # The buffers are arguments placed as the module's (the causal mask split as fsdp() splits
    # it), as xgrad.compile's program reads them: not constants of jax.jit's program.
    theirs = collective_stats(jitted.lower(params, buffers, state, x.array, y.array).compile())
    return {"xgrad.compile": ours, "jax.jit": theirs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=LAYOUTS, default="fsdp")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    config = nanogpt.GPTConfig()
    model, optimizer, next_batch = setup(args.layout, config, args.batch_size)
    step = xgrad.compile(training_step(model, optimizer))
    for i in range(args.steps):
        loss = step(*next_batch())
        if i % 5 == 0 or i == args.steps - 1:
            print(f"step {i:3d}  loss {loss.item():.4f}")
    weight = model.transformer.h[0].mlp.c_fc.weight
    print(f"c_fc.weight {list(weight.shape)} sharded {weight.sharding.spec}, its grad {weight.grad.sharding.spec}")
    for who, stats in communication(args.layout, nanogpt.GPTConfig(), args.batch_size).items():
        print(f"{who:14s}", {kind: f"{count} ops, {size} B" for kind, (count, size) in stats.items()})


if __name__ == "__main__":
    main()
