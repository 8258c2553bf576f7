"""``xgrad.compile``: a whole PyTorch-style training step as one cached XLA program.

# NOTE [Whole-step compile]
# ``xgrad.compile(fn)`` runs ``fn`` (forward, ``backward()``/``autograd.grad``,
# ``Optax.step()``, in-place updates) once under ``jax.make_jaxpr`` with the eager
# engine running on tensors that wrap tracers, and caches the jaxpr as one ``jax.jit``
# program per input signature. Three pieces make that the same as calling ``fn``:
#
# 1. Finding the state. While ``fn`` is traced, ``Tensor._array`` and ``Tensor._grad``
#    are swapped for recording descriptors (``_Recorder``): every tensor whose storage
#    or ``.grad`` is read or rebound is snapshotted on first touch. A concrete array
#    a traced op reads becomes a constant of the jaxpr (``ClosedJaxpr.consts``); each
#    constant that came from a tensor that outlives the trace (a parameter, a
#    ``.grad``, an optimizer-state tensor, found through closures, attributes or
#    globals alike) becomes a program input, read from that tensor at every call.
#    Constants from tensors made during the trace stay constants.
# 2. Writing back. A surviving tensor whose storage or ``.grad`` was rebound is an
#    output; after the call its new value is rebound on the same object and
#    ``_version`` moves as it did while tracing. Every touched tensor is restored from
#    its snapshot when the trace ends, so tracing has no effect of its own. What cannot
#    be written back (a ``.grad`` or an in-place result that carries autograd history
#    out of the program) is not compiled (below).
# 3. Guards. The trace took Python branches on the state it saw: whether a ``.grad``
#    was ``None`` (set or accumulate), ``requires_grad``, the hooks present, shapes
#    and dtypes. A cache entry keeps these per state tensor and a call whose state
#    differs is a miss, traced again.
#
# Hooks not marked ``compiled.pure_hook`` run through ``io_callback(ordered=True)`` at
# their point in the program, with concrete tensors, in eager order
# (``_host_hook``); pure hooks are traced inline. Hooks registered while tracing are
# taken out again when the trace ends; one that would stay on a tensor or node that
# outlives the call is not compiled (eager adds one more per call, and all run).
# A host hook runs with a stand-in for its backward's ``GraphTask`` (``_HostGraphTask``),
# so ``queue_callback`` inside it works; where the traced backward ran its final
# callbacks, one more host call runs the ones queued during this call, in queue order,
# with the state tensors showing their values at that point (``_state_on_host``: the
# ``.grad``s and the arrays the step changed so far go to the host, and what a callback
# rebinds among them flows on; an array the step left alone stays on the device, and a
# callback that changes one raises). That call sits under a ``lax.cond`` on flags the
# host hooks return (whether callbacks wait), so hooks that queue nothing cost one
# flag each. A callback queued by traced code (a pure hook, a custom
# Function's backward) is such a host call too, at its place in the traced backward's
# list (``_TracedCallbacks``: while tracing, ``GraphTask.final_callbacks`` is one).
# Python needing a concrete value
# (``.item()``, ``if t > 0``, ``.numpy()``) makes the call run eagerly after a
# one-time warning naming the user's line, or raises under ``fallback="error"``; a
# signature that fell back is remembered and runs eagerly without retracing.
#
# Shared with the compiled backward (``xgrad/engine/compiled``): ``RecompileWarning``
# and ``RECOMPILE_WARNING_LIMIT``, ``TRACER_ERRORS`` (what means "needs a concrete
# value") and ``call_site`` (the user's line). Not shared, because the concern differs:
# how hooks reach the host (the backward splits its program into segments and calls
# hooks between them; a step is one jaxpr traced by running user code, so hooks go
# through ``io_callback``), the cache (the backward's is process-wide, locked and
# keyed by graph structure; a step's is per function and keyed by its arguments) and
# so the stats and recompile reasons (call sites and nodes there, argument leaves here).
#
# NOTE [Index checks in a compiled step]
# Eager ops raise ``IndexError`` for an out-of-range index (``check_index_range`` in
# ``xgrad/ops/_util.py``); JAX would clamp a read and drop a write. While a step is
# traced, a check whose index is a tracer of this trace becomes a ``_Check``: a flag
# (any entry out of range), the first bad entry, the message, and the state writes
# as they stand at that point of ``fn`` (what eager would have done before raising:
# a ``zero_grad()`` that ran, an in-place update). The program returns the flags as
# one vector; a call reads it (one small device-to-host copy, only for programs with
# checks) and, when a flag is set, applies the writes of the first failed check
# instead of the final ones and raises the eager error. Host hooks after a failed
# check are skipped (they see whether a check failed before them), so hooks run as
# eagerly: up to the failing op. Checks under a ``jax.jit``/``vmap`` nested in ``fn``
# run at another trace level and keep JAX's behaviour, as under plain ``jax.jit``.
# Reading the flags waits for the whole program, which costs a loop that never waits on
# its steps JAX's asynchronous dispatch. So the common check, of indices the call was
# given as they are (targets, token ids), reached before any state but cleared grads
# changed and before any hook ran, is done on the host by eager's own
# ``check_index_range`` (a NumPy read on CPU) and raises with the same state eager
# leaves. A program without host calls is dispatched first and checked while it runs
# (a failed check drops its outputs: nothing was written back, no hook ran); one with
# hooks is checked before it is dispatched. Only the other checks need the flags.
"""

from __future__ import annotations

import collections
import functools
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jax.extend.core import ClosedJaxpr, get_opaque_trace_state, jaxpr_as_fun

from xgrad.engine import hooks as hooks_module
from xgrad.engine.anomaly import ANOMALY
from xgrad.engine.compiled.cache import RECOMPILE_WARNING_LIMIT, call_site
from xgrad.engine.compiled.switch import TRACER_ERRORS, RecompileWarning
from xgrad.engine.engine import GraphTask
from xgrad.engine.node import AccumulateGrad, Node, _sequence, current_task
from xgrad.grad_mode import is_grad_enabled
from xgrad.ops import _util as ops_util
from xgrad.ops._util import IndexOutOfRangeError, _first_out_of_range
from xgrad.tensor import Tensor

__all__ = ["CompileFallbackError", "CompileFallbackWarning", "CompiledFunction", "RecompileWarning", "compile"]

#: Signatures kept per compiled function (least recently used dropped first).
CACHE_SIZE = 64

