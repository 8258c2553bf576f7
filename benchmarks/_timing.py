"""Shared helpers for the benchmarks: medians of many repeats, tables, the chain workload, the demo step in xgrad and in JAX."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, NamedTuple


def median_seconds(fn: Callable[[], object], repeats: int = 30, warmup: int = 3) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs (after ``warmup`` runs)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved(timers: dict[str, Callable[[], float]], repeats: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds of each timer (each returns the seconds it measured), taken in turns
    so that load on the shared machine hits them all alike."""
    times: dict[str, list[float]] = {name: [] for name in timers}
    for i in range(repeats + warmup):
        for name, timer in timers.items():
            seconds = timer()
            if i >= warmup:
                times[name].append(seconds)
    return {name: statistics.median(t) for name, t in times.items()}


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    """A GitHub-markdown table."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def mul_chain(x: Any, n: int) -> Any:
    """The chain workload: ``n`` elementwise multiplies of a 1-element tensor, then a sum."""
    y = x
    for _ in range(n):
        y = y * 1.0001
    return y.sum()


class DemoStep(NamedTuple):
    """The demo step in xgrad (eager: wrap ``step`` in ``xgrad.compile``), its model's parameters, its optimizer, and the
    norms its observer hooks append (empty without hooks)."""

    step: Callable[[Any, Any], Any]
    params: list[Any]
    opt: Any
    norms: list[Any]


def xgrad_demo_step(device: Any, hooks: bool = False) -> DemoStep:
    """The demo step (Adam) on a model of its own; with ``hooks``, six observer hooks, one per parameter, append each
    gradient's norm to ``norms``."""
    import xgrad
    from xgrad import demo

    model = demo.make_model(device)
    opt = xgrad.optim.Adam(model.parameters(), lr=1e-3)
    norms: list[Any] = []
    if hooks:
        for p in model.parameters():
            p.register_hook(lambda g: norms.append(g.norm()))

    def step(x: Any, y: Any) -> Any:
        opt.zero_grad()
        loss = xgrad.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return DemoStep(step, list(model.parameters()), opt, norms)


def jit_optax_demo_step(device: Any) -> tuple[Callable[[Any, Any], Any], dict[str, Any]]:
    """The demo step as ``jax.jit(value_and_grad)`` + optax's Adam on a model of its own: the floor xgrad is measured
    against, and its state (``"params"``, ``"opt"``). Each call takes a batch ``(x, y)``, updates the state and returns
    the loss."""
    import jax
    import optax

    from xgrad import demo

    tx = optax.adam(1e-3)
    state = {"params": [p.array for p in demo.make_model(device).parameters()]}
    state["opt"] = tx.init(state["params"])

    @jax.jit
    def jit_step(params: Any, opt_state: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(demo.jax_loss)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def run_jit(x: Any, y: Any) -> Any:
        state["params"], state["opt"], loss = jit_step(state["params"], state["opt"], x, y)
        return loss

    return run_jit, state
