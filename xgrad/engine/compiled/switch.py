"""The switch that turns compiled backwards on, the ``pure_hook`` mark, and what a refusal raises or warns."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax

ERR_FALLBACK = "compiled backward cannot run this graph: {reason}. Use fallback='eager' to run such graphs eagerly."
WARN_FALLBACK = "compiled backward fell back to eager: {reason}. (Warned once per reason.)"
WARN_RECOMPILE = (
    "compiled backward recompiled {count} times at {site}; the last change: {reason}. Keep shapes, dtypes, hooks "
    "and leaves fixed between steps, or pad inputs to a few sizes."
)


class CompiledFallbackWarning(UserWarning):
    """A backward asked to run compiled ran eagerly instead (the message says why).

    >>> from xgrad.autograd.compiled import CompiledFallbackWarning
    >>> issubclass(CompiledFallbackWarning, UserWarning)
    True
    """


class RecompileWarning(UserWarning):
    """One call site (a compiled backward, or an ``xgrad.compile`` function) keeps compiling new programs.

    >>> from xgrad.autograd.compiled import RecompileWarning
    >>> issubclass(RecompileWarning, UserWarning)
    True
    """


class CompiledFallbackError(RuntimeError):
    """Under ``enable(fallback="error")``: the backward cannot be compiled.

    >>> from xgrad.autograd.compiled import CompiledFallbackError
    >>> issubclass(CompiledFallbackError, RuntimeError)
    True
    """


class NotTraceable(Exception):
    """Raised while walking or tracing: this graph must run eagerly (the text says why)."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.kind = kind


TRACER_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.NonConcreteBooleanIndexError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.UnexpectedTracerError,
)


# -- the switch ----------------------------------------------------------------------


class _CompiledState(threading.local):
    enabled = False
    fallback = "eager"
    tracing = False
    depth = 0  # compiled backwards running on this thread (NOTE [Nested compiled backwards])


state = _CompiledState()


def is_enabled() -> bool:
    """Whether ``backward``/``grad`` run compiled on this thread by default.

    >>> import xgrad
    >>> xgrad.autograd.compiled.is_enabled()
    False
    """
    return state.enabled


def set_enabled(enabled: bool) -> None:
    """Make ``backward``/``grad`` run compiled (``True``) or eagerly (``False``) on this thread.

    >>> import xgrad
    >>> xgrad.autograd.compiled.set_enabled(True); xgrad.autograd.compiled.is_enabled()
    True
    >>> xgrad.autograd.compiled.set_enabled(False)
    """
    state.enabled = bool(enabled)


class enable:
    """Context manager: backwards inside it run compiled on this thread.

    Args:
        fallback: ``"eager"`` (default) runs what cannot be compiled eagerly, with a
            one-time ``CompiledFallbackWarning``; ``"error"`` raises
            ``CompiledFallbackError`` instead.

    Which Python runs on a cache hit: see ``pure_hook``.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> with xgrad.autograd.compiled.enable(fallback="error"):
    ...     (x * x).sum().backward()
    >>> x.grad.tolist()
    [2.0, 4.0]
    """

    def __init__(self, fallback: str = "eager") -> None:
        if fallback not in ("eager", "error"):
            raise ValueError(f"fallback must be 'eager' or 'error', got {fallback!r}")
        self.fallback = fallback

    def __enter__(self) -> enable:
        self.prev = (state.enabled, state.fallback)
        state.enabled, state.fallback = True, self.fallback
        return self

    def __exit__(self, *exc: object) -> None:
        state.enabled, state.fallback = self.prev


class _MarkedHook:
    """A hook wrapped in a mark that says where it runs; programs are keyed by it, so marking the same function
    again must not recompile (equal, same hash).

    >>> from xgrad.autograd.compiled import HostHook, PureHook, host_hook, pure_hook
    >>> def double(g):
    ...     return g * 2
    >>> isinstance(pure_hook(double), PureHook), pure_hook(double) == pure_hook(double)
    (True, True)
    >>> isinstance(host_hook(double), HostHook), host_hook(double) == host_hook(double)
    (True, True)
    """

    __slots__ = ("__wrapped__", "fn")
    mark = ""  # the function that makes it

    def __init__(self, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise TypeError(f"{self.mark} expects a callable, got {type(fn).__name__}")
        self.fn = fn
        self.__wrapped__ = fn  # inspect.signature (hook arity checks) sees the function's own

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.fn is self.fn  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self.fn)

    def __repr__(self) -> str:
        return f"{self.mark}({self.fn!r})"


class PureHook(_MarkedHook):
    """A hook marked traceable and free of side effects (see ``pure_hook``)."""

    __slots__ = ()
    mark = "pure_hook"


def pure_hook(fn: Callable[..., Any]) -> PureHook:
    """Mark a hook as JAX-traceable with no side effects, so compiled backwards and ``xgrad.compile`` trace it in.

    Any hook kind can be marked, and so can a custom ``Function.backward`` (decorate
    it below ``@staticmethod``). Eager backwards call it as usual; compiled ones call
    it only while tracing (once per compiled program), on traced values, as under
    ``jax.jit``, like the backward rules of xgrad's ops. Unmarked hooks and Function
    backwards run on the host at their point on every call, as in eager.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> h = x.register_hook(xgrad.autograd.compiled.pure_hook(lambda g: g * 2))
    >>> (x * 3).sum().backward(compiled=True); x.grad.tolist()
    [6.0, 6.0]
    """
    return fn if isinstance(fn, PureHook) else PureHook(fn)


class HostHook(_MarkedHook):
    """A hook marked to run on the host at every call of ``xgrad.compile`` (see ``host_hook``)."""

    __slots__ = ()
    mark = "host_hook"


def host_hook(fn: Callable[..., Any]) -> HostHook:
    """Mark a hook to run on the host, with concrete values, at every call of an ``xgrad.compile`` step.

    The opposite of ``pure_hook``. ``xgrad.compile`` traces an unmarked hook into its
    program when the hook touches no Python state outside its arguments (NOTE [Hooks
    traced in] in ``xgrad/compile_step/hook_purity.py``); mark one whose effects that
    rule cannot see (a C extension's state, a file it reads through a library), or one
    that reads a value rebound at every call. Compiled backwards already run unmarked
    hooks on the host; eager backwards call it as usual.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> h = x.register_hook(xgrad.autograd.compiled.host_hook(lambda g: g * 2))
    >>> (x * 3).sum().backward(); x.grad.tolist()
    [6.0, 6.0]
    """
    if isinstance(fn, PureHook):
        raise TypeError(f"host_hook expects an unmarked hook, got {fn!r}: a hook is either pure or on the host")
    return fn if isinstance(fn, HostHook) else HostHook(fn)
