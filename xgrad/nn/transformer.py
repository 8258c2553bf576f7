"""Attention and transformer layers: ``MultiheadAttention``, the encoder and decoder layers and stacks, ``Transformer``."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from xgrad import ops
from xgrad.generator import KeyState
from xgrad.nn.containers import ModuleList
from xgrad.nn.dropout import Dropout
from xgrad.nn.init import prng_key, xavier_uniform_
from xgrad.nn.linear import Linear
from xgrad.nn.module import Module, Parameter
from xgrad.nn.normalization import LayerNorm
from xgrad.tensor import Tensor
from xgrad.tensor.devices import resolve_device
from xgrad.tensor.dtypes import parameter_dtype


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
        *, key: Any = None, dtype: Any = None,
    ) -> None:
        dtype = parameter_dtype(dtype)
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} and num_heads={num_heads} instead")
        if embed_dim % num_heads:  # PyTorch's assert
            raise AssertionError(f"embed_dim must be divisible by num_heads, got embed_dim={embed_dim} and num_heads={num_heads}")
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
        self._dropout_rng = KeyState(k_drop)  # not a child module: PyTorch's attention has none

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
        if e != self.embed_dim:  # PyTorch's asserts, before any product fails in its own words
            raise AssertionError(f"was expecting embedding dimension of {self.embed_dim}, but got {e}")
        if key.shape != value.shape:
            raise AssertionError(f"key shape {key.shape} does not match value shape {value.shape}")
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
            weights = ops.dropout(weights, self.dropout, key=self._dropout_rng.draw(), training=True)
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


def _activation(activation: Any) -> Any:
    if isinstance(activation, str):
        if activation not in _ACTIVATIONS:
            raise RuntimeError(f"activation should be relu/gelu, not {activation}")
        return _ACTIVATIONS[activation]
    return activation


def _layer_norm(d_model: int, eps: float, bias: bool, dtype: Any) -> LayerNorm:
    """PyTorch's ``LayerNorm(d_model, eps=eps, bias=bias)``: without ``bias`` it has no ``bias`` parameter."""
    norm = LayerNorm(d_model, eps=eps, dtype=dtype)
    if not bias:
        norm.bias = None
    return norm


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
        *, key: Any = None, dtype: Any = None,
    ) -> None:
        keys = jax.random.split(prng_key(key), 6)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, key=keys[0], dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, key=keys[1], dtype=dtype)
        self.dropout = Dropout(dropout, key=keys[2])
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, key=keys[3], dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = _layer_norm(d_model, layer_norm_eps, bias, dtype)
        self.norm2 = _layer_norm(d_model, layer_norm_eps, bias, dtype)
        self.dropout1 = Dropout(dropout, key=keys[4])
        self.dropout2 = Dropout(dropout, key=keys[5])
        self.activation = _activation(activation)

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


