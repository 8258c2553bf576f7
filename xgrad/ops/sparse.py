"""Sparse COO tensors: ``SparseTensor`` on ``jax.experimental.sparse.BCOO``, ``to_sparse``,
``sparse_coo_tensor``, ``sparse_mm``, and sparse + dense.

# NOTE [Sparse tensors]
# A ``SparseTensor`` holds its ``values`` as an xgrad Tensor (which may require grad) and its
# ``indices`` as a constant ``(nse, ndim)`` integer array: BCOO's layout (PyTorch's
# ``indices()`` is its transpose). Two primitives compute with it through BCOO,
# ``sparse_matmul`` (sparse @ dense) and ``sparse_to_dense``; their rules are ``jax.vjp`` of
# BCOO's, so the gradient of the values is the incoming gradient read at the indices:
# PyTorch's gradient for a sparse input, a sparse tensor with the input's pattern. The
# dense side's gradient is dense. Sparse + dense is dense (as PyTorch's), through
# ``sparse_to_dense``. Tensor's operators defer to a ``SparseTensor`` (``DEFER_TO``), so
# ``dense + sparse`` and ``dense @ sparse`` reach its reflected operators. What BCOO lacks
# (sparse gradients as sparse tensors, CSR layouts, in-place ops on sparse tensors) raises
# an error naming the dense alternative, ``to_dense()``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse as jsparse

from xgrad.ops.index import scatter_add
from xgrad.ops.jaxop import vjp_of
from xgrad.ops.registry import defprim
from xgrad.ops.shape import cat
from xgrad.tensor import Tensor

__all__ = ["SparseTensor", "sparse_coo_tensor", "sparse_mm", "to_sparse"]


def _bcoo(values: Any, indices: Any, shape: tuple[int, ...]) -> jsparse.BCOO:
    return jsparse.BCOO((values, indices), shape=shape)


def _to_dense_impl(values: Any, indices: Any, shape: tuple[int, ...]) -> Any:
    return _bcoo(values, indices, shape).todense()


def _matmul_impl(values: Any, indices: Any, dense: Any, shape: tuple[int, ...]) -> Any:
    return _bcoo(values, indices, shape) @ dense


def _to_dense_grad(g: Tensor, out: Any, values: Tensor, indices: Any, **params: Any) -> Any:
    return vjp_of("sparse_to_dense", _to_dense_impl, **params)(g, values, indices)


def _matmul_grad(g: Tensor, out: Any, values: Tensor, indices: Any, dense: Tensor, **params: Any) -> Any:
    return vjp_of("sparse_matmul", _matmul_impl, **params)(g, values, indices, dense)


_sparse_to_dense = defprim("sparse_to_dense", _to_dense_impl, joint_vjp=_to_dense_grad)
_sparse_matmul = defprim("sparse_matmul", _matmul_impl, joint_vjp=_matmul_grad)


def _dense_alternative(what: str) -> NotImplementedError:
    return NotImplementedError(f"{what} is not supported on xgrad's sparse COO tensors (jax.experimental.sparse.BCOO); "
                               "convert with .to_dense() and use the dense tensor")


class SparseTensor:
    """A sparse COO tensor, as ``torch.sparse_coo_tensor`` makes (NOTE [Sparse tensors]).

    >>> import xgrad
    >>> s = xgrad.sparse_coo_tensor([[0, 1], [1, 0]], [2.0, 3.0], (2, 2))
    >>> s.to_dense().tolist(), (s @ xgrad.ones(2, 1)).tolist()
    ([[0.0, 2.0], [3.0, 0.0]], [[2.0], [3.0]])
    """

    is_sparse = True
    layout = "sparse_coo"

    def __init__(self, indices: Any, values: Tensor, shape: tuple[int, ...]) -> None:
        self._indices = indices  # (nse, ndim) integers, BCOO's layout
        self._values = values
        self.shape = tuple(shape)

    # -- PyTorch's accessors ---------------------------------------------------------------
    @property
    def dtype(self) -> Any:
        return self._values.dtype

    @property
    def device(self) -> Any:
        return self._values.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def requires_grad(self) -> bool:
        return self._values.requires_grad

    @property
    def grad(self) -> Any:
        raise _dense_alternative("a sparse leaf's .grad")

    def dim(self) -> int:
        return self.ndim

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def sparse_dim(self) -> int:
        return self.ndim

    def dense_dim(self) -> int:
        return 0

    def _nnz(self) -> int:
        return int(self._indices.shape[0])

    def indices(self) -> Tensor:
        """The ``(ndim, nnz)`` indices, as PyTorch's."""
        return Tensor(jnp.asarray(self._indices).T)

    def values(self) -> Tensor:
        return self._values

    def is_coalesced(self) -> bool:
        keys = np.ravel_multi_index(np.asarray(self._indices).T, self.shape) if self._nnz() else np.zeros(0, np.int64)
        return bool(np.all(np.diff(keys) > 0))

    def coalesce(self) -> SparseTensor:
        """Indices sorted and unique, the values of repeated indices summed."""
        indices = np.asarray(self._indices)
        keys = np.ravel_multi_index(indices.T, self.shape) if self._nnz() else np.zeros(0, np.int64)
        unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        summed = scatter_add(Tensor(jnp.zeros((len(unique),), self.dtype)), 0, Tensor(jnp.asarray(inverse.reshape(-1))),
                             self._values)
        return SparseTensor(indices[first], summed, self.shape)

    # -- conversions -------------------------------------------------------------------------
    def to_dense(self) -> Tensor:
        """The dense tensor; differentiable in the values (their gradient is the dense gradient at the indices)."""
        return _sparse_to_dense(self._values, Tensor(jnp.asarray(self._indices)), shape=self.shape)

    def to_sparse(self) -> SparseTensor:
        return self

    def to_jax(self) -> jsparse.BCOO:
        """The ``jax.experimental.sparse.BCOO`` of the values and indices."""
        return _bcoo(self._values._array, jnp.asarray(self._indices), self.shape)

    def to(self, *args: Any, **kwargs: Any) -> SparseTensor:
        return SparseTensor(self._indices, self._values.to(*args, **kwargs), self.shape)

    def detach(self) -> SparseTensor:
        return SparseTensor(self._indices, self._values.detach(), self.shape)

    def requires_grad_(self, requires_grad: bool = True) -> SparseTensor:
        self._values.requires_grad_(requires_grad)
        return self

    def t(self) -> SparseTensor:
        if self.ndim != 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 sparse dimensions, but self has {self.ndim}")
        return SparseTensor(jnp.asarray(self._indices)[:, ::-1], self._values, self.shape[::-1])

    # -- arithmetic --------------------------------------------------------------------------
    def __matmul__(self, other: Any) -> Tensor:
        return sparse_mm(self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        if not isinstance(other, Tensor) or other.ndim != 2:
            return NotImplemented
        return sparse_mm(self.t(), other.mT).mT

    def __add__(self, other: Any) -> Any:
        if isinstance(other, SparseTensor):
            if other.shape != self.shape:
                raise RuntimeError(f"add: expected sizes to match, got {list(self.shape)} and {list(other.shape)}")
            return SparseTensor(jnp.concatenate([jnp.asarray(self._indices), jnp.asarray(other._indices)]),
                                cat([self._values, other._values.to(self.dtype)]), self.shape)
        if isinstance(other, Tensor):
            return self.to_dense() + other
        return NotImplemented

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, Tensor):
            return other + self.to_dense()
        return NotImplemented

    def __mul__(self, other: Any) -> SparseTensor:
        if isinstance(other, (int, float)):
            return SparseTensor(self._indices, self._values * other, self.shape)
        raise _dense_alternative("multiplying a sparse tensor by a tensor")

    __rmul__ = __mul__

    def __neg__(self) -> SparseTensor:
        return self * -1

    def __setitem__(self, index: Any, value: Any) -> None:
        raise _dense_alternative("in-place assignment")

    def __getitem__(self, index: Any) -> Any:
        raise _dense_alternative("indexing")

    def __repr__(self) -> str:
        return (f"tensor(indices={np.asarray(self._indices).T.tolist()},\n       values={self._values.tolist()},\n"
                f"       size={self.shape}, nnz={self._nnz()}, layout=torch.sparse_coo)")


