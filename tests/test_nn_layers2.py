"""3-d and transposed convolutions, 3-d pools, pixel (un)shuffle, upsampling, the remaining dropouts and
losses against PyTorch's numbers.

``tests/fixtures/torch_layers.npz`` (written by ``make_torch_layers.py``) holds, per case, one
``torch.nn.functional`` call's inputs, output and the gradients of ``sum(output * g)``; each case
runs through ``xgrad.nn.functional``, one per function with the eager and the compiled backward.
The modules (PyTorch's weight layouts and ``state_dict``), the dropouts' masks and bad arguments follow.
"""

import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest

import xgrad
import xgrad.nn as nn
import xgrad.nn.functional as F
from tests._backward_modes import eager_and_compiled  # noqa: F401 - the fixture

TORCH = np.load(Path(__file__).parent / "fixtures" / "torch_layers.npz")
CALLS = json.loads(str(TORCH["calls"]))
FIRST_PER_FUNCTION = sorted({call["fn"]: case for case, call in reversed(list(CALLS.items()))}.values())
OTHER_CASES = sorted(set(CALLS) - set(FIRST_PER_FUNCTION))


def _run_case(case: str) -> None:
    count = sum(1 for key in TORCH.files if re.fullmatch(rf"{case}/in\d+", key))
    tensors = [xgrad.tensor(TORCH[f"{case}/in{i}"], requires_grad=f"{case}/grad{i}" in TORCH.files) for i in range(count)]
    call = CALLS[case]
    keywords = call["tensor_keywords"]
    positional = tensors[: len(tensors) - len(keywords)]
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in call["kwargs"].items()}
    result = getattr(F, call["fn"])(*positional, **dict(zip(keywords, tensors[len(positional):], strict=True)), **kwargs)
    out, indices = result if isinstance(result, tuple) else (result, None)
    np.testing.assert_allclose(out.detach().numpy(), TORCH[f"{case}/out"], rtol=1e-10, atol=1e-12)
    if indices is not None:
        np.testing.assert_array_equal(indices.numpy(), TORCH[f"{case}/indices"])
    (out * xgrad.tensor(TORCH[f"{case}/g"])).sum().backward()
    for i, t in enumerate(tensors):
        if f"{case}/grad{i}" in TORCH.files:
            np.testing.assert_allclose(t.grad.numpy(), TORCH[f"{case}/grad{i}"], rtol=1e-10, atol=1e-12, err_msg=f"input {i}")


@pytest.mark.usefixtures("eager_and_compiled")
@pytest.mark.parametrize("case", FIRST_PER_FUNCTION)
def test_functional_matches_pytorch(case):
    _run_case(case)


@pytest.mark.parametrize("case", OTHER_CASES)
def test_functional_options_match_pytorch(case):
    _run_case(case)


@pytest.mark.parametrize("cls, args, weight_shape, bias_shape, in_shape, out_shape", [
    (nn.Conv3d, (4, 6, 3), (6, 4, 3, 3, 3), (6,), (2, 4, 4, 5, 6), (2, 6, 2, 3, 4)),
    (nn.ConvTranspose1d, (4, 6, 3), (4, 6, 3), (6,), (2, 4, 5), (2, 6, 7)),
    (nn.ConvTranspose2d, (4, 6, 3), (4, 3, 3, 3), (6,), (2, 4, 4, 5), (2, 6, 6, 7)),
    (nn.ConvTranspose3d, (4, 6, 3), (4, 6, 3, 3, 3), (6,), (2, 4, 4, 5, 6), (2, 6, 6, 7, 8)),
])
def test_conv_modules_have_pytorchs_layout_init_and_state_dict(cls, args, weight_shape, bias_shape, in_shape, out_shape):
    groups = 2 if cls is nn.ConvTranspose2d else 1
    layer = cls(*args, groups=groups, key=0)
    assert layer.weight.shape == weight_shape and layer.bias.shape == bias_shape
    assert list(layer.state_dict()) == ["weight", "bias"]
    # PyTorch's kaiming_uniform_(a=sqrt(5)): bound 1/sqrt(weight.shape[1] * kernel volume), the bias's too
    bound = 1 / np.sqrt(np.prod(weight_shape[1:]))
    for p in (layer.weight, layer.bias):
        assert np.abs(p.detach().numpy()).max() <= bound and np.abs(p.detach().numpy()).max() > 0.5 * bound
    assert layer(xgrad.randn(*in_shape)).shape == out_shape
    weight = xgrad.randn(*weight_shape)
    layer.load_state_dict({"weight": weight, "bias": xgrad.zeros(*bias_shape)})
    np.testing.assert_array_equal(layer.weight.detach().numpy(), weight.numpy())


