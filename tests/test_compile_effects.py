"""``xgrad.compile`` has eager's effects: value checks, exceptions from hooks, and the state they leave.

Each test runs the same step eagerly and under ``xgrad.compile`` and compares the error
(type, message) and the state afterwards (parameters, ``.grad``s, optimizer state).
"""

from __future__ import annotations

import re
import traceback

import jax
import numpy as np
import optax
import pytest

import xgrad
from xgrad.compile_step import CompileFallbackError, CompileFallbackWarning
from xgrad.optim import Optax

MODES = ["eager", "compile"]


def f64(data, requires_grad=False):
    return xgrad.tensor(np.asarray(data, np.float64), requires_grad=requires_grad)


def run(step, mode):
    return xgrad.compile(step, fallback="error") if mode == "compile" else step


# Every check the op library makes on values (not on shapes or dtypes), with an argument that
# passes, one that fails, the exception type and PyTorch's message. Index checks are
# covered one per op in test_compile_errors.py; here each value check and one index check.
VALUE_CHECKS = {
    "binary_cross_entropy input in [0, 1]": (
        lambda w, a: xgrad.binary_cross_entropy(w * 0.0 + a, xgrad.ones(3, dtype=np.float64)),
        [0.5, 0.25, 0.1], [0.5, 1.5, 0.1], RuntimeError, "all elements of input should be between 0 and 1",
    ),
    "pow: integer to a negative integer power": (
        lambda w, a: (w * (xgrad.tensor([2, 3, 4]) ** a.long()).double()),
        [1, 2, 0], [1, -1, 0], RuntimeError, "Integers to negative integer powers are not allowed.",
    ),
    "nll_loss target in range": (
        lambda w, a: xgrad.nll_loss(w.reshape(1, 3).log_softmax(-1), a.long()[:1]),
        [2, 0, 0], [3, 0, 0], IndexError, "Target 3 is out of bounds.",
    ),
    "nll_loss target negative": (
        lambda w, a: xgrad.nll_loss(w.reshape(1, 3).log_softmax(-1), a.long()[:1]),
        [1, 0, 0], [-2, 0, 0], IndexError, "Target -2 is out of bounds.",
    ),
    "one_hot class values below num_classes": (
        lambda w, a: w * xgrad.one_hot(a.long(), 3).double(),
        [2, 0, 1], [0, 3, 1], RuntimeError, "Class values must be smaller than num_classes.",
    ),
    "one_hot class values non-negative": (
        lambda w, a: w * xgrad.one_hot(a.long(), 3).double(),
        [2, 0, 1], [0, -1, 1], RuntimeError, "Class values must be non-negative.",
    ),
    "cross_entropy target in range": (
        lambda w, a: xgrad.cross_entropy(w.reshape(1, 3), a.long()[:1]),
        [2, 0, 0], [5, 0, 0], IndexError, "Target 5 is out of bounds.",
    ),
}


def _check_setup(op, mode):
    w = f64([0.3, -0.2, 0.9], requires_grad=True)
    opt = Optax([w], optax.sgd(0.1))

    def step(a):
        opt.zero_grad()
        # The values the check reads are computed inside the step: the check is a flag of the program.
        loss = op(w, a * 1).sum()
        loss.backward()
        opt.step()
        return loss

    return w, run(step, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(VALUE_CHECKS))
