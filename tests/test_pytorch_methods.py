"""The Tensor methods and functions PyTorch users reach for, beyond what the
op-spec table checks: method wiring, dtype and device conversions, non-differentiable
outputs, in-place ``masked_fill_``, ``unbind``'s one node, error cases, and values
PyTorch documents (BCE's log clamp, ``nn.Upsample``'s examples, the norm's gradient at 0).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad.testing import assert_grads_match

COMPILED = pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])


def _x(requires_grad=True):
    return xgrad.tensor(np.array([[0.5, -1.0, 2.0], [0.0, 3.0, -0.25]]), requires_grad=requires_grad)


# -- methods are the functions --------------------------------------------------------------
METHOD_CALLS = {
    "clamp_min": ((0.0,), {}), "clamp_max": ((0.0,), {}), "norm": ((), {"dim": 1}), "topk": ((2,), {}),
    "repeat": ((2, 1), {}), "repeat_interleave": ((2,), {"dim": 0}), "unbind": ((1,), {}), "narrow": ((1, 0, 2), {}),
    "select": ((1, 2), {}), "argsort": ((), {"descending": True}), "any": ((1,), {}), "all": ((), {"dim": 0}),
    "nonzero": ((), {}),
}


@pytest.mark.parametrize("name", METHOD_CALLS)
def test_method_is_the_function(name):
    args, kwargs = METHOD_CALLS[name]
    x = _x(requires_grad=False)
    by_method = getattr(x, name)(*args, **kwargs)
    by_function = getattr(xgrad, name)(x, *args, **kwargs)
    for a, b in zip(jax.tree_util.tree_leaves(by_method), jax.tree_util.tree_leaves(by_function), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_shape_methods_against_numpy():
    a = np.arange(6.0).reshape(2, 3)
    x = xgrad.tensor(a)
    assert x.contiguous() is x
    assert x.numel() == 6 and x.dim() == 2
    assert x.element_size() == 8 and x.float().element_size() == 4 and x.half().element_size() == 2
    np.testing.assert_array_equal(x.expand_as(xgrad.zeros(4, 2, 3)).detach().numpy(), np.broadcast_to(a, (4, 2, 3)))
    np.testing.assert_array_equal(x.view_as(xgrad.zeros(3, 2)).detach().numpy(), a.reshape(3, 2))
    np.testing.assert_array_equal(x.reshape_as(xgrad.zeros(6)).detach().numpy(), a.ravel())
    np.testing.assert_array_equal(x.repeat(2, 1, 2).detach().numpy(), np.tile(a, (2, 1, 2)))
    np.testing.assert_array_equal(x.repeat_interleave(xgrad.tensor([2, 0, 1]), dim=1).detach().numpy(), np.repeat(a, [2, 0, 1], axis=1))
    np.testing.assert_array_equal(x.narrow(-1, 1, 2).detach().numpy(), a[:, 1:3])
    np.testing.assert_array_equal(x.select(-1, 0).detach().numpy(), a[:, 0])
    np.testing.assert_array_equal(xgrad.outer(xgrad.tensor([1.0, 2.0]), xgrad.tensor([3.0, 4.0, 5.0])).detach().numpy(),
                                  np.outer([1.0, 2.0], [3.0, 4.0, 5.0]))


# -- dtype and device conversions -------------------------------------------------------------
@pytest.mark.parametrize(
    "method, dtype",
    [("double", jnp.float64), ("float", jnp.float32), ("half", jnp.float16), ("bfloat16", jnp.bfloat16),
     ("long", jnp.int64), ("int", jnp.int32), ("bool", jnp.bool_)],
)
def test_dtype_methods(method, dtype):
    x = xgrad.tensor(np.array([1.5, -2.0, 0.0]), requires_grad=True)
    out = getattr(x, method)()
    assert out.dtype == jnp.dtype(dtype)
    np.testing.assert_array_equal(out.detach().numpy(), np.asarray(x.detach().numpy()).astype(np.dtype(dtype)))
    if jnp.issubdtype(dtype, jnp.inexact):
        assert out.requires_grad  # x itself for double(): x is float64 already
    else:  # integer and bool results leave the graph, as in PyTorch
        assert out.grad_fn is None and not out.requires_grad


@COMPILED
def test_to_forms_are_differentiable(compiled):
    dev0, dev1 = jax.devices()[:2]
    x = xgrad.tensor(np.array([0.5, -1.0, 2.0]), device=dev0, requires_grad=True)
    outs = [
        x.to(jnp.float32), x.to(dev1, jnp.float32), x.to(dtype=jnp.float32, device=dev1), x.to("cpu:1"),
        x.to(xgrad.zeros(3, dtype=jnp.float32, device=dev1)), x.type_as(xgrad.zeros(1, dtype=jnp.float32)),
        x.to(dev1, non_blocking=True, copy=False),
    ]
    assert [o.dtype for o in outs] == [jnp.float32, jnp.float32, jnp.float32, jnp.float64, jnp.float32, jnp.float32, jnp.float64]
    assert [o.device for o in outs] == [dev0, dev1, dev1, dev1, dev1, dev0, dev1]
    # One backward per form: each gradient comes back to x's dtype and device.
    for o in outs:
        x.grad = None
        (o.to(dev0).to(jnp.float64) ** 2).sum().backward(compiled=compiled)
        assert x.grad.dtype == jnp.float64 and x.grad.device == dev0
        np.testing.assert_allclose(x.grad.detach().numpy(), 2 * x.detach().numpy(), rtol=1e-6)


def test_to_rejects_unknown_keywords():
    with pytest.raises(TypeError, match="unexpected keyword"):
        _x().to(jnp.float32, layout="strided")


def test_cpu_and_cuda():
    x = xgrad.tensor([1.0, 2.0], device=jax.devices("cpu")[1], requires_grad=True)
    assert x.cpu() is x  # already on a CPU device
    if not any(d.platform == "gpu" for d in jax.devices()):
        with pytest.raises(RuntimeError, match="No CUDA GPUs are available"):
            x.cuda()
    else:
        y = x.cuda()
        assert y.device == jax.devices("gpu")[0] and y.grad_fn is not None
        assert y.cpu().device.platform == "cpu"


def test_new_factories_follow_self():
    dev1 = jax.devices()[1]
    x = xgrad.tensor(np.array([1, 2, 3], dtype=np.int32), device=dev1)
    for t, shape, value in ((x.new_zeros(2, 2), (2, 2), 0), (x.new_ones((3,)), (3,), 1), (x.new_full((1, 2), 7), (1, 2), 7)):
        assert t.shape == shape and t.dtype == jnp.int32 and t.device == dev1 and not t.requires_grad
        assert (t.detach().numpy() == value).all()
    f = x.new_zeros(2, dtype=jnp.float32, device=jax.devices()[0], requires_grad=True)
    assert f.dtype == jnp.float32 and f.device == jax.devices()[0] and f.requires_grad and f.is_leaf
    source = xgrad.tensor([1.5, 2.5], requires_grad=True) * 2
    copied = xgrad.tensor([0.0]).new_tensor(source)
    assert copied.is_leaf and not copied.requires_grad and copied.tolist() == [3.0, 5.0]
    assert x.new_tensor([4.9, 5.1]).tolist() == [4, 5]  # self's dtype


# -- masks -------------------------------------------------------------------------------------
@COMPILED
def test_masked_fill_inplace_rebinds_and_differentiates(compiled):
    a = np.array([[0.5, -1.0, 2.0], [0.0, 3.0, -0.25]])
    leaf = xgrad.tensor(a, requires_grad=True)
    value = xgrad.tensor(4.0, requires_grad=True)
    y = leaf * 2
    version = y._version
    out = y.masked_fill_(y > 1.0, value)
    assert out is y and y._version == version + 1
    np.testing.assert_array_equal(y.detach().numpy(), np.where(2 * a > 1.0, 4.0, 2 * a))
    (y * y).sum().backward(compiled=compiled)
    np.testing.assert_allclose(leaf.grad.detach().numpy(), np.where(2 * a > 1.0, 0.0, 8 * a))
    assert value.grad.item() == pytest.approx(2 * 4.0 * (2 * a > 1.0).sum())


def test_masked_fill_errors():
    x = _x()
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        x.masked_fill_(x > 0, 0.0)
    with pytest.raises(RuntimeError, match="only supports boolean masks"):
        x.masked_fill(xgrad.ones(2, 3), 0.0)
    with pytest.raises(RuntimeError, match="0-dimensional value tensor"):
        x.masked_fill(x > 0, xgrad.ones(3))
    # Out of place x and mask broadcast together; in place the result must keep x's shape.
    assert x.masked_fill(xgrad.tensor(np.ones((4, 2, 3), bool)), 0.0).shape == (4, 2, 3)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        (x * 1).masked_fill_(xgrad.tensor(np.ones((4, 2, 3), bool)), 0.0)
    # An integer tensor keeps its dtype: the value is cast, as PyTorch does.
    ints = xgrad.tensor([1, 2, 3])
    assert ints.masked_fill(ints > 1, 7.9).tolist() == [1, 7, 7]


@COMPILED
def test_masked_select_scatters_the_gradient_back(compiled):
    x = _x()
    mask = np.array([True, False, True])  # broadcast over the rows
    picked = x.masked_select(xgrad.tensor(mask))
    assert picked.tolist() == [0.5, 2.0, 0.0, -0.25]
    (picked * xgrad.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward(compiled=compiled)
    assert x.grad.tolist() == [[1.0, 0.0, 2.0], [3.0, 0.0, 4.0]]


def test_nonzero_any_all_argsort_are_non_differentiable():
    a = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]])
    x = xgrad.tensor(a, requires_grad=True)
    np.testing.assert_array_equal(x.nonzero().detach().numpy(), np.stack(np.nonzero(a), axis=1))
    for got, want in zip(x.nonzero(as_tuple=True), np.nonzero(a), strict=True):
        np.testing.assert_array_equal(got.detach().numpy(), want)
    assert x.nonzero().dtype == jnp.int64
    np.testing.assert_array_equal(x.any(dim=1, keepdim=True).detach().numpy(), np.any(a != 0, axis=1, keepdims=True))
    np.testing.assert_array_equal(x.all(dim=0).detach().numpy(), np.all(a != 0, axis=0))
    assert x.any().item() is True and x.all().item() is False
    # A 0-dim input, as PyTorch: one row per non-zero scalar and no columns; as_tuple sees a 1-element vector.
    assert xgrad.nonzero(xgrad.tensor(3.0)).shape == (1, 0) and xgrad.nonzero(xgrad.tensor(0.0)).shape == (0, 0)
    assert [t.tolist() for t in xgrad.nonzero(xgrad.tensor(3.0), as_tuple=True)] == [[0]]
    for out in (x.nonzero(), x.any(), x.all(), x.argsort()):
        assert out.grad_fn is None and not out.requires_grad


def test_argsort_and_topk_keep_tie_order():
    values = [2.0, 1.0, 2.0, 3.0, 1.0]
    x = xgrad.tensor(values)
    # Python's sort is stable: the reference order of equal keys is their index order.
    assert x.argsort().tolist() == sorted(range(5), key=lambda i: values[i])
    assert x.argsort(descending=True, stable=True).tolist() == sorted(range(5), key=lambda i: -values[i])
    top = x.topk(3)
    assert top.values.tolist() == [3.0, 2.0, 2.0] and top.indices.tolist() == [3, 0, 2]
    low = x.topk(2, largest=False)
    assert low.values.tolist() == [1.0, 1.0] and low.indices.tolist() == [1, 4]
    with pytest.raises(RuntimeError, match="selected index k out of range"):
        x.topk(6)


@COMPILED
def test_topk_gradient_reaches_the_picked_elements(compiled):
    x = xgrad.tensor(np.array([[0.1, 0.9, 0.5], [0.7, 0.2, 0.3]]), requires_grad=True)
    values, indices = x.topk(2, dim=1)
    assert indices.tolist() == [[1, 2], [0, 2]] and indices.grad_fn is None
    (values * xgrad.tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward(compiled=compiled)
    assert x.grad.tolist() == [[0.0, 1.0, 2.0], [3.0, 0.0, 4.0]]


# -- one_hot ----------------------------------------------------------------------------------
def test_one_hot():
    labels = np.array([[0, 2], [1, 0]])
    out = xgrad.one_hot(xgrad.tensor(labels))
    assert out.dtype == jnp.int64 and out.shape == (2, 2, 3) and out.grad_fn is None
    np.testing.assert_array_equal(out.detach().numpy(), np.eye(3, dtype=np.int64)[labels])
    assert xgrad.one_hot(xgrad.tensor([1]), num_classes=4).tolist() == [[0, 1, 0, 0]]
    with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes"):
        xgrad.one_hot(xgrad.tensor([0, 3]), num_classes=3)
    with pytest.raises(RuntimeError, match="Class values must be non-negative"):
        xgrad.one_hot(xgrad.tensor([-1, 0]))
    with pytest.raises(RuntimeError, match="index tensor"):
        xgrad.one_hot(xgrad.tensor([0.0, 1.0]))


# -- norm and normalize -----------------------------------------------------------------------
@COMPILED
def test_norm_gradient_at_zero_is_zero(compiled):
    """PyTorch defines the 2-norm's gradient at the zero vector as 0 (a subgradient), not NaN."""
    x = xgrad.tensor(np.array([[0.0, 0.0, 0.0], [3.0, 0.0, 4.0]]), requires_grad=True)
    (x.norm(dim=1) * xgrad.tensor([1.0, 2.0])).sum().backward(compiled=compiled)
    np.testing.assert_allclose(x.grad.detach().numpy(), [[0.0, 0.0, 0.0], [1.2, 0.0, 1.6]])
    z = xgrad.zeros(3, dtype=jnp.float64, requires_grad=True)
    (g,) = xgrad.autograd.grad(z.norm(), z, create_graph=True, compiled=compiled)
    assert g.tolist() == [0.0, 0.0, 0.0]
    (g2,) = xgrad.autograd.grad(g.sum(), z, compiled=compiled)
    assert np.isfinite(g2.detach().numpy()).all()


