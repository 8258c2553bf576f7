"""Views and in-place ops: a write through a view reaches its base with PyTorch's semantics.

Values and gradients are compared with the same computation written functionally in
JAX (``x.at[idx].set``), in eager and compiled backward; the error cases and the
expected gradients of PyTorch's own tests (test_autograd.py: test_inplace_on_view_*)
are written out.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from tests._helpers import assert_view_write_matches
from xgrad.autograd import compiled


@pytest.fixture(autouse=True)
def fresh_cache():
    compiled.reset()
    yield
    compiled.reset()


def _sibling_view_of_write(b, y):
    w = b[0]  # made before the write: must see it
    b[0, 1:].mul_(y[:2])
    return w


def _base_write_regenerates_view(b, y):
    w = b[:, 1]
    b.mul_(y)
    return w


def _reshape_copy(b, y):
    r = b.T.reshape(-1)  # not expressible as a view: a copy, as in PyTorch
    r.add_(y[0])
    return r


def _write_rows_in_turn(b, y):
    rows = list(b)  # all alive while each is written
    for i, row in enumerate(rows):
        row.mul_(y[i])
    return rows[0]


# name: (xgrad step on the intermediate b, returning the tensor to read after the write;
#        the same in JAX: (b, y) -> (new b, what is read))
CASES = {
    "select column mul_": (
        lambda b, y: b[:, 0].mul_(y[0]),
        lambda b, y: (b.at[:, 0].multiply(y[0]), b.at[:, 0].multiply(y[0])[:, 0]),
    ),
    "transpose add_": (
        lambda b, y: b.T.add_(y.reshape(3, 1)),
        lambda b, y: ((b.T + y[:, None]).T, b.T + y[:, None]),
    ),
    "view(-1) mul_": (
        lambda b, y: b.view(-1).mul_(xgrad.cat([y, y])),
        lambda b, y: ((b.reshape(-1) * jnp.concatenate([y, y])).reshape(2, 3), b.reshape(-1) * jnp.concatenate([y, y])),
    ),
    "view(-1) zero_": (
        lambda b, y: b.view(-1).zero_(),
        lambda b, y: (jnp.zeros_like(b), jnp.zeros(6)),
    ),
    "slice copy_": (
        lambda b, y: b[1:].copy_(y),
        lambda b, y: (b.at[1:].set(y), jnp.broadcast_to(y, (1, 3))),
    ),
    "view of view add_": (
        lambda b, y: b.T[1:, 0].add_(y[:2]),
        lambda b, y: (b.at[0, 1:].add(y[:2]), b.at[0, 1:].add(y[:2])[0, 1:]),
    ),
    "setitem on a view": (
        lambda b, y: b[0].__setitem__(1, y[2]) or b[0],
        lambda b, y: (b.at[0, 1].set(y[2]), b.at[0, 1].set(y[2])[0]),
    ),
    "unsqueeze chain div_": (
        lambda b, y: b.unsqueeze(0)[0, :, 2].div_(y[:2].exp()),
        lambda b, y: (b.at[:, 2].divide(jnp.exp(y[:2])), b.at[:, 2].divide(jnp.exp(y[:2]))[:, 2]),
    ),
    "sibling view sees the write": (
        _sibling_view_of_write,
        lambda b, y: (b.at[0, 1:].multiply(y[:2]), b.at[0, 1:].multiply(y[:2])[0]),
    ),
    "base write regenerates views": (
        _base_write_regenerates_view,
        lambda b, y: (b * y, (b * y)[:, 1]),
    ),
    "rows written in turn": (
        _write_rows_in_turn,
        lambda b, y: (b * y[:2, None], b[0] * y[0]),
    ),
    "reshape copy leaves the base alone": (
        _reshape_copy,
        lambda b, y: (b, b.T.reshape(-1) + y[0]),
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_inplace_through_a_view_matches_the_functional_update(name):
    step, reference = CASES[name]
    assert_view_write_matches(step, reference, (2, 3), modes=("eager", "compiled", "jax"))


def test_write_into_a_base_without_grad_makes_it_require_grad():
    # PyTorch's test_inplace_on_view_makes_base_require_grad.
    a = xgrad.tensor(np.arange(8.0).reshape(2, 4))
    w = xgrad.tensor(np.full((2, 2), 3.0), requires_grad=True)
    x = a.clone()
    assert not x.requires_grad
    x[:, 2:].mul_(w)
    assert x.requires_grad and x.grad_fn is not None
    (x * x).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * 3.0 * a.detach().numpy()[:, 2:] ** 2)


@pytest.mark.parametrize("flag", [False, True], ids=["eager", "compiled"])
def test_view_of_view_gradient_reaches_the_root(flag):
    # PyTorch's test_inplace_on_view_of_view: root.grad is [[1, 2], [1, 1]].
    root = xgrad.tensor(np.random.default_rng(1).standard_normal((2, 2)), requires_grad=True)
    x = root.clone()
    v1 = x[0:1]
    v2 = v1[:, 1:2]
    v2.mul_(2)
    x.sum().backward(compiled=flag)
    assert root.grad.tolist() == [[1.0, 2.0], [1.0, 1.0]]


@pytest.mark.parametrize("flag", [False, True], ids=["eager", "compiled"])
def test_non_contiguous_root_view_of_view(flag):
    # PyTorch's test_inplace_on_view_non_contig: the root is itself a transposed slice.
    root = xgrad.ones(2, 3, 2)[:, :, 1].T.detach().requires_grad_(True)
    x = root.clone()
    x[:, 1:2][1:2].mul_(2)
    x.sum().backward(compiled=flag)
    assert root.grad.tolist() == [[1.0, 1.0], [1.0, 2.0], [1.0, 1.0]]


@pytest.mark.parametrize("flag", [False, True], ids=["eager", "compiled"])
def test_the_written_view_and_its_base_both_backpropagate(flag):
    x = xgrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = xgrad.tensor(5.0, requires_grad=True)
    b = x * 2
    v = b[1:]
    v.mul_(y)
    assert b.grad_fn.name() == "IndexPutBackward" and v.grad_fn is not None
    np.testing.assert_allclose(b.detach().numpy(), [2.0, 20.0, 30.0])
    np.testing.assert_allclose(v.detach().numpy(), [20.0, 30.0])
    v.sum().backward(compiled=flag, retain_graph=True)
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 10.0, 10.0])
    np.testing.assert_allclose(y.grad.numpy(), 10.0)
    b.sum().backward(compiled=flag)
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 20.0, 20.0])
    np.testing.assert_allclose(y.grad.numpy(), 20.0)


@pytest.mark.parametrize(
    "write",
    [lambda x: x[0].mul_(2), lambda x: x.view(-1).zero_(), lambda x: x.T.add_(1), lambda x: x[1].__setitem__(0, 5.0)],
    ids=["select", "view", "transpose", "setitem"],
)
def test_inplace_on_a_view_of_a_leaf_raises_and_changes_nothing(write):
    x = xgrad.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad is being used in an in-place operation."):
        write(x)
    assert x.tolist() == np.arange(6.0).reshape(2, 3).tolist() and x._version == 0
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize("flag", [False, True], ids=["eager", "compiled"])
def test_no_grad_writes_through_views_reach_the_parameter(flag):
    p = xgrad.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    col = p[:, 2]  # made with grad on: regenerated by the writes
    with xgrad.no_grad():
        p[0].zero_()
        p.T[2].fill_(7.0)
        p.view(-1)[4:5].mul_(10.0)
    assert p.tolist() == [[0.0, 0.0, 7.0], [3.0, 40.0, 7.0]]
    assert p.is_leaf and p.grad_fn is None and p._version == 3 and col._version == 3
    assert col.tolist() == [7.0, 7.0]
    (p * p).sum().backward(compiled=flag)
    np.testing.assert_allclose(p.grad.numpy(), 2 * p.detach().numpy())


def test_a_view_made_under_no_grad_cannot_be_written_with_grad_on():
    x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    b = x * 1.0
    with xgrad.no_grad():
        v = b[:1]
    with pytest.raises(RuntimeError, match="A view was created in no_grad mode and is being modified inplace with grad mode enabled"):
        v.mul_(2)
    with xgrad.no_grad():
        v.mul_(2)
    assert b.tolist() == [2.0, 2.0]


def test_an_expanded_view_cannot_be_written():
    b = xgrad.tensor([1.0, 2.0]) * 1.0
    e = b.expand(3, 2)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor refers to a single memory location"):
        e.add_(1.0)
    assert b.tolist() == [1.0, 2.0]


def test_views_share_the_version_counter_so_a_saved_base_detects_a_write_through_a_view():
    x = xgrad.tensor([0.5, 1.0, 1.5], requires_grad=True)
    b = x.sin()
    out = b * b  # saves b
    v = b[1:]
    assert v._version == b._version == 0
    v.mul_(2.0)
    assert v._version == b._version == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    (x * 2).sum().backward()  # the next backward works
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0, 2.0])


def test_a_saved_view_detects_a_write_to_its_base():
    x = xgrad.tensor([0.5, 1.0], requires_grad=True)
    b = x * 1.0
    v = b[:1]
    out = v * v  # saves the view
    b.add_(1.0)
    assert v.tolist() == [1.5]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_view_of_a_non_contiguous_tensor_raises_where_reshape_copies():
    b = xgrad.tensor(np.arange(6.0).reshape(2, 3)) * 1.0
    with pytest.raises(RuntimeError, match=r"view size is not compatible with input tensor's size and stride .* Use .reshape\(...\) instead."):
        b.T.view(-1)
    assert b.T.reshape(-1).tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    split = b.T.view(3, 1, 2)  # splitting a dim keeps the strides expressible: still a view
    split[0, 0, 1] = 10.0
    assert b.tolist() == [[0.0, 1.0, 2.0], [10.0, 4.0, 5.0]]


def test_a_write_regenerates_only_the_views_that_see_it():
    x = xgrad.tensor(np.arange(12.0).reshape(4, 3), requires_grad=True)
    b = x * 1.0
    rows = list(b)
    column = b[:, 1]
    before = [r.grad_fn for r in rows]
    rows[2].mul_(10.0)
    # The other rows keep their values and grad_fn (the same gradients); every version moved on.
    assert [r.grad_fn is g for r, g in zip(rows, before, strict=True)] == [True, True, False, True]
    assert {r._version for r in rows} == {b._version} == {column._version} == {1}
    assert column.tolist() == [1.0, 4.0, 70.0, 10.0]
    (sum(r.sum() * (i + 1) for i, r in enumerate(rows)) + column.sum()).backward()
    expected = np.repeat([[1.0], [2.0], [30.0], [4.0]], 3, axis=1)
    expected[:, 1] += [1.0, 1.0, 10.0, 1.0]
    np.testing.assert_allclose(x.grad.numpy(), expected)
    # A sibling that did not require grad joins the graph once the base does.
    z = xgrad.zeros(2, 2)
    first, second = z[0], z[1]
    w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    first.copy_(w)
    assert second.requires_grad and z.requires_grad


@pytest.mark.parametrize(
    "slices",
    [lambda b: b.unbind(1), lambda b: b.split(1, dim=1), lambda b: b.chunk(3, dim=1),
     lambda b: [b.select(1, i) for i in range(3)], lambda b: [b.narrow(1, i, 1) for i in range(3)]],
    ids=["unbind", "split", "chunk", "select", "narrow"],
)
def test_slices_of_the_slicing_ops_are_views(slices):
    x = xgrad.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    b = x * 1.0
    with xgrad.no_grad():
        parts = slices(b)
        parts[1].mul_(10.0)
    assert b.tolist() == [[0.0, 10.0, 2.0], [3.0, 40.0, 5.0]]
    b = x * 1.0
    parts = slices(b)
    if isinstance(parts, tuple):  # one call returned several views: PyTorch forbids writing them with grad on
        with pytest.raises(RuntimeError, match="This view is the output of a function that returns multiple views"):
            parts[1].mul_(10.0)
        return
    parts[1].mul_(10.0)
    assert b.tolist() == [[0.0, 10.0, 2.0], [3.0, 40.0, 5.0]]
    b.sum().backward()
    assert x.grad.tolist() == [[1.0, 10.0, 1.0], [1.0, 10.0, 1.0]]


def test_advanced_indexing_is_a_copy_as_in_pytorch():
    b = xgrad.tensor([1.0, 2.0, 3.0]) * 1.0
    picked = b[np.array([0, 2])]
    picked.mul_(10.0)
    assert b.tolist() == [1.0, 2.0, 3.0] and picked.tolist() == [10.0, 30.0]


def test_detach_in_place_of_a_view_raises():
    b = xgrad.tensor([1.0, 2.0], requires_grad=True) * 1.0
    with pytest.raises(RuntimeError, match="Can't detach views in-place. Use detach"):
        b[:1].detach_()


@pytest.mark.parametrize("flag", [False, True], ids=["eager", "compiled"])
def test_copy_from_a_tensor_requiring_grad_records_the_copy(flag):
    x = xgrad.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = xgrad.zeros(3)
    y.copy_(x)
    assert y.requires_grad and y.grad_fn is not None
    (y * y).sum().backward(compiled=flag)
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0, 6.0])
    # Over a value with history: the old value gets zeros, the copied one the gradient.
    w = xgrad.tensor([1.0, 1.0, 1.0], requires_grad=True)
    x.grad = None
    z = w * 3
    z.copy_(x)
    (z * 2).sum().backward(compiled=flag)
    np.testing.assert_allclose(w.grad.numpy(), [0.0, 0.0, 0.0])
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0, 2.0])


@pytest.mark.parametrize(
    ("make", "write", "message"),
    [
        (lambda: xgrad.tensor([1, 2]), lambda t: t.mul_(xgrad.tensor([1.5, 2.5], dtype=jnp.float32)),
         "result type Float can't be cast to the desired output type Long"),
        (lambda: xgrad.tensor([1, 2], dtype=jnp.int32), lambda t: t.add_(xgrad.tensor(0.5, dtype=jnp.float64)),
         "result type Double can't be cast to the desired output type Int"),
        (lambda: xgrad.tensor([True, False]), lambda t: t.add_(xgrad.tensor([1, 1])),
         "result type Long can't be cast to the desired output type Bool"),
        (lambda: xgrad.tensor([1, 2]), lambda t: t[0:1].mul_(xgrad.tensor([1.5], dtype=jnp.float32)),
         "result type Float can't be cast to the desired output type Long"),
    ],
    ids=["long*float", "int+double", "bool+long", "view of long"],
)
def test_inplace_that_would_change_an_integer_dtype_raises(make, write, message):
    t = make()
    before = t.tolist()
    with pytest.raises(RuntimeError, match=message):
        write(t)
    assert t.tolist() == before and t._version == 0


def test_inplace_results_of_a_castable_dtype_keep_the_tensor_dtype():
    t = xgrad.tensor([1, 2])
    t.add_(xgrad.tensor([3, 4], dtype=jnp.int32))
    assert t.dtype == jnp.int64 and t.tolist() == [4, 6]
    f = xgrad.tensor([1.0, 2.0], dtype=jnp.float32)
    f.mul_(xgrad.tensor([2.0, 2.0], dtype=jnp.float64))  # a float64 result, cast back as PyTorch does
    assert f.dtype == jnp.float32 and f.tolist() == [2.0, 4.0]
