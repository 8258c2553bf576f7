"""Thread-local grad mode: ``no_grad``, ``enable_grad``, ``set_grad_enabled``, ``inference_mode``.

Each thread starts with grad mode enabled, as in PyTorch. The engine sets grad mode on
whichever thread runs a node (``create_graph`` decides it), so worker threads never
see the caller's setting by accident.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import jax

from xgrad.jax_internals import get_opaque_trace_state

__all__ = ["enable_grad", "graph_off", "inference_mode", "is_grad_enabled", "no_grad", "set_grad_enabled", "stops_gradients"]

F = TypeVar("F", bound=Callable[..., Any])


# NOTE [Grad mode on JAX's AD]
# Outside JAX, grad mode decides whether ops record xgrad's graph. On JAX's tracers it
# must also decide what JAX's AD sees, or ``jax.grad`` of a function with a ``no_grad``
# block would differentiate through it. So a user's switch (``no_grad``,
# ``inference_mode``, ``set_grad_enabled(False)``) remembers the JAX trace it was
# entered in (``_GradState.stop_trace``), and ops run with grad off on tracers of that
# very trace give their results through ``lax.stop_gradient`` (``bind``): a switch
# entered outside a transformation does not reach into it, as ``torch.func.grad``
# ignores a ``no_grad`` around it. xgrad's own machinery (the engine running a
# backward, ``xgrad.func`` running the user's function) turns recording off with
# ``_GradState.enabled`` alone, which leaves JAX's AD as it is.
_NOT_TRACING = get_opaque_trace_state(convention="xgrad")  # the same in every thread outside any JAX trace


class _GradState(threading.local):
    enabled: bool = True
    inference: bool = False
    stop_trace: Any = None  # the JAX trace in which a user turned grad off, else None
    transform: str | None = None  # the xgrad.func transform whose function runs on this thread, if any


_state = _GradState()


def is_grad_enabled() -> bool:
    """Whether ops on this thread record a backward graph.

    >>> import xgrad
    >>> xgrad.is_grad_enabled()
    True
    """
    return _state.enabled


def is_inference_mode_enabled() -> bool:
    """Whether this thread is inside ``inference_mode()``.

    >>> import xgrad
    >>> with xgrad.inference_mode():
    ...     xgrad.is_inference_mode_enabled()
    True
    """
    return _state.inference


@contextlib.contextmanager
def graph_off(transform: str | None = None) -> Iterator[None]:
    """No graph recorded, and JAX's AD left as it is: for xgrad's own machinery that runs
    user code on JAX's tracers (NOTE [Grad mode on JAX's AD]). ``transform`` names the
    ``xgrad.func`` transform whose function runs (``"grad"`` for the AD ones, ``"vmap"``),
    for the checks on in-place writes (NOTE [In-place writes in xgrad.func])."""
    prev = (_state.enabled, _state.stop_trace, _state.transform)
    _state.enabled, _state.stop_trace, _state.transform = False, None, transform
    try:
        yield
    finally:
        _state.enabled, _state.stop_trace, _state.transform = prev


def stops_gradients(arrays: Any) -> bool:
    """Whether results computed now from ``arrays`` must stop JAX's AD: grad is off by a user's
    switch entered in the very trace these tracers belong to (NOTE [Grad mode on JAX's AD])."""
    stop_trace = _state.stop_trace
    if stop_trace is None or _state.enabled:
        return False
    for a in arrays:
        if isinstance(a, jax.core.Tracer):
            return bool(get_opaque_trace_state(convention="xgrad") == stop_trace)
    return False


def _set_enabled(mode: bool) -> None:
    _state.enabled = mode


class _GradModeContext:
    """Base for the grad-mode switches: a context manager that is also a decorator."""

    _mode: bool

    def __init__(self) -> None:
        self._saved: list[tuple[bool, bool, Any]] = []

    def _swap(self) -> tuple[bool, bool, Any]:
        prev = (_state.enabled, _state.inference, _state.stop_trace)
        _state.enabled = self._mode
        if self._mode:
            _state.stop_trace = None
        else:  # outside any JAX trace there is nothing to stop: None spares ``bind`` the check
            trace = get_opaque_trace_state(convention="xgrad")
            _state.stop_trace = None if trace == _NOT_TRACING else trace
        return prev

    @staticmethod
    def _restore(prev: tuple[bool, bool, Any]) -> None:
        _state.enabled, _state.inference, _state.stop_trace = prev

    def __enter__(self) -> None:
        self._saved.append(self._swap())

    def __exit__(self, *exc: object) -> None:
        self._restore(self._saved.pop())

    def _run(self, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        prev = self._swap()
        try:
            return step(*args, **kwargs)
        finally:
            self._restore(prev)

    def __call__(self, fn: F) -> F:
        if inspect.isgeneratorfunction(fn):
            return self._wrap_generator(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return self._run(fn, *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    def _wrap_generator(self, fn: F) -> F:
        """The mode holds while the generator body runs, not while its caller does."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            gen = self._run(fn, *args, **kwargs)
            try:
                response = self._run(gen.send, None)
                while True:
                    try:
                        request = yield response
                    except GeneratorExit:
                        self._run(gen.close)
                        raise
                    except BaseException as exc:
                        response = self._run(gen.throw, exc)
                    else:
                        response = self._run(gen.send, request)
            except StopIteration as stop:
                return stop.value

        return wrapper  # type: ignore[return-value]


class _NoParamGradModeContext(_GradModeContext):
    """A switch that is also a decorator without parentheses, as PyTorch's: ``@no_grad``
    means ``@no_grad()``."""

    def __new__(cls, orig_func: Callable[..., Any] | None = None) -> Any:
        if orig_func is None:
            return super().__new__(cls)
        return cls()(orig_func)

    def __init__(self, orig_func: Callable[..., Any] | None = None) -> None:
        super().__init__()


class no_grad(_NoParamGradModeContext):
    """Context manager and decorator (with or without parentheses) that disables graph recording on this thread.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0], requires_grad=True)
    >>> with xgrad.no_grad():
    ...     y = x * 2
    >>> y.requires_grad
    False
    >>> @xgrad.no_grad
    ... def double(t):
    ...     return t * 2
    >>> double(x).requires_grad
    False
    """

    _mode = False


class enable_grad(_NoParamGradModeContext):
    """Context manager and decorator (with or without parentheses) that enables graph recording on this thread.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0], requires_grad=True)
    >>> with xgrad.no_grad(), xgrad.enable_grad():
    ...     y = x * 2
    >>> y.requires_grad
    True
    >>> @xgrad.enable_grad
    ... def double(t):
    ...     return t * 2
    >>> with xgrad.no_grad():
    ...     double(x).requires_grad
    True
    """

    _mode = True


class set_grad_enabled(_GradModeContext):
    """Set grad mode to ``mode``: takes effect at once, and as a context manager restores it.

    Args:
        mode: ``True`` to record graphs, ``False`` not to.

    >>> import xgrad
    >>> with xgrad.set_grad_enabled(False):
    ...     xgrad.is_grad_enabled()
    False
    """

    def __init__(self, mode: bool) -> None:
        super().__init__()
        self._mode = bool(mode)
        # The switch happens at construction, as PyTorch's does: the first ``with``
        # restores the mode from before it, and a decorator undoes it at once so that
        # only calls of the decorated function see ``mode``.
        self._construction_prev: tuple[bool, bool, Any] | None = self._swap()

    def __enter__(self) -> None:
        if self._construction_prev is None:
            super().__enter__()
        else:
            self._saved.append(self._construction_prev)
            self._construction_prev = None

    def __call__(self, fn: F) -> F:
        if self._construction_prev is not None:
            self._restore(self._construction_prev)
            self._construction_prev = None
        return super().__call__(fn)


# NOTE [Inference tensors]
# As in PyTorch, a tensor made inside ``inference_mode()`` (by a factory or an op) is
# an inference tensor (``Tensor.is_inference()``): it is outside autograd for good. It
# may not be saved for backward ("Inference tensors cannot be saved for backward") nor
# changed in place outside inference mode, and a view of it is another inference
# tensor, not a view. A leaf inference tensor that requires grad still takes part in
# ops that save nothing of it (``c + s``). A view taken inside inference mode of a normal
# tensor is a normal tensor and a view: it requires grad when its base does, with no
# ``grad_fn``, and an in-place op on it outside inference mode raises. In-place ops
# inside inference mode on normal tensors keep them normal.
class inference_mode(_GradModeContext):
    """Like ``no_grad``, and marks the thread as in inference mode (NOTE [Inference tensors]).

    Args:
        mode: ``False`` leaves inference mode and enables grad inside the context (as
            PyTorch's does), and makes the decorator a no-op, for code that toggles it.
            Also a decorator without parentheses: ``@inference_mode``.

    >>> import xgrad
    >>> with xgrad.inference_mode():
    ...     xgrad.is_grad_enabled()
    False
    """

    def __new__(cls, mode: Any = True) -> Any:
        if mode is None or isinstance(mode, bool):
            return super().__new__(cls)
        return cls()(mode)  # ``@inference_mode`` on a function

    def __init__(self, mode: bool = True) -> None:
        super().__init__()
        self._mode = not mode
        self._inference = bool(mode)

    def _swap(self) -> tuple[bool, bool, Any]:
        prev = super()._swap()
        _state.inference = self._inference
        return prev

    def __call__(self, fn: F) -> F:
        return super().__call__(fn) if self._inference else fn
