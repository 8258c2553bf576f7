"""``xgrad.compile``: a whole step as one program, with the effects of running it eagerly.

Each test builds the same state twice, runs the step eagerly on one copy and
compiled on the other, and compares returned values, ``.grad``s, parameters (the
same objects), optimizer state and hook calls; a few compare with ``jax.grad``.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import xgrad
from xgrad import nn
from xgrad.autograd import compiled as compiled_backward
from xgrad.compile_step import CompileFallbackError, CompileFallbackWarning, RecompileWarning
from xgrad.optim import Optax
from xgrad.utils.checkpoint import checkpoint

RNG = np.random.default_rng(0)


def f64(data, requires_grad=False):
    """A float64 tensor (Python floats make float32 ones, as in PyTorch)."""
    return xgrad.tensor(np.asarray(data, np.float64), requires_grad=requires_grad)


X = RNG.normal(size=(6, 2))
Y = np.array([0, 2, 1, 1, 0, 2])


def assert_same_state(eager, compiled, rtol=1e-10):
    """Parameters, grads and optimizer state of two copies agree."""
    for a, b in zip(eager["params"], compiled["params"], strict=True):
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=rtol, atol=1e-12)
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            np.testing.assert_allclose(b.grad.detach().numpy(), a.grad.detach().numpy(), rtol=rtol, atol=1e-12)
        assert b._version == a._version
    for a, b in zip(jax.tree.leaves(eager["opt"].state), jax.tree.leaves(compiled["opt"].state), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=rtol, atol=1e-12)


def mlp_setup(zero_grads=True):
    model = nn.MLP([2, 8, 3], activation=nn.Tanh, key=0, dtype=jnp.float64)
    opt = Optax(model.parameters(), optax.adam(1e-2))

    def step(x, y):
        if zero_grads:
            opt.zero_grad()
        loss = xgrad.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return {"params": list(model.parameters()), "opt": opt, "step": step, "model": model}


def test_mlp_steps_match_eager_and_compile_once():
    eager, comp = mlp_setup(), mlp_setup()
    step = xgrad.compile(comp["step"])
    params_before = list(comp["params"])
    x, y = xgrad.tensor(X), xgrad.tensor(Y)
    for _ in range(4):
        want = eager["step"](x, y)
        got = step(x, y)
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-10)
        assert not got.requires_grad and got.grad_fn is None  # the graph stayed in the program
        assert_same_state(eager, comp)
    assert all(a is b for a, b in zip(comp["model"].parameters(), params_before, strict=True))
    assert step.stats()["compiles"] == 1 and step.stats()["hits"] == 3 and step.stats()["fallbacks"] == 0


def test_mlp_matches_jax_value_and_grad_with_optax():
    comp = mlp_setup()
    step = xgrad.compile(comp["step"])
    params = [p.array for p in comp["params"]]
    transform = optax.adam(1e-2)
    state = transform.init(params)

    def loss_fn(ps):
        w0, b0, w1, b1 = ps
        logits = jnp.tanh(X @ w0.T + b0) @ w1.T + b1
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(6), Y])

    for _ in range(3):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, state = transform.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        np.testing.assert_allclose(step(xgrad.tensor(X), xgrad.tensor(Y)).item(), loss, rtol=1e-10)
    for p, ref in zip(comp["params"], params, strict=True):
        np.testing.assert_allclose(p.detach().numpy(), ref, rtol=1e-9, atol=1e-12)


def test_two_threads_trace_two_steps_at_the_same_time():
    """A trace is this thread's alone (NOTE [The step-trace seam]): two threads trace two
    different steps at once, each finding its own state, and both match eager."""
    barrier = threading.Barrier(2, timeout=30)

    def setup(hidden, transform, key):
        model = nn.MLP([2, hidden, 3], activation=nn.Tanh, key=key, dtype=jnp.float64)
        opt = Optax(model.parameters(), transform)

        def step(x, y, traced=False):
            if traced:
                barrier.wait()  # the body runs only while traced: both traces are inside it together
            opt.zero_grad()
            loss = xgrad.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        return {"params": list(model.parameters()), "opt": opt, "step": step}

    def both():
        return [setup(8, optax.adam(1e-2), 0), setup(5, optax.sgd(0.1, momentum=0.9), 1)]

    eager, comp = both(), both()
    data = [(xgrad.tensor(X), xgrad.tensor(Y)), (xgrad.tensor(X[::-1] * 2.0), xgrad.tensor(Y[::-1]))]
    steps = [xgrad.compile(lambda x, y, s=c["step"]: s(x, y, traced=True)) for c in comp]
    got: list[list[float]] = [[], []]
    errors: list[BaseException] = []

    def run(i):
        try:
            for _ in range(3):
                got[i].append(steps[i](*data[i]).item())
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for i in range(2):
        want = [eager[i]["step"](*data[i]).item() for _ in range(3)]
        np.testing.assert_allclose(got[i], want, rtol=1e-10)
        assert_same_state(eager[i], comp[i])
        assert steps[i].stats()["compiles"] == 1 and steps[i].stats()["fallbacks"] == 0


def test_grads_accumulate_when_not_zeroed():
    eager, comp = mlp_setup(zero_grads=False), mlp_setup(zero_grads=False)
    step = xgrad.compile(comp["step"])
    x, y = xgrad.tensor(X), xgrad.tensor(Y)
    for _ in range(3):
        eager["step"](x, y)
        step(x, y)
        assert_same_state(eager, comp)
    # The first call set .grad, later ones add to it: two programs, then hits.
    assert step.stats()["compiles"] == 2 and step.stats()["hits"] == 1


def test_recompiles_on_a_shape_change_and_warns_after_repeated_misses():
    eager, comp = mlp_setup(), mlp_setup()
    step = xgrad.compile(comp["step"])
    for n in (6, 4, 6, 4):
        x, y = xgrad.tensor(X[:n]), xgrad.tensor(Y[:n])
        np.testing.assert_allclose(step(x, y).detach().numpy(), eager["step"](x, y).detach().numpy(), rtol=1e-10)
    assert_same_state(eager, comp)
    stats = step.stats()
    assert (stats["compiles"], stats["misses"], stats["hits"]) == (2, 2, 2)
    assert stats["compile_seconds"] > 0

    counter = xgrad.tensor(0.0)

    @xgrad.compile
    def grow(v):
        counter.add_(v.sum())
        return v * 2

    with pytest.warns(RecompileWarning, match=r"the last change: argument v: shape \[8\] -> \[9\]\. Keep"):
        for n in range(1, 12):
            grow(xgrad.ones(n))
    assert counter.item() == sum(range(1, 12))


def test_a_step_keeps_its_most_recently_used_signatures(monkeypatch):
    """Past ``CACHE_SIZE`` signatures the least recently used one goes: a hit keeps its signature."""
    from xgrad.compile_step import program

    monkeypatch.setattr(program, "CACHE_SIZE", 2)
    step = xgrad.compile(lambda v: v * 2.0, fallback="error")
    for n in (1, 2, 1, 3, 1, 2):  # size 1 is used again before size 3 comes, so size 2 goes
        np.testing.assert_allclose(step(xgrad.ones(n)).numpy(), np.full(n, 2.0))
    assert (step.stats()["misses"], step.stats()["hits"]) == (4, 2)


def test_a_call_like_the_last_hit_skips_the_signature_and_any_change_still_retraces(monkeypatch):
    """A call whose arguments match the last hit's by identity (the same avals, shardings found
    equal, the same static values) runs its program without building the signature; every
    change the signature sees (dtype, weak type, a static value's value or type, a
    Tensor argument's requires_grad, grad mode, aliasing) is still a miss, traced once."""
    from xgrad.compile_step import program

    built = []
    real_signature = program.signature_of
    monkeypatch.setattr(program, "signature_of", lambda leaves, tree: built.append(1) or real_signature(leaves, tree))
    total = xgrad.tensor(0.0)

    @xgrad.compile(fallback="error")
    def step(v, w, scale=1.0):
        total.add_((v * scale).sum())
        return w + v * scale

    expected = [0.0]

    def call(v, w, scale=1.0, n=0, expect_built=0):
        built.clear()
        out = step(v, w, scale=scale)
        expected[0] += float((np.asarray(v) * scale).sum())
        np.testing.assert_allclose(np.asarray(out.array), np.asarray(v) * scale + np.asarray(w.array))
        assert len(built) == expect_built
        assert step.stats()["compiles"] == n

    d0 = jax.devices()[0]
    w = xgrad.tensor(np.ones(3, np.float32))
    call(jax.device_put(np.arange(3.0, dtype=np.float32), d0), w, n=1, expect_built=1)  # a miss
    call(jax.device_put(np.arange(3.0, dtype=np.float32) + 1, d0), w, n=1, expect_built=1)  # a hit, recorded
    for k in range(3):  # new arrays, each with its own (equal) sharding object
        call(jax.device_put(np.full(3, k, np.float32), d0), w, n=1)
    call(jax.device_put(np.arange(3, dtype=np.int32), d0), w, n=2, expect_built=1)
    call(jnp.asarray(2.0), w, n=3, expect_built=1)  # weakly typed
    call(jnp.asarray(2.0, jnp.float32), w, n=4, expect_built=1)
    x = jax.device_put(np.ones(3, np.float32), d0)
    call(x, w, n=4, expect_built=1)  # back to the first signature: a hit
    call(x, w, scale=2.0, n=5, expect_built=1)
    call(x, w, scale=2, n=6, expect_built=1)  # an int where a float was: another static value
    call(x, w, scale=2, n=6, expect_built=1)
    call(x, w, scale=2, n=6)
    call(x, w.detach().requires_grad_(), scale=2, n=7, expect_built=1)
    with xgrad.no_grad():
        call(x, w, scale=2, n=8, expect_built=1)
    call(x, w, scale=2, n=8, expect_built=1)

    @xgrad.compile(fallback="error")
    def pair(a, b):
        a.add_(1.0)
        b.mul_(2.0)

    a, b = xgrad.tensor(np.ones(2)), xgrad.tensor(np.ones(2))
    for _ in range(3):
        pair(a, b)
    pair(a, a)  # one tensor twice: another program
    assert pair.stats()["compiles"] == 2
    np.testing.assert_array_equal(a.numpy(), np.full(2, 10.0))  # (4 + 1) * 2
    assert total.item() == pytest.approx(expected[0])


def test_positional_arguments_like_the_last_hit_are_not_flattened_and_a_container_in_their_place_retraces(monkeypatch):
    """Positional arguments that were the last hit's leaves themselves are compared as they are, without
    flattening them; a container, ``None`` or keywords in their place are flattened and traced as before,
    each call's results and state updates those of the function (NumPy reference)."""
    flattened = []
    real_flatten = jax.tree_util.tree_flatten
    monkeypatch.setattr(jax.tree_util, "tree_flatten", lambda *a, **k: flattened.append(1) or real_flatten(*a, **k))
    total = xgrad.tensor(0.0)
    expected = [0.0]

    @xgrad.compile(fallback="error")
    def step(v, w):
        acc = xgrad.zeros(3) if w is None else w
        for part in v if isinstance(v, (list, tuple)) else [v]:
            acc = acc + part
        total.add_(acc.sum())
        return acc

    def call(v, w, compiles, reference, keywords=False):
        flattened.clear()
        out = step(v=v, w=w) if keywords else step(v, w)
        expected[0] += reference.sum()
        np.testing.assert_allclose(out.numpy(), reference)
        assert step.stats()["compiles"] == compiles
        return len(flattened)

    w = xgrad.tensor(np.ones(3, np.float32))
    xs = [jnp.full(3, k, jnp.float32) for k in range(4)]
    call(xs[0], w, 1, np.full(3, 1.0))  # a miss
    call(xs[1], w, 1, np.full(3, 2.0))  # a hit, recorded
    assert call(xs[2], w, 1, np.full(3, 3.0)) == 0  # a hit like the recorded one: not flattened
    assert call([xs[1], xs[2]], w, 2, np.full(3, 4.0)) > 0  # a list where an array was: flattened, traced
    assert call(xs[3], None, 3, np.full(3, 3.0)) > 0  # None where a Tensor was
    call(xs[1], w, 3, np.full(3, 2.0))  # the first signature again: a hit, recorded
    assert call(xs[2], w, 3, np.full(3, 3.0)) == 0
    assert call((xs[2], xs[2]), None, 4, np.full(3, 4.0), keywords=True) > 0
    assert call((xs[2], xs[2]), None, 5, np.full(3, 4.0)) > 0
    assert call((xs[1], xs[2]), None, 5, np.full(3, 3.0)) > 0  # a hit, recorded: a tuple is no leaf
    assert step.stats()["hits"] == 5
    assert total.item() == pytest.approx(expected[0])


@pytest.mark.parametrize(
    ("vary", "reason"),
    [
        (lambda n: ((xgrad.ones(2),), {"batch": {"x": xgrad.ones(n)}}), r"argument batch\['x'\]: shape \[8\] -> \[9\]"),
        (lambda n: ((xgrad.ones(2), xgrad.ones(n)), {}), r"argument rest\[0\]: shape \[8\] -> \[9\]"),
        (lambda n: ((xgrad.ones(2),), {"scale": float(n)}), r"argument scale: the value 8\.0 -> the value 9\.0"),
        (lambda n: ((jnp.ones(n, jnp.int32 if n % 2 else jnp.float32),), {}),
         r"argument v: shape \[8\] -> \[9\], dtype float32 -> int32"),
        (lambda n: ((xgrad.ones(n) if n < 9 else xgrad.ones(8, requires_grad=True),), {}),
         r"argument v: requires_grad False -> True"),
        (lambda n: ((xgrad.ones(2),), {"batch": {"x": xgrad.ones(n)} if n < 9 else {"x": xgrad.ones(8), "y": None}}),
         r"argument batch: structure PyTreeDef\(\{'x': \*\}\) -> PyTreeDef\(\{'x': \*, 'y': None\}\)"),
    ],
)
def test_the_recompile_warning_names_the_argument_and_its_change_in_one_line(vary, reason):
    @xgrad.compile
    def step(v, *rest, scale=1.0, batch=None):
        return v * scale

    with pytest.warns(RecompileWarning, match=f"the last change: {reason}\\. Keep") as record:
        for n in range(1, 10):
            args, kwargs = vary(n)
            step(*args, **kwargs)
    assert "\n" not in str(record[0].message)


def test_hooks_run_once_per_call_with_concrete_values_in_eager_order():
    def setup():
        w = f64([1.0, -2.0, 0.5], requires_grad=True)
        log = []
        w.register_hook(lambda g: log.append(("w", np.asarray(g.array).tolist())))
        w.register_post_accumulate_grad_hook(lambda t: log.append(("post", t.grad.detach().numpy().tolist())))

        def step(x):
            w.grad = None
            h = (w * x).tanh()
            h.register_hook(lambda g: log.append(("h", type(g.array).__name__, g.detach().numpy().tolist())) or g * 2)
            h.retain_grad()
            h.grad_fn.register_hook(lambda gi, go: log.append(("node", len(gi))))
            loss = (h * h).sum()
            loss.backward()
            return loss, h

        return w, log, step

    w_e, log_e, step_e = setup()
    w_c, log_c, step_c = setup()
    step_c = xgrad.compile(step_c)
    x = f64([0.3, 0.2, -1.0])
    for i in range(3):
        loss_e, h_e = step_e(x)
        loss_c, h_c = step_c(x)
        np.testing.assert_allclose(loss_c.detach().numpy(), loss_e.detach().numpy())
        np.testing.assert_allclose(w_c.grad.detach().numpy(), w_e.grad.detach().numpy())
        np.testing.assert_allclose(h_c.grad.detach().numpy(), h_e.grad.detach().numpy())  # retain_grad on a returned tensor
        assert [e[0] for e in log_c] == [e[0] for e in log_e] == ["h", "node", "w", "post"] * (i + 1)
    for a, b in zip(log_e, log_c, strict=True):
        assert a[0] == b[0]
        np.testing.assert_allclose(np.asarray(b[-1]), np.asarray(a[-1]))
    assert all(e[1] == "ArrayImpl" for e in log_c if e[0] == "h")  # concrete arrays, not tracers
    assert step_c.stats()["compiles"] == 1


def test_pure_hooks_are_traced_into_the_program():
    calls = []

    @compiled_backward.pure_hook
    def double(g):
        calls.append(1)
        return g * 2

    w = f64([1.0, 2.0], requires_grad=True)
    w.register_hook(double)

    @xgrad.compile
    def step(x):
        w.grad = None
        (w * x).sum().backward()

    for _ in range(3):
        step(f64([3.0, 4.0]))
    assert w.grad.tolist() == [6.0, 8.0] and len(calls) == 1  # traced once, inlined


def test_autograd_grad_and_a_gradient_penalty_inside_the_step():
    def setup():
        w = f64([[0.5, -1.0], [2.0, 0.3]], requires_grad=True)
        opt = Optax([w], optax.sgd(0.1))

        def step(x):
            opt.zero_grad()
            x = x.detach().requires_grad_()
            out = (x @ w).tanh().sum()
            (gx,) = xgrad.autograd.grad(out, x, create_graph=True)
            loss = out + (gx * gx).sum()
            loss.backward()
            opt.step()
            return loss, gx

        return w, opt, step

    w_e, opt_e, step_e = setup()
    w_c, opt_c, step_c = setup()
    step_c = xgrad.compile(step_c)
    x = f64([[1.0, 2.0], [-0.5, 0.1]])
    for _ in range(3):
        (loss_e, gx_e), (loss_c, gx_c) = step_e(x), step_c(x)
        np.testing.assert_allclose(loss_c.detach().numpy(), loss_e.detach().numpy(), rtol=1e-10)
        np.testing.assert_allclose(gx_c.detach().numpy(), gx_e.detach().numpy(), rtol=1e-10)
        np.testing.assert_allclose(w_c.detach().numpy(), w_e.detach().numpy(), rtol=1e-10)

    def ref_loss(w, x):
        out = lambda x: jnp.tanh(x @ w).sum()  # noqa: E731
        return out(x) + (jax.grad(out)(x) ** 2).sum()

    np.testing.assert_allclose(w_c.grad.detach().numpy(), jax.grad(ref_loss)(w_c.array + 0.1 * w_c.grad.array, x.array), rtol=1e-9)


class Cube(xgrad.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x


@pytest.mark.parametrize("block", ["function", "checkpoint_reentrant", "checkpoint_non_reentrant"])
def test_custom_function_and_checkpointing_inside_the_step(block):
    def body(h):
        return Cube.apply(h).sin()

    def setup():
        w = f64([0.5, -1.0, 0.25], requires_grad=True)
        opt = Optax([w], optax.sgd(0.05))

        def step(x):
            opt.zero_grad()
            h = w * x
            if block == "function":
                out = body(h)
            else:
                out = checkpoint(body, h, use_reentrant=block == "checkpoint_reentrant")
            loss = out.sum()
            loss.backward()
            opt.step()
            return loss

        return w, step

    w_e, step_e = setup()
    w_c, step_c = setup()
    step_c = xgrad.compile(step_c)
    x = f64([1.0, 2.0, -3.0])
    for _ in range(3):
        np.testing.assert_allclose(step_c(x).detach().numpy(), step_e(x).detach().numpy(), rtol=1e-10)
        np.testing.assert_allclose(w_c.detach().numpy(), w_e.detach().numpy(), rtol=1e-10)
        np.testing.assert_allclose(w_c.grad.detach().numpy(), w_e.grad.detach().numpy(), rtol=1e-10)
    assert step_c.stats()["fallbacks"] == 0


def test_buffers_and_arguments_updated_in_place_are_written_back():
    running = xgrad.zeros(2)
    seen = xgrad.zeros(2)

    @xgrad.compile
    def update(x):
        with xgrad.no_grad():
            running.mul_(0.5).add_(x)
        x.add_(1.0)
        return running

    x = xgrad.tensor([2.0, 4.0])
    out = update(x)
    assert out is running and running.tolist() == [2.0, 4.0] and x.tolist() == [3.0, 5.0]
    out = update(x)
    assert running.tolist() == [4.0, 7.0] and x.tolist() == [4.0, 6.0]
    assert running._version == 4 and x._version == 2 and seen._version == 0
    assert update.stats()["compiles"] == 1


RETURNS = {
    "a Tensor": lambda loss, w: loss,
    "an array": lambda loss, w: loss.array,
    "a number": lambda loss, w: 3,
    "None": lambda loss, w: None,
    "a 1-tuple": lambda loss, w: (loss,),
    "a dict with a parameter": lambda loss, w: {"loss": loss, "w": w},
}


@pytest.mark.parametrize("returned", list(RETURNS))
def test_a_step_returns_what_eager_returns_one_leaf_or_a_tree(returned):
    """A step's results come back as eager's: one leaf handed back as it is, a tree rebuilt, a parameter itself."""

    def make():
        w = f64([1.0, -2.0], requires_grad=True)

        def step(x):
            w.grad = None
            loss = (w * x).sum() ** 2
            loss.backward()
            return RETURNS[returned](loss, w)

        return w, step

    w, eager = make()
    cw, compiled = make()
    compiled = xgrad.compile(compiled, fallback="error")
    for x in (f64([1.0, 2.0]), f64([3.0, -1.0])):
        expected, found = eager(x), compiled(x)
        expected_leaves, expected_tree = jax.tree_util.tree_flatten(expected, is_leaf=xgrad.is_tensor)
        found_leaves, found_tree = jax.tree_util.tree_flatten(found, is_leaf=xgrad.is_tensor)
        assert found_tree == expected_tree
        for e, f in zip(expected_leaves, found_leaves, strict=True):
            assert type(f) is type(e)
            if isinstance(e, xgrad.Tensor):
                assert (f is cw) == (e is w)
                np.testing.assert_allclose(f.detach().numpy(), e.detach().numpy(), rtol=1e-12)
            else:
                np.testing.assert_allclose(f, e, rtol=1e-12)
    np.testing.assert_allclose(cw.grad.numpy(), w.grad.numpy(), rtol=1e-12)
    assert compiled.stats()["compiles"] == 1


def test_changed_state_retraces():
    # Freezing a parameter between calls changes what the trace decided: a new program.
    eager, comp = mlp_setup(), mlp_setup()
    step = xgrad.compile(comp["step"])
    x, y = xgrad.tensor(X), xgrad.tensor(Y)
    step(x, y), eager["step"](x, y)
    for setup in (eager, comp):
        setup["params"][0].requires_grad_(False)
        setup["params"][0].grad = None
    for _ in range(2):
        np.testing.assert_allclose(step(x, y).detach().numpy(), eager["step"](x, y).detach().numpy(), rtol=1e-10)
        assert_same_state(eager, comp)
    assert comp["params"][0].grad is None and step.stats()["compiles"] == 2


def test_concrete_values_fall_back_to_eager_with_one_warning_or_raise():
    w = f64([1.0, 2.0], requires_grad=True)
    printed = []

    def step(x):
        w.grad = None
        loss = (w * x).sum()
        if loss > 0:  # needs a concrete value
            printed.append(loss.item())
        loss.backward()
        return loss

    eager_step = xgrad.compile(step)
    with pytest.warns(CompileFallbackWarning, match=r"step eagerly: Python needs a concrete value.*test_compile.py:\d+"):
        eager_step(f64([1.0, 1.0]))
    eager_step(f64([1.0, 3.0]))  # no second warning (warnings are errors here)
    assert printed == [3.0, 7.0] and w.grad.tolist() == [1.0, 3.0]
    assert eager_step.stats()["fallbacks"] == 2 and eager_step.stats()["compiles"] == 0

    strict = xgrad.compile(step, fallback="error")
    with pytest.raises(CompileFallbackError, match=r"cannot compile .*step: Python needs a concrete value"):
        strict(f64([1.0, 1.0]))
    # Nothing the trace touched leaked: the next eager backward works on concrete values.
    w.grad = None
    (w * 2).sum().backward()
    assert w.grad.tolist() == [2.0, 2.0] and not isinstance(w.array, jax.core.Tracer)
    with pytest.raises(ValueError, match="fallback must be"):
        xgrad.compile(step, fallback="never")


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_a_boolean_mask_of_traced_values_runs_eagerly(mode):
    # Its result's shape depends on the values: the call runs eagerly, as other concrete needs do.
    w = f64([1.0, -2.0, 3.0], requires_grad=True)

    def step(x):
        w.grad = None
        y = w * x
        loss = y[y > 0].sum()
        loss.backward()
        return loss

    run = xgrad.compile(step) if mode == "compile" else step
    if mode == "compile":
        with pytest.warns(CompileFallbackWarning, match=r"Python needs a concrete value.*test_compile.py:\d+"):
            loss = run(f64([1.0, 1.0, 1.0]))
    else:
        loss = run(f64([1.0, 1.0, 1.0]))
    assert loss.item() == 4.0 and w.grad.tolist() == [1.0, 0.0, 1.0]
    assert run(f64([-1.0, 1.0, 1.0])).item() == 3.0 and w.grad.tolist() == [0.0, 0.0, 1.0]


def test_one_recompile_warning_class_for_compiled_backwards_and_steps():
    # One filter silences both (xgrad.testing and the test suite filter the backward's).
    assert RecompileWarning is compiled_backward.RecompileWarning


def test_a_grad_with_history_cannot_leave_the_program():
    w = f64([1.0, 2.0], requires_grad=True)

    @xgrad.compile(fallback="error")
    def step(x):
        (w * w * x).sum().backward(create_graph=True)

    with pytest.warns(UserWarning, match="create_graph=True"), pytest.raises(CompileFallbackError, match="autograd history"):
        step(f64([1.0, 1.0]))
    assert w.grad is None


# -- the JAX boundary: xgrad code under plain JAX transformations ----------------------
def test_a_jax_array_on_the_left_of_an_operator_converts_the_tensor_as_jnp_does():
    t = f64([1.0, 2.0], requires_grad=True)
    a = jnp.array([3.0, 0.5])
    with pytest.raises(RuntimeError, match=r"requires grad to a jax\.Array.*t \* a rather than a \* t"):
        a * t
    with pytest.raises(RuntimeError, match="requires grad to a jax.Array"):
        step = xgrad.compile(lambda: (a * t).sum(), fallback="error")
        step()
    out = a * t.detach()  # the value only, as JAX computes it
    assert isinstance(out, jax.Array) and out.tolist() == [3.0, 1.0]
    (t * a + t / a - t ** a).sum().backward()  # a Tensor on the left records
    np.testing.assert_allclose(t.grad.detach().numpy(), jax.grad(lambda v: (v * a + v / a - v ** a).sum())(t.array), rtol=1e-12)


def test_history_never_crosses_a_jax_transformation_or_device_put_silently():
    w = f64([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"passed into a JAX function or transformation.*xgrad\.func.*xgrad\.compile"):
        jax.jit(lambda t: t * 2)(w * 1.0)
    with pytest.raises(RuntimeError, match=r"passed into a JAX function or transformation"):
        jax.vmap(lambda t: t.sin())(xgrad.tensor(np.ones((3, 2)), requires_grad=True).exp())
    with pytest.raises(RuntimeError, match=r"jax\.device_put.*tensor\.to\(device\)"):
        jax.device_put(w * 2, jax.devices()[1])
    moved = jax.device_put((w * 2).detach(), jax.devices()[1])
    assert not moved.requires_grad and moved.tolist() == [2.0, 4.0]
    # What a traced function returns comes out without history: its graph stayed in the trace.
    out = jax.jit(lambda t: t * 2)(w)
    assert isinstance(out, xgrad.Tensor) and out.grad_fn is None and not out.requires_grad
    assert out.tolist() == [2.0, 4.0]
    # A backward inside a trace works on tensors wrapping tracers.

    def grad_inside(t):
        (t * t * t).sum().backward()
        return t.grad.array

    np.testing.assert_allclose(jax.jit(grad_inside)(w), 3 * w.detach().numpy() ** 2)
    np.testing.assert_allclose(jax.grad(lambda a: (xgrad.Tensor(a).tanh() * 2).sum().array)(w.array), 2 / np.cosh(w.detach().numpy()) ** 2)
    assert w.grad is None  # the traced backward wrote to the traced leaf only
    (w * w).sum().backward()
    assert w.grad.tolist() == [2.0, 4.0]
