"""``xgrad.utils``: helpers around autograd (activation checkpointing) and data loading (``xgrad.utils.data``).

``xgrad.utils.checkpoint`` is the module (``xgrad.utils.checkpoint.checkpoint``, as in
PyTorch) and is itself callable as that function (``xgrad.utils.checkpoint(fn, *args)``).
``traced_checks(False)`` leaves the host callbacks of index and value checks out of ``jax.jit``
programs, for ``jax.export``.
"""

from xgrad.ops._util import traced_checks
from xgrad.utils import checkpoint, data
from xgrad.utils.checkpoint import CheckpointError, set_checkpoint_debug_enabled, set_checkpoint_early_stop

__all__ = [
    "CheckpointError", "checkpoint", "data", "set_checkpoint_debug_enabled", "set_checkpoint_early_stop", "traced_checks",
]
