"""The top-level torch surface: dtype names, the default dtype, devices, factories and random fills,
each against PyTorch's documented behaviour (values PyTorch gives, written out)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _scripts import run_json

import xgrad


def test_dtype_names_are_numpy_dtypes_under_pytorch_names():
    assert xgrad.float32 == jnp.float32 and xgrad.long == jnp.int64 and xgrad.double == xgrad.float64
    assert (xgrad.half, xgrad.float, xgrad.int, xgrad.short, xgrad.cfloat) == (
        jnp.float16, jnp.float32, jnp.int32, jnp.int16, jnp.complex64)
    x = xgrad.zeros(2, dtype=xgrad.float64)
    assert x.dtype == xgrad.float64 and xgrad.float64 == x.dtype and x.dtype != xgrad.float32
    assert {x.dtype: 1}[xgrad.float64] == 1 and isinstance(x.dtype, xgrad.dtype)
    assert repr(xgrad.float32) == "xgrad.float32" and repr(xgrad.long) == "xgrad.int64"  # torch.float32, torch.int64
    assert xgrad.ones(2).to(xgrad.bfloat16).dtype == jnp.bfloat16 and xgrad.tensor([1], dtype=xgrad.uint8).dtype == jnp.uint8
    assert xgrad.float16.is_floating_point and xgrad.complex64.is_complex and not xgrad.uint8.is_signed
    assert xgrad.finfo(xgrad.float16).max == 65504.0 and xgrad.iinfo(xgrad.int8).min == -128
    assert xgrad.zeros(1).is_floating_point() and not xgrad.arange(2).is_floating_point()
    assert xgrad.is_floating_point(xgrad.zeros(1)) and xgrad.is_complex(xgrad.zeros(1, dtype=xgrad.cfloat))


def test_set_default_dtype_reaches_python_floats_and_float_factories():
    assert xgrad.get_default_dtype() == xgrad.float32
    xgrad.set_default_dtype(xgrad.float64)
    try:
        made = [xgrad.tensor(1.5), xgrad.tensor([1.0, 2]), xgrad.zeros(2), xgrad.ones(2), xgrad.full((1,), 0.5), xgrad.rand(2),
                xgrad.randn(2), xgrad.empty(2), xgrad.linspace(0, 1, 3), xgrad.arange(0.0, 1.0, 0.5), xgrad.eye(2),
                xgrad.Tensor([1.0]), xgrad.Tensor(2, 3)]
        layers = [xgrad.nn.Linear(2, 2), xgrad.nn.Conv2d(1, 1, 2), xgrad.nn.LayerNorm(2), xgrad.nn.BatchNorm1d(2),
                  xgrad.nn.Embedding(3, 2), xgrad.nn.LSTM(2, 2), xgrad.nn.GRUCell(2, 2), xgrad.nn.MultiheadAttention(2, 1),
                  xgrad.nn.Transformer(2, 1, 1, 1, dim_feedforward=2)]
        made += [p for layer in layers for p in layer.parameters()]
        made.append(xgrad.nn.Transformer.generate_square_subsequent_mask(2))
        assert [t.dtype for t in made] == [jnp.float64] * len(made)
        assert xgrad.tensor(1j).dtype == jnp.complex128 and xgrad.tensor(1).dtype == jnp.int64
        assert xgrad.get_default_dtype() == xgrad.float64
    finally:
        xgrad.set_default_dtype(xgrad.float32)
    assert xgrad.tensor(1.5).dtype == jnp.float32
    with pytest.raises(TypeError, match="only floating-point types are supported as the default type"):
        xgrad.set_default_dtype(xgrad.int64)


@pytest.mark.slow
def test_64_bit_requests_raise_with_x64_off():
    result = run_json(
        """
        jax.config.update("jax_enable_x64", False)
        import json, warnings
        import xgrad
        errors = []
        for call in (lambda: xgrad.ones(2).double(), lambda: xgrad.ones(2).to(xgrad.float64),
                     lambda: xgrad.zeros(2, dtype=xgrad.float64), lambda: xgrad.set_default_dtype(xgrad.float64)):
            try:
                call()
            except TypeError as e:
                errors.append(str(e))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            longs = [xgrad.zeros(2, dtype=xgrad.long).dtype.name, xgrad.ones(2).long().dtype.name,
                     xgrad.randint(0, 3, (2,)).dtype.name]
        print(json.dumps({"errors": errors, "longs": longs}))
        """,
        devices=1,
    )
    assert len(result["errors"]) == 4 and all("jax_enable_x64" in e for e in result["errors"])
    assert result["longs"] == ["int32"] * 3  # int64 narrows silently, as JAX's index arrays do


def test_device_names_and_queries():
    d = xgrad.device("cuda:1")
    assert (d.type, d.index, str(d), repr(d)) == ("cuda", 1, "cuda:1", "device(type='cuda', index=1)")
    assert xgrad.device("cuda", 0) == "cuda:0" and repr(xgrad.device("cpu")) == "device(type='cpu')"
    with pytest.raises(RuntimeError, match="must not include an index"):
        xgrad.device("cuda:0", 1)
    x = xgrad.zeros(2, device=xgrad.device("cpu", 1))
    assert x.device == jax.devices("cpu")[1] and x.device == xgrad.device("cpu:1") and x.device == xgrad.device("cpu")
    assert x.to(xgrad.device("cpu:0")).device == jax.devices("cpu")[0]
    model = xgrad.nn.Linear(2, 2, key=0).to(xgrad.device("cpu:1"))
    assert model.weight.device == jax.devices("cpu")[1]
    has_gpu = any(dev.platform == "gpu" for dev in jax.devices())
    assert xgrad.cuda.is_available() == has_gpu == xgrad.accelerator.is_available()
    assert xgrad.cuda.device_count() == (len(jax.devices("gpu")) if has_gpu else 0)
    assert xgrad.accelerator.current_accelerator() == (xgrad.device("cuda") if has_gpu else None)


def test_legacy_constructors_and_type():
    assert xgrad.Tensor(2, 3).shape == (2, 3) and xgrad.Tensor([1, 2]).dtype == jnp.float32 and xgrad.Tensor().shape == (0,)
    x = xgrad.LongTensor([1, 2])
    assert x.dtype == jnp.int64 and isinstance(x, xgrad.LongTensor) and not isinstance(x, xgrad.FloatTensor)
    assert xgrad.FloatTensor(3).shape == (3,) and xgrad.FloatTensor(3).dtype == jnp.float32
    y = xgrad.ones(2, requires_grad=True)
    assert y.type() == "torch.FloatTensor" and x.type() == "torch.LongTensor"  # PyTorch's names
    assert y.type("torch.DoubleTensor").dtype == jnp.float64 and y.type(xgrad.HalfTensor).dtype == jnp.float16
    y.type(xgrad.float64).sum().backward()
    assert y.grad.tolist() == [1.0, 1.0] and y.grad.dtype == jnp.float32
    with pytest.raises(ValueError, match="invalid type"):
        y.type("torch.NoSuchTensor")


def test_like_factories_keep_shape_dtype_and_device():
    src = xgrad.zeros(2, 3, dtype=xgrad.float16, device="cpu:1")
    for made in (xgrad.zeros_like(src), xgrad.ones_like(src), xgrad.full_like(src, 7), xgrad.empty_like(src),
                 xgrad.rand_like(src), xgrad.randn_like(src), xgrad.randint_like(src, 5)):
        assert (made.shape, made.dtype, made.device) == ((2, 3), jnp.float16, jax.devices("cpu")[1])
    assert xgrad.full_like(src, 7).tolist() == [[7.0] * 3] * 2
    assert xgrad.zeros_like(src, dtype=xgrad.long, device="cpu:0").device == jax.devices("cpu")[0]
    assert xgrad.from_numpy(np.arange(3, dtype=np.int16)).tolist() == [0, 1, 2]


def test_random_factories_ranges_and_generators():
    g = xgrad.Generator().manual_seed(7)
    a = xgrad.randint(3, 7, (200,), generator=g)
    assert a.dtype == jnp.int64 and set(a.tolist()) == {3, 4, 5, 6}
    assert xgrad.randint(5, (2, 2)).shape == (2, 2)
    assert sorted(xgrad.randperm(6, generator=g).tolist()) == list(range(6))
    # a reseeded generator repeats its draws; an advanced one does not
    first = xgrad.rand(3, generator=g.manual_seed(1)).tolist()
    assert xgrad.rand(3, generator=g.manual_seed(1)).tolist() == first != xgrad.rand(3, generator=g).tolist()
    np.testing.assert_allclose(xgrad.linspace(-1, 1, 5).numpy(), np.linspace(-1, 1, 5), rtol=1e-6)


def test_in_place_random_fills():
    xgrad.manual_seed(0)
    assert set(xgrad.zeros(100).bernoulli_(0.5).tolist()) == {0.0, 1.0}
    assert xgrad.zeros(3).bernoulli_(xgrad.tensor([0.0, 1.0, 0.0])).tolist() == [0.0, 1.0, 0.0]
    assert set(xgrad.zeros(200).random_(2, 5).tolist()) == {2.0, 3.0, 4.0}
    assert set(xgrad.zeros(200, dtype=xgrad.int64).random_(3).tolist()) == {0, 1, 2}
    e = xgrad.zeros(20000).exponential_(4.0)
    assert bool((e > 0).all()) and abs(e.mean().item() - 0.25) < 0.01  # mean 1/lambda
    x = xgrad.ones(3)
    assert x.fill_(2.5) is x and x.tolist() == [2.5] * 3 and x.zero_().tolist() == [0.0] * 3
    with pytest.raises(RuntimeError, match="expects 'from' to be less than 'to'"):
        xgrad.zeros(2).random_(5, 5)


def test_bernoulli_and_multinomial():
    xgrad.manual_seed(0)
    p = xgrad.tensor([0.0, 1.0, 0.3])
    draws = np.stack([xgrad.bernoulli(p).numpy() for _ in range(200)])
    assert (draws[:, 0] == 0).all() and (draws[:, 1] == 1).all() and 0.2 < draws[:, 2].mean() < 0.4
    weights = xgrad.tensor([[1.0, 0.0, 3.0], [0.0, 0.0, 1.0]])
    with_repl = xgrad.multinomial(weights, 1000, replacement=True)
    assert with_repl.shape == (2, 1000) and with_repl.dtype == jnp.int64
    assert set(with_repl[1].tolist()) == {2} and abs((with_repl[0] == 2).float().mean().item() - 0.75) < 0.06
    without = xgrad.multinomial(xgrad.tensor([1.0, 2.0, 3.0, 4.0]), 4)
    assert sorted(without.tolist()) == [0, 1, 2, 3]  # each index once
    assert xgrad.multinomial(weights, 2).tolist()[0] in ([0, 2], [2, 0])  # never the zero-weight category
    with pytest.raises(RuntimeError, match="cannot sample n_sample > prob_dist.size"):
        xgrad.multinomial(weights, 4)
    with pytest.raises(RuntimeError, match="element < 0"):
        xgrad.multinomial(xgrad.tensor([1.0, -1.0]), 1)


def test_jit_gives_back_and_onnx_raises():
    model = xgrad.nn.Linear(2, 1, key=0)
    assert xgrad.jit.script(model) is model and xgrad.jit.trace(model, xgrad.ones(1, 2)) is model
    with pytest.raises(RuntimeError, match="no TorchScript archives"):
        xgrad.jit.save(model, "m.pt")
    with pytest.raises(NotImplementedError, match="cannot write ONNX"):
        xgrad.onnx.export(model, (xgrad.ones(1, 2),), "m.onnx")


def test_t_transposes_matrices_with_gradients_as_jax():
    w = np.arange(6.0).reshape(2, 3)
    x = xgrad.tensor(w, requires_grad=True)
    (x.t() * xgrad.tensor(w.T)).sum().backward()
    expected = jax.grad(lambda a: (a.T * w.T).sum())(jnp.asarray(w))
    np.testing.assert_array_equal(x.grad.numpy(), expected)
    assert xgrad.tensor([1.0, 2.0]).t().shape == (2,)
    with pytest.raises(RuntimeError, match="expects a tensor with <= 2 dimensions"):
        xgrad.zeros(1, 2, 3).t()


def test_no_grad_decorator_passes_keyword_arguments():
    @xgrad.no_grad()
    def generate(x, *, temperature=1.0, top_k=None):
        return x * temperature, top_k, xgrad.is_grad_enabled()

    out, top_k, enabled = generate(xgrad.ones(1, requires_grad=True), temperature=2.0, top_k=3)
    assert out.tolist() == [2.0] and top_k == 3 and not enabled and not out.requires_grad
