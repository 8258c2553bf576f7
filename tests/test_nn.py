"""xgrad.nn modules and the Optax optimizer, against plain JAX/optax on the same arrays."""

import copy
from collections import OrderedDict
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import xgrad
from xgrad import nn
from xgrad.optim import Optax


def test_linear_matches_jax_and_pytorch_init_bounds():
    layer = nn.Linear(5, 3, key=1, dtype=jnp.float64)
    assert layer.weight.shape == (3, 5) and layer.bias.shape == (3,)
    bound = 1 / np.sqrt(5)
    assert np.all(np.abs(layer.weight.detach().numpy()) <= bound) and np.all(np.abs(layer.bias.detach().numpy()) <= bound)
    assert layer.weight.is_leaf and layer.weight.requires_grad
    x = np.random.default_rng(0).normal(size=(4, 5))
    out = layer(xgrad.tensor(x))
    np.testing.assert_allclose(out.detach().numpy(), x @ layer.weight.detach().numpy().T + layer.bias.detach().numpy(), rtol=1e-12)


def test_same_key_same_init_and_default_key_differs():
    a, b = nn.Linear(3, 3, key=7), nn.Linear(3, 3, key=7)
    np.testing.assert_array_equal(a.weight.detach().numpy(), b.weight.detach().numpy())
    c, d = nn.Linear(3, 3), nn.Linear(3, 3)
    assert not np.array_equal(c.weight.detach().numpy(), d.weight.detach().numpy())


def test_mlp_parameter_discovery_and_grads_match_jax_grad():
    model = nn.MLP([3, 4, 2], activation=nn.Tanh, key=0, dtype=jnp.float64)
    names = [n for n, _ in model.named_parameters()]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert len(list(model.parameters())) == 4
    x = np.random.default_rng(1).normal(size=(6, 3))
    labels = np.array([0, 1, 1, 0, 1, 0])
    xgrad.ops.cross_entropy(model(xgrad.tensor(x)), labels).backward()

    def loss(params):
        w0, b0, w1, b1 = params
        logits = jnp.tanh(x @ w0.T + b0) @ w1.T + b1
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(6), labels])

    expected = jax.grad(loss)([p.array for p in model.parameters()])
    for p, g in zip(model.parameters(), expected, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-10, atol=1e-12)
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_shared_parameter_listed_once():
    shared = nn.Linear(2, 2, key=0)
    net = nn.Sequential(shared, nn.ReLU(), shared)
    assert len(list(net.parameters())) == 2
    assert list(net.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]  # PyTorch keeps both names


def test_state_dict_round_trip_and_errors():
    src, dst = nn.MLP([2, 3, 1], key=0), nn.MLP([2, 3, 1], key=1)
    state = src.state_dict()
    assert all(t.grad_fn is None and not t.requires_grad for t in state.values())
    weight_before = dst[0].weight
    assert dst.load_state_dict(state) == ([], [])
    assert dst[0].weight is weight_before  # loaded in place, still a leaf requiring grad
    assert weight_before.requires_grad and weight_before._version == 1
    for (n1, p1), (n2, p2) in zip(src.named_parameters(), dst.named_parameters(), strict=True):
        assert n1 == n2
        np.testing.assert_array_equal(p1.detach().numpy(), p2.detach().numpy())
    with pytest.raises(RuntimeError, match=r'Error\(s\) in loading state_dict for MLP:\n\tMissing key\(s\) in state_dict: "2.bias". '):
        dst.load_state_dict({k: v for k, v in state.items() if k != "2.bias"})
    with pytest.raises(RuntimeError, match=r'\n\tMissing key\(s\) in state_dict: "2.bias". \n\tUnexpected key\(s\) in state_dict: "extra". '):
        dst.load_state_dict({**{k: v for k, v in state.items() if k != "2.bias"}, "extra": xgrad.zeros(1)})
    with pytest.raises(RuntimeError, match=r"size mismatch for 0.weight: copying a param with shape \[5, 5\] from checkpoint, "
                       r"the shape in current model is \[3, 2\]."):
        dst.load_state_dict({**state, "0.bias": xgrad.zeros(3), "0.weight": xgrad.zeros(5, 5)})
    assert weight_before._version == 1 and not np.any(dst[0].bias.detach().numpy() == 0)  # a failed load copies nothing
    partial = {k: v for k, v in state.items() if k != "2.bias"}
    assert dst.load_state_dict({**partial, "extra": xgrad.zeros(1)}, strict=False) == (["2.bias"], ["extra"])


