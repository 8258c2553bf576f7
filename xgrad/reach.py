"""What a Python function reaches: the values it holds and the code it runs (NOTE [What a function reaches]).

# NOTE [What a function reaches]
# Three pieces ask what a function reads beyond its arguments: ``xgrad.compile``'s hook
# purity (``compile_step/hook_purity.py``: what a hook reads, to trace it in and guard
# it), its host calls (``compile_step/host.py``: the step's tensors a host hook holds, to
# hand them over with their values) and ``xgrad.func``'s cached transforms
# (``func_programs._reached``: the modules and tensors whose arrays a program reads).
# They share what a callable holds (``unbound``, ``held``) and, the last two, one walk of
# it (``reached``); each keeps its own decisions:
#
# - A ``functools.partial`` holds its function and arguments, a bound method its function
#   and ``self``, a builtin bound to an object (``a_list.append``) that object; a Python function its closure cells, its defaults and the globals its code
#   and nested code (lambdas, comprehensions) name, and what ``__wrapped__`` names. A
#   library function (``LIBRARIES``) reads no user state: only its closure (a wrapper's
#   wrapped function) is followed.
# - ``reached`` also follows the keys and items of lists, tuples, dicts, sets and deques
#   (``max_items`` or fewer), and, with ``objects``, an object's attributes (``vars``) and
#   those of its classes that are not library code (its methods, ``__call__``). It stops at
#   ``stop``'s values and ``depth`` steps from the function, and says which values it did
#   not follow (a property, an object with no ``__dict__``), for the user to judge.
# - The hook purity walks on its own terms: the attributes a hook's code names, guards at
#   each read, a depth that rules a hook out (NOTE [Hooks traced in]).
"""

from __future__ import annotations

import collections
import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

import jax

# Packages whose code reads no user state: a function of theirs is library code, not followed
# into what it reads (by the three walks above).
LIBRARIES = frozenset({
    "xgrad", "jax", "jaxlib", "numpy", "math", "cmath", "operator", "functools", "itertools", "builtins", "optax",
    "equinox", "flax", "typing", "collections", "abc", "enum", "dataclasses",
})
MISSING = object()  # an empty cell's value, or a name a namespace lacks
# Values that hold nothing a walk is after: immutable plain values and arrays, classes and modules.
_PLAIN = (type(None), bool, int, float, complex, str, bytes, jax.Array, type, types.ModuleType)
CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)


def from_library(obj: Any) -> bool:
    """Whether ``obj`` (a module, a function, a class, an object of one) is library code (``LIBRARIES``)."""
    module = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
    if not isinstance(module, str):
        module = type(obj).__module__
    return module.partition(".")[0] in LIBRARIES


def nested_codes(code: types.CodeType) -> list[types.CodeType]:
    """``code`` and the code objects nested in it (lambdas, comprehensions, inner functions)."""
    found = [code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found += nested_codes(const)
    return found


def container_items(container: Any) -> tuple[Any, ...]:
    """A container's keys and values (a dict's in turn) or its items, to compare by identity."""
    return tuple(v for pair in container.items() for v in pair) if isinstance(container, dict) else tuple(container)


def unbound(fn: Any) -> tuple[Any, tuple[Any, ...]]:
    """The function a ``functools.partial`` or a bound method calls, and the values bound to it (the arguments,
    ``self``); any other ``fn`` and ``()``."""
    if isinstance(fn, functools.partial):
        return fn.func, (*fn.args, *fn.keywords.values())
    if isinstance(fn, types.MethodType):
        return fn.__func__, (fn.__self__,)
    return fn, ()


def held(fn: types.FunctionType) -> Iterator[tuple[Any, Any, Any]]:
    """The values the Python function ``fn`` reads beyond its arguments, each as where it is read from:
    ``(cell, None, value)`` per closure cell (``MISSING`` when empty), ``(fn.__globals__, name, value)`` per global
    its code or nested code names, ``(None, None, value)`` per default."""
    for cell in fn.__closure__ or ():
        try:
            yield cell, None, cell.cell_contents
        except ValueError:  # not yet bound
            yield cell, None, MISSING
    names = dict.fromkeys(name for code in nested_codes(fn.__code__) for name in code.co_names)
    for name in names:
        if name in fn.__globals__:
            yield fn.__globals__, name, fn.__globals__[name]
    for value in (*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()):
        yield None, None, value


def reached(
    fn: Any, depth: int | None = None, objects: bool = False, max_items: int | None = None,
    stop: Callable[[Any], bool] = lambda _: False,
) -> Iterator[tuple[Any, bool]]:
    """Each value ``fn`` reaches, ``fn`` first, once, with whether what it holds was followed (NOTE [What a function
    reaches]); plain values (numbers, strings, ``None``, arrays, classes, modules, builtins) are passed over.

    ``depth``: how many steps from ``fn`` values are followed (``None``: all);
    ``objects``: whether an object's attributes are; ``max_items``: the largest
    container followed; ``stop``: values yielded but not followed.
    """
    seen: set[int] = set()

    def walk(value: Any, steps: int) -> Iterator[tuple[Any, bool]]:
        if isinstance(value, _PLAIN) or value is MISSING or id(value) in seen:
            return
        seen.add(id(value))
        parts = None if stop(value) or (depth is not None and steps >= depth) else _parts(value, objects, max_items)
        yield value, parts is not None
        for part in parts or ():
            yield from walk(part, steps + 1)

    return walk(fn, 0)


def _parts(value: Any, objects: bool, max_items: int | None) -> list[Any] | None:
    """What ``value`` holds, one step on; ``None`` when a walk does not follow it."""
    func, bound = unbound(value)
    if func is not value:
        return [func, *bound]
    if isinstance(value, types.BuiltinMethodType):  # a builtin (``len``), or one bound to an object (``a_list.append``)
        owner = value.__self__
        return [] if owner is None or isinstance(owner, types.ModuleType) else [owner]
    if isinstance(value, CONTAINERS):
        return None if max_items is not None and len(value) > max_items else list(container_items(value))
    parts = None
    if isinstance(value, types.FunctionType):
        library = from_library(value)
        parts = [v for cell, _, v in held(value) if not library or isinstance(cell, types.CellType)]
    elif objects and hasattr(value, "__dict__"):
        classes = [vars(c) for c in type(value).__mro__ if not from_library(c)]
        parts = [*vars(value).values(), *(v for c in classes for k, v in c.items() if _method_name(k))]
    wrapped = getattr(value, "__wrapped__", None)  # a wrapper's function (``functools.wraps``, ``jax.jit``)
    return parts if wrapped is None else [*(parts or ()), wrapped]


def _method_name(name: str) -> bool:
    """Whether a class attribute of this name is the class's own code (its methods, properties and ``__call__``)."""
    return name == "__call__" or not name.startswith("__")
