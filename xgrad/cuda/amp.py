"""``torch.cuda.amp``: PyTorch's older spellings of ``xgrad.amp``'s ``autocast("cuda")`` and ``GradScaler("cuda")``.

PyTorch deprecates them with a ``FutureWarning`` naming the ``torch.amp`` form; so does xgrad.
"""

from __future__ import annotations

import warnings
from typing import Any

from xgrad.amp import autocast as _autocast
from xgrad.amp.grad_scaler import GradScaler as _GradScaler

__all__ = ["GradScaler", "autocast"]


class autocast(_autocast):  # noqa: N801  (PyTorch's name)
    """``torch.cuda.amp.autocast(args...)``: ``xgrad.amp.autocast("cuda", args...)``."""

    def __init__(self, enabled: bool = True, dtype: Any = None, cache_enabled: bool = True) -> None:
        warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cuda', args...)` "
                      "instead.", FutureWarning, stacklevel=2)
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(_GradScaler):
    """``torch.cuda.amp.GradScaler(args...)``: ``xgrad.amp.GradScaler("cuda", args...)``."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        warnings.warn("`torch.cuda.amp.GradScaler(args...)` is deprecated. Please use `torch.amp.GradScaler('cuda', "
                      "args...)` instead.", FutureWarning, stacklevel=2)
        super().__init__("cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled)
