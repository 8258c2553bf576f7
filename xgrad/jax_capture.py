"""Requires-grad leaves that a plain JAX trace captures as constants.

# NOTE [Captured leaves]
# ``jax.jit(lambda x: model(x))`` closes over the model's parameters: JAX bakes their
# values into the traced program as constants. After an optimizer step the cached
# program still computes with the old values, and neither JAX nor xgrad computes a
# gradient for them there: silently stale. xgrad sees it happen when it records an op
# whose output is a tracer while one of its inputs is a concrete leaf that requires
# grad, and warns once per trace and leaf, naming the leaf and the two fixes. An
# ``xgrad.compile`` step (which lifts such leaves to program state) and the
# ``xgrad.func`` transforms (which run on every call, so nothing goes stale, and treat
# what they are not given as constants, as ``torch.func`` does) stay silent.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import jax

from xgrad import step_trace
from xgrad.jax_internals import get_opaque_trace_state
from xgrad.tensor import Tensor, user_site, user_stacklevel
from xgrad.tensor.parameters import is_parameter, parameter_name

__all__ = ["CapturedLeafWarning", "check_captured_leaves", "quiet_captures"]

WARN_CAPTURED_LEAF = (
    "a JAX transformation (jax.jit, jax.vmap, jax.grad, ...) traced a function that closes over a leaf Tensor that "
    "requires grad ({leaf}){where}. JAX bakes its current value into the trace as a constant: a jitted function "
    "keeps computing with it after an optimizer step, and no gradient reaches it. Pass the module (or the tensor) "
    "to the transformed function as an argument, or use xgrad.compile(fn), which tracks parameters and optimizer "
    "state. If it is meant to be a constant, use tensor.detach() or xgrad.no_grad()."
)


class CapturedLeafWarning(UserWarning):
    """A plain JAX trace captured a leaf that requires grad as a constant (NOTE [Captured leaves])."""


class _State(threading.local):
    def __init__(self) -> None:
        self.quiet = 0
        self.trace: Any = None  # the trace the warned leaves below belong to
        self.warned: set[int] = set()


_state = _State()


class quiet_captures:
    """A context in which captured leaves are intended constants (``xgrad.func``'s transforms)."""

    def __enter__(self) -> None:
        _state.quiet += 1

    def __exit__(self, *exc: object) -> None:
        _state.quiet -= 1


def _describe(t: Tensor) -> str:
    name = parameter_name(t)
    kind = f"the parameter {name}" if name else "a parameter" if is_parameter(t) else "a tensor"
    return f"{kind} of shape {list(t.shape)}, dtype {t.dtype}"


def check_captured_leaves(args: tuple[Any, ...], out: Any) -> None:
    """Warn when ``out`` is traced and one of ``args`` is a concrete leaf that requires grad."""
    if not isinstance(out, jax.core.Tracer) or _state.quiet or step_trace.current() is not None:
        return
    trace = None
    for a in args:
        if (
            isinstance(a, Tensor)
            and a.grad_fn is None
            and a._requires_grad
            and not isinstance(a._array, jax.core.Tracer)
        ):
            if trace is None:
                trace = get_opaque_trace_state(convention="xgrad")
                if _state.trace is None or _state.trace != trace:
                    _state.trace, _state.warned = trace, set()
            if id(a) in _state.warned or getattr(a, "_entered_trace", None) == trace:
                continue  # warned already, or an argument of this trace (``vmap``'s unmapped ones stay concrete)
            _state.warned.add(id(a))
            warnings.warn(
                WARN_CAPTURED_LEAF.format(leaf=_describe(a), where=user_site()),
                CapturedLeafWarning,
                stacklevel=user_stacklevel(),  # attributed to the user's line, as the message says
            )
