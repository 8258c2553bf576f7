"""Random programs over the op table, and the same programs with hooks on their tensors.

A ``Program`` is straight-line code over an array namespace ``np``::

    def program(np, x0, x1):
        v0 = np.exp(0.5 * np.tanh(x0))
        v1 = v0 * x1
        return v1

It runs the same with ``xgrad``, ``jax.numpy`` and NumPy, prints as that source, and
carries sample inputs (``program.inputs``) for which every op stays in its domain.
``strategies.programs()`` draws them; ``build_program`` makes one from explicit choices.

A ``HookedProgram`` adds hooks of every kind at chosen tensors; ``run`` records each
call, and ``reference_grads`` gives, from JAX, the gradients the hooks must produce
(hooks that scale a gradient become a scaled cotangent at that point).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import xgrad
from xgrad.tensor import Tensor
from xgrad.tensor.hook_kinds import KINDS, RECORDS, REPLACES_GRAD, REPLACES_GRADS
from xgrad.testing.op_specs import OP_SPECS, REAL, Domain, OpSpec
from xgrad.testing.program_families import family_ops, namespace

__all__ = ["HOOK_KINDS", "HookSpec", "HookedProgram", "Program", "build_program", "program_ops"]

#: Largest magnitude a program value may take: keeps finite differences well conditioned.
VALUE_LIMIT = 20.0
_BOUNDED_GUARD = "0.5 * np.tanh({0})"
_POSITIVE_GUARD = "np.exp(np.tanh({0}))"


def program_ops(
    names: Sequence[str] | None = None, smooth: bool = False, families: Sequence[str] = (), second_order: bool = False,
) -> list[OpSpec]:
    """The specs usable in programs (those with an ``expr``), one per distinct expression.

    ``families`` adds those of ``program_families.FAMILIES`` (``"functional"``, ``"losses"``,
    ``"recurrent"``, ``"inplace"``) to the op table's; ``second_order`` keeps only the ops
    with second derivatives.
    """
    candidates = [spec for spec in (*OP_SPECS, *family_ops(families)) if spec.expr is not None]
    if names is not None:
        unknown = sorted(set(names) - {s.name for s in candidates})
        if unknown:
            raise ValueError(f"ops {unknown} have no program expression in op_specs (ops with one: "
                             f"{sorted({s.name for s in candidates})})")
    seen: dict[str | None, OpSpec] = {}
    for spec in candidates:
        if spec.expr in seen or (names is not None and spec.name not in names):
            continue
        if (smooth and not spec.smooth) or (second_order and not spec.second_order):
            continue
        seen[spec.expr] = spec
    return list(seen.values())


def _in_domain(values: np.ndarray, domain: Domain) -> bool:
    if not np.all(np.isfinite(values)) or np.max(np.abs(values), initial=0.0) > VALUE_LIMIT:
        return False
    if domain == REAL:
        return True
    if domain.lo > 0:  # a positive domain (log, sqrt, a denominator): keep away from 0
        return bool(np.min(values, initial=np.inf) >= domain.lo / 2)
    return bool(np.all((values >= domain.lo) & (values <= domain.hi)))


def _guard(domain: Domain) -> str:
    return _POSITIVE_GUARD if domain.lo > 0 and domain != REAL else _BOUNDED_GUARD


class Program:
    """Straight-line code over an array namespace: ``program(np, *xs)``.

    Attributes:
        lines: ``(variable, expression)`` pairs, in order; the last variable is returned.
        inputs: sample float64 arrays, one per input, inside every op's domain.
    """

    def __init__(self, input_shapes: Sequence[tuple[int, ...]], lines: Sequence[tuple[str, str]], inputs: Sequence[np.ndarray]) -> None:
        self.input_names = tuple(f"x{i}" for i in range(len(input_shapes)))
        self.input_shapes = tuple(tuple(s) for s in input_shapes)
        self.lines = tuple(lines)
        self.inputs = tuple(inputs)
        self._code = tuple(compile(expr, f"<program line {var}>", "eval") for var, expr in self.lines)

    @property
    def output(self) -> str:
        return self.lines[-1][0] if self.lines else self.input_names[0]

    @property
    def variables(self) -> tuple[str, ...]:
        return self.input_names + tuple(var for var, _ in self.lines)

    def uses(self) -> dict[str, set[str]]:
        """For each variable, the variables whose line reads it."""
        users: dict[str, set[str]] = {v: set() for v in self.variables}
        for var, expr in self.lines:
            for name in self.variables:
                if _mentions(expr, name):
                    users[name].add(var)
        return users

    def run(self, np_: Any, *xs: Any, tap: Callable[[str, Any], Any] | None = None) -> Any:
        """Evaluate with namespace ``np_``; ``tap(name, value)`` may replace each value."""
        if len(xs) != len(self.input_names):
            raise TypeError(f"program takes {len(self.input_names)} inputs, got {len(xs)}")
        env: dict[str, Any] = {}
        for name, x in zip(self.input_names, xs, strict=True):
            env[name] = tap(name, x) if tap is not None else x
        scope = {"np": namespace(np_)}  # NOTE [Program namespaces]
        for (var, _), code in zip(self.lines, self._code, strict=True):
            value = eval(code, scope, env)  # noqa: S307  (our own generated source)
            env[var] = tap(var, value) if tap is not None else value
        return env[self.output]

    def __call__(self, np_: Any, *xs: Any) -> Any:
        return self.run(np_, *xs)

    @property
    def source(self) -> str:
        body = [f"    {var} = {expr}" for var, expr in self.lines]
        return "\n".join([f"def program(np, {', '.join(self.input_names)}):", *body, f"    return {self.output}"])

    def __repr__(self) -> str:
        shapes = ", ".join(f"{n}: {list(s)}" for n, s in zip(self.input_names, self.input_shapes, strict=True))
        return f"{self.source}\n# input shapes: {shapes}"


def _mentions(expr: str, name: str) -> bool:
    return re.search(rf"\b{name}\b", expr) is not None


def _evaluate(expr: str, operands: Sequence[Any]) -> np.ndarray | None:
    """``expr`` on the reference namespace's values; ``None`` when the shapes do not fit the op."""
    names = [f"a{i}" for i in range(len(operands))]
    text = expr.format(*names)

    def in_jax(*arrays: Any) -> Any:
        return eval(text, {"np": namespace(jnp)}, dict(zip(names, arrays, strict=True)))  # noqa: S307  (the op table's expressions)

    try:
        jax.eval_shape(in_jax, *operands)
    except (ValueError, TypeError, IndexError):
        return None
    return np.asarray(in_jax(*operands), dtype=np.float64)


