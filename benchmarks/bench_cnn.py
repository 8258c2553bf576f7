"""The MNIST CNN's training step (pytorch/examples mnist/main.py) in float64 and float32.

The program's Net (conv 1->32 and 32->64 3x3, relu, max_pool2d 2, dropout 0.25, fc
9216->128, dropout 0.5, fc 128->10, log_softmax), ``nll_loss`` and Adadelta (lr 1.0) on
a batch of 64 28x28 images, stepped as: xgrad eager; ``xgrad.compile`` of the same step;
``jax.jit`` of ``jax.value_and_grad`` of the same loss plus optax's adadelta in one
program (the floor); and PyTorch eager on one thread when ``torch`` is importable. All
start from the same parameters. Timings are interleaved (one step of each in turn) and
medians; each step ends when its parameters are ready.

    python benchmarks/bench_cnn.py            # ~4 min on 2 CPU cores
    python benchmarks/bench_cnn.py --quick
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax

jax.config.update("jax_enable_x64", True)  # before any array: the float64 rows need it

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from _timing import interleaved, table  # noqa: E402

import xgrad  # noqa: E402

BATCH = 64


def make_net(torch: ModuleType) -> Any:
    """pytorch/examples' MNIST ``Net``, written once for ``torch`` or ``xgrad`` (the same API)."""
    nn, F = torch.nn, torch.nn.functional

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, 1)
            self.conv2 = nn.Conv2d(32, 64, 3, 1)
            self.dropout1 = nn.Dropout(0.25)
            self.dropout2 = nn.Dropout(0.5)
            self.fc1 = nn.Linear(9216, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x: Any) -> Any:
            x = F.relu(self.conv2(F.relu(self.conv1(x))))
            x = self.dropout1(F.max_pool2d(x, 2))
            x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
            return F.log_softmax(self.fc2(x), dim=1)

    return Net()


def framework_step(torch: ModuleType, state: dict[str, np.ndarray], dtype: str) -> tuple[Callable[..., Any], Any]:
    """The program's training step in ``torch`` (or ``xgrad``) from ``state``: ``(step, model)``."""
    model = make_net(torch).to(getattr(torch, dtype))
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()})
    model.train()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)

    def step(data: Any, target: Any) -> Any:
        optimizer.zero_grad()
        loss = torch.nn.functional.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        return loss

    return step, model


def jax_loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array, key: jax.Array) -> jax.Array:
    """The Net's loss in plain JAX (NCHW, OIHW as PyTorch), dropout drawn from ``key``."""

    def conv(h: jax.Array, name: str) -> jax.Array:
        out = jax.lax.conv_general_dilated(h, params[f"{name}.weight"], (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return out + params[f"{name}.bias"][:, None, None]

    def dropout(h: jax.Array, p: float, key: jax.Array) -> jax.Array:
        return jnp.where(jax.random.bernoulli(key, 1 - p, h.shape), h / (1 - p), 0)

    k1, k2 = jax.random.split(key)
    h = jax.nn.relu(conv(jax.nn.relu(conv(x, "conv1")), "conv2"))
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    h = dropout(h, 0.25, k1).reshape(len(h), -1)
    h = dropout(jax.nn.relu(h @ params["fc1.weight"].T + params["fc1.bias"]), 0.5, k2)
    logp = jax.nn.log_softmax(h @ params["fc2.weight"].T + params["fc2.bias"], axis=1)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def floor_timer(state: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> Callable[[], float]:
    transform = optax.adadelta(learning_rate=1.0, rho=0.9, eps=1e-6)

    @jax.jit
    def step(params: dict[str, jax.Array], opt_state: Any, key: jax.Array, x: jax.Array, y: jax.Array) -> tuple[Any, ...]:
        key, sub = jax.random.split(key)
        loss, grads = jax.value_and_grad(jax_loss)(params, x, y, sub)
        updates, opt_state = transform.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, key, loss

    params = {k: jnp.asarray(v) for k, v in state.items()}
    box = [params, transform.init(params), jax.random.key(0)]
    xs, ys = jnp.asarray(x), jnp.asarray(y)

    def timer() -> float:
        start = time.perf_counter()
        box[0], box[1], box[2], _ = step(*box, xs, ys)
        jax.block_until_ready(box[0])
        return time.perf_counter() - start

    return timer


def xgrad_timer(step: Callable[..., Any], model: Any, x: np.ndarray, y: np.ndarray) -> Callable[[], float]:
    xs, ys = xgrad.tensor(x), xgrad.tensor(y)

    def timer() -> float:
        start = time.perf_counter()
        step(xs, ys)
        jax.block_until_ready([p.array for p in model.parameters()])
        return time.perf_counter() - start

    return timer


def torch_timer(state: dict[str, np.ndarray], dtype: str, x: np.ndarray, y: np.ndarray) -> Callable[[], float] | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    step, _ = framework_step(torch, state, dtype)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)

    def timer() -> float:
        start = time.perf_counter()
        step(xs, ys)
        return time.perf_counter() - start

    return timer


def timers(dtype: str) -> dict[str, Callable[[], float]]:
    """One timer per way of stepping the Net, each on its own copy of the same initial parameters."""
    xgrad.manual_seed(0)
    state = {k: np.asarray(v.detach().numpy()).astype(dtype) for k, v in make_net(xgrad).state_dict().items()}
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((BATCH, 1, 28, 28)).astype(dtype), rng.integers(0, 10, BATCH)
    eager, eager_model = framework_step(xgrad, state, dtype)
    compiled, compiled_model = framework_step(xgrad, state, dtype)
    result = {
        "xgrad eager": xgrad_timer(eager, eager_model, x, y),
        "xgrad.compile step": xgrad_timer(xgrad.compile(compiled, fallback="error"), compiled_model, x, y),
        "jax.jit(value_and_grad) + optax (floor)": floor_timer(state, x, y),
    }
    torch_step = torch_timer(state, dtype, x, y)
    if torch_step is not None:
        result["torch eager (1 thread)"] = torch_step
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    repeats = 5 if args.quick else 20
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; interleaved medians of {repeats} steps\n")
    rows = []
    for dtype in ("float64", "float32"):
        medians = interleaved(timers(dtype), repeats)
        eager, floor, torch = medians["xgrad eager"], medians["jax.jit(value_and_grad) + optax (floor)"], medians.get("torch eager (1 thread)")
        rows += [
            (f"{dtype}: {how}", f"{seconds * 1e3:.1f}", f"{eager / seconds:.2f}x", f"{floor / seconds:.2f}x",
             "" if torch is None else f"{torch / seconds:.2f}x")
            for how, seconds in medians.items()
        ]
    print(table(rows, ("MNIST CNN step, batch 64", "ms / step", "vs eager", "vs floor", "vs torch")))
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
