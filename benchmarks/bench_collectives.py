"""What a sharded training step communicates: ``xgrad.compile`` against ``jax.jit`` of the same loss, over a sweep.

Models: MLPs of several widths and depths (some with sizes the mesh does not divide, whose
tensors stay replicated or split along another dim), nanoGPT (``examples/nanogpt.py``: one
layer of width 16, and the example's two of width 32) and a small CNN (two 3x3 convolutions
with max pooling). Layouts, on four host devices (the CPU split by ``XLA_FLAGS`` before JAX
is imported): ``dp`` (parameters replicated, batch over ``data``), ``fsdp`` (``fsdp("data")``)
and ``2d`` (a 2x2 ``data`` x ``model`` mesh: ``fsdp`` over ``data``, and each tensor's last
other dim that ``model`` divides split over ``model``). The batch is split over ``data``.

Each case is one SGD step compiled twice for the same placed arrays: ``xgrad.compile`` of the
PyTorch-style step (forward, ``backward()``, ``optimizer.step()``), and ``jax.jit`` of
``jax.value_and_grad`` of the same loss (``xgrad.func.functional_call``: the same forward,
JAX's own transposes) with the update ``p - lr * g``, its outputs placed as the parameters.
Bytes are the collectives' result sizes per device in the optimized HLO
(``xgrad.distributed.collective_stats``); nothing runs.

    python benchmarks/bench_collectives.py                   # every case, ~3 min on 2 CPU cores
    python benchmarks/bench_collectives.py --model "gpt 2x32" --layout fsdp --hlo /tmp/hlo
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import xgrad
from xgrad.distributed import collective_stats, fsdp, shard_module
from xgrad.distributed.hlo import KINDS

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import nanogpt  # noqa: E402  (the example model)

LAYOUTS = ("dp", "fsdp", "2d")
LR = 0.1
Stats = dict[str, tuple[int, int]]


class CNN(xgrad.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = xgrad.nn.Sequential(
            xgrad.nn.Conv2d(1, 8, 3, padding=1), xgrad.nn.ReLU(), xgrad.nn.MaxPool2d(2),
            xgrad.nn.Conv2d(8, 12, 3, padding=1), xgrad.nn.ReLU(), xgrad.nn.MaxPool2d(2),
        )
        self.head = xgrad.nn.Linear(12 * 2 * 2, 10)

    def forward(self, x: xgrad.Tensor) -> xgrad.Tensor:
        return self.head(self.features(x).flatten(1))


def _mlp(sizes: list[int], batch: int) -> Callable[[], tuple[xgrad.nn.Module, np.ndarray, np.ndarray]]:
    def make() -> tuple[xgrad.nn.Module, np.ndarray, np.ndarray]:
        rng = np.random.default_rng(0)
        model = xgrad.nn.MLP(sizes, activation=xgrad.nn.Tanh, key=0)
        return model, rng.normal(size=(batch, sizes[0])).astype(np.float32), rng.integers(0, sizes[-1], batch)

    return make


def _gpt(config: nanogpt.GPTConfig) -> Callable[[], tuple[xgrad.nn.Module, np.ndarray, np.ndarray]]:
    def make() -> tuple[xgrad.nn.Module, np.ndarray, np.ndarray]:
        chars = sorted(set(nanogpt.TEXT))
        config.vocab_size = len(chars)
        xgrad.manual_seed(0)
        model = nanogpt.GPT(config)
        data = np.array([chars.index(c) for c in nanogpt.TEXT], dtype=np.int32)
        x, y = nanogpt.get_batch(data, config.block_size, 8, np.random.default_rng(0))
        return model, np.asarray(x.array), np.asarray(y.array)

    return make


def _cnn() -> tuple[xgrad.nn.Module, np.ndarray, np.ndarray]:
    xgrad.manual_seed(0)
    rng = np.random.default_rng(0)
    return CNN(), rng.normal(size=(8, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)


# name -> a maker of (model, inputs, targets); the MLPs' sizes that 4 (or 2) does not divide
# leave some tensors replicated or split along their other dim.
MODELS: dict[str, Callable[[], tuple[xgrad.nn.Module, np.ndarray, np.ndarray]]] = {
    "mlp 16-64-64-8": _mlp([16, 64, 64, 8], 32),
    "mlp 64-256-256-16": _mlp([64, 256, 256, 16], 32),
    "mlp 20-30-30-10": _mlp([20, 30, 30, 10], 32),
    "mlp 6-10-14-3": _mlp([6, 10, 14, 3], 16),
    "mlp 32-48x5-10": _mlp([32, 48, 48, 48, 48, 48, 10], 16),
    "gpt 1x16": _gpt(nanogpt.GPTConfig(block_size=8, n_layer=1, n_head=2, n_embd=16)),
    "gpt 2x32": _gpt(nanogpt.GPTConfig()),  # examples/fsdp_nanogpt.py's model
    "cnn": _cnn,
}


def _loss(model: xgrad.nn.Module, forward: Callable[..., Any], x: xgrad.Tensor, y: xgrad.Tensor) -> xgrad.Tensor:
    """The model's training loss, its forward called through ``forward`` (the module, or a functional call)."""
    if isinstance(model, nanogpt.GPT):
        return forward(x, y)[1]
    return xgrad.cross_entropy(forward(x), y)


