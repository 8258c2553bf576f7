"""Indexing primitives: ``x[idx]``, ``x[idx] = v``, gather / scatter_add, and composites."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.grad_mode import no_grad
from xgrad.ops import shape_rules
from xgrad.ops._util import as_array, canonical_dim, check_index_range
from xgrad.ops.autocast import autocast_op
from xgrad.ops.elementwise import where
from xgrad.ops.registry import defprim
from xgrad.ops.views import is_basic_index, strides_of, track_view
from xgrad.tensor import Tensor


def _index_arg(index: Any) -> Any:
    """A Python index with tensors replaced by their arrays."""
    if isinstance(index, Tensor):
        return as_array(index)
    if isinstance(index, tuple):
        return tuple(_index_arg(i) for i in index)
    if isinstance(index, list):
        return _index_array(index)
    return index


def _index_array(index: Any) -> Any:
    """An index as an array; an empty list is an empty integer index, as in PyTorch."""
    if isinstance(index, Tensor):
        return as_array(index)
    array = jnp.asarray(index)
    return array.astype(int) if array.size == 0 and isinstance(index, (list, tuple)) else array


def _scatter_into_zeros(g: Any, index: Any, shape: tuple[int, ...]) -> Any:
    return jnp.zeros_like(g, shape=shape).at[index].add(g)  # on g's device


_getitem = defprim(
    "getitem",
    lambda x, index: x[index],
    (lambda g, out, x, index: _index_scatter(g, index=index, shape=x.shape),),
    save=(),
    shape_rule=shape_rules.index,
)
_index_scatter: Callable[..., Any] = defprim(
    "index_scatter",
    _scatter_into_zeros,
    (lambda g, out, src, index, shape: _getitem(g, index=index),),
    save=(),
)
_index_put: Callable[..., Any] = defprim(
    "index_put",
    lambda x, v, index: x.at[index].set(v),
    (lambda g, out, x, v, index: _index_put(g, 0.0, index=index), lambda g, out, x, v, index: _getitem(g, index=index)),
    save=(),
    shape_rule=shape_rules.index,
)


def _index_width(item: Any) -> int:
    """How many dims of ``x`` one index item consumes."""
    if item is None or isinstance(item, bool):  # a Python bool adds a dim, as None does
        return 0
    if getattr(item, "dtype", None) == jnp.bool_.dtype:
        return getattr(item, "ndim", 1)
    return 1


def check_index_bounds(shape: tuple[int, ...], index: Any) -> None:
    """PyTorch's IndexError for an out-of-range integer or integer-array index of ``x[index]``.

    JAX would clamp a read and drop a write silently. Shared by ``x[index]`` and
    ``x[index] = v``; slices, ``None``, ``...`` and boolean masks need no check.
    """
    items = index if isinstance(index, tuple) else (index,)
    for item in items:
        if isinstance(item, (float, complex, str, np.floating)):  # JAX: a TypeError in its words
            raise IndexError("only integers, slices (`:`), ellipsis (`...`), None and long or byte Variables are valid "
                             f"indices (got {type(item).__name__})")
    if sum(_index_width(i) for i in items if i is not Ellipsis) > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
    dim = 0
    for pos, item in enumerate(items):
        if item is Ellipsis:
            dim = len(shape) - sum(_index_width(i) for i in items[pos + 1 :])
            continue
        if dim < len(shape) and not isinstance(item, (slice, bool)) and item is not None:
            size = shape[dim]
            if isinstance(item, int):
                if not -size <= item < size:
                    raise IndexError(f"index {item} is out of bounds for dimension {dim} with size {size}")
            else:
                check_index_range(item, size, f"index {{index}} is out of bounds for dimension {dim} with size {size}")
        dim += _index_width(item)


def getitem(x: Tensor, index: Any) -> Tensor:
    """``x[index]``: basic slicing, ``None``/``...``, integer-array and boolean-mask indexing.

    >>> import xgrad
    >>> x = xgrad.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> xgrad.getitem(x, (slice(None), 1)).tolist()
    [2.0, 4.0]
    """
    if not isinstance(index, slice):
        check_index_bounds(x.shape, index)
    index = _index_arg(index)
    out = _getitem(x, index=index)
    return track_view(x, out, "getitem", {"index": index}) if is_basic_index(index) else out


def setitem(x: Tensor, index: Any, value: Any) -> None:
    """``x[index] = value`` in place: rebinds the storage and bumps ``_version``.

    >>> import xgrad
    >>> x = xgrad.zeros(3)
    >>> xgrad.setitem(x, 1, 5.0)
    >>> x.tolist()
    [0.0, 5.0, 0.0]
    """
    shape = getattr(value, "shape", ())
    if shape and shape[0] == 1:  # PyTorch drops the value's leading size-1 dims (``slicePrefix1sSize``)
        lead = next((i for i, n in enumerate(shape) if n != 1), len(shape))
        value = value.reshape(shape[lead:])
    if x._view is not None and is_basic_index(index) and _repeats_elements(x):
        # An expanded tensor: the write goes to the view ``x[index]``, which is allowed when
        # it has no repeated elements itself (``e[0] = v``), as in PyTorch.
        sub = getitem(x, index)
        sub.copy_(value if isinstance(value, Tensor) else Tensor(jnp.asarray(value, sub.dtype)))
        return
    x._check_inplace()
    check_index_bounds(x.shape, index)
    index = _index_arg(index)
    try:
        result = _index_put(x._alias(), value, index=index)
    except ValueError:  # JAX's words for a value that does not broadcast to the indexed shape
        target = jax.eval_shape(lambda a: a[index], jax.ShapeDtypeStruct(x.shape, x.dtype)).shape
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(getattr(value, 'shape', ()))} cannot be "
                           f"broadcast to indexing result of shape {list(target)}") from None
    x._rebind(result)


def _repeats_elements(x: Tensor) -> bool:
    return any(s == 0 and n > 1 for s, n in zip(strides_of(x), x.shape, strict=True))


# NOTE [Gather along a dim is batched]
# torch.gather and scatter_add pair each index with the entries at its own position in
# the other dims. Written as XLA's gather/scatter with those dims as batching dims (as
# ``jnp.take_along_axis`` writes it), the indices are ``index`` itself, and XLA's SPMD
# partitioner keeps a tensor split over the other dims where it is: each device gathers
# from its own part. Written with full index arrays (``x[index, iota, ...]``) instead, the
# partitioner gathered those arrays onto every device, once for the forward and again
# for the backward's scatter, which rebuilt them (a max pool's step on a 2x2 mesh moved
# 1.45x ``jax.jit``'s bytes; benchmarks/RESULTS.md, FSDP). PyTorch lets ``index`` be
# smaller than ``x`` (and ``src``) in the other dims: only their leading part is read.
def _leading(x: Any, shape: tuple[int, ...], dim: int | None = None) -> Any:
    """``x``'s leading part of ``shape`` in the dims other than ``dim`` (in all, without one); ``x`` where it fits."""
    if all(n == m for d, (n, m) in enumerate(zip(x.shape, shape, strict=True)) if d != dim):
        return x
    return x[tuple(slice(None) if d == dim else slice(n) for d, n in enumerate(shape))]