def test_conv_transpose_output_size_picks_output_padding():
    up = nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, key=0)
    x = xgrad.randn(1, 2, 4, 4)
    assert up(x).shape == (1, 3, 7, 7)
    assert up(x, output_size=(8, 7)).shape == (1, 3, 8, 7)
    np.testing.assert_allclose(up(x, output_size=[1, 3, 8, 8]).detach().numpy(),
                               F.conv_transpose2d(x, up.weight, up.bias, 2, 1, 1).detach().numpy())
    with pytest.raises(ValueError, match="valid sizes range from"):
        up(x, output_size=(9, 9))


def test_conv_transpose_is_the_input_gradient_of_conv():
    # conv_transpose2d(g, w) is d/dx <conv2d(x, w), g>, PyTorch's definition of it
    x = xgrad.randn(1, 6, 5, 7)
    w = xgrad.randn(4, 3, 3, 2)
    g = xgrad.randn(1, 4, 3, 2)
    _, vjp = jax.vjp(lambda a: jax.lax.conv_general_dilated(a, w.numpy(), (2, 3), [(1, 1), (0, 0)], rhs_dilation=(1, 2),
                                                            dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                                            feature_group_count=2), x.numpy())
    expected = vjp(g.numpy())[0]
    got = F.conv_transpose2d(g, w, stride=(2, 3), padding=(1, 0), output_padding=(0, 1), groups=2, dilation=(1, 2))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_pixel_unshuffle_inverts_pixel_shuffle_and_modules_match():
    x = xgrad.randn(2, 12, 3, 4)
    shuffled = nn.PixelShuffle(2)(x)
    assert shuffled.shape == (2, 3, 6, 8)
    np.testing.assert_array_equal(nn.PixelUnshuffle(2)(shuffled).numpy(), x.numpy())


@pytest.mark.parametrize("module, mode, align", [
    (nn.Upsample(scale_factor=2, mode="bilinear"), "bilinear", False),
    (nn.UpsamplingBilinear2d(scale_factor=2), "bilinear", True),
    (nn.UpsamplingNearest2d(scale_factor=2), "nearest", None),
])
def test_upsample_modules_are_interpolate(module, mode, align):
    x = xgrad.randn(1, 2, 3, 4)
    np.testing.assert_array_equal(module(x).numpy(), F.interpolate(x, scale_factor=2.0, mode=mode, align_corners=align).numpy())


def test_dropout3d_and_feature_alpha_dropout_drop_whole_channels():
    x = xgrad.ones(4, 6, 2, 2, 3)
    out = F.dropout3d(x, 0.5, key=jax.random.key(0)).numpy().reshape(4, 6, -1)
    assert set(np.unique(out)) == {0.0, 2.0} and (out.min(axis=2) == out.max(axis=2)).all()
    alpha = F.feature_alpha_dropout(x, 0.5, True, key=jax.random.key(1)).numpy().reshape(4, 6, -1)
    assert (alpha.min(axis=2) == alpha.max(axis=2)).all() and len(np.unique(alpha)) == 2
    # PyTorch's affine map: kept values 1 * a + c, dropped values -alpha' * a + c (alpha' = SELU's saturation)
    p, sat = 0.5, 1.7580993408473766
    a = 1 / np.sqrt((sat**2 * p + 1) * (1 - p))
    np.testing.assert_allclose(sorted(np.unique(alpha)), sorted([a + sat * a * p, -sat * a + sat * a * p]), rtol=1e-6)
    assert nn.Dropout3d(0.5).eval()(x) is x and nn.FeatureAlphaDropout(0.5).eval()(x) is x


@pytest.mark.parametrize("module, call, fn, kwargs", [
    (nn.SoftMarginLoss(reduction="sum"), 2, F.soft_margin_loss, {"reduction": "sum"}),
    (nn.HingeEmbeddingLoss(margin=0.5), 2, F.hinge_embedding_loss, {"margin": 0.5}),
    (nn.MultiLabelSoftMarginLoss(), 2, F.multilabel_soft_margin_loss, {}),
    (nn.TripletMarginLoss(swap=True), 3, F.triplet_margin_loss, {"swap": True}),
    (nn.PoissonNLLLoss(full=True), 2, F.poisson_nll_loss, {"full": True}),
    (nn.GaussianNLLLoss(eps=0.1), 3, F.gaussian_nll_loss, {"eps": 0.1}),
])
def test_loss_modules_call_their_functions(module, call, fn, kwargs):
    args = [xgrad.rand(3, 4) + 0.5 for _ in range(call)]
    np.testing.assert_allclose(module(*args).numpy(), fn(*args, **kwargs).numpy())


