"""``nn.Transformer``, its encoder and decoder stacks and ``TransformerDecoderLayer`` against PyTorch.

``tests/fixtures/torch_transformer.npz`` holds PyTorch's state dicts, inputs, masks, outputs and
gradients (its generator, ``make_torch_transformer.py``, says how it was made); each case loads
the state dict into xgrad's model and compares the output and every gradient.
"""

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
import xgrad.nn as nn
from tests._backward_modes import eager_and_compiled  # noqa: F401  (a fixture)

FIXTURE = np.load(Path(__file__).parent / "fixtures" / "torch_transformer.npz")
CASES = {
    "post_norm_relu": (dict(num_encoder_layers=2, num_decoder_layers=2, batch_first=True), True),
    "pre_norm_gelu_no_bias": (
        dict(num_encoder_layers=1, num_decoder_layers=1, activation="gelu", norm_first=True, bias=False, batch_first=True), True,
    ),
}


def _case(name):
    prefix = f"{name}/"
    return {k[len(prefix):]: FIXTURE[k] for k in FIXTURE.files if k.startswith(prefix)}


def _close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-10, atol=1e-12)


def _check_against_pytorch(name):
    kwargs, _ = CASES[name]
    data = _case(name)
    model = nn.Transformer(d_model=4, nhead=2, dim_feedforward=6, dropout=0.0, key=0, dtype=jnp.float64, **kwargs)
    state = {k: v for k, v in data.items() if not k.startswith("grad/") and "." in k}
    assert sorted(model.state_dict()) == sorted(state)  # PyTorch's parameter names, nothing more or less
    model.load_state_dict(state)
    src = xgrad.tensor(data["src"], requires_grad=True)
    tgt = xgrad.tensor(data["tgt"], requires_grad=True)
    out = model(
        src, tgt, tgt_mask=xgrad.tensor(data["tgt_mask"]), src_key_padding_mask=data["src_padding"],
        tgt_key_padding_mask=data["tgt_padding"], memory_key_padding_mask=data["src_padding"],
    )
    _close(out.array, data["out"])
    (out * xgrad.tensor(data["weights"])).sum().backward()
    _close(src.grad.array, data["grad/src"])
    _close(tgt.grad.array, data["grad/tgt"])
    for key, p in model.named_parameters():
        _close(p.grad.array, data[f"grad/{key}"])


@pytest.mark.usefixtures("eager_and_compiled")
def test_transformer_matches_pytorch_outputs_and_gradients():
    _check_against_pytorch("post_norm_relu")


def test_pre_norm_gelu_transformer_without_bias_matches_pytorch():
    _check_against_pytorch("pre_norm_gelu_no_bias")  # eagerly only: the compiled backward has no other path here


def test_decoder_layer_is_causal_equals_the_square_subsequent_mask():
    layer = nn.TransformerDecoderLayer(4, 2, dim_feedforward=6, dropout=0.0, batch_first=True, key=1, dtype=jnp.float64)
    tgt = xgrad.tensor(np.random.default_rng(0).normal(size=(2, 3, 4)))
    memory = xgrad.tensor(np.random.default_rng(1).normal(size=(2, 5, 4)))
    mask = nn.Transformer.generate_square_subsequent_mask(3, dtype=jnp.float64)
    boolean = np.triu(np.ones((3, 3), bool), 1)
    expected = layer(tgt, memory, tgt_mask=mask).array
    _close(layer(tgt, memory, tgt_is_causal=True).array, np.asarray(expected))
    _close(layer(tgt, memory, tgt_mask=boolean).array, np.asarray(expected))
    # A step of a causal decoder never looks ahead: the first position ignores the later ones.
    changed = tgt.array.at[:, 1:].add(1.0)
    _close(layer(xgrad.tensor(changed), memory, tgt_mask=mask).array[:, 0], np.asarray(expected)[:, 0])


def test_stacks_copy_the_layer_and_apply_the_final_norm():
    layer = nn.TransformerEncoderLayer(4, 2, dim_feedforward=6, dropout=0.0, key=2, dtype=jnp.float64)
    stack = nn.TransformerEncoder(layer, num_layers=2, norm=nn.LayerNorm(4, dtype=jnp.float64))
    names = [n for n, _ in stack.named_parameters()]
    assert names[0] == "layers.0.self_attn.in_proj_weight" and names[-2:] == ["norm.weight", "norm.bias"]
    first, second = stack.layers
    assert first.linear1.weight is not layer.linear1.weight
    np.testing.assert_array_equal(first.linear1.weight.array, second.linear1.weight.array)  # clones, as PyTorch's
    x = xgrad.tensor(np.random.default_rng(2).normal(size=(5, 2, 4)))
    expected = stack.norm(second(first(x)))
    _close(stack(x).array, np.asarray(expected.array))


def test_cloned_layers_draw_different_dropout_masks():
    layer = nn.TransformerEncoderLayer(4, 2, dim_feedforward=6, dropout=0.5, key=3, dtype=jnp.float64)
    stack = nn.TransformerEncoder(layer, num_layers=2)
    x = xgrad.ones(6, 4, dtype=jnp.float64)
    masks = [np.asarray(clone.dropout1(x).array) != 0 for clone in stack.layers]
    assert (masks[0] != masks[1]).any()


def test_transformer_init_and_errors_follow_pytorch():
    model = nn.Transformer(
        d_model=4, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=6, key=0, dtype=jnp.float64,
    )
    bound = np.sqrt(6.0 / (6 + 4))
    weight = np.asarray(model.encoder.layers[0].linear1.weight.array)  # xavier_uniform_ over every matrix
    assert np.abs(weight).max() <= bound and np.abs(weight).max() > 0.8 * bound
    with pytest.raises(RuntimeError, match="the batch number of src and tgt must be equal"):
        model(xgrad.ones(5, 2, 4), xgrad.ones(3, 3, 4))
    with pytest.raises(RuntimeError, match="the feature number of src and tgt must be equal to d_model"):
        model(xgrad.ones(5, 2, 3), xgrad.ones(3, 2, 3))
    mask = nn.Transformer.generate_square_subsequent_mask(3)
    assert mask.dtype == jnp.float32
    np.testing.assert_array_equal(mask.array, np.triu(np.full((3, 3), -np.inf, np.float32), 1))


def test_decoder_layer_inside_xgrad_compile_matches_eager():
    layer = nn.TransformerDecoderLayer(4, 2, dim_feedforward=6, dropout=0.0, batch_first=True, key=4, dtype=jnp.float64)
    tgt = xgrad.tensor(np.random.default_rng(3).normal(size=(2, 3, 4)), requires_grad=True)
    memory = xgrad.tensor(np.random.default_rng(4).normal(size=(2, 5, 4)))

    def loss(tgt):
        return (layer(tgt, memory, tgt_is_causal=True) ** 2).sum()

    loss(tgt).backward()
    eager = np.asarray(tgt.grad.array)

    @xgrad.compile
    def step(tgt):
        tgt.grad = None
        loss(tgt).backward()
        return tgt.grad

    _close(step(tgt).array, eager)


def test_attention_has_pytorchs_submodules():
    attention = nn.MultiheadAttention(4, 2, dropout=0.5, key=0)
    assert [name for name, _ in attention.named_modules()] == ["", "out_proj"]
    assert repr(attention) == "MultiheadAttention(\n  (out_proj): Linear(in_features=4, out_features=4, bias=True)\n)"
