"""``torch.amp``: autocast (ops in a lower precision where PyTorch's lists say so) and loss scaling.

>>> import xgrad
>>> with xgrad.amp.autocast("cpu"):
...     (xgrad.ones(2, 2) @ xgrad.ones(2, 2)).dtype
dtype(bfloat16)
"""

from xgrad.amp.autocast_mode import autocast, get_autocast_dtype, is_autocast_available, is_autocast_enabled
from xgrad.amp.grad_scaler import GradScaler

__all__ = ["GradScaler", "autocast", "get_autocast_dtype", "is_autocast_available", "is_autocast_enabled"]
