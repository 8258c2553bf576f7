"""Differential fuzzing: random op programs against ``jax.vjp`` of the same program.

Each drawn program (``xgrad.testing.strategies.programs``: DAGs of registered ops with
shared subexpressions, fan-in and fan-out) runs in all three xgrad modes (the eager
engine, the compiled backward, ``xgrad.compile`` of the whole step) and as plain
``jax.numpy``; values and vector-Jacobian products must agree. Under the ``ci``
hypothesis profile the draws are derandomized, so CI sees the same programs each run;
``XGRAD_HYPOTHESIS_PROFILE=thorough`` searches many more.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import xgrad
from xgrad.engine.compiled import RecompileWarning
from xgrad.testing import assert_grads_match
from xgrad.testing import strategies as xst

ATOL, RTOL = 1e-6, 1e-5


def _close(what, got, want, program):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} {got.dtype} vs {want.shape} {want.dtype}\n{program}"
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{what}\n{program!r}")


def _whole_step_matches_jax(program):
    arrays = [jnp.asarray(x) for x in program.inputs]
    out, pullback = jax.vjp(lambda *xs: program(jnp, *xs), *arrays)
    cotangent = np.random.default_rng(0).standard_normal(np.shape(out))
    want = pullback(jnp.asarray(cotangent, out.dtype))

    def step(*leaves):
        value = program(xgrad, *leaves)
        return value.detach(), xgrad.autograd.grad(value, list(leaves), xgrad.tensor(cotangent), allow_unused=True)

    leaves = [xgrad.tensor(x, requires_grad=True) for x in program.inputs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecompileWarning)  # every program is a new one
        value, grads = xgrad.compile(step, fallback="error")(*leaves)
    _close("xgrad.compile forward", value.array, out, program)
    for k, (g, w) in enumerate(zip(grads, want, strict=True)):
        _close(f"xgrad.compile gradient w.r.t. input {k}", np.zeros_like(w) if g is None else g.array, w, program)


# Each example compiles three programs (compiled backward, xgrad.compile, jax.jit): half the
# profile's examples keep the ci run near 20 s; thorough still draws 150.
@pytest.mark.slow
@settings(deadline=None, max_examples=max(4, settings().max_examples // 2))
@given(xst.programs(max_nodes=4, max_side=3))
def test_random_programs_match_jax_vjp_in_every_mode(program):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecompileWarning)
        assert_grads_match(program, *program.inputs, modes=("eager", "compiled", "jax"), atol=ATOL, rtol=RTOL)
    _whole_step_matches_jax(program)
