"""PyTorch's ``torch.nn.modules`` paths, so ``from torch.nn.modules.module import ...`` and the
class paths of a whole-model checkpoint's ``safe_globals`` (``torch.nn.modules.rnn.LSTM``) port with
their import changed."""

from xgrad.nn.modules import (
    activation,
    batchnorm,
    container,
    conv,
    dropout,
    flatten,
    linear,
    loss,
    module,
    normalization,
    pooling,
    rnn,
    sparse,
    transformer,
)

__all__ = ["activation", "batchnorm", "container", "conv", "dropout", "flatten", "linear", "loss", "module", "normalization", "pooling", "rnn", "sparse", "transformer"]
