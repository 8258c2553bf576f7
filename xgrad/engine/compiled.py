"""Compiled backward: a whole backward graph run as cached ``jax.jit`` programs.

# NOTE [Compiled backward]
# ``execute`` takes the same arguments as ``engine.execute`` and computes the same
# things, in four stages.
#
# 1. Prepare. ``engine.prepare`` builds the ``GraphTask`` exactly as for eager:
#    validated root grads, dependency counts, ``exec_info``. A call without
#    ``inputs`` first tries the hit path, which needs no dependency counts: it
#    validates the root grads and builds the task without them (``_hit_task``).
# 2. Walk. The structural key: one tuple per node (``_node_key``) with its kind,
#    primitive and static params, output and saved shapes/dtypes, constants, edges
#    (as indices in discovery order), hooks (pure ones by identity, others as a
#    marker), and ``exec_info``; plus the leaves' shardings and which leaves already
#    have a ``.grad``. The saved tensors are unpacked into one flat list of arrays.
#    Arrays inside params (integer index arrays) are keyed by shape and dtype and
#    become program inputs, never baked-in values; boolean masks decide output
#    shapes, so they are keyed by value. The shardings of saved arrays are left to
#    ``jax.jit``'s own dispatch cache, which keys on them anyway. Two walks build it:
#    - ``_walk_structure`` (the hit path of a call without ``inputs``; its only
#      per-node Python): one pass in discovery order, no dependency counts, no
#      schedule. Eager's schedule (a node is ready when its dependency count reaches
#      zero; ready nodes pop highest ``sequence_nr`` first) is decided by the
#      structure and the relative order of the ``sequence_nr``s, so the key adds
#      their rank order. A hookless primitive node, most of any graph, adds only a
#      fragment id computed when it was recorded (NOTE [Structure fragments]) and its
#      edges. On a miss the program stores where this walk's nodes and
#      flat values sit in schedule order (``_Program.hit_order``); a hit reorders
#      them with two C-level maps. It gives up, for the other walk, where the order
#      of unpacking is observable (an unpack hook, a failing version check, a freed
#      tensor: eager unpacks in schedule order) or where ranks do not decide the
#      schedule (equal ``sequence_nr``s, from nodes recorded on different threads).
#    - ``_walk`` (misses, calls with ``inputs``, and what the first gives up on):
#      replays the eager schedule without running anything (with ``exec_info`` only
#      nodes on a path to an input are queued), unpacking in eager's order so
#      version checks and saved-tensor hooks behave as in eager. Its key is the one
#      recompile reasons are described from.
#    A lookup hashes the key once (``_CacheKey``).
# 3. Compile (a miss). ``_Program`` turns the walked nodes into steps and each step
#    into phases (capture, pre-hooks, body, post-hooks, route). The body runs the
#    same code eager runs: ``PrimitiveNode.compute`` / ``FunctionNode.compute`` on
#    tensors wrapping tracers, ``InputBuffer`` sums in arrival order,
#    ``validate_outputs``, and eager's ``call_*_hooks`` for hooks marked pure.
#    Hooks that are not pure split the program: each maximal run of traced phases is
#    one segment, jitted on its own, and between segments the host runs eager's
#    hook functions on concrete tensors, at their point, in eager's order. Splitting
#    was chosen over ``io_callback(ordered=True)`` by measurement (benchmarks/
#    bench_compiled.py: on CPU one program with an ordered callback took 3.7x as long
#    as two programs with the hook between them, and ordered callbacks gather sharded
#    operands to one device). Each
#    segment is traced once with ``jax.make_jaxpr``; inputs no equation reads are
#    dropped (a saved value whose rule reads only its shape, say), and
#    the rest run through ``jax.jit`` of the jaxpr, donating the old ``.grad``
#    buffers when nothing else holds them.
# 4. Run (a hit). Segment by segment: gather the used inputs from the flat list, call
#    the executable, write ``.grad`` (under the accumulate lock that eager uses, so
#    concurrent backwards into shared leaves are exact), retained grads and captured
#    grads, then the leaves' post-accumulate-grad hooks; at the end the final
#    callbacks, and unless ``retain_graph`` ``release_variables`` on every node that
#    ran and holds something to free (Functions, primitives that saved a tensor).
#
# ``create_graph=True`` runs each segment as one ``from_jax`` op over the saved
# tensors, root grads and old grads: one differentiable node whose backward is
# ``jax.vjp`` of the program. Outputs that depend on no input requiring grad (from
# the jaxpr's data flow) are detached, as eager's would have no ``grad_fn``.
# Under ``xgrad.autograd.profile()`` a compiled backward is one "CompiledBackward"
# span (from after the task is built to the end of the run), marked ``cache="hit"``/``"miss"``
# with the seconds it spent tracing and compiling.
# What cannot be traced (anomaly mode, unknown node kinds, a Function
# backward or a pure hook that concretizes a tracer or runs a backward of its own)
# falls back to eager with a one-time warning, or raises under ``fallback="error"``;
# a key that failed to trace is cached as a fallback so it is not retried.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal, jaxpr_as_fun

from xgrad import profiler
from xgrad.engine import engine
from xgrad.engine.anomaly import ANOMALY
from xgrad.engine.engine import InputBuffer, call_post_hooks, call_pre_hooks, call_tensor_pre_hooks, validate_outputs
from xgrad.engine.function import FunctionCtx, FunctionNode
from xgrad.engine.node import (
    ACCUMULATE_GRAD_SEQUENCE_NR,
    AccumulateGrad,
    Edge,
    GraphRoot,
    InputMetadata,
    Node,
    _accumulate_lock,
    current_task,
    run_post_accumulate_grad_hooks,
    store_into_grad,
)
from xgrad.engine.saved import SavedTensor
from xgrad.grad_mode import _state as _grad_state
from xgrad.ops import registry
from xgrad.ops.jaxop import from_jax
from xgrad.ops.registry import REGISTRY, Aval, PrimitiveNode, incoming_grad
from xgrad.tensor import Tensor

__all__ = [
    "CompiledFallbackError", "CompiledFallbackWarning", "RecompileWarning", "enable", "execute", "is_enabled",
    "pure_hook", "reset", "set_cache_size", "set_enabled", "stats",
]

DEFAULT_CACHE_SIZE = 256
#: Misses at one call site beyond this many warn once, naming what changed in the key.
RECOMPILE_WARNING_LIMIT = 8
_XGRAD_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ERR_FALLBACK = "compiled backward cannot run this graph: {reason}. Use fallback='eager' to run such graphs eagerly."
WARN_FALLBACK = "compiled backward fell back to eager: {reason}. (Warned once per reason.)"
WARN_RECOMPILE = (
    "compiled backward recompiled {count} times at {site}; the last change: {reason}. Keep shapes, dtypes, hooks "
    "and leaves fixed between steps, or pad inputs to a few sizes."
)


class CompiledFallbackWarning(UserWarning):
    """A backward asked to run compiled ran eagerly instead (the message says why).

    >>> import warnings
    >>> from xgrad.autograd.compiled import CompiledFallbackWarning
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warnings.warn("ran eagerly", CompiledFallbackWarning)
    >>> caught[0].category.__name__, issubclass(CompiledFallbackWarning, UserWarning)
    ('CompiledFallbackWarning', True)
    """


class RecompileWarning(UserWarning):
    """One call site keeps compiling new backward programs.

    >>> from xgrad.autograd.compiled import RecompileWarning
    >>> issubclass(RecompileWarning, UserWarning)
    True
    """


class CompiledFallbackError(RuntimeError):
    """Under ``enable(fallback="error")``: the backward cannot be compiled.

    >>> from xgrad.autograd.compiled import CompiledFallbackError
    >>> try:
    ...     raise CompiledFallbackError("cannot compile")
    ... except RuntimeError as e:
    ...     print(type(e).__name__, e)
    CompiledFallbackError cannot compile
    """


class _NotTraceable(Exception):
    """Raised while walking or tracing: this graph must run eagerly (the text says why)."""

    def __init__(self, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.kind = kind


_TRACER_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.NonConcreteBooleanIndexError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.UnexpectedTracerError,
)


# -- the switch ----------------------------------------------------------------------


class _CompiledState(threading.local):
    def __init__(self) -> None:
        self.enabled = False
        self.fallback = "eager"
        self.tracing = False


_state = _CompiledState()


def is_enabled() -> bool:
    """Whether ``backward``/``grad`` run compiled on this thread by default.

    >>> import xgrad
    >>> xgrad.autograd.compiled.is_enabled()
    False
    """
    return _state.enabled


def set_enabled(enabled: bool) -> None:
    """Make ``backward``/``grad`` run compiled (``True``) or eagerly (``False``) on this thread.

    >>> import xgrad
    >>> xgrad.autograd.compiled.set_enabled(True); xgrad.autograd.compiled.is_enabled()
    True
    >>> xgrad.autograd.compiled.set_enabled(False)
    """
    _state.enabled = bool(enabled)


class enable:
    """Context manager: backwards inside it run compiled on this thread.

    Args:
        fallback: ``"eager"`` (default) runs what cannot be compiled eagerly, with a
            one-time ``CompiledFallbackWarning``; ``"error"`` raises
            ``CompiledFallbackError`` instead.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> with xgrad.autograd.compiled.enable():
    ...     (x * x).sum().backward()
    >>> x.grad.tolist()
    [2.0, 4.0]
    """

    def __init__(self, fallback: str = "eager") -> None:
        if fallback not in ("eager", "error"):
            raise ValueError(f"fallback must be 'eager' or 'error', got {fallback!r}")
        self.fallback = fallback

    def __enter__(self) -> enable:
        self.prev = (_state.enabled, _state.fallback)
        _state.enabled = True
        _state.fallback = self.fallback
        return self

    def __exit__(self, *exc: object) -> None:
        _state.enabled, _state.fallback = self.prev


class PureHook:
    """A hook marked traceable and free of side effects (see ``pure_hook``).

    >>> from xgrad.autograd.compiled import PureHook, pure_hook
    >>> def double(g):
    ...     return g * 2
    >>> isinstance(pure_hook(double), PureHook), pure_hook(double) == pure_hook(double)
    (True, True)
    """

    __slots__ = ("__wrapped__", "fn")

    def __init__(self, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise TypeError(f"pure_hook expects a callable, got {type(fn).__name__}")
        self.fn = fn
        self.__wrapped__ = fn  # inspect.signature (hook arity checks) sees the function's own

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    # Programs are keyed by the hook: wrapping the same function again must not recompile.
    def __eq__(self, other: object) -> bool:
        return type(other) is PureHook and other.fn is self.fn

    def __hash__(self) -> int:
        return hash(self.fn)

    def __repr__(self) -> str:
        return f"pure_hook({self.fn!r})"


def pure_hook(fn: Callable[..., Any]) -> PureHook:
    """Mark a hook as JAX-traceable with no side effects, so compiled backwards trace it in.

    Any hook kind can be marked. Eager backwards call it as usual; compiled ones call
    it only while tracing (once per compiled program), on traced values.

    >>> import xgrad
    >>> x = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> h = x.register_hook(xgrad.autograd.compiled.pure_hook(lambda g: g * 2))
    >>> (x * 3).sum().backward(compiled=True); x.grad.tolist()
    [6.0, 6.0]
    """
    return fn if isinstance(fn, PureHook) else PureHook(fn)


# -- cache and statistics ------------------------------------------------------------


class _Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        self.hits = 0
        self.misses = 0
        self.compiles = 0
        self.traces = 0
        self.compile_seconds = 0.0
        self.fallbacks: collections.Counter[str] = collections.Counter()
        self.recompile_reasons: collections.deque[str] = collections.deque(maxlen=16)
        self.sites: dict[str, tuple[int, Any]] = {}
        self.warned_sites: set[str] = set()

    def add(self, name: str, amount: Any = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + amount)


_stats = _Stats()
_cache: collections.OrderedDict[_CacheKey, Any] = collections.OrderedDict()
_cache_lock = threading.Lock()
_cache_size = DEFAULT_CACHE_SIZE
_warned_reasons: set[str] = set()


def stats() -> dict[str, Any]:
    """Counters of the compiled backward since the last ``reset``.

    Keys: ``hits``, ``misses``, ``compiles`` (segments compiled), ``traces`` (times
    the backward rules were traced), ``fallbacks`` (a dict: reason kind → count),
    ``compile_seconds``, ``cache_size`` and ``recompile_reasons`` (latest last).

    >>> import xgrad
    >>> xgrad.autograd.compiled.reset()
    >>> x = xgrad.tensor([1.0], requires_grad=True)
    >>> for _ in range(2):
    ...     x.grad = None  # a leaf with or without a .grad is a different structure
    ...     (x * 2).sum().backward(compiled=True)
    >>> s = xgrad.autograd.compiled.stats(); (s["misses"], s["hits"])
    (1, 1)
    """
    with _stats.lock:
        return {
            "hits": _stats.hits,
            "misses": _stats.misses,
            "compiles": _stats.compiles,
            "traces": _stats.traces,
            "fallbacks": dict(_stats.fallbacks),
            "compile_seconds": _stats.compile_seconds,
            "cache_size": len(_cache),
            "recompile_reasons": list(_stats.recompile_reasons),
        }


def reset() -> None:
    """Empty the program cache and zero the statistics (one-time warnings warn again).

    >>> import xgrad
    >>> xgrad.autograd.compiled.reset(); xgrad.autograd.compiled.stats()["cache_size"]
    0
    """
    with _cache_lock:
        _cache.clear()
        _stats.clear()
        _warned_reasons.clear()


def set_cache_size(size: int) -> None:
    """Bound the number of cached programs (least recently used go first; default 256).

    >>> import xgrad
    >>> xgrad.autograd.compiled.set_cache_size(64); xgrad.autograd.compiled.set_cache_size(256)
    """
    global _cache_size
    if int(size) < 1:
        raise ValueError(f"cache size must be at least 1, got {size}")
    with _cache_lock:
        _cache_size = int(size)
        while len(_cache) > _cache_size:
            _cache.popitem(last=False)


class _CacheKey:
    """A structural key with its hash computed once.

    Tuples do not cache their hash, and a key has a few entries per node: a lookup
    would hash it twice (``get``, ``move_to_end``) and compare it twice. Once equal to
    the cached key, this one adopts the cached tuple, so the second comparison is by
    identity.
    """

    __slots__ = ("hash", "value")

    def __init__(self, value: tuple[Any, ...]) -> None:
        self.value = value
        self.hash = hash(value)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        if type(other) is not _CacheKey or other.hash != self.hash:
            return False
        if other.value is self.value:
            return True
        if other.value != self.value:
            return False
        self.value = other.value
        return True


def _lookup(key: _CacheKey) -> Any:
    entry = _cache.get(key)
    if entry is not None:
        try:
            _cache.move_to_end(key)
        except KeyError:  # evicted by another thread just now; the entry still works
            pass
    return entry


def _insert(key: _CacheKey, entry: Any) -> Any:
    with _cache_lock:
        entry = _cache.setdefault(key, entry)
        _cache.move_to_end(key)
        while len(_cache) > _cache_size:
            _cache.popitem(last=False)
    return entry


# -- the walk: order, structural key, flat saved arrays ------------------------------

# Node kinds, the first field of each node's key (-1: a node that is only captured).
K_CAPTURED, K_PRIM, K_ACC, K_ROOT, K_FUNC = -1, 0, 1, 2, 3
_FIELDS = {
    K_CAPTURED: ("kind", "hooks", "exec_info"),
    K_PRIM: ("kind", "primitive", "params", "output shapes/dtypes", "saved values", "edges", "hooks", "exec_info"),
    K_ACC: ("kind", "leaf shape/dtype/sharding", "leaf .grad", "hooks", "exec_info"),
    K_ROOT: ("kind", "edges", "exec_info"),
    K_FUNC: ("kind", "Function", "output shapes/dtypes", "ctx attributes", "saved values", "edges", "hooks", "exec_info"),
}
_TOP_FIELDS = ("create_graph", "accumulate into .grad", "number of inputs", "root input slot")
_HOOKS_FIELD = {K_CAPTURED: 1, K_PRIM: 6, K_ACC: 3, K_FUNC: 6}

_SCALARS = frozenset((float, int, bool, complex, type(None), str))
_HOST = "host"  # hooks key: a hook group with a hook that is not pure runs on the host
_RAW = "raw array"  # saved-values key tag: a raw array argument, a program input
_TENSOR = "tensor"  # saved-values / ctx key tag: a tensor, a program input
_TENSOR_RG = "tensor requiring grad"  # a Function's saved tensor that requires grad (its backward may ask)
_ARG = object()  # template marker: filled from the program's inputs
_ARG_TENSOR = object()  # template marker: filled from the program's inputs, as a Tensor
_CTX_BASE = frozenset(FunctionCtx().__dict__)


class _Walk:
    __slots__ = ("compile_seconds", "flat", "key", "nodes", "starts")

    def __init__(self, key: Any, nodes: list[Node], flat: list[Any], starts: list[int] | None) -> None:
        self.key = key
        self.nodes = nodes
        self.flat = flat
        self.starts = starts  # where each node's entries begin in ``flat`` (the schedule walk's; the structure walk has none)
        self.compile_seconds = 0.0  # this call's tracing and compiling, for the profiler's span


def _group_key(hooks: Any, tensor_hooks: bool) -> Any:
    """Key of one hook dict: the pure hooks themselves, or ``_HOST`` if any is not pure."""
    if not hooks:
        return None
    values = tuple(hooks.values())
    for v in values:
        if type(v[1] if tensor_hooks else v) is not PureHook:
            return _HOST
    return values


def _hooks_key(node: Node) -> Any:
    tensor_pre = node.tensor_pre_hooks()
    if not (tensor_pre or node._pre_hooks or node._post_hooks or node._retains_grad_hooks):
        return None
    pre: Any = _group_key(tensor_pre, True)
    node_pre = _group_key(node._pre_hooks, False)
    if node_pre is _HOST:
        pre = _HOST
    elif pre is not _HOST:
        retains = tuple(node._retains_grad_hooks or ())
        pre = (pre, node_pre, retains) if pre or node_pre or retains else None
    return pre, _group_key(node._post_hooks, False)


def _scalar_key(value: Any) -> tuple[Any, ...]:
    """A constant's key: its type (1, 1.0 and True are equal) and, for zeros, its sign (0.0 == -0.0)."""
    return (type(value), value) if value else (type(value), value, str(value))


