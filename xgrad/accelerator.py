"""``torch.accelerator``: the accelerator JAX sees (a GPU), or none.

>>> import xgrad
>>> xgrad.accelerator.current_accelerator() is None or xgrad.accelerator.is_available()
True
"""

from __future__ import annotations

from xgrad import cuda
from xgrad.creation import device

__all__ = ["current_accelerator", "device_count", "is_available"]


def is_available() -> bool:
    """Whether an accelerator (a GPU JAX sees) is available."""
    return cuda.is_available()


def current_accelerator(check_available: bool = False) -> device | None:
    """``device("cuda")`` when JAX sees a GPU, else ``None`` (as a PyTorch build without one)."""
    return device("cuda") if cuda.is_available() else None


def device_count() -> int:
    return cuda.device_count()
