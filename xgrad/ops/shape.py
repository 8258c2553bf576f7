"""Shape primitives (reshape, broadcast, transpose, concatenate, pad, flip, roll, tril/triu)
and the composites PyTorch users know them by (view, expand, squeeze, stack, split, …)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.ops._util import canonical_dim, check_int, norm_axes
from xgrad.ops.registry import defprim
from xgrad.ops.views import mark_multi_output, track_view
from xgrad.tensor import Tensor

_reshape = defprim("reshape", lambda x, shape: jnp.reshape(x, shape), (lambda g, out, x, shape: g.reshape(x.shape),), save=())
_broadcast_to = defprim(
    "broadcast_to",
    lambda x, shape: jnp.broadcast_to(x, shape),
    (lambda g, out, x, shape: g.sum_to(x.shape),),
    save=(),
)


def _inverse(axes: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(axes)
    for i, a in enumerate(axes):
        inv[a] = i
    return tuple(inv)


_transpose = defprim(
    "transpose",
    lambda x, axes: jnp.transpose(x, axes),
    (lambda g, out, x, axes: g.permute(_inverse(axes)),),
    save=(),
)


def _concatenate_grad(g: Tensor, out: Any, *xs: Any, axis: int) -> tuple[Tensor, ...]:
    grads = []
    start = 0
    for x in xs:
        index = [slice(None)] * g.ndim
        index[axis] = slice(start, start + x.shape[axis])
        grads.append(g[tuple(index)])
        start += x.shape[axis]
    return tuple(grads)


_concatenate = defprim(
    "concatenate",
    lambda *xs, axis: jnp.concatenate(xs, axis=axis),
    joint_vjp=_concatenate_grad,
    save=(),
)


def _pad_grad(g: Tensor, out: Any, x: Any, pad_width: tuple[tuple[int, int], ...], value: float) -> Tensor:
    # The adjoint of padding (or cropping, for negative widths) is cropping (padding) by as much.
    return _pad(g, pad_width=tuple((-lo, -hi) for lo, hi in pad_width), value=0.0)


_pad: Callable[..., Any] = defprim(
    "pad",
    lambda x, pad_width, value: jax.lax.pad(x, jnp.asarray(value, x.dtype), [(lo, hi, 0) for lo, hi in pad_width]),
    (_pad_grad,),
    save=(),
)
_flip = defprim("flip", lambda x, axes: jnp.flip(x, axes), (lambda g, out, x, axes: g.flip(axes),), save=())
_roll: Callable[..., Any] = defprim(
    "roll",
    lambda x, shifts, axes: jnp.roll(x, shifts, axes),
    (lambda g, out, x, shifts, axes: _roll(g, shifts=tuple(-s for s in shifts), axes=axes),),
    save=(),
)
_tril: Callable[..., Any] = defprim("tril", lambda x, k: jnp.tril(x, k), (lambda g, out, x, k: _tril(g, k=k),), save=())
_triu: Callable[..., Any] = defprim("triu", lambda x, k: jnp.triu(x, k), (lambda g, out, x, k: _triu(g, k=k),), save=())


def _shape_arg(shape: Sequence[Any], op: str = "reshape", arg: str = "shape") -> tuple[int, ...]:
    """Sizes given as ``f(2, 3)`` or ``f((2, 3))``, checked to be ints (PyTorch's ``TypeError`` otherwise)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    shape = tuple(shape)
    for pos, s in enumerate(shape):
        if type(s) is not int:
            if isinstance(s, bool) or not hasattr(s, "__index__"):
                raise TypeError(
                    f"{op}(): argument '{arg}' (position 1) must be tuple of ints, but found element of type "
                    f"{type(s).__name__} at pos {pos}"
                )
            return tuple(operator.index(v) for v in shape)  # NumPy or 0-dim integers
    return shape


def sizes_or_keyword(op: str, keyword: str, sizes: tuple[Any, ...], keywords: dict[str, Any]) -> tuple[Any, ...]:
    """``sizes`` as given positionally (``x.view(2, 3)``, ``x.view((2, 3))``) or as PyTorch's keyword
    (``x.view(size=(2, 3))``); any other keyword is a ``TypeError`` naming the three forms."""
    if not keywords:
        return sizes
    if not sizes and set(keywords) == {keyword}:
        return (keywords[keyword],)
    wrong = next((k for k in keywords if k != keyword), keyword)
    problem = f"got multiple values for argument '{keyword}'" if wrong == keyword else f"got an unexpected keyword argument '{wrong}'"
    raise TypeError(f"{op}() {problem}; the accepted forms are {op}(2, 3), {op}((2, 3)) and {op}({keyword}=(2, 3))")


def _infer_shape(shape: tuple[int, ...], numel: int) -> tuple[int, ...]:
    """``shape`` with its one ``-1`` filled in; PyTorch's errors for any other mismatch."""
    inferred = None
    known = 1
    for i, s in enumerate(shape):
        if s == -1:
            if inferred is not None:
                raise RuntimeError("only one dimension can be inferred")
            inferred = i
        elif s < 0:
            raise RuntimeError(f"invalid shape dimension {s}")
        else:
            known *= s
    if inferred is not None and known and numel % known == 0:
        return shape[:inferred] + (numel // known,) + shape[inferred + 1 :]
    if inferred is None and known == numel:
        return shape
    raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")


def reshape(x: Tensor, *shape: Any, **keywords: Any) -> Tensor:
    """``x`` with a new shape (one ``-1`` allowed); same elements, row-major.

    >>> import xgrad
    >>> xgrad.reshape(xgrad.arange(6.0), 2, 3).shape
    (2, 3)
    >>> xgrad.view(xgrad.arange(6.0), -1, 2).shape
    (3, 2)
    """
    target = _shape_arg(sizes_or_keyword("reshape", "shape", shape, keywords))
    if target == x.shape:
        return x
    out = _reshape(x, shape=_infer_shape(target, x.numel()))
    return track_view(x, out, "reshape", {"shape": out.shape})


ERR_VIEW_STRIDES = (
    "view size is not compatible with input tensor's size and stride (at least one dimension spans across two "
    "contiguous subspaces). Use .reshape(...) instead."
)


def view(x: Tensor, *shape: Any, **keywords: Any) -> Tensor:
    """``x`` with a new shape, always a view of it (writes through); raises where only a copy can do it.

    >>> import xgrad
    >>> x = xgrad.zeros(2, 3)
    >>> _ = x.view(-1)[4:].fill_(1.0)
    >>> x.tolist()
    [[0.0, 0.0, 0.0], [0.0, 1.0, 1.0]]
    """
    # A new view even when the shape is unchanged, as PyTorch's (``reshape`` returns ``x``).
    out = _reshape(x, shape=_infer_shape(_shape_arg(sizes_or_keyword("view", "size", shape, keywords)), x.numel()))
    out = track_view(x, out, "reshape", {"shape": out.shape})
    if out._view is None and not x._inference:  # PyTorch's strides cannot express it: reshape copied
        raise RuntimeError(ERR_VIEW_STRIDES)
    return out


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dims ``start_dim..end_dim`` into one.

    >>> import xgrad
    >>> xgrad.flatten(xgrad.zeros(2, 3, 4), start_dim=1).shape
    (2, 12)
    """
    start, end = canonical_dim(start_dim, x.ndim), canonical_dim(end_dim, x.ndim)
    if start > end:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    if x.ndim == 0:
        return reshape(x, (1,))
    merged = 1
    for s in x.shape[start : end + 1]:
        merged *= s
    return reshape(x, x.shape[:start] + (merged,) + x.shape[end + 1 :])


def squeeze(x: Tensor, dim: Any = None) -> Tensor:
    """Drop size-1 dims (only ``dim``, when given).

    >>> import xgrad
    >>> xgrad.squeeze(xgrad.zeros(1, 3, 1)).shape, xgrad.squeeze(xgrad.zeros(1, 3, 1), 0).shape
    ((3,), (3, 1))
    """
    axes = norm_axes(dim, x.ndim)
    if axes is None:  # dim=None: every size-1 dim
        axes = tuple(i for i, s in enumerate(x.shape) if s == 1)
    return reshape(x, tuple(s for i, s in enumerate(x.shape) if not (i in axes and s == 1)))


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    """Insert a size-1 dim at ``dim``.

    >>> import xgrad
    >>> xgrad.unsqueeze(xgrad.zeros(3), 0).shape
    (1, 3)
    """
    dim = canonical_dim(dim, x.ndim + 1)
    return reshape(x, x.shape[:dim] + (1,) + x.shape[dim:])


def broadcast_to(x: Tensor, *shape: Any) -> Tensor:
    """Broadcast ``x`` to ``shape``; the gradient is summed back.

    >>> import xgrad
    >>> xgrad.broadcast_to(xgrad.tensor([1.0, 2.0]), 2, 2).tolist()
    [[1.0, 2.0], [1.0, 2.0]]
    """
    target = _shape_arg(shape, "broadcast_to", "size")
    if target == x.shape:
        return x
    _check_expand(x.shape, target)
    return track_view(x, _broadcast_to(x, shape=target), "broadcast_to", {"shape": target})


def _check_expand(shape: tuple[int, ...], target: tuple[int, ...]) -> None:
    """PyTorch's ``expand`` errors (JAX's would name ``broadcast_to`` internals)."""
    if len(target) < len(shape):
        raise RuntimeError(
            f"expand: the number of sizes provided ({len(target)}) must be greater or equal to the number of "
            f"dimensions in the tensor ({len(shape)})"
        )
    lead = len(target) - len(shape)
    for i, size in enumerate(target):
        if size < 0:
            raise RuntimeError(f"expand: invalid size {size} at dimension {i}; target sizes: {list(target)}")
        if i >= lead and shape[i - lead] not in (1, size):
            raise RuntimeError(
                f"The expanded size of the tensor ({size}) must match the existing size ({shape[i - lead]}) at "
                f"non-singleton dimension {i}.  Target sizes: {list(target)}.  Tensor sizes: {list(shape)}"
            )


def expand(x: Tensor, *sizes: Any, **keywords: Any) -> Tensor:
    """PyTorch's ``expand``: ``-1`` keeps a dim's size.

    >>> import xgrad
    >>> xgrad.expand(xgrad.tensor([[1.0], [2.0]]), -1, 3).tolist()
    [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
    """
    target = _shape_arg(sizes_or_keyword("expand", "size", sizes, keywords), "expand", "size")
    lead = len(target) - x.ndim
    if lead < 0:
        _check_expand(x.shape, target)
    if any(s == -1 for s in target[:lead]):
        raise RuntimeError(f"expand: -1 is not allowed in a leading, non-existing dimension; target sizes: {list(target)}")
    resolved = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(target))
    return broadcast_to(x, resolved)


def permute(x: Tensor, *dims: Any, **keywords: Any) -> Tensor:
    """Reorder the dims.

    >>> import xgrad
    >>> xgrad.permute(xgrad.zeros(2, 3, 4), 2, 0, 1).shape
    (4, 2, 3)
    """
    wanted = _shape_arg(sizes_or_keyword("permute", "dims", dims, keywords), "permute", "dims")
    if len(wanted) != x.ndim:
        raise RuntimeError(
            "permute: number of dimensions in the tensor input does not match the length of the desired ordering "
            f"of dimensions i.e. input.dim() = {x.ndim} is not equal to len(dims) = {len(wanted)}"
        )
    axes = tuple(canonical_dim(d, x.ndim) for d in wanted)
    if len(set(axes)) != len(axes):
        raise RuntimeError("permute(): duplicate dims are not allowed.")
    if axes == tuple(range(x.ndim)):
        return x
    return track_view(x, _transpose(x, axes=axes), "transpose", {"axes": axes})


def transpose(x: Tensor, dim0: int = 0, dim1: int = 1) -> Tensor:
    """Swap two dims.

    >>> import xgrad
    >>> xgrad.transpose(xgrad.zeros(2, 3, 4), 0, 2).shape
    (4, 3, 2)
    """
    dim0, dim1 = canonical_dim(dim0, x.ndim), canonical_dim(dim1, x.ndim)
    if x.ndim == 0:
        return x
    axes = list(range(x.ndim))
    axes[dim0], axes[dim1] = axes[dim1], axes[dim0]
    return permute(x, tuple(axes))


def T(x: Tensor) -> Tensor:
    """All dims reversed.

    >>> import xgrad
    >>> xgrad.T(xgrad.tensor([[1.0, 2.0]])).tolist()
    [[1.0], [2.0]]
    """
    return permute(x, tuple(reversed(range(x.ndim))))


def mT(x: Tensor) -> Tensor:
    """The last two dims swapped (batched matrix transpose).

    >>> import xgrad
    >>> xgrad.mT(xgrad.zeros(5, 2, 3)).shape
    (5, 3, 2)
    """
    return transpose(x, -2, -1)


def _tensor_list(tensors: Any, op: str) -> list[Tensor]:
    """``cat``/``stack``'s sequence of tensors, with PyTorch's errors for anything else."""
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{op}(): argument 'tensors' (position 1) must be tuple of Tensors, not {type(tensors).__name__}")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"expected Tensor as element {i} in argument 0, but got {type(t).__name__}")
    if not tensors:
        if op == "stack":
            raise RuntimeError("stack expects a non-empty TensorList")
        raise ValueError(f"torch.{op}(): expected a non-empty list of Tensors")
    return list(tensors)


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Concatenate along an existing dim.

    >>> import xgrad
    >>> xgrad.cat([xgrad.tensor([1.0]), xgrad.tensor([2.0, 3.0])]).tolist()
    [1.0, 2.0, 3.0]
    """
    tensors = _tensor_list(tensors, "cat")
    first = tensors[0]
    axis = canonical_dim(dim, first.ndim)
    for i, t in enumerate(tensors):
        if t.ndim == 0:
            raise RuntimeError(f"zero-dimensional tensor (at position {i}) cannot be concatenated")
        if t.ndim != first.ndim:
            raise RuntimeError(f"Tensors must have same number of dimensions: got {first.ndim} and {t.ndim}")
        for d in range(t.ndim):
            if d != axis and t.shape[d] != first.shape[d]:
                raise RuntimeError(
                    f"Sizes of tensors must match except in dimension {axis}. Expected size {first.shape[d]} but "
                    f"got size {t.shape[d]} for tensor number {i} in the list."
                )
    return _concatenate(*tensors, axis=axis)


concatenate = cat


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """Stack along a new dim.

    >>> import xgrad
    >>> xgrad.stack([xgrad.tensor([1.0, 2.0]), xgrad.tensor([3.0, 4.0])], dim=1).tolist()
    [[1.0, 3.0], [2.0, 4.0]]
    """
    tensors = _tensor_list(tensors, "stack")
    for i, t in enumerate(tensors):
        if t.shape != tensors[0].shape:
            raise RuntimeError(
                f"stack expects each tensor to be equal size, but got {list(tensors[0].shape)} at entry 0 and "
                f"{list(t.shape)} at entry {i}"
            )
    dim = canonical_dim(dim, tensors[0].ndim + 1)
    return cat([unsqueeze(t, dim) for t in tensors], dim)


def split(x: Tensor, split_size_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    """Split into chunks of a size (the last may be smaller) or of the given sizes.

    >>> import xgrad
    >>> [t.tolist() for t in xgrad.split(xgrad.arange(5.0), 2)]
    [[0.0, 1.0], [2.0, 3.0], [4.0]]
    """
    axis = canonical_dim(dim, x.ndim)
    if x.ndim == 0:
        raise RuntimeError("split expects at least a 1-dimensional tensor")
    n = x.shape[axis]
    if isinstance(split_size_or_sections, int):
        size = split_size_or_sections
        if size < 0:
            raise RuntimeError(f"split expects split_size be non-negative, but got split_size={size}")
        if size == 0 and n != 0:
            raise RuntimeError(f"split_size can only be 0 if dimension size is 0, but got dimension size of {n}")
        pieces = [size] * (n // size) + ([n % size] if n % size else []) if size else []
        sizes = pieces or [0]  # at least one (empty) piece, as PyTorch returns
    else:
        sizes = list(split_size_or_sections)
        if any(s < 0 for s in sizes):
            raise RuntimeError(f"split_with_sizes expects split_sizes have only non-negative entries, but got split_sizes={sizes}")
        if sum(sizes) != n:
            raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size at dimension {dim}), but got split_sizes={sizes}")
    out = []
    start = 0
    for s in sizes:
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, start + s)
        out.append(x[tuple(index)])
        start += s
    return mark_multi_output(tuple(out), "Split" if isinstance(split_size_or_sections, int) else "SplitWithSizes")


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """Split into ``chunks`` pieces of (nearly) equal size.

    >>> import xgrad
    >>> [t.tolist() for t in xgrad.chunk(xgrad.arange(4.0), 2)]
    [[0.0, 1.0], [2.0, 3.0]]
    """
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    if x.ndim == 0:
        raise RuntimeError("chunk expects at least a 1-dimensional tensor")
    n = x.shape[canonical_dim(dim, x.ndim)]
    return split(x, -(-n // chunks), dim)


_PAD_SOURCES = {
    "reflect": lambda i, n: np.abs((i + n - 1) % (2 * n - 2) - (n - 1)) if n > 1 else np.zeros_like(i),
    "replicate": lambda i, n: np.clip(i, 0, n - 1),
    "circular": lambda i, n: i % n,
}


def pad(x: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Tensor:
    """PyTorch's ``F.pad``: ``pad`` lists (left, right) pairs from the last dim backwards; negative widths crop.

    ``mode`` is ``constant`` (``value``, 0 by default), ``reflect`` (mirrored, the edge not
    repeated), ``replicate`` (the edge repeated) or ``circular`` (wrapped around); the last
    three pad the trailing 1 to 3 dims of a batched or unbatched input, as PyTorch.

    >>> import xgrad
    >>> xgrad.pad(xgrad.tensor([1.0, 2.0]), (1, 2)).tolist()
    [0.0, 1.0, 2.0, 0.0, 0.0]
    >>> xgrad.pad(xgrad.tensor([[1.0, 2.0, 3.0]]), (2, 1), mode="reflect").tolist()
    [[3.0, 2.0, 1.0, 2.0, 3.0, 2.0]]
    """
    if mode not in ("constant", *_PAD_SOURCES):
        raise NotImplementedError(f"pad mode {mode!r} is not supported; use one of constant, reflect, replicate, circular")
    for width in pad:
        check_int(width, "pad", "pad", 2)
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise RuntimeError(f"Padding length must be divisible by 2 and at most twice the number of dims, got {len(pad)}")
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    if mode != "constant":
        if value:
            raise RuntimeError(f"Padding mode \"{mode}\" doesn't take in value argument")
        return _pad_by_index(x, widths, len(pad) // 2, mode)
    for (lo, hi), n in zip(widths, x.shape, strict=True):
        if n + lo + hi < 0:  # negative widths crop, as in PyTorch, but not past nothing
            raise RuntimeError("narrow(): length must be non-negative.")
    return _pad(x, pad_width=tuple(widths), value=0.0 if value is None else value)


def _pad_by_index(x: Tensor, widths: list[tuple[int, int]], padded_dims: int, mode: str) -> Tensor:
    """Reflect, replicate or circular padding: each padded dim read at PyTorch's source index (indexing's rule
    sends the gradient back, summing where an element is read more than once)."""
    if not 1 <= padded_dims <= 3 or x.ndim not in (padded_dims + 1, padded_dims + 2):
        raise NotImplementedError(f"Only 2D, 3D, 4D, 5D padding with non-constant padding are supported for now; got "
                                  f"{len(widths)}D input and a pad of {2 * padded_dims} values")
    for axis in range(x.ndim - padded_dims, x.ndim):
        (lo, hi), n = widths[axis], x.shape[axis]
        if mode == "reflect" and (lo >= n or hi >= n) or mode == "circular" and (lo > n or hi > n) or min(lo, hi) < 0 or n == 0:
            raise RuntimeError(f"Padding size should be less than the corresponding input dimension, but got: padding "
                               f"({lo}, {hi}) at dimension {axis} of input {list(x.shape)}")
        source = _PAD_SOURCES[mode](np.arange(-lo, n + hi), n)
        x = x[(slice(None),) * axis + (source,)]
    return x


def flip(x: Tensor, dims: Any) -> Tensor:
    """Reverse the order of elements along ``dims``.

    >>> import xgrad
    >>> xgrad.flip(xgrad.tensor([1.0, 2.0, 3.0]), 0).tolist()
    [3.0, 2.0, 1.0]
    """
    return _flip(x, axes=norm_axes(dims, x.ndim))


def roll(x: Tensor, shifts: Any, dims: Any = None) -> Tensor:
    """Roll elements along ``dims`` (over the flattened tensor when ``None``).

    >>> import xgrad
    >>> xgrad.roll(xgrad.tensor([1.0, 2.0, 3.0]), 1).tolist()
    [3.0, 1.0, 2.0]
    """
    if dims is None:
        return roll(flatten(x), shifts, 0).reshape(x.shape)
    shifts_t = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims_t = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(shifts_t) != len(dims_t):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts_t)}, dims:{len(dims_t)}")
    return _roll(x, shifts=shifts_t, axes=tuple(canonical_dim(d, x.ndim) for d in dims_t))


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """Lower triangle of the last two dims.

    >>> import xgrad
    >>> xgrad.tril(xgrad.ones(2, 2)).tolist()
    [[1.0, 0.0], [1.0, 1.0]]
    """
    if x.ndim < 2:
        raise RuntimeError("tril: input tensor must have at least 2 dimensions")
    return _tril(x, k=diagonal)


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """Upper triangle of the last two dims.

    >>> import xgrad
    >>> xgrad.triu(xgrad.ones(2, 2)).tolist()
    [[1.0, 1.0], [0.0, 1.0]]
    """
    if x.ndim < 2:
        raise RuntimeError("triu: input tensor must have at least 2 dimensions")
    return _triu(x, k=diagonal)
