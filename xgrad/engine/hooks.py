"""Removable hook handles shared by tensors and nodes."""

from __future__ import annotations

import itertools
import weakref
from typing import Any

__all__ = ["RemovableHandle", "add_hook"]

_next_id = itertools.count()

# Set by ``xgrad.compile`` while it traces a step: ``trace_wrapper(fn, hooks)`` returns
# what to call instead of ``fn`` (a host callback), so hooks see concrete values.
trace_wrapper: Any = None


class RemovableHandle:
    """Returned by every ``register_*``: ``.remove()`` takes the hook out again.

    Removal is safe at any time, also from inside a hook while backward runs: the
    engine iterates over a snapshot of hook ids and skips the ones that are gone.
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


class HookDict(dict):  # type: ignore[type-arg]
    """An insertion-ordered dict of hooks that a weak reference can point at."""

    __slots__ = ("__weakref__",)


def add_hook(hooks: HookDict, fn: Any) -> RemovableHandle:
    """Add ``fn`` (or an ``(input_nr, fn)`` pair, for tensor hooks) and return its handle."""
    hook = fn[1] if isinstance(fn, tuple) else fn
    if not callable(hook):
        raise TypeError(f"hook must be callable, got {type(hook).__name__}")
    handle = RemovableHandle(hooks)
    hooks[handle.id] = fn
    return handle


def run_in_order(hooks: HookDict | None):  # type: ignore[no-untyped-def]
    """Yield the hooks registered now, skipping any removed while iterating."""
    if not hooks:
        return
    wrap = trace_wrapper
    for key in tuple(hooks):
        fn = hooks.get(key)
        if fn is not None:
            yield fn if wrap is None else wrap(fn, hooks)
