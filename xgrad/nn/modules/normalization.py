"""PyTorch's ``torch.nn.modules.normalization`` path (the classes live in ``xgrad.nn.normalization``)."""

from xgrad.nn.normalization import GroupNorm, LayerNorm

__all__ = ["GroupNorm", "LayerNorm"]
