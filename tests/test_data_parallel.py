"""``nn.DataParallel`` and ``nn.parallel.DistributedDataParallel``: PyTorch's data-parallel wrappers.

``DataParallel`` over the suite's two host devices (and four, in a fresh interpreter)
must train to the single-device losses, parameters and BatchNorm statistics, in eager,
with every backward compiled and inside ``xgrad.compile``, its inputs actually split
over the devices. ``python tests/test_data_parallel.py OUT PROCESS_ID PORT`` is the
worker of ``DistributedDataParallel``'s test: two processes on loopback, each with its
own batch and its own initial parameters; the test checks the gradients they end with
against ``jax.grad`` of the same loss on each process's batch, averaged as PyTorch's
DDP averages them, and ``no_sync``'s local accumulation.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

SHAPES = (3, 4, 2)  # in, hidden, out


def _mlp(key: int, batchnorm: bool = False):
    import xgrad

    layers = [xgrad.nn.Linear(SHAPES[0], SHAPES[1], key=key)]
    layers += [xgrad.nn.BatchNorm1d(SHAPES[1])] if batchnorm else []
    layers += [xgrad.nn.Tanh(), xgrad.nn.Linear(SHAPES[1], SHAPES[2], key=key + 1)]
    return xgrad.nn.Sequential(*layers).double()


def _batches(sizes):
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(n, SHAPES[0])), rng.normal(size=(n, SHAPES[2]))) for n in sizes]


def _train(model, mode: str, batches):
    """SGD steps on ``model``; the losses and the final state."""
    import xgrad

    optimizer = xgrad.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        optimizer.zero_grad()
        loss = xgrad.nn.functional.mse_loss(model(x), y)
        loss.backward(compiled=mode == "compiled")
        optimizer.step()
        return loss

    run = xgrad.compile(step) if mode == "xgrad.compile" else step
    losses = [float(run(xgrad.tensor(x), xgrad.tensor(y))) for x, y in batches]
    return losses, {name: t.detach().numpy() for name, t in model.state_dict().items()}


@pytest.mark.parametrize("mode", ["eager", "compiled", "xgrad.compile"])
def test_data_parallel_trains_to_the_single_device_result(mode):
    import jax

    import xgrad

    assert jax.local_device_count() == 2
    batches = _batches([6, 6, 5, 6])  # 5 rows: the devices do not divide it, so it is replicated
    want_losses, want_state = _train(_mlp(0, batchnorm=True), "eager", batches)
    model = xgrad.nn.DataParallel(_mlp(0, batchnorm=True))
    losses, state = _train(model, mode, batches)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
    assert list(state) == [f"module.{name}" for name in want_state]
    for name, value in want_state.items():
        np.testing.assert_allclose(state[f"module.{name}"], value, rtol=1e-12, atol=1e-14, err_msg=name)
    for p in model.parameters():  # replicated over both devices, and so are the grads XLA reduced
        assert len(p.sharding.device_set) == 2 and p.sharding.is_fully_replicated
        assert p.grad.sharding.is_fully_replicated and len(p.grad.sharding.device_set) == 2


def test_data_parallel_splits_the_batch_along_dim():
    import jax
    from jax.sharding import PartitionSpec as P

    import xgrad

    seen = []

    class Probe(xgrad.nn.Module):
        def forward(self, x, extra):
            seen.append((str(x.sharding.spec), str(extra["t"].sharding.spec), extra["n"]))
            return x * 2

    x = xgrad.tensor(np.arange(12.0).reshape(3, 4))
    extra = {"t": xgrad.ones(3), "n": 7}
    out = xgrad.nn.DataParallel(Probe(), dim=1)(x, extra=extra)
    assert seen == [(str(P(None, "batch")), str(P()), 7)]
    np.testing.assert_array_equal(out.numpy(), 2 * np.arange(12.0).reshape(3, 4))
    assert out.device == jax.local_devices()[0]  # gathered onto output_device, as PyTorch's
    # data_parallel: the same, as a function; a single argument needs no tuple.
    gathered = xgrad.nn.parallel.data_parallel(Probe(), x, output_device=1, dim=1, module_kwargs={"extra": extra})
    assert seen[1] == seen[0] and gathered.device == jax.local_devices()[1]
    np.testing.assert_array_equal(gathered.numpy(), out.numpy())


def test_data_parallel_on_one_device_is_the_model_called():
    import jax

    import xgrad

    model = _mlp(0)
    dp = xgrad.nn.parallel.DataParallel(model, device_ids=[1])
    assert dp.module is model and xgrad.nn.DataParallel is xgrad.nn.parallel.DataParallel
    x = xgrad.tensor(_batches([4])[0][0])
    out = dp(x)
    assert model[0].weight.sharding.device_set == {jax.local_devices()[0]}  # not moved
    np.testing.assert_array_equal(out.detach().numpy(), model(x).detach().numpy())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device_ids": [5]}, r"device_ids must be indices 0\.\.1 into jax.local_devices\(\)"),
        ({"device_ids": []}, "device_ids is empty"),
        ({"device_ids": [0, 0]}, "names a device twice"),
        ({"device_ids": [0], "output_device": 1}, "output_device 1 is not one of device_ids"),
    ],
)
def test_data_parallel_rejects_devices_it_does_not_have(kwargs, message):
    import xgrad

    model = _mlp(0)
    before = model[0].weight.sharding
    with pytest.raises(ValueError, match=message):
        xgrad.nn.DataParallel(model, **kwargs)
    assert model[0].weight.sharding == before
    with pytest.raises(TypeError, match="module must be an xgrad.nn.Module, got function"):
        xgrad.nn.DataParallel(lambda x: x)


@pytest.mark.slow
def test_data_parallel_on_four_devices():
    from tests._scripts import run_json

    found = run_json(
        """
        import json, sys
        sys.path.insert(0, ".")
        import xgrad
        from tests.test_data_parallel import _batches, _mlp, _train
        batches = _batches([8, 8, 6])
        want = _train(_mlp(0, batchnorm=True), "eager", batches)[0]
        got = {mode: _train(xgrad.nn.DataParallel(_mlp(0, batchnorm=True)), mode, batches)[0]
               for mode in ("eager", "compiled", "xgrad.compile")}
        model = xgrad.nn.DataParallel(_mlp(0))
        specs = []
        model.module.register_forward_pre_hook(lambda module, args: specs.append(str(args[0].sharding.spec)))
        model(xgrad.ones(8, 3))
        spec = specs[0]
        print(json.dumps({"want": want, "got": got, "devices": len(model.device_ids), "spec": spec}))
        """,
        devices=4,
        timeout=120,
    )
    assert found["devices"] == 4 and found["spec"] == "P('batch',)"
    for mode, losses in found["got"].items():
        np.testing.assert_allclose(losses, found["want"], rtol=1e-12, err_msg=mode)


def test_distributed_data_parallel_in_one_process_is_the_model():
    import xgrad

    model = _mlp(0)
    ddp = xgrad.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    assert xgrad.nn.DistributedDataParallel is xgrad.nn.parallel.DistributedDataParallel
    x, y = (xgrad.tensor(a) for a in _batches([4])[0])
    with ddp.no_sync():
        assert not ddp.require_backward_grad_sync
        xgrad.nn.functional.mse_loss(ddp(x), y).backward()
    assert ddp.require_backward_grad_sync
    want = _mlp(0)
    xgrad.nn.functional.mse_loss(want(x), y).backward()
    for p, q in zip(model.parameters(), want.parameters(), strict=True):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
    assert list(ddp.state_dict()) == [f"module.{name}" for name in want.state_dict()]
    with pytest.raises(ValueError, match="device_ids must name one device"):
        xgrad.nn.parallel.DistributedDataParallel(model, device_ids=[0, 1])


# -- DistributedDataParallel over two processes ----------------------------------------
def _ddp_batch(process_id: int, which: int):
    rng = np.random.default_rng(10 * process_id + which)
    return rng.normal(size=(4, SHAPES[0])), rng.normal(size=(4, SHAPES[2]))


def _ddp_model(key: int):
    """The MLP plus a head only process 0 uses (``find_unused_parameters``'s case)."""
    import xgrad

    class Model(xgrad.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = _mlp(key)
            self.head = xgrad.nn.Linear(SHAPES[2], SHAPES[2], key=key + 7).double()
            self.never = xgrad.nn.Linear(1, 1, key=key).double()

        def forward(self, x, use_head):
            out = self.body(x)
            return self.head(out) if use_head else out

    return Model()


def ddp_worker(out: str, process_id: int, port: int) -> None:  # pragma: no cover - runs in children
    import jax

    import xgrad

    xgrad.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60,
                                 heartbeat_timeout_seconds=30, shutdown_timeout_seconds=30)
    jax.config.update("jax_enable_x64", True)
    model = _ddp_model(key=process_id)  # different in each process: DDP takes process 0's
    ddp = xgrad.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    arrays = {f"init/{n}": p.detach().numpy() for n, p in model.named_parameters()}
    use_head = process_id == 0

    def loss(which):
        x, y = (xgrad.tensor(a) for a in _ddp_batch(process_id, which))
        return xgrad.nn.functional.mse_loss(ddp(x, use_head), y)

    for engine in ("eager", "compiled"):
        compiled = engine == "compiled"
        model.zero_grad()
        loss(0).backward(compiled=compiled)
        arrays |= {f"{engine}/synced/{n}": p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        with ddp.no_sync():
            loss(0).backward(compiled=compiled)
        arrays |= {f"{engine}/local/{n}": p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}
        loss(1).backward(compiled=compiled)
        arrays |= {f"{engine}/accumulated/{n}": p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}
    def step(x, y):
        xgrad.nn.functional.mse_loss(ddp(x, use_head), y).backward()

    try:
        xgrad.compile(step, fallback="error")(*(xgrad.tensor(a) for a in _ddp_batch(process_id, 0)))
    except RuntimeError as error:
        arrays["compile_error"] = np.array(str(error))
    np.savez(os.path.join(out, f"arrays{process_id}.npz"), **arrays)


def _jax_grads(params: dict, process_id: int, which: int) -> dict:
    """``jax.grad`` of one process's loss, written with jax.numpy."""
    import jax
    import jax.numpy as jnp

    x, y = (jnp.asarray(a) for a in _ddp_batch(process_id, which))

    def loss(p):
        h = jnp.tanh(x @ p["body.0.weight"].T + p["body.0.bias"])
        out = h @ p["body.2.weight"].T + p["body.2.bias"]
        if process_id == 0:
            out = out @ p["head.weight"].T + p["head.bias"]
        return jnp.mean((out - y) ** 2)

    used = {n: v for n, v in params.items() if process_id == 0 or not n.startswith("head.")}
    return {n: np.asarray(g) for n, g in jax.grad(loss)(used).items()}


@pytest.mark.slow
def test_distributed_data_parallel_averages_gradients_over_two_processes(tmp_path):
    from tests.test_distributed import _free_port, launch

    port = _free_port()
    launch(lambda i: [sys.executable, __file__, str(tmp_path), str(i), str(port)], 2, 1, timeout=120)
    arrays = [dict(np.load(tmp_path / f"arrays{i}.npz")) for i in range(2)]
    for found in arrays:
        assert "a forward inside xgrad.compile cannot sync its gradients" in str(found.pop("compile_error"))
    init = {k.removeprefix("init/"): v for k, v in arrays[0].items() if k.startswith("init/")}
    for k, v in init.items():  # process 1 started from its own parameters and took process 0's
        np.testing.assert_array_equal(arrays[1][f"init/{k}"], v)
    import jax.numpy as jnp

    params = {k: jnp.asarray(v) for k, v in init.items() if not k.startswith("never.")}
    grads = {(p, w): _jax_grads(params, p, w) for p in range(2) for w in range(2)}

    def mean(*per_process):
        names = set().union(*per_process)
        return {n: sum(g.get(n, 0.0) for g in per_process) / 2 for n in names}

    def add(a, b):
        return {n: a[n] + b.get(n, 0.0) for n in a}

    for engine in ("eager", "compiled"):
        for i in range(2):
            want = {
                "synced": mean(grads[0, 0], grads[1, 0]),  # head: process 0's grad over 2, as PyTorch's DDP
                "local": grads[i, 0],
                "accumulated": mean(add(grads[0, 0], grads[0, 1]), add(grads[1, 0], grads[1, 1])),
            }
            for case, expected in want.items():
                got = {k.split("/")[-1]: v for k, v in arrays[i].items() if k.startswith(f"{engine}/{case}/")}
                assert set(got) == set(expected), (engine, i, case, sorted(got))  # never used anywhere: grad None
                for n, g in expected.items():
                    np.testing.assert_allclose(got[n], g, rtol=1e-12, atol=1e-15, err_msg=f"{engine} process {i} {case} {n}")


if __name__ == "__main__":  # pragma: no cover - the worker of the two-process test
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ddp_worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    print(json.dumps({"done": True}))
