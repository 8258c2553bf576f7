"""Autocast's op policy: which ops run in low precision, which in float32, per device type.

``xgrad.autocast`` (``xgrad/amp``) switches it on for a block; the ops in the tables below
carry ``autocast_op``, which casts their floating-point tensor arguments as PyTorch's
autocast does for the same op on the same device type.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

import jax.numpy as jnp

from xgrad.ops.dispatch import OP_CALL
from xgrad.tensor import Tensor

__all__ = ["AUTOCAST", "POLICIES", "autocast_key", "autocast_op", "device_type_of"]

# NOTE [Autocast policies]
# PyTorch's autocast is a dispatch key above autograd: an op on its lists casts its
# eligible arguments (floating point, not float64, on the autocast device type) and runs
# with autocast off inside, so the ops it is built of are not cast again. Each op here
# does the same through ``autocast_op``; the cast is ``Tensor.to``, recorded, so a float32
# parameter's gradient comes back float32. The policies, per device type:
#
# * ``lower``: to the autocast dtype (matmuls, convolutions, linear, attention);
# * ``float32``: to float32 (exp/log family, norms, losses);
# * ``float32_unless_dtype``: to float32 unless the call names a ``dtype`` (softmax, sums);
# * ``widest``: to the widest floating dtype among the arguments (scatter_add);
# * ``refused``: raises, as PyTorch's CUDA autocast refuses ``binary_cross_entropy``;
# * ``own_dtype``: runs in its inputs' dtype. PyTorch's op is one kernel there, while
#   xgrad's is built of ops that are on a list (``mish`` of ``softplus``): autocast off
#   inside keeps the result in the input's dtype, as PyTorch's.
#
# The CUDA lists are PyTorch's (``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``,
# ``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_PROMOTE`` in ATen/autocast_mode.h); the
# CPU lists are what PyTorch's CPU autocast gives (tests/fixtures/make_torch_amp.py checks
# them). The lists name PyTorch's ops by their ``F.``/``torch.`` names, those xgrad has not
# built yet included: an op takes its policy by carrying ``autocast_op`` (test_amp.py checks
# that every op xgrad has under a listed name does). Ops on no list run in their inputs' dtype
# (with mixed inputs, type promotion decides).
_LOWER = (
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "prelu", "matmul", "einsum",
    "mm", "linear", "baddbmm", "bmm", "scaled_dot_product_attention",
)
_LOSSES_FLOAT32 = (
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
    "binary_cross_entropy_with_logits", "margin_ranking_loss", "cosine_embedding_loss", "poisson_nll_loss",
    "hinge_embedding_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "multilabel_margin_loss",
)
_CPU_FLOAT32 = (*_LOSSES_FLOAT32, "prod", "binary_cross_entropy", "ctc_loss", "avg_pool3d")
_CUDA_FLOAT32 = (
    *_LOSSES_FLOAT32, "exp", "expm1", "log", "log1p", "rsqrt", "tan", "pow", "softplus", "layer_norm", "group_norm",
    "cosine_similarity", "logsumexp", "interpolate",
)
_CUDA_FLOAT32_UNLESS_DTYPE = ("softmax", "log_softmax", "sum", "prod", "cumsum", "norm")
# Native kernels in PyTorch, built of listed ops in xgrad (NOTE above).
_CUDA_OWN_DTYPE = ("mish", "logsigmoid", "mean", "var", "std", "batch_norm", "instance_norm")

POLICIES: Mapping[str, Mapping[str, str]] = MappingProxyType({
    "cpu": MappingProxyType(dict.fromkeys(_LOWER, "lower") | dict.fromkeys(_CPU_FLOAT32, "float32")),
    "cuda": MappingProxyType(
        dict.fromkeys(_LOWER, "lower") | dict.fromkeys(_CUDA_FLOAT32, "float32")
        | dict.fromkeys(_CUDA_FLOAT32_UNLESS_DTYPE, "float32_unless_dtype") | dict.fromkeys(_CUDA_OWN_DTYPE, "own_dtype")
        | {"scatter_add": "widest", "binary_cross_entropy": "refused"}
    ),
})

#: The autocast dtype of each device type autocast is on for, in this context (empty: off).
AUTOCAST: ContextVar[Mapping[str, Any]] = ContextVar("xgrad_autocast", default=MappingProxyType({}))
_OFF: Mapping[str, Any] = MappingProxyType({})

_BCE_REFUSED = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast."
)


def autocast_key() -> tuple[tuple[str, Any], ...]:
    """The autocast state as a hashable key: a step traced under it is a program of its own."""
    return tuple(sorted(AUTOCAST.get().items()))


def device_type_of(t: Tensor) -> str:
    """PyTorch's device type of the JAX device holding ``t``: a ``gpu`` device is ``cuda``."""
    platform = t.device.platform
    return "cuda" if platform == "gpu" else platform


def _eligible(value: Any, device_type: str) -> bool:
    return (
        isinstance(value, Tensor)
        and jnp.issubdtype(value.dtype, jnp.floating)
        and value.dtype != jnp.float64
        and device_type_of(value) == device_type
    )


