"""Shape rules: PyTorch's checks of an op's argument shapes and dtypes, in its words and exception types.

# NOTE [Shape rules]
# JAX checks shapes too, but raises its own ``TypeError``/``ValueError`` in its own
# words, and accepts some inputs PyTorch refuses (``matmul`` of an int and a float
# tensor, a kernel larger than the padded input, negative padding). A primitive
# registered with ``defprim(..., shape_rule=rule)`` runs ``rule(*arrays, **params)``
# before its forward, on the arrays' shapes and dtypes alone, and the rule raises
# PyTorch's ``RuntimeError``/``IndexError`` with PyTorch's phrases. The rule runs where
# JAX does its own shape inference: when the jitted forward is traced, once per
# signature, so a cache hit pays nothing (NOTE [Jitted dispatch]); a forward that is
# not jitted runs it on every call. The same rule holds under ``xgrad.compile`` and
# plain JAX traces, where shapes are static. A rule reads ``.shape``/``.dtype`` only;
# Python scalars count as 0-dim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

from xgrad.tensor import torch_dtype_name

__all__ = [
    "attention", "broadcast_shapes", "check_float", "conv2d", "einsum", "elementwise", "float_only", "index", "linear",
    "matmul", "nonempty_reduction", "not_bool", "not_bool_kernel", "same_dtype_name", "softmax", "subtraction",
]

# PyTorch's C++ names of dtypes, as its matmul messages print them.
_CPP_NAMES = {
    "float32": "float", "float64": "double", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
    "int64": "long int", "int32": "int", "int16": "short int", "int8": "signed char", "uint8": "unsigned char",
    "bool": "bool",
}


def _shape(a: Any) -> tuple[int, ...]:
    return tuple(getattr(a, "shape", ()))


def _dtype(a: Any) -> Any:
    return getattr(a, "dtype", None)


def _inexact(dtype: Any) -> bool:
    return dtype is not None and bool(jnp.issubdtype(dtype, jnp.inexact))  # bfloat16 too (its kind is "V")


def _kinds_differ(a: Any, b: Any) -> bool:
    """Whether dtypes ``a`` and ``b`` are of different kinds (integer or bool against float).

    PyTorch also refuses two float widths (float32 with float64); xgrad promotes those, as
    JAX does: with x64 on, ``xgrad.ones`` is float64 while a module's parameters may be float32.
    """
    return a != b and (a is None or b is None or _inexact(a) != _inexact(b) or a == jnp.bool_ or b == jnp.bool_)


def same_dtype_name(dtype: Any) -> str:
    """PyTorch's C++ name of ``dtype`` (``long int``, ``float``), as in its matmul dtype message.

    >>> import jax.numpy as jnp
    >>> same_dtype_name(jnp.int64), same_dtype_name(jnp.float32)
    ('long int', 'float')
    """
    name = jnp.dtype(dtype).name
    return _CPP_NAMES.get(name, name)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """PyTorch's ``infer_size``: the broadcast shape, or its ``RuntimeError`` naming the first mismatch from the right.

    >>> broadcast_shapes((2, 1), (3,))
    (2, 3)
    >>> broadcast_shapes((2, 3), (4,))
    Traceback (most recent call last):
    RuntimeError: The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 1
    """
    result = shapes[0] if shapes else ()
    for other in shapes[1:]:
        if other == result:
            continue
        ndim = max(len(result), len(other))
        out = []
        for i in range(ndim):
            a = result[i - ndim + len(result)] if i - ndim + len(result) >= 0 else 1
            b = other[i - ndim + len(other)] if i - ndim + len(other) >= 0 else 1
            if a != b and a != 1 and b != 1:
                raise RuntimeError(
                    f"The size of tensor a ({a}) must match the size of tensor b ({b}) at non-singleton dimension {i}"
                )
            out.append(b if a == 1 else a)
        result = tuple(out)
    return result


def elementwise(*operands: Any, **params: Any) -> None:
    """Operands of an elementwise op must broadcast together (``None`` operands are absent)."""
    shapes = [_shape(a) for a in operands if a is not None]
    if len(shapes) > 1 and any(s != shapes[0] for s in shapes):
        broadcast_shapes(*shapes)


def check_float(x: Any, kernel: str) -> None:
    """PyTorch's ``NotImplementedError`` for a kernel it has for floating (and complex) dtypes only.

    >>> import jax.numpy as jnp
    >>> check_float(jnp.zeros(2, jnp.int32), "mse_cpu")
    Traceback (most recent call last):
    NotImplementedError: "mse_cpu" not implemented for 'Int'
    """
    dtype = _dtype(x)
    if dtype is not None and not _inexact(dtype):
        raise NotImplementedError(f'"{kernel}" not implemented for \'{torch_dtype_name(dtype)}\'')


def not_bool(message: str) -> Callable[..., None]:
    """A rule for ops PyTorch refuses on bool tensors, with its ``RuntimeError`` ``message``."""

    def rule(*operands: Any, **params: Any) -> None:
        if any(_dtype(a) == jnp.bool_ for a in operands):
            raise RuntimeError(message)

    return rule


def not_bool_kernel(kernel: str) -> Callable[..., None]:
    """A rule for ops PyTorch has no bool kernel for: its ``NotImplementedError``."""

    def rule(x: Any, *rest: Any, **params: Any) -> None:
        if _dtype(x) == jnp.bool_:
            raise NotImplementedError(f'"{kernel}" not implemented for \'Bool\'')

    return rule


def subtraction(x: Any, y: Any) -> None:
    """``sub``'s rules: broadcastable operands, neither of them bool (PyTorch's ``sub_check``)."""
    elementwise(x, y)
    bools = (_dtype(x) == jnp.bool_) + (_dtype(y) == jnp.bool_)
    if bools == 2:
        raise RuntimeError(
            "Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or `logical_xor()` "
            "operator instead."
        )
    if bools:
        raise RuntimeError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying to invert a mask, "
            "use the `~` or `logical_not()` operator instead."
        )


def softmax(kernel: str) -> Callable[..., None]:
    """``softmax``/``log_softmax``'s rule: floating input (PyTorch names its kernel by the dim)."""

    def rule(x: Any, axis: Any) -> None:
        last = axis is None or axis == len(_shape(x)) - 1
        check_float(x, f"{kernel}_lastdim_kernel_impl" if last else f"{kernel}_kernel_impl")

    return rule


