"""Registry-driven op tests: every op in the spec table against ``jax`` on plain arrays.

The table (``xgrad.testing.op_specs``) must cover every registry primitive and every
name in ``DIFFERENTIABLE_OPS``; each spec's xgrad call is compared with ``jax.vjp`` of
its independent ``jnp`` reference (forward values, first- and second-order
gradients) and, in forward mode, with ``jax.jvp`` (tangents, and their gradients)
through ``xgrad.testing.assert_grads_match``, the code users get.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad.testing import assert_grads_match, gradcheck, gradgradcheck
from xgrad.testing.op_specs import OP_SPECS, uncovered_ops

CASES = [(spec, v) for spec in OP_SPECS for v in range(len(spec.shapes))]


def _case_id(case):
    spec, v = case
    return f"{spec.id}-{'x'.join(map(str, spec.shapes[v][0])) or '0d'}-v{v}"


def test_every_registered_and_differentiable_op_has_a_spec():
    names = sorted(set(xgrad.ops.REGISTRY) | set(xgrad.ops.DIFFERENTIABLE_OPS))
    assert len(names) > 60
    missing = uncovered_ops(names)
    assert not missing, f"ops without an entry in xgrad/testing/op_specs.py: {missing}"


def test_every_differentiable_op_is_exported_at_top_level():
    # xgrad.ops.__all__ is a literal list (so type checkers see the re-export): it must not miss a name.
    missing = sorted(set(xgrad.ops.DIFFERENTIABLE_OPS) - set(xgrad.ops.__all__))
    assert not missing, f"add these to xgrad/ops/__init__.py's __all__: {missing}"
    assert all(getattr(xgrad, name) is getattr(xgrad.ops, name) for name in xgrad.ops.__all__)


def test_uncovered_ops_notices_a_new_primitive():
    prim = xgrad.ops.defprim("brand_new_op", jnp.sin, (lambda g, out, x: g * x.cos(),))
    try:
        assert uncovered_ops(sorted(xgrad.ops.REGISTRY)) == ["brand_new_op"]
    finally:
        del xgrad.ops.REGISTRY[prim.primitive.name]


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_op_matches_jax(case):
    spec, variant = case
    inputs = spec.sample(np.random.default_rng(variant), variant)
    # Second order on the first shape variant; first order (and forward) on every variant.
    order = 2 if spec.second_order and variant == 0 else 1
    # forward=True: the forward-mode column, every op's tangents against ``jax.jvp`` (and, at
    # order 2, reverse over forward); an op without a working forward rule fails here.
    assert_grads_match(spec.op, *inputs, reference=spec.ref, modes=("eager", "jax"), order=order, forward=True)


def _one_input_cases():
    for spec in OP_SPECS:
        n_float = sum(d.differentiable for d in spec.domains)
        if n_float > 1:
            yield from ((spec, i) for i, d in enumerate(spec.domains) if d.differentiable)


ONE_INPUT_CASES = list(_one_input_cases())


@pytest.mark.parametrize("case", ONE_INPUT_CASES, ids=[f"{s.id}-input{i}" for s, i in ONE_INPUT_CASES])
def test_op_grad_when_only_one_input_requires_grad(case):
    """A primitive saves only what the rules of its grad-requiring inputs read: each input alone still gets jax's grads."""
    spec, i = case
    inputs = spec.sample(np.random.default_rng(4), 0)

    def with_xgrad(xi):
        return spec.op(*(xi if k == i else xgrad.tensor(a) for k, a in enumerate(inputs)))

    def with_jax(xi):
        return spec.ref(*(xi if k == i else jnp.asarray(a) for k, a in enumerate(inputs)))

    order = 2 if spec.second_order else 1
    assert_grads_match(with_xgrad, inputs[i], reference=with_jax, modes=("eager", "jax"), order=order)


CONV2D_SPECS = [s for s in OP_SPECS if s.name == "conv2d"]


@pytest.mark.parametrize("spec", CONV2D_SPECS, ids=[s.id for s in CONV2D_SPECS])
def test_conv2d_float32_grads_match_jax(spec):
    """The table runs float64; float32 has its own rule form on CPU too (NOTE [Convolution gradients on CPU])."""
    inputs = [a.astype(np.float32) for a in spec.sample(np.random.default_rng(5), 0)]
    assert_grads_match(spec.op, *inputs, reference=spec.ref, modes=("eager", "compiled", "jax"), order=2, atol=1e-4, rtol=1e-4)


