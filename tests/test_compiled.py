"""Compiled backward: the same gradients as eager and as ``jax.grad``, caching, memory, errors.

Random graphs come from a small table of ops, each written for xgrad and for
``jax.numpy``; every check compares compiled xgrad against eager xgrad and against JAX
on plain arrays.
"""

from __future__ import annotations

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import xgrad
from xgrad.autograd import compiled
from xgrad.bounded_cache import BoundedCache
from xgrad.engine import compiled as compiled_engine
from xgrad.engine.saved import ERR_FREED

# name -> (arity, xgrad version, jax version); shapes are kept (2, 3)-broadcastable.
INDEX = np.array([2, 0, 0])  # a gather along the last axis with a repeat: fan-in in the backward
OPS = {
    "tanh": (1, xgrad.tanh, jnp.tanh),
    "sin": (1, xgrad.sin, jnp.sin),
    "sigmoid": (1, xgrad.sigmoid, jax.nn.sigmoid),
    "square": (1, lambda x: x * x, lambda x: x * x),
    "scale": (1, lambda x: x * 0.5 + 1.0, lambda x: x * 0.5 + 1.0),
    "rowsum": (1, lambda x: x.sum(-1, keepdim=True), lambda x: jnp.sum(x, -1, keepdims=True)),
    "gather": (1, lambda x: x[..., INDEX] if x.shape[-1] == 3 else x, lambda x: x[..., INDEX] if x.shape[-1] == 3 else x),
    "add": (2, xgrad.add, jnp.add),
    "mul": (2, xgrad.mul, jnp.multiply),
    "sub": (2, xgrad.sub, jnp.subtract),
}
SHAPES = [(2, 3), (3,), (1, 3), (2, 1)]


@st.composite
def programs(draw: st.DrawFn) -> tuple[list[tuple[int, ...]], list[tuple[str, tuple[int, ...]]]]:
    """Input shapes and a list of (op, operand indices): operands reused (fan-out), results summed (fan-in)."""
    shapes = draw(st.lists(st.sampled_from(SHAPES), min_size=1, max_size=3))
    ops = []
    n_values = len(shapes)
    for _ in range(draw(st.integers(1, 7))):
        name = draw(st.sampled_from(sorted(OPS)))
        operands = tuple(draw(st.integers(0, n_values - 1)) for _ in range(OPS[name][0]))
        ops.append((name, operands))
        n_values += 1
    return shapes, ops


def run_program(program, xs, use_jax: bool):
    _, ops = program
    values = list(xs)
    for name, operands in ops:
        fn = OPS[name][2 if use_jax else 1]
        values.append(fn(*(values[i] for i in operands)))
    total = values[0].sum() if not use_jax else jnp.sum(values[0])
    for v in values[1:]:
        total = total + (jnp.sum(v) if use_jax else v.sum())
    return total


def sample_inputs(program, seed: int):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for shape in program[0]]


def xgrad_grads(program, arrays, compiled_flag: bool, inputs=None):
    xs = [xgrad.tensor(a, requires_grad=True) for a in arrays]
    loss = run_program(program, xs, use_jax=False)
    wrt = xs if inputs is None else [xs[i] for i in inputs]
    grads = xgrad.autograd.grad(loss, wrt, allow_unused=True, materialize_grads=True, compiled=compiled_flag)
    return [g.detach().numpy() for g in grads]


def jax_grads(program, arrays, inputs=None):
    idx = list(range(len(arrays))) if inputs is None else list(inputs)

    def f(*diff):
        full = list(map(jnp.asarray, arrays))
        for i, d in zip(idx, diff, strict=True):
            full[i] = d
        return run_program(program, full, use_jax=True)

    return [np.asarray(g) for g in jax.grad(f, argnums=tuple(range(len(idx))))(*(arrays[i] for i in idx))]


def assert_close(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-12)


@pytest.fixture(autouse=True)
def fresh_cache():
    compiled.reset()
    yield
    compiled.reset()


