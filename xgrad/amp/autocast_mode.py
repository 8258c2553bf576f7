"""``torch.autocast``: ops in a block run in a lower precision where PyTorch's autocast says so."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from contextvars import Token
from types import MappingProxyType
from typing import Any, TypeVar

import jax.numpy as jnp

from xgrad import cuda
from xgrad.ops.autocast import AUTOCAST, POLICIES

__all__ = ["autocast", "get_autocast_dtype", "is_autocast_available", "is_autocast_enabled"]

F = TypeVar("F", bound=Callable[..., Any])

_DEFAULT_DTYPE = {"cpu": jnp.dtype(jnp.bfloat16), "cuda": jnp.dtype(jnp.float16)}
_SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def is_autocast_available(device_type: str) -> bool:
    """Whether ``autocast`` has op lists for ``device_type`` (``"cpu"`` and ``"cuda"``)."""
    return device_type in POLICIES


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    """Whether autocast is on for ``device_type`` in this context."""
    return device_type in AUTOCAST.get()


def get_autocast_dtype(device_type: str) -> Any:
    """The dtype autocast casts to on ``device_type`` (its default when autocast is off)."""
    return AUTOCAST.get().get(device_type, _DEFAULT_DTYPE.get(device_type))


class autocast:  # noqa: N801  (PyTorch's name)
    """``torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)``: in the block,
    the ops on PyTorch's autocast lists for ``device_type`` cast their floating-point arguments:
    matmuls, convolutions, ``linear`` and attention to ``dtype``; on ``cuda`` also the
    exp/log family, softmax, norms, sums and losses to float32, and on ``cpu`` the losses and
    ``prod`` (NOTE [Autocast policies] in ``xgrad/ops/autocast.py``). A ``cuda`` device is one of
    JAX's GPUs; without one, ``autocast("cuda")`` warns and does nothing, as PyTorch without CUDA.

    Usable as a context manager or a decorator; inside ``xgrad.compile`` the casts are traced
    into the program, and a step compiled under autocast is a different program from one without.
    ``cache_enabled`` is accepted: a cast is one op in xgrad's graph whether cached or not.

    >>> import xgrad
    >>> x, w = xgrad.ones(2, 3), xgrad.ones(4, 3, requires_grad=True)
    >>> with xgrad.autocast("cpu", dtype=xgrad.bfloat16):
    ...     y = xgrad.nn.functional.linear(x, w)
    >>> y.dtype
    dtype(bfloat16)
    >>> y.float().sum().backward()
    >>> w.grad.dtype
    dtype('float32')
    """

    def __init__(self, device_type: str, dtype: Any = None, enabled: bool = True, cache_enabled: bool | None = None) -> None:
        if not isinstance(device_type, str):
            raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
        if device_type not in POLICIES:
            raise RuntimeError(
                f"User specified an unsupported autocast device_type '{device_type}': xgrad's autocast has op lists "
                f"for {sorted(POLICIES)}"
            )
        self.device = device_type
        self.fast_dtype = jnp.dtype(dtype) if dtype is not None else _DEFAULT_DTYPE[device_type]
        self._enabled = bool(enabled)
        if self._enabled and device_type == "cuda" and not cuda.is_available():
            warnings.warn(
                "User provided device_type of 'cuda', but CUDA is not available (JAX sees no GPU). Disabling",
                UserWarning, stacklevel=2,
            )
            self._enabled = False
        if self._enabled and self.fast_dtype not in _SUPPORTED_DTYPES:
            warnings.warn(
                f"In {device_type} autocast, but the target dtype {self.fast_dtype} is not supported (bfloat16 and "
                "float16 are). Disabling autocast.", UserWarning, stacklevel=2,
            )
            self._enabled = False
        self._tokens: list[Token[Any]] = []

    def __enter__(self) -> autocast:
        state = dict(AUTOCAST.get())
        if self._enabled:
            state[self.device] = self.fast_dtype
        else:
            state.pop(self.device, None)
        self._tokens.append(AUTOCAST.set(MappingProxyType(state)))
        return self

    def __exit__(self, *exc: object) -> None:
        AUTOCAST.reset(self._tokens.pop())

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def under_autocast(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return under_autocast  # type: ignore[return-value]
