"""Layout ops PyTorch users reach for: ``unbind`` (one multi-output primitive), ``unfold``
(a primitive, a view), and the composites ``narrow``, ``select``, ``repeat``,
``repeat_interleave``, ``expand_as``, ``view_as``, ``reshape_as``, ``movedim``, ``diag``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from xgrad.ops._util import canonical_dim, check_int
from xgrad.ops.index import _index_scatter
from xgrad.ops.registry import defprim
from xgrad.ops.shape import broadcast_to, expand, reshape, sizes_or_keyword, stack, view
from xgrad.ops.views import mark_multi_output, track_view
from xgrad.tensor import Tensor

__all__ = [
    "diag", "expand_as", "movedim", "narrow", "repeat", "repeat_interleave", "reshape_as", "select", "unbind", "unfold",
    "view_as",
]


# NOTE [unbind is one node]
# As in PyTorch, ``unbind`` is one node with one output per slice (``output_nr`` 0..n-1),
# not n indexing nodes: its rule stacks the slices' grads (missing ones arrive as zeros).
# A primitive has a fixed number of outputs, so there is one per slice count, made on
# first use and kept (unregistered, as ``from_jax`` makes its primitives; the op specs
# cover them under the name ``unbind``). Each slice is also a view of ``x`` (as the
# basic index ``x[..., i]``), so an in-place op on it writes through to ``x``
# (NOTE [Views write through] in views.py).
_UNBIND: dict[int, Callable[..., Any]] = {}
_UNBIND_LOCK = threading.Lock()


def _unbind_impl(x: Any, axis: int) -> tuple[Any, ...]:
    return tuple(jnp.moveaxis(x, axis, 0))


def _unbind_grad(g: tuple[Tensor, ...], out: Any, x: Any, axis: int) -> Tensor:
    return stack(g, axis)


def _unbind_prim(n: int) -> Callable[..., Any]:
    prim = _UNBIND.get(n)
    if prim is None:
        with _UNBIND_LOCK:
            prim = _UNBIND.setdefault(n, defprim("unbind", _unbind_impl, (_unbind_grad,), save=(), num_outputs=n, register=False))
    return prim


def unbind(x: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    """The slices of ``x`` along ``dim``, as one node with an output per slice.

    >>> import xgrad
    >>> a, b = xgrad.unbind(xgrad.tensor([[1.0, 2.0], [3.0, 4.0]]), dim=1)
    >>> a.tolist(), b.tolist()
    ([1.0, 3.0], [2.0, 4.0])
    """
    if x.ndim == 0:
        raise IndexError("Dimension specified as 0 but tensor has no dimensions")
    axis = canonical_dim(dim, x.ndim)
    n = x.shape[axis]
    if n == 0:
        return ()
    if n == 1:  # one output: a primitive with one output returns a Tensor, not a tuple
        return (reshape(x, x.shape[:axis] + x.shape[axis + 1 :]),)
    # Each slice is a view of x (NOTE [Views write through]), as x[:, i] would be.
    lead = (slice(None),) * axis
    views = tuple(
        track_view(x, out, "getitem", {"index": (*lead, i)}) for i, out in enumerate(_unbind_prim(n)(x, axis=axis))
    )
    return mark_multi_output(views, "Unbind")


def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    """Elements ``start .. start + length - 1`` along ``dim`` (a negative ``start`` counts from the end).

    >>> import xgrad
    >>> xgrad.narrow(xgrad.arange(5.0), 0, 1, 3).tolist()
    [1.0, 2.0, 3.0]
    """
    if x.ndim == 0:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    axis = canonical_dim(dim, x.ndim)
    size = x.shape[axis]
    if not -size <= start <= size:
        raise IndexError(f"start out of range (expected to be in range of [{-size}, {size}], but got {start})")
    start = start % size if start < 0 else start
    if length < 0:
        raise RuntimeError("narrow(): length must be non-negative.")
    if start + length > size:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({size}).")
    return x[(slice(None),) * axis + (slice(start, start + length),)]


def select(x: Tensor, dim: int, index: int) -> Tensor:
    """The slice at ``index`` along ``dim``, that dim removed (``x[..., index, ...]``).

    >>> import xgrad
    >>> xgrad.select(xgrad.tensor([[1.0, 2.0], [3.0, 4.0]]), 1, -1).tolist()
    [2.0, 4.0]
    """
    if x.ndim == 0:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    check_int(index, "select", "index", 2)
    axis = canonical_dim(dim, x.ndim)
    size = x.shape[axis]
    if not -size <= index < size:
        raise IndexError(f"select(): index {index} out of range for tensor of size {list(x.shape)} at dimension {dim}")
    return x[(slice(None),) * axis + (index,)]


def _sizes(sizes: tuple[Any, ...]) -> tuple[int, ...]:
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        return tuple(sizes[0])
    return tuple(sizes)


def repeat(x: Tensor, *sizes: Any, **keywords: Any) -> Tensor:
    """PyTorch's ``Tensor.repeat``: tile ``x`` ``sizes[i]`` times along dim ``i`` (NumPy's ``tile``).

    Extra leading ``sizes`` add dims. Built from reshape and broadcast: the gradient
    sums the copies.

    >>> import xgrad
    >>> xgrad.repeat(xgrad.tensor([1.0, 2.0]), 2, 2).tolist()
    [[1.0, 2.0, 1.0, 2.0], [1.0, 2.0, 1.0, 2.0]]
    """
    reps = _sizes(sizes_or_keyword("repeat", "repeats", sizes, keywords))
    if len(reps) < x.ndim:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor")
    if any(r < 0 for r in reps):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {list(reps)}")
    shape = (1,) * (len(reps) - x.ndim) + x.shape
    # (s0, s1, ...) -> (1, s0, 1, s1, ...) -> (r0, s0, r1, s1, ...) -> (r0*s0, r1*s1, ...)
    spread = reshape(x, tuple(d for s in shape for d in (1, s)))
    tiled = broadcast_to(spread, tuple(d for r, s in zip(reps, shape, strict=True) for d in (r, s)))
    return reshape(tiled, tuple(r * s for r, s in zip(reps, shape, strict=True)))


def repeat_interleave(x: Tensor, repeats: Any, dim: int | None = None, *, output_size: int | None = None) -> Tensor:
    """Repeat each element ``repeats`` times along ``dim`` (the flattened tensor when ``None``).

    ``repeats`` is an int or a 1-D integer tensor with one count per element of ``dim``.

    >>> import xgrad
    >>> xgrad.repeat_interleave(xgrad.tensor([1.0, 2.0]), 2).tolist()
    [1.0, 1.0, 2.0, 2.0]
    >>> xgrad.repeat_interleave(xgrad.tensor([[1.0, 2.0]]), xgrad.tensor([1, 3]), dim=1).tolist()
    [[1.0, 2.0, 2.0, 2.0]]
    """
    if dim is None:
        x = reshape(x, (-1,))
        dim = 0
    axis = canonical_dim(dim, x.ndim)
    if isinstance(repeats, int):
        if repeats < 0:
            raise RuntimeError("repeats can not be negative")
        expanded = expand(x.unsqueeze(axis + 1), x.shape[: axis + 1] + (repeats,) + x.shape[axis + 1 :])
        out = reshape(expanded, x.shape[:axis] + (x.shape[axis] * repeats,) + x.shape[axis + 1 :])
    else:
        counts = jnp.asarray(repeats._array if isinstance(repeats, Tensor) else repeats)
        if counts.ndim == 0:
            return repeat_interleave(x, int(counts), axis, output_size=output_size)
        if counts.ndim != 1 or counts.shape[0] != x.shape[axis]:
            raise RuntimeError("repeats must have the same size as input along dim")
        if bool((counts < 0).any()):
            raise RuntimeError("repeats can not be negative")
        index = jnp.repeat(jnp.arange(x.shape[axis]), counts)
        out = x[(slice(None),) * axis + (index,)]
    if output_size is not None and out.shape[axis] != output_size:
        raise RuntimeError(f"allocated size does not match required size: output_size={output_size}, but {out.shape[axis]} needed")
    return out


def expand_as(x: Tensor, other: Tensor) -> Tensor:
    """``x.expand(other.size())``.

    >>> import xgrad
    >>> xgrad.expand_as(xgrad.tensor([1.0, 2.0]), xgrad.zeros(2, 2)).tolist()
    [[1.0, 2.0], [1.0, 2.0]]
    """
    return expand(x, other.shape)


def view_as(x: Tensor, other: Tensor) -> Tensor:
    """``x.view(other.size())``.

    >>> import xgrad
    >>> xgrad.view_as(xgrad.arange(4.0), xgrad.zeros(2, 2)).shape
    (2, 2)
    """
    return view(x, other.shape)


def reshape_as(x: Tensor, other: Tensor) -> Tensor:
    """``x.reshape(other.size())``.

    >>> import xgrad
    >>> xgrad.reshape_as(xgrad.arange(6.0), xgrad.zeros(3, 2)).shape
    (3, 2)
    """
    return reshape(x, other.shape)


def movedim(x: Tensor, source: Any, destination: Any) -> Tensor:
    """Move the dims ``source`` to the positions ``destination``; the others keep their order (a view).

    >>> import xgrad
    >>> xgrad.movedim(xgrad.zeros(2, 3, 4), 0, -1).shape
    (3, 4, 2)
    >>> xgrad.movedim(xgrad.zeros(2, 3, 4), (0, 1), (2, 0)).shape
    (3, 4, 2)
    """
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    if len(src) != len(dst):
        raise RuntimeError(
            f"movedim: Invalid source or destination dims: source ({list(src)} dims) should contain the same number "
            f"of dims as destination ({list(dst)} dims)"
        )
    src = tuple(canonical_dim(d, x.ndim) for d in src)
    dst = tuple(canonical_dim(d, x.ndim) for d in dst)
    for name, dims in (("source", src), ("destination", dst)):
        if len(set(dims)) != len(dims):
            raise RuntimeError(f"movedim: repeated dim in `{name}` ({list(dims)})")
    order = [-1] * x.ndim
    for s, d in zip(src, dst, strict=True):
        order[d] = s
    rest = iter(a for a in range(x.ndim) if a not in src)
    return x.permute(tuple(a if a >= 0 else next(rest) for a in order))


def _diagonal_index(rows: int, cols: int, diagonal: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices of diagonal ``diagonal`` of a ``rows x cols`` matrix."""
    start_row, start_col = max(-diagonal, 0), max(diagonal, 0)
    n = max(min(rows - start_row, cols - start_col), 0)
    return np.arange(n) + start_row, np.arange(n) + start_col