_XGRAD_DIR = os.path.dirname(os.path.abspath(__file__))
_JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__))

WARN_FALLBACK = (
    "xgrad.compile ran {name} eagerly: {reason} (at {site}). The results are the same, without the speed; "
    "use fallback='error' to make this an error. (Warned once per line.)"
)
ERR_FALLBACK = "xgrad.compile cannot compile {name}: {reason} (at {site}). Use fallback='eager' to run such calls eagerly."
WARN_RECOMPILE = (
    "xgrad.compile recompiled {name} {count} times; the last change: {reason}. Keep shapes, dtypes, shardings and "
    "the state fn touches fixed between calls, or pad inputs to a few sizes."
)
HOOK_KEPT = (
    "a hook registered inside the function stays on a tensor or node that outlives the call (eager adds one more every "
    "call, and they pile up); register it once outside the function, or remove its handle inside it"
)


class CompileFallbackWarning(UserWarning):
    """A call of an ``xgrad.compile`` function ran eagerly (the warning says why and where)."""


class CompileFallbackError(RuntimeError):
    """Raised instead of running eagerly under ``xgrad.compile(fn, fallback="error")``."""


class _NotCompilable(Exception):
    def __init__(self, reason: str, site: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.site = site


# -- recording the state a trace touches ---------------------------------------------
_ARRAY = Tensor.__dict__["_array"]  # the slots' own descriptors
_GRAD = Tensor.__dict__["_grad"]
_FINAL_CALLBACKS = GraphTask.__dict__["final_callbacks"]
_trace_lock = threading.RLock()  # one trace at a time: the descriptors are per class


class _Snapshot:
    """A tensor's autograd-visible state when a trace first touched it."""

    __slots__ = (
        "array", "grad", "grad_fn", "output_nr", "ref", "requires_grad", "retains_grad", "start", "target", "version",
    )

    def __init__(self, t: Tensor) -> None:
        self.ref = weakref.ref(t)
        # Where the tensor is found at a call (``_resolve``): an argument's leaf index (a
        # new object each call), ``("grad", owner's target)``, or a weak reference.
        self.target: Any = self.ref
        self.array = _ARRAY.__get__(t, Tensor)
        self.start = self.array  # what counts as unchanged (a tracer for an argument)
        self.grad = _GRAD.__get__(t, Tensor)
        self.grad_fn = t.grad_fn
        self.output_nr = t._output_nr
        self.version = t._version
        self.requires_grad = t._requires_grad
        self.retains_grad = t._retains_grad

    def restore(self, t: Tensor) -> None:
        _ARRAY.__set__(t, self.array)
        _GRAD.__set__(t, self.grad)
        t.grad_fn = self.grad_fn
        t._output_nr = self.output_nr
        t._version = self.version
        t._requires_grad = self.requires_grad
        t._retains_grad = self.retains_grad


class _Recorder:
    """What one trace touched: snapshots, where concrete arrays came from, which ``.grad``s decided branches."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.snapshots: dict[int, _Snapshot] = {}
        self.sources: dict[int, list[Any]] = {}  # id(array) -> targets of the tensors holding it
        self.keep: list[Any] = []  # the arrays whose ids key ``sources`` stay alive
        self.grad_owner: dict[int, weakref.ref[Tensor]] = {}
        self.grad_read: set[int] = set()  # ``.grad`` read before this trace rebound it
        self.grad_written: set[int] = set()
        # Tensors made during the trace: never state, their arrays stay constants.
        # (By id: a WeakSet would compare tensors with ``==``, an op.)
        self.born: dict[int, weakref.ref[Tensor]] = {}
        self.trace: Any = None  # the step's own trace level (set once ``fn`` is called)
        self.outputs: list[Any] = []  # the program's outputs, each once (``output``)
        self.output_index: dict[int, int] = {}
        self.checks: list[_Check] = []
        # Checks of an argument's own index values, done on the host before the program runs
        # (NOTE [Index checks in a compiled step]): (leaf, size, message, negative, ignore, writes).
        self.host_checks: list[tuple[int, int, str, bool, int | None, list[Any]]] = []
        self.arg_leaves: dict[int, int] = {}  # id(an argument's tracer) -> its leaf
        self.host_calls = 0  # ordered host calls traced so far (hooks)
        # Hooks added while tracing: (their dict, handle id, the user's line, whether the owner outlives the call).
        self.added_hooks: list[tuple[Any, int, str, bool]] = []
        self.first_sequence_nr = _sequence.next()  # nodes made by the trace number above it
        self.host_tasks: dict[int, _HostGraphTask] = {}  # id(a traced GraphTask still running) -> its stand-in
        self.queued: dict[int, list[Any]] = {}  # id(a stand-in) -> traced flags: callbacks wait on it

    def output(self, value: Any) -> int:
        """The position of ``value`` among the program's outputs (added on first use)."""
        index = self.output_index.get(id(value))
        if index is None:
            index = self.output_index[id(value)] = len(self.outputs)
            self.outputs.append(value)
        return index

    def failed_so_far(self) -> Any:
        """A traced flag: whether an index check traced before this point failed (``None``: no checks yet)."""
        if not self.checks:
            return None
        return jnp.stack([check.failed for check in self.checks]).any()

    def is_born(self, t: Tensor) -> bool:
        ref = self.born.get(id(t))
        return ref is not None and ref() is t

    def touch(self, t: Tensor) -> None:
        if id(t) not in self.snapshots and not self.is_born(t):
            snap = self.snapshots[id(t)] = _Snapshot(t)
            ref = self.grad_owner.get(id(t))
            owner = ref() if ref is not None else None
            if owner is not None and _GRAD.__get__(owner, Tensor) is t:
                # A ``.grad``: at the next call it is whatever tensor its owner holds then.
                snap.target = ("grad", self.snapshots[id(owner)].target)

    def read(self, t: Tensor, array: Any) -> None:
        if self.is_born(t):
            return
        self.touch(t)
        source = self.snapshots[id(t)].target
        entries = self.sources.setdefault(id(array), [])
        if not entries:
            self.keep.append(array)
        if source not in entries:
            entries.append(source)


class _Check:
    """One index check traced into a step (NOTE [Index checks in a compiled step])."""

    __slots__ = ("failed", "first", "message", "writes")

    def __init__(self, failed: Any, first: Any, message: str, writes: list[Any]) -> None:
        self.failed = failed  # traced: any entry out of range
        self.first = first  # traced, then its output position: the first bad entry
        self.message = message
        self.writes = writes  # the state writes as they stood at the check


_active: _Recorder | None = None


def _get_array(t: Tensor) -> Any:
    value = _ARRAY.__get__(t, Tensor)
    rec = _active
    if rec is not None and rec.thread == threading.get_ident() and not isinstance(value, jax.core.Tracer):
        rec.read(t, value)
    return value


def _set_array(t: Tensor, value: Any) -> None:
    rec = _active
    if rec is not None and rec.thread == threading.get_ident():
        try:
            _ARRAY.__get__(t, Tensor)
        except AttributeError:  # the first assignment, in ``Tensor.__init__``
            rec.born[id(t)] = weakref.ref(t)
        else:
            rec.touch(t)
    _ARRAY.__set__(t, value)


def _get_grad(t: Tensor) -> Any:
    value = _GRAD.__get__(t, Tensor)
    rec = _active
    if rec is not None and rec.thread == threading.get_ident() and not rec.is_born(t):
        rec.touch(t)
        if id(t) not in rec.grad_written:
            rec.grad_read.add(id(t))
        if value is not None:
            rec.grad_owner[id(value)] = weakref.ref(t)
    return value


def _set_grad(t: Tensor, value: Any) -> None:
    rec = _active
    if rec is not None and rec.thread == threading.get_ident():
        rec.touch(t)
        rec.grad_written.add(id(t))
    _GRAD.__set__(t, value)


def _trace_check(index: Any, size: int, message: str, negative: bool, ignore: int | None) -> None:
    """``check_index_range`` on a tracer while a step is traced: a ``_Check`` of the program."""
    rec = _active
    if rec is None or rec.thread != threading.get_ident() or get_opaque_trace_state(convention="xgrad") != rec.trace:
        return  # another thread, or a JAX transformation inside ``fn``: JAX's behaviour
    if not jnp.issubdtype(index.dtype, jnp.integer):
        return
    writes = _state_writes(rec, call_site())
    leaf = rec.arg_leaves.get(id(index))
    if (
        leaf is not None
        and not rec.checks
        and not rec.host_calls
        and all(what == "requires_grad" or (what == "grad" and value is None) for _, what, value, _ in writes)
    ):
        rec.host_checks.append((leaf, size, message, negative, ignore, writes))
        return
    failed, first = _first_out_of_range(index, size, negative=negative, ignore=ignore)
    rec.checks.append(_Check(failed, first, message, writes))


def _trace_added(hooks: Any, handle: Any) -> None:
    """A hook was registered while a step is traced: note it, and whether its owner outlives the call."""
    rec = _active
    if rec is None or rec.thread != threading.get_ident():
        return
    owner = sys._getframe(2).f_locals.get("self")  # the ``register_*`` method's tensor or node
    if isinstance(owner, AccumulateGrad):
        owner = owner.variable
    if isinstance(owner, Tensor):
        outlives = not rec.is_born(owner)
    else:
        outlives = isinstance(owner, Node) and owner.sequence_nr < rec.first_sequence_nr
    rec.added_hooks.append((weakref.ref(hooks), handle.id, call_site(), outlives))


def tracing() -> bool:
    """Whether this thread is tracing an ``xgrad.compile`` function."""
    rec = _active
    return rec is not None and rec.thread == threading.get_ident()


class _Recording:
    """Install the recording descriptors and the host-hook wrapper for one trace."""

    def __init__(self, recorder: _Recorder) -> None:
        self.recorder = recorder

    def __enter__(self) -> _Recorder:
        global _active
        _trace_lock.acquire()
        self.outer = _active
        _active = self.recorder
        setattr(Tensor, "_array", property(_get_array, _set_array))  # noqa: B010 (a slot: mypy would object)
        setattr(Tensor, "_grad", property(_get_grad, _set_grad))  # noqa: B010
        setattr(GraphTask, "final_callbacks", property(_FINAL_CALLBACKS.__get__, _set_final_callbacks))  # noqa: B010
        self.outer_wrap = hooks_module.trace_wrapper
        hooks_module.trace_wrapper = _host_hook
        self.outer_check = ops_util.traced_check
        ops_util.traced_check = _trace_check
        self.outer_added = hooks_module.trace_added
        hooks_module.trace_added = _trace_added
        return self.recorder

    def __exit__(self, *exc: object) -> None:
        global _active
        hooks_module.trace_wrapper = self.outer_wrap
        ops_util.traced_check = self.outer_check
        hooks_module.trace_added = self.outer_added
        if self.outer is None:
            setattr(Tensor, "_array", _ARRAY)  # noqa: B010
            setattr(Tensor, "_grad", _GRAD)  # noqa: B010
            setattr(GraphTask, "final_callbacks", _FINAL_CALLBACKS)  # noqa: B010
        _active = self.outer
        _trace_lock.release()


# -- hooks as host callbacks ----------------------------------------------------------
def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def _struct(array: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(array.shape, array.dtype)


def _host_hook(fn: Any, hooks: Any) -> Any:
    """``fn`` as called inside a traced step: through an ordered host callback, unless it is pure."""
    from xgrad.autograd.compiled import PureHook

    if isinstance(fn, tuple):  # a tensor hook: (input_nr, hook)
        return (fn[0], _host_hook(fn[1], hooks))
    if isinstance(fn, PureHook) or not tracing():
        return fn

    def call(*args: Any) -> Any:
        graph_task = _host_graph_task()
        if len(args) == 1 and isinstance(args[0], Tensor) and args[0]._post_accumulate_grad_hooks is hooks:
            return _post_accumulate_on_host(fn, args[0], graph_task)
        return _replacing_hook_on_host(fn, args, graph_task)

    return call


def _replacing_hook_on_host(fn: Any, args: tuple[Any, ...], graph_task: Any) -> Any:
    """A hook whose non-``None`` result replaces its first argument (tensor, pre and post hooks)."""
    leaves, tree = jax.tree_util.tree_flatten(args, is_leaf=_is_tensor)
    first_leaves, first_tree = jax.tree_util.tree_flatten(args[0], is_leaf=_is_tensor)
    first_tree_any: Any = first_tree
    arrays = [leaf._array for leaf in leaves]
    n_first = len(first_leaves)

    def host(*concrete: Any) -> Any:
        call_args = jax.tree_util.tree_unflatten(tree, [Tensor(jnp.asarray(c)) for c in concrete])
        result = _in_backward(graph_task, fn, *call_args)
        if result is None:
            return tuple(np.asarray(c) for c in concrete[:n_first])
        if isinstance(result, list):
            result = tuple(result)
        r_leaves, r_tree = jax.tree_util.tree_flatten(result, is_leaf=_is_tensor)
        if r_tree != first_tree_any or not all(isinstance(r, Tensor) for r in r_leaves):
            raise RuntimeError(
                f"under xgrad.compile, hook {fn!r} returned a value shaped {r_tree}, but it replaces {first_tree}"
            )
        return tuple(np.asarray(r._array, dtype=a.dtype) for r, a in zip(r_leaves, first_leaves, strict=True))

    def unchanged(*concrete: Any) -> Any:
        return tuple(np.asarray(c) for c in concrete[:n_first])

    if n_first == 0:
        _ordered_host_call(lambda *c: host(*c) and None, lambda *c: None, None, arrays, graph_task)
        return None
    out = _ordered_host_call(host, unchanged, tuple(_struct(a) for a in arrays[:n_first]), arrays, graph_task)
    replaced = jax.tree_util.tree_unflatten(first_tree, [Tensor(o) for o in out])
    return replaced


def _post_accumulate_on_host(fn: Any, var: Tensor, graph_task: Any) -> None:
    """A post-accumulate-grad hook: run on the real leaf with concrete values; what it rebinds flows on."""
    _state_on_host(lambda: _in_backward(graph_task, fn, var), [var], reports=graph_task)


def _state_on_host(
    call: Callable[[], Any], tensors: list[Tensor], only_changed: bool = False, reports: Any = None, when: Any = None
) -> None:
    """Run ``call()`` on the host at this point of the program, ``tensors`` showing their values and ``.grad``s then.

    The real tensors hold these concrete values while ``call`` runs; what it rebinds
    (an array or a ``.grad``) flows on in the program. With ``only_changed``, an array
    the step has not rebound so far stays on the device: the real tensor holds that
    value already, and ``call`` must leave it alone. ``reports``: as for
    ``_ordered_host_call``; ``when``: a traced flag, the call is made only if it is set.
    """
    rec = _active
    assert rec is not None
    slots = []  # (tensor, whether its array goes to the host, whether it has a .grad)
    arrays = []
    for t in tensors:
        array, grad = _ARRAY.__get__(t, Tensor), _GRAD.__get__(t, Tensor)
        snap = rec.snapshots.get(id(t))
        sent = not only_changed or snap is None or array is not snap.start
        slots.append((t, sent, grad is not None))
        if sent:
            arrays.append(array)
        if grad is not None:
            arrays.append(grad._array)

    def host(*concrete: Any) -> Any:
        saved = [(_ARRAY.__get__(t, Tensor), _GRAD.__get__(t, Tensor), t._version) for t, _, _ in slots]
        values = iter(concrete)
        for t, sent, has_grad in slots:
            if sent:
                _ARRAY.__set__(t, jnp.asarray(next(values)))
            _GRAD.__set__(t, Tensor(jnp.asarray(next(values))) if has_grad else None)
        try:
            call()
            new = []
            for (t, sent, has_grad), (before, _, _) in zip(slots, saved, strict=True):
                array, grad = _ARRAY.__get__(t, Tensor), _GRAD.__get__(t, Tensor)
                if sent:
                    new.append(array)
                elif array is not before:
                    raise RuntimeError(
                        f"under xgrad.compile a final callback cannot change a tensor (shape {list(array.shape)}) "
                        "that the step had not changed before it; change it in the step, or run this step eagerly"
                    )
                if (grad is not None) != has_grad:
                    raise RuntimeError(
                        "under xgrad.compile a hook or final callback cannot set a .grad to None or set one that was "
                        "None; zero it instead, or run this step eagerly"
                    )
                if grad is not None:
                    new.append(grad._array)
        finally:
            for (t, _, _), (array, grad, version) in zip(slots, saved, strict=True):
                _ARRAY.__set__(t, array)
                _GRAD.__set__(t, grad)
                t._version = version
        return tuple(np.asarray(n, dtype=c.dtype) for n, c in zip(new, concrete, strict=True))

    def on_host(arrays: Any) -> Any:
        return _ordered_host_call(host, lambda *c: tuple(np.asarray(a) for a in c), tuple(_struct(a) for a in arrays), arrays, reports)

    outs = iter(on_host(arrays) if when is None else jax.lax.cond(when, on_host, tuple, arrays))
    for t, sent, has_grad in slots:
        if sent:
            t._array = next(outs)
        if has_grad:
            t._grad = Tensor(next(outs))


class _HostGraphTask:
    """Stands in on the host for a traced backward's ``GraphTask``: what its hooks queue waits here."""

    __slots__ = ("final_callbacks", "mutex")

    def __init__(self) -> None:
        self.final_callbacks: list[Callable[[], None]] = []
        self.mutex = threading.Lock()  # ``queue_callback`` takes it


def _host_graph_task() -> _HostGraphTask | None:
    """While tracing a backward: its host stand-in, whose callbacks run, on the host, when it ends."""
    graph_task = current_task.graph_task
    rec = _active
    if graph_task is None or rec is None:
        return None
    key = id(graph_task)
    stand_in = rec.host_tasks.get(key)
    if stand_in is None:
        stand_in = rec.host_tasks[key] = _HostGraphTask()

        def at_the_end() -> None:  # queued now, it runs where the traced backward runs its final callbacks
            del rec.host_tasks[key]  # the task is done: its id may come again
            _final_callbacks_on_host(stand_in)

        with graph_task.mutex:
            list.append(graph_task.final_callbacks, at_the_end)  # itself not a host call: not wrapped
    return stand_in


def _in_backward(graph_task: _HostGraphTask | None, fn: Any, *args: Any) -> Any:
    """Call a hook on the host as the engine would: ``queue_callback`` inside it queues on ``graph_task``."""
    previous = current_task.graph_task
    current_task.graph_task = graph_task
    try:
        return fn(*args)
    finally:
        current_task.graph_task = previous


class _TracedCallbacks(list):  # type: ignore[type-arg]
    """A traced backward's final callbacks: one queued while tracing runs on the host, once per call, in its place."""

    def append(self, callback: Callable[[], None]) -> None:
        def on_host() -> None:
            graph_task = _HostGraphTask()
            graph_task.final_callbacks.append(callback)
            _run_final_callbacks(graph_task)

        super().append(lambda: _state_on_host(on_host, _state_owners(), only_changed=True))


def _set_final_callbacks(graph_task: GraphTask, value: list[Callable[[], None]]) -> None:
    rec = _active
    if rec is not None and rec.thread == threading.get_ident():
        value = _TracedCallbacks(value)
    _FINAL_CALLBACKS.__set__(graph_task, value)


def _state_owners() -> list[Tensor]:
    """While tracing: the state tensors touched so far (a ``.grad`` comes with its owner)."""
    rec = _active
    assert rec is not None
    owners = []
    for snap in rec.snapshots.values():
        t = snap.ref()
        if t is not None and type(snap.target) is not tuple:
            owners.append(t)
    return owners


def _final_callbacks_on_host(graph_task: _HostGraphTask) -> None:
    """At the end of a traced backward: a host call that runs the callbacks its hooks queued during this call.

    They see the state's values at that point (``_state_on_host``), as eager's do. The
    call is made only when a hook did queue one: each reports it (``_ordered_host_call``).
    """
    rec = _active
    assert rec is not None
    queued = rec.queued.pop(id(graph_task), None)
    if queued:
        when = jnp.stack(queued).any()
        _state_on_host(lambda: _run_final_callbacks(graph_task), _state_owners(), only_changed=True, when=when)


def _run_final_callbacks(graph_task: _HostGraphTask) -> None:
    """On the host: run and clear ``graph_task``'s callbacks, as ``GraphTask.exec_post_processing`` does."""
    callbacks = graph_task.final_callbacks
    try:
        i = 0
        while i < len(callbacks):  # callbacks may queue more: index, do not iterate
            _in_backward(graph_task, callbacks[i])
            i += 1
    finally:
        callbacks.clear()


def _ordered_host_call(
    host: Callable[..., Any], unchanged: Callable[..., Any], result_shapes: Any, arrays: Any, reports: Any = None
) -> Any:
    """``host(*arrays)`` on concrete values at this point of the program, in program order.

    Once an index check traced before this point failed, the call is ``unchanged(*arrays)``
    instead: eager would have raised before reaching it (NOTE [Index checks in a compiled step]).
    With ``reports`` (a ``_HostGraphTask``), the call also returns whether callbacks wait on
    it, a flag the end of the backward reads (``_final_callbacks_on_host``).
    """
    rec = _active
    assert rec is not None
    rec.host_calls += 1
    failed = rec.failed_so_far()
    shapes = result_shapes
    if reports is not None:
        host, unchanged = _reporting(host, reports), _reporting(unchanged, None)
        shapes = (*(result_shapes or ()), jax.ShapeDtypeStruct((), np.bool_))
    if failed is None:
        outs = io_callback(host, shapes, *arrays, ordered=True)
    else:

        def guarded(failed: Any, *concrete: Any) -> Any:
            return unchanged(*concrete) if failed else host(*concrete)

        outs = io_callback(guarded, shapes, failed, *arrays, ordered=True)
    if reports is None:
        return outs
    rec.queued.setdefault(id(reports), []).append(outs[-1])
    return None if result_shapes is None else tuple(outs[:-1])


def _reporting(fn: Callable[..., Any], graph_task: _HostGraphTask | None) -> Callable[..., Any]:
    """``fn``'s results, and whether ``graph_task`` has callbacks waiting (never, for ``None``)."""

    def call(*concrete: Any) -> Any:
        return (*(fn(*concrete) or ()), np.bool_(graph_task is not None and bool(graph_task.final_callbacks)))

    return call


# -- the compiled function ------------------------------------------------------------
def _user_site(tb: Any) -> str:
    """The innermost frame of a traceback outside xgrad and JAX: the user's line."""
    frames = []
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    for filename, lineno in reversed(frames):
        path = os.path.abspath(filename)
        if not path.startswith((_XGRAD_DIR, _JAX_DIR)) and "/jax/" not in path and "/jaxlib/" not in path:
            return f"{filename}:{lineno}"
    return "unknown location"


def _leaf_key(leaf: Any) -> Any:
    if isinstance(leaf, Tensor):
        a = _ARRAY.__get__(leaf, Tensor)
        return ("tensor", a.shape, a.dtype, getattr(a, "sharding", None), *_guard(leaf, True)[2:])
    if isinstance(leaf, jax.Array):
        return ("array", leaf.shape, leaf.dtype, leaf.sharding, leaf.weak_type)
    if isinstance(leaf, np.ndarray):
        return ("ndarray", leaf.shape, leaf.dtype)
    return ("static", type(leaf), leaf)


def _guard(t: Tensor, grad_read: bool) -> tuple[Any, ...]:
    """What a trace's Python decided on about a state tensor (NOTE [Whole-step compile], 3)."""
    a = _ARRAY.__get__(t, Tensor)
    g = _GRAD.__get__(t, Tensor)
    return (
        a.shape, a.dtype, t.grad_fn, t._requires_grad, g is None if grad_read else None,
        None if g is None or not grad_read else g._array.shape,
        tuple(t._backward_hooks or ()), tuple(t._post_accumulate_grad_hooks or ()),
    )


class _Entry:
    """One compiled signature: the program, where its inputs come from, where its outputs go."""

    __slots__ = (
        "aliased", "arg_tensor_slots", "checks", "consts", "flags", "guards", "has_host_calls", "host_checks", "inputs", "jitted",
        "n_dyn_args", "result_template", "result_tree", "writes",
    )
    aliased: list[list[Any]]
    arg_tensor_slots: tuple[int, ...]
    checks: tuple[tuple[str, int, list[Any]], ...]  # message, first bad entry's output, writes at the check
    consts: list[tuple[str, Any]]
    guards: list[tuple[Any, bool, tuple[Any, ...]]]
    host_checks: tuple[tuple[int, int, str, bool, int | None, list[Any]], ...]  # an argument's indices, checked first
    has_host_calls: bool  # hooks or callbacks run from inside the program
    inputs: list[tuple[int, Any]]
    flags: int | None  # the output holding the checks' flags (NOTE [Index checks in a compiled step])
    jitted: Any
    n_dyn_args: int
    result_template: list[tuple[str, Any, Any]]
    result_tree: Any
    writes: list[tuple[Any, str, Any, int]]


_FALLBACK = object()


def _describe_change(old: Any, new: Any) -> str:
    if old is None:
        return "first call"
    (old_tree, old_leaves, old_alias, old_mode), (new_tree, new_leaves, new_alias, new_mode) = old, new
    if old_tree != new_tree:
        return f"the arguments' structure changed from {old_tree} to {new_tree}"
    for i, (a, b) in enumerate(zip(old_leaves, new_leaves, strict=True)):
        if a != b:
            return f"argument leaf {i} changed from {_describe_leaf(a)} to {_describe_leaf(b)}"
    if old_alias != new_alias:
        return "which arguments are the same tensor changed"
    if old_mode != new_mode:
        return f"grad mode changed from {old_mode[0]} to {new_mode[0]}"
    return "the state fn reads (a .grad set or cleared, requires_grad, hooks, or a shape)"


def _describe_leaf(key: Any) -> str:
    if key[0] == "static":
        return f"the value {key[2]!r}"
    return f"a {key[0]} of shape {list(key[1])} and dtype {key[2]}" + (f" on {key[3]}" if len(key) > 3 else "")


class CompiledFunction:
    """``fn`` run as one cached ``jax.jit`` program per input signature (see ``xgrad.compile``)."""

    def __init__(self, fn: Callable[..., Any], fallback: str) -> None:
        if fallback not in ("eager", "error"):
            raise ValueError(f"fallback must be 'eager' or 'error', got {fallback!r}")
        self.fn = fn
        self.fallback = fallback
        self._cache: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._stats = {"compiles": 0, "hits": 0, "misses": 0, "fallbacks": 0, "compile_seconds": 0.0}
        self._warned_sites: set[str] = set()
        self._last_signature: Any = None
        self._recompile_warned = False
        functools.update_wrapper(self, fn)

    def stats(self) -> dict[str, Any]:
        """``{"compiles", "hits", "misses", "fallbacks", "compile_seconds"}`` for this function."""
        return dict(self._stats)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if tracing() or ANOMALY.enabled:
            # Inside another compiled function the body is part of that trace; anomaly
            # mode records forward tracebacks per op, which only an eager run has.
            if ANOMALY.enabled and not tracing():
                self._stats["fallbacks"] += 1
            return self.fn(*args, **kwargs)
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs), is_leaf=_is_tensor)
        if any(isinstance(leaf, jax.core.Tracer) or (isinstance(leaf, Tensor) and isinstance(leaf._array, jax.core.Tracer)) for leaf in leaves):
            return self.fn(*args, **kwargs)  # under a plain jax transformation: part of its trace
        alias: list[int] = []
        first: dict[int, int] = {}
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, Tensor):
                alias.append(first.setdefault(id(leaf), i))
        try:
            signature = (tree, tuple(_leaf_key(leaf) for leaf in leaves), tuple(alias), (is_grad_enabled(),))
            hash(signature)
        except TypeError:
            raise TypeError(
                "xgrad.compile: an argument that is not a Tensor or array must be hashable (it is a static part of "
                "the signature)"
            ) from None
        entry = self._cache.get(signature)
        if entry is _FALLBACK:
            self._stats["fallbacks"] += 1
            return self.fn(*args, **kwargs)
        if entry is not None and self._guards_hold(entry, leaves):
            self._cache.move_to_end(signature)
            self._stats["hits"] += 1
            return self._run(entry, leaves)
        self._stats["misses"] += 1
        self._note_miss(signature)
        try:
            entry = self._compile(leaves, tree)
        except _NotCompilable as exc:
            self._cache[signature] = _FALLBACK
            self._fall_back(exc)
            return self.fn(*args, **kwargs)
        self._cache[signature] = entry
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return self._run(entry, leaves)

    # -- hit path ----------------------------------------------------------------------
    @staticmethod
    def _guards_hold(entry: _Entry, leaves: list[Any]) -> bool:
        for ref, grad_read, expected in entry.guards:
            t = ref()
            if t is None or _guard(t, grad_read) != expected:
                return False
        for refs in entry.aliased:
            values = [_source_value(s, leaves) for s in refs]
            if any(v is not values[0] for v in values[1:]):
                return False
        return True

    def _run(self, entry: _Entry, leaves: list[Any]) -> Any:
        if entry.has_host_calls:  # its hooks must not run if a check fails: check before
            _check_on_host(entry.host_checks, leaves)
        inputs = []
        for kind, source in entry.inputs:  # one loop, no calls for the common kinds: it runs every step
            if kind == 0:
                inputs.append(source)
            elif kind == 1:
                inputs.append(source()._array)
            else:
                inputs.append(_source_value(source, leaves))
        for i in entry.arg_tensor_slots:
            leaf = leaves[i]
            inputs.append(leaf._array if isinstance(leaf, Tensor) else leaf)
        outs = entry.jitted(*inputs)
        if not entry.has_host_calls:
            # While the program runs: if a check fails its outputs are dropped, as if it never ran.
            _check_on_host(entry.host_checks, leaves)
        if entry.flags is not None:
            failed = np.asarray(outs[entry.flags])  # the one device-to-host read of a program with checks
            if failed.any():
                message, first, writes = entry.checks[int(np.argmax(failed))]
                _apply_writes(writes, outs, leaves)  # the state as eager leaves it when the op raises
                raise IndexOutOfRangeError(message.format(index=int(outs[first])))
        _apply_writes(entry.writes, outs, leaves)
        results = []
        for how, value, grad_index in entry.result_template:
            if how == "out":
                t = Tensor(outs[value])
                if grad_index is not None:
                    _GRAD.__set__(t, Tensor(outs[grad_index]))
                results.append(t)
            elif how == "array":
                results.append(outs[value])
            elif how == "same":
                results.append(_resolve(value, leaves))
            else:
                results.append(value)
        return jax.tree_util.tree_unflatten(entry.result_tree, results)

    # -- miss path ---------------------------------------------------------------------
    def _note_miss(self, signature: Any) -> None:
        previous, self._last_signature = self._last_signature, signature
        if self._stats["misses"] > RECOMPILE_WARNING_LIMIT and not self._recompile_warned:
            self._recompile_warned = True
            warnings.warn(
                WARN_RECOMPILE.format(name=self._name(), count=self._stats["misses"], reason=_describe_change(previous, signature)),
                RecompileWarning,
                stacklevel=3,
            )

    def _name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))

    def _fall_back(self, exc: _NotCompilable) -> None:
        if self.fallback == "error":
            raise CompileFallbackError(ERR_FALLBACK.format(name=self._name(), reason=exc.reason, site=exc.site)) from exc
        self._stats["fallbacks"] += 1
        if exc.site not in self._warned_sites:
            self._warned_sites.add(exc.site)
            warnings.warn(
                WARN_FALLBACK.format(name=self._name(), reason=exc.reason, site=exc.site), CompileFallbackWarning, stacklevel=3
            )

    def _compile(self, leaves: list[Any], tree: Any) -> _Entry:
        start = time.perf_counter()
        recorder = _Recorder()
        dyn_slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, (Tensor, jax.Array, np.ndarray))]
        dyn_values = [_ARRAY.__get__(leaves[i], Tensor) if isinstance(leaves[i], Tensor) else leaves[i] for i in dyn_slots]
        found: dict[str, Any] = {}
        fn = self.fn

        def traced(*tracers: Any) -> Any:
            recorder.trace = get_opaque_trace_state(convention="xgrad")
            call_leaves = list(leaves)
            for i, tracer in zip(dyn_slots, tracers, strict=True):
                recorder.arg_leaves[id(tracer)] = i
                leaf = leaves[i]
                if isinstance(leaf, Tensor):
                    snap = recorder.snapshots.get(id(leaf))
                    if snap is None:
                        recorder.touch(leaf)
                        snap = recorder.snapshots[id(leaf)]
                        snap.start = tracer
                        snap.target = i
                        _ARRAY.__set__(leaf, tracer)
                else:
                    call_leaves[i] = tracer
            call_args, call_kwargs = jax.tree_util.tree_unflatten(tree, call_leaves)
            return _collect(recorder, fn(*call_args, **call_kwargs), found)

        for i in dyn_slots:
            leaf = leaves[i]
            if isinstance(leaf, Tensor) and leaf.grad_fn is not None:
                raise _NotCompilable(
                    f"argument leaf {i} has autograd history from outside the function (detach it, or compute it inside)",
                    "the call",
                )
        with _Recording(recorder):
            try:
                closed = jax.make_jaxpr(traced)(*dyn_values)
            except TRACER_ERRORS as exc:
                raise _NotCompilable(
                    "Python needs a concrete value here (.item(), .numpy(), bool() or int() of a tensor, a boolean mask)",
                    _user_site(exc.__traceback__),
                ) from exc
            finally:
                for snap in recorder.snapshots.values():
                    t = snap.ref()
                    if t is not None:
                        snap.restore(t)
                kept = _remove_added_hooks(recorder)
            if kept is not None:
                raise _NotCompilable(HOOK_KEPT, kept)
        entry = _Entry()
        entry.arg_tensor_slots = tuple(dyn_slots)
        entry.n_dyn_args = len(dyn_slots)
        (entry.writes, entry.result_template, entry.result_tree, guard_refs, entry.checks, entry.flags,
         entry.host_checks) = found["layout"]
        entry.guards = [(ref, grad_read, _guard(ref(), grad_read)) for ref, grad_read in guard_refs if ref() is not None]
        consts: list[tuple[str, Any]] = []
        for c in closed.consts:
            live = [s for s in recorder.sources.get(id(c), ()) if _resolve(s, leaves) is not None]
            consts.append(("state", live) if live else ("const", c))
        entry.consts = consts
        entry.aliased = [refs for kind, refs in consts if kind != "const" and len(refs) > 1]
        entry.inputs = [
            (0, refs) if kind == "const" else (1, refs[0]) if type(refs[0]) is weakref.ref else (2, refs[0]) for kind, refs in consts
        ]
        jaxpr = closed.jaxpr
        program = jaxpr_as_fun(ClosedJaxpr(jaxpr.replace(constvars=[], invars=[*jaxpr.constvars, *jaxpr.invars]), []))
        entry.jitted = jax.jit(program)
        entry.has_host_calls = bool(closed.effects)
        entry.jitted.lower(*[refs if kind == "const" else _source_value(refs[0], leaves) for kind, refs in consts], *dyn_values).compile()
        self._stats["compiles"] += 1
        self._stats["compile_seconds"] += time.perf_counter() - start
        return entry


