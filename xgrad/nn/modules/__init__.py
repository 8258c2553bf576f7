"""PyTorch's ``torch.nn.modules`` paths, so ``from torch.nn.modules.module import ...`` and the
class paths of a whole-model checkpoint's ``safe_globals`` (``torch.nn.modules.rnn.LSTM``) port with
their import changed. Each path's ``__all__`` is where its layers' names are written: ``xgrad.nn``
takes them from here (NOTE [Layer names live at PyTorch's paths] in ``xgrad/nn/__init__.py``)."""

from xgrad.nn.modules import (
    activation,
    batchnorm,
    container,
    conv,
    distance,
    dropout,
    flatten,
    linear,
    loss,
    module,
    normalization,
    pixelshuffle,
    pooling,
    rnn,
    sparse,
    transformer,
    upsampling,
)

__all__ = [
    "activation", "batchnorm", "container", "conv", "distance", "dropout", "flatten", "linear", "loss", "module",
    "normalization", "pixelshuffle", "pooling", "rnn", "sparse", "transformer", "upsampling",
]
