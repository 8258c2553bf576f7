"""``xgrad.testing`` itself: gradcheck, assert_grads_match, strategies, invariants, the plugin."""

import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _scripts import run_json
from hypothesis import given, settings
from hypothesis import strategies as st

import xgrad
from xgrad.testing import GradcheckError, GradientMismatch, assert_grads_match, gradcheck, gradgradcheck, invariants
from xgrad.testing import finite_differences as gradcheck_module
from xgrad.testing import strategies as xst
from xgrad.testing.op_specs import specs_for
from xgrad.testing.programs import HOOK_KINDS, HookedProgram, HookSpec, Program, build_program


def _scaled_sin(factor):
    return xgrad.ops.defprim(
        "scaled_sin", jnp.sin, (lambda g, out, x: g * x.cos() * factor,), register=False
    )


# -- gradcheck ------------------------------------------------------------------------------
@pytest.mark.parametrize("fast_mode", [False, True])
def test_gradcheck_passes_and_upcasts_to_float64(fast_mode):
    seen = []

    def fn(x, y):
        seen.append(x.dtype)
        return (x @ y).tanh(), x.exp().sum()

    x = xgrad.tensor(np.random.default_rng(0).standard_normal((2, 3)), dtype=jnp.float32, requires_grad=True)
    y = xgrad.tensor(np.random.default_rng(1).standard_normal((3, 2)), requires_grad=True)
    with pytest.warns(UserWarning, match="Input #0 requires gradient and is not a double precision"):
        assert gradcheck(fn, (x, y), fast_mode=fast_mode) is True
    assert set(seen) == {jnp.dtype(jnp.float64)}


@pytest.mark.parametrize("fast_mode", [False, True])
def test_gradcheck_failure_names_input_output_and_worst_element(fast_mode):
    op = _scaled_sin(1.5)
    x = xgrad.tensor(np.array([0.1, 0.2, 3.0]), requires_grad=True)
    c = xgrad.tensor(np.ones(2))  # not differentiated: passed through

    with pytest.raises(GradcheckError) as info:
        gradcheck(lambda c, x: (c.sum() * x, op(x)), (c, x), fast_mode=fast_mode)
    message = str(info.value)
    assert "output 1 with respect to input 1" in message
    # worst element: the diagonal entry with the largest |cos|, x[0]
    assert "d output[1][0] / d input[1][0]" in message
    assert f"numerical {float(np.cos(0.1))!r}"[:18] in message and "analytical / numerical = 1.5" in message
    assert gradcheck(lambda c, x: op(x), (c, x), raise_exception=False, fast_mode=fast_mode) is False


def test_gradcheck_fast_mode_is_the_default_for_large_inputs(monkeypatch):
    calls = []
    monkeypatch.setattr(gradcheck_module, "_check_full", lambda *a: calls.append("full"))
    monkeypatch.setattr(gradcheck_module, "_check_fast", lambda *a: calls.append("fast"))
    gradcheck(lambda x: x * 2, [np.ones(3)])
    gradcheck(lambda x: x * 2, [np.ones(100)])
    assert calls == ["full", "fast"]


def test_gradcheck_checks_plain_arrays_and_unused_inputs():
    assert gradcheck(lambda x, y: x.sin(), [np.ones(2), np.ones(3)])
    with pytest.raises(ValueError, match="at least one input tensor to require gradient"):
        gradcheck(lambda x: x, [xgrad.tensor(np.ones(2))])


def test_gradcheck_leaves_the_process_x64_setting_as_it_was():
    # A fresh process with x64 off: the checks run in float64 (they catch an error of
    # 1e-7 that float32 differences could not see) and afterwards new arrays are float32
    # again, with no warning raised on the way.
    result = run_json(
        """
        import json, warnings
        warnings.simplefilter("error")
        jax.config.update("jax_enable_x64", False)
        import jax.numpy as jnp
        import numpy as np
        import xgrad
        from xgrad.testing import gradcheck, gradgradcheck

        @jax.custom_vjp
        def almost_sin(x):
            return jnp.sin(x)
        almost_sin.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (g * (jnp.cos(x) + 1e-4),))
        bad = xgrad.ops.from_jax(almost_sin)
        x = xgrad.tensor([0.3, -1.2], requires_grad=True)
        with warnings.catch_warnings():  # x is float32 (x64 is off): gradcheck says so, as PyTorch's does
            warnings.filterwarnings("ignore", "Input #0 requires gradient and is not a double precision")
            passed = gradcheck(lambda t: t.sin(), (x,)) and gradgradcheck(lambda t: t.exp() * t, (x,))
            caught = not gradcheck(bad, (x,), atol=1e-6, rtol=1e-6, raise_exception=False)
        print(json.dumps({
            "passed": bool(passed), "caught": caught, "x64": bool(jax.config.jax_enable_x64),
            "dtypes": [str(t.dtype) for t in (xgrad.tensor([1.0]), xgrad.randn(2), xgrad.zeros(2), x * 2)],
        }))
        """,
        devices=1,
    )
    assert result == {"passed": True, "caught": True, "x64": False, "dtypes": ["float32"] * 4}


