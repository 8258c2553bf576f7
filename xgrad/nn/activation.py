"""Activation modules: ``ReLU``, ``Tanh``, ``GELU``, ``SiLU``, ``Sigmoid``."""

from __future__ import annotations

from collections.abc import Callable

from xgrad import ops
from xgrad.nn.module import Module
from xgrad.tensor import Tensor


class _Activation(Module):
    fn: Callable[[Tensor], Tensor]

    def forward(self, x: Tensor) -> Tensor:
        return type(self).fn(x)


class ReLU(_Activation):
    """``max(x, 0)``.

    >>> import xgrad
    >>> xgrad.nn.ReLU()(xgrad.tensor([-1.0, 2.0])).tolist()
    [0.0, 2.0]
    """

    fn = staticmethod(ops.relu)


class Tanh(_Activation):
    """``tanh(x)``.

    >>> import xgrad
    >>> xgrad.nn.Tanh()(xgrad.tensor([0.0])).tolist()
    [0.0]
    """

    fn = staticmethod(ops.tanh)


class GELU(_Activation):
    """Gaussian error linear unit.

    >>> import xgrad
    >>> xgrad.nn.GELU()(xgrad.tensor([0.0])).tolist()
    [0.0]
    """

    fn = staticmethod(ops.gelu)


class SiLU(_Activation):
    """``x * sigmoid(x)``.

    >>> import xgrad
    >>> xgrad.nn.SiLU()(xgrad.tensor([0.0])).tolist()
    [0.0]
    """

    fn = staticmethod(ops.silu)


class Sigmoid(_Activation):
    """``1 / (1 + exp(-x))``.

    >>> import xgrad
    >>> xgrad.nn.Sigmoid()(xgrad.tensor([0.0])).tolist()
    [0.5]
    """

    fn = staticmethod(ops.sigmoid)

