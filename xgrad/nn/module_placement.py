"""Where a module's state lives: ``Module.to``, ``float``/``double``/``half``/``bfloat16``, ``cpu``/``cuda``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from xgrad import step_trace
from xgrad.tensor import Tensor
from xgrad.tensor.devices import resolve_device

__all__ = ["ModulePlacement"]

ERR_NO_X64 = (
    "{call} asks for {dtype}, but JAX's 64-bit mode is off, so JAX would silently keep 32 bits. Turn it on at startup "
    'with jax.config.update("jax_enable_x64", True) (before making tensors), or keep float32.'
)
ERR_NO_GPU = (
    "Module.cuda(): JAX sees no GPU (its devices are {platforms}). Install a CUDA build of JAX "
    '(pip install "jax[cuda12]") on a machine with a GPU, or keep the module on the CPU.'
)


def _checked(dtype: Any, call: str) -> Any:
    dtype = jnp.dtype(dtype)
    if jax.dtypes.canonicalize_dtype(dtype) != dtype:  # a 64-bit type while x64 is off (also a scoped jax.enable_x64)
        raise RuntimeError(ERR_NO_X64.format(call=call, dtype=dtype))
    return dtype


class ModulePlacement:
    """The placement half of ``nn.Module``: moving and casting its parameters and buffers in place."""

    named_parameters: Callable[..., Iterator[tuple[str, Tensor]]]
    named_buffers: Callable[..., Iterator[tuple[str, Tensor]]]

    def to(self, *args: Any, device: Any = None, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        """Move parameters and buffers to a device and/or cast the floating ones to a dtype, in place.

        ``to(device)``, ``to(dtype)``, ``to(device, dtype)``, ``to(tensor)`` (its device and
        dtype) or keywords, as in PyTorch: a device is a ``jax.Device``, a ``Sharding`` or a
        name (``"cpu"``, ``"cuda:1"``); integer buffers keep their dtype. The same Tensor
        objects are kept (optimizers holding them stay valid); their ``.grad`` moves with
        them. ``non_blocking`` and ``memory_format`` are accepted and change nothing.

        >>> import xgrad, jax.numpy as jnp
        >>> layer = xgrad.nn.Linear(2, 2, key=0).to(jnp.float16)
        >>> layer.weight.dtype, layer.weight.requires_grad
        (dtype('float16'), True)
        """
        unknown = set(kwargs) - {"memory_format"}
        if unknown:
            raise TypeError(f"to() got an unexpected keyword argument '{sorted(unknown)[0]}'")
        for arg in args:
            if isinstance(arg, Tensor):
                device, dtype = arg.sharding, arg.dtype
            elif isinstance(arg, (str, jax.Device, jax.sharding.Sharding)):
                device = arg
            else:
                dtype = arg
        if dtype is not None:
            dtype = jnp.dtype(dtype)
            if not jnp.issubdtype(dtype, jnp.inexact):
                raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, but got desired dtype={dtype}")
            _checked(dtype, "Module.to")
        return self._convert(resolve_device(device), dtype, (jnp.inexact,))

    def float(self) -> Any:
        """Cast floating parameters and buffers to ``float32``; returns ``self``."""
        return self._convert(None, jnp.dtype(jnp.float32), (jnp.floating,))

    def double(self) -> Any:
        """Cast floating parameters and buffers to ``float64`` (needs ``jax_enable_x64``); returns ``self``."""
        return self._convert(None, _checked(jnp.float64, "Module.double()"), (jnp.floating,))

    def half(self) -> Any:
        """Cast floating parameters and buffers to ``float16``; returns ``self``."""
        return self._convert(None, jnp.dtype(jnp.float16), (jnp.floating,))

    def bfloat16(self) -> Any:
        """Cast floating parameters and buffers to ``bfloat16``; returns ``self``."""
        return self._convert(None, jnp.dtype(jnp.bfloat16), (jnp.floating,))

    def cpu(self) -> Any:
        """Move parameters and buffers to the first CPU device; returns ``self``."""
        return self._convert(jax.devices("cpu")[0], None, ())

    def cuda(self, device: Any = None) -> Any:
        """Move parameters and buffers to a GPU (``device``: an index, a name or a ``jax.Device``); returns ``self``."""
        platforms = {d.platform for d in jax.devices()}
        if "gpu" not in platforms:
            raise RuntimeError(ERR_NO_GPU.format(platforms=", ".join(sorted(platforms))))
        if device is None or isinstance(device, int):
            device = f"cuda:{device or 0}"
        return self._convert(resolve_device(device), None, ())

    def _convert(self, target: Any, dtype: Any, cast_kinds: tuple[Any, ...]) -> Any:
        """Give every parameter and buffer (each once) its array cast (if its dtype is one of ``cast_kinds``) and placed."""

        def convert(array: Any) -> Any:
            if dtype is not None and any(jnp.issubdtype(array.dtype, kind) for kind in cast_kinds):
                array = array.astype(dtype)
            return array if target is None else jax.device_put(array, target)

        seen: set[int] = set()
        tensors = [t for _, t in self.named_parameters()] + [t for _, t in self.named_buffers()]
        for t in tensors:
            if id(t) in seen:
                continue
            seen.add(id(t))
            _replace_storage(t, convert(t.array))
            if t.grad is not None:
                t._grad = Tensor(convert(t.grad.array))
        return self


def _replace_storage(t: Tensor, array: Any) -> None:
    """Give ``t`` a new array (possibly another dtype or device) as an in-place op would: the version moves on."""
    if array is t.array:
        return
    trace = step_trace.current()
    if trace is not None:  # NOTE [The step-trace seam]
        trace.write(t)
    t._array = array
    t._version += 1
