"""Placement of traced arrays: every op of the registry inside ``xgrad.compile`` and ``jax.jit``.

A traced array has no device of its own (XLA places the program), so nothing may read
``.sharding`` of one: ``Tensor.device`` names the step's device, and ops that make
constants (average pools, ``interpolate``) leave their placement to XLA. Each op spec
(``xgrad.testing.op_specs``) runs forward and backward eagerly, as a compiled step and
under ``jax.jit``, on one small sample; the values must agree.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad import nn
from xgrad.compile_step import CompileFallbackError
from xgrad.engine.compiled.switch import TRACER_ERRORS
from xgrad.testing.op_specs import OP_SPECS

#: One spec per op (the last of each name).
ONE_PER_OP = list({s.name: s for s in OP_SPECS}.values())
#: Ops whose output shape depends on their input values: no program has them (eager runs them).
DATA_DEPENDENT = {"masked_select[broadcast mask]", "repeat_interleave[tensor repeats]"}


def is_tensor(x):
    return isinstance(x, xgrad.Tensor)


def forward_and_grads(spec, *tensors):
    """The op's outputs, then the gradients of the sum of its differentiable outputs."""
    outs = [o for o in jax.tree.leaves(spec.op(*tensors), is_leaf=is_tensor) if is_tensor(o)]
    wanted = [t for t in tensors if t.requires_grad]
    scalars = [o.sum() for o in outs if o.requires_grad]
    grads = []
    if scalars and wanted:
        grads = xgrad.autograd.grad(sum(scalars), wanted, allow_unused=True, materialize_grads=True)
    return [o.detach() for o in outs], list(grads)


def as_tensors(spec, arrays):
    return [
        xgrad.tensor(a, requires_grad=d.differentiable) if d.differentiable else xgrad.tensor(a)
        for a, d in zip(arrays, spec.domains, strict=True)
    ]


def values(result):
    return [np.asarray(t.array if is_tensor(t) else t) for t in jax.tree.leaves(result, is_leaf=is_tensor)]


@pytest.mark.parametrize("spec", ONE_PER_OP, ids=[s.id for s in ONE_PER_OP])
def test_op_in_a_compiled_step_and_under_jax_jit(spec):
    arrays = spec.sample(np.random.default_rng(3), 0)
    step = xgrad.compile(lambda *ts: forward_and_grads(spec, *ts), fallback="error")

    def jitted(*arrays):
        return jax.tree.map(lambda t: t.array, forward_and_grads(spec, *as_tensors(spec, arrays)), is_leaf=is_tensor)

    if spec.id in DATA_DEPENDENT:
        with pytest.raises(CompileFallbackError, match="concrete value"):
            step(*as_tensors(spec, arrays))
        with pytest.raises(TRACER_ERRORS):
            jax.jit(jitted)(*arrays)
        return
    want = values(forward_and_grads(spec, *as_tensors(spec, arrays)))
    for got in (values(step(*as_tensors(spec, arrays))), values(jax.jit(jitted)(*arrays))):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12)


def test_cnn_with_global_average_pooling_and_interpolate_compiles():
    """A CNN step (upsampling, average pools, a global average pool) compiled is the eager step, call by call."""

    def setup():
        model = nn.Sequential(
            nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.Conv2d(4, 4, 3, padding=1),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3),
        ).to(jnp.float64)
        opt = xgrad.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x, y):
            opt.zero_grad()
            up = xgrad.nn.functional.interpolate(x, scale_factor=2, mode="bilinear")
            loss = xgrad.cross_entropy(model(up), y)
            loss.backward()
            opt.step()
            return loss

        return model, step

    xgrad.manual_seed(0)
    eager_model, eager_step = setup()
    xgrad.manual_seed(0)
    model, step = setup()
    step = xgrad.compile(step, fallback="error")
    rng = np.random.default_rng(0)
    for _ in range(3):
        x, y = xgrad.tensor(rng.normal(size=(2, 2, 4, 4))), xgrad.tensor(rng.integers(0, 3, size=2))
        np.testing.assert_allclose(step(x, y).item(), eager_step(x, y).item(), rtol=1e-10)
    for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-9, atol=1e-12)
    assert step.stats()["compiles"] == 1


def test_device_of_a_tensor_inside_a_compiled_step_is_the_inputs_device():
    devices = jax.devices()
    seen = []

    def step(x):
        seen.append(x.device)
        made = xgrad.zeros(3, dtype=x.dtype, device=x.device)
        return (x * 2).to(x.device) + made.to(x)

    x = xgrad.tensor(jax.device_put(np.arange(3.0), devices[-1]))
    out = xgrad.compile(step, fallback="error")(x)
    np.testing.assert_array_equal(out.numpy(), [0.0, 2.0, 4.0])
    assert seen == [devices[-1]]
    # Under plain jax.jit a traced value is on JAX's default device.
    jax.jit(lambda a: step(xgrad.tensor(a)).array)(np.arange(3.0))
    assert seen[-1] == jax.devices()[0]


def backward_with_host_grad(w, x):
    (w * x).backward(np.array([1.0, -2.0, 0.5]))
    return w.grad


def backward_saving_on_cpu(w, x):
    with xgrad.autograd.graph.save_on_cpu():
        y = (w * x).exp().sum()
    y.backward()
    return w.grad


@pytest.mark.parametrize("fn", [backward_with_host_grad, backward_saving_on_cpu], ids=lambda fn: fn.__name__)
def test_backward_placing_host_values_in_a_compiled_step_and_under_jax_jit(fn):
    """A gradient given as host data is placed like its output, and ``save_on_cpu`` moves saved
    values to the host: traced, both leave placement to XLA."""
    x = np.array([0.5, 1.0, -1.5])

    def run(x, traced_w):
        w = xgrad.tensor(traced_w, requires_grad=True)
        return fn(w, xgrad.tensor(x)).array

    w = np.array([1.0, 2.0, 3.0])
    want = run(x, w)
    param = xgrad.tensor(w, requires_grad=True)
    got = xgrad.compile(lambda x: fn(param, x), fallback="error")(xgrad.tensor(x))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(jax.jit(run)(x, w), want, rtol=1e-12)


@pytest.mark.parametrize(
    "op",
    [
        lambda x: xgrad.nn.functional.avg_pool2d(x, 2),
        lambda x: xgrad.nn.functional.adaptive_avg_pool2d(x, (1, 3)),
        lambda x: xgrad.nn.functional.interpolate(x, scale_factor=2, mode="bilinear"),
    ],
    ids=["avg_pool2d", "adaptive_avg_pool2d", "interpolate"],
)
def test_ops_making_constants_on_a_sharded_input(op):
    """An input sharded over two devices: the constants are replicated over its mesh (eagerly they sat
    on its first device, and the op raised that two devices were mixed), and traced XLA places them."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
    values = np.random.default_rng(0).normal(size=(2, 3, 4, 6))
    sharded = xgrad.tensor(jax.device_put(values, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))))
    want = op(xgrad.tensor(values)).numpy()
    np.testing.assert_allclose(op(sharded).numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(xgrad.compile(op, fallback="error")(sharded).numpy(), want, rtol=1e-12)
