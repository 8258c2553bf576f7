"""The base ``LRScheduler`` and PyTorch's epoch schedules: step, multi-step, exponential, cosine, chained, on plateau."""

from __future__ import annotations

import functools
import math
import types
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from xgrad import step_trace
from xgrad.optim.optimizer import Optimizer

__all__ = [
    "ChainedScheduler", "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "ExponentialLR", "LRScheduler", "LambdaLR",
    "LinearLR", "MultiStepLR", "MultiplicativeLR", "PolynomialLR", "ReduceLROnPlateau", "SequentialLR", "StepLR", "check_optimizer",
    "per_group",
]


def check_optimizer(optimizer: Any) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(
            f"{type(optimizer).__name__} is not an Optimizer (an xgrad.optim.Optax optimizer takes its schedule as part "
            "of its optax transform, e.g. optax.adam(optax.cosine_decay_schedule(...)), or use xgrad.optim.set_lr)"
        )


def per_group(name: str, optimizer: Optimizer, value: Any) -> list[Any]:
    """``value`` for each parameter group: a list of one per group, or one for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(
                f"{name} must have the same length as optimizer.param_groups. {name} has {len(value)} values, "
                f"param_groups has {len(optimizer.param_groups)}."
            )
        return list(value)
    return [value] * len(optimizer.param_groups)


def _at_every_call(step: Callable[..., None]) -> Callable[..., None]:
    """``step`` as a step compiled with ``xgrad.compile`` calls it: on the host, at every call.

    Its Python (``last_epoch``, the rates) is plain state the program cannot hold; run
    once at the trace it would freeze the schedule (NOTE [Python state in a compiled step]).
    """

    @functools.wraps(step)
    def run(self: LRScheduler, *args: Any, **kwargs: Any) -> None:
        trace = step_trace.current()
        if trace is not None:
            hyper = [group.hyper_tensor for group in self.optimizer.param_groups if group.hyper_tensor is not None]
            if trace.host_effect(step, (self, *args), kwargs, hyper):
                return
        step(self, *args, **kwargs)

    return run


class LRScheduler:
    """``torch.optim.lr_scheduler.LRScheduler``: ``step()`` moves one epoch and sets each group's ``lr``.

    A subclass gives ``get_lr()`` (the new rates from the current ones, PyTorch's
    recursive form) and may give ``_get_closed_form_lr()`` (the rates at ``last_epoch``
    from ``base_lrs``), which ``step(epoch)`` uses.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:
            cls.step = _at_every_call(cls.__dict__["step"])  # type: ignore[method-assign]

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        check_optimizer(optimizer)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] when resuming an optimizer")
        self.base_lrs: list[float] = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._step_count = 0
        self._initial_step()

    def _initial_step(self) -> None:
        self._step_count = 0
        self.step()

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def get_last_lr(self) -> list[float]:
        """The rates the last ``step`` (or construction) set, one per parameter group."""
        return list(self._last_lr)

    @_at_every_call
    def step(self, epoch: int | None = None) -> None:
        """Move to the next epoch (or to ``epoch``, PyTorch's deprecated form) and set its rates."""
        self._step_count += 1
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            closed_form = getattr(self, "_get_closed_form_lr", None)
            values = closed_form() if closed_form is not None else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values, strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's attributes, the optimizer and functions left out."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer" and not callable(v) and k != "lr_lambdas"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)


