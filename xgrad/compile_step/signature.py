"""What a call of a compiled step is compared against: its signature, the guards of its state, the last hit.

NOTE [The hit path] (below) and NOTE [Whole-step compile], 3, in ``__init__``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from xgrad.grad_mode import is_grad_enabled
from xgrad.ops.autocast import AUTOCAST, autocast_key
from xgrad.tensor import Tensor
from xgrad.tensor.hook_kinds import LEAF_KINDS, leaf_has_hooks

__all__ = [
    "LastCall", "aliases", "guard_entry", "hook_ids_hold", "leaf_hook_ids", "leaf_hook_versions", "leaf_key",
    "plain_argument", "same_shape", "signature_of",
]

# A step's state is guarded on its hooks of each kind a leaf keeps (NOTE [Hook kinds]).
_LEAF_SLOTS: tuple[str, ...] = tuple(kind.leaf_slot for kind in LEAF_KINDS)  # type: ignore[misc]


def leaf_hook_ids(t: Tensor) -> tuple[tuple[int, ...], ...]:
    """The ids of ``t``'s hooks (their handles'), per kind in ``LEAF_KINDS``."""
    return tuple(tuple(getattr(t, slot) or ()) for slot in _LEAF_SLOTS)


def _versions_reader(slots: tuple[str, ...]) -> Callable[[Tensor], tuple[int | None, ...]]:
    """``t -> (t.<slot 0>'s version or None, ...)``, built once from the table as the inline tuple: the hit path
    reads it of every hooked state tensor (a loop over the slots costs twice as much)."""
    if not all(slot.isidentifier() for slot in slots):
        raise ValueError(f"hook slots must be attribute names, got {slots!r}")
    items = "".join(f"None if t.{slot} is None else t.{slot}.version, " for slot in slots)
    read: Callable[[Tensor], tuple[int | None, ...]] = eval(f"lambda t: ({items})")
    return read


#: The versions of a tensor's hook dicts (``None``: none), per kind in ``LEAF_KINDS``: equal, the same hooks
#: (``HookDict.version``).
leaf_hook_versions = _versions_reader(_LEAF_SLOTS)


def leaf_key(leaf: Any) -> Any:
    if isinstance(leaf, Tensor):
        a, g = leaf._array, leaf._grad
        return ("tensor", a.shape, a.dtype, getattr(a, "sharding", None), leaf.grad_fn, leaf._requires_grad, g is None,
                None if g is None else g._array.shape, leaf_hook_ids(leaf))
    if isinstance(leaf, jax.Array):
        return ("array", leaf.shape, leaf.dtype, leaf.sharding, leaf.weak_type)
    if isinstance(leaf, np.ndarray):
        return ("ndarray", leaf.shape, leaf.dtype)
    return ("static", type(leaf), leaf)


def guard_entry(ref: Any, grad_read: bool) -> list[Any]:
    """What a trace's Python decided on about a state tensor (NOTE [Whole-step compile], 3), as ``_guards_hold``
    reads it: ``[ref, aval, shape, dtype, requires_grad]`` for a leaf without hooks whose ``.grad`` was not read
    (``Entry.plain_guards``); for the others ``[ref, aval, shape, dtype, grad_read, grad_fn, requires_grad, the
    .grad's shape (None: no .grad or not read), hook ids, hook dicts' versions]`` (``Entry.guards``), the versions
    (``leaf_hook_versions``) compared by ``_guards_with_history_hold`` before the hooks."""
    t = ref()
    a, g, hooks = t._array, t._grad, leaf_hook_ids(t)
    if not grad_read and t.grad_fn is None and not any(hooks):
        return [ref, None, a.shape, a.dtype, t._requires_grad]
    grad_shape = None if g is None or not grad_read else g._array.shape
    return [ref, None, a.shape, a.dtype, grad_read, t.grad_fn, t._requires_grad, grad_shape, hooks, leaf_hook_versions(t)]


def hook_ids_hold(guard: list[Any], t: Tensor) -> bool:
    """Whether ``t`` has the hooks ``guard`` expects, its hook dicts' versions being others than last seen; if so
    they are the ones compared next time (a hook added then removed fails no guard)."""
    if leaf_hook_ids(t) != guard[8]:
        return False
    guard[9] = leaf_hook_versions(t)
    return True


def aliases(leaves: list[Any]) -> tuple[int, ...]:
    """Which Tensor arguments are one tensor: each one's first position."""
    alias: list[int] = []
    first: dict[int, int] = {}
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, Tensor):
            alias.append(first.setdefault(id(leaf), i))
    return tuple(alias)


