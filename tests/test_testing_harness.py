"""The property-testing harness as a user meets it: hypothesis's own defaults, float32 rules, shrinking."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from xgrad.testing import GradientMismatch, assert_grads_match
from xgrad.testing import strategies as xst


def _layer_norm_math(x):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)


def _layer_norm_fwd(x):
    mu = x.mean(-1, keepdims=True)
    rstd = jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    return (x - mu) * rstd, ((x - mu) * rstd, rstd)


def _layer_norm_bwd(res, g):  # the textbook rule, correct
    xhat, rstd = res
    return (rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True)),)


def _layer_norm(bwd):
    fn = jax.custom_vjp(_layer_norm_math)
    fn.defvjp(_layer_norm_fwd, bwd)
    return fn


WRONG_RULES = {
    "missing_projection_term": lambda res, g: (res[1] * (g - g.mean(-1, keepdims=True)),),
    "off_by_one_percent": lambda res, g: (1.01 * _layer_norm_bwd(res, g)[0],),
}


def _inputs(std, seed):
    # Small spreads make the rule's rounding large: 1/std amplifies it.
    return (1.0 + std * np.random.default_rng(100 + seed).standard_normal((4, 64))).astype(np.float32)


@pytest.mark.parametrize("std", [0.1, 0.01])
def test_a_correct_float32_rule_passes_the_default_tolerances(std):
    layer_norm = _layer_norm(_layer_norm_bwd)
    flagged_before = 0
    for seed in range(3):
        x = _inputs(std, seed)
        assert_grads_match(layer_norm, x, modes=("eager", "jax"), seed=seed)
        try:  # the old fixed tolerance, float64's
            assert_grads_match(layer_norm, x, modes=("eager", "jax"), seed=seed, atol=1e-6, rtol=1e-5)
        except GradientMismatch:
            flagged_before += 1
    assert flagged_before >= 1  # these inputs are the ones float64's tolerance calls wrong


@pytest.mark.parametrize("name", sorted(WRONG_RULES))
@pytest.mark.parametrize("std", [1.0, 0.1, 0.01])
def test_a_wrong_float32_rule_still_fails(name, std):
    with pytest.raises(GradientMismatch, match="eager vs jax disagree on the gradient w.r.t. input 0"):
        assert_grads_match(_layer_norm(WRONG_RULES[name]), _inputs(std, 0), modes=("eager", "jax"))


def test_float64_keeps_its_tolerance():
    # A relative error of 2e-5 is a failure in float64 as before (rtol 1e-5), and within float32's.
    scaled = _layer_norm(lambda res, g: ((1 + 2e-5) * _layer_norm_bwd(res, g)[0],))
    x = _inputs(1.0, 0)
    with pytest.raises(GradientMismatch):
        assert_grads_match(scaled, x.astype(np.float64), modes=("eager", "jax"))
    assert_grads_match(scaled, x, modes=("eager", "jax"))


def _count_compiles(fn):
    compiles = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        fn()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    return len(compiles)


@pytest.mark.parametrize("modes", [("eager", "jax"), ("eager", "compiled", "jax")])
def test_checking_the_same_function_again_compiles_nothing(modes):
    # What makes shrinking fast: every example of the same shape reuses the programs.
    layer_norm = _layer_norm(_layer_norm_bwd)
    rng = np.random.default_rng(0)
    assert _count_compiles(lambda: assert_grads_match(layer_norm, rng.standard_normal((3, 4)), modes=modes)) > 0
    assert _count_compiles(lambda: assert_grads_match(layer_norm, rng.standard_normal((3, 4)), modes=modes)) == 0
    program_fn = lambda np, x: np.tanh(x) * x  # noqa: E731
    assert_grads_match(program_fn, rng.standard_normal(5), modes=modes)
    assert _count_compiles(lambda: assert_grads_match(program_fn, rng.standard_normal(5), modes=modes)) == 0


def _under_hypothesis_defaults(test):
    """Run ``test`` under hypothesis's own default profile, as a plain ``pytest`` would, with no example database."""
    previous = settings.default
    settings.load_profile("default")
    try:
        test()
    finally:
        settings.register_profile("_restored", previous)
        settings.load_profile("_restored")


def test_harness_examples_run_under_plain_pytest_defaults():
    # A fresh custom_vjp: its first calls compile, well over hypothesis's 200 ms deadline.
    @jax.custom_vjp
    def softplus(x):
        return jnp.logaddexp(x, 0.0)

    softplus.defvjp(lambda x: (softplus(x), x), lambda x, g: (g * jax.nn.sigmoid(x),))

    def run():
        @xst.harness_settings(max_examples=8, database=None)
        @given(xst.tensors(lo=-30.0, hi=30.0, kinks=(0.0,)))
        def test_softplus_rule(x):
            assert_grads_match(softplus, x, modes=("eager", "jax"))

        test_softplus_rule()

    _under_hypothesis_defaults(run)


@pytest.mark.slow
def test_a_wrong_custom_vjp_fails_and_shrinks_in_seconds():
    @jax.custom_vjp
    def softplus(x):
        return jnp.logaddexp(x, 0.0)

    # Wrong above 1.5 only: hypothesis finds such an element, then shrinks the array to it.
    softplus.defvjp(lambda x: (softplus(x), x), lambda x, g: (g * jax.nn.sigmoid(x) * jnp.where(x > 1.5, 1.1, 1.0),))
    examples = []

    def run():
        @xst.harness_settings(database=None, derandomize=True)
        @given(xst.tensors(shape=xst.shapes(min_dims=1, max_dims=2, max_side=8), lo=-30.0, hi=30.0, kinks=(0.0,)))
        def test_softplus_rule(x):
            examples.append(x.detach().numpy())
            assert_grads_match(softplus, x, modes=("eager", "jax"))

        with pytest.raises(GradientMismatch):
            test_softplus_rule()

    start = time.process_time()
    _under_hypothesis_defaults(run)
    seconds = time.process_time() - start
    assert examples[-1].shape == (1,) and examples[-1][0] > 1.5  # the reported example: the one wrong element
    assert seconds < 10, f"finding and shrinking took {seconds:.1f} s of CPU over {len(examples)} examples"
