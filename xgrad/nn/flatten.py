"""``Flatten`` and ``Unflatten``: reshape layers, as PyTorch's."""

from __future__ import annotations

from collections.abc import Sequence

from xgrad.nn.module import Module
from xgrad.ops._util import canonical_dim
from xgrad.tensor import Tensor


class Flatten(Module):
    """Flatten dims ``start_dim`` to ``end_dim`` into one (by default all but the batch dim).

    >>> import xgrad
    >>> xgrad.nn.Flatten()(xgrad.zeros(2, 3, 4)).shape
    (2, 12)
    """

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Split dim ``dim`` into ``unflattened_size`` (one entry may be -1).

    >>> import xgrad
    >>> xgrad.nn.Unflatten(1, (3, 4))(xgrad.zeros(2, 12)).shape
    (2, 3, 4)
    """

    def __init__(self, dim: int, unflattened_size: Sequence[int]) -> None:
        if not isinstance(unflattened_size, (tuple, list)):
            raise TypeError(f"unflattened_size must be tuple of ints, but found type {type(unflattened_size).__name__}")
        self.dim, self.unflattened_size = dim, unflattened_size

    def forward(self, x: Tensor) -> Tensor:
        dim = canonical_dim(self.dim, x.ndim)
        return x.reshape(*x.shape[:dim], *self.unflattened_size, *x.shape[dim + 1:])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
