"""Data parallelism the PyTorch way on JAX's devices: ``nn.DataParallel`` splits the batch over the
local devices and trains to the single-device result; ``DistributedDataParallel`` averages the
gradients of a job's processes as PyTorch's all-reduce does (checked against ``jax.grad`` of
each process's loss, averaged by hand)."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401
from tests.test_distributed import _free_port, launch

X = np.random.default_rng(0).standard_normal((8, 3))
Y = np.arange(8) % 2


def _model():
    return xgrad.nn.Sequential(xgrad.nn.Linear(3, 8, key=1), xgrad.nn.Tanh(), xgrad.nn.Linear(8, 2, key=2)).double()


def _train(model, params, x, steps=3):
    opt = xgrad.optim.SGD(params, lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = xgrad.cross_entropy(model(x), xgrad.tensor(Y[: x.shape[0]]))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.usefixtures("eager_and_compiled")
@pytest.mark.parametrize("batch", [8, 7])  # 7 rows do not split over 2 devices: each computes all of them
def test_data_parallel_trains_to_the_single_device_result(batch):
    single, parallel = _model(), _model()
    wrapped = xgrad.nn.DataParallel(parallel)
    assert wrapped.device_ids == jax.local_devices() and len(wrapped.device_ids) == 2
    seen = []
    parallel[0].register_forward_hook(lambda m, args, out: seen.append(args[0].sharding))
    want = _train(single, single.parameters(), xgrad.tensor(X[:batch]))
    got = _train(wrapped, wrapped.parameters(), xgrad.tensor(X[:batch]))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    for a, b in zip(parallel.parameters(), single.parameters(), strict=True):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-12)
        assert a.sharding.spec == PartitionSpec() and len(a.sharding.device_set) == 2  # replicated
    assert seen[0].spec == (PartitionSpec("batch") if batch == 8 else PartitionSpec())
    assert wrapped(xgrad.tensor(X)).device == jax.local_devices()[0]  # gathered on output_device
    assert list(wrapped.state_dict()) == [f"module.{k}" for k in single.state_dict()]


def test_data_parallel_device_ids_and_the_functional_form():
    model = _model()
    out = xgrad.nn.parallel.data_parallel(model, xgrad.tensor(X), device_ids=[1], output_device=1)
    assert out.device == jax.local_devices()[1]
    np.testing.assert_allclose(out.detach().numpy(), _model()(xgrad.tensor(X)).detach().numpy(), rtol=1e-12)
    with pytest.raises(RuntimeError, match="device id 5 is out of range: JAX sees 2 local devices"):
        xgrad.nn.DataParallel(model, device_ids=[5])


def test_init_process_group_without_torchruns_environment_says_what_is_missing(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="environment variable MASTER_ADDR expected, but not set"):
        xgrad.distributed.init_process_group("nccl")
    assert (xgrad.distributed.get_rank(), xgrad.distributed.get_world_size()) == (0, 1)
    assert not xgrad.distributed.is_initialized()


def test_distributed_data_parallel_in_one_process_is_the_module():
    model = _model()
    ddp = xgrad.nn.parallel.DistributedDataParallel(model, device_ids=[0], find_unused_parameters=True)
    assert ddp.module is model and ddp.require_backward_grad_sync
    with ddp.no_sync():
        assert not ddp.require_backward_grad_sync
    assert ddp.require_backward_grad_sync
    np.testing.assert_array_equal(ddp(xgrad.tensor(X)).detach().numpy(), model(xgrad.tensor(X)).detach().numpy())


_WORKER = """
import json, os, sys
import jax, numpy as np
port, rank = sys.argv[1], int(sys.argv[2])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2", RANK=str(rank))  # as torchrun sets them
import xgrad
xgrad.distributed.init_process_group(backend="gloo")
jax.config.update("jax_enable_x64", True)
assert (xgrad.distributed.get_rank(), xgrad.distributed.get_world_size()) == (rank, 2)
from tests.test_data_parallel import X, Y, _model
model = xgrad.nn.parallel.DistributedDataParallel(_model())
x, y = xgrad.tensor(X[rank::2], device=jax.local_devices()[0]), xgrad.tensor(Y[rank::2], device=jax.local_devices()[0])
with model.no_sync():  # accumulated here, averaged with the next backward's
    xgrad.cross_entropy(model(x), y).backward()
xgrad.cross_entropy(model(x[:2]), y[:2]).backward()
print(json.dumps({n: p.grad.tolist() for n, p in model.module.named_parameters()}))
xgrad.distributed.destroy_process_group()
"""


def test_distributed_data_parallel_averages_two_processes_gradients():  # a torchrun launch of two processes
    port = str(_free_port())
    outputs = launch(lambda i: [sys.executable, "-c", _WORKER, port, str(i)], num_processes=2, devices_per_process=1,
                     timeout=120)
    grads = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    params = {n: jnp.asarray(p.detach().numpy()) for n, p in _model().named_parameters()}

    def loss(p, x, y):
        h = jnp.tanh(x @ p["0.weight"].T + p["0.bias"]) @ p["2.weight"].T + p["2.bias"]
        return -jnp.mean(jax.nn.log_softmax(h)[jnp.arange(len(y)), y])

    def local(rank):
        x, y = X[rank::2], Y[rank::2]
        first, second = jax.grad(loss)(params, x, y), jax.grad(loss)(params, x[:2], y[:2])
        return {n: first[n] + second[n] for n in params}

    want = {n: (local(0)[n] + local(1)[n]) / 2 for n in params}
    for rank in (0, 1):
        for n in params:
            np.testing.assert_allclose(grads[rank][n], want[n], rtol=1e-10, err_msg=f"process {rank}, {n}")
