"""Small helpers the op modules share: dim normalisation, argument checks and non-differentiable wrappers."""

from __future__ import annotations

import contextlib
import functools
import operator
import sys
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from xgrad import step_trace
from xgrad.engine.node import sharding_of
from xgrad.jax_internals import concrete_value
from xgrad.tensor import Tensor

__all__ = [
    "IndexOutOfRangeError", "as_array", "canonical_dim", "check_index_range", "check_int", "check_nonnegative_shape",
    "check_values", "constant_like", "inplace_or_not", "legacy_reduction", "norm_axes", "refuse_none", "traced_checks",
    "nondiff", "reduce_loss",
]


def canonical_dim(dim: Any, ndim: int) -> int:
    """PyTorch's ``maybe_wrap_dim``: ``dim`` in ``[-ndim, ndim - 1]`` as a non-negative axis.

    A 0-dim tensor accepts ``dim`` 0 and -1 (both mean its one, empty, axis: 0). For a
    dim that may point one past the end (``unsqueeze``, ``stack``), pass ``ndim + 1``.

    >>> canonical_dim(-1, 3), canonical_dim(0, 0)
    (2, 0)
    >>> canonical_dim(3, 3)
    Traceback (most recent call last):
    IndexError: Dimension out of range (expected to be in range of [-3, 2], but got 3)
    """
    if isinstance(dim, bool) or not hasattr(dim, "__index__"):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    dim = operator.index(dim)
    bound = ndim if ndim > 0 else 1
    if not -bound <= dim < bound:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-bound}, {bound - 1}], but got {dim})")
    return dim % bound if ndim > 0 else 0


