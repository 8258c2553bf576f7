"""``torch.nn.functional``'s losses, activations and dropout variants, and their modules, against PyTorch.

Values and gradients come from PyTorch itself (``tests/fixtures/torch_losses.npz``, written by
``make_torch_losses.py``; activations are evaluated at their kinks too); module reprs, buffers
and errors are PyTorch's, written out here.
"""

import json
import re
import warnings
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
import xgrad.nn.functional as F
from tests._backward_modes import eager_and_compiled  # noqa: F401 - a fixture
from xgrad import nn

FIXTURES = Path(__file__).parent / "fixtures"
TORCH = np.load(FIXTURES / "torch_losses.npz")
CASES = json.loads((FIXTURES / "torch_losses.json").read_text())
# PyTorch computes two constants in float32 even for float64 input: hardsigmoid's 1/6 and the
# 1e-12 floor of binary_cross_entropy's gradient denominator.
RTOL = {"hardsigmoid": 1e-7, "binary_cross_entropy_clamped_logs": 1e-8}
# A few cases whose backward graphs differ in kind, run again with the compiled backward.
COMPILED_CASES = [
    "cross_entropy_weight_smoothing_ignore", "binary_cross_entropy_with_logits", "kl_div_batchmean",
    "cosine_similarity_tiny", "prelu",
]


