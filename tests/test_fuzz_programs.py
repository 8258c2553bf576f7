"""Differential fuzzing: random op programs against ``jax.vjp`` of the same program.

Each drawn program (``xgrad.testing.strategies.programs``: DAGs of registered ops with
shared subexpressions, fan-in and fan-out, and of the op families of
``xgrad.testing.program_families``) runs in all three xgrad modes (the eager engine, the
compiled backward, ``xgrad.compile`` of the whole step) and as plain ``jax.numpy``; values
and vector-Jacobian products must agree, and second derivatives too. Under the ``ci``
hypothesis profile the draws are derandomized, so CI sees the same programs each run;
``XGRAD_HYPOTHESIS_PROFILE=thorough`` searches many more.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xgrad
from xgrad.engine.compiled import RecompileWarning
from xgrad.testing import assert_grads_match
from xgrad.testing import strategies as xst
from xgrad.testing.program_families import FAMILIES, KINKS, inplace_chain_raises, namespace

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


# The op families beyond the op table (xgrad/testing/program_families.py): nn.functional
# activations, the losses, recurrent cells and in-place chains, with input elements drawn
# exactly at the activations' kinks, where the references take PyTorch's derivatives.
def _family_programs(family, **options):
    """Programs of ``family``'s ops alone (the op table's appear in the test above)."""
    return xst.programs(ops=[spec.name for spec in FAMILIES[family]], families=[family], max_nodes=3, max_side=3,
                        **options)


# A third of the profile's examples per family: each compiles three programs.
@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(deadline=None, max_examples=max(3, settings().max_examples // 3))
@given(data=st.data())
def test_family_programs_at_kinks_match_jax_vjp_in_every_mode(family, data):
    program = data.draw(_family_programs(family, kinks=KINKS), label="program")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecompileWarning)
        assert_grads_match(program, *program.inputs, modes=("eager", "compiled", "jax"), atol=ATOL, rtol=RTOL)
    _whole_step_matches_jax(program)


# Second derivatives (away from kinks, where PyTorch's conventions and JAX's differ) against JAX's.
@pytest.mark.parametrize("family", sorted(FAMILIES))
@settings(deadline=None, max_examples=max(3, settings().max_examples // 3))
@given(data=st.data())
def test_family_programs_second_derivatives_match_jax(family, data):
    program = data.draw(_family_programs(family, second_order=True), label="program")
    assert_grads_match(program, *program.inputs, modes=("eager", "jax"), order=2, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@settings(deadline=None)
@given(chain=xst.inplace_chains(), view=st.booleans(), x=xst.tensors(shape=(2, 3), kinks=KINKS, requires_grad=False))
def test_inplace_chains_raise_exactly_where_pytorch_raises(mode, chain, view, x):
    # PyTorch refuses the backward once an op that saved its result (exp_, tanh_, sigmoid_,
    # relu_) sees a later in-place write to that tensor; any other chain differentiates.
    leaf = xgrad.tensor(x.numpy(), requires_grad=True)
    out = namespace(xgrad).inplace(leaf, chain, view=view)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecompileWarning)
        if inplace_chain_raises(chain):
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                out.sum().backward(compiled=mode == "compiled")
            return
        out.sum().backward(compiled=mode == "compiled")
    want = jax.grad(lambda a: namespace(jnp).inplace(a, chain).sum())(jnp.asarray(x.numpy()))
    _close("gradient through the in-place chain", leaf.grad.array, want, chain)
