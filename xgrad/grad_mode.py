"""Thread-local grad mode: ``no_grad``, ``enable_grad``, ``set_grad_enabled``, ``inference_mode``.

Each thread starts with grad mode enabled, as in PyTorch. The engine sets grad mode on
whichever thread runs a node (``create_graph`` decides it), so worker threads never
see the caller's setting by accident.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["enable_grad", "inference_mode", "is_grad_enabled", "no_grad", "set_grad_enabled"]

F = TypeVar("F", bound=Callable[..., Any])


class _GradState(threading.local):
    enabled: bool = True
    inference: bool = False


_state = _GradState()


def is_grad_enabled() -> bool:
    """Whether ops on this thread record a backward graph.

    >>> import xgrad
    >>> xgrad.is_grad_enabled()
    True
    """
    return _state.enabled


def is_inference_mode_enabled() -> bool:
    """Whether this thread is inside ``inference_mode()``."""
    return _state.inference


def _set_enabled(mode: bool) -> None:
    _state.enabled = mode


class _GradModeContext:
    """Base for the grad-mode switches: a context manager that is also a decorator."""

    _mode: bool | None  # None keeps the current mode
    _inference: bool = False

    def __init__(self) -> None:
        self._saved: list[tuple[bool, bool]] = []

    def _swap(self) -> tuple[bool, bool]:
        prev = (_state.enabled, _state.inference)
        if self._mode is not None:
            _state.enabled = self._mode
        _state.inference = self._inference or _state.inference
        return prev

    @staticmethod
    def _restore(prev: tuple[bool, bool]) -> None:
        _state.enabled, _state.inference = prev

    def __enter__(self) -> None:
        self._saved.append(self._swap())

    def __exit__(self, *exc: object) -> None:
        self._restore(self._saved.pop())

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            prev = self._swap()
            try:
                return fn(*args, **kwargs)
            finally:
                self._restore(prev)

        return wrapper  # type: ignore[return-value]


class no_grad(_GradModeContext):
    """Context manager and decorator that disables graph recording on this thread.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0], requires_grad=True)
    >>> with xgrad.no_grad():
    ...     y = x * 2
    >>> y.requires_grad
    False
    """

    _mode = False


class enable_grad(_GradModeContext):
    """Context manager and decorator that enables graph recording on this thread.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0], requires_grad=True)
    >>> with xgrad.no_grad(), xgrad.enable_grad():
    ...     y = x * 2
    >>> y.requires_grad
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
        # The switch happens at construction, as PyTorch's does; the context restores it.
        self._saved.append(self._swap())

    def __enter__(self) -> None:
        pass


class inference_mode(_GradModeContext):
    """Like ``no_grad``, and marks the thread as in inference mode.

    Args:
        mode: ``False`` makes it a no-op, for code that toggles it.

    >>> import xgrad
    >>> with xgrad.inference_mode():
    ...     xgrad.is_grad_enabled()
    False
    """

    def __init__(self, mode: bool = True) -> None:
        super().__init__()
        self._mode = False if mode else None
        self._inference = bool(mode)
