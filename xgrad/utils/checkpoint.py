"""Activation checkpointing: drop a block's intermediate values and recompute them in backward.

# NOTE [Two checkpoint variants]
# ``use_reentrant=True`` runs the block under ``no_grad`` inside a custom Function
# whose backward recomputes it with grad on and calls ``backward`` on the recomputed
# graph: a reentrant backward, so it accumulates into ``.grad`` and cannot serve
# ``autograd.grad``. ``use_reentrant=False`` runs the block normally inside
# saved-tensor hooks that keep a placeholder instead of each saved value; the first
# unpack recomputes the block (under hooks that collect what it saves, in the same
# order) and hands out the recomputed values, so any backward, ``grad`` and double
# backward work. Both restore the default random key before recomputing, so dropout
# with ``key=None`` draws the same mask twice.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from xgrad import creation
from xgrad.engine.api import backward
from xgrad.engine.function import Function
from xgrad.engine.node import current_task
from xgrad.engine.saved import saved_tensors_hooks
from xgrad.grad_mode import enable_grad
from xgrad.tensor import Tensor

__all__ = ["CheckpointError", "checkpoint"]

ERR_REENTRANT_GRAD = (
    "Checkpointing is not compatible with .grad() or when an `inputs` parameter is passed to .backward(). "
    "Please use .backward() and do not pass its `inputs` argument, or use checkpoint(..., use_reentrant=False)."
)
ERR_NO_OUTPUT_GRAD = "none of output has requires_grad=True, this checkpoint() is not necessary"
ERR_REENTRANT_KWARGS = "Unexpected keyword arguments: {names}; only checkpoint(..., use_reentrant=False) passes keyword arguments to fn"
WARN_NO_INPUT_GRAD = "None of the inputs have requires_grad=True. Gradients will be None"
ERR_MORE_SAVED = (
    "xgrad.utils.checkpoint: trying to save more tensors during recomputation than during the original "
    "forward pass ({n} saved in the forward). The checkpointed function must do the same work both times."
)
ERR_FEWER_SAVED = (
    "xgrad.utils.checkpoint: A different number of tensors was saved during the original forward and "
    "recomputation.\nNumber of tensors saved during forward: {forward}\nNumber of tensors saved during "
    "recomputation: {recomputed}"
)
ERR_METADATA = (
    "xgrad.utils.checkpoint: Recomputed values for the following tensors have different metadata than during "
    "the forward pass.\n{details}"
)
ERR_UNPACK_TWICE = (
    "xgrad.utils.checkpoint: Unpack is being triggered for a tensor that was already unpacked once. If you "
    "are calling backward twice on a checkpointed graph, pass retain_graph=True to the first backward."
)
ERR_INNER_UNPACK = "xgrad.utils.checkpoint: a value saved during recomputation was unpacked; please report a bug."


class CheckpointError(RuntimeError):
    """The recomputation of a checkpointed block did not match its original forward."""


# -- random state -------------------------------------------------------------------


def _rng_state() -> tuple[int, Any]:
    key = creation._default_key
    with key.lock:
        return key.seed, key.key


@contextlib.contextmanager
def _replayed_rng(state: tuple[int, Any] | None) -> Iterator[None]:
    """Run the body with the default key at ``state``; restore the caller's key afterwards."""
    if state is None:
        yield
        return
    key = creation._default_key
    outer = _rng_state()
    with key.lock:
        key.seed, key.key = state
    try:
        yield
    finally:
        with key.lock:
            key.seed, key.key = outer


# -- reentrant ------------------------------------------------------------------------