class LambdaLR(LRScheduler):
    """``lr = base_lr * lr_lambda(epoch)``; ``lr_lambda`` a function or one per group.

    >>> import xgrad
    >>> opt = xgrad.optim.SGD([xgrad.tensor([1.0], requires_grad=True)], lr=2.0)
    >>> sched = xgrad.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1 / (epoch + 1))
    >>> sched.step(); sched.get_last_lr()
    [1.0]
    """

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]], last_epoch: int = -1) -> None:
        check_optimizer(optimizer)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != len(optimizer.param_groups):
                raise ValueError(f"Expected {len(optimizer.param_groups)} lr_lambdas, but got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * len(optimizer.param_groups)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base_lr * f(self.last_epoch) for f, base_lr in zip(self.lr_lambdas, self.base_lrs, strict=True)]

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        # PyTorch saves a lambda that is a callable object's ``__dict__``, and ``None`` for a function.
        state["lr_lambdas"] = [None if isinstance(f, types.FunctionType) else dict(f.__dict__) for f in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        for f, saved in zip(self.lr_lambdas, state.pop("lr_lambdas", [None] * len(self.lr_lambdas)), strict=True):
            if saved is not None:
                f.__dict__.update(saved)
        super().load_state_dict(state)


class MultiplicativeLR(LambdaLR):
    """``lr *= lr_lambda(epoch)`` at each epoch after the first."""

    def get_lr(self) -> list[float]:
        if self.last_epoch > 0:
            return [g["lr"] * f(self.last_epoch) for f, g in zip(self.lr_lambdas, self.optimizer.param_groups, strict=True)]
        return [g["lr"] for g in self.optimizer.param_groups]


class StepLR(LRScheduler):
    """``lr = base_lr * gamma ** (epoch // step_size)``.

    >>> import xgrad
    >>> opt = xgrad.optim.SGD([xgrad.tensor([1.0], requires_grad=True)], lr=1.0)
    >>> sched = xgrad.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    >>> sched.step(); [round(lr, 6) for lr in sched.get_last_lr()]
    [0.1]
    """

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [g["lr"] for g in self.optimizer.param_groups]
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        return [base_lr * self.gamma ** (self.last_epoch // self.step_size) for base_lr in self.base_lrs]


class MultiStepLR(LRScheduler):
    """``lr = base_lr * gamma ** (number of milestones reached)``."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1, last_epoch: int = -1) -> None:
        self.milestones, self.gamma = Counter(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch not in self.milestones:
            return [g["lr"] for g in self.optimizer.param_groups]
        return [g["lr"] * self.gamma ** self.milestones[self.last_epoch] for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        milestones = sorted(self.milestones.elements())
        return [base_lr * self.gamma ** bisect_right(milestones, self.last_epoch) for base_lr in self.base_lrs]


class ConstantLR(LRScheduler):
    """``lr = base_lr * factor`` for the first ``total_iters`` epochs, ``base_lr`` after."""

    def __init__(self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5, last_epoch: int = -1) -> None:
        if factor > 1.0 or factor < 0:
            raise ValueError("Constant multiplicative factor expected to be between 0 and 1.")
        self.factor, self.total_iters = factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        groups = self.optimizer.param_groups
        if self.last_epoch == 0:
            return [g["lr"] * self.factor for g in groups]
        if self.last_epoch != self.total_iters:
            return [g["lr"] for g in groups]
        return [g["lr"] * (1.0 / self.factor) for g in groups]

    def _get_closed_form_lr(self) -> list[float]:
        reached = self.last_epoch >= self.total_iters
        return [base_lr * (self.factor + reached * (1 - self.factor)) for base_lr in self.base_lrs]


class LinearLR(LRScheduler):
    """The rate's factor goes linearly from ``start_factor`` to ``end_factor`` over ``total_iters`` epochs.

    >>> import xgrad
    >>> opt = xgrad.optim.SGD([xgrad.tensor([1.0], requires_grad=True)], lr=1.0)
    >>> sched = xgrad.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=2)
    >>> sched.get_last_lr(), (sched.step(), sched.get_last_lr())[1]
    ([0.5], [0.75])
    """

    def __init__(
        self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0, total_iters: int = 5, last_epoch: int = -1,
    ) -> None:
        if start_factor > 1.0 or start_factor <= 0:
            raise ValueError("Starting multiplicative factor expected to be greater than 0 and less or equal to 1.")
        if end_factor > 1.0 or end_factor < 0:
            raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        groups = self.optimizer.param_groups
        if self.last_epoch == 0:
            return [g["lr"] * self.start_factor for g in groups]
        if self.last_epoch > self.total_iters:
            return [g["lr"] for g in groups]
        change = self.end_factor - self.start_factor
        factor = 1.0 + change / (self.total_iters * self.start_factor + (self.last_epoch - 1) * change)
        return [g["lr"] * factor for g in groups]

    def _get_closed_form_lr(self) -> list[float]:
        progress = min(self.total_iters, self.last_epoch) / self.total_iters
        return [base_lr * (self.start_factor + (self.end_factor - self.start_factor) * progress) for base_lr in self.base_lrs]


class ExponentialLR(LRScheduler):
    """``lr = base_lr * gamma ** epoch``.

    >>> import xgrad
    >>> opt = xgrad.optim.SGD([xgrad.tensor([1.0], requires_grad=True)], lr=1.0)
    >>> sched = xgrad.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
    >>> sched.step(); sched.step(); sched.get_last_lr()
    [0.25]
    """

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0:
            return [g["lr"] for g in self.optimizer.param_groups]
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        return [base_lr * self.gamma**self.last_epoch for base_lr in self.base_lrs]


class PolynomialLR(LRScheduler):
    """``lr = base_lr * (1 - min(epoch, total_iters) / total_iters) ** power``."""

    def __init__(self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1) -> None:
        self.total_iters, self.power = total_iters, power
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch > self.total_iters:
            return [g["lr"] for g in self.optimizer.param_groups]
        ratio = (1.0 - self.last_epoch / self.total_iters) / (1.0 - (self.last_epoch - 1) / self.total_iters)
        return [g["lr"] * ratio**self.power for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        left = 1.0 - min(self.total_iters, self.last_epoch) / self.total_iters
        return [base_lr * left**self.power for base_lr in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """``lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2``; past ``T_max`` it climbs back.

    >>> import xgrad
    >>> opt = xgrad.optim.SGD([xgrad.tensor([1.0], requires_grad=True)], lr=1.0)
    >>> sched = xgrad.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2)
    >>> sched.step(); [round(lr, 6) for lr in sched.get_last_lr()]
    [0.5]
    """

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:  # noqa: N803 (PyTorch's name)
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        groups, t, period = self.optimizer.param_groups, self.last_epoch, self.T_max
        if t == 0:
            return [g["lr"] for g in groups]
        if self._step_count == 1 and t > 0:
            return [self.eta_min + (b - self.eta_min) * (1 + math.cos(t * math.pi / period)) / 2 for b in self.base_lrs]
        if (t - 1 - period) % (2 * period) == 0:
            return [g["lr"] + (b - self.eta_min) * (1 - math.cos(math.pi / period)) / 2 for b, g in zip(self.base_lrs, groups, strict=True)]
        ratio = (1 + math.cos(math.pi * t / period)) / (1 + math.cos(math.pi * (t - 1) / period))
        return [ratio * (g["lr"] - self.eta_min) + self.eta_min for g in groups]

    def _get_closed_form_lr(self) -> list[float]:
        return [self.eta_min + (b - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2 for b in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing restarted every ``T_i`` epochs, ``T_0`` first and ``T_mult`` times longer at each restart."""

    def __init__(self, optimizer: Optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0, last_epoch: int = -1) -> None:  # noqa: N803 (PyTorch's names)
        if T_0 <= 0 or not isinstance(T_0, int):
            raise ValueError(f"Expected positive integer T_0, but got {T_0}")
        if T_mult < 1 or not isinstance(T_mult, int):
            raise ValueError(f"Expected integer T_mult >= 1, but got {T_mult}")
        self.T_0, self.T_i, self.T_mult, self.eta_min = T_0, T_0, T_mult, eta_min
        self.T_cur: float = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [self.eta_min + (b - self.eta_min) * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2 for b in self.base_lrs]

    def step(self, epoch: float | None = None) -> None:  # type: ignore[override]
        """Move one epoch, or to ``epoch`` (a fraction of one works: ``epoch + i / iters``)."""
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur, self.T_i = self.T_cur - self.T_i, self.T_i * self.T_mult
        else:
            if epoch < 0:
                raise ValueError(f"Expected non-negative epoch, but got {epoch}")
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:
                    n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
                    self.T_cur = epoch - self.T_0 * (self.T_mult**n - 1) / (self.T_mult - 1)
                    self.T_i = self.T_0 * self.T_mult**n
            else:
                self.T_i, self.T_cur = self.T_0, epoch
        self.last_epoch = math.floor(epoch)
        self._step_count += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


class SequentialLR(LRScheduler):
    """Run ``schedulers`` one after another, switching at the epochs in ``milestones``."""

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int], last_epoch: int = -1) -> None:
        check_optimizer(optimizer)
        if len(schedulers) < 1:
            raise ValueError(f"{type(self).__name__} expects at least one scheduler, but got no scheduler.")
        for i, scheduler in enumerate(schedulers):
            if getattr(scheduler, "optimizer", None) is not optimizer:
                raise ValueError(
                    f"{type(self).__name__} expects all schedulers to belong to the same optimizer, but got scheduler "
                    f"{type(scheduler).__name__} at index {i} has {getattr(scheduler, 'optimizer', None)}, which is "
                    f"different from {type(optimizer).__name__}."
                )
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                "Sequential Schedulers expects number of schedulers provided to be one more than the number of milestone "
                f"points, but got number of schedulers {len(schedulers)} and the number of milestones to be equal to {len(milestones)}"
            )
        self._schedulers, self._milestones = list(schedulers), list(milestones)
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        # Undo the steps the schedulers took when they were made, and start the first one afresh.
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        for scheduler in self._schedulers:
            scheduler.last_epoch -= 1
        self._schedulers[0]._initial_step()
        self._last_lr = self._schedulers[0].get_last_lr()

    def step(self) -> None:  # type: ignore[override]
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler.step(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        for scheduler, saved in zip(self._schedulers, state.pop("_schedulers"), strict=True):
            scheduler.load_state_dict(saved)
        self.__dict__.update(state)


class ChainedScheduler(LRScheduler):
    """Step every scheduler in ``schedulers`` at each ``step()``: their factors multiply."""

    def __init__(self, schedulers: Sequence[LRScheduler], optimizer: Optimizer | None = None) -> None:
        if len(schedulers) < 1:
            raise ValueError(f"{type(self).__name__} expects at least one scheduler to be chained, but got no scheduler.")
        owner = optimizer or schedulers[0].optimizer
        for i, scheduler in enumerate(schedulers):
            if getattr(scheduler, "optimizer", None) is not owner:
                raise ValueError(
                    f"{type(self).__name__} expects all schedulers to belong to the same optimizer, but got scheduler "
                    f"{type(scheduler).__name__} at index {i} has {getattr(scheduler, 'optimizer', None)}, which is "
                    f"different from {type(owner).__name__}."
                )
        self._schedulers, self.optimizer = list(schedulers), owner
        self._last_lr = [group["lr"] for group in owner.param_groups]

    def step(self) -> None:  # type: ignore[override]
        for scheduler in self._schedulers:
            scheduler.step()
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    state_dict = SequentialLR.state_dict
    load_state_dict = SequentialLR.load_state_dict


class ReduceLROnPlateau(LRScheduler):
    """Multiply the rates by ``factor`` once ``metrics`` passed to ``step(metrics)`` stop improving for ``patience`` epochs."""

    def __init__(
        self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10, threshold: float = 1e-4,
        threshold_mode: str = "rel", cooldown: int = 0, min_lr: float | Sequence[float] = 0, eps: float = 1e-8,
    ) -> None:
        if factor >= 1.0:
            raise ValueError("Factor should be < 1.0.")
        check_optimizer(optimizer)
        self.factor, self.optimizer = factor, optimizer
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != len(optimizer.param_groups):
                raise ValueError(f"expected {len(optimizer.param_groups)} min_lrs, got {len(min_lr)}")
            self.default_min_lr, self.min_lrs = None, list(min_lr)
        else:
            self.default_min_lr, self.min_lrs = min_lr, [min_lr] * len(optimizer.param_groups)
        if mode not in {"min", "max"}:
            raise ValueError("mode " + mode + " is unknown!")
        if threshold_mode not in {"rel", "abs"}:
            raise ValueError("threshold mode " + threshold_mode + " is unknown!")
        self.patience, self.cooldown, self.cooldown_counter = patience, cooldown, 0
        self.mode, self.threshold, self.threshold_mode, self.eps = mode, threshold, threshold_mode, eps
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.last_epoch = 0
        self._last_lr = [group["lr"] for group in optimizer.param_groups]
        self._reset()

    def _reset(self) -> None:
        self.best, self.cooldown_counter, self.num_bad_epochs = self.mode_worse, 0, 0

    def step(self, metrics: Any, epoch: int | None = None) -> None:  # type: ignore[override]
        current = float(metrics)
        self.last_epoch = self.last_epoch + 1 if epoch is None else epoch
        if self.is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for i, group in enumerate(self.optimizer.param_groups):
                old_lr = float(group["lr"])
                new_lr = max(old_lr * self.factor, self.min_lrs[i])
                if old_lr - new_lr > self.eps:
                    group["lr"] = new_lr
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    @property
    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def is_better(self, a: float, best: float) -> bool:
        if self.mode == "min":
            return a < (best * (1.0 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold)
        return a > (best * (self.threshold + 1.0) if self.threshold_mode == "rel" else best + self.threshold)
