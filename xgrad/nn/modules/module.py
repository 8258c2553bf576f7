"""PyTorch's ``torch.nn.modules.module``: ``Module`` and the global module hooks."""

from xgrad.nn.hooks import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
    register_module_full_backward_hook,
    register_module_full_backward_pre_hook,
)
from xgrad.nn.module import Module

__all__ = [
    "Module", "register_module_forward_hook", "register_module_forward_pre_hook", "register_module_full_backward_hook",
    "register_module_full_backward_pre_hook",
]