def _is_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, np.ndarray))


def _freeze(value: Any, flat: list[Any]) -> Any:
    """A hashable key for a static value; integer arrays go to ``flat``, keyed by shape and dtype.

    Boolean masks decide output shapes, so they are keyed (and later baked in) by value.
    """
    if isinstance(value, Tensor):
        flat.append(value._array)
        return (_TENSOR, value.shape, value.dtype)
    if _is_array(value):
        if value.dtype == np.bool_:
            return (_RAW, "bool", value.shape, np.asarray(value).tobytes())
        flat.append(value)
        return (_RAW, value.shape, value.dtype)
    cls = type(value)
    if cls is tuple or cls is list:
        return (cls, *(_freeze(v, flat) for v in value))
    if cls is dict:
        return (dict, *((k, _freeze(v, flat)) for k, v in value.items()))
    if cls is slice:
        return (slice, _freeze(value.start, flat), _freeze(value.stop, flat), _freeze(value.step, flat))
    try:
        hash(value)
    except TypeError:
        raise _NotTraceable(f"a static value of type {cls.__name__} cannot be keyed", "unhashable static value") from None
    return (cls, value)


def _params_key(params: dict[str, Any], flat: list[Any]) -> Any:
    if not params:
        return ()
    items = tuple(params.items())
    try:
        hash(items)
        return items
    except TypeError:
        return tuple((k, _freeze(v, flat)) for k, v in items)