def test_norm_values_against_numpy():
    a = np.array([[1.0, -2.0, 0.0], [3.0, 0.5, -4.0]])
    x = xgrad.tensor(a)
    for p, dim in ((2, None), ("fro", (0, 1)), (1, 1), (math.inf, 0), (-math.inf, 1), (0, 1), (3, 1)):
        np.testing.assert_allclose(x.norm(p, dim).detach().numpy(), np.linalg.norm(a if dim is not None else a.ravel(), ord=p, axis=dim)
                                   if p != "fro" else np.linalg.norm(a), rtol=1e-12)
    with pytest.raises(NotImplementedError):
        x.norm("nuc")


def test_normalize_keeps_zero_rows_zero():
    x = xgrad.tensor(np.array([[0.0, 0.0], [3.0, 4.0]]), requires_grad=True)
    out = xgrad.normalize(x)
    assert out.tolist() == [[0.0, 0.0], [0.6, 0.8]]
    out.sum().backward()
    assert np.isfinite(x.grad.detach().numpy()).all()


# -- unbind: one node, n outputs ----------------------------------------------------------------
@COMPILED
def test_unbind_is_one_node_with_an_output_per_slice(compiled):
    x = xgrad.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    parts = x.unbind(1)
    assert len(parts) == 3
    node = parts[0].grad_fn
    assert node.name() == "UnbindBackward"
    assert all(p.grad_fn is node for p in parts) and [p.output_nr for p in parts] == [0, 1, 2]
    assert node.next_functions[0][0].variable is x  # straight to the leaf: no index nodes in between
    # Only the middle slice used: the others get zeros in the stacked gradient.
    (parts[1] * xgrad.tensor([2.0, 3.0])).sum().backward(compiled=compiled)
    assert x.grad.tolist() == [[0.0, 2.0, 0.0], [0.0, 3.0, 0.0]]


