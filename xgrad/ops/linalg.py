"""Contractions and norms: ``matmul`` (rules in xgrad ops), ``einsum`` and ``conv2d`` (rules from jax.vjp),
``norm`` (a 2-norm primitive), ``linear`` (a primitive, as PyTorch's addmm), and the composites ``outer``, ``bmm``,
``baddbmm``, ``normalize``."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.ops import shape_rules
from xgrad.ops.autocast import autocast_op
from xgrad.ops.jaxop import vjp_of
from xgrad.ops.reduce import _axes
from xgrad.ops.registry import REGISTRY, _differentiable_dtype, bind, defprim
from xgrad.tensor import Tensor, torch_dtype_name


def _matmul_x_grad(g: Tensor, out: Any, x: Any, y: Tensor) -> Tensor:
    if y.ndim == 1:  # (..., k) @ (k,) -> (...): g (...,) outer y
        return g.unsqueeze(-1) * y
    if x.ndim == 1:  # (k,) @ (..., k, n) -> (..., n)
        return (g.unsqueeze(-2) @ y.mT).sum_to((1, x.shape[0])).reshape(x.shape)
    return g @ y.mT


def _matmul_y_grad(g: Tensor, out: Any, x: Tensor, y: Any) -> Tensor:
    if x.ndim == 1:  # (k,) @ (..., k, n): x outer g
        if y.ndim == 1:
            return g * x
        return x.unsqueeze(-1) * g.unsqueeze(-2)
    if y.ndim == 1:  # (..., m, k) @ (k,) -> (..., m)
        return (x.mT @ g.unsqueeze(-1)).sum_to((y.shape[0], 1)).reshape(y.shape)
    if y.ndim == 2 and x.ndim > 2:
        # A batch against one matrix (x @ W): one GEMM over the flattened batch, rather
        # than a batched product summed down afterwards.
        rows = math.prod(x.shape[:-1])  # not -1: a dim of size 0 leaves -1 undetermined
        return x.reshape(rows, x.shape[-1]).mT @ g.reshape(rows, g.shape[-1])
    return x.mT @ g


matmul = autocast_op(defprim("matmul", jnp.matmul, (_matmul_x_grad, _matmul_y_grad), shape_rule=shape_rules.matmul, doc="""Matrix product with NumPy's batching and 1-D rules.

    >>> import xgrad
    >>> a = xgrad.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> xgrad.matmul(a, xgrad.tensor([[1.0], [1.0]])).tolist()
    [[3.0], [7.0]]
    """))


def _einsum_impl(*operands: Any, subscripts: str) -> Any:
    return jnp.einsum(subscripts, *operands)


def _einsum_grad(g: Tensor, out: Any, *operands: Any, subscripts: str) -> Any:
    grads = vjp_of("einsum", _einsum_impl, subscripts=subscripts)(g, *operands)
    return grads if isinstance(grads, tuple) else (grads,)


_einsum = defprim("einsum", _einsum_impl, joint_vjp=_einsum_grad, shape_rule=shape_rules.einsum)


@autocast_op
def einsum(subscripts: str, *operands: Tensor) -> Tensor:
    """Einstein summation, as ``jnp.einsum(subscripts, *operands)``.

    >>> import xgrad
    >>> a = xgrad.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> xgrad.einsum("ij,j->i", a, xgrad.tensor([1.0, 1.0])).tolist()
    [3.0, 7.0]
    """
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return _einsum(*operands, subscripts=subscripts)


def _sizes(v: int | Sequence[int], n: int, name: str) -> tuple[int, ...]:
    """A convolution's ``stride``/``padding``/``dilation``: one int for every dim, or exactly ``n`` of them."""
    if isinstance(v, int):
        return (v,) * n
    if len(v) != n:
        raise RuntimeError(f"expected {name} to be a single integer value or a list of {n} values to match the "
                           f"convolution dimensions, but got {name}={list(v)}")
    return tuple(int(i) for i in v)


def _conv2d_impl(x: Any, w: Any, stride: tuple[int, int], padding: Any, dilation: tuple[int, int], groups: int) -> Any:
    return jax.lax.conv_general_dilated(
        x, w, window_strides=stride, padding=padding, rhs_dilation=dilation,
        dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=groups,
    )