def _run_case(name):
    case = CASES[name]
    inputs = {k: xgrad.tensor(TORCH[f"{name}/{k}"], requires_grad=k in case["grad"]) for k in case["args"]}
    tensor_kwargs = {k: xgrad.tensor(TORCH[f"{name}/{k}"]) for k in case["tensor_kwargs"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kl_div's reduction="mean" warning is checked on its own below
        out = getattr(F, case["fn"])(*inputs.values(), **tensor_kwargs, **case["kwargs"])
    np.testing.assert_allclose(out.detach().numpy(), TORCH[f"{name}/out"], rtol=1e-9, atol=1e-12)
    (out * xgrad.tensor(TORCH[f"{name}/cotangent"])).sum().backward()
    for k in case["grad"]:
        np.testing.assert_allclose(
            inputs[k].grad.numpy(), TORCH[f"{name}/grad/{k}"], rtol=RTOL.get(name, 1e-9), atol=1e-12, err_msg=k
        )


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_match_pytorch(name):
    _run_case(name)


@pytest.mark.usefixtures("eager_and_compiled")
@pytest.mark.parametrize("name", COMPILED_CASES)
def test_values_and_gradients_match_pytorch_with_either_backward(name):
    _run_case(name)


def test_every_fixture_function_is_in_nn_functional_and_ops():
    assert {case["fn"] for case in CASES.values()} <= set(F.__all__)
    for name in ("leaky_relu", "kl_div", "cosine_similarity", "dropout2d", "huber_loss"):
        assert getattr(F, name) is getattr(xgrad, name)


# -- modules ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("module", "text"),
    [
        (nn.LeakyReLU(0.2, True), "LeakyReLU(negative_slope=0.2, inplace=True)"),
        (nn.ELU(), "ELU(alpha=1.0)"),
        (nn.CELU(), "CELU(alpha=1.0)"),
        (nn.SELU(), "SELU()"),
        (nn.ReLU(inplace=True), "ReLU(inplace=True)"),
        (nn.ReLU6(inplace=True), "ReLU6(inplace=True)"),
        (nn.Hardtanh(), "Hardtanh(min_val=-1.0, max_val=1.0)"),
        (nn.Softplus(), "Softplus(beta=1.0, threshold=20.0)"),
        (nn.Softshrink(), "Softshrink(0.5)"),
        (nn.Hardshrink(), "Hardshrink(0.5)"),
        (nn.Threshold(0.1, 20), "Threshold(threshold=0.1, value=20)"),
        (nn.Softmax(1), "Softmax(dim=1)"),
        (nn.LogSoftmax(1), "LogSoftmax(dim=1)"),
        (nn.Softmin(1), "Softmin(dim=1)"),
        (nn.GLU(), "GLU(dim=-1)"),
        (nn.GELU(), "GELU(approximate='none')"),
        (nn.PReLU(), "PReLU(num_parameters=1)"),
        (nn.Mish(), "Mish()"),
        (nn.Hardswish(), "Hardswish()"),
        (nn.Tanhshrink(), "Tanhshrink()"),
        (nn.Dropout2d(0.2), "Dropout2d(p=0.2, inplace=False)"),
        (nn.CrossEntropyLoss(), "CrossEntropyLoss()"),
        (nn.HuberLoss(), "HuberLoss()"),
        (nn.KLDivLoss(), "KLDivLoss()"),
        (nn.CosineSimilarity(), "CosineSimilarity()"),
    ],
    ids=lambda v: v if isinstance(v, str) else type(v).__name__,
)
def test_module_reprs_are_pytorchs(module, text):
    assert repr(module) == text


def test_loss_modules_match_the_functional_losses_and_register_weights_as_buffers():
    x = xgrad.tensor(TORCH["cross_entropy_weight_smoothing_ignore/input"])
    t = xgrad.tensor(TORCH["cross_entropy_weight_smoothing_ignore/target"])
    w = xgrad.tensor(TORCH["cross_entropy_weight_smoothing_ignore/weight"])
    loss = nn.CrossEntropyLoss(weight=w, ignore_index=1, label_smoothing=0.15)
    assert list(loss.state_dict()) == ["weight"] and not list(loss.parameters())
    np.testing.assert_allclose(loss(x, t).item(), TORCH["cross_entropy_weight_smoothing_ignore/out"], rtol=1e-9)
    assert list(nn.BCEWithLogitsLoss(pos_weight=xgrad.ones(3)).state_dict()) == ["pos_weight"]
    assert nn.NLLLoss().weight is None and list(nn.NLLLoss().state_dict()) == []
    a, b = xgrad.tensor(TORCH["smooth_l1_loss/input"]), xgrad.tensor(TORCH["smooth_l1_loss/target"])
    for module, fn in [(nn.SmoothL1Loss(beta=0.5), lambda: F.smooth_l1_loss(a, b, beta=0.5)),
                       (nn.HuberLoss(delta=0.7), lambda: F.huber_loss(a, b, delta=0.7)),
                       (nn.L1Loss(reduction="sum"), lambda: F.l1_loss(a, b, reduction="sum")),
                       (nn.MSELoss(), lambda: F.mse_loss(a, b))]:
        assert module(a, b).item() == fn().item()
    np.testing.assert_allclose(nn.SmoothL1Loss(beta=0.5)(a, b).item(), TORCH["smooth_l1_loss/out"], rtol=1e-9)


def test_deprecated_size_average_and_reduce_map_to_reduction_with_pytorchs_warning():
    a, b = xgrad.tensor([1.0, 3.0]), xgrad.tensor([0.0, 0.0])
    with pytest.warns(UserWarning, match=re.escape("please use reduction='sum' instead.")):
        assert F.mse_loss(a, b, size_average=False).item() == 10.0
    with pytest.warns(UserWarning, match=re.escape("please use reduction='none' instead.")):
        assert nn.L1Loss(reduce=False)(a, b).tolist() == [1.0, 3.0]
    with pytest.warns(UserWarning, match="'batchmean' divides only by the batch size"):
        F.kl_div(a.log_softmax(0), b.softmax(0))


def test_prelu_module_learns_one_slope_per_channel():
    m = nn.PReLU(3, init=0.5)
    x = xgrad.tensor(np.arange(-6.0, 6.0).reshape(2, 3, 2))
    m(x).sum().backward()
    negative_sums = np.where(x.numpy() > 0, 0.0, x.numpy()).sum(axis=(0, 2))
    np.testing.assert_allclose(m.weight.grad.numpy(), negative_sums)
    with pytest.raises(RuntimeError, match="Found parameter numbers = 3 and channel size = 4"):
        m(xgrad.ones(2, 4))


def test_inplace_activations_rebind_their_input_and_keep_the_gradient():
    x = xgrad.tensor(np.array([-2.0, 0.5, 3.0]), requires_grad=True)
    y = x * 2.0
    out = nn.LeakyReLU(0.1, inplace=True)(y)
    assert out is y and y.tolist() == pytest.approx([-0.4, 1.0, 6.0])
    F.hardtanh(y, -1.0, 2.0, inplace=True)
    y.sum().backward()
    assert x.grad.tolist() == pytest.approx([0.2, 2.0, 0.0])
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        F.relu6(x, inplace=True)


# -- softmax family ----------------------------------------------------------------------
def test_softmax_without_dim_warns_and_picks_pytorchs_implicit_dim():
    x = xgrad.tensor(np.arange(24.0).reshape(2, 3, 4) / 10)
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmax has been deprecated"):
        out = F.softmax(x)
    np.testing.assert_allclose(out.numpy(), F.softmax(x, dim=0).numpy())
    with pytest.warns(UserWarning, match="Implicit dimension choice for log_softmax"):
        np.testing.assert_allclose(F.log_softmax(x[0]).numpy(), F.log_softmax(x[0], 1).numpy())
    assert F.softmax(x, -1, dtype=jnp.float32).dtype == jnp.float32


# -- dropout -----------------------------------------------------------------------------
def test_dropout_takes_training_as_its_third_positional_argument():
    x = xgrad.ones(3, 4)
    assert F.dropout(x, 0.5, False) is x
    kept = F.dropout(x, 0.5, True).numpy()
    assert set(np.unique(kept)) <= {0.0, 2.0}


@pytest.mark.parametrize(("fn", "shape", "channel_axes"), [
    (F.dropout2d, (4, 6, 3, 3), (0, 1)),
    (F.dropout1d, (6, 5), (0,)),
])
def test_channel_dropout_zeroes_whole_channels(fn, shape, channel_axes):
    x = xgrad.ones(*shape, requires_grad=True)
    out = fn(x, 0.5)
    values = out.detach().numpy()
    per_channel = values.reshape(values.shape[: len(channel_axes)] + (-1,))
    assert np.all(per_channel == per_channel[..., :1])  # one draw per channel
    assert set(np.unique(values)) == {0.0, 2.0}
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), values)


