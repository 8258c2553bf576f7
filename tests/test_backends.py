"""The back-end boilerplate of PyTorch programs runs as on PyTorch, answering from what JAX has:
``torch.backends``, the matmul precision, thread counts, the device flags of a tensor,
``pin_memory``, the CUDA seeding names and ``torch.compile``'s forms.

PyTorch's values are written out where it defines them (its defaults, its error messages);
a device flag is checked against the JAX device that holds the array.
"""

import jax
import numpy as np
import pytest

import xgrad


@pytest.fixture
def restore_matmul_precision():
    saved = jax.config.jax_default_matmul_precision
    yield
    jax.config.update("jax_default_matmul_precision", saved)


def test_cudnn_flags_have_pytorchs_defaults_and_take_assignments():
    cudnn = xgrad.backends.cudnn
    assert (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32) == (True, False, False, True)
    saved = cudnn.benchmark, cudnn.deterministic
    try:
        cudnn.benchmark, cudnn.deterministic = True, True
        assert xgrad.backends.cudnn.benchmark and xgrad.backends.cudnn.deterministic
    finally:
        cudnn.benchmark, cudnn.deterministic = saved
    has_gpu = bool(xgrad.cuda.device_count())
    assert cudnn.is_available() == has_gpu == xgrad.backends.cuda.is_built()
    assert not xgrad.backends.mps.is_available() and not xgrad.backends.mps.is_built()


@pytest.mark.usefixtures("restore_matmul_precision")
def test_matmul_precision_is_jaxs_default_matmul_precision():
    jax.config.update("jax_default_matmul_precision", None)
    platform_default = {"cpu": "highest", "gpu": "high", "tpu": "medium"}[jax.default_backend()]
    assert xgrad.get_float32_matmul_precision() == platform_default  # what XLA's DEFAULT precision is there
    for name, jax_name in (("highest", "float32"), ("high", "tensorfloat32"), ("medium", "bfloat16")):
        xgrad.set_float32_matmul_precision(name)
        assert jax.config.jax_default_matmul_precision == jax_name and xgrad.get_float32_matmul_precision() == name
        assert xgrad.backends.cuda.matmul.allow_tf32 == (name != "highest")  # PyTorch ties the two together
    xgrad.backends.cuda.matmul.allow_tf32 = False
    assert xgrad.get_float32_matmul_precision() == "highest"
    xgrad.backends.cuda.matmul.allow_tf32 = True
    assert xgrad.get_float32_matmul_precision() == "high"
    with pytest.warns(UserWarning, match="fast is not one of 'highest', 'high', or 'medium'"):
        xgrad.set_float32_matmul_precision("fast")
    assert xgrad.get_float32_matmul_precision() == "high"


def test_thread_counts_report_xlas_pool_and_check_as_pytorch():
    import os

    assert xgrad.get_num_threads() == len(os.sched_getaffinity(0)) == xgrad.get_num_interop_threads()
    xgrad.set_num_threads(1)
    xgrad.set_num_interop_threads(2)
    with pytest.raises(RuntimeError, match="set_num_threads expects a positive integer"):
        xgrad.set_num_threads(0)
    with pytest.raises(RuntimeError, match="set_num_threads expects an int, but got float"):
        xgrad.set_num_threads(1.5)
    with pytest.raises(RuntimeError, match="set_num_interop_threads expects a positive integer"):
        xgrad.set_num_interop_threads(-1)


def test_device_flags_follow_the_jax_device_of_the_array():
    x = xgrad.ones(2)
    platform = x.array.devices().pop().platform
    assert (x.is_cpu, x.is_cuda, x.is_mps, x.is_xpu) == (platform == "cpu", platform == "gpu", False, False)
    on_cpu = x.to(jax.devices("cpu")[1])
    assert on_cpu.is_cpu and not on_cpu.is_cuda
    if xgrad.cuda.is_available():
        on_gpu = x.cuda()
        assert on_gpu.is_cuda and not on_gpu.is_cpu
    seen = []

    @xgrad.compile
    def step(t):
        seen.append(t.is_cpu)  # a traced tensor answers for the device its step runs on
        return t * 2

    step(on_cpu)
    assert seen == [True]


def test_pin_memory_returns_the_tensor_and_the_seeding_names_seed_every_draw():
    x = xgrad.ones(2, requires_grad=True)
    assert x.pin_memory() is x and not x.is_pinned()
    draws = []
    for seed_all in (xgrad.manual_seed, xgrad.cuda.manual_seed, xgrad.cuda.manual_seed_all):
        seed_all(1337)
        draws.append(xgrad.rand(3).tolist())
    assert draws[0] == draws[1] == draws[2]


def test_cuda_queries_answer_from_jax():
    if xgrad.cuda.is_available():
        gpu = jax.devices("gpu")[0]
        assert xgrad.cuda.get_device_name() == gpu.device_kind and xgrad.cuda.is_bf16_supported()
        xgrad.cuda.set_device("cuda:0")
        return
    assert not xgrad.cuda.is_bf16_supported()
    with pytest.raises(RuntimeError, match="No CUDA GPUs are available"):
        xgrad.cuda.set_device(0)
    with pytest.raises(RuntimeError, match="No CUDA GPUs are available"):
        xgrad.cuda.get_device_name()
    xgrad.cuda.empty_cache()


