"""Hypothesis strategies for gradient tests: dtypes, shapes, tensors, random programs, hooks.

Decorate a test with ``harness_settings()`` too: the first call of each new shape
compiles, which hypothesis's default deadline (200 ms) would report as a failure.

>>> from hypothesis import given
>>> from xgrad.testing import assert_grads_match, strategies as xst
>>> @xst.harness_settings()
... @given(xst.programs(max_nodes=4))
... def test_program(program):
...     assert_grads_match(program, *program.inputs, modes=("eager", "jax"))
>>> test_program()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import xgrad
from xgrad.testing.program_families import INPLACE_OPS
from xgrad.testing.programs import HOOK_KINDS, KIND, HookedProgram, HookSpec, Program, build_program, program_ops

__all__ = [
    "broadcastable_shapes", "dtypes", "graphs_with_hooks", "harness_settings", "inplace_chains", "programs", "shapes", "tensors",
]

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def harness_settings(**changes: Any) -> settings:
    """The hypothesis settings a test of xgrad's checks needs, on top of the active profile.

    No ``deadline``: the first call of each new shape or function compiles XLA programs
    (a second or so), which the default deadline of 200 ms reports as a flaky failure; later
    calls of the same shapes reuse them. The ``too_slow`` health check is off for the same
    reason. Everything else (``max_examples``, the database, a profile you loaded) is left
    as it is; ``changes`` are further settings. Use it as a decorator, next to ``@given``.

    >>> from hypothesis import given
    >>> from xgrad.testing import strategies as xst
    >>> @xst.harness_settings(max_examples=5)
    ... @given(xst.tensors(shape=(2,)))
    ... def test_tanh_bounded(x):
    ...     assert (x.tanh().abs() <= 1).all().item()
    >>> test_tanh_bounded()
    """
    options = {"deadline": None, "suppress_health_check": [*settings().suppress_health_check, HealthCheck.too_slow]}
    return settings(**{**options, **changes})


def _x64() -> bool:
    """Whether float64 arrays exist now (``jax_enable_x64``, also inside a scoped ``jax.enable_x64``)."""
    return bool(jax.dtypes.canonicalize_dtype(np.float64) == np.float64)


def dtypes(names: Sequence[str] | None = None) -> st.SearchStrategy[Any]:
    """Floating dtypes (``jnp.dtype``); by default float16, bfloat16, float32, and float64 when x64 is on."""
    if names is None:
        names = FLOAT_DTYPES if _x64() else tuple(n for n in FLOAT_DTYPES if n != "float64")
    return st.sampled_from([jnp.dtype(n) for n in names])


def shapes(min_dims: int = 0, max_dims: int = 3, min_side: int = 1, max_side: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Array shapes, 0-dim included when ``min_dims`` is 0."""
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def broadcastable_shapes(n: int = 2, min_dims: int = 0, max_dims: int = 3, max_side: int = 4) -> st.SearchStrategy[tuple[tuple[int, ...], ...]]:
    """``n`` shapes that broadcast together (size-1 and missing leading dims)."""
    return hnp.mutually_broadcastable_shapes(num_shapes=n, min_dims=min_dims, max_dims=max_dims, max_side=max_side).map(
        lambda r: tuple(r.input_shapes)
    )


def _elements(dtype: Any, lo: float | None, hi: float | None, kinks: Sequence[float], allow_nan: bool,
              allow_infinity: bool) -> st.SearchStrategy[float]:
    width: Literal[16, 32, 64] = 16 if jnp.dtype(dtype).itemsize <= 2 else 32 if jnp.dtype(dtype).itemsize == 4 else 64
    if jnp.dtype(dtype) == jnp.bfloat16:  # bfloat16 has float32's range, not float16's
        width = 32
    floats = st.floats(lo, hi, allow_nan=allow_nan, allow_infinity=allow_infinity and (lo is None or hi is None), width=width)
    return st.one_of(st.sampled_from(list(kinks)), floats) if kinks else floats


@st.composite
def tensors(
    draw: Any,
    shape: Any = None,
    dtype: Any = None,
    elements: st.SearchStrategy[float] | None = None,
    requires_grad: bool = True,
    lo: float | None = -3.0,
    hi: float | None = 3.0,
    kinks: Sequence[float] = (),
    allow_nan: bool = False,
    allow_infinity: bool = False,
) -> xgrad.Tensor:
    """An ``xgrad.Tensor``.

    Args:
        shape: a shape, a shape strategy, or ``None`` for ``shapes()``.
        dtype: a dtype or a dtype strategy; ``None``: float64 when x64 is on, else float32
            (no float64 request that JAX would truncate with a warning).
        elements: a strategy for the elements (drawn as floats); replaces the options below.
        requires_grad: whether the tensor is a leaf that requires grad.
        lo, hi: the range of the elements (default ``[-3, 3]``); ``None`` for no bound, up to
            the dtype's largest finite value, to test overflow (``exp`` of 100 in float32).
        kinks: values drawn often and exactly, where a function has a kink or a
            boundary (``kinks=(0.0,)`` for ``relu``, ``abs``, ``sqrt``).
        allow_nan, allow_infinity: also draw NaN, or ±inf (the latter only with an open range).

    >>> from hypothesis import given
    >>> from xgrad.testing import strategies as xst
    >>> @given(xst.tensors(shape=(3,), lo=-1.0, hi=1.0, kinks=(0.0,)))
    ... def test_relu_kink(x):
    ...     assert ((x.relu() == 0) | (x > 0)).all().item()
    >>> test_relu_kink()
    """
    if shape is None:
        shape = shapes()
    if isinstance(shape, st.SearchStrategy):
        shape = draw(shape)
    if dtype is None:
        dtype = jnp.float64 if _x64() else jnp.float32
    if isinstance(dtype, st.SearchStrategy):
        dtype = draw(dtype)
    dtype = jnp.dtype(dtype)
    if elements is None:
        elements = _elements(dtype, lo, hi, kinks, allow_nan, allow_infinity)
    values = draw(hnp.arrays(np.float64, tuple(shape), elements=elements))
    # Cast in NumPy: an explicit float64 request of JAX with x64 off would warn and truncate.
    with np.errstate(over="ignore"):
        return xgrad.tensor(values.astype(dtype), requires_grad=requires_grad)