@given(programs(), st.integers(0, 2**16))
def test_random_graphs_match_eager_and_jax(program, seed):
    compiled.reset()  # one call site compiles many structures here: no recompile warning
    first, second = sample_inputs(program, seed), sample_inputs(program, seed + 1)
    for arrays in (first, second):  # a miss, then a hit with new values
        expected = jax_grads(program, arrays)
        assert_close(xgrad_grads(program, arrays, False), expected)
        assert_close(xgrad_grads(program, arrays, True), expected)
    assert compiled.stats()["hits"] >= 1


def backward_grads(program, arrays, compiled_flag: bool):
    """``loss.backward()`` (no ``inputs``: the compiled hit path's one-pass walk); unused inputs read as zeros."""
    xs = [xgrad.tensor(a, requires_grad=True) for a in arrays]
    run_program(program, xs, use_jax=False).backward(compiled=compiled_flag)
    return [np.zeros(x.shape) if x.grad is None else x.grad.detach().numpy() for x in xs]


@given(programs(), st.integers(0, 2**16))
def test_random_graphs_backward_match_eager_and_jax(program, seed):
    compiled.reset()
    for offset in (0, 1, 2):  # a miss, then hits with new values
        arrays = sample_inputs(program, seed + offset)
        expected = jax_grads(program, arrays)
        assert_close(backward_grads(program, arrays, False), expected)
        assert_close(backward_grads(program, arrays, True), expected)
    s = compiled.stats()
    assert (s["misses"], s["hits"]) == (1, 2)


@given(programs(), st.integers(0, 2**16), st.data())
def test_random_graphs_grad_inputs(program, seed, data):
    compiled.reset()
    arrays = sample_inputs(program, seed)
    inputs = data.draw(st.lists(st.integers(0, len(arrays) - 1), min_size=1, max_size=len(arrays), unique=True))
    expected = jax_grads(program, arrays, inputs)
    assert_close(xgrad_grads(program, arrays, False, inputs), expected)
    assert_close(xgrad_grads(program, arrays, True, inputs), expected)


@given(programs(), st.integers(0, 2**16))
def test_random_graphs_second_order(program, seed):
    compiled.reset()
    arrays = sample_inputs(program, seed)
    weights = [np.random.default_rng(seed + 7).standard_normal(a.shape) for a in arrays]

    def jax_second():
        def projected(*xs):
            grads = jax.grad(lambda *ys: run_program(program, ys, use_jax=True), argnums=tuple(range(len(xs))))(*xs)
            return sum(jnp.vdot(g, w) for g, w in zip(grads, weights, strict=True))

        return [np.asarray(g) for g in jax.grad(projected, argnums=tuple(range(len(arrays))))(*map(jnp.asarray, arrays))]

    def xgrad_second(flag):
        xs = [xgrad.tensor(a, requires_grad=True) for a in arrays]
        grads = xgrad.autograd.grad(run_program(program, xs, use_jax=False), xs, create_graph=True, compiled=flag)
        projected = sum(((g * xgrad.tensor(w)).sum() for g, w in zip(grads, weights, strict=True)), xgrad.tensor(0.0))
        if not projected.requires_grad:  # a linear program: no second-order term at all
            return [np.zeros_like(a) for a in arrays]
        second = xgrad.autograd.grad(projected, xs, allow_unused=True, materialize_grads=True, compiled=flag)
        return [g.detach().numpy() for g in second]

    expected = jax_second()
    assert_close(xgrad_second(False), expected)
    assert_close(xgrad_second(True), expected)


def test_backward_accumulates_like_eager():
    def step(flag, x, w):
        ((x @ w).tanh() ** 2).mean().backward(compiled=flag)

    data = np.random.default_rng(0).standard_normal((4, 3)), np.random.default_rng(1).standard_normal((3, 2))
    results = []
    for flag in (False, True):
        x, w = (xgrad.tensor(a, requires_grad=True) for a in data)
        for _ in range(3):
            step(flag, x, w)
        results.append((x.grad.detach().numpy(), w.grad.detach().numpy()))
    assert_close(results[0], results[1])

    def loss(x, w):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    gx, gw = jax.grad(loss, argnums=(0, 1))(*data)
    assert_close(results[1], (3 * np.asarray(gx), 3 * np.asarray(gw)))