@COMPILED
def test_unbind_slices_are_views_that_write_through(compiled):
    leaf = xgrad.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    x = leaf * 1.0
    first, second = x.unbind(0)
    # As PyTorch: the outputs of a multi-view op may not be modified in place while grad is on ...
    with pytest.raises(RuntimeError, match="Output 1 of UnbindBackward is a view and is being modified inplace"):
        second.mul_(10.0)
    # ... and under no_grad the write goes through to the base and the sibling slice.
    with xgrad.no_grad():
        second.mul_(10.0)
    assert x.tolist() == [[0.0, 1.0, 2.0], [30.0, 40.0, 50.0]]
    assert first._version == x._version  # the sibling slice sees the new base too
    (x * x).sum().backward(compiled=compiled)
    np.testing.assert_allclose(leaf.grad.detach().numpy(), [[0.0, 2.0, 4.0], [60.0, 80.0, 100.0]])


def test_unbind_second_order_against_jax():
    assert_grads_match(lambda t: [p.sin() * p for p in t.unbind(0)], np.linspace(-1, 1, 6).reshape(3, 2),
                       reference=lambda a: [jnp.sin(p) * p for p in a], modes=("eager", "compiled", "jax"), order=2)


# -- shape errors -------------------------------------------------------------------------------
def test_shape_op_errors():
    x = _x()
    with pytest.raises(RuntimeError, match="Number of dimensions of repeat dims"):
        x.repeat(2)
    with pytest.raises(RuntimeError, match="exceeds dimension size"):
        x.narrow(1, 2, 2)
    with pytest.raises(IndexError, match="out of range"):
        x.select(0, 2)
    with pytest.raises(IndexError, match="Dimension out of range"):
        x.unbind(2)
    with pytest.raises(RuntimeError, match="repeats must have the same size"):
        x.repeat_interleave(xgrad.tensor([1, 2]), dim=1)
    with pytest.raises(RuntimeError, match="batch1 must be a 3D tensor"):
        xgrad.bmm(x, x)
    with pytest.raises(RuntimeError, match="Expected size for first two dimensions of batch2"):
        xgrad.bmm(xgrad.zeros(2, 3, 4), xgrad.zeros(2, 3, 4))
    with pytest.raises(RuntimeError, match="outer: Expected 1-D"):
        xgrad.outer(x, x)


