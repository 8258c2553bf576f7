"""The Adam family: ``Adam``, ``AdamW``, ``Adamax``, ``NAdam``, ``RAdam`` (NOTE [PyTorch optimizers] in ``optimizer``).

Each ``_update`` transcribes PyTorch's single-tensor algorithm. Step counts and bias
corrections are computed in the default float type, as PyTorch does them in Python
doubles, and cast to the parameter's dtype where they meet its arrays.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from xgrad.optim.optimizer import Optimizer, check_betas, check_nonnegative, scalar_state
from xgrad.tensor import Tensor


def _lerp(start: Any, end: Any, weight: Any) -> Any:
    """``torch.lerp``: ``start + weight * (end - start)``."""
    return start + weight * (end - start)


def _decay(options: dict[str, Any], h: dict[str, Any], p: Any, g: Any) -> tuple[Any, Any]:
    """Weight decay: decoupled (``p *= 1 - lr * wd``) or an L2 term added to the gradient."""
    if options.get("decoupled_weight_decay"):
        return (p * (1 - h["lr"] * h["weight_decay"]).astype(p.dtype)), g
    return p, g + h["weight_decay"].astype(p.dtype) * p


def _begin(options: dict[str, Any], h: dict[str, Any], p: Any, g: Any, state: dict[str, Any]) -> tuple[Any, ...]:
    """What every Adam-family update starts with: ``maximize``, the step count, the betas, weight decay.

    Returns ``(p, g, step, t, b1, b2)``: ``step`` the new count, ``t`` it in the rate's dtype.
    """
    g = -g if options["maximize"] else g
    step = state["step"] + 1
    b1, b2 = h["betas"][0], h["betas"][1]
    p, g = _decay(options, h, p, g)
    return p, g, step, step.astype(h["lr"].dtype), b1, b2


def _moments(state: dict[str, Any], g: Any, b1: Any, b2: Any, dtype: Any) -> tuple[Any, Any]:
    """The first and second moment estimates, updated as PyTorch's Adam does (``lerp``, then ``mul_.addcmul_``)."""
    exp_avg = _lerp(state["exp_avg"], g, (1 - b1).astype(dtype))
    exp_avg_sq = state["exp_avg_sq"] * b2.astype(dtype) + (1 - b2).astype(dtype) * g * g
    return exp_avg, exp_avg_sq


