"""``xgrad.compile`` against ``jax.jit``, and the same compiled step with observer hooks.

The demo MLP (2-64-64-3, tanh, batch 128, cross-entropy, Adam, float32), stepped over
the demo's batches in turn as:

1. ``jax.jit`` of ``jax.value_and_grad`` plus ``optax.adam`` in one program (the floor);
2. an ``xgrad.compile`` step (``zero_grad``, forward, ``backward()``, ``step()``), and its
   program alone (the jitted call, without the per-call Python around it, fed the state it
   wrote at its last call, as the step feeds it);
3. the same compiled step with one observer hook per parameter
   (``p.register_hook(lambda g: norms.append(g.norm()))``, six in all);
4. that step eagerly, hooks and all;
5. the hooks' own Python: the six hook calls on concrete gradients, without any step.

Each timer runs a few steps and ends when the last loss and parameter are ready (with
``--sync``, each step does); the
timers take turns round after round (so load on the shared machine hits them alike) and
the medians are printed with the ratios the targets name.

    python benchmarks/bench_hooks.py            # ~1 min on 2 CPU cores
    python benchmarks/bench_hooks.py --sync
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import jax
from _timing import interleaved, jit_optax_demo_step, table, xgrad_demo_step

import xgrad
from xgrad import demo
from xgrad.compile_step.program_call import gather_inputs

STEPS_PER_ROUND = 10


def _timer(
    run_step: Callable[[Any, Any], Any], last_param: Callable[[], Any], batches: list[Any], steps: int, sync: bool
) -> Callable[[], float]:
    """Seconds per step of ``steps`` steps; with ``sync``, each waited for, so no step's Python overlaps its program."""
    position = [0]

    def timed() -> float:
        start = time.perf_counter()
        for _ in range(steps):
            x, y = batches[position[0] % len(batches)]
            position[0] += 1
            loss = run_step(x, y)
            if sync:
                jax.block_until_ready((loss, last_param()))
        jax.block_until_ready((loss, last_param()))
        return (time.perf_counter() - start) / steps

    return timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--sync", action="store_true", help="wait for each step's results before the next")
    args = parser.parse_args()
    device = jax.devices()[0]
    batches = demo.make_batches(device)

    compiled_fn, compiled_params, _, _ = xgrad_demo_step(device)
    compiled = xgrad.compile(compiled_fn)
    hooked_fn, hooked_params, _, norms = xgrad_demo_step(device, hooks=True)
    hooked = xgrad.compile(hooked_fn)
    eager_fn, eager_params, _, eager_norms = xgrad_demo_step(device, hooks=True)

    run_jit, state = jit_optax_demo_step(device)

    def run_compiled(x: Any, y: Any) -> Any:
        return compiled(x, y).array

    def run_hooked(x: Any, y: Any) -> Any:
        norms.clear()
        return hooked(x, y).array

    def run_eager(x: Any, y: Any) -> Any:
        eager_norms.clear()
        return eager_fn(x, y).array

    # Its program alone, on a model of its own: the state it replaces is donated, so each call
    # takes the outputs that replaced it at the last one, as the step's write-back does.
    alone_fn, alone_params, _, _ = xgrad_demo_step(device)
    alone = xgrad.compile(alone_fn)
    alone(*batches[0])
    entry = next(iter(alone._cache.values()))
    program_inputs = gather_inputs(entry, list(batches[0]))
    del alone_params

    def run_program_alone(x: Any, y: Any) -> Any:
        outs = entry.jitted(*program_inputs[:-2], x, y)
        if entry.in_order is not None:
            outs = entry.in_order(outs)
        for position, _, _, index in entry.donated:
            program_inputs[position] = outs[index]
        return outs[entry.result_template[0][1]]

    grads = [xgrad.Tensor(p.array) for p in hooked_params]
    hook_fns = [hook for p in hooked_params for _, hook in p._backward_hooks.values()]

    def run_hooks_alone(x: Any, y: Any) -> Any:
        norms.clear()
        for hook, g in zip(hook_fns, grads, strict=True):
            hook(g)
        return norms[-1].array

    timers = {
        "jax.jit(value_and_grad) + optax": _timer(run_jit, lambda: state["params"][-1], batches, STEPS_PER_ROUND, args.sync),
        "xgrad.compile": _timer(run_compiled, lambda: compiled_params[-1].array, batches, STEPS_PER_ROUND, args.sync),
        "xgrad.compile's program alone": _timer(run_program_alone, lambda: program_inputs[0], batches, STEPS_PER_ROUND, args.sync),
        "xgrad.compile, 6 observer hooks": _timer(run_hooked, lambda: hooked_params[-1].array, batches, STEPS_PER_ROUND, args.sync),
        "eager, 6 observer hooks": _timer(run_eager, lambda: eager_params[-1].array, batches, 2, args.sync),
        "the 6 hooks' own Python alone": _timer(run_hooks_alone, lambda: hooked_params[-1].array, batches, STEPS_PER_ROUND, args.sync),
    }
    load = os.getloadavg()
    medians = interleaved(timers, repeats=args.rounds)
    load_after = os.getloadavg()
    us = {name: seconds * 1e6 for name, seconds in medians.items()}
    jit_us, compiled_us, program_us, hooked_us = (us[k] for k in list(timers)[:4])
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPUs; medians of {args.rounds} "
          f"interleaved rounds of {STEPS_PER_ROUND} steps{', each waited for' if args.sync else ''}; load average {load[0]:.2f} before, {load_after[0]:.2f} after\n")
    print(table([(name, f"{value:.1f}") for name, value in us.items()], ("demo MLP step", "µs/step")))
    print()
    print(table([
        ("xgrad.compile vs jax.jit (jit time / compile time)", f"{jit_us / compiled_us:.2f}x", ">= 1.0x"),
        ("xgrad.compile's program alone vs jax.jit", f"{jit_us / program_us:.2f}x", ""),
        ("6 observer hooks vs none (no hooks / hooks)", f"{compiled_us / hooked_us:.2f}x", ">= 0.85x"),
        ("6 hooks, compiled vs eager (eager / compiled)", f"{us['eager, 6 observer hooks'] / hooked_us:.2f}x", ""),
    ], ("ratio", "measured", "target")))
    print(f"\ncompile stats: {compiled.stats()}; with hooks: {hooked.stats()}")


if __name__ == "__main__":
    main()