class TransformerDecoderLayer(Module):
    """Self-attention, attention over the encoder's output (``memory``) and a feed-forward block, as PyTorch's.

    Each block has a residual and a LayerNorm (after it, or before it with
    ``norm_first=True``). Parameters are named as PyTorch names them (``self_attn.*``,
    ``multihead_attn.*``, ``linear1``, ``linear2``, ``norm1``-``norm3``), so its checkpoints load.

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False)``: masks as in
    ``MultiheadAttention`` (boolean True or ``-inf`` marks what is not attended to); an
    ``*_is_causal`` flag without its mask applies the causal mask.

    Args:
        d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
            norm_first, bias: as ``TransformerEncoderLayer``.
        key: a ``jax.random`` key or int seed for every initialisation and dropout.

    >>> import xgrad
    >>> layer = xgrad.nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, batch_first=True, key=0)
    >>> layer(xgrad.ones(2, 3, 8), xgrad.ones(2, 5, 8)).shape
    (2, 3, 8)
    """

    def __init__(
        self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1, activation: Any = "relu",
        layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False, bias: bool = True,
        *, key: Any = None, dtype: Any = None,
    ) -> None:
        keys = jax.random.split(prng_key(key), 8)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, key=keys[0], dtype=dtype)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, key=keys[1], dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, key=keys[2], dtype=dtype)
        self.dropout = Dropout(dropout, key=keys[3])
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, key=keys[4], dtype=dtype)
        self.norm_first = norm_first
        self.norm1 = _layer_norm(d_model, layer_norm_eps, bias, dtype)
        self.norm2 = _layer_norm(d_model, layer_norm_eps, bias, dtype)
        self.norm3 = _layer_norm(d_model, layer_norm_eps, bias, dtype)
        self.dropout1 = Dropout(dropout, key=keys[5])
        self.dropout2 = Dropout(dropout, key=keys[6])
        self.dropout3 = Dropout(dropout, key=keys[7])
        self.activation = _activation(activation)

    def forward(
        self, tgt: Tensor, memory: Tensor, tgt_mask: Any = None, memory_mask: Any = None, tgt_key_padding_mask: Any = None,
        memory_key_padding_mask: Any = None, tgt_is_causal: bool = False, memory_is_causal: bool = False,
    ) -> Tensor:
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
            x = self.norm3(x + self._ff_block(x))
        return x

    def _sa_block(self, x: Tensor, attn_mask: Any, key_padding_mask: Any, is_causal: bool) -> Tensor:
        out, _ = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False, is_causal=is_causal)
        return self.dropout1(out)

    def _mha_block(self, x: Tensor, memory: Tensor, attn_mask: Any, key_padding_mask: Any, is_causal: bool) -> Tensor:
        out, _ = self.multihead_attn(
            x, memory, memory, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False, is_causal=is_causal,
        )
        return self.dropout2(out)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))


def _clones(layer: Module, n: int) -> ModuleList:
    """``n`` deep copies of ``layer`` (PyTorch's ``_get_clones``: equal parameters at first), each random key re-keyed.

    A copied dropout would repeat its original's masks; PyTorch's layers draw from one
    global generator, so their masks differ. Each copy's random states get keys of their own.
    """
    clones = []
    for i in range(n):
        clone = copy.deepcopy(layer)
        for module in clone.modules():
            for name, value in list(vars(module).items()):
                if isinstance(value, KeyState):
                    object.__setattr__(module, name, KeyState(jax.random.fold_in(value.draw(), i)))
        clones.append(clone)
    return ModuleList(clones)


