"""The hit path of ``xgrad.compile`` against ``jax.jit``: the demo MLP step's time and its calling thread's CPU.

The demo MLP (2-64-64-3, tanh, batch 128, cross-entropy, Adam, float32) stepped over the
demo's batches in turn as ``jax.jit`` of ``jax.value_and_grad`` plus ``optax.adam`` (the
floor), as an ``xgrad.compile`` step, and as that step's program alone (its jitted call
fed the state it wrote at its last call, without the Python around it). Three measures,
each taken in turns round after round so that load on a shared machine hits all alike,
medians of the rounds:

- ``pipelined``: rounds of 10 steps, waited for at the end (a loop that never reads its loss);
- ``synced``: each step waited for (``bench_step.py``'s measure);
- ``thread CPU``: the calling thread's CPU per step (``time.thread_time``), the Python and
  dispatch each step costs, which other jobs on the machine disturb least.

    python benchmarks/bench_hit_path.py            # ~1 min on 2 CPU cores
    python benchmarks/bench_hit_path.py --rounds 300
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
from _timing import jit_optax_demo_step, table, xgrad_demo_step

import xgrad
from xgrad import demo
from xgrad.compile_step.program_call import gather_inputs

STEPS_PER_ROUND = 10


def _compiled_demo_step(device: Any) -> Any:
    """The demo step (Adam) under ``xgrad.compile``, on a model of its own."""
    return xgrad.compile(xgrad_demo_step(device).step, fallback="error")


def _steps(device: Any) -> dict[str, Callable[[Any, Any], Any]]:
    """The three ways of stepping, each on a model of its own; each returns its step's loss as an array."""
    compiled = _compiled_demo_step(device)
    alone = _compiled_demo_step(device)
    x, y = demo.make_batches(device)[0]
    alone(x, y)
    entry = next(iter(alone._cache.values()))
    program_inputs = gather_inputs(entry, [x, y])

    def run_program_alone(x: Any, y: Any) -> Any:
        # The state it replaces is donated: each call takes the outputs that replaced it at the last one.
        outs = entry.jitted(*program_inputs[:-2], x, y)
        if entry.in_order is not None:
            outs = entry.in_order(outs)
        for position, _, _, index in entry.donated:
            program_inputs[position] = outs[index]
        return outs[entry.result_template[0][1]]

    run_jit, _ = jit_optax_demo_step(device)

    return {
        "jax.jit(value_and_grad) + optax": run_jit,
        "xgrad.compile": lambda x, y: compiled(x, y).array,
        "xgrad.compile's program alone": run_program_alone,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=150)
    args = parser.parse_args()
    device = jax.devices()[0]
    batches = demo.make_batches(device)
    steps = _steps(device)
    measures = ("pipelined", "synced", "thread CPU")
    times: dict[tuple[str, str], list[float]] = {(m, name): [] for m in measures for name in steps}
    position = 0
    for round_ in range(args.rounds + 3):
        for measure in measures:
            for name, run in steps.items():
                clock = time.thread_time if measure == "thread CPU" else time.perf_counter
                start = clock()
                for _ in range(STEPS_PER_ROUND):
                    x, y = batches[position % len(batches)]
                    position += 1
                    loss = run(x, y)
                    if measure == "synced":
                        jax.block_until_ready(loss)
                seconds = (clock() - start) / STEPS_PER_ROUND
                jax.block_until_ready(loss)
                if round_ >= 3:  # warm-up rounds
                    times[(measure, name)].append(seconds)
    medians = {key: statistics.median(values) * 1e6 for key, values in times.items()}
    print(f"{args.rounds} interleaved rounds of {STEPS_PER_ROUND} steps; µs per step\n")
    rows = [(name, *(f"{medians[(m, name)]:.1f}" for m in measures)) for name in steps]
    print(table(rows, ("demo MLP step", *measures)))
    floor, compiled = "jax.jit(value_and_grad) + optax", "xgrad.compile"
    ratios = [(m, f"{medians[(m, floor)] / medians[(m, compiled)]:.2f}x") for m in measures]
    print()
    print(table(ratios, ("xgrad.compile vs jax.jit (jit / compile)", "ratio")))


if __name__ == "__main__":
    main()