def test_backward_inputs_and_retain_grad():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    w = xgrad.tensor([0.5, -1.0], requires_grad=True)
    h = x * w
    (h.exp().sum()).backward(inputs=[h, w], compiled=True)
    assert x.grad is None
    np.testing.assert_allclose(h.grad.detach().numpy(), np.exp([0.5, -2.0]))
    np.testing.assert_allclose(w.grad.detach().numpy(), np.exp([0.5, -2.0]) * [1.0, 2.0])


def test_grad_of_an_intermediate_whose_node_saved_values_before_a_node_that_runs():
    """``h``'s node is only captured: its saved output is no input of the program, and nothing reads it."""
    x1_np, x2_np = np.array([0.3, 0.7]), np.array([0.5, -1.0])

    def loss(x1, x2, sin=xgrad.sin):  # noqa: ANN001, ANN202  (xgrad tensors or jax arrays)
        g = sin(x2 * 3.0)
        return (x1 * g * g).sum(), g

    want_h, want_x2 = jax.grad(lambda h, x2: loss(h, x2, jnp.sin)[0], argnums=(0, 1))(jnp.exp(x1_np), jnp.asarray(x2_np))
    for _ in range(2):  # a miss, then a hit
        x1, x2 = xgrad.tensor(x1_np, requires_grad=True), xgrad.tensor(x2_np, requires_grad=True)
        h = x1.exp()
        grads = xgrad.autograd.grad(loss(h, x2)[0], [h, x2], compiled=True)
        np.testing.assert_allclose(grads[0].numpy(), want_h, rtol=1e-12)
        np.testing.assert_allclose(grads[1].numpy(), want_x2, rtol=1e-12)


def test_multiple_roots_and_integer_index_params():
    x = xgrad.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    for index in (np.array([0, 0, 2]), np.array([1, 2, 2])):  # same structure, new index values: no stale bake-in
        x.grad = None
        a = x[:, index].sin().sum()
        b = (x * x).sum()
        xgrad.autograd.backward([a, b], compiled=True)
        expected = jax.grad(lambda v, i=index: jnp.sum(jnp.sin(v[:, i])) + jnp.sum(v * v))(jnp.arange(6.0).reshape(2, 3))
        np.testing.assert_allclose(x.grad.detach().numpy(), expected)
    assert compiled.stats()["hits"] == 1


def test_boolean_mask_index_is_keyed_by_value():
    x = xgrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
    for mask in ([True, False, True], [False, True, True], [True, False, True]):
        x.grad = None
        (x[np.array(mask)] ** 2).sum().backward(compiled=True)
        np.testing.assert_allclose(x.grad.detach().numpy(), 2 * np.array([1.0, 2.0, 3.0]) * mask)
    assert compiled.stats()["misses"] == 2


