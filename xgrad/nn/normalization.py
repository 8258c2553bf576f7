"""Normalisation layers: ``LayerNorm``, ``GroupNorm``, ``BatchNorm1d``, ``BatchNorm2d``."""

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


class GroupNorm(Module):
    """Group normalisation (``F.group_norm``) of ``(N, C, *)`` input, with a learned scale and shift per channel.

    >>> import xgrad
    >>> xgrad.nn.GroupNorm(2, 4)(xgrad.randn(3, 4, 5)).shape
    (3, 4, 5)
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, *, dtype: Any = None) -> None:
        dtype = parameter_dtype(dtype)
        if num_groups <= 0 or num_channels % num_groups:
            raise ValueError("num_channels must be divisible by num_groups")
        check_nonnegative_shape((num_channels,))
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.weight = Parameter(jnp.ones((num_channels,), dtype)) if affine else None
        self.bias = Parameter(jnp.zeros((num_channels,), dtype)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        return ops.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"



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
        use_batch_stats = self.training or self.running_mean is None
        momentum = self.momentum
        if self.training and self.num_batches_tracked is not None:
            with no_grad():
                self.num_batches_tracked.copy_(Tensor(self.num_batches_tracked.array + 1))
            if momentum is None:  # a cumulative average: PyTorch's factor 1 / num_batches_tracked
                momentum = 1.0 / float(self.num_batches_tracked.array)
        # Untracked statistics are None buffers: batch statistics then, in eval mode too, as PyTorch.
        return ops.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, use_batch_stats,
                              0.0 if momentum is None else momentum, self.eps)

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