def test_baddbmm_with_beta_zero_ignores_nan_input():
    nan_input = xgrad.tensor(np.full((1, 2, 2), np.nan), requires_grad=True)
    b1 = xgrad.tensor(np.ones((1, 2, 3)), requires_grad=True)
    out = xgrad.baddbmm(nan_input, b1, xgrad.tensor(np.ones((1, 3, 2))), beta=0.0, alpha=0.5)
    assert out.tolist() == [[[1.5, 1.5], [1.5, 1.5]]]
    out.sum().backward()
    assert nan_input.grad.tolist() == [[[0.0, 0.0], [0.0, 0.0]]]
    np.testing.assert_allclose(b1.grad.detach().numpy(), np.full((1, 2, 3), 1.0))


def test_linear_with_a_vector_weight():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert_grads_match(lambda a, w: xgrad.linear(a, w), x, np.array([0.5, -1.0]), reference=lambda a, w: a @ w,
                       modes=("eager", "jax"))


# -- losses -----------------------------------------------------------------------------------
def test_binary_cross_entropy_clamps_log_at_minus_100():
    """PyTorch: "BCELoss clamps its log function outputs to be greater than or equal to -100"."""
    x = xgrad.tensor(np.array([0.0, 1.0, 0.0, 1.0]), requires_grad=True)
    target = xgrad.tensor(np.array([1.0, 0.0, 0.0, 1.0]))
    loss = xgrad.binary_cross_entropy(x, target, reduction="none")
    assert loss.tolist() == [100.0, 100.0, 0.0, 0.0]
    loss.sum().backward()
    # PyTorch's rule: (x - t) / max(x (1 - x), 1e-12): finite at the ends.
    np.testing.assert_allclose(x.grad.detach().numpy(), [-1e12, 1e12, 0.0, 0.0])


