"""``torch.nn.init``: fill a tensor in place, under ``no_grad``, and return it.

Random fills draw from xgrad's default generator (``xgrad.manual_seed`` makes them
reproducible; inside ``xgrad.compile`` the key is state of the step, as for ``randn``),
or from ``generator=``: a ``jax.random`` key or an int seed, what ``key=`` takes
elsewhere, or a ``KeyState`` (``xgrad.generator``), drawn from as a
``torch.Generator`` would be. The formulas (fans, gains, bounds) are PyTorch's.

>>> import xgrad
>>> w = xgrad.nn.init.xavier_uniform_(xgrad.zeros(3, 5))
>>> bound = (6 / (3 + 5)) ** 0.5
>>> bool((w.abs() <= bound).all())
True
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.generator import generator_key, next_key
from xgrad.grad_mode import no_grad
from xgrad.tensor import Tensor

__all__ = [
    "calculate_gain", "constant_", "eye_", "kaiming_normal_", "kaiming_uniform_", "normal_", "ones_", "orthogonal_",
    "prng_key", "trunc_normal_", "uniform_", "xavier_normal_", "xavier_uniform_", "zeros_",
]

_LINEAR_GAIN_NAMES = (
    "linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "sigmoid",
)


def prng_key(key: Any) -> jax.Array:
    """A ``jax.random`` key from a key, an int seed, or the default key when ``None``.

    >>> from xgrad.nn.init import prng_key
    >>> bool((jax.random.key_data(prng_key(0)) == jax.random.key_data(jax.random.key(0))).all())
    True
    """
    if key is None:
        return next_key()
    if isinstance(key, int):
        return jax.random.key(key)
    return key


def calculate_gain(nonlinearity: str, param: Any = None) -> float:
    """The recommended gain for ``nonlinearity`` (PyTorch's table).

    >>> calculate_gain("tanh")
    1.6666666666666667
    """
    if nonlinearity in _LINEAR_GAIN_NAMES:
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            negative_slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, (int, float)):
            negative_slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + negative_slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _fill(tensor: Tensor, values: Any) -> Tensor:
    with no_grad():
        return tensor.copy_(Tensor(jnp.asarray(values, tensor.dtype)))


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Tensor:
    """Fill ``tensor`` with draws from ``U(a, b)``.

    >>> import xgrad
    >>> w = uniform_(xgrad.zeros(4), -1.0, 1.0, generator=0)
    >>> bool(((w >= -1) & (w < 1)).all())
    True
    """
    with no_grad():
        return tensor.uniform_(a, b, generator=generator)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Tensor:
    """Fill ``tensor`` with draws from ``N(mean, std^2)``.

    >>> import xgrad
    >>> normal_(xgrad.zeros(2, 3), std=0.02).shape
    (2, 3)
    """
    with no_grad():
        return tensor.normal_(mean, std, generator=generator)


def trunc_normal_(
    tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0, generator: Any = None
) -> Tensor:
    """Fill ``tensor`` with draws from ``N(mean, std^2)`` truncated to ``[a, b]``.

    >>> import xgrad
    >>> w = trunc_normal_(xgrad.zeros(100), std=1.0, a=-0.5, b=0.5)
    >>> bool(((w >= -0.5) & (w <= 0.5)).all())
    True
    """
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn(
            "mean is more than 2 std from [a, b] in nn.init.trunc_normal_. The distribution of values may be incorrect.",
            stacklevel=2,
        )
    lower, upper = (a - mean) / std, (b - mean) / std
    standard = jax.random.truncated_normal(generator_key(generator), lower, upper, tensor.shape, tensor.dtype)
    return _fill(tensor, jnp.clip(mean + std * standard, a, b))  # clip as PyTorch does, against rounding


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill ``tensor`` with ``val``.

    >>> import xgrad
    >>> constant_(xgrad.zeros(2), 0.5).tolist()
    [0.5, 0.5]
    """
    with no_grad():
        return tensor.fill_(val)


def ones_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with ones.

    >>> import xgrad
    >>> ones_(xgrad.zeros(2)).tolist()
    [1.0, 1.0]
    """
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    """Fill ``tensor`` with zeros.

    >>> import xgrad
    >>> zeros_(xgrad.ones(2)).tolist()
    [0.0, 0.0]
    """
    return constant_(tensor, 0.0)


def eye_(tensor: Tensor) -> Tensor:
    """Fill a 2-D ``tensor`` with the identity (ones on the diagonal of a rectangle too).

    >>> import xgrad
    >>> eye_(xgrad.zeros(2, 3)).tolist()
    [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    """
    if tensor.ndim != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    return _fill(tensor, jnp.eye(tensor.shape[0], tensor.shape[1]))


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    if tensor.ndim < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
    receptive_field_size = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive_field_size, tensor.shape[0] * receptive_field_size


def _calculate_correct_fan(tensor: Tensor, mode: str) -> int:
    mode = mode.lower()
    valid_modes = ["fan_in", "fan_out"]
    if mode not in valid_modes:
        raise ValueError(f"Mode {mode} not supported, please use one of {valid_modes}")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Glorot uniform: ``U(-a, a)`` with ``a = gain * sqrt(6 / (fan_in + fan_out))``.

    >>> import xgrad
    >>> xavier_uniform_(xgrad.zeros(3, 5)).shape
    (3, 5)
    """
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = math.sqrt(3.0) * gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Glorot normal: ``N(0, std^2)`` with ``std = gain * sqrt(2 / (fan_in + fan_out))``.

    >>> import xgrad
    >>> xavier_normal_(xgrad.zeros(3, 5)).shape
    (3, 5)
    """
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)), generator)


def _kaiming_std(tensor: Tensor, a: float, mode: str, nonlinearity: str) -> float | None:
    """He's ``gain / sqrt(fan)``, or ``None`` (with PyTorch's warning) for a tensor with no elements."""
    if 0 in tensor.shape:
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=3)
        return None
    return calculate_gain(nonlinearity, a) / math.sqrt(_calculate_correct_fan(tensor, mode))


def kaiming_uniform_(
    tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", generator: Any = None
) -> Tensor:
    """He uniform: ``U(-bound, bound)`` with ``bound = gain * sqrt(3 / fan_mode)``.

    >>> import xgrad
    >>> kaiming_uniform_(xgrad.zeros(4, 3), a=5 ** 0.5).shape
    (4, 3)
    """
    std = _kaiming_std(tensor, a, mode, nonlinearity)
    if std is None:
        return tensor
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(
    tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu", generator: Any = None
) -> Tensor:
    """He normal: ``N(0, std^2)`` with ``std = gain / sqrt(fan_mode)``.

    >>> import xgrad
    >>> kaiming_normal_(xgrad.zeros(4, 3), mode="fan_out", nonlinearity="relu").shape
    (4, 3)
    """
    std = _kaiming_std(tensor, a, mode, nonlinearity)
    if std is None:
        return tensor
    return normal_(tensor, 0.0, std, generator)


def orthogonal_(tensor: Tensor, gain: float = 1, generator: Any = None) -> Tensor:
    """A (semi-)orthogonal matrix times ``gain``, from the QR of a normal draw; trailing dims are flattened.

    >>> import xgrad
    >>> q = orthogonal_(xgrad.zeros(3, 3))
    >>> bool(((q.T @ q - xgrad.eye(3)).abs() < 1e-5).all())
    True
    """
    if tensor.ndim < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if tensor.numel() == 0:
        return tensor  # nothing to fill, as PyTorch
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    flattened = jax.random.normal(generator_key(generator), (rows, cols), tensor.dtype)
    if rows < cols:
        flattened = flattened.T
    q, r = jnp.linalg.qr(flattened)
    q = q * jnp.sign(jnp.diagonal(r))  # makes the decomposition unique, so Q is uniformly distributed
    if rows < cols:
        q = q.T
    return _fill(tensor, gain * q.reshape(tensor.shape))
