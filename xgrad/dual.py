"""The forward-mode AD level: which tangents are live, and where tangent rules are off.

# NOTE [Dual levels]
# As in PyTorch, one forward AD level may exist at a time (``forward_ad.dual_level``). A
# dual tensor keeps its tangent in the slot ``Tensor._fw_grad`` as ``(level, tangent)``,
# and the tangent counts only while that ``level`` object is the live one: leaving the
# level drops every tangent of it at once, without visiting the tensors, and a later level
# (also numbered 0, as PyTorch's) is a new object that sees none of them. The level is
# global, as PyTorch's: tensors pass between threads (the engine's device workers run
# backward nodes) with their tangents. Where tangents must not be computed (inside a
# tangent rule, in a custom ``Function``'s forward) a thread-local switch turns them off.
# ``bind`` reads ``LEVEL.current`` once per op: with no level, forward AD costs nothing more.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xgrad.tensor import Tensor

__all__ = [
    "ERR_TANGENT_SIZE", "LEVEL", "DualLevel", "fwd_grad_enabled", "set_fwd_grad_enabled", "set_tangent", "tangent_of",
    "tangents_off", "tangents_on",
]

ERR_TANGENT_SIZE = (
    "Trying to set a forward gradient that has a different size than that of the original Tensor, this is not "
    "supported. Tensor is of size {primal} while the given forward gradient is of size {tangent}."
)


class DualLevel:
    """One entered forward AD level; ``number`` is what ``enter_dual_level`` returned."""

    __slots__ = ("number",)

    def __init__(self, number: int) -> None:
        self.number = number

    def __repr__(self) -> str:
        return f"DualLevel({self.number})"


class _Live:
    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current: DualLevel | None = None


LEVEL = _Live()


class _Switch(threading.local):
    off: int = 0  # > 0 while tangent rules must not run on this thread
    disabled: bool = False  # forward grad turned off on this thread (``forward_ad._set_fwd_grad_enabled``)


_switch = _Switch()


def tangents_on() -> bool:
    """Whether ops on this thread compute tangents now (a live level, not switched off)."""
    return LEVEL.current is not None and not _switch.off and not _switch.disabled


def fwd_grad_enabled() -> bool:
    """Whether forward grad is on for this thread (PyTorch's ``_is_fwd_grad_enabled``)."""
    return not _switch.disabled


def set_fwd_grad_enabled(enabled: bool) -> None:
    """Turn forward grad on or off for this thread: off, tensors show no tangents and ops compute none, as in PyTorch."""
    _switch.disabled = not enabled


@contextmanager
def tangents_off() -> Iterator[None]:
    """Ops inside compute no tangents (a tangent rule's own ops, a Function's forward)."""
    _switch.off += 1
    try:
        yield
    finally:
        _switch.off -= 1


def tangent_of(t: Tensor) -> Tensor | None:
    """``t``'s tangent at the live level, or ``None``."""
    fw: Any = t._fw_grad
    if fw is None:
        return None
    level = LEVEL.current
    if level is None or fw[0] is not level or _switch.disabled:
        return None
    return fw[1]  # type: ignore[no-any-return]


def set_tangent(t: Tensor, tangent: Tensor | None) -> None:
    """Give ``t`` a tangent at the live level (``None`` removes it)."""
    level = LEVEL.current
    t._fw_grad = None if tangent is None or level is None else (level, tangent)