def test_gradgradcheck_flags_only_second_order_bugs():
    @jax.custom_vjp
    def f(x):
        return x**3

    f.defvjp(lambda x: (x**3, x), lambda x, g: (3 * g * jax.lax.stop_gradient(x) ** 2,))
    op = xgrad.ops.from_jax(f, name="cube")
    x = np.array([0.5, -1.5])
    assert gradcheck(op, [x])
    with pytest.raises(GradcheckError, match="second-order.*with respect to input 0"):
        gradgradcheck(op, [x])
    assert gradgradcheck(lambda t: t**3, [x])
    assert gradgradcheck(lambda t: t**3, [x], grad_outputs=[np.array([1.0, -2.0])])


# -- assert_grads_match -----------------------------------------------------------------------
def test_assert_grads_match_fn_written_once():
    fn = lambda np, x, y: np.sum(np.exp(x) * np.maximum(x, y), axis=-1, keepdims=True)  # noqa: E731
    x, y = np.random.default_rng(0).standard_normal((2, 2, 3))
    assert_grads_match(fn, x, y, modes=("eager", "jax"), order=2)


def test_assert_grads_match_compiled_mode():
    fn = lambda np, x, y: np.tanh(x @ y) * x.sum()  # noqa: E731
    x, y = np.random.default_rng(0).standard_normal((2, 3, 3))
    assert_grads_match(fn, x, y)  # eager, compiled and jax


def test_assert_grads_match_names_the_disagreeing_pair_and_element():
    op = _scaled_sin(-1.0)
    x = np.array([[0.1, 0.5], [1.0, -2.0]])
    with pytest.raises(GradientMismatch) as info:
        assert_grads_match(op, x, reference=jnp.sin, modes=("eager", "jax"))
    message = str(info.value)
    found = re.match(r"eager vs jax disagree on the gradient w.r.t. input 0: worst element at index \((\d), (\d)\): "
                     r"(-?[\d.]+) vs (-?[\d.]+)", message)
    assert found, message
    assert float(found[3]) == pytest.approx(-float(found[4]))  # the planted sign flip
    with pytest.raises(GradientMismatch, match="forward output 0"):
        assert_grads_match(lambda t: t.cos(), x, reference=jnp.sin, modes=("eager", "jax"))
    with pytest.raises(GradientMismatch, match="dtypes differ: float32 vs float64"):
        assert_grads_match(lambda t: t.float(), x, reference=lambda a: a, modes=("eager", "jax"))
    with pytest.raises(ValueError, match="modes must be at least two of"):
        assert_grads_match(op, x, reference=jnp.sin, modes=("eager",))


# -- strategies -------------------------------------------------------------------------------
@settings(max_examples=20)
@given(xst.broadcastable_shapes(3), st.data())
def test_broadcastable_shapes_broadcast_and_tensors_follow_their_spec(shapes, data):
    np.broadcast_shapes(*shapes)
    dtype = data.draw(xst.dtypes())
    t = data.draw(xst.tensors(shapes[0], dtype=dtype, lo=-1.0, hi=1.0))
    assert t.shape == shapes[0] and t.dtype == dtype and t.requires_grad and t.is_leaf
    assert np.all(np.abs(t.detach().numpy().astype(np.float64)) <= 1.0)


