"""Forward-mode AD with PyTorch's ``torch.autograd.forward_ad`` API.

Inside a ``dual_level()``, ``make_dual(x, v)`` gives ``x`` a tangent ``v``; every op
computes its outputs' tangents (Jacobian-vector products) along with their values
(NOTE [Tangents are jvp of the forward] in ``xgrad/ops/tangents.py``), and
``unpack_dual(y)`` returns ``(primal, tangent)``. Leaving the level drops every tangent
made in it (NOTE [Dual levels] in ``xgrad/dual.py``). Only one level at a time, as
in PyTorch.

>>> import xgrad
>>> import xgrad.autograd.forward_ad as fwAD
>>> x = xgrad.tensor([0.0, 2.0])
>>> with fwAD.dual_level():
...     y = fwAD.make_dual(x, xgrad.tensor([1.0, 0.5])) ** 2
...     fwAD.unpack_dual(y).tangent.tolist()
[0.0, 2.0]
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp

from xgrad.dual import (
    ERR_TANGENT_SIZE,
    LEVEL,
    DualLevel,
    fwd_grad_enabled,
    set_fwd_grad_enabled,
    set_tangent,
    tangent_of,
    tangents_off,
)
from xgrad.ops.registry import REGISTRY, bind
from xgrad.step_trace import array_of
from xgrad.tensor import Tensor

__all__ = ["UnpackedDualTensor", "dual_level", "enter_dual_level", "exit_dual_level", "make_dual", "unpack_dual"]

ERR_NESTED = "Nested forward mode AD is not supported at the moment"
ERR_EXIT_NOT_LAST = "Trying to exit a forward AD level that was not the last one that was created. This is not supported."
ERR_EXIT_NONE = "Dual level must be a positive number."
ERR_NO_LEVEL = (
    "Trying to create a dual Tensor for forward AD but no level exists, make sure to enter_dual_level() first."
)


def enter_dual_level() -> int:
    """Enter a forward AD level (there can be one at a time) and return its number, 0.

    >>> import xgrad.autograd.forward_ad as fwAD
    >>> level = fwAD.enter_dual_level()
    >>> level
    0
    >>> fwAD.exit_dual_level()
    """
    if LEVEL.current is not None:
        raise RuntimeError(ERR_NESTED)
    LEVEL.current = DualLevel(0)
    return 0


def exit_dual_level(*, level: int | None = None) -> None:
    """Leave the forward AD level: every tangent made in it is dropped.

    Args:
        level: the level to leave (default: the current one); only the last entered may be left.
    """
    current = LEVEL.current
    if current is None:
        raise RuntimeError(ERR_EXIT_NONE)
    if level is not None and level != current.number:
        raise RuntimeError(ERR_EXIT_NOT_LAST)
    LEVEL.current = None


class dual_level:  # noqa: N801 - PyTorch's name
    """Context manager (and decorator) for a forward AD level; ``as`` gives its number.

    >>> import xgrad, xgrad.autograd.forward_ad as fwAD
    >>> with fwAD.dual_level():
    ...     y = fwAD.make_dual(xgrad.tensor(2.0), xgrad.tensor(1.0)) ** 3
    ...     fwAD.unpack_dual(y).tangent.item()
    12.0
    >>> fwAD.unpack_dual(y).tangent is None    # gone with its level
    True
    """

    def __enter__(self) -> int:
        return enter_dual_level()

    def __exit__(self, *exc: object) -> None:
        exit_dual_level()

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with dual_level():
                return fn(*args, **kwargs)

        return wrapper


def _is_fwd_grad_enabled() -> bool:
    """PyTorch's ``forward_ad._is_fwd_grad_enabled``: whether forward grad is on for this thread.

    >>> import xgrad.autograd.forward_ad as fwAD
    >>> fwAD._is_fwd_grad_enabled()
    True
    """
    return fwd_grad_enabled()


class _set_fwd_grad_enabled:  # noqa: N801 - PyTorch's name
    """PyTorch's ``forward_ad._set_fwd_grad_enabled(mode)``: forward grad on or off for this thread.

    Set when made (so a plain call sets it), put back when its ``with`` block (or the
    function it decorates) ends. Off, dual tensors show no tangent (``unpack_dual``
    gives ``None``) and ops compute none; their tangents come back when it is on again.
    ``xgrad.func.jvp`` is JAX's and is not affected.

    >>> import xgrad, xgrad.autograd.forward_ad as fwAD
    >>> with fwAD.dual_level():
    ...     x = fwAD.make_dual(xgrad.tensor(2.0), xgrad.tensor(1.0))
    ...     with fwAD._set_fwd_grad_enabled(False):
    ...         shift = x ** 2
    ...     y = x ** 2 - shift
    ...     fwAD.unpack_dual(y).tangent.item(), fwAD.unpack_dual(shift).tangent
    (4.0, None)
    """

    def __init__(self, mode: bool) -> None:
        self.prev = fwd_grad_enabled()
        self.mode = mode
        set_fwd_grad_enabled(mode)

    def __enter__(self) -> None:
        set_fwd_grad_enabled(self.mode)

    def __exit__(self, *exc: object) -> None:
        set_fwd_grad_enabled(self.prev)

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        set_fwd_grad_enabled(self.prev)  # as a decorator it applies only while ``fn`` runs
        mode = self.mode

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _set_fwd_grad_enabled(mode):
                return fn(*args, **kwargs)

        return wrapper


def _checked_level(level: int | None, what: str) -> DualLevel | None:
    current = LEVEL.current
    if level is None or current is None:
        return current
    if level != current.number:
        raise RuntimeError(f"Invalid level given to {what}")
    return current


def _alias_without_tangent(tensor: Tensor) -> Tensor:
    """``tensor``'s value and graph position without its tangent.

    PyTorch's forward non-differentiable view: an in-place op on it reaches ``tensor``'s
    value (NOTE [Detached aliases]) but not its tangent, and backward goes through it to
    ``tensor``'s history.
    """
    with tangents_off():  # an identity op: the alias's own node leads to ``tensor``'s history
        alias = _identity(tensor, shape=tensor.shape)
    alias._array = array_of(tensor)  # the same array, so that writes reach ``tensor``
    alias._version = tensor._version
    alias._alias_of = (weakref.ref(tensor) if tensor._view is None else (lambda: tensor), True, (alias._array, alias._array))
    return alias


def _identity(tensor: Tensor, shape: tuple[int, ...]) -> Tensor:
    return bind(REGISTRY["reshape"], (tensor,), {"shape": shape})  # type: ignore[no-any-return]


def make_dual(tensor: Tensor, tangent: Tensor, *, level: int | None = None) -> Tensor:
    """A view of ``tensor`` whose tangent is ``tangent`` (kept as it is), for forward AD.

    Differentiable in reverse mode: gradients reach ``tensor`` through the result, and
    ``tangent`` through everything computed from the result's tangent.

    Args:
        tensor: the primal, a floating or complex tensor.
        tangent: its tangent, of the same shape.
        level: the level (default: the current one, which must exist).
    """
    current = _checked_level(level, "_make_dual")
    if current is None:
        raise RuntimeError(ERR_NO_LEVEL)
    if not jnp.issubdtype(tensor.dtype, jnp.inexact):
        raise ValueError(f"Expected primal to be floating point or complex, but got: {_dtype_name(tensor.dtype)}")
    if not jnp.issubdtype(tangent.dtype, jnp.inexact):
        raise ValueError(f"Expected tangent to be floating point or complex, but got: {_dtype_name(tangent.dtype)}")
    if tangent.shape != tensor.shape:
        raise RuntimeError(ERR_TANGENT_SIZE.format(primal=list(tensor.shape), tangent=list(tangent.shape)))
    if tangent_of(tensor) is not None:  # PyTorch's check: the new tangent would silently replace the old one
        raise RuntimeError(f"Making a dual Tensor based on a Tensor that already has a forward gradient at the same "
                           f"level {current.number} is not supported.")
    dual = _alias_without_tangent(tensor)
    set_tangent(dual, tangent)
    return dual


def _dtype_name(dtype: Any) -> str:
    """PyTorch's spelling of a dtype in these messages (``torch.int64``)."""
    return f"torch.{jnp.dtype(dtype).name}"


class UnpackedDualTensor(NamedTuple):
    """What ``unpack_dual`` returns: the primal (a view without tangent) and the tangent (or ``None``)."""

    primal: Tensor
    tangent: Tensor | None


def unpack_dual(tensor: Tensor, *, level: int | None = None) -> UnpackedDualTensor:
    """``(primal, tangent)`` of ``tensor`` at the level (``tangent`` is ``None`` for a tensor without one).

    The primal is a view of ``tensor`` that carries no tangent; both are differentiable
    in reverse mode. Outside any level the tensor comes back as it is, with ``None``.
    """
    current = _checked_level(level, "_fw_primal")
    if current is None:
        return UnpackedDualTensor(tensor, None)
    return UnpackedDualTensor(_alias_without_tangent(tensor), tangent_of(tensor))
