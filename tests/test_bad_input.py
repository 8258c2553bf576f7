"""Bad input raises as PyTorch does; the same ops' valid edge cases give the right values.

One table per kind of argument (dims, integer indices, shapes and sizes): each row's bad
call must raise PyTorch's exception type, and its valid edge cases (a negative in-range
dim or index, ``dim=-1``, empty and 0-dim tensors) must match ``jnp`` on the same arrays.
The gradient semantics PyTorch defines at special points (``pow`` at 0, ties and NaN in
``max``/``min``/``amax``/``amin``) and ``cross_entropy`` are checked against values written
from PyTorch's documented formulas, under the eager and the compiled backward.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad.autograd import compiled as compiled_backward

COMPILED = pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])


@pytest.fixture(autouse=True)
def fresh_compiled_cache():
    # Each test's graphs differ on purpose; a per-test cache keeps recompile warnings meaningful.
    compiled_backward.reset()
    yield
    compiled_backward.reset()

X23 = np.arange(6.0).reshape(2, 3) - 2.5  # distinct values, so sorting and max have one answer
X234 = np.arange(24.0).reshape(2, 3, 4) / 7.0 - 1.5


def _close(actual: Any, expected: Any) -> None:
    actual = actual._array if isinstance(actual, xgrad.Tensor) else actual
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-6, atol=1e-9)


# -- dims ------------------------------------------------------------------------------
# name -> (xgrad call with (tensor, dim), jnp reference with (array, dim) or None, extra dims allowed)
# "extra" is 1 for ops whose dim may point one past the end (unsqueeze, stack).
DIM_OPS: dict[str, tuple[Callable[..., Any], Callable[..., Any], int]] = {
    "softmax": (lambda t, d: xgrad.softmax(t, d), lambda a, d: jax.nn.softmax(a, axis=d), 0),
    "log_softmax": (lambda t, d: xgrad.log_softmax(t, d), lambda a, d: jax.nn.log_softmax(a, axis=d), 0),
    "sort": (lambda t, d: xgrad.sort(t, d).values, lambda a, d: jnp.sort(a, axis=d), 0),
    "roll": (lambda t, d: xgrad.roll(t, 1, d), lambda a, d: jnp.roll(a, 1, d), 0),
    "flip": (lambda t, d: xgrad.flip(t, d), lambda a, d: jnp.flip(a, d), 0),
    "cumsum": (lambda t, d: xgrad.cumsum(t, d), lambda a, d: jnp.cumsum(a, axis=d), 0),
    "sum": (lambda t, d: xgrad.sum(t, d), lambda a, d: jnp.sum(a, axis=d), 0),
    "mean": (lambda t, d: xgrad.mean(t, d), lambda a, d: jnp.mean(a, axis=d), 0),
    "prod": (lambda t, d: xgrad.prod(t, d), lambda a, d: jnp.prod(a, axis=d), 0),
    "var": (lambda t, d: xgrad.var(t, d), lambda a, d: jnp.var(a, axis=d, ddof=1), 0),
    "amax": (lambda t, d: xgrad.amax(t, d), lambda a, d: jnp.max(a, axis=d), 0),
    "amin": (lambda t, d: xgrad.amin(t, d), lambda a, d: jnp.min(a, axis=d), 0),
    "max(dim)": (lambda t, d: xgrad.max(t, d).values, lambda a, d: jnp.max(a, axis=d), 0),
    "min(dim)": (lambda t, d: xgrad.min(t, d).indices, lambda a, d: jnp.argmin(a, axis=d), 0),
    "argmax": (lambda t, d: xgrad.argmax(t, d), lambda a, d: jnp.argmax(a, axis=d), 0),
    "argmin": (lambda t, d: xgrad.argmin(t, d), lambda a, d: jnp.argmin(a, axis=d), 0),
    "logsumexp": (lambda t, d: xgrad.logsumexp(t, d), lambda a, d: jax.scipy.special.logsumexp(a, axis=d), 0),
    "squeeze": (lambda t, d: xgrad.squeeze(t[:1], d), lambda a, d: a[:1].squeeze(d) if a[:1].shape[d] == 1 else a[:1], 0),
    "unsqueeze": (lambda t, d: xgrad.unsqueeze(t, d), lambda a, d: jnp.expand_dims(a, d), 1),
    "stack": (lambda t, d: xgrad.stack([t, t * 2], d), lambda a, d: jnp.stack([a, a * 2], d), 1),
    "cat": (lambda t, d: xgrad.cat([t, t * 2], d), lambda a, d: jnp.concatenate([a, a * 2], d), 0),
    "split": (lambda t, d: xgrad.split(t, 1, d)[-1], lambda a, d: jnp.split(a, a.shape[d], d)[-1], 0),
    "chunk": (lambda t, d: xgrad.chunk(t, 2, d)[0], lambda a, d: jnp.array_split(a, 2, d)[0], 0),
    "transpose": (lambda t, d: xgrad.transpose(t, 0, d), lambda a, d: jnp.swapaxes(a, 0, d), 0),
    "flatten": (lambda t, d: xgrad.flatten(t, 0, d), lambda a, d: a.reshape((-1,) + a.shape[d % a.ndim + 1 :]), 0),
    "index_select": (lambda t, d: xgrad.index_select(t, d, xgrad.tensor([0])), lambda a, d: jnp.take(a, jnp.array([0]), d), 0),
    "gather": (lambda t, d: xgrad.gather(t, d, xgrad.zeros(t.shape, dtype=jnp.int32)),
               lambda a, d: jnp.take_along_axis(a, jnp.zeros(a.shape, jnp.int32), d), 0),
}


@pytest.mark.parametrize("name", sorted(DIM_OPS))
def test_out_of_range_dim_raises_index_error(name):
    op, _, extra = DIM_OPS[name]
    x = xgrad.tensor(X234)
    bound = x.ndim + extra
    for dim in (bound, -bound - 1, 100):
        message = rf"^Dimension out of range \(expected to be in range of \[{-bound}, {bound - 1}\], but got {dim}\)$"
        with pytest.raises(IndexError, match=message):
            op(x, dim)


@pytest.mark.parametrize("name", sorted(DIM_OPS))
@pytest.mark.parametrize("dim", [-1, 0, -3], ids=["dim=-1", "dim=0", "dim=-3"])
def test_in_range_dims_match_jnp(name, dim):
    op, ref, _ = DIM_OPS[name]
    _close(op(xgrad.tensor(X234), dim), ref(jnp.asarray(X234), dim))


@pytest.mark.parametrize(
    "name", ["softmax", "log_softmax", "sum", "mean", "amax", "amin", "logsumexp", "prod", "cumsum", "sort", "argmax"],
)
def test_zero_dim_tensor_accepts_dim_0_and_minus_1_only(name):
    # PyTorch wraps a scalar's dim as if it had one dim: 0 and -1 are its only dims.
    op, ref, _ = DIM_OPS[name]
    x = xgrad.tensor(1.5)
    for dim in (0, -1):
        _close(op(x, dim), ref(jnp.asarray([1.5]), 0))
    with pytest.raises(IndexError, match=r"expected to be in range of \[-1, 0\], but got 1\)"):
        op(x, 1)


def test_reductions_over_a_list_of_dims_check_each_and_reject_repeats():
    x = xgrad.tensor(X234)
    _close(xgrad.sum(x, (0, -1)), jnp.sum(X234, axis=(0, 2)))
    with pytest.raises(IndexError, match="but got 3"):
        xgrad.sum(x, (0, 3))
    with pytest.raises(RuntimeError, match="^dim 2 appears multiple times in the list of dims$"):
        xgrad.sum(x, (2, -1))
    with pytest.raises(TypeError, match="dim must be an int"):
        xgrad.sum(x, 1.0)


def test_size_of_a_dim():
    x = xgrad.tensor(X234)
    assert (x.size(-1), x.size(0), x.size()) == (4, 2, (2, 3, 4))
    with pytest.raises(IndexError, match=r"^Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)$"):
        x.size(3)
    with pytest.raises(IndexError, match="^dimension specified as 0 but tensor has no dimensions$"):
        xgrad.tensor(1.0).size(0)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda x: x.permute(0, 1), RuntimeError, r"input.dim\(\) = 3 is not equal to len\(dims\) = 2"),
        (lambda x: x.permute(0, 1, 1), RuntimeError, r"^permute\(\): duplicate dims are not allowed\.$"),
        (lambda x: x.permute(0, 1, 3), IndexError, "Dimension out of range"),
        (lambda x: xgrad.flatten(x, 2, 1), RuntimeError, "start_dim cannot come after end_dim"),
        (lambda x: xgrad.roll(x, (1, 2), 0), RuntimeError, "^shifts and dimensions must align. shifts: 2, dims:1$"),
        (lambda x: xgrad.tril(x[0, 0]), RuntimeError, "^tril: input tensor must have at least 2 dimensions$"),
        (lambda x: xgrad.triu(x[0, 0]), RuntimeError, "^triu: input tensor must have at least 2 dimensions$"),
    ],
    ids=["permute-length", "permute-repeat", "permute-range", "flatten-order", "roll-align", "tril-1d", "triu-1d"],
)
def test_bad_dim_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call(xgrad.tensor(X234))


# -- integer indices -------------------------------------------------------------------
def _as(kind: str, values: Any) -> Any:
    """The same integer index as a Python list, a NumPy array or a device tensor."""
    return {"list": list, "numpy": np.asarray, "tensor": xgrad.tensor}[kind](values)


INDEX_KINDS = pytest.mark.parametrize("kind", ["list", "numpy", "tensor"])

# name -> (xgrad call with (tensor of X23, index), jnp reference with (array, index as jnp), message)
INDEX_OPS: dict[str, tuple[Callable[..., Any], Callable[..., Any], str]] = {
    "getitem rows": (lambda t, i: t[i], lambda a, i: a[i], "index 2 is out of bounds for dimension 0 with size 2"),
    "getitem cols": (lambda t, i: t[:, i], lambda a, i: a[:, i], "index 3 is out of bounds for dimension 1 with size 3"),
    "getitem pair": (lambda t, i: t[i, i], lambda a, i: a[i, i], "index 2 is out of bounds for dimension 0 with size 2"),
    "getitem ellipsis": (lambda t, i: t[..., i], lambda a, i: a[..., i], "index 3 is out of bounds for dimension 1 with size 3"),
    "index_select": (lambda t, i: xgrad.index_select(t, 1, i), lambda a, i: jnp.take(a, i, 1), "index out of range in self"),
    "embedding": (lambda t, i: xgrad.embedding(i, t.T), lambda a, i: a.T[i], "index out of range in self"),
}
BAD_INDEX = {"getitem rows": [0, 2], "getitem cols": [3], "getitem pair": [1, 2], "getitem ellipsis": [-1, 3],
             "index_select": [3, 0], "embedding": [0, 3]}


@INDEX_KINDS
@pytest.mark.parametrize("name", sorted(INDEX_OPS))
def test_out_of_range_index_raises_index_error(name, kind):
    op, _, message = INDEX_OPS[name]
    with pytest.raises(IndexError, match=f"^{message}$"):
        op(xgrad.tensor(X23), _as(kind, BAD_INDEX[name]))


NO_NEGATIVE_INDEX = ("index_select", "embedding")  # PyTorch: "index out of range in self" for -1


@INDEX_KINDS
@pytest.mark.parametrize("name", sorted(INDEX_OPS))
def test_negative_and_empty_in_range_indices_match_jnp(name, kind):
    op, ref, message = INDEX_OPS[name]
    negative = [-1, 0, -2] if "rows" not in name and "pair" not in name else [-1, 0, -2 + 1]
    if name in NO_NEGATIVE_INDEX:
        with pytest.raises(IndexError, match=f"^{message}$"):
            op(xgrad.tensor(X23), _as(kind, negative))
    else:
        _close(op(xgrad.tensor(X23), _as(kind, negative)), ref(jnp.asarray(X23), jnp.asarray(negative)))
    empty = np.zeros((0,), np.int32) if kind != "list" else []
    index = xgrad.tensor(empty, dtype=jnp.int32) if kind == "tensor" else empty
    _close(op(xgrad.tensor(X23), index), ref(jnp.asarray(X23), jnp.zeros((0,), jnp.int32)))


def test_python_int_index_out_of_range():
    x = xgrad.tensor(X23)
    with pytest.raises(IndexError, match="^index -3 is out of bounds for dimension 0 with size 2$"):
        x[-3]
    with pytest.raises(IndexError, match="^index 3 is out of bounds for dimension 1 with size 3$"):
        x[0, 3]
    _close(x[-2, -1], X23[-2, -1])


@INDEX_KINDS
def test_gather_and_scatter_add_reject_negative_and_too_large_indices(kind):
    # gather/scatter_add index in [0, size): PyTorch rejects negatives here (unlike x[i]).
    x = xgrad.tensor(X23)
    for bad, shown in (([[0, 3]], 3), ([[-1, 0]], -1)):
        message = f"^index {shown} is out of bounds for dimension 1 with size 3$"
        with pytest.raises(IndexError, match=message):
            xgrad.gather(x, 1, _as(kind, bad))
        with pytest.raises(RuntimeError, match=message):  # also PyTorch's RuntimeError
            xgrad.scatter_add(x, 1, _as(kind, bad), xgrad.ones(1, 2, dtype=x.dtype))


def test_gather_and_scatter_add_index_shape_and_dtype():
    x = xgrad.tensor(X23)
    with pytest.raises(RuntimeError, match="^Index tensor must have the same number of dimensions as input tensor$"):
        xgrad.gather(x, 1, [0, 1])
    with pytest.raises(RuntimeError, match=r"^Size does not match at dimension 0 expected index \[3, 1\] to be smaller than self \[2, 3\] apart from dimension 1$"):
        xgrad.gather(x, 1, [[0], [1], [2]])
    with pytest.raises(RuntimeError, match="Expected dtype int64 for index"):
        xgrad.gather(x, 1, xgrad.tensor([[0.0]]))
    with pytest.raises(RuntimeError, match=r"expected index \[1, 2\] to be smaller than src \[1, 1\]"):
        xgrad.scatter_add(x, 1, [[0, 1]], xgrad.ones(1, 1, dtype=x.dtype))


@COMPILED
def test_gather_and_scatter_add_valid_values_and_grads(compiled):
    x = xgrad.tensor(X23, requires_grad=True)
    index = np.array([[2, 2], [0, 1]])
    out = xgrad.gather(x, 1, index)
    _close(out, np.take_along_axis(X23, index, 1))
    (out * xgrad.tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward(compiled=compiled)
    _close(x.grad, [[0.0, 0.0, 3.0], [3.0, 4.0, 0.0]])
    src = xgrad.tensor([[1.0, 2.0], [3.0, 4.0]])
    _close(xgrad.scatter_add(xgrad.tensor(X23), 1, index, src), X23 + [[0.0, 0.0, 3.0], [3.0, 4.0, 0.0]])


@INDEX_KINDS
def test_setitem_out_of_range_raises_and_leaves_the_tensor_unchanged(kind):
    x = xgrad.tensor(X23)
    with pytest.raises(IndexError, match="^index 2 is out of bounds for dimension 0 with size 2$"):
        x[_as(kind, [2])] = 0.0
    with pytest.raises(IndexError, match="^index 5 is out of bounds for dimension 1 with size 3$"):
        x[:, 5] = 0.0
    _close(x, X23)
    x[_as(kind, [-1])] = 7.0
    _close(x, np.where(np.arange(2)[:, None] == 1, 7.0, X23))


@COMPILED
def test_a_backward_after_an_index_error_works(compiled):
    w = xgrad.tensor(X23, requires_grad=True)
    with pytest.raises(IndexError):
        (w * 2)[xgrad.tensor([5])]
    (w * 2)[xgrad.tensor([-1])].sum().backward(compiled=compiled)
    _close(w.grad, [[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]])


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint8])
def test_device_check_finds_the_first_out_of_range_entry(dtype):
    # The jitted reduction used for arrays on accelerators (CPU arrays are read by NumPy).
    from xgrad.ops._util import first_out_of_range

    index = jnp.asarray([[0, 2], [7, 5]], dtype)
    assert not first_out_of_range(index, 8, negative=True, ignore=None)[0]
    bad, first = first_out_of_range(index, 6, negative=True, ignore=None)
    assert bool(bad) and int(first) == 7
    assert not first_out_of_range(index, 6, negative=False, ignore=7)[0]
    assert not first_out_of_range(jnp.zeros((0,), dtype), 1, negative=True, ignore=None)[0]
    if dtype == jnp.int32:
        signed = jnp.asarray([1, -3, -2], dtype)
        assert not first_out_of_range(signed, 3, negative=True, ignore=None)[0]
        bad, first = first_out_of_range(signed, 3, negative=False, ignore=None)
        assert bool(bad) and int(first) == -3


def test_index_sharded_over_two_devices_is_checked():
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:2]), ("batch",))
    index = jax.device_put(jnp.asarray([0, 1, 2, 9]), NamedSharding(mesh, PartitionSpec("batch")))
    with pytest.raises(IndexError, match="^index 9 is out of bounds for dimension 0 with size 3$"):
        xgrad.tensor([1.0, 2.0, 3.0])[xgrad.tensor(index)]


def test_bool_mask_and_slices_need_no_check():
    x = xgrad.tensor(X23)
    _close(x[x > 0], X23[X23 > 0])
    _close(x[5:], X23[5:])  # slices clamp, as in PyTorch
    _close(x[None, ..., 1:], X23[None, ..., 1:])


# -- every op that reads a user's index, in every mode ---------------------------------
# JAX clamps an out-of-range read and drops a write; PyTorch raises. Each path on the
# (4, 3) W with the index [0, 7]: name -> (the op, PyTorch's message).
W43 = np.arange(12.0).reshape(4, 3)


def _set_rows(w, i):
    h = w + 0.0 * i.sum().to(w.dtype)  # mapped as i is under vmap (an in-place write into an unmapped tensor raises)
    h[i] = 0.0
    return h


INDEX_PATHS: dict[str, tuple[Callable[..., Any], str]] = {
    "getitem": (lambda w, i: w[i], "index 7 is out of bounds for dimension 0 with size 4"),
    "getitem tuple": (lambda w, i: w[i, 0], "index 7 is out of bounds for dimension 0 with size 4"),
    "setitem": (_set_rows, "index 7 is out of bounds for dimension 0 with size 4"),
    "index_select": (lambda w, i: w.index_select(0, i), "index out of range in self"),
    "gather": (lambda w, i: w.gather(0, i.reshape(-1, 1).expand(-1, 3)), "index 7 is out of bounds for dimension 0 with size 4"),
    "scatter_add": (lambda w, i: w.scatter_add(0, i.reshape(-1, 1).expand(-1, 3), xgrad.ones(i.shape[0], 3, dtype=w.dtype)),
                    "index 7 is out of bounds for dimension 0 with size 4"),
    "embedding": (lambda w, i: xgrad.nn.functional.embedding(i, w), "index out of range in self"),
    "nll_loss": (lambda w, i: xgrad.nn.functional.nll_loss(w.T[: i.shape[0]], i), "Target 7 is out of bounds."),
    "cross_entropy": (lambda w, i: xgrad.nn.functional.cross_entropy(w.T[: i.shape[0]], i), "Target 7 is out of bounds."),
    "one_hot": (lambda w, i: xgrad.nn.functional.one_hot(i, 4), "Class values must be smaller than num_classes."),
    "TensorDataset": (lambda w, i: xgrad.utils.data.TensorDataset(w)[i][0], "index 7 is out of bounds for dimension 0 with size 4"),
}


def _run_index_path(mode: str, op: Callable[..., Any], index: Any) -> Any:
    w = xgrad.tensor(W43)
    if mode == "eager":
        return op(w, xgrad.tensor(index)).numpy()
    if mode == "xgrad.compile":
        return xgrad.compile(lambda i: op(w, i))(xgrad.tensor(index)).numpy()
    if mode == "xgrad.func.vmap":  # each lane one index, as PyTorch's vmap
        return xgrad.func.vmap(lambda i: op(w, i.reshape(1)))(xgrad.tensor(index)).numpy()
    return np.asarray(jax.jit(lambda i: op(w, xgrad.Tensor(i)).array)(jnp.asarray(index)))


@pytest.mark.parametrize("mode", ["eager", "xgrad.compile", "xgrad.func.vmap", "jax.jit"])
@pytest.mark.parametrize("name", sorted(INDEX_PATHS))
def test_every_index_path_raises_for_an_out_of_range_index_in_every_mode(name, mode):
    op, message = INDEX_PATHS[name]
    # A valid index gives eager's values (under vmap, each lane's).
    expected = (np.stack([_run_index_path("eager", op, [i]) for i in (0, 3)]) if mode == "xgrad.func.vmap"
                else _run_index_path("eager", op, [0, 3]))
    np.testing.assert_allclose(_run_index_path(mode, op, [0, 3]), expected)
    if mode == "jax.jit":
        # Values are unknown while jax.jit traces: a host callback raises when the program runs,
        # and JAX reports it as its JaxRuntimeError, a RuntimeError (NOTE [Checks under jax.jit]).
        with pytest.raises(RuntimeError, match=re.escape(message)):
            _run_index_path(mode, op, [0, 7])
        return
    error = RuntimeError if name == "one_hot" else IndexError
    end = "" if mode == "xgrad.func.vmap" else "$"  # JAX appends a note on its filtered traceback
    with pytest.raises(error, match=f"^{re.escape(message)}{end}"):
        _run_index_path(mode, op, [0, 7])


def test_concrete_value_reads_through_vmap_and_grad_but_not_jit():
    # What the checks under xgrad.func rely on (xgrad/jax_internals.py): vmap's batched value, grad's primal.
    from xgrad.jax_internals import concrete_value

    seen = []
    jax.vmap(lambda x: seen.append(concrete_value(x)) or x)(jnp.arange(2))
    jax.grad(lambda x: seen.append(concrete_value(x)) or x)(1.5)
    jax.vmap(jax.grad(lambda x: seen.append(concrete_value(x)) or x))(jnp.asarray([2.5, 3.5]))
    jax.jit(lambda x: seen.append(concrete_value(x)) or x)(1.0)
    np.testing.assert_array_equal(seen[0], [0, 1])
    assert float(seen[1]) == 1.5 and seen[2].tolist() == [2.5, 3.5] and seen[3] is None


def test_traced_checks_can_be_left_out_for_jax_export():
    # Host callbacks cannot be serialized: export works with the checks off, and reads as JAX does.
    weight = xgrad.tensor(W43)

    def lookup():  # a fresh function each time: the setting applies when JAX traces it
        return jax.jit(lambda i: xgrad.nn.functional.embedding(xgrad.Tensor(i), weight).array)

    spec = jax.ShapeDtypeStruct((2,), jnp.int32)
    with pytest.raises(NotImplementedError):
        jax.export.export(lookup())(spec)
    with xgrad.utils.traced_checks(False):
        exported = jax.export.export(lookup())(spec)
    np.testing.assert_allclose(exported.call(jnp.asarray([3, 1], jnp.int32)), W43[[3, 1]])
    with pytest.raises(RuntimeError, match="index out of range in self"):  # the default again
        lookup()(jnp.asarray([0, 4]))


# -- shapes and sizes ------------------------------------------------------------------
SHAPE_ERRORS = [
    ("reshape size", lambda: xgrad.zeros(2, 3).reshape(4), RuntimeError, r"^shape '\[4\]' is invalid for input of size 6$"),
    ("reshape two -1", lambda: xgrad.zeros(2, 3).reshape(-1, -1), RuntimeError, "^only one dimension can be inferred$"),
    ("reshape -2", lambda: xgrad.zeros(2, 3).reshape(-2, 3), RuntimeError, "^invalid shape dimension -2$"),
    ("view -1 no fit", lambda: xgrad.zeros(2, 3).view(-1, 4), RuntimeError, r"shape '\[-1, 4\]' is invalid for input of size 6"),
    ("expand mismatch", lambda: xgrad.zeros(2, 1).expand(3, 4), RuntimeError, r"expanded size of the tensor \(3\) must match the existing size \(2\) at non-singleton dimension 0"),
    ("expand fewer", lambda: xgrad.zeros(2, 1).expand(4), RuntimeError, r"number of sizes provided \(1\) must be greater or equal to the number of dimensions in the tensor \(2\)"),
    ("expand lead -1", lambda: xgrad.zeros(2).expand(-1, 2), RuntimeError, "-1 is not allowed in a leading, non-existing dimension"),
    ("cat ndim", lambda: xgrad.cat([xgrad.zeros(2, 3), xgrad.zeros(3)]), RuntimeError, "^Tensors must have same number of dimensions: got 2 and 1$"),
    ("cat sizes", lambda: xgrad.cat([xgrad.zeros(2, 3), xgrad.zeros(2, 2)]), RuntimeError, r"^Sizes of tensors must match except in dimension 0. Expected size 3 but got size 2 for tensor number 1 in the list.$"),
    ("cat 0-dim", lambda: xgrad.cat([xgrad.tensor(1.0)]), RuntimeError, r"^zero-dimensional tensor \(at position 0\) cannot be concatenated$"),
    ("cat empty", lambda: xgrad.cat([]), ValueError, r"^torch.cat\(\): expected a non-empty list of Tensors$"),
    ("mean of ints", lambda: xgrad.tensor([1, 2]).mean(), RuntimeError,
     "^mean\\(\\): could not infer output dtype. Input dtype must be either a floating point or complex dtype. Got: (Long|Int)$"),
    ("var of ints", lambda: xgrad.tensor([1, 2]).var(), RuntimeError, "^std and var only support floating point and complex dtypes$"),
    ("std of bools", lambda: xgrad.tensor([True, False]).std(dim=0), RuntimeError, "^std and var only support"),
    ("where float condition", lambda: xgrad.where(xgrad.ones(2), 1.0, 0.0), RuntimeError,
     "^where expected condition to be a boolean tensor, but got a tensor with dtype Float$"),
    ("item of many", lambda: xgrad.zeros(2, 3).item(), RuntimeError, "^a Tensor with 6 elements cannot be converted to Scalar$"),
    ("bool of many", lambda: bool(xgrad.zeros(2)), RuntimeError, "^Boolean value of Tensor with more than one value is ambiguous$"),
    ("bool of none", lambda: bool(xgrad.zeros(0)), RuntimeError, "^Boolean value of Tensor with no values is ambiguous$"),
    ("int negative power", lambda: xgrad.tensor([2, 3]) ** -1, RuntimeError, r"^Integers to negative integer powers are not allowed\.$"),
    ("int negative tensor power", lambda: xgrad.tensor([2, 3]) ** xgrad.tensor([1, -1]), RuntimeError, "^Integers to negative integer powers"),
    ("int negative rpow", lambda: 2 ** xgrad.tensor([-1]), RuntimeError, "^Integers to negative integer powers"),
    ("int negative ipow", lambda: xgrad.tensor([2]).__ipow__(-2), RuntimeError, "^Integers to negative integer powers"),
    ("stack sizes", lambda: xgrad.stack([xgrad.zeros(2), xgrad.zeros(3)]), RuntimeError, r"^stack expects each tensor to be equal size, but got \[2\] at entry 0 and \[3\] at entry 1$"),
    ("split 0", lambda: xgrad.split(xgrad.zeros(5), 0), RuntimeError, "^split_size can only be 0 if dimension size is 0, but got dimension size of 5$"),
    ("split negative", lambda: xgrad.split(xgrad.zeros(5), -1), RuntimeError, "^split expects split_size be non-negative, but got split_size=-1$"),
    ("split sections", lambda: xgrad.split(xgrad.zeros(5), [2, 2]), RuntimeError, "expects split_sizes to sum exactly to 5"),
    ("split sections negative", lambda: xgrad.split(xgrad.zeros(5), [-1, 6]), RuntimeError, "only non-negative entries"),
    ("chunk 0", lambda: xgrad.chunk(xgrad.zeros(5), 0), RuntimeError, "^chunk expects `chunks` to be greater than 0, got: 0$"),
    ("chunk 0-dim", lambda: xgrad.chunk(xgrad.tensor(1.0), 1), RuntimeError, "chunk expects at least a 1-dimensional tensor"),
    ("max empty", lambda: xgrad.max(xgrad.zeros(0)), RuntimeError, r"^max\(\): Expected reduction dim to be specified for input.numel\(\) == 0"),
    ("max(dim) empty", lambda: xgrad.max(xgrad.zeros(2, 0), 1), IndexError, r"^max\(\): Expected reduction dim 1 to have non-zero size.$"),
    ("argmin empty", lambda: xgrad.argmin(xgrad.zeros(0, 2), 0), IndexError, r"^argmin\(\): Expected reduction dim 0 to have non-zero size.$"),
    ("index_select 2-d index", lambda: xgrad.index_select(xgrad.zeros(3), 0, [[0]]), IndexError, r"^index_select\(\): Index is supposed to be a vector$"),
    ("embedding 1-d weight", lambda: xgrad.embedding([0], xgrad.zeros(3)), RuntimeError, "^'weight' must be 2-D$"),
    ("embedding float index", lambda: xgrad.embedding(xgrad.tensor([0.0]), xgrad.zeros(3, 2)), RuntimeError, "'indices' to have one of the following scalar types"),
]


@pytest.mark.parametrize("call, error, message", [r[1:] for r in SHAPE_ERRORS], ids=[r[0] for r in SHAPE_ERRORS])
def test_wrong_shapes_and_sizes_raise(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize(
    "call, expected",
    [
        (lambda: xgrad.zeros(2, 3).reshape(-1), np.zeros(6)),
        (lambda: xgrad.zeros(0, 3).reshape(-1, 3), np.zeros((0, 3))),
        (lambda: xgrad.tensor([1.0, 2.0]).expand(2, -1), [[1.0, 2.0], [1.0, 2.0]]),
        (lambda: xgrad.cat([xgrad.zeros(0, 2), xgrad.ones(1, 2)]), np.ones((1, 2))),
        (lambda: xgrad.split(xgrad.zeros(0), 2)[0], np.zeros(0)),
        (lambda: xgrad.split(xgrad.zeros(0), 0)[0], np.zeros(0)),
        (lambda: xgrad.stack([xgrad.tensor(1.0), xgrad.tensor(2.0)], -1), [1.0, 2.0]),
        (lambda: xgrad.transpose(xgrad.tensor(3.0), 0, -1), 3.0),
        (lambda: xgrad.flatten(xgrad.tensor(3.0)), [3.0]),
        (lambda: xgrad.sum(xgrad.zeros(0, 2), 0), [0.0, 0.0]),
        (lambda: xgrad.max(xgrad.tensor(3.0), 0).values, 3.0),
        (lambda: xgrad.index_select(xgrad.tensor([1.0, 2.0]), 0, xgrad.tensor(1)), [2.0]),
    ],
    ids=["reshape -1", "empty -1", "expand -1", "cat with empty", "split empty", "split 0 of empty", "stack 0-dim",
         "transpose 0-dim", "flatten 0-dim", "sum empty", "max 0-dim", "index_select 0-dim index"],
)
def test_valid_shape_edge_cases(call, expected):
    _close(call(), expected)


# -- creation and modules --------------------------------------------------------------
CREATION_ERRORS = [
    ("zeros", lambda: xgrad.zeros(2, -1), RuntimeError, r"^Trying to create tensor with negative dimension -1: \[2, -1\]$"),
    ("ones", lambda: xgrad.ones((-3,)), RuntimeError, "negative dimension -3"),
    ("full", lambda: xgrad.full((2, -2), 1.0), RuntimeError, "negative dimension -2"),
    ("randn", lambda: xgrad.randn(-1, key=jax.random.key(0)), RuntimeError, "negative dimension -1"),
    ("rand", lambda: xgrad.rand(1, -1, key=jax.random.key(0)), RuntimeError, "negative dimension -1"),
    ("eye", lambda: xgrad.eye(-1), RuntimeError, "must be greater or equal to 0"),
    ("new_zeros", lambda: xgrad.zeros(2).new_zeros(2, -1), RuntimeError, r"negative dimension -1: \[2, -1\]$"),
    ("new_full", lambda: xgrad.zeros(2).new_full((-4,), 1.0), RuntimeError, "negative dimension -4"),
    ("arange step 0", lambda: xgrad.arange(0, 3, 0), RuntimeError, "^step must be nonzero$"),
    ("arange sign", lambda: xgrad.arange(0, 3, -1), RuntimeError, "^upper bound and larger bound inconsistent with step sign$"),
    ("zeros float size", lambda: xgrad.zeros(2.5), TypeError, "shape must be a sequence of ints"),
    ("zeros_like None", lambda: xgrad.zeros_like(None), TypeError, r"^zeros_like\(\): argument 'input' \(position 1\) must be Tensor, not NoneType$"),
    ("ones_like list", lambda: xgrad.ones_like([1.0]), TypeError, "must be Tensor, not list"),
    ("Linear in", lambda: xgrad.nn.Linear(-1, 2, key=0), RuntimeError, r"^Trying to create tensor with negative dimension -1: \[2, -1\]$"),
    ("Linear out", lambda: xgrad.nn.Linear(2, -3, key=0), RuntimeError, "negative dimension -3"),
]


@pytest.mark.parametrize("call, error, message", [r[1:] for r in CREATION_ERRORS], ids=[r[0] for r in CREATION_ERRORS])
def test_bad_creation_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_valid_creation_edge_cases():
    _close(xgrad.zeros(0, 3), np.zeros((0, 3)))
    _close(xgrad.full((), 2.0), 2.0)
    _close(xgrad.arange(5, 0, -2), [5, 3, 1])
    _close(xgrad.arange(0), np.zeros(0))
    assert xgrad.nn.Linear(0, 2, key=0)(xgrad.zeros(3, 0)).shape == (3, 2)


# -- layer_norm ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape, normalized, message",
    [
        ((2, 3), (4,), r"^Given normalized_shape=\[4\], expected input with shape \[\*, 4\], but got input of size\[2, 3\]$"),
        ((2, 3), (2, 2), r"normalized_shape=\[2, 2\], expected input with shape \[\*, 2, 2\]"),
        ((3,), (1, 3), r"normalized_shape=\[1, 3\], expected input with shape \[\*, 1, 3\], but got input of size\[3\]"),
        ((3,), (), "Expected normalized_shape to be at least 1-dimensional"),
    ],
)
def test_layer_norm_checks_normalized_shape(shape, normalized, message):
    with pytest.raises(RuntimeError, match=message):
        xgrad.layer_norm(xgrad.zeros(*shape), normalized)


def test_layer_norm_checks_weight_and_bias_shapes():
    with pytest.raises(RuntimeError, match=r"Expected weight to be of same shape as normalized_shape, but got weight of shape \[2\]"):
        xgrad.layer_norm(xgrad.zeros(2, 3), [3], weight=xgrad.ones(2))
    with pytest.raises(RuntimeError, match="Expected bias to be of same shape"):
        xgrad.layer_norm(xgrad.zeros(2, 3), (3,), bias=xgrad.ones(1))
    x = jnp.asarray(X234)
    mu = x.mean(axis=(1, 2), keepdims=True)
    expected = (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(axis=(1, 2), keepdims=True) + 1e-5)
    _close(xgrad.layer_norm(xgrad.tensor(X234), [3, 4]), expected)


# -- pow at 0 --------------------------------------------------------------------------
# (x, y, d/dx x**y, d/dy x**y) as PyTorch's pow_backward_self / pow_backward_exponent define
# them: d/dx is 0 where y == 0; d/dy at x == 0 is 0 for y >= 0 and -inf for y < 0.
POW_AT_ZERO = [
    (0.0, -1.0, -math.inf, -math.inf),
    (0.0, -2.0, -math.inf, -math.inf),
    (0.0, 0.0, 0.0, 0.0),
    (0.0, 1.0, 1.0, 0.0),
    (0.0, 2.0, 0.0, 0.0),
    (0.0, 0.5, math.inf, 0.0),
    (2.0, 0.0, 0.0, math.log(2.0)),
    (2.0, -1.0, -0.25, 0.5 * math.log(2.0)),
]


@COMPILED
def test_pow_grads_at_zero_match_pytorch(compiled):
    x = xgrad.tensor([p[0] for p in POW_AT_ZERO], dtype=jnp.float64, requires_grad=True)
    y = xgrad.tensor([p[1] for p in POW_AT_ZERO], dtype=jnp.float64, requires_grad=True)
    (x**y).sum().backward(compiled=compiled)
    _close(x.grad, [p[2] for p in POW_AT_ZERO])
    _close(y.grad, [p[3] for p in POW_AT_ZERO])


@COMPILED
def test_pow_with_scalar_operands_at_zero(compiled):
    x = xgrad.tensor([0.0, 1.0], dtype=jnp.float64, requires_grad=True)
    (x**0).sum().backward(compiled=compiled)  # PyTorch: zeros, not 0 * 0**-1 = nan
    _close(x.grad, [0.0, 0.0])
    b = xgrad.tensor([-1.0, 0.0, 2.0], dtype=jnp.float64, requires_grad=True)
    (0.0**b).sum().backward(compiled=compiled)
    _close(b.grad, [-math.inf, 0.0, 0.0])


# -- max / min / amax / amin: ties and NaN ---------------------------------------------
# Which rule (PyTorch's derivatives.yaml):
#   amax/amin (any dim, also all dims): scale_grad_by_count: ties share evenly; a slice whose
#     result is NaN matches no entry, so its grad is 0/0 = NaN throughout.
#   max()/min() without dim: evenly_distribute_backward: ties share evenly, and when the
#     result is NaN the NaN entries share it.
#   max(dim)/min(dim): value_selecting_reduction_backward: the whole grad to the returned index.
NAN = math.nan


@COMPILED
@pytest.mark.parametrize(
    "call, values, expected",
    [
        (lambda t: xgrad.amax(t), [1.0, 3.0, 3.0, 2.0], [0.0, 0.5, 0.5, 0.0]),
        (lambda t: xgrad.amin(t.reshape(2, 2), 1).sum(), [1.0, 1.0, 2.0, 0.0], [0.5, 0.5, 0.0, 1.0]),
        (lambda t: xgrad.amax(t), [1.0, NAN, NAN, 2.0], [NAN, NAN, NAN, NAN]),
        (lambda t: xgrad.amax(t.reshape(2, 2), 1).sum(), [1.0, NAN, 2.0, 2.0], [NAN, NAN, 0.5, 0.5]),
        (lambda t: xgrad.max(t), [1.0, 3.0, 3.0, 3.0], [0.0, 1 / 3, 1 / 3, 1 / 3]),
        (lambda t: xgrad.min(t), [1.0, NAN, 0.0, NAN], [0.0, 0.5, 0.0, 0.5]),
        (lambda t: xgrad.max(t), [NAN, NAN, NAN, NAN], [0.25, 0.25, 0.25, 0.25]),
        (lambda t: xgrad.max(t.reshape(2, 2), 1).values.sum(), [3.0, 3.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.0]),
        (lambda t: xgrad.min(t.reshape(2, 2), 0).values.sum(), [1.0, NAN, 1.0, 2.0], [1.0, 1.0, 0.0, 0.0]),
    ],
    ids=["amax ties", "amin dim ties", "amax NaN", "amax dim NaN row", "max() ties", "min() NaN", "max() all NaN",
         "max(dim) ties first", "min(dim) NaN"],
)
def test_extremum_gradients_with_ties_and_nan(compiled, call, values, expected):
    x = xgrad.tensor(values, dtype=jnp.float64, requires_grad=True)
    call(x).backward(compiled=compiled)
    _close(x.grad, expected)


# -- cross_entropy ---------------------------------------------------------------------
def _ref_cross_entropy(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """PyTorch's documented cross_entropy, written with jnp (class dim 1)."""
    axis = 1 if logits.ndim > 1 else 0
    n_classes = logits.shape[axis]
    logp = jax.nn.log_softmax(logits, axis=axis)
    if jnp.issubdtype(target.dtype, jnp.floating):
        q = target * (1 - label_smoothing) + label_smoothing / n_classes
        loss = -jnp.sum(q * logp, axis=axis)
        return {"mean": jnp.mean, "sum": jnp.sum, "none": lambda v: v}[reduction](loss)
    kept = target != ignore_index
    safe = jnp.where(kept, target, 0)
    nll = -jnp.squeeze(jnp.take_along_axis(logp, jnp.expand_dims(safe, axis), axis), axis) * kept
    smooth = -jnp.sum(logp, axis=axis) * kept
    if reduction == "mean":
        return (1 - label_smoothing) * nll.sum() / kept.sum() + label_smoothing / n_classes * smooth.sum() / kept.sum()
    reduce = {"sum": jnp.sum, "none": lambda v: v}[reduction]
    return (1 - label_smoothing) * reduce(nll) + label_smoothing / n_classes * reduce(smooth)


