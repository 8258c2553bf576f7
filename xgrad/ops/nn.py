"""Neural-network ops: softmax family (fused rules), losses, layer, group, batch and instance norm, dropout."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.engine.node import sharding_of
from xgrad.generator import next_key
from xgrad.grad_mode import no_grad
from xgrad.ops import shape_rules
from xgrad.ops._util import (
    as_array,
    canonical_dim,
    check_index_range,
    inplace_or_not,
    legacy_reduction,
    reduce_loss,
    refuse_none,
)
from xgrad.ops.autocast import autocast_op
from xgrad.ops.elementwise import where
from xgrad.ops.registry import _differentiable_dtype, defprim
from xgrad.tensor import Tensor, torch_dtype_name

_softmax = defprim(
    "softmax",
    lambda x, axis: jax.nn.softmax(x, axis=axis),
    (lambda g, out, x, axis: out * (g - (g * out).sum(dim=axis, keepdim=True)),),
    save=(),
    save_out=True,
    shape_rule=shape_rules.softmax("softmax"),
)
_log_softmax = defprim(
    "log_softmax",
    lambda x, axis: jax.nn.log_softmax(x, axis=axis),
    (lambda g, out, x, axis: g - out.exp() * g.sum(dim=axis, keepdim=True),),
    save=(),
    save_out=True,
    shape_rule=shape_rules.softmax("log_softmax"),
)


def implicit_softmax_dim(name: str, ndim: int, stacklevel: int) -> int:
    """PyTorch's deprecated choice of dim for ``softmax(input)`` without one: 0 for 0-, 1- and 3-dim input, else 1."""
    warnings.warn(
        f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X as an argument.",
        UserWarning,
        stacklevel=stacklevel,
    )
    return 0 if ndim in (0, 1, 3) else 1


@autocast_op
def softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    """Softmax along ``dim``, after casting ``input`` to ``dtype`` if given.

    ``dim=None`` picks PyTorch's implicit dim with its deprecation warning.

    >>> import xgrad
    >>> xgrad.softmax(xgrad.tensor([0.0, 0.0]), dim=-1).tolist()
    [0.5, 0.5]
    """
    if dim is None:
        dim = implicit_softmax_dim("softmax", input.ndim, _stacklevel)
    x = input if dtype is None else input.to(dtype)
    axis = canonical_dim(dim, x.ndim)
    return _softmax(x, axis=axis if x.ndim else None)


