"""Anomaly mode: forward tracebacks on nodes, and NaN checks on their outputs.

Global, as in PyTorch. When it is off the only cost per recorded node is one
attribute read.
"""

from __future__ import annotations

import traceback
from typing import Any

__all__ = ["detect_anomaly", "is_anomaly_check_nan_enabled", "is_anomaly_enabled", "set_detect_anomaly"]

TRACEBACK_KEY = "traceback_"
TRACE_HEADER = "Traceback of forward call that caused the error:\n"
PARENT_KEY = "parent_"
PARENT_TRACE_HEADER = "Traceback of forward call that induced the previous calculation:\n"
NO_FORWARD_INFO = "No forward pass information available. Enable detect anomaly during forward pass for more information."


class _AnomalyState:
    __slots__ = ("check_nan", "enabled")

    def __init__(self) -> None:
        self.enabled = False
        self.check_nan = True


ANOMALY = _AnomalyState()


def is_anomaly_enabled() -> bool:
    """Whether anomaly mode is on.

    >>> import xgrad
    >>> with xgrad.autograd.set_detect_anomaly(True):
    ...     xgrad.autograd.is_anomaly_enabled()
    True
    >>> xgrad.autograd.is_anomaly_enabled()
    False
    """
    return ANOMALY.enabled


def is_anomaly_check_nan_enabled() -> bool:
    """Whether anomaly mode raises when a node returns NaN.

    >>> import xgrad
    >>> with xgrad.autograd.set_detect_anomaly(True, check_nan=False):
    ...     xgrad.autograd.is_anomaly_check_nan_enabled()
    False
    """
    return ANOMALY.check_nan


class set_detect_anomaly:
    """Turn anomaly mode on or off; as a context manager, restore it on exit.

    Args:
        mode: on or off.
        check_nan: raise when a node returns NaN.

    >>> import xgrad
    >>> with xgrad.autograd.set_detect_anomaly(True):
    ...     xgrad.autograd.is_anomaly_enabled()
    True
    """

    def __init__(self, mode: bool, check_nan: bool = True) -> None:
        self.prev = (ANOMALY.enabled, ANOMALY.check_nan)
        ANOMALY.enabled = bool(mode)
        ANOMALY.check_nan = bool(check_nan)

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        ANOMALY.enabled, ANOMALY.check_nan = self.prev


class detect_anomaly:
    """Context manager: nodes record their forward traceback; errors in backward show it.

    Args:
        check_nan: raise ``RuntimeError`` when a node returns NaN.

    >>> import xgrad, math
    >>> x = xgrad.tensor([0.0], requires_grad=True)
    >>> try:
    ...     with xgrad.autograd.detect_anomaly():
    ...         (x.sqrt() * 0).sum().backward()
    ... except RuntimeError as e:
    ...     print(str(e).splitlines()[0])
    Function 'SqrtBackward' returned nan values in its 0th output.
    """

    def __init__(self, check_nan: bool = True) -> None:
        self.check_nan = check_nan
        # One entry per ``with``: contexts nest, even with this same object.
        self._saved: list[tuple[bool, bool]] = []

    def __enter__(self) -> None:
        self._saved.append((ANOMALY.enabled, ANOMALY.check_nan))
        ANOMALY.enabled = True
        ANOMALY.check_nan = self.check_nan

    def __exit__(self, *exc: object) -> None:
        ANOMALY.enabled, ANOMALY.check_nan = self._saved.pop()


def record_forward_trace(node: Any) -> None:
    """Store the forward traceback on ``node`` when anomaly mode is on.

    A node recorded while a backward runs another node (``create_graph``) also keeps
    that node as its parent, as PyTorch's ``assign_parent`` does: an error in the
    double backward then shows what the first backward was computing.
    """
    if ANOMALY.enabled:
        metadata = node.metadata
        metadata[TRACEBACK_KEY] = "".join(traceback.format_stack()[:-3])
        from xgrad.engine.node import current_task

        parent = current_task.node
        if parent is not None:
            metadata[PARENT_KEY] = parent


def _trace_of(node: Any) -> str | None:
    return node._metadata.get(TRACEBACK_KEY) if node._metadata else None


def with_forward_trace(exc: BaseException, node: Any) -> BaseException:
    """``exc`` of the same type, its message extended with ``node``'s forward traceback.

    Then, for each parent in turn (NOTE in ``record_forward_trace``), the forward
    traceback of the node whose backward recorded it.
    """
    trace = _trace_of(node)
    if trace is None or getattr(exc, "_xgrad_has_trace", False):
        return exc
    parts = [f"{exc}\n\n{TRACE_HEADER}{trace}(in the forward of {node.name()})"]
    parent = node._metadata.get(PARENT_KEY)
    seen = {id(node)}
    while parent is not None and id(parent) not in seen:  # a loop, never recursion
        seen.add(id(parent))
        parent_trace = _trace_of(parent)
        parts.append(
            f"Previous calculation was induced by {parent.name()}. "
            + (PARENT_TRACE_HEADER + parent_trace if parent_trace is not None else NO_FORWARD_INFO)
        )
        parent = parent._metadata.get(PARENT_KEY) if parent._metadata else None
    message = "\n\n".join(parts)
    try:
        new = type(exc)(message)
    except Exception:  # an exception type whose constructor takes other arguments
        exc.args = (message,)
        new = exc
    new._xgrad_has_trace = True  # type: ignore[attr-defined]
    return new
