"""Which hooks of a traced step are traced into its program, and which run on the host (NOTE [Hooks traced in]).

# NOTE [Hooks traced in]
# A hook run as an ordered host call costs ~170 us a call and takes the program off JAX's
# fast dispatch, which costs a small step more than its whole program; torch.compile's
# compiled autograd inlines hooks instead. Under ``xgrad.compile`` a hook marked neither
# ``pure_hook`` (traced in) nor ``host_hook`` (on the host) is traced in when it touches
# no Python state outside its arguments, decided where the step calls it, while tracing:
#
# 1. Its code, and that of the user functions it reaches (through its globals, closure
#    cells, defaults, a bound ``self``, the objects and containers among those: NOTE [What
#    a function reaches]), has no
#    store or delete of a global, an attribute or an outer function's variable, and no
#    name of ``_EFFECT_NAMES`` (``print``, ``.item()``, ``list.append``, logging, I/O,
#    clocks, ``random``, JAX callbacks, registering hooks). A callable that is not Python
#    code (a builtin, an extension's object) runs on the host. A module's full backward
#    hook is classified by the user hooks it calls.
# 2. What it reaches is read: the global, closure, attribute and default values its code
#    names, and the items of lists, dicts, sets and tuples among them. The hook is then
#    called on the traced arguments. If it raises (a tracer made concrete: ``bool(g > 0)``,
#    ``float(g)``, ``np.asarray(g)``; the user's own error), if a post-accumulate-grad hook
#    returns a value, or if one of those values changed (by identity), what the call did
#    is undone (the values, the state tensors, the trace's records of checks, prints,
#    effects and hooks) and the hook runs on the host at every call, as before.
# 3. Those values are guards of the program (``Entry.hook_reads``), compared by identity
#    at every call: a hook that read ``SCALE`` while it was 2.0 is traced again once
#    ``SCALE`` is rebound, so what it computes is always eager's. A value rebound at every
#    call (a global step counter) then retraces at every call: mark such a hook ``host_hook``.
#
# Library code (``reach.LIBRARIES``: xgrad, JAX, NumPy, math, Equinox, Optax, ...)
# that a hook calls is traced as any op of the step is (a random draw threads the
# generator's state through the program); its modules, classes and functions are not read
# as the hook's state, but its objects are (an optimizer's ``param_groups``, a module's
# attributes and children), except JAX's and NumPy's own and per-thread state. A NumPy
# array the hook reaches can change in place unseen by an identity guard, and so can an
# attribute held in ``__slots__``: the hook runs on the host.
#
# Under a plain JAX transformation (NOTE [Hooks under jax.jit] in ``jax_hooks.py``) the same
# screen and trial decide, with no guards to keep: a hook reading a value that can be
# rebound or changed in place (a number, a string, ``None``, a list's or dict's items) runs
# on the host there (``trace_in`` given no recorder).
"""

from __future__ import annotations

import dis
import functools
import logging
import threading
import types
from collections.abc import Collection, Iterator
from typing import Any

import jax
import numpy as np

from xgrad.compile_step.recording import Snapshot
from xgrad.reach import CONTAINERS, MISSING, container_items, from_library, held, nested_codes, unbound
from xgrad.tensor import Tensor, is_tensor

# Names whose use is an effect a trace cannot repeat (NOTE [Hooks traced in], 1).
_EFFECT_NAMES = frozenset({
    "print", "input", "open", "exec", "eval", "globals", "locals", "vars", "setattr", "delattr", "next", "send",
    "item", "tolist", "numpy", "block_until_ready", "device_get",
    "append", "extend", "insert", "pop", "popleft", "popitem", "appendleft", "extendleft", "setdefault", "update",
    "discard", "remove", "clear", "write", "writelines", "flush", "put", "put_nowait",
    "debug", "info", "warning", "warn", "exception", "critical", "logger", "logging",
    "time", "perf_counter", "monotonic", "process_time", "sleep", "random", "seed", "environ", "getenv",
    "callback", "io_callback", "pure_callback", "queue_callback", "register_hook", "register_prehook",
    "register_post_accumulate_grad_hook", "retain_grad", "backward",
})
# What each instruction that writes Python state outliving the call writes (``writes``).
_WRITES = {
    "STORE_GLOBAL": "global", "DELETE_GLOBAL": "global", "STORE_DEREF": "closed-over", "DELETE_DEREF": "closed-over",
    "STORE_ATTR": "attribute", "DELETE_ATTR": "attribute", "STORE_NAME": "name", "DELETE_NAME": "name",
}
# Values a name or attribute may be rebound to between calls (``_changeable``), and the immutable values a hook reads.
_REBINDABLE = (type(None), bool, int, float, complex, str, bytes, np.generic)
_SCALARS = (*_REBINDABLE, range, slice, type(Ellipsis), jax.Array, types.BuiltinFunctionType)
_MAX_ITEMS = 64  # a larger container read by a hook keeps it on the host: its guard would cost every call
_MAX_DEPTH = 4  # how far from the hook objects and functions are followed