def test_unused_input_errors_like_eager():
    x = xgrad.tensor([1.0], requires_grad=True)
    y = xgrad.tensor([2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
        xgrad.autograd.grad((x * 2).sum(), [x, y], compiled=True)
    gx, gy = xgrad.autograd.grad((x * 2).sum(), [x, y], allow_unused=True, compiled=True)
    assert gy is None and gx.tolist() == [2.0]
    gx, gy = xgrad.autograd.grad((x * 2).sum(), [x, y], materialize_grads=True, compiled=True)
    assert gy.tolist() == [0.0]


def test_create_graph_records_one_differentiable_node():
    x = xgrad.tensor([0.3, -0.7], requires_grad=True)
    (g,) = xgrad.autograd.grad((x.sin() * x).sum(), x, create_graph=True, compiled=True)
    assert g.grad_fn.name() == "CompiledBackward"
    (gg,) = xgrad.autograd.grad(g.sum(), x, compiled=True)
    f = lambda v: jnp.sum(jnp.sin(v) * v)  # noqa: E731
    expected = jax.grad(lambda v: jnp.sum(jax.grad(f)(v)))(jnp.array([0.3, -0.7]))
    np.testing.assert_allclose(gg.detach().numpy(), expected)


def test_create_graph_grads_of_linear_functions_do_not_require_grad():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    for flag in (False, True):
        (g,) = xgrad.autograd.grad((x * 3).sum(), x, create_graph=True, compiled=flag)
        assert not g.requires_grad
        assert g.tolist() == [3.0, 3.0]


# -- caching ---------------------------------------------------------------------------


def mlp_loss(x, w1, w2):
    return ((x @ w1).tanh() @ w2).sin().sum()


def test_same_structure_hits_without_retracing():
    rng = np.random.default_rng(0)
    w1 = xgrad.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    w2 = xgrad.tensor(rng.standard_normal((4, 2)), requires_grad=True)
    for _ in range(4):
        w1.grad = w2.grad = None
        mlp_loss(xgrad.tensor(rng.standard_normal((5, 3))), w1, w2).backward(compiled=True)
    s = compiled.stats()
    assert (s["misses"], s["hits"], s["traces"], s["cache_size"]) == (1, 3, 1, 1)
    assert s["compile_seconds"] > 0


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("shape", "saved for backward changed"),
        ("dtype", "dtype"),
        ("hook", "the hooks on AccumulateGrad changed"),
        ("leaf set", "a leaf's .grad changed between None and a tensor"),
    ],
)
def test_changed_structure_misses_with_a_reason(change, reason):
    rng = np.random.default_rng(0)

    def run(batch=5, dtype=np.float64, hook=False):
        w1 = xgrad.tensor(rng.standard_normal((3, 4)).astype(dtype), requires_grad=True)
        w2 = xgrad.tensor(rng.standard_normal((4, 2)).astype(dtype), requires_grad=True)
        if change == "leaf set" and hook:
            w2.grad = xgrad.zeros(4, 2, dtype=dtype)
        if change == "hook" and hook:
            w1.register_hook(lambda g: None)
        mlp_loss(xgrad.tensor(rng.standard_normal((batch, 3)).astype(dtype)), w1, w2).backward(compiled=True)

    run()
    run()
    assert compiled.stats()["misses"] == 1
    kwargs = {"shape": {"batch": 7}, "dtype": {"dtype": np.float32}, "hook": {"hook": True}, "leaf set": {"hook": True}}[change]
    run(**kwargs)
    s = compiled.stats()
    assert s["misses"] == 2
    assert reason in s["recompile_reasons"][-1]


def test_nodes_recorded_before_and_after_the_first_compiled_backward_share_a_program(monkeypatch):
    """Fragments computed at record time and on the first walk key the same structure (NOTE [Structure fragments])."""
    from xgrad.engine.rules import RuleNode

    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    monkeypatch.setattr(RuleNode, "on_record", None)
    early = (x.exp() * 3.0).sum()  # recorded as in a process that has not run compiled yet
    assert early.grad_fn.structure is None
    early.backward(compiled=True)
    assert RuleNode.on_record is not None  # the first compiled backward switched it on
    late = (x.exp() * 3.0).sum()
    assert late.grad_fn.structure is not None
    x.grad = None
    late.backward(compiled=True)
    assert (compiled.stats()["misses"], compiled.stats()["hits"]) == (1, 1)
    np.testing.assert_allclose(x.grad.detach().numpy(), 3 * np.exp([1.0, 2.0]))


def test_constants_key_their_value_type_and_zero_sign():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    for constant in (2.0, 3.0, 0.0, -0.0, 0.0, 2):
        x.grad = None
        (x * constant).sum().backward(compiled=True)
        expected = jax.grad(lambda a, c=constant: jnp.sum(a * c))(jnp.array([1.0, 2.0]))
        np.testing.assert_array_equal(np.signbit(x.grad.detach().numpy()), np.signbit(expected))
        np.testing.assert_array_equal(x.grad.detach().numpy(), expected)
    # 2.0, 3.0, 0.0, -0.0 and the int 2 are five structures; the second 0.0 hits.
    assert (compiled.stats()["misses"], compiled.stats()["hits"]) == (5, 1)