#: Types whose operators take over from Tensor's (``dense + sparse`` is the sparse tensor's ``__radd__``).
DEFER_TO = (SparseTensor,)


def _concrete(array: Any, what: str) -> np.ndarray:
    try:
        return np.asarray(array)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        raise RuntimeError(f"{what} needs concrete values to find the nonzeros, which a traced tensor (xgrad.compile, "
                           "jax.jit) has not: build the sparse tensor outside the step, or keep the dense tensor") from None


def to_sparse(self: Tensor, sparse_dim: int | None = None, *, layout: Any = None) -> SparseTensor:
    """``Tensor.to_sparse()``: a COO tensor of ``self``'s nonzeros, differentiable in ``self`` at those places.

    >>> import xgrad
    >>> s = xgrad.tensor([[0.0, 2.0], [3.0, 0.0]]).to_sparse()
    >>> s.indices().tolist(), s.values().tolist()
    ([[0, 1], [1, 0]], [2.0, 3.0])
    """
    if layout not in (None, "sparse_coo") or sparse_dim not in (None, self.ndim):
        raise _dense_alternative(f"to_sparse(sparse_dim={sparse_dim}, layout={layout})")
    nonzero = np.nonzero(_concrete(self._array, "to_sparse()"))
    return SparseTensor(jnp.asarray(np.stack(nonzero, axis=1)), self[tuple(Tensor(jnp.asarray(i)) for i in nonzero)],
                        self.shape)


