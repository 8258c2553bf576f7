"""``xgrad.optim.lr_scheduler``: PyTorch's learning-rate schedulers, computed by optax schedules.

A scheduler wraps an optimizer whose learning rate lives in its optax state
(``optim.SGD``/``Adam``/``AdamW``, or any ``Optax`` built with
``optax.inject_hyperparams``). Construction sets the epoch-0 rate; each
``scheduler.step()`` moves one epoch and writes ``schedule(epoch)`` into the
optimizer's state, so the next ``optimizer.step()`` uses it without a recompile.
``get_last_lr()`` returns it as a one-element list (xgrad optimizers have one parameter
group). Rates follow PyTorch's closed forms from the rate the optimizer had when the
scheduler was made; schedulers do not chain (one scheduler per optimizer).

>>> import xgrad
>>> w = xgrad.tensor([1.0], requires_grad=True)
>>> opt = xgrad.optim.SGD([w], lr=1.0)
>>> sched = xgrad.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
>>> rates = []
>>> for epoch in range(5):
...     rates.append(sched.get_last_lr()[0])
...     opt.step(); sched.step()
>>> rates
[1.0, 1.0, 0.5, 0.5, 0.25]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import optax

from xgrad.optim.optimizer import Optax, get_lr, set_lr

__all__ = ["CosineAnnealingLR", "ExponentialLR", "LRScheduler", "LambdaLR", "LinearLR", "StepLR"]


class LRScheduler:
    """Base class: ``schedule(epoch)`` gives the learning rate; ``step()`` applies the next epoch's.

    Args:
        optimizer: an ``Optax`` optimizer with a learning rate in its state.
        schedule: an optax schedule (or any callable) from the epoch to the rate.
        last_epoch: the epoch to resume after (``-1``: start from epoch 0).
    """

    def __init__(self, optimizer: Optax, schedule: Callable[[int], Any], last_epoch: int = -1) -> None:

        self.optimizer = optimizer
        self.base_lrs = [get_lr(optimizer)]
        self.schedule = schedule
        self.last_epoch = last_epoch
        self._last_lr = self.base_lrs
        self.step()

    def step(self) -> None:
        """Move to the next epoch and set its learning rate in the optimizer."""

        self.last_epoch += 1
        lr = float(self.schedule(self.last_epoch))
        set_lr(self.optimizer, lr)
        self._last_lr = [lr]

    def get_last_lr(self) -> list[float]:
        """The learning rate the last ``step`` (or construction) set, one per parameter group."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs), "_last_lr": list(self._last_lr)}

    def load_state_dict(self, state: dict[str, Any]) -> None:

        self.last_epoch = int(state["last_epoch"])
        self.base_lrs = list(state["base_lrs"])
        self._last_lr = list(state["_last_lr"])
        set_lr(self.optimizer, self._last_lr[0])


def _base_lr(optimizer: Optax) -> float:

    return get_lr(optimizer)


class StepLR(LRScheduler):
    """``lr = base_lr * gamma ** (epoch // step_size)`` (``optax.exponential_decay``, staircase).

    >>> import xgrad
    >>> opt = xgrad.optim.SGD([xgrad.tensor([1.0], requires_grad=True)], lr=1.0)
    >>> sched = xgrad.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    >>> sched.step(); [round(lr, 6) for lr in sched.get_last_lr()]
    [0.1]
    """

    def __init__(self, optimizer: Optax, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        if step_size <= 0:
            raise ValueError(f"step_size must be a positive integer, got {step_size}")
        schedule = optax.exponential_decay(_base_lr(optimizer), transition_steps=step_size, decay_rate=gamma, staircase=True)
        super().__init__(optimizer, schedule, last_epoch)


class ExponentialLR(LRScheduler):
    """``lr = base_lr * gamma ** epoch`` (``optax.exponential_decay``).

    >>> import xgrad
    >>> opt = xgrad.optim.SGD([xgrad.tensor([1.0], requires_grad=True)], lr=1.0)
    >>> sched = xgrad.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
    >>> sched.step(); sched.step(); sched.get_last_lr()
    [0.25]
    """

    def __init__(self, optimizer: Optax, gamma: float, last_epoch: int = -1) -> None:
        super().__init__(optimizer, optax.exponential_decay(_base_lr(optimizer), transition_steps=1, decay_rate=gamma), last_epoch)


class CosineAnnealingLR(LRScheduler):
    """``lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2`` (``optax.cosine_decay_schedule``).

    Past ``T_max`` the rate climbs back, with period ``2 * T_max``, as PyTorch's does.

    >>> import xgrad
    >>> opt = xgrad.optim.SGD([xgrad.tensor([1.0], requires_grad=True)], lr=1.0)
    >>> sched = xgrad.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2)
    >>> sched.step(); sched.get_last_lr()
    [0.5]
    """

    def __init__(self, optimizer: Optax, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:  # noqa: N803 (PyTorch's name)
        if T_max <= 0:
            raise ValueError(f"T_max must be a positive integer, got {T_max}")
        base = _base_lr(optimizer)
        cosine = optax.cosine_decay_schedule(base, decay_steps=T_max, alpha=eta_min / base if base else 0.0)

        def schedule(epoch: int) -> Any:
            # cos(pi t / T) is symmetric about every multiple of T: fold t into [0, T].
            phase = epoch % (2 * T_max)
            return cosine(min(phase, 2 * T_max - phase)) if base else eta_min

        super().__init__(optimizer, schedule, last_epoch)


class LinearLR(LRScheduler):
    """The rate's factor goes linearly from ``start_factor`` to ``end_factor`` over ``total_iters`` epochs (``optax.linear_schedule``).

    >>> import xgrad
    >>> opt = xgrad.optim.SGD([xgrad.tensor([1.0], requires_grad=True)], lr=1.0)
    >>> sched = xgrad.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=2)
    >>> sched.get_last_lr(), (sched.step(), sched.get_last_lr())[1]
    ([0.5], [0.75])
    """

    def __init__(
        self, optimizer: Optax, start_factor: float = 1.0 / 3, end_factor: float = 1.0, total_iters: int = 5, last_epoch: int = -1,
    ) -> None:
        if not 0 < start_factor <= 1:
            raise ValueError("Starting multiplicative factor expected to be greater than 0 and less or equal to 1.")
        if not 0 <= end_factor <= 1:
            raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")
        base = _base_lr(optimizer)
        schedule = optax.linear_schedule(base * start_factor, base * end_factor, transition_steps=total_iters)
        super().__init__(optimizer, schedule, last_epoch)


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(epoch)``.

    >>> import xgrad
    >>> opt = xgrad.optim.SGD([xgrad.tensor([1.0], requires_grad=True)], lr=2.0)
    >>> sched = xgrad.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1 / (epoch + 1))
    >>> sched.step(); sched.get_last_lr()
    [1.0]
    """

    def __init__(self, optimizer: Optax, lr_lambda: Callable[[int], float], last_epoch: int = -1) -> None:
        base = _base_lr(optimizer)
        super().__init__(optimizer, lambda epoch: jnp.asarray(base * lr_lambda(epoch)), last_epoch)

