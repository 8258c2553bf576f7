"""``xgrad.nn.functional``: the functional forms of the layers, as ``torch.nn.functional`` names them.

They are xgrad's ops (also at the top level, ``xgrad.relu``, and as Tensor methods);
this module gathers the ones ``torch.nn.functional`` holds, so ``F.relu`` reads as in PyTorch.

>>> import xgrad
>>> import xgrad.nn.functional as F
>>> F.relu(xgrad.tensor([-1.0, 2.0])).tolist()
[0.0, 2.0]
"""

from xgrad.ops import (
    alpha_dropout,
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    celu,
    conv2d,
    cosine_embedding_loss,
    cosine_similarity,
    cross_entropy,
    dropout,
    dropout1d,
    dropout2d,
    elu,
    embedding,
    gelu,
    glu,
    hardshrink,
    hardsigmoid,
    hardswish,
    hardtanh,
    huber_loss,
    interpolate,
    kl_div,
    l1_loss,
    layer_norm,
    leaky_relu,
    linear,
    log_softmax,
    logsigmoid,
    margin_ranking_loss,
    mish,
    mse_loss,
    nll_loss,
    normalize,
    one_hot,
    pad,
    prelu,
    relu,
    relu6,
    scaled_dot_product_attention,
    selu,
    sigmoid,
    silu,
    smooth_l1_loss,
    softmax,
    softmin,
    softplus,
    softshrink,
    softsign,
    tanh,
    tanhshrink,
    threshold,
)

__all__ = [
    "alpha_dropout", "binary_cross_entropy", "binary_cross_entropy_with_logits", "celu", "conv2d",
    "cosine_embedding_loss", "cosine_similarity", "cross_entropy", "dropout", "dropout1d", "dropout2d", "elu",
    "embedding", "gelu", "glu", "hardshrink", "hardsigmoid", "hardswish", "hardtanh", "huber_loss", "interpolate",
    "kl_div", "l1_loss", "layer_norm", "leaky_relu", "linear", "log_softmax", "logsigmoid", "margin_ranking_loss",
    "mish", "mse_loss", "nll_loss", "normalize", "one_hot", "pad", "prelu", "relu", "relu6",
    "scaled_dot_product_attention", "selu", "sigmoid", "silu", "smooth_l1_loss", "softmax", "softmin", "softplus",
    "softshrink", "softsign", "tanh", "tanhshrink", "threshold",
]