def test_mul_by_a_constant_saves_no_tensor():
    x = xgrad.tensor([0.5, 2.0], requires_grad=True)
    assert not any(isinstance(s, xgrad.engine.saved.SavedTensor) for s in (x * 1.5).grad_fn.saved)
    # Both inputs requiring grad: each rule reads the other input, so both are saved.
    both = (x * xgrad.tensor([3.0, 4.0], requires_grad=True)).grad_fn.saved
    assert all(isinstance(s, xgrad.engine.saved.SavedTensor) for s in both)


SMOOTH = [s for s in OP_SPECS if s.smooth]
ONE_SMOOTH_PER_OP = list({s.name: s for s in SMOOTH}.values())


@pytest.mark.parametrize("spec", ONE_SMOOTH_PER_OP, ids=[s.id for s in ONE_SMOOTH_PER_OP])
def test_op_gradcheck(spec):
    """Finite differences, independent of any autograd: one random direction per input."""
    inputs = spec.sample(np.random.default_rng(1), 0)
    assert gradcheck(spec.op, list(inputs), fast_mode=True)


SECOND_ORDER_FD = [s for s in SMOOTH if s.name in ("mul", "div", "pow", "exp", "log", "tanh", "sigmoid", "matmul", "softmax",
                                                    "logsumexp", "layer_norm", "gelu", "erf", "prod")]


@pytest.mark.parametrize("spec", SECOND_ORDER_FD[:12], ids=[s.id for s in SECOND_ORDER_FD[:12]])
def test_op_gradgradcheck(spec):
    inputs = spec.sample(np.random.default_rng(2), 0)
    assert gradgradcheck(spec.op, list(inputs), fast_mode=True)


ONE_PER_OP = list({s.name: s for s in OP_SPECS if s.name != "to_device"}.values())


@pytest.mark.parametrize("spec", ONE_PER_OP, ids=[s.id for s in ONE_PER_OP])
def test_op_compiled_matches_eager(spec):
    """``compiled=True`` against eager (which the tests above hold to jax)."""
    inputs = spec.sample(np.random.default_rng(3), 0)
    assert_grads_match(spec.op, *inputs, reference=spec.ref, modes=("eager", "compiled"))


@pytest.fixture
def unfused_rules():
    """Every primitive forgets its fused rules: the next eager backward of each signature runs op by op."""
    for prim in xgrad.ops.REGISTRY.values():
        prim._fused.clear()


@pytest.mark.parametrize("spec", ONE_PER_OP, ids=[s.id for s in ONE_PER_OP])
def test_op_fused_rules_match_jax(spec, unfused_rules):
    """The first eager backward runs each node's rules op by op; the second runs them as one jitted
    call where that pays (NOTE [Fused eager rules]): both against jax."""
    inputs = spec.sample(np.random.default_rng(4), 0)
    for _ in range(2):
        assert_grads_match(spec.op, *inputs, reference=spec.ref, modes=("eager", "jax"))


def test_fused_rules_dispatch_once_per_node(unfused_rules, monkeypatch):
    x_np = np.linspace(-1.0, 1.0, 5)
    x = xgrad.tensor(x_np, requires_grad=True)
    for _ in range(2):  # the first backward learns what each node's rules dispatch
        x.grad = None
        xgrad.tanh(x).sum().backward()
    x.grad = None
    loss = xgrad.tanh(x).sum()
    dispatched = []
    with monkeypatch.context() as patch:
        original = xgrad.ops.Primitive.dispatch
        patch.setattr(xgrad.ops.Primitive, "dispatch", lambda prim, *a: dispatched.append(prim.name) or original(prim, *a))
        loss.backward()
    # SumBackward (broadcast, reshape) and TanhBackward (g * (1 - out * out)) each ran as one
    # jitted call, which does not pass through Primitive.dispatch.
    assert dispatched == []
    np.testing.assert_allclose(np.asarray(x.grad.array), 1 - np.tanh(x_np) ** 2, rtol=1e-12)
    # Recording a graph of the backward (create_graph) still runs the rules op by op.
    x.grad = None
    (g,) = xgrad.autograd.grad(xgrad.tanh(x).sum(), x, create_graph=True)
    (gg,) = xgrad.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(np.asarray(gg.array), -2 * np.tanh(x_np) * (1 - np.tanh(x_np) ** 2), rtol=1e-12)


