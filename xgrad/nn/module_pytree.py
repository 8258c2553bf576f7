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
# NOTE [Foreign pytrees in a module]
# A module may hold any pytree with arrays: an Equinox or Flax module, a dict of arrays,
# a list of Parameters. Its arrays are children (``jax.grad`` differentiates them,
# optax and ``jax.jit`` see them) and its other leaves (functions, ints) are aux data,
# as ``eqx.partition`` splits a model. Which leaf is which is decided by value when a
# module is flattened, so a module that was *unflattened* from a tree built leaf by leaf
# (Equinox's filter masks of bools, ``eqx.partition``'s ``None``s) remembers its aux
# data, and flattening it again takes its children where the original's were, whatever
# they hold now: the mask tree has the model's structure. Eager optimizers train what ``parameters()``
# lists: a foreign pytree's arrays are constants there until they are Parameters
# (``jax.tree_util.tree_map(nn.Parameter, arrays)``, which ``parameters()`` then finds).
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

import operator
import threading
import weakref
from typing import Any

import jax
import numpy as np

from xgrad import step_trace
from xgrad.nn.hooks import HOOK_DICTS
from xgrad.tensor import Tensor
from xgrad.tensor.parameters import is_parameter, mark_parameter

__all__ = ["register_module_pytree"]

_ARRAYS = (Tensor, jax.Array, np.ndarray)
_LEAF = jax.tree_util.tree_structure(0)  # the treedef of one leaf
_INTERNAL = frozenset({"_buffers", "training", *HOOK_DICTS})  # a module's own bookkeeping: aux data always
_OWN_DICTS = ("_buffers", *HOOK_DICTS)


# Per module unflattened with a foreign pytree among its attributes: the aux data it was
# built from (NOTE [Foreign pytrees in a module]).
_built_from: weakref.WeakKeyDictionary[Any, _ModuleAux] = weakref.WeakKeyDictionary()


def _stop_at_tensors_and_modules(x: Any) -> bool:
    from xgrad.nn.module import Module

    return isinstance(x, (Tensor, Module))


# Types whose instances are pytree leaves (not containers), learnt as they are met: no
# state can be inside them, and ``_is_state`` answers for them without a tree walk.
_LEAF_TYPES: set[type] = {bool, int, float, str, type, type(None)}


def _is_state(value: Any) -> bool:
    """Whether an attribute value is (or holds) state: a Tensor, an array or a Module, or
    any pytree (a list, an Equinox or Flax module, a dict) with one among its leaves."""
    from xgrad.nn.module import Module

    kind = type(value)
    if kind in _LEAF_TYPES:
        return False
    if isinstance(value, (*_ARRAYS, Module)):
        return True
    if isinstance(value, (dict, list, tuple)) and not value:
        return False
    leaves = jax.tree_util.tree_leaves(value, is_leaf=_stop_at_tensors_and_modules)
    if len(leaves) == 1 and leaves[0] is value:
        _LEAF_TYPES.add(kind)
        return False
    return any(isinstance(leaf, (*_ARRAYS, Module)) for leaf in leaves)


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # an == that returns no single truth value
        return False


