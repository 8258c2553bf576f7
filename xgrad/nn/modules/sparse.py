"""PyTorch's ``torch.nn.modules.sparse`` path (the classes live in ``xgrad.nn.embedding``)."""

from xgrad.nn.embedding import Embedding

__all__ = ["Embedding"]