def diag(x: Tensor, diagonal: int = 0) -> Tensor:
    """``torch.diag``: a 1-D ``x`` as the ``diagonal``-th diagonal of a square matrix, or that diagonal of a 2-D ``x``.

    >>> import xgrad
    >>> xgrad.diag(xgrad.tensor([1.0, 2.0])).tolist()
    [[1.0, 0.0], [0.0, 2.0]]
    >>> xgrad.diag(xgrad.tensor([[1.0, 2.0], [3.0, 4.0]]), 1).tolist()
    [2.0]
    """
    from xgrad.ops.index import _index_put

    if x.ndim == 1:
        side = x.shape[0] + abs(diagonal)
        rows, cols = _diagonal_index(side, side, diagonal)
        return _index_put(Tensor(jnp.zeros((side, side), x.dtype)), x, index=(rows, cols))
    if x.ndim == 2:
        return x[_diagonal_index(x.shape[0], x.shape[1], diagonal)]
    raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {x.ndim}D")


def _window_index(length: int, size: int, step: int) -> np.ndarray:
    """Row ``i`` holds the positions of window ``i``: ``i * step .. i * step + size - 1``."""
    starts = np.arange((length - size) // step + 1) * step
    return starts[:, None] + np.arange(size)


def _unfold_impl(x: Any, axis: int, size: int, step: int) -> Any:
    windows = jnp.take(x, _window_index(x.shape[axis], size, step), axis=axis)  # (..., n, size, ...)
    return jnp.moveaxis(windows, axis + 1, -1)


def _unfold_grad(g: Tensor, out: Any, x: Any, axis: int, size: int, step: int) -> Tensor:
    # Each window element's grad goes back to its element of x; overlapping windows add up.
    index = (slice(None),) * axis + (_window_index(x.shape[axis], size, step),)
    return _index_scatter(movedim(g, -1, axis + 1), index=index, shape=x.shape)


_unfold = defprim("unfold", _unfold_impl, (_unfold_grad,), save=())


def unfold(x: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """``Tensor.unfold``: the windows of ``size`` elements ``step`` apart along ``dimension``, as a new last dim.

    A view, as in PyTorch: writing into it writes ``x`` (NOTE [Views write through]).
    Its strides are ``x``'s with ``dimension``'s times ``step``, and ``dimension``'s
    stride for the new dim. Unlike PyTorch, which leaves the result undefined, an
    in-place op on overlapping windows (``step < size`` with more than one window)
    raises, as on an expanded view: one element of ``x`` would take several values.

    Args:
        dimension: the dim the windows slide along.
        size: the number of elements in each window.
        step: how far apart the windows start.

    >>> import xgrad
    >>> x = xgrad.arange(5.0)
    >>> w = x.unfold(0, 2, 2)
    >>> w.tolist()
    [[0.0, 1.0], [2.0, 3.0]]
    >>> _ = w[1].fill_(9.0)
    >>> x.tolist()
    [0.0, 1.0, 9.0, 9.0, 4.0]
    """
    axis = canonical_dim(dimension, x.ndim)
    length = x.shape[axis] if x.ndim else 1
    if size < 0:
        raise RuntimeError(f"size is {size} but must be >= 0")
    if size > length:
        raise RuntimeError(f"maximum size for tensor at dimension {axis} is {length} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    if x.ndim == 0:
        return x.reshape(1)
    params = {"axis": axis, "size": size, "step": step}
    return track_view(x, _unfold(x, **params), "unfold", params)
