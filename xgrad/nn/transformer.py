"""Attention and transformer layers: ``MultiheadAttention``, ``TransformerEncoderLayer``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from xgrad import ops
from xgrad.nn.dropout import Dropout
from xgrad.nn.init import prng_key
from xgrad.nn.linear import Linear
from xgrad.nn.module import Module, Parameter
from xgrad.nn.normalization import LayerNorm
from xgrad.tensor import Tensor


def _additive_mask(mask: Any, dtype: Any) -> Any:
    """A mask as something to add to attention scores: boolean True (masked out) becomes -inf."""
    if mask is None:
        return None
    array = mask.array if isinstance(mask, Tensor) else jnp.asarray(mask)
    if array.dtype == jnp.bool_:
        return Tensor(jnp.where(array, -jnp.inf, 0.0).astype(dtype))
    return mask if isinstance(mask, Tensor) else Tensor(array.astype(dtype))


class MultiheadAttention(Module):
    """Multi-head attention with PyTorch's parameters: ``in_proj_weight`` (3E × E), ``in_proj_bias``, ``out_proj``.

    ``forward(query, key, value, key_padding_mask=None, need_weights=True,
    attn_mask=None, average_attn_weights=True, is_causal=False)`` returns
    ``(attn_output, attn_weights)`` as PyTorch does: inputs ``(L, N, E)``, or
    ``(N, L, E)`` with ``batch_first=True``, or unbatched ``(L, E)``; a boolean mask marks
    positions *not* attended to with True, a float mask is added to the scores; the weights
    are averaged over heads unless ``average_attn_weights=False``, and ``None`` when
    ``need_weights=False``.

    Args:
        embed_dim, num_heads: model width and head count (``embed_dim`` divisible by it).
        dropout: dropout on the attention weights while training.
        bias: biases on the input and output projections.
        batch_first: inputs and outputs are ``(N, L, E)``.
        key: a ``jax.random`` key or int seed for the initialisation and the dropout.

    >>> import xgrad
    >>> mha = xgrad.nn.MultiheadAttention(8, 2, batch_first=True, key=0)
    >>> out, weights = mha(xgrad.ones(3, 5, 8), xgrad.ones(3, 4, 8), xgrad.ones(3, 4, 8))
    >>> out.shape, weights.shape, [n for n, _ in mha.named_parameters()]
    ((3, 5, 8), (3, 5, 4), ['in_proj_weight', 'in_proj_bias', 'out_proj.weight', 'out_proj.bias'])
    """

    def __init__(
        self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True, add_bias_kv: bool = False,
        add_zero_attn: bool = False, kdim: int | None = None, vdim: int | None = None, batch_first: bool = False,
        *, key: Any = None, dtype: Any = jnp.float32,
    ) -> None:
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} and num_heads={num_heads} instead")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim must be divisible by num_heads, got embed_dim={embed_dim} and num_heads={num_heads}")
        if add_bias_kv or add_zero_attn or kdim not in (None, embed_dim) or vdim not in (None, embed_dim):
            raise ValueError(
                "xgrad's MultiheadAttention supports key and value of width embed_dim, without add_bias_kv or "
                "add_zero_attn; project key and value to embed_dim first"
            )
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.batch_first = batch_first
        k_in, k_out, k_drop = jax.random.split(prng_key(key), 3)
        # xavier_uniform_ on the (3E, E) in-projection, zero biases: PyTorch's _reset_parameters.
        bound = math.sqrt(6.0 / (embed_dim + 3 * embed_dim))
        self.in_proj_weight = Parameter(jax.random.uniform(k_in, (3 * embed_dim, embed_dim), dtype, -bound, bound))
        self.in_proj_bias = Parameter(jnp.zeros((3 * embed_dim,), dtype)) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, key=k_out, dtype=dtype)
        if bias:
            self.out_proj.bias = Parameter(jnp.zeros((embed_dim,), dtype))
        self.dropout = dropout
        self._dropout = Dropout(dropout, key=k_drop)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Any = None, need_weights: bool = True,
        attn_mask: Any = None, average_attn_weights: bool = True, is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        batched = query.ndim == 3
        if not batched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = jnp.asarray(key_padding_mask)[None]
        elif not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        n, tgt_len, e = query.shape
        src_len = key.shape[1]
        h, d = self.num_heads, self.head_dim
        w, b = self.in_proj_weight, self.in_proj_bias

        def project(x: Tensor, i: int) -> Tensor:
            y = x @ w[i * e:(i + 1) * e].T
            if b is not None:
                y = y + b[i * e:(i + 1) * e]
            return y.reshape(n, x.shape[1], h, d).transpose(1, 2)  # (N, H, len, D)

        q, k, v = project(query, 0), project(key, 1), project(value, 2)
        scores = (q @ k.mT) * (1.0 / math.sqrt(d))  # (N, H, L, S)
        if attn_mask is None and is_causal:
            attn_mask = jnp.triu(jnp.ones((tgt_len, src_len), jnp.bool_), 1)
        mask = _additive_mask(attn_mask, scores.dtype)
        if mask is not None:
            scores = scores + (mask.reshape(n, h, tgt_len, src_len) if mask.ndim == 3 else mask)
        padding = _additive_mask(key_padding_mask, scores.dtype)
        if padding is not None:
            scores = scores + padding.reshape(n, 1, 1, src_len)
        weights = ops.softmax(scores, dim=-1)
        if self.training and self.dropout > 0.0:
            weights = self._dropout(weights)
        out = (weights @ v).transpose(1, 2).reshape(n, tgt_len, e)
        out = self.out_proj(out)
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = weights.mean(dim=1)
        return out, (weights if batched else weights.squeeze(0))


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": ops.relu, "gelu": ops.gelu}


class TransformerEncoderLayer(Module):
    """Self-attention and a feed-forward block, each with a residual and a LayerNorm, as PyTorch's.

    Parameters are named as PyTorch names them (``self_attn.in_proj_weight``,
    ``linear1.weight``, ``norm1.weight``, …), so its checkpoints load as they are.
    ``norm_first=True`` normalises before each block (pre-LN) instead of after.

    Args:
        d_model, nhead: width and attention heads.
        dim_feedforward: hidden width of the feed-forward block.
        dropout: dropout after attention, inside and after the feed-forward block.
        activation: ``"relu"``, ``"gelu"`` or a callable on Tensors.
        layer_norm_eps, batch_first, norm_first, bias: as PyTorch.
        key: a ``jax.random`` key or int seed for every initialisation and dropout.

    >>> import xgrad
    >>> layer = xgrad.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True, key=0)
    >>> layer(xgrad.ones(2, 5, 8)).shape
    (2, 5, 8)
    """

    def __init__(
        self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1, activation: Any = "relu",
        layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False, bias: bool = True,
        *, key: Any = None, dtype: Any = jnp.float32,
    ) -> None:
        keys = jax.random.split(prng_key(key), 6)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, key=keys[0], dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, key=keys[1], dtype=dtype)
        self.dropout = Dropout(dropout, key=keys[2])
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, key=keys[3], dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, dtype=dtype)
        self.dropout1 = Dropout(dropout, key=keys[4])
        self.dropout2 = Dropout(dropout, key=keys[5])
        if isinstance(activation, str):
            if activation not in _ACTIVATIONS:
                raise RuntimeError(f"activation should be relu/gelu, not {activation}")
            activation = _ACTIVATIONS[activation]
        self.activation = activation

    def forward(self, src: Tensor, src_mask: Any = None, src_key_padding_mask: Any = None, is_causal: bool = False) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x: Tensor, attn_mask: Any, key_padding_mask: Any, is_causal: bool) -> Tensor:
        out, _ = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False, is_causal=is_causal)
        return self.dropout1(out)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))