def build_program(
    input_shapes: Sequence[tuple[int, ...]],
    steps: Sequence[tuple[OpSpec, Sequence[int]]],
    seed: int = 0,
    kinks: Sequence[float] = (),
) -> Program | None:
    """A program from explicit choices: each step applies an op to earlier values (by index).

    Operands outside the op's domain get a guard line first (``0.5 * np.tanh(v)`` or
    ``np.exp(np.tanh(v))``); a step whose shapes do not fit, or whose value leaves
    ``[-VALUE_LIMIT, VALUE_LIMIT]`` even with guards, is dropped. Sinks (values nothing
    reads) are summed into the output, so every line reaches it. Returns ``None`` when
    no step survives. With ``kinks``, about a third of the inputs' elements are drawn from
    them exactly (the points where an op's derivative jumps).

    >>> from xgrad.testing.op_specs import specs_for
    >>> p = build_program([(3,)], [(specs_for("exp")[0], [0]), (specs_for("mul")[0], [1, 0])])
    >>> print(p.source)
    def program(np, x0):
        v0 = np.exp(x0)
        v1 = v0 * x0
        return v1
    """
    rng = np.random.default_rng(seed)
    inputs = [rng.uniform(-2.0, 2.0, size=s) for s in input_shapes]
    if kinks:
        inputs = [np.where(rng.random(x.shape) < 1 / 3, rng.choice(np.asarray(kinks), x.shape), x) for x in inputs]
    names = [f"x{i}" for i in range(len(input_shapes))]
    values: list[np.ndarray] = list(inputs)
    lines: list[tuple[str, str]] = []
    read: set[int] = set()

    def emit(expr: str, value: np.ndarray) -> int:
        name = f"v{len(lines)}"
        lines.append((name, expr))
        names.append(name)
        values.append(value)
        return len(values) - 1

    for spec, chosen in steps:
        expr = spec.expr
        if expr is None:
            raise ValueError(f"op {spec.name} has no program expression in op_specs (use program_ops())")
        operands = [k % len(values) for k in chosen]
        # First guard only the operands outside the op's domain; if the result is still
        # too large (or the shapes do not fit), guard every operand; else drop the step.
        for guard_all in (False, True):
            plan: list[tuple[int, str | None, np.ndarray]] = []  # (operand index, guard or None, operand value)
            for pos, k in enumerate(operands):
                domain = spec.domains[pos]
                if guard_all or not _in_domain(values[k], domain):
                    guard = _guard(domain)
                    guarded = _evaluate(guard, [values[k]])
                    assert guarded is not None, "a guard is elementwise: every shape fits"
                    plan.append((k, guard, guarded))
                else:
                    plan.append((k, None, values[k]))
            out = _evaluate(expr, [v for _, _, v in plan])
            if out is not None and _in_domain(out, REAL):
                args = []
                for k, operand_guard, value in plan:
                    read.add(k)
                    args.append(k if operand_guard is None else emit(operand_guard.format(names[k]), value))
                read.update(args)
                emit(expr.format(*(names[k] for k in args)), out)
                break
    if not lines:
        return None
    first_line = len(input_shapes)
    sinks = [k for k in range(first_line, len(values)) if k not in read]
    if len(sinks) > 1:
        total = sum(values[k] for k in sinks)
        emit(" + ".join(names[k] for k in sinks), np.asarray(total))
    return Program(input_shapes, lines, inputs)