def sparse_coo_tensor(indices: Any, values: Any, size: Any = None, *, dtype: Any = None, device: Any = None,
                      requires_grad: bool = False, check_invariants: bool | None = None,
                      is_coalesced: bool | None = None) -> SparseTensor:
    """``torch.sparse_coo_tensor``: ``values`` at ``indices`` (``(ndim, nnz)``) in a tensor of ``size``
    (by default each dim one past its largest index).

    >>> import xgrad
    >>> xgrad.sparse_coo_tensor([[0, 2]], [1.0, 5.0]).to_dense().tolist()
    [1.0, 0.0, 5.0]
    """
    index_array = _concrete(indices._array if isinstance(indices, Tensor) else indices, "sparse_coo_tensor()")
    index_array = np.asarray(index_array, np.int64).reshape(-1, np.shape(index_array)[-1] if np.ndim(index_array) else 0)
    values = values if isinstance(values, Tensor) else Tensor(jnp.asarray(values))
    if dtype is not None:
        values = values.to(dtype)
    if device is not None:
        values = values.to(device)
    if index_array.shape[1] != values.shape[0]:
        raise RuntimeError(f"indices and values must have same nnz, but got nnz from indices: {index_array.shape[1]}, "
                           f"nnz from values: {values.shape[0]}")
    shape = tuple(int(s) for s in size) if size is not None else tuple(int(m) + 1 for m in index_array.max(axis=1))
    if len(shape) != index_array.shape[0]:
        raise RuntimeError(f"number of dimensions must be sparse_dim ({index_array.shape[0]}) + dense_dim (0), but got "
                           f"{len(shape)}")
    if index_array.size and ((index_array < 0).any() or (index_array.max(axis=1) >= np.array(shape)).any()):
        raise RuntimeError(f"size is inconsistent with indices: for size {list(shape)}, an index is out of range")
    if requires_grad:
        values = values.detach().requires_grad_(True)
    return SparseTensor(jnp.asarray(index_array.T, jnp.int32 if math.prod(shape) < 2**31 else jnp.int64), values, shape)


def sparse_mm(mat1: Any, mat2: Tensor) -> Tensor:
    """``torch.sparse.mm``: sparse (or dense) ``mat1`` times dense ``mat2``, a dense result.

    The gradient of the sparse matrix's values is the product's gradient at its indices (PyTorch's
    sparse gradient, with the input's pattern), the dense matrix's is ``mat1.T @ grad``.

    >>> import xgrad
    >>> s = xgrad.sparse_coo_tensor([[0, 1], [1, 0]], [2.0, 3.0], (2, 2))
    >>> xgrad.sparse.mm(s, xgrad.tensor([[1.0], [10.0]])).tolist()
    [[20.0], [3.0]]
    """
    if isinstance(mat2, SparseTensor):
        raise _dense_alternative("a sparse right operand of mm")
    if not isinstance(mat1, SparseTensor):
        return mat1 @ mat2
    if mat1.ndim != 2 or mat2.ndim not in (1, 2):
        raise RuntimeError(f"sparse.mm: expected a 2-D sparse matrix and a 1-D or 2-D dense one, got sizes "
                           f"{list(mat1.shape)} and {list(mat2.shape)}")
    if mat1.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({mat1.shape[0]}x{mat1.shape[1]} and "
                           f"{'x'.join(map(str, mat2.shape))})")
    values = mat1._values if mat1.dtype == mat2.dtype else mat1._values.to(mat2.dtype)
    return _sparse_matmul(values, Tensor(jnp.asarray(mat1._indices)), mat2, shape=mat1.shape)