@autocast_op
def log_softmax(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    """Log-softmax along ``dim``, computed stably, after casting ``input`` to ``dtype`` if given.

    ``dim=None`` picks PyTorch's implicit dim with its deprecation warning.

    >>> import xgrad
    >>> [round(v, 4) for v in xgrad.log_softmax(xgrad.tensor([0.0, 0.0]), dim=0).tolist()]
    [-0.6931, -0.6931]
    """
    if dim is None:
        dim = implicit_softmax_dim("log_softmax", input.ndim, _stacklevel)
    x = input if dtype is None else input.to(dtype)
    axis = canonical_dim(dim, x.ndim)
    return _log_softmax(x, axis=axis if x.ndim else None)


def _one_hot(target: Any, shape: tuple[int, ...], axis: int, dtype: Any) -> Any:
    """``target``'s classes as a one-hot array of ``shape`` along ``axis``: elementwise, so a
    batch-sharded ``target`` stays sharded (no gather or scatter of the labels)."""
    classes = jax.lax.broadcasted_iota(target.dtype, shape, axis)
    return (jnp.expand_dims(target, axis) == classes).astype(dtype)


def _cross_entropy_impl(
    x: Any, target: Any, axis: int, ignore_index: int, label_smoothing: float, reduction: str, all_kept: bool = False,
) -> Any:
    logp = jax.nn.log_softmax(x, axis=axis)
    smoothed = (1.0 - label_smoothing) * _one_hot(target, x.shape, axis, x.dtype) + label_smoothing / x.shape[axis]
    loss = -jnp.sum(smoothed * logp, axis=axis)
    kept = target != ignore_index
    loss = jnp.where(kept, loss, jnp.zeros((), x.dtype))
    weights = jnp.where(jnp.expand_dims(kept, axis), smoothed, jnp.zeros((), x.dtype))
    if reduction != "mean":
        return jnp.sum(loss) if reduction == "sum" else loss, logp, jnp.ones((), x.dtype), weights
    # The reduction in the same program, one node as PyTorch's NllLossBackward: as a sum
    # and a division of their own, the demo's loss was five more programs to compile and
    # dispatch. PyTorch's mean is over the targets that are not ignored (NaN when all are).
    # Their count is an output the rule reads: counted again there, a batch split over
    # devices would be all-reduced once more in the backward.
    # ``all_kept``: no target is ignored (NOTE [Cross-entropy without ignored targets]).
    count = jnp.asarray(target.size, x.dtype) if all_kept else jnp.sum(kept).astype(x.dtype)
    return jnp.sum(loss) / count, logp, count, weights


def _cross_entropy_grad(
    g: Any, out: Any, x: Any, target: Tensor, axis: int, ignore_index: int, label_smoothing: float,
    reduction: str = "none", all_kept: bool = False,  # the forward's: the saved weights carry the mask
) -> Tensor:
    # NOTE [Cross-entropy saves its log-probabilities]
    # The primitive returns the log-probabilities as a second output and saves them, as
    # PyTorch's log_softmax saves its result: d loss / d x = exp(logp) - smoothed one-hot
    # (its entries sum to 1), zero where ignored, elementwise in what the forward saved.
    # Recomputing softmax(x) here instead reduces the logits over the classes a second
    # time, which steers XLA's sharding propagation of a whole sharded step to a plan that
    # communicates a third more (benchmarks/RESULTS.md, FSDP). The smoothed one-hot of the
    # kept targets is saved as well (a fourth output, as JAX's transpose keeps it as a
    # residual): rebuilt here from the targets, a batch split over devices gathered them
    # again. ``g_logp`` is zero but under ``create_graph``, where the grad of ``exp(logp)``
    # flows back through it.
    g_loss, g_logp, _, _ = g  # the count and the target weights have no gradient
    probs = out[1].exp()
    weights = out[3]
    kept = weights.sum(dim=axis, keepdim=True) != 0
    if reduction == "mean":
        g_loss = g_loss / out[2]
    # Selected, not multiplied by ``kept``: with every target ignored the mean's ``g_loss``
    # is inf, and PyTorch's gradient is still zero at the ignored targets.
    grad_loss = where(kept, (probs - weights) * (g_loss if g_loss.ndim == 0 else g_loss.unsqueeze(axis)), 0.0)
    return grad_loss + g_logp - probs * g_logp.sum(dim=axis, keepdim=True)


_cross_entropy = defprim(
    "cross_entropy", _cross_entropy_impl, (_cross_entropy_grad, None), save=(), save_out=True, num_outputs=4,
    shape_rule=shape_rules.float_only("log_softmax_lastdim_kernel_impl"),
)


def _weighted_cross_entropy(
    input: Tensor, target: Any, class_weight: Any, axis: int, ignore_index: int, reduction: str, label_smoothing: float,
) -> Tensor:
    """PyTorch's class-weighted loss: ``-sum_c w_c q_c log p_c`` per target, ``q`` the smoothed one-hot."""
    kept = jnp.expand_dims(target != ignore_index, axis)
    smoothed = (1.0 - label_smoothing) * _one_hot(target, input.shape, axis, input.dtype) + label_smoothing / input.shape[axis]
    coefficients = jnp.where(kept, smoothed * class_weight.astype(input.dtype), jnp.zeros((), input.dtype))
    # Selected as in ``nll_loss``: all targets ignored, the mean's inf gradient stays off them.
    loss = where(Tensor(target != ignore_index), -(Tensor(coefficients) * log_softmax(input, dim=axis)).sum(dim=axis), 0.0)
    if reduction == "mean":
        picked_weight = jnp.where(kept, _one_hot(target, input.shape, axis, input.dtype) * class_weight, 0).sum()
        return loss.sum() / Tensor(picked_weight.astype(input.dtype))
    return reduce_loss(loss, reduction)


@autocast_op
def cross_entropy(
    input: Tensor, target: Any, weight: Tensor | None = None, size_average: bool | None = None, ignore_index: int = -100,
    reduce: bool | None = None, reduction: str = "mean", label_smoothing: float = 0.0,
) -> Tensor:
    """``F.cross_entropy`` with PyTorch's shapes, ``weight``, ``ignore_index``, ``label_smoothing`` and ``reduction``.

    Args:
        input: logits of shape ``(C,)``, ``(N, C)`` or ``(N, C, d1, ...)``: classes along dim 1.
        target: integer class indices of shape ``()``, ``(N,)`` or ``(N, d1, ...)``, or class
            probabilities of ``input``'s shape.
        weight: a constant weight per class, ``(C,)``; the mean of class-index targets is then
            divided by the summed weights of the targets (as PyTorch).
        ignore_index: class-index targets equal to it add nothing and are left out of the mean.
        reduction: ``'mean'`` (over the non-ignored targets), ``'sum'`` or ``'none'``.
        label_smoothing: ``ε`` in ``[0, 1]``: the target becomes ``(1 - ε) · one_hot + ε / C``.
        size_average, reduce: deprecated; mapped to ``reduction`` with PyTorch's warning.

    >>> import xgrad
    >>> logits = xgrad.tensor([[0.0, 0.0], [0.0, 0.0]])
    >>> round(xgrad.cross_entropy(logits, xgrad.tensor([0, 1])).item(), 4)
    0.6931
    >>> xgrad.cross_entropy(logits, xgrad.tensor([0, -100]), reduction="none").tolist()[1]
    0.0
    """
    reduction = legacy_reduction(size_average, reduce, reduction)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    axis = canonical_dim(1 if input.ndim != 1 else 0, input.ndim)
    classes = input.shape[axis]
    class_weight = None
    if weight is not None:
        if weight.shape != (classes,):
            raise RuntimeError(
                f"weight tensor should be defined either for all {classes} classes or no classes but got weight "
                f"tensor of shape: {list(weight.shape)}"
            )
        if weight.requires_grad:
            raise RuntimeError("the derivative for 'weight' is not implemented.")
        # Shaped to broadcast along the class dim.
        class_weight = weight._array.reshape((classes,) + (1,) * (input.ndim - 1 - axis))
    refuse_none(target, "target", 2)
    target_array = as_array(target) if isinstance(target, Tensor) else jnp.asarray(target)
    if target_array.shape == input.shape:
        if not jnp.issubdtype(target_array.dtype, jnp.floating):
            raise RuntimeError(f"Expected floating point type for target with class probabilities, got {target_array.dtype}")
        probs = target if isinstance(target, Tensor) else Tensor(target_array)
        if label_smoothing:
            probs = probs * (1.0 - label_smoothing) + label_smoothing / classes
        if class_weight is not None:
            probs = probs * Tensor(class_weight)
        loss = -(probs * log_softmax(input, dim=axis)).sum(dim=axis)
        return reduce_loss(loss, reduction)  # the mean is over the batch, weighted or not, as PyTorch
    if not jnp.issubdtype(target_array.dtype, jnp.integer):
        raise RuntimeError(f"expected scalar type Long but found {torch_dtype_name(target_array.dtype)}")
    expected = input.shape[:axis] + input.shape[axis + 1 :]
    if input.ndim == 2 and target_array.ndim > 1:
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if input.ndim == 2 and target_array.ndim == 1 and target_array.shape[0] != input.shape[0]:
        raise ValueError(f"Expected input batch_size ({input.shape[0]}) to match target batch_size ({target_array.shape[0]}).")
    if target_array.shape != expected:
        raise RuntimeError(f"Expected target size {list(expected)}, got {list(target_array.shape)}")
    in_range = check_index_range(target_array, classes, "Target {index} is out of bounds.", negative=False, ignore=ignore_index)
    if class_weight is not None:
        return _weighted_cross_entropy(input, target_array, class_weight, axis, ignore_index, reduction, label_smoothing)
    # NOTE [Cross-entropy without ignored targets]
    # Targets read on the host, all in [0, C), with an ``ignore_index`` outside it (-100 by
    # default): none is ignored, and the mean divides by the number of targets instead of
    # counting the kept ones, a reduction that XLA:CPU compiles for ~20 ms at every new
    # batch size (benchmarks/RESULTS.md, "A new batch size: what its programs compile").
    # The same bits: the count is an integer converted to the dtype either way. The masks
    # stay: without the select, XLA fuses the loss's sum otherwise and sums in another order.
    all_kept = in_range and not 0 <= ignore_index < classes
    loss, _, _, _ = _cross_entropy(
        input, Tensor(target_array), axis=axis, ignore_index=ignore_index, label_smoothing=label_smoothing,
        reduction=reduction, all_kept=all_kept,
    )
    return loss


@autocast_op
def layer_norm(x: Tensor, normalized_shape: Any, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """``F.layer_norm`` over the last ``len(normalized_shape)`` dims.

    >>> import xgrad
    >>> xgrad.layer_norm(xgrad.tensor([[1.0, 3.0]]), (2,), eps=0.0).tolist()
    [[-1.0, 1.0]]
    """
    if not isinstance(normalized_shape, (tuple, list)):  # PyTorch's argument parser takes no bare int here
        raise TypeError(f"layer_norm(): argument 'normalized_shape' (position 2) must be tuple of ints, not "
                        f"{type(normalized_shape).__name__}")
    shape_rules.check_float(x, "LayerNormKernelImpl")
    shape = tuple(normalized_shape)
    n = len(shape)
    if n == 0:
        raise RuntimeError(
            "Expected normalized_shape to be at least 1-dimensional, i.e., containing at least one element, but got "
            "normalized_shape = []"
        )
    if x.shape[x.ndim - n :] != shape:
        raise RuntimeError(
            f"Given normalized_shape={list(shape)}, expected input with shape [*, {', '.join(map(str, shape))}], "
            f"but got input of size{list(x.shape)}"
        )
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None and param.shape != shape:
            raise RuntimeError(f"Expected {name} to be of same shape as normalized_shape, but got {name} of shape "
                               f"{list(param.shape)} and normalized_shape = {list(shape)}")
    dims = tuple(range(x.ndim - n, x.ndim))
    mu = x.mean(dim=dims, keepdim=True)
    centered = x - mu
    variance = (centered * centered).mean(dim=dims, keepdim=True)
    out = centered * (variance + eps).rsqrt()
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def _check_probability(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False, *, key: Any = None) -> Tensor:
    """``F.dropout``: zero each element with probability ``p`` and scale the rest by ``1/(1-p)``.

    Args:
        training: apply dropout; ``False`` returns ``input`` (the third positional argument, as in PyTorch).
        inplace: ``input`` itself takes the result (xgrad's in-place rebinding).
        key: a ``jax.random`` key; ``None`` draws from the default generator.

    >>> import jax, xgrad
    >>> x = xgrad.ones(4)
    >>> xgrad.dropout(x, 0.5, False).tolist()
    [1.0, 1.0, 1.0, 1.0]
    >>> kept = xgrad.dropout(x, p=0.5, key=jax.random.key(0)).tolist()
    >>> all(v in (0.0, 2.0) for v in kept)
    True
    """
    _check_probability(p)
    if not training:
        return input
    return inplace_or_not(_dropout, input, inplace, p, key, input.shape)


def _feature_dropout(input: Tensor, p: float, training: bool, inplace: bool, key: Any, batched: bool,
                     drop: Callable[..., Tensor] | None = None) -> Tensor:
    """Whole channels (dim 1, or dim 0 of an unbatched input) dropped together by ``drop`` (plain dropout's
    zeroing by default): one draw per channel."""
    if not training:
        return input
    channel_dims = 2 if batched else 1
    mask_shape = input.shape[:channel_dims] + (1,) * (input.ndim - channel_dims)
    return inplace_or_not(drop or _dropout, input, inplace, p, key, mask_shape)


def dropout1d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False, *, key: Any = None) -> Tensor:
    """``F.dropout1d``: zero whole channels of ``(N, C, L)`` or ``(C, L)`` input with probability ``p``.

    >>> import xgrad
    >>> out = xgrad.dropout1d(xgrad.ones(2, 3, 4), 0.5).sum(dim=2).tolist()
    >>> all(v in (0.0, 8.0) for row in out for v in row)
    True
    """
    _check_probability(p)
    if input.ndim not in (2, 3):
        raise RuntimeError(
            f"dropout1d: Expected 2D or 3D input, but received a {input.ndim}D input. Note that dropout1d exists to "
            "provide channel-wise dropout on inputs with 1 spatial dimension, a channel dimension, and an optional "
            "batch dimension (i.e. 2D or 3D inputs)."
        )
    return _feature_dropout(input, p, training, inplace, key, batched=input.ndim == 3)


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False, *, key: Any = None) -> Tensor:
    """``F.dropout2d``: zero whole channels (dim 1) with probability ``p``, with PyTorch's warnings.

    A 3-dim input is taken as ``(N, C, L)`` (channel-wise 1-D dropout), as PyTorch does today.

    >>> import xgrad
    >>> out = xgrad.dropout2d(xgrad.ones(2, 3, 2, 2), 0.5).sum(dim=(2, 3)).tolist()
    >>> all(v in (0.0, 8.0) for row in out for v in row)
    True
    """
    _check_probability(p)
    if input.ndim not in (3, 4):
        warnings.warn(
            f"dropout2d: Received a {input.ndim}-D input to dropout2d, which is deprecated and will result in an error "
            "in a future release. To retain the behavior and silence this warning, please use dropout instead. Note "
            "that dropout2d exists to provide channel-wise dropout on inputs with 2 spatial dimensions, a channel "
            "dimension, and an optional batch dimension (i.e. 3D or 4D inputs).",
            UserWarning,
            stacklevel=2,
        )
    if input.ndim == 3:
        warnings.warn(
            "dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout behavior is desired "
            "- input is interpreted as shape (N, C, L), where C is the channel dim. This behavior will change in a "
            "future release to interpret the input as one without a batch dimension, i.e. shape (C, H, W). To "
            "maintain the 1D channel-wise dropout behavior, please switch to using dropout1d instead.",
            UserWarning,
            stacklevel=2,
        )
    if input.ndim < 2:  # PyTorch's feature dropout needs a channel dim
        raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
    return _feature_dropout(input, p, training, inplace, key, batched=True)


