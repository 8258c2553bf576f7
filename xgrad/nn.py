"""A thin ``Module`` and the layers a small model needs; parameters are leaf Tensors.

A module's state is its attributes: every ``Tensor`` attribute is a parameter, every
``Module`` attribute (or list/tuple of modules) is a submodule. Nothing is registered
by hand, so ``named_parameters`` walks ``vars(self)`` in assignment order, the order
PyTorch gives.

>>> import xgrad
>>> model = xgrad.nn.MLP([4, 8, 3], key=0)
>>> [name for name, _ in model.named_parameters()]
['layers.0.weight', 'layers.0.bias', 'layers.2.weight', 'layers.2.bias']
>>> model(xgrad.ones(2, 4)).shape
(2, 3)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from xgrad import ops
from xgrad.creation import next_key
from xgrad.grad_mode import no_grad
from xgrad.ops._util import check_nonnegative_shape
from xgrad.tensor import Tensor

__all__ = [
    "GELU", "MLP", "Dropout", "Embedding", "Identity", "LayerNorm", "Linear", "Module", "ReLU", "Sequential", "SiLU",
    "Sigmoid", "Tanh",
]


def _key(key: Any) -> jax.Array:
    """A ``jax.random`` key from a key, an int seed, or the default key when ``None``."""
    if key is None:
        return next_key()
    if isinstance(key, int):
        return jax.random.key(key)
    return key


def _parameter(array: jax.Array) -> Tensor:
    return Tensor(array, requires_grad=True)


def clear_grads(params: Iterable[Tensor], set_to_none: bool) -> None:
    """Set each ``.grad`` to ``None`` or, with ``set_to_none=False``, to zeros."""
    for p in params:
        if set_to_none or p.grad is None:
            p.grad = None
        else:
            p.grad = Tensor(jnp.zeros_like(p.grad.array))


class Module:
    """Base class: parameters and submodules are found among the attributes.

    Subclasses set attributes in ``__init__`` and define ``forward``; calling the
    module calls ``forward``.

    >>> import xgrad
    >>> class Scale(xgrad.nn.Module):
    ...     def __init__(self):
    ...         self.weight = xgrad.tensor([2.0], requires_grad=True)
    ...     def forward(self, x):
    ...         return x * self.weight
    >>> m = Scale()
    >>> [name for name, _ in m.named_parameters()], m(xgrad.tensor([3.0])).tolist()
    (['weight'], [6.0])
    """

    training: bool = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    # -- discovery -------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        """The direct submodules, as ``(name, module)``; list entries are named by index."""
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, (list, tuple)) and value and all(isinstance(v, Module) for v in value):
                for i, v in enumerate(value):
                    yield f"{name}.{i}", v

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module and every submodule, depth first, with dotted names."""
        stack: list[tuple[str, Module]] = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            yield name, module
            children = [(f"{name}.{n}" if name else n, m) for n, m in module.named_children()]
            stack.extend(reversed(children))

    def named_parameters(self) -> Iterator[tuple[str, Tensor]]:
        """Every parameter as ``(dotted name, tensor)``, each tensor once.

        >>> import xgrad
        >>> [n for n, _ in xgrad.nn.Linear(2, 3, key=0).named_parameters()]
        ['weight', 'bias']
        """
        seen: set[int] = set()
        for module_name, module in self.named_modules():
            for name, value in vars(module).items():
                if isinstance(value, Tensor) and id(value) not in seen:
                    seen.add(id(value))
                    yield (f"{module_name}.{name}" if module_name else name), value

    def parameters(self) -> list[Tensor]:
        """The parameters, in ``named_parameters`` order."""
        return [p for _, p in self.named_parameters()]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's ``.grad`` (to ``None``, or to zeros)."""
        clear_grads(self.parameters(), set_to_none)

    # -- modes -----------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Set training mode (``Dropout`` is active) on this module and all submodules."""
        for _, module in self.named_modules():
            module.training = bool(mode)
        return self

    def eval(self) -> Module:
        """``train(False)``."""
        return self.train(False)

    # -- state -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Tensor]:
        """The parameters by dotted name, detached (they share the arrays, which never change in place).

        >>> import xgrad
        >>> sorted(xgrad.nn.Linear(2, 3, key=0).state_dict())
        ['bias', 'weight']
        """
        return {name: p.detach() for name, p in self.named_parameters()}

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Copy values from ``state`` into the parameters (in place, under ``no_grad``).

        Args:
            state: dotted name → Tensor or array, as ``state_dict`` returns.
            strict: raise when ``state`` misses a parameter or has unknown keys.
        """
        params = dict(self.named_parameters())
        if strict:
            missing = sorted(set(params) - set(state))
            unexpected = sorted(set(state) - set(params))
            if missing or unexpected:
                raise RuntimeError(
                    f"Error(s) in loading state_dict for {type(self).__name__}: missing keys {missing}, "
                    f"unexpected keys {unexpected}"
                )
        with no_grad():
            for name, value in state.items():
                p = params.get(name)
                if p is None:
                    continue
                array = value.array if isinstance(value, Tensor) else jnp.asarray(value)
                if array.shape != p.shape:
                    raise RuntimeError(
                        f"size mismatch for {name}: copying a param with shape {list(array.shape)}, "
                        f"the shape in current model is {list(p.shape)}"
                    )
                p.copy_(Tensor(jax.device_put(array.astype(p.dtype), p.sharding)))

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        children = list(self.named_children())
        if not children:
            return f"{type(self).__name__}({self.extra_repr()})"
        body = "\n".join(f"  ({name}): " + repr(m).replace("\n", "\n  ") for name, m in children)
        return f"{type(self).__name__}(\n{body}\n)"


class Linear(Module):
    """``y = x @ weight.T + bias`` with ``weight`` of shape ``(out_features, in_features)``.

    Initialised as PyTorch does: uniform in ``±1/sqrt(in_features)``.

    Args:
        in_features, out_features: sizes.
        bias: whether to add a bias.
        key: a ``jax.random`` key or int seed (the default key when ``None``).
        dtype: parameter dtype (float32 by default).

    >>> import xgrad
    >>> xgrad.nn.Linear(3, 2, key=0)(xgrad.ones(5, 3)).shape
    (5, 2)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, key: Any = None, dtype: Any = jnp.float32) -> None:
        check_nonnegative_shape((out_features, in_features))  # PyTorch's error, before JAX's
        kw, kb = jax.random.split(_key(key))
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        self.in_features = in_features
        self.out_features = out_features
        self.weight = _parameter(jax.random.uniform(kw, (out_features, in_features), dtype, -bound, bound))
        self.bias = _parameter(jax.random.uniform(kb, (out_features,), dtype, -bound, bound)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = x @ self.weight.T
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Sequential(Module):
    """Modules applied one after the other.

    >>> import xgrad
    >>> net = xgrad.nn.Sequential(xgrad.nn.Linear(2, 4, key=0), xgrad.nn.Tanh())
    >>> net(xgrad.ones(1, 2)).shape
    (1, 4)
    """

    def __init__(self, *layers: Module) -> None:
        for layer in layers:
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential takes Modules, got {type(layer).__name__}")
        self.layers = list(layers)

    def forward(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer(x)
        return x

    def __getitem__(self, i: int) -> Module:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)


class MLP(Sequential):
    """``Linear`` layers of the given sizes with an activation between them (none after the last).

    Args:
        sizes: ``[in, hidden..., out]``.
        activation: a module class or factory for the nonlinearity (``ReLU`` by default).
        key: a ``jax.random`` key or int seed, split once per layer.

    >>> import xgrad
    >>> mlp = xgrad.nn.MLP([2, 4, 1], activation=xgrad.nn.Tanh, key=0)
    >>> mlp(xgrad.ones(3, 2)).shape, len(mlp.layers)
    ((3, 1), 3)
    """

    def __init__(self, sizes: Sequence[int], activation: Callable[[], Module] | None = None, *, key: Any = None, dtype: Any = jnp.float32) -> None:
        if len(sizes) < 2:
            raise ValueError(f"MLP needs at least an input and an output size, got sizes={list(sizes)}")
        make_activation = activation or ReLU
        keys = jax.random.split(_key(key), len(sizes) - 1)
        layers: list[Module] = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            layers.append(Linear(fan_in, fan_out, key=keys[i], dtype=dtype))
            if i < len(sizes) - 2:
                layers.append(make_activation())
        super().__init__(*layers)


class LayerNorm(Module):
    """Layer normalisation over the trailing ``normalized_shape`` dims, with a learned scale and shift.

    >>> import xgrad
    >>> xgrad.nn.LayerNorm(2)(xgrad.tensor([[1.0, 3.0]])).shape
    (1, 2)
    """

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True, *, dtype: Any = jnp.float32) -> None:
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = _parameter(jnp.ones(self.normalized_shape, dtype)) if elementwise_affine else None
        self.bias = _parameter(jnp.zeros(self.normalized_shape, dtype)) if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        return ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class Embedding(Module):
    """A lookup table of ``num_embeddings`` vectors of size ``embedding_dim``, initialised N(0, 1).

    >>> import xgrad
    >>> emb = xgrad.nn.Embedding(10, 3, key=0)
    >>> emb(xgrad.tensor([[1, 2], [3, 4]])).shape
    (2, 2, 3)
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *, key: Any = None, dtype: Any = jnp.float32) -> None:
        self.weight = _parameter(jax.random.normal(_key(key), (num_embeddings, embedding_dim), dtype))

    def forward(self, indices: Any) -> Tensor:
        return ops.embedding(indices, self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}"


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
        self._rng = None if key is None else _key(key)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        key = None
        if self._rng is not None:
            self._rng, key = jax.random.split(self._rng)
        return ops.dropout(x, self.p, key=key, training=True)

    def extra_repr(self) -> str:
        return f"p={self.p}"


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


class Identity(Module):
    """Returns its input.

    >>> import xgrad
    >>> xgrad.nn.Identity()(xgrad.tensor([1.0, 2.0])).tolist()
    [1.0, 2.0]
    """

    def forward(self, x: Any) -> Any:
        return x
