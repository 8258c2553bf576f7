"""PyTorch's ``torch.nn.modules.conv`` path (the classes live in ``xgrad.nn.conv``)."""

from xgrad.nn.conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"]