def _detached(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """New leaves for the tensors in ``args``, requiring grad where the originals did."""
    return tuple(Tensor(a._array, requires_grad=a.requires_grad) if isinstance(a, Tensor) else a for a in args)


class CheckpointFunction(Function):
    """The reentrant variant: forward without a graph, backward recomputes and runs ``backward``."""

    @staticmethod
    def forward(ctx: Any, run_function: Callable[..., Any], rng_state: Any, *args: Any) -> Any:
        ctx.run_function = run_function
        ctx.rng_state = rng_state
        ctx.tensor_indices = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.inputs = [None if isinstance(a, Tensor) else a for a in args]
        ctx.save_for_backward(*(args[i] for i in ctx.tensor_indices))
        return run_function(*args)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        task = current_task.graph_task
        if task is not None and task.exec_info:
            raise RuntimeError(ERR_REENTRANT_GRAD)
        inputs = list(ctx.inputs)
        for i, t in zip(ctx.tensor_indices, ctx.saved_tensors, strict=True):
            inputs[i] = t
        with _replayed_rng(ctx.rng_state):
            detached = _detached(tuple(inputs))
            with enable_grad():
                outputs = ctx.run_function(*detached)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        roots, root_grads = [], []
        for out, g in zip(outputs, grads, strict=True):
            if isinstance(out, Tensor) and out.requires_grad:
                roots.append(out)
                root_grads.append(g)
        if not roots:
            raise RuntimeError(ERR_NO_OUTPUT_GRAD)
        backward(roots, root_grads)
        return (None, None, *(d.grad if isinstance(d, Tensor) else None for d in detached))


# -- non-reentrant --------------------------------------------------------------------


class _Holder:
    """What a saved-tensor pack hook keeps instead of the value: a key for the recomputed one."""

    __slots__ = ("__weakref__", "index")

    def __init__(self, index: int) -> None:
        self.index = index


def _metadata(t: Tensor) -> dict[str, Any]:
    sharding = getattr(t._array, "sharding", None)  # None under a trace (xgrad.compile): XLA places values
    return {"shape": tuple(t.shape), "dtype": t.dtype, "device": None if sharding is None else sorted(d.id for d in sharding.device_set)}


class _Frame:
    """One non-reentrant checkpoint call: what it saved, and how to recompute it."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], rng_state: Any) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.rng_state = rng_state
        self.holders: list[weakref.ref[_Holder]] = []
        self.metadata: list[dict[str, Any]] = []
        self.recomputed: weakref.WeakKeyDictionary[_Holder, Tensor] = weakref.WeakKeyDictionary()

    def pack(self, t: Tensor) -> _Holder:
        holder = _Holder(len(self.holders))
        self.holders.append(weakref.ref(holder))
        self.metadata.append(_metadata(t))
        return holder

    def unpack(self, holder: _Holder) -> Tensor:
        if holder not in self.recomputed:
            self.recompute()
        value = self.recomputed.pop(holder, None)
        if value is None:
            raise CheckpointError(ERR_UNPACK_TWICE)
        return value

    def recompute(self) -> None:
        count = 0
        mismatches = []

        def inner_pack(t: Tensor) -> None:
            nonlocal count
            i = count
            count += 1
            if i >= len(self.holders):
                raise CheckpointError(ERR_MORE_SAVED.format(n=len(self.holders)))
            meta = _metadata(t)
            if meta != self.metadata[i]:
                mismatches.append(f"tensor at position {i}:\nsaved metadata: {self.metadata[i]}\nrecomputed metadata: {meta}")
                return
            holder = self.holders[i]()
            if holder is not None:  # a holder that is gone belongs to a node already freed
                self.recomputed[holder] = Tensor(t._array)

        def inner_unpack(_: None) -> Tensor:
            raise CheckpointError(ERR_INNER_UNPACK)

        with _replayed_rng(self.rng_state), enable_grad(), saved_tensors_hooks(inner_pack, inner_unpack):
            self.fn(*self.args, **self.kwargs)
        if mismatches:
            raise CheckpointError(ERR_METADATA.format(details="\n".join(mismatches)))
        if count != len(self.holders):
            raise CheckpointError(ERR_FEWER_SAVED.format(forward=len(self.holders), recomputed=count))


# -- entry point ----------------------------------------------------------------------


def checkpoint(
    function: Callable[..., Any],
    *args: Any,
    use_reentrant: bool = True,
    preserve_rng_state: bool = True,
    **kwargs: Any,
) -> Any:
    """Run ``function(*args)`` without keeping its intermediate values; backward recomputes them.

    Args:
        function: the block to checkpoint; it must do the same work when rerun.
        args: its arguments (tensors and anything else).
        use_reentrant: recompute inside a custom Function's backward (``True``,
            ``backward`` only) or through saved-tensor hooks (``False``: also
            ``autograd.grad``, ``inputs=`` and double backward).
        preserve_rng_state: replay the default random key (``dropout(key=None)``,
            ``rand``/``randn``) so the recomputation draws the same values.
        kwargs: keyword arguments for ``function`` (``use_reentrant=False`` only).

    >>> import xgrad
    >>> from xgrad.utils import checkpoint
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> y = checkpoint(lambda t: (t.sin() * t).sum(), x, use_reentrant=False)
    >>> y.backward(); [round(v, 4) for v in x.grad.tolist()]
    [1.3818, 0.077]
    """
    rng_state = _rng_state() if preserve_rng_state else None
    if use_reentrant:
        if kwargs:
            raise ValueError(ERR_REENTRANT_KWARGS.format(names=", ".join(sorted(kwargs))))
        if not any(isinstance(a, Tensor) and a.requires_grad for a in args):
            warnings.warn(WARN_NO_INPUT_GRAD, UserWarning, stacklevel=2)
        return CheckpointFunction.apply(function, rng_state, *args)
    frame = _Frame(function, args, kwargs, rng_state)
    with saved_tensors_hooks(frame.pack, frame.unpack):
        return function(*args, **kwargs)