def signature_of(leaves: list[Any], tree: Any) -> Any:
    """The cache key of a call: the arguments' structure, each leaf's key, which are one tensor, the grad
    and autocast modes."""
    try:
        signature = (tree, tuple(leaf_key(leaf) for leaf in leaves), aliases(leaves), (is_grad_enabled(), autocast_key()))
        hash(signature)
    except TypeError:
        raise TypeError(
            "xgrad.compile: an argument that is not a Tensor or array must be hashable (it is a static part of "
            "the signature)"
        ) from None
    return signature


# NOTE [The hit path]
# A step's call that hits pays Python that ``jax.jit``'s C++ fast path does not: the
# signature of its arguments, the guards of its state, gathering its inputs and writing
# back its outputs, each at every call. Each is made a walk over lists prepared once:
# ``LastCall`` keeps the last hit's arguments as the objects that passed (each array's
# type and aval, interned by JAX, its sharding, a static value) with the signature and
# the cache entry they led to, so a call whose arguments are those objects again, or
# arrays with the same aval and a sharding already found equal, skips building,
# hashing and comparing the signature (``signature_of`` and its ``sharding == sharding``
# per leaf, Python in JAX); where they were the positional arguments themselves, it
# skips flattening them too, and a grad mode and autocast state that are the very
# objects seen then skip building the modes' key. Anything else (a Tensor argument
# with history, hooks or a ``.grad``, a NumPy array, another tree, grad or autocast
# mode) takes the full path, which then records the new call. Any change to the cache
# forgets it. The guards that follow are plain loops over lists made once: on CPython
# 3.11 a loop's specialized slot reads beat ``operator.attrgetter`` mapped over the
# tensors (measured in ``benchmarks/RESULTS.md``, "The hit path, round 3").


