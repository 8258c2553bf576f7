"""``torch.cuda``'s queries, answered by JAX: a CUDA device is one of JAX's ``gpu`` devices.

>>> import xgrad
>>> xgrad.cuda.is_available() == bool(xgrad.cuda.device_count())
True
"""

from __future__ import annotations

from typing import Any

import jax

from xgrad.generator import manual_seed as _manual_seed

__all__ = [
    "amp", "current_device", "device_count", "empty_cache", "get_device_name", "is_available", "is_bf16_supported",
    "manual_seed", "manual_seed_all", "set_device", "synchronize",
]


def _gpus() -> list[Any]:
    try:
        return jax.devices("gpu")
    except RuntimeError:  # no GPU backend in this JAX
        return []


def is_available() -> bool:
    """Whether JAX sees a GPU."""
    return bool(_gpus())


def device_count() -> int:
    """How many GPUs JAX sees (0 without one)."""
    return len(_gpus())


def _gpu(device: Any) -> Any:
    gpus = _gpus()
    if not gpus:
        raise RuntimeError("No CUDA GPUs are available")
    index = getattr(device, "index", device)
    if isinstance(index, str):
        index = index.rpartition(":")[2] or 0
    index = int(index or 0)
    if not 0 <= index < len(gpus):
        raise RuntimeError(f"CUDA error: invalid device ordinal {index} (there are {len(gpus)} GPUs)")
    return gpus[index]


def current_device() -> int:
    """The index of the default GPU: 0 (JAX has no per-thread current device)."""
    _gpu(0)
    return 0


def set_device(device: Any) -> None:
    """Check ``device`` names a GPU JAX sees; place tensors with ``device=``/``.to()`` (JAX has no current device)."""
    _gpu(device)


def get_device_name(device: Any = None) -> str:
    """The GPU's name as JAX reports it (``device_kind``, such as ``"NVIDIA H100 80GB HBM3"``)."""
    return str(_gpu(device).device_kind)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether JAX sees a GPU: XLA runs bfloat16 on every GPU it supports (emulated where the chip lacks it)."""
    return is_available()


def empty_cache() -> None:
    """Nothing for xgrad to release: XLA owns JAX's GPU memory pool (``XLA_PYTHON_CLIENT_PREALLOCATE`` and
    ``XLA_PYTHON_CLIENT_ALLOCATOR`` configure it)."""


def manual_seed(seed: int) -> None:
    """Seeds the default generator, which every device draws from (``xgrad.manual_seed``)."""
    _manual_seed(seed)


manual_seed_all = manual_seed


def synchronize(device: Any = None) -> None:
    """Wait until every computation dispatched so far has finished (``jax.effects_barrier``)."""
    jax.effects_barrier()


from xgrad.cuda import amp  # noqa: E402  (torch.cuda.amp; it imports this module's is_available)