def _check_on_host(host_checks: Any, leaves: list[Any]) -> None:
    """Eager's range checks of argument indices (NOTE [Index checks in a compiled step]); raise as eager would."""
    for leaf, size, message, negative, ignore, writes in host_checks:
        try:
            ops_util.check_index_range(leaves[leaf], size, message, negative, ignore)
        except IndexOutOfRangeError:
            _apply_writes(writes, (), leaves)  # the state as eager leaves it when the op raises
            raise


def _remove_added_hooks(recorder: _Recorder) -> str | None:
    """Take out the hooks the trace registered (a call's own effects are the program's).

    Returns the line that registered one that stayed on a tensor or node outliving the
    call: eager adds one more such hook every call, which one program cannot do.
    """
    kept = None
    for hooks_ref, handle_id, site, outlives in recorder.added_hooks:
        hooks = hooks_ref()
        if hooks is not None and hooks.pop(handle_id, None) is not None and outlives and kept is None:
            kept = site
    return kept


def _resolve(target: Any, leaves: list[Any]) -> Any:
    """The tensor a target names at this call (``_Snapshot.target``), ``None`` if it is gone."""
    if type(target) is int:
        return leaves[target]
    if type(target) is tuple:
        owner = _resolve(target[1], leaves)
        return None if owner is None else _GRAD.__get__(owner, Tensor)
    return target()


