"""``Optax``: any optax gradient transformation as an optimizer of parameters' ``.grad`` (NOTE [Optimizer state in Tensors] in ``__init__``)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from xgrad import step_trace
from xgrad.fast_compile import FastJit
from xgrad.grads import clear_grads
from xgrad.jax_internals import single_device_sharding
from xgrad.optim.written import WrittenArrays
from xgrad.tensor import Tensor


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
    transform: optax.GradientTransformation, state_def: Any, stepped: tuple[bool, ...], params: list[Any], grads: list[Any],
    state_leaves: list[Any],
) -> tuple[list[Any], list[Any]]:
    """One update of every parameter; those not ``stepped`` (no grad) keep their value and state.

    The state comes and goes as its leaves: rebuilding optax's tree and flattening it again
    on the host are a tenth of a small model's step, in the program they cost nothing."""
    state = jax.tree.unflatten(state_def, state_leaves)
    new_params, new_state = _update(transform, stepped, params, grads, state)
    return new_params, jax.tree.leaves(new_state)


def _update(
    transform: optax.GradientTransformation, stepped: tuple[bool, ...], params: list[Any], grads: list[Any], state: Any
) -> tuple[list[Any], Any]:
    full_grads = [g if s else jnp.zeros_like(p) for p, g, s in zip(params, grads, stepped, strict=True)]
    updates, new_state = transform.update(full_grads, state, params)
    new_params = optax.apply_updates(params, updates)
    if all(stepped):
        return new_params, new_state
    shapes = tuple(p.shape for p in params)
    return [n if s else None for n, s in zip(new_params, stepped, strict=True)], _keep_frozen(new_state, state, stepped, shapes)