def norm_axes(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """PyTorch ``dim`` (int, sequence or None) as a sorted tuple of non-negative axes.

    A dim named twice raises ``RuntimeError`` as PyTorch's reductions do.

    >>> norm_axes((-1, 0), 3), norm_axes(None, 3)
    ((0, 2), None)
    """
    if dim is None:
        return None
    dims = (dim,) if not isinstance(dim, (tuple, list)) else tuple(dim)
    axes: set[int] = set()
    for d in dims:
        axis = canonical_dim(d, ndim)
        if axis in axes:
            raise RuntimeError(f"dim {axis} appears multiple times in the list of dims")
        axes.add(axis)
    return tuple(sorted(axes))


def check_int(value: Any, op: str, arg: str, position: int) -> int:
    """``value`` as an int; anything else (a float, NaN or inf among them) raises PyTorch's argument ``TypeError``.

    >>> check_int(float("nan"), "linspace", "steps", 3)
    Traceback (most recent call last):
    TypeError: linspace(): argument 'steps' (position 3) must be int, not float
    """
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{op}(): argument '{arg}' (position {position}) must be int, not {type(value).__name__}")
    return operator.index(value)


def check_nonnegative_shape(shape: tuple[Any, ...]) -> tuple[int, ...]:
    """``shape`` as ints; a negative size raises ``RuntimeError`` as PyTorch's factories do.

    >>> check_nonnegative_shape((2, -1))
    Traceback (most recent call last):
    RuntimeError: Trying to create tensor with negative dimension -1: [2, -1]
    """
    sizes = []
    for s in shape:
        if isinstance(s, bool) or not hasattr(s, "__index__"):
            raise TypeError(f"shape must be a sequence of ints, got {list(shape)}")
        sizes.append(operator.index(s))
    for s in sizes:
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {sizes}")
    return tuple(sizes)


class IndexOutOfRangeError(IndexError, RuntimeError):
    """An integer index outside its dim: an ``IndexError`` that is also the ``RuntimeError``
    PyTorch raises from ``gather``/``scatter_add``, so either ``except`` catches it."""


@functools.partial(jax.jit, static_argnames=("negative", "ignore"))
def first_out_of_range(index: Any, size: int, negative: bool, ignore: int | None) -> Any:
    """Whether any entry lies outside ``[-size, size)`` (``[0, size)`` unless ``negative``), and the first such.

    One fused program, so the device check costs one dispatch and one host sync. Only
    reductions to scalars: on a sharded index (a batch's targets) that is two scalar
    all-reduces, where indexing at an ``argmax`` would gather the whole index.
    """
    bad = index >= size
    if jnp.issubdtype(index.dtype, jnp.signedinteger):
        bad = bad | (index < (-size if negative else 0))
    if ignore is not None:
        bad = bad & (index != ignore)
    flat_bad, flat = bad.ravel(), index.ravel()
    positions = jnp.arange(flat.size)
    first = jnp.min(jnp.where(flat_bad, positions, flat.size), initial=flat.size)
    return first < flat.size, jnp.sum(jnp.where(positions == first, flat, 0))


@functools.cache
def _cpu_only() -> bool:
    """Whether JAX runs on the CPU alone here: every array is then in host memory."""
    return jax.default_backend() == "cpu"


def check_index_range(index: Any, size: int, message: str, negative: bool = True, ignore: int | None = None) -> bool:
    """Raise ``IndexOutOfRangeError(message.format(index=i))`` if an integer ``index`` is outside ``[-size, size)``.

    With ``negative=False`` the range is ``[0, size)`` (``gather``/``scatter_add``); entries
    equal to ``ignore`` pass (``cross_entropy``'s ``ignore_index``).

    JAX clamps (reads) or drops (writes) out-of-range indices silently; PyTorch raises.
    Python ints, lists, NumPy arrays and arrays on CPU devices are checked on the host
    with NumPy; an array on an accelerator by one small jitted reduction and a host sync
    (the costs are in ``benchmarks/RESULTS.md``). Inside an ``xgrad.compile`` step the
    check becomes part of the program and the call raises the same error; under
    ``jax.vmap``/``jax.grad`` (``xgrad.func``) of concrete arrays their values are
    checked as eagerly; under ``jax.jit`` the program raises when it runs
    (NOTE [Checks under jax.jit]).

    Returns whether the entries were read on the host and every one lies in the range, so
    that none equals an ``ignore`` outside it (``cross_entropy`` then divides its mean by the
    number of targets, uncounted); ``False`` where that is not known (traced, on an
    accelerator, or some entry ignored).

    >>> check_index_range([0, -3, 2], 3, "index {index} is out of bounds")
    True
    >>> check_index_range([0, 3], 3, "index {index} is out of bounds")
    Traceback (most recent call last):
    xgrad.ops._util.IndexOutOfRangeError: index 3 is out of bounds
    """
    if isinstance(index, Tensor):
        index = index._array
    if isinstance(index, jax.core.Tracer):
        trace = step_trace.current()  # inside ``xgrad.compile``: a flag of the program
        if trace is not None and trace.check_index(index, size, message, negative, ignore):
            return False
        concrete = concrete_value(index)
        if concrete is None:
            if jnp.issubdtype(index.dtype, jnp.integer):
                failed, first = first_out_of_range(index, size, negative=negative, ignore=ignore)
                _raise_when_run(failed, first, lambda i: IndexOutOfRangeError(message.format(index=int(i))))
            return False
        index = concrete
    if isinstance(index, jax.Array):
        if index.dtype.kind not in "iu":  # (``jnp.issubdtype`` costs as much as the whole check)
            return False
        if index.is_fully_addressable and (_cpu_only() or all(getattr(d, "platform", None) == "cpu" for d in index.devices())):
            # Host memory already: NumPy reads it without a copy, far cheaper than a dispatch.
            index = np.asarray(index)
        else:
            any_bad, first = first_out_of_range(index, size, negative=negative, ignore=ignore)
            if any_bad:
                raise IndexOutOfRangeError(message.format(index=int(first)))
            return False
    array = np.asarray(index)
    if array.dtype.kind not in "iu" or not array.size:
        return False
    low = -size if negative else 0
    if array.min() >= low and array.max() < size:  # the common case, without temporaries
        return True
    bad = (array < low) | (array >= size)
    if ignore is not None:
        bad &= array != ignore
    if bad.any():
        raise IndexOutOfRangeError(message.format(index=int(array[bad].flat[0])))
    return False


def _raise_if(make_error: Callable[[Any], BaseException], failed: Any, detail: Any) -> None:
    failed = np.asarray(failed)
    if failed.any():
        # Under ``vmap`` the flag and detail carry the batch: the detail of the first failed lane.
        raise make_error(None if detail is None else np.asarray(detail)[failed].flat[0] if failed.ndim else detail)


_TRACED_CHECKS: ContextVar[bool] = ContextVar("xgrad_traced_checks", default=True)


@contextlib.contextmanager
def traced_checks(enabled: bool) -> Iterator[None]:
    """Whether checks of values traced under ``jax.jit`` become host callbacks (NOTE [Checks under jax.jit]).

    On by default. Turn them off to ``jax.export`` a function of xgrad ops (JAX cannot
    serialize host callbacks); out-of-range indices are then JAX's: clamped reads, dropped
    writes. The setting holds for what JAX traces inside the ``with`` (a ``jax.jit`` function
    traced before keeps its program).

    >>> import jax, jax.numpy as jnp, xgrad
    >>> f = jax.jit(lambda i: xgrad.tensor([1.0, 2.0])[xgrad.Tensor(i)].array)
    >>> with xgrad.utils.traced_checks(False):
    ...     exported = jax.export.export(f)(jax.ShapeDtypeStruct((1,), jnp.int32))
    """
    token = _TRACED_CHECKS.set(enabled)
    try:
        yield
    finally:
        _TRACED_CHECKS.reset(token)


def _raise_when_run(failed: Any, detail: Any, make_error: Callable[[Any], BaseException]) -> None:
    """A traced check outside an ``xgrad.compile`` step (``jax.jit``, ``make_jaxpr``): a host callback that raises.

    NOTE [Checks under jax.jit]
    The values are unknown while the program is traced, and JAX would clamp a read or
    drop a write silently: the program calls back to the host with the check's flag,
    and the callback raises the eager error, which JAX reports when the program runs
    (as its ``JaxRuntimeError``, a ``RuntimeError`` whose message holds the eager one).
    Under ``vmap``/``grad`` of concrete arrays the values are there and the check is
    eager's (``concrete_value``); in a step the check is a flag of the program. JAX
    cannot serialize host callbacks: ``traced_checks(False)`` leaves them out for
    ``jax.export``.
    """
    if not _TRACED_CHECKS.get():
        return
    if _CHECKS_AS_VALUES.get():  # a cached xgrad.func program: a checkify error, rerun eagerly if it fails
        checkify.check(jnp.logical_not(jnp.any(failed)), "a value check of an xgrad op failed")
        return
    jax.debug.callback(functools.partial(_raise_if, make_error), failed, detail)


_CHECKS_AS_VALUES: ContextVar[bool] = ContextVar("xgrad_checks_as_values", default=False)


@contextlib.contextmanager
def checks_as_values() -> Iterator[None]:
    """Traced checks of values inside the ``with`` become ``jax.experimental.checkify`` checks, not host
    callbacks: the caller traces under ``checkify.checkify`` and reads the error after the program runs
    (``xgrad.func``'s cached transforms, NOTE [Transforms cached per signature])."""
    token = _CHECKS_AS_VALUES.set(True)
    try:
        yield
    finally:
        _CHECKS_AS_VALUES.reset(token)


def check_values(failed: Callable[[Any], Any], value: Any, make_error: Callable[[], BaseException]) -> None:
    """Raise ``make_error()`` if ``failed(value)`` is true: a check of values, eager's and compiled.

    ``failed`` maps ``value``'s array (a NumPy array for values in host memory, else a
    JAX array or tracer) to one boolean: write it with operators and ``.any()``/``.all()``
    so both kinds work. Every check an op makes on values goes through here: inside an
    ``xgrad.compile`` step it becomes a flag of the program and the call raises the same
    error, with the state eager leaves (NOTE [Checks in a compiled step] in
    ``xgrad/compile_step``); under ``jax.vmap``/``jax.grad`` of concrete arrays it reads
    them, under ``jax.jit`` the program raises when it runs (NOTE [Checks under jax.jit]).

    >>> import xgrad
    >>> check_values(lambda a: (a < 0).any(), [1, 2], lambda: RuntimeError("negative"))
    >>> check_values(lambda a: (a < 0).any(), xgrad.tensor([1, -2]), lambda: RuntimeError("negative"))
    Traceback (most recent call last):
    RuntimeError: negative
    """
    array = value._array if isinstance(value, Tensor) else value
    if isinstance(array, jax.core.Tracer):
        trace = step_trace.current()
        if trace is not None and trace.at_step_level():
            trace.check(jnp.asarray(failed(array)), lambda _: make_error())
            return
        concrete = concrete_value(array)
        if concrete is None:
            _raise_when_run(jnp.asarray(failed(array)), None, lambda _: make_error())
            return
        array = concrete
    if isinstance(array, jax.Array):
        if array.is_fully_addressable and (_cpu_only() or all(getattr(d, "platform", None) == "cpu" for d in array.devices())):
            array = np.asarray(array)  # host memory already: NumPy reads it without a dispatch
    else:
        array = np.asarray(array)
    if bool(failed(array)):
        raise make_error()


def constant_like(values: Any, like: Tensor) -> Tensor:
    """Host ``values`` as a Tensor of ``like``'s dtype, where ``like`` is: on its device, or replicated
    over its mesh when it is sharded.

    A traced ``like`` (``xgrad.compile``, ``jax.jit``) has no placement of its own: XLA
    places the program's constants with the rest of it, so the values are not moved.
    """
    array = jnp.asarray(values, like.dtype)
    sharding = sharding_of(like._array)
    if sharding is None:
        return Tensor(array)
    if isinstance(sharding, jax.sharding.NamedSharding):
        return Tensor(jax.device_put(array, jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())))
    return Tensor(jax.device_put(array, like.device))