class _Static:
    """A leaf of a state attribute that is not an array (an activation function in an
    Equinox module, an int in a list): aux data, as ``eqx.partition`` makes it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and _same(self.value, other.value)

    def __hash__(self) -> int:
        return 0


class _OwnDict:
    """A module's own dict (``_buffers``, a hook dict) in its aux data: its items as they
    were, so that a hook registered since is a change (a jit cache traces again), and a
    fresh dict for each module built from it (a hook registered there stays there)."""

    __slots__ = ("items", "keys", "kind")

    def __init__(self, value: dict[Any, Any]) -> None:
        self.kind = type(value)
        self.items = tuple(value.items())
        self.keys = tuple(value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _OwnDict) or self.kind is not other.kind or self.keys != other.keys:
            return False
        return all(_same(a, b) for (_, a), (_, b) in zip(self.items, other.items, strict=True))

    def __hash__(self) -> int:
        return len(self.items)

    def build(self) -> dict[Any, Any]:
        return self.kind(self.items)


# A path from a module to something below it: per step, where it is held ("attr": in
# the module's ``__dict__``, "key": in its ``_modules``) and under which name.
Path = tuple[tuple[str, str], ...]


class _Tied:
    """A later occurrence of a tensor or module that a model holds in several places: the
    path, from the module that found it, of its first occurrence (NOTE [Shared parameters])."""

    __slots__ = ("path",)

    def __init__(self, path: Path) -> None:
        self.path = path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Tied) and self.path == other.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"tied to {'.'.join(name for _, name in self.path)}"


class _ModuleAux:
    """A Module node's aux data: its class, which attributes hold children and how, and the rest's values."""

    __slots__ = ("cls", "entries", "modules", "order", "static", "template", "ties")

    def __init__(
        self,
        cls: type,
        order: tuple[str, ...],
        entries: tuple[tuple[str, Any, tuple[Any, ...]], ...],
        modules: tuple[tuple[str, Any], ...],
        static: tuple[tuple[str, Any], ...],
        ties: tuple[tuple[Path, _Tied], ...],
    ) -> None:
        self.cls = cls
        self.order = order  # every attribute, in the instance's order (``named_parameters`` follows it)
        # Per attribute holding state: (name, the treedef of its value down to Tensors and
        # Modules, per leaf ``None`` (a child), a Tensor's (pytree metadata, whether a
        # parameter), or a ``_Static`` value).
        self.entries = entries
        self.modules = modules  # per child held by key: (name, None for a child, or a _Tied)
        self.static = static
        self.ties = ties  # the later occurrences below this module, resolved when it is unflattened
        self.template: tuple[dict[str, Any], tuple[tuple[str, _OwnDict], ...]] | None = None  # see _unflatten_simple

    def __eq__(self, other: object) -> bool:
        # Loops, not generator expressions: a jitted function of a model compares one per module per call.
        if self is other:
            return True
        if not isinstance(other, _ModuleAux):
            return False
        if (
            self.cls is not other.cls
            or self.order != other.order
            or self.modules != other.modules
            or self.ties != other.ties
            or len(self.entries) != len(other.entries)
            or len(self.static) != len(other.static)
        ):
            return False
        for (n, t, i), (m, u, j) in zip(self.entries, other.entries, strict=True):
            if n != m or t != u or len(i) != len(j):
                return False
            for a, b in zip(i, j, strict=True):
                if a is not b and not _same(a, b):
                    return False
        for (name, value), (other_name, other_value) in zip(self.static, other.static, strict=True):
            if name != other_name or (value is not other_value and not _same(value, other_value)):
                return False
        return True

    def __hash__(self) -> int:
        return hash((self.cls, self.order, self.modules))

    def __repr__(self) -> str:
        return f"{self.cls.__name__}(static={dict(self.static)})"


# NOTE [Flatten plans]
# ``jax.jit`` flattens its model argument at every call and compares the treedef with
# the cached one; a module's flatten is Python, so that would cost a walk per call. A
# module whose state is Tensor attributes and submodules, with nothing tied below it,
# keeps what its last flatten found: the objects its attributes held (compared by
# identity, as an optimizer's in-place update keeps them) and the aux data built. While
# they hold, a flatten only reads its Tensors' arrays and metadata, and returns the same
# aux object when the metadata is the same, so the treedef comparison is by identity.
# Any rebinding (``model.eval()``, a new attribute, a replaced parameter) misses, and
# that module is flattened as before.
class _Plan:
    """What flattening a module found (NOTE [Flatten plans])."""

    __slots__ = (
        "aux", "keys", "module_keys", "module_values", "own_dicts", "own_keys", "submodules", "tensors", "values",
    )

    def __init__(self, module: Any, aux: _ModuleAux) -> None:
        from xgrad.nn.module import Module

        state = module.__dict__
        self.keys = tuple(state)
        self.values = tuple(state.values())
        self.module_keys = tuple(module._modules)
        self.module_values = tuple(module._modules.values())
        self.tensors = tuple(state[name] for name, _, _ in aux.entries)
        self.submodules = [v for v in (*self.values, *self.module_values) if isinstance(v, Module)]
        owns = [(state[name], value.keys) for name, value in aux.static if type(value) is _OwnDict]
        self.own_dicts = tuple(d for d, _ in owns)
        keys = tuple(keys for _, keys in owns)
        self.own_keys = keys if any(keys) else None
        self.aux = aux

    def holds(self, module: Any) -> bool:
        """Whether ``module``'s attributes and children are the objects they were."""
        state = module.__dict__
        modules = module._modules
        return (
            tuple(state) == self.keys
            and all(map(operator.is_, state.values(), self.values))
            and tuple(modules) == self.module_keys
            and all(map(operator.is_, modules.values(), self.module_values))
            # The same dicts (checked above): with the same entries? (Mostly none: no hooks.)
            and (not any(self.own_dicts) if self.own_keys is None else tuple(map(tuple, self.own_dicts)) == self.own_keys)
        )