LOGITS = {
    "(N,C)": np.sin(np.arange(12.0)).reshape(4, 3),
    "(N,C,d)": np.cos(np.arange(24.0)).reshape(2, 3, 4),
    "(C,)": np.array([0.5, -1.0, 2.0]),
}
TARGETS = {
    "(N,C)": np.array([2, -100, 0, 1]),
    "(N,C,d)": np.array([[0, 1, 2, -100], [2, 2, 1, 0]]),
    "(C,)": np.array(2),
}


@COMPILED
@pytest.mark.parametrize("shape", sorted(LOGITS))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_cross_entropy_class_indices_match_pytorch_formulas(compiled, shape, reduction, label_smoothing):
    logits, target = LOGITS[shape], TARGETS[shape]
    ref = lambda z: _ref_cross_entropy(z, jnp.asarray(target), reduction=reduction, label_smoothing=label_smoothing)
    x = xgrad.tensor(logits, requires_grad=True)
    loss = xgrad.cross_entropy(x, xgrad.tensor(target), reduction=reduction, label_smoothing=label_smoothing)
    expected, pullback = jax.vjp(ref, jnp.asarray(logits))
    _close(loss, expected)
    cotangent = np.linspace(0.5, 1.5, expected.size).reshape(expected.shape)
    loss.backward(xgrad.tensor(cotangent), compiled=compiled)
    _close(x.grad, pullback(jnp.asarray(cotangent))[0])