def float_only(kernel: str) -> Callable[..., None]:
    """A rule for ops PyTorch implements for floating (and complex) dtypes only: its ``NotImplementedError``.

    >>> import jax.numpy as jnp
    >>> float_only("softmax_lastdim_kernel_impl")(jnp.zeros(2, jnp.int32))
    Traceback (most recent call last):
    NotImplementedError: "softmax_lastdim_kernel_impl" not implemented for 'Int'
    """

    def rule(x: Any, *rest: Any, **params: Any) -> None:
        check_float(x, kernel)

    return rule


def matmul(x: Any, y: Any) -> None:
    """PyTorch's ``matmul`` checks: ranks, dtypes, the contracted sizes, broadcastable batch dims.

    >>> import jax.numpy as jnp
    >>> matmul(jnp.zeros((2, 3)), jnp.zeros((2, 3)))
    Traceback (most recent call last):
    RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)
    """
    _matmul_shapes(_shape(x), _shape(y), _dtype(x), _dtype(y))


def _matmul_shapes(xs: tuple[int, ...], ys: tuple[int, ...], x_dtype: Any, y_dtype: Any) -> None:
    if not xs or not ys:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {len(xs)}D and {len(ys)}D")
    if x_dtype == jnp.bool_ and y_dtype == jnp.bool_:
        kernel = "dot" if len(xs) == len(ys) == 1 else "addmm_impl_cpu_" if len(ys) <= 2 else "bmm"
        raise NotImplementedError(f'"{kernel}" not implemented for \'Bool\'')
    if _kinds_differ(x_dtype, y_dtype):
        if len(xs) == 1 and len(ys) == 1:
            raise RuntimeError(
                f"dot : expected both vectors to have same dtype, but found {torch_dtype_name(x_dtype)} and "
                f"{torch_dtype_name(y_dtype)}"
            )
        raise RuntimeError(
            f"expected m1 and m2 to have the same dtype, but got: {same_dtype_name(x_dtype)} != {same_dtype_name(y_dtype)}"
        )
    k_x = xs[-1]
    k_y = ys[0] if len(ys) == 1 else ys[-2]
    if k_x != k_y:
        if len(xs) == 1 and len(ys) == 1:
            raise RuntimeError(
                f"inconsistent tensor size, expected tensor [{xs[0]}] and src [{ys[0]}] to have the same number of "
                f"elements, but got {xs[0]} and {ys[0]} elements respectively"
            )
        rows = int(np.prod(xs[:-1]))
        if len(ys) == 1:
            raise RuntimeError(f"size mismatch, got input ({rows}), mat ({rows}x{k_x}), vec ({ys[0]})")
        if len(ys) == 2:  # a (batch of) matrix times one matrix: PyTorch folds the batch into the rows
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({rows}x{k_x} and {ys[0]}x{ys[1]})")
        batch = int(np.prod(ys[:-2]))
        raise RuntimeError(
            f"Expected size for first two dimensions of batch2 tensor to be: [{batch}, {k_x}] but got: [{batch}, {k_y}]."
        )
    if len(xs) > 2 or len(ys) > 2:
        broadcast_shapes(xs[:-2], ys[:-2])


