"""PyTorch's ``torch.nn.modules.normalization`` path (the classes live in ``xgrad.nn.normalization``)."""

from xgrad.nn.normalization import LayerNorm

__all__ = ["LayerNorm"]