class LastCall:
    """The last hit's arguments, as ``LastCall.matches`` compares them (NOTE [The hit path])."""

    __slots__ = ("autocast", "checks", "grad_enabled", "head", "mode", "positional", "signature", "tree")

    def __init__(self, tree: Any, checks: list[tuple[Any, ...]], signature: Any, head: Any) -> None:
        self.tree = tree
        # The number of leaves if they were the positional arguments themselves (no kwargs, no containers), else -1.
        self.positional = len(checks) if tree == jax.tree_util.tree_structure(((0,) * len(checks), {})) else -1
        # Per leaf: (0, type, aval, sharding, known) for an array, (1, ...) the same for a Tensor holding
        # one (no history, hooks or .grad), (2, type, value) for a static value; ``known`` maps ids to
        # the shardings found equal to ``sharding`` (held, so the ids stay theirs).
        self.checks = checks
        self.signature = signature
        self.mode = signature[3]
        self.grad_enabled = self.mode[0]
        # The autocast state seen: a new immutable mapping each time autocast is entered or left.
        self.autocast = AUTOCAST.get()
        self.head = head

    @staticmethod
    def of(leaves: list[Any], tree: Any, signature: Any, head: Any) -> LastCall | None:
        """The record of a call that hit ``head`` with ``signature``; ``None`` if a leaf cannot be compared quickly."""
        checks: list[tuple[Any, ...]] = []
        for leaf in leaves:
            if isinstance(leaf, Tensor):
                a = leaf._array
                if not (isinstance(a, jax.Array) and plain_argument(leaf)):
                    return None
                checks.append((1, type(a), a.aval, a.sharding, {id(a.sharding): a.sharding}))
            elif isinstance(leaf, jax.Array):
                checks.append((0, type(leaf), leaf.aval, leaf.sharding, {id(leaf.sharding): leaf.sharding}))
            elif isinstance(leaf, np.ndarray):
                return None
            else:
                checks.append((2, type(leaf), leaf))
        return LastCall(tree, checks, signature, head)

    def matches(self, leaves: list[Any]) -> bool:
        """Whether a call with ``leaves`` (of the recorded tree) has the recorded signature.

        Each leaf's type is compared first, so the positional arguments themselves,
        unflattened, match only where they were the leaves (a container is never a leaf).
        """
        tensors = 0
        for leaf, check in zip(leaves, self.checks, strict=True):
            kind = check[0]
            if kind == 2:
                if type(leaf) is not check[1] or not (leaf is check[2] or leaf == check[2]):
                    return False
                continue
            if kind == 1:
                if not isinstance(leaf, Tensor) or not plain_argument(leaf):
                    return False
                tensors += 1
                leaf = leaf._array
            if type(leaf) is not check[1] or leaf.aval is not check[2]:
                return False
            sharding = leaf.sharding
            known = check[4]
            if id(sharding) not in known:
                if sharding != check[3]:
                    return False
                if len(known) == _KNOWN_SHARDINGS:
                    known.clear()
                known[id(sharding)] = sharding
        if tensors > 1 and aliases(leaves) != self.signature[2]:
            return False
        if is_grad_enabled() is self.grad_enabled and AUTOCAST.get() is self.autocast:
            return True
        return (is_grad_enabled(), autocast_key()) == self.mode


#: Shardings kept per argument as found equal to its signature's (batches placed one by one each bring their own).
_KNOWN_SHARDINGS = 16


def same_shape(guard: list[Any], aval: Any) -> bool:
    """Whether ``aval`` has the guard's shape and dtype; if so it is the one compared by identity next time (JAX interns avals)."""
    if aval.shape != guard[2] or aval.dtype != guard[3]:
        return False
    guard[1] = aval
    return True


def plain_argument(t: Tensor) -> bool:
    """A Tensor argument whose guard part of its key (``leaf_key``) is the plain one: compared without building it."""
    return t.grad_fn is None and not t._requires_grad and t._grad is None and not leaf_has_hooks(t)


# NOTE [Param groups in a compiled step]
# An optimizer's parameter group is a dict of plain Python that eager reads at every
# call. Its numeric entries reach the update as one packed Tensor, a program input
# (NOTE [PyTorch optimizers]); the rest is frozen where the trace reads it: an entry the
# step's own code reads (``loss * g["lr"]``, ``if g["nesterov"]``) and the update's code
# choices. So the group reports them (``StepTrace.entry_read``) and they become guards of
# the program (``Entry.entry_reads``), compared at every call: an entry by identity, or
# by value for a number, a string or a tuple of numbers; the choices by the one number
# that counts their changes (``options_version``). The step's code may read through any
# of dict's read paths: ``[]``, ``get``, ``setdefault``, ``pop``, ``values()``,
# ``items()`` report the entries they read, and ``in``, ``len``, iteration, ``keys()``
# (and a key read absent) which keys the group has, which ``options_version`` counts too
# (a key added or removed); ``**g``, ``dict(g)``, ``g.copy()`` and ``|`` read through
# ``keys`` and ``[]`` (the group defines ``__iter__``), ``copy.copy`` and ``pickle``
# through ``__reduce__``. Not seen: ``==`` and ``repr``, read in C. The update's choices
# are its options (static arguments: ``nesterov``, ``amsgrad``, ``centered``) and the
# sign of an entry that decides which state exists (SGD's and RMSprop's ``momentum``,
# ``Optimizer._signed_hyper``); a step traced again for one makes the state it calls
# for as eager does, outside the trace (the program's state, not a constant of it). A
# change traces the step again (NOTE [Entries of one signature]). xgrad's own reads add
# none: the update's go through the packed Tensor and a scheduler stepped in the step
# reads and sets the rate on the host (its writes change no option). An entry read
# after the step set it is the step's own value, not a guard. What the step sets to an
# entry that is no Tensor (``g["lr"] = g["lr"] * 0.5``) is undone when the trace ends, so
# a second trace of the call starts from the same group, and set again after every call
# (``Entry.entry_writes``; before a host effect that follows, for a scheduler stepped in
# the program to read), so the dict holds what eager leaves, and a choice it changed is
# counted (the next call traces for it); the packed Tensor gets the traced op's value as
# any state does. A Tensor set stays as the trace left it.


