"""``Embedding``: a lookup table of vectors."""

from __future__ import annotations

from typing import Any

import jax

from xgrad import ops
from xgrad.nn.init import prng_key
from xgrad.nn.module import Module, Parameter
from xgrad.ops._util import check_nonnegative_shape
from xgrad.tensor import Tensor
from xgrad.tensor.dtypes import parameter_dtype


class Embedding(Module):
    """A lookup table of ``num_embeddings`` vectors of size ``embedding_dim``, initialised N(0, 1).

    >>> import xgrad
    >>> emb = xgrad.nn.Embedding(10, 3, key=0)
    >>> emb(xgrad.tensor([[1, 2], [3, 4]])).shape
    (2, 2, 3)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *, key: Any = None, dtype: Any = None) -> None:
        dtype = parameter_dtype(dtype)
        shape = check_nonnegative_shape((num_embeddings, embedding_dim))  # PyTorch's error, before JAX's
        self.weight = Parameter(jax.random.normal(prng_key(key), shape, dtype))

    def forward(self, indices: Any) -> Tensor:
        return ops.embedding(indices, self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}"

