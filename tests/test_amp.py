"""Mixed precision as PyTorch's: ``autocast`` casts the ops PyTorch's autocast casts, eagerly and
inside ``xgrad.compile``, and ``GradScaler`` scales, unscales, skips and rescales as PyTorch's does.

The references are PyTorch's own results on the same runs (tests/fixtures/amp_cases.py, run
under PyTorch by tests/fixtures/make_torch_amp.py into torch_amp.json) and, for gradients,
``jax.grad`` of the same casts written by hand.
"""

import json
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from tests._backward_modes import eager_and_compiled  # noqa: F401
from tests.fixtures.amp_cases import autocast_dtypes, autocast_training_losses, op_cases, scaler_run

TORCH = json.loads((Path(__file__).parent / "fixtures" / "torch_amp.json").read_text())
HAS_GPU = xgrad.cuda.is_available()


@pytest.fixture(autouse=True)
def on_host_cpu():
    """CPU autocast casts CPU tensors only (as PyTorch's): on a GPU host, these runs make theirs on the CPU."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def test_every_op_under_a_listed_name_takes_its_policy():
    from xgrad.ops.autocast import POLICIES

    listed = {name for policies in POLICIES.values() for name in policies}
    ops = [getattr(space, name) for name in sorted(listed) for space in (xgrad, xgrad.nn.functional) if hasattr(space, name)]
    assert len(ops) > 40 and all(getattr(op, "__wrapped__", None) is not None for op in ops), [
        op.__name__ for op in ops if getattr(op, "__wrapped__", None) is None]


def test_cpu_autocast_gives_pytorchs_dtypes_for_every_listed_op():
    assert autocast_dtypes(xgrad) == TORCH["autocast_dtypes"]


# One op of each kind: low precision, float32 from any input, off the lists.
@pytest.mark.parametrize("name", ["linear", "cross_entropy", "gelu"])
def test_autocast_inside_a_compiled_step_gives_the_eager_dtypes(name):
    def run():
        with xgrad.autocast("cpu", dtype=xgrad.bfloat16):
            return op_cases(xgrad, xgrad.float32)[name]()

    assert str(xgrad.compile(run)().dtype) == TORCH["autocast_dtypes"][name][0]


def test_a_step_compiled_outside_autocast_is_another_program_under_it():
    w = xgrad.ones(3, 3)
    step = xgrad.compile(lambda x: x @ w)
    x = xgrad.ones(2, 3)
    assert step(x).dtype == jnp.float32
    with xgrad.autocast("cpu"):
        assert step(x).dtype == jnp.bfloat16  # not the float32 program traced before
    assert step(x).dtype == jnp.float32 and step.stats()["compiles"] == 2


@pytest.mark.usefixtures("eager_and_compiled")
def test_autocast_gradients_are_jaxs_through_the_same_casts(request):
    rng = np.random.default_rng(0)
    x_np, w_np = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    w = xgrad.tensor(w_np, requires_grad=True)
    with xgrad.autocast("cpu", dtype=xgrad.bfloat16):
        logits = xgrad.nn.functional.linear(xgrad.tensor(x_np), w)
        loss = xgrad.cross_entropy(logits, xgrad.tensor([0, 1, 2, 3]))
    loss.backward()

    def by_hand(w):
        logits = (jnp.asarray(x_np, jnp.bfloat16) @ w.astype(jnp.bfloat16).T).astype(jnp.float32)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), jnp.arange(4)[:, None], 1))

    assert (logits.dtype, loss.dtype, w.grad.dtype) == (jnp.bfloat16, jnp.float32, jnp.float32)
    np.testing.assert_allclose(loss.item(), by_hand(jnp.asarray(w_np)), rtol=1e-6)
    # The compiled backward is one XLA program, which may keep a bfloat16 matmul's float32 result
    # unrounded where a float32 cast reads it (XLA's excess precision): there, within bfloat16's 2**-8.
    rtol = 1e-6 if request.getfixturevalue("eager_and_compiled") == "eager" else 2.0**-8
    np.testing.assert_allclose(w.grad.numpy(), jax.grad(by_hand)(jnp.asarray(w_np)), rtol=rtol)


def test_autocast_leaves_float64_and_integer_tensors_alone_and_nests():
    a = xgrad.ones(2, 2, dtype=xgrad.float64)
    with xgrad.autocast("cpu"):
        assert (a @ a).dtype == jnp.float64 and (xgrad.arange(4).view(2, 2) @ xgrad.arange(4).view(2, 2)).dtype == jnp.int64
        assert xgrad.amp.is_autocast_enabled("cpu") and xgrad.amp.get_autocast_dtype("cpu") == jnp.bfloat16
        with xgrad.autocast("cpu", enabled=False):
            assert (xgrad.ones(2, 2) @ xgrad.ones(2, 2)).dtype == jnp.float32
            assert not xgrad.amp.is_autocast_enabled("cpu")
        with xgrad.autocast("cpu", dtype=xgrad.float16):
            assert (xgrad.ones(2, 2) @ xgrad.ones(2, 2)).dtype == jnp.float16

    @xgrad.autocast("cpu")
    def decorated(x):
        return x @ x

    assert decorated(xgrad.ones(2, 2)).dtype == jnp.bfloat16 and not xgrad.amp.is_autocast_enabled("cpu")


def test_autocast_bad_arguments():
    with pytest.raises(ValueError, match="Expected `device_type` of type `str`"):
        xgrad.autocast(0)
    with pytest.raises(RuntimeError, match="unsupported autocast device_type 'tpu'.*'cpu', 'cuda'"):
        xgrad.autocast("tpu")
    with pytest.warns(UserWarning, match="target dtype float32 is not supported"):
        off = xgrad.autocast("cpu", dtype=xgrad.float32)
    with off:
        assert not xgrad.amp.is_autocast_enabled("cpu")


def test_cuda_autocast_and_scaler_report_what_jax_has():
    if HAS_GPU:  # on a GPU, autocast("cuda") casts tensors on it, with PyTorch's CUDA lists
        x = xgrad.ones(2, 2, device="cuda")
        with xgrad.autocast("cuda"):
            assert (x @ x).dtype == jnp.float16 and (x @ x).softmax(-1).dtype == jnp.float32
            with pytest.raises(RuntimeError, match="unsafe to autocast"):
                xgrad.nn.functional.binary_cross_entropy(x * 0.5, x)
        assert xgrad.amp.GradScaler().is_enabled()
        return
    with pytest.warns(UserWarning, match="CUDA is not available"):
        block = xgrad.autocast("cuda")
    with block:
        assert not xgrad.amp.is_autocast_enabled("cuda")
    with pytest.warns(FutureWarning, match=r"torch.amp.GradScaler\('cuda'"), pytest.warns(UserWarning, match="Disabling"):
        scaler = xgrad.cuda.amp.GradScaler()
    loss = xgrad.ones(())
    assert not scaler.is_enabled() and scaler.scale(loss) is loss and scaler.state_dict() == {} and scaler.get_scale() == 1.0


@pytest.mark.usefixtures("eager_and_compiled")
def test_grad_scaler_sequence_matches_pytorch_with_injected_infs():
    got, want = scaler_run(xgrad), TORCH["scaler"]
    assert got["scale"] == want["scale"] and got["stepped"] == want["stepped"] and got["state_dict"] == want["state_dict"]
    # float32 throughout: PyTorch's and XLA's sums round in different orders, so the gradients and
    # weights agree to a few float32 ulps (2**-23 ~ 1.2e-7 each), not bit for bit.
    np.testing.assert_allclose(got["weight"], want["weight"], rtol=1e-5, atol=1e-7)
    for g, w in zip(got["unscaled_grad"], want["unscaled_grad"], strict=True):
        assert [type(v) for v in g] == [type(v) for v in w]  # inf and NaN in the same places
        np.testing.assert_allclose(np.array(g, dtype=float), np.array(w, dtype=float), rtol=1e-5)


def test_grad_scaler_misuse_raises_pytorchs_errors():
    w = xgrad.nn.Parameter(xgrad.ones(2))
    opt = xgrad.optim.SGD([w], lr=0.1)
    scaler = xgrad.amp.GradScaler("cpu")
    with pytest.raises(AssertionError, match="did not use scaler.scale"):
        scaler.step(opt)
    scaler.scale(w.sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="Closure use is not currently supported"):
        scaler.step(opt, closure=lambda: None)
    scaler.update(new_scale=8.0)
    assert scaler.get_scale() == 8.0
    with pytest.raises(RuntimeError, match="source state dict is empty"):
        scaler.load_state_dict({})
    half = xgrad.nn.Parameter(xgrad.ones(2, dtype=xgrad.float16))
    half_opt = xgrad.optim.SGD([half], lr=0.1)
    scaler.scale(half.sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.unscale_(half_opt)
    with pytest.raises(ValueError, match="growth factor must be > 1.0"):
        xgrad.amp.GradScaler("cpu", growth_factor=1.0)


def test_grad_scaler_state_dict_round_trip():
    source = xgrad.amp.GradScaler("cpu", init_scale=32.0, growth_interval=3)
    target = xgrad.amp.GradScaler("cpu")
    target.load_state_dict(source.state_dict())
    assert target.state_dict() == {"scale": 32.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3,
                                   "_growth_tracker": 0}


@pytest.mark.usefixtures("eager_and_compiled")
def test_bfloat16_autocast_training_matches_pytorchs_losses():
    # bfloat16 keeps 8 bits of mantissa (relative step 2**-8 ~ 4e-3); PyTorch's CPU kernels and XLA's
    # round the bfloat16 matmuls' float32 accumulations in different orders: the losses agree to 1e-3.
    np.testing.assert_allclose(autocast_training_losses(xgrad), TORCH["autocast_losses"], rtol=1e-3)


def test_bfloat16_autocast_training_in_a_compiled_step_matches_pytorchs_losses():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to eager: every step runs the one program
        losses = autocast_training_losses(xgrad, wrap_step=xgrad.compile)
    np.testing.assert_allclose(losses, TORCH["autocast_losses"], rtol=1e-3)
