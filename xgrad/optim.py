"""Optimizers: any ``optax`` gradient transformation, applied to parameters' ``.grad``.

There is no hand-written optimizer here: ``Optax`` reads the ``.grad`` arrays, runs
the transformation's ``update`` and ``optax.apply_updates`` in one ``jax.jit``
program, and rebinds each parameter's storage in place (under ``no_grad``, bumping
``_version`` as any in-place op does). ``SGD``, ``Adam`` and ``AdamW`` take PyTorch's
arguments and build the matching optax chain; ``xgrad.optim.lr_scheduler`` changes their
learning rate between steps.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from xgrad.grad_mode import no_grad
from xgrad.nn import clear_grads
from xgrad.tensor import Tensor

__all__ = ["SGD", "Adam", "AdamW", "Optax", "get_lr", "lr_scheduler", "set_lr"]


def _step(transform: optax.GradientTransformation, params: list[Any], grads: list[Any], state: Any) -> tuple[list[Any], Any]:
    updates, state = transform.update(grads, state, params)
    return optax.apply_updates(params, updates), state


class Optax:
    """Update parameters in place with an ``optax`` transformation of their ``.grad``.

    Args:
        params: the parameters: an iterable of leaf Tensors (``model.parameters()``)
            or a mapping name → Tensor (``dict(model.named_parameters())``).
        transform: an ``optax.GradientTransformation`` (``optax.sgd(0.1)``,
            ``optax.adam(1e-3)``, a chain, …).

    A parameter whose ``.grad`` is ``None`` is stepped with a zero gradient: an optax
    transformation updates its whole tree at once.

    >>> import optax, xgrad
    >>> w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> opt = xgrad.optim.Optax([w], optax.sgd(0.5))
    >>> (w * w).sum().backward()
    >>> opt.step(); w.tolist()
    [0.0, 0.0]
    """

    def __init__(self, params: Iterable[Tensor] | Mapping[str, Tensor], transform: optax.GradientTransformation) -> None:
        tensors = list(params.values()) if isinstance(params, Mapping) else list(params)
        if not tensors:
            raise ValueError("optimizer got an empty parameter list")
        for i, p in enumerate(tensors):
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but parameter {i} is a {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError(f"can't optimize a non-leaf Tensor (parameter {i}, grad_fn={p.grad_fn.name()})")  # type: ignore[union-attr]
        if len({id(p) for p in tensors}) != len(tensors):
            raise ValueError("some parameters appear more than once in the parameter list")
        self.params = tensors
        self.transform = transform
        self.state = transform.init([p.array for p in tensors])
        self._jitted_step = jax.jit(lambda params, grads, state: _step(transform, params, grads, state))

    def step(self) -> None:
        """Apply one update from the current ``.grad``s."""
        arrays = [p.array for p in self.params]
        grads = [p.grad.array if p.grad is not None else jnp.zeros_like(p.array) for p in self.params]
        new_arrays, self.state = self._jitted_step(arrays, grads, self.state)
        with no_grad():
            for p, new in zip(self.params, new_arrays, strict=True):
                p.copy_(Tensor(new))

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the parameters' ``.grad`` (to ``None``, or to zeros)."""
        clear_grads(self.params, set_to_none)


# -- PyTorch's optimizers, as optax chains ----------------------------------------------
#
# Each class below only translates PyTorch's arguments into a chain of stock optax
# transforms and hands it to ``Optax``: the update rules are optax's. The learning rate
# goes through ``optax.inject_hyperparams``, so it lives in the optimizer state where
# ``lr`` and the schedulers in ``xgrad.optim.lr_scheduler`` can change it between steps
# without a recompile.


def _check_nonnegative(name: str, value: float) -> None:
    if not value >= 0.0:
        raise ValueError(f"Invalid {name}: {value}")


def _check_betas(betas: tuple[float, float]) -> None:
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta}")


class _WithLearningRate(Optax):
    """An ``Optax`` whose transform was built by ``optax.inject_hyperparams`` with a ``learning_rate``."""

    @property
    def lr(self) -> float:
        """The current learning rate (what a scheduler sets; assignable)."""
        return get_lr(self)

    @lr.setter
    def lr(self, value: float) -> None:
        set_lr(self, value)


def get_lr(optimizer: Optax) -> float:
    """The learning rate held in ``optimizer``'s state (its transform made by ``optax.inject_hyperparams``)."""
    return float(_hyperparams(optimizer)["learning_rate"])


def set_lr(optimizer: Optax, value: float) -> None:
    """Set the learning rate in ``optimizer``'s state; the next ``step`` uses it (same dtype: no recompile)."""
    hyperparams = _hyperparams(optimizer)
    old = hyperparams["learning_rate"]
    hyperparams["learning_rate"] = jnp.asarray(value, dtype=jnp.asarray(old).dtype)


def _hyperparams(optimizer: Optax) -> dict[str, Any]:
    hyperparams = getattr(optimizer.state, "hyperparams", None)
    if not isinstance(hyperparams, dict) or "learning_rate" not in hyperparams:
        raise TypeError(
            "this optimizer has no learning rate in its state: build its transform with "
            "optax.inject_hyperparams(optax.adam)(learning_rate=...) (as optim.SGD/Adam/AdamW do) to schedule it"
        )
    return hyperparams


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
        _check_nonnegative("learning rate", lr)
        _check_nonnegative("epsilon value", eps)
        _check_betas(betas)
        _check_nonnegative("weight_decay value", weight_decay)

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
        _check_nonnegative("learning rate", lr)
        _check_nonnegative("epsilon value", eps)
        _check_betas(betas)
        _check_nonnegative("weight_decay value", weight_decay)

        def make(learning_rate: Any) -> optax.GradientTransformation:
            parts = [optax.scale(-1.0)] if maximize else []
            parts += [_adam(betas[0], betas[1], eps, amsgrad), optax.add_decayed_weights(weight_decay),
                      optax.scale_by_learning_rate(learning_rate)]
            return optax.chain(*parts)

        super().__init__(params, optax.inject_hyperparams(make)(learning_rate=lr))


from xgrad import lr_scheduler  # noqa: E402  (it reads the optimizers above)

# ``from xgrad.optim.lr_scheduler import StepLR`` works as with torch.optim.
sys.modules[f"{__name__}.lr_scheduler"] = lr_scheduler