_SELU_SATURATION = 1.7580993408473766  # SELU's scale * alpha: minus its limit at -inf


def alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False, *, key: Any = None) -> Tensor:
    """``F.alpha_dropout``: dropped elements take SELU's saturation value, and an affine map keeps
    zero mean and unit variance, as PyTorch's (note ``training=False`` by default, as there).

    >>> import jax, xgrad
    >>> x = xgrad.ones(3)
    >>> xgrad.alpha_dropout(x, 0.5) is x
    True
    >>> len(set(xgrad.alpha_dropout(x, 0.5, True, key=jax.random.key(0)).tolist())) <= 2
    True
    """
    _check_probability(p)
    if not training or p == 0.0:
        return input
    return inplace_or_not(_alpha_dropout, input, inplace, p, key, input.shape)


def dropout3d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False, *, key: Any = None) -> Tensor:
    """``F.dropout3d``: zero whole channels of ``(N, C, D, H, W)`` or ``(C, D, H, W)`` input with probability ``p``.

    >>> import xgrad
    >>> out = xgrad.dropout3d(xgrad.ones(2, 3, 1, 2, 2), 0.5).sum(dim=(2, 3, 4)).tolist()
    >>> all(v in (0.0, 8.0) for row in out for v in row)
    True
    """
    _check_probability(p)
    if input.ndim not in (4, 5):
        warnings.warn(
            f"dropout3d: Received a {input.ndim}-D input to dropout3d, which is deprecated and will result in an error "
            "in a future release. To retain the behavior and silence this warning, please use dropout instead. Note "
            "that dropout3d exists to provide channel-wise dropout on inputs with 3 spatial dimensions, a channel "
            "dimension, and an optional batch dimension (i.e. 4D or 5D inputs).",
            UserWarning,
            stacklevel=2,
        )
    if input.ndim < 2:
        raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
    return _feature_dropout(input, p, training, inplace, key, batched=input.ndim != 4)


