"""Eager per-op cost: recording one op above the bare ``jnp`` call, and the demo MLP's eager step against torch's.

1. Recording: a recorded ``sin`` (1 element), ``mul`` of two grad-requiring 4x4 tensors and
   ``linear`` of a (2, 4) input by a (3, 4) weight and bias, each against the bare call on the
   arrays (``jnp.sin``, ``jnp.multiply``, ``jax.jit(lambda x, w, b: x @ w.T + b)``). Process
   time per call; the rows are timed in turns, medians of the rounds. The leaves'
   ``AccumulateGrad`` nodes are kept alive, as a graph that reaches them would.
2. The eager step: the demo's MLP (2-64-64-3, tanh, batch 128, cross-entropy, Adam) stepped by
   xgrad eagerly and by PyTorch eagerly on one thread (``nn.Linear``/``nn.Tanh``, the same
   initial parameters and batches). PyTorch runs in its own interpreter (``--torch-python``,
   one that can import ``torch``; it never imports xgrad or JAX), kept alive for the run; the
   two take turns, one block of steps each per round. Each step ends when its parameters are
   ready. The ratio is torch's step time over xgrad's, per round, and its median. Two more rows
   time each optimizer's step alone, on the grads the last step left.

3. The programs: each jitted program one eager step calls, replayed alone, and three kernels
   (``x + 1`` of one element, ``tanh`` of 128x64, ``x @ w.T + b`` of 128x64 by 64x64) as
   ``jax.jit`` programs against torch's ops on one thread (``--part programs``).

    PYTHONPATH=<checkout> python benchmarks/bench_eager_op.py --torch-python /path/to/python-with-torch

``--ab REV`` times the recording rows as an A/B in one process instead: the functions named by
``--swap`` (``module:qualname``) run with the code they have at git revision ``REV`` (A) and as
checked out (B), swapped in and out with the rounds in turns (the order alternating), so both
sides see the same load. It prints each side's µs above the bare call and the median of the
paired differences. Constructors are swapped like any function; a function whose closure or
globals differ between the two is not (``__code__`` must fit the function it is put into).

    PYTHONPATH=<checkout> python benchmarks/bench_eager_op.py --part recording --ab main \
        --swap xgrad.ops.registry:bind xgrad.ops.linalg:linear xgrad.tensor.core:Tensor.__init__
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

TORCH_WORKER = "--torch-worker"


def median_step(step: Callable[[], object], n: int) -> tuple[float, float]:
    """Median wall and process seconds of ``n`` calls of ``step`` (which returns once its results are ready).

    Process time counts every thread of the process (XLA's included): on a loaded machine
    it is what a step costs, where the wall time also counts the waits for a core."""
    walls, cpus = [], []
    for _ in range(n):
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls * 1e6


def swapped_code(revision: str, targets: list[str]) -> Callable[[str], None]:
    """A switch between the code of ``targets`` (``module:qualname``) at git ``revision`` ("A") and now ("B")."""
    import ast
    import importlib
    import textwrap

    swaps = []
    for target in targets:
        module_name, qualname = target.split(":")
        module = importlib.import_module(module_name)
        fn: Any = module
        for part in qualname.split("."):
            fn = getattr(fn, part)
        fn = getattr(fn, "__func__", fn)
        while fn.__code__.co_name != qualname.split(".")[-1]:  # a wrapper (autocast's): the op it wraps
            fn = fn.__wrapped__
        source = subprocess.run(  # ``REV:./name``: the path relative to the module's folder
            ["git", "show", f"{revision}:./{os.path.basename(module.__file__)}"], capture_output=True, text=True,
            check=True, cwd=os.path.dirname(module.__file__),
        ).stdout
        node: Any = ast.parse(source)
        for part in qualname.split("."):
            node = next(n for n in ast.iter_child_nodes(node)
                        if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == part)
        namespace = dict(vars(module))
        exec(compile("from __future__ import annotations\n" + textwrap.dedent(ast.get_source_segment(source, node)),
                     f"{module.__file__} at {revision}", "exec"), namespace)
        old = namespace[node.name]
        swaps.append((fn, {"A": (old.__code__, old.__defaults__), "B": (fn.__code__, fn.__defaults__)}))

    def use(side: str) -> None:
        for fn, codes in swaps:
            fn.__code__, fn.__defaults__ = codes[side]

    return use


def recording_rows(
    rounds: int, calls: int, use: Callable[[str], None] | None = None
) -> list[tuple[str, float, float, float]] | list[tuple[str, float, float, float, float]]:
    """``(op, bare µs, recorded µs, recorded - bare)`` per op, medians of ``rounds`` rounds in turns.

    With ``use`` (``swapped_code``'s switch): ``(op, bare, A - bare, B - bare, median of B - A per round)``."""
    import jax
    import jax.numpy as jnp

    import xgrad
    from xgrad.engine.node import grad_accumulator

    x = xgrad.tensor([0.5], requires_grad=True)
    a = xgrad.randn(4, 4, requires_grad=True)
    b = xgrad.randn(4, 4, requires_grad=True)
    inp, weight, bias = xgrad.randn(2, 4), xgrad.randn(3, 4, requires_grad=True), xgrad.randn(3, requires_grad=True)
    accumulators = [grad_accumulator(t) for t in (x, a, b, weight, bias)]
    bare_linear = jax.jit(lambda x, w, b: x @ w.T + b)
    xa, aa, ba, ia, wa, biasa = x.array, a.array, b.array, inp.array, weight.array, bias.array
    pairs: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "sin": (lambda: jnp.sin(xa), lambda: xgrad.sin(x)),
        "mul": (lambda: jnp.multiply(aa, ba), lambda: a * b),
        "linear": (lambda: bare_linear(ia, wa, biasa), lambda: xgrad.linear(inp, weight, bias)),
    }
    sides = ("A", "B") if use is not None else ("",)
    times: dict[tuple[str, Any], list[float]] = {(op, k): [] for op in pairs for k in (0, *sides)}
    for side in sides:  # compile and warm up
        if use is not None:
            use(side)
        for fns in pairs.values():
            for fn in fns:
                per_call_us(fn, 100)
    for r in range(rounds):
        for op, (bare, recorded) in pairs.items():
            times[op, 0].append(per_call_us(bare, calls))
            for side in sides if r % 2 == 0 else sides[::-1]:
                if use is not None:
                    use(side)
                times[op, side].append(per_call_us(recorded, calls))
    del accumulators
    if use is not None:
        use("B")
        return [
            (op, statistics.median(times[op, 0]), statistics.median(times[op, "A"]) - statistics.median(times[op, 0]),
             statistics.median(times[op, "B"]) - statistics.median(times[op, 0]),
             statistics.median([b - a for a, b in zip(times[op, "A"], times[op, "B"], strict=True)]))
            for op in pairs
        ]
    rows = []
    for op in pairs:
        bare, recorded = statistics.median(times[op, 0]), statistics.median(times[op, ""])
        rows.append((op, bare, recorded, recorded - bare))
    return rows


def _step_data(path: str) -> None:
    """The demo's initial parameters and batches, written for the torch worker."""
    import jax

    from xgrad import demo

    device = jax.devices()[0]
    model = demo.make_model(device)
    arrays = {f"p{i}": np.asarray(p.array) for i, p in enumerate(model.parameters())}
    arrays["lr"] = np.float64(demo.LEARNING_RATE)
    for i, (x, y) in enumerate(demo.make_batches(device)):
        arrays[f"x{i}"], arrays[f"y{i}"] = np.asarray(x), np.asarray(y)
    np.savez(path, **arrays)


def xgrad_stepper(path: str) -> Callable[[int], float]:
    """Median seconds of ``n`` eager steps of the demo MLP, from the saved parameters and batches."""
    import jax
    import optax

    import xgrad
    from xgrad import demo
    from xgrad.optim import Optax

    data = np.load(path)
    model = demo.make_model(jax.devices()[0])
    params = list(model.parameters())
    with xgrad.no_grad():
        for i, p in enumerate(params):
            p.copy_(xgrad.tensor(data[f"p{i}"]))
    batches = [(xgrad.tensor(data[f"x{i}"]), xgrad.tensor(data[f"y{i}"])) for i in range(_num_batches(data))]
    opt = Optax(params, optax.adam(demo.LEARNING_RATE))
    count = [0]

    def step() -> None:
        x, y = batches[count[0] % len(batches)]
        count[0] += 1
        opt.zero_grad()
        xgrad.cross_entropy(model(x), y).backward()
        opt.step()

    def run(n: int) -> tuple[float, float]:
        return median_step(lambda: (step(), jax.block_until_ready(params[0].array)), n)

    return run, step, opt


def programs_of_step(step: Callable[[], None], opt: Any) -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
    """The jitted programs one eager step calls, with their arguments, in order: the primitives'
    forwards, the backward's fused rules (NOTE [Fused eager rules]) and the optimizer's update.
    Called again back to back they are the step without xgrad's Python: its floor."""
    from xgrad.ops.registry import REGISTRY, Primitive

    calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def recording(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            calls.append((fn, args))
            return fn(*args)

        return call

    dispatch = Primitive.dispatch
    fused = {prim: dict(prim._fused.items()) for prim in REGISTRY.values()}
    jitted_step = opt._jitted_step
    Primitive.dispatch = lambda prim, arrays, params: recording(lambda *a: dispatch(prim, list(a), params))(*arrays)  # type: ignore[method-assign]
    for prim, entries in fused.items():
        for key, fn in entries.items():
            if callable(fn):
                prim._fused[key] = recording(fn)
    opt._jitted_step = recording(jitted_step)
    try:
        step()
    finally:
        Primitive.dispatch = dispatch  # type: ignore[method-assign]
        for prim, entries in fused.items():
            for key, fn in entries.items():
                prim._fused[key] = fn
        opt._jitted_step = jitted_step
    return calls


def replayer(calls: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> Callable[[int], tuple[float, float]]:
    import jax

    def run(n: int) -> tuple[float, float]:
        return median_step(lambda: jax.block_until_ready([fn(*args) for fn, args in calls]), n)

    return run


def _num_batches(data: Any) -> int:
    return sum(1 for name in data.files if name.startswith("x"))


def torch_worker(path: str) -> None:
    """Serve ``n`` on stdin with the median wall and process seconds of ``n`` torch eager steps on stdout (one thread)."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    data = np.load(path)
    weights = [torch.from_numpy(data[f"p{i}"]) for i in range(sum(1 for f in data.files if f.startswith("p")))]
    layers: list[nn.Module] = []
    for i in range(0, len(weights), 2):
        linear = nn.Linear(weights[i].shape[1], weights[i].shape[0])
        with torch.no_grad():
            linear.weight.copy_(weights[i])
            linear.bias.copy_(weights[i + 1])
        layers.append(linear)
        if i + 2 < len(weights):
            layers.append(nn.Tanh())
    model = nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=float(data["lr"]))
    batches = [(torch.from_numpy(data[f"x{i}"]), torch.from_numpy(data[f"y{i}"]).long()) for i in range(_num_batches(data))]
    count = [0]

    def step() -> None:
        x, y = batches[count[0] % len(batches)]
        count[0] += 1
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    h, w, b, one = torch.randn(128, 64), torch.randn(64, 64), torch.zeros(64), torch.zeros(1)
    runs = {
        "step": step, "optimizer": opt.step, "add_one": lambda: one + 1, "tanh": lambda: torch.tanh(h),
        "linear": lambda: torch.addmm(b, h, w.t()),
    }
    for line in sys.stdin:
        what, n = line.split()
        print(*median_step(runs[what], int(n)), flush=True)


Rounds = list[tuple[float, float]]  # per round, the median wall and process seconds of a step
ROWS = (
    "xgrad eager", "xgrad's programs replayed, no Python", "torch eager (1 thread)",
    "xgrad's optimizer step alone (Optax Adam)", "torch's optimizer step alone (Adam)",
)


def step_rounds(torch_python: str, rounds: int, steps: int) -> dict[str, Rounds] | None:
    """Per row of ``ROWS``, per round, ``median_step`` of ``steps`` calls: xgrad's step, its programs replayed,
    torch's step, then each optimizer's step alone on the last step's grads; the rows in turns."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "step.npz")
        _step_data(path)
        try:
            worker = subprocess.Popen(
                [torch_python, os.path.abspath(__file__), TORCH_WORKER, path],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
        except OSError as e:
            print(f"torch worker did not start: {e}")
            return None
        assert worker.stdin is not None and worker.stdout is not None

        def torch_run(what: str) -> Callable[[int], tuple[float, float]]:
            def run(n: int) -> tuple[float, float]:
                worker.stdin.write(f"{what} {n}\n")
                worker.stdin.flush()
                wall, cpu = worker.stdout.readline().split()
                return float(wall), float(cpu)

            return run

        import jax

        xgrad_run, step, opt = xgrad_stepper(path)
        try:
            xgrad_run(steps)  # compiles the primitives, then the fused rules
            runs = dict(zip(ROWS, (
                xgrad_run, replayer(programs_of_step(step, opt)), torch_run("step"),
                lambda n: median_step(lambda: (opt.step(), jax.block_until_ready(opt.params[0].array)), n),
                torch_run("optimizer"),
            ), strict=True))
            runs[ROWS[2]](steps)
            result: dict[str, Rounds] = {name: [] for name in ROWS}
            for _ in range(rounds):
                for name, run in runs.items():
                    result[name].append(run(steps))
        except ValueError:  # the worker died: its error is on stderr
            return None
        finally:
            worker.stdin.close()
            worker.wait()
    return result


def program_rows(torch_python: str, rounds: int, calls: int) -> None:
    """Print each program of one eager step replayed alone (``calls`` calls, waited for at the end), then three
    kernels against torch's (each call waited for): process µs per call, medians of ``rounds``."""
    import jax
    import jax.numpy as jnp

    from xgrad.fast_compile import fast_compiler_options

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "step.npz")
        _step_data(path)
        run, step, opt = xgrad_stepper(path)
        run(3)
        programs = programs_of_step(step, opt)
        print(f"Each program of one step replayed alone: process µs per call, medians of {rounds} rounds of {calls} calls\n")
        print("| # | arrays in (first shapes) | µs |\n|---|---|---:|")
        def pipelined_us(fn: Callable[..., Any], args: tuple[Any, ...]) -> float:  # waits once, after the calls
            start = time.process_time()
            for _ in range(calls):
                out = fn(*args)
            jax.block_until_ready(out)
            return (time.process_time() - start) / calls * 1e6

        for i, (fn, args) in enumerate(programs):
            arrays = [a for a in jax.tree.leaves(args) if hasattr(a, "shape")]
            us = statistics.median(pipelined_us(fn, args) for _ in range(rounds))
            print(f"| {i} | {len(arrays)} {[tuple(a.shape) for a in arrays[:3]]} | {us:.1f} |")
        worker = subprocess.Popen(
            [torch_python, os.path.abspath(__file__), TORCH_WORKER, path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert worker.stdin is not None and worker.stdout is not None
        options = fast_compiler_options()
        rng = np.random.default_rng(0)
        h, w = jnp.asarray(rng.normal(size=(128, 64)), jnp.float32), jnp.asarray(rng.normal(size=(64, 64)), jnp.float32)
        b, one = jnp.zeros(64, jnp.float32), jnp.zeros(1, jnp.float32)
        add_one, tanh = jax.jit(lambda x: x + 1, compiler_options=options), jax.jit(jnp.tanh, compiler_options=options)
        linear = jax.jit(lambda x, w, b: x @ w.T + b, compiler_options=options)
        kernels = {"add_one": lambda: add_one(one), "tanh": lambda: tanh(h), "linear": lambda: linear(h, w, b)}
        times: dict[tuple[str, str], list[float]] = {}
        try:
            for _ in range(rounds):
                for name, fn in kernels.items():
                    times.setdefault((name, "xgrad"), []).append(median_step(lambda fn=fn: jax.block_until_ready(fn()), calls)[1])
                    worker.stdin.write(f"{name} {calls}\n")
                    worker.stdin.flush()
                    times.setdefault((name, "torch"), []).append(float(worker.stdout.readline().split()[1]))
        finally:
            worker.stdin.close()
            worker.wait()
        print("\nOne kernel, XLA:CPU's jitted program (eager's fast options) against torch (one thread): process µs per call\n")
        print("| kernel | jax.jit | torch |\n|---|---:|---:|")
        for name in kernels:
            xla, torch_us = (statistics.median(times[name, who]) * 1e6 for who in ("xgrad", "torch"))
            print(f"| {name} | {xla:.1f} | {torch_us:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="rounds of each part, the rows in turns")
    parser.add_argument("--calls", type=int, default=3000, help="calls per row and round (recording)")
    parser.add_argument("--steps", type=int, default=50, help="steps per system and round (the eager step)")
    parser.add_argument("--torch-python", default=sys.executable, help="an interpreter that can import torch")
    parser.add_argument("--part", choices=("all", "recording", "step", "programs"), default="all")
    parser.add_argument("--ab", metavar="REV", help="recording: an A/B in one process against the code at git REV")
    parser.add_argument("--swap", nargs="+", default=[], metavar="MODULE:QUALNAME", help="the functions --ab swaps")
    args = parser.parse_args()
    if args.ab is not None:
        print(f"Recording one op, A = {args.ab}, B = this checkout ({' '.join(args.swap)} swapped): process µs per "
              f"call, medians of {args.rounds} rounds of {args.calls} calls, the sides in turns\n")
        print("| op | bare | A above bare | B above bare | B - A (median of the rounds' pairs) |\n|---|---:|---:|---:|---:|")
        for op, bare, above_a, above_b, delta in recording_rows(args.rounds, args.calls, swapped_code(args.ab, args.swap)):
            print(f"| {op} | {bare:.2f} | {above_a:.2f} | {above_b:.2f} | {delta:+.2f} |")
        return
    if args.part in ("all", "recording"):
        print(f"Recording one op: process µs per call, medians of {args.rounds} rounds of {args.calls} calls\n")
        print("| op | bare | recorded | above bare |\n|---|---:|---:|---:|")
        for op, bare, recorded, above in recording_rows(args.rounds, args.calls):
            print(f"| {op} | {bare:.2f} | {recorded:.2f} | {above:.2f} |")
    if args.part in ("all", "programs"):
        program_rows(args.torch_python, args.rounds, min(args.calls, 1000))
    if args.part in ("all", "step"):
        result = step_rounds(args.torch_python, args.rounds, args.steps)
        if result is None:
            print("\ntorch eager: unavailable (see the worker's error above)")
            return
        ts = result[ROWS[2]]
        print(f"\nDemo MLP eager step: ms, medians of {args.steps} steps per round, {args.rounds} rounds in turns")
        for kind, k in (("wall", 0), ("process (CPU) time", 1)):
            print(f"\n{kind}:\n\n| what | median of rounds | rounds |\n|---|---:|---|")
            for name, per_round in result.items():
                ms = [r[k] * 1e3 for r in per_round]
                print(f"| {name} | {statistics.median(ms):.3f} | {' '.join(f'{m:.2f}' for m in ms)} |")
            for name in ROWS[:2]:
                ratios = [t[k] / x[k] for x, t in zip(result[name], ts, strict=True)]
                print(f"\ntorch / {name}, {kind}, per round: median {statistics.median(ratios):.2f}x "
                      f"({min(ratios):.2f}-{max(ratios):.2f}x)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == TORCH_WORKER:
        torch_worker(sys.argv[2])
    else:
        main()