def linear(x: Any, w: Any, b: Any) -> None:
    """``F.linear``'s checks: ``x @ w.T`` as ``matmul``'s, then the bias against the output."""
    ws = _shape(w)
    _matmul_shapes(_shape(x), ws[::-1], _dtype(x), _dtype(w))
    if b is not None:  # the bias is expanded to the output, as PyTorch's addmm does
        out, bs = _shape(x)[:-1] + ws[:1], _shape(b)
        lead = len(out) - len(bs)
        for i, size in enumerate(bs):
            if lead < 0 or size not in (1, out[lead + i]):
                dim = max(lead, 0) + i
                raise RuntimeError(
                    f"The expanded size of the tensor ({out[dim] if dim < len(out) else 0}) must match the existing size "
                    f"({size}) at non-singleton dimension {dim}.  Target sizes: {list(out)}.  Tensor sizes: {list(bs)}"
                )


def attention(q: Any, k: Any, v: Any, mask: Any, keep: Any, scale: float, is_causal: bool) -> None:
    """``F.scaled_dot_product_attention``'s checks: PyTorch's math path multiplies ``q @ k^T``, then ``probs @ v``."""
    qs, ks = _shape(q), _shape(k)
    _matmul_shapes(qs, ks[:-2] + ks[-1:] + ks[-2:-1], _dtype(q), _dtype(k))
    scores = broadcast_shapes(qs[:-2], ks[:-2]) + (qs[-2], ks[-2])
    if mask is not None:
        broadcast_shapes(scores, _shape(mask))
    _matmul_shapes(scores, _shape(v), _dtype(q), _dtype(v))


def einsum(*operands: Any, subscripts: str) -> None:
    """``torch.einsum``'s checks: operand count, subscripts per operand, one size per subscript, the output's subscripts."""
    equation = subscripts.replace(" ", "")
    for i, c in enumerate(equation):
        if not (c.isascii() and c.isalpha()) and c not in ",.->":
            raise RuntimeError(
                f"einsum(): invalid subscript given at index {i} in the equation string, subscripts must be in [a-zA-Z]"
            )
    inputs = equation.split("->")[0].split(",")
    if "->" in equation:
        output = equation.split("->", 1)[1].replace("...", "")
        for label in output:
            if output.count(label) > 1:
                raise RuntimeError(f"einsum(): output subscript {label} appears more than once in the output")
            if not any(label in labels for labels in inputs):
                raise RuntimeError(f"einsum(): output subscript {label} does not appear in the equation for any input operand")
    if len(inputs) > len(operands):
        raise RuntimeError("einsum(): fewer operands were provided than specified in the equation")
    if len(inputs) < len(operands):
        raise RuntimeError("einsum(): more operands were provided than specified in the equation")
    sizes: dict[str, int] = {}
    for i, (labels, operand) in enumerate(zip(inputs, operands, strict=True)):
        shape = _shape(operand)
        if "..." in labels:
            continue  # broadcast dims: JAX's rule, as it is PyTorch's
        if len(labels) != len(shape):
            raise RuntimeError(
                f"einsum(): the number of subscripts in the equation ({len(labels)}) does not match the number of "
                f"dimensions ({len(shape)}) for operand {i} and no ellipsis was given"
            )
        for label, size in zip(labels, shape, strict=True):
            seen = sizes.setdefault(label, size)
            if seen != size and seen != 1 and size != 1:
                raise RuntimeError(
                    f"einsum(): subscript {label} has size {size} for operand {i} which does not broadcast with "
                    f"previously seen size {seen}"
                )