def refuse_none(value: Any, name: str, position: int) -> None:
    """PyTorch's argument parser's ``TypeError`` for ``None`` given as the Tensor ``name`` of the calling op."""
    if value is None:
        op = sys._getframe(1).f_code.co_name  # the op's own frame: its name is the op's
        raise TypeError(f"{op}(): argument '{name}' (position {position}) must be Tensor, not NoneType")


def as_array(x: Any) -> Any:
    """``x``'s array if it is a Tensor (told to a step being traced: NOTE [The step-trace seam]), else ``x``."""
    return step_trace.array_of(x) if isinstance(x, Tensor) else x


def nondiff(
    fn: Callable[..., Any], name: str, example: str, shape_rule: Callable[..., None] | None = None, *, module: str
) -> Callable[..., Tensor]:
    """Wrap an array function whose result has no gradient (comparisons, argmax, …).

    ``example`` is a doctest line (call and result) for the wrapper's docstring;
    ``shape_rule`` checks the arrays first, as a primitive's (NOTE [Shape rules]);
    ``module`` is the ``__name__`` of the module that defines the op.
    """

    def op(*args: Any, **kwargs: Any) -> Tensor:
        arrays = [as_array(a) for a in args]
        if shape_rule is not None:
            shape_rule(*arrays)
        return Tensor(fn(*arrays, **kwargs))

    op.__name__ = name
    op.__qualname__ = name
    op.__doc__ = f"``{name}`` on arrays; the result records no graph.\n\n>>> import xgrad\n{example}\n"
    # Owned by the module that defined it, so doctest finds its example.
    op.__module__ = module
    return op


