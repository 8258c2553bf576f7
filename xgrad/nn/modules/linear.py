"""PyTorch's ``torch.nn.modules.linear`` path (the classes live in ``xgrad.nn.linear``)."""

from xgrad.nn.linear import Identity, Linear

# PyTorch's class of MultiheadAttention's out_proj (a Linear that quantization skips); a Linear here,
# importable from this path (checkpoints' safe_globals name it) but, as PyTorch's, not in ``__all__``.
NonDynamicallyQuantizableLinear = Linear

__all__ = ["Identity", "Linear"]
