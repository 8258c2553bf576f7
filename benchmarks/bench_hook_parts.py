"""The demo step under ``xgrad.compile`` with six observer hooks against the same step without: the ratio in wall
time and in the calling thread's CPU, then where the hooked step's thread CPU goes.

1. Both steps in one process, taking turns round after round (``--rounds`` rounds of 10 steps, each round ending
   when its last loss and parameter are ready), medians per step: wall time, and ``time.thread_time`` of the
   calling thread, which the load of a shared machine disturbs least.
2. Each step alone for ``--steps`` steps with a timer around each part of a call (the guards, the jitted call, the
   observer hooks, the write-back and results; each timer adds ~0.3 µs), per step.

The hooks are ``p.register_hook(lambda g: norms.append(g.norm()))``, one per parameter, as in ``bench_hooks.py``.

    python benchmarks/bench_hook_parts.py             # ~1 min on 2 CPU cores
    python benchmarks/bench_hook_parts.py --rounds 300 --steps 5000
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
from _timing import table, xgrad_demo_step

import xgrad
import xgrad.compile_step.program as program
from xgrad import demo

STEPS_PER_ROUND = 10


def _step(device: Any, hooks: bool) -> tuple[Any, list[Any], list[Any]]:
    """The compiled demo step on a fresh model and Adam, with six observer hooks or none; its parameters and norms."""
    demo_step = xgrad_demo_step(device, hooks)
    return xgrad.compile(demo_step.step), demo_step.params, demo_step.norms


def _ratio(steps: dict[str, Any], batches: list[Any], rounds: int) -> dict[str, tuple[float, float]]:
    """Median wall and thread CPU µs per step of each step, taking turns."""
    wall: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    position = 0
    for i in range(rounds + 3):
        for name, (step, params, norms) in steps.items():
            jax.block_until_ready(params[-1].array)
            start, start_cpu = time.perf_counter(), time.thread_time()
            for k in range(STEPS_PER_ROUND):
                norms.clear()
                loss = step(*batches[(position + k) % len(batches)])
            end_cpu = time.thread_time()
            jax.block_until_ready((loss.array, params[-1].array))
            end = time.perf_counter()
            if i >= 3:
                wall[name].append((end - start) / STEPS_PER_ROUND * 1e6)
                cpu[name].append((end_cpu - start_cpu) / STEPS_PER_ROUND * 1e6)
        position += STEPS_PER_ROUND
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in steps}


def _timed(name: str, fn: Callable[..., Any], spent: dict[str, float]) -> Callable[..., Any]:
    def timed(*args: Any) -> Any:
        start = time.thread_time()
        try:
            return fn(*args)
        finally:
            spent[name] += time.thread_time() - start

    return timed


def _parts(step: Any, norms: list[Any], batches: list[Any], n: int) -> dict[str, float]:
    """Thread CPU µs per step of each part of ``n`` hooked calls (the observer variant's path)."""
    spent: dict[str, float] = collections.defaultdict(float)
    entry = next(iter(step._cache.values()))
    variant = entry.observing
    saved = program.run_observers, program.finish, program.CompiledFunction._guards_hold, variant.jitted
    program.run_observers = _timed("the six hooks (run_observers)", program.run_observers, spent)
    program.finish = _timed("write-back and results (finish)", program.finish, spent)
    program.CompiledFunction._guards_hold = staticmethod(_timed("guards", program.CompiledFunction._guards_hold, spent))
    variant.jitted = _timed("the jitted call", variant.jitted, spent)
    try:
        start = time.thread_time()
        for i in range(n):
            norms.clear()
            step(*batches[i % len(batches)])
        total = time.thread_time() - start
    finally:
        program.run_observers, program.finish, guards_hold, variant.jitted = saved
        program.CompiledFunction._guards_hold = staticmethod(guards_hold)
    return {name: seconds / n * 1e6 for name, seconds in spent.items()} | {"total": total / n * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--steps", type=int, default=3000, help="hooked steps timed part by part")
    args = parser.parse_args()
    device = jax.devices()[0]
    batches = demo.make_batches(device)
    steps = {"no hooks": _step(device, hooks=False), "6 observer hooks": _step(device, hooks=True)}
    load = os.getloadavg()[0]
    medians = _ratio(steps, batches, args.rounds)
    (plain_wall, plain_cpu), (hooked_wall, hooked_cpu) = medians.values()
    print(f"jax {jax.__version__}, backend {jax.default_backend()}; medians of {args.rounds} interleaved rounds of "
          f"{STEPS_PER_ROUND} steps; load average {load:.2f} before, {os.getloadavg()[0]:.2f} after\n")
    print(table(
        [(name, f"{wall:.1f}", f"{cpu:.1f}") for name, (wall, cpu) in medians.items()]
        + [("no hooks / hooks", f"{plain_wall / hooked_wall:.3f}x", f"{plain_cpu / hooked_cpu:.3f}x")],
        ("demo MLP step, xgrad.compile", "wall µs/step", "thread CPU µs/step"),
    ))
    hooked, _, norms = steps["6 observer hooks"]
    parts = _parts(hooked, norms, batches, args.steps)
    print(f"\n{args.steps} hooked steps, a timer around each part; load average {os.getloadavg()[0]:.2f}\n")
    print(table([(name, f"{us:.1f}") for name, us in parts.items()], ("part", "thread CPU µs/step")))


if __name__ == "__main__":
    main()