def test_binary_cross_entropy_checks():
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        xgrad.binary_cross_entropy(xgrad.tensor([1.5]), xgrad.tensor([1.0]))
    with pytest.raises(ValueError, match="different to the input size"):
        xgrad.binary_cross_entropy(xgrad.tensor([0.5, 0.5]), xgrad.tensor([[1.0, 0.0]]))
    with pytest.raises(ValueError, match="is not a valid value for reduction"):
        xgrad.binary_cross_entropy(xgrad.tensor([0.5]), xgrad.tensor([1.0]), reduction="avg")


def test_binary_cross_entropy_with_logits_is_stable_for_large_logits():
    x = xgrad.tensor(np.array([1000.0, -1000.0, 30.0]), requires_grad=True)
    loss = xgrad.binary_cross_entropy_with_logits(x, xgrad.tensor([0.0, 1.0, 1.0]), reduction="none")
    np.testing.assert_allclose(loss.detach().numpy(), [1000.0, 1000.0, math.log1p(math.exp(-30.0))], rtol=1e-12)
    loss.sum().backward()
    np.testing.assert_allclose(x.grad.detach().numpy(), [1.0, -1.0, -1 / (1 + math.exp(30.0))], rtol=1e-9)


def test_nll_loss_ignore_index_and_errors():
    logp = xgrad.tensor(np.log(np.array([[0.2, 0.8], [0.6, 0.4]])), requires_grad=True)
    all_ignored = xgrad.nll_loss(logp, xgrad.tensor([-100, -100]))
    assert math.isnan(all_ignored.item())  # 0 / 0, as PyTorch's mean over no target
    loss = xgrad.nll_loss(logp, xgrad.tensor([1, 5]), ignore_index=5)
    assert loss.item() == pytest.approx(-math.log(0.8))
    loss.backward()
    assert logp.grad.tolist() == [[0.0, -1.0], [0.0, 0.0]]
    with pytest.raises(IndexError, match="Target 2 is out of bounds"):
        xgrad.nll_loss(logp, xgrad.tensor([0, 2]))
    with pytest.raises(ValueError, match="Expected input batch_size"):
        xgrad.nll_loss(logp, xgrad.tensor([0, 1, 1]))
    with pytest.raises(RuntimeError, match="expected scalar type Long"):
        xgrad.nll_loss(logp, xgrad.tensor([0.0, 1.0]))