def test_every_value_check_raises_in_both_modes(case, mode):
    op, good, bad, error, message = VALUE_CHECKS[case]
    w, step = _check_setup(op, mode)
    ref_w, ref_step = _check_setup(op, "eager")
    for args in (good, good):
        a = f64(args)
        np.testing.assert_allclose(step(a).detach().numpy(), ref_step(a).detach().numpy(), rtol=1e-12)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        step(f64(bad))
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        ref_step(f64(bad))
    # The state eager leaves: zero_grad() ran, nothing after the op did.
    assert w.grad is None and ref_w.grad is None
    np.testing.assert_allclose(w.detach().numpy(), ref_w.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(step(f64(good)).detach().numpy(), ref_step(f64(good)).detach().numpy(), rtol=1e-12)
    if mode == "compile":
        assert step.stats()["fallbacks"] == 0


def test_value_checks_under_a_plain_jax_transformation_raise_when_the_program_runs():
    # The values are unknown when traced: a host callback raises the eager error when the program runs
    # (NOTE [Checks under jax.jit]); with traced_checks(False) the result is what the formula gives in JAX.
    x = np.asarray([0.5, 1.5])
    labels = np.asarray([0, 5, 2])  # 5 is out of range: JAX's one_hot gives an all-zero row

    def bce(x):
        return xgrad.binary_cross_entropy(xgrad.Tensor(x), xgrad.ones(2, dtype=np.float64)).array

    def one_hot(y):
        return xgrad.one_hot(xgrad.Tensor(y), 3).array

    with pytest.raises(RuntimeError, match="all elements of input should be between 0 and 1"):
        jax.jit(bce)(x)
    with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes."):
        jax.jit(one_hot)(labels)
    with xgrad.utils.traced_checks(False):  # fresh functions: jax.jit keeps the programs it traced
        out, hot = jax.jit(lambda x: bce(x))(x), jax.jit(lambda y: one_hot(y))(labels)
    with np.errstate(invalid="ignore"):  # log(1 - 1.5), as the traced program computes it
        expected = np.mean(-(np.maximum(np.log(x), -100.0) + 0.0 * np.maximum(np.log(1 - x), -100.0)))
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(hot), np.asarray(jax.nn.one_hot(labels, 3, dtype=hot.dtype)))


# -- exceptions from hooks ---------------------------------------------------------------


class HookError(Exception):
    pass


def _hooked(mode, raise_on_call, exc_type):
    w = f64([1.0, 2.0], requires_grad=True)
    v = f64([3.0, -1.0], requires_grad=True)
    opt = Optax([w, v], optax.sgd(0.1))
    calls = []

    def hook(g):
        calls.append(1)
        if len(calls) == raise_on_call:
            raise exc_type("from the hook")
        return g * 2

    w.register_hook(hook)

    def step(x):
        loss = (w * x).sum() + (v * v * x).sum()
        loss.backward()  # no zero_grad: .grad accumulates, so a partial backward shows
        opt.step()
        return loss

    return {"w": w, "v": v, "calls": calls, "step": run(step, mode)}


def _state(s):
    return [None if t.grad is None else t.grad.numpy().copy() for t in (s["w"], s["v"])] + [s["w"].detach().numpy(), s["v"].detach().numpy()]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("exc_type", [HookError, ValueError, KeyboardInterrupt])