def _check(lr: Any, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    """PyTorch's argument checks of the Adam family, in its order and words."""
    check_nonnegative("learning rate", lr)
    check_nonnegative("epsilon value", eps)
    check_betas(betas)
    check_nonnegative("weight_decay value", weight_decay)


class _AdamFamily(Optimizer):
    _hyper: ClassVar[tuple[str, ...]] = ("lr", "betas", "eps", "weight_decay")

    def _state_keys(self, group: dict[str, Any]) -> set[str]:
        return {"step", "exp_avg", "exp_avg_sq"}

    def _init_state(self, param: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        zeros = jnp.zeros(param.shape, param.dtype)
        return {"step": scalar_state(), "exp_avg": zeros, "exp_avg_sq": zeros, "max_exp_avg_sq": zeros,
                "exp_inf": zeros, "mu_product": jnp.ones((), jnp.float32)}


class Adam(_AdamFamily):
    """``torch.optim.Adam``; ``weight_decay`` is an L2 term added to the gradient unless ``decoupled_weight_decay``.

    >>> import xgrad
    >>> w = xgrad.tensor([1.0, -1.0], requires_grad=True)
    >>> opt = xgrad.optim.Adam([w], lr=0.1)
    >>> (w * w).sum().backward()
    >>> opt.step(); [round(v, 4) for v in w.tolist()]
    [0.9, -0.9]
    """

    def __init__(
        self, params: Any, lr: float | Tensor = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
        weight_decay: float = 0, amsgrad: bool = False, *, foreach: bool | None = None, maximize: bool = False,
        capturable: bool = False, differentiable: bool = False, fused: bool | None = None, decoupled_weight_decay: bool = False,
    ) -> None:
        _check(lr, betas, eps, weight_decay)
        defaults = {
            "lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "amsgrad": amsgrad, "maximize": maximize,
            "foreach": foreach, "capturable": capturable, "differentiable": differentiable, "fused": fused,
            "decoupled_weight_decay": decoupled_weight_decay,
        }
        super().__init__(params, defaults)

    def _state_keys(self, group: dict[str, Any]) -> set[str]:
        return {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"} if group["amsgrad"] else {"step", "exp_avg", "exp_avg_sq"}

    @staticmethod
    def _update(options: dict[str, Any], h: dict[str, Any], p: Any, g: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        p, g, step, t, b1, b2 = _begin(options, h, p, g, state)
        exp_avg, exp_avg_sq = _moments(state, g, b1, b2, p.dtype)
        step_size = (h["lr"] / (1 - b1**t)).astype(p.dtype)
        bias_correction2_sqrt = jnp.sqrt(1 - b2**t).astype(p.dtype)
        new_state = {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
        second = exp_avg_sq
        if options["amsgrad"]:
            second = new_state["max_exp_avg_sq"] = jnp.maximum(state["max_exp_avg_sq"], exp_avg_sq)
        denom = jnp.sqrt(second) / bias_correction2_sqrt + h["eps"].astype(p.dtype)
        return p - step_size * exp_avg / denom, new_state


class AdamW(Adam):
    """``torch.optim.AdamW``: Adam with decoupled weight decay, ``p *= 1 - lr * weight_decay`` each step.

    >>> import xgrad
    >>> w = xgrad.tensor([1.0], requires_grad=True)
    >>> opt = xgrad.optim.AdamW([w], lr=0.1, weight_decay=0.5)
    >>> (w * 0).sum().backward()  # a zero gradient: only the decay moves w
    >>> opt.step(); round(w.item(), 4)
    0.95
    """

    def __init__(
        self, params: Any, lr: float | Tensor = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
        weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False, foreach: bool | None = None,
        capturable: bool = False, differentiable: bool = False, fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize, capturable=capturable,
            differentiable=differentiable, fused=fused, decoupled_weight_decay=True,
        )


class Adamax(_AdamFamily):
    """``torch.optim.Adamax``: Adam with the infinity norm, ``exp_inf = max(beta2 * exp_inf, |g| + eps)``."""

    def __init__(
        self, params: Any, lr: float | Tensor = 2e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
        weight_decay: float = 0, foreach: bool | None = None, *, maximize: bool = False, differentiable: bool = False,
        capturable: bool = False,
    ) -> None:
        _check(lr, betas, eps, weight_decay)
        defaults = {
            "lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "foreach": foreach, "maximize": maximize,
            "differentiable": differentiable, "capturable": capturable,
        }
        super().__init__(params, defaults)

    def _state_keys(self, group: dict[str, Any]) -> set[str]:
        return {"step", "exp_avg", "exp_inf"}

    @staticmethod
    def _update(options: dict[str, Any], h: dict[str, Any], p: Any, g: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        g = -g if options["maximize"] else g
        step = state["step"] + 1
        b1, b2 = h["betas"][0], h["betas"][1]
        g = g + h["weight_decay"].astype(p.dtype) * p
        exp_avg = _lerp(state["exp_avg"], g, (1 - b1).astype(p.dtype))
        exp_inf = jnp.maximum(state["exp_inf"] * b2.astype(p.dtype), jnp.abs(g) + h["eps"].astype(p.dtype))
        clr = (h["lr"] / (1 - b1 ** step.astype(b1.dtype))).astype(p.dtype)
        return p - clr * exp_avg / exp_inf, {"step": step, "exp_avg": exp_avg, "exp_inf": exp_inf}


class NAdam(_AdamFamily):
    """``torch.optim.NAdam``: Adam with Nesterov momentum and PyTorch's ``momentum_decay`` schedule of ``mu``."""

    _hyper = ("lr", "betas", "eps", "weight_decay", "momentum_decay")

    def __init__(
        self, params: Any, lr: float | Tensor = 2e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
        weight_decay: float = 0, momentum_decay: float = 4e-3, decoupled_weight_decay: bool = False, *,
        foreach: bool | None = None, maximize: bool = False, capturable: bool = False, differentiable: bool = False,
    ) -> None:
        _check(lr, betas, eps, weight_decay)
        check_nonnegative("momentum_decay value", momentum_decay)
        defaults = {
            "lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "momentum_decay": momentum_decay,
            "decoupled_weight_decay": decoupled_weight_decay, "maximize": maximize, "foreach": foreach,
            "capturable": capturable, "differentiable": differentiable,
        }
        super().__init__(params, defaults)

    def _state_keys(self, group: dict[str, Any]) -> set[str]:
        return {"step", "mu_product", "exp_avg", "exp_avg_sq"}

    @staticmethod
    def _update(options: dict[str, Any], h: dict[str, Any], p: Any, g: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        p, g, step, t, b1, b2 = _begin(options, h, p, g, state)
        bias_correction2 = (1 - b2**t).astype(p.dtype)
        mu = b1 * (1 - 0.5 * 0.96 ** (t * h["momentum_decay"]))
        mu_next = b1 * (1 - 0.5 * 0.96 ** ((t + 1) * h["momentum_decay"]))
        mu_product = state["mu_product"] * mu.astype(state["mu_product"].dtype)  # float32, as PyTorch keeps it
        exp_avg, exp_avg_sq = _moments(state, g, b1, b2, p.dtype)
        denom = jnp.sqrt(exp_avg_sq / bias_correction2) + h["eps"].astype(p.dtype)
        product = mu_product.astype(mu.dtype)
        p = p - (h["lr"] * (1 - mu) / (1 - product)).astype(p.dtype) * g / denom
        p = p - (h["lr"] * mu_next / (1 - product * mu_next)).astype(p.dtype) * exp_avg / denom
        return p, {"step": step, "mu_product": mu_product, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}


class RAdam(_AdamFamily):
    """``torch.optim.RAdam``: Adam with the variance rectification term (plain momentum while ``rho_t <= 5``)."""

    def __init__(
        self, params: Any, lr: float | Tensor = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
        weight_decay: float = 0, decoupled_weight_decay: bool = False, *, foreach: bool | None = None,
        maximize: bool = False, capturable: bool = False, differentiable: bool = False,
    ) -> None:
        _check(lr, betas, eps, weight_decay)
        defaults = {
            "lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "maximize": maximize, "foreach": foreach,
            "capturable": capturable, "decoupled_weight_decay": decoupled_weight_decay, "differentiable": differentiable,
        }
        super().__init__(params, defaults)

    @staticmethod
    def _update(options: dict[str, Any], h: dict[str, Any], p: Any, g: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        p, g, step, t, b1, b2 = _begin(options, h, p, g, state)
        exp_avg, exp_avg_sq = _moments(state, g, b1, b2, p.dtype)
        bias_correction1, bias_correction2 = 1 - b1**t, 1 - b2**t
        corrected = exp_avg / bias_correction1.astype(p.dtype)
        rho_inf = 2 / (1 - b2) - 1
        rho_t = rho_inf - 2 * t * b2**t / bias_correction2
        rect = jnp.sqrt(jnp.maximum((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t), 0))
        adaptive = jnp.sqrt(bias_correction2).astype(p.dtype) / (jnp.sqrt(exp_avg_sq) + h["eps"].astype(p.dtype))
        lr = h["lr"].astype(p.dtype)
        p = jnp.where(rho_t > 5, p - corrected * lr * adaptive * rect.astype(p.dtype), p - corrected * lr)
        return p, {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