class TransformerEncoder(Module):
    """A stack of ``num_layers`` copies of ``encoder_layer`` and an optional final ``norm``, as PyTorch's.

    ``forward(src, mask=None, src_key_padding_mask=None, is_causal=None)``. Parameters are
    ``layers.0.*``, …, ``norm.*``. PyTorch's nested-tensor fast path
    (``enable_nested_tensor``) is accepted and changes nothing: the result is the same.

    >>> import xgrad
    >>> layer = xgrad.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True, key=0)
    >>> xgrad.nn.TransformerEncoder(layer, num_layers=2)(xgrad.ones(2, 5, 8)).shape
    (2, 5, 8)
    """

    def __init__(
        self, encoder_layer: Module, num_layers: int, norm: Module | None = None, enable_nested_tensor: bool = True,
        mask_check: bool = True,
    ) -> None:
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src: Tensor, mask: Any = None, src_key_padding_mask: Any = None, is_causal: bool | None = None) -> Tensor:
        output = src
        for layer in self.layers:
            output = layer(output, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        return output if self.norm is None else self.norm(output)


class TransformerDecoder(Module):
    """A stack of ``num_layers`` copies of ``decoder_layer`` and an optional final ``norm``, as PyTorch's.

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False)``.

    >>> import xgrad
    >>> layer = xgrad.nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, batch_first=True, key=0)
    >>> xgrad.nn.TransformerDecoder(layer, num_layers=2)(xgrad.ones(2, 3, 8), xgrad.ones(2, 5, 8)).shape
    (2, 3, 8)
    """

    def __init__(self, decoder_layer: Module, num_layers: int, norm: Module | None = None) -> None:
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(
        self, tgt: Tensor, memory: Tensor, tgt_mask: Any = None, memory_mask: Any = None, tgt_key_padding_mask: Any = None,
        memory_key_padding_mask: Any = None, tgt_is_causal: bool | None = None, memory_is_causal: bool = False,
    ) -> Tensor:
        output = tgt
        for layer in self.layers:
            output = layer(
                output, memory, tgt_mask=tgt_mask, memory_mask=memory_mask, tgt_key_padding_mask=tgt_key_padding_mask,
                memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=bool(tgt_is_causal),
                memory_is_causal=memory_is_causal,
            )
        return output if self.norm is None else self.norm(output)


class Transformer(Module):
    """PyTorch's ``nn.Transformer``: an encoder stack and a decoder stack, each with a final LayerNorm.

    ``forward(src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
    src_key_padding_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
    src_is_causal=None, tgt_is_causal=None, memory_is_causal=False)``. Parameters are named
    as PyTorch's (``encoder.layers.0.self_attn.in_proj_weight``, ``decoder.norm.weight``, …)
    and every matrix is initialised ``xavier_uniform_``, as PyTorch's ``_reset_parameters``.

    Args:
        d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward, dropout,
            activation, layer_norm_eps, batch_first, norm_first, bias: as PyTorch.
        custom_encoder, custom_decoder: modules used instead of the stacks.
        key: a ``jax.random`` key or int seed for every initialisation and dropout.

    >>> import xgrad
    >>> model = xgrad.nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
    ...                              dim_feedforward=16, batch_first=True, key=0)
    >>> mask = xgrad.nn.Transformer.generate_square_subsequent_mask(3)
    >>> model(xgrad.ones(2, 5, 8), xgrad.ones(2, 3, 8), tgt_mask=mask).shape
    (2, 3, 8)
    """

    def __init__(
        self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
        dim_feedforward: int = 2048, dropout: float = 0.1, activation: Any = "relu", custom_encoder: Module | None = None,
        custom_decoder: Module | None = None, layer_norm_eps: float = 1e-5, batch_first: bool = False,
        norm_first: bool = False, bias: bool = True, *, key: Any = None, dtype: Any = None,
    ) -> None:
        k_enc, k_dec, k_init = jax.random.split(prng_key(key), 3)
        layer_args = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first, bias)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            encoder_layer = TransformerEncoderLayer(*layer_args, key=k_enc, dtype=dtype)
            self.encoder = TransformerEncoder(encoder_layer, num_encoder_layers, _layer_norm(d_model, layer_norm_eps, bias, dtype))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            decoder_layer = TransformerDecoderLayer(*layer_args, key=k_dec, dtype=dtype)
            self.decoder = TransformerDecoder(decoder_layer, num_decoder_layers, _layer_norm(d_model, layer_norm_eps, bias, dtype))
        for i, p in enumerate(self.parameters()):
            if p.ndim > 1:
                xavier_uniform_(p, generator=jax.random.fold_in(k_init, i))
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def forward(
        self, src: Tensor, tgt: Tensor, src_mask: Any = None, tgt_mask: Any = None, memory_mask: Any = None,
        src_key_padding_mask: Any = None, tgt_key_padding_mask: Any = None, memory_key_padding_mask: Any = None,
        src_is_causal: bool | None = None, tgt_is_causal: bool | None = None, memory_is_causal: bool = False,
    ) -> Tensor:
        if src.ndim == 3 and src.shape[0 if self.batch_first else 1] != tgt.shape[0 if self.batch_first else 1]:
            raise RuntimeError("the batch number of src and tgt must be equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError("the feature number of src and tgt must be equal to d_model")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(  # type: ignore[no-any-return]
            tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask, tgt_key_padding_mask=tgt_key_padding_mask,
            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal,
        )

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device: Any = None, dtype: Any = None) -> Tensor:
        """A float ``(sz, sz)`` mask: ``-inf`` above the diagonal (future positions), ``0.0`` elsewhere.

        >>> import xgrad
        >>> xgrad.nn.Transformer.generate_square_subsequent_mask(3).tolist()
        [[0.0, -inf, -inf], [0.0, 0.0, -inf], [0.0, 0.0, 0.0]]
        """
        mask = jnp.triu(jnp.full((sz, sz), -jnp.inf, parameter_dtype(dtype)), 1)  # the default dtype, as PyTorch
        return Tensor(mask if device is None else jax.device_put(mask, resolve_device(device)))