def _cast_arguments(
    name: str, state: Mapping[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    values = [*args, *kwargs.values()]
    targets: dict[str, Any] = {}
    for device_type, low_dtype in state.items():
        policy = POLICIES.get(device_type, _OFF).get(name)
        if policy is None or policy == "own_dtype" or not any(_eligible(v, device_type) for v in values):
            continue
        if policy == "refused":
            raise RuntimeError(_BCE_REFUSED)
        if policy == "lower":
            targets[device_type] = low_dtype
        elif policy == "widest":
            targets[device_type] = functools.reduce(
                jnp.promote_types, [v.dtype for v in values if _eligible(v, device_type)])
        elif policy == "float32" or kwargs.get("dtype") is None:
            targets[device_type] = jnp.dtype(jnp.float32)
    if not targets:
        return args, kwargs

    def cast(value: Any) -> Any:
        for device_type, dtype in targets.items():
            if _eligible(value, device_type):
                return value.to(dtype)
        return value

    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


# NOTE [Autocast's wrapper keeps the op's signature]
# Every listed op runs through its wrapper, autocast on or off, so the wrapper is part
# of each call's cost. One taking ``*args, **kwargs`` packs a tuple and a dict and
# unpacks them again for the op: about 0.3 µs of a recorded ``linear``'s ~11. So the
# wrapper is made with the op's own parameters (its source built from the signature,
# the defaults the op's own objects): while autocast is off and no ``OP_CALL`` serves
# the call, it passes them on as they came. Otherwise the arguments go on as
# ``args`` and ``kwargs`` (the ones before a ``*args`` and those without a default
# positionally, the others by name, defaults included), which autocast's policies and
# ``OP_CALL`` read.
_PARAMETER = inspect.Parameter
_WRAPPER_NAMES = frozenset({"_AUTOCAST", "_OP_CALL", "_fn", "_cast_and_call"})


def _signature_source(fn: Callable[..., Any]) -> tuple[str, str, str, str, dict[str, Any]]:
    """The wrapper's parameter list, its call of ``fn``, the ``args`` and ``kwargs`` it packs, and its defaults."""
    params, call, packed_args, packed_kwargs = [], [], [], []
    defaults: dict[str, Any] = {}
    positional_only = False
    parameters = inspect.signature(fn).parameters.values()
    before_varargs = any(p.kind is _PARAMETER.VAR_POSITIONAL for p in parameters)
    keyword_only_marked = False
    for p in parameters:
        name, kind = p.name, p.kind
        if name in _WRAPPER_NAMES or name.startswith("_default_"):
            raise TypeError(f"autocast_op: {fn.__name__}'s parameter {name!r} would hide a name its wrapper uses")
        default = ""
        if p.default is not _PARAMETER.empty:
            defaults[f"_default_{name}"] = p.default
            default = f"=_default_{name}"
        if kind is _PARAMETER.POSITIONAL_ONLY:
            positional_only = True
        elif positional_only:
            params.append("/")
            positional_only = False
        if kind is _PARAMETER.VAR_POSITIONAL:
            params.append(f"*{name}")
            call.append(f"*{name}")
            packed_args.append(f"*{name}")
            before_varargs = False
            keyword_only_marked = True
        elif kind is _PARAMETER.VAR_KEYWORD:
            params.append(f"**{name}")
            call.append(f"**{name}")
            packed_kwargs.append(f"**{name}")
        elif kind is _PARAMETER.KEYWORD_ONLY:
            if not keyword_only_marked:
                params.append("*")
                keyword_only_marked = True
            params.append(name + default)
            call.append(f"{name}={name}")
            packed_kwargs.append(f"{name!r}: {name}")
        else:
            params.append(name + default)
            call.append(name)
            if before_varargs or not default or kind is _PARAMETER.POSITIONAL_ONLY:
                packed_args.append(name)
            else:
                packed_kwargs.append(f"{name!r}: {name}")
    if positional_only:
        params.append("/")
    packed = "".join(f"{a}, " for a in packed_args)
    return ", ".join(params), ", ".join(call), f"({packed})", "{" + ", ".join(packed_kwargs) + "}", defaults


def autocast_op(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with autocast's cast of its arguments, by its name's policy (NOTE [Autocast policies])."""
    name = fn.__name__

    def cast_and_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        state = AUTOCAST.get()
        if not state:
            op_call = OP_CALL.get()  # NOTE [Dispatch seam] in xgrad/ops/dispatch.py
            return fn(*args, **kwargs) if op_call is None else op_call(fn, args, kwargs)
        args, kwargs = _cast_arguments(name, state, args, kwargs)
        token = AUTOCAST.set(_OFF)  # the ops ``fn`` is built of are not cast again
        try:
            return fn(*args, **kwargs)
        finally:
            AUTOCAST.reset(token)

    params, call, packed_args, packed_kwargs, defaults = _signature_source(fn)
    # NOTE [Autocast's wrapper keeps the op's signature]
    source = (
        f"def under_autocast({params}):\n"
        f"    if not _AUTOCAST.get() and _OP_CALL.get() is None:\n"
        f"        return _fn({call})\n"
        f"    return _cast_and_call({packed_args}, {packed_kwargs})\n"
    )
    # Named as this module's code (its ``__name__``, a file name under this file's): the sites that messages and
    # warnings point at skip it as they skip xgrad's own frames, and name the user's line.
    namespace = {
        "__name__": __name__, "_AUTOCAST": AUTOCAST, "_OP_CALL": OP_CALL, "_fn": fn, "_cast_and_call": cast_and_call,
        **defaults,
    }
    filename = f"{__file__} <autocast_op {name}>"
    exec(compile(source, filename, "exec"), namespace)  # the source is built from fn's signature alone
    return functools.wraps(fn)(namespace["under_autocast"])
