"""A/B pairs on ``xgrad.compile``'s hit path, each pair in one process: the demo MLP step's calling-thread CPU.

Each pair is timed in interleaved rounds of 10 steps, the two sides taking turns at
each place in the round (the second block of a round runs slower on this machine),
medians of the rounds (``time.thread_time``: the Python and dispatch a step costs,
which other jobs disturb least). The pairs:

- ``control``: one step against a second one built alike (A/A: what the method resolves);
- ``hyperparameters``: Adam's group's hyperparameters as one packed program input
  against four (one per entry, as each was its own Tensor: four Tensors the step reads,
  concatenated inside the program);
- ``result tensors``: the ``.grad``s and the loss made by ``Tensor._from_program``
  against ``Tensor(array)`` (switched before each block);
- ``the result``: the step's one returned Tensor handed back as it is, against rebuilt
  by its tree (``treedef.unflatten``);
- ``program call``: the step's program alone (its state fed back) called as ``jax.jit``'s
  function against the ``Compiled`` of ``.lower().compile()``, and with three more scalar
  inputs it does not read (what ``jax.jit``'s dispatch pays per input).

    python benchmarks/bench_hit_path_ab.py --rounds 150
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from _timing import table, xgrad_demo_step

import xgrad
from xgrad import demo, step_trace
from xgrad.compile_step.program_call import gather_inputs
from xgrad.tensor import Tensor

STEPS_PER_ROUND = 10
_FROM_PROGRAM = Tensor.__dict__["_from_program"]


def compiled_step(device: Any, split_hyper: bool = False) -> Any:
    """The demo step (Adam) under ``xgrad.compile`` on a model of its own; with ``split_hyper``, its
    hyperparameters reach the program as four inputs."""
    demo_step = xgrad_demo_step(device)
    if split_hyper:
        group = demo_step.opt.param_groups[0]
        packed = group.hyper_array()
        pieces = [Tensor(packed[start:start + math.prod(shape)]) for _, start, shape in group.hyper_layout]

        def hyper_array() -> Any:
            trace = step_trace.current()
            if trace is not None:
                for t in pieces:
                    trace.read(t)
            return jnp.concatenate([t._array for t in pieces])

        group.hyper_array = hyper_array  # type: ignore[method-assign]

    return xgrad.compile(demo_step.step, fallback="error")


def program_alone(device: Any, batch: tuple[Any, Any], how: str) -> Callable[[Any, Any], Any]:
    """A compiled step's program called without the Python around it, its donated state fed back."""
    step = compiled_step(device)
    step(*batch)
    entry = next(iter(step._cache.values()))
    state = gather_inputs(entry, list(batch))[:-2]
    call = entry.jitted
    if how == "Compiled":
        call = entry.jitted.lower(*state, *batch).compile()
    elif how == "3 more inputs":
        extra = [jnp.float32(1.0)] * 3
        inner = jax.jit(
            lambda *args: entry.jitted.__wrapped__(*args[:-3]),
            donate_argnums=tuple(position for position, _, _, _ in entry.donated), keep_unused=True,
        )
        call = lambda *args: inner(*args, *extra)  # noqa: E731

    def run(x: Any, y: Any) -> Any:
        outs = call(*state, x, y)
        if entry.in_order is not None:
            outs = entry.in_order(outs)
        for position, _, _, index in entry.donated:
            state[position] = outs[index]
        return outs[entry.result_template[0][1]]

    return run


class Switched:
    """A compiled step run with ``Tensor._from_program`` set to ``from_program``, set before each block of steps
    (setting a class attribute resets CPython's attribute caches of the class: not once per step)."""

    def __init__(self, step: Any, from_program: Any) -> None:
        self.step = step
        self.from_program = from_program

    def before_block(self) -> None:
        Tensor._from_program = self.from_program  # type: ignore[method-assign]

    def __call__(self, x: Any, y: Any) -> Any:
        return self.step(x, y).array


def pairs(device: Any, batch: tuple[Any, Any]) -> dict[str, dict[str, Callable[[Any, Any], Any]]]:
    plain = classmethod(lambda cls, array: cls(array))
    both = compiled_step(device)
    a, b = compiled_step(device), compiled_step(device)
    packed, split = compiled_step(device), compiled_step(device, split_hyper=True)
    leaf, rebuilt = compiled_step(device), compiled_step(device)
    rebuilt(*batch)
    next(iter(rebuilt._cache.values())).returns_one_leaf = False
    return {
        "control": {"a step": lambda x, y: a(x, y).array, "the same step again": lambda x, y: b(x, y).array},
        "hyperparameters": {
            "one packed input": lambda x, y: packed(x, y).array, "four inputs": lambda x, y: split(x, y).array,
        },
        "the result": {
            "one leaf returned as it is": lambda x, y: leaf(x, y).array,
            "rebuilt by its tree": lambda x, y: rebuilt(x, y).array,
        },
        "result tensors": {"Tensor._from_program": Switched(both, _FROM_PROGRAM), "Tensor(array)": Switched(both, plain)},
        "program call": {
            "jax.jit's function": program_alone(device, batch, "jit"),
            "its Compiled": program_alone(device, batch, "Compiled"),
            "jax.jit's, 3 more inputs": program_alone(device, batch, "3 more inputs"),
        },
    }


def measure(steps: dict[str, Callable[[Any, Any], Any]], batches: list[Any], rounds: int) -> dict[str, float]:
    """Median thread CPU per step of each side, the sides taking turns at each place."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    position = 0
    for round_ in range(rounds + 3):
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:
            run = steps[name]
            if isinstance(run, Switched):
                run.before_block()
            start = time.thread_time()
            for _ in range(STEPS_PER_ROUND):
                loss = run(*batches[position % len(batches)])
                position += 1
            seconds = (time.thread_time() - start) / STEPS_PER_ROUND
            jax.block_until_ready(loss)
            if round_ >= 3:  # warm-up rounds
                times[name].append(seconds)
    return {name: statistics.median(values) * 1e6 for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=150)
    args = parser.parse_args()
    device = jax.devices()[0]
    batches = demo.make_batches(device)
    rows = []
    for pair, steps in pairs(device, batches[0]).items():
        for run in steps.values():
            run(*batches[0])
        medians = measure(steps, batches, args.rounds)
        Tensor._from_program = _FROM_PROGRAM  # type: ignore[method-assign]
        first = next(iter(medians.values()))
        rows += [(pair, name, f"{us:.1f}", f"{us / first:.3f}") for name, us in medians.items()]
    print(f"{args.rounds} interleaved rounds of {STEPS_PER_ROUND} steps per pair; thread CPU, µs per step\n")
    print(table(rows, ("pair", "side", "µs", "vs the first")))


if __name__ == "__main__":
    main()
