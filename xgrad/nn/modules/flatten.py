"""PyTorch's ``torch.nn.modules.flatten`` path (the classes live in ``xgrad.nn.flatten``)."""

from xgrad.nn.flatten import Flatten, Unflatten

__all__ = ["Flatten", "Unflatten"]
