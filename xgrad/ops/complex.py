"""Complex conjugation: ``conj`` with PyTorch's conjugate bit, ``conj_physical``, ``resolve_conj``.

# NOTE [The conjugate bit]
# PyTorch's ``conj()`` of a complex tensor is a lazy view whose ``is_conj()`` is true until
# ``resolve_conj()`` materialises it. A ``jax.Array`` is immutable, so here the values are
# conjugated at once (``conj_physical``) and the result carries the bit only as a mark
# that ``is_conj()`` reads and ``resolve_conj()`` drops: programs that branch on it see
# PyTorch's answers, and values and gradients are the same either way. A real tensor's
# ``conj()`` has no bit, as in PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from xgrad.ops.registry import defprim
from xgrad.tensor import Tensor

__all__ = ["conj", "conj_physical", "is_conj", "resolve_conj"]

conj_physical: Callable[..., Any] = defprim("conj_physical", jnp.conj, (lambda g, out, x: conj_physical(g),), save=(), doc="""Elementwise complex conjugate (the identity on real tensors).

    >>> import xgrad
    >>> xgrad.conj_physical(xgrad.tensor([1 + 2j])).tolist()
    [(1-2j)]
    """)


def conj(x: Tensor) -> Tensor:
    """The complex conjugate, marked with PyTorch's conjugate bit for complex ``x`` (NOTE [The conjugate bit]).

    >>> import xgrad
    >>> y = xgrad.tensor([1 + 2j]).conj()
    >>> y.tolist(), y.is_conj(), y.resolve_conj().is_conj()
    ([(1-2j)], True, False)
    """
    out = conj_physical(x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        out._conj_bit = not is_conj(x)
    return out  # type: ignore[no-any-return]


def is_conj(x: Tensor) -> bool:
    """Whether ``x`` carries PyTorch's conjugate bit (NOTE [The conjugate bit]).

    >>> import xgrad
    >>> xgrad.tensor([1 + 2j]).is_conj()
    False
    """
    return bool(getattr(x, "_conj_bit", False))


def resolve_conj(x: Tensor) -> Tensor:
    """``x`` without the conjugate bit: the same values (a new tensor with the bit cleared when it had one).

    >>> import xgrad
    >>> xgrad.tensor([1 + 2j]).conj().resolve_conj().is_conj()
    False
    """
    if not is_conj(x):
        return x
    out = x.clone()
    out._conj_bit = False
    return out
