"""``xgrad.utils``: helpers around autograd (activation checkpointing)."""

from xgrad.utils.checkpoint import CheckpointError, checkpoint, set_checkpoint_debug_enabled, set_checkpoint_early_stop

__all__ = ["CheckpointError", "checkpoint", "set_checkpoint_debug_enabled", "set_checkpoint_early_stop"]
