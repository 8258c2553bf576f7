"""Helpers on tensors' ``.grad``, shared by ``nn.Module`` and the optimizers."""

from __future__ import annotations

from collections.abc import Iterable

import jax.numpy as jnp

from xgrad.tensor import Tensor

__all__ = ["clear_grads"]


def clear_grads(params: Iterable[Tensor], set_to_none: bool) -> None:
    """Set each ``.grad`` to ``None`` or, with ``set_to_none=False``, to zeros."""
    for p in params:
        if set_to_none or p.grad is None:
            p.grad = None
        else:
            p.grad = Tensor(jnp.zeros_like(p.grad.array))
