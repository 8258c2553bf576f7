"""Pooling, resampling, normalization, conv1d and embedding options against PyTorch's numbers.

``tests/fixtures/torch_pooling.npz`` (written by ``make_torch_pooling.py``) holds, per case,
one ``torch.nn.functional`` call's inputs, output, indices and the gradients of
``sum(output * g)``; each case runs here through ``xgrad.nn.functional`` with the eager and
the compiled backward. The modules, argument errors and an ``xgrad.compile``'d use follow.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest

import xgrad
import xgrad.nn as nn
import xgrad.nn.functional as F
from tests._backward_modes import eager_and_compiled  # noqa: F401 - the fixture

TORCH = np.load(Path(__file__).parent / "fixtures" / "torch_pooling.npz")
CALLS = json.loads(str(TORCH["calls"]))


def _inputs(case: str) -> list[np.ndarray]:
    count = sum(1 for key in TORCH.files if re.fullmatch(rf"{case}/in\d+", key))
    return [TORCH[f"{case}/in{i}"] for i in range(count)]


def _call(case: str, tensors: list[xgrad.Tensor]):
    call = CALLS[case]
    keywords = call["tensor_keywords"]
    positional = tensors[: len(tensors) - len(keywords)]
    by_name = dict(zip(keywords, tensors[len(positional):], strict=True))
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in call["kwargs"].items()}
    return getattr(F, call["fn"])(*positional, **by_name, **kwargs)


# One case per function runs with the eager and the compiled backward; the others eagerly.
FIRST_PER_FUNCTION = sorted({call["fn"]: case for case, call in reversed(list(CALLS.items()))}.values())
OTHER_CASES = sorted(set(CALLS) - set(FIRST_PER_FUNCTION))


@pytest.mark.usefixtures("eager_and_compiled")
@pytest.mark.parametrize("case", FIRST_PER_FUNCTION)
def test_functional_matches_pytorch(case):
    _check_against_pytorch(case)


@pytest.mark.parametrize("case", OTHER_CASES)
def test_functional_options_match_pytorch(case):
    _check_against_pytorch(case)


def _check_against_pytorch(case):
    arrays = _inputs(case)
    tensors = [
        xgrad.tensor(a, requires_grad=f"{case}/grad{i}" in TORCH.files) if a.dtype == np.float64 else xgrad.tensor(a)
        for i, a in enumerate(arrays)
    ]
    result = _call(case, tensors)
    out, indices = result if isinstance(result, tuple) else (result, None)
    np.testing.assert_allclose(out.detach().numpy(), TORCH[f"{case}/out"], rtol=1e-10, atol=1e-12)
    if f"{case}/indices" in TORCH.files:
        np.testing.assert_array_equal(indices.numpy(), TORCH[f"{case}/indices"])
    (out * xgrad.tensor(TORCH[f"{case}/g"])).sum().backward()
    for i, t in enumerate(tensors):
        if f"{case}/grad{i}" in TORCH.files:
            np.testing.assert_allclose(t.grad.numpy(), TORCH[f"{case}/grad{i}"], rtol=1e-10, atol=1e-12, err_msg=f"input {i}")
    for name, index in (("running_mean", 1), ("running_var", 2)):
        if f"{case}/{name}" in TORCH.files:
            np.testing.assert_allclose(tensors[index].detach().numpy(), TORCH[f"{case}/{name}"], rtol=1e-12)
    if f"{case}/weight_after" in TORCH.files:  # max_norm renormalised the looked-up rows in place
        np.testing.assert_allclose(tensors[1].detach().numpy(), TORCH[f"{case}/weight_after"], rtol=1e-12)


def test_functional_has_every_torch_function_xgrad_has():
    torch_names = set(json.loads(str(TORCH["functional_names"])))
    # torch.nn.functional.unfold is im2col; xgrad's unfold is Tensor.unfold (a sliding view).
    expected = (torch_names & set(xgrad.ops.__all__)) - {"unfold"}
    assert expected <= set(F.__all__), sorted(expected - set(F.__all__))
    assert all(getattr(F, name) is getattr(xgrad.ops, name) for name in expected)
    assert "unfold" not in F.__all__


@pytest.mark.usefixtures("eager_and_compiled")
def test_max_pool_gradient_goes_to_one_element_per_window():
    # All equal, overlapping windows: each window sends its gradient to its first element (as PyTorch).
    x = xgrad.ones(1, 1, 3, 4, requires_grad=True)
    out, indices = F.max_pool2d(x, 2, stride=1, return_indices=True)
    out.sum().backward()
    assert indices.tolist() == [[[[0, 1, 2], [4, 5, 6]]]]
    assert x.grad.tolist() == [[[[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]]]


def test_pooling_modules_and_their_repr():
    x = xgrad.tensor(np.random.default_rng(2).uniform(-2, 2, (2, 3, 6, 6)))
    layers = [
        (nn.MaxPool2d(3, stride=2, padding=1), F.max_pool2d(x, 3, 2, 1), "kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=False"),
        (nn.AvgPool2d(2, ceil_mode=True, divisor_override=2), F.avg_pool2d(x, 2, ceil_mode=True, divisor_override=2),
         "kernel_size=2, stride=2, padding=0"),
        (nn.AdaptiveAvgPool2d((2, None)), F.adaptive_avg_pool2d(x, (2, None)), "output_size=(2, None)"),
        (nn.AdaptiveMaxPool2d(4), F.adaptive_max_pool2d(x, 4), "output_size=4"),
        (nn.Flatten(), x.reshape(2, -1), "start_dim=1, end_dim=-1"),
    ]
    for layer, expected, extra in layers:
        np.testing.assert_array_equal(layer(x).detach().numpy(), expected.detach().numpy())
        assert layer.extra_repr() == extra
    seq = x[:, :, 0]
    for layer, expected in ((nn.MaxPool1d(2), F.max_pool1d(seq, 2)), (nn.AvgPool1d(3, 1, 1), F.avg_pool1d(seq, 3, 1, 1)),
                            (nn.AdaptiveAvgPool1d(4), F.adaptive_avg_pool1d(seq, 4))):
        np.testing.assert_array_equal(layer(seq).numpy(), expected.numpy())
    values, indices = nn.MaxPool2d(2, return_indices=True)(x)
    assert indices.shape == values.shape == (2, 3, 3, 3)
    assert nn.Unflatten(1, (3, 2))(xgrad.zeros(4, 6, 5)).shape == (4, 3, 2, 5)
    assert nn.Flatten(0, 2)(x).shape == (36, 6)
    assert repr(nn.Unflatten(1, (3, 2))) == "Unflatten(dim=1, unflattened_size=(3, 2))"


def test_group_norm_and_conv1d_modules():
    gn = nn.GroupNorm(2, 4)
    assert gn.weight.tolist() == [1.0] * 4 and gn.bias.tolist() == [0.0] * 4
    assert gn.extra_repr() == "2, 4, eps=1e-05, affine=True"
    x = xgrad.tensor(np.random.default_rng(3).uniform(-2, 2, (2, 4, 5)), dtype="float32")
    np.testing.assert_allclose(gn(x).detach().numpy(), F.group_norm(x, 2, gn.weight, gn.bias).detach().numpy())
    conv = nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2, key=0)
    assert conv.weight.shape == (6, 2, 3) and conv.bias.shape == (6,)
    assert conv.extra_repr() == "4, 6, kernel_size=(3,), stride=(2,), padding=(1,), groups=2"
    np.testing.assert_allclose(conv(x).detach().numpy(), F.conv1d(x, conv.weight, conv.bias, 2, 1, 1, 2).detach().numpy())
    with pytest.raises(ValueError, match="divisible"):
        nn.GroupNorm(3, 4)


def test_embedding_padding_idx_and_max_norm_modules():
    emb = nn.Embedding(5, 3, padding_idx=-2, key=0)
    assert emb.padding_idx == 3 and emb.weight[3].tolist() == [0.0, 0.0, 0.0]
    idx = xgrad.tensor([[3, 1], [3, 3]])
    emb(idx).sum().backward()
    assert emb.weight.grad[3].tolist() == [0.0, 0.0, 0.0] and emb.weight.grad[1].tolist() == [1.0, 1.0, 1.0]
    assert emb.extra_repr() == "5, 3, padding_idx=3"
    frozen = nn.Embedding.from_pretrained(xgrad.tensor([[1.0, 2.0], [3.0, 4.0]]), padding_idx=0)
    assert not frozen.weight.requires_grad and frozen(xgrad.tensor([1, 0])).tolist() == [[3.0, 4.0], [1.0, 2.0]]
    capped = nn.Embedding(4, 2, max_norm=1.0, key=1)
    with xgrad.no_grad():
        capped.weight.copy_(xgrad.tensor([[3.0, 4.0], [0.3, 0.4], [6.0, 8.0], [0.0, 2.0]], dtype="float32"))
    capped(xgrad.tensor([0, 1]))
    norms = np.linalg.norm(capped.weight.detach().numpy(), axis=1)
    np.testing.assert_allclose(norms, [1.0, 0.5, 10.0, 2.0], rtol=1e-6)  # only the looked-up rows are renormalised


def test_batch_norm_module_uses_functional_running_stats():
    bn = nn.BatchNorm1d(3, momentum=None)
    x = xgrad.tensor(np.random.default_rng(4).uniform(-2, 2, (5, 3)), dtype="float32")
    bn(x)
    bn(x * 2)
    # momentum=None: the cumulative average of the two batches' statistics.
    mean = (x.numpy().mean(0) + (2 * x.numpy()).mean(0)) / 2
    np.testing.assert_allclose(bn.running_mean.numpy(), mean, rtol=1e-5)
    running_mean, running_var = xgrad.zeros(3), xgrad.ones(3)
    F.batch_norm(x, running_mean, running_var, training=True, momentum=0.5)
    np.testing.assert_allclose(running_var.numpy(), 0.5 + 0.5 * x.numpy().var(0, ddof=1), rtol=1e-5)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda x: F.max_pool2d(x, 2, padding=2), RuntimeError, "pad should be at most half of effective kernel size"),
        (lambda x: F.max_pool2d(x, 5), RuntimeError, r"Given input size: \(2x4x4\). Calculated output size: \(2x0x0\)"),
        (lambda x: F.max_pool2d(x, (2, 2, 2)), RuntimeError, "kernel_size must either be a single int, or a tuple of two ints"),
        (lambda x: F.max_pool2d(x, 2, stride=0), RuntimeError, "stride should not be zero"),
        (lambda x: F.max_pool2d(x[0, 0], 2), RuntimeError, "3D or 4D"),
        (lambda x: F.max_pool1d(x, 2), RuntimeError, "Expected 2D or 3D"),
        (lambda x: F.avg_pool2d(x, 2, divisor_override=0), RuntimeError, "divisor must be not zero"),
        (lambda x: F.avg_pool2d(x.long(), 2), NotImplementedError, r"\.float\(\)"),
        (lambda x: F.adaptive_avg_pool2d(x[0, 0], 2), RuntimeError, "Expected 3D or 4D tensor"),
        (lambda x: F.adaptive_max_pool2d(x, (2, 2, 2)), RuntimeError, "output_size.size\\(\\) must be 2"),
        (lambda x: F.group_norm(x, 3), RuntimeError, "divisible by num_groups"),
        (lambda x: F.conv1d(x[0], xgrad.ones(3, 2, 2), stride=2, padding="same"), RuntimeError, "strided convolutions"),
        (lambda x: F.conv1d(x, xgrad.ones(3, 2, 2)), RuntimeError, "Expected 2D \\(unbatched\\) or 3D"),
        (lambda x: F.embedding(xgrad.tensor([1]), xgrad.ones(3, 2), padding_idx=3), AssertionError, "Padding_idx"),
        (lambda x: F.batch_norm(x, None, None), RuntimeError, "running_mean and running_var must be defined"),
    ],
)
def test_bad_arguments_raise_pytorchs_errors(call, error, message):
    with pytest.raises(error, match=message):
        call(xgrad.zeros(1, 2, 4, 4))


def test_compiled_step_with_pooling_and_norms():
    model = nn.Sequential(nn.Conv1d(2, 4, 3, padding=1, key=0), nn.MaxPool1d(2), nn.Flatten())
    opt = xgrad.optim.SGD(model.parameters(), lr=0.1)
    x = xgrad.tensor(np.random.default_rng(5).uniform(-1, 1, (3, 2, 4)), dtype="float32")

    def step(x):
        loss = (model(x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    eager_model_state = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    compiled = xgrad.compile(step)
    losses = [compiled(x).item() for _ in range(2)]
    model.load_state_dict({k: xgrad.tensor(v) for k, v in eager_model_state.items()})
    expected = [step(x).item() for _ in range(2)]
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