def feature_alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False, *,
                          key: Any = None) -> Tensor:
    """``F.feature_alpha_dropout``: ``alpha_dropout`` with one draw per channel of ``(N, C, ...)`` input.

    >>> import jax, xgrad
    >>> out = xgrad.feature_alpha_dropout(xgrad.ones(2, 3, 4), 0.5, True, key=jax.random.key(0))
    >>> all(len(set(channel)) == 1 for sample in out.tolist() for channel in sample)
    True
    """
    _check_probability(p)
    if input.ndim < 2:
        raise RuntimeError("Feature dropout requires at least 2 dimensions in the input")
    if p == 0.0:
        return input
    return _feature_dropout(input, p, training, inplace, key, batched=True, drop=_alpha_dropout)


def _alpha_dropout(x: Tensor, p: float, key: Any, mask_shape: tuple[int, ...]) -> Tensor:
    if not _differentiable_dtype(x.dtype):
        raise RuntimeError(f"result type Float can't be cast to the desired output type {torch_dtype_name(x.dtype)}")
    if p == 1.0:
        return x * 0.0
    keep = jax.random.bernoulli(next_key() if key is None else key, 1.0 - p, mask_shape).astype(x.dtype)
    # PyTorch's constants: a rescales, b shifts, so a unit normal input keeps mean 0 and variance 1.
    a = 1.0 / math.sqrt((_SELU_SATURATION**2 * p + 1) * (1 - p))
    b = (keep - 1) * (_SELU_SATURATION * a) + _SELU_SATURATION * a * p
    return x * Tensor(keep * a) + Tensor(b)


