"""The recorded op's hot path: what it skips and what it still checks.

NOTE [One device, no device check] in ``xgrad/ops/devices.py`` and NOTE [Recording cost] in ``xgrad/ops/registry.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _scripts import run_json

import xgrad
from xgrad.ops import registry

ONE_DEVICE_STEP = """
import json
import numpy as np
import xgrad
from xgrad.ops import registry

calls = []
check = registry.check_same_devices
registry.check_same_devices = lambda args, tensors, arrays: calls.append(len(tensors)) or check(args, tensors, arrays)
rng = np.random.default_rng(0)
x = xgrad.tensor(rng.standard_normal((2, 4)), requires_grad=True)
w = xgrad.tensor(rng.standard_normal((3, 4)), requires_grad=True)
b = xgrad.tensor(rng.standard_normal(3), requires_grad=True)
loss = (xgrad.linear(x, w, b) * xgrad.linear(x, w, b).tanh()).sum()
forward = list(calls)
loss.backward()
print(json.dumps({"forward": forward, "checks": len(calls), "devices": len(jax.devices()), "loss": loss.item(),
                  "grads": [t.grad.tolist() for t in (x, w, b)]}))
"""


def _reference(x, w, b):
    h = x @ w.T + b
    return jnp.sum(h * jnp.tanh(h))


@pytest.mark.parametrize("devices", [1, 2])
def test_device_check_runs_only_where_a_process_holds_several_devices(devices):
    """With one device in the process, ops of several tensors skip the check; the values and grads are the same."""
    result = run_json(ONE_DEVICE_STEP, devices=devices)
    assert result["devices"] == devices
    # linear twice (three tensors each), mul (two); none on one device, forward or backward
    assert result["forward"] == ([] if devices == 1 else [3, 3, 2])
    assert (result["checks"] == 0) == (devices == 1)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((2, 4)), rng.standard_normal((3, 4)), rng.standard_normal(3)]
    np.testing.assert_allclose(result["loss"], _reference(*args), rtol=1e-12)
    for got, expected in zip(result["grads"], jax.grad(_reference, argnums=(0, 1, 2))(*args), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_a_zero_dim_operand_on_another_device_joins_the_other_operand():
    """Several devices (this process has two): a 0-dim tensor elsewhere is moved, as PyTorch allows scalars."""
    dev0, dev1 = jax.devices()[:2]
    v = xgrad.tensor(np.array([1.0, -2.0, 3.0]), device=dev0, requires_grad=True)
    s = xgrad.tensor(np.array(2.5), device=dev1, requires_grad=True)
    for out in (v * s, s * v, s * s * v):
        assert out.device == dev0
    (s * v * s).sum().backward()
    np.testing.assert_allclose(v.grad.detach().numpy(), [6.25, 6.25, 6.25], rtol=1e-15)
    np.testing.assert_allclose(s.grad.item(), 2 * 2.5 * (1.0 - 2.0 + 3.0), rtol=1e-15)
    assert s.grad.device == dev1 and v.grad.device == dev0


def test_several_outputs_carry_their_metadata_and_history():
    """A primitive of several outputs (cross_entropy's four) records one node with each output's metadata."""
    logits = xgrad.tensor(np.array([[0.5, -1.0, 2.0], [1.0, 0.0, -0.5]]), requires_grad=True)
    target = xgrad.tensor(np.array([2, 0]))
    loss = xgrad.cross_entropy(logits, target)
    node = loss.grad_fn
    assert [m.shape for m in node.input_metadata] == [(), (2, 3), (), (2, 3)]
    assert all(m.dtype == jnp.float64 and m.sharding == logits.array.sharding for m in node.input_metadata)
    loss.backward()

    def reference(z):
        logp = jax.nn.log_softmax(z)
        return -jnp.mean(logp[jnp.arange(2), jnp.array([2, 0])])

    np.testing.assert_allclose(logits.grad.detach().numpy(), jax.grad(reference)(logits.array), rtol=1e-12)


def test_edges_and_saved_avals_are_their_named_tuples():
    """``_record`` makes Edge, InputMetadata and Aval with ``tuple.__new__``: still those types, with their fields.
    A tensor input that no needed rule reads is kept as ``None`` (NOTE [Save what the needed rules read])."""
    x = xgrad.tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x * 3.0  # the constant's rule reads nothing: x's value is not saved
    z = xgrad.tensor(np.array([4.0, 5.0])) * y  # z's rule for y reads the other operand, not y
    assert type(y.grad_fn.next_edges[0]) is registry.Edge and y.grad_fn.next_functions[0][1] == 0
    assert type(z.grad_fn.input_metadata[0]) is registry.InputMetadata and z.grad_fn.input_metadata[0].ndim == 1
    assert z.grad_fn.saved[1] is None
    aval = x.to(xgrad.float32).grad_fn.saved[0]  # the cast's rule reads the input's dtype, which ``save=()`` keeps alone
    assert type(aval) is registry.Aval and (aval.shape, aval.dtype, aval.ndim) == ((2,), jnp.float64, 1)
    z.sum().backward()
    np.testing.assert_allclose(x.grad.detach().numpy(), [12.0, 15.0])


def test_recording_reads_no_unset_tensor_attribute(monkeypatch):
    """An input that needs no grad is asked where JAX cut it (``_cut_site``): a set slot, not a miss
    that goes through ``Tensor.__getattr__`` (1-2 µs per input); a cut tensor still raises."""
    misses = []
    getattr_of_tensor = xgrad.Tensor.__getattr__
    monkeypatch.setattr(
        xgrad.Tensor, "__getattr__", lambda self, name: misses.append(name) or getattr_of_tensor(self, name)
    )
    x = xgrad.tensor(np.ones((2, 4)))
    w = xgrad.tensor(np.ones((3, 4)), requires_grad=True)
    b = xgrad.tensor(np.zeros(3), requires_grad=True)
    out = xgrad.linear(x, w, b) * xgrad.tensor(np.full(3, 0.5))
    assert misses == []
    out.sum().backward()
    np.testing.assert_allclose(w.grad.detach().numpy(), np.full((3, 4), 1.0))
    cut = jax.jit(lambda a: (a * a).sum())(w)
    with pytest.raises(RuntimeError, match="plain JAX transformation"):
        cut + w.sum()


def _linear_loss(x, w, b):
    h = x @ w.T + b
    return jnp.sum(h * h)


@pytest.mark.parametrize("mode", ["eager", "compiled", "xgrad.compile"])
def test_inputs_no_needed_rule_reads_are_dropped_and_grads_match_jax(mode):
    """``linear`` with only the weight and bias requiring grad keeps the input's value alone: the weight
    and bias are read by no needed rule (the weight's reads the input, the bias's ``g``) and are kept as
    ``None``. The grads, eager, compiled backward and under ``xgrad.compile``, are ``jax.grad``'s, and so
    is a second-order grad through ``create_graph`` (its rules then run op by op)."""
    rng = np.random.default_rng(3)
    x, w, b = (rng.standard_normal(s) for s in ((2, 4), (3, 4), (3,)))
    tx, tw, tb = xgrad.tensor(x), xgrad.tensor(w, requires_grad=True), xgrad.tensor(b, requires_grad=True)
    node = xgrad.linear(tx, tw, tb).grad_fn
    assert [type(s) for s in node.saved] == [xgrad.engine.saved.SavedTensor, type(None), type(None)]

    def grads():
        tw.grad = tb.grad = None
        (xgrad.linear(tx, tw, tb) ** 2).sum().backward()
        return tw.grad, tb.grad

    if mode == "compiled":
        with xgrad.autograd.compiled.enable():
            gw, gb = grads()
    elif mode == "xgrad.compile":
        gw, gb = xgrad.compile(grads)()
    else:
        gw, gb = grads()
    want_w, want_b = jax.grad(_linear_loss, argnums=(1, 2))(x, w, b)
    np.testing.assert_allclose(gw.detach().numpy(), want_w, rtol=1e-12)
    np.testing.assert_allclose(gb.detach().numpy(), want_b, rtol=1e-12)
    # Second order: d/dw of sum(d loss/db), with the first backward recorded.
    (first,) = xgrad.autograd.grad((xgrad.linear(tx, tw, tb) ** 2).sum(), [tb], create_graph=True)
    (second,) = xgrad.autograd.grad(first.sum(), [tw])
    want = jax.grad(lambda w: jnp.sum(jax.grad(_linear_loss, argnums=2)(x, w, b)))(w)
    np.testing.assert_allclose(second.detach().numpy(), want, rtol=1e-12)


def test_autocast_wrapper_takes_the_ops_own_parameters():
    """A listed op's autocast wrapper has the op's parameters (no ``*args, **kwargs`` to pack), keeps
    ``__wrapped__``, and passes calls on as they came, by position or keyword: NumPy's results."""
    import inspect

    def parameters(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn, follow_wrapped=False).parameters.values()]

    for op in (xgrad.linear, xgrad.sum, xgrad.einsum, xgrad.baddbmm):
        assert op.__wrapped__ is not op and parameters(op) == parameters(op.__wrapped__)
    rng = np.random.default_rng(5)
    x, w, b = (rng.standard_normal(s) for s in ((2, 4), (3, 4), (3,)))
    b1, b2, c = (rng.standard_normal(s) for s in ((2, 2, 3), (2, 3, 4), (2, 2, 4)))
    t = xgrad.tensor
    np.testing.assert_allclose(xgrad.linear(t(x), weight=t(w), bias=t(b)).numpy(), x @ w.T + b, rtol=1e-12)
    np.testing.assert_allclose(xgrad.linear(t(x), t(w)).numpy(), x @ w.T, rtol=1e-12)
    np.testing.assert_allclose(xgrad.sum(t(x), 1, keepdim=True).numpy(), x.sum(1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(xgrad.einsum("ij,kj->ik", t(x), t(w)).numpy(), x @ w.T, rtol=1e-12)
    np.testing.assert_allclose(
        xgrad.baddbmm(t(c), t(b1), t(b2), beta=0.5, alpha=2.0).numpy(), 0.5 * c + 2.0 * (b1 @ b2), rtol=1e-12)


def test_autocast_wrapper_of_every_kind_of_parameter():
    """Positional-only, defaults, ``*args``, keyword-only and ``**kwargs`` reach the op as they came; a
    parameter that would hide one of the wrapper's names is refused when the op is defined."""
    import inspect

    from xgrad.ops.autocast import autocast_op

    def op(a, /, b, c=2, *rest, d, e=5, **extra):
        return a, b, c, rest, d, e, extra

    wrapped = autocast_op(op)
    assert inspect.signature(wrapped, follow_wrapped=False) == inspect.signature(op)
    assert wrapped(1, 2, 3, 4, d=6, z=7) == op(1, 2, 3, 4, d=6, z=7) == (1, 2, 3, (4,), 6, 5, {"z": 7})
    assert wrapped(1, b=2, d=3) == (1, 2, 2, (), 3, 5, {})
    with pytest.raises(TypeError, match="_fn"):
        autocast_op(lambda x, _fn=None: x)


def test_a_leafs_accumulator_is_made_only_when_an_op_is_recorded():
    """``bind`` reads a leaf's ``AccumulateGrad`` in its one pass but makes a missing one only for a node:
    under ``no_grad`` none is made; recorded, the edge leads to the one ``grad_accumulator`` gives, and
    the grad reaches the leaf (``jax.grad``'s)."""
    from xgrad.engine.node import grad_accumulator

    rng = np.random.default_rng(6)
    w_value, x_value = rng.standard_normal((3, 4)), rng.standard_normal((2, 4))
    w = xgrad.tensor(w_value, requires_grad=True)
    with xgrad.no_grad():
        xgrad.linear(xgrad.tensor(x_value), w)
    assert w._grad_accumulator is None
    out = xgrad.linear(xgrad.tensor(x_value), w)
    assert out.grad_fn.next_functions[1] == (grad_accumulator(w), 0)
    (out ** 2).sum().backward()
    want = jax.grad(lambda w: jnp.sum((x_value @ w.T) ** 2))(w_value)
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-12)


def _fields(t):
    """Every field of a tensor that is set, by name (``_array`` and ``grad_fn`` left out)."""
    slots = [name for name in xgrad.Tensor.__slots__ if name not in ("__weakref__", "_array", "grad_fn")]
    return {name: getattr(t, name) for name in slots if hasattr(t, name)}


def test_op_outputs_are_whole_tensors_made_without_the_types_call(monkeypatch):
    """A recorded op's output, and one made under ``no_grad``, is made by ``Tensor._fill`` (NOTE [Op outputs
    made without the type's call]): ``Tensor.__init__`` never runs for it, and it has every field
    ``Tensor(array)`` gives; inside ``inference_mode`` it is an inference tensor, as that would be."""
    x = xgrad.tensor(np.array([0.5, -1.0]), requires_grad=True)
    inits = []
    init = xgrad.Tensor.__init__
    monkeypatch.setattr(xgrad.Tensor, "__init__", lambda self, *a, **k: inits.append(a) or init(self, *a, **k))
    recorded = xgrad.sin(x)
    with xgrad.no_grad():
        plain = xgrad.sin(x)
    with xgrad.inference_mode():
        inference = xgrad.sin(x)
    assert inits == []
    monkeypatch.undo()
    for out in (recorded, plain):
        assert _fields(out) == _fields(xgrad.Tensor(out.array))
    assert _fields(inference) == {**_fields(xgrad.Tensor(inference.array)), "_inference": True}
    assert inference.is_inference() and not plain.is_inference() and plain.grad_fn is None
    recorded.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.cos([0.5, -1.0]), rtol=1e-15)