class _NeedsSchedule(Exception):
    """Raised by the one-pass walk: this graph has effects that must happen in eager's order.

    An unpack hook, a version check that fails or a freed saved tensor: eager unpacks in
    schedule order, so such a graph takes the walk that replays the schedule.
    """


def _unpack(s: SavedTensor, node: Node, in_order: bool) -> Tensor:
    """``s.unpack(node)``; out of eager's order (``in_order`` false) only where it has no effect."""
    t = s._ref if s._state == "input" else None
    if t is not None and t._version == s._saved_version:
        return t  # the common case, inline: a live input at its saved version
    if not in_order:
        original = s._ref() if s._state == "output" else None
        if s._state != "output" or (original is not None and original._version != s._saved_version):
            raise _NeedsSchedule
    return s.unpack(node)


def _saved_key(values: Any, node: Node, flat: list[Any], keep_tensors: bool, in_order: bool) -> tuple[Any, ...]:
    """Key of a node's saved values, appending the unpacked ones to ``flat`` in order.

    ``keep_tensors`` (create_graph) keeps the unpacked tensors, which carry the graph.
    """
    key: list[Any] = []
    append = key.append
    for s in values:
        cls = type(s)
        if cls is SavedTensor or cls is Tensor:
            t = _unpack(s, node, in_order) if cls is SavedTensor else s
            a = t._array
            flat.append(t if keep_tensors else a)
            append(a.shape)
            append(a.dtype)
            if cls is Tensor:
                append(t.requires_grad)
        elif cls in _SCALARS:
            append(_scalar_key(s))
        elif cls is Aval:
            append(s)
        elif _is_array(s):
            flat.append(s)
            append(_RAW)
            append(s.shape)
            append(s.dtype)
        else:
            append(_freeze(s, flat))
    return tuple(key)


def _ctx_key(ctx: FunctionCtx, name: str, flat: list[Any]) -> tuple[Any, ...]:
    """Key of what a Function's ``backward`` may read from ``ctx`` besides the saved tensors."""
    items = []
    for attr, value in ctx.__dict__.items():
        if attr in _CTX_BASE:
            continue
        try:
            items.append((attr, _freeze(value, flat)))
        except _NotTraceable:
            raise _NotTraceable(
                f"ctx.{attr} of {name} is a {type(value).__name__}, which cannot be keyed", "unhashable ctx attribute"
            ) from None
    return (ctx.materialize_grads, ctx.needs_input_grad, tuple(items))


def _function_saved(node: FunctionNode, in_order: bool) -> tuple[Tensor | None, ...]:
    if in_order:
        return node.unpack_saved()
    if node.saved is None:
        raise _NeedsSchedule  # freed: eager raises when it reaches the node
    return tuple(None if s is None else _unpack(s, node, False) for s in node.saved)


def _outputs_key(meta: tuple[InputMetadata, ...]) -> Any:
    """(shape, dtype) of each output of a node."""
    return meta[0][:2] if len(meta) == 1 else tuple(m[:2] for m in meta)


def _node_key(node: Node, edges_key: tuple[int, ...], exec_key: Any, flat: list[Any], create_graph: bool,
              in_order: bool) -> tuple[Any, ...]:
    """One node's key (see ``_FIELDS``), appending its saved arrays to ``flat``: the per-node work of both walks.

    The common case (a primitive node whose saved values are plain saved tensors and
    scalars) is written out inline: it is the hit path's per-node Python.
    """
    cls = type(node)
    hooks = (
        _hooks_key(node)
        if node._tensor_pre_hooks or node._pre_hooks or node._post_hooks or node._retains_grad_hooks or cls is AccumulateGrad
        else None
    )
    if cls is PrimitiveNode:
        meta = node.input_metadata
        saved_out = node.saved_out
        params = node.params
        saved_key: list[Any] = []
        add_saved = saved_key.append
        for s in node.saved if saved_out is None else (*node.saved, *saved_out):
            scls = type(s)
            if scls is SavedTensor:
                t = s._ref if s._state == "input" else None
                if t is None or t._version != s._saved_version:
                    t = _unpack(s, node, in_order)
                a = t._array
                flat.append(t if create_graph else a)
                aval = a.aval
                add_saved(aval.shape)
                add_saved(aval.dtype)
            elif scls in _SCALARS:
                add_saved(_scalar_key(s))
            elif scls is Aval:
                add_saved(s)
            else:
                add_saved(_saved_key((s,), node, flat, create_graph, in_order))
        return (
            K_PRIM,
            node.prim,
            _params_key(params, flat) if params else (),
            _outputs_key(meta),
            tuple(saved_key),
            edges_key,
            hooks,
            exec_key,
        )
    if cls is AccumulateGrad:
        grad = node.variable.grad
        return (
            K_ACC,
            node.input_metadata[0],
            None if grad is None else (grad._array.shape, grad._array.dtype),
            hooks,
            exec_key,
        )
    if isinstance(node, FunctionNode):
        return (
            K_FUNC,
            node.function,
            tuple(None if m is None else (m[0], m[1]) for m in node.input_metadata),
            _ctx_key(node.ctx, node.name(), flat),
            _saved_key(_function_saved(node, in_order), node, flat, create_graph, in_order),
            edges_key,
            hooks,
            exec_key,
        )
    if cls is GraphRoot:
        return (K_ROOT, edges_key, exec_key)
    raise _NotTraceable(f"the graph has a node of kind {node.name()} that compiled backward does not know", "unknown node kind")


def _walk(graph_task: Any, root: Node, create_graph: bool, accumulate_grad: bool, n_inputs: int, root_nr: int) -> _Walk:
    """Replay the eager schedule; return the key, the nodes in run order and the flat saved values.

    Saved tensors are unpacked in eager's order, so unpack hooks and version checks
    behave as in eager. ``graph_task``'s dependency counts are used up.
    """
    dependencies = graph_task.dependencies
    exec_info = graph_task.exec_info
    order: dict[Node, int] = {root: 0}
    nodes: list[Node] = []
    node_keys: list[Any] = []
    flat: list[Any] = []
    starts: list[int] = []
    # Eager's ready queue: highest sequence_nr first, ties in push order. A node that
    # becomes ready while the queue is empty, alone, is next: it skips the heap.
    heap: list[tuple[int, int, Node]] = []
    pushed = 0
    ready: Node | None = root
    heappop, heappush = heapq.heappop, heapq.heappush
    add_node, add_key, add_start = nodes.append, node_keys.append, starts.append
    exec_key: Any = None
    while True:
        if ready is not None:
            node, ready = ready, None
        elif heap:
            node = heappop(heap)[2]
        else:
            break
        add_node(node)
        add_start(len(flat))
        if exec_info:
            info = exec_info[node]
            exec_key = (info.needed, None if info.captures is None else tuple(info.captures))
            if not info.needed:
                # Captured only: eager runs its tensor pre-hooks and stops there.
                add_key((K_CAPTURED, _hooks_key(node), exec_key))
                continue
        edges_key: list[int] = []
        add_edge = edges_key.append
        for next_fn, input_nr in node.next_edges:
            if next_fn is None:
                add_edge(-1)
                add_edge(0)
                continue
            i = order.get(next_fn)
            if i is None:
                i = order[next_fn] = len(order)
            add_edge(i)
            add_edge(input_nr)
            remaining = dependencies[next_fn] - 1
            if remaining:
                dependencies[next_fn] = remaining
                continue
            del dependencies[next_fn]
            if exec_info:
                next_info = exec_info.get(next_fn)
                if next_info is None or not next_info.should_execute():
                    continue
            if ready is None and not heap:
                ready = next_fn
                continue
            if ready is not None:  # a second ready node: both go through the heap, in push order
                heappush(heap, (-ready.sequence_nr, pushed, ready))
                pushed += 1
                ready = None
            heappush(heap, (-next_fn.sequence_nr, pushed, next_fn))
            pushed += 1
        add_key(_node_key(node, tuple(edges_key), exec_key, flat, create_graph, True))
    add_start(len(flat))
    return _Walk((create_graph, accumulate_grad, n_inputs, root_nr, tuple(node_keys)), nodes, flat, starts)


