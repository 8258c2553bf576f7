"""``Module``, ``Parameter``, buffers, containers and the layers PyTorch users reach for first.

A module's state lives in its attributes, as in PyTorch: an ``nn.Parameter`` attribute
is a parameter, a ``register_buffer`` name is a buffer, a ``Module`` attribute is a
submodule, and so is every Module inside a list, tuple or dict attribute (named
``attr.0``, ``attr.key``, as ``ModuleList``/``ModuleDict`` would name them), so a
submodule is never silently left out. Containers (``Sequential``, ``ModuleList``,
``ModuleDict``) hold their children by key, so ``state_dict`` keys are PyTorch's:
``0.weight`` in a ``Sequential``, and a PyTorch checkpoint saved as safetensors loads
without renaming.

>>> import xgrad
>>> model = xgrad.nn.MLP([4, 8, 3], key=0)
>>> [name for name, _ in model.named_parameters()]
['0.weight', '0.bias', '2.weight', '2.bias']
>>> model(xgrad.ones(2, 4)).shape
(2, 3)
"""

from typing import TYPE_CHECKING, Any

from xgrad.missing_names import missing_attribute
from xgrad.nn import functional, init, modules, parallel, utils
from xgrad.nn.activation import (
    CELU,
    ELU,
    GELU,
    GLU,
    SELU,
    Hardshrink,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    LeakyReLU,
    LogSigmoid,
    LogSoftmax,
    Mish,
    PReLU,
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmax,
    Softmin,
    Softplus,
    Softshrink,
    Softsign,
    Tanh,
    Tanhshrink,
    Threshold,
)
from xgrad.nn.containers import ModuleDict, ModuleList, Sequential
from xgrad.nn.conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from xgrad.nn.dropout import AlphaDropout, Dropout, Dropout1d, Dropout2d, Dropout3d, FeatureAlphaDropout
from xgrad.nn.embedding import Embedding
from xgrad.nn.flatten import Flatten, Unflatten
from xgrad.nn.linear import MLP, Identity, Linear
from xgrad.nn.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CosineEmbeddingLoss,
    CosineSimilarity,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MarginRankingLoss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from xgrad.nn.module import Module, Parameter
from xgrad.nn.normalization import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm
from xgrad.nn.parallel import DataParallel, DistributedDataParallel
from xgrad.nn.pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
)
from xgrad.nn.rarer_losses import (
    CTCLoss,
    GaussianNLLLoss,
    HingeEmbeddingLoss,
    MultiLabelMarginLoss,
    MultiLabelSoftMarginLoss,
    MultiMarginLoss,
    PairwiseDistance,
    PoissonNLLLoss,
    SoftMarginLoss,
    TripletMarginLoss,
)
from xgrad.nn.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from xgrad.nn.transformer import (
    MultiheadAttention,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from xgrad.nn.upsampling import PixelShuffle, PixelUnshuffle, Upsample, UpsamplingBilinear2d, UpsamplingNearest2d

__all__ = [
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
    "AlphaDropout", "AvgPool1d", "AvgPool2d", "AvgPool3d", "BCELoss", "BCEWithLogitsLoss", "BatchNorm1d",
    "BatchNorm2d", "CELU", "CTCLoss", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
    "ConvTranspose3d", "CosineEmbeddingLoss", "CosineSimilarity", "CrossEntropyLoss", "DataParallel",
    "DistributedDataParallel", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "ELU", "Embedding",
    "FeatureAlphaDropout", "Flatten", "GELU", "GLU", "GRU", "GRUCell", "GaussianNLLLoss", "GroupNorm", "Hardshrink",
    "Hardsigmoid", "Hardswish", "Hardtanh", "HingeEmbeddingLoss", "HuberLoss", "Identity", "KLDivLoss", "L1Loss",
    "LSTM", "LSTMCell", "LayerNorm", "LeakyReLU", "Linear", "LogSigmoid", "LogSoftmax", "MLP", "MSELoss",
    "MarginRankingLoss", "MaxPool1d", "MaxPool2d", "MaxPool3d", "Mish", "Module", "ModuleDict", "ModuleList",
    "MultiLabelMarginLoss", "MultiLabelSoftMarginLoss", "MultiMarginLoss", "MultiheadAttention", "NLLLoss", "PReLU",
    "PairwiseDistance", "Parameter", "PixelShuffle", "PixelUnshuffle", "PoissonNLLLoss", "RNN", "RNNCell", "ReLU",
    "ReLU6", "SELU", "Sequential", "SiLU", "Sigmoid", "SmoothL1Loss", "SoftMarginLoss", "Softmax", "Softmin",
    "Softplus", "Softshrink", "Softsign", "Tanh", "Tanhshrink", "Threshold", "Transformer", "TransformerDecoder",
    "TransformerDecoderLayer", "TransformerEncoder", "TransformerEncoderLayer", "TripletMarginLoss", "Unflatten",
    "Upsample", "UpsamplingBilinear2d", "UpsamplingNearest2d", "functional", "init", "modules", "parallel", "utils"
]


if not TYPE_CHECKING:  # for type checkers a missing name stays an error, not ``Any``

    def __getattr__(name: str) -> Any:  # reached only for a name this module does not have
        raise missing_attribute("torch.nn", "module 'xgrad.nn'", name)