# By ``id``, each with a weak reference to its module (a WeakKeyDictionary's lookup costs
# a weak reference per call): per module, its plan.
_plans: dict[int, tuple[weakref.ref[Any], _Plan]] = {}


def _plan_of(module: Any) -> _Plan | None:
    entry = _plans.get(id(module))
    return entry[1] if entry is not None and entry[0]() is module else None


def _keep_plan(module: Any, plan: _Plan) -> None:
    key = id(module)
    _plans[key] = weakref.ref(module, lambda _: _plans.pop(key, None)), plan


def _plans_below(root: Any) -> dict[int, tuple[Any, _Plan]] | None:
    """Per module from ``root`` down, its plan, when each holds to its plan (so nothing
    is tied below ``root``: a plan is made only where nothing was); else ``None``."""
    found: dict[int, tuple[Any, _Plan]] = {}
    stack = [root]
    while stack:
        module = stack.pop()
        plan = _plan_of(module)
        if plan is None or not plan.holds(module):
            return None
        found[id(module)] = module, plan
        stack.extend(plan.submodules)
    return found


# NOTE [Shared parameters]
# A model may hold one tensor in several places (tied weights: ``head.weight =
# emb.weight``) or one submodule twice. As PyTorch's ``named_parameters`` lists it once,
# the pytree has it once: flattening a module finds, in its subtree and in the order
# the leaves come (attributes, then children by key, depth first), every later
# occurrence of a tensor attribute or child module already seen, and flattens, in its
# place, a ``_Tied`` mark holding the path of the first one (a shallow copy of each
# submodule on the way carries the mark; the model itself is not changed). Unflattening
# puts the first occurrence's object back at each mark. So ``jax.grad(loss)(model)``
# gives a tied weight one gradient, the sum over its uses, and ``optax.apply_updates``
# builds a model whose head and embedding share one parameter again.
class _TieFree(threading.local):
    """The submodules a module's flatten found no later occurrence below (NOTE [Shared parameters]),
    and those of them found holding to their plans (NOTE [Flatten plans])."""

    def __init__(self) -> None:
        self.modules: dict[int, Any] = {}
        self.plans: dict[int, tuple[Any, _Plan]] = {}


_tie_free = _TieFree()


def _ties(module: Any) -> list[tuple[Path, _Tied]]:
    """``_later_occurrences(module)``, without a walk for the submodules of a module just found free of them.

    JAX flattens a module's children right after the module, depth first: a walk that
    finds none below a module leaves its submodules here, and their own flattens take
    them out instead of walking again. Any other module's flatten starts afresh.
    """
    table = _tie_free.modules
    if table.pop(id(module), None) is module:
        return []
    table.clear()
    later, submodules = _later_occurrences(module)
    if not later:
        table.update(submodules)
    return later


