"""The dispatch seam: how ``bind`` runs a primitive's forward in this context (NOTE [Dispatch seam])."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

__all__ = ["DISPATCH", "dispatching_through"]

# NOTE [Dispatch seam]
# ``bind`` runs a primitive's forward through ``Primitive.dispatch``, unless this context
# dispatches through a function of its own (``dispatching_through``): ``xgrad.compile``'s
# observer hooks learn the ops a hook runs on its gradients and, on later calls, find
# their results among the program's outputs instead of dispatching them (NOTE [Hook ops
# in the program] in ``xgrad/compile_step/hook_ops.py``). Eagerly it is one context-variable read.
DISPATCH: ContextVar[Callable[[Any, list[Any], dict[str, Any]], Any] | None] = ContextVar(
    "xgrad_dispatch", default=None
)


@contextlib.contextmanager
def dispatching_through(dispatch: Callable[[Any, list[Any], dict[str, Any]], Any]) -> Iterator[None]:
    """Run the forwards ``bind`` dispatches in the body as ``dispatch(prim, arrays, params)`` (NOTE [Dispatch seam])."""
    token = DISPATCH.set(dispatch)
    try:
        yield
    finally:
        DISPATCH.reset(token)