def test_outputs_of_one_aval_and_sharding_share_their_metadata():
    """A one-output primitive keeps its output's metadata per ``aval`` while the sharding is the same object
    (NOTE [One metadata per output aval]): two ``sin`` nodes of one shape and device share it; another
    shape, and the same shape on another device (this process has two), get their own, with their
    sharding. The grads, which the metadata shapes and places, are ``cos``'s on each device."""
    dev0, dev1 = jax.devices()[:2]
    values = np.array([0.5, 2.0])
    x0 = xgrad.tensor(values, device=dev0, requires_grad=True)
    x1 = xgrad.tensor(values, device=dev1, requires_grad=True)
    wide = xgrad.tensor(np.ones(3), device=dev0, requires_grad=True)
    a, b, c, d = xgrad.sin(x0), xgrad.sin(x0), xgrad.sin(x1), xgrad.sin(wide)
    assert a.grad_fn.input_metadata is b.grad_fn.input_metadata
    for out, x in ((a, x0), (c, x1), (d, wide)):
        (meta,) = out.grad_fn.input_metadata
        assert (meta.shape, meta.dtype, meta.sharding) == (x.shape, x.dtype, out.array.sharding)
        assert meta.sharding.device_set == {x.device}
    ((a + b).sum() + d.sum()).backward()
    c.sum().backward()
    np.testing.assert_allclose(x0.grad.numpy(), 2 * np.cos(values), rtol=1e-15)
    np.testing.assert_allclose(x1.grad.numpy(), np.cos(values), rtol=1e-15)
    assert x1.grad.device == dev1 and x0.grad.device == dev0


