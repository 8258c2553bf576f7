"""PyTorch's ``torch.nn.modules`` path, so ``from torch.nn.modules.module import ...`` ports with its import changed."""

from xgrad.nn.modules import module

__all__ = ["module"]