def test_program_source_is_runnable_python():
    # operands index all values so far: x0, x1, then each line (the guard is value 2)
    p = build_program([(2, 3), (3,)], [(specs_for("log")[0], [0]), (specs_for("mul")[0], [3, 1]),
                                       (specs_for("exp")[0], [1])], seed=3)
    # log of a value that can be negative gets a guard; the two sinks are summed at the end
    assert p.source.splitlines() == [
        "def program(np, x0, x1):",
        "    v0 = np.exp(np.tanh(x0))",
        "    v1 = np.log(v0)",
        "    v2 = v1 * x1",
        "    v3 = np.exp(x1)",
        "    v4 = v2 + v3",
        "    return v4",
    ]
    namespace = {}
    exec(p.source, namespace)  # noqa: S102
    np.testing.assert_allclose(namespace["program"](jnp, *p.inputs), p(np, *p.inputs), rtol=1e-12)
    assert "# input shapes: x0: [2, 3], x1: [3]" in repr(p)


@settings(max_examples=15)
@given(xst.programs(max_nodes=5))
def test_programs_stay_in_domain_and_share_subexpressions(program):
    assert isinstance(program, Program)
    out = program(np, *program.inputs)
    assert np.all(np.isfinite(out))
    # every line reaches the output
    users = program.uses()
    reached = {program.output}
    for var, _ in reversed(program.lines):
        if users[var] & reached:
            reached.add(var)
    assert reached == {v for v, _ in program.lines}


def test_programs_draw_fan_in_and_fan_out():
    found = {"fan_out": False, "fan_in": False}

    @settings(max_examples=40, derandomize=True)
    @given(xst.programs(max_nodes=6))
    def look(program):
        users = program.uses()
        found["fan_out"] |= any(len(u) > 1 for u in users.values())
        found["fan_in"] |= any(len(set(re.findall(r"\b[xv]\d+\b", expr))) > 1 for _, expr in program.lines)

    look()
    assert found == {"fan_out": True, "fan_in": True}


@settings(max_examples=8)
@given(xst.programs(max_nodes=3, max_side=2))
def test_programs_agree_across_xgrad_and_jax(program):
    assert_grads_match(program, *program.inputs, modes=("eager", "jax"), order=2)


@settings(max_examples=6)
@given(xst.programs(max_nodes=3, smooth=True, max_side=2))
def test_smooth_programs_pass_gradcheck(program):
    assert gradcheck(lambda *xs: program(xgrad, *xs), program.inputs)


# -- invariants -------------------------------------------------------------------------------
@settings(max_examples=8)
@given(xst.graphs_with_hooks(xst.programs(max_nodes=3, max_side=2), max_hooks=5))
def test_graphs_with_hooks_satisfy_the_hook_invariants(hooked):
    assert {h.kind for h in hooked.hooks} <= set(HOOK_KINDS)
    invariants.check_hooks(hooked)


def test_check_hooks_catches_a_wrong_value():
    p = build_program([(3,)], [(specs_for("sin")[0], [0]), (specs_for("mul")[0], [1, 0])])
    hooked = HookedProgram(p, [HookSpec("tensor", "v0", 2.0), HookSpec("post_accumulate", "x0")])
    invariants.check_hooks(hooked)
    # Lie about the scale: the real run scales by 2, the reference now expects 3.
    liar = HookedProgram(p, [HookSpec("tensor", "v0", 2.0), HookSpec("post_accumulate", "x0")])
    liar.reference_grads = HookedProgram(p, [HookSpec("tensor", "v0", 3.0)]).reference_grads
    with pytest.raises(invariants.InvariantError, match="the gradient of input x0 with these hooks"):
        invariants.check_hooks(liar)


def test_hooked_program_rejects_impossible_hooks():
    p = build_program([(3,)], [(specs_for("sin")[0], [0])])
    with pytest.raises(ValueError, match="post_accumulate hooks go on inputs"):
        HookedProgram(p, [HookSpec("post_accumulate", "v0")])
    with pytest.raises(ValueError, match="prehook hooks go on computed values"):
        HookedProgram(p, [HookSpec("prehook", "x0")])


def test_grad_backward_retain_graph_and_compiled_invariants():
    fn = lambda x, y: (x.exp() * y).tanh()  # noqa: E731
    x, y = np.random.default_rng(0).standard_normal((2, 3))
    invariants.check_grad_matches_backward(fn, x, y)
    invariants.check_retain_graph(fn, x, y)
    invariants.check_compiled_matches_eager(fn, x, y)
    invariants.check_retain_graph(lambda x: x + 1.0, x)  # nothing saved: a second backward is legal