def test_ctc_loss_module_and_its_gradient_convention():
    log_probs = xgrad.tensor(TORCH["ctc_loss/in0"], requires_grad=True)
    args = [xgrad.tensor(TORCH[f"ctc_loss/in{i}"]) for i in (1, 2, 3)]
    loss = nn.CTCLoss(reduction="sum")(log_probs, *args)
    np.testing.assert_allclose(loss.detach().numpy(), F.ctc_loss(log_probs, *args, reduction="sum").detach().numpy())
    loss.backward()
    # PyTorch's: the derivative plus exp(log_probs) inside each input length, so that after a
    # log_softmax the logits' gradient is softmax - posterior, which sums to zero over the classes
    # (the derivative alone sums to -1 at each step inside the input length)
    np.testing.assert_allclose(log_probs.grad.numpy().sum(axis=2), 0.0, atol=1e-12)


def test_class_loss_modules_take_weights_as_buffers():
    x = xgrad.randn(3, 4)
    target = xgrad.tensor([0, 3, 1])
    weight = xgrad.tensor([1.0, 2.0, 0.5, 3.0])
    loss = nn.MultiMarginLoss(p=2, weight=weight)
    assert list(loss.state_dict()) == ["weight"]
    np.testing.assert_allclose(loss(x, target).numpy(), F.multi_margin_loss(x, target, p=2, weight=weight).numpy())
    labels = xgrad.tensor([[1, -1, 0, 0], [3, 2, -1, 1], [0, 1, 2, 3]])
    np.testing.assert_allclose(nn.MultiLabelMarginLoss()(x, labels).numpy(), F.multilabel_margin_loss(x, labels).numpy())


@pytest.mark.parametrize("call, error, message", [
    (lambda: F.conv_transpose2d(xgrad.ones(1, 2, 3, 3), xgrad.ones(2, 1, 3, 3), stride=2, output_padding=2), RuntimeError,
     "output padding must be smaller than either stride or dilation"),
    (lambda: F.conv_transpose2d(xgrad.ones(1, 3, 3, 3), xgrad.ones(2, 1, 3, 3)), RuntimeError, "to have 2 channels"),
    (lambda: F.conv3d(xgrad.ones(2, 3, 3), xgrad.ones(1, 2, 2, 2, 2)), RuntimeError, "Expected 4D \\(unbatched\\) or 5D"),
    (lambda: F.conv3d(xgrad.ones(1, 2, 3, 3, 3), xgrad.ones(1, 2, 4, 2, 2)), RuntimeError, "Kernel size can't be greater"),
    (lambda: nn.ConvTranspose2d(2, 2, 3, padding="same"), ValueError, "not supported for transposed"),
    (lambda: F.pixel_shuffle(xgrad.ones(1, 3, 2, 2), 2), RuntimeError, "divisible by the square of upscale_factor"),
    (lambda: F.pixel_unshuffle(xgrad.ones(1, 1, 3, 4), 2), RuntimeError, "divisible by downscale_factor"),
    (lambda: F.multi_margin_loss(xgrad.ones(2, 3), xgrad.tensor([0, 1]), p=3), ValueError, "only p == 1 and p == 2"),
    (lambda: F.multi_margin_loss(xgrad.ones(2, 3), xgrad.tensor([0, 3])), IndexError, "target out of range"),
    (lambda: F.gaussian_nll_loss(xgrad.ones(2, 3), xgrad.ones(2, 3), xgrad.ones(3)), ValueError, "var is of incorrect size"),
    (lambda: F.gaussian_nll_loss(xgrad.ones(2), xgrad.ones(2), -xgrad.ones(2)), ValueError, "var has negative entry"),
    (lambda: F.max_pool3d(xgrad.ones(2, 3, 3), 2), RuntimeError, "4D or 5D"),
])
def test_bad_arguments_raise_pytorchs_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("factory", [xgrad.zeros, xgrad.ones, xgrad.empty, xgrad.rand, xgrad.randn])
def test_factories_take_size_as_a_keyword(factory):
    assert factory(size=(2, 3)).shape == (2, 3) and factory(size=[4]).shape == (4,)
    with pytest.raises(TypeError, match="either as positional ints or as size="):
        factory(2, size=(2,))