def _later_occurrences(root: Any) -> tuple[list[tuple[Path, _Tied]], dict[int, Any]]:
    """Every later occurrence below ``root`` (its path, a mark naming the first one's path), and the submodules met."""
    from xgrad.nn.module import Module

    # Where each object was first met: (its module's path, "attr" or "key", its name); a
    # path tuple is built only for a submodule to walk or a later occurrence found.
    first: dict[int, tuple[Path, str, str]] = {id(root): ((), "", "")}
    submodules: dict[int, Any] = {}
    later: list[tuple[Path, _Tied]] = []
    stack: list[tuple[Any, Path]] = [(root, ())]
    held = (Tensor, Module)
    while stack:
        module, path = stack.pop()
        below = []
        for where, items in (("attr", module.__dict__), ("key", module._modules)):
            for name, value in items.items():
                if not isinstance(value, held):
                    continue
                here = (path, where, name)
                seen = first.setdefault(id(value), here)
                if seen is not here:
                    seen_path, seen_where, seen_name = seen
                    later.append(((*path, (where, name)), _Tied((*seen_path, (seen_where, seen_name)))))
                elif isinstance(value, Module):
                    below.append((value, (*path, (where, name))))
                    submodules[id(value)] = value
        stack.extend(reversed(below))  # depth first, in order
    return later, submodules


def _marked(module: Any, later: list[tuple[Path, _Tied]]) -> Any:
    """A shallow copy of ``module`` with each later occurrence (paths relative to it) replaced by its mark."""
    from xgrad.nn.module import Module

    copy = Module.__new__(type(module))
    state = copy.__dict__
    state.clear()
    state.update(module.__dict__)
    state["_modules"] = dict(module._modules)
    below: dict[tuple[str, str], list[tuple[Path, _Tied]]] = {}
    for path, mark in later:
        if len(path) == 1:
            _put(copy, path, mark)
        else:
            below.setdefault(path[0], []).append((path[1:], mark))
    for step, marks in below.items():
        _put(copy, (step,), _marked(_find(copy, (step,)), marks))
    return copy


def _tensor(child: Any, info: tuple[Any, bool], cls: type, name: str) -> Any:
    """The Tensor a module attribute held, rebuilt around ``child``."""
    meta, was_parameter = info
    if not meta.requires_grad and isinstance(child, jax.core.Tracer) and step_trace.current() is None:
        child = jax.lax.stop_gradient(child)  # NOTE [Frozen state on JAX's AD]
    tensor = Tensor.tree_unflatten(meta, (child,))
    if was_parameter and isinstance(tensor, Tensor):
        mark_parameter(tensor, f"{cls.__name__}.{name}")
    return tensor


def _find(module: Any, path: Path) -> Any:
    for where, name in path:
        module = module.__dict__[name] if where == "attr" else module._modules[name]
    return module


def _put(module: Any, path: Path, value: Any) -> None:
    module = _find(module, path[:-1])
    where, name = path[-1]
    if where == "attr":
        module.__dict__[name] = value
    else:
        module._modules[name] = value