def _source_value(target: Any, leaves: list[Any]) -> Any:
    t = _resolve(target, leaves)
    if t is None:
        raise RuntimeError("xgrad.compile: a tensor the program reads was freed (internal error: please report it)")
    return _ARRAY.__get__(t, Tensor)


def _collect(recorder: _Recorder, result: Any, found: dict[str, Any]) -> list[Any]:
    """Inside the trace, after ``fn``: the program's outputs and where each goes (NOTE [Whole-step compile], 2)."""
    leaves, result_tree = jax.tree_util.tree_flatten(result, is_leaf=_is_tensor)
    returned = [weakref.ref(leaf) if isinstance(leaf, Tensor) else None for leaf in leaves]
    returned_values = [_returned_value(leaf) for leaf in leaves]
    del result, leaves
    writes = _state_writes(recorder, "the end of the compiled function")
    guards: list[Any] = []
    for key, snap in recorder.snapshots.items():
        # Arguments are keyed by the signature, grads by their owner.
        if snap.ref() is not None and type(snap.target) is weakref.ref:
            guards.append((snap.ref, key in recorder.grad_read))
    template: list[Any] = []
    for ref, value in zip(returned, returned_values, strict=True):
        t = ref() if ref is not None else None
        if t is not None and id(t) in recorder.snapshots:
            template.append(("same", recorder.snapshots[id(t)].target, None))
        elif ref is not None:
            array, grad = value
            template.append(("out", recorder.output(array), None if grad is None else recorder.output(grad)))
        elif isinstance(value, (jax.Array, jax.core.Tracer)):
            template.append(("array", recorder.output(value), None))
        else:
            template.append(("static", value, None))
    checks = tuple((c.message, recorder.output(c.first), c.writes) for c in recorder.checks)
    flags = recorder.output(jnp.stack([c.failed for c in recorder.checks])) if checks else None
    found["layout"] = (writes, template, result_tree, guards, checks, flags, tuple(recorder.host_checks))
    return recorder.outputs