def test_a_rule_that_reads_a_concrete_value_stays_op_by_op(unfused_rules):
    def rule(g, out, x):
        return g * float(x.sum().item())  # a concrete value: cannot be traced

    op = xgrad.ops.defprim("fused_test_concrete_rule", jnp.sin, (rule,))
    try:
        for values in ([1.0, 2.0], [3.0, 4.0], [5.0, 6.0]):
            x = xgrad.tensor(np.array(values), requires_grad=True)
            op(x).sum().backward()
            np.testing.assert_allclose(np.asarray(x.grad.array), [sum(values)] * 2)
    finally:
        del xgrad.ops.REGISTRY[op.primitive.name]


def test_to_device_compiled_second_order():
    """Compiled ``create_graph=True`` through a device move (``.to`` is differentiable compiled too)."""
    x = np.linspace(-1, 1, 3)
    assert_grads_match(lambda t: xgrad.to_device(t, jax.devices()[1]).sin(), x,
                       reference=lambda a: jnp.sin(jax.device_put(a, jax.devices()[1])),
                       modes=("eager", "compiled"), order=2)


# -- from_jax ----------------------------------------------------------------------------
def _pytree_fn(params, x, *, power):
    hidden = jnp.tanh(params["w"] @ x + params["b"])
    return {"out": hidden**power, "aux": (jnp.sum(hidden), x.shape[0])}


def test_from_jax_pytrees_and_static_kwargs():
    op = xgrad.ops.from_jax(_pytree_fn)
    rng = np.random.default_rng(0)
    w, b, x = rng.standard_normal((3, 4)), rng.standard_normal(3), rng.standard_normal(4)

    def with_xgrad(w, b, x):
        res = op({"w": w, "b": b}, x, power=3)
        assert res["aux"][1] == 4  # a non-array leaf comes back as is
        return res["out"], res["aux"][0]

    def with_jax(w, b, x):
        res = _pytree_fn({"w": w, "b": b}, x, power=3)
        return res["out"], res["aux"][0]

    assert_grads_match(with_xgrad, w, b, x, reference=with_jax, modes=("eager", "jax"), order=2)
    # Another static value is another primitive: the result follows it.
    out2 = op({"w": xgrad.tensor(w), "b": xgrad.tensor(b)}, xgrad.tensor(x), power=2)["out"]
    np.testing.assert_allclose(out2.detach().numpy(), np.asarray(_pytree_fn({"w": w, "b": b}, x, power=2)["out"]))


def test_from_jax_double_backward_against_jax_hessian():
    fn = lambda x: jnp.sum(jnp.sin(x) * x**2)  # noqa: E731
    op = xgrad.ops.from_jax(fn, name="sinsq")
    x = np.array([0.3, -1.2, 2.0])
    t = xgrad.tensor(x, requires_grad=True)
    (g,) = xgrad.autograd.grad(op(t), t, create_graph=True)
    assert g.grad_fn is not None and g.grad_fn.name() == "SinsqVjpBackward"
    rows = [xgrad.autograd.grad(g[i], t, retain_graph=True)[0].detach().numpy() for i in range(3)]
    np.testing.assert_allclose(np.stack(rows), jax.hessian(fn)(x), rtol=1e-12)
    assert gradgradcheck(op, [x])


def test_from_jax_non_float_inputs_get_no_gradient():
    op = xgrad.ops.from_jax(lambda x, idx: x[idx] * 2.0, name="pick")
    x = xgrad.tensor(np.arange(4.0), requires_grad=True)
    out = op(x, xgrad.tensor(np.array([3, 3, 0])))
    out.sum().backward()
    np.testing.assert_array_equal(x.grad.detach().numpy(), [2.0, 0.0, 0.0, 4.0])


# -- non-differentiable ops -------------------------------------------------------------
NON_DIFFERENTIABLE = {
    "eq": lambda x: x == 0.5, "ne": lambda x: x != 0.5, "lt": lambda x: x < 0.5, "le": lambda x: x <= 0.5,
    "gt": lambda x: x > 0.5, "ge": lambda x: x >= 0.5, "argmax": lambda x: xgrad.argmax(x, dim=1),
    "argmin": lambda x: x.argmin(), "isnan": xgrad.isnan, "isfinite": xgrad.isfinite, "floor": xgrad.floor,
    "ceil": xgrad.ceil, "round": xgrad.round, "logical_not": lambda x: ~(x > 0),
    "logical_and": lambda x: (x > 0) & (x < 1), "sort indices": lambda x: x.sort().indices,
    "max indices": lambda x: x.max(dim=0).indices,
}