def test_compile_returns_a_module_and_compiles_a_step():
    model = xgrad.nn.Linear(2, 1, key=0)
    assert xgrad.compile(model) is model and xgrad.compile(model, mode="max-autotune", dynamic=False) is model
    opt = xgrad.optim.SGD(model.parameters(), lr=0.1)

    @xgrad.compile(mode="reduce-overhead", backend="inductor")
    def step(x):
        opt.zero_grad()
        loss = (model(x) ** 2).sum()
        loss.backward()
        opt.step()
        return loss

    for _ in range(2):
        assert step(xgrad.ones(3, 2)).grad_fn is None
    assert step.stats()["compiles"] == 1 and step.stats()["hits"] == 1
    assert xgrad.compile(step.fn, disable=True) is step.fn


def test_a_missing_pytorch_name_says_so_and_what_to_use():
    with pytest.raises(AttributeError, match=r"^module 'xgrad' has no attribute 'acos': torch.acos is a PyTorch name xgrad "
                                             r"does not have\. .*xgrad\.from_jax\(jax\.numpy\.acos\)"):
        xgrad.acos  # noqa: B018
    x = xgrad.tensor([0.25, 0.5], requires_grad=True)
    xgrad.from_jax(jax.numpy.acos)(x).sum().backward()  # the advice works, with gradients
    np.testing.assert_allclose(x.grad.numpy(), -1 / np.sqrt(1 - np.array([0.25, 0.5]) ** 2), rtol=1e-6)
    with pytest.raises(AttributeError, match=r"torch.Tensor.square is a PyTorch name xgrad does not have\. Use tensor \*\* 2"):
        x.square()
    with pytest.raises(AttributeError, match=r"torch.nn.RReLU is a PyTorch name .*migrating_from_pytorch\.md"):
        xgrad.nn.RReLU  # noqa: B018
    with pytest.raises(AttributeError, match=r"torch.nn.functional.conv_tbc is a PyTorch name"):
        xgrad.nn.functional.conv_tbc  # noqa: B018
    for owner in (xgrad, xgrad.nn, xgrad.nn.functional, x):
        with pytest.raises(AttributeError) as raised:
            owner.no_such_name  # noqa: B018
        assert str(raised.value).endswith("has no attribute 'no_such_name'") and raised.value.name == "no_such_name"
    assert not hasattr(x, "acosh") and getattr(xgrad, "acosh", None) is None  # still an AttributeError for hasattr


def test_shape_methods_take_pytorchs_keywords_and_name_the_forms_otherwise():
    x = xgrad.tensor(np.arange(6.0).reshape(2, 3))
    a = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(x.view(size=(3, 2)).numpy(), a.reshape(3, 2))
    np.testing.assert_array_equal(x.reshape(shape=(6,)).numpy(), a.reshape(6))
    np.testing.assert_array_equal(x.permute(dims=(1, 0)).numpy(), a.T)
    np.testing.assert_array_equal(x[:1].expand(size=(2, 3)).numpy(), np.broadcast_to(a[:1], (2, 3)))
    np.testing.assert_array_equal(x.repeat(repeats=(2, 1)).numpy(), np.tile(a, (2, 1)))
    with pytest.raises(TypeError, match=r"view\(\) got an unexpected keyword argument 'shape'; the accepted forms are "
                                        r"view\(2, 3\), view\(\(2, 3\)\) and view\(size=\(2, 3\)\)"):
        x.view(shape=(3, 2))
    with pytest.raises(TypeError, match=r"reshape\(\) got multiple values for argument 'shape'"):
        x.reshape(6, shape=(6,))
    with pytest.raises(TypeError, match=r"permute\(\) got an unexpected keyword argument 'dim'.*permute\(dims="):
        x.permute(dim=(1, 0))


def test_init_process_group_without_torchruns_environment_says_what_is_missing(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="environment variable MASTER_ADDR expected, but not set"):
        xgrad.distributed.init_process_group("nccl")
    assert (xgrad.distributed.get_rank(), xgrad.distributed.get_world_size()) == (0, 1)
    assert not xgrad.distributed.is_initialized()


_TORCHRUN_WORKER = """
import json, os, sys
port, rank = sys.argv[1], sys.argv[2]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2", RANK=rank)  # as torchrun sets them
import jax, xgrad
from jax.experimental import multihost_utils
xgrad.distributed.init_process_group(backend="gloo")
ranks = multihost_utils.process_allgather(jax.numpy.asarray(xgrad.distributed.get_rank())).tolist()
print(json.dumps([xgrad.distributed.get_rank(), xgrad.distributed.get_world_size(), xgrad.distributed.is_initialized(),
                  ranks]))
xgrad.distributed.destroy_process_group()
"""


def test_init_process_group_joins_the_job_torchrun_describes():
    import json
    import sys

    from tests.test_distributed import _free_port, launch

    port = str(_free_port())
    outputs = launch(lambda i: [sys.executable, "-c", _TORCHRUN_WORKER, port, str(i)], num_processes=2,
                     devices_per_process=1, timeout=120)
    assert [json.loads(out.strip().splitlines()[-1]) for out in outputs] == [[0, 2, True, [0, 1]], [1, 2, True, [0, 1]]]