def test_nll_loss_of_one_sample():
    logp = xgrad.tensor(np.array([-0.5, -1.25, -3.0]), requires_grad=True)
    loss = xgrad.nll_loss(logp, xgrad.tensor(1))
    assert loss.shape == () and loss.item() == 1.25
    loss.backward()
    assert logp.grad.tolist() == [0.0, -1.0, 0.0]


def test_nll_loss_of_log_softmax_is_cross_entropy():
    logits = np.array([[0.3, -1.0, 2.0], [1.0, 0.0, 0.5]])
    target = xgrad.tensor([2, 0])
    via_nll = xgrad.nll_loss(xgrad.log_softmax(xgrad.tensor(logits), dim=1), target)
    assert via_nll.item() == pytest.approx(xgrad.cross_entropy(xgrad.tensor(logits), target).item(), rel=1e-12)


# -- scaled_dot_product_attention ---------------------------------------------------------------
def _qkv(seed=0, heads=2):
    rng = np.random.default_rng(seed)
    return [xgrad.tensor(rng.standard_normal(s), requires_grad=True) for s in ((heads, 3, 4), (heads, 5, 4), (heads, 5, 2))]


def test_sdpa_is_one_node_straight_to_its_inputs():
    q, k, v = _qkv()
    out = xgrad.scaled_dot_product_attention(q, k, v, attn_mask=xgrad.tensor(np.tril(np.ones((3, 5), bool))))
    assert out.grad_fn.name() == "ScaledDotProductAttentionBackward"
    assert [n.variable for n, _ in out.grad_fn.next_functions[:3]] == [q, k, v]


