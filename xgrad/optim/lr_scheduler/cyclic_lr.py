"""The cyclical learning-rate policies of ``xgrad.optim.lr_scheduler``: ``CyclicLR`` and ``OneCycleLR``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from xgrad.optim.lr_scheduler.schedulers import LRScheduler, check_optimizer, per_group
from xgrad.optim.optimizer import Optimizer


def _set_momentum(group: dict[str, Any], value: float, use_beta1: bool) -> None:
    if use_beta1:
        group["betas"] = (value, *group["betas"][1:])
    else:
        group["momentum"] = value


def _momentum_key(optimizer: Optimizer) -> bool:
    """Whether ``cycle_momentum`` cycles ``betas[0]`` (else ``momentum``); PyTorch's error when there is neither."""
    if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
        raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` option enabled")
    return "betas" in optimizer.defaults


class CyclicLR(LRScheduler):
    """The rate cycles between ``base_lr`` and ``max_lr`` (``triangular``, ``triangular2``, ``exp_range`` or ``scale_fn``), momentum inversely."""

    def __init__(
        self, optimizer: Optimizer, base_lr: float | Sequence[float], max_lr: float | Sequence[float],
        step_size_up: int = 2000, step_size_down: int | None = None, mode: str = "triangular", gamma: float = 1.0,
        scale_fn: Callable[[float], float] | None = None, scale_mode: str = "cycle", cycle_momentum: bool = True,
        base_momentum: float | Sequence[float] = 0.8, max_momentum: float | Sequence[float] = 0.9, last_epoch: int = -1,
    ) -> None:
        check_optimizer(optimizer)
        base_lrs = per_group("base_lr", optimizer, base_lr)
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups, strict=True):
                group["lr"] = lr
        self.max_lrs = per_group("max_lr", optimizer, max_lr)
        up = float(step_size_up)
        down = float(step_size_down) if step_size_down is not None else up
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise ValueError("mode is invalid and scale_fn is None")
        self.mode, self.gamma = mode, gamma
        self._scale_fn_custom = scale_fn
        self.scale_mode = scale_mode if scale_fn is not None else ("iterations" if mode == "exp_range" else "cycle")
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self.use_beta1 = _momentum_key(optimizer)
            self.base_momentums = per_group("base_momentum", optimizer, base_momentum)
            self.max_momentums = per_group("max_momentum", optimizer, max_momentum)
            if last_epoch == -1:
                for top, group in zip(self.max_momentums, optimizer.param_groups, strict=True):
                    _set_momentum(group, top, self.use_beta1)
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def scale_fn(self, x: float) -> float:
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self.gamma**x

    def get_lr(self) -> list[float]:
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        scale_factor = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        scale = self.scale_fn(cycle if self.scale_mode == "cycle" else self.last_epoch)
        lrs = [base + (top - base) * scale_factor * scale for base, top in zip(self.base_lrs, self.max_lrs, strict=True)]
        if self.cycle_momentum:
            for base, top, group in zip(self.base_momentums, self.max_momentums, self.optimizer.param_groups, strict=True):
                _set_momentum(group, top - (top - base) * scale_factor * scale, self.use_beta1)
        return lrs

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in super().state_dict().items() if k != "_scale_fn_custom"}


class OneCycleLR(LRScheduler):
    """The 1cycle policy: the rate climbs from ``max_lr / div_factor`` to ``max_lr`` and anneals far below, momentum inversely."""

    def __init__(
        self, optimizer: Optimizer, max_lr: float | Sequence[float], total_steps: int | None = None, epochs: int | None = None,
        steps_per_epoch: int | None = None, pct_start: float = 0.3, anneal_strategy: str = "cos", cycle_momentum: bool = True,
        base_momentum: float | Sequence[float] = 0.85, max_momentum: float | Sequence[float] = 0.95, div_factor: float = 25.0,
        final_div_factor: float = 1e4, three_phase: bool = False, last_epoch: int = -1,
    ) -> None:
        check_optimizer(optimizer)
        if total_steps is not None:
            if total_steps <= 0 or not isinstance(total_steps, int):
                raise ValueError(f"Expected positive integer total_steps, but got {total_steps}")
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            if epochs <= 0 or not isinstance(epochs, int):
                raise ValueError(f"Expected positive integer epochs, but got {epochs}")
            if steps_per_epoch <= 0 or not isinstance(steps_per_epoch, int):
                raise ValueError(f"Expected positive integer steps_per_epoch, but got {steps_per_epoch}")
            self.total_steps = epochs * steps_per_epoch
        else:
            raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")
        if pct_start < 0 or pct_start > 1 or not isinstance(pct_start, float):
            raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy}")
        end = float(pct_start * self.total_steps) - 1
        self._schedule_phases: list[dict[str, Any]]
        if three_phase:
            self._schedule_phases = [
                {"end_step": end, "start_lr": "initial_lr", "end_lr": "max_lr", "start_momentum": "max_momentum", "end_momentum": "base_momentum"},
                {"end_step": float(2 * pct_start * self.total_steps) - 2, "start_lr": "max_lr", "end_lr": "initial_lr",
                 "start_momentum": "base_momentum", "end_momentum": "max_momentum"},
                {"end_step": self.total_steps - 1, "start_lr": "initial_lr", "end_lr": "min_lr", "start_momentum": "max_momentum",
                 "end_momentum": "max_momentum"},
            ]
        else:
            self._schedule_phases = [
                {"end_step": end, "start_lr": "initial_lr", "end_lr": "max_lr", "start_momentum": "max_momentum", "end_momentum": "base_momentum"},
                {"end_step": self.total_steps - 1, "start_lr": "max_lr", "end_lr": "min_lr", "start_momentum": "base_momentum",
                 "end_momentum": "max_momentum"},
            ]
        self._anneal_func_type = anneal_strategy
        if last_epoch == -1:
            for group, lr in zip(optimizer.param_groups, per_group("max_lr", optimizer, max_lr), strict=True):
                group["initial_lr"] = lr / div_factor
                group["max_lr"] = lr
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self.use_beta1 = _momentum_key(optimizer)
            max_momenta = per_group("max_momentum", optimizer, max_momentum)
            base_momenta = per_group("base_momentum", optimizer, base_momentum)
            if last_epoch == -1:
                for top, bottom, group in zip(max_momenta, base_momenta, optimizer.param_groups, strict=True):
                    _set_momentum(group, top, self.use_beta1)
                    group["max_momentum"], group["base_momentum"] = top, bottom
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list[float]:
        step_num = self.last_epoch
        if step_num > self.total_steps:
            raise ValueError(f"Tried to step {step_num} times. The specified number of total steps is {self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start_step = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end_step = phase["end_step"]
                if step_num <= end_step or i == len(self._schedule_phases) - 1:
                    pct = (step_num - start_step) / (end_step - start_step)
                    lr = self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    momentum = self._anneal(group[phase["start_momentum"]], group[phase["end_momentum"]], pct) if self.cycle_momentum else None
                    break
                start_step = phase["end_step"]
            lrs.append(lr)
            if momentum is not None:
                _set_momentum(group, momentum, self.use_beta1)
        return lrs