@st.composite
def programs(
    draw: Any,
    ops: Sequence[str] | None = None,
    max_nodes: int = 6,
    max_inputs: int = 3,
    max_dims: int = 3,
    max_side: int = 3,
    smooth: bool = False,
    families: Sequence[str] = (),
    kinks: Sequence[float] = (),
    second_order: bool = False,
) -> Program:
    """Random programs: DAGs of ops from the op table with shared subexpressions,
    fan-in (several operands, sinks summed at the end) and fan-out (a value read by
    several lines). Domains hold (guards are inserted). The drawn ``Program`` is
    callable as ``program(np, *xs)``, carries sample arrays in ``program.inputs`` and
    prints as Python.

    Args:
        ops: op names to draw from (default: every op with a program expression).
        max_nodes: most op applications (guards and the final sum come on top).
        max_inputs, max_dims, max_side: input count and shape limits.
        smooth: leave out ops with kinks (abs, maximum, where, …): for ``gradcheck``.
        families: op families to draw from as well (``program_families.FAMILIES``:
            ``"functional"``, ``"losses"``, ``"recurrent"``, ``"inplace"``).
        kinks: values some input elements take exactly (``program_families.KINKS``).
        second_order: only ops with second derivatives (PyTorch's ``hardsigmoid`` has none).
    """
    specs = program_ops(ops, smooth=smooth, families=families, second_order=second_order)
    ndim = draw(st.integers(0, max_dims))
    base = [draw(st.integers(1, max_side)) for _ in range(ndim)]
    if ndim >= 2 and draw(st.booleans()):  # square trailing dims, so matmul fits
        base[-1] = base[-2]
    n_inputs = draw(st.integers(1, max_inputs))
    input_shapes = []
    for _ in range(n_inputs):
        ones = draw(st.lists(st.booleans(), min_size=ndim, max_size=ndim))
        input_shapes.append(tuple(1 if one else s for s, one in zip(base, ones, strict=True)))
    steps = []
    for k in range(draw(st.integers(1, max_nodes))):
        spec = draw(st.sampled_from(specs))
        arity = len(spec.domains)
        # Operands by index into all values so far; later values are as likely as early ones.
        operands = [draw(st.integers(0, n_inputs + 2 * k + 1)) for _ in range(arity)]
        steps.append((spec, operands))
    seed = draw(st.integers(0, 2**16))
    program = build_program(input_shapes, steps, seed=seed, kinks=kinks)
    if program is None:  # no step fitted: fall back to the simplest one that always does
        program = build_program(input_shapes, [(program_ops(["tanh"])[0], [0])], seed=seed)
    return program  # type: ignore[return-value]


@st.composite
def graphs_with_hooks(draw: Any, programs_strategy: st.SearchStrategy[Program] | None = None, max_hooks: int = 6,
                      kinds: Sequence[str] = HOOK_KINDS) -> HookedProgram:
    """A random program with random hooks of every kind on its tensors.

    Each hook either observes (returns ``None``) or scales the gradient it sees.
    Check the result with ``xgrad.testing.invariants.check_hooks``.
    """
    program = draw(programs_strategy if programs_strategy is not None else programs(max_nodes=4))
    leaves = program.input_names
    computed = tuple(v for v, _ in program.lines)
    hooks = []
    for _ in range(draw(st.integers(1, max_hooks))):
        kind = draw(st.sampled_from(list(kinds)))
        row = KIND[kind]  # where it may sit and whether it may scale: NOTE [Hook kinds]
        places = (leaves if row.leaf_slot is not None else ()) + (computed if row.node_slot is not None else ())
        target = draw(st.sampled_from(places))
        scale = None
        if row.replaces and draw(st.booleans()):
            scale = draw(st.sampled_from([0.5, 2.0, -1.0, 3.0]))
        hooks.append(HookSpec(kind, target, scale))
    return HookedProgram(program, hooks)


@st.composite
def inplace_chains(draw: Any, max_length: int = 4) -> tuple[tuple[Any, ...], ...]:
    """Chains of in-place ops for one tensor, ``(method, *args)`` each, from
    ``program_families.INPLACE_OPS``: legal ones and ones PyTorch's backward refuses
    (``program_families.inplace_chain_raises`` tells which).

    >>> from hypothesis import given
    >>> from xgrad.testing.program_families import INPLACE_OPS
    >>> @given(inplace_chains())
    ... def test_chain(chain):
    ...     assert all(name in INPLACE_OPS for name, *_ in chain)
    >>> test_chain()
    """
    chain = []
    for _ in range(draw(st.integers(1, max_length))):
        name = draw(st.sampled_from(sorted(INPLACE_OPS)))
        args = (draw(st.sampled_from([-1.5, 0.5, 2.0])),) if name in ("add_", "mul_") else ()
        chain.append((name, *args))
    return tuple(chain)
