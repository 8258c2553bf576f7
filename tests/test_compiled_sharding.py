"""Compiled backward over several devices (a data-parallel step) and from several threads."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

import xgrad
from tests._scripts import run_json
from xgrad.autograd import compiled


@pytest.mark.slow
def test_data_parallel_mlp_on_four_devices_matches_one_device():
    result = run_json(
        """
        import json
        import numpy as np
        import jax, jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import xgrad

        mesh = Mesh(np.array(jax.devices()), ("data",))
        batch, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
        rng = np.random.default_rng(0)
        x_np, y_np = rng.standard_normal((8, 5)), rng.integers(0, 3, 8)
        w1_np, w2_np = rng.standard_normal((5, 16)), rng.standard_normal((16, 3))

        def loss(x, y, w1, w2):
            return xgrad.cross_entropy((x @ w1).tanh() @ w2, y)

        def ref(w1, w2):
            logits = jnp.tanh(x_np @ w1) @ w2
            return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(8), y_np])

        out = {"ref": [np.asarray(g).tolist() for g in jax.grad(ref, argnums=(0, 1))(w1_np, w2_np)]}
        x = xgrad.tensor(jax.device_put(x_np, batch))
        y = xgrad.tensor(jax.device_put(y_np, batch))
        w1 = xgrad.tensor(jax.device_put(w1_np, replicated), requires_grad=True)
        w2 = xgrad.tensor(jax.device_put(w2_np, replicated), requires_grad=True)
        for _ in range(2):  # a miss, then a hit
            w1.grad = w2.grad = None
            loss(x, y, w1, w2).backward(compiled=True)
        out["compiled"] = [w.grad.numpy().tolist() for w in (w1, w2)]
        out["same_sharding"] = all(w.grad.array.sharding.is_equivalent_to(w.array.sharding, w.ndim) for w in (w1, w2))
        out["devices"] = len(w1.grad.array.sharding.device_set)
        out["stats"] = xgrad.autograd.compiled.stats()
        print(json.dumps(out))
        """,
        devices=4,
        timeout=240,
    )
    for got, want in zip(result["compiled"], result["ref"], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert result["same_sharding"] and result["devices"] == 4
    assert (result["stats"]["misses"], result["stats"]["hits"]) == (1, 1)


def test_concurrent_compiled_backwards_accumulate_exactly():
    compiled.reset()
    w = xgrad.tensor(np.ones(3), requires_grad=True)
    (w * w).sum().backward(compiled=True)  # compile once up front
    w.grad = None
    errors = []

    def worker(k):
        try:
            for _ in range(10):
                (w * w * float(k)).sum().backward(compiled=True)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in (1, 2, 3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    np.testing.assert_allclose(w.grad.numpy(), 2 * np.ones(3) * 10 * (1 + 2 + 3 + 4))
    compiled.reset()


def test_device_move_runs_between_programs():
    compiled.reset()
    dev0, dev1 = jax.devices()[:2]
    x = xgrad.tensor(np.array([0.5, -1.0, 2.0]), device=dev0, requires_grad=True)
    for _ in range(2):
        x.grad = None
        y = x.to(dev1)
        (y.sin() * y).sum().backward(compiled=True)
        assert x.grad.device == dev0
        np.testing.assert_allclose(x.grad.numpy(), np.sin(x.detach().numpy()) + x.detach().numpy() * np.cos(x.detach().numpy()), rtol=1e-12)
    s = compiled.stats()
    assert (s["misses"], s["hits"], s["fallbacks"]) == (1, 1, {})
    compiled.reset()


def test_hlo_text_is_compiled_for_the_input_shardings_it_ran_with():
    """A batch sharded over two devices: the weight's grad needs an all-reduce, and the HLO shows it."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from xgrad.engine import compiled as compiled_engine

    compiled.reset()
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    rng = np.random.default_rng(0)
    x_np, w_np = rng.standard_normal((4, 3)), rng.standard_normal((3, 2))
    x = xgrad.tensor(jax.device_put(x_np, NamedSharding(mesh, P("data"))))
    w = xgrad.tensor(jax.device_put(w_np, NamedSharding(mesh, P())), requires_grad=True)
    ((x @ w).tanh() * 2).sum().backward(compiled=True)
    np.testing.assert_allclose(w.grad.numpy(), x_np.T @ (2 * (1 - np.tanh(x_np @ w_np) ** 2)), rtol=1e-6)
    (program,) = compiled_engine.cache.programs.values()
    assert "all-reduce" in program.hlo_text()
    compiled.reset()


def test_hlo_text_of_a_graph_mixing_a_mesh_and_the_default_device():
    """Mesh tensors and a default-device scalar in one backward: it trains, and its program text shows."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from xgrad.engine import compiled as compiled_engine

    compiled.reset()
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    rng = np.random.default_rng(1)
    x_np, w_np = rng.standard_normal((4, 3)), rng.standard_normal((3, 2))
    x = xgrad.tensor(jax.device_put(x_np, NamedSharding(mesh, P("data"))))
    w = xgrad.tensor(jax.device_put(w_np, NamedSharding(mesh, P())), requires_grad=True)
    scale = xgrad.tensor(np.array(3.0), requires_grad=True)
    ((x @ w).tanh().sum().to(jax.devices()[0]) * scale).backward(compiled=True)
    np.testing.assert_allclose(w.grad.numpy(), x_np.T @ (3 * (1 - np.tanh(x_np @ w_np) ** 2)), rtol=1e-12)
    np.testing.assert_allclose(scale.grad.numpy(), np.tanh(x_np @ w_np).sum(), rtol=1e-12)
    (program,) = compiled_engine.cache.programs.values()
    assert any("all-reduce" in program.hlo_text(i) for i in range(len(program.segments)))
    compiled.reset()
