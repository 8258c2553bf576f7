"""PyTorch's ``torch.nn.modules.upsampling`` path (the classes live in ``xgrad.nn.upsampling``)."""

from xgrad.nn.upsampling import Upsample, UpsamplingBilinear2d, UpsamplingNearest2d

__all__ = ["Upsample", "UpsamplingBilinear2d", "UpsamplingNearest2d"]
