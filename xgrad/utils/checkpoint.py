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
import sys
import threading
import traceback
import types
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from xgrad.engine.api import backward
from xgrad.engine.function import Function
from xgrad.engine.node import current_task, sharding_of
from xgrad.engine.saved import saved_tensors_hooks, saving_op
from xgrad.generator import default_generator
from xgrad.grad_mode import enable_grad
from xgrad.step_trace import array_of
from xgrad.tensor import Tensor

__all__ = ["CheckpointError", "checkpoint", "checkpoint_sequential", "set_checkpoint_debug_enabled", "set_checkpoint_early_stop"]

ERR_REENTRANT_GRAD = (
    "When use_reentrant=True, xgrad.utils.checkpoint is incompatible with .grad() or passing an `inputs` "
    "parameter to .backward(). To resolve this error, you can either set use_reentrant=False, or call "
    ".backward() without passing the `inputs` argument."
)
ERR_NO_OUTPUT_GRAD = "none of output has requires_grad=True, this checkpoint() is not necessary"
ERR_REENTRANT_KWARGS = "Unexpected keyword arguments: {names}; only checkpoint(..., use_reentrant=False) passes keyword arguments to fn"
WARN_NO_INPUT_GRAD = "None of the inputs have requires_grad=True. Gradients will be None"
WARN_USE_REENTRANT = (
    "xgrad.utils.checkpoint: the use_reentrant parameter should be passed explicitly. use_reentrant=False is "
    "recommended, but if you need to preserve the current default behavior, you can pass use_reentrant=True. "
    "Refer to the docs for the differences between the two variants."
)
ERR_REENTRANT_OPTIONS = "Passing `context_fn` or `debug` is only supported when use_reentrant=False."
ERR_DEBUG_CONTEXT = "debug=True is incompatible with non-default context_fn"
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


def _rng_state() -> Any:
    generator = default_generator
    with generator.lock:
        return generator.get()


@contextlib.contextmanager
def _replayed_rng(state: Any) -> Iterator[None]:
    """Run the body with the default key at ``state``; restore the caller's key afterwards."""
    if state is None:
        yield
        return
    generator = default_generator
    outer = _rng_state()
    with generator.lock:
        generator.set(state)
    try:
        yield
    finally:
        with generator.lock:
            generator.set(outer)


# -- reentrant ------------------------------------------------------------------------


