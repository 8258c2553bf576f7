"""xgrad's op library: primitives from the registry and the composites built on them.

Every name here is also an ``xgrad.*`` function, and most are ``Tensor`` methods
and operators (installed below).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from xgrad.engine import engine_ops
from xgrad.grad_mode import is_grad_enabled
from xgrad.ops import tangents as _tangents  # noqa: F401 - installs every primitive's forward-mode rule
from xgrad.ops import views
from xgrad.ops.attention import scaled_dot_product_attention
from xgrad.ops.elementwise import (
    abs,
    add,
    astype,
    ceil,
    clamp,
    clamp_max,
    clamp_min,
    clone,
    cos,
    div,
    eq,
    erf,
    exp,
    expm1,
    floor,
    ge,
    gelu,
    gt,
    isfinite,
    isnan,
    le,
    log,
    log1p,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    lt,
    maximum,
    minimum,
    mul,
    ne,
    neg,
    pow,
    relu,
    round,
    rsqrt,
    sigmoid,
    sign,
    silu,
    sin,
    softplus,
    sqrt,
    sub,
    tan,
    tanh,
    to_device,
    where,
)
from xgrad.ops.index import embedding, gather, getitem, index_select, scatter_add, setitem, sort
from xgrad.ops.jaxop import from_jax
from xgrad.ops.layout import (
    diag,
    expand_as,
    movedim,
    narrow,
    repeat,
    repeat_interleave,
    reshape_as,
    select,
    unbind,
    unfold,
    view_as,
)
from xgrad.ops.linalg import baddbmm, bmm, conv2d, einsum, linear, matmul, norm, normalize, outer
from xgrad.ops.losses import binary_cross_entropy, binary_cross_entropy_with_logits, nll_loss
from xgrad.ops.nn import cross_entropy, dropout, layer_norm, log_softmax, mse_loss, softmax
from xgrad.ops.reduce import (
    amax,
    amin,
    argmax,
    argmin,
    cumsum,
    logsumexp,
    max,
    mean,
    min,
    prod,
    std,
    sum,
    sum_to,
    var,
)
from xgrad.ops.registry import REGISTRY, Primitive, defprim
from xgrad.ops.resample import interpolate
from xgrad.ops.selection import all, any, argsort, masked_fill, masked_select, nonzero, one_hot, topk
from xgrad.ops.shape import (
    T,
    broadcast_to,
    cat,
    chunk,
    concatenate,
    expand,
    flatten,
    flip,
    mT,
    pad,
    permute,
    reshape,
    roll,
    split,
    squeeze,
    stack,
    transpose,
    tril,
    triu,
    unsqueeze,
    view,
)
from xgrad.tensor import Tensor

#: The differentiable ops a user calls (the registry-driven tests cover each one).
DIFFERENTIABLE_OPS = (
    "abs", "add", "amax", "amin", "astype", "broadcast_to", "cat", "chunk", "clamp", "clone", "concatenate", "conv2d", "cos",
    "cross_entropy", "cumsum", "div", "dropout", "einsum", "embedding", "erf", "exp", "expand", "expm1", "flatten",
    "flip", "gather", "gelu", "getitem", "index_select", "layer_norm", "log", "log1p", "log_softmax", "logsumexp",
    "matmul", "max", "maximum", "mean", "min", "minimum", "mse_loss", "mT", "mul", "neg", "pad", "permute", "pow",
    "prod", "relu", "reshape", "roll", "rsqrt", "scatter_add", "sigmoid", "sign", "silu", "sin", "softmax",
    "softplus", "sort", "split", "sqrt", "squeeze", "stack", "std", "sub", "sum", "sum_to", "T", "tan", "tanh",
    "to_device", "transpose", "tril", "triu", "unsqueeze", "var", "view", "where",
    # Names PyTorch users reach for
    "baddbmm", "binary_cross_entropy", "binary_cross_entropy_with_logits", "bmm", "clamp_max", "clamp_min", "expand_as",
    "interpolate", "linear", "masked_fill", "masked_select", "narrow", "nll_loss", "norm", "normalize", "outer", "repeat",
    "repeat_interleave", "reshape_as", "scaled_dot_product_attention", "select", "topk", "unbind", "view_as",
    "diag", "movedim", "unfold",
)

# Written out in full (not computed from DIFFERENTIABLE_OPS) so that type checkers see the
# top-level re-export ``from xgrad.ops import *``; every differentiable op must be listed here
# too (tests/test_ops.py checks).
__all__ = [
    "abs", "add", "all", "amax", "amin", "any", "argmax", "argmin", "argsort", "astype", "baddbmm",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "bmm", "broadcast_to", "cat", "ceil", "chunk", "clamp",
    "clamp_max", "clamp_min", "clone", "concatenate", "conv2d", "cos", "cross_entropy", "cumsum", "defprim", "diag", "div",
    "dropout", "einsum", "embedding", "eq", "erf", "exp", "expand", "expand_as", "expm1", "flatten", "flip", "floor",
    "from_jax", "gather", "ge", "gelu", "getitem", "gt", "index_select", "interpolate", "isfinite", "isnan",
    "layer_norm", "le", "linear", "log", "log1p", "log_softmax", "logical_and", "logical_not", "logical_or",
    "logical_xor", "logsumexp", "lt", "masked_fill", "masked_select", "matmul", "max", "maximum", "mean", "min",
    "minimum", "movedim", "mse_loss", "mT", "mul", "narrow", "ne", "neg", "nll_loss", "nonzero", "norm", "normalize", "one_hot",
    "outer", "pad", "permute", "pow", "Primitive", "prod", "REGISTRY", "relu", "repeat", "repeat_interleave", "reshape",
    "reshape_as", "roll", "round", "rsqrt", "scaled_dot_product_attention", "scatter_add", "select", "setitem",
    "sigmoid", "sign", "silu", "sin", "softmax", "softplus", "sort", "split", "sqrt", "squeeze", "stack", "std", "sub",
    "sum", "sum_to", "T", "tan", "tanh", "to_device", "topk", "transpose", "tril", "triu", "unbind", "unfold", "unsqueeze",
    "var", "view", "view_as", "where",
]


# -- Tensor methods and operators ----------------------------------------------------
def _r(fn: Any) -> Any:
    """The reflected operator: ``other <op> self``."""
    return lambda self, other: fn(other, self)


def _to(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """``.to(device)``, ``.to(dtype)``, ``.to(device, dtype)``, ``.to(other)`` or keywords; each is differentiable."""
    target = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    for ignored in ("non_blocking", "copy", "memory_format"):  # no meaning for immutable jax.Arrays
        kwargs.pop(ignored, None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, Tensor):  # .to(other): other's dtype and device
            dtype, target = a.dtype, a.sharding if a.shape == self.shape else a.device
        elif isinstance(a, str) or hasattr(a, "platform") or hasattr(a, "device_set"):
            target = a
        elif a is not None and not isinstance(a, bool):  # non_blocking/copy given positionally
            dtype = a
    out = self
    if dtype is not None and jnp.dtype(dtype) != self.dtype:
        out = astype(out, dtype=jnp.dtype(dtype))
    if target is not None:
        from xgrad.creation import resolve_device

        resolved = resolve_device(target)
        current = self._array.sharding
        if resolved not in current.device_set and resolved != current:
            out = to_device(out, resolved)
    return out


def _inplace(fn: Any) -> Any:
    def method(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        self._check_inplace()
        return self._rebind(fn(self._alias(), *args, **kwargs))

    method.__name__ = fn.__name__ + "_"
    method.__doc__ = f"In-place ``{fn.__name__}``: rebinds the storage and bumps ``_version``."
    return method


def _overwrite(self: Tensor, value: Tensor) -> Tensor:
    """Replace every element of ``self`` by ``value`` (broadcast), in place.

    The old value gets a zero gradient, ``value`` the incoming one: recorded as a
    ``where`` that never picks the old value, so a non-leaf's history is cut exactly
    there even when ``value`` is a constant (as PyTorch's ``zero_``/``copy_`` do).
    """
    self._check_inplace()
    if not (is_grad_enabled() and (self.requires_grad or value.requires_grad)):
        return self._rebind(broadcast_to(value.to(self.dtype), self.shape))
    return self._rebind(where(jnp.zeros(self.shape, bool), self._alias(), value.to(self.dtype)))


def _zero_(self: Tensor) -> Tensor:
    return _overwrite(self, Tensor(jnp.zeros((), self.dtype)))


def _fill_(self: Tensor, value: Any) -> Tensor:
    return _overwrite(self, value if isinstance(value, Tensor) else Tensor(jnp.asarray(value, self.dtype)))


def _copy_(self: Tensor, src: Any) -> Tensor:
    return _overwrite(self, src if isinstance(src, Tensor) else Tensor(jnp.asarray(src)))


_METHODS: dict[str, Any] = {
    "__add__": add, "__radd__": _r(add), "__sub__": sub, "__rsub__": _r(sub), "__mul__": mul, "__rmul__": _r(mul),
    "__truediv__": div, "__rtruediv__": _r(div), "__pow__": pow, "__rpow__": _r(pow), "__matmul__": matmul,
    "__rmatmul__": _r(matmul), "__neg__": neg, "__abs__": abs, "__getitem__": getitem, "__setitem__": setitem,
    "__eq__": eq, "__ne__": ne, "__lt__": lt, "__le__": le, "__gt__": gt, "__ge__": ge,
    "__and__": logical_and, "__or__": logical_or, "__xor__": logical_xor, "__invert__": logical_not,
    "add": add, "sub": sub, "mul": mul, "div": div, "neg": neg, "pow": pow, "matmul": matmul,
    "exp": exp, "log": log, "log1p": log1p, "expm1": expm1, "sqrt": sqrt, "rsqrt": rsqrt, "abs": abs, "sign": sign,
    "sin": sin, "cos": cos, "tan": tan, "tanh": tanh, "sigmoid": sigmoid, "relu": relu, "erf": erf,
    "maximum": maximum, "minimum": minimum, "clamp": clamp, "clip": clamp,
    "sum": sum, "mean": mean, "var": var, "std": std, "prod": prod, "max": max, "min": min, "amax": amax,
    "amin": amin, "logsumexp": logsumexp, "argmax": argmax, "argmin": argmin, "cumsum": cumsum, "sum_to": sum_to,
    "softmax": softmax, "log_softmax": log_softmax,
    "reshape": reshape, "view": view, "flatten": flatten, "squeeze": squeeze, "unsqueeze": unsqueeze,
    "transpose": transpose, "permute": permute, "expand": expand, "broadcast_to": broadcast_to,
    "split": split, "chunk": chunk, "flip": flip, "roll": roll, "tril": tril, "triu": triu,
    "gather": gather, "scatter_add": scatter_add, "index_select": index_select, "sort": sort,
    "isnan": isnan, "isfinite": isfinite, "floor": floor, "ceil": ceil, "round": round,
    "eq": eq, "ne": ne, "lt": lt, "le": le, "gt": gt, "ge": ge,
    "astype": lambda self, dtype: astype(self, dtype=jnp.dtype(dtype)) if jnp.dtype(dtype) != self.dtype else self,
    "to": _to, "clone": clone,
    "float": lambda self: _to(self, jnp.float32), "double": lambda self: _to(self, jnp.float64),
    "half": lambda self: _to(self, jnp.float16), "bfloat16": lambda self: _to(self, jnp.bfloat16),
    "zero_": _zero_, "fill_": _fill_, "copy_": _copy_,
    # More names PyTorch users reach for (contiguous, cpu, cuda, new_* ... are in tensor/pytorch_methods.py)
    # long(): int64 where x64 allows it, else int32 without a warning (indices work either way).
    "long": lambda self: _to(self, jax.dtypes.canonicalize_dtype(jnp.int64)), "int": lambda self: _to(self, jnp.int32),
    "bool": lambda self: _to(self, jnp.bool_),
    "clamp_min": clamp_min, "clamp_max": clamp_max, "masked_fill": masked_fill, "masked_select": masked_select,
    "nonzero": nonzero, "any": any, "all": all, "argsort": argsort, "topk": topk, "norm": norm, "outer": outer,
    "bmm": bmm, "baddbmm": baddbmm, "repeat": repeat, "repeat_interleave": repeat_interleave, "unbind": unbind,
    "narrow": narrow, "select": select, "expand_as": expand_as, "view_as": view_as, "reshape_as": reshape_as,
    "movedim": movedim, "moveaxis": movedim, "diag": diag, "unfold": unfold,
}
for _name in ("add", "sub", "mul", "div", "pow", "clamp", "exp", "log", "sqrt", "neg", "abs", "tanh", "sigmoid", "relu", "sin", "cos",
              "clamp_min", "clamp_max", "masked_fill"):
    _METHODS[_name + "_"] = _inplace(globals()[_name])
for _op, _name in (("__iadd__", "add"), ("__isub__", "sub"), ("__imul__", "mul"), ("__itruediv__", "div"), ("__ipow__", "pow")):
    _METHODS[_op] = _METHODS[_name + "_"]
for _name, _fn in _METHODS.items():
    setattr(Tensor, _name, _fn)
Tensor.T = property(T)  # type: ignore[attr-defined]
Tensor.mT = property(mT)  # type: ignore[attr-defined]
del _name, _fn, _op

engine_ops.register(sum_to=sum_to, to_device=to_device, stack=stack, write_through=views.write_through)
