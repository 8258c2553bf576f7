"""Optimizers: any ``optax`` gradient transformation, applied to parameters' ``.grad``.

There is no hand-written optimizer here: ``Optax`` reads the ``.grad`` arrays, runs
the transformation's ``update`` and ``optax.apply_updates`` in one ``jax.jit``
program, and rebinds each parameter's storage in place (under ``no_grad``, bumping
``_version`` as any in-place op does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from xgrad.grad_mode import no_grad
from xgrad.nn import clear_grads
from xgrad.tensor import Tensor

__all__ = ["Optax"]


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
