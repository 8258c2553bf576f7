"""Activation modules, with PyTorch's constructor arguments and reprs.

A module with ``inplace=True`` rebinds its input as xgrad's in-place methods do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from xgrad import ops
from xgrad.nn.module import Module, Parameter
from xgrad.tensor import Tensor
from xgrad.tensor.dtypes import parameter_dtype


class _Activation(Module):
    fn: Callable[[Tensor], Tensor]

    def forward(self, x: Tensor) -> Tensor:
        return type(self).fn(x)


class _InplaceActivation(Module):
    """An activation with PyTorch's ``inplace=`` argument and nothing else."""

    fn: Callable[..., Tensor]

    def __init__(self, inplace: bool = False) -> None:
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return type(self).fn(x, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


def _inplace_suffix(inplace: bool) -> str:
    return ", inplace=True" if inplace else ""


class ReLU(_InplaceActivation):
    """``max(x, 0)``.

    >>> import xgrad
    >>> xgrad.nn.ReLU()(xgrad.tensor([-1.0, 2.0])).tolist()
    [0.0, 2.0]
    """

    fn = staticmethod(ops.relu)


class ReLU6(_InplaceActivation):
    """``min(max(x, 0), 6)``.

    >>> import xgrad
    >>> xgrad.nn.ReLU6()(xgrad.tensor([-1.0, 7.0])).tolist()
    [0.0, 6.0]
    """

    fn = staticmethod(ops.relu6)


class SELU(_InplaceActivation):
    """Scaled ELU with SELU's fixed constants.

    >>> import xgrad
    >>> xgrad.nn.SELU()(xgrad.tensor([0.0])).tolist()
    [0.0]
    """

    fn = staticmethod(ops.selu)


class SiLU(_InplaceActivation):
    """``x * sigmoid(x)``.

    >>> import xgrad
    >>> xgrad.nn.SiLU()(xgrad.tensor([0.0])).tolist()
    [0.0]
    """

    fn = staticmethod(ops.silu)


class Mish(_InplaceActivation):
    """``x * tanh(softplus(x))``.

    >>> import xgrad
    >>> xgrad.nn.Mish()(xgrad.tensor([0.0])).tolist()
    [0.0]
    """

    fn = staticmethod(ops.mish)


class Hardswish(_InplaceActivation):
    """``x * relu6(x + 3) / 6``.

    >>> import xgrad
    >>> xgrad.nn.Hardswish()(xgrad.tensor([4.0])).tolist()
    [4.0]
    """

    fn = staticmethod(ops.hardswish)


class Hardsigmoid(_InplaceActivation):
    """``relu6(x + 3) / 6``.

    >>> import xgrad
    >>> xgrad.nn.Hardsigmoid()(xgrad.tensor([0.0])).tolist()
    [0.5]
    """

    fn = staticmethod(ops.hardsigmoid)


class Tanh(_Activation):
    """``tanh(x)``.

    >>> import xgrad
    >>> xgrad.nn.Tanh()(xgrad.tensor([0.0])).tolist()
    [0.0]
    """

    fn = staticmethod(ops.tanh)


class Sigmoid(_Activation):
    """``1 / (1 + exp(-x))``.

    >>> import xgrad
    >>> xgrad.nn.Sigmoid()(xgrad.tensor([0.0])).tolist()
    [0.5]
    """

    fn = staticmethod(ops.sigmoid)


class LogSigmoid(_Activation):
    """``log(sigmoid(x))``.

    >>> import xgrad
    >>> round(xgrad.nn.LogSigmoid()(xgrad.tensor(0.0)).item(), 4)
    -0.6931
    """

    fn = staticmethod(ops.logsigmoid)


class Softsign(_Activation):
    """``x / (1 + |x|)``.

    >>> import xgrad
    >>> xgrad.nn.Softsign()(xgrad.tensor([1.0])).tolist()
    [0.5]
    """

    fn = staticmethod(ops.softsign)


class Tanhshrink(_Activation):
    """``x - tanh(x)``.

    >>> import xgrad
    >>> xgrad.nn.Tanhshrink()(xgrad.tensor([0.0])).tolist()
    [0.0]
    """

    fn = staticmethod(ops.tanhshrink)


class GELU(Module):
    """Gaussian error linear unit; ``approximate="tanh"`` for the tanh approximation.

    >>> import xgrad
    >>> xgrad.nn.GELU()(xgrad.tensor([0.0])).tolist()
    [0.0]
    """

    def __init__(self, approximate: str = "none") -> None:
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return ops.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class LeakyReLU(Module):
    """``x`` where positive, else ``negative_slope * x``.

    >>> import xgrad
    >>> xgrad.nn.LeakyReLU(0.5)(xgrad.tensor([-2.0, 1.0])).tolist()
    [-1.0, 1.0]
    """

    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False) -> None:
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return ops.leaky_relu(x, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}{_inplace_suffix(self.inplace)}"


