"""Removable hook handles shared by tensors and nodes."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable
from typing import Any, Self

from xgrad import step_trace
from xgrad.tensor.hook_kinds import HookKind

__all__ = ["RemovableHandle", "add_hook"]

_next_id = itertools.count()


class RemovableHandle:
    """Returned by every ``register_*``: ``.remove()`` takes the hook out again.

    Removal is safe at any time, also from inside a hook while backward runs: the
    engine runs a snapshot of the hooks taken before calling the first of them, so a
    hook removed by an earlier one still runs in that pass (PyTorch's semantics), and
    not in later ones.
    """

    __slots__ = ("_hooks_ref", "id")

    def __init__(self, hooks: dict[int, Any]) -> None:
        self.id = next(_next_id)
        self._hooks_ref = weakref.ref(hooks)

    def remove(self) -> None:
        hooks = self._hooks_ref()
        if hooks is not None:
            hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


#: Each ``HookDict``'s ``version`` is the next of these: no two states of any two dicts share one.
_versions = itertools.count()


class HookDict(dict):  # type: ignore[type-arg]
    """An insertion-ordered dict of hooks of one ``kind`` (NOTE [Hook kinds]) that a weak reference can point at.

    A route given the dict (a step being traced wraps each hook it runs) reads from
    ``kind`` what the hook's result means. ``version`` changes with every change of its
    keys, to a number no other dict or state of one had: a dict whose version is one seen
    before holds the hooks it held then (a compiled step's guard compares it, not the keys).
    """

    __slots__ = ("__weakref__", "kind", "version")

    def __init__(self, kind: HookKind, items: Iterable[tuple[int, Any]] = ()) -> None:
        super().__init__(items)
        self.kind = kind
        self.version = next(_versions)

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy (or an unpickled one, from another process's count) takes a version of its own.
        return type(self), (self.kind, list(self.items()))

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.version = next(_versions)

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        self.version = next(_versions)

    def __ior__(self, other: Any) -> Self:  # type: ignore[misc]  # as typeshed's own dict.__ior__ (wider than __or__)
        self.update(other)
        return self

    def pop(self, *args: Any) -> Any:
        self.version = next(_versions)  # before: a missing key without a default raises
        return super().pop(*args)

    def popitem(self) -> Any:
        self.version = next(_versions)
        return super().popitem()

    def clear(self) -> None:
        super().clear()
        self.version = next(_versions)

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self.version = next(_versions)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self.version = next(_versions)
        return super().setdefault(key, default)


def add_hook(hooks: HookDict, fn: Any, owner: Any) -> RemovableHandle:
    """Add ``fn`` (or an ``(input_nr, fn)`` pair, for tensor hooks) to ``owner``'s ``hooks``; return its handle.

    ``owner`` is the tensor or node the hooks belong to: a step being traced learns of
    each hook added (NOTE [The step-trace seam]), so one added inside the step to a
    tensor that outlives it is found.
    """
    hook = fn[1] if isinstance(fn, tuple) else fn
    if not callable(hook):
        raise TypeError(f"hook must be callable, got {type(hook).__name__}")
    handle = RemovableHandle(hooks)
    hooks[handle.id] = fn
    trace = step_trace.current()
    if trace is not None:
        trace.hook_added(hooks, handle, owner)
    return handle


def run_in_order(hooks: HookDict | None) -> tuple[Any, ...]:
    """The hooks registered now, in registration order: a snapshot, as PyTorch takes.

    A hook removed (by itself or by another hook) while the snapshot is being run
    still runs in that pass; one registered meanwhile waits for the next pass.
    While ``xgrad.compile`` traces a step, each comes as the step calls it (a host
    callback; NOTE [The step-trace seam]); on a plain JAX transformation's tracers, as
    NOTE [Hooks under a plain JAX transformation] in ``step_trace`` says.
    """
    if not hooks:
        return ()
    trace = step_trace.current()
    if trace is None:
        return tuple(map(step_trace.on_plain_jax, hooks.values()))
    return tuple(trace.wrap_hook(fn, hooks) for fn in hooks.values())