def _flatten(module: Any, keyed: bool) -> tuple[list[Any], list[Any], _ModuleAux]:
    """The children (and, when ``keyed``, their keys) and the aux data of ``module``."""
    plan = _plan_holding(module) if _plans else None
    if plan is not None:
        return _flatten_by_plan(plan, keyed)
    ties = _ties(module)
    built_from = _built_from.get(module) if _built_from else None
    if ties:
        module = _marked(module, ties)
    children: list[Any] = []
    keys: list[Any] = []
    entries: list[tuple[str, Any, tuple[Any, ...]]] = []
    static: list[tuple[str, Any]] = []
    state = module.__dict__
    for name, value in state.items():
        if name in _INTERNAL:
            static.append((name, _OwnDict(value) if name in _OWN_DICTS and isinstance(value, dict) else value))
            continue
        if isinstance(value, Tensor):  # the common case, without a tree walk
            (array,), meta = value.tree_flatten()
            entries.append((name, _LEAF, ((meta, is_parameter(value)),)))
            children.append(array)
            if keyed:
                keys.append(jax.tree_util.GetAttrKey(name))
            continue
        remembered = None if built_from is None else _remembered_entry(built_from, name, value)
        if remembered is None and (name == "_modules" or not _is_state(value)):
            if name != "_modules":
                static.append((name, value))
            continue
        # A Tensor's array is the child itself (not a Tensor node), so that trees built
        # leaf by leaf (``eqx.partition``'s masks and ``None``s) keep the model's structure.
        if remembered is None:
            paths, treedef = jax.tree_util.tree_flatten_with_path(value, is_leaf=_stop_at_tensors_and_modules)
            kinds: list[Any] = [None] * len(paths)
        else:
            paths, treedef, kinds = remembered
        infos: list[Any] = []
        for (path, leaf), kind in zip(paths, kinds, strict=True):
            if type(kind) is _Static:
                infos.append(_Static(leaf))
                continue
            if kind is not None:  # a child where the module this one was built from had one
                infos.append(None)
                array = leaf
            elif isinstance(leaf, Tensor):
                (array,), meta = leaf.tree_flatten()
                infos.append((meta, is_parameter(leaf)))
            elif _is_state(leaf):
                infos.append(None)
                array = leaf
            else:  # NOTE [Foreign pytrees in a module]
                infos.append(_Static(leaf))
                continue
            children.append(array)
            if keyed:
                keys.append(jax.tree_util.GetAttrKey(name + jax.tree_util.keystr(path)))
        entries.append((name, treedef, tuple(infos)))
    modules: list[tuple[str, Any]] = []
    for name, child in module._modules.items():
        if isinstance(child, _Tied):
            modules.append((name, child))
        else:
            modules.append((name, None))
            children.append(child)
            if keyed:
                keys.append(jax.tree_util.GetAttrKey(name))
    aux = _ModuleAux(type(module), tuple(state), tuple(entries), tuple(modules), tuple(static), tuple(ties))
    if not ties and built_from is None and all(treedef is _LEAF for _, treedef, _ in entries):
        _keep_plan(module, _Plan(module, aux))
    return children, keys, aux


def _plan_holding(module: Any) -> _Plan | None:
    """``module``'s plan, when it and every module below hold to theirs (NOTE [Flatten plans])."""
    planned = _tie_free.plans
    entry = planned.pop(id(module), None)
    if entry is not None and entry[0] is module:  # found holding by the flatten of a module above
        return entry[1] if entry[1].holds(module) else None
    planned.clear()
    below = _plans_below(module)
    if below is None:
        return None
    _, plan = below.pop(id(module))
    planned.update(below)
    return plan


def _flatten_by_plan(plan: _Plan, keyed: bool) -> tuple[list[Any], list[Any], _ModuleAux]:
    """``_flatten``, for a module that holds to ``plan`` (NOTE [Flatten plans])."""
    aux = plan.aux
    children: list[Any] = []
    infos = []
    same = True
    for tensor, (_, _, ((old_meta, old_parameter),)) in zip(plan.tensors, aux.entries, strict=True):
        (array,), meta = tensor.tree_flatten()
        children.append(array)
        parameter = is_parameter(tensor)
        infos.append((meta, parameter))
        same = same and parameter == old_parameter and meta.same_as(old_meta)
    if not same:
        entries = tuple((name, treedef, (info,)) for (name, treedef, _), info in zip(aux.entries, infos, strict=True))
        aux = plan.aux = _ModuleAux(aux.cls, aux.order, entries, aux.modules, aux.static, aux.ties)
    children.extend(plan.module_values)
    keys = []
    if keyed:
        keys = [jax.tree_util.GetAttrKey(name) for name, _, _ in aux.entries]
        keys.extend(jax.tree_util.GetAttrKey(name) for name in plan.module_keys)
    return children, keys, aux