def _dropout(x: Tensor, p: float, key: Any, mask_shape: tuple[int, ...]) -> Tensor:
    """``x`` times a mask of ``mask_shape`` (broadcast over ``x``): 0 with probability ``p``, else ``1/(1-p)``."""
    if not _differentiable_dtype(x.dtype):  # the kept values are scaled by 1 / (1 - p)
        raise RuntimeError(f"result type Float can't be cast to the desired output type {torch_dtype_name(x.dtype)}")
    if p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    key = next_key() if key is None else key
    sharding = sharding_of(x._array)
    if mask_shape == x.shape and isinstance(sharding, jax.sharding.NamedSharding) and len(sharding.device_set) > 1:
        # The mask is made where x lives, each device drawing its own part (threefry is
        # partitionable: the same values as unsharded); the key is replicated over x's mesh,
        # as its raw bits: a typed key cannot be put on devices of other processes.
        typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
        bits = np.asarray(jax.random.key_data(key) if typed else key)
        bits = jax.device_put(bits, jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec()))
        impl = jax.random.key_impl(key) if typed else None
        return x * Tensor(_sharded_dropout_scale(bits, impl, 1.0 - p, x.shape, x.dtype, sharding))
    keep = jax.random.bernoulli(key, 1.0 - p, mask_shape)
    return x * Tensor(keep.astype(x.dtype) / (1.0 - p))


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5))
def _sharded_dropout_scale(bits: Any, impl: Any, keep_prob: float, shape: tuple[int, ...], dtype: Any, sharding: Any) -> Any:
    key = bits if impl is None else jax.random.wrap_key_data(bits, impl=impl)
    keep = jax.random.bernoulli(key, keep_prob, shape)
    return jax.lax.with_sharding_constraint(keep.astype(dtype) / keep_prob, sharding)