def test_saved_and_unsaved_inputs_of_one_shape_are_different_structures():
    """``a * b`` saves ``b`` when ``a`` wants a grad and only ``b``'s shape when not: two structures."""
    rng = np.random.default_rng(0)
    values = [rng.standard_normal((2, 3)) for _ in range(2)]
    for wants in [(True, False), (False, True), (True, True), (True, False)]:
        a, b = (xgrad.tensor(v, requires_grad=w) for v, w in zip(values, wants, strict=True))
        (a.exp() * b.exp()).sum().backward(compiled=True)
        expected = jax.grad(lambda p, q: jnp.sum(jnp.exp(p) * jnp.exp(q)), argnums=(0, 1))(*values)
        for t, want, e in zip((a, b), wants, expected, strict=True):
            assert (t.grad is not None) == want
            if want:
                np.testing.assert_allclose(t.grad.detach().numpy(), e, rtol=1e-12)
    assert (compiled.stats()["misses"], compiled.stats()["hits"]) == (3, 1)


def test_a_full_fragment_table_drops_its_oldest_without_mixing_structures(monkeypatch):
    # A table of its own: files run before this one in the process may have cached these ops'
    # fragments already, and a table that only hits never drops.
    monkeypatch.setattr(compiled_engine.key, "fragments", BoundedCache(2))
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    ops = [lambda v: v.exp(), lambda v: v.sin(), lambda v: v * 2.0, lambda v: v.tanh()]
    for _ in range(2):
        for op in ops:
            x.grad = None
            op(x).sum().backward(compiled=True)
            expected = x.grad.detach().numpy()
            x.grad = None
            op(x).sum().backward()
            # Equal up to XLA fusing the compiled rule differently (1 ulp); a program of
            # another op (exp for sin, say) would be far off.
            np.testing.assert_allclose(x.grad.detach().numpy(), expected, rtol=1e-6)
    assert len(compiled_engine.key.fragments) <= 2


def test_lru_bound():
    compiled.set_cache_size(2)
    try:
        x = xgrad.tensor([1.0], requires_grad=True)

        def chain(n):
            y = x
            for _ in range(n):
                y = y * 2.0
            y.sum().backward(compiled=True)
            x.grad = None
            assert compiled.stats()["cache_size"] <= 2

        for n in (1, 2, 3, 1):  # chains of different lengths: different structures
            chain(n)
        assert compiled.stats()["misses"] == 4  # the 1-chain was evicted by the 3-chain
        chain(1)
        chain(3)  # both still cached: the second 1-chain evicted the 2-chain, the least recently used
        chain(2)
        assert (compiled.stats()["misses"], compiled.stats()["hits"]) == (5, 2)
    finally:
        compiled.set_cache_size(compiled.DEFAULT_CACHE_SIZE)


def test_recompile_storm_warns_with_reason():
    x = xgrad.tensor([1.0], requires_grad=True)

    def at_one_site(n):
        xgrad.ones(n).mul(x).sum().backward(compiled=True)

    for n in range(1, compiled.RECOMPILE_WARNING_LIMIT + 2):
        at_one_site(n)
    with pytest.warns(compiled.RecompileWarning, match="recompiled .* times .* saved for backward changed"):
        at_one_site(compiled.RECOMPILE_WARNING_LIMIT + 2)


# -- memory and errors ------------------------------------------------------------------


def test_saved_tensors_are_released_without_retain_graph():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    h = x.exp()
    ref = weakref.ref(h)
    y = (h * h).sum()
    del h
    y.backward(compiled=True)
    gc.collect()
    assert ref() is None
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        y.backward(compiled=True)
    assert ERR_FREED.startswith("Trying to backward")


def test_retain_graph_allows_a_second_compiled_backward():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    y = (x.exp() * x).sum()
    y.backward(retain_graph=True, compiled=True)
    y.backward(compiled=True)
    np.testing.assert_allclose(x.grad.detach().numpy(), 2 * np.exp([1.0, 2.0]) * ([1.0, 2.0] + np.ones(2)))


def test_inplace_modification_is_detected():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    h = x * 1.0
    y = (h * h).sum()
    with xgrad.no_grad():
        h.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward(compiled=True)


def test_inplace_modification_is_detected_on_a_hit_and_the_next_backward_works():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)

    def step(modify: bool) -> None:
        h = x * 1.0
        y = (h * h).sum()
        if modify:
            with xgrad.no_grad():
                h.mul_(2.0)
        x.grad = None
        y.backward(compiled=True)

    step(False)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        step(True)
    assert x.grad is None
    step(False)
    np.testing.assert_allclose(x.grad.detach().numpy(), [2.0, 4.0])
    assert compiled.stats()["hits"] == 1


