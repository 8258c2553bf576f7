"""``Embedding``: a lookup table of vectors."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from xgrad import ops
from xgrad.nn.init import prng_key
from xgrad.nn.module import Module, Parameter
from xgrad.ops._util import check_nonnegative_shape
from xgrad.tensor import Tensor
from xgrad.tensor.dtypes import parameter_dtype


class Embedding(Module):
    """A lookup table of ``num_embeddings`` vectors of size ``embedding_dim``, initialised N(0, 1) (``F.embedding``).

    Args:
        padding_idx: a row initialised to zeros that gets no gradient (negative counts from the end).
        max_norm: looked-up rows with a ``norm_type``-norm above it are scaled in place to it before each lookup.
        _weight: an initial ``(num_embeddings, embedding_dim)`` weight, used as is.
        _freeze: the weight does not require grad.

    >>> import xgrad
    >>> emb = xgrad.nn.Embedding(10, 3, padding_idx=0, key=0)
    >>> emb(xgrad.tensor([[1, 2], [3, 0]])).shape, emb.weight[0].tolist()
    ((2, 2, 3), [0.0, 0.0, 0.0])
    """

    def __init__(
        self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, max_norm: float | None = None,
        norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False, _weight: Any = None,
        _freeze: bool = False, *, key: Any = None, dtype: Any = None,
    ) -> None:
        dtype = parameter_dtype(dtype)
        shape = check_nonnegative_shape((num_embeddings, embedding_dim))  # PyTorch's error, before JAX's
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise AssertionError("Padding_idx must be within num_embeddings")
            padding_idx %= num_embeddings
        if scale_grad_by_freq or sparse:
            raise NotImplementedError("Embedding: scale_grad_by_freq and sparse gradients are not supported (gradients "
                                      "are dense arrays); leave both False")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx, self.max_norm, self.norm_type = padding_idx, max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        if _weight is not None:
            weight = _weight.array if isinstance(_weight, Tensor) else jnp.asarray(_weight)
            if weight.shape != shape:
                raise AssertionError("Shape of weight does not match num_embeddings and embedding_dim")
        else:
            weight = jax.random.normal(prng_key(key), shape, dtype)
            if padding_idx is not None:
                weight = weight.at[padding_idx].set(0)
        self.weight = Parameter(weight, requires_grad=not _freeze)

    @classmethod
    def from_pretrained(
        cls, embeddings: Any, freeze: bool = True, padding_idx: int | None = None, max_norm: float | None = None,
        norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False,
    ) -> Embedding:
        """An ``Embedding`` whose weight is the 2-D ``embeddings``, frozen (no grad) unless ``freeze=False``, as PyTorch's.

        >>> import xgrad
        >>> emb = xgrad.nn.Embedding.from_pretrained(xgrad.tensor([[1.0, 2.0], [3.0, 4.0]]))
        >>> emb(xgrad.tensor([1])).tolist(), emb.weight.requires_grad
        ([[3.0, 4.0]], False)
        """
        if len(getattr(embeddings, "shape", ())) != 2:
            raise AssertionError("Embeddings parameter is expected to be 2-dimensional")
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse, _weight=embeddings, _freeze=freeze)

    def forward(self, indices: Any) -> Tensor:
        return ops.embedding(indices, self.weight, self.padding_idx, self.max_norm, self.norm_type)

    def extra_repr(self) -> str:
        text = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            text += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            text += f", max_norm={self.max_norm}"
        if self.norm_type != 2.0:
            text += f", norm_type={self.norm_type}"
        return text
