"""Tensor: attributes, conversion, pytree, factories, in-place versioning, dtypes, devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad import autograd


@pytest.fixture
def cpu1():
    return jax.devices("cpu")[1]


# -- attributes and conversion -----------------------------------------------------------


def test_attributes_come_from_the_array():
    array = jnp.arange(6.0).reshape(2, 3)
    t = xgrad.tensor(array, requires_grad=True)
    assert t.array is array  # jax.Array in: no copy
    assert t.shape == (2, 3) and t.ndim == 2 and t.dim() == 2 and t.numel() == 6 and len(t) == 2
    assert t.size() == (2, 3) and t.size(1) == 3
    assert t.dtype == jnp.float64
    assert isinstance(t.device, jax.Device) and t.device == jax.devices("cpu")[0]
    assert t.sharding == array.sharding
    assert t.requires_grad and t.is_leaf and t.grad is None and t.grad_fn is None
    assert not t.retains_grad and t._version == 0


def test_conversions():
    t = xgrad.tensor([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(t.detach().numpy(), np.array([[1.0, 2.0], [3.0, 4.0]]))
    assert t.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert xgrad.tensor(2.5).item() == 2.5 and float(xgrad.tensor(2.5)) == 2.5 and int(xgrad.tensor(3)) == 3
    np.testing.assert_array_equal(np.asarray(t, dtype=np.float32), np.array([[1, 2], [3, 4]], np.float32))
    with pytest.raises(TypeError, match="0-d"):
        len(xgrad.tensor(1.0))


def test_iteration_yields_rows_and_ends():
    # JAX indexing clamps out-of-range indices: iteration must not rely on IndexError.
    x = xgrad.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], requires_grad=True)
    rows = list(x)
    assert [r.tolist() for r in rows] == x.tolist()
    sum(r.sum() * (i + 1) for i, r in enumerate(rows)).backward()
    assert x.grad.tolist() == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    with pytest.raises(TypeError, match="0-d"):
        iter(xgrad.tensor(1.0))


def test_jax_array_protocol_gives_the_value_of_a_tensor_outside_the_graph():
    x = xgrad.tensor([0.5, 1.5], requires_grad=True)
    for value in (x.detach(), xgrad.tensor([0.5, 1.5])):
        out = jnp.sin(value)
        assert isinstance(out, jax.Array)
        np.testing.assert_allclose(out, np.sin([0.5, 1.5]))
    with xgrad.no_grad():
        np.testing.assert_allclose(jnp.sin(x), np.sin([0.5, 1.5]))
    assert x.grad is None


def test_detach_shares_array_and_leaves_the_graph():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    d = y.detach()
    assert d.array is y.array and d.is_leaf and not d.requires_grad
    assert y.data.array is y.array and not y.data.requires_grad
    y.detach_()
    assert y.is_leaf and not y.requires_grad


def test_repr_shows_values_grad_fn_and_requires_grad():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)  # Python floats: float32, as PyTorch's default
    assert repr(x) == "tensor([1., 2.], requires_grad=True)"
    assert repr(x * x) == "tensor([1., 4.], grad_fn=<MulBackward>)"
    assert repr(xgrad.tensor(np.array([1.0]))) == "tensor([1.], dtype=float64)"
    assert repr(xgrad.tensor([1, 2], dtype=jnp.int32)) == "tensor([1, 2])"
    assert repr(xgrad.tensor(3.0, dtype=jnp.float32)) == "tensor(3.)"


# -- pytree ---------------------------------------------------------------------------------


def test_tensor_is_a_pytree(cpu1):
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    (leaf,) = jax.tree_util.tree_leaves(x)
    assert leaf is x.array
    doubled = jax.tree.map(lambda a: a * 2, {"w": x})
    assert isinstance(doubled["w"], xgrad.Tensor) and doubled["w"].tolist() == [2.0, 4.0]
    assert doubled["w"].requires_grad and doubled["w"].is_leaf
    moved = jax.device_put(x, cpu1)
    assert isinstance(moved, xgrad.Tensor) and moved.device == cpu1
    assert float(jax.jit(lambda t: jnp.sum(t * 3))(x)) == 9.0


# -- factories --------------------------------------------------------------------------------


def test_tensor_from_each_source():
    assert xgrad.tensor([1, 2]).dtype == jnp.int64
    assert xgrad.tensor(3.0).shape == ()
    assert xgrad.tensor(np.arange(3, dtype=np.float32)).dtype == jnp.float32
    src = xgrad.tensor([1.0, 2.0], requires_grad=True)
    copy = xgrad.tensor(src)
    assert copy.array is src.array and copy.is_leaf and not copy.requires_grad
    assert xgrad.tensor([1, 2], dtype=jnp.float32).dtype == jnp.float32
    a = jnp.ones(2)
    assert xgrad.tensor(a, dtype=jnp.float32).dtype == jnp.float32


def test_shape_factories():
    assert xgrad.zeros(2, 3).tolist() == np.zeros((2, 3)).tolist()
    assert xgrad.zeros((2, 3)).shape == (2, 3) and xgrad.zeros(2).dtype == jnp.float32
    assert xgrad.ones([2]).tolist() == [1.0, 1.0]
    assert xgrad.full((2,), 7.0).tolist() == [7.0, 7.0] and xgrad.full(3, 1).shape == (3,)
    assert xgrad.arange(4).tolist() == [0, 1, 2, 3] and xgrad.arange(1, 6, 2).tolist() == [1, 3, 5]
    np.testing.assert_array_equal(xgrad.eye(2, 3).detach().numpy(), np.eye(2, 3))
    z = xgrad.zeros(2, dtype=jnp.float64, requires_grad=True)
    assert z.requires_grad and z.dtype == jnp.float64


def test_like_factories_keep_shape_dtype_and_device(cpu1):
    t = xgrad.tensor([[1.0, 2.0]], dtype=jnp.float32, device=cpu1)
    for like in (xgrad.zeros_like(t), xgrad.ones_like(t)):
        assert like.shape == (1, 2) and like.dtype == jnp.float32 and like.device == cpu1
    assert xgrad.ones_like(t).tolist() == [[1.0, 1.0]] and xgrad.zeros_like(t, dtype=jnp.int32).dtype == jnp.int32


def test_random_factories_take_a_key_or_the_seeded_default():
    key = jax.random.key(3)
    np.testing.assert_array_equal(xgrad.randn(2, 3, key=key).detach().numpy(), jax.random.normal(key, (2, 3), jnp.float32))
    np.testing.assert_array_equal(xgrad.rand((4,), key=key).detach().numpy(), jax.random.uniform(key, (4,), jnp.float32))
    xgrad.manual_seed(11)
    first = (xgrad.randn(3).tolist(), xgrad.rand(3).tolist())
    xgrad.manual_seed(11)
    assert (xgrad.randn(3).tolist(), xgrad.rand(3).tolist()) == first
    assert xgrad.randn(3).tolist() != first[0]  # the default key moves on
    u = xgrad.rand(1000, key=key)
    assert 0.0 <= float(u.array.min()) and float(u.array.max()) < 1.0


def test_device_names_resolve(cpu1):
    assert xgrad.tensor([1.0], device="cpu:1").device == cpu1
    assert xgrad.zeros(2, device=cpu1).device == cpu1
    with pytest.raises(RuntimeError, match="does not exist"):
        xgrad.tensor([1.0], device="cpu:7")
    with pytest.raises(TypeError, match="device must be"):
        xgrad.tensor([1.0], device=3)


# -- dtypes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.int64, jnp.bool_, jnp.uint8])
def test_integer_and_bool_tensors_never_require_grad(dtype):
    with pytest.raises(RuntimeError, match="Only Tensors of floating point and complex dtype can require gradients"):
        xgrad.zeros(2, dtype=dtype, requires_grad=True)
    t = xgrad.zeros(2, dtype=dtype)
    with pytest.raises(RuntimeError, match=f"got {jnp.dtype(dtype)}"):
        t.requires_grad_()
    with pytest.raises(RuntimeError, match="floating point"):
        t.requires_grad = True
    assert not t.requires_grad


def test_non_differentiable_results_do_not_require_grad():
    x = xgrad.tensor([1.0, 3.0, 2.0], requires_grad=True)
    assert not (x > 1.5).requires_grad and not x.argmax().requires_grad
    assert not x.astype(jnp.int32).requires_grad


def test_requires_grad_flags_of_non_leaves():
    x = xgrad.tensor([1.0], requires_grad=True)
    y = x * 2
    assert y.requires_grad_() is y
    with pytest.raises(RuntimeError, match="you can only change requires_grad flags of leaf variables"):
        y.requires_grad_(False)


# -- in-place ops and versions -------------------------------------------------------------------


def test_inplace_ops_bump_version_and_rebind_storage():
    t = xgrad.tensor([1.0, 2.0])
    before = t.array
    t.add_(1)
    assert t.tolist() == [2.0, 3.0] and t._version == 1 and t.array is not before
    t.mul_(2)
    t += 1
    t.zero_()
    t.fill_(4.0)
    t.copy_(xgrad.tensor([5.0, 6.0]))
    t[0] = -1.0
    assert t.tolist() == [-1.0, 6.0] and t._version == 7


def test_inplace_on_a_non_leaf_is_differentiable():
    x = xgrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1
    y.mul_(x)  # y = x * x
    y[0] = 10.0  # the first element no longer depends on x
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 4.0, 6.0])


def test_inplace_records_onto_a_tensor_that_did_not_require_grad():
    w = xgrad.tensor([2.0, 3.0], requires_grad=True)
    acc = xgrad.zeros(2, dtype=jnp.float64)
    acc.add_(w * w)
    assert acc.grad_fn is not None and not acc.is_leaf
    acc.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [4.0, 6.0])


def test_modified_saved_tensor_raises_naming_the_node():
    x = xgrad.tensor([1.0, 2.0], dtype=jnp.float64, requires_grad=True)
    y = x * 1
    z = (y * y).sum()
    y.add_(1)
    with pytest.raises(
        RuntimeError,
        match=r"one of the variables needed for gradient computation has been modified by an inplace operation: "
        r"\[float64 \[2\]\], which is output 0 of AddBackward, is at version 1; expected version 0 instead "
        r"\(saved by MulBackward\)",
    ):
        z.backward()


def test_modified_saved_output_raises():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    e = x.exp()  # ExpBackward saves its output
    z = e.sum()
    e.mul_(2)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation.*saved by ExpBackward"):
        z.backward()


def test_inplace_on_a_leaf_that_requires_grad():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    for inplace in (lambda: x.add_(1), lambda: x.zero_(), lambda: x.__setitem__(0, 3.0), lambda: x.copy_(x)):
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place operation"):
            inplace()
    assert x._version == 0 and x.tolist() == [1.0, 2.0]
    y = (x * x).sum()
    with xgrad.no_grad():
        x[0] = 5.0  # allowed under no_grad (an optimizer step), but the graph saw the old value
    assert x.tolist() == [5.0, 2.0] and x._version == 1 and x.is_leaf and x.requires_grad
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [10.0, 4.0])


def test_inplace_shape_mismatch():
    t = xgrad.tensor([1.0, 2.0])
    with pytest.raises(RuntimeError, match=r"output with shape \[2\] doesn't match the broadcast shape \[2, 2\]"):
        t.add_(xgrad.ones(2, 2, dtype=jnp.float64))


# -- .grad assignment ---------------------------------------------------------------------------


def test_grad_assignment_is_validated(cpu1):
    x = xgrad.tensor([1.0, 2.0], dtype=jnp.float64, requires_grad=True)
    x.grad = xgrad.tensor([3.0, 4.0], dtype=jnp.float64)
    (x * 2).sum().backward()
    assert x.grad.tolist() == [5.0, 6.0]
    with pytest.raises(TypeError, match="assigned grad expected to be a Tensor or None but got grad of type list"):
        x.grad = [1.0, 2.0]
    with pytest.raises(RuntimeError, match="assigned grad has data of a different size"):
        x.grad = xgrad.tensor([1.0], dtype=jnp.float64)
    with pytest.raises(RuntimeError, match="assigned grad has data of a different type"):
        x.grad = xgrad.tensor([1.0, 2.0], dtype=jnp.float32)
    with pytest.raises(RuntimeError, match="assigned grad has data located on a different device"):
        x.grad = xgrad.tensor([1.0, 2.0], dtype=jnp.float64, device=cpu1)
    x.grad = None
    assert x.grad is None


# -- devices --------------------------------------------------------------------------------------


def test_mixing_devices_raises_naming_both(cpu1):
    a = xgrad.tensor([1.0, 2.0], requires_grad=True)
    b = xgrad.tensor([1.0, 2.0], device=cpu1, requires_grad=True)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*cpu:0 and cpu:1"):
        a + b


def test_to_device_is_differentiable(cpu1):
    a = xgrad.tensor([1.0, 2.0], requires_grad=True)
    b = xgrad.tensor([3.0, 4.0], device=cpu1, requires_grad=True)
    moved = a.to(cpu1)
    assert moved.device == cpu1 and moved.grad_fn.name() == "ToDeviceBackward"
    (moved * b).sum().backward()
    assert a.grad.device == a.device and a.grad.tolist() == [3.0, 4.0]
    assert b.grad.device == cpu1 and b.grad.tolist() == [1.0, 2.0]
    assert a.to("cpu:0") is a


def test_to_dtype_is_differentiable_and_grad_keeps_leaf_dtype():
    x = xgrad.tensor([1.0, 2.0], dtype=jnp.float32, requires_grad=True)
    y = x.to(jnp.float64)
    assert y.dtype == jnp.float64 and x.to(jnp.float32) is x
    (y * y).sum().backward()
    assert x.grad.dtype == jnp.float32 and x.grad.tolist() == [2.0, 4.0]
    (g,) = autograd.grad(x.double().sum(), x)
    assert g.dtype == jnp.float32


def test_clone_is_differentiable_and_independent():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    c = x.clone()
    assert c.grad_fn.name() == "CloneBackward"
    c.mul_(3)
    assert x.tolist() == [1.0, 2.0]
    c.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


def test_retain_grad_follows_inplace_and_tensor_hooks_stay_with_the_old_value():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.retain_grad()
    seen = []
    y.register_hook(lambda g: seen.append(g.tolist()))
    y.mul_(3)
    (y * xgrad.tensor([1.0, 10.0])).sum().backward()
    assert y.grad.tolist() == [1.0, 10.0]  # the gradient of the latest value, counted once
    assert seen == [[3.0, 30.0]]  # the hook saw the gradient of the value before mul_
    assert x.grad.tolist() == [6.0, 60.0]


# -- operators -------------------------------------------------------------------------------------

A = np.array([[0.5, 1.5], [2.0, 0.25]])
B = np.array([[1.25, -0.5], [0.75, 2.0]])
OPERATORS = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "truediv": lambda a, b: a / b, "pow": lambda a, b: a ** b, "matmul": lambda a, b: a @ b,
}


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_binary_operators_match_jax(name):
    op = OPERATORS[name]
    a = xgrad.tensor(A, requires_grad=True)
    b = xgrad.tensor(B, requires_grad=True)
    out = op(a, b)
    cotangent = np.array([[1.0, -2.0], [0.5, 3.0]])
    out.backward(cotangent)
    expected, vjp = jax.vjp(op, jnp.asarray(A), jnp.asarray(B))
    ga, gb = vjp(jnp.asarray(cotangent))
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(a.grad.numpy(), ga, rtol=1e-12)
    np.testing.assert_allclose(b.grad.numpy(), gb, rtol=1e-12)


@pytest.mark.parametrize("name", sorted(set(OPERATORS) - {"matmul"}))
def test_operators_with_scalars_and_arrays_on_either_side(name):
    op = OPERATORS[name]
    a = xgrad.tensor(A, requires_grad=True)
    # A jax.Array on the left converts the Tensor through __jax_array__ (untracked), so
    # it appears on the right only; NumPy defers to Tensor by __array_priority__.
    cases = [(other, right_side) for other in (1.5, np.float64(1.5), B) for right_side in (True, False)]
    cases.append((jnp.asarray(B), True))
    for other, on_right in cases:
        if on_right:
            left, right, ref = a, other, lambda v, o=other: op(v, o)
        else:
            left, right, ref = other, a, lambda v, o=other: op(o, v)
        out = op(left, right)
        assert isinstance(out, xgrad.Tensor) and out.requires_grad
        (g,) = autograd.grad(out.sum(), a)
        np.testing.assert_allclose(out.detach().numpy(), ref(jnp.asarray(A)), rtol=1e-12)
        np.testing.assert_allclose(g.detach().numpy(), jax.grad(lambda v, f=ref: f(v).sum())(jnp.asarray(A)), rtol=1e-12)


def test_unary_operators_and_comparisons():
    a = xgrad.tensor(A, requires_grad=True)
    (-a).sum().backward()
    assert a.grad.tolist() == (-np.ones((2, 2))).tolist()
    assert abs(xgrad.tensor([-1.0, 2.0])).tolist() == [1.0, 2.0]
    b = xgrad.tensor(B)
    for op, ref in ((a < b, A < B), (a <= b, A <= B), (a > b, A > B), (a >= b, A >= B), (a == b, A == B), (a != b, A != B)):
        assert op.dtype == jnp.bool_ and not op.requires_grad and op.tolist() == ref.tolist()
    assert (~(a > 1)).tolist() == (~(A > 1)).tolist()
    assert ((a > 1) & (b > 0)).tolist() == ((A > 1) & (B > 0)).tolist()


def test_inplace_operators():
    t = xgrad.tensor(A.copy())
    original = t
    t += 1.0
    t -= 0.5
    t *= 2.0
    t /= 4.0
    t **= 2.0
    assert t is original and t._version == 5
    np.testing.assert_allclose(t.detach().numpy(), (((A + 0.5) * 2.0) / 4.0) ** 2.0, rtol=1e-12)


def test_integer_index_out_of_range_raises_like_pytorch():
    x = xgrad.tensor([[1.0, 2.0], [3.0, 4.0]])
    for index in (5, (0, 2), (..., 2), (None, 3), -3):
        with pytest.raises(IndexError, match="out of bounds for dimension"):
            x[index]
    assert x[-2, ..., -1].item() == 2.0


def test_zero_dim_tensor_from_another_device_joins_either_operand_order():
    v = xgrad.tensor([1.0, 2.0], requires_grad=True)
    s = xgrad.tensor(3.0, device=jax.devices()[1], requires_grad=True)
    (v * s + s * v).sum().backward()
    assert (v * s).device == v.device == (s * v).device
    np.testing.assert_allclose(v.grad.numpy(), [6.0, 6.0])
    assert s.grad.item() == 6.0 and s.grad.device == s.device


@pytest.mark.parametrize("inference", [False, True], ids=["grad mode", "inference mode"])
def test_a_tensor_from_a_compiled_program_is_the_tensor_the_constructor_makes(inference):
    """``Tensor._from_program`` (a compiled step's ``.grad``s and results) sets every slot ``Tensor(array)`` sets, alike."""
    array = jnp.arange(3.0)
    missing = object()
    with xgrad.inference_mode(inference):
        made, fast = xgrad.Tensor(array), xgrad.Tensor._from_program(array)
    for name in xgrad.Tensor.__slots__:
        if name != "__weakref__":
            expected, found = getattr(made, name, missing), getattr(fast, name, missing)
            assert found is expected or found == expected, name
    assert fast.is_inference() == inference and fast.is_leaf and not fast.requires_grad