def _remembered_entry(aux: _ModuleAux, name: str, value: Any) -> tuple[list[Any], Any, list[Any]] | None:
    """For a module unflattened from ``aux``: the attribute ``name``'s leaves (with their
    paths), treedef and per leaf its kind in ``aux`` (``_Static`` or a child), when
    ``value`` still has that structure (NOTE [Foreign pytrees in a module])."""
    found = [(treedef, infos) for entry_name, treedef, infos in aux.entries if entry_name == name]
    if not found:
        return None
    treedef, infos = found[0]
    if any(type(info) is tuple for info in infos):
        return None  # Tensors in it: their placeholders keep the structure already
    try:
        leaves = treedef.flatten_up_to(value)
    except (TypeError, ValueError):
        return None
    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(treedef.unflatten(range(len(leaves))))[0]]
    kinds = [info if type(info) is _Static else True for info in infos]
    return list(zip(paths, leaves, strict=True)), treedef, kinds


def _flatten_with_keys(module: Any) -> tuple[list[tuple[Any, Any]], _ModuleAux]:
    children, keys, aux = _flatten(module, keyed=True)
    return list(zip(keys, children, strict=True)), aux


def _flatten_plain(module: Any) -> tuple[list[Any], _ModuleAux]:
    children, _, aux = _flatten(module, keyed=False)
    return children, aux


def _unflatten_simple(aux: _ModuleAux, children: Any) -> Any:
    """``_unflatten`` of a module whose state is Tensor attributes and submodules: its
    ``__dict__`` copied from a template in the original's order, the Tensors set in it."""
    if aux.template is None:
        template = {name: None for name in aux.order}
        template.update(aux.static)
        aux.template = template, tuple((name, value) for name, value in aux.static if type(value) is _OwnDict)
    template, own_dicts = aux.template
    module: Any = object.__new__(aux.cls)
    state = module.__dict__
    state.update(template)
    for name, own in own_dicts:  # the new module's own, as ``register_buffer`` and hooks write to them
        state[name] = own.kind(own.items)
    children = iter(children)
    for name, _, (info,) in aux.entries:
        state[name] = _tensor(next(children), info, aux.cls, name)
    state["_modules"] = {name: next(children) for name, _ in aux.modules}
    return module


def _unflatten(aux: _ModuleAux, children: Any) -> Any:
    if aux.template is not None or (
        not aux.ties
        and all(mark is None for _, mark in aux.modules)
        and all(treedef is _LEAF and type(infos[0]) is tuple for _, treedef, infos in aux.entries)
    ):
        return _unflatten_simple(aux, children)
    children = iter(children)
    # object.__new__, not Module.__new__: every attribute of the new module is set below.
    module: Any = object.__new__(aux.cls)
    values = {name: value.build() if type(value) is _OwnDict else value for name, value in aux.static}
    for name, treedef, infos in aux.entries:
        if treedef == _LEAF and type(infos[0]) is tuple:  # a Tensor attribute, the common case
            values[name] = _tensor(next(children), infos[0], aux.cls, name)
            continue
        leaves = []
        for info in infos:
            if type(info) is _Static:
                leaves.append(info.value)
                continue
            child = next(children)
            leaves.append(child if info is None else _tensor(child, info, aux.cls, name))
        values[name] = jax.tree_util.tree_unflatten(treedef, leaves)
    values["_modules"] = {name: next(children) if mark is None else mark for name, mark in aux.modules}
    state = module.__dict__
    for name in aux.order:
        state[name] = values[name]
    for path, mark in aux.ties:
        _put(module, path, _find(module, mark.path))
    if any(treedef != _LEAF and None in infos for _, treedef, infos in aux.entries):
        _built_from[module] = aux
    return module


def register_module_pytree(cls: type) -> None:
    """Make ``cls`` (a Module class) a pytree node (NOTE [Module as a pytree])."""
    jax.tree_util.register_pytree_with_keys(cls, _flatten_with_keys, _unflatten, _flatten_plain)