# -- hooks -----------------------------------------------------------------------------
#: The names of the kinds of hook (NOTE [Hook kinds]): ``tensor``: ``Tensor.register_hook``;
#: ``retain_grad``; ``prehook`` / ``posthook``: on the tensor's ``grad_fn``; ``post_accumulate``:
#: ``register_post_accumulate_grad_hook`` (leaves).
HOOK_KINDS = tuple(kind.name for kind in KINDS)
KIND = {kind.name: kind for kind in KINDS}


@dataclasses.dataclass(frozen=True)
class HookSpec:
    """One hook: its kind, the program variable it sits on, and an optional gradient scale."""

    kind: str
    target: str
    scale: float | None = None

    def __repr__(self) -> str:
        effect = f" scaling by {self.scale}" if self.scale is not None else ""
        return f"<{self.kind} hook on {self.target}{effect}>"


@dataclasses.dataclass
class HookCall:
    """One recorded call: which hook (index into ``hooks``) and the gradient it saw."""

    hook: int
    grad: Any


@dataclasses.dataclass
class HookedRun:
    """What one backward of a ``HookedProgram`` did."""

    calls: list[HookCall]
    leaf_grads: list[Any]
    retained: dict[str, Any]


class HookedProgram:
    """A ``Program`` whose tensors carry hooks (``hooks``, in registration order)."""

    def __init__(self, program: Program, hooks: Sequence[HookSpec]) -> None:
        self.program = program
        self.hooks = tuple(hooks)
        leaves = set(program.input_names)
        for h in self.hooks:
            kind = KIND.get(h.kind)
            if kind is None:
                raise ValueError(f"unknown hook kind {h.kind!r}; expected one of {HOOK_KINDS}")
            if kind.node_slot is None and h.target not in leaves:
                raise ValueError(f"{h.kind} hooks go on inputs, not {h.target}")
            if kind.leaf_slot is None and h.target in leaves:
                raise ValueError(f"{h.kind} hooks go on computed values, not the input {h.target}")

    @property
    def inputs(self) -> tuple[np.ndarray, ...]:
        return self.program.inputs

    def __repr__(self) -> str:
        return f"{self.program!r}\n# hooks: {list(self.hooks)}"

    def run(self, retain_graph: bool = False, compiled: bool = False, backwards: int = 1) -> HookedRun:
        """Build the graph with xgrad, install the hooks, run ``backwards`` backward passes."""
        calls: list[HookCall] = []
        leaves = [xgrad.tensor(x, requires_grad=True) for x in self.program.inputs]
        retained: dict[str, Tensor] = {}

        def install(name: str, t: Tensor) -> Tensor:
            for index, h in enumerate(self.hooks):
                if h.target == name:
                    _install(h, index, t, calls, retained)
            return t

        out = self.program.run(xgrad, *leaves, tap=install)
        cotangent = _cotangent(self.program)
        for n in range(backwards):
            keep = retain_graph or n < backwards - 1
            out.backward(Tensor(jnp.asarray(cotangent)), retain_graph=keep, compiled=compiled)
        return HookedRun(
            calls,
            [None if t.grad is None else np.asarray(t.grad.array) for t in leaves],
            {name: None if t.grad is None else np.asarray(t.grad.array) for name, t in retained.items()},
        )

    def reference_grads(self) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        """From JAX: the leaf gradients with the hooks' scalings applied, and, per variable,
        the gradient arriving at it before its own hooks run."""
        scales: dict[str, float] = {}
        for h in self.hooks:
            if h.scale is not None and KIND[h.kind].replaces:
                scales[h.target] = scales.get(h.target, 1.0) * h.scale
        cotangent = jnp.asarray(_cotangent(self.program))

        def f(leaves: list[Any], probes: dict[str, Any]) -> Any:
            def tap(name: str, value: Any) -> Any:
                if name in scales:
                    value = _scale_cotangent(value, scales[name])
                return value + probes[name]

            return jnp.vdot(self.program.run(jnp, *leaves, tap=tap), cotangent)

        arrays = [jnp.asarray(x) for x in self.program.inputs]
        probes: dict[str, Any] = {}

        def zero_probe(name: str, value: Any) -> Any:
            probes[name] = jnp.zeros_like(value)
            return value

        self.program.run(jnp, *arrays, tap=zero_probe)
        leaf_grads, probe_grads = jax.grad(f, argnums=(0, 1))(arrays, probes)
        # The probe is added after the scaling, so in backward it sees the gradient first.
        return [np.asarray(g) for g in leaf_grads], {n: np.asarray(g) for n, g in probe_grads.items()}


