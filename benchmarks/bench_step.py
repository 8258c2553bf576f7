"""Whole training steps: ``xgrad.compile`` against the ``jax.jit`` floor, xgrad eager and compiled backward.

Two models, each trained with Adam from the same parameters on the same batch:

1. the demo's MLP (2-64-64-3, tanh, batch 128, cross-entropy);
2. the 2-layer transformer block of ``bench_compiled.py`` (d=256, seq 128, batch 8).

Each is stepped as: an ``xgrad.compile`` step (forward, ``backward()``,
``Optax.step()``); ``jax.jit`` of ``jax.value_and_grad`` plus the optax update in
one program (the floor); xgrad eager; xgrad eager forward with the compiled backward;
and PyTorch eager when ``torch`` is importable (MLP only). Timings are interleaved
(one step of each in turn) and medians; each step ends when its parameters are ready.
Then the cold start: the first eager and the first ``xgrad.compile`` step of the demo model in a
fresh process, without and with the persistent compilation cache.

    python benchmarks/bench_step.py            # ~2 min on 2 CPU cores
    python benchmarks/bench_step.py --quick
    python benchmarks/bench_step.py --cold-start   # the cold start rows alone
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _timing import interleaved, table
from bench_compiled import JaxOps, XgradOps, init_transformer, transformer

import xgrad
from xgrad import demo
from xgrad.optim import Optax

LEARNING_RATE = 1e-2


XGRAD_STEPS = ("xgrad.compile step", "xgrad eager", "xgrad compiled backward")


def xgrad_steps(
    loss_fn: Callable[..., xgrad.Tensor], params: list[xgrad.Tensor], inputs: list[Any], hows: tuple[str, ...] = XGRAD_STEPS
) -> dict[str, Callable[[], float]]:
    """Timers of one xgrad step, three ways (or ``hows``), each on its own copy of the parameters."""
    timers = {}
    for how in hows:
        copies = [xgrad.tensor(p.array, requires_grad=True) for p in params]
        opt = Optax(copies, optax.adam(LEARNING_RATE))

        def step(*xs: Any, copies: list[xgrad.Tensor] = copies, opt: Optax = opt, compiled: bool = how.endswith("backward")) -> xgrad.Tensor:
            opt.zero_grad()
            loss = loss_fn(copies, *xs)
            loss.backward(compiled=compiled)
            opt.step()
            return loss

        run = xgrad.compile(step, fallback="error") if how == "xgrad.compile step" else step

        def timer(run: Callable[..., Any] = run, copies: list[xgrad.Tensor] = copies) -> float:
            start = time.perf_counter()
            run(*inputs)
            jax.block_until_ready([p.array for p in copies])
            return time.perf_counter() - start

        timers[how] = timer
    return timers


def floor_step(jax_loss: Callable[..., jax.Array], params: list[jax.Array], inputs: list[Any]) -> Callable[[], float]:
    transform = optax.adam(LEARNING_RATE)

    @jax.jit
    def step(params: list[jax.Array], state: Any, *xs: Any) -> tuple[Any, Any, jax.Array]:
        loss, grads = jax.value_and_grad(jax_loss)(params, *xs)
        updates, state = transform.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    box = [list(params), transform.init(params)]

    def timer() -> float:
        start = time.perf_counter()
        box[0], box[1], _ = step(box[0], box[1], *inputs)
        jax.block_until_ready(box[0])
        return time.perf_counter() - start

    return timer


def torch_mlp_step(params: list[jax.Array], x: np.ndarray, y: np.ndarray) -> Callable[[], float] | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    tparams = [torch.tensor(np.asarray(p), requires_grad=True) for p in params]
    opt = torch.optim.Adam(tparams, lr=LEARNING_RATE)
    tx, ty = torch.tensor(x), torch.tensor(y, dtype=torch.long)

    def timer() -> float:
        start = time.perf_counter()
        opt.zero_grad()
        h = tx
        for i in range(0, len(tparams), 2):
            h = h @ tparams[i].T + tparams[i + 1]
            if i + 2 < len(tparams):
                h = torch.tanh(h)
        torch.nn.functional.cross_entropy(h, ty).backward()
        opt.step()
        return time.perf_counter() - start

    return timer


def rows_for(name: str, timers: dict[str, Callable[[], float]], repeats: int) -> list[tuple[str, ...]]:
    medians = interleaved(timers, repeats)
    floor = medians["jax.jit(value_and_grad) + optax (floor)"]
    return [
        (f"{name}: {how}", f"{1 / seconds:.0f}", f"{seconds * 1e3:.3f}", f"{floor / seconds:.2f}x")
        for how, seconds in medians.items()
    ]


def _tanh_backward(ctx: Any, g: xgrad.Tensor) -> xgrad.Tensor:
    (out,) = ctx.saved_tensors
    return g * (1 - out * out)


class HostTanh(xgrad.autograd.Function):
    """tanh with a hand-written backward: under ``xgrad.compile`` it runs on the host at every call."""

    @staticmethod
    def forward(ctx: Any, x: xgrad.Tensor) -> xgrad.Tensor:
        out = x.tanh()
        ctx.save_for_backward(out)
        return out

    backward = staticmethod(_tanh_backward)


class PureTanh(HostTanh):
    """The same backward marked ``pure_hook``: traced into the program."""

    backward = staticmethod(xgrad.autograd.compiled.pure_hook(_tanh_backward))


def mlp_timers() -> dict[str, Callable[[], float]]:
    batch = demo.make_batches(jax.devices()[0])[0]
    model = demo.make_model(jax.devices()[0])
    params = list(model.parameters())

    def loss_fn(ps: list[xgrad.Tensor], x: xgrad.Tensor, y: xgrad.Tensor, tanh: Callable[..., Any] = xgrad.tanh) -> xgrad.Tensor:
        h = x
        for i in range(0, len(ps), 2):
            h = h @ ps[i].T + ps[i + 1]
            if i + 2 < len(ps):
                h = tanh(h)
        return xgrad.cross_entropy(h, y)

    x, y = xgrad.tensor(batch[0]), xgrad.tensor(batch[1])
    timers = xgrad_steps(loss_fn, params, [x, y])
    # The targets as a constant of the program: cross_entropy checks them when traced, so
    # the program has no index check (NOTE [Checks in a compiled step]); the
    # difference to the row above is what the check costs per step.
    no_check = xgrad_steps(lambda ps, x: loss_fn(ps, x, y), params, [x], hows=("xgrad.compile step",))
    timers["xgrad.compile step, no index check"] = no_check["xgrad.compile step"]
    # tanh as a custom Function: its backward is one ordered host call per layer and step
    # (NOTE [Functions in a compiled step]), or traced in when marked pure_hook.
    for label, function in (("tanh a Function, host backward", HostTanh), ("tanh a Function, pure_hook", PureTanh)):
        steps = xgrad_steps(
            lambda ps, x, y, f=function: loss_fn(ps, x, y, f.apply), params, [x, y], hows=("xgrad.compile step",)
        )
        timers[f"xgrad.compile step, {label}"] = steps["xgrad.compile step"]
    timers["jax.jit(value_and_grad) + optax (floor)"] = floor_step(demo.jax_loss, [p.array for p in params], list(batch))
    torch_timer = torch_mlp_step([p.array for p in params], np.asarray(batch[0]), np.asarray(batch[1]))
    if torch_timer is not None:
        timers["torch eager (1 thread)"] = torch_timer
    return timers


def transformer_timers() -> dict[str, Callable[[], float]]:
    rng = np.random.default_rng(0)
    params_np = init_transformer(rng)
    x_np = rng.standard_normal((8, 128, 256)).astype(np.float32)
    leaves_np, tree = jax.tree_util.tree_flatten(params_np)

    def loss_fn(ps: list[xgrad.Tensor], x: xgrad.Tensor) -> xgrad.Tensor:
        return transformer(XgradOps, jax.tree_util.tree_unflatten(tree, ps), x)

    def jax_loss(ps: list[jax.Array], x: jax.Array) -> jax.Array:
        return transformer(JaxOps, jax.tree_util.tree_unflatten(tree, ps), x)

    params = [xgrad.tensor(p, requires_grad=True) for p in leaves_np]
    timers = xgrad_steps(loss_fn, params, [xgrad.tensor(x_np)])
    timers["jax.jit(value_and_grad) + optax (floor)"] = floor_step(jax_loss, [jnp.asarray(p) for p in leaves_np], [jnp.asarray(x_np)])
    return timers


COLD_START = textwrap.dedent(
    """
    import sys, time
    start = time.perf_counter()
    import jax, optax, xgrad
    from xgrad import demo
    from xgrad.optim import Optax
    imported = time.perf_counter()
    device = jax.devices()[0]
    x, y = demo.make_batches(device)[0]
    model = demo.make_model(device)
    opt = Optax(model.parameters(), optax.adam(1e-2))

    def step(x, y):
        opt.zero_grad()
        loss = xgrad.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    if sys.argv[1] == "compile":
        step = xgrad.compile(step)
    for _ in range(2):
        step_start, cpu_start = time.perf_counter(), time.process_time()
        step(xgrad.tensor(x), y)
        jax.block_until_ready(next(model.parameters()).array)
        print(time.perf_counter() - step_start, time.process_time() - cpu_start)
    print(imported - start)
    """
)


def cold_start_rows() -> list[tuple[str, ...]]:
    """The first step of the demo model in fresh processes, eager and ``xgrad.compile``:
    without the persistent compilation cache (the default), then twice with it
    (``XGRAD_COMPILATION_CACHE=DIR``, a fresh directory: the first run fills it)."""
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for mode in ("eager", "compile"):
            for label, setting in (("no compilation cache", None), ("with the cache", cache), ("with the cache, again", cache)):
                env = os.environ.copy()
                env.pop("XGRAD_COMPILATION_CACHE", None)
                if setting is not None:
                    env["XGRAD_COMPILATION_CACHE"] = os.path.join(setting, mode)
                out = subprocess.run([sys.executable, "-c", COLD_START, mode], capture_output=True, text=True, check=True, env=env)
                first, first_cpu, second, _, imports = (float(v) for v in out.stdout.split())
                step = "first eager step" if mode == "eager" else "first xgrad.compile step"
                rows.append((f"{step}, {label}", f"{imports:.2f}", f"{first:.2f}", f"{first_cpu:.2f}", f"{second:.3f}"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--cold-start", action="store_true", help="only the cold start rows")
    args = parser.parse_args()
    repeats = 10 if args.quick else 40
    if not args.cold_start:
        print(f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPUs; interleaved medians of {repeats} steps\n")
        rows = rows_for("MLP", mlp_timers(), repeats * 3)
        rows += rows_for("transformer", transformer_timers(), repeats)
        print(table(rows, ("step", "steps/s", "ms / step", "vs floor")))
    print("\nCold start\n")
    print(table(cold_start_rows(), ("demo model, fresh process", "import s", "step 1 s", "step 1 CPU s", "step 2 s")))


if __name__ == "__main__":
    main()
