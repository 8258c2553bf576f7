"""torch.func's two recipes in ``xgrad.func`` against the same math under ``jax.jit`` by hand.

1. **per-example gradients**: ``vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)`` of an
   MLP's cross-entropy (784-256-10, relu, float32, batch 128 or ``--batch``), the loss written
   with ``functional_call`` on the module, against
   ``jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))`` on a dict of arrays;
2. **ensembling**: ``vmap(fmodel, in_dims=(0, 0, None))(params, buffers, x)`` of 8 stacked
   copies of the MLP (``functional_call`` on the base module) on one shared batch, against
   ``jax.jit(jax.vmap(..., in_axes=(0, None)))``.

Both xgrad recipes are the two lines a torch.func user writes: nothing jitted by hand (the
transforms cache their programs, NOTE [Transforms cached per signature] in ``xgrad/func.py``).
Each call ends when its result is ready; timers run in turns and the medians are printed with
their ratio (xgrad / by hand). The target is a ratio of at most 1.2.

    python benchmarks/bench_func.py          # ~1 min on 2 CPU cores
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
import xgrad.nn.functional as F
from xgrad import func, nn

SIZES = (784, 256, 10)
MODELS = 8


def _mlp(key: int) -> nn.Module:
    return nn.Sequential(nn.Linear(SIZES[0], SIZES[1], key=key), nn.ReLU(), nn.Linear(SIZES[1], SIZES[2], key=key + 1))


def _forward_by_hand(p: dict[str, Any], x: Any) -> Any:
    h = jnp.maximum(x @ p["0.weight"].T + p["0.bias"], 0.0)
    return h @ p["2.weight"].T + p["2.bias"]


def _timer(fn: Callable[[], Any]) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        jax.block_until_ready(fn())
        return time.perf_counter() - start

    return run


def _ready(tree: Any) -> Any:
    """The arrays of a result of Tensors, to wait on."""
    return [t.array for t in jax.tree_util.tree_leaves(tree, is_leaf=xgrad.is_tensor)]


def per_example_gradients(batch: int, rng: np.random.Generator) -> dict[str, Callable[[], float]]:
    model = _mlp(0)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = xgrad.tensor(rng.standard_normal((batch, SIZES[0])).astype(np.float32))
    y = xgrad.tensor(rng.integers(0, SIZES[-1], batch))

    def loss(params: Any, x: Any, y: Any) -> Any:
        return F.cross_entropy(func.functional_call(model, params, (x.unsqueeze(0),)), y.unsqueeze(0))

    per_example = func.vmap(func.grad(loss), in_dims=(None, 0, 0))

    def loss_by_hand(p: dict[str, Any], x: Any, y: Any) -> Any:
        return -jax.nn.log_softmax(_forward_by_hand(p, x))[y]

    by_hand = jax.jit(jax.vmap(jax.grad(loss_by_hand), in_axes=(None, 0, 0)))
    raw = {k: v.array for k, v in params.items()}
    ours, theirs = per_example(params, x, y), by_hand(raw, x.array, y.array)
    for k in raw:
        np.testing.assert_allclose(np.asarray(ours[k].array), np.asarray(theirs[k]), rtol=1e-4, atol=1e-6)
    return {
        "xgrad.func": _timer(lambda: _ready(per_example(params, x, y))),
        "jax.jit by hand": _timer(lambda: by_hand(raw, x.array, y.array)),
    }


def ensembling(batch: int, rng: np.random.Generator) -> dict[str, Callable[[], float]]:
    models = [_mlp(2 * i) for i in range(MODELS)]
    base = models[0]
    params = {k: xgrad.stack([dict(m.named_parameters())[k].detach() for m in models]) for k, _ in base.named_parameters()}
    buffers: dict[str, Any] = {}
    x = xgrad.tensor(rng.standard_normal((batch, SIZES[0])).astype(np.float32))

    def fmodel(params: Any, buffers: Any, x: Any) -> Any:
        return func.functional_call(base, (params, buffers), (x,))

    ensemble = func.vmap(fmodel, in_dims=(0, 0, None))
    by_hand = jax.jit(jax.vmap(_forward_by_hand, in_axes=(0, None)))
    raw = {k: v.array for k, v in params.items()}
    np.testing.assert_allclose(
        np.asarray(ensemble(params, buffers, x).array), np.asarray(by_hand(raw, x.array)), rtol=1e-4, atol=1e-5
    )
    return {
        "xgrad.func": _timer(lambda: ensemble(params, buffers, x).array),
        "jax.jit by hand": _timer(lambda: by_hand(raw, x.array)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for name, make in (("per-example gradients", per_example_gradients), ("ensembling (8 models)", ensembling)):
        medians = interleaved(make(args.batch, rng), repeats=args.repeats, warmup=5)
        ours, theirs = medians["xgrad.func"], medians["jax.jit by hand"]
        rows.append((name, f"{ours * 1e3:.3f}", f"{theirs * 1e3:.3f}", f"{ours / theirs:.2f}x"))
    print(f"batch {args.batch}, MLP {'-'.join(map(str, SIZES))}, float32, {jax.devices()[0].platform}")
    print(table(rows, ("recipe", "xgrad.func ms", "jax.jit by hand ms", "ratio")))


if __name__ == "__main__":
    main()
