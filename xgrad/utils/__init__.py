"""``xgrad.utils``: helpers around autograd (activation checkpointing)."""

from xgrad.utils.checkpoint import CheckpointError, checkpoint

__all__ = ["CheckpointError", "checkpoint"]