# NOTE [Structure fragments]
# The hit path's walk must cost little per node. Most nodes are primitives without
# hooks, and most of such a node's key is fixed once it is recorded: primitive,
# params, output shapes/dtypes and what it saved (shapes/dtypes of tensors, constants,
# avals), with the number of its inputs, which fixes how many edges follow it in the
# key. ``_fragment`` interns that part to a small int, shared by every node with the
# same fragment together with the positions of its saved tensors
# (``PrimitiveNode.structure``), so the walk appends an int and the node's edges, and
# the key hashes and compares as flat ints.
# Once a compiled backward has run in the process, primitives get their fragment as
# they are recorded (``registry.on_record``); nodes recorded before then get it on
# their first walk. Ids are never reused: past ``MAX_FRAGMENTS`` the table starts
# afresh, and a structure keyed with old ids only misses once more. Nodes with hooks,
# unhashable params or saved values with effects (hooked, freed), and every other kind
# of node, are keyed by ``_node_key`` as in the schedule walk.

MAX_FRAGMENTS = 1 << 16
_fragments: dict[tuple[Any, ...], tuple[int, tuple[int, ...], bool]] = {}
_next_fragment = itertools.count().__next__
_NO_FRAGMENT = (-1, (), False)  # ``structure`` of a primitive node that ``_node_key`` keys


def _saved_aval(s: SavedTensor) -> tuple[Any, Any] | None:
    """Shape and dtype of a plain saved tensor without unpacking it; ``None`` for hooked or freed ones."""
    state = s._state
    if state == "input":
        array = s._ref._array
    elif state == "output":
        array = s._array
    else:
        return None
    return array.shape, array.dtype


def _fragment(node: PrimitiveNode) -> tuple[int, tuple[int, ...], bool]:
    """``(id, positions of saved tensors, whether outputs were saved)`` (NOTE [Structure fragments])."""
    params = node.params
    items = tuple(params.items()) if params else ()
    try:
        hash(items)
    except TypeError:
        return _NO_FRAGMENT
    n_inputs = len(node.saved)
    key: list[Any] = [node.prim, items, _outputs_key(node.input_metadata), n_inputs]
    gather = []
    saved_out = node.saved_out
    for i, s in enumerate(node.saved if saved_out is None else (*node.saved, *saved_out)):
        cls = type(s)
        if cls is SavedTensor:
            aval = _saved_aval(s)
            if aval is None:
                return _NO_FRAGMENT
            key.append((_TENSOR, *aval))  # tagged: an Aval of the same shape and dtype is an equal tuple
            if i < n_inputs:
                gather.append(i)
        elif cls in _SCALARS:
            key.append(_scalar_key(s))
        elif cls is Aval:
            key.append(s)
        else:
            return _NO_FRAGMENT
    frozen = tuple(key)
    structure = _fragments.get(frozen)
    if structure is None:
        if len(_fragments) >= MAX_FRAGMENTS:
            _fragments.clear()
        structure = _fragments.setdefault(frozen, (_next_fragment(), tuple(gather), saved_out is not None))
    return structure


def _record_fragment(node: PrimitiveNode) -> None:
    node.structure = _fragment(node)


def _walk_structure(root: Node, create_graph: bool, root_nr: int) -> _Walk | None:
    """The hit path's walk, for a call without ``inputs``: one pass in discovery order.

    Its key is the structure, node by node (a fragment id, NOTE [Structure fragments],
    or ``_node_key``), with edges as discovery indices, plus the rank order of the
    nodes' ``sequence_nr``s: together they decide eager's schedule, which a miss
    computes with ``_walk`` and stores with the program (``_Program.hit_order``). An
    edge is one entry, the target's discovery index, when it leads to input 0 (most
    do), and two, ``~index`` and the input number, otherwise; ``None`` when it leads
    nowhere.
    ``None`` when only the schedule replay may walk this graph: saved values with
    effects (``_NeedsSchedule``), equal ``sequence_nr``s (nodes recorded on different
    threads: eager breaks such ties by push order, which ranks do not capture), or
    what ``_walk`` reports as not traceable.
    """
    index: dict[Node, int] = {root: 0}
    nodes: list[Node] = [root]
    key: list[Any] = []
    flat: list[Any] = []
    add_node, add_key, add_flat = nodes.append, key.append, flat.append
    try:
        for node in nodes:  # grows while iterating: breadth-first discovery
            if type(node) is PrimitiveNode and not (
                node._tensor_pre_hooks or node._pre_hooks or node._post_hooks or node._retains_grad_hooks
            ):
                structure = node.structure
                if structure is None:
                    structure = node.structure = _fragment(node)
                fid, gather, saved_out = structure
            else:
                fid = -1
            if fid >= 0:
                add_key(fid)  # the fragment fixes the number of edges that follow
                for i in gather:
                    s = node.saved[i]
                    t = s._ref if s._state == "input" else None
                    if t is None or t._version != s._saved_version:
                        t = _unpack(s, node, False)
                    add_flat(t if create_graph else t._array)
                if saved_out:
                    for s in node.saved_out:
                        t = _unpack(s, node, False)
                        add_flat(t if create_graph else t._array)
            else:
                # A tuple, unlike a fragment id; it counts the edges that follow.
                add_key(_node_key(node, len(node.next_edges), None, flat, create_graph, False))
            for next_fn, input_nr in node.next_edges:
                if next_fn is None:
                    add_key(None)
                    continue
                i = index.get(next_fn)
                if i is None:
                    i = index[next_fn] = len(nodes)
                    add_node(next_fn)
                if input_nr:
                    add_key(~i)
                    add_key(input_nr)
                else:
                    add_key(i)
    except (_NeedsSchedule, _NotTraceable):
        return None
    sequence_nrs = [node.sequence_nr for node in nodes]
    # Accumulators share one number (NOTE [AccumulateGrad runs first] in node.py); their
    # ties are broken by push order, which the structure and the other ranks decide.
    n_accumulators = sequence_nrs.count(ACCUMULATE_GRAD_SEQUENCE_NR)
    if len(set(sequence_nrs)) + max(n_accumulators - 1, 0) < len(nodes):
        return None
    ranks = tuple(sorted(range(len(nodes)), key=sequence_nrs.__getitem__))
    return _Walk((create_graph, root_nr, tuple(key), ranks), nodes, flat, None)


# -- steps: what the program does per node -------------------------------------------


class _NodeView:
    """What eager's hook runners and ``validate_outputs`` read from a node, without its saved state."""

    __slots__ = ("_name", "_post_hooks", "_pre_hooks", "_retains_grad_hooks", "_tensor_pre_hooks", "input_metadata")

    def __init__(self, name: str, input_metadata: tuple[Any, ...]) -> None:
        self._name = name
        self.input_metadata = input_metadata
        self._tensor_pre_hooks: Any = None
        self._pre_hooks: Any = None
        self._post_hooks: Any = None
        self._retains_grad_hooks: Any = None

    def name(self) -> str:
        return self._name

    def tensor_pre_hooks(self) -> Any:
        return self._tensor_pre_hooks


def _traced_metadata(meta: tuple[Any, ...]) -> tuple[Any, ...]:
    """Input metadata without shardings: inside a program XLA places the values."""
    return tuple(None if m is None else InputMetadata(m.shape, m.dtype, None) for m in meta)


class _PrimRules:
    """A primitive's rules with their params: ``PrimitiveNode.compute`` runs on it unchanged."""

    __slots__ = ("params", "prim")
    compute = PrimitiveNode.compute

    def __init__(self, prim: Any, params: dict[str, Any]) -> None:
        self.prim = prim
        self.params = params


class _FunctionRules:
    """A custom Function's backward: ``FunctionNode.compute`` runs on it unchanged."""

    __slots__ = ("_name", "ctx", "function", "input_is_tensor", "next_edges")
    compute = FunctionNode.compute
    _check_grads = FunctionNode._check_grads

    def __init__(self, name: str, function: Any, input_is_tensor: tuple[bool, ...], n_edges: int, ctx: FunctionCtx) -> None:
        self._name = name
        self.function = function
        self.input_is_tensor = input_is_tensor
        self.next_edges = (None,) * n_edges  # only counted: the graph's nodes are not kept
        self.ctx = ctx

    def name(self) -> str:
        return self._name


class _Step:
    """One node of the program: the static facts its phases need, none of the graph's values."""

    __slots__ = (
        "captures", "ctx_template", "edge_views", "function", "kind", "leaf_sharding", "leaf_slot", "materialize",
        "meta", "n_saved_out", "name", "needs_input_grad", "num_outputs", "params", "pos", "post", "pre", "prim",
        "runs", "saved", "size", "targets", "host_body",
    )