@autocast_op
def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """``F.group_norm``: normalise ``(N, C, *)`` input over each group of ``C / num_groups`` channels, then scale per channel.

    >>> import xgrad
    >>> xgrad.group_norm(xgrad.tensor([[1.0, 3.0, 5.0, 9.0]]), 2, eps=0.0).tolist()
    [[-1.0, 1.0, -1.0, 1.0]]
    """
    shape_rules.check_float(input, "GroupNormKernelImpl")
    if input.ndim < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received {input.ndim}")
    n, channels = input.shape[:2]
    if num_groups <= 0 or channels % num_groups:
        raise RuntimeError(f"Expected number of channels in input to be divisible by num_groups, but got input of shape "
                           f"{list(input.shape)} and num_groups={num_groups}")
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None and param.shape != (channels,):
            raise RuntimeError(f"Expected {name} to be a vector of size equal to the number of channels in input, but got "
                               f"{name} of shape {list(param.shape)} and input of shape {list(input.shape)}")
    grouped = input.reshape(n, num_groups, -1)
    mu = grouped.mean(dim=-1, keepdim=True)
    centered = grouped - mu
    variance = (centered * centered).mean(dim=-1, keepdim=True)
    out = (centered * (variance + eps).rsqrt()).reshape(input.shape)
    per_channel = (channels,) + (1,) * (input.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(per_channel)
    if bias is not None:
        out = out + bias.reshape(per_channel)
    return out


def _update_running(running: Tensor, batch: Any, momentum: float) -> None:
    """PyTorch's in-place ``running = (1 - momentum) * running + momentum * batch``, recorded by no graph."""
    with no_grad():
        running.copy_(Tensor(((1 - momentum) * running.array + momentum * batch).astype(running.dtype)))


def _normalize_channels(
    input: Tensor, mean: Tensor, var: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
) -> Tensor:
    per_channel = (1, input.shape[1]) + (1,) * (input.ndim - 2)
    out = (input - mean) * (var + eps).rsqrt()
    if weight is not None:
        out = out * weight.reshape(per_channel)
    if bias is not None:
        out = out + bias.reshape(per_channel)
    return out


@autocast_op
def batch_norm(
    input: Tensor, running_mean: Tensor | None, running_var: Tensor | None, weight: Tensor | None = None,
    bias: Tensor | None = None, training: bool = False, momentum: float = 0.1, eps: float = 1e-5,
) -> Tensor:
    """``F.batch_norm`` over the channels (dim 1) of ``(N, C, *)`` input.

    Training normalises with the batch's mean and biased variance and, when given, updates
    ``running_mean``/``running_var`` in place by ``momentum`` (the variance unbiased), as
    PyTorch; otherwise the running statistics normalise.

    >>> import xgrad
    >>> mean, var = xgrad.zeros(2), xgrad.ones(2)
    >>> xgrad.batch_norm(xgrad.tensor([[0.0, 1.0], [2.0, 3.0]]), mean, var, training=True, eps=0.0).tolist()
    [[-1.0, -1.0], [1.0, 1.0]]
    >>> [round(v, 4) for v in mean.tolist()], [round(v, 4) for v in var.tolist()]
    ([0.1, 0.2], [1.1, 1.1])
    """
    shape_rules.check_float(input, "batch_norm")
    if input.ndim < 2:
        raise ValueError(f"Expected 2D or higher input (got {input.ndim}D input)")
    channels = input.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)):
        if t is not None and t.numel() != channels:
            raise RuntimeError(f"{name} should contain {channels} elements not {t.numel()}")
    stat_shape = (1, channels) + (1,) * (input.ndim - 2)
    if not training:
        if running_mean is None or running_var is None:
            raise RuntimeError("running_mean and running_var must be defined in evaluation mode")
        return _normalize_channels(input, running_mean.reshape(stat_shape), running_var.reshape(stat_shape), weight, bias, eps)
    count = input.numel() // channels if channels else 0
    if count <= 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(input.shape)}")
    dims = (0, *range(2, input.ndim))
    mean = input.mean(dim=dims, keepdim=True)
    var = input.var(dim=dims, keepdim=True, correction=0)
    if running_mean is not None:
        _update_running(running_mean, mean.array.reshape(running_mean.shape), momentum)
    if running_var is not None:
        _update_running(running_var, var.array.reshape(running_var.shape) * (count / (count - 1)), momentum)
    return _normalize_channels(input, mean, var, weight, bias, eps)