@COMPILED
def test_cross_entropy_custom_ignore_index_and_probabilities(compiled):
    logits = LOGITS["(N,C)"]
    x = xgrad.tensor(logits, requires_grad=True)
    target = np.array([1, 2, 2, 0])
    loss = xgrad.cross_entropy(x, target, ignore_index=2)
    expected, pullback = jax.vjp(lambda z: _ref_cross_entropy(z, jnp.asarray(target), ignore_index=2), jnp.asarray(logits))
    _close(loss, expected)
    loss.backward(compiled=compiled)
    _close(x.grad, pullback(jnp.ones(()))[0])

    probs = jax.nn.softmax(jnp.asarray(logits[::-1].copy()), axis=1)
    y = xgrad.tensor(logits, requires_grad=True)
    xgrad.cross_entropy(y, xgrad.tensor(probs), label_smoothing=0.1).backward(compiled=compiled)
    _close(y.grad, jax.grad(lambda z: _ref_cross_entropy(z, probs, label_smoothing=0.1))(jnp.asarray(logits)))


def _ref_weighted_cross_entropy(logits, target, weight, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """PyTorch's class-weighted cross_entropy from its documented formula, class dim 1."""
    n_classes = logits.shape[1]
    shape = (n_classes,) + (1,) * (logits.ndim - 2)
    w = weight.reshape(shape)
    logp = jax.nn.log_softmax(logits, axis=1)
    if jnp.issubdtype(target.dtype, jnp.floating):
        loss = -jnp.sum((target * (1 - label_smoothing) + label_smoothing / n_classes) * w * logp, axis=1)
        return {"mean": jnp.mean, "sum": jnp.sum, "none": lambda v: v}[reduction](loss)
    kept = target != ignore_index
    safe = jnp.where(kept, target, 0)
    onehot = jnp.moveaxis(jax.nn.one_hot(safe, n_classes), -1, 1)
    q = (1 - label_smoothing) * onehot + label_smoothing / n_classes
    loss = -jnp.sum(q * w * logp, axis=1) * kept
    if reduction == "mean":
        return loss.sum() / jnp.sum(weight[safe] * kept)
    return {"sum": jnp.sum, "none": lambda v: v}[reduction](loss)


@COMPILED
@pytest.mark.parametrize("shape", ["(N,C)", "(N,C,d)"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_class_weights_match_pytorch_formulas(compiled, shape, reduction):
    logits, target = LOGITS[shape], TARGETS[shape]
    weight = np.array([0.5, 2.0, 1.25])
    x = xgrad.tensor(logits, requires_grad=True)
    loss = xgrad.cross_entropy(x, target, xgrad.tensor(weight), reduction=reduction, label_smoothing=0.1)
    ref = lambda z: _ref_weighted_cross_entropy(z, jnp.asarray(target), jnp.asarray(weight), reduction=reduction,
                                                 label_smoothing=0.1)
    expected, pullback = jax.vjp(ref, jnp.asarray(logits))
    _close(loss, expected)
    cotangent = np.linspace(0.5, 1.5, expected.size).reshape(expected.shape)
    loss.backward(xgrad.tensor(cotangent), compiled=compiled)
    _close(x.grad, pullback(jnp.asarray(cotangent))[0])
    probs = jax.nn.softmax(jnp.asarray(logits[::-1].copy()), axis=1)
    _close(xgrad.cross_entropy(xgrad.tensor(logits), xgrad.tensor(probs), xgrad.tensor(weight), reduction=reduction),
           _ref_weighted_cross_entropy(jnp.asarray(logits), probs, jnp.asarray(weight), reduction=reduction))


def test_cross_entropy_weight_checks():
    x = xgrad.zeros(2, 3)
    with pytest.raises(RuntimeError, match=r"^weight tensor should be defined either for all 3 classes or no classes but got weight tensor of shape: \[2\]$"):
        xgrad.cross_entropy(x, [0, 1], xgrad.ones(2))
    with pytest.raises(RuntimeError, match="the derivative for 'weight' is not implemented"):
        xgrad.cross_entropy(x, [0, 1], xgrad.ones(3, requires_grad=True))


def test_cross_entropy_all_targets_ignored_is_nan_as_in_pytorch():
    loss = xgrad.cross_entropy(xgrad.tensor(LOGITS["(N,C)"]), [-100] * 4)
    assert math.isnan(loss.item())
    _close(xgrad.cross_entropy(xgrad.tensor(LOGITS["(N,C)"]), [-100] * 4, reduction="sum"), 0.0)


@pytest.mark.parametrize(
    "logits_shape, target, error, message",
    [
        ((2, 3, 5), np.zeros((2, 3), np.int32), RuntimeError, r"^Expected target size \[2, 5\], got \[2, 3\]$"),
        ((4, 3), np.zeros(3, np.int32), ValueError, r"^Expected input batch_size \(4\) to match target batch_size \(3\)\.$"),
        ((4, 3), np.zeros((4, 1), np.int32), RuntimeError, "^0D or 1D target tensor expected, multi-target not supported$"),
        ((4, 3), np.zeros(4, np.float32), RuntimeError, "expected scalar type Long but found Float"),
        ((4, 3), np.zeros((4, 3), np.int32), RuntimeError, "Expected floating point type for target with class probabilities"),
        ((4, 3), np.array([0, 1, 3, 0]), IndexError, r"^Target 3 is out of bounds\.$"),
        ((4, 3), np.array([0, -1, 1, 0]), IndexError, r"^Target -1 is out of bounds\.$"),
        ((), np.array(0), IndexError, "Dimension out of range"),
    ],
    ids=["(B,T,V) with (B,T)", "batch", "2-d target", "float target", "int probabilities", "too large", "negative", "0-dim"],
)
@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_cross_entropy_rejects_bad_targets(logits_shape, target, error, message, kind):
    with pytest.raises(error, match=message):
        xgrad.cross_entropy(xgrad.zeros(*logits_shape), target if kind == "numpy" else xgrad.tensor(target))


def test_cross_entropy_bad_arguments():
    x, t = xgrad.zeros(2, 3), [0, 1]
    with pytest.raises(ValueError, match="^max is not a valid value for reduction$"):
        xgrad.cross_entropy(x, t, reduction="max")
    with pytest.raises(RuntimeError, match="^label_smoothing must be between 0.0 and 1.0. Got: 1.5$"):
        xgrad.cross_entropy(x, t, label_smoothing=1.5)


def test_cross_entropy_backward_keeps_batch_sharded_labels_sharded():
    # The forward builds the one-hot elementwise from the labels and the rule reads it, so
    # under a batch sharding XLA partitions both without gathering the labels onto every device.
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from xgrad.ops.nn import _cross_entropy_grad, _cross_entropy_impl

    devices = jax.devices()[:2]
    mesh = Mesh(np.array(devices), ("batch",))
    rows = NamedSharding(mesh, PartitionSpec("batch"))

    def backward(g, logits, labels):
        params = {"axis": 1, "ignore_index": -100, "label_smoothing": 0.1}
        out = [xgrad.Tensor(o) for o in _cross_entropy_impl(logits, labels, reduction="none", **params)]
        grads = (xgrad.Tensor(g), xgrad.Tensor(jnp.zeros_like(logits)), None, None)
        return _cross_entropy_grad(grads, out, xgrad.Tensor(logits), xgrad.Tensor(labels), **params)._array

    args = (jnp.ones(8), jnp.zeros((8, 16)), jnp.zeros(8, jnp.int32))
    compiled = jax.jit(backward, in_shardings=(rows, rows, rows), out_shardings=rows).lower(*args).compile()
    hlo = compiled.as_text()
    assert len(devices) == 2
    assert "all-gather" not in hlo and "all-to-all" not in hlo and "collective-permute" not in hlo
    assert "[4,16]" in hlo  # each device computes its own 4 rows


# -- arguments PyTorch refuses: its exception type and words, never JAX's or a silent result ----
def _load_state_dict_value(value):
    model = xgrad.nn.Linear(2, 2, key=0)
    model.load_state_dict({**model.state_dict(), "weight": value})


def _vmap_none():
    return xgrad.func.vmap(lambda t: None)(xgrad.ones(3))


def _dual_of_a_dual():
    from xgrad.autograd import forward_ad as fwAD

    with fwAD.dual_level():
        fwAD.make_dual(fwAD.make_dual(xgrad.ones(2), xgrad.ones(2)), xgrad.zeros(2))


def _set_row(value):
    x = xgrad.ones(2, 3)
    x[0] = value


_IMG, _K = xgrad.ones(1, 1, 4, 4), xgrad.ones(1, 1, 2, 2)
_P = xgrad.ones(2, requires_grad=True)
_DS = xgrad.utils.data.TensorDataset(xgrad.ones(4))
NAN = math.nan
ARGUMENT_ERRORS = [
    # convolutions
    ("conv2d stride of 3", lambda: xgrad.conv2d(_IMG, _K, stride=(1, 1, 1)), RuntimeError,
     r"^expected stride to be a single integer value or a list of 2 values to match the convolution dimensions, but got stride=\[1, 1, 1\]$"),
    ("conv2d padding of 3", lambda: xgrad.conv2d(_IMG, _K, padding=(1, 1, 1)), RuntimeError, "^expected padding to be a single integer"),
    ("conv2d dilation of 1", lambda: xgrad.conv2d(_IMG, _K, dilation=(1,)), RuntimeError, r"list of 2 values .* dilation=\[1\]$"),
    ("conv1d stride of 2", lambda: xgrad.conv1d(xgrad.ones(1, 1, 4), xgrad.ones(1, 1, 2), stride=(1, 1)), RuntimeError,
     r"list of 1 values to match the convolution dimensions, but got stride=\[1, 1\]$"),
    ("conv2d zero-size kernel", lambda: xgrad.conv2d(_IMG, xgrad.ones(1, 1, 0, 2)), RuntimeError,
     "^kernel size should be greater than zero, but got kernel_height: 0 kernel_width: 2$"),
    # normalisation, optimizers, data
    ("layer_norm int shape", lambda: xgrad.nn.functional.layer_norm(xgrad.ones(2, 4), 4), TypeError,
     r"^layer_norm\(\): argument 'normalized_shape' \(position 2\) must be tuple of ints, not int$"),
    ("SGD of a dict", lambda: xgrad.optim.SGD({"a": _P}, lr=0.1), TypeError,
     "^optimizer can only optimize Tensors, but one of the params is str$"),
    ("DataLoader prefetch_factor", lambda: xgrad.utils.data.DataLoader(_DS, prefetch_factor=2), ValueError,
     "^prefetch_factor option could only be specified in multiprocessing"),
    ("DataLoader persistent_workers", lambda: xgrad.utils.data.DataLoader(_DS, persistent_workers=True), ValueError,
     r"^persistent_workers option needs num_workers > 0$"),
    ("DataLoader timeout", lambda: xgrad.utils.data.DataLoader(_DS, timeout=-1), ValueError, "^timeout option should be non-negative$"),
    ("RandomSampler replacement", lambda: xgrad.utils.data.RandomSampler(_DS, replacement="no"), TypeError,
     "^replacement should be a boolean value, but got replacement=no$"),
    ("load_state_dict list", lambda: _load_state_dict_value([[1.0, 2.0], [3.0, 4.0]]), RuntimeError,
     "While copying the parameter named \"weight\", expected torch.Tensor or Tensor-like object from checkpoint but "
     "received <class 'list'>"),
    ("load_state_dict str", lambda: _load_state_dict_value("abc"), RuntimeError, "but received <class 'str'>"),
    # losses
    ("bce target > 1", lambda: xgrad.nn.functional.binary_cross_entropy(xgrad.tensor([0.5]), xgrad.tensor([2.0])),
     RuntimeError, "^all elements of target should be between 0 and 1$"),
    ("bce target < 0", lambda: xgrad.nn.functional.binary_cross_entropy(xgrad.tensor([0.5]), xgrad.tensor([-0.5])),
     RuntimeError, "^all elements of target should be between 0 and 1$"),
    ("nll_loss float target", lambda: xgrad.nn.functional.nll_loss(xgrad.zeros(2, 3), xgrad.tensor([0.0, 1.0])),
     RuntimeError, "^expected scalar type Long but found Float$"),
    # einsum, indexing, broadcasting, None
    ("einsum unknown output", lambda: xgrad.einsum("ij->k", xgrad.ones(2, 2)), RuntimeError,
     "^einsum\\(\\): output subscript k does not appear in the equation for any input operand$"),
    ("einsum repeated output", lambda: xgrad.einsum("ij->ii", xgrad.ones(2, 2)), RuntimeError,
     "^einsum\\(\\): output subscript i appears more than once in the output$"),
    ("einsum bad character", lambda: xgrad.einsum("i1->i", xgrad.ones(2, 2)), RuntimeError,
     "^einsum\\(\\): invalid subscript given at index 1 in the equation string, subscripts must be in \\[a-zA-Z\\]$"),
    ("float index", lambda: xgrad.ones(3)[1.0], IndexError,
     r"^only integers, slices \(`:`\), ellipsis \(`...`\), None and long or byte Variables are valid indices \(got float\)$"),
    ("float index setitem", lambda: xgrad.ones(3).__setitem__((0, 1.5), 0.0), IndexError, r"valid indices \(got float\)$"),
    ("float index tensor", lambda: xgrad.ones(3)[xgrad.tensor([1.0])], IndexError,
     "^tensors used as indices must be long, int, byte or bool tensors$"),
    ("too many indices", lambda: xgrad.ones(2, 3)[0, 1, 2], IndexError, "^too many indices for tensor of dimension 2$"),
    ("setitem broadcast", lambda: _set_row(xgrad.ones(4)), RuntimeError,
     r"^shape mismatch: value tensor of shape \[4\] cannot be broadcast to indexing result of shape \[3\]$"),
    ("add broadcast", lambda: xgrad.ones(2) + xgrad.ones(3), RuntimeError,
     r"^The size of tensor a \(2\) must match the size of tensor b \(3\) at non-singleton dimension 0$"),
    ("None to exp", lambda: xgrad.exp(None), TypeError, r"^exp\(\): argument \(position 1\) must be Tensor, not NoneType$"),
    ("None to add", lambda: xgrad.ones(2) + None, TypeError, "must be Tensor, not NoneType$"),
    ("tensor(None)", lambda: xgrad.tensor(None), RuntimeError, "^Could not infer dtype of NoneType$"),
    # NaN and inf where an integer goes
    ("arange nan", lambda: xgrad.arange(NAN), RuntimeError, "^unsupported range: 0 -> nan$"),
    ("arange inf", lambda: xgrad.arange(0, math.inf), RuntimeError, "^unsupported range: 0 -> inf$"),
    ("zeros nan", lambda: xgrad.zeros(NAN), TypeError, r"^shape must be a sequence of ints, got \[nan\]$"),
    ("linspace nan steps", lambda: xgrad.linspace(0, 1, NAN), TypeError,
     r"^linspace\(\): argument 'steps' \(position 3\) must be int, not float$"),
    ("eye inf", lambda: xgrad.eye(math.inf), TypeError, r"^eye\(\): argument 'n' \(position 1\) must be int, not float$"),
    ("randperm nan", lambda: xgrad.randperm(NAN), TypeError, r"^randperm\(\): argument 'n' \(position 1\) must be int"),
    ("one_hot nan", lambda: xgrad.nn.functional.one_hot(xgrad.tensor([0, 1]), NAN), TypeError,
     r"^one_hot\(\): argument 'num_classes' \(position 2\) must be int, not float$"),
    ("topk nan", lambda: xgrad.ones(4).topk(NAN), TypeError, r"^topk\(\): argument 'k' \(position 2\) must be int"),
    ("select nan", lambda: xgrad.ones(4).select(0, NAN), TypeError, r"^select\(\): argument 'index' \(position 2\) must be int"),
    ("pad nan", lambda: xgrad.nn.functional.pad(xgrad.ones(4), (NAN, 1)), TypeError, r"^pad\(\): argument 'pad' \(position 2\)"),
    ("interpolate nan", lambda: xgrad.nn.functional.interpolate(xgrad.ones(1, 1, 4), size=NAN), TypeError,
     r"^interpolate\(\): argument 'size' \(position 2\) must be int, not float$"),
    # modules and autograd
    ("embed_dim not divisible", lambda: xgrad.nn.MultiheadAttention(5, 2, key=0), AssertionError,
     "^embed_dim must be divisible by num_heads"),
    ("attention width", lambda: xgrad.nn.MultiheadAttention(4, 2, key=0)(*[xgrad.ones(3, 1, 5)] * 3), AssertionError,
     "^was expecting embedding dimension of 4, but got 5$"),
    ("make_dual of a dual", _dual_of_a_dual, RuntimeError,
     "^Making a dual Tensor based on a Tensor that already has a forward gradient at the same level 0 is not supported.$"),
    # xgrad.func
    ("vmap returning None", _vmap_none, ValueError,
     r"^vmap\(<lambda>, \.\.\.\): `<lambda>` must only return Tensors, got type <class 'NoneType'>"),
    ("vmap no inputs", lambda: xgrad.func.vmap(lambda: 1)(), ValueError, r"^vmap\(<lambda>\)\(<inputs>\): got no inputs"),
    ("vmap in_dim range", lambda: xgrad.func.vmap(lambda t: t, in_dims=5)(xgrad.ones(2)), ValueError,
     r"Got in_dim=5 for some input, but that input is a Tensor of dimensionality 1 so expected in_dim to satisfy -1 <= in_dim < 1\.$"),
    ("vmap non-Tensor", lambda: xgrad.func.vmap(lambda t: t)(3), ValueError,
     "Got in_dim=0 for an input but the input is of type <class 'int'>. We cannot vmap over non-Tensor arguments"),
    ("vmap sizes", lambda: xgrad.func.vmap(lambda a, b: a + b)(xgrad.ones(2), xgrad.ones(3)), ValueError,
     r"Expected all tensors to have the same size in the mapped dimension, got sizes \[2, 3\] for the mapped dimension$"),
    ("vmap out_dims", lambda: xgrad.func.vmap(lambda t: t, out_dims=3)(xgrad.ones(2)), IndexError,
     r"^Dimension out of range \(expected to be in range of \[-1, 0\], but got 3\)"),  # (JAX adds a note)
    ("grad argnums float", lambda: xgrad.func.grad(lambda t: t.sum(), argnums=1.5)(xgrad.ones(2)), RuntimeError,
     r"^grad_and_value: argnums must be int or Tuple\[int, \.\.\.\], got: <class 'float'>$"),
    ("grad of ints", lambda: xgrad.func.grad(lambda t: t.sum())(xgrad.tensor([1, 2])), RuntimeError,
     "^only Tensors of floating point and complex dtype can require gradients$"),
    ("jvp tangent shape", lambda: xgrad.func.jvp(lambda t: t, (xgrad.ones(2),), (xgrad.ones(3),)), RuntimeError,
     r"^Trying to set a forward gradient that has a different size than that of the original Tensor"),
    ("vjp cotangent shape", lambda: xgrad.func.vjp(lambda t: t * 2, xgrad.ones(2))[1](xgrad.ones(3)), RuntimeError,
     r"^Mismatch in shape: grad_output\[0\] has a shape of \[3\] and output\[0\] has a shape of \[2\]\.$"),
    ("None target", lambda: xgrad.nn.functional.mse_loss(xgrad.ones(2), None), TypeError,
     r"^mse_loss\(\): argument 'target' \(position 2\) must be Tensor, not NoneType$"),
    ("None class target", lambda: xgrad.nn.functional.cross_entropy(xgrad.ones(2, 3), target=None), TypeError,
     r"^cross_entropy\(\): argument 'target' \(position 2\) must be Tensor, not NoneType$"),
    ("None pair target", lambda: xgrad.nn.functional.cosine_embedding_loss(xgrad.ones(2, 3), xgrad.ones(2, 3), None),
     TypeError, r"^cosine_embedding_loss\(\): argument 'target' \(position 3\) must be Tensor, not NoneType$"),
]


@pytest.mark.parametrize("call, error, message", [r[1:] for r in ARGUMENT_ERRORS], ids=[r[0] for r in ARGUMENT_ERRORS])
def test_arguments_pytorch_refuses_raise_its_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("call, expected", [
    (lambda: xgrad.conv2d(_IMG, _K, stride=[2, 2], padding=(0, 1), dilation=1).shape, (1, 1, 2, 3)),
    (lambda: xgrad.nn.functional.layer_norm(xgrad.tensor([[1.0, 3.0]]), [2], eps=0.0).tolist(), [[-1.0, 1.0]]),
    (lambda: xgrad.nn.functional.binary_cross_entropy(xgrad.tensor([0.5, 0.5]), xgrad.tensor([0.0, 1.0])).item(),
     pytest.approx(math.log(2.0))),
    (lambda: xgrad.einsum("ij,jk->ki", xgrad.ones(2, 3), xgrad.ones(3, 4)).shape, (4, 2)),
    (lambda: xgrad.ones(2, 3)[True, 0].shape, (1, 3)),
    (lambda: xgrad.ones(2, 3)[None, ..., 1].shape, (1, 2)),
    (lambda: len(list(xgrad.utils.data.DataLoader(_DS, num_workers=2, prefetch_factor=2, persistent_workers=True))), 4),
    (lambda: xgrad.func.vmap(lambda t: (t * 2, t), out_dims=-1)(xgrad.ones(2, 3))[0].shape, (3, 2)),
], ids=["conv2d lists", "layer_norm list", "bce in range", "einsum output", "bool index", "None index", "workers", "vmap out_dims"])
def test_valid_arguments_next_to_the_refused_ones(call, expected):
    assert call() == expected