def _detached(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """New leaves for the tensors in ``args``, requiring grad where the originals did."""
    return tuple(Tensor(array_of(a), requires_grad=a.requires_grad) if isinstance(a, Tensor) else a for a in args)


class CheckpointFunction(Function):
    """The reentrant variant: forward without a graph, backward recomputes and runs ``backward``."""

    _traced_in_step = True  # its backward accumulates into the block's parameters: the step's state

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
    """What a saved-tensor pack hook keeps instead of the value: its position among the block's saved tensors."""

    __slots__ = ("__weakref__", "index")

    def __init__(self, index: int) -> None:
        self.index = index


def _task_key(task: Any) -> Any:
    """A weakly referenceable object that lives exactly as long as graph task ``task``.

    Every graph task (the engine's, the compiled backward's and ``xgrad.compile``'s host
    stand-in) has the lock ``queue_callback`` takes; keyed by it, a block's recomputed
    values go when their task does, and a new task is never mistaken for an old one
    that had the same ``id``. Outside any backward (a ``ctx.saved_tensors`` read
    directly) each unpack is a task of its own.
    """
    return task.mutex if task is not None else threading.Lock()


def _metadata(t: Tensor) -> dict[str, Any]:
    sharding = sharding_of(t._array)  # None under a trace (xgrad.compile): XLA places values
    return {"shape": tuple(t.shape), "dtype": t.dtype, "device": None if sharding is None else sorted(d.id for d in sharding.device_set)}


class _Settings(threading.local):
    """What ``set_checkpoint_early_stop`` / ``set_checkpoint_debug_enabled`` impose (``None``: each call decides)."""

    def __init__(self) -> None:
        self.early_stop: bool | None = None
        self.debug: bool | None = None


_settings = _Settings()


class set_checkpoint_early_stop:
    """Context manager: whether non-reentrant recomputation stops once every needed value is back.

    On by default, as in PyTorch. Off, the whole function reruns, and a recomputation
    that saves more tensors than the forward did raises. Inside it, this setting wins
    over each call's ``early_stop=`` argument, for the checkpoints made inside it (their
    backward may run after it ends).

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
        self.previous: bool | None = _settings.early_stop

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


DEBUG_EXPLANATION = (
    "You are seeing this error because you passed `debug=True` to checkpoint and the tensors saved during the "
    "original forward differ from those saved during recomputation: different operators ran in the two. "
    "Compare the two lists above, op by op, to find where they part."
)
DEBUG_TIP = (
    "\nTip: to see the ops run during the original forward and during recomputation, pass debug=True to "
    "checkpoint(...) or wrap the code in `with xgrad.utils.set_checkpoint_debug_enabled(True):`."
)


class _Frame:
    """One non-reentrant checkpoint call: what it saved, and how to recompute it."""

    def __init__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], rng_state: Any,
        determinism_check: str, debug: bool, early_stop: bool, recompute_context: Any,
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.rng_state = rng_state
        self.early_stop = _settings.early_stop if _settings.early_stop is not None else early_stop
        self.recompute_context = recompute_context
        self.check_metadata = determinism_check == "default"
        self.debug = debug
        self.forward_completed = False
        self.holders: list[weakref.ref[_Holder]] = []
        self.metadata: list[dict[str, Any]] = []
        self.forward_trace: list[str] = []
        # graph task (its key) -> holder index -> recomputed value not yet unpacked.
        self.recomputed: weakref.WeakKeyDictionary[Any, dict[int, Tensor]] = weakref.WeakKeyDictionary()

    def pack(self, t: Tensor) -> _Holder:
        holder = _Holder(len(self.holders))
        self.holders.append(weakref.ref(holder))
        self.metadata.append(_metadata(t))
        if self.debug:
            self.forward_trace.append(_op_trace_line(t))
        return holder

    def unpack(self, holder: _Holder) -> Tensor:
        key = _task_key(current_task.graph_task)
        values = self.recomputed.get(key)
        if values is None:
            values = self.recomputed[key] = {}
            self.recompute(values)
        if holder.index not in values:
            raise CheckpointError(ERR_UNPACK_TWICE)
        return values.pop(holder.index)

    def _error(self, message: str, recompute_trace: list[str]) -> CheckpointError:
        if not self.debug:
            return CheckpointError(message + DEBUG_TIP)
        forward = "\n".join(f"  {i}: {line}" for i, line in enumerate(self.forward_trace))
        recomputed = "\n".join(f"  {i}: {line}" for i, line in enumerate(recompute_trace))
        return CheckpointError(
            f"{message}\n\nSaved by the original forward:\n{forward}\n\nSaved by the recomputation:\n{recomputed}"
            f"\n\n{DEBUG_EXPLANATION}"
        )

    def recompute(self, values: dict[int, Tensor]) -> None:
        """Rerun the block, putting each saved value whose holder is alive into ``values``."""
        count = 0
        mismatches = []
        trace: list[str] = []
        n = len(self.holders)

        def inner_pack(t: Tensor) -> Tensor:
            nonlocal count
            i = count
            count += 1
            if self.debug:
                trace.append(_op_trace_line(t))
            # Detached, as PyTorch keeps it: packing ``t`` itself would make each node of
            # the recomputed graph hold itself (node -> saved ``t`` -> ``t.grad_fn``), a cycle
            # only the garbage collector frees. A tensor that needs no graph stays the very
            # object the block saved (a Function's ``ctx.saved_tensors`` keeps identity).
            detached = Tensor(array_of(t)) if t.requires_grad else t
            if i >= n:
                if not self.forward_completed:
                    return detached  # recomputed while the forward is still running: it saved no more yet
                raise self._error(ERR_MORE_SAVED.format(n=n), trace)
            if self.check_metadata:
                meta = _metadata(t)
                if meta != self.metadata[i]:
                    mismatches.append(f"tensor at position {i}:\nsaved metadata: {self.metadata[i]}\nrecomputed metadata: {meta}")
            if self.holders[i]() is not None:  # a holder that is gone belongs to a node already freed
                values[i] = detached
            if self.early_stop and count == n:
                raise _StopRecomputation
            return detached

        def inner_unpack(t: Tensor) -> Tensor:
            return t  # a value saved by the rerun function itself (it called grad, or nests a checkpoint)

        stopped = False
        try:
            with _replayed_rng(self.rng_state), enable_grad(), self.recompute_context, \
                    saved_tensors_hooks(inner_pack, inner_unpack):
                self.fn(*self.args, **self.kwargs)
        except _StopRecomputation as stop:
            stopped = True
            # Raised inside a backward the block runs itself (it calls grad), the signal is
            # also that task's stored error, and its traceback holds the task's frames: a
            # cycle that would keep the recomputed graph alive until a garbage collection.
            stop.__traceback__ = None
        if mismatches:
            raise self._error(ERR_METADATA.format(details="\n".join(mismatches)), trace)
        if not stopped and count < n and self.forward_completed:
            raise self._error(ERR_FEWER_SAVED.format(forward=n, recomputed=count), trace)


# -- entry point ----------------------------------------------------------------------


def _no_context() -> tuple[contextlib.nullcontext[None], contextlib.nullcontext[None]]:
    return contextlib.nullcontext(), contextlib.nullcontext()


def checkpoint(
    function: Callable[..., Any],
    *args: Any,
    use_reentrant: bool | None = None,
    context_fn: Callable[[], tuple[Any, Any]] = _no_context,
    preserve_rng_state: bool = True,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
    **kwargs: Any,
) -> Any:
    """Run ``function(*args)`` without keeping its intermediate values; backward recomputes them.

    Args:
        function: the block to checkpoint; it must do the same work when rerun.
        args: its arguments (tensors and anything else).
        use_reentrant: recompute inside a custom Function's backward (``True``,
            ``backward`` only) or through saved-tensor hooks (``False``: also
            ``autograd.grad``, ``inputs=``, double backward, nesting, and a function
            that calls ``autograd.grad`` itself). Pass it: leaving it out warns, as in
            PyTorch, and means ``True``.
        context_fn: returns two context managers, the forward runs inside the first and
            the recomputation inside the second (``use_reentrant=False`` only).
        preserve_rng_state: replay the default random key (``dropout(key=None)``,
            ``rand``/``randn``) so the recomputation draws the same values.
        determinism_check: ``"default"`` compares each recomputed saved tensor's shape,
            dtype and device with the original's and raises on a difference;
            ``"none"`` skips that (``use_reentrant=False`` only).
        debug: on a recomputation error, list what the original forward and the
            recomputation saved, op by op, with the lines that ran them
            (``use_reentrant=False`` only).
        early_stop: stop the recomputation once every saved value is back
            (``use_reentrant=False`` only; ``set_checkpoint_early_stop`` overrides it).
        kwargs: keyword arguments for ``function`` (``use_reentrant=False`` only).

    >>> import xgrad
    >>> from xgrad.utils import checkpoint
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> y = checkpoint(lambda t: (t.sin() * t).sum(), x, use_reentrant=False)
    >>> y.backward(); [round(v, 4) for v in x.grad.tolist()]
    [1.3818, 0.077]
    """
    if use_reentrant is None:
        warnings.warn(WARN_USE_REENTRANT, UserWarning, stacklevel=2)
        use_reentrant = True
    if determinism_check not in ("default", "none"):
        raise ValueError(f"determinism_check should be one of ['default', 'none'], but got {determinism_check}")
    rng_state = _rng_state() if preserve_rng_state else None
    if use_reentrant:
        if kwargs:
            raise ValueError(ERR_REENTRANT_KWARGS.format(names=", ".join(sorted(kwargs))))
        if context_fn is not _no_context or debug is not False:
            raise ValueError(ERR_REENTRANT_OPTIONS)
        if not any(isinstance(a, Tensor) and a.requires_grad for a in args):
            warnings.warn(WARN_NO_INPUT_GRAD, UserWarning, stacklevel=2)
        return CheckpointFunction.apply(function, rng_state, *args)
    debug_enabled = _settings.debug if _settings.debug is not None else debug
    if debug_enabled and context_fn is not _no_context:
        raise ValueError(ERR_DEBUG_CONTEXT)
    forward_context, recompute_context = context_fn()
    frame = _Frame(function, args, kwargs, rng_state, determinism_check, debug_enabled, early_stop, recompute_context)
    with forward_context, saved_tensors_hooks(frame.pack, frame.unpack):
        out = function(*args, **kwargs)
    frame.forward_completed = True
    return out


def checkpoint_sequential(
    functions: Any, segments: int, input: Any, use_reentrant: bool | None = None, preserve_rng_state: bool = True,
) -> Any:
    """Run a sequence of layers in ``segments`` chunks, checkpointing every chunk but the last.

    Args:
        functions: an ``nn.Sequential`` (its children run in order) or a list of callables.
        segments: how many chunks to cut ``functions`` into.
        input: the first layer's input.
        use_reentrant, preserve_rng_state: as in ``checkpoint``.

    >>> import xgrad
    >>> from xgrad.utils.checkpoint import checkpoint_sequential
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> y = checkpoint_sequential([xgrad.sin, xgrad.exp, xgrad.sum], 2, x, use_reentrant=False)
    >>> y.backward(); x.grad.shape
    (2,)
    """
    if use_reentrant is None:
        warnings.warn(WARN_USE_REENTRANT, UserWarning, stacklevel=2)
        use_reentrant = True
    layers = list(functions.children()) if hasattr(functions, "children") else list(functions)

    def run(start: int, end: int) -> Callable[[Any], Any]:
        def forward(x: Any) -> Any:
            for layer in layers[start : end + 1]:
                x = layer(x)
            return x

        return forward

    size = len(layers) // segments
    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(run(start, end), input, use_reentrant=use_reentrant, preserve_rng_state=preserve_rng_state)
    return run(end + 1, len(layers) - 1)(input)


class _CheckpointModule(types.ModuleType):
    """This module, callable as ``checkpoint``: ``xgrad.utils.checkpoint(fn, *args, ...)`` and
    PyTorch's ``xgrad.utils.checkpoint.checkpoint(fn, *args, ...)`` are the same call."""

    def __call__(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return checkpoint(function, *args, **kwargs)


sys.modules[__name__].__class__ = _CheckpointModule
