"""The harness must catch real gradient bugs: each test plants one and asserts that a
hypothesis search under the ``ci`` profile, with ``xgrad.testing``'s checks, flags it with
a message that points at it, and that the same search passes on the correct version.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import xgrad
from xgrad.engine import engine
from xgrad.testing import GradcheckError, GradientMismatch, assert_grads_match, gradcheck, gradgradcheck
from xgrad.testing import strategies as xst
from xgrad.testing.invariants import InvariantError, check_hooks


def falsify(prop, **strategies):
    """Run ``prop`` as a hypothesis test under the ci profile; return what it raised (or None)."""

    def body(**drawn):
        prop(**drawn)  # the checks return True on success; a hypothesis test returns None

    # No shrinking: finding the bug is what is tested here, and shrinking costs most of the time.
    ci = settings.get_profile("ci")
    test = settings(ci, phases=[p for p in ci.phases if p != Phase.shrink])(given(**strategies)(body))
    try:
        test()
    except (AssertionError, GradcheckError) as exc:  # GradcheckError is a RuntimeError, as PyTorch's
        return exc
    return None


def matrices():
    return st.tuples(st.integers(1, 4), st.integers(1, 4))


# -- 1. a backward off by a factor (from_jax + custom_vjp) ------------------------------
def _sin_with_vjp(factor):
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (factor * g * jnp.cos(x),))
    return xgrad.ops.from_jax(f, name=f"sin_times_{factor}")


@pytest.mark.parametrize("factor", [2.0, 1.0], ids=["buggy", "correct"])
def test_backward_off_by_a_factor(factor):
    op = _sin_with_vjp(factor)
    found = falsify(lambda x: gradcheck(op, [x]), x=xst.tensors(xst.shapes(0, 2)))
    if factor == 1.0:
        assert found is None
        return
    assert isinstance(found, GradcheckError)
    assert "with respect to input 0" in str(found) and "analytical / numerical = 2" in str(found)


# -- 2. a missing broadcast reduction (autograd.Function) ------------------------------
def _bias_add(reduce_batch):
    class BiasAdd(xgrad.autograd.Function):
        @staticmethod
        def forward(ctx, x, b):
            return x + b

        @staticmethod
        def backward(ctx, g):
            # The bias was broadcast over the batch: its gradient sums over it. The bug
            # takes the first row, as if the batch had one element.
            return g, g.sum(dim=0) if reduce_batch else g[0]

    return BiasAdd.apply


@pytest.mark.parametrize("reduce_batch", [False, True], ids=["buggy", "correct"])
def test_missing_broadcast_reduction(reduce_batch):
    op = _bias_add(reduce_batch)

    def prop(shape):
        rng = np.random.default_rng(0)
        x, b = rng.standard_normal(shape), rng.standard_normal(shape[1:])
        assert_grads_match(op, x, b, reference=lambda x, b: x + b, modes=("eager", "jax"))

    found = falsify(prop, shape=matrices())
    if reduce_batch:
        assert found is None
        return
    assert isinstance(found, GradientMismatch)
    assert "eager vs jax disagree on the gradient w.r.t. input 1" in str(found)


# -- 3. a transposed matmul gradient (defprim, register=False) --------------------------
def _matmul(transposed_bug):
    x_rule = (lambda g, out, x, y: g @ y) if transposed_bug else (lambda g, out, x, y: g @ y.mT)
    return xgrad.ops.defprim("my_matmul", jnp.matmul, (x_rule, lambda g, out, x, y: x.mT @ g), register=False)


@pytest.mark.parametrize("bug", [True, False], ids=["buggy", "correct"])
def test_transposed_matmul_grad(bug):
    op = _matmul(bug)
    pairs = st.integers(1, 4).flatmap(lambda n: st.tuples(xst.tensors((n, n)), xst.tensors((n, n))))
    found = falsify(lambda xy: gradcheck(op, list(xy)), xy=pairs)
    if not bug:
        assert found is None
        return
    assert isinstance(found, GradcheckError)
    assert "with respect to input 0" in str(found)


# -- 4. a sign error only for negative inputs (autograd.Function) ------------------------
def _abs(bug):
    class Abs(xgrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.abs()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * xgrad.where(x > 0, 1.0, 1.0 if bug else -1.0)

    return Abs.apply


@pytest.mark.parametrize("bug", [True, False], ids=["buggy", "correct"])
def test_sign_error_only_for_negative_inputs(bug):
    op = _abs(bug)
    away_from_kink = st.floats(0.1, 3.0) | st.floats(-3.0, -0.1)
    seen = []

    def prop(x):
        seen.append(x)
        gradcheck(op, [x])

    found = falsify(prop, x=xst.tensors(xst.shapes(0, 2), elements=away_from_kink))
    if not bug:
        assert found is None
        return
    assert isinstance(found, GradcheckError)
    # The message names the element; in the (shrunk) failing input that element is negative.
    message = str(found)
    assert "numerical -1.0" in message and "analytical 1.0" in message
    index = message.split("d input[0]")[1].split(":")[0]
    failing = seen[-1].detach().numpy()
    assert failing[tuple(eval(index))] < 0  # noqa: S307  (our own message)


# -- 5. a wrong second derivative (from_jax + custom_vjp) ------------------------------
def _sin(bad_second_derivative):
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    # Stopping the gradient through x keeps the first derivative right and makes the
    # second one zero instead of -sin(x).
    through = jax.lax.stop_gradient if bad_second_derivative else (lambda v: v)
    f.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (g * jnp.cos(through(x)),))
    return xgrad.ops.from_jax(f, name="my_sin")


@pytest.mark.parametrize("bug", [True, False], ids=["buggy", "correct"])
def test_wrong_second_derivative(bug):
    op = _sin(bug)
    small = xst.shapes(0, 1, max_side=3)
    found_first = falsify(lambda x: gradcheck(op, [x]), x=xst.tensors(small))
    assert found_first is None  # first order is right either way
    found = falsify(lambda x: gradgradcheck(op, [x]), x=xst.tensors(small, lo=0.5, hi=2.5))
    found_vs_jax = falsify(
        lambda shape: assert_grads_match(op, np.linspace(0.5, 2.5, int(np.prod(shape))).reshape(shape), reference=jnp.sin,
                                         modes=("eager", "jax"), order=2),
        shape=small,
    )
    if not bug:
        assert found is None and found_vs_jax is None
        return
    assert isinstance(found, GradcheckError) and "second-order (gradgradcheck" in str(found)
    assert "with respect to input 0" in str(found)
    assert isinstance(found_vs_jax, GradientMismatch) and "second-order gradient w.r.t. input 0" in str(found_vs_jax)


# -- 6. a hook fired twice (an engine bug, planted) -------------------------------------
@pytest.mark.parametrize("bug", [True, False], ids=["buggy", "correct"])
def test_hook_fired_twice(bug, monkeypatch):
    if bug:
        original = engine.call_tensor_pre_hooks
        monkeypatch.setattr(engine, "call_tensor_pre_hooks", lambda fn, inputs: original(fn, original(fn, inputs)))
    small = xst.programs(max_nodes=3, max_side=2)
    found = falsify(lambda hooked: check_hooks(hooked), hooked=xst.graphs_with_hooks(small, kinds=("tensor", "prehook", "posthook")))
    if not bug:
        assert found is None
        return
    assert isinstance(found, InvariantError)
    assert "fired 2 times in one backward (expected 1)" in str(found) and "tensor hook on" in str(found)