@autocast_op
def instance_norm(
    input: Tensor, running_mean: Tensor | None = None, running_var: Tensor | None = None, weight: Tensor | None = None,
    bias: Tensor | None = None, use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5,
) -> Tensor:
    """``F.instance_norm``: normalise each ``(sample, channel)`` of ``(N, C, *)`` input over its spatial dims.

    With ``use_input_stats`` the running statistics, when given, move towards the batch
    average of the instances' mean and unbiased variance, as PyTorch; without, they normalise.

    >>> import xgrad
    >>> xgrad.instance_norm(xgrad.tensor([[[1.0, 3.0]], [[0.0, 4.0]]]), eps=0.0).tolist()
    [[[-1.0, 1.0]], [[-1.0, 1.0]]]
    """
    shape_rules.check_float(input, "instance_norm")
    if input.ndim < 3:
        raise ValueError(f"instance_norm expects (N, C, *spatial) input with at least 3 dims, got {input.ndim}D")
    channels = input.shape[1]
    stat_shape = (1, channels) + (1,) * (input.ndim - 2)
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise RuntimeError("Expected running_mean and running_var to be defined when use_input_stats is false")
        return _normalize_channels(input, running_mean.reshape(stat_shape), running_var.reshape(stat_shape), weight, bias, eps)
    dims = tuple(range(2, input.ndim))
    count = math.prod(input.shape[2:])
    if count <= 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input size {list(input.shape)}")
    mean = input.mean(dim=dims, keepdim=True)
    var = input.var(dim=dims, keepdim=True, correction=0)
    if running_mean is not None:
        _update_running(running_mean, mean.array.reshape(input.shape[:2]).mean(0), momentum)
    if running_var is not None:
        _update_running(running_var, (var.array.reshape(input.shape[:2]) * (count / (count - 1))).mean(0), momentum)
    return _normalize_channels(input, mean, var, weight, bias, eps)