@pytest.mark.parametrize("name", NON_DIFFERENTIABLE)
def test_non_differentiable_ops_record_no_graph(name):
    x = xgrad.tensor(np.array([[0.2, 1.7, -0.4], [0.5, 0.9, 3.0]]), requires_grad=True)
    out = NON_DIFFERENTIABLE[name](x)
    assert out.grad_fn is None and not out.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        out.astype(jnp.float64).sum().backward()


def test_integer_outputs_match_jnp():
    x = np.array([[0.2, 1.7, -0.4], [0.5, 0.9, 3.0]])
    t = xgrad.tensor(x, requires_grad=True)
    np.testing.assert_array_equal(xgrad.argmax(t, dim=1).detach().numpy(), jnp.argmax(x, axis=1))
    np.testing.assert_array_equal(t.max(dim=0).indices.detach().numpy(), jnp.argmax(x, axis=0))
    np.testing.assert_array_equal(t.sort(dim=1).indices.detach().numpy(), jnp.argsort(x, axis=1))
    assert jnp.issubdtype(xgrad.argmax(t).dtype, jnp.integer)


# -- indexing -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "index",
    [np.array([2, 0, 2, 2]), np.array([[True, False, True, False], [False, True, True, True], [False] * 4]),
     (np.array([0, 2]), slice(1, None)), (Ellipsis, np.array([3, 0])), (np.array([1, 1]), np.array([0, 0]))],
    ids=["int array, repeats", "bool mask", "int array + slice", "ellipsis + int array", "repeated pairs"],
)
def test_advanced_indexing_gradients(index):
    x = np.random.default_rng(0).standard_normal((3, 4))
    assert_grads_match(lambda t: t[index] * 3.0, x, reference=lambda a: a[index] * 3.0, modes=("eager", "jax"), order=2)


def test_setitem_gradients_reach_value_and_base():
    rng = np.random.default_rng(0)
    x, v = rng.standard_normal((3, 4)), rng.standard_normal(2)
    mask = np.array([[True, False, False, False], [False, False, False, False], [False, False, False, True]])

    def with_xgrad(x, v):
        y = x * 1.0
        y[mask] = v.exp()
        y[0, 1:3] = v * 2
        return y.sin()

    def with_jax(x, v):
        y = x.at[mask].set(jnp.exp(v)).at[0, 1:3].set(v * 2)
        return jnp.sin(y)

    assert_grads_match(with_xgrad, x, v, reference=with_jax, modes=("eager", "jax"), order=2)


# -- devices ----------------------------------------------------------------------------
def test_mixing_devices_raises_naming_both():
    dev0, dev1 = jax.devices()[:2]
    a = xgrad.tensor(np.ones(3), device=dev0, requires_grad=True)
    b = xgrad.tensor(np.ones(3), device=dev1)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device") as info:
        a * b
    assert str(dev0) in str(info.value) and str(dev1) in str(info.value)


def test_to_device_is_differentiable_and_grad_returns_to_source():
    dev0, dev1 = jax.devices()[:2]
    x = xgrad.tensor(np.array([0.5, -1.0, 2.0]), device=dev0, requires_grad=True)
    y = x.to(dev1)
    assert y.device == dev1 and y.grad_fn is not None
    (y.sin() * y).sum().backward()
    assert x.grad.device == dev0
    expected = jax.grad(lambda a: jnp.sum(jnp.sin(a) * a))(np.array([0.5, -1.0, 2.0]))
    np.testing.assert_allclose(x.grad.detach().numpy(), expected, rtol=1e-12)
    assert gradgradcheck(lambda t: t.to(dev1).exp(), [x])


def test_scalar_operands_keep_python_scalar_semantics():
    """Scalars reach jit as cached device scalars (NOTE [Scalar constants]): same values, signs and dtypes."""
    x = xgrad.tensor(np.array([1.0, 2.0]))  # float64
    assert (1.0 / (x * 0.0)).tolist() == [np.inf, np.inf]
    assert (1.0 / (x * -0.0)).tolist() == [-np.inf, -np.inf]
    assert np.isnan((x * float("nan")).detach().numpy()).all()
    f32 = xgrad.tensor(np.ones(2, np.float32))
    assert (f32 * 1.0001).dtype == jnp.float32  # weakly typed, as the Python scalar
    np.testing.assert_allclose((x * 1.0001).detach().numpy(), np.array([1.0001, 2.0002]), rtol=1e-15)  # float64 kept exact
    ints = xgrad.tensor(np.array([1, 2], np.int32))
    assert (ints + 2).dtype == jnp.int32 and (ints + 2).tolist() == [3, 4]
    assert (ints * 1.5).tolist() == [1.5, 3.0]
