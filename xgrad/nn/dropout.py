"""``Dropout``, ``Dropout1d/2d/3d``, ``AlphaDropout``, ``FeatureAlphaDropout``: draws from the default generator unless given a key."""

from __future__ import annotations

from collections.abc import Callable
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
        inplace: the input itself takes the result (xgrad's in-place rebinding).
        key: a ``jax.random`` key or int seed for the first call; later calls split it.
            ``None`` draws from the default generator.

    >>> import xgrad
    >>> drop = xgrad.nn.Dropout(0.5, key=0)
    >>> drop.eval()(xgrad.ones(3)).tolist()
    [1.0, 1.0, 1.0]
    """

    fn: Callable[..., Tensor] = staticmethod(ops.dropout)

    def __init__(self, p: float = 0.5, inplace: bool = False, *, key: Any = None) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace
        self._rng = None if key is None else KeyState(prng_key(key))  # state of a compiled step (NOTE [Random state])

    def forward(self, x: Tensor) -> Tensor:
        # Called in eval mode too, as PyTorch does: the functional form's shape checks and warnings apply.
        key = None if self._rng is None or not self.training or self.p == 0.0 else self._rng.draw()
        return type(self).fn(x, self.p, self.training, self.inplace, key=key)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(Dropout):
    """Zero whole channels of ``(N, C, L)`` or ``(C, L)`` input with probability ``p`` while training.

    >>> import xgrad
    >>> xgrad.nn.Dropout1d(0.5).eval()(xgrad.ones(2, 3)).tolist()
    [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    """

    fn = staticmethod(ops.dropout1d)


class Dropout2d(Dropout):
    """Zero whole channels (dim 1) of ``(N, C, H, W)`` input with probability ``p`` while training.

    >>> import xgrad
    >>> xgrad.nn.Dropout2d(0.5).eval()(xgrad.ones(1, 2, 1, 1)).flatten().tolist()
    [1.0, 1.0]
    """

    fn = staticmethod(ops.dropout2d)


class AlphaDropout(Dropout):
    """Alpha dropout for SELU networks: dropped elements take SELU's saturation value, mean and variance kept.

    >>> import xgrad
    >>> xgrad.nn.AlphaDropout(0.2).eval()(xgrad.ones(2)).tolist()
    [1.0, 1.0]
    """

    fn = staticmethod(ops.alpha_dropout)


class Dropout3d(Dropout):
    """Zero whole channels (dim 1) of ``(N, C, D, H, W)`` input with probability ``p`` while training.

    >>> import xgrad
    >>> xgrad.nn.Dropout3d(0.5).eval()(xgrad.ones(1, 2, 1, 1, 1)).flatten().tolist()
    [1.0, 1.0]
    """

    fn = staticmethod(ops.dropout3d)


class FeatureAlphaDropout(Dropout):
    """Alpha dropout of whole channels (dim 1): a dropped channel takes SELU's saturation value.

    >>> import xgrad
    >>> xgrad.nn.FeatureAlphaDropout(0.2).eval()(xgrad.ones(1, 2)).tolist()
    [[1.0, 1.0]]
    """

    fn = staticmethod(ops.feature_alpha_dropout)