logger = logging.getLogger(__name__)


class Impure(Exception):
    """The hook does something a trace cannot repeat: it runs on the host."""


def _array_library(obj: Any) -> bool:
    return type(obj).__module__.partition(".")[0] in ("jax", "jaxlib", "numpy")


def writes(code: types.CodeType, outer: Collection[str]) -> Iterator[tuple[dis.Instruction, str]]:
    """The instructions of ``code`` that write Python state outliving its call, each with what it writes: a
    ``"global"``, a ``"closed-over"`` name (among ``outer``), an ``"attribute"`` or a ``"name"`` of a namespace."""
    for ins in dis.get_instructions(code):
        kind = _WRITES.get(ins.opname)
        if kind is not None and (kind != "closed-over" or ins.argval in outer):
            yield ins, kind


class Reads:
    """The Python state one hook reaches (NOTE [Hooks traced in], 2 and 3): guards to compare, and to restore from."""

    __slots__ = ("guards", "names", "_seen")

    def __init__(self) -> None:
        # (namespace dict, key, value), (cell, None, value) or (container, None, its items)
        self.guards: list[tuple[Any, Any, Any]] = []
        self.names: set[str] = set()
        self._seen: set[int] = set()

    def hook(self, fn: Any, args: tuple[Any, ...]) -> None:
        """Read what ``fn``, called on ``args``, reaches; raise ``Impure`` if its code has effects."""
        from xgrad.nn.hooks import BackwardHook

        owner = getattr(fn, "__self__", None)
        if isinstance(owner, BackwardHook):  # a module's full backward hooks: the user's hooks it calls
            for user_hook in (*owner.user_hooks, *owner.user_pre_hooks):
                self._callable(user_hook, 0, top=True)
            self._value(owner.module, 1)
        else:
            self._callable(fn, 0, top=True)
        for arg in jax.tree_util.tree_leaves(args, is_leaf=is_tensor):
            self._value(arg, 1)

    def _callable(self, fn: Any, depth: int, top: bool = False) -> None:
        from xgrad.autograd.compiled import HostHook, PureHook

        if isinstance(fn, HostHook):  # inside a module's hooks: the mark holds there too
            raise Impure(f"{fn!r} is marked host_hook")
        if isinstance(fn, PureHook):
            return
        func, bound = unbound(fn)
        if func is not fn:  # a partial's arguments, a bound method's self
            self._callable(func, depth, top)
            for value in bound:
                self._value(value, depth + 1)
        elif isinstance(fn, types.FunctionType):
            if top or not from_library(fn):
                self._function(fn, depth)
        elif isinstance(fn, (type, types.BuiltinFunctionType, types.BuiltinMethodType)) or (not top and from_library(fn)):
            return  # a constructor, a builtin, or library code: traced as the step's ops are
        else:
            call = next((vars(c)["__call__"] for c in type(fn).__mro__ if "__call__" in vars(c)), None)
            if not isinstance(call, types.FunctionType):
                raise Impure(f"{fn!r} is not Python code")
            self._function(call, depth)
            self._value(fn, depth + 1)

    def _function(self, fn: types.FunctionType, depth: int) -> None:
        if id(fn) in self._seen:
            return
        self._seen.add(id(fn))
        outer = set(fn.__code__.co_freevars)
        for code in nested_codes(fn.__code__):
            for ins, _ in writes(code, outer):
                raise Impure(f"{fn.__qualname__} changes {ins.argval!r} ({ins.opname})")
            effects = _EFFECT_NAMES.intersection(code.co_names)
            if effects:
                raise Impure(f"{fn.__qualname__} uses {sorted(effects)[0]!r}")
            self.names.update(code.co_names)
            # An attribute read by its name as a string (``getattr(cfg, "scale")``) is read too.
            self.names.update(c for c in code.co_consts if isinstance(c, str) and c.isidentifier())
        for where, key, value in held(fn):  # its closure cells and the globals it names are guarded, defaults not
            if where is not None:
                self.guards.append((where, key, value))
            self._value(value, depth + 1)

    def _entry(self, namespace: Any, key: str, depth: int) -> None:
        value = namespace.get(key, MISSING)
        self.guards.append((namespace, key, value))
        self._value(value, depth)

    def _value(self, value: Any, depth: int) -> None:
        if isinstance(value, (_SCALARS, Tensor)) or value is MISSING or id(value) in self._seen:
            return  # immutable, or state the step itself reads and writes back
        if depth > _MAX_DEPTH:
            raise Impure(f"it reaches state deeper than {_MAX_DEPTH} levels")
        if isinstance(value, np.ndarray):
            raise Impure("it reads a NumPy array, which can change in place")
        if isinstance(value, (types.FunctionType, types.MethodType, functools.partial)):
            self._callable(value, depth)
            return
        if isinstance(value, (staticmethod, classmethod, property)):  # reading a property reads what its getter does
            func = value.fget if isinstance(value, property) else value.__func__
            if func is not None:
                self._callable(func, depth)
            return
        self._seen.add(id(value))
        if isinstance(value, CONTAINERS):
            if len(value) > _MAX_ITEMS:
                raise Impure(f"it reads a {type(value).__name__} of {len(value)} items")
            items = container_items(value)
            if not isinstance(value, (tuple, frozenset)):
                self.guards.append((value, None, items))
            for item in items:
                self._value(item, depth + 1)
            return
        if from_library(value) and (isinstance(value, (types.ModuleType, type)) or _array_library(value)):
            return  # library code, or an array library's own object
        if isinstance(value, threading.local):
            return  # per-thread bookkeeping (the running backward's task): what a trace sees of it is not the call's
        self._attributes(value, depth)

    def _attributes(self, value: Any, depth: int) -> None:
        """The attributes of ``value`` that the code names, set or not (one set later shadows its class's): its
        classes' first, whose properties add the names their getters read, then its own."""
        from xgrad.nn import Module

        classes = [] if isinstance(value, type) else [c for c in type(value).__mro__ if not from_library(c)]
        slots = {name for c in classes for name in getattr(c, "__slots__", ())}
        if slots & self.names:
            raise Impure(f"it reads {sorted(slots & self.names)[0]!r}, held in __slots__ where no guard sees it change")
        if not hasattr(value, "__dict__") and not classes:
            raise Impure(f"it reads a {type(value).__name__}, whose state no guard sees change")
        # A module's children are attributes too, found through its ``_modules`` (its parameters and buffers
        # are tensors: state the step reads).
        children = value.__dict__.get("_modules") if isinstance(value, Module) else None
        for namespace in (*map(vars, classes), getattr(value, "__dict__", None), children):
            if namespace is not None:
                for name in sorted(self.names):
                    self._entry(namespace, name, depth + 1)

    def changed(self) -> list[tuple[Any, Any, Any]]:
        """The guards that no longer hold."""
        return [g for g in self.guards if not _holds(g)]

    @staticmethod
    def restore(changed: list[tuple[Any, Any, Any]]) -> None:
        """Give what a hook's trial changed its values from before it."""
        for target, key, value in changed:
            if isinstance(target, types.MappingProxyType):
                continue  # a class's namespace: nothing but setattr, which no traced-in hook uses, changes it
            if key is not None:
                if value is MISSING:
                    target.pop(key, None)
                else:
                    target[key] = value
            elif isinstance(target, types.CellType):
                target.cell_contents = value
            else:
                target.clear()
                if isinstance(target, dict):
                    target.update(zip(value[::2], value[1::2], strict=True))
                elif isinstance(target, set):
                    target.update(value)
                else:
                    target.extend(value)