def test_layer_norm_embedding_match_references():
    ln = nn.LayerNorm(4, dtype=jnp.float64)
    x = np.random.default_rng(2).normal(size=(3, 4))
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(ln(xgrad.tensor(x)).detach().numpy(), (x - mu) / np.sqrt(var + 1e-5), rtol=1e-10)
    assert [n for n, _ in ln.named_parameters()] == ["weight", "bias"]
    emb = nn.Embedding(10, 3, key=0)
    idx = np.array([[1, 2], [9, 1]])
    out = emb(idx)
    np.testing.assert_array_equal(out.detach().numpy(), emb.weight.detach().numpy()[idx])
    out.sum().backward()
    assert emb.weight.grad.numpy()[1].tolist() == [2.0, 2.0, 2.0] and emb.weight.grad.numpy()[0].tolist() == [0.0] * 3


def test_dropout_train_and_eval():
    model = nn.Sequential(nn.Dropout(0.5, key=0))
    x = xgrad.ones(1000)
    y = model(x).detach().numpy()
    assert set(np.unique(y)) <= {0.0, 2.0} and 300 < (y == 0).sum() < 700
    assert not np.array_equal(y, model(x).detach().numpy())  # each call draws a fresh mask
    model.eval()
    assert not model[0].training
    assert model(x) is x
    with pytest.raises(ValueError, match="dropout probability"):
        nn.Dropout(1.5)


@pytest.mark.parametrize("activation, reference", [
    (nn.ReLU, jax.nn.relu), (nn.Tanh, jnp.tanh), (nn.GELU, lambda v: jax.nn.gelu(v, approximate=False)),
    (nn.SiLU, jax.nn.silu), (nn.Sigmoid, jax.nn.sigmoid),
])
def test_activations(activation, reference):
    x = np.linspace(-3, 3, 7)
    np.testing.assert_allclose(activation()(xgrad.tensor(x)).detach().numpy(), reference(x), rtol=1e-10)


@pytest.mark.parametrize("make_transform", [lambda: optax.sgd(0.1, momentum=0.9), lambda: optax.adam(1e-2)], ids=["sgd", "adam"])
def test_optax_steps_equal_optax_on_jax_arrays(make_transform):
    model = nn.MLP([3, 5, 2], key=0, dtype=jnp.float64)
    x = np.random.default_rng(3).normal(size=(8, 3))
    y = np.random.default_rng(4).normal(size=(8, 2))

    def loss_fn(params):
        w0, b0, w1, b1 = params
        return jnp.mean((jax.nn.relu(x @ w0.T + b0) @ w1.T + b1 - y) ** 2)

    ref_params = [p.array for p in model.parameters()]
    transform = make_transform()
    ref_state = transform.init(ref_params)
    opt = Optax(model.parameters(), make_transform())
    params_before = list(model.parameters())
    for _ in range(3):
        opt.zero_grad()
        xgrad.ops.mse_loss(model(xgrad.tensor(x)), y).backward()
        opt.step()
        updates, ref_state = transform.update(jax.grad(loss_fn)(ref_params), ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, updates)
    assert list(model.parameters()) == params_before  # the same tensors, updated in place
    for p, ref in zip(model.parameters(), ref_params, strict=True):
        assert p.is_leaf and p.requires_grad
        np.testing.assert_allclose(p.detach().numpy(), ref, rtol=1e-10, atol=1e-12)