def scalar_sharding(sharding: Any) -> Any:
    """Where state that is not per-parameter-shaped (a count, a scalar) lives: replicated over ``sharding``'s devices."""
    if isinstance(sharding, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    if len(sharding.device_set) == 1:
        return single_device_sharding(next(iter(sharding.device_set)))
    return None


def _committed(array: Any, device: Any) -> Any:
    """``array`` committed to ``device`` (the step's outputs are), unless it is already committed; a buffer of
    its own, as a committed twin would let a compiled step donating it consume the array others still hold."""
    if device is None or getattr(array, "committed", True):
        return array
    return jax.device_put(array, device, may_alias=False)


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

    _state_def: Any
    _state_tensors: list[Tensor]

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
        # The step's outputs are committed to their devices; an uncommitted parameter or
        # state array (jax.random, optax's init on the default device) would make every
        # primitive of the second step compile again, for committed inputs. Only when
        # everything sits on one device: sharded parameters keep what they have.
        devices = {d for p in tensors for d in p._array.sharding.device_set}
        self._home = next(iter(devices)) if len(devices) == 1 else None
        for p in tensors:
            p._array = _committed(p._array, self._home)
        self.params = tensors
        self._placement = [p._array.sharding for p in tensors]
        self._written = WrittenArrays()  # the parameters' arrays as the last step left them
        self.transform = transform
        self.state = transform.init([p.array for p in tensors])
        self._jitted_step = FastJit(functools.partial(_step, transform), static_argnums=(0, 1))  # NOTE [Fast compiles]

    @property
    def state(self) -> Any:
        """The optax state of the transformation (NOTE [Optimizer state in Tensors])."""
        trace = step_trace.current()
        if trace is not None:  # a step being traced finds the state here (NOTE [The step-trace seam])
            for t in self._state_tensors:
                trace.read(t)
        return jax.tree.unflatten(self._state_def, [t._array for t in self._state_tensors])

    @state.setter
    def state(self, value: Any) -> None:
        leaves, treedef = jax.tree.flatten(value)
        old_def = getattr(self, "_state_def", None)
        if old_def is not None and old_def == treedef:  # same structure: the same Tensors, rebound
            _writing(self._state_tensors)
            for t, leaf in zip(self._state_tensors, leaves, strict=True):
                t._array = _committed(jnp.asarray(leaf), self._home)
            return
        self._state_def = treedef
        self._state_tensors = [Tensor(_committed(jnp.asarray(leaf), self._home)) for leaf in leaves]

    def step(self) -> None:
        """Apply one update from the current ``.grad``s to the parameters that have one."""
        params = self.params
        trace = step_trace.current()
        if trace is not None:  # a step being traced finds the parameters and grads here (NOTE [The step-trace seam])
            for p in params:
                trace.grad_read(p)
                trace.read(p)
                if p._grad is not None:
                    trace.read(p._grad)
        stepped = tuple(p._grad is not None and (p._requires_grad or p.grad_fn is not None) for p in params)
        if not any(stepped):
            return
        if trace is None and not self._written.unchanged(0, [p._array for p in params]):  # NOTE [Unmoved parameters]
            self._follow_params()
        arrays = [p._array for p in params]
        grads = [p._grad._array if s else None for p, s in zip(params, stepped, strict=True)]  # type: ignore[union-attr]
        state_tensors = self._state_tensors
        program = self._jitted_step if trace is None else self._jitted_step.plain
        if trace is not None:
            for t in state_tensors:
                trace.read(t)
        new_arrays, new_leaves = program(self._state_def, stepped, arrays, grads, [t._array for t in state_tensors])
        # A direct rebind of each stepped parameter: no op recorded, as under no_grad.
        if trace is not None:
            _writing(params)
            _writing(state_tensors)
        for p, new in zip(params, new_arrays, strict=True):
            if new is not None:
                p._array = new
                p._version += 1
        for t, leaf in zip(state_tensors, new_leaves, strict=True):
            t._array = leaf
        if trace is None:
            self._written.record(0, [p._array for p in params])

    def _follow_params(self) -> None:
        """Move the state to where the parameters are now, if they were moved or resharded since it was placed."""
        placement = [p._array.sharding for p in self.params]
        if placement == self._placement:
            return
        shapes = tuple(p.shape for p in self.params)
        devices = {d for sharding in placement for d in sharding.device_set}
        self._home = next(iter(devices)) if len(devices) == 1 else None
        shared = scalar_sharding(placement[0])

        def place(node: Any) -> Any:
            if _mirrors_params(node, shapes):
                return type(node)(jax.device_put(leaf, s) for leaf, s in zip(node, placement, strict=True))
            return node if shared is None else jax.device_put(node, shared)

        self.state = jax.tree.map(place, self.state, is_leaf=lambda node: _mirrors_params(node, shapes))
        self._placement = placement

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the parameters' ``.grad`` (to ``None``, or to zeros)."""
        clear_grads(self.params, set_to_none)


def _writing(tensors: list[Tensor]) -> None:
    """Tell a step being traced that ``tensors`` are about to be rebound (NOTE [The step-trace seam])."""
    trace = step_trace.current()
    if trace is not None:
        for t in tensors:
            trace.write(t)


def get_lr(optimizer: Optax) -> float:
    """The learning rate held in ``optimizer``'s state (its transform made by ``optax.inject_hyperparams``)."""
    return float(_hyperparams(optimizer.state)["learning_rate"])


def set_lr(optimizer: Optax, value: float) -> None:
    """Set the learning rate in ``optimizer``'s state; the next ``step`` uses it (same dtype: no recompile)."""
    state = optimizer.state
    hyperparams = _hyperparams(state)
    old = hyperparams["learning_rate"]
    hyperparams["learning_rate"] = jnp.asarray(value, dtype=jnp.asarray(old).dtype)
    optimizer.state = state


def _hyperparams(state: Any) -> dict[str, Any]:
    hyperparams = getattr(state, "hyperparams", None)
    if not isinstance(hyperparams, dict) or "learning_rate" not in hyperparams:
        raise TypeError(
            "this optimizer has no learning rate in its state: build its transform with "
            "optax.inject_hyperparams(optax.adam)(learning_rate=...) to set it"
        )
    return hyperparams

