"""The XLA options eager's small programs are compiled with (NOTE [Fast compiles]).

# NOTE [Fast compiles]
# Eager xgrad compiles one small program per op, dtype and shape (its forward, its
# fused backward rules) and one per optimizer update, and a new batch size compiles
# the ops' programs again. XLA's CPU compiler spends most of such a program's compile
# time on its MLIR fusion emitters and LLVM's expensive passes, which buy a small
# program's run time nothing. These programs are compiled without them
# (``xla_cpu_use_fusion_emitters`` off: XLA's loop emitters, its default until 2025;
# ``xla_llvm_disable_expensive_passes``): about half the compile time of a program
# (Adam's update of the demo 0.24 -> 0.12 CPU s, ``cross_entropy`` 0.12 -> 0.06), a
# quarter less CPU for the demo's first step and a step at a new batch size
# (``benchmarks/RESULTS.md``, "Cold programs"). Results agree with XLA's defaults to
# rounding: of the op table's 376 ops and dtypes, 357 give the same bits and the
# others (``tan``, reductions in means, norms, pools and losses, whose arithmetic the
# loop emitters order or contract otherwise) lie within 2 epsilons of their scale
# (``tests/test_fast_compile.py``). ``xla_backend_optimization_level=0``, which the test
# suite also sets, would halve compile times again but is left out: it runs
# elementwise kernels unvectorized, 3-4x slower from a few thousand elements on.
# JAX takes compiler options on top-level programs only: under a trace that stages
# (``jax.jit``, ``xgrad.compile``, the compiled backward) an op's program is inlined into
# the traced one, whose options rule, so there the same function runs as a plain jit.
# Only on CPU: on an accelerator both options would reach that backend's kernels, whose
# compile times were not measured. An option the running XLA does not know (a later
# XLA drops the loop emitters) is left out: asked once per process by compiling an empty
# program, as ``tests/_scripts.py`` asks of the flags it passes the suite.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import jax

from xgrad.jax_internals import get_opaque_trace_state

__all__ = ["FAST_COMPILE_CANDIDATES", "FastJit", "fast_compiler_options"]

FAST_COMPILE_CANDIDATES: dict[str, Any] = {
    "xla_cpu_use_fusion_emitters": False,
    "xla_llvm_disable_expensive_passes": True,
}
_UNKNOWN_OPTION = re.compile(r"No such compile option: '([^']+)'")

_lock = threading.Lock()
_known: dict[str, Any] | None = None


def _options_xla_knows(candidates: dict[str, Any]) -> dict[str, Any]:
    """``candidates`` less those the running XLA refuses (it names one per refusal)."""
    remaining = dict(candidates)
    while remaining:
        try:
            jax.jit(lambda: None, compiler_options=remaining).lower().compile()
        except jax.errors.JaxRuntimeError as e:
            match = _UNKNOWN_OPTION.search(str(e))
            if match is None or match.group(1) not in remaining:
                raise
            del remaining[match.group(1)]
        else:
            break
    return remaining


def fast_compiler_options() -> dict[str, Any]:
    """The ``compiler_options=`` of an eager op's or optimizer update's ``jax.jit`` (NOTE [Fast compiles]).

    >>> import jax, xgrad.fast_compile as fc
    >>> options = fc.fast_compiler_options()
    >>> set(options) <= set(fc.FAST_COMPILE_CANDIDATES) and (options == {} or jax.default_backend() == "cpu")
    True
    """
    global _known
    known = _known
    if known is None:
        with _lock:
            if _known is None:
                _known = _options_xla_knows(FAST_COMPILE_CANDIDATES) if jax.default_backend() == "cpu" else {}
            known = _known
    return known


_TOP_LEVEL = get_opaque_trace_state(convention="xgrad")  # the same in every thread outside any JAX trace


class FastJit:
    """``jax.jit(fun, **jit_kwargs)`` compiled with ``fast_compiler_options()`` where JAX allows it (NOTE [Fast compiles]).

    Calling it runs the fast program; called inside a trace that stages, where JAX refuses
    compiler options, it runs ``plain`` (the jit without them), which a caller that knows
    its arguments are traced calls directly.

    >>> import jax, jax.numpy as jnp
    >>> from xgrad.fast_compile import FastJit
    >>> double = FastJit(lambda x: 2 * x)
    >>> double(jnp.ones(2)).tolist(), jax.jit(lambda x: double(x) + 1)(jnp.ones(2)).tolist()
    ([2.0, 2.0], [3.0, 3.0])
    """

    __slots__ = ("fast", "plain")

    def __init__(self, fun: Any, **jit_kwargs: Any) -> None:
        self.fast = jax.jit(fun, compiler_options=fast_compiler_options(), **jit_kwargs)
        self.plain = jax.jit(fun, **jit_kwargs)

    def __call__(self, *args: Any) -> Any:
        try:
            return self.fast(*args)
        except ValueError:
            if get_opaque_trace_state(convention="xgrad") == _TOP_LEVEL:
                raise
            return self.plain(*args)  # refused under a trace; a real error raises here again
