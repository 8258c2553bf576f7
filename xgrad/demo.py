"""``python -m xgrad demo``: train a small MLP four ways, check they agree and time them.

The data set is made here (three interleaved spirals, no download). The same model,
from the same initial parameters, is trained on the same batches four ways:

1. xgrad eager: ``loss.backward()`` runs xgrad's Python engine, node by node;
2. xgrad compiled backward: ``loss.backward(compiled=True)``, the backward as one cached
   ``jax.jit`` program, the forward still eager;
3. ``xgrad.compile``: the same eager step code, forward, backward and optimizer compiled
   as one program;
4. the reference: a plain ``jax.jit`` step of ``jax.value_and_grad`` plus the same optax
   update.

The run checks that eager and compiled agree (gradients at the first step against each
other and ``jax.grad``, losses along the way) and prints steps per second, compile time
and cache hits. ``--eager`` or ``--compiled`` trains that way and the reference only.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

import xgrad
from xgrad import nn
from xgrad.ops import cross_entropy
from xgrad.optim import Optax
from xgrad.tensor.devices import resolve_device

SIZES = (2, 64, 64, 3)
BATCH = 128
NUM_POINTS = 1536
LEARNING_RATE = 1e-2
# float32 training: eager and compiled run the same rules but XLA may fuse them
# differently, so values agree to float32 rounding, not bit for bit.
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5
LOSS_TOL = 2e-3


def spirals(num_points: int, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Points on ``classes`` interleaved noisy spiral arms, and their arm index."""
    rng = np.random.default_rng(seed)
    per_class = num_points // classes
    radius = np.tile(np.linspace(0.05, 1.0, per_class), classes)
    labels = np.repeat(np.arange(classes), per_class)
    angle = labels * (2 * np.pi / classes) + radius * 4.0 + rng.normal(0, 0.2, radius.shape)
    points = np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1).astype(np.float32)
    order = rng.permutation(len(labels))
    return points[order], labels[order].astype(np.int32)


def make_batches(device: Any) -> list[tuple[jax.Array, jax.Array]]:
    points, labels = spirals(NUM_POINTS)
    return [
        (jax.device_put(points[i:i + BATCH], device), jax.device_put(labels[i:i + BATCH], device))
        for i in range(0, NUM_POINTS - BATCH + 1, BATCH)
    ]


def make_model(device: Any) -> nn.MLP:
    with jax.default_device(device):
        return nn.MLP(SIZES, activation=nn.Tanh, key=0)


