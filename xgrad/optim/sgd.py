"""``SGD``: PyTorch's stochastic gradient descent as an optax chain."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax.numpy as jnp
import optax

from xgrad.optim.optimizer import _check_nonnegative, _WithLearningRate
from xgrad.tensor import Tensor


class SGD(_WithLearningRate):
    """``torch.optim.SGD``: stochastic gradient descent with momentum, dampening, weight decay, Nesterov.

    PyTorch's update, from optax pieces: ``g += weight_decay * p``; with momentum,
    ``buf = g`` on the first step and ``buf = momentum * buf + (1 - dampening) * g`` after;
    ``g = g + momentum * buf`` (Nesterov) or ``buf``; ``p -= lr * g``.

    Args:
        params: the parameters (``model.parameters()``) or a mapping name → Tensor.
        lr, momentum, dampening, weight_decay, nesterov, maximize: as PyTorch, with its defaults.

    >>> import xgrad
    >>> w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> opt = xgrad.optim.SGD([w], lr=0.5, momentum=0.9)
    >>> (w * w).sum().backward()
    >>> opt.step(); w.tolist()
    [0.0, 0.0]
    """

    def __init__(
        self, params: Iterable[Tensor] | Mapping[str, Tensor], lr: float = 1e-3, momentum: float = 0.0,
        dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
    ) -> None:
        _check_nonnegative("learning rate", lr)
        _check_nonnegative("momentum value", momentum)
        _check_nonnegative("weight_decay value", weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

        def make(learning_rate: Any) -> optax.GradientTransformation:
            parts = [optax.scale(-1.0)] if maximize else []
            if weight_decay:
                parts.append(optax.add_decayed_weights(weight_decay))
            if momentum:
                if dampening:
                    # PyTorch's first buffer is the gradient itself; dampening starts at step 2.
                    parts.append(optax.scale_by_schedule(lambda count: jnp.where(count == 0, 1.0, 1.0 - dampening)))
                parts.append(optax.trace(decay=momentum, nesterov=nesterov))
            parts.append(optax.scale_by_learning_rate(learning_rate))
            return optax.chain(*parts)

        super().__init__(params, optax.inject_hyperparams(make)(learning_rate=lr))

