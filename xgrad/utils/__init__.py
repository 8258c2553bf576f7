"""``xgrad.utils``: helpers around autograd (activation checkpointing) and data loading (``xgrad.utils.data``).

``xgrad.utils.checkpoint`` is the module (``xgrad.utils.checkpoint.checkpoint``, as in
PyTorch) and is itself callable as that function (``xgrad.utils.checkpoint(fn, *args)``).
"""

from xgrad.utils import checkpoint, data
from xgrad.utils.checkpoint import CheckpointError, set_checkpoint_debug_enabled, set_checkpoint_early_stop

__all__ = ["CheckpointError", "checkpoint", "data", "set_checkpoint_debug_enabled", "set_checkpoint_early_stop"]
