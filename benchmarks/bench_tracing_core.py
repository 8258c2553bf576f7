"""Toward one tracing core: the numbers that choose how ``backward(compiled=True)`` runs hooks.

Today the compiled backward splits its program at each hook that is not pure (segments, and the
host runs the hook between them); ``xgrad.compile`` instead traces the eager engine and reaches
the host through an ordered ``io_callback`` per hook. Four comparisons:

1. ``--hooks``: k hooks in a chain of k+1 ``tanh(h @ w)`` layers, in JAX alone: one program and
   no hook; k+1 programs with the host call between (the split); one program with an ordered
   ``io_callback`` per hook (a hook whose result flows on) or an ordered ``jax.debug.callback``
   (an observer). Then the same through xgrad: eager, ``backward(compiled=True)`` and an
   ``xgrad.compile`` step (forward and backward), each with k hooks that are not pure and with
   none; what a hook adds, per hook.
2. ``--miss``: a chain of N one-element multiplies: the miss of ``backward(compiled=True)``
   (chunked) against the eager engine traced under ``jax.jit`` as one program: the trace
   (forward alone, and forward with backward), then XLA's compile.
3. ``--reentrant``: a backward that runs a backward of its own (``checkpoint(use_reentrant=True)``
   around two blocks of an MLP): eager, compiled backward, ``xgrad.compile``.
4. ``--create-graph``: a gradient penalty (``grad(loss, w, create_graph=True)``, then backward
   through it): eager, compiled backward, ``xgrad.compile``.

    python benchmarks/bench_tracing_core.py                # all four, ~5 min on 2 CPU cores
    python benchmarks/bench_tracing_core.py --hooks --rounds 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _timing import mul_chain, table
from jax.experimental import io_callback

import xgrad
from xgrad.autograd import compiled
from xgrad.utils.checkpoint import checkpoint

WIDTH = 256
BATCH = 64


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}"


def _both(pair: tuple[float, float]) -> str:
    """``median (best)`` in µs."""
    return f"{_us(pair[0])} ({_us(pair[1])})"


def interleaved(timers: dict[str, Callable[[], float]], rounds: int, warmup: int = 3) -> dict[str, tuple[float, float]]:
    """``(median, best)`` seconds of each timer, taken in turns whose order rotates every round.

    Both, because on a loaded machine a program's wait is bimodal: a jitted call with no host
    callback took 0.39 ms at best and 7 ms at the median (its waiting thread descheduled), one
    with a callback 0.97 and 1.1 ms. The best is the mechanism's own cost; the median, what load adds.
    """
    names = list(timers)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds + warmup):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            seconds = timers[name]()
            if i >= warmup:
                times[name].append(seconds)
    return {name: (statistics.median(times[name]), min(times[name])) for name in names}


def _largest_difference(results: dict[str, list[Any]]) -> str:
    """How far each way's gradients are from the first way's (eager): the largest difference, relative to the largest gradient."""
    (first, reference), *others = results.items()
    parts = []
    for name, grads in others:
        gap = max(float(jnp.abs(g.array - r.array).max() / jnp.abs(r.array).max()) for g, r in zip(grads, reference, strict=True))
        parts.append(f"{name} {gap:.1e}")
    return f"largest |grad - {first}'s| / max |{first}'s|: " + ", ".join(parts)


def _counts(stats: dict[str, Any]) -> str:
    """The counters of a ``stats()`` dict, without its reasons."""
    return ", ".join(f"{k} {v}" for k, v in stats.items() if isinstance(v, int))


def _timed(fn: Callable[[], Any]) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        jax.block_until_ready(fn())
        return time.perf_counter() - start

    return run


# -- 1. hooks: segment split against an ordered host call per hook ------------------------------


def jax_hook_rows(hooks: int, rounds: int) -> list[tuple[str, ...]]:
    """k hooks between k+1 layers, in JAX alone: split, ``io_callback`` and ``debug.callback``; then the gradient
    of that chain with an ordered ``io_callback`` per hook in its backward (a ``custom_vjp`` identity), the raw
    cost of what a hook that is not pure costs an ``xgrad.compile`` step (its rows below)."""
    seen: list[float] = []

    def host_hook(g: Any) -> Any:
        seen.append(float(np.asarray(g).ravel()[0]))
        return np.asarray(g)

    def observe(g: Any) -> None:
        seen.append(float(np.asarray(g).ravel()[0]))

    x = jnp.ones((BATCH, WIDTH), jnp.float32)
    ws = [jnp.eye(WIDTH, dtype=jnp.float32) * 0.5 for _ in range(hooks + 1)]  # arguments of every program, never constants

    def layer(h: Any, w: Any) -> Any:
        return jnp.tanh(h @ w)

    def chain(between: Callable[[Any], Any]) -> Callable[[Any, list[Any]], Any]:
        def run(x: Any, ws: list[Any]) -> Any:
            h = layer(x, ws[0])
            for w in ws[1:]:
                h = layer(between(h), w)
            return h.sum()

        return run

    def with_io_callback(h: Any) -> Any:
        return io_callback(host_hook, jax.ShapeDtypeStruct(h.shape, h.dtype), h, ordered=True)

    def with_debug_callback(h: Any) -> Any:
        jax.debug.callback(observe, h, ordered=True)
        return h

    no_hook = jax.jit(chain(lambda h: h))
    io_program = jax.jit(chain(with_io_callback))
    debug_program = jax.jit(chain(with_debug_callback))
    middle = jax.jit(layer)
    last = jax.jit(lambda h, w: layer(h, w).sum())

    def split() -> Any:
        h = middle(x, ws[0])
        for w in ws[1:-1]:
            h = middle(jnp.asarray(host_hook(h)), w)
        return last(jnp.asarray(host_hook(h)), ws[-1])

    @jax.custom_vjp
    def on_host_in_backward(h: Any) -> Any:
        return h

    on_host_in_backward.defvjp(lambda h: (h, None), lambda _, g: (with_io_callback(g),))

    def grad_of(between: Callable[[Any], Any]) -> Any:
        return jax.jit(jax.grad(lambda ws, x: chain(between)(x, ws)))

    grad_no_hook, grad_io = grad_of(lambda h: h), grad_of(on_host_in_backward)
    medians = interleaved({
        "no hook": _timed(lambda: no_hook(x, ws)),
        "split": _timed(split),
        "io_callback": _timed(lambda: io_program(x, ws)),
        "debug.callback": _timed(lambda: debug_program(x, ws)),
        "grad, no hook": _timed(lambda: grad_no_hook(ws, x)),
        "grad, io_callback in the backward": _timed(lambda: grad_io(ws, x)),
    }, rounds)
    rows = []
    for name, s in medians.items():
        base = medians["grad, no hook" if name.startswith("grad") else "no hook"][1]
        per_hook = "" if name.endswith("no hook") else _us((s[1] - base) / hooks)
        rows.append((f"JAX, {hooks} hook(s): {name}", _both(s), f"{s[1] / base:.2f}x", per_hook))
    return rows


def _xgrad_chain(hooks: int, with_hooks: bool) -> tuple[Callable[[], Any], list[xgrad.Tensor]]:
    """The same chain through xgrad: leaves ``ws``, a hook on each of k intermediates, its result flowing on, marked
    ``host_hook`` (unmarked, ``g -> g`` would be traced in: NOTE [Hooks traced in])."""
    ws = [xgrad.tensor(np.eye(WIDTH, dtype=np.float32) * 0.5, requires_grad=True) for _ in range(hooks + 1)]
    x = xgrad.ones(BATCH, WIDTH)

    def host_hook(g: xgrad.Tensor) -> xgrad.Tensor:
        return g

    def loss() -> xgrad.Tensor:
        h = (x @ ws[0]).tanh()
        for w in ws[1:]:
            if with_hooks:
                h.register_hook(compiled.host_hook(host_hook))
            h = (h @ w).tanh()
        return h.sum()

    return loss, ws


def xgrad_hook_rows(hooks: int, rounds: int) -> list[tuple[str, ...]]:
    timers = {}
    for with_hooks in (False, True):
        tag = f"{hooks} hook(s)" if with_hooks else "no hook"
        loss, ws = _xgrad_chain(hooks, with_hooks)

        def backward(loss: Callable[[], Any] = loss, ws: list[Any] = ws, flag: bool = False) -> Callable[[], float]:
            def run() -> float:
                for w in ws:
                    w.grad = None
                value = loss()
                jax.block_until_ready(value.array)
                start = time.perf_counter()
                value.backward(compiled=flag)
                jax.block_until_ready([w.grad.array for w in ws])
                return time.perf_counter() - start

            return run

        def step(loss: Callable[[], Any] = loss, ws: list[Any] = ws) -> list[Any]:
            for w in ws:
                w.grad = None
            loss().backward()
            return [w.grad for w in ws]

        stepped = xgrad.compile(step)
        timers[f"eager backward, {tag}"] = backward()
        timers[f"backward(compiled=True), {tag}"] = backward(flag=True)
        timers[f"xgrad.compile step (forward + backward), {tag}"] = _timed(lambda stepped=stepped: [g.array for g in stepped()])
    medians = interleaved(timers, rounds)
    rows = []
    for name, s in medians.items():
        base = medians[name.replace(f"{hooks} hook(s)", "no hook")][1]
        per_hook = "" if "no hook" in name else _us((s[1] - base) / hooks)
        rows.append((f"xgrad: {name}", _both(s), f"{s[1] / base:.2f}x", per_hook))
    return rows


# -- 2. misses on long chains: chunked against the eager engine traced once ----------------------


def _trace(n: int) -> tuple[float, float, float, Any]:
    """Seconds to trace the chain's forward and its eager backward on tracers under ``jax.jit``
    (timed inside the trace), to lower the program to StableHLO, and the lowered program: traced
    afresh, as JAX caches traces per function."""
    spent: list[float] = []

    def forward_and_backward(a: Any) -> Any:
        start = time.perf_counter()
        leaf = xgrad.Tensor(a, requires_grad=True)
        loss = mul_chain(leaf, n)
        middle = time.perf_counter()
        loss.backward()
        spent[:] = [middle - start, time.perf_counter() - middle]
        return leaf.grad.array

    start = time.perf_counter()
    lowered = jax.jit(forward_and_backward).lower(jnp.asarray([0.5]))
    lowering = time.perf_counter() - start - sum(spent)
    return spent[0], spent[1], lowering, lowered


def miss_rows(sizes: tuple[int, ...]) -> list[tuple[str, ...]]:
    """The traced figures are the best of three traces (the machine is shared), after a warm-up at N=10."""
    x = xgrad.tensor([0.5], requires_grad=True)
    mul_chain(x, 10).backward(compiled=True)  # the process's first compiled backward jits the rules
    rows = []
    for n in (10, *sizes):
        compiled.reset()
        x.grad = None
        loss = mul_chain(x, n)
        start = time.perf_counter()
        loss.backward(compiled=True)
        jax.block_until_ready(x.grad.array)
        chunked = time.perf_counter() - start
        stats = compiled.stats()
        traces = [_trace(n) for _ in range(3)]
        trace_forward = min(t[0] for t in traces)
        trace_backward = min(t[1] for t in traces)
        lowering = min(t[2] for t in traces)
        start = time.perf_counter()
        traces[0][3].compile()
        compile_seconds = time.perf_counter() - start
        if n == 10:
            continue
        rows.append((
            str(n), f"{chunked:.2f}", f"{stats.get('chunk_compiles', 0)} / {stats.get('chunk_reuses', 0)}",
            f"{trace_forward:.2f}", f"{trace_backward:.2f}", f"{trace_backward / n * 1e6:.0f}", f"{lowering:.2f}",
            f"{compile_seconds:.2f}", f"{trace_backward + lowering + compile_seconds:.2f}",
        ))
    return rows


# -- 3. a backward inside a backward --------------------------------------------------------------


def _mlp(rng: np.random.Generator) -> list[xgrad.Tensor]:
    return [xgrad.tensor(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) / 16, requires_grad=True) for _ in range(4)]


def reentrant_rows(rounds: int) -> list[tuple[str, ...]]:
    ws = _mlp(np.random.default_rng(0))
    x = xgrad.ones(BATCH, WIDTH)

    def block(h: xgrad.Tensor, w1: xgrad.Tensor, w2: xgrad.Tensor) -> xgrad.Tensor:
        return ((h @ w1).tanh() @ w2).tanh()

    def loss(reentrant: bool) -> xgrad.Tensor:
        h = x
        for w1, w2 in (ws[:2], ws[2:]):
            h = checkpoint(block, h, w1, w2, use_reentrant=True) if reentrant else block(h, w1, w2)
        return h.sum()

    def step(reentrant: bool) -> list[Any]:
        for w in ws:
            w.grad = None
        loss(reentrant).backward()
        return [w.grad for w in ws]

    def backward(reentrant: bool, flag: bool) -> Callable[[], float]:
        def run() -> float:
            for w in ws:
                w.grad = None
            value = loss(reentrant)
            jax.block_until_ready(value.array)
            start = time.perf_counter()
            value.backward(compiled=flag)
            jax.block_until_ready([w.grad.array for w in ws])
            return time.perf_counter() - start

        return run

    plain_step, reentrant_step = xgrad.compile(lambda: step(False)), xgrad.compile(lambda: step(True))

    def grads_of(run: Callable[[], float]) -> list[Any]:
        run()
        return [xgrad.Tensor(w.grad.array) for w in ws]

    print(_largest_difference({
        "eager": grads_of(backward(True, False)),
        "compiled backward": grads_of(backward(True, True)),
        "xgrad.compile": [xgrad.Tensor(g.array) for g in reentrant_step()],
        "eager without checkpoint": grads_of(backward(False, False)),
    }))
    timers = {
        "eager backward, no checkpoint": backward(False, False),
        "eager backward, reentrant checkpoint": backward(True, False),
        "backward(compiled=True), no checkpoint": backward(False, True),
        "backward(compiled=True), reentrant checkpoint": backward(True, True),
        "xgrad.compile step, no checkpoint": _timed(lambda: [g.array for g in plain_step()]),
        "xgrad.compile step, reentrant checkpoint": _timed(lambda: [g.array for g in reentrant_step()]),
    }
    medians = interleaved(timers, rounds)
    print(f"compiled backward: {_counts(compiled.stats())}; the reentrant xgrad.compile step: {_counts(reentrant_step.stats())}")
    return [(name, _both(s)) for name, s in medians.items()]


# -- 4. create_graph ------------------------------------------------------------------------------


def create_graph_rows(rounds: int) -> list[tuple[str, ...]]:
    ws = _mlp(np.random.default_rng(1))[:2]
    x = xgrad.ones(BATCH, WIDTH)

    def penalty_step(flag: bool | None) -> list[Any]:
        for w in ws:
            w.grad = None
        loss = ((x @ ws[0]).tanh() @ ws[1]).tanh().sum()
        grads = xgrad.autograd.grad(loss, ws, create_graph=True, compiled=flag)
        total = loss + sum((g * g).sum() for g in grads)
        total.backward(compiled=flag)
        return [w.grad for w in ws]

    stepped = xgrad.compile(lambda: penalty_step(None))
    print(_largest_difference({
        "eager": [xgrad.Tensor(g.array) for g in penalty_step(False)],
        "compiled backwards": [xgrad.Tensor(g.array) for g in penalty_step(True)],
        "xgrad.compile": [xgrad.Tensor(g.array) for g in stepped()],
    }))
    medians = interleaved({
        "eager (forward, grad with create_graph, backward)": _timed(lambda: [g.array for g in penalty_step(False)]),
        "compiled backwards (both)": _timed(lambda: [g.array for g in penalty_step(True)]),
        "xgrad.compile step": _timed(lambda: [g.array for g in stepped()]),
    }, rounds)
    print(f"compiled backward: {_counts(compiled.stats())}; xgrad.compile step: {_counts(stepped.stats())}")
    return [(name, _both(s)) for name, s in medians.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hooks", action="store_true")
    parser.add_argument("--miss", action="store_true")
    parser.add_argument("--reentrant", action="store_true")
    parser.add_argument("--create-graph", action="store_true")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--sizes", default="1000,3000,10000", help="chain lengths for --miss")
    parser.add_argument("--hook-counts", default="1,4,16", help="hooks per backward for --hooks")
    args = parser.parse_args()
    every = not (args.hooks or args.miss or args.reentrant or args.create_graph)
    warnings.simplefilter("ignore", compiled.CompiledFallbackWarning)
    warnings.simplefilter("ignore", compiled.RecompileWarning)
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPUs; load average "
          f"{os.getloadavg()[0]:.1f}; {args.rounds} interleaved rounds, µs as median (best); ratios and per-hook costs "
          "from the best\n")
    if every or args.hooks:
        rows = []
        for k in map(int, args.hook_counts.split(",")):
            rows += jax_hook_rows(k, args.rounds) + xgrad_hook_rows(k, args.rounds)
        print(f"Hooks that are not pure, {BATCH}x{WIDTH} activations\n")
        print(table(rows, ("how", "µs", "vs no hook (best)", "µs per hook (best)")) + "\n")
    if every or args.miss:
        print("Miss on a chain of N one-element multiplies: today's chunked compiled backward, the eager engine traced once\n")
        print(table(miss_rows(tuple(map(int, args.sizes.split(",")))), (
            "N", "chunked miss s", "chunks compiled / reused", "trace forward s", "trace backward s",
            "µs / node (backward trace)", "lower s", "XLA compile s", "one traced program s (backward trace + lower + compile)",
        )) + "\n")
    if every or args.reentrant:
        compiled.reset()
        print(f"A backward inside a backward: checkpoint(use_reentrant=True) around 2 blocks of a {WIDTH}-wide MLP\n")
        print(table(reentrant_rows(args.rounds), ("how", "µs")) + "\n")
    if every or args.create_graph:
        compiled.reset()
        print(f"create_graph: a gradient penalty on a 2-layer {WIDTH}-wide MLP\n")
        print(table(create_graph_rows(args.rounds), ("how", "µs")) + "\n")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