def _batching(x: Any, dim: int) -> tuple[int, ...]:
    return tuple(d for d in range(x.ndim) if d != dim)


def _gather_along(x: Any, index: Any, dim: int) -> Any:
    if x.ndim == 0:  # one entry; the index (checked) addresses it
        return x
    x = _leading(x, index.shape, dim)
    numbers = jax.lax.GatherDimensionNumbers(
        offset_dims=(), collapsed_slice_dims=(dim,), start_index_map=(dim,),
        operand_batching_dims=_batching(x, dim), start_indices_batching_dims=_batching(x, dim),
    )
    return jax.lax.gather(x, index[..., None], numbers, (1,) * x.ndim, mode=jax.lax.GatherScatterMode.CLIP)


def _scatter_add_along(x: Any, index: Any, src: Any, dim: int) -> Any:
    if index.ndim != x.ndim:  # an empty index of another rank (the checks allow no other) adds nothing
        return x
    if x.ndim == 0:
        return x + src.astype(x.dtype)
    part = _leading(x, index.shape, dim)
    numbers = jax.lax.ScatterDimensionNumbers(
        update_window_dims=(), inserted_window_dims=(dim,), scatter_dims_to_operand_dims=(dim,),
        operand_batching_dims=_batching(x, dim), scatter_indices_batching_dims=_batching(x, dim),
    )
    added = jax.lax.scatter_add(
        part, index[..., None], _leading(src, index.shape).astype(x.dtype), numbers,
        mode=jax.lax.GatherScatterMode.FILL_OR_DROP,
    )
    return added if part is x else jax.lax.dynamic_update_slice(x, added, (0,) * x.ndim)