def legacy_reduction(size_average: bool | None, reduce: bool | None, reduction: str) -> str:
    """``reduction``, or what PyTorch maps the deprecated ``size_average``/``reduce`` pair to, with its warning.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     legacy_reduction(False, None, "mean")
    'sum'
    >>> str(caught[0].message)
    "size_average and reduce args will be deprecated, please use reduction='sum' instead."
    """
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    mapped = "mean" if size_average and reduce else "sum" if reduce else "none"
    warnings.warn(f"size_average and reduce args will be deprecated, please use reduction='{mapped}' instead.",
                  UserWarning, stacklevel=3)
    return mapped


def reduce_loss(loss: Tensor, reduction: str) -> Tensor:
    """A loss's ``reduction`` as PyTorch's functional losses take it: ``"mean"``, ``"sum"`` or ``"none"``."""
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{reduction} is not a valid value for reduction")


def inplace_or_not(fn: Callable[..., Tensor], x: Tensor, inplace: bool, *args: Any, **kwargs: Any) -> Tensor:
    """``fn(x, ...)``; with ``inplace`` ``x`` itself takes the result's value and history, as
    xgrad's in-place methods do (``inplace=`` of PyTorch's functional activations and dropout)."""
    if not inplace:
        return fn(x, *args, **kwargs)
    x._check_inplace()
    return x._rebind(fn(x._alias(), *args, **kwargs))