def test_linear_of_a_weight_without_an_aval_takes_the_composite():
    """``linear``'s front reads the shapes from the arrays' ``aval``; a tensor over an array without one
    (a NumPy array) goes the composite's way, with NumPy's result and grads."""
    rng = np.random.default_rng(8)
    x, w, b = (rng.standard_normal(s) for s in ((2, 4), (3, 4), (3,)))
    weight = xgrad.Tensor(w).requires_grad_()
    out = xgrad.linear(xgrad.tensor(x), weight, xgrad.tensor(b))
    np.testing.assert_allclose(out.detach().numpy(), x @ w.T + b, rtol=1e-12)
    out.sum().backward()
    np.testing.assert_allclose(weight.grad.numpy(), np.ones((2, 3)).T @ x, rtol=1e-12)


def test_the_sharding_field_is_the_arrays_sharding():
    """``bind`` reads an output's sharding from its field (``ARRAY_SHARDING_FIELD``): the very object
    ``jax.Array.sharding`` returns."""
    from xgrad.jax_internals import ARRAY_SHARDING_FIELD

    for device in jax.devices()[:2]:
        array = jax.device_put(jnp.ones(3), device)
        assert getattr(array, ARRAY_SHARDING_FIELD) is array.sharding


def test_a_paramless_primitive_runs_its_fast_program_from_bind(monkeypatch):
    """``bind`` calls a param-less primitive's fast program itself once made (NOTE [Jitted dispatch]): no
    ``Primitive.dispatch`` call for untraced arrays. Traced ones (under ``jax.jit``) still go through it to the
    program without options, a ``None`` argument is still PyTorch's ``TypeError``, and the values are NumPy's."""
    values = np.array([0.5, -1.0])
    x = xgrad.tensor(values, requires_grad=True)
    xgrad.sin(x)  # the program is made
    calls = []
    dispatch = registry.Primitive.dispatch
    monkeypatch.setattr(
        registry.Primitive, "dispatch", lambda self, arrays, params: calls.append(self.name) or dispatch(self, arrays, params)
    )
    y = xgrad.sin(x)
    assert calls == []
    traced = jax.jit(lambda a: xgrad.sin(xgrad.Tensor(a)).array)(x.array)
    assert calls == ["sin"]
    np.testing.assert_allclose(y.detach().numpy(), np.sin(values), rtol=1e-15)
    np.testing.assert_allclose(np.asarray(traced), np.sin(values), rtol=1e-15)
    with pytest.raises(TypeError, match=r"^sin\(\): argument \(position 1\) must be Tensor, not NoneType$"):
        registry.bind(registry.REGISTRY["sin"], (None,), {})
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.cos(values), rtol=1e-15)