def _template(value: Any) -> Any:
    """``value`` with the entries ``_freeze`` sent to ``flat`` replaced by markers."""
    if isinstance(value, Tensor):
        return _ARG_TENSOR
    if _is_array(value):
        return np.asarray(value) if value.dtype == np.bool_ else _ARG
    cls = type(value)
    if cls is tuple or cls is list:
        return cls(_template(v) for v in value)
    if cls is dict:
        return {k: _template(v) for k, v in value.items()}
    if cls is slice:
        return slice(_template(value.start), _template(value.stop), _template(value.step))
    return value


def _fill(template: Any, values: Iterator[Any]) -> Any:
    if template is _ARG:
        return next(values)
    if template is _ARG_TENSOR:
        return Tensor(next(values))
    cls = type(template)
    if cls is tuple or cls is list:
        return cls(_fill(v, values) for v in template)
    if cls is dict:
        return {k: _fill(v, values) for k, v in template.items()}
    if cls is slice:
        return slice(_fill(template.start, values), _fill(template.stop, values), _fill(template.step, values))
    return template


def _saved_template(values: Any) -> tuple[Any, ...]:
    """Per saved value, what the program passes the rule: ``_TENSOR``/``_RAW`` inputs or a template."""
    out = []
    for s in values:
        cls = type(s)
        if cls is SavedTensor:
            out.append(_TENSOR)
        elif cls is Tensor:
            out.append(_TENSOR_RG if s.requires_grad else _TENSOR)
        elif cls in _SCALARS or cls is Aval:
            out.append(s)
        elif _is_array(s):
            out.append(_RAW)
        else:
            out.append(_template(s))
    return tuple(out)


def _hook_views(name: str, meta: tuple[Any, ...], key: Any) -> tuple[Any, Any]:
    """A node's two hook groups as traced views, ``_HOST`` markers, or ``None`` (from its hooks key)."""
    if key is None:
        return None, None
    pre_key, post_key = key
    pre: Any = pre_key
    if pre_key is not _HOST and pre_key is not None:
        tensor_pre, node_pre, retains = pre_key
        pre = _NodeView(name, meta)
        pre._tensor_pre_hooks = dict(enumerate(tensor_pre or ()))
        pre._pre_hooks = dict(enumerate(node_pre or ()))
        pre._retains_grad_hooks = retains
    post: Any = post_key
    if post_key is not _HOST and post_key is not None:
        post = _NodeView(name, meta)
        post._post_hooks = dict(enumerate(post_key))
    return pre, post


def _build_steps(walk: _Walk) -> list[_Step]:
    nodes = walk.nodes
    position = {node: pos for pos, node in enumerate(nodes)}
    steps = []
    leaf_slots = 0
    for pos, (node, nkey) in enumerate(zip(nodes, walk.key[4], strict=True)):
        step = _Step()
        step.pos = pos
        step.kind = nkey[0]
        step.name = node.name()
        step.meta = _traced_metadata(node.input_metadata)
        step.size = len(node.input_metadata)
        exec_key = nkey[-1]
        step.runs = exec_key is None or exec_key[0]
        step.captures = None if exec_key is None else exec_key[1]
        hooks_field = _HOOKS_FIELD.get(step.kind)
        step.pre, step.post = _hook_views(step.name, step.meta, None if hooks_field is None else nkey[hooks_field])
        step.leaf_slot = None
        step.host_body = False
        steps.append(step)
        if not step.runs:
            continue
        targets = []
        views = []
        for next_fn, input_nr in node.next_edges:
            target = position.get(next_fn) if next_fn is not None else None
            targets.append(None if target is None else (target, input_nr))
            view = None if next_fn is None else _NodeView(next_fn.name(), _traced_metadata(next_fn.input_metadata))
            views.append(Edge(view, input_nr))
        step.targets = targets
        step.edge_views = tuple(views)
        if step.kind == K_PRIM:
            step.prim = node.prim
            # Registered primitives that do not jit their forward are device moves: one XLA
            # program cannot move values between devices, so they run on the host.
            step.host_body = not node.prim.jit and REGISTRY.get(node.prim.name) is node.prim
            step.params = _template(node.params)
            step.num_outputs = node.prim.num_outputs
            step.n_saved_out = 0 if node.saved_out is None else len(node.saved_out)
            step.saved = _saved_template(node.saved if node.saved_out is None else (*node.saved, *node.saved_out))
        elif step.kind == K_ACC:
            step.leaf_slot = leaf_slots
            leaf_slots += 1
            sharding = node.input_metadata[0].sharding
            multi = isinstance(sharding, jax.sharding.NamedSharding) and len(sharding.device_set) > 1
            step.leaf_sharding = sharding if multi else None
        elif step.kind == K_FUNC:
            ctx = node.ctx
            step.function = (node.function, node.input_is_tensor, len(node.next_edges))
            step.needs_input_grad = ctx.needs_input_grad
            step.materialize = ctx.materialize_grads
            step.ctx_template = [(attr, _template(v)) for attr, v in ctx.__dict__.items() if attr not in _CTX_BASE]
            step.saved = _saved_template(node.unpack_saved())
    return steps


# -- phases: the eager engine's per-node work, on traced or concrete values ------------


CAPTURE, PRE, BODY, POST, ROUTE = range(5)


class _Values:
    """Gradients in flight inside a segment (or between segments, on the host)."""

    __slots__ = ("buffers", "captures", "current", "grads", "retained")

    def __init__(self) -> None:
        self.buffers: dict[int, InputBuffer] = {}
        self.current: dict[int, Any] = {}  # {pos: (outputs, inputs)} between a node's body and its routing
        self.grads: dict[int, Tensor] = {}
        self.captures: dict[int, Tensor] = {}
        self.retained: dict[tuple[int, int], Tensor] = {}

    def live(self) -> Any:
        """What flows on to the next segment, as a pytree with tensor (or ``None``) leaves."""
        return {pos: list(buf.buffer) for pos, buf in self.buffers.items()}, {
            pos: (list(outs), list(ins)) for pos, (outs, ins) in self.current.items()
        }

    @staticmethod
    def from_live(live: Any) -> _Values:
        values = _Values()
        buffers, current = live
        for pos, grads in buffers.items():
            buf = InputBuffer(len(grads))
            buf.buffer = list(grads)
            values.buffers[pos] = buf
        values.current = {pos: (list(outs), list(ins)) for pos, (outs, ins) in current.items()}
        return values


def _phase(steps: list[_Step], step: _Step, op: int, view: Any, values: _Values, args: Iterator[Any],
           roots: list[Tensor], old: dict[int, Tensor]) -> None:
    """Run one phase of ``step``; ``view`` is the node itself (host) or its traced hook view."""
    try:
        _phase_unchecked(steps, step, op, view, values, args, roots, old)
    except _TRACER_ERRORS as exc:
        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        if op in (PRE, POST):
            raise _NotTraceable(f"a hook marked pure_hook on {step.name} is not traceable ({detail})", "untraceable hook") from exc
        if step.kind == K_FUNC:
            raise _NotTraceable(
                f"the backward of custom Function {step.function[0].__name__} is not traceable ({detail})",
                "untraceable Function",
            ) from exc
        raise _NotTraceable(f"{step.name} is not traceable ({detail})", "untraceable node") from exc
    except _NotTraceable as exc:
        if step.kind == K_FUNC and exc.kind == "reentrant backward" and op == BODY:
            raise _NotTraceable(f"the backward of custom Function {step.function[0].__name__} {exc}", exc.kind) from exc
        raise


def _phase_unchecked(steps: list[_Step], step: _Step, op: int, view: Any, values: _Values, args: Iterator[Any],
                     roots: list[Tensor], old: dict[int, Tensor]) -> None:
    pos = step.pos
    if op == CAPTURE:
        buf = values.buffers[pos].buffer
        # No captures: the root of a ``grad`` that reaches none of its inputs.
        for input_idx, output_idx in step.captures or ():
            if buf[input_idx] is not None:
                values.captures[output_idx] = buf[input_idx]
        if not step.runs:
            del values.buffers[pos]
    elif op == PRE:
        buf = values.buffers[pos]
        if step.runs:
            buf.buffer = call_tensor_pre_hooks(view, buf.buffer)
            if view._pre_hooks:
                buf.buffer = call_pre_hooks(view, buf.buffer)
        else:
            buf.buffer = call_tensor_pre_hooks(view, list(buf.buffer))
    elif op == BODY:
        buf = values.buffers.pop(pos, None)
        inputs = [] if buf is None else buf.buffer
        outs = _body(step, inputs, values, args, roots, old)
        # The received grads stay in flight only for post hooks (after a device move they
        # would pin the next segment to the old device).
        values.current[pos] = (outs, inputs if step.post is not None else [])
    elif op == POST:
        outs, ins = values.current[pos]
        values.current[pos] = (call_post_hooks(view, outs, ins), ins)
    else:
        outs, _ = values.current.pop(pos)
        buffers = values.buffers
        for out, target in zip(outs, step.targets, strict=True):
            if target is None:
                continue
            tpos, input_nr = target
            buf = buffers.get(tpos)
            if buf is None:
                buf = buffers[tpos] = InputBuffer(steps[tpos].size)
            buf.add(input_nr, out)