def test_dropout2d_warns_as_pytorch_and_dropout1d_rejects_other_ranks():
    with pytest.warns(UserWarning, match="Received a 3D input to dropout2d"):
        F.dropout2d(xgrad.ones(2, 3, 4))
    with pytest.warns(UserWarning, match="Received a 2-D input to dropout2d, which is deprecated"):
        F.dropout2d(xgrad.ones(2, 3))
    with pytest.raises(RuntimeError, match="dropout1d: Expected 2D or 3D input, but received a 4D input"):
        F.dropout1d(xgrad.ones(1, 2, 3, 4))
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1, but got 1.5"):
        nn.Dropout1d(1.5)
    drop = nn.Dropout2d(0.5).eval()
    x = xgrad.ones(1, 2, 2, 2)
    assert drop(x) is x


def test_alpha_dropout_keeps_a_unit_normal_inputs_mean_and_variance():
    x = xgrad.tensor(np.random.default_rng(2).standard_normal(20000))
    assert F.alpha_dropout(x, 0.3) is x  # training=False by default, as PyTorch's
    out = F.alpha_dropout(x, 0.3, True).numpy()
    assert abs(out.mean()) < 0.03 and abs(out.var() - 1) < 0.03
    assert np.isclose(out, -1.7580993408473766 * (0.7 * (1 + 0.3 * 1.7580993408473766**2)) ** -0.5 * 0.7).mean() > 0.25
    assert repr(nn.AlphaDropout(0.2)) == "AlphaDropout(p=0.2, inplace=False)"


def test_dropout_inplace_rebinds_its_input():
    x = xgrad.ones(50, requires_grad=True)
    y = x * 1.0
    out = nn.Dropout(0.5, inplace=True)(y)
    assert out is y and set(np.unique(y.detach().numpy())) == {0.0, 2.0}