def test_optax_with_named_params_and_missing_grad():
    a = xgrad.tensor([1.0, 2.0], requires_grad=True)
    b = xgrad.tensor([3.0], requires_grad=True)
    opt = Optax({"a": a, "b": b}, optax.sgd(1.0))
    (a * a).sum().backward()
    opt.step()
    assert a.tolist() == [-1.0, -2.0] and b.tolist() == [3.0]  # b had no grad: a zero step


def test_optax_rejects_bad_params():
    with pytest.raises(ValueError, match="empty parameter list"):
        Optax([], optax.sgd(0.1))
    x = xgrad.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match="non-leaf"):
        Optax([x * 2], optax.sgd(0.1))
    with pytest.raises(TypeError, match="parameter 0 is a ndarray"):
        Optax([np.ones(2)], optax.sgd(0.1))
    with pytest.raises(ValueError, match="more than once"):
        Optax([x, x], optax.sgd(0.1))


def test_step_after_backward_uses_new_values():
    # In-place updates must invalidate graphs that saved the old value, as in PyTorch.
    w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    opt = Optax([w], optax.sgd(0.1))
    loss = (w * w).sum()
    loss.backward(retain_graph=True)
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    opt.zero_grad()
    (w * w).sum().backward()  # and the next backward works
    np.testing.assert_allclose(w.grad.numpy(), 2 * w.detach().numpy())


# -- Parameter, buffers, discovery -------------------------------------------------------------