def _body(step: _Step, inputs: list[Any], values: _Values, args: Iterator[Any], roots: list[Tensor],
          old: dict[int, Tensor]) -> list[Any]:
    kind = step.kind
    if kind == K_ACC:
        new = inputs[0]
        if new is not None:
            previous = old.get(step.leaf_slot)
            value = new._array if previous is None else previous._array + new._array
            if step.leaf_sharding is not None:
                value = jax.lax.with_sharding_constraint(value, step.leaf_sharding)
            values.grads[step.leaf_slot] = Tensor(value)
        return []
    if kind == K_ROOT:
        outs = list(roots)
    elif kind == K_PRIM:
        outs = _prim_body(step, inputs, args)
    else:
        outs = _function_body(step, inputs, args)
    validate_outputs(step.edge_views, outs, step.name)
    return outs


def _saved_values(template: tuple[Any, ...], args: Iterator[Any]) -> list[Any]:
    values = []
    for s in template:
        if s is _TENSOR:
            values.append(Tensor(next(args)))
        elif s is _TENSOR_RG:
            values.append(Tensor(next(args), requires_grad=True))
        elif s is _RAW:
            values.append(next(args))
        else:
            values.append(_fill(s, args))
    return values


def _prim_body(step: _Step, grads: list[Any], args: Iterator[Any]) -> list[Any]:
    """``PrimitiveNode.apply`` on given values: the same rules, through the same ``compute``."""
    rules = _PrimRules(step.prim, _fill(step.params, args))
    values = _saved_values(step.saved, args)
    n_out = step.n_saved_out
    inputs = values[:len(values) - n_out]
    g = incoming_grad(step.num_outputs, grads, step.meta)
    if g is None:
        return [None] * len(step.targets)
    out: Any = tuple(values[len(values) - n_out:]) if n_out else step.meta
    if step.num_outputs == 1:
        out = out[0]
    return rules.compute(g, out, inputs, [t is not None for t in step.targets])


def _function_body(step: _Step, grads: list[Any], args: Iterator[Any]) -> list[Any]:
    """``FunctionNode.apply`` on given values: the user's ``backward``, through the same ``compute``."""
    ctx = FunctionCtx()
    ctx.needs_input_grad = step.needs_input_grad
    ctx.materialize_grads = step.materialize
    for attr, template in step.ctx_template:
        setattr(ctx, attr, _fill(template, args))
    saved = tuple(_saved_values(step.saved, args))
    if step.materialize:
        grads = [
            Tensor(jnp.zeros(m.shape, m.dtype)) if g is None and m is not None else g
            for g, m in zip(grads, step.meta, strict=True)
        ]
    return _FunctionRules(step.name, *step.function, ctx).compute(grads, saved)


def _retain_recorders(view: _NodeView, pos: int, values: _Values) -> _NodeView:
    """A copy of ``view`` whose retains-grad hooks record the traced grad as a program output."""
    recorder = _NodeView(view._name, view.input_metadata)
    recorder._tensor_pre_hooks = view._tensor_pre_hooks
    recorder._pre_hooks = view._pre_hooks

    def record(nr: int) -> Callable[[Any], None]:
        def retain(grad: Any) -> None:
            if grad is not None:
                values.retained[(pos, nr)] = grad

        return retain

    recorder._retains_grad_hooks = {nr: record(nr) for nr in view._retains_grad_hooks}
    return recorder


@contextlib.contextmanager
def _tracing() -> Iterator[None]:
    """While tracing: record no graph, and send nested backwards to ``execute`` (which refuses them)."""
    prev = (_state.tracing, _state.enabled, _grad_state.enabled)
    _state.tracing, _state.enabled, _grad_state.enabled = True, True, False
    try:
        yield
    finally:
        _state.tracing, _state.enabled, _grad_state.enabled = prev


# -- segments and their compiled variants --------------------------------------------


class _Segment:
    """A run of traced phases between host hooks: one jitted program per input layout."""

    def __init__(self, program: _Program, index: int, phases: list[tuple[int, int]], arg_lo: int, arg_hi: int) -> None:
        self.program = program
        self.index = index
        self.phases = phases
        self.arg_lo = arg_lo
        self.arg_hi = arg_hi
        steps = program.steps
        self.leaf_steps = [steps[pos] for op, pos in phases if op == BODY and steps[pos].kind == K_ACC]
        self.variants: dict[Any, _Variant] = {}

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == len(self.program.segments) - 1

    def trace(self, flat: list[Any], layout: tuple[Any, ...]) -> tuple[list[Any], Any]:
        """The segment as a function of flat arrays; returns the flat outputs and their pytree."""
        _stats.add("traces")
        n_saved, live_tree, n_live, n_roots, old_mask = layout
        args = iter(flat[:n_saved])
        live = jax.tree_util.tree_unflatten(live_tree, [Tensor(a) for a in flat[n_saved:n_saved + n_live]])
        roots = [Tensor(a) for a in flat[n_saved + n_live:n_saved + n_live + n_roots]]
        old_arrays = iter(flat[n_saved + n_live + n_roots:])
        old = {s.leaf_slot: Tensor(next(old_arrays)) for s, has in zip(self.leaf_steps, old_mask, strict=True) if has}
        values = _Values.from_live(live)
        program = self.program
        steps = program.steps
        if self.first and program.root_nr >= 0:
            buf = InputBuffer(steps[0].size)
            buf.add(program.root_nr, roots[0])
            values.buffers[0] = buf
        for op, pos in self.phases:
            step = steps[pos]
            view = step.post if op == POST else step.pre
            if op == PRE and view._retains_grad_hooks:
                view = _retain_recorders(view, pos, values)
            _phase(steps, step, op, view, values, args, roots, old)
        outputs = (
            None if self.last else values.live(),
            values.grads,
            values.captures,
            values.retained,
        )
        leaves, tree = jax.tree_util.tree_flatten(outputs, is_leaf=_is_tensor)
        return [t._array for t in leaves], tree


class _Variant:
    """A segment compiled for one layout of its inputs.

    Traced once to a jaxpr: the inputs no equation reads are dropped, the data flow
    from inputs to outputs is kept (create_graph detaches outputs that need no graph),
    and the rest runs as ``jax.jit`` of the jaxpr.
    """

    __slots__ = ("deps", "donated", "donating", "example", "fresh", "op", "out_avals", "out_tree", "plain", "used")

    def __init__(self, segment: _Segment, avals: list[Any], layout: tuple[Any, ...]) -> None:
        trees: list[Any] = []

        def traced(*flat: Any) -> list[Any]:
            leaves, tree = segment.trace(list(flat), layout)
            trees.append(tree)
            return leaves

        with _tracing():
            closed = jax.make_jaxpr(traced)(*avals)
        self.out_tree = trees[0]
        self.out_avals = closed.out_avals
        jaxpr = closed.jaxpr
        index = {v: i for i, v in enumerate(jaxpr.invars)}
        depends: dict[Any, frozenset[int]] = {v: frozenset((i,)) for v, i in index.items()}
        used: set[int] = set()
        for eqn in jaxpr.eqns:
            sources: frozenset[int] = frozenset()
            for v in eqn.invars:
                if not isinstance(v, Literal):
                    sources = sources | depends.get(v, frozenset())
                    if v in index:
                        used.add(index[v])
            for v in eqn.outvars:
                depends[v] = sources
        self.deps = []
        for v in jaxpr.outvars:
            if isinstance(v, Literal):
                self.deps.append(frozenset())
                continue
            self.deps.append(depends.get(v, frozenset()))
            if v in index:
                used.add(index[v])
        self.used = sorted(used)
        first_old = len(avals) - sum(layout[4])
        self.donated = tuple(k for k, i in enumerate(self.used) if i >= first_old)
        run_all = jaxpr_as_fun(closed)
        n_in = len(avals)
        used_idx = tuple(self.used)

        def run(*used_args: Any) -> Any:
            full: list[Any] = [None] * n_in
            for i, a in zip(used_idx, used_args, strict=True):
                full[i] = a
            return run_all(*full)

        self.plain = jax.jit(run)
        self.donating = jax.jit(run, donate_argnums=self.donated) if self.donated else self.plain

        def program(*flat: Any) -> list[Any]:
            with _tracing():
                return segment.trace(list(flat), layout)[0]

        self.op = from_jax(program, name="compiled")  # create_graph: the segment as one differentiable op


