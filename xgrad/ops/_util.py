"""Small helpers the op modules share: axis normalisation and non-differentiable wrappers."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from xgrad.tensor import Tensor

__all__ = ["as_array", "norm_axes", "nondiff"]


def norm_axes(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """PyTorch ``dim`` (int, sequence or None) as a sorted tuple of non-negative axes."""
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    out = []
    for d in dims:
        if not -max(ndim, 1) <= d < max(ndim, 1):
            raise IndexError(f"Dimension out of range (expected to be in range of [{-max(ndim, 1)}, {max(ndim, 1) - 1}], but got {d})")
        out.append(d % ndim if ndim else 0)
    return tuple(sorted(set(out)))


def as_array(x: Any) -> Any:
    return x._array if isinstance(x, Tensor) else x


def nondiff(fn: Callable[..., Any], name: str, example: str) -> Callable[..., Tensor]:
    """Wrap an array function whose result has no gradient (comparisons, argmax, …).

    ``example`` is a doctest line (call and result) for the wrapper's docstring.
    """

    def op(*args: Any, **kwargs: Any) -> Tensor:
        return Tensor(fn(*(as_array(a) for a in args), **kwargs))

    op.__name__ = name
    op.__qualname__ = name
    op.__doc__ = f"``{name}`` on arrays; the result records no graph.\n\n>>> import xgrad\n{example}\n"
    # Owned by the module that defined it, so doctest finds its example.
    op.__module__ = sys._getframe(1).f_globals.get("__name__", op.__module__)
    return op