def test_sdpa_create_graph_compiled_and_eager_against_jax():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 4, 4)), rng.standard_normal((2, 4, 3))

    def reference(q, k, v):
        probs = jax.nn.softmax(jnp.where(np.tril(np.ones((3, 4), bool)), q @ jnp.swapaxes(k, -1, -2) / 2.0, -jnp.inf))
        return probs @ v

    assert_grads_match(lambda q, k, v: xgrad.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v,
                       reference=reference, modes=("eager", "compiled", "jax"), order=2)


def test_sdpa_grouped_query_attention_is_repeated_heads():
    q, _, _ = _qkv(heads=4)
    _, k, v = _qkv(seed=1, heads=2)
    grouped = xgrad.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    explicit = xgrad.scaled_dot_product_attention(q, k.repeat_interleave(2, dim=0), v.repeat_interleave(2, dim=0))
    np.testing.assert_allclose(grouped.detach().numpy(), explicit.detach().numpy(), rtol=1e-12)


def test_sdpa_dropout_uses_a_key():
    q, k, v = _qkv()
    key = jax.random.PRNGKey(11)
    a = xgrad.scaled_dot_product_attention(q, k, v, dropout_p=0.5, dropout_key=key)
    b = xgrad.scaled_dot_product_attention(q, k, v, dropout_p=0.5, dropout_key=key)
    np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    xgrad.manual_seed(0)
    c = xgrad.scaled_dot_product_attention(q, k, v, dropout_p=0.5)  # the module default key, as xgrad.dropout
    assert not np.allclose(a.detach().numpy(), c.detach().numpy())
    np.testing.assert_allclose(xgrad.scaled_dot_product_attention(q, k, v, dropout_p=1.0).detach().numpy(), 0.0)


def test_sdpa_errors():
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when is_causal=True"):
        xgrad.scaled_dot_product_attention(q, k, v, attn_mask=xgrad.ones(3, 5), is_causal=True)
    with pytest.raises(ValueError, match="dropout probability"):
        xgrad.scaled_dot_product_attention(q, k, v, dropout_p=1.5)
    with pytest.raises(RuntimeError, match="same dtype"):
        xgrad.scaled_dot_product_attention(q, k.float(), v)


# -- interpolate --------------------------------------------------------------------------------
# The examples of PyTorch's ``nn.Upsample`` documentation, written out.
_UPSAMPLE_IN = np.array([[[[1.0, 2.0], [3.0, 4.0]]]])
_UPSAMPLE_DOC = {
    ("nearest", None): [[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]],
    ("bilinear", False): [[1.0, 1.25, 1.75, 2.0], [1.5, 1.75, 2.25, 2.5], [2.5, 2.75, 3.25, 3.5], [3.0, 3.25, 3.75, 4.0]],
    ("bilinear", True): [[1.0, 4 / 3, 5 / 3, 2.0], [5 / 3, 2.0, 7 / 3, 8 / 3], [7 / 3, 8 / 3, 3.0, 10 / 3], [3.0, 10 / 3, 11 / 3, 4.0]],
}


@pytest.mark.parametrize("mode, align_corners", list(_UPSAMPLE_DOC))
def test_interpolate_matches_pytorch_upsample_docs(mode, align_corners):
    out = xgrad.interpolate(xgrad.tensor(_UPSAMPLE_IN), scale_factor=2, mode=mode, align_corners=align_corners)
    np.testing.assert_allclose(out.detach().numpy()[0, 0], _UPSAMPLE_DOC[mode, align_corners], rtol=1e-12)


