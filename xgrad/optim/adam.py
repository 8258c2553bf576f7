"""``Adam`` and ``AdamW``: PyTorch's Adam family as optax chains."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax.numpy as jnp
import optax

from xgrad.optim.optimizer import _check_adam_arguments, _WithLearningRate
from xgrad.tensor import Tensor


def _adam(
    b1: float, b2: float, eps: float, amsgrad: bool,
) -> optax.GradientTransformation:
    if not amsgrad:
        return optax.scale_by_adam(b1, b2, eps)
    # PyTorch keeps the maximum of the raw second moment and bias-corrects it at each
    # step: m̂ / (sqrt(max v / (1 - b2^t)) + eps) = sqrt(1 - b2^t) m̂ / (sqrt(max v) + eps sqrt(1 - b2^t)).
    # optax's amsgrad without nu bias correction keeps the raw maximum; the step-dependent
    # eps and factor come in as schedules.
    def correction(count: Any) -> Any:
        return jnp.sqrt(1.0 - b2 ** (count + 1))

    return optax.chain(
        optax.inject_hyperparams(optax.scale_by_amsgrad, static_args=("bias_correction_nu",))(
            b1=b1, b2=b2, eps=lambda count: eps * correction(count), bias_correction_nu=False
        ),
        optax.scale_by_schedule(correction),
    )


class Adam(_WithLearningRate):
    """``torch.optim.Adam``; ``weight_decay`` is an L2 term added to the gradient, as PyTorch's.

    Args:
        params: the parameters (``model.parameters()``) or a mapping name → Tensor.
        lr, betas, eps, weight_decay, amsgrad, maximize: as PyTorch, with its defaults.

    >>> import xgrad
    >>> w = xgrad.tensor([1.0, -1.0], requires_grad=True)
    >>> opt = xgrad.optim.Adam([w], lr=0.1)
    >>> (w * w).sum().backward()
    >>> opt.step(); [round(v, 4) for v in w.tolist()]
    [0.9, -0.9]
    """

    def __init__(
        self, params: Iterable[Tensor] | Mapping[str, Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *, maximize: bool = False,
    ) -> None:
        _check_adam_arguments(lr, betas, eps, weight_decay)

        def make(learning_rate: Any) -> optax.GradientTransformation:
            parts = [optax.scale(-1.0)] if maximize else []
            if weight_decay:
                parts.append(optax.add_decayed_weights(weight_decay))
            parts += [_adam(betas[0], betas[1], eps, amsgrad), optax.scale_by_learning_rate(learning_rate)]
            return optax.chain(*parts)

        super().__init__(params, optax.inject_hyperparams(make)(learning_rate=lr))


class AdamW(_WithLearningRate):
    """``torch.optim.AdamW``: Adam with decoupled weight decay, ``p -= lr * weight_decay * p`` each step.

    Args:
        params: the parameters (``model.parameters()``) or a mapping name → Tensor.
        lr, betas, eps, weight_decay (default 0.01), amsgrad, maximize: as PyTorch.

    >>> import xgrad
    >>> w = xgrad.tensor([1.0], requires_grad=True)
    >>> opt = xgrad.optim.AdamW([w], lr=0.1, weight_decay=0.5)
    >>> (w * 0).sum().backward()  # a zero gradient: only the decay moves w
    >>> opt.step(); round(w.item(), 4)
    0.95
    """

    def __init__(
        self, params: Iterable[Tensor] | Mapping[str, Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
    ) -> None:
        _check_adam_arguments(lr, betas, eps, weight_decay)

        def make(learning_rate: Any) -> optax.GradientTransformation:
            parts = [optax.scale(-1.0)] if maximize else []
            parts += [_adam(betas[0], betas[1], eps, amsgrad), optax.add_decayed_weights(weight_decay),
                      optax.scale_by_learning_rate(learning_rate)]
            return optax.chain(*parts)

        super().__init__(params, optax.inject_hyperparams(make)(learning_rate=lr))
