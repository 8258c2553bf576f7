"""``torch.amp.GradScaler``: loss scaling for float16 training, with PyTorch's sequence of scales."""

from __future__ import annotations

import enum
import warnings
from collections.abc import Iterable
from typing import Any

import jax.numpy as jnp

from xgrad import cuda
from xgrad.grad_mode import no_grad
from xgrad.optim.optimizer import Optimizer
from xgrad.tensor import Tensor

__all__ = ["GradScaler"]


class _Stage(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _fresh_state() -> dict[str, Any]:
    return {"stage": _Stage.READY, "found_inf": None}


class GradScaler:
    """``GradScaler(device="cuda", init_scale=2.**16, growth_factor=2.0, backoff_factor=0.5,
    growth_interval=2000, enabled=True)``, as PyTorch's.

    ``scale(loss)`` multiplies by the scale (a float32 scalar); ``unscale_(optimizer)`` divides
    the optimizer's gradients by it, in place, and records whether any is inf or NaN;
    ``step(optimizer)`` unscales if not done yet and steps unless one was; ``update()`` multiplies
    the scale by ``backoff_factor`` after a skipped step, and by ``growth_factor`` after
    ``growth_interval`` steps in a row without one. A disabled scaler is a pass-through:
    ``scale`` returns its argument and ``step`` is ``optimizer.step()``. A ``"cuda"`` scaler
    where JAX sees no GPU warns and disables itself, as PyTorch without CUDA.

    ``step`` reads the inf check on the host (as PyTorch's ``.item()``): inside ``xgrad.compile``
    such a step runs eagerly.

    >>> import xgrad
    >>> w = xgrad.nn.Parameter(xgrad.ones(2))
    >>> opt = xgrad.optim.SGD([w], lr=0.25)
    >>> scaler = xgrad.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    >>> scaler.scale((w * 2).sum()).backward()
    >>> w.grad.tolist()
    [8.0, 8.0]
    >>> scaler.step(opt); scaler.update()
    >>> w.tolist(), scaler.get_scale()
    ([0.5, 0.5], 8.0)
    """

    def __init__(
        self, device: str = "cuda", init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
        growth_interval: int = 2000, enabled: bool = True,
    ) -> None:
        self._device = device
        self._enabled = enabled
        if enabled and device == "cuda" and not cuda.is_available():
            warnings.warn("torch.cuda.amp.GradScaler is enabled, but CUDA is not available (JAX sees no GPU).  Disabling.",
                          UserWarning, stacklevel=2)
            self._enabled = False
        if self._enabled:
            if growth_factor <= 1.0:
                raise ValueError("The growth factor must be > 1.0.")
            if backoff_factor >= 1.0:
                raise ValueError("The backoff factor must be < 1.0.")
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._init_growth_tracker = 0
        self._scale: Tensor | None = None
        self._growth_tracker: Tensor | None = None
        self._per_optimizer_states: dict[int, dict[str, Any]] = {}

    def is_enabled(self) -> bool:
        return self._enabled

    def scale(self, outputs: Any) -> Any:
        """``outputs`` (a Tensor, or an iterable of them, nested) times the scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs * self._scale_tensor()
        if isinstance(outputs, Iterable):
            scaled = [self.scale(o) for o in outputs]
            return type(outputs)(scaled) if isinstance(outputs, (list, tuple)) else iter(scaled)
        raise ValueError("outputs must be a Tensor or an iterable of Tensors")

    def _scale_tensor(self) -> Tensor:
        if self._scale is None:
            self._scale = Tensor(jnp.full((), self._init_scale, jnp.float32))
            self._growth_tracker = Tensor(jnp.full((), self._init_growth_tracker, jnp.int32))
        return self._scale

    def _checked_scale(self, funcname: str) -> Tensor:
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  This may indicate your script did not use "
                                 "scaler.scale(loss or outputs) earlier in the iteration.")
        return self._scale

    def _state(self, optimizer: Optimizer) -> dict[str, Any]:
        return self._per_optimizer_states.setdefault(id(optimizer), _fresh_state())

    def unscale_(self, optimizer: Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale, in place (once per ``update``)."""
        if not self._enabled:
            return
        scale = self._checked_scale("unscale_")
        state = self._state(optimizer)
        if state["stage"] is _Stage.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        # The reciprocal in float64, then float32, as PyTorch's (a float32 division can round differently).
        inv_scale = Tensor(jnp.asarray(1.0 / float(scale.item()), jnp.float32))
        found_inf = jnp.zeros((), jnp.bool_)
        with no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    grad = param.grad
                    if grad is None:
                        continue
                    if grad.dtype == jnp.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    found_inf = found_inf | ~jnp.isfinite(grad.array).all()
                    grad.mul_(inv_scale)
        state["found_inf"] = found_inf
        state["stage"] = _Stage.UNSCALED

    def step(self, optimizer: Optimizer, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step()`` unless the unscaled gradients hold an inf or NaN (then ``None``)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._checked_scale("step")
        state = self._state(optimizer)
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is _Stage.READY:
            self.unscale_(optimizer)
        result = None if bool(state["found_inf"]) else optimizer.step(*args, **kwargs)
        state["stage"] = _Stage.STEPPED
        return result

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Set the scale for the next iteration: ``new_scale``, or grown or backed off (class docstring)."""
        if not self._enabled:
            return
        scale = self._checked_scale("update")
        if new_scale is not None:
            if isinstance(new_scale, Tensor) and (new_scale.numel() != 1 or new_scale.requires_grad):
                raise AssertionError("new_scale should be a float or a 1-element FloatTensor with requires_grad=False.")
            self._scale = Tensor(jnp.asarray(new_scale.item() if isinstance(new_scale, Tensor) else new_scale,
                                             jnp.float32).reshape(()))
        else:
            found = [s["found_inf"] for s in self._per_optimizer_states.values() if s["found_inf"] is not None]
            if not found:
                raise AssertionError("No inf checks were recorded prior to update.")
            self._update_scale(scale, any(bool(f) for f in found))
        self._per_optimizer_states = {}

    def _update_scale(self, scale: Tensor, found_inf: bool) -> None:
        assert self._growth_tracker is not None
        current = scale.array
        if found_inf:
            new_scale, tracker = current * jnp.float32(self._backoff_factor), 0
        else:
            tracker = int(self._growth_tracker.item()) + 1
            new_scale = current
            if tracker == self._growth_interval:
                grown = current * jnp.float32(self._growth_factor)
                new_scale, tracker = (grown if jnp.isfinite(grown) else current), 0
        self._scale = Tensor(new_scale)
        self._growth_tracker = Tensor(jnp.asarray(tracker, jnp.int32))

    def get_scale(self) -> float:
        """The scale as a Python float (1.0 when disabled)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale.item())

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = new_interval

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._growth_tracker is None else int(self._growth_tracker.item())

    def state_dict(self) -> dict[str, Any]:
        """``{"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}`` (empty when disabled)."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._enabled:
            return
        if not state_dict:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a disabled instance "
                               "of GradScaler.")
        self._init_scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._scale is not None:
            self._scale = Tensor(jnp.asarray(self._init_scale, jnp.float32))
            self._growth_tracker = Tensor(jnp.asarray(self._init_growth_tracker, jnp.int32))
