"""Neural-network ops: softmax family (fused rules), losses, layer norm, dropout."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.ops.registry import defprim
from xgrad.tensor import Tensor

_softmax = defprim(
    "softmax",
    lambda x, axis: jax.nn.softmax(x, axis=axis),
    (lambda g, out, x, axis: out * (g - (g * out).sum(dim=axis, keepdim=True)),),
    save=(),
    save_out=True,
)
_log_softmax = defprim(
    "log_softmax",
    lambda x, axis: jax.nn.log_softmax(x, axis=axis),
    (lambda g, out, x, axis: g - out.exp() * g.sum(dim=axis, keepdim=True),),
    save=(),
    save_out=True,
)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax along ``dim``.

    >>> import xgrad
    >>> xgrad.softmax(xgrad.tensor([0.0, 0.0])).tolist()
    [0.5, 0.5]
    """
    return _softmax(x, axis=dim % x.ndim)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Log-softmax along ``dim``, computed stably.

    >>> import xgrad
    >>> [round(v, 4) for v in xgrad.log_softmax(xgrad.tensor([0.0, 0.0])).tolist()]
    [-0.6931, -0.6931]
    """
    return _log_softmax(x, axis=dim % x.ndim)


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{reduction} is not a valid value for reduction")


def cross_entropy(input: Tensor, target: Any, reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """``F.cross_entropy``: ``input`` logits (N, C); ``target`` class indices (N,) or probabilities (N, C).

    >>> import xgrad
    >>> logits = xgrad.tensor([[0.0, 0.0], [0.0, 0.0]])
    >>> round(xgrad.cross_entropy(logits, xgrad.tensor([0, 1])).item(), 4)
    0.6931
    """
    logp = log_softmax(input, dim=1 if input.ndim > 1 else 0)
    target_arr = target._array if isinstance(target, Tensor) else jnp.asarray(target)
    if jnp.issubdtype(target_arr.dtype, jnp.integer):
        picked = logp.gather(1, Tensor(target_arr[:, None])).squeeze(1) if input.ndim > 1 else logp[target_arr]
        nll = -picked
        if label_smoothing:
            nll = (1 - label_smoothing) * nll - label_smoothing * logp.mean(dim=-1)
        return _reduce(nll, reduction)
    probs = target if isinstance(target, Tensor) else Tensor(target_arr)
    return _reduce(-(probs * logp).sum(dim=1 if input.ndim > 1 else 0), reduction)


def mse_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:
    """``F.mse_loss``: squared error, averaged by default.

    >>> import xgrad
    >>> xgrad.mse_loss(xgrad.tensor([1.0, 3.0]), xgrad.tensor([1.0, 1.0])).item()
    2.0
    """
    diff = input - target
    return _reduce(diff * diff, reduction)


def layer_norm(x: Tensor, normalized_shape: Any, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """``F.layer_norm`` over the last ``len(normalized_shape)`` dims.

    >>> import xgrad
    >>> xgrad.layer_norm(xgrad.tensor([[1.0, 3.0]]), (2,), eps=0.0).tolist()
    [[-1.0, 1.0]]
    """
    n = 1 if isinstance(normalized_shape, int) else len(tuple(normalized_shape))
    dims = tuple(range(x.ndim - n, x.ndim))
    mu = x.mean(dim=dims, keepdim=True)
    centered = x - mu
    variance = (centered * centered).mean(dim=dims, keepdim=True)
    out = centered * (variance + eps).rsqrt()
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def dropout(x: Tensor, p: float = 0.5, key: Any = None, training: bool = True) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1/(1-p)``.

    Args:
        key: a ``jax.random`` key; when ``None`` the module default key is split.

    >>> import jax, xgrad
    >>> x = xgrad.ones(4)
    >>> xgrad.dropout(x, p=0.5, key=jax.random.key(0), training=False).tolist()
    [1.0, 1.0, 1.0, 1.0]
    >>> kept = xgrad.dropout(x, p=0.5, key=jax.random.key(0)).tolist()
    >>> all(v in (0.0, 2.0) for v in kept)
    True
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    from xgrad.creation import next_key

    key = next_key() if key is None else key
    sharding = getattr(x._array, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding) and len(sharding.device_set) > 1:
        # The mask is made where x lives, each device drawing its own part (threefry is
        # partitionable: the same values as unsharded); the key is replicated over x's mesh,
        # as its raw bits: a typed key cannot be put on devices of other processes.
        typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
        bits = np.asarray(jax.random.key_data(key) if typed else key)
        bits = jax.device_put(bits, jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec()))
        impl = jax.random.key_impl(key) if typed else None
        return x * Tensor(_sharded_dropout_scale(bits, impl, 1.0 - p, x.shape, x.dtype, sharding))
    keep = jax.random.bernoulli(key, 1.0 - p, x.shape)
    return x * Tensor(keep.astype(x.dtype) / (1.0 - p))


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5))
def _sharded_dropout_scale(bits: Any, impl: Any, keep_prob: float, shape: tuple[int, ...], dtype: Any, sharding: Any) -> Any:
    key = bits if impl is None else jax.random.wrap_key_data(bits, impl=impl)
    keep = jax.random.bernoulli(key, keep_prob, shape)
    return jax.lax.with_sharding_constraint(keep.astype(dtype) / keep_prob, sharding)