_BY_VALUE = (int, float, complex, str, type(None))


def _same_entry(found: Any, value: Any) -> bool:
    if found is value:
        return True
    if type(found) is not type(value):
        return False
    if type(value) is tuple:
        return len(found) == len(value) and all(_same_entry(a, b) for a, b in zip(found, value, strict=True))
    return type(value) in _BY_VALUE and bool(found == value)


class GroupEntries:
    """The parameter-group entries a trace read and set (NOTE [Param groups in a compiled step])."""

    __slots__ = ("before", "reads", "set_in_trace", "writes")

    def __init__(self) -> None:
        # id(group) -> (group, its entries and ``options_version`` before the trace set one)
        self.before: dict[int, tuple[Any, dict[str, Any], int]] = {}
        self.reads: dict[tuple[int, str | None], tuple[Any, str | None, Any]] = {}
        self.set_in_trace: dict[tuple[int, str], tuple[Any, str]] = {}  # the entries the trace set: undone at its end
        self.writes: dict[tuple[int, str], tuple[Any, str, Any]] = {}  # the last value set since the last ``flush``

    def read(self, group: Any, key: str | None, value: Any) -> None:
        where = (id(group), key)
        if where in self.reads or where in self.set_in_trace:
            return
        if key is None and id(group) in self.before:  # the options as they were before the trace set one
            value = self.before[id(group)][2]
        self.reads[where] = (group, key, value)

    def written(self, group: Any, key: str, value: Any) -> None:
        if id(group) not in self.before:
            self.before[id(group)] = (group, dict(group), group.options_version)
        if isinstance(value, Tensor):  # stays as the trace leaves it
            self.writes.pop((id(group), key), None)
            self.set_in_trace.pop((id(group), key), None)
            return
        self.writes[(id(group), key)] = (group, key, value)
        self.set_in_trace[(id(group), key)] = (group, key)

    def flush(self) -> list[tuple[Any, str, Any]]:
        """The entries set since the last flush, to set at this point of every call (before a host effect that may read
        them, then after the call), forgotten."""
        writes = list(self.writes.values())
        self.writes.clear()
        return writes

    def restore(self) -> None:
        """Give the groups the entries the trace set, and their ``options_version``, from before it."""
        for group, key in self.set_in_trace.values():
            _, entries, version = self.before[id(group)]
            if key in entries:
                dict.__setitem__(group, key, entries[key])
            else:
                dict.pop(group, key, None)
            group.options_version = version


def set_entries(writes: list[tuple[Any, str, Any]]) -> None:
    """Set again what a trace set in parameter groups (``GroupEntries.flush``): the dict entries, a changed option
    counted; the packed hyperparameters are the program's to write."""
    for group, key, value in writes:
        group.set_entry(key, value)


def entries_hold(reads: list[tuple[Any, str | None, Any]]) -> bool:
    """Whether the group entries a program read hold what they held then (``Entry.entry_reads``)."""
    for group, key, value in reads:
        if key is None:
            if group.options_version != value:
                return False
        elif not _same_entry(dict.get(group, key, _ABSENT), value):
            return False
    return True


_ABSENT = object()