def test_full_and_randint_take_size_as_a_keyword():
    assert xgrad.full(size=(2,), fill_value=1.5).tolist() == [1.5, 1.5]
    assert xgrad.randint(3, size=(4,)).shape == (4,) and xgrad.randint(1, 3, size=(2, 2)).shape == (2, 2)


def test_is_inference():
    with xgrad.inference_mode():
        made_inside = xgrad.ones(2)
    assert xgrad.is_inference(made_inside) and not xgrad.is_inference(xgrad.ones(2))
    with pytest.raises(TypeError, match="must be Tensor, not list"):
        xgrad.is_inference([1.0])


@pytest.mark.usefixtures("eager_and_compiled")
def test_sparse_mm_matches_pytorch_with_its_sparse_gradient():
    dense = xgrad.tensor(TORCH["sparse_mm/dense"], requires_grad=True)
    other = xgrad.tensor(TORCH["sparse_mm/other"], requires_grad=True)
    sparse = dense.to_sparse()
    assert sparse.is_sparse and sparse._nnz() == np.count_nonzero(TORCH["sparse_mm/dense"])
    out = xgrad.sparse.mm(sparse, other)
    np.testing.assert_allclose(out.detach().numpy(), TORCH["sparse_mm/out"], rtol=1e-12)
    (out * xgrad.tensor(TORCH["sparse_mm/g"])).sum().backward()
    # the sparse operand's gradient has its pattern: zero where the dense matrix is zero
    np.testing.assert_allclose(dense.grad.numpy(), TORCH["sparse_mm/grad_dense"], rtol=1e-12)
    np.testing.assert_allclose(other.grad.numpy(), TORCH["sparse_mm/grad_other"], rtol=1e-12)
    np.testing.assert_allclose((sparse @ other).detach().numpy(), TORCH["sparse_mm/out"], rtol=1e-12)


@pytest.mark.usefixtures("eager_and_compiled")
def test_dense_plus_sparse_coo_tensor_matches_pytorch():
    values = xgrad.tensor(TORCH["sparse_add/values"], requires_grad=True)
    sparse = xgrad.sparse_coo_tensor(TORCH["sparse_add/indices"], values, (3, 4))
    out = xgrad.eye(3, 4, dtype=xgrad.float64) + sparse
    assert isinstance(out, xgrad.Tensor)
    np.testing.assert_allclose(out.detach().numpy(), TORCH["sparse_add/out"], rtol=1e-12)
    (out * xgrad.tensor(TORCH["sparse_add/g"])).sum().backward()
    np.testing.assert_allclose(values.grad.numpy(), TORCH["sparse_add/grad_values"], rtol=1e-12)


def test_sparse_tensor_accessors_and_bcoo():
    sparse = xgrad.sparse_coo_tensor([[1, 0, 1], [2, 1, 2]], [1.0, 2.0, 3.0], dtype=xgrad.float64)
    assert sparse.shape == (2, 3) and not sparse.is_coalesced()
    merged = sparse.coalesce()
    assert merged.is_coalesced() and merged.indices().tolist() == [[0, 1], [1, 2]] and merged.values().tolist() == [2.0, 4.0]
    np.testing.assert_array_equal(sparse.to_jax().todense(), sparse.to_dense().numpy())
    np.testing.assert_array_equal((xgrad.ones(4, 2, dtype=xgrad.float64) @ sparse).numpy(),
                                  np.ones((4, 2)) @ sparse.to_dense().numpy())
    np.testing.assert_array_equal((sparse + sparse).to_dense().numpy(), 2 * sparse.to_dense().numpy())


@pytest.mark.parametrize("call, error, message", [
    (lambda s: s[0], NotImplementedError, "convert with .to_dense"),
    (lambda s: s * xgrad.ones(2, 2), NotImplementedError, "convert with .to_dense"),
    (lambda s: xgrad.sparse.mm(s, xgrad.ones(3, 1)), RuntimeError, "cannot be multiplied"),
    (lambda s: xgrad.sparse_coo_tensor([[0, 3]], [1.0, 2.0], (2,)), RuntimeError, "size is inconsistent with indices"),
    (lambda s: xgrad.sparse_coo_tensor([[0, 1]], [1.0], (2,)), RuntimeError, "same nnz"),
    (lambda s: jax.jit(lambda a: xgrad.Tensor(a).to_sparse().values()._array)(np.ones(2)), RuntimeError,
     "needs concrete values"),
])
def test_sparse_errors_name_the_dense_alternative(call, error, message):
    with pytest.raises(error, match=message):
        call(xgrad.eye(2).to_sparse())