class Net(nn.Module):
    """Every way a module holds state: parameters, buffers, submodules directly and in containers."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(xgrad.ones(2))
        self.register_buffer("mask", xgrad.tensor(np.array([1.0, 0.0])))
        self.register_buffer("cache", xgrad.zeros(2), persistent=False)
        self.register_buffer("steps", xgrad.tensor(np.array(0)))
        self.constant = xgrad.tensor(np.array([5.0, 5.0], np.float32))  # a plain tensor: neither parameter nor buffer, as in PyTorch
        self.blocks = [nn.Linear(2, 2, key=0), nn.Linear(2, 2, key=1)]
        self.heads = {"a": nn.Linear(2, 1, key=2)}
        self.extra = nn.ModuleList([nn.ReLU(), nn.Linear(2, 2, key=3)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.heads["a"](x * self.scale * self.mask)


def test_parameter_is_a_leaf_tensor_that_modules_register():
    w = nn.Parameter(xgrad.tensor(np.ones(3)))
    assert isinstance(w, nn.Parameter) and isinstance(w, xgrad.Tensor) and w.is_leaf and w.requires_grad
    assert not isinstance(xgrad.ones(3), nn.Parameter) and not isinstance(w.detach(), nn.Parameter)
    assert not nn.Parameter(np.zeros(2), requires_grad=False).requires_grad
    with pytest.raises(TypeError, match=r"nn.Parameter\(tensor\).*register_buffer"):
        Net().w = xgrad.ones(2, requires_grad=True)


def test_parameters_buffers_and_containers_are_discovered_with_pytorch_names():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == [
        "scale", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias", "heads.a.weight",
        "heads.a.bias", "extra.1.weight", "extra.1.bias",
    ]
    assert [n for n, _ in net.named_buffers()] == ["mask", "cache", "steps"]
    assert list(net.state_dict()) == [
        "scale", "mask", "steps", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias",
        "heads.a.weight", "heads.a.bias", "extra.1.weight", "extra.1.bias",
    ]
    assert [n for n, _ in net.named_children()] == ["blocks.0", "blocks.1", "heads.a", "extra"]
    assert [n for n, _ in net.named_modules()] == ["", "blocks.0", "blocks.1", "heads.a", "extra", "extra.0", "extra.1"]
    assert list(net.modules())[0] is net and list(net.children())[-1] is net.extra
    net.blocks.append(nn.Linear(2, 2, key=4))  # a list mutated later is still seen
    assert "blocks.2.weight" in net.state_dict()
    net.bad = {nn.ReLU()}
    with pytest.raises(TypeError, match="attribute 'bad' is a set"):
        list(net.parameters())


def test_register_buffer_checks():
    net = Net()
    with pytest.raises(KeyError, match="attribute 'scale' already exists"):
        net.register_buffer("scale", xgrad.ones(1))
    with pytest.raises(KeyError, match='contain ".", got: a.b'):
        net.register_buffer("a.b", xgrad.ones(1))
    with pytest.raises(TypeError, match="cannot assign 'int' object to buffer 'x'"):
        net.register_buffer("x", 3)
    with pytest.raises(TypeError, match="cannot assign 'list' as buffer 'mask'"):
        net.mask = [1.0]
    net.mask = xgrad.tensor(np.array([0.0, 1.0]))  # reassigning a buffer keeps it a buffer
    assert net.state_dict()["mask"].tolist() == [0.0, 1.0]
    net.mask = None
    assert "mask" not in net.state_dict()


def test_module_list_and_module_dict():
    blocks = nn.ModuleList([nn.Linear(2, 2, key=0)])
    blocks.extend([nn.ReLU(), nn.Linear(2, 3, key=1)])
    blocks.insert(0, nn.Tanh())
    assert [type(m).__name__ for m in blocks] == ["Tanh", "Linear", "ReLU", "Linear"]
    assert list(blocks.state_dict()) == ["1.weight", "1.bias", "3.weight", "3.bias"]
    assert blocks[-1].weight.shape == (3, 2) and len(blocks[1:]) == 3
    del blocks[0]
    assert list(blocks.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    with pytest.raises(IndexError, match="index 4 is out of range"):
        blocks[4]
    heads = nn.ModuleDict({"cls": nn.Linear(2, 3, key=0)})
    heads["reg"] = nn.Linear(2, 1, key=1)
    assert list(heads) == ["cls", "reg"] and "reg" in heads and heads.reg is heads["reg"]
    assert list(heads.state_dict()) == ["cls.weight", "cls.bias", "reg.weight", "reg.bias"]
    heads.pop("cls")
    assert list(heads.keys()) == ["reg"]
    seq = nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2, key=0)), ("act", nn.ReLU())]))
    assert list(seq.state_dict()) == ["fc.weight", "fc.bias"] and isinstance(seq[1], nn.ReLU)
    seq[-1] = nn.Tanh()  # PyTorch's Sequential: item assignment keeps the key, deletion renumbers numbered keys
    assert list(seq._modules) == ["fc", "act"] and isinstance(seq.act, nn.Tanh)
    numbered = nn.Sequential(nn.Linear(2, 2, key=0), nn.ReLU(), nn.Linear(2, 3, key=1))
    del numbered[0]
    assert list(numbered.state_dict()) == ["1.weight", "1.bias"] and isinstance(numbered[0], nn.ReLU)
    del numbered[0:1]
    assert list(numbered.state_dict()) == ["0.weight", "0.bias"]
    with pytest.raises(IndexError, match="index 3 is out of range"):
        numbered[3] = nn.ReLU()


def test_train_eval_requires_grad_apply_zero_grad():
    net = Net()
    assert net.training and net.eval() is net
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    with pytest.raises(ValueError, match="boolean"):
        net.train("no")
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())
    net.requires_grad_()
    net(xgrad.ones(1, 2)).sum().backward()
    assert all(p.grad is not None for p in net.parameters() if p is not net.extra[1].weight and p is not net.extra[1].bias)
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    visited = []
    net.apply(lambda m: visited.append(m))
    assert visited[-1] is net and len(visited) == len(list(net.modules()))


def test_to_dtype_and_device_keeps_the_objects():
    net = Net()
    cpu1 = jax.devices("cpu")[1]
    weight = net.blocks[0].weight
    net(xgrad.ones(1, 2)).sum().backward()
    assert net.to(jnp.float64) is net
    assert weight.dtype == jnp.float64 and weight.grad.dtype == jnp.float64 and weight.requires_grad
    assert net.mask.dtype == jnp.float64 and net.steps.dtype == jnp.int64  # integer buffers keep their dtype
    assert net.constant.dtype == jnp.float32  # a plain tensor attribute is not the module's state
    net.to("cpu:1")
    assert all(t.device == cpu1 for t in [*net.parameters(), *net.buffers(), weight.grad])
    net.to(device=jax.devices("cpu")[0], dtype=jnp.float32)
    assert weight.device == jax.devices("cpu")[0] and weight.dtype == jnp.float32 and net.blocks[0].weight is weight
    with pytest.raises(TypeError, match="floating point or complex"):
        net.to(jnp.int32)


# -- PyTorch checkpoints -----------------------------------------------------------------------

FIXTURE = Path(__file__).parent / "fixtures" / "torch_sequential.safetensors"


def test_loads_a_state_dict_written_with_pytorch_key_names():
    state = xgrad.load(FIXTURE)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2), nn.BatchNorm1d(2))
    assert model.load_state_dict(state) == ([], [])  # strict: every key matched by name
    raw = {k: v.detach().numpy() for k, v in state.items()}
    assert model[3].num_batches_tracked.item() == 7 and model[3].num_batches_tracked.dtype == jnp.int64
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    hidden = np.maximum(x @ raw["0.weight"].T + raw["0.bias"], 0) @ raw["2.weight"].T + raw["2.bias"]
    expected = (hidden - raw["3.running_mean"]) / np.sqrt(raw["3.running_var"] + 1e-5) * raw["3.weight"] + raw["3.bias"]
    np.testing.assert_allclose(model.eval()(xgrad.tensor(x)).detach().numpy(), expected, rtol=1e-5, atol=1e-6)


# -- layers ---------------------------------------------------------------------------------------


def test_conv2d_matches_lax_and_pytorch_init():
    conv = nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=1, dilation=1, groups=2, key=0, dtype=jnp.float64)
    assert conv.weight.shape == (6, 2, 3, 2) and [n for n, _ in conv.named_parameters()] == ["weight", "bias"]
    bound = 1 / np.sqrt(2 * 3 * 2)
    assert np.abs(conv.weight.detach().numpy()).max() <= bound and np.abs(conv.bias.detach().numpy()).max() <= bound
    x = np.random.default_rng(0).normal(size=(2, 4, 7, 5))
    expected = jax.lax.conv_general_dilated(
        x, conv.weight.array, (2, 1), ((1, 1), (1, 1)), feature_group_count=2, dimension_numbers=("NCHW", "OIHW", "NCHW")
    ) + conv.bias.array[None, :, None, None]
    np.testing.assert_allclose(conv(xgrad.tensor(x)).detach().numpy(), expected, rtol=1e-12)
    assert nn.Conv2d(2, 2, 3, bias=False, key=0).bias is None
    with pytest.raises(ValueError, match="divisible by groups"):
        nn.Conv2d(3, 4, 1, groups=2)


def _batch_norm_reference(x, weight, bias, eps=1e-5):
    dims = (0, *range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = x.mean(dims), x.var(dims)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * weight.reshape(shape) + bias.reshape(shape)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("cls, shape", [(nn.BatchNorm1d, (6, 3)), (nn.BatchNorm1d, (4, 3, 5)), (nn.BatchNorm2d, (2, 3, 4, 5))])
def test_batch_norm_training_running_stats_and_eval(cls, shape, compiled):
    rng = np.random.default_rng(1)
    bn = cls(3, momentum=0.3, dtype=jnp.float64)
    dims = (0, *range(2, len(shape)))
    count = np.prod([shape[d] for d in dims])
    running_mean, running_var = np.zeros(3), np.ones(3)
    for _ in range(2):
        x = rng.normal(1.0, 2.0, size=shape)
        out = bn(xgrad.tensor(x))
        np.testing.assert_allclose(out.detach().numpy(), _batch_norm_reference(x, np.ones(3), np.zeros(3)), rtol=1e-10, atol=1e-12)
        running_mean = 0.7 * running_mean + 0.3 * x.mean(dims)
        running_var = 0.7 * running_var + 0.3 * x.var(dims) * count / (count - 1)
    np.testing.assert_allclose(bn.running_mean.detach().numpy(), running_mean, rtol=1e-12)
    np.testing.assert_allclose(bn.running_var.detach().numpy(), running_var, rtol=1e-12)
    assert bn.num_batches_tracked.item() == 2 and [n for n, _ in bn.named_buffers()] == ["running_mean", "running_var", "num_batches_tracked"]
    # the gradient through the batch statistics, against jax.grad of the same formula
    weights = rng.normal(size=shape)
    out = bn(xgrad.tensor(x))
    (out * xgrad.tensor(weights)).sum().backward(compiled=compiled)

    def loss(w, b):
        dims_, shape_ = (0, *range(2, x.ndim)), (1, -1) + (1,) * (x.ndim - 2)
        y = (x - x.mean(dims_).reshape(shape_)) / jnp.sqrt(x.var(dims_).reshape(shape_) + 1e-5)
        return jnp.sum((y * w.reshape(shape_) + b.reshape(shape_)) * weights)

    gw, gb = jax.grad(loss, argnums=(0, 1))(bn.weight.array, bn.bias.array)
    np.testing.assert_allclose(bn.weight.grad.numpy(), gw, rtol=1e-10)
    np.testing.assert_allclose(bn.bias.grad.numpy(), gb, rtol=1e-10)
    # eval: the running statistics, which stay put
    bn.eval()
    stats = bn.running_mean.detach().numpy(), bn.running_var.detach().numpy()
    shape_ = (1, -1) + (1,) * (len(shape) - 2)
    expected = (x - stats[0].reshape(shape_)) / np.sqrt(stats[1].reshape(shape_) + 1e-5)
    np.testing.assert_allclose(bn(xgrad.tensor(x)).detach().numpy(), expected, rtol=1e-10)
    assert bn.num_batches_tracked.item() == 3 and np.array_equal(bn.running_mean.detach().numpy(), stats[0])


def test_batch_norm_cumulative_average_and_errors():
    bn = nn.BatchNorm1d(2, momentum=None, affine=False, dtype=jnp.float64)
    xs = [np.random.default_rng(i).normal(size=(4, 2)) for i in range(3)]
    for x in xs:
        bn(xgrad.tensor(x))
    np.testing.assert_allclose(bn.running_mean.detach().numpy(), np.mean([x.mean(0) for x in xs], axis=0), rtol=1e-12)
    assert list(bn.state_dict()) == ["running_mean", "running_var", "num_batches_tracked"]
    with pytest.raises(ValueError, match=r"expected 2D or 3D input \(got 4D input\)"):
        bn(xgrad.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        bn(xgrad.zeros(1, 2))
    untracked = nn.BatchNorm2d(2, track_running_stats=False)
    assert list(untracked.state_dict()) == ["weight", "bias"]
    x = np.random.default_rng(5).normal(size=(2, 2, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(untracked.eval()(xgrad.tensor(x)).detach().numpy(), _batch_norm_reference(x, np.ones(2), np.zeros(2)), rtol=1e-4, atol=1e-5)


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _mha_reference(mha, q, k, v, add_mask=0.0):
    """PyTorch's multi_head_attention_forward in NumPy, batch-first."""
    (n, lq, e), h = q.shape, mha.num_heads
    w, b = mha.in_proj_weight.detach().numpy(), mha.in_proj_bias.detach().numpy()

    def split(x, i):
        return (x @ w[i * e:(i + 1) * e].T + b[i * e:(i + 1) * e]).reshape(n, -1, h, e // h).transpose(0, 2, 1, 3)

    scores = split(q, 0) @ split(k, 1).transpose(0, 1, 3, 2) / np.sqrt(e // h) + add_mask
    weights = _softmax(scores)
    out = (weights @ split(v, 2)).transpose(0, 2, 1, 3).reshape(n, lq, e)
    return out @ mha.out_proj.weight.detach().numpy().T + mha.out_proj.bias.detach().numpy(), weights


def test_multihead_attention_matches_pytorch_formula():
    rng = np.random.default_rng(2)
    mha = nn.MultiheadAttention(8, 2, key=0, dtype=jnp.float64)
    assert [n for n, _ in mha.named_parameters()] == ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    assert mha.in_proj_weight.shape == (24, 8) and np.all(mha.in_proj_bias.detach().numpy() == 0) and np.all(mha.out_proj.bias.detach().numpy() == 0)
    q, k, v = rng.normal(size=(3, 5, 8)), rng.normal(size=(3, 4, 8)), rng.normal(size=(3, 4, 8))
    expected, weights = _mha_reference(mha, q, k, v)
    # (L, N, E) by default
    out, avg = mha(*(xgrad.tensor(a.transpose(1, 0, 2)) for a in (q, k, v)))
    np.testing.assert_allclose(out.detach().numpy().transpose(1, 0, 2), expected, rtol=1e-10)
    np.testing.assert_allclose(avg.detach().numpy(), weights.mean(1), rtol=1e-10)
    mha.batch_first = True
    out, per_head = mha(xgrad.tensor(q), xgrad.tensor(k), xgrad.tensor(v), average_attn_weights=False)
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-10)
    np.testing.assert_allclose(per_head.detach().numpy(), weights, rtol=1e-10)
    # masks: bool True = not attended; a float mask is added; key padding per batch row
    attn_mask = rng.random((5, 4)) < 0.3
    attn_mask[:, 0] = False
    padding = np.zeros((3, 4), bool)
    padding[1, 3] = True
    add = np.where(attn_mask, -np.inf, 0.0)[None, None] + np.where(padding, -np.inf, 0.0)[:, None, None, :]
    expected_masked, _ = _mha_reference(mha, q, k, v, add)
    out, _ = mha(xgrad.tensor(q), xgrad.tensor(k), xgrad.tensor(v), attn_mask=attn_mask, key_padding_mask=padding)
    np.testing.assert_allclose(out.detach().numpy(), expected_masked, rtol=1e-10)
    float_mask = rng.normal(size=(6, 5, 4))  # (N * H, L, S)
    expected_float, _ = _mha_reference(mha, q, k, v, float_mask.reshape(3, 2, 5, 4))
    out, none = mha(xgrad.tensor(q), xgrad.tensor(k), xgrad.tensor(v), attn_mask=float_mask, need_weights=False)
    assert none is None
    np.testing.assert_allclose(out.detach().numpy(), expected_float, rtol=1e-10)
    causal, _ = _mha_reference(mha, q, q, q, np.where(np.triu(np.ones((5, 5)), 1) > 0, -np.inf, 0.0))
    np.testing.assert_allclose(mha(*(xgrad.tensor(q),) * 3, is_causal=True)[0].detach().numpy(), causal, rtol=1e-10)
    # unbatched (L, E)
    out, w = mha(xgrad.tensor(q[0]), xgrad.tensor(k[0]), xgrad.tensor(v[0]))
    np.testing.assert_allclose(out.detach().numpy(), expected[0], rtol=1e-10)
    assert w.shape == (5, 4)
    with pytest.raises(AssertionError, match="divisible by num_heads"):
        nn.MultiheadAttention(6, 4)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_multihead_attention_grads_match_jax(compiled):
    rng = np.random.default_rng(3)
    mha = nn.MultiheadAttention(4, 2, batch_first=True, key=1, dtype=jnp.float64)
    x = rng.normal(size=(2, 3, 4))
    mha(xgrad.tensor(x), xgrad.tensor(x), xgrad.tensor(x))[0].sum().backward(compiled=compiled)

    def loss(w_in, b_in, w_out, b_out):
        (n, length, e), h = x.shape, 2

        def split(i):
            return (x @ w_in[i * e:(i + 1) * e].T + b_in[i * e:(i + 1) * e]).reshape(n, length, h, e // h).transpose(0, 2, 1, 3)

        weights = jax.nn.softmax(split(0) @ split(1).transpose(0, 1, 3, 2) / jnp.sqrt(e // h), axis=-1)
        out = (weights @ split(2)).transpose(0, 2, 1, 3).reshape(n, length, e)
        return jnp.sum(out @ w_out.T + b_out)

    params = list(mha.parameters())
    expected = jax.grad(loss, argnums=(0, 1, 2, 3))(*(p.array for p in params))
    for p, g in zip(params, expected, strict=True):
        np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-9, atol=1e-12)


def _layer_norm(x, eps=1e-5):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer_matches_pytorch_formula(norm_first, activation):
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first, key=0, dtype=jnp.float64)
    assert list(layer.state_dict()) == [
        "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
        "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias", "norm1.weight", "norm1.bias",
        "norm2.weight", "norm2.bias",
    ]
    act = (lambda h: np.maximum(h, 0)) if activation == "relu" else (lambda h: np.asarray(jax.nn.gelu(h, approximate=False)))
    w1, b1, w2, b2 = (t.detach().numpy() for t in (layer.linear1.weight, layer.linear1.bias, layer.linear2.weight, layer.linear2.bias))

    def sa(h):
        return _mha_reference(layer.self_attn, h, h, h)[0]

    def ff(h):
        return act(h @ w1.T + b1) @ w2.T + b2

    x = np.random.default_rng(4).normal(size=(2, 5, 8))
    if norm_first:
        h = x + sa(_layer_norm(x))
        expected = h + ff(_layer_norm(h))
    else:
        h = _layer_norm(x + sa(x))
        expected = _layer_norm(h + ff(h))
    np.testing.assert_allclose(layer(xgrad.tensor(x)).detach().numpy(), expected, rtol=1e-9, atol=1e-12)
    with pytest.raises(RuntimeError, match="activation should be relu/gelu, not tanh"):
        nn.TransformerEncoderLayer(8, 2, activation="tanh")


def test_transformer_encoder_layer_dropout_follows_the_mode():
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.5, batch_first=True, key=0)
    x = xgrad.randn(2, 5, 8, key=jax.random.key(1))
    assert not np.array_equal(layer(x).detach().numpy(), layer(x).detach().numpy())  # fresh dropout masks while training
    layer.eval()
    np.testing.assert_array_equal(layer(x).detach().numpy(), layer(x).detach().numpy())


def test_deepcopy_makes_separate_parameters_and_keeps_ties():
    model = nn.Sequential(nn.Linear(2, 2, key=0), nn.Linear(2, 2, key=1))
    model[1].weight = model[0].weight  # tied
    x = xgrad.tensor(np.array([[1.0, -2.0]], np.float32))
    model(x).sum().backward()
    grad_before = model[0].weight.grad.numpy().copy()
    clone = copy.deepcopy(model)
    assert clone[0].weight is not model[0].weight and isinstance(clone[0].weight, nn.Parameter)
    assert clone[1].weight is clone[0].weight and len(list(clone.parameters())) == 3
    np.testing.assert_array_equal(clone[0].weight.grad.numpy(), grad_before)
    clone.zero_grad()
    clone(x).sum().backward()  # the copy's gradients land on the copy only
    np.testing.assert_array_equal(model[0].weight.grad.numpy(), grad_before)
    np.testing.assert_allclose(clone[0].weight.grad.numpy(), grad_before, rtol=1e-6)
    with xgrad.no_grad():
        clone[0].weight.copy_(xgrad.zeros(2, 2))
    assert not np.all(model[0].weight.detach().numpy() == 0)