def test_interpolate_bilinear_3x3_matches_pytorch_docs():
    x = np.zeros((1, 1, 3, 3))
    x[0, 0, :2, :2] = _UPSAMPLE_IN[0, 0]
    out = xgrad.interpolate(xgrad.tensor(x), scale_factor=2, mode="bilinear").detach().numpy()[0, 0]
    np.testing.assert_allclose(out[:, :5], [
        [1.0, 1.25, 1.75, 1.5, 0.5], [1.5, 1.75, 2.25, 1.875, 0.625], [2.5, 2.75, 3.25, 2.625, 0.875],
        [2.25, 2.4375, 2.8125, 2.25, 0.75], [0.75, 0.8125, 0.9375, 0.75, 0.25], [0.0] * 5], rtol=1e-12)
    aligned = xgrad.interpolate(xgrad.tensor(x), scale_factor=2, mode="bilinear", align_corners=True).detach().numpy()[0, 0]
    np.testing.assert_allclose(aligned[:3, :5], [
        [1.0, 1.4, 1.8, 1.6, 0.8], [1.8, 2.2, 2.6, 2.24, 1.12], [2.6, 3.0, 3.4, 2.88, 1.44]], rtol=1e-12)


def test_interpolate_bilinear_upsampling_agrees_with_jax_image_resize():
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5))
    out = xgrad.interpolate(xgrad.tensor(x), size=(7, 9), mode="bilinear")
    np.testing.assert_allclose(out.detach().numpy(), jax.image.resize(x, (2, 3, 7, 9), "bilinear"), rtol=1e-10, atol=1e-12)


def test_interpolate_errors():
    x = xgrad.tensor(_UPSAMPLE_IN)
    with pytest.raises(ValueError, match="only one of size or scale_factor"):
        xgrad.interpolate(x, size=4, scale_factor=2)
    with pytest.raises(ValueError, match="either size or scale_factor"):
        xgrad.interpolate(x)
    with pytest.raises(ValueError, match="align_corners option can only be set with the interpolating modes"):
        xgrad.interpolate(x, scale_factor=2, align_corners=True)
    with pytest.raises(NotImplementedError, match="bicubic"):
        xgrad.interpolate(x, scale_factor=2, mode="bicubic")
    with pytest.raises(NotImplementedError, match="linear mode needs 3D input"):
        xgrad.interpolate(x, scale_factor=2, mode="linear")


# -- dtypes ------------------------------------------------------------------------------------
FLOAT32_OPS = ["norm2", "nll_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "scaled_dot_product_attention",
               "interpolate", "normalize", "unbind", "topk", "baddbmm", "repeat_interleave"]


@pytest.mark.parametrize("name", FLOAT32_OPS)
def test_float32_in_float32_out(name):
    """Forward values and gradients keep float32 (assert_grads_match also compares dtypes with jnp's)."""
    from xgrad.testing.op_specs import specs_for

    spec = specs_for(name)[-1]  # the last spec of each: the one with the most options
    inputs = [x.astype(np.float32) if np.issubdtype(x.dtype, np.floating) else x for x in spec.sample(np.random.default_rng(0), 0)]
    assert_grads_match(spec.op, *inputs, reference=spec.ref, modes=("eager", "jax"), atol=1e-5, rtol=1e-4)


def test_format_of_a_zero_dim_tensor_is_its_numbers():
    assert f"{xgrad.tensor(2.5):.3f}" == "2.500" and f"{xgrad.tensor([1.25, 2.0])[0]:+.2f}" == "+1.25"
    with pytest.raises(TypeError):
        f"{xgrad.tensor([1.0, 2.0]):.2f}"


@pytest.mark.parametrize("a, b, message", [
    ((2, 3), (2, 3), r"^mat1 and mat2 shapes cannot be multiplied \(2x3 and 2x3\)$"),
    ((3,), (3, 2), "^self must be a matrix$"),
    ((2, 3), (3,), "^mat2 must be a matrix$"),
])
def test_mm_takes_matrices_only(a, b, message):
    with pytest.raises(RuntimeError, match=message):
        xgrad.mm(xgrad.ones(*a), xgrad.ones(*b))