def test_an_exception_in_a_hook_comes_out_as_itself_with_eager_state(exc_type, mode):
    s, ref = _hooked(mode, 2, exc_type), _hooked("eager", 2, exc_type)
    x = f64([1.0, 0.5])
    s["step"](x), ref["step"](x)
    with pytest.raises(exc_type, match="from the hook") as info:
        s["step"](x)
    with pytest.raises(exc_type, match="from the hook"):
        ref["step"](x)
    # The user's traceback: the line that raised is in it.
    assert any(frame.name == "hook" for frame in traceback.extract_tb(info.value.__traceback__))
    for a, b in zip(_state(s), _state(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)  # the partial accumulation eager leaves; no optimizer step
    assert len(s["calls"]) == len(ref["calls"]) == 2
    s["step"](x), ref["step"](x)  # and the next call works
    for a, b in zip(_state(s), _state(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_an_exception_in_a_final_callback_comes_out_as_itself(mode):
    w = f64([1.0, 2.0], requires_grad=True)
    calls = []

    def callback():
        calls.append(1)
        if len(calls) == 2:
            raise HookError("from the callback")

    w.register_hook(lambda g: xgrad.autograd.queue_callback(callback))

    def step(x):
        (w * x).sum().backward()

    step = run(step, mode)
    step(f64([1.0, 1.0]))
    with pytest.raises(HookError, match="from the callback"):
        step(f64([1.0, 1.0]))
    np.testing.assert_allclose(w.grad.numpy(), [2.0, 2.0])
    step(f64([1.0, 1.0]))
    assert len(calls) == 3


# -- custom Function backwards -----------------------------------------------------------
# A Function's backward is user Python: under xgrad.compile it runs on the host at every call,
# as eagerly, unless marked pure_hook (then traced, running once per signature, as under jax.jit).

FN_MODES = [*MODES, "compiled backward"]


def run_fn(step, mode):
    if mode != "compiled backward":
        return run(step, mode)

    def compiled_step(x):
        with xgrad.autograd.compiled.enable(fallback="error"):
            return step(x)

    return compiled_step


def cube_function(raise_on=None, exc_type=ValueError, pure=False):
    """``scale * x ** 3`` (``scale`` a float kept on ctx) whose backward counts its calls and raises on call ``raise_on``."""
    calls = []

    def backward(ctx, g):
        calls.append(1)
        if len(calls) == raise_on:
            raise exc_type("from the backward")
        (x,) = ctx.saved_tensors
        return g * 3 * x * x * ctx.scale, None

    class Cube(xgrad.autograd.Function):
        @staticmethod
        def forward(ctx, x, scale):
            ctx.save_for_backward(x)
            ctx.scale = scale
            return x * x * x * scale

    Cube.backward = staticmethod(xgrad.autograd.compiled.pure_hook(backward) if pure else backward)
    return Cube, calls


def cube_loss(np_, w, v, x, function=None):
    """The steps' loss, written once for xgrad (through ``function``) and for jax.numpy (its math)."""
    h = w * x
    cubed = 2.0 * h ** 3 if function is None else function.apply(h, 2.0)
    return np_.sin(cubed).sum() + (v * v * x).sum()


def _function_step(mode, function):
    w = f64([0.5, -1.0, 0.25], requires_grad=True)
    v = f64([1.5, 0.5, -0.5], requires_grad=True)
    opt = Optax([w, v], optax.sgd(0.1))

    def step(x):
        # No zero_grad: .grad accumulates, so a partial backward shows. The (v * v * x) branch is
        # recorded last, so its grads reach v before the Function's backward runs.
        loss = cube_loss(xgrad, w, v, x, function)
        loss.backward()
        opt.step()
        return loss

    return {"w": w, "v": v, "step": run_fn(step, mode)}


X = [1.0, 0.5, -2.0]


@pytest.mark.parametrize("mode", FN_MODES)
def test_a_function_backward_runs_at_every_call_with_eagers_grads(mode):
    function, calls = cube_function()
    s = _function_step(mode, function)
    ref_function, ref_calls = cube_function()
    ref = _function_step("eager", ref_function)
    w0, v0 = s["w"].detach().numpy().copy(), s["v"].detach().numpy().copy()
    s["step"](f64(X))
    expected = jax.grad(lambda w, v: cube_loss(jax.numpy, w, v, np.asarray(X)), argnums=(0, 1))(w0, v0)
    np.testing.assert_allclose(s["w"].grad.numpy(), expected[0], rtol=1e-12)
    np.testing.assert_allclose(s["v"].grad.numpy(), expected[1], rtol=1e-12)
    for _ in range(2):
        s["step"](f64(X))
    for _ in range(3):
        ref["step"](f64(X))
    assert len(calls) == len(ref_calls) == 3
    for a, b in zip(_state(s), _state(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    if mode == "compile":
        stats = s["step"].stats()
        assert (stats["compiles"], stats["hits"], stats["fallbacks"]) == (2, 1, 0)  # .grad None, then set


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("exc_type", [ValueError, KeyboardInterrupt])
def test_an_exception_in_a_function_backward_comes_out_as_itself_with_eager_state(exc_type, mode):
    (function, calls), (ref_function, ref_calls) = cube_function(2, exc_type), cube_function(2, exc_type)
    s, ref = _function_step(mode, function), _function_step("eager", ref_function)
    s["step"](f64(X)), ref["step"](f64(X))
    with pytest.raises(exc_type, match="from the backward") as info:
        s["step"](f64(X))
    with pytest.raises(exc_type, match="from the backward"):
        ref["step"](f64(X))
    assert any(frame.name == "backward" for frame in traceback.extract_tb(info.value.__traceback__))
    # v's grads accumulated before the backward raised; w's did not; the optimizer did not step.
    for a, b in zip(_state(s), _state(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    assert len(calls) == len(ref_calls) == 2
    s["step"](f64(X)), ref["step"](f64(X))  # and the next call works
    for a, b in zip(_state(s), _state(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_a_pure_function_backward_is_traced_with_the_same_numbers():
    (function, calls), (ref_function, ref_calls) = cube_function(pure=True), cube_function(pure=True)
    s, ref = _function_step("compile", function), _function_step("eager", ref_function)
    for _ in range(3):
        s["step"](f64(X)), ref["step"](f64(X))
    # Once per trace, as under jax.jit (two signatures: .grad None at the first call, then set).
    assert len(calls) == s["step"].stats()["compiles"] == 2 and len(ref_calls) == 3
    for a, b in zip(_state(s), _state(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)


class PowerAndExp(xgrad.autograd.Function):
    """``(x ** power, exp(x))``: saved input and output, non-tensor ctx attributes, a tensor kept on ctx."""

    seen: list = []

    @staticmethod
    def forward(ctx, x, power, label):
        y = x ** power
        ctx.save_for_backward(x, y)
        ctx.power, ctx.label, ctx.sizes = power, label, {"n": x.shape[0]}
        ctx.exp_x = x.exp()  # a tensor on ctx without save_for_backward
        ctx.set_materialize_grads(False)
        return y, ctx.exp_x

    @staticmethod
    def backward(ctx, gy, gexp):
        PowerAndExp.seen.append((ctx.label, ctx.sizes["n"], gexp is None))
        x, y = ctx.saved_tensors
        gx = gy * ctx.power * y / x
        if gexp is not None:
            gx = gx + gexp * ctx.exp_x
        return gx, None, None


@pytest.mark.parametrize("mode", FN_MODES)
@pytest.mark.parametrize("both", [False, True])
def test_a_function_backward_on_the_host_reads_its_ctx_as_eager(both, mode):
    w = f64([0.5, -1.0, 2.0], requires_grad=True)

    def step(x):
        w.grad = None
        y, e = PowerAndExp.apply(w * x, 3, "cube")
        ((y.sin() + (e if both else 0.0)).sum()).backward()
        return w.grad

    PowerAndExp.seen = []
    step = run_fn(step, mode)
    for scale in (1.0, 2.0):
        grad = step(f64([scale, scale, scale])).numpy()
        expected = jax.grad(lambda w, c: (jax.numpy.sin((w * c) ** 3) + (jax.numpy.exp(w * c) if both else 0.0)).sum())
        np.testing.assert_allclose(grad, expected(w.detach().numpy(), scale), rtol=1e-12)
    assert PowerAndExp.seen == [("cube", 3, not both)] * 2


class ScaleByArray(xgrad.autograd.Function):
    """Keeps a raw ``jax.Array`` computed from its input on ctx, not a Tensor."""

    @staticmethod
    def forward(ctx, x):
        ctx.twice = x.array * 2
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return g * xgrad.tensor(ctx.twice)


@pytest.mark.parametrize("mode", FN_MODES)
def test_a_function_backward_on_the_host_reads_a_jax_array_on_its_ctx(mode):
    # Under xgrad.compile the array is a value of the trace: the host call gets each call's.
    w = f64([0.5, -1.0, 2.0], requires_grad=True)

    def step(x):
        w.grad = None
        ScaleByArray.apply(w * x).sum().backward()
        return w.grad

    step = run_fn(step, mode)
    for scale in (1.0, 3.0):
        grad = step(f64([scale, scale, scale])).numpy()
        np.testing.assert_allclose(grad, 2 * w.detach().numpy() * scale * scale, rtol=1e-12)  # g * 2(w c) * c


class OnceSquare(xgrad.autograd.Function):
    calls: list = []

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @xgrad.autograd.once_differentiable
    def backward(ctx, g):
        OnceSquare.calls.append(1)
        (x,) = ctx.saved_tensors
        return 2 * x * g


@pytest.mark.parametrize("mode", MODES)
def test_a_once_differentiable_backward_runs_at_every_call(mode):
    w = f64([0.5, -1.5], requires_grad=True)

    def step(x):
        w.grad = None
        OnceSquare.apply(w * x).sum().backward()
        return w.grad

    OnceSquare.calls = []
    step = run(step, mode)
    for scale in (1.0, 3.0, -1.0):
        np.testing.assert_allclose(step(f64([scale, scale])).numpy(), 2 * scale * scale * w.detach().numpy(), rtol=1e-12)
    assert len(OnceSquare.calls) == 3


class NoGradForX(xgrad.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return None


def test_a_host_backward_returning_none_for_an_input_that_requires_grad_raises_under_compile():
    # Eager leaves w.grad None; the compiled step laid its gradients out when traced, and says so.
    w = f64([1.0, 2.0], requires_grad=True)

    def step(x):
        (NoGradForX.apply(w * x) + w).sum().backward()

    step(f64([1.0, 1.0]))
    assert w.grad.tolist() == [1.0, 1.0]
    w.grad = None
    with pytest.raises(RuntimeError, match=r"NoGradForXBackward returned None as the gradient of input 0, which requires grad.*pure_hook"):
        run(step, "compile")(f64([1.0, 1.0]))
    assert w.grad is None  # raised before anything reached w


class AccumulatesIntoW(xgrad.autograd.Function):
    """Identity whose backward runs a backward of its own into the module-level ``W`` (as a hand-made checkpoint would)."""

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        with xgrad.enable_grad():
            (W * W).sum().backward()
        return g


W = f64([1.0, 2.0], requires_grad=True)


def test_a_host_backward_changing_the_steps_state_raises_under_compile():
    v = f64([3.0, 4.0], requires_grad=True)

    def step(x):
        W.grad = None
        (AccumulatesIntoW.apply(v * x) + W * x).sum().backward()

    step(f64([1.0, 1.0]))  # eagerly: W.grad has x and 2 W
    assert W.grad.tolist() == [3.0, 5.0]
    with pytest.raises(RuntimeError, match=r"the backward of AccumulatesIntoWBackward changed the storage or \.grad of a tensor the step uses \(shape \[2\]\).*pure_hook"):
        run(step, "compile")(f64([1.0, 1.0]))
    assert W.tolist() == [1.0, 2.0]


def test_a_host_backward_under_create_graph_runs_the_step_eagerly():
    w = f64([0.5, -1.0], requires_grad=True)

    def step(x):
        (gw,) = xgrad.autograd.grad(OnceSquare.apply(w * x).sum() * 0 + (w * w * x).sum(), w, create_graph=True)
        return gw

    with pytest.raises(CompileFallbackError, match="create_graph=True"):
        run(step, "compile")(f64([1.0, 2.0]))
    compiled = xgrad.compile(step)
    with pytest.warns(CompileFallbackWarning, match="create_graph=True"):
        np.testing.assert_allclose(compiled(f64([1.0, 2.0])).detach().numpy(), [1.0, -4.0])
    assert compiled.stats()["fallbacks"] == 1


# -- randomness --------------------------------------------------------------------------


def _random_step(mode):
    """A step drawing from the default generator (five ways) and from a module's own key."""
    xgrad.manual_seed(5)
    drop, own = xgrad.nn.Dropout(0.5), xgrad.nn.Dropout(0.5, key=1)
    w = f64(np.ones(6), requires_grad=True)
    q = f64(np.ones((1, 2, 4)))

    def step(x):
        y = drop(w * x) + own(w * x) + xgrad.dropout(w * x, 0.5) + xgrad.randn(6, dtype=np.float64)
        y = y + xgrad.rand(6, dtype=np.float64)
        attention = xgrad.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
        (y.sum() + attention.sum()).backward()
        return y, attention

    return w, own, run(step, mode)


def test_random_draws_are_fresh_every_call_and_match_eagers_sequence():
    results = {}
    for mode in MODES:
        w, own, step = _random_step(mode)
        outs = [step(f64(np.arange(6.0))) for _ in range(3)]
        # The generators are usable eagerly afterwards, where eager leaves them.
        results[mode] = [[o.detach().numpy() for o in out] for out in outs], w.grad.numpy(), xgrad.randn(3).detach().numpy(), own(xgrad.ones(8)).detach().numpy()
        if mode == "compile":
            assert step.stats()["fallbacks"] == 0 and step.stats()["hits"] >= 1
    (eager_outs, eager_grad, eager_next, eager_own), (outs, grad, after, after_own) = results["eager"], results["compile"]
    for a, b in zip(eager_outs, outs, strict=True):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)  # bit-identical draws
    assert not np.array_equal(outs[0][0], outs[1][0]) and not np.array_equal(outs[1][1], outs[2][1])  # fresh masks
    np.testing.assert_array_equal(grad, eager_grad)
    np.testing.assert_array_equal(after, eager_next)
    np.testing.assert_array_equal(after_own, eager_own)


@pytest.mark.parametrize("transform", ["jit", "vmap", "grad"])
def test_a_draw_from_a_generator_under_a_plain_jax_transformation_raises(transform):
    drop = xgrad.nn.Dropout(0.5, key=0)
    draws = {
        "default generator": lambda x: xgrad.dropout(xgrad.Tensor(x), 0.5).array.sum(),
        "module key": lambda x: drop(xgrad.Tensor(x)).array.sum(),
        "randn": lambda x: (xgrad.randn(3).array * x).sum(),
    }
    before = xgrad.randn(2, key=None)  # the default generator works before and after
    for fn in draws.values():
        wrapped = {"jit": jax.jit(fn), "vmap": jax.vmap(fn), "grad": jax.grad(fn)}[transform]
        with pytest.raises(RuntimeError, match=r"random op without key= ran under a JAX transformation.*key=.*xgrad\.compile"):
            wrapped(jnp_ones())
    assert xgrad.randn(2).shape == before.shape and drop(xgrad.ones(2)).shape == (2,)
    # With key= the draw is the caller's business: it works.
    out = jax.jit(lambda x, k: xgrad.dropout(xgrad.Tensor(x), 0.5, key=k).array)(jnp_ones(), jax.random.key(0))
    assert out.shape == (3,)


def jnp_ones():
    return jax.numpy.ones((3,))


def _nanogpt():
    import importlib.util
    import pathlib
    import sys

    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "nanogpt.py"
    spec = importlib.util.spec_from_file_location("nanogpt", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["nanogpt"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # the eager run compiles each primitive's first call: tens of seconds on 2 busy cores
def test_nanogpt_with_dropout_compiled_matches_eager():
    nanogpt = _nanogpt()
    data = np.arange(200, dtype=np.int32) % 11
    losses = {}
    for mode in MODES:
        config = nanogpt.GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=16, dropout=0.2)
        xgrad.manual_seed(0)
        model = nanogpt.GPT(config)
        optimizer = xgrad.optim.AdamW(model.parameters(), lr=3e-3)

        def step(x, y, model=model, optimizer=optimizer):
            _, loss = model(x, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return loss

        step = run(step, mode)
        rng = np.random.default_rng(0)
        losses[mode] = [step(*nanogpt.get_batch(data, 8, 2, rng)).item() for _ in range(3)]
        losses[mode + " params"] = [p.detach().numpy() for p in model.parameters()]
    np.testing.assert_allclose(losses["compile"], losses["eager"], rtol=1e-5)
    for a, b in zip(losses["compile params"], losses["eager params"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


# -- Python state in the step's body -----------------------------------------------------

CALLS = 0


def test_a_step_rebinding_a_global_or_a_closed_over_name_warns_once_naming_the_line():
    w = f64([1.0], requires_grad=True)
    count = 0

    def step(x):
        global CALLS
        nonlocal count
        CALLS += 1
        count += 1
        return (w * x).sum()

    compiled = xgrad.compile(step)
    with pytest.warns(xgrad.compile_step.CompileSideEffectWarning) as record:
        compiled(f64([1.0]))
    messages = sorted(str(r.message) for r in record)
    assert len(messages) == 2
    assert "global variable 'CALLS'" in messages[1] and "closed-over variable 'count'" in messages[0]
    line = step.__code__.co_firstlineno + 3
    assert f"test_compile_effects.py:{line}" in messages[1]
    compiled(f64([1.0]))  # once: no warning on later calls (warnings are errors here)
    assert CALLS == count == 1  # the body ran once, when traced


def test_a_step_writing_only_what_it_owns_does_not_warn():
    w = f64([1.0], requires_grad=True)

    def step(x):
        total = 0
        for _ in range(2):
            total += 1
        return (w * x * total).sum()

    xgrad.compile(step)(f64([1.0]))  # warnings are errors in this suite