def conv2d(x: Any, w: Any, stride: tuple[int, int], padding: Any, dilation: tuple[int, int], groups: int) -> None:
    """``F.conv2d``'s checks (PyTorch's ``check_shape_forward``): ranks, dtypes, channels, groups, padded size."""
    xs, ws = _shape(x), _shape(w)
    if len(xs) != 4:
        raise RuntimeError(f"Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: {list(xs)}")
    if len(ws) != 4:
        raise RuntimeError(
            f"weight should have at least three dimensions and as many as the input: got weight of size {list(ws)}"
        )
    if _kinds_differ(_dtype(x), _dtype(w)):
        raise RuntimeError(
            f"expected scalar type {torch_dtype_name(_dtype(x))} but found {torch_dtype_name(_dtype(w))}"
        )
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    if 0 in ws[2:]:  # XLA's verifier would reject the program (an MLIR dump)
        raise RuntimeError(f"kernel size should be greater than zero, but got kernel_height: {ws[2]} kernel_width: {ws[3]}")
    if any(s <= 0 for s in stride):
        raise RuntimeError("non-positive stride is not supported")
    if any(d <= 0 for d in dilation):
        raise RuntimeError(f"dilation should be greater than zero, but got {list(dilation)}")
    if isinstance(padding, str):
        if padding == "SAME" and any(s != 1 for s in stride):
            raise RuntimeError("padding='same' is not supported for strided convolutions")
        pads = ((0, 0), (0, 0)) if padding == "VALID" else None
    else:
        pads = padding
        if any(p < 0 for pair in pads for p in pair):
            raise RuntimeError("negative padding is not supported")
    if ws[0] % groups:
        raise RuntimeError(
            f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but got weight of "
            f"size [{list(ws)}] instead"
        )
    if xs[1] != ws[1] * groups:
        raise RuntimeError(
            f"Given groups={groups}, weight of size {list(ws)}, expected input{list(xs)} to have {ws[1] * groups} "
            f"channels, but got {xs[1]} channels instead"
        )
    if pads is not None:
        padded = [xs[2 + i] + pads[i][0] + pads[i][1] for i in range(2)]
        kernel = [(ws[2 + i] - 1) * dilation[i] + 1 for i in range(2)]
        if any(k > p for k, p in zip(kernel, padded, strict=True)):
            raise RuntimeError(
                f"Calculated padded input size per channel: ({padded[0]} x {padded[1]}). Kernel size: "
                f"({kernel[0]} x {kernel[1]}). Kernel size can't be greater than actual input size"
            )


def nonempty_reduction(name: str) -> Callable[..., None]:
    """A rule for ``amax``/``amin``: each reduced dim must have elements (PyTorch's ``IndexError``)."""

    def rule(x: Any, axis: Any, keepdims: bool) -> None:
        shape = _shape(x)
        if axis is None:
            if 0 in shape:
                raise RuntimeError(
                    f"{name}(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction "
                    "dim with the 'dim' argument."
                )
            return
        for a in axis:
            if shape[a] == 0:
                raise IndexError(f"{name}(): Expected reduction dim {a} to have non-zero size.")

    return rule


def index(x: Any, *rest: Any, index: Any) -> None:
    """``x[index]``'s checks on index arrays: integer or bool dtypes, shapes that broadcast together."""
    items = index if isinstance(index, tuple) else (index,)
    arrays = []
    for item in items:
        dtype = _dtype(item)
        if dtype is None or not _shape(item) and isinstance(item, (int, np.integer)):
            continue
        kind = jnp.dtype(dtype).kind
        if kind not in "iub":
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        if kind != "b":
            arrays.append(_shape(item))
    if len(arrays) > 1 and any(s != arrays[0] for s in arrays):
        try:
            broadcast_shapes(*arrays)
        except RuntimeError:
            shown = ", ".join(str(list(s)) for s in arrays)
            raise IndexError(f"shape mismatch: indexing tensors could not be broadcast together with shapes {shown}") from None
