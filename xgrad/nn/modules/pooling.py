"""PyTorch's ``torch.nn.modules.pooling`` path (the classes live in ``xgrad.nn.pooling``)."""

from xgrad.nn.pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveMaxPool2d,
    AvgPool1d,
    AvgPool2d,
    MaxPool1d,
    MaxPool2d,
)

__all__ = ["AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d", "AvgPool1d", "AvgPool2d", "MaxPool1d", "MaxPool2d"]
