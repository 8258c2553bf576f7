"""Cold programs: the first eager step in a fresh process, and an eager step at a batch size not seen before.

Each measurement runs in a fresh subprocess, without JAX's persistent compilation cache and with
``XLA_FLAGS`` unset (what a user's first run gets):

1. ``first eager step``: the demo model (MLP 2-64-64-3, tanh, batch 128, cross-entropy) trained
   with ``Optax(optax.adam)``; the first step's wall and CPU seconds (the step after it for scale).
2. ``new batch size``: an MLP 32-64-64-10 (ReLU, cross-entropy) trained with ``xgrad.optim.SGD`` at
   batch 64 for two steps, then one step at batch 48, never seen before (timed), then one more at 48.

Alongside each time: how many XLA programs the step compiled and the seconds JAX reports for their
backend compiles (``jax.monitoring``). ``--against DIR`` runs another checkout's ``xgrad`` in the same
turns (each run alternates the checkouts), so that load on the shared machine hits both alike;
the table shows medians over ``--runs`` fresh processes per checkout and workload.

``--programs`` profiles the new batch size's step instead: each program it compiles, with the CPU
seconds of its XLA compile (the process time from the end of its lowering to the end of its
compile, both reported by ``jax.monitoring``), and the seconds JAX reports for tracing and lowering.

    python benchmarks/bench_cold.py --runs 5
    python benchmarks/bench_cold.py --runs 5 --against /path/to/other/checkout
    python benchmarks/bench_cold.py --programs --runs 3 --against /path/to/other/checkout
    python benchmarks/bench_cold.py --programs --runs 3 --options '{"xla_backend_optimization_level": 0}'
    python benchmarks/bench_cold.py --kernels --runs 3   # what the fast compile options (and level 0) cost run time
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, cast

from _timing import table

ROOT = Path(__file__).resolve().parent.parent

PRELUDE = textwrap.dedent(
    """
    import json, time
    import jax
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **_: compiles.append(seconds) if event == "/jax/core/compile/backend_compile_duration" else None
    )
    import xgrad

    def timed(step, *args):
        del compiles[:]
        start, cpu = time.perf_counter(), time.process_time()
        params = step(*args)
        jax.block_until_ready([p.array for p in params])
        return {"s": time.perf_counter() - start, "cpu": time.process_time() - cpu, "programs": len(compiles),
                "compile_s": sum(compiles)}
    """
)

FIRST_STEP = PRELUDE + textwrap.dedent(
    """
    import optax
    from xgrad import demo
    from xgrad.optim import Optax
    device = jax.devices()[0]
    x, y = demo.make_batches(device)[0]
    model = demo.make_model(device)
    opt = Optax(model.parameters(), optax.adam(1e-2))

    def step(x, y):
        opt.zero_grad()
        xgrad.cross_entropy(model(x), y).backward()
        opt.step()
        return list(model.parameters())

    first = timed(step, xgrad.tensor(x), xgrad.tensor(y))
    second = timed(step, xgrad.tensor(x), xgrad.tensor(y))
    print(json.dumps({"step 1": first, "step 2": second}))
    """
)

NEW_BATCH_SETUP = PRELUDE + textwrap.dedent(
    """
    import numpy as np
    model = xgrad.nn.MLP([32, 64, 64, 10], key=0)
    opt = xgrad.optim.SGD(model.parameters(), lr=0.1)
    rng = np.random.default_rng(0)

    def batch(n):
        return xgrad.tensor(rng.standard_normal((n, 32)).astype(np.float32)), xgrad.tensor(rng.integers(0, 10, n).astype(np.int32))

    def step(x, y):
        opt.zero_grad()
        xgrad.cross_entropy(model(x), y).backward()
        opt.step()
        return list(model.parameters())

    for _ in range(2):
        timed(step, *batch(64))
    """
)

NEW_BATCH = NEW_BATCH_SETUP + textwrap.dedent(
    """
    new = timed(step, *batch(48))
    again = timed(step, *batch(48))
    print(json.dumps({"new batch": new, "same batch again": again}))
    """
)

WORKLOADS = {"first eager step": FIRST_STEP, "new batch size": NEW_BATCH}

# The new batch size's step, program by program. JAX reports a program's phases as they end
# (its trace, then its lowering, then its backend compile) on this thread, so the process time
# between the end of its lowering and the end of its compile is its compile's CPU time, the
# threads XLA compiles with included.
PROGRAMS = NEW_BATCH_SETUP + textwrap.dedent(
    """
    phases, programs, lowered = {}, [], [0.0]

    def listener(event, seconds, fun_name=None, **_):
        phase = event.rsplit("/", 1)[-1]
        phases[phase] = phases.get(phase, 0.0) + seconds
        if phase == "jaxpr_to_mlir_module_duration":
            lowered[0] = time.process_time()
        elif phase == "backend_compile_duration":
            programs.append((str(fun_name), time.process_time() - lowered[0]))

    x, y = batch(48)  # made before listening: making them compiles two programs of their own
    jax.monitoring.register_event_duration_secs_listener(listener)
    step_cpu = timed(step, x, y)["cpu"]
    jax.monitoring.unregister_event_duration_listener(listener)
    print(json.dumps({"step cpu": step_cpu, "phases": phases, "programs": programs}))
    """
)

# What the fast options cost a program's run time: kernels of the demo's kinds compiled with
# XLA's defaults, with ``fast_compiler_options()`` and with those and the optimization level 0
# (``level0``), small (an eager MLP's: the new batch size's (48, 10) and (48, 64), the demo's
# (128, 3) and (128, 64)) and large; and how far level 0's results are from the fast ones', in
# epsilons of the result's largest magnitude.
KERNELS = textwrap.dedent(
    """
    import json, statistics, time
    import jax, jax.numpy as jnp, numpy as np, optax
    from xgrad.fast_compile import fast_compiler_options
    from xgrad.ops.nn import _cross_entropy_impl

    rng = np.random.default_rng(0)
    adam = optax.adam(1e-3)

    def adam_update(params, grads, state):
        updates, state = adam.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    def cross_entropy(x, t):
        return _cross_entropy_impl(x, t, 1, -100, 0.0, "mean", True)

    def kernels(rows, width):
        x = jnp.asarray(rng.standard_normal((rows, width)).astype(np.float32))
        w = jnp.asarray(rng.standard_normal((width, width)).astype(np.float32))
        t = jnp.asarray(rng.integers(0, width, rows).astype(np.int32))
        params = [w, x[0]]
        return {
            "tanh": (jnp.tanh, (x,)), "relu": (jax.nn.relu, (x,)), "sum over the batch": (lambda a: a.sum(0), (x,)),
            "log_softmax": (jax.nn.log_softmax, (x,)), "cross_entropy": (cross_entropy, (x, t)),
            "matmul": (lambda a, b: a @ b.T, (x, w)), "adam update": (adam_update, (params, params, adam.init(params))),
        }

    def eps(a, b):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind != "f" or np.array_equal(a, b):
            return 0.0
        return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) * np.finfo(b.dtype).eps))

    fast = fast_compiler_options()
    rows = []
    for rows_, width in ((48, 10), (48, 64), (128, 3), (128, 64), (4096, 1024)):
        for name, (fn, args) in kernels(rows_, width).items():
            row, results = {"kernel": f"{name} ({rows_}x{width})"}, {}
            for label, options in (("default", {}), ("fast", fast), ("level0", {**fast, "xla_backend_optimization_level": 0})):
                lowered = jax.jit(lambda *a, fn=fn: fn(*a), compiler_options=options).lower(*args)
                start = time.process_time()
                compiled = lowered.compile()
                row[f"{label} compile s"] = time.process_time() - start
                results[label] = jax.tree.leaves(jax.block_until_ready(compiled(*args)))
                runs = []
                for _ in range(20):
                    start = time.perf_counter()
                    jax.block_until_ready(compiled(*args))
                    runs.append(time.perf_counter() - start)
                row[f"{label} run us"] = statistics.median(runs) * 1e6
            row["level0 eps"] = max(eps(a, b) for a, b in zip(results["level0"], results["fast"]))
            rows.append(row)
    print(json.dumps(rows))
    """
)

# ``--options``: compiler options on top of the fast ones, for every program the script compiles.
EXTRA_OPTIONS = textwrap.dedent(
    """
    import json, os
    from xgrad import fast_compile
    fast_compile._known = {**fast_compile.fast_compiler_options(), **json.loads(os.environ["BENCH_COLD_OPTIONS"])}
    """
)


def run_once(script: str, checkout: Path, options: str | None = None) -> Any:
    """The JSON ``script`` prints last, run in a fresh process on ``checkout``'s xgrad, no cache, no XLA_FLAGS.

    ``options``: a JSON object of compiler options added to the fast ones (``--options``).
    """
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "XGRAD_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    env["PYTHONPATH"] = str(checkout)
    env["JAX_PLATFORMS"] = "cpu"
    if options is not None:
        env["BENCH_COLD_OPTIONS"] = options
        script = script.replace("import xgrad\n", "import xgrad\n" + EXTRA_OPTIONS, 1)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=checkout)
    if out.returncode != 0:
        raise RuntimeError(f"the benchmark's subprocess failed ({checkout}):\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_kernels() -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], run_once(KERNELS, ROOT))


def profile_programs(checkouts: dict[str, tuple[Path, str | None]], runs: int) -> None:
    """Per checkout: the new batch size's programs (in order, median compile CPU s over ``runs``) and phases."""
    profiles: dict[str, list[Any]] = {label: [] for label in checkouts}
    for _ in range(runs):
        for label, (checkout, options) in checkouts.items():
            profiles[label].append(run_once(PROGRAMS, checkout, options))
    print(f"{runs} fresh processes per checkout, load average {os.getloadavg()[0]:.1f} at the end\n")
    for label, results in profiles.items():
        names = [name for name, _ in results[0]["programs"]]
        rows = [
            (f"{i + 1}. {name}", f"{statistics.median(r['programs'][i][1] for r in results if len(r['programs']) > i):.3f}")
            for i, name in enumerate(names)
        ]
        compile_cpu = statistics.median(sum(c for _, c in r["programs"]) for r in results)
        rows.append((f"**{len(names)} programs: compile CPU s**", f"**{compile_cpu:.3f}**"))
        for phase in ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration", "backend_compile_duration"):
            rows.append((f"JAX's {phase} (wall s)", f"{statistics.median(r['phases'].get(phase, 0.0) for r in results):.3f}"))
        rows.append(("the step's CPU s", f"{statistics.median(r['step cpu'] for r in results):.3f}"))
        print(f"{label}:\n")
        print(table(rows, ("program (new batch size)", "median")))
        print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per checkout and workload")
    parser.add_argument("--against", type=Path, help="another checkout to run in the same turns")
    parser.add_argument("--only", choices=sorted(WORKLOADS), help="one workload")
    parser.add_argument("--kernels", action="store_true", help="compile and run times of single kernels, default options against fast")
    parser.add_argument("--programs", action="store_true", help="the new batch size's programs and their compile CPU seconds")
    parser.add_argument("--options", help="with --programs: this checkout again with these compiler options (JSON) on top of the fast ones")
    args = parser.parse_args()
    if args.kernels:
        kernel_rows = [run_kernels() for _ in range(args.runs)]
        columns = (("default compile s", 3), ("fast compile s", 3), ("level0 compile s", 3),
                   ("default run us", 1), ("fast run us", 1), ("level0 run us", 1), ("level0 eps", 2))
        rows = [
            (first["kernel"], *(f"{statistics.median(run[i][key] for run in kernel_rows):.{digits}f}" for key, digits in columns))
            for i, first in enumerate(kernel_rows[0])
        ]
        print(f"medians of {args.runs} fresh processes, load average {os.getloadavg()[0]:.1f} at the end\n")
        print(table(rows, ("kernel (float32)", "compile CPU s, default", "fast", "level 0", "run µs, default", "fast", "level 0",
                           "level 0 from fast, eps")))
        return
    checkouts = {"this checkout": ROOT}
    if args.against is not None:
        checkouts = {f"{args.against}": args.against.resolve(), **checkouts}
    if args.programs:
        profiled = {label: (checkout, None) for label, checkout in checkouts.items()}
        if args.options is not None:
            profiled[f"this checkout, {args.options}"] = (ROOT, args.options)
        profile_programs(profiled, args.runs)
        return
    workloads = {args.only: WORKLOADS[args.only]} if args.only else WORKLOADS
    results: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for _ in range(args.runs):
        for workload, script in workloads.items():
            for label, checkout in checkouts.items():
                for step, measured in run_once(script, checkout).items():
                    results.setdefault((workload, step, label), []).append(measured)
    rows = []
    for (workload, step, label), runs in results.items():
        seconds = [r["s"] for r in runs]
        rows.append((
            f"{workload}: {step}", label, f"{statistics.median(seconds):.3f}", " ".join(f"{s:.2f}" for s in seconds),
            f"{statistics.median(r['cpu'] for r in runs):.3f}", f"{statistics.median(r['programs'] for r in runs):.0f}",
            f"{statistics.median(r['compile_s'] for r in runs):.3f}",
        ))
    print(f"{args.runs} fresh processes per row, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end\n")
    print(table(rows, ("step", "checkout", "median s", "runs s", "median CPU s", "programs", "compile s")))


if __name__ == "__main__":
    main()
