"""PyTorch's ``torch.nn.modules.distance`` path (the classes live in ``xgrad.nn.loss`` and ``xgrad.nn.rarer_losses``)."""

from xgrad.nn.loss import CosineSimilarity
from xgrad.nn.rarer_losses import PairwiseDistance

__all__ = ["CosineSimilarity", "PairwiseDistance"]