def _holds(guard: tuple[Any, Any, Any]) -> bool:
    target, key, value = guard
    if key is not None:
        return target.get(key, MISSING) is value
    if isinstance(target, types.CellType):
        try:
            return target.cell_contents is value
        except ValueError:
            return value is MISSING
    found = container_items(target)
    return len(found) == len(value) and all(a is b for a, b in zip(found, value, strict=True))


def reads_hold(guards: list[tuple[Any, Any, Any]]) -> bool:
    """Whether every value the traced-in hooks of a program read is the one they read (``Entry.hook_reads``)."""
    return all(_holds(g) for g in guards)


# What a trace records that a hook's trial may add to, and an undone trial takes back.
_RECORDS = ("checks", "host_checks", "added_hooks", "printed", "prints", "effects", "observers")


def _changeable(guard: tuple[Any, Any, Any]) -> bool:
    """Whether a value a hook read is state a program that cannot check it would keep stale: a number, a string or
    ``None`` a name or attribute holds (``SCALE``, ``cfg.scale``), or the items of a list, dict or set."""
    target, key, value = guard
    if key is None and not isinstance(target, types.CellType):
        return True
    return isinstance(value, _REBINDABLE)


def trace_in(rec: Any, fn: Any, args: tuple[Any, ...], post_accumulate: bool = False) -> tuple[bool, Any]:
    """Call ``fn`` on the traced ``args`` if it may be traced in (NOTE [Hooks traced in]): ``(True, its result)``;
    else ``(False, None)``, nothing of the call left behind, for the caller to run it on the host. ``rec``: the
    step's recorder, whose guards keep what a traced-in hook read, or ``None`` under a plain JAX transformation."""
    reads = _screened(rec, fn, args)
    if reads is None:
        return False, None
    tensors = [t for t in jax.tree_util.tree_leaves(args, is_leaf=is_tensor) if isinstance(t, Tensor)]
    if rec is not None:
        lengths = [len(getattr(rec, name)) for name in _RECORDS]
        tensors += [t for t in (snap.ref() for snap in rec.snapshots.values()) if t is not None]
        snapshotted = set(rec.snapshots)
    before = [Snapshot(t) for t in tensors]
    try:
        result = fn(*args)
        why = "it returned a value" if post_accumulate and result is not None else None  # eager's error, on the host
    except Exception as exc:  # a tracer made concrete, or the user's error: the host call raises it again
        why, result = f"{type(exc).__name__}: {exc}", None
    changed = reads.changed()
    if changed:
        why = "it changed Python state it reads"
    if why is None:
        if rec is not None:
            rec.hook_reads.extend(reads.guards)
        return True, result
    logger.debug("hook %r runs on the host: %s", fn, why)
    Reads.restore(changed)
    if rec is not None:
        _undo_records(rec, lengths, snapshotted)
    for t, snap in zip(tensors, before, strict=True):
        snap.restore(t)
    return False, None


def _screened(rec: Any, fn: Any, args: tuple[Any, ...]) -> Reads | None:
    """What ``fn`` reads, or ``None`` (logged) when its code rules out tracing it in."""
    try:
        reads = Reads()
        reads.hook(fn, args)
        read = None if rec is not None else next((g for g in reads.guards if _changeable(g)), None)
        if read is not None:
            raise Impure(f"it reads {read[1] or read[2]!r}, which a plain JAX trace cannot check")
    except Impure as exc:
        logger.debug("hook %r runs on the host: %s", fn, exc)
        return None
    return reads


def _undo_records(rec: Any, lengths: list[int], snapshotted: set[Any]) -> None:
    """Drop what a trial call added to the step's records, and give back the tensors it snapshotted first."""
    for name, n in zip(_RECORDS, lengths, strict=True):
        del getattr(rec, name)[n:]
    for key, snap in rec.snapshots.items():
        t = snap.ref()
        if key not in snapshotted and t is not None:
            snap.restore(t)
