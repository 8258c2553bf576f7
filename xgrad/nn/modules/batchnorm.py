"""PyTorch's ``torch.nn.modules.batchnorm`` path (the classes live in ``xgrad.nn.normalization``)."""

from xgrad.nn.normalization import BatchNorm1d, BatchNorm2d

__all__ = ["BatchNorm1d", "BatchNorm2d"]
