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
import threading
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from xgrad import creation
from xgrad.engine.api import backward
from xgrad.engine.function import Function
from xgrad.engine.node import current_task, sharding_of
from xgrad.engine.saved import saved_tensors_hooks, saving_op
from xgrad.grad_mode import enable_grad
from xgrad.tensor import Tensor

__all__ = ["CheckpointError", "checkpoint", "set_checkpoint_debug_enabled", "set_checkpoint_early_stop"]

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
#
# NOTE [Non-reentrant recomputation per graph task]
# As in PyTorch, what a checkpoint recomputes belongs to one graph task: the first
# unpack in a backward (or in an ``autograd.grad`` that the checkpointed function
# itself calls during its forward) reruns the function under recomputation hooks that
# collect each saved value for its holder, keyed by that task, and stop as soon as
# every holder has its value (early stop). A later backward (``retain_graph``)
# recomputes again. The recomputation hooks hand saved values back as they are, so a
# function that calls ``autograd.grad`` (or a nested checkpoint) works when rerun.


class _StopRecomputation(Exception):  # noqa: N818  (a signal, not an error)
    """Raised by the recomputation's pack hook once every holder has its value (early stop)."""


class _Holder:
    """What a saved-tensor pack hook keeps instead of the value: its slot in each task's recomputation."""

    __slots__ = ("__weakref__", "handles", "index")

    def __init__(self, index: int) -> None:
        self.index = index
        # graph task id -> True while that task's recomputed value is waiting, False once used.
        self.handles: dict[int, bool] = {}


def _metadata(t: Tensor) -> dict[str, Any]:
    sharding = sharding_of(t._array)  # None under a trace (xgrad.compile): XLA places values
    return {"shape": tuple(t.shape), "dtype": t.dtype, "device": None if sharding is None else sorted(d.id for d in sharding.device_set)}


class _Settings(threading.local):
    def __init__(self) -> None:
        self.early_stop = True
        self.debug: bool | None = None


_settings = _Settings()


class set_checkpoint_early_stop:
    """Context manager: whether non-reentrant recomputation stops once every needed value is back.

    On by default, as in PyTorch. Off, the whole function reruns, and a recomputation
    that saves more tensors than the forward did raises.

    >>> import xgrad
    >>> from xgrad.utils import checkpoint, set_checkpoint_early_stop
    >>> calls = []
    >>> def fn(t):
    ...     y = t.exp()
    ...     calls.append("after exp")  # runs again in recomputation only without early stop
    ...     return y * 1.0
    >>> x = xgrad.tensor([1.0], requires_grad=True)
    >>> with set_checkpoint_early_stop(False):
    ...     out = checkpoint(fn, x, use_reentrant=False)
    >>> out.sum().backward(); len(calls)
    2
    """

    def __init__(self, enable: bool) -> None:
        self.enable = bool(enable)
        self.previous = _settings.early_stop

    def __enter__(self) -> None:
        self.previous = _settings.early_stop
        _settings.early_stop = self.enable

    def __exit__(self, *exc: object) -> None:
        _settings.early_stop = self.previous


class set_checkpoint_debug_enabled:
    """Context manager: ``debug=True`` for every non-reentrant checkpoint made inside it (``None``: each call decides).

    >>> from xgrad.utils import set_checkpoint_debug_enabled
    >>> with set_checkpoint_debug_enabled(True):
    ...     pass
    """

    def __init__(self, enabled: bool | None) -> None:
        self.enabled = enabled
        self.previous = _settings.debug

    def __enter__(self) -> None:
        self.previous = _settings.debug
        _settings.debug = self.enabled

    def __exit__(self, *exc: object) -> None:
        _settings.debug = self.previous


_OWN_DIR = __file__.rsplit("/", 2)[0]  # the xgrad package


def _op_trace_line(t: Tensor) -> str:
    """For debug mode, inside a pack hook: the op that saved ``t`` and the line of user code that ran it."""
    where = "?"
    for frame, lineno in traceback.walk_stack(None):
        if not frame.f_code.co_filename.startswith(_OWN_DIR):
            where = f"{frame.f_code.co_filename}:{lineno} in {frame.f_code.co_name}"
            break
    return f"{saving_op()} saved {t.dtype}{list(t.shape)} ({where})"


DEBUG_TIP = (
    "\nTip: to see the ops run during the original forward and during recomputation, pass debug=True to "
    "checkpoint(...) or wrap the code in `with xgrad.utils.set_checkpoint_debug_enabled(True):`."
)