def test_invalid_gradient_raises_before_anything_is_written():
    class BadShape(xgrad.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            return a * b

        @staticmethod
        def backward(ctx, g):
            return g, xgrad.ones(4)

    a = xgrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = xgrad.tensor([1.0, 1.0, 1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"BadShapeBackward returned an invalid gradient at index 1 - got \[4\]"):
        BadShape.apply(a, b).sum().backward(compiled=True)
    assert a.grad is None and b.grad is None
    (a * b).sum().backward(compiled=True)  # the next backward works
    assert b.grad.tolist() == [1.0, 2.0, 3.0]


def test_old_grad_buffers_are_donated_only_when_unshared():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    for _ in range(2):
        (x * x).sum().backward(compiled=True)
    held = x.grad
    (x * x).sum().backward(compiled=True)
    assert x.grad is held  # accumulated in place, as eager: the user's reference sees the sum
    np.testing.assert_allclose(held.detach().numpy(), [6.0, 12.0])
    array = held.array
    (x * x).sum().backward(compiled=True)
    assert not array.is_deleted()  # the user holds the old buffer: not donated
    np.testing.assert_allclose(np.asarray(array), [6.0, 12.0])
    np.testing.assert_allclose(held.detach().numpy(), [8.0, 16.0])


def test_switches():
    assert not compiled.is_enabled()
    with compiled.enable():
        assert compiled.is_enabled()
    compiled.set_enabled(True)
    try:
        x = xgrad.tensor([2.0], requires_grad=True)
        (x * x).sum().backward()
        assert compiled.stats()["misses"] == 1
    finally:
        compiled.set_enabled(False)
    with pytest.raises(ValueError, match="fallback must be"):
        compiled.enable(fallback="maybe")
    with pytest.raises(ValueError, match="cache size"):
        compiled.set_cache_size(0)


def test_hlo_of_cached_program_is_available():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    (x.sin() * x).sum().backward(compiled=True)
    (program,) = compiled_engine.cache.programs.values()
    assert "sine" in program.hlo_text() or "cosine" in program.hlo_text()


def test_refill_takes_back_what_keying_sent_to_the_flat_list():
    """Each case the key sends to the program's inputs (``freeze``, ``_saved_key``) is taken back in its place by
    ``refill``; the rest (a boolean mask as a static value, constants, avals) stays as it was."""
    from xgrad.engine.compiled.key import _saved_key, freeze, refill
    from xgrad.engine.rules import Aval

    mask = jnp.array([True, False])
    static = (xgrad.tensor([1.0]), jnp.array([1, 2]), [0.5, slice(1, None, np.array(2))], mask, {"dim": (1, 2), "i": np.array([0])})
    flat: list = []
    freeze(static, flat)
    args = iter([jnp.asarray(10.0 * i) for i in range(len(flat))])  # the program's inputs, told apart by value
    tensor, index, (half, step), kept, params = refill(static, args)
    assert next(args, None) is None
    assert (int(tensor._array), int(index), int(step.step), int(params["i"])) == (0, 10, 20, 30)
    assert isinstance(tensor, xgrad.Tensor) and half == 0.5 and step.start == 1 and kept is mask and params["dim"] == (1, 2)

    saved = (xgrad.tensor([1.0], requires_grad=True), xgrad.tensor([2.0]), mask, 3, Aval((2,), np.float32), [np.array([4])])
    flat = []
    _saved_key(saved, None, flat, False, True)
    args = iter([jnp.asarray(10.0 * i) for i in range(len(flat))])
    grad_wanted, plain, taken, three, aval, (listed,) = (refill(s, args, saved=True) for s in saved)
    assert next(args, None) is None
    assert (grad_wanted.requires_grad, plain.requires_grad) == (True, False)
    assert (int(grad_wanted._array), int(plain._array), int(taken), int(listed)) == (0, 10, 20, 30)
    assert three == 3 and aval == Aval((2,), np.float32)
