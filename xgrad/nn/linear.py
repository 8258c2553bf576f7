"""Linear layers: ``Linear``, ``Identity``, and ``MLP`` built from them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax

from xgrad import ops
from xgrad.nn.activation import ReLU
from xgrad.nn.containers import Sequential
from xgrad.nn.init import prng_key
from xgrad.nn.module import Module, Parameter
from xgrad.ops._util import check_nonnegative_shape
from xgrad.tensor import Tensor
from xgrad.tensor.dtypes import parameter_dtype


class Linear(Module):
    """``y = x @ weight.T + bias`` with ``weight`` of shape ``(out_features, in_features)``.

    Initialised as PyTorch does: uniform in ``±1/sqrt(in_features)``.

    Args:
        in_features, out_features: sizes.
        bias: whether to add a bias.
        key: a ``jax.random`` key or int seed (the default key when ``None``).
        dtype: parameter dtype (``xgrad.get_default_dtype()``, float32 unless set, by default).

    >>> import xgrad
    >>> xgrad.nn.Linear(3, 2, key=0)(xgrad.ones(5, 3)).shape
    (5, 2)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, key: Any = None, dtype: Any = None) -> None:
        dtype = parameter_dtype(dtype)
        check_nonnegative_shape((out_features, in_features))  # PyTorch's error, before JAX's
        kw, kb = jax.random.split(prng_key(key))
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(jax.random.uniform(kw, (out_features, in_features), dtype, -bound, bound))
        self.bias = Parameter(jax.random.uniform(kb, (out_features,), dtype, -bound, bound)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return ops.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class MLP(Sequential):
    """``Linear`` layers of the given sizes with an activation between them (none after the last).

    Args:
        sizes: ``[in, hidden..., out]``.
        activation: a module class or factory for the nonlinearity (``ReLU`` by default).
        key: a ``jax.random`` key or int seed, split once per layer.

    >>> import xgrad
    >>> mlp = xgrad.nn.MLP([2, 4, 1], activation=xgrad.nn.Tanh, key=0)
    >>> mlp(xgrad.ones(3, 2)).shape, len(mlp)
    ((3, 1), 3)
    """

    def __init__(self, sizes: Sequence[int], activation: Callable[[], Module] | None = None, *, key: Any = None, dtype: Any = None) -> None:
        if len(sizes) < 2:
            raise ValueError(f"MLP needs at least an input and an output size, got sizes={list(sizes)}")
        make_activation = activation or ReLU
        keys = jax.random.split(prng_key(key), len(sizes) - 1)
        layers: list[Module] = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            layers.append(Linear(fan_in, fan_out, key=keys[i], dtype=dtype))
            if i < len(sizes) - 2:
                layers.append(make_activation())
        super().__init__(*layers)



class Identity(Module):
    """Returns its input.

    >>> import xgrad
    >>> xgrad.nn.Identity()(xgrad.tensor([1.0, 2.0])).tolist()
    [1.0, 2.0]
    """

    def forward(self, x: Any) -> Any:
        return x

