"""PyTorch's ``torch.nn.modules.pixelshuffle`` path (the classes live in ``xgrad.nn.upsampling``)."""

from xgrad.nn.upsampling import PixelShuffle, PixelUnshuffle

__all__ = ["PixelShuffle", "PixelUnshuffle"]
