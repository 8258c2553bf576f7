"""Normalisation layers: ``LayerNorm``, ``BatchNorm1d``, ``BatchNorm2d``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from xgrad import ops
from xgrad.grad_mode import no_grad
from xgrad.nn.module import Module, Parameter
from xgrad.ops._util import check_nonnegative_shape
from xgrad.tensor import Tensor
from xgrad.tensor.dtypes import parameter_dtype


class LayerNorm(Module):
    """Layer normalisation over the trailing ``normalized_shape`` dims, with a learned scale and shift.

    >>> import xgrad
    >>> xgrad.nn.LayerNorm(2)(xgrad.tensor([[1.0, 3.0]])).shape
    (1, 2)
    """

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True, *, dtype: Any = None) -> None:
        dtype = parameter_dtype(dtype)
        self.normalized_shape = check_nonnegative_shape(
            (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        )
        self.eps = eps
        self.weight = Parameter(jnp.ones(self.normalized_shape, dtype)) if elementwise_affine else None
        self.bias = Parameter(jnp.zeros(self.normalized_shape, dtype)) if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        return ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"



class _BatchNorm(Module):
    _input_dims: tuple[int, ...]

    def __init__(
        self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
        track_running_stats: bool = True, *, dtype: Any = None,
    ) -> None:
        dtype = parameter_dtype(dtype)
        check_nonnegative_shape((num_features,))
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(jnp.ones((num_features,), dtype)) if affine else None
        self.bias = Parameter(jnp.zeros((num_features,), dtype)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", Tensor(jnp.zeros((num_features,), dtype)))
            self.register_buffer("running_var", Tensor(jnp.ones((num_features,), dtype)))
            # int64 where x64 is on, int32 otherwise (JAX has no int64 then).
            self.register_buffer("num_batches_tracked", Tensor(jnp.zeros((), jax.dtypes.canonicalize_dtype(jnp.int64))))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim not in self._input_dims:
            expected = " or ".join(f"{d}D" for d in self._input_dims)
            raise ValueError(f"expected {expected} input (got {x.ndim}D input)")
        if x.shape[1] != self.num_features:  # PyTorch's batch_norm check, naming the running mean
            raise RuntimeError(f"running_mean should contain {x.shape[1]} elements not {self.num_features}")
        dims = (0, *range(2, x.ndim))
        stat_shape = (1, self.num_features) + (1,) * (x.ndim - 2)
        use_batch_stats = self.training or self.running_mean is None
        if use_batch_stats:
            count = x.numel() // self.num_features
            if self.training and count <= 1:
                raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(x.shape)}")
            mean = ops.mean(x, dim=dims, keepdim=True)
            var = ops.var(x, dim=dims, keepdim=True, correction=0)
            if self.training and self.running_mean is not None:
                self._update_running_stats(mean.array.reshape(-1), var.array.reshape(-1) * (count / (count - 1)))
        else:
            mean = self.running_mean.reshape(stat_shape)
            var = self.running_var.reshape(stat_shape)
        y = (x - mean) * ops.rsqrt(var + self.eps)
        if self.weight is not None and self.bias is not None:
            y = y * self.weight.reshape(stat_shape) + self.bias.reshape(stat_shape)
        return y

    def _update_running_stats(self, batch_mean: jax.Array, unbiased_var: jax.Array) -> None:
        # PyTorch: running = (1 - factor) * running + factor * batch, the factor being
        # momentum, or 1/num_batches_tracked (a cumulative average) when momentum is None.
        with no_grad():
            tracked = self.num_batches_tracked
            tracked.copy_(Tensor(tracked.array + 1))
            factor = 1.0 / float(tracked.array) if self.momentum is None else self.momentum
            for buffer, batch in ((self.running_mean, batch_mean), (self.running_var, unbiased_var)):
                buffer.copy_(Tensor(((1 - factor) * buffer.array + factor * batch).astype(buffer.dtype)))

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalisation over ``(N, C)`` or ``(N, C, L)`` input, with running statistics as buffers.

    Training normalises with the batch's mean and biased variance and updates
    ``running_mean``/``running_var`` (with the unbiased variance) by ``momentum``, or by a
    cumulative average when ``momentum=None``; eval mode normalises with the running
    statistics. ``num_batches_tracked`` counts the training batches. As PyTorch.

    >>> import xgrad
    >>> bn = xgrad.nn.BatchNorm1d(2)
    >>> _ = bn(xgrad.tensor([[0.0, 1.0], [2.0, 3.0]], dtype="float32"))
    >>> bn.running_mean.tolist(), bn.running_var.tolist(), bn.num_batches_tracked.item()
    ([0.10000000149011612, 0.20000000298023224], [1.100000023841858, 1.100000023841858], 1)
    """

    _input_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation over ``(N, C, H, W)`` input; see ``BatchNorm1d``.

    >>> import xgrad
    >>> xgrad.nn.BatchNorm2d(3)(xgrad.randn(2, 3, 4, 4)).shape
    (2, 3, 4, 4)
    """

    _input_dims = (4,)