class _Program:
    """The compiled form of one graph structure: its steps, and its segments split at host hooks."""

    def __init__(self, walk: _Walk) -> None:
        key = walk.key
        self.create_graph = key[0]
        self.root_nr = key[3]
        self.node_keys = key[4]
        # Calls without inputs find the program by ``_walk_structure``'s key: where that
        # walk's nodes and flat values sit in this program's order (set on the miss).
        self.hit_order: tuple[list[int], list[int]] | None = None
        self.steps = _build_steps(walk)
        # The nodes whose release_variables frees something: Functions, and primitives that
        # saved a tensor (avals and constants stay; the other kinds hold nothing).
        self.released = [
            s.pos for s in self.steps if s.runs and (s.kind == K_FUNC or (s.kind == K_PRIM and any(v is _TENSOR for v in s.saved)))
        ]
        self.items: list[Any] = []  # segments, with host phases (op, pos) between them
        self.segments: list[_Segment] = []
        phases: list[tuple[int, int]] = []
        arg_lo = arg = 0
        starts = walk.starts
        for step in self.steps:
            ops = []
            if step.captures is not None and step.runs:
                ops.append(CAPTURE)  # eager captures a running node's grads before its hooks
            if step.pre is not None:
                ops.append(PRE)
            if not step.runs:
                ops.append(CAPTURE)
            else:
                ops.append(BODY)
                if step.post is not None:
                    ops.append(POST)
                ops.append(ROUTE)
            for op in ops:
                if (op == PRE and step.pre is _HOST) or (op == POST and step.post is _HOST) or (op == BODY and step.host_body):
                    self._add_segment(phases, arg_lo, arg)
                    phases = []
                    arg_lo = arg
                    self.items.append((op, step.pos))
                else:
                    phases.append((op, step.pos))
                    if op == BODY:
                        arg += starts[step.pos + 1] - starts[step.pos]
        self._add_segment(phases, arg_lo, arg)

    def _add_segment(self, phases: list[tuple[int, int]], lo: int, hi: int) -> None:
        segment = _Segment(self, len(self.segments), phases, lo, hi)
        self.segments.append(segment)
        self.items.append(segment)

    def hlo_text(self, segment: int = 0) -> str:
        """The compiled HLO of one segment's first variant (for tests and debugging)."""
        variant = next(iter(self.segments[segment].variants.values()))
        return variant.plain.lower(*(variant.example[i] for i in variant.used)).compile().as_text()


# -- running a program ---------------------------------------------------------------


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def _array_of(x: Any) -> Any:
    return x._array if isinstance(x, Tensor) else x


def _aval(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def _donatable(var: Tensor) -> bool:
    """Whether leaf ``var``'s old ``.grad`` buffer is held by nothing else, so it can be reused.

    The ``.grad`` tensor itself may be shared: it takes the sum in place. The array's
    references: the tensor's slot and ``getrefcount``'s argument.
    """
    grad = var._grad
    return grad is None or sys.getrefcount(grad._array) <= 2


def _compile_variant(segment: _Segment, avals: list[Any], layout: tuple[Any, ...], signature: Any) -> _Variant:
    start = time.perf_counter()
    variant = _Variant(segment, avals, layout)
    variant.example = avals
    variant.fresh = True
    _stats.add("compiles")
    _stats.add("compile_seconds", time.perf_counter() - start)
    return segment.variants.setdefault(signature, variant)


def _pretrace(program: _Program, walk: _Walk, roots: list[Tensor]) -> None:
    """Trace every segment before any runs, so nothing traceable fails halfway through a backward.

    Each segment's live inputs are the previous one's live outputs (host hooks keep
    shapes and dtypes: eager checks what they return); old ``.grad``s come from the key.
    """
    live_leaves, live_tree = jax.tree_util.tree_flatten(_Values().live())
    live_avals: list[tuple[Any, Any]] = []
    for item in program.items:
        if type(item) is tuple:
            op, pos = item
            if op == BODY:  # a device move on the host: find what it leaves behind, abstractly
                live_avals, live_tree = _host_body_avals(program, pos, live_tree, live_avals)
            continue
        segment = item
        saved = [_aval(_array_of(x).shape, _array_of(x).dtype) for x in walk.flat[segment.arg_lo:segment.arg_hi]]
        old_keys = [program.node_keys[s.pos][2] for s in segment.leaf_steps]
        old_mask = tuple(k is not None for k in old_keys)
        old_avals = tuple(k for k in old_keys if k is not None)
        root_avals = [_aval(r._array.shape, r._array.dtype) for r in roots] if segment.first else []
        layout = (len(saved), live_tree, len(live_avals), len(root_avals), old_mask)
        avals = [*saved, *(_aval(*a) for a in live_avals), *root_avals, *(_aval(*a) for a in old_avals)]
        variant = _compile_variant(segment, avals, layout, (live_tree, old_mask, tuple(live_avals), old_avals))
        live = jax.tree_util.tree_unflatten(variant.out_tree, range(len(variant.out_avals)))[0]
        if live is not None:
            live_leaves, live_tree = jax.tree_util.tree_flatten(live)
            live_avals = [(variant.out_avals[i].shape, variant.out_avals[i].dtype) for i in live_leaves]


def _host_body_avals(program: _Program, pos: int, live_tree: Any, live_avals: list[tuple[Any, Any]]) -> tuple[list[Any], Any]:
    def body(*arrays: Any) -> Any:
        live = jax.tree_util.tree_unflatten(live_tree, [Tensor(a) for a in arrays])
        values = _Values.from_live(live)
        _phase(program.steps, program.steps[pos], BODY, None, values, iter(()), [], {})
        return jax.tree_util.tree_map(_array_of, values.live(), is_leaf=_is_tensor)

    with _tracing():
        out = jax.eval_shape(body, *(_aval(*a) for a in live_avals))
    leaves, tree = jax.tree_util.tree_flatten(out)
    return [(a.shape, a.dtype) for a in leaves], tree


def _run_segment(segment: _Segment, walk: _Walk, values: _Values, roots: list[Tensor], create_graph: bool) -> Any:
    nodes = walk.nodes
    saved = walk.flat[segment.arg_lo:segment.arg_hi]
    live_leaves, live_tree = jax.tree_util.tree_flatten(values.live(), is_leaf=_is_tensor)
    leaves = [nodes[s.pos].variable for s in segment.leaf_steps]  # type: ignore[attr-defined]
    root_tensors = roots if segment.first else []
    # Read, add and write .grad under eager's accumulate lock: concurrent backwards into
    # shared leaves stay exact. The program is dispatched asynchronously, so the lock is
    # held for the dispatch, not the computation.
    with _accumulate_lock if leaves else contextlib.nullcontext():
        donate = not create_graph and all(_donatable(v) for v in leaves)
        old = [v._grad for v in leaves]
        old_mask = tuple(g is not None for g in old)
        old = [g for g in old if g is not None]
        live_arrays = [t._array for t in live_leaves]
        signature = (
            live_tree, old_mask, tuple((a.shape, a.dtype) for a in live_arrays), tuple((g._array.shape, g._array.dtype) for g in old)
        )
        variant = segment.variants.get(signature)
        start = time.perf_counter() if variant is None or variant.fresh else 0.0
        if variant is None:
            arrays = [*map(_array_of, saved), *live_arrays, *(t._array for t in root_tensors), *(g._array for g in old)]
            layout = (len(saved), live_tree, len(live_leaves), len(root_tensors), old_mask)
            variant = _compile_variant(segment, [_aval(a.shape, a.dtype) for a in arrays], layout, signature)
        run_start = time.perf_counter() if variant.fresh else 0.0
        if create_graph:
            outs = _run_differentiable(variant, saved, live_leaves, root_tensors, old)
        else:
            inputs = [*saved, *live_arrays, *(t._array for t in root_tensors), *(g._array for g in old)]
            runner = variant.donating if donate else variant.plain
            outs = [Tensor(a) for a in runner(*[inputs[i] for i in variant.used])]
        if variant.fresh:  # the first call compiles: count it as compile time
            jax.block_until_ready([t._array for t in outs])
            variant.fresh = False
            end = time.perf_counter()
            _stats.add("compile_seconds", end - run_start)
            walk.compile_seconds += end - start
        live, grads, captures, retained = jax.tree_util.tree_unflatten(variant.out_tree, outs)
        for step, var in zip(segment.leaf_steps, leaves, strict=True):
            grad = grads.get(step.leaf_slot)
            if grad is not None:
                # ``_grad``, as eager's AccumulateGrad writes it: the traced validate_outputs
                # fitted shape and dtype, and the program places it with the leaf. An
                # existing ``.grad`` takes the sum in place, as in eager, unless create_graph.
                old_grad = var._grad
                if old_grad is None or create_graph:
                    var._grad = grad
                else:
                    store_into_grad(old_grad, grad._array)
    return live, grads, captures, retained


def _run_differentiable(variant: _Variant, saved: list[Any], live: list[Tensor], roots: list[Tensor], old: list[Tensor]) -> list[Tensor]:
    """Run a segment as one ``from_jax`` op: its outputs are differentiable (create_graph).

    An output that depends on no input requiring grad is detached, as eager's would
    have no ``grad_fn``.
    """
    tensors = [x if isinstance(x, Tensor) else Tensor(jnp.asarray(x)) for x in saved] + live + roots + old
    if not variant.deps:
        return []
    outs = list(variant.op(*tensors))
    requires = [t.requires_grad for t in tensors]
    return [o if any(requires[i] for i in deps) else Tensor(o._array) for o, deps in zip(outs, variant.deps, strict=True)]


def _run(program: _Program, walk: _Walk, graph_task: Any, roots: list[Tensor], keep_graph: bool, create_graph: bool,
         n_captured: int) -> list[Tensor | None]:
    nodes = walk.nodes
    steps = program.steps
    captured: list[Tensor | None] = [None] * n_captured
    values = _Values()
    prev_grad_mode, prev_task = _grad_state.enabled, current_task.graph_task
    _grad_state.enabled = create_graph
    current_task.graph_task = graph_task  # so hooks can queue_callback
    try:
        for item in program.items:
            if type(item) is tuple:  # a host phase: eager's hook runner on the real node
                op, pos = item
                _phase(steps, steps[pos], op, nodes[pos], values, iter(()), roots, {})
                continue
            live, grads, captures, retained = _run_segment(item, walk, values, roots, create_graph)
            values = _Values() if live is None else _Values.from_live(live)
            for (pos, nr), grad in retained.items():
                retain = (nodes[pos]._retains_grad_hooks or {}).get(nr)
                if retain is not None:
                    retain(grad)
            for i, grad in captures.items():
                captured[i] = grad
            for step in item.leaf_steps:
                if step.leaf_slot in grads:
                    run_post_accumulate_grad_hooks(nodes[step.pos].variable)  # type: ignore[attr-defined]
    finally:
        _grad_state.enabled = prev_grad_mode
        current_task.graph_task = prev_task
    if not keep_graph:
        for pos in program.released:
            nodes[pos].release_variables()
    graph_task.exec_post_processing()
    return captured


# -- misses, fallbacks, recompile reasons --------------------------------------------


def _call_site() -> str:
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_XGRAD_DIR):
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _node_label(nkey: Any) -> str:
    kind = nkey[0]
    if kind == K_PRIM:
        return nkey[1].node_name
    if kind == K_FUNC:
        return f"{nkey[1].__name__}Backward"
    return {K_ACC: "AccumulateGrad", K_ROOT: "GraphRoot"}.get(kind, "a captured node")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _describe_change(old: Any, new: Any) -> str:
    """What differs between two structural keys, in words (the "recompile reason")."""
    for i, field in enumerate(_TOP_FIELDS):
        if old[i] != new[i]:
            return f"{field} changed from {old[i]!r} to {new[i]!r}"
    before, after = old[4], new[4]
    for pos, (a, b) in enumerate(zip(before, after)):  # noqa: B905  (lengths may differ)
        if a == b:
            continue
        label = _node_label(b)
        if a[0] != b[0]:
            return f"node {pos} is now {label}, was {_node_label(a)}"
        for field, x, y in zip(_FIELDS[b[0]], a, b):  # noqa: B905
            if x != y:
                return f"node {pos} ({label}): {field} changed from {_short(x)} to {_short(y)}"
    if len(before) != len(after):
        return f"the graph has {len(after)} nodes, was {len(before)}"
    return "the same structure as before: its program was evicted from the cache (see set_cache_size)"