def _state_writes(recorder: _Recorder, site: str) -> list[Any]:
    """How the state tensors differ from their snapshots now: what a call writes back (NOTE [Whole-step compile], 2).

    Each write is ``(target, what, value, version_delta)``; ``value`` is an output
    position (``None`` for a ``.grad`` set to ``None``), or the new ``requires_grad``.
    """
    writes: list[Any] = []
    for key, snap in recorder.snapshots.items():
        t = snap.ref()
        if t is None:
            continue
        array = _ARRAY.__get__(t, Tensor)
        grad = _GRAD.__get__(t, Tensor)
        if t.grad_fn is not snap.grad_fn:
            raise _NotCompilable(
                f"an in-place op gave a tensor from outside the function (shape {list(array.shape)}) autograd history, "
                "which cannot leave the program", site,
            )
        if array is not snap.start:
            writes.append((snap.target, "array", recorder.output(array), t._version - snap.version))
        # A ``.grad`` set to ``None`` is written even if it was ``None`` when traced: unless
        # the trace read it, a call may find it set (``zero_grad()`` before a step's first backward).
        if grad is not snap.grad or (grad is None and key in recorder.grad_written):
            if grad is not None and grad.grad_fn is not None:
                raise _NotCompilable(
                    "a .grad with autograd history (backward(create_graph=True)) cannot leave the program; use "
                    "autograd.grad(..., create_graph=True) inside the function instead", site,
                )
            writes.append((snap.target, "grad", None if grad is None else recorder.output(_ARRAY.__get__(grad, Tensor)), 0))
        if t._requires_grad != snap.requires_grad:
            writes.append((snap.target, "requires_grad", t._requires_grad, 0))
    return writes


