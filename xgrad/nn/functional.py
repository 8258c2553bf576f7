"""``xgrad.nn.functional``: the functional forms of the layers, as ``torch.nn.functional`` names them.

They are xgrad's ops (also at the top level, ``xgrad.relu``, and as Tensor methods);
this module gathers every one that ``torch.nn.functional`` holds, so ``F.relu`` reads as in
PyTorch. ``F.unfold`` is PyTorch's im2col, not ``Tensor.unfold``: it is not here.

>>> import xgrad
>>> import xgrad.nn.functional as F
>>> F.relu(xgrad.tensor([-1.0, 2.0])).tolist()
[0.0, 2.0]
"""

from typing import TYPE_CHECKING, Any

from xgrad.missing_names import missing_attribute
from xgrad.ops import (
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_avg_pool3d,
    adaptive_max_pool2d,
    adaptive_max_pool3d,
    alpha_dropout,
    avg_pool1d,
    avg_pool2d,
    avg_pool3d,
    batch_norm,
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    celu,
    conv1d,
    conv2d,
    conv3d,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
    cosine_embedding_loss,
    cosine_similarity,
    cross_entropy,
    ctc_loss,
    dropout,
    dropout1d,
    dropout2d,
    dropout3d,
    elu,
    embedding,
    feature_alpha_dropout,
    gaussian_nll_loss,
    gelu,
    glu,
    group_norm,
    hardshrink,
    hardsigmoid,
    hardswish,
    hardtanh,
    hinge_embedding_loss,
    huber_loss,
    instance_norm,
    interpolate,
    kl_div,
    l1_loss,
    layer_norm,
    leaky_relu,
    linear,
    log_softmax,
    logsigmoid,
    margin_ranking_loss,
    max_pool1d,
    max_pool2d,
    max_pool3d,
    mish,
    mse_loss,
    multi_margin_loss,
    multilabel_margin_loss,
    multilabel_soft_margin_loss,
    nll_loss,
    normalize,
    one_hot,
    pad,
    pairwise_distance,
    pixel_shuffle,
    pixel_unshuffle,
    poisson_nll_loss,
    prelu,
    relu,
    relu6,
    scaled_dot_product_attention,
    selu,
    sigmoid,
    silu,
    smooth_l1_loss,
    soft_margin_loss,
    softmax,
    softmin,
    softplus,
    softshrink,
    softsign,
    tanh,
    tanhshrink,
    threshold,
    triplet_margin_loss,
)
from xgrad.tensor import Tensor


def max_pool1d_with_indices(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                            ceil_mode: bool = False, return_indices: bool = True) -> Any:
    """``max_pool1d`` returning ``(values, indices)``, as PyTorch's name for it."""
    return max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)


def max_pool2d_with_indices(input: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                            ceil_mode: bool = False, return_indices: bool = True) -> Any:
    """``max_pool2d`` returning ``(values, indices)``, as PyTorch's name for it."""
    return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)


def adaptive_max_pool2d_with_indices(input: Tensor, output_size: Any, return_indices: bool = True) -> Any:
    """``adaptive_max_pool2d`` returning ``(values, indices)``, as PyTorch's name for it."""
    return adaptive_max_pool2d(input, output_size, return_indices=True)


__all__ = [
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool2d",
    "adaptive_max_pool2d_with_indices", "adaptive_max_pool3d", "alpha_dropout", "avg_pool1d", "avg_pool2d",
    "avg_pool3d", "batch_norm", "binary_cross_entropy", "binary_cross_entropy_with_logits", "celu", "conv1d",
    "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "cosine_embedding_loss",
    "cosine_similarity", "cross_entropy", "ctc_loss", "dropout", "dropout1d", "dropout2d", "dropout3d", "elu", "embedding",
    "feature_alpha_dropout", "gaussian_nll_loss", "gelu", "glu", "group_norm", "hardshrink", "hardsigmoid",
    "hardswish", "hardtanh", "hinge_embedding_loss", "huber_loss", "instance_norm", "interpolate", "kl_div",
    "l1_loss", "layer_norm", "leaky_relu", "linear", "log_softmax", "logsigmoid", "margin_ranking_loss",
    "max_pool1d", "max_pool1d_with_indices", "max_pool2d", "max_pool2d_with_indices", "max_pool3d", "mish",
    "mse_loss", "multi_margin_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss", "nll_loss",
    "normalize", "one_hot", "pad", "pairwise_distance", "pixel_shuffle", "pixel_unshuffle", "poisson_nll_loss",
    "prelu", "relu", "relu6", "scaled_dot_product_attention", "selu", "sigmoid", "silu", "smooth_l1_loss",
    "soft_margin_loss", "softmax", "softmin", "softplus", "softshrink", "softsign", "tanh", "tanhshrink",
    "threshold", "triplet_margin_loss"
]


if not TYPE_CHECKING:  # for type checkers a missing name stays an error, not ``Any``

    def __getattr__(name: str) -> Any:  # reached only for a name this module does not have
        raise missing_attribute("torch.nn.functional", "module 'xgrad.nn.functional'", name)