def _note_miss(site: str, key: Any) -> None:
    with _stats.lock:
        _stats.misses += 1
        previous = _stats.sites.get(site)
        count = 1 if previous is None else previous[0] + 1
        _stats.sites[site] = (count, key)
        if previous is None:
            return
        reason = _describe_change(previous[1], key)
        _stats.recompile_reasons.append(reason)
        warn = count - 1 > RECOMPILE_WARNING_LIMIT and site not in _stats.warned_sites
        if warn:
            _stats.warned_sites.add(site)
    if warn:
        warnings.warn(WARN_RECOMPILE.format(count=count - 1, site=site, reason=reason), RecompileWarning, stacklevel=4)


def _compile(walk: _Walk, roots: list[Tensor]) -> Any:
    """The program for ``walk``'s structure, or the ``_NotTraceable`` that stops it (cached too)."""
    _note_miss(_call_site(), walk.key)
    try:
        program = _Program(walk)
        _pretrace(program, walk, roots)
    except _NotTraceable as exc:
        return exc  # cached: the same structure is not traced again
    return program


def _hit_order(walk: _Walk, structure: _Walk) -> tuple[list[int], list[int]]:
    """Where ``walk``'s nodes and flat values (schedule order) sit in ``structure``'s (discovery order).

    A node has the same flat values in both walks, in the same order.
    """
    index = {node: i for i, node in enumerate(structure.nodes)}
    node_order = [index[node] for node in walk.nodes]
    counts = [0] * len(structure.nodes)
    for j, i in enumerate(node_order):
        counts[i] = walk.starts[j + 1] - walk.starts[j]  # type: ignore[index]
    starts = [0, *itertools.accumulate(counts)]
    flat_order: list[int] = []
    for i in node_order:
        flat_order.extend(range(starts[i], starts[i + 1]))
    return node_order, flat_order


def _hit_task(root_edges: list[Edge], root_grads: list[Tensor], keep_graph: bool, create_graph: bool) -> engine.GraphTask:
    """``engine.prepare`` for a call without ``inputs``, less the dependency count: a hit does not read it."""
    engine._devices.initialize_device_threads_pool()
    validate_outputs(root_edges, root_grads)
    tls = engine._tls
    if tls.local_ready_queue is None:
        tls.local_ready_queue = engine.ReadyQueue()
    reentrant = tls.worker_device != engine.NO_DEVICE
    graph_task = engine.GraphTask(
        keep_graph, create_graph, tls.total_depth + 1 if reentrant else 0, tls.local_ready_queue, [e.node for e in root_edges]
    )
    parent = current_task.graph_task if reentrant else None
    if tls.multithreading_enabled and (parent is None or parent.device_queues):
        graph_task.device_queues = engine._devices.queues
    return graph_task


def _fallback(exc: _NotTraceable, args: tuple[Any, ...]) -> list[Tensor | None]:
    reason = str(exc)
    with _stats.lock:
        _stats.fallbacks[exc.kind] += 1
        first = reason not in _warned_reasons
        _warned_reasons.add(reason)
    if _state.fallback == "error":
        raise CompiledFallbackError(ERR_FALLBACK.format(reason=reason)) from None
    if first:
        warnings.warn(WARN_FALLBACK.format(reason=reason), CompiledFallbackWarning, stacklevel=4)
    return engine.execute(*args)


def execute(
    root_edges: list[Edge],
    root_grads: list[Tensor],
    keep_graph: bool,
    create_graph: bool,
    accumulate_grad: bool,
    outputs: list[Edge],
) -> list[Tensor | None]:
    """``engine.execute``, compiled: the same arguments, effects and return value (NOTE [Compiled backward])."""
    args = (root_edges, root_grads, keep_graph, create_graph, accumulate_grad, outputs)
    if _state.tracing:
        raise _NotTraceable("it runs a backward of its own (a reentrant backward)", "reentrant backward")
    if ANOMALY.enabled:
        return _fallback(_NotTraceable("anomaly mode is on", "anomaly mode"), args)
    if registry.on_record is None:
        registry.on_record = _record_fragment
    root_nr = root_edges[0].input_nr if len(root_edges) == 1 else -1
    structure = None
    if not outputs:
        root = root_edges[0].node if len(root_edges) == 1 else GraphRoot(tuple(root_edges), root_grads)
        structure = _walk_structure(root, create_graph, root_nr)  # type: ignore[arg-type]
    cache_key = None
    if structure is not None:
        cache_key = _CacheKey(structure.key)
        program = _lookup(cache_key)
        if program is not None:
            graph_task = _hit_task(root_edges, root_grads, keep_graph, create_graph)
            start = time.perf_counter()
            if isinstance(program, _NotTraceable):
                return _fallback(program, args)
            _stats.add("hits")
            node_order, flat_order = program.hit_order
            walk = _Walk(
                structure.key, list(map(structure.nodes.__getitem__, node_order)),
                list(map(structure.flat.__getitem__, flat_order)), None,
            )
            return _run_and_record(program, walk, graph_task, root_grads, keep_graph, create_graph, 0, start, True)
        graph_task = engine.prepare(*args)[0]
        graph_root = root
    else:
        graph_task, graph_root, _ = engine.prepare(*args)
    start = time.perf_counter()
    try:
        walk = _walk(graph_task, graph_root, create_graph, accumulate_grad, len(outputs), root_nr)
    except _NotTraceable as exc:
        return _fallback(exc, args)
    if cache_key is None:
        cache_key = _CacheKey(walk.key)
        program = _lookup(cache_key)
    else:
        program = None
    hit = program is not None
    if not hit:
        compile_start = time.perf_counter()
        program = _compile(walk, root_grads)
        if structure is not None and not isinstance(program, _NotTraceable):
            program.hit_order = _hit_order(walk, structure)
        program = _insert(cache_key, program)
        walk.compile_seconds += time.perf_counter() - compile_start
    elif not isinstance(program, _NotTraceable):
        _stats.add("hits")
    if isinstance(program, _NotTraceable):
        return _fallback(program, args)
    n_captured = 0 if accumulate_grad else len(outputs)
    return _run_and_record(program, walk, graph_task, root_grads, keep_graph, create_graph, n_captured, start, hit)


def _run_and_record(program: _Program, walk: _Walk, graph_task: Any, root_grads: list[Tensor], keep_graph: bool,
                    create_graph: bool, n_captured: int, start: float, hit: bool) -> list[Tensor | None]:
    captured = _run(program, walk, graph_task, list(root_grads), keep_graph, create_graph, n_captured)
    if profiler.is_active():  # one span per compiled backward (the profiler's node timer never runs here)
        profiler.record(
            "CompiledBackward", start, time.perf_counter(), cache="hit" if hit else "miss", compile_seconds=walk.compile_seconds
        )
    return captured