# -- bad arguments -----------------------------------------------------------------------
@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: F.cross_entropy(xgrad.zeros(3, 4), xgrad.tensor([0, 1])), ValueError,
     "Expected input batch_size (3) to match target batch_size (2)."),
    (lambda: F.cross_entropy(xgrad.zeros(3, 4), xgrad.tensor([0, 1, 4])), IndexError, "Target 4 is out of bounds."),
    (lambda: F.nll_loss(xgrad.zeros(3, 4), xgrad.tensor([0, 1, 4])), IndexError, "Target 4 is out of bounds."),
    (lambda: F.cross_entropy(xgrad.zeros(3, 4), xgrad.tensor([0, 1, 2]), label_smoothing=1.5), RuntimeError,
     "label_smoothing must be between 0.0 and 1.0. Got: 1.5"),
    (lambda: F.binary_cross_entropy(xgrad.tensor([0.5, 0.5]), xgrad.tensor([1.0])), ValueError,
     "that is different to the input size"),
    (lambda: F.binary_cross_entropy(xgrad.tensor([1.5]), xgrad.tensor([1.0])), RuntimeError,
     "all elements of input should be between 0 and 1"),
    (lambda: F.l1_loss(xgrad.zeros(3), xgrad.zeros(3), reduction="avg"), ValueError, "avg is not a valid value for reduction"),
    (lambda: F.kl_div(xgrad.zeros(3), xgrad.zeros(3), reduction="avg"), ValueError, "avg is not a valid value for reduction"),
    (lambda: F.mse_loss(xgrad.zeros(3), xgrad.zeros(3), weight=xgrad.ones(2)), ValueError,
     "Weights and input must have the same size."),
    (lambda: F.mse_loss(xgrad.zeros(3, 4), xgrad.zeros(3, 5)), RuntimeError, "must match the size of tensor b (5)"),
    (lambda: F.smooth_l1_loss(xgrad.zeros(3), xgrad.zeros(3), beta=-1.0), RuntimeError,
     "smooth_l1_loss does not support negative values for beta."),
    (lambda: F.huber_loss(xgrad.zeros(3), xgrad.zeros(3), delta=0.0), RuntimeError,
     "huber_loss does not support non-positive values for delta."),
    (lambda: F.cosine_similarity(xgrad.tensor([1, 2]), xgrad.tensor([1, 2]), dim=0), RuntimeError,
     "expected common dtype to be floating point, yet common dtype is"),
    (lambda: F.cosine_embedding_loss(xgrad.zeros(3, 4), xgrad.zeros(3, 4), xgrad.ones(3, 1)), RuntimeError,
     "0D or 1D target tensor expected, multi-target not supported"),
    (lambda: F.margin_ranking_loss(xgrad.zeros(3), xgrad.zeros(3), xgrad.ones(3, 1)), RuntimeError,
     "All input tensors should have same dimension"),
    (lambda: F.kl_div(xgrad.zeros(3, 4), xgrad.zeros(3, 5), reduction="sum"), RuntimeError,
     "The size of tensor a (5) must match the size of tensor b (4) at non-singleton dimension 1"),
    (lambda: F.cosine_embedding_loss(xgrad.zeros(3, 4), xgrad.zeros(3, 4), xgrad.ones(2)), RuntimeError,
     "The size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 0"),
    (lambda: F.margin_ranking_loss(xgrad.zeros(3), xgrad.zeros(3), xgrad.ones(2)), RuntimeError,
     "The size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 0"),
    (lambda: F.glu(xgrad.zeros(2, 3)), RuntimeError, "Halving dimension must be even, but dimension 1 is size 3"),
    (lambda: F.prelu(xgrad.zeros(2, 3), xgrad.ones(3, 1)), RuntimeError, "Expected `weight` to be a scalar or 1D tensor"),
    (lambda: F.softshrink(xgrad.zeros(3, dtype=jnp.float32), -1.0), RuntimeError,
     "lambda must be in range [0, 3.40282e+38] for input dtype Float, but found -1"),
    (lambda: F.celu(xgrad.zeros(3), 0.0), RuntimeError, "ZeroDivisionError: alpha cannot be 0 for CELU"),
    (lambda: F.hardtanh(xgrad.zeros(3), 1.0, -1.0), ValueError, "min_val cannot be greater than max_val"),
    (lambda: F.leaky_relu(xgrad.tensor([1, 2])), NotImplementedError, "\"leaky_relu_cpu\" not implemented for"),
])
def test_bad_arguments_raise_pytorchs_exception(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()


# -- in a compiled step ------------------------------------------------------------------
def test_a_compiled_training_step_with_the_new_layers_matches_eager():
    rng = np.random.default_rng(1)
    x, y = xgrad.tensor(rng.standard_normal((8, 4))), xgrad.tensor(rng.integers(0, 3, 8))

    def setup():
        model = nn.Sequential(nn.Linear(4, 6, key=0, dtype=jnp.float64), nn.LeakyReLU(0.1), nn.Dropout(0.0),
                              nn.Linear(6, 3, key=1, dtype=jnp.float64))
        loss_fn = nn.CrossEntropyLoss(weight=xgrad.tensor([0.5, 1.0, 2.0]), label_smoothing=0.1)
        opt = xgrad.optim.SGD(model.parameters(), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            return loss

        return model, step

    (eager_model, eager_step), (model, step) = setup(), setup()
    compiled = xgrad.compile(step)
    for _ in range(2):
        np.testing.assert_allclose(compiled(x, y).item(), eager_step(x, y).item(), rtol=1e-10)
    for p, q in zip(model.parameters(), eager_model.parameters(), strict=True):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-10)
    assert compiled.stats()["compiles"] == 1


_CLASS_WEIGHT = np.array([0.5, 1.0, 2.0, 4.0])
ALL_IGNORED_LOSSES = {
    "cross_entropy": lambda x, t: F.cross_entropy(x, t),
    "cross_entropy_smoothing": lambda x, t: F.cross_entropy(x, t, label_smoothing=0.2),
    "cross_entropy_weight": lambda x, t: F.cross_entropy(x, t, weight=xgrad.tensor(_CLASS_WEIGHT)),
    "nll_loss": lambda x, t: F.nll_loss(F.log_softmax(x, dim=1), t),
    "nll_loss_weight": lambda x, t: F.nll_loss(x, t, weight=xgrad.tensor(_CLASS_WEIGHT), ignore_index=2),
}


@pytest.mark.parametrize("mode", ["eager", "compiled", "xgrad.compile"])
@pytest.mark.parametrize("name", sorted(ALL_IGNORED_LOSSES))
def test_mean_loss_with_every_target_ignored_is_nan_with_zero_gradients(name, mode):
    # PyTorch's mean over no kept target is 0/0 = NaN, but its backward writes the gradient
    # only at kept targets (nll_loss_backward), so an all-padding batch leaves zeros, not NaN.
    loss_fn = ALL_IGNORED_LOSSES[name]
    ignored = 2 if name == "nll_loss_weight" else -100
    logits = np.random.default_rng(0).standard_normal((3, 4))
    target = xgrad.tensor(np.full(3, ignored))
    x = xgrad.tensor(logits, requires_grad=True)

    def step(x, target):
        loss = loss_fn(x, target)
        loss.backward(compiled=mode == "compiled")
        return loss.detach()

    loss = (xgrad.compile(step) if mode == "xgrad.compile" else step)(x, target)
    assert np.isnan(loss.item())
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros_like(logits))
    # One kept target: the gradient is that target's alone, finite (the mean of one item).
    x.grad = None
    kept = np.full(3, ignored)
    kept[1] = 3
    loss = step(x, xgrad.tensor(kept))
    assert np.isfinite(loss.item()) and np.all(np.isfinite(x.grad.numpy()))
    np.testing.assert_array_equal(x.grad.numpy()[[0, 2]], 0.0)