def jax_loss(params: list[jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    """The same MLP and loss as plain ``jnp`` on ``[w0, b0, w1, b1, …]`` (``Linear``'s layout)."""
    h = x
    for i in range(0, len(params), 2):
        h = h @ params[i].T + params[i + 1]
        if i + 2 < len(params):
            h = jnp.tanh(h)
    return optax.softmax_cross_entropy_with_integer_labels(h, y).mean()


# The first steps compile (jitted dispatch, the compiled backward, jit's retrace once
# the optimizer state comes back committed to the device): timed apart, not in steps/s.
WARMUP_STEPS = 2


class Run(NamedTuple):
    name: str
    losses: np.ndarray
    warmup_seconds: float
    steps_per_second: float


def _rate(steps: int, seconds: float) -> float:
    timed = steps - WARMUP_STEPS
    return timed / seconds if timed > 0 else float("nan")


def _progress(steps: int, desc: str) -> tqdm:
    return tqdm(range(steps), desc=desc, unit="step", dynamic_ncols=True, mininterval=0.2, leave=True)


def _train_xgrad_steps(
    name: str, model: nn.MLP, batches: list[tuple[jax.Array, jax.Array]], steps: int,
    step_fn: Callable[[xgrad.Tensor, xgrad.Tensor], xgrad.Tensor],
) -> Run:
    """Run ``step_fn`` on the batches in turn, timing the warm-up steps apart."""
    losses = []
    bar = _progress(steps, name)
    start = time.perf_counter()
    warmup = 0.0
    for step in bar:
        x, y = batches[step % len(batches)]
        loss = step_fn(xgrad.tensor(x), xgrad.tensor(y))
        losses.append(loss.array)
        if step == WARMUP_STEPS - 1:
            jax.block_until_ready(next(model.parameters()).array)
            warmup = time.perf_counter() - start
            start = time.perf_counter()
        if step % 25 == 0 or step == steps - 1:
            bar.set_postfix(loss=f"{float(loss.item()):.4f}", refresh=False)
    jax.block_until_ready(next(model.parameters()).array)
    return Run(name, np.asarray(jnp.stack(losses)), warmup, _rate(steps, time.perf_counter() - start))


def train_xgrad(model: nn.MLP, batches: list[tuple[jax.Array, jax.Array]], steps: int, compiled: bool) -> Run:
    """Train ``model`` in place, eagerly or with the compiled backward."""
    opt = Optax(model.parameters(), optax.adam(LEARNING_RATE))

    def train_step(x: xgrad.Tensor, y: xgrad.Tensor) -> xgrad.Tensor:
        loss = cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward(compiled=compiled)
        opt.step()
        return loss

    return _train_xgrad_steps("xgrad compiled backward" if compiled else "xgrad eager", model, batches, steps, train_step)


def train_xgrad_compile(model: nn.MLP, batches: list[tuple[jax.Array, jax.Array]], steps: int) -> tuple[Run, dict[str, Any]]:
    """The same eager code as ``train_xgrad``, the whole step under ``xgrad.compile``."""
    opt = Optax(model.parameters(), optax.adam(LEARNING_RATE))

    @xgrad.compile
    def train_step(x: xgrad.Tensor, y: xgrad.Tensor) -> xgrad.Tensor:
        loss = cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return _train_xgrad_steps("xgrad.compile step", model, batches, steps, train_step), train_step.stats()


def train_jax(params: list[jax.Array], batches: list[tuple[jax.Array, jax.Array]], steps: int) -> Run:
    """The reference: one ``jax.jit`` step of ``value_and_grad`` and the optax update."""
    transform = optax.adam(LEARNING_RATE)

    @jax.jit
    def step_fn(params: list[jax.Array], state: Any, x: jax.Array, y: jax.Array) -> tuple[Any, Any, jax.Array]:
        loss, grads = jax.value_and_grad(jax_loss)(params, x, y)
        updates, state = transform.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    state = transform.init(params)
    losses = []
    start = time.perf_counter()
    warmup = 0.0
    for step in _progress(steps, "jax.jit"):
        x, y = batches[step % len(batches)]
        params, state, loss = step_fn(params, state, x, y)
        losses.append(loss)
        if step == WARMUP_STEPS - 1:
            jax.block_until_ready(params)
            warmup = time.perf_counter() - start
            start = time.perf_counter()
    jax.block_until_ready(params)
    rate = _rate(steps, time.perf_counter() - start)
    return Run("jax.jit(jax.value_and_grad) + optax", np.asarray(jnp.stack(losses)), warmup, rate)


def first_step_grads(model: nn.MLP, batch: tuple[jax.Array, jax.Array], compiled: bool) -> list[np.ndarray]:
    model.zero_grad()
    x, y = batch
    cross_entropy(model(xgrad.tensor(x)), y).backward(compiled=compiled)
    grads = [p.grad.numpy() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    return grads


def _max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


def _backward_step(model: nn.MLP, batch: tuple[jax.Array, jax.Array], compiled: bool) -> None:
    model.zero_grad()
    x, y = batch
    cross_entropy(model(xgrad.tensor(x)), y).backward(compiled=compiled)


def _profile(model: nn.MLP, batches: list[tuple[jax.Array, jax.Array]], modes: list[bool], path: str) -> None:
    for compiled in modes:  # warm: the trace shows steady-state steps, not compilation
        _backward_step(model, batches[0], compiled)
    with xgrad.autograd.profile() as prof:
        for compiled in modes:
            for step in range(3):
                with xgrad.profiler.span("compiled step (forward + backward)" if compiled else "eager step (forward + backward)"):
                    _backward_step(model, batches[step % len(batches)], compiled)
    prof.export_chrome_trace(path)
    print(f"\nprofile of {3 * len(modes)} backward steps (trace written to {path}; open it in ui.perfetto.dev):")
    print(prof.table(sort_by="total", row_limit=12))


def _table(runs: list[Run]) -> str:
    header = ("run", "steps/s", f"first {WARMUP_STEPS} steps (s)", "final loss")
    rows = [(r.name, f"{r.steps_per_second:.1f}", f"{r.warmup_seconds:.2f}", f"{r.losses[-1]:.4f}") for r in runs]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    fmt = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))  # noqa: E731
    return "\n".join([fmt(header), "  ".join("-" * w for w in widths), *map(fmt, rows)])


# The demo is a CLI: it prints; the library logs.
def main(argv: list[str] | None = None) -> int:
    summary, _, details = __doc__.partition("\n\n")
    parser = argparse.ArgumentParser(
        prog="xgrad demo", description=summary.replace("``", "") + "\n\n" + details.replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python -m xgrad demo                 # the four ways, about a minute on a CPU\n"
               "  python -m xgrad demo --eager --steps 50\n"
               "  python -m xgrad demo --device gpu --profile trace.json",
    )
    parser.add_argument("--steps", type=int, default=300, help="training steps per run (default: 300)")
    parser.add_argument("--device", default="cpu", help='where to train: "cpu", "cpu:1", "gpu", … (default: cpu)')
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--compiled", dest="mode", action="store_const", const="compiled", help="train with the compiled backward (and the jax.jit reference) only")
    which.add_argument("--eager", dest="mode", action="store_const", const="eager", help="train eagerly (and the jax.jit reference) only")
    parser.add_argument("--profile", nargs="?", const="xgrad_demo_trace.json", default=None, metavar="PATH",
                        help="also profile a few backward steps and write a Chrome/Perfetto trace (default PATH: %(const)s)")
    args = parser.parse_args(argv)
    if args.steps <= WARMUP_STEPS:
        parser.error(f"--steps must be more than {WARMUP_STEPS} (the warm-up steps), got {args.steps}")
    try:
        device = resolve_device(args.device)
    except RuntimeError as exc:
        parser.error(str(exc))
    modes = {"eager": [False], "compiled": [True], None: [False, True]}[args.mode]

    batches = make_batches(device)
    print(f"xgrad {xgrad.__version__} demo: MLP {'-'.join(map(str, SIZES))} on {NUM_POINTS} spiral points, "
          f"batch {BATCH}, {args.steps} steps on {device}")
    init = make_model(device).state_dict()
    ok = True

    if len(modes) == 2:
        model = make_model(device)
        eager_grads = first_step_grads(model, batches[0], compiled=False)
        compiled_grads = first_step_grads(model, batches[0], compiled=True)
        jax_grads = [np.asarray(g) for g in jax.grad(jax_loss)([p.array for p in model.parameters()], *batches[0])]
        grads_agree = all(np.allclose(a, b, rtol=GRAD_RTOL, atol=GRAD_ATOL) for a, b in zip(eager_grads, compiled_grads, strict=True))
        print(f"first-step gradients: max |eager - compiled| = {_max_diff(eager_grads, compiled_grads):.2e}, "
              f"max |eager - jax.grad| = {_max_diff(eager_grads, jax_grads):.2e}")
        ok &= grads_agree

    runs = []
    stats = None
    for compiled in modes:
        model = make_model(device)
        model.load_state_dict(init)
        if compiled:
            from xgrad.autograd import compiled as compiled_backward

            compiled_backward.reset()
        runs.append(train_xgrad(model, batches, args.steps, compiled))
        if compiled:
            stats = compiled_backward.stats()
    step_stats = None
    if len(modes) == 2:
        model = make_model(device)
        model.load_state_dict(init)
        run, step_stats = train_xgrad_compile(model, batches, args.steps)
        runs.append(run)
    runs.append(train_jax([t.array for t in make_model(device).parameters()], batches, args.steps))

    print()
    print(_table(runs))
    if stats is not None:
        print(f"compiled backward: {stats['compiles']} compile(s) in {stats['compile_seconds']:.2f} s, "
              f"{stats['hits']} cache hits, {stats['misses']} misses, {sum(stats['fallbacks'].values())} eager fallbacks")
    if len(modes) == 2:
        eager_losses, compiled_losses = runs[0].losses, runs[1].losses
        loss_diff = float(np.max(np.abs(eager_losses - compiled_losses)))
        losses_agree = loss_diff <= LOSS_TOL * (1 + float(np.max(np.abs(eager_losses))))
        print(f"eager vs compiled losses over {args.steps} steps: max difference {loss_diff:.2e}")
        ok &= losses_agree
        step_diff = float(np.max(np.abs(eager_losses - runs[2].losses)))
        print(f"eager vs xgrad.compile losses over {args.steps} steps: max difference {step_diff:.2e} "
              f"({step_stats['compiles']} compile(s) in {step_stats['compile_seconds']:.2f} s, "  # type: ignore[index]
              f"{step_stats['hits']} cache hits)")  # type: ignore[index]
        ok &= step_diff <= LOSS_TOL * (1 + float(np.max(np.abs(eager_losses))))
        print("eager and compiled agree" if ok else "MISMATCH: eager and compiled disagree")
    if args.profile:
        profile_model = make_model(device)
        _profile(profile_model, batches, modes, args.profile)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
