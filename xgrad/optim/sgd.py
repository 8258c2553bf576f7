"""``SGD``: PyTorch's stochastic gradient descent (NOTE [PyTorch optimizers] in ``optimizer``)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from xgrad.optim.optimizer import Optimizer, check_nonnegative, scalar_state
from xgrad.tensor import Tensor


class SGD(Optimizer):
    """``torch.optim.SGD``: stochastic gradient descent with momentum, dampening, weight decay, Nesterov.

    PyTorch's update: ``g += weight_decay * p``; with momentum, ``buf = g`` on the first
    step and ``buf = momentum * buf + (1 - dampening) * g`` after; ``g = g + momentum * buf``
    (Nesterov) or ``buf``; ``p -= lr * g``. ``state[p]`` holds ``momentum_buffer`` when
    the momentum is not zero, and the step count that tells the first step.

    >>> import xgrad
    >>> w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> opt = xgrad.optim.SGD([w], lr=0.5, momentum=0.9)
    >>> (w * w).sum().backward()
    >>> opt.step(); w.tolist()
    [0.0, 0.0]
    """

    _hyper = ("lr", "momentum", "dampening", "weight_decay")
    _signed_hyper = ("momentum",)
    _hidden_state = frozenset({"step"})

    def __init__(
        self, params: Any, lr: float | Tensor = 1e-3, momentum: float = 0, dampening: float = 0,
        weight_decay: float | Tensor = 0, nesterov: bool = False, *, maximize: bool = False,
        foreach: bool | None = None, differentiable: bool = False, fused: bool | None = None,
    ) -> None:
        check_nonnegative("learning rate", lr)
        check_nonnegative("momentum value", momentum)
        check_nonnegative("weight_decay value", weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = {
            "lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay, "nesterov": nesterov,
            "maximize": maximize, "foreach": foreach, "differentiable": differentiable, "fused": fused,
        }
        super().__init__(params, defaults)

    def _state_keys(self, group: dict[str, Any]) -> set[str]:
        return {"step", "momentum_buffer"} if group["momentum"] != 0 else set()

    def _init_state(self, param: Tensor, group: dict[str, Any]) -> dict[str, Any]:
        return {"step": scalar_state(), "momentum_buffer": jnp.zeros(param.shape, param.dtype)}

    def _loaded(self, state: dict[str, Tensor], saved: Any) -> None:
        if "step" in state and saved.get("momentum_buffer") is not None:
            state["step"]._array = state["step"]._array + 1  # a saved buffer: the first step is behind

    @staticmethod
    def _update(options: dict[str, Any], hyper: dict[str, Any], p: Any, g: Any, state: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        h = {k: v.astype(p.dtype) for k, v in hyper.items()}
        g = -g if options["maximize"] else g
        g = g + h["weight_decay"] * p
        new_state = {}
        if "momentum_buffer" in state:
            momentum = h["momentum"]
            buf = jnp.where(state["step"] == 0, g, momentum * state["momentum_buffer"] + (1 - h["dampening"]) * g)
            g = g + momentum * buf if options["nesterov"] else buf
            new_state = {"step": state["step"] + 1, "momentum_buffer": buf}
        return p - h["lr"] * g, new_state