def test_check_grad_matches_backward_catches_disagreement(monkeypatch):
    real_grad = xgrad.autograd.grad
    monkeypatch.setattr(xgrad.autograd, "grad", lambda *a, **k: tuple(None if g is None else g * 2 for g in real_grad(*a, **k)))
    with pytest.raises(invariants.InvariantError, match=r"grad\(outputs, inputs=\[0\]\) for input 0 vs backward"):
        invariants.check_grad_matches_backward(lambda x: x.sin(), np.ones(2))


# -- pytest plugin ---------------------------------------------------------------------------
# Each case runs pytest in a fresh process on a throwaway project, as another project of
# the same environment would.
PROBE = textwrap.dedent(
    """
    import sys

    def test_probe():
        try:
            from hypothesis import settings
        except ImportError:
            profile = "no hypothesis"
        else:
            profile = f"{settings.default.max_examples} {settings.default.derandomize}"
        print("PROFILE", profile, "| xgrad imported:", "xgrad" in sys.modules, "| jax imported:", "jax" in sys.modules)
    """
)


def _pytest_in_throwaway_project(tmp_path, args, env, hide_hypothesis=False):
    (tmp_path / "test_probe.py").write_text(PROBE)
    environ = {k: v for k, v in os.environ.items() if k != "XGRAD_HYPOTHESIS_PROFILE"} | env
    if hide_hypothesis:
        blocker = tmp_path / "blocker" / "hypothesis"
        blocker.mkdir(parents=True, exist_ok=True)
        (blocker / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'hypothesis'\", name='hypothesis')\n")
        environ["PYTHONPATH"] = os.pathsep.join([str(blocker.parent), environ.get("PYTHONPATH", "")])
        args = ["-p", "no:hypothesispytest", *args]  # hypothesis's own plugin leaves with it
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *args, str(tmp_path / "test_probe.py")],
        capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=120,
    )


@pytest.mark.parametrize(
    "args, env, expected",
    [(["-p", "xgrad.testing.pytest_plugin"], {}, "PROFILE 25 False"),
     ([], {"XGRAD_HYPOTHESIS_PROFILE": "thorough"}, "PROFILE 300 False"),
     (["--xgrad-profile", "ci"], {"XGRAD_HYPOTHESIS_PROFILE": "thorough"}, "PROFILE 10 True")],
    ids=["explicit plugin: dev", "environment", "option wins over environment"],
)
def test_pytest_plugin_is_opt_in_and_selects_profiles(tmp_path, args, env, expected):
    result = _pytest_in_throwaway_project(tmp_path, args, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert expected in result.stdout


def test_pytest_plugin_not_asked_leaves_the_run_as_without_xgrad(tmp_path):
    # Hypothesis's own default (which itself depends on the environment, e.g. CI) is kept.
    with_xgrad = _pytest_in_throwaway_project(tmp_path, [], {})
    without_xgrad = _pytest_in_throwaway_project(tmp_path, ["-p", "no:xgrad"], {})
    assert with_xgrad.returncode == without_xgrad.returncode == 0, with_xgrad.stdout + with_xgrad.stderr
    line = next(s for s in with_xgrad.stdout.splitlines() if s.startswith("PROFILE"))
    assert line == next(s for s in without_xgrad.stdout.splitlines() if s.startswith("PROFILE"))
    assert line.endswith("xgrad imported: False | jax imported: False")


def test_pytest_plugin_without_hypothesis(tmp_path):
    # Another project's run is unaffected; asking for a profile says what is missing.
    result = _pytest_in_throwaway_project(tmp_path, [], {}, hide_hypothesis=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PROFILE no hypothesis | xgrad imported: False" in result.stdout
    asked = _pytest_in_throwaway_project(tmp_path, ["--xgrad-profile", "ci"], {}, hide_hypothesis=True)
    assert asked.returncode != 0
    assert "hypothesis is not installed: pip install hypothesis" in asked.stdout + asked.stderr


def test_pytest_plugin_rejects_an_unknown_profile(tmp_path):
    result = _pytest_in_throwaway_project(tmp_path, ["--xgrad-profile", "fast"], {})
    assert result.returncode != 0
    assert "unknown xgrad hypothesis profile 'fast': choose one of dev, ci, thorough" in result.stdout + result.stderr
