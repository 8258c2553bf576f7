"""Invariants any autograd graph must satisfy, as checks you can call on your own graphs.

Each check raises ``InvariantError`` naming what broke, or returns ``None``:

- ``check_hooks(hooked)``: every hook fires once per backward, in PyTorch's order,
  seeing the right gradient, and scaling hooks change the leaf grads as JAX says.
- ``check_grad_matches_backward(fn, *inputs)``: ``grad(out, inputs=[x])`` equals the
  ``x.grad`` that ``backward()`` accumulates, for each input and for all together.
- ``check_compiled_matches_eager(fn, *inputs)``: the compiled backward gives the eager grads.
- ``check_retain_graph(fn, *inputs)``: two backwards with ``retain_graph=True`` accumulate
  twice the gradient; without it the second one raises (or, when nothing was saved,
  accumulates correctly too), and a fresh graph works afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

import xgrad
from xgrad.tensor import Tensor
from xgrad.tensor.hook_kinds import ACCUMULATED, BEFORE, KINDS, RECORDS
from xgrad.testing.compare import _compare
from xgrad.testing.programs import KIND, HookedProgram

__all__ = [
    "InvariantError", "check_compiled_matches_eager", "check_grad_matches_backward", "check_hooks", "check_retain_graph",
]

# What a retained ``.grad`` holds: the gradient after the hooks ranked before the recording one.
_RETAIN_RANK = min(kind.rank for kind in KINDS if kind.convention is RECORDS)


class InvariantError(AssertionError):
    """An autograd invariant does not hold."""


def _close(a: Any, b: Any, what: str, atol: float = 1e-8, rtol: float = 1e-6) -> None:
    problem = _compare(np.asarray(a, np.float64), np.asarray(b, np.float64), atol, rtol)
    if problem is not None:
        raise InvariantError(f"{what}: {problem}")


def check_hooks(hooked: HookedProgram, compiled: bool = False) -> None:
    """Run ``hooked`` once and check its hooks: count, order, values and effect.

    >>> import numpy as np
    >>> from xgrad.testing.programs import HookedProgram, HookSpec, build_program
    >>> from xgrad.testing.op_specs import specs_for
    >>> p = build_program([(3,)], [(specs_for("sin")[0], [0]), (specs_for("mul")[0], [1, 0])])
    >>> check_hooks(HookedProgram(p, [HookSpec("tensor", "v0", 2.0), HookSpec("posthook", "v1")]))
    """
    run = hooked.run(compiled=compiled)
    hooks = hooked.hooks
    fired: dict[int, list[int]] = {i: [] for i in range(len(hooks))}
    for position, call in enumerate(run.calls):
        fired[call.hook].append(position)
    downstream = _downstream(hooked)
    output = hooked.program.output
    for i, h in enumerate(hooks):
        # A tensor the output does not depend on gets no gradient, so its hooks do not fire.
        expected_calls = int(h.target == output or output in downstream[h.target])
        if KIND[h.kind].convention is not RECORDS and len(fired[i]) != expected_calls:
            raise InvariantError(
                f"hook {i} {h!r} fired {len(fired[i])} times in one backward (expected {expected_calls})\n{hooked!r}"
            )

    # Order on one tensor: tensor hooks, then node pre-hooks, then node post-hooks (or, on a
    # leaf, post-accumulate-grad hooks), each group in registration order (the kinds' ranks).
    logged = [i for i, h in enumerate(hooks) if KIND[h.kind].convention is not RECORDS and fired[i]]
    for target in {h.target for h in hooks}:
        mine = [i for i in logged if hooks[i].target == target]
        expected_order = sorted(mine, key=lambda i: (KIND[hooks[i].kind].rank, i))
        actual = sorted(mine, key=lambda i: fired[i][0])
        if actual != expected_order:
            raise InvariantError(
                f"hooks on {target} fired in the order {[hooks[i] for i in actual]}, "
                f"expected {[hooks[i] for i in expected_order]} (PyTorch's order)\n{hooked!r}"
            )
    # Across tensors: a tensor's gradient is complete only after every value computed from
    # it has been through backward, so their hooks all fire first.
    for i in logged:
        for j in logged:
            if hooks[j].target in downstream[hooks[i].target] and fired[j][0] > fired[i][0]:
                raise InvariantError(
                    f"hook {i} {hooks[i]!r} fired before hook {j} {hooks[j]!r}, but {hooks[j].target} is computed "
                    f"from {hooks[i].target}, so its backward must come first\n{hooked!r}"
                )

    leaf_grads, arriving = hooked.reference_grads()
    for name, got, want in zip(hooked.program.input_names, run.leaf_grads, leaf_grads, strict=True):
        _close(np.zeros_like(want) if got is None else got, want, f"the gradient of input {name} with these hooks\n{hooked!r}\n")
    scale_so_far: dict[str, float] = {}
    for i in sorted(logged, key=lambda i: fired[i][0]):
        h, kind = hooks[i], KIND[hooks[i].kind]
        seen = run.calls[fired[i][0]].grad
        if kind.phase == ACCUMULATED:  # it sees the leaf's .grad
            expected = leaf_grads[hooked.program.input_names.index(h.target)]
        else:
            expected = arriving[h.target] * scale_so_far.get(h.target, 1.0)
        _close(seen, expected, f"the gradient hook {i} {h!r} received\n{hooked!r}\n")
        if h.scale is not None and kind.phase == BEFORE:  # post-hooks scale grad_inputs, not what later ones see
            scale_so_far[h.target] = scale_so_far.get(h.target, 1.0) * h.scale
    for name, got in run.retained.items():
        tensor_scale = np.prod([
            h.scale for h in hooks if h.target == name and KIND[h.kind].rank < _RETAIN_RANK and h.scale is not None
        ])
        _close(np.zeros_like(arriving[name]) if got is None else got, arriving[name] * tensor_scale, f"the retained .grad of {name}\n{hooked!r}\n")


def _downstream(hooked: HookedProgram) -> dict[str, set[str]]:
    """For each variable, every variable computed (directly or not) from it."""
    users = hooked.program.uses()
    result: dict[str, set[str]] = {}
    for var in reversed(hooked.program.variables):
        below: set[str] = set()
        for u in users[var]:
            below |= {u} | result.get(u, set())
        result[var] = below
    return result


def _leaves(inputs: Sequence[Any]) -> list[Tensor]:
    return [xgrad.tensor(x.array if isinstance(x, Tensor) else x, requires_grad=True) for x in inputs]


def _root(fn: Callable[..., Any], leaves: list[Tensor]) -> tuple[Tensor, Tensor]:
    out = fn(*leaves)
    cotangent = np.random.default_rng(0).standard_normal(out.shape).astype(out.dtype)
    return out, Tensor(jnp.asarray(cotangent))


def _grad_arrays(leaves: list[Tensor]) -> list[np.ndarray]:
    return [np.zeros(t.shape) if t.grad is None else np.asarray(t.grad.array) for t in leaves]


def check_grad_matches_backward(fn: Callable[..., Any], *inputs: Any, compiled: bool = False) -> None:
    """``autograd.grad`` w.r.t. each input (and all) equals what ``backward()`` accumulates.

    >>> import numpy as np
    >>> check_grad_matches_backward(lambda x, y: (x * y).sin(), np.ones(3), np.arange(3.0))
    """
    leaves = _leaves(inputs)
    out, ct = _root(fn, leaves)
    out.backward(ct, compiled=compiled)
    accumulated = _grad_arrays(leaves)
    subsets = [[i] for i in range(len(leaves))] + ([list(range(len(leaves)))] if len(leaves) > 1 else [])
    for subset in subsets:
        fresh = _leaves(inputs)
        out, ct = _root(fn, fresh)
        grads = xgrad.autograd.grad(out, [fresh[i] for i in subset], ct, allow_unused=True, compiled=compiled)
        for i, g in zip(subset, grads, strict=True):
            got = np.zeros(fresh[i].shape) if g is None else np.asarray(g.array)
            _close(got, accumulated[i], f"grad(outputs, inputs={subset}) for input {i} vs backward()")
        fresh = _leaves(inputs)
        out, ct = _root(fn, fresh)
        out.backward(ct, inputs=[fresh[i] for i in subset], compiled=compiled)
        for i, t in enumerate(fresh):
            if i not in subset and t.grad is not None:
                raise InvariantError(f"backward(inputs={subset}) accumulated into input {i}, which was not listed")
            if i in subset:
                _close(_grad_arrays([t])[0], accumulated[i], f"backward(inputs={subset}) for input {i} vs backward()")


def check_compiled_matches_eager(fn: Callable[..., Any], *inputs: Any) -> None:
    """The compiled backward accumulates the same ``.grad`` as the eager engine, twice over."""
    results = []
    for compiled in (False, True):
        leaves = _leaves(inputs)
        for _ in range(2):  # the second run accumulates (and, compiled, hits the cache)
            out, ct = _root(fn, leaves)
            out.backward(ct, compiled=compiled)
        results.append(_grad_arrays(leaves))
    for i, (eager, comp) in enumerate(zip(*results, strict=True)):
        _close(comp, eager, f"compiled vs eager .grad of input {i}")


def check_retain_graph(fn: Callable[..., Any], *inputs: Any, compiled: bool = False) -> None:
    """``retain_graph`` semantics: see the module docstring.

    >>> import numpy as np
    >>> check_retain_graph(lambda x: x.exp() * x, np.ones(2))
    """
    leaves = _leaves(inputs)
    out, ct = _root(fn, leaves)
    out.backward(ct, retain_graph=True, compiled=compiled)
    once = _grad_arrays(leaves)
    out.backward(ct, retain_graph=True, compiled=compiled)
    for i, (g, g1) in enumerate(zip(_grad_arrays(leaves), once, strict=True)):
        _close(g, 2 * g1, f"input {i}: two backwards with retain_graph=True must accumulate twice the gradient")

    leaves = _leaves(inputs)
    out, ct = _root(fn, leaves)
    out.backward(ct, compiled=compiled)
    try:
        out.backward(ct, compiled=compiled)
    except RuntimeError as exc:
        if "second time" not in str(exc):
            raise InvariantError(f"a second backward without retain_graph raised the wrong error: {exc}") from exc
    else:
        # Legal only when the graph saved nothing (PyTorch too), and then it must be right.
        for i, (g, g1) in enumerate(zip(_grad_arrays(leaves), once, strict=True)):
            _close(g, 2 * g1, f"input {i}: a second backward without retain_graph neither raised nor accumulated correctly")
    fresh = _leaves(inputs)
    out, ct = _root(fn, fresh)
    out.backward(ct, compiled=compiled)
    for i, (g, g1) in enumerate(zip(_grad_arrays(fresh), once, strict=True)):
        _close(g, g1, f"input {i}: a fresh graph after the failed backward")

