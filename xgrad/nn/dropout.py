"""``Dropout``."""

from __future__ import annotations

from typing import Any

from xgrad import ops
from xgrad.generator import KeyState
from xgrad.nn.init import prng_key
from xgrad.nn.module import Module
from xgrad.tensor import Tensor


class Dropout(Module):
    """Zero elements with probability ``p`` while training; identity in eval mode.

    Args:
        p: drop probability.
        key: a ``jax.random`` key or int seed for the first call; later calls split it.
            ``None`` uses the default key.

    >>> import xgrad
    >>> drop = xgrad.nn.Dropout(0.5, key=0)
    >>> drop.eval()(xgrad.ones(3)).tolist()
    [1.0, 1.0, 1.0]
    """

    def __init__(self, p: float = 0.5, *, key: Any = None) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self._rng = None if key is None else KeyState(prng_key(key))  # state of a compiled step (NOTE [Random state])

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        key = None if self._rng is None else self._rng.draw()
        return ops.dropout(x, self.p, key=key, training=True)

    def extra_repr(self) -> str:
        return f"p={self.p}"