class _Frame:
    """One non-reentrant checkpoint call: what it saved, and how to recompute it."""

    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], rng_state: Any,
        determinism_check: str, debug: bool,
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.rng_state = rng_state
        self.early_stop = _settings.early_stop
        self.check_metadata = determinism_check == "default"
        self.debug = debug
        self.forward_completed = False
        self.holders: list[weakref.ref[_Holder]] = []
        self.metadata: list[dict[str, Any]] = []
        self.forward_trace: list[str] = []
        # graph task id -> holder index -> recomputed value; the tasks themselves, so an
        # id is not reused while it keys something here.
        self.recomputed: dict[int, dict[int, Tensor]] = {}
        self.tasks: dict[int, Any] = {}

    def pack(self, t: Tensor) -> _Holder:
        holder = _Holder(len(self.holders))
        self.holders.append(weakref.ref(holder))
        self.metadata.append(_metadata(t))
        if self.debug:
            self.forward_trace.append(_op_trace_line(t))
        return holder

    def unpack(self, holder: _Holder) -> Tensor:
        # Outside any backward (a Function's ctx.saved_tensors read directly) each unpack is its own task.
        task = current_task.graph_task if current_task.graph_task is not None else object()
        gid = id(task)
        if self.tasks.get(gid) is not task:
            self.tasks[gid] = task
            self.recomputed[gid] = {}
            for ref in self.holders:
                alive = ref()
                if alive is not None:
                    alive.handles.pop(gid, None)
            self.recompute(gid)
        if not holder.handles.get(gid):
            raise CheckpointError(ERR_UNPACK_TWICE)
        holder.handles[gid] = False
        return self.recomputed[gid].pop(holder.index)

    def _error(self, message: str, recompute_trace: list[str]) -> CheckpointError:
        if not self.debug:
            return CheckpointError(message + DEBUG_TIP)
        forward = "\n".join(f"  {i}: {line}" for i, line in enumerate(self.forward_trace))
        recomputed = "\n".join(f"  {i}: {line}" for i, line in enumerate(recompute_trace))
        return CheckpointError(
            f"{message}\n\nSaved by the original forward:\n{forward}\n\nSaved by the recomputation:\n{recomputed}"
        )

    def recompute(self, gid: int) -> None:
        count = 0
        mismatches = []
        values = self.recomputed[gid]
        trace: list[str] = []
        n = len(self.holders)

        def inner_pack(t: Tensor) -> Tensor:
            nonlocal count
            i = count
            count += 1
            if self.debug:
                trace.append(_op_trace_line(t))
            if i >= n:
                if not self.forward_completed:
                    return t  # recomputed while the forward is still running: it saved no more yet
                raise self._error(ERR_MORE_SAVED.format(n=n), trace)
            if self.check_metadata:
                meta = _metadata(t)
                if meta != self.metadata[i]:
                    mismatches.append(f"tensor at position {i}:\nsaved metadata: {self.metadata[i]}\nrecomputed metadata: {meta}")
            holder = self.holders[i]()
            if holder is not None:  # a holder that is gone belongs to a node already freed
                holder.handles[gid] = True
                values[i] = Tensor(t._array)
            if self.early_stop and count == n:
                raise _StopRecomputation
            return t

        def inner_unpack(t: Tensor) -> Tensor:
            return t  # a value saved by the rerun function itself (it called grad, or nests a checkpoint)

        stopped = False
        try:
            with _replayed_rng(self.rng_state), enable_grad(), saved_tensors_hooks(inner_pack, inner_unpack):
                self.fn(*self.args, **self.kwargs)
        except _StopRecomputation:
            stopped = True
        if mismatches:
            raise self._error(ERR_METADATA.format(details="\n".join(mismatches)), trace)
        if not stopped and count < n and self.forward_completed:
            raise self._error(ERR_FEWER_SAVED.format(forward=n, recomputed=count), trace)


# -- entry point ----------------------------------------------------------------------


def checkpoint(
    function: Callable[..., Any],
    *args: Any,
    use_reentrant: bool = True,
    preserve_rng_state: bool = True,
    determinism_check: str = "default",
    debug: bool = False,
    **kwargs: Any,
) -> Any:
    """Run ``function(*args)`` without keeping its intermediate values; backward recomputes them.

    Args:
        function: the block to checkpoint; it must do the same work when rerun.
        args: its arguments (tensors and anything else).
        use_reentrant: recompute inside a custom Function's backward (``True``,
            ``backward`` only) or through saved-tensor hooks (``False``: also
            ``autograd.grad``, ``inputs=``, double backward, nesting, and a function
            that calls ``autograd.grad`` itself).
        preserve_rng_state: replay the default random key (``dropout(key=None)``,
            ``rand``/``randn``) so the recomputation draws the same values.
        determinism_check: ``"default"`` compares each recomputed saved tensor's shape,
            dtype and device with the original's and raises on a difference;
            ``"none"`` skips that (``use_reentrant=False`` only).
        debug: on a recomputation error, list what the original forward and the
            recomputation saved, op by op, with the lines that ran them
            (``use_reentrant=False`` only).
        kwargs: keyword arguments for ``function`` (``use_reentrant=False`` only).

    Recomputation stops once every saved value is back (see ``set_checkpoint_early_stop``).

    >>> import xgrad
    >>> from xgrad.utils import checkpoint
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> y = checkpoint(lambda t: (t.sin() * t).sum(), x, use_reentrant=False)
    >>> y.backward(); [round(v, 4) for v in x.grad.tolist()]
    [1.3818, 0.077]
    """
    if determinism_check not in ("default", "none"):
        raise ValueError(f"determinism_check should be one of ['default', 'none'], but got {determinism_check}")
    rng_state = _rng_state() if preserve_rng_state else None
    if use_reentrant:
        if kwargs:
            raise ValueError(ERR_REENTRANT_KWARGS.format(names=", ".join(sorted(kwargs))))
        if not any(isinstance(a, Tensor) and a.requires_grad for a in args):
            warnings.warn(WARN_NO_INPUT_GRAD, UserWarning, stacklevel=2)
        return CheckpointFunction.apply(function, rng_state, *args)
    debug_enabled = _settings.debug if _settings.debug is not None else debug
    frame = _Frame(function, args, kwargs, rng_state, determinism_check, debug_enabled)
    with saved_tensors_hooks(frame.pack, frame.unpack):
        out = function(*args, **kwargs)
    frame.forward_completed = True
    return out