class ELU(Module):
    """``x`` where positive, else ``alpha * (exp(x) - 1)``.

    >>> import xgrad
    >>> xgrad.nn.ELU()(xgrad.tensor([1.0])).tolist()
    [1.0]
    """

    fn = staticmethod(ops.elu)

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return type(self).fn(x, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}{_inplace_suffix(self.inplace)}"


class CELU(ELU):
    """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``.

    >>> import xgrad
    >>> xgrad.nn.CELU(2.0)(xgrad.tensor([1.0])).tolist()
    [1.0]
    """

    fn = staticmethod(ops.celu)


class Hardtanh(Module):
    """``x`` clamped into ``[min_val, max_val]``.

    >>> import xgrad
    >>> xgrad.nn.Hardtanh(-2.0, 2.0)(xgrad.tensor([-3.0, 1.0])).tolist()
    [-2.0, 1.0]
    """

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        if max_val < min_val:
            raise ValueError("min_val cannot be greater than max_val")
        self.min_val = min_val
        self.max_val = max_val
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return ops.hardtanh(x, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}{_inplace_suffix(self.inplace)}"


class Threshold(Module):
    """``x`` where ``x > threshold``, else ``value``.

    >>> import xgrad
    >>> xgrad.nn.Threshold(1.0, 0.0)(xgrad.tensor([0.5, 2.0])).tolist()
    [0.0, 2.0]
    """

    def __init__(self, threshold: float, value: float, inplace: bool = False) -> None:
        self.threshold = threshold
        self.value = value
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return ops.threshold(x, self.threshold, self.value, self.inplace)

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}, value={self.value}{_inplace_suffix(self.inplace)}"


class Softplus(Module):
    """``log(1 + exp(beta * x)) / beta``, linear above ``threshold``.

    >>> import xgrad
    >>> round(xgrad.nn.Softplus()(xgrad.tensor(0.0)).item(), 4)
    0.6931
    """

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        self.beta = beta
        self.threshold = threshold

    def forward(self, x: Tensor) -> Tensor:
        return ops.softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class Softshrink(Module):
    """``x - lambd`` above ``lambd``, ``x + lambd`` below ``-lambd``, else 0.

    >>> import xgrad
    >>> xgrad.nn.Softshrink()(xgrad.tensor([1.0])).tolist()
    [0.5]
    """

    fn = staticmethod(ops.softshrink)

    def __init__(self, lambd: float = 0.5) -> None:
        self.lambd = lambd

    def forward(self, x: Tensor) -> Tensor:
        return type(self).fn(x, self.lambd)

    def extra_repr(self) -> str:
        return str(self.lambd)


class Hardshrink(Softshrink):
    """``x`` where ``|x| > lambd``, else 0.

    >>> import xgrad
    >>> xgrad.nn.Hardshrink()(xgrad.tensor([0.25, 1.0])).tolist()
    [0.0, 1.0]
    """

    fn = staticmethod(ops.hardshrink)


class GLU(Module):
    """Gated linear unit over the halves of ``dim``.

    >>> import xgrad
    >>> xgrad.nn.GLU()(xgrad.tensor([[1.0, 0.0]])).tolist()
    [[0.5]]
    """

    def __init__(self, dim: int = -1) -> None:
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return ops.glu(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax(Module):
    """Softmax along ``dim`` (PyTorch's implicit dim, with its warning, when ``None``).

    >>> import xgrad
    >>> xgrad.nn.Softmax(dim=-1)(xgrad.tensor([0.0, 0.0])).tolist()
    [0.5, 0.5]
    """

    fn = staticmethod(ops.softmax)

    def __init__(self, dim: int | None = None) -> None:
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return type(self).fn(x, self.dim, _stacklevel=5)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """Log-softmax along ``dim``.

    >>> import xgrad
    >>> [round(v, 4) for v in xgrad.nn.LogSoftmax(dim=0)(xgrad.tensor([0.0, 0.0])).tolist()]
    [-0.6931, -0.6931]
    """

    fn = staticmethod(ops.log_softmax)


class Softmin(Softmax):
    """Softmax of ``-x`` along ``dim``.

    >>> import xgrad
    >>> xgrad.nn.Softmin(dim=0)(xgrad.tensor([0.0, 0.0])).tolist()
    [0.5, 0.5]
    """

    fn = staticmethod(ops.softmin)


class PReLU(Module):
    """``x`` where positive, else ``weight * x`` with a learned ``weight``: one slope, or one per channel (dim 1).

    ``dtype``: the weight's (``xgrad.get_default_dtype()`` by default).

    >>> import xgrad
    >>> m = xgrad.nn.PReLU()
    >>> m.weight.tolist(), m(xgrad.tensor([[-4.0, 1.0]])).tolist()
    ([0.25], [[-1.0, 1.0]])
    """

    def __init__(self, num_parameters: int = 1, init: float = 0.25, *, dtype: Any = None) -> None:
        self.num_parameters = num_parameters
        self.init = init
        self.weight = Parameter(jnp.full((num_parameters,), init, parameter_dtype(dtype)))

    def forward(self, x: Tensor) -> Tensor:
        return ops.prelu(x, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"
