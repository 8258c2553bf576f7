"""``Optax``: any optax gradient transformation as an optimizer of parameters' ``.grad`` (NOTE [Optimizer state in Tensors] in ``__init__``)."""

from __future__ import annotations

import functools
import itertools
import math
import weakref
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
    transform: optax.GradientTransformation, layout: StateLayout, stepped: tuple[bool, ...], params: list[Any],
    grads: list[Any], state_arrays: list[Any],
) -> tuple[list[Any], list[Any]]:
    """One update of every parameter; those not ``stepped`` (no grad) keep their value and state.

    The state comes and goes as ``layout``'s arrays (NOTE [Packed optimizer state]): rebuilding
    optax's tree from them and packing it again on the host would be a tenth of a small
    model's step, in the program they cost nothing."""
    state = layout.unflatten(state_arrays)
    new_params, new_state = _update(transform, stepped, params, grads, state)
    return new_params, layout.flatten(new_state)


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


# NOTE [Packed optimizer state]
# A small model's update costs its buffers more than its arithmetic: the demo's Adam
# takes 25 arrays and gives 19 (six parameters, their moments twice, a count), and each
# output is an allocation. So each per-parameter entry of the state (a moment, a
# momentum: ``_mirrors_params``) lives in one flat buffer per dtype while all parameters
# sit on one device; the update slices the leaves out of it, runs optax's update, and
# concatenates the new leaves into the next buffer. The demo's Adam takes 15 arrays and
# gives 9 (the count, a buffer for ``mu``, one for ``nu``): its step alone 104 -> 70 µs,
# and the arithmetic is the same elementwise code: the same bits. ``state`` shows optax's
# own tree, its entries sliced from the buffers (kept until the buffers change, so a
# state read and assigned back, as ``set_lr`` does, repacks nothing). Sharded
# parameters keep one array per entry, as does a transform whose update changes its
# state's shapes or dtypes (asked once, by ``jax.eval_shape``), and weakly typed entries.


