"""Per-coordinate step sizes: ``Adagrad``, ``Adadelta``, ``RMSprop`` (NOTE [PyTorch optimizers] in ``optimizer``).

Each ``_update`` transcribes PyTorch's single-tensor algorithm.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from xgrad.optim.optimizer import Optimizer, check_nonnegative, scalar_state
from xgrad.tensor import Tensor


def _cast(h: dict[str, Any], dtype: Any) -> dict[str, Any]:
    return {k: v.astype(dtype) for k, v in h.items()}


class Adagrad(Optimizer):
    """``torch.optim.Adagrad``: ``sum += g**2``, ``p -= lr / (1 + (step - 1) * lr_decay) * g / (sqrt(sum) + eps)``.

    >>> import xgrad
    >>> w = xgrad.tensor([1.0, -1.0], requires_grad=True)
    >>> opt = xgrad.optim.Adagrad([w], lr=0.5)
    >>> (w * w).sum().backward()
    >>> opt.step(); [round(v, 4) for v in w.tolist()]
    [0.5, -0.5]
    """

    _hyper = ("lr", "lr_decay", "eps", "weight_decay", "initial_accumulator_value")

    def __init__(
        self, params: Any, lr: float | Tensor = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
        initial_accumulator_value: float = 0, eps: float = 1e-10, foreach: bool | None = None, *,
        maximize: bool = False, differentiable: bool = False, fused: bool | None = None,
    ) -> None:
        check_nonnegative("learning rate", lr)
        check_nonnegative("lr_decay value", lr_decay)
        check_nonnegative("weight_decay value", weight_decay)
        check_nonnegative("initial_accumulator_value value", initial_accumulator_value)
        check_nonnegative("epsilon value", eps)
        defaults = {
            "lr": lr, "lr_decay": lr_decay, "eps": eps, "weight_decay": weight_decay,
            "initial_accumulator_value": initial_accumulator_value, "foreach": foreach, "maximize": maximize,
            "differentiable": differentiable, "fused": fused,
        }
        super().__init__(params, defaults)

    def _state_keys(self, group: dict[str, Any]) -> set[str]:
        return {"step", "sum"}

    def _init_state(self, param: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        return {"step": scalar_state(), "sum": jnp.full(param.shape, group["initial_accumulator_value"], param.dtype)}

    @staticmethod
    def _update(options: dict[str, Any], hyper: dict[str, Any], p: Any, g: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        g = -g if options["maximize"] else g
        step = state["step"] + 1
        g = g + hyper["weight_decay"].astype(p.dtype) * p
        clr = (hyper["lr"] / (1 + (step.astype(hyper["lr"].dtype) - 1) * hyper["lr_decay"])).astype(p.dtype)
        total = state["sum"] + g * g
        return p - clr * g / (jnp.sqrt(total) + hyper["eps"].astype(p.dtype)), {"step": step, "sum": total}


class Adadelta(Optimizer):
    """``torch.optim.Adadelta``: running averages of squared gradients and squared updates, scaled by ``lr``."""

    _hyper = ("lr", "rho", "eps", "weight_decay")

    def __init__(
        self, params: Any, lr: float | Tensor = 1.0, rho: float = 0.9, eps: float = 1e-6, weight_decay: float = 0,
        foreach: bool | None = None, *, capturable: bool = False, maximize: bool = False, differentiable: bool = False,
    ) -> None:
        check_nonnegative("learning rate", lr)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        check_nonnegative("epsilon value", eps)
        check_nonnegative("weight_decay value", weight_decay)
        defaults = {
            "lr": lr, "rho": rho, "eps": eps, "weight_decay": weight_decay, "maximize": maximize,
            "capturable": capturable, "foreach": foreach, "differentiable": differentiable,
        }
        super().__init__(params, defaults)

    def _state_keys(self, group: dict[str, Any]) -> set[str]:
        return {"step", "square_avg", "acc_delta"}

    def _init_state(self, param: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        zeros = jnp.zeros(param.shape, param.dtype)
        return {"step": scalar_state(), "square_avg": zeros, "acc_delta": zeros}

    @staticmethod
    def _update(options: dict[str, Any], hyper: dict[str, Any], p: Any, g: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        h = _cast(hyper, p.dtype)
        g = -g if options["maximize"] else g
        g = g + h["weight_decay"] * p
        rho, eps = h["rho"], h["eps"]
        square_avg = state["square_avg"] * rho + (1 - rho) * g * g
        delta = jnp.sqrt(state["acc_delta"] + eps) / jnp.sqrt(square_avg + eps) * g
        acc_delta = state["acc_delta"] * rho + (1 - rho) * delta * delta
        return p - h["lr"] * delta, {"step": state["step"] + 1, "square_avg": square_avg, "acc_delta": acc_delta}


class RMSprop(Optimizer):
    """``torch.optim.RMSprop``: ``g / (sqrt(square_avg) + eps)``, optionally centered and with momentum."""

    _hyper = ("lr", "momentum", "alpha", "eps", "weight_decay")
    _signed_hyper = ("momentum",)

    def __init__(
        self, params: Any, lr: float | Tensor = 1e-2, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0,
        momentum: float = 0, centered: bool = False, capturable: bool = False, foreach: bool | None = None,
        maximize: bool = False, differentiable: bool = False,
    ) -> None:
        check_nonnegative("learning rate", lr)
        check_nonnegative("epsilon value", eps)
        check_nonnegative("momentum value", momentum)
        check_nonnegative("weight_decay value", weight_decay)
        check_nonnegative("alpha value", alpha)
        defaults = {
            "lr": lr, "momentum": momentum, "alpha": alpha, "eps": eps, "centered": centered,
            "weight_decay": weight_decay, "capturable": capturable, "foreach": foreach, "maximize": maximize,
            "differentiable": differentiable,
        }
        super().__init__(params, defaults)

    def _state_keys(self, group: dict[str, Any]) -> set[str]:
        keys = {"step", "square_avg"}
        if group["momentum"] > 0:
            keys.add("momentum_buffer")
        if group["centered"]:
            keys.add("grad_avg")
        return keys

    def _init_state(self, param: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        zeros = jnp.zeros(param.shape, param.dtype)
        return {"step": scalar_state(), "square_avg": zeros, "momentum_buffer": zeros, "grad_avg": zeros}

    @staticmethod
    def _update(options: dict[str, Any], hyper: dict[str, Any], p: Any, g: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        h = _cast(hyper, p.dtype)
        g = -g if options["maximize"] else g
        g = g + h["weight_decay"] * p
        alpha = h["alpha"]
        new = {"step": state["step"] + 1, "square_avg": state["square_avg"] * alpha + (1 - alpha) * g * g}
        if "grad_avg" in state:
            new["grad_avg"] = state["grad_avg"] + (1 - alpha) * (g - state["grad_avg"])
            avg = jnp.sqrt(new["square_avg"] - new["grad_avg"] * new["grad_avg"])
        else:
            avg = jnp.sqrt(new["square_avg"])
        avg = avg + h["eps"]
        if "momentum_buffer" in state:
            new["momentum_buffer"] = state["momentum_buffer"] * h["momentum"] + g / avg
            return p - h["lr"] * new["momentum_buffer"], new
        return p - h["lr"] * g / avg, new