def _mesh(layout: str) -> Mesh:
    devices = np.array(jax.devices()[:4])
    return Mesh(devices.reshape(2, 2), ("data", "model")) if layout == "2d" else Mesh(devices, ("data",))


def _two_d(name: str, t: xgrad.Tensor, mesh: Mesh) -> P:
    """``fsdp("data")``'s spec, and ``model`` on the last other dim that it divides."""
    split = fsdp("data")(name, t, mesh)  # type: ignore[call-arg]
    spec = [*split, *[None] * (t.ndim - len(split))]
    for dim in reversed(range(t.ndim)):
        if spec[dim] is None and t.shape[dim] % mesh.shape["model"] == 0:
            spec[dim] = "model"
            break
    return P(*spec)


_two_d.needs_mesh = True  # type: ignore[attr-defined]  (shard_module passes it the mesh)


def place(model: xgrad.nn.Module, layout: str) -> Mesh:
    mesh = _mesh(layout)
    if layout == "dp":
        shard_module(model, mesh, [])
    elif layout == "fsdp":
        shard_module(model, mesh, fsdp("data"))
    else:
        shard_module(model, mesh, _two_d)  # type: ignore[arg-type]
    return mesh


def programs(model_name: str, layout: str) -> dict[str, Any]:
    """The compiled programs of one case: ``{"xgrad.compile": ..., "jax.jit": ...}`` (JAX ``Compiled``)."""
    model, inputs, targets = MODELS[model_name]()
    mesh = place(model, layout)
    optimizer = xgrad.optim.SGD(model.parameters(), lr=LR)
    batch = NamedSharding(mesh, P("data"))
    x = xgrad.tensor(jax.device_put(inputs, batch))
    y = xgrad.tensor(jax.device_put(targets, batch))

    def step(x: xgrad.Tensor, y: xgrad.Tensor) -> xgrad.Tensor:
        optimizer.zero_grad()
        loss = _loss(model, model, x, y)
        loss.backward()
        optimizer.step()
        return loss

    ours = xgrad.compile(step, fallback="error").lower(x, y).compile()
    params = {name: p.array for name, p in model.named_parameters()}
    buffers = {name: b.array for name, b in model.named_buffers()}

    def loss(params: dict[str, jax.Array], buffers: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
        state = {**params, **buffers}
        forward = lambda *args: xgrad.func.functional_call(model, state, args)  # noqa: E731
        return _loss(model, forward, xgrad.tensor(x), xgrad.tensor(y)).array

    def jax_step(params: Any, buffers: Any, x: jax.Array, y: jax.Array) -> Any:
        value, grads = jax.value_and_grad(loss)(params, buffers, x, y)
        return jax.tree.map(lambda p, g: p - LR * g, params, grads), value

    shardings = jax.tree.map(lambda a: a.sharding, params)
    theirs = jax.jit(jax_step, out_shardings=(shardings, None)).lower(params, buffers, x.array, y.array).compile()
    return {"xgrad.compile": ours, "jax.jit": theirs}


def communication(model_name: str, layout: str) -> dict[str, Stats]:
    """``{"xgrad.compile": stats, "jax.jit": stats}`` of one case (``collective_stats``)."""
    return {who: collective_stats(program) for who, program in programs(model_name, layout).items()}


def total(stats: Stats) -> int:
    return sum(size for _, size in stats.values())


def _cell(stats: Stats, kind: str) -> str:
    count, size = stats.get(kind, (0, 0))
    return f"{count}: {size:,}" if count else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), action="append", help="these models only (repeatable)")
    parser.add_argument("--layout", choices=LAYOUTS, action="append", help="these layouts only (repeatable)")
    parser.add_argument("--hlo", help="a folder to write each case's two optimized HLO texts into")
    args = parser.parse_args()
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {jax.device_count()} devices; "
          "per kind: count: bytes per device, xgrad.compile vs jax.jit\n")
    print("| model | layout | " + " | ".join(KINDS) + " | bytes | jax.jit bytes | ratio |")
    print("|---|---|" + "---|" * len(KINDS) + "---:|---:|---:|")
    for model_name in args.model or MODELS:
        for layout in args.layout or LAYOUTS:
            compiled = programs(model_name, layout)
            if args.hlo:
                os.makedirs(args.hlo, exist_ok=True)
                for who, program in compiled.items():
                    name = f"{model_name}-{layout}-{who}".replace(" ", "_")
                    with open(os.path.join(args.hlo, name + ".hlo"), "w") as f:
                        f.write(program.as_text())
            ours, theirs = (collective_stats(compiled[who]) for who in ("xgrad.compile", "jax.jit"))
            cells = " | ".join(f"{_cell(ours, kind)} vs {_cell(theirs, kind)}" for kind in KINDS)
            ratio = f"{total(ours) / total(theirs):.3f}" if total(theirs) else "-"
            print(f"| {model_name} | {layout} | {cells} | {total(ours):,} | {total(theirs):,} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
