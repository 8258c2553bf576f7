"""The dispatch seam: how ``bind`` runs a primitive's forward in this context (NOTE [Dispatch seam])."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

__all__ = ["DISPATCH", "OP_CALL", "dispatching_through"]

# NOTE [Dispatch seam]
# ``bind`` runs a primitive's forward through ``Primitive.dispatch``, unless this context
# dispatches through a function of its own (``dispatching_through``): ``xgrad.compile``'s
# observer hooks learn the ops a hook runs on its gradients and, on later calls, find
# their results among the program's outputs instead of dispatching them (NOTE [Hook ops
# in the program] in ``xgrad/compile_step/hook_ops.py``). Eagerly it is one context-variable read.
# ``OP_CALL`` is the same seam one level up, for the ops ``autocast_op`` wraps, while
# autocast is off: ``op_call(fn, args, kwargs)`` runs ``fn(*args, **kwargs)``, or hands
# back the result of the very same call served whole (its front-end's checks, ``bind``).
DISPATCH: ContextVar[Callable[[Any, list[Any], dict[str, Any]], Any] | None] = ContextVar(
    "xgrad_dispatch", default=None
)
OP_CALL: ContextVar[Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any] | None] = ContextVar(
    "xgrad_op_call", default=None
)


@contextlib.contextmanager
def dispatching_through(
    dispatch: Callable[[Any, list[Any], dict[str, Any]], Any],
    op_call: Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any] | None = None,
) -> Iterator[None]:
    """Run the forwards ``bind`` dispatches in the body as ``dispatch(prim, arrays, params)`` (NOTE [Dispatch seam]).

    ``op_call``: how the ops ``autocast_op`` wraps are called meanwhile, autocast being off.
    """
    token = DISPATCH.set(dispatch)
    call_token = OP_CALL.set(op_call)
    try:
        yield
    finally:
        OP_CALL.reset(call_token)
        DISPATCH.reset(token)