def _cotangent(program: Program) -> np.ndarray:
    out = jax.eval_shape(lambda *xs: program.run(jnp, *xs), *program.inputs)
    return np.random.default_rng(1).standard_normal(np.shape(out))


@jax.custom_vjp
def _scale_cotangent_fn(x: Any, scale: float) -> Any:
    return x


_scale_cotangent_fn.defvjp(lambda x, scale: (x, scale), lambda scale, g: (g * scale, None))


def _scale_cotangent(x: Any, scale: float) -> Any:
    return _scale_cotangent_fn(x, scale)


def _install(h: HookSpec, index: int, t: Tensor, calls: list[HookCall], retained: dict[str, Tensor]) -> None:
    """Register ``h`` on ``t`` as its kind's row says (NOTE [Hook kinds]), with a hook that logs what it sees."""
    kind = KIND[h.kind]
    on, method = kind.register
    owner = t if on == "tensor" else t.grad_fn
    assert owner is not None, "HookedProgram puts node hooks on intermediate values only"
    register = getattr(owner, method)

    def scaled(g: Any) -> Any:
        return None if g is None or h.scale is None else g * h.scale

    if kind.convention is RECORDS:
        register()
        retained[h.target] = t
    elif kind.convention is REPLACES_GRAD:
        def replaces_grad(g: Tensor) -> Any:
            calls.append(HookCall(index, np.asarray(g.array)))
            return scaled(g)

        register(replaces_grad)
    elif kind.convention is REPLACES_GRADS:
        def replaces_grads(grads: tuple[Any, ...], *received: tuple[Any, ...]) -> Any:
            # The gradient arriving at ``t``: its node's first input, the hook's last argument.
            arriving = (received or (grads,))[-1][0]
            calls.append(HookCall(index, np.asarray(arriving.array)))
            return None if h.scale is None else tuple(scaled(g) for g in grads)

        register(replaces_grads)
    else:  # RETURNS_NONE: it sees the leaf, its .grad written
        def returns_none(leaf: Tensor) -> None:
            grad = leaf.grad
            assert grad is not None, "the hook runs after accumulation"
            calls.append(HookCall(index, np.asarray(grad.array)))

        register(returns_none)
