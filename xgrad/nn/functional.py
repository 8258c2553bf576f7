"""``xgrad.nn.functional``: the functional forms of the layers, as ``torch.nn.functional`` names them.

They are xgrad's ops (also at the top level, ``xgrad.relu``, and as Tensor methods);
this module gathers the ones ``torch.nn.functional`` holds, so ``F.relu`` reads as in PyTorch.

>>> import xgrad
>>> import xgrad.nn.functional as F
>>> F.relu(xgrad.tensor([-1.0, 2.0])).tolist()
[0.0, 2.0]
"""

from xgrad.ops import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    conv2d,
    cross_entropy,
    dropout,
    embedding,
    gelu,
    interpolate,
    layer_norm,
    linear,
    log_softmax,
    mse_loss,
    nll_loss,
    normalize,
    one_hot,
    pad,
    relu,
    scaled_dot_product_attention,
    sigmoid,
    silu,
    softmax,
    softplus,
    tanh,
)

__all__ = [
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "conv2d", "cross_entropy", "dropout", "embedding", "gelu",
    "interpolate", "layer_norm", "linear", "log_softmax", "mse_loss", "nll_loss", "normalize", "one_hot", "pad", "relu",
    "scaled_dot_product_attention", "sigmoid", "silu", "softmax", "softplus", "tanh",
]