_gather = defprim(
    "gather",
    _gather_along,
    (lambda g, out, x, index, dim: _scatter_add(Tensor(jnp.zeros_like(g._array, shape=x.shape)), index, g, dim=dim), None),
    save=(1,),
)
_scatter_add: Callable[..., Any] = defprim(
    "scatter_add",
    _scatter_add_along,
    (lambda g, out, x, index, src, dim: g, None, lambda g, out, x, index, src, dim: _gather(g, index, dim=dim)),
    save=(1,),
)


def _check_scatter_gather(op: str, x: Tensor, dim: int, index: Tensor, src: Tensor | None = None) -> None:
    """PyTorch's shape, dtype and range checks of ``gather``/``scatter_add``'s ``index``."""
    if not jnp.issubdtype(index.dtype, jnp.integer):
        raise RuntimeError(f"{op}(): Expected dtype int64 for index, got {index.dtype}")
    if index.ndim != x.ndim and index.numel() > 0:
        raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
    if src is not None and jnp.issubdtype(src.dtype, jnp.inexact) != jnp.issubdtype(x.dtype, jnp.inexact):
        # PyTorch also refuses two float widths; xgrad casts, as JAX (with x64, float64 meets float32 often).
        raise RuntimeError("scatter(): Expected self.dtype to be equal to src.dtype")
    others = [("self", x)] + ([("src", src)] if src is not None else [])
    for name, t in others:
        if name == "src" and index.ndim != t.ndim:
            raise RuntimeError("Index tensor must have the same number of dimensions as src tensor")
        for d in range(index.ndim):
            if (d != dim or name == "src") and index.shape[d] > t.shape[d]:
                raise RuntimeError(
                    f"Size does not match at dimension {d} expected index {list(index.shape)} to be smaller than "
                    f"{name} {list(t.shape)} apart from dimension {dim}"
                )
    size = x.shape[dim] if x.ndim else 1
    # Negative indices are out of range here, as in PyTorch's gather and scatter.
    check_index_range(index, size, f"index {{index}} is out of bounds for dimension {dim} with size {size}", negative=False)


def gather(x: Tensor, dim: int, index: Any) -> Tensor:
    """``torch.gather``: ``out[i][j] = x[index[i][j]][j]`` for ``dim=0``, and so on.

    >>> import xgrad
    >>> x = xgrad.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> xgrad.gather(x, 1, xgrad.tensor([[1], [0]])).tolist()
    [[2.0], [3.0]]
    """
    dim = canonical_dim(dim, x.ndim)
    index = index if isinstance(index, Tensor) else Tensor(_index_array(index))
    _check_scatter_gather("gather", x, dim, index)
    if index.ndim != x.ndim and x.ndim:
        # An empty index of another rank (the checks allow no other): an empty result of its shape.
        return _gather(x, index.reshape((0,) * x.ndim), dim=dim).reshape(index.shape)
    return _gather(x, index, dim=dim)


@autocast_op
def scatter_add(x: Tensor, dim: int, index: Any, src: Tensor) -> Tensor:
    """``torch.scatter_add``: ``x`` with ``src`` added at ``index`` along ``dim``.

    >>> import xgrad
    >>> xgrad.scatter_add(xgrad.tensor([0.0, 0.0, 0.0]), 0, xgrad.tensor([0, 2, 0]), xgrad.tensor([1.0, 2.0, 3.0])).tolist()
    [4.0, 0.0, 2.0]
    """
    dim = canonical_dim(dim, x.ndim)
    index = index if isinstance(index, Tensor) else Tensor(_index_array(index))
    _check_scatter_gather("scatter_add", x, dim, index, src)
    return _scatter_add(x, index, src, dim=dim)


