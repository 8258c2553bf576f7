"""Optimizers: any ``optax`` gradient transformation, applied to parameters' ``.grad``.

There is no hand-written optimizer here: ``Optax`` reads the ``.grad`` arrays, runs
the transformation's ``update`` and ``optax.apply_updates`` over all parameters as
one ``jax.jit`` program (a pytree in, a pytree out), and rebinds each stepped
parameter's storage directly, bumping ``_version`` as any in-place op does.

# NOTE [Optimizer state in Tensors]
# The optax state's arrays are held by Tensors (``Optax.state`` rebuilds the optax
# pytree from them). That makes the state what every other piece of training state
# is, a Tensor whose storage is rebound: ``xgrad.compile`` finds the Tensors a step
# reads and rebinds, so an optimizer stepped inside a compiled function needs no
# special case.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from xgrad.nn import clear_grads
from xgrad.tensor import Tensor

__all__ = ["Optax"]


def _mirrors_params(node: Any, shapes: tuple[tuple[int, ...], ...]) -> bool:
    """Whether ``node`` is a per-parameter entry of the state (``mu``, ``nu``, a momentum)."""
    return (
        isinstance(node, (list, tuple))
        and len(node) == len(shapes)
        and all(getattr(leaf, "shape", None) == shape for leaf, shape in zip(node, shapes, strict=True))
    )


def _keep_frozen(new: Any, old: Any, stepped: tuple[bool, ...], shapes: tuple[tuple[int, ...], ...]) -> Any:
    """``new`` state, except that the per-parameter entries of parameters not stepped keep ``old``."""

    def select(n: Any, o: Any) -> Any:
        if _mirrors_params(n, shapes):
            return type(n)(ni if s else oi for ni, oi, s in zip(n, o, stepped, strict=True))
        return n

    return jax.tree.map(select, new, old, is_leaf=lambda node: _mirrors_params(node, shapes))


def _step(
    transform: optax.GradientTransformation, stepped: tuple[bool, ...], params: list[Any], grads: list[Any], state: Any
) -> tuple[list[Any], Any]:
    """One update of every parameter; those not ``stepped`` (no grad) keep their value and state."""
    full_grads = [g if s else jnp.zeros_like(p) for p, g, s in zip(params, grads, stepped, strict=True)]
    updates, new_state = transform.update(full_grads, state, params)
    new_params = optax.apply_updates(params, updates)
    if all(stepped):
        return new_params, new_state
    shapes = tuple(p.shape for p in params)
    return [n if s else None for n, s in zip(new_params, stepped, strict=True)], _keep_frozen(new_state, state, stepped, shapes)


def _committed(array: Any) -> Any:
    return array if getattr(array, "_committed", True) else jax.device_put(array, array.sharding)


class Optax:
    """Update parameters in place with an ``optax`` transformation of their ``.grad``.

    Args:
        params: the parameters: an iterable of leaf Tensors (``model.parameters()``)
            or a mapping name → Tensor (``dict(model.named_parameters())``).
        transform: an ``optax.GradientTransformation`` (``optax.sgd(0.1)``,
            ``optax.adam(1e-3)``, a chain, …).

    A parameter whose ``.grad`` is ``None``, or that does not require grad, is left
    alone, as PyTorch's optimizers do: its value does not move (not even by weight
    decay) and its entries in the optimizer state (moments, momentum) stay as they
    were. ``state`` is the optax state (read and assignable).

    >>> import optax, xgrad
    >>> w = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> frozen = xgrad.tensor([5.0], requires_grad=True)
    >>> opt = xgrad.optim.Optax([w, frozen], optax.adamw(0.5, weight_decay=0.1))
    >>> (w * w).sum().backward()
    >>> opt.step(); [round(v, 4) for v in w.tolist()], frozen.tolist()
    ([0.45, 1.4], [5.0])
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
        for p in tensors:
            # The step's outputs are committed to their devices; an uncommitted parameter
            # (made by jax.random on the default device) would make every primitive of
            # the second step compile again, for committed inputs.
            p._array = _committed(p._array)
        self.params = tensors
        self.transform = transform
        self.state = transform.init([p.array for p in tensors])
        self._jitted_step = jax.jit(functools.partial(_step, transform), static_argnums=0)

    @property
    def state(self) -> Any:
        """The optax state of the transformation (NOTE [Optimizer state in Tensors])."""
        return jax.tree.unflatten(self._state_def, [t._array for t in self._state_tensors])

    @state.setter
    def state(self, value: Any) -> None:
        leaves, self._state_def = jax.tree.flatten(value)
        self._state_tensors = [Tensor(_committed(jnp.asarray(leaf))) for leaf in leaves]

    def step(self) -> None:
        """Apply one update from the current ``.grad``s to the parameters that have one."""
        params = self.params
        stepped = tuple(p._grad is not None and p.requires_grad for p in params)
        if not any(stepped):
            return
        arrays = [p._array for p in params]
        grads = [p._grad._array if s else None for p, s in zip(params, stepped, strict=True)]  # type: ignore[union-attr]
        new_arrays, new_state = self._jitted_step(stepped, arrays, grads, self.state)
        # A direct rebind of each stepped parameter: no op recorded, as under no_grad.
        for p, new in zip(params, new_arrays, strict=True):
            if new is not None:
                p._array = new
                p._version += 1
        for t, leaf in zip(self._state_tensors, jax.tree.leaves(new_state), strict=True):
            t._array = leaf

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the parameters' ``.grad`` (to ``None``, or to zeros)."""
        clear_grads(self.params, set_to_none)
