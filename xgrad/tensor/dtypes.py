"""Dtype rules of ``Tensor``: which dtypes are differentiable, which casts an in-place
result may take, PyTorch's names for dtypes (``xgrad.float32``, ``Float`` in messages)
and the default floating dtype."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "DTYPES", "ERR_REQUIRES_GRAD_DTYPE", "ERR_X64_OFF", "can_cast", "check_x64", "resolve_dtype", "default_complex", "default_float", "dtype",
    "finfo", "get_default_dtype", "iinfo", "is_differentiable_dtype", "parameter_dtype", "set_default_dtype", "torch_dtype_name",
    "x64_enabled",
]

ERR_REQUIRES_GRAD_DTYPE = "Only Tensors of floating point and complex dtype can require gradients, got {dtype}"


def is_differentiable_dtype(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


# PyTorch's names for dtypes, used in its error messages.
_TORCH_DTYPE_NAMES = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int64": "Long",
    "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool",
    "complex64": "ComplexFloat", "complex128": "ComplexDouble",
}


def torch_dtype_name(dtype: Any) -> str:
    """PyTorch's name of ``dtype`` (``Float``, ``Long``, …), for messages PyTorch users recognise.

    >>> import jax.numpy as jnp
    >>> torch_dtype_name(jnp.float32), torch_dtype_name(jnp.int64)
    ('Float', 'Long')
    """
    name = jnp.dtype(dtype).name
    return _TORCH_DTYPE_NAMES.get(name, name)


def _dtype_kind_rank(dtype: Any) -> int:
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return 3
    if jnp.issubdtype(dtype, jnp.floating):
        return 2
    if jnp.issubdtype(dtype, jnp.bool_):
        return 0
    return 1


def can_cast(from_dtype: Any, to_dtype: Any) -> bool:
    """PyTorch's ``can_cast`` for in-place results: never complex to real, float to int, or anything to bool.

    >>> import jax.numpy as jnp
    >>> can_cast(jnp.float64, jnp.float32), can_cast(jnp.float32, jnp.int64), can_cast(jnp.int32, jnp.float32)
    (True, False, True)
    """
    return _dtype_kind_rank(from_dtype) <= _dtype_kind_rank(to_dtype)


# -- PyTorch's dtype names -------------------------------------------------------------
class _DtypeMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        # ``t.dtype`` is a NumPy dtype (the contract): ``isinstance(t.dtype, xgrad.dtype)`` holds as in PyTorch.
        return type.__instancecheck__(cls, obj) or isinstance(obj, np.dtype)


class dtype(metaclass=_DtypeMeta):  # noqa: N801  (PyTorch's name)
    """A dtype under PyTorch's name (``xgrad.float32``, ``xgrad.long``, …).

    It stands for a NumPy dtype (its ``.dtype``), so NumPy and JAX take it wherever they
    take a dtype, it compares and hashes equal to that dtype (``t.dtype == xgrad.float32``)
    and it prints as PyTorch's does.

    >>> import xgrad, jax.numpy as jnp
    >>> xgrad.float32, xgrad.zeros(2, dtype=xgrad.int64).dtype == xgrad.long, xgrad.float32 == jnp.float32
    (xgrad.float32, True, True)
    """

    __slots__ = ("dtype", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = np.dtype(jnp.dtype(name))

    def __repr__(self) -> str:
        return f"xgrad.{self.name}"

    def __eq__(self, other: object) -> bool:
        try:
            return bool(self.dtype == np.dtype(other))  # type: ignore[call-overload]
        except TypeError:
            return NotImplemented

    def __hash__(self) -> int:
        return hash(self.dtype)

    def __reduce__(self) -> tuple[Any, ...]:
        return (dtype, (self.name,))

    @property
    def is_floating_point(self) -> bool:
        return bool(jnp.issubdtype(self.dtype, jnp.floating))

    @property
    def is_complex(self) -> bool:
        return bool(jnp.issubdtype(self.dtype, jnp.complexfloating))

    @property
    def is_signed(self) -> bool:
        return bool(jnp.issubdtype(self.dtype, jnp.signedinteger) or jnp.issubdtype(self.dtype, jnp.inexact))

    @property
    def itemsize(self) -> int:
        return int(self.dtype.itemsize)


#: ``xgrad.<name>`` for each PyTorch dtype name, aliases included (``long`` is ``int64``).
DTYPES = {name: dtype(name) for name in (
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "uint8", "int8", "int16", "int32", "int64", "bool",
)}
DTYPES.update(
    half=DTYPES["float16"], float=DTYPES["float32"], double=DTYPES["float64"], cfloat=DTYPES["complex64"],
    cdouble=DTYPES["complex128"], short=DTYPES["int16"], int=DTYPES["int32"], long=DTYPES["int64"],
)

ERR_X64_OFF = (
    "{what}: {dtype} needs JAX's 64-bit mode, which is off (JAX would silently give {narrow}). Turn it on at "
    'startup with jax.config.update("jax_enable_x64", True), or keep 32-bit types (.float(), xgrad.float32).'
)


def x64_enabled() -> bool:
    # Read through canonicalisation, so a scoped jax.enable_x64 counts as well as the flag.
    return bool(jax.dtypes.canonicalize_dtype(np.float64) == np.float64)


def check_x64(requested: Any, what: str) -> None:
    """Raise ``ERR_X64_OFF`` when ``requested`` is float64/complex128 and JAX's x64 mode is off.

    Integers are left to JAX's narrowing: index arrays are routinely int64 and work as int32.
    """
    if requested is None:
        return
    wanted = np.dtype(requested)
    if wanted in (np.float64, np.complex128) and not x64_enabled():
        raise TypeError(ERR_X64_OFF.format(what=what, dtype=wanted.name, narrow=jax.dtypes.canonicalize_dtype(wanted).name))


def resolve_dtype(requested: Any, what: str) -> Any:
    """``requested`` as the NumPy dtype JAX will use: ``check_x64`` first, then int64 is int32 with x64 off
    (no JAX warning: ``dtype=xgrad.long`` is everywhere in PyTorch programs)."""
    if requested is None:
        return None
    check_x64(requested, what)
    return jax.dtypes.canonicalize_dtype(np.dtype(requested))


def parameter_dtype(requested: Any) -> Any:
    """A layer's ``dtype=``: the default dtype when None (NOTE [Default dtype]), else ``resolve_dtype``'s."""
    return default_float() if requested is None else resolve_dtype(requested, "dtype=")


# NOTE [Default dtype]
# ``set_default_dtype`` chooses the dtype of floating-point values that come without one:
# Python floats given to ``xgrad.tensor``, the float factories (``zeros``, ``rand``, …),
# the legacy ``Tensor(...)`` constructor and layers' parameters. Complex values take the
# matching complex dtype. It is process-wide, as PyTorch's is.
_default_float = [np.dtype(np.float32)]
_COMPLEX_OF = {"float16": np.complex64, "bfloat16": np.complex64, "float32": np.complex64, "float64": np.complex128}


def get_default_dtype() -> Any:
    """The dtype of floating-point values created without one (NOTE [Default dtype]).

    >>> import xgrad
    >>> xgrad.get_default_dtype()
    xgrad.float32
    """
    return DTYPES[_default_float[0].name]


def default_float() -> np.dtype:
    """``get_default_dtype()`` as a NumPy dtype."""
    return _default_float[0]


def default_complex() -> np.dtype:
    return np.dtype(_COMPLEX_OF[_default_float[0].name])


def set_default_dtype(d: Any) -> None:
    """Make ``d`` (a floating dtype) the default of Python floats, float factories and layers.

    Raises ``TypeError`` for a non-floating dtype (as PyTorch) and for float64 while JAX's
    64-bit mode is off (JAX would give float32).

    >>> import xgrad
    >>> xgrad.set_default_dtype(xgrad.float16); xgrad.tensor([1.5]).dtype
    dtype('float16')
    >>> xgrad.set_default_dtype(xgrad.float32)
    """
    try:
        wanted = np.dtype(d)
    except TypeError:
        raise TypeError(f"set_default_dtype(): argument 'd' must be a dtype, not {type(d).__name__}") from None
    if not jnp.issubdtype(wanted, jnp.floating):
        raise TypeError("only floating-point types are supported as the default type")
    check_x64(wanted, "set_default_dtype")
    _default_float[0] = wanted


def finfo(type: Any = None) -> Any:  # noqa: A002  (PyTorch's argument name)
    """Machine limits of a floating dtype (the default dtype when omitted): ``eps``, ``max``, ``tiny``, …

    >>> import xgrad
    >>> float(xgrad.finfo(xgrad.float16).max)
    65504.0
    """
    return jnp.finfo(default_float() if type is None else np.dtype(type))


def iinfo(type: Any) -> Any:  # noqa: A002  (PyTorch's argument name)
    """Limits of an integer dtype: ``min``, ``max``, ``bits``.

    >>> import xgrad
    >>> xgrad.iinfo(xgrad.int8).max
    127
    """
    return jnp.iinfo(np.dtype(type))