# NOTE [Convolution gradients on CPU]
# XLA's CPU backend runs a float64 convolution as a plain loop nest, and hands the
# weight gradient's form (a convolution with the whole image as its window) to a
# YNNPACK kernel that is slow at it in float32 too: on a 2-core VM the 32->64 3x3
# conv of the MNIST CNN took 4-5x (float64) and 2.4x (float32) the CPU time for its
# two gradients of the same convolution written as a product of the input's patches
# (im2col, the form PyTorch's CPU float64 convolution takes), whose matrix products
# run at XLA's GEMM speed; a 1x1 conv took 25x. So conv2d's float32 and float64 rules
# on CPU are the vjp of that form, eager and in a compiled program alike. The forward
# stays ``conv_general_dilated``, faster there than the patches. ``lax.platform_dependent``
# picks the form when the program is lowered, so other backends keep their convolution.
#
# Not on a mesh: operands placed over several devices (JAX traces a value with the
# abstract mesh of the arrays it comes from) keep the convolution's own transposes.
# XLA's SPMD partitioner plans those as it plans ``jax.jit``'s; it partitions the
# patches' two products one by one and gathers the output gradient for each (XLA does
# not merge the two collectives): a CNN's step on a 2x2 data x model mesh moved 1.17x
# ``jax.jit``'s bytes (the 8->12 conv's gradient gathered over ``model`` twice).
# ``backward(compiled=True)`` traces its programs from shapes and dtypes alone, so it
# keeps the patches form on a mesh too; eager and ``xgrad.compile`` trace placed values.
def _conv2d_patches(x: Any, w: Any, stride: tuple[int, int], padding: Any, dilation: tuple[int, int], groups: int) -> Any:
    """``_conv2d_impl`` as a product of ``x``'s patches (NOTE [Convolution gradients on CPU])."""
    n, c, _, _ = x.shape
    o, cg, kh, kw = w.shape
    if isinstance(padding, str):
        padding = jax.lax.padtype_to_pads(x.shape[2:], ((kh - 1) * dilation[0] + 1, (kw - 1) * dilation[1] + 1), stride, padding)
    x = jax.lax.pad(jnp.transpose(x, (0, 2, 3, 1)), jnp.zeros((), x.dtype), ((0, 0, 0), (*padding[0], 0), (*padding[1], 0), (0, 0, 0)))
    oh = (x.shape[1] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (x.shape[2] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    patches = jnp.stack([
        jax.lax.slice(x, (0, i * dilation[0], j * dilation[1], 0),
                      (n, i * dilation[0] + (oh - 1) * stride[0] + 1, j * dilation[1] + (ow - 1) * stride[1] + 1, c), (1, *stride, 1))
        for i in range(kh) for j in range(kw)
    ], axis=3).reshape(n * oh * ow, kh * kw, groups, cg)
    # (group, pixel, output channel): contracts each patch's offsets and channels with its group's kernels
    out = jax.lax.dot_general(patches, w.reshape(groups, o // groups, cg, kh * kw), (((1, 3), (3, 2)), ((2,), (0,))))
    return jnp.transpose(out.reshape(groups, n, oh, ow, o // groups), (1, 0, 4, 2, 3)).reshape(n, o, oh, ow)


def _conv2d_differentiated(x: Any, w: Any, **params: Any) -> Any:
    """The function conv2d's rules are the vjp of: ``_conv2d_impl``, or its patches form for float32/64 on one CPU device."""
    on_a_mesh = any(jax.typeof(a).sharding.mesh.size > 1 for a in (x, w))
    if x.dtype not in (jnp.float32, jnp.float64) or w.size == 0 or on_a_mesh:
        return _conv2d_impl(x, w, **params)
    return jax.lax.platform_dependent(
        x, w, cpu=functools.partial(_conv2d_patches, **params), default=functools.partial(_conv2d_impl, **params)
    )


def _conv2d_grad(g: Tensor, out: Any, x: Tensor, w: Tensor, **params: Any) -> Any:
    return vjp_of("conv2d", _conv2d_differentiated, **params)(g, x, w)


_conv2d = defprim("conv2d", _conv2d_impl, joint_vjp=_conv2d_grad, shape_rule=shape_rules.conv2d)


@autocast_op
def conv2d(
    input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1
) -> Tensor:
    """``F.conv2d`` on NCHW (or unbatched CHW) input and OIHW weight; ``padding`` an int, pair, ``"same"`` or ``"valid"``.

    PyTorch's checks hold: channels and groups, non-negative padding, positive stride and
    dilation, a kernel no larger than the padded input (NOTE [Shape rules]).

    >>> import xgrad
    >>> x = xgrad.ones(1, 1, 3, 3)
    >>> w = xgrad.ones(1, 1, 2, 2)
    >>> out = xgrad.conv2d(x, w)
    >>> out.shape, out.tolist()[0][0][0]
    ((1, 1, 2, 2), [4.0, 4.0])
    """
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise RuntimeError(f"Invalid padding string: '{padding}'")
        if padding == "same" and _sizes(stride, 2, "stride") != (1, 1):
            raise RuntimeError("padding='same' is not supported for strided convolutions")
        pad: Any = padding.upper()
    else:
        ph, pw = _sizes(padding, 2, "padding")
        pad = ((ph, ph), (pw, pw))
    if bias is not None and (bias.ndim != 1 or weight.ndim and bias.shape[0] != weight.shape[0]):
        raise RuntimeError(
            f"Given weight of size {list(weight.shape)}, expected bias to be 1-dimensional with "
            f"{weight.shape[0] if weight.ndim else 0} elements, but got bias of size {list(bias.shape)} instead"
        )
    unbatched = input.ndim == 3  # (C, H, W), as PyTorch takes it
    if unbatched:
        input = input.unsqueeze(0)
    out = _conv2d(input, weight, stride=_sizes(stride, 2, "stride"), padding=pad,
                  dilation=_sizes(dilation, 2, "dilation"), groups=groups)
    if bias is not None:
        out = out + bias.reshape((1, -1, 1, 1))
    return out.squeeze(0) if unbatched else out


@autocast_op
def conv1d(
    input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1
) -> Tensor:
    """``F.conv1d`` on ``(N, C, L)`` (or unbatched ``(C, L)``) input and ``(O, C / groups, K)`` weight: ``conv2d`` over a height of one.

    >>> import xgrad
    >>> xgrad.conv1d(xgrad.tensor([[[1.0, 2.0, 3.0]]]), xgrad.tensor([[[1.0, -1.0]]])).tolist()
    [[[-1.0, -1.0]]]
    """
    if input.ndim not in (2, 3):
        raise RuntimeError(f"Expected 2D (unbatched) or 3D (batched) input to conv1d, but got input of size: {list(input.shape)}")
    if weight.ndim != 3:
        raise RuntimeError(f"Expected 3-dimensional weight for 3-dimensional input {list(input.shape)}, but got weight of "
                           f"size {list(weight.shape)} instead")
    # The height of one takes stride 1, padding 0 and dilation 1.
    pad = padding if isinstance(padding, str) else (0, *_sizes(padding, 1, "padding"))
    out = conv2d(input.unsqueeze(-2), weight.unsqueeze(-2), bias, (1, *_sizes(stride, 1, "stride")), pad,
                 (1, *_sizes(dilation, 1, "dilation")), groups)
    return out.squeeze(-2)


# -- products and norms PyTorch users reach for ----------------------------------------
def outer(x: Tensor, y: Tensor) -> Tensor:
    """Outer product of two vectors: ``out[i, j] = x[i] * y[j]``.

    >>> import xgrad
    >>> xgrad.outer(xgrad.tensor([1.0, 2.0]), xgrad.tensor([3.0, 4.0])).tolist()
    [[3.0, 4.0], [6.0, 8.0]]
    """
    for name, t in (("self", x), ("vec2", y)):
        if t.ndim != 1:
            raise RuntimeError(f"outer: Expected 1-D argument {name}, but got {t.ndim}-D")
    return x.unsqueeze(1) * y


@autocast_op
def mm(input: Tensor, mat2: Tensor) -> Tensor:
    """Matrix product of two 2-D tensors, ``(n, m) @ (m, p) -> (n, p)`` (no broadcasting, as PyTorch's ``mm``).

    >>> import xgrad
    >>> xgrad.mm(xgrad.ones(2, 3), xgrad.ones(3, 1)).tolist()
    [[3.0], [3.0]]
    """
    if input.ndim != 2:
        raise RuntimeError("self must be a matrix")
    if mat2.ndim != 2:
        raise RuntimeError("mat2 must be a matrix")
    if input.shape[1] != mat2.shape[0]:
        raise RuntimeError(
            f"mat1 and mat2 shapes cannot be multiplied ({input.shape[0]}x{input.shape[1]} and {mat2.shape[0]}x{mat2.shape[1]})"
        )
    return matmul(input, mat2)


@autocast_op
def bmm(input: Tensor, mat2: Tensor) -> Tensor:
    """Batched matrix product of two 3-D tensors, ``(b, n, m) @ (b, m, p) -> (b, n, p)``.

    >>> import xgrad
    >>> xgrad.bmm(xgrad.ones(2, 1, 3), xgrad.ones(2, 3, 2)).tolist()
    [[[3.0, 3.0]], [[3.0, 3.0]]]
    """
    if input.ndim != 3:
        raise RuntimeError("batch1 must be a 3D tensor")
    if mat2.ndim != 3:
        raise RuntimeError("batch2 must be a 3D tensor")
    expected = [input.shape[0], input.shape[2]]
    if list(mat2.shape[:2]) != expected:
        raise RuntimeError(
            f"Expected size for first two dimensions of batch2 tensor to be: {expected} but got: {list(mat2.shape[:2])}."
        )
    return matmul(input, mat2)


@autocast_op
def baddbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta: float = 1, alpha: float = 1) -> Tensor:
    """``beta * input + alpha * bmm(batch1, batch2)``; with ``beta=0`` ``input`` is ignored (NaNs in it too).

    >>> import xgrad
    >>> xgrad.baddbmm(xgrad.ones(1, 1, 2), xgrad.ones(1, 1, 3), xgrad.ones(1, 3, 2), beta=0.5, alpha=2).tolist()
    [[[6.5, 6.5]]]
    """
    product = bmm(batch1, batch2)
    if alpha != 1:
        product = product * alpha
    if tuple(jnp.broadcast_shapes(input.shape, product.shape)) != product.shape:
        raise RuntimeError(f"expand: the input of shape {list(input.shape)} is not broadcastable to {list(product.shape)}")
    if beta == 0:
        # A ``where`` that never picks ``input``: its value is dropped (NaN included) and its
        # gradient is zero, as PyTorch's ``grad * beta``.
        from xgrad.ops.elementwise import where

        return where(jnp.zeros((), bool), input, product)
    return product + (input if beta == 1 else input * beta)


def _norm2_grad(g: Tensor, out: Tensor, x: Tensor, axis: Any, keepdims: bool) -> Tensor:
    from xgrad.ops.elementwise import where
    from xgrad.ops.reduce import _keep

    norm = _keep(out, x.ndim, axis, keepdims)
    # x / norm, with the gradient at the zero vector defined as 0 (PyTorch's subgradient);
    # the safe denominator keeps the unused branch finite for higher orders.
    return _keep(g, x.ndim, axis, keepdims) * x / where(norm == 0, 1.0, norm)


_norm2 = defprim(
    "norm2",
    lambda x, axis, keepdims: jnp.sqrt(jnp.sum(x * x, axis=axis, keepdims=keepdims)),
    (_norm2_grad,),
    save_out=True,
)


@autocast_op
def norm(x: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    """Vector norm over ``dim`` (all elements when ``None``): ``p`` is ``2``/``"fro"``, ``1``, ``inf``, ``-inf``, ``0`` or any float.

    The 2-norm is one primitive whose gradient at the zero vector is 0, as PyTorch's;
    ``inf`` shares the gradient evenly between tied maxima.

    >>> import xgrad
    >>> xgrad.norm(xgrad.tensor([3.0, 4.0])).item()
    5.0
    >>> xgrad.norm(xgrad.tensor([[1.0, -2.0], [3.0, 0.0]]), p=1, dim=1).tolist()
    [3.0, 3.0]
    """
    if dtype is not None:
        x = x.to(dtype)
    if not _differentiable_dtype(x.dtype):
        raise RuntimeError(
            f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got {torch_dtype_name(x.dtype)}"
        )
    axes = _axes(dim, x)
    if p == "fro" or p == 2:  # first, with no imports: the common norm, often in a hook at every step
        return _norm2(x, axis=axes, keepdims=keepdim)
    if p == "nuc":
        raise NotImplementedError("norm(p='nuc') is not supported: use jnp.linalg.norm through xgrad.ops.from_jax")
    from xgrad.ops.elementwise import abs, sign
    from xgrad.ops.reduce import amax, amin, sum

    if isinstance(p, str):
        raise RuntimeError(f"norm(): p must be a number, 'fro' or 'nuc', got {p!r}")
    if p == math.inf:
        return amax(abs(x), dim=axes, keepdim=keepdim)
    if p == -math.inf:
        return amin(abs(x), dim=axes, keepdim=keepdim)
    if p == 0:  # the count of non-zeros; its gradient is 0
        return sum(sign(abs(x)), dim=axes, keepdim=keepdim)
    if p == 1:
        return sum(abs(x), dim=axes, keepdim=keepdim)
    return sum(abs(x) ** p, dim=axes, keepdim=keepdim) ** (1.0 / p)


def _linear_impl(x: Any, w: Any, b: Any) -> Any:
    # ``x @ w.T`` contracting ``w``'s second dim in place, not through a transposed copy:
    # the backward's ``g @ w`` then reads the same value, so a sharded weight is gathered
    # once per step for both (an explicit ``w.T`` is a second array XLA gathers again).
    y = jax.lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())))
    return y if b is None else y + b


def _linear_input_grad(g: Tensor, out: Any, x: Any, w: Tensor, b: Any) -> Tensor:
    return g @ w


def _linear_weight_grad(g: Tensor, out: Any, x: Tensor, w: Any, b: Any) -> Tensor:
    if x.ndim == 1:
        return g.unsqueeze(-1) * x
    # One GEMM contracting every batch dim of ``g`` and ``x`` in place (not a batched product
    # summed down, nor ``g.mT @ x``: a transposed copy of ``g`` is a second array that XLA
    # gathers again when the batch is split over devices, as JAX's transpose does not).
    return einsum("...o,...i->oi", g, x)


def _linear_bias_grad(g: Tensor, out: Any, x: Any, w: Any, b: Any) -> Tensor:
    return g.sum_to((g.shape[-1],))


# One node for ``x @ w.T + b``, as PyTorch's addmm: one dispatch forward, one rule call backward.
# ``linear`` binds the primitive itself: the function ``defprim`` returns would pack the arguments again.
defprim("linear", _linear_impl, (_linear_input_grad, _linear_weight_grad, _linear_bias_grad), shape_rule=shape_rules.linear)
_LINEAR = REGISTRY["linear"]


@autocast_op
def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear``: ``input @ weight.T + bias`` with ``weight`` of shape ``(out_features, in_features)``.

    >>> import xgrad
    >>> xgrad.linear(xgrad.tensor([[1.0, 2.0]]), xgrad.tensor([[1.0, 1.0], [0.0, 1.0]]), xgrad.tensor([0.5, 0.0])).tolist()
    [[3.5, 2.0]]
    """
    # The input is not read here: the primitive's shape rule checks it against the weight, as
    # the composite below would (one error either way). The shapes are the arrays' ``aval``
    # fields: ``Tensor.shape`` reads JAX's Python ``shape`` property over them, a call each
    # (NOTE [Recording cost] in registry.py).
    try:
        weight_shape = weight._array.aval.shape
        primitive = len(weight_shape) == 2 and (bias is None or bias._array.aval.shape == weight_shape[:1])
    except AttributeError:  # not a tensor, or one whose array has no ``aval``: the composite reads it as it can
        primitive = False
    if primitive:
        return bind(_LINEAR, (input, weight, bias), {})  # type: ignore[no-any-return]
    # Other shapes (a 1-D weight, a broadcasting bias, a mismatch to report) as the composite.
    if weight.ndim == 2:
        shape_rules.linear(input, weight, bias)
    out = matmul(input, weight.mT if weight.ndim == 2 else weight)
    return out if bias is None else out + bias


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """``F.normalize``: ``input / max(norm_p(input, dim), eps)``.

    >>> import xgrad
    >>> [round(v, 4) for v in xgrad.normalize(xgrad.tensor([[3.0, 4.0]]))[0].tolist()]
    [0.6, 0.8]
    """
    return input / norm(input, p, dim, keepdim=True).clamp_min(eps).expand_as(input)
