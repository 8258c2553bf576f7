"""``nn.Module`` as a JAX pytree, as an Equinox module is one.

# NOTE [Module as a pytree]
# Every Module class is a pytree node (registered as it is defined). Its children are
# the attributes that hold state: Tensors and arrays (parameters, buffers, constants),
# submodules, and lists, tuples and dicts holding any of them; then the children a
# container holds by key (``_modules``). Everything else (sizes, flags, activation
# classes, ``training``, hooks) is aux data, compared by ``==`` so that a jit cache
# traces again when it changes. So ``jax.tree_util.tree_leaves(model)`` gives the
# parameter and buffer arrays (a Tensor's own leaf is its array), and ``tree_map``,
# ``jax.jit``/``grad``/``vmap`` over a model argument, ``eqx.filter_jit`` and
# ``optax.apply_updates(model, updates)`` build a working model of the same class: a new
# object with the same configuration, made without calling ``__init__``, whose Tensors
# that were parameters are parameters again (``named_parameters`` finds them).
# Flattening reads the model and changes nothing: eager users mutate parameters in
# place (``p.data.mul_``, optimizers) exactly as before.
#
# NOTE [Frozen state on JAX's AD]
# Eager backward gives a frozen parameter (``requires_grad=False``) and a buffer no
# gradient, whatever the loss does with them. ``jax.grad(loss)(model)`` differentiates
# every leaf, so a module unflattened on tracers (inside a JAX transformation) holds
# those through ``lax.stop_gradient``: their "gradient" is zeros, and an optimizer's
# update leaves them as they are, as eager's ``optimizer.step()`` does. Inside an
# ``xgrad.compile`` step xgrad's own engine differentiates and nothing is wrapped.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from xgrad import step_trace
from xgrad.nn.hooks import HOOK_DICTS
from xgrad.tensor import Tensor

__all__ = ["register_module_pytree"]

_ARRAYS = (Tensor, jax.Array, np.ndarray)


def _is_state(value: Any) -> bool:
    """Whether an attribute value is (or holds) state: a Tensor, an array or a Module."""
    from xgrad.nn.module import Module

    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (*_ARRAYS, Module)):
            return True
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return False


def _stop_at_tensors_and_modules(x: Any) -> bool:
    from xgrad.nn.module import Module

    return isinstance(x, (Tensor, Module))


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # an == that returns no single truth value
        return False


class _ModuleAux:
    """A Module node's aux data: its class, which attributes hold children and how, and the rest's values."""

    __slots__ = ("cls", "entries", "modules", "order", "static")

    def __init__(
        self,
        cls: type,
        order: tuple[str, ...],
        entries: tuple[tuple[str, Any, tuple[Any, ...]], ...],
        modules: tuple[str, ...],
        static: tuple[tuple[str, Any], ...],
    ) -> None:
        self.cls = cls
        self.order = order  # every attribute, in the instance's order (``named_parameters`` follows it)
        # Per attribute holding state: (name, the treedef of its value down to Tensors and
        # Modules, per leaf ``None`` or a Tensor's (pytree metadata, whether a parameter)).
        self.entries = entries
        self.modules = modules
        self.static = static

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _ModuleAux):
            return False
        return (
            self.cls is other.cls
            and self.order == other.order
            and self.modules == other.modules
            and len(self.entries) == len(other.entries)
            and all(
                n == m and t == u and len(i) == len(j) and all(_same(a, b) for a, b in zip(i, j, strict=True))
                for (n, t, i), (m, u, j) in zip(self.entries, other.entries, strict=True)
            )
            and len(self.static) == len(other.static)
            and all(k == j and _same(a, b) for (k, a), (j, b) in zip(self.static, other.static, strict=True))
        )

    def __hash__(self) -> int:
        return hash((self.cls, self.order, self.modules))

    def __repr__(self) -> str:
        return f"{self.cls.__name__}(static={dict(self.static)})"


def _flatten(module: Any) -> tuple[list[tuple[Any, Any]], _ModuleAux]:
    from xgrad.nn.module import _is_parameter

    children: list[tuple[Any, Any]] = []
    entries: list[tuple[str, Any, tuple[Any, ...]]] = []
    static: list[tuple[str, Any]] = []
    state = module.__dict__
    for name, value in state.items():
        if name == "_modules":
            continue
        if not _is_state(value):
            static.append((name, value))
            continue
        # A Tensor's array is the child itself (not a Tensor node), so that trees built
        # leaf by leaf (``eqx.partition``'s masks and ``None``s) keep the model's structure.
        paths, treedef = jax.tree_util.tree_flatten_with_path(value, is_leaf=_stop_at_tensors_and_modules)
        infos: list[Any] = []
        for path, leaf in paths:
            key = jax.tree_util.GetAttrKey(name + jax.tree_util.keystr(path))
            if isinstance(leaf, Tensor):
                (array,), meta = leaf.tree_flatten()
                infos.append((meta, _is_parameter(leaf)))
                children.append((key, array))
            else:
                infos.append(None)
                children.append((key, leaf))
        entries.append((name, treedef, tuple(infos)))
    modules = module._modules
    for name, child in modules.items():
        children.append((jax.tree_util.GetAttrKey(name), child))
    aux = _ModuleAux(type(module), tuple(state), tuple(entries), tuple(modules), tuple(static))
    return children, aux


def _flatten_plain(module: Any) -> tuple[list[Any], _ModuleAux]:
    children, aux = _flatten(module)
    return [child for _, child in children], aux


def _unflatten(aux: _ModuleAux, children: Any) -> Any:
    from xgrad.nn.module import Module, _mark_parameter

    children = iter(children)
    module = Module.__new__(aux.cls)
    values = dict(aux.static)
    for own in ("_buffers", *HOOK_DICTS):  # the new module's own, as ``register_buffer`` and hooks write to them
        if isinstance(values.get(own), dict):
            values[own] = type(values[own])(values[own])
    for name, treedef, infos in aux.entries:
        leaves = []
        for info in infos:
            child = next(children)
            if info is not None:
                meta, is_parameter = info
                if not meta.requires_grad and isinstance(child, jax.core.Tracer) and step_trace.current() is None:
                    child = jax.lax.stop_gradient(child)  # NOTE [Frozen state on JAX's AD]
                child = Tensor.tree_unflatten(meta, (child,))
                if is_parameter and isinstance(child, Tensor):
                    _mark_parameter(child, f"{aux.cls.__name__}.{name}")
            leaves.append(child)
        values[name] = jax.tree_util.tree_unflatten(treedef, leaves)
    values["_modules"] = dict(zip(aux.modules, children, strict=True))
    state = module.__dict__
    state.clear()
    for name in aux.order:
        state[name] = values[name]
    return module


def register_module_pytree(cls: type) -> None:
    """Make ``cls`` (a Module class) a pytree node (NOTE [Module as a pytree])."""
    jax.tree_util.register_pytree_with_keys(cls, _flatten, _unflatten, _flatten_plain)
