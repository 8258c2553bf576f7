"""Per-device scheduling: graphs that hop across host devices, where each node runs, where grads land.

The four-device checks run in one subprocess with the host split into four devices
(NOTE [Device threads] in engine/threads.py); the test process compares its numbers with
``jax.grad`` of the same function on plain arrays on one device. The rest runs in the
main session's two devices.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _scripts import run_json

import xgrad
from xgrad.autograd import Function

# Written once: ``ns`` is jax.numpy or xgrad, ``to(t, k)`` moves to device k (or not at
# all), ``tap(t, label)`` lets the xgrad run record which thread t's gradient reached.
FORWARD = """
def hopping(ns, to, tap, x, w1, w2, w3):
    h0 = tap(ns.tanh(x), "h0")
    h1 = tap(ns.tanh(to(h0, 1) @ w1), "h1")
    h1_on_2 = to(h1, 2)
    h2 = tap(ns.sin(h1_on_2 @ w2) + h1_on_2, "h2")
    h3 = tap(ns.exp(to(h2, 3) * w3), "h3")
    return to(h3.sum(), 0) + to((h1 ** 2).mean(), 0) * x.sum()


def branches(ns, to, tap, x, w1, w2, w3):
    total = ns.tanh(x).sum()
    for k, w in ((1, w1), (2, w2), (3, w3)):
        total = total + to(tap(ns.tanh(to(x, k) @ w), f"b{k}").sum(), 0)
    return total
"""
SHAPES = {"x": (3, 4), "w1": (4, 4), "w2": (4, 4), "w3": (4,)}
BRANCH_SHAPES = {"x": (3, 4), "w1": (4, 4), "w2": (4, 2), "w3": (4, 5)}
LEAF_DEVICE = {"x": 0, "w1": 1, "w2": 2, "w3": 3}

SCRIPT = """
import json, threading
import numpy as np
import xgrad

devices = jax.devices()
FORWARD = {forward!r}
SHAPES = {shapes!r}
LEAF_DEVICE = {leaf_device!r}
exec(FORWARD)


def run(fn, shapes, multi_device, multithreading=True):
    rng = np.random.default_rng(0)
    leaves = {{}}
    for name, shape in shapes.items():
        device = devices[LEAF_DEVICE[name] if multi_device else 0]
        leaves[name] = xgrad.tensor(rng.normal(size=shape), device=device, requires_grad=True)
    threads = []

    def tap(t, label):
        t.register_hook(lambda g: threads.append((label, threading.current_thread().name)))
        return t

    def to(t, k):
        return t.to(devices[k]) if multi_device else t

    for name, leaf in leaves.items():
        leaf.register_post_accumulate_grad_hook(
            lambda t, name=name: threads.append(("acc_" + name, threading.current_thread().name))
        )
    with xgrad.autograd.set_multithreading_enabled(multithreading):
        fn(xgrad, to, tap, *leaves.values()).backward()
    return {{
        "grads": {{n: t.grad.numpy().tolist() for n, t in leaves.items()}},
        "grad_devices": {{n: t.grad.device.id for n, t in leaves.items()}},
        "threads": threads,
    }}


