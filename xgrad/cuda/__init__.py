"""``torch.cuda``'s queries, answered by JAX: a CUDA device is one of JAX's ``gpu`` devices.

>>> import xgrad
>>> xgrad.cuda.is_available() == bool(xgrad.cuda.device_count())
True
"""

from __future__ import annotations

from typing import Any

import jax

from xgrad.generator import manual_seed as _manual_seed

__all__ = ["current_device", "device_count", "is_available", "manual_seed", "manual_seed_all", "synchronize"]


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


def current_device() -> int:
    """The index of the default GPU: 0 (JAX has no per-thread current device)."""
    if not _gpus():
        raise RuntimeError("No CUDA GPUs are available")
    return 0


def manual_seed(seed: int) -> None:
    """Seeds the default generator, which every device draws from (``xgrad.manual_seed``)."""
    _manual_seed(seed)


manual_seed_all = manual_seed


def synchronize(device: Any = None) -> None:
    """Wait until every computation dispatched so far has finished (``jax.effects_barrier``)."""
    jax.effects_barrier()
