"""PyTorch's ``torch.nn.modules.container`` path (the classes live in ``xgrad.nn.containers``)."""

from xgrad.nn.containers import ModuleDict, ModuleList, Sequential

__all__ = ["ModuleDict", "ModuleList", "Sequential"]