class StateLayout:
    """How optax's state tree is held: arrays (slots), each a leaf of the tree or a flat buffer of several
    (NOTE [Packed optimizer state]). Static in the update's program: hashed once, compared by value.

    >>> import jax.numpy as jnp, optax
    >>> params = [jnp.ones((2, 2)), jnp.zeros(3)]
    >>> state = optax.adam(0.1).init(params)
    >>> layout = StateLayout.of(state, params, pack=True)
    >>> [a.shape for a in layout.flatten(state)]  # the count, then mu and nu, a buffer each
    [(), (7,), (7,)]
    >>> jax.tree.all(jax.tree.map(lambda a, b: (a == b).all(), layout.unflatten(layout.flatten(state)), state))
    True
    """

    __slots__ = ("_hash", "entries", "packed", "treedef")

    def __init__(self, treedef: Any, entries: tuple[tuple[int, int | None, tuple[int, ...], Any], ...], packed: tuple[bool, ...]) -> None:
        self.treedef = treedef
        self.entries = entries  # per leaf: (its slot, its start in the slot's buffer or None, its shape, its dtype)
        self.packed = packed  # per slot: a buffer of several leaves
        self._hash = hash((treedef, entries, packed))

    @classmethod
    def of(cls, state: Any, params: list[Any], pack: bool) -> StateLayout:
        """The layout of ``state``; with ``pack``, each per-parameter entry (a list of leaves) packed into one
        buffer per dtype. One buffer per entry, not one for all: a program that splits one buffer into more
        pieces and concatenates more runs slower (the demo's Adam: 96 µs for ``mu`` and ``nu`` in one, 66 in two)."""
        leaves, treedef = jax.tree.flatten(state)
        shapes = tuple(p.shape for p in params)
        entries_seen = itertools.count()

        def number(node: Any) -> Any:  # a per-parameter entry's leaves: its number; other leaves: -1
            if not _mirrors_params(node, shapes):
                return -1
            entry = next(entries_seen) if pack else -1
            return jax.tree.map(lambda _: entry, node)

        owners = jax.tree.leaves(jax.tree.map(number, state, is_leaf=lambda node: _mirrors_params(node, shapes)))
        buffers: dict[Any, tuple[int, list[int]]] = {}  # (entry, dtype) -> (its slot, its length so far)
        entries: list[tuple[int, int | None, tuple[int, ...], Any]] = []
        packed: list[bool] = []
        for leaf, owner in zip(leaves, owners, strict=True):
            if owner >= 0 and not getattr(leaf, "weak_type", True):
                slot, length = buffers.setdefault((owner, leaf.dtype), (len(packed), [0]))
                if slot == len(packed):
                    packed.append(True)
                entries.append((slot, length[0], tuple(leaf.shape), leaf.dtype))
                length[0] += leaf.size
            else:
                entries.append((len(packed), None, jnp.shape(leaf), jnp.result_type(leaf)))
                packed.append(False)
        return cls(treedef, tuple(entries), tuple(packed))

    @property
    def packs(self) -> bool:
        return any(self.packed)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, StateLayout) and (self.treedef, self.entries, self.packed) == (other.treedef, other.entries, other.packed)
        )

    def leaves(self, arrays: list[Any]) -> list[Any]:
        """The tree's leaves from the slots' arrays."""
        return [
            arrays[slot] if start is None else arrays[slot][start : start + math.prod(shape)].reshape(shape)
            for slot, start, shape, _ in self.entries
        ]

    def unflatten(self, arrays: list[Any]) -> Any:
        return jax.tree.unflatten(self.treedef, self.leaves(arrays))

    def pack_leaves(self, leaves: list[Any], kept: list[Any] | None = None) -> list[Any]:
        """The slots' arrays from the tree's leaves; a buffer given in ``kept`` is taken as it is."""
        parts: list[list[Any]] = [[] for _ in self.packed]
        for (slot, _, _, _), leaf in zip(self.entries, leaves, strict=True):
            parts[slot].append(leaf)
        kept = kept or [None] * len(parts)
        return [
            part[0] if not packed else buffer if buffer is not None else jnp.concatenate([leaf.reshape(-1) for leaf in part])
            for part, packed, buffer in zip(parts, self.packed, kept, strict=True)
        ]

    def holds(self, leaves: list[Any]) -> bool:
        """Whether ``leaves`` have the shapes and dtypes this layout was made for."""
        return len(leaves) == len(self.entries) and all(
            (jnp.shape(leaf), jnp.result_type(leaf)) == (shape, dtype) for leaf, (_, _, shape, dtype) in zip(leaves, self.entries, strict=True)
        )

    def flatten(self, state: Any) -> list[Any]:
        return self.pack_leaves(jax.tree.leaves(state))


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

    _layout: StateLayout
    _state_tensors: list[Tensor]  # the layout's slots (NOTE [Packed optimizer state])

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
        self._shown: tuple[list[weakref.ref[Any]], list[weakref.ref[Any]]] | None = None  # slots and leaves last shown
        self._assign(transform.init([p.array for p in tensors]), relayout=True)
        self._jitted_step = FastJit(functools.partial(_step, transform), static_argnums=(0, 1))  # NOTE [Fast compiles]

    @property
    def state(self) -> Any:
        """The optax state of the transformation (NOTE [Optimizer state in Tensors], NOTE [Packed optimizer state])."""
        arrays = [t._array for t in self._state_tensors]
        trace = step_trace.current()
        if trace is not None:  # a step being traced finds the state here (NOTE [The step-trace seam])
            for t in self._state_tensors:
                trace.read(t)
            return self._layout.unflatten(arrays)
        leaves = self._shown_leaves(arrays)
        if leaves is None:
            leaves = self._layout.leaves(arrays)
            self._shown = ([weakref.ref(a) for a in arrays], [weakref.ref(leaf) for leaf in leaves])
        return jax.tree.unflatten(self._layout.treedef, leaves)

    @state.setter
    def state(self, value: Any) -> None:
        leaves, treedef = jax.tree.flatten(value)
        self._assign(value, relayout=treedef != self._layout.treedef or not self._layout.holds(leaves))

    def _shown_leaves(self, arrays: list[Any]) -> list[Any] | None:
        """The leaves ``state`` last showed, if they are still alive and were sliced from ``arrays``."""
        if self._shown is None:
            return None
        slots, shown = self._shown
        if len(slots) != len(arrays) or any(ref() is not array for ref, array in zip(slots, arrays, strict=True)):
            return None
        leaves = [ref() for ref in shown]
        return None if any(leaf is None for leaf in leaves) else leaves

    def _assign(self, value: Any, relayout: bool) -> None:
        """Hold the state ``value``: in a new layout (``relayout``) or the current one (NOTE [Packed optimizer state])."""
        leaves = [jnp.asarray(leaf) for leaf in jax.tree.leaves(value)]
        old = getattr(self, "_layout", None)
        layout = self._layout_of(value) if relayout else self._layout
        kept = None
        if layout == old:  # a buffer all of whose leaves come back as ``state`` showed them is kept
            arrays = [t._array for t in self._state_tensors]
            shown = self._shown_leaves(arrays)
            if shown is not None:
                kept = [a if packed else None for a, packed in zip(arrays, layout.packed, strict=True)]
                for (slot, _, _, _), leaf, seen in zip(layout.entries, leaves, shown, strict=True):
                    if leaf is not seen:
                        kept[slot] = None
        slots = [_committed(a, self._home) for a in layout.pack_leaves(leaves, kept)]
        if layout == old:  # the same Tensors, rebound
            _writing(self._state_tensors)
            for t, array in zip(self._state_tensors, slots, strict=True):
                t._array = array
            return
        self._layout = layout
        self._state_tensors = [Tensor(array) for array in slots]

    def _layout_of(self, state: Any) -> StateLayout:
        """``state``'s layout: packed while the parameters sit on one device and the update keeps the state's avals."""
        params = [p._array for p in self.params]
        pack = self._home is not None
        if pack:
            everything = (True,) * len(params)
            _, new = jax.eval_shape(functools.partial(_update, self.transform, everything), params, params, state)
            leaves, new_leaves = jax.tree.leaves(state), jax.tree.leaves(new)
            structure: Any = jax.tree.structure(state)  # a PyTreeDef, whose == the stubs do not declare
            pack = structure == jax.tree.structure(new) and all(
                (a.shape, a.dtype) == (jnp.shape(b), jnp.result_type(b)) for a, b in zip(new_leaves, leaves, strict=True)
            )
        return StateLayout.of(state, params, pack)

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
        new_arrays, new_slots = program(self._layout, stepped, arrays, grads, [t._array for t in state_tensors])
        # A direct rebind of each stepped parameter: no op recorded, as under no_grad.
        if trace is not None:
            _writing(params)
            _writing(state_tensors)
        for p, new in zip(params, new_arrays, strict=True):
            if new is not None:
                p._array = new
                p._version += 1
        for t, array in zip(state_tensors, new_slots, strict=True):
            t._array = array
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

        self._assign(jax.tree.map(place, self.state, is_leaf=lambda node: _mirrors_params(node, shapes)), relayout=True)
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