print(json.dumps({{
    "hopping": run(hopping, SHAPES, True),
    "hopping_one_device": run(hopping, SHAPES, False),
    "hopping_no_threads": run(hopping, SHAPES, True, multithreading=False),
    "branches": run(branches, {branch_shapes!r}, True),
    "worker_threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("xgrad-autograd")),
}}))
"""


def reference_grads(fn_name, shapes):
    namespace: dict = {}
    exec(FORWARD, namespace)
    rng = np.random.default_rng(0)
    arrays = [jnp.asarray(rng.normal(size=shape)) for shape in shapes.values()]

    def f(*xs):
        return namespace[fn_name](jnp, lambda t, k: t, lambda t, label: t, *xs)

    grads = jax.grad(f, argnums=tuple(range(len(arrays))))(*arrays)
    return dict(zip(shapes, grads, strict=True))


@pytest.fixture(scope="module")
def four_devices():
    return run_json(
        SCRIPT.format(forward=FORWARD, shapes=SHAPES, leaf_device=LEAF_DEVICE, branch_shapes=BRANCH_SHAPES),
        devices=4,
    )


def assert_grads(got, fn_name, shapes):
    for name, expected in reference_grads(fn_name, shapes).items():
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(expected), rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("run", ["hopping", "hopping_one_device", "hopping_no_threads"])
def test_hopping_graph_gives_single_device_grads(four_devices, run):
    assert_grads(four_devices[run]["grads"], "hopping", SHAPES)


def test_independent_branches_on_four_devices(four_devices):
    assert_grads(four_devices["branches"]["grads"], "branches", BRANCH_SHAPES)
    ran = dict(four_devices["branches"]["threads"])
    assert ran == {
        "b1": "xgrad-autograd-cpu:1",
        "b2": "xgrad-autograd-cpu:2",
        "b3": "xgrad-autograd-cpu:3",
        "acc_x": "MainThread",
        "acc_w1": "xgrad-autograd-cpu:1",
        "acc_w2": "xgrad-autograd-cpu:2",
        "acc_w3": "xgrad-autograd-cpu:3",
    }


def test_each_leaf_grad_lives_on_the_leaf_device(four_devices):
    assert four_devices["hopping"]["grad_devices"] == LEAF_DEVICE
    assert four_devices["hopping_one_device"]["grad_devices"] == dict.fromkeys(LEAF_DEVICE, 0)


def test_nodes_on_other_devices_run_on_their_worker_thread(four_devices):
    ran = four_devices["hopping"]["threads"]
    assert dict(ran) == {
        "h0": "MainThread",
        "h1": "xgrad-autograd-cpu:1",
        "h2": "xgrad-autograd-cpu:2",
        "h3": "xgrad-autograd-cpu:3",
        "acc_x": "MainThread",
        "acc_w1": "xgrad-autograd-cpu:1",
        "acc_w2": "xgrad-autograd-cpu:2",
        "acc_w3": "xgrad-autograd-cpu:3",
    }
    assert len(ran) == 8  # every hook ran exactly once
    assert four_devices["worker_threads"] == [f"xgrad-autograd-cpu:{k}" for k in (1, 2, 3)]


def test_multithreading_disabled_runs_everything_on_the_caller(four_devices):
    ran = four_devices["hopping_no_threads"]["threads"]
    assert len(ran) == 8
    assert {thread for _, thread in ran} == {"MainThread"}
    assert four_devices["hopping_no_threads"]["grad_devices"] == LEAF_DEVICE


# -- in the main session's two devices ---------------------------------------------------


class WrongDeviceGrad(Function):
    """Identity whose backward returns its gradient on the default device, whatever the input's."""

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return xgrad.tensor(g.array, device=jax.devices()[0]) * 2.0


def test_zero_dim_grad_on_another_device_is_moved_to_the_input_device():
    dev1 = jax.devices()[1]
    x = xgrad.tensor(1.5, device=dev1, requires_grad=True)
    (WrongDeviceGrad.apply(x) * x).backward()
    assert x.grad.device == dev1
    assert x.grad.item() == pytest.approx(2.0 * 1.5 + 1.5)


def test_grad_on_another_device_is_rejected_with_the_node_and_devices():
    x = xgrad.tensor([1.0, 2.0], device=jax.devices()[1], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"WrongDeviceGradBackward returned an invalid gradient at index 0 - expected device cpu:1 but got cpu:0"):
        WrongDeviceGrad.apply(x).sum().backward()
    (x * 3.0).sum().backward()  # the engine is fine afterwards
    assert x.grad.tolist() == [3.0, 3.0]


def test_to_device_backward_moves_the_grad_back():
    dev0, dev1 = jax.devices()[:2]
    x = xgrad.tensor([1.0, -2.0, 3.0], requires_grad=True)
    y = x.to(dev1)
    assert y.device == dev1 and y.grad_fn.name() == "ToDeviceBackward"
    (y ** 3).sum().backward()
    assert x.grad.device == dev0
    np.testing.assert_allclose(x.grad.numpy(), 3.0 * np.array([1.0, -2.0, 3.0]) ** 2)


def test_sharded_arrays_run_on_the_callers_queue():
    import threading

    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
    sharding = NamedSharding(mesh, PartitionSpec("d"))
    x = xgrad.tensor(jax.device_put(jnp.arange(4.0), sharding), requires_grad=True)
    y = x * x
    ran = []
    y.register_hook(lambda g: ran.append(threading.current_thread().name))
    assert y.grad_fn.device() is None
    y.sum().backward()
    assert ran == [threading.current_thread().name]
    np.testing.assert_allclose(x.grad.numpy(), 2.0 * np.arange(4.0))
    assert x.grad.array.sharding.device_set == sharding.device_set


def test_compiled_grads_live_on_their_leaves_devices():
    """The compiled backward writes ``.grad`` directly: each must come out on its leaf's device, as eager's."""
    dev0, dev1 = jax.devices()[:2]
    x_np, w_np = np.array([1.0, -2.0, 3.0]), np.array([0.5, 0.25, -1.0])
    grads = {}
    for compiled in (False, True, True):  # a miss, then a hit
        x = xgrad.tensor(x_np, requires_grad=True)
        w = xgrad.tensor(w_np, device=dev1, requires_grad=True)
        ((x.to(dev1) * w).tanh().to(dev0) ** 2).sum().backward(compiled=compiled)
        assert (x.grad.device, w.grad.device) == (dev0, dev1)
        grads[compiled] = (x.grad.numpy(), w.grad.numpy())
    expected = jax.grad(lambda a, b: jnp.sum(jnp.tanh(a * b) ** 2), argnums=(0, 1))(x_np, w_np)
    for got in grads.values():
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-12)