def index_select(x: Tensor, dim: int, index: Any) -> Tensor:
    """The entries of ``x`` at the 1-D ``index`` along ``dim``.

    >>> import xgrad
    >>> xgrad.index_select(xgrad.tensor([1.0, 2.0, 3.0]), 0, xgrad.tensor([2, 0])).tolist()
    [3.0, 1.0]
    """
    dim = canonical_dim(dim, x.ndim)
    index_array = _index_array(index)
    if index_array.ndim > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    if not jnp.issubdtype(index_array.dtype, jnp.integer):
        raise RuntimeError(f"index_select(): Expected dtype int32 or int64 for index, got {index_array.dtype}")
    # PyTorch's index_select and embedding take no negative indices (unlike indexing).
    check_index_range(index_array, x.shape[dim] if x.ndim else 1, "index out of range in self", negative=False)
    if x.ndim == 0:
        return _getitem(x, index=())
    return _getitem(x, index=(slice(None),) * dim + (index_array.reshape(-1),))


def embedding(
    input: Any, weight: Tensor, padding_idx: int | None = None, max_norm: float | None = None, norm_type: float = 2.0,
    scale_grad_by_freq: bool = False, sparse: bool = False,
) -> Tensor:
    """``F.embedding``: rows of ``weight`` at the integer ``input``.

    Args:
        padding_idx: the row that gets no gradient (its lookups still read it); negative counts from the end.
        max_norm: before the lookup, the looked-up rows whose ``norm_type``-norm exceeds it are
            scaled in place to that norm (under ``no_grad``, as PyTorch's ``embedding_renorm_``).

    >>> import xgrad
    >>> weight = xgrad.tensor([[0.0, 0.5], [1.0, 1.5]])
    >>> xgrad.embedding(xgrad.tensor([1, 1, 0]), weight).tolist()
    [[1.0, 1.5], [1.0, 1.5], [0.0, 0.5]]
    """
    if weight.ndim != 2:
        raise RuntimeError("'weight' must be 2-D")
    if scale_grad_by_freq or sparse:
        raise NotImplementedError("embedding: scale_grad_by_freq and sparse gradients are not supported (gradients are "
                                  "dense arrays); leave both False")
    index_array = _index_array(input)
    if not jnp.issubdtype(index_array.dtype, jnp.integer):
        raise RuntimeError(f"Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; but got {index_array.dtype} instead")
    num_embeddings = weight.shape[0]
    if padding_idx is not None:
        if not -num_embeddings <= padding_idx < num_embeddings:
            raise AssertionError("Padding_idx must be within num_embeddings")
        padding_idx %= num_embeddings
    check_index_range(index_array, num_embeddings, "index out of range in self", negative=False)
    if max_norm is not None:
        _renorm_rows(weight, index_array, float(max_norm), float(norm_type))
    rows = _getitem(weight, index=index_array)
    if padding_idx is None:
        return rows
    at_padding = Tensor(jnp.expand_dims(index_array == padding_idx, -1))
    return where(at_padding, rows.detach(), rows)  # the padding row's lookups pass no gradient back


def _renorm_rows(weight: Tensor, index: Any, max_norm: float, norm_type: float) -> None:
    """PyTorch's ``embedding_renorm_``: each looked-up row with norm above ``max_norm`` scaled to ``max_norm / (norm + 1e-7)``."""
    w = weight.array
    looked_up = jnp.zeros(w.shape[0], bool).at[index.reshape(-1)].set(True)
    magnitude = jnp.abs(w)
    norms = jnp.max(magnitude, axis=1) if norm_type == float("inf") else jnp.sum(magnitude**norm_type, axis=1) ** (1 / norm_type)
    scale = jnp.where(looked_up & (norms > max_norm), max_norm / (norms + 1e-7), 1.0)
    with no_grad():
        weight.copy_(Tensor((w * scale[:, None]).astype(w.dtype)))


class Sorted(NamedTuple):
    values: Tensor
    indices: Tensor


def sort(x: Tensor, dim: int = -1, descending: bool = False) -> Sorted:
    """Sorted values along ``dim`` and their indices; the gradient follows the values.

    >>> import xgrad
    >>> values, indices = xgrad.sort(xgrad.tensor([3.0, 1.0, 2.0]))
    >>> values.tolist(), indices.tolist()
    ([1.0, 2.0, 3.0], [1, 2, 0])
    """
    dim = canonical_dim(dim, x.ndim)
    if x.ndim == 0:
        indices = Tensor(jnp.zeros((), int))
    else:
        indices = Tensor(jnp.argsort(as_array(x), axis=dim, descending=descending, stable=True))
    # argsort's indices are in range by construction: no check needed.
    return Sorted(_gather(x, indices, dim=dim), indices)