def _apply_writes(writes: list[Any], outs: Any, leaves: list[Any]) -> None:
    """Rebind the state a call changed, on the same tensor objects."""
    for target, what, index, version_delta in writes:
        t = target() if type(target) is weakref.ref else _resolve(target, leaves)
        if t is None:
            continue
        if what == "array":
            t._array = outs[index]
            t._version += version_delta
        elif what == "grad":
            t._grad = None if index is None else Tensor(outs[index])
        else:  # requires_grad
            t._requires_grad = index


def _returned_value(leaf: Any) -> Any:
    if not isinstance(leaf, Tensor):
        return leaf
    grad = _GRAD.__get__(leaf, Tensor)
    return _ARRAY.__get__(leaf, Tensor), None if grad is None else _ARRAY.__get__(grad, Tensor)


def compile(fn: Callable[..., Any] | None = None, *, fallback: str = "eager") -> Any:
    """Run ``fn`` — forward, ``backward()``, ``Optax.step()``, in-place updates — as one XLA program.

    Usable as ``@xgrad.compile`` or ``xgrad.compile(fn, fallback="error")``. Each input
    signature (shapes, dtypes and shardings of the Tensor and array arguments; other
    arguments are static and must be hashable) is traced once into a cached
    ``jax.jit`` program (NOTE [Whole-step compile] in ``xgrad/compile_step.py``).

    Calling it has the effects calling ``fn`` has: the same return values (returned
    Tensors come back without autograd history: the graph stays in the program),
    ``.grad`` on leaves (accumulated when not zeroed), and parameters and optimizer
    state updated in place on the same Tensor objects. Tensors ``fn`` reads or
    rebinds through closures, attributes or globals are found by themselves: pass
    only the data.

    Args:
        fn: the step function.
        fallback: ``"eager"`` (default): a call that cannot be traced — Python needing
            a concrete value inside ``fn`` (``.item()``, ``if t > 0``, ``.numpy()``) —
            runs eagerly, after a one-time warning naming the line; ``"error"``: raise
            ``CompileFallbackError`` instead.

    Hooks registered on tensors or nodes (inside ``fn`` or before) run once per call
    with concrete values in eager order, through host callbacks;
    ``xgrad.autograd.compiled.pure_hook`` hooks are traced into the program. Plain
    Python side effects in ``fn``'s body (``print``, appending to a list) run when
    ``fn`` is traced, on the first call of each signature, not on every call, as
    under ``jax.jit``. ``step.stats()`` returns ``{"compiles", "hits", "misses",
    "fallbacks", "compile_seconds"}``.

    >>> import optax, xgrad
    >>> w = xgrad.tensor([1.0, -2.0], requires_grad=True)
    >>> opt = xgrad.optim.Optax([w], optax.sgd(0.1))
    >>> @xgrad.compile
    ... def step(x):
    ...     opt.zero_grad()
    ...     loss = ((w * x).sum() - 1.0) ** 2
    ...     loss.backward()
    ...     opt.step()
    ...     return loss
    >>> [round(step(xgrad.tensor([1.0, 1.0])).item(), 4) for _ in range(3)]
    [4.0, 1.44, 0.5184]
    >>> [round(g, 4) for g in w.grad.tolist()], step.stats()["compiles"], step.stats()["hits"]
    ([-1.44, -1.44], 1, 2)
    """
    if fn is None:
        return lambda f: CompiledFunction(f, fallback)
    return CompiledFunction(fn, fallback)
