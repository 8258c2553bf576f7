"""Hooks, final callbacks and custom Function backwards of a traced step as ordered host callbacks.

NOTE [Whole-step compile] and NOTE [Functions in a compiled step] in ``__init__``.
"""

from __future__ import annotations

import copy
import functools
import logging
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.compile_step import recording
from xgrad.compile_step.errors import NotCompilable
from xgrad.compile_step.hook_purity import trace_in
from xgrad.compile_step.observers import HookBox, HostGraphTask, Observer, call_in_backward
from xgrad.engine.compiled.cache import call_site
from xgrad.engine.compiled.key import traced_function
from xgrad.engine.compiled.switch import HostHook, PureHook
from xgrad.engine.function import UNPACK_ON_ACCESS, FunctionCtx, FunctionNode
from xgrad.engine.graph_task import run_final_callbacks
from xgrad.engine.host_call import call_on_host, hook_on_host, swapped_state
from xgrad.engine.node import ERR_POST_ACCUMULATE_RESULT, Edge, InputMetadata, current_task
from xgrad.engine.saved import SavedTensor
from xgrad.engine.validate import validate_outputs
from xgrad.grad_mode import is_grad_enabled, no_grad
from xgrad.nn.hooks import BackwardHook
from xgrad.reach import from_library, nested_codes, reached
from xgrad.step_trace import array_of
from xgrad.tensor import Tensor, is_tensor
from xgrad.tensor.hook_kinds import RETURNS_NONE

ERR_NO_GRAD_FROM_HOST = (
    "under xgrad.compile, {name} returned None as the gradient of input {i}, which requires grad: its backward runs "
    "on the host at every call, in a program whose gradients were laid out when it was traced. Return zeros instead, "
    "mark the backward xgrad.autograd.compiled.pure_hook if it is traceable, or run this step eagerly"
)
FALLBACK_CREATE_GRAPH = (
    "the backward of {name} runs under create_graph=True, and its graph must be recorded, which a host call cannot do "
    "(mark it xgrad.autograd.compiled.pure_hook if it is traceable)"
)
ERR_STATE_FROM_HOST = (
    "under xgrad.compile, the backward of {name} changed the storage or .grad of a tensor the step uses (shape {shape}), "
    "as a backward of its own does when it accumulates into parameters: it runs on the host, where the step's state "
    "cannot change. Mark it xgrad.autograd.compiled.pure_hook if it is traceable, or run this step eagerly"
)
_CTX_OWN = frozenset(vars(FunctionCtx()))  # what autograd keeps on a ctx; the rest is the Function's
_NOT_FOLLOWED = (Tensor, logging.Logger)  # by ``_reaches_state``: a logger holds no tensor


def hook_in_step(fn: Any, hooks: Any) -> Any:
    """``fn`` (a hook of ``hooks``) as called inside a traced step: traced in if it is pure, else through an ordered
    host call.

    Marked ``pure_hook``: traced in; marked ``host_hook``: on the host; neither: traced in
    when it touches no Python state (NOTE [Hooks traced in] in ``hook_purity.py``). On the
    host, ``hooks``'s kind says what its result means (NOTE [Hook kinds]): one that
    replaces gradients goes through ``hook_on_host``, one that returns ``None`` runs on
    the real tensor (``_returning_none_on_host``).
    """
    if isinstance(fn, tuple):  # a tensor hook: (input_nr, hook)
        return (fn[0], hook_in_step(fn[1], hooks))
    if isinstance(fn, PureHook):
        return fn
    returns_none = hooks.kind.convention is RETURNS_NONE

    def call(*args: Any) -> Any:
        rec = recording.current()
        module_hooks = getattr(fn, "__self__", None)
        if not isinstance(module_hooks, BackwardHook):
            module_hooks = None
        # Hooks that share state on the host follow an earlier one there: a module call's backward hooks
        # its pre-hooks (the grad_output they keep), a tensor's hooks that return None each other (the check
        # that none returned a value, made after the last).
        group = id(module_hooks) if module_hooks is not None else id(hooks) if returns_none else None
        on_host = isinstance(fn, HostHook) or group in rec.hosted_groups
        kept_grad_outputs = None if module_hooks is None else module_hooks.grad_outputs  # before a trial resets it
        if not on_host:
            traced, result = trace_in(rec, fn, args, returns_none)
            if traced:
                return result
        host_fn = fn
        if module_hooks is not None and fn.__func__ is BackwardHook._input_hook and group not in rec.hosted_groups:
            # After traced-in pre-hooks: the grad_output they made goes to the host along.
            host_fn = functools.partial(_module_hooks_on_host, module_hooks)
            args = (args[0], kept_grad_outputs)
        graph_task = _host_graph_task()
        if returns_none:
            return _returning_none_on_host(host_fn, args[0], graph_task, hooks)
        if group is not None:
            rec.hosted_groups[group] = [False]
        return _replacing_hook_on_host(host_fn, args, graph_task)

    return call


def _module_hooks_on_host(module_hooks: BackwardHook, grad_inputs: Any, grad_outputs: Any) -> Any:
    """A module's backward hooks on the host, given the ``grad_output`` its traced-in pre-hooks made."""
    module_hooks.grad_outputs = grad_outputs
    return module_hooks._input_hook(grad_inputs, None)


def _replacing_hook_on_host(fn: Any, args: tuple[Any, ...], graph_task: Any) -> Any:
    """A hook whose non-``None`` result replaces its first argument (tensor, pre and post hooks)."""
    rec = recording.current()
    if rec.observing:  # the observer variant: the hook runs after the program (NOTE [Observer hooks])
        leaves, tree = jax.tree_util.tree_flatten(args, is_leaf=is_tensor)
        arrays = [leaf._array for leaf in leaves]
        outputs = [rec.output(a) for a in arrays]
        k = len(rec.observers)
        ops = rec.learned[k] if k < len(rec.learned) else None
        planned = ops.trace(arrays, rec.output) if ops is not None and ops.fn is fn else None
        rec.observers.append(Observer(fn, tree, outputs, graph_task is not None, planned))
        return None
    rec.hook_calls += 1
    if rec.hook_box is None:
        rec.hook_box = HookBox()
    call = functools.partial(rec.hook_box.call, graph_task)
    # What eager's hook would see at this point: the state's .grads (a retained one included) and the arrays the
    # step has rebound so far, and the tensors of the step the hook holds (through ``_reaches_state``'s walk).
    # A hook that reaches no tensor and never names ``grad`` reads none of it: it gets none (each costs a copy).
    state = []
    may_read, held = _reaches_state(fn)
    if may_read:
        owners = _state_owners()
        state = [(t, *_traced_state(t, rec)) for t in owners]
        known = {id(t) for t in owners}
        state += [(t, t._array, _grad_array(t)) for t in held if id(t) not in known]
    return _on_host(graph_task, hook_on_host, fn, args, call=call, state=state)


def _reaches_state(fn: Any) -> tuple[bool, list[Tensor]]:
    """Whether ``fn`` may read a tensor's value or ``.grad`` beyond its arguments, and the tensors made in the step
    (their arrays traced) that it holds (NOTE [What a function reaches]: four steps deep, objects' attributes and
    containers of 16 items or fewer followed). It may read one when its code or that of a function it reaches names
    ``grad``, or it reaches a tensor, or a value the walk does not follow (a callable that is not Python code, an
    object with no ``__dict__``, one past the depth)."""
    may_read = False
    tensors = []
    for value, followed in reached(fn, 4, objects=True, max_items=16, stop=lambda v: isinstance(v, _NOT_FOLLOWED)):
        if isinstance(value, Tensor):
            may_read = True
            if _traced(value._array):
                tensors.append(value)
        elif not followed:
            may_read = may_read or not isinstance(value, logging.Logger)
        elif isinstance(value, types.FunctionType):
            may_read = may_read or any("grad" in c.co_names or "grad" in c.co_consts for c in nested_codes(value.__code__))
    return may_read, tensors


def _traced_state(t: Tensor, rec: Any) -> tuple[Any, Any]:
    """``t``'s traced array where the step has rebound it so far (else ``None``), and its ``.grad``'s (or ``None``)."""
    snap = rec.snapshots.get(id(t))
    return None if snap is not None and t._array is snap.start else t._array, _grad_array(t)


def _returning_none_on_host(fn: Any, var: Tensor, graph_task: Any, hooks: Any) -> None:
    """A hook that returns ``None`` (a post-accumulate-grad hook): run on the real leaf with concrete values; what it
    rebinds flows on.

    As eagerly (``run_post_accumulate_grad_hooks``), every hook of ``var`` runs, then the
    last one raises if any returned a value: the hooks of one run share a flag on the host.
    """
    rec = recording.current()
    # The first of them on the host (those before it were traced in, returning None) resets the flag.
    first = id(hooks) not in rec.hosted_groups
    last = fn is list(hooks.values())[-1]
    returned = rec.hosted_groups.setdefault(id(hooks), [False])

    def call() -> None:
        if first:
            returned[0] = False
        if call_in_backward(graph_task, fn, var) is not None:
            returned[0] = True
        if last and returned[0]:
            raise RuntimeError(ERR_POST_ACCUMULATE_RESULT)

    state_on_host(call, [var], reports=graph_task, who=f"hook {fn!r}")


def state_on_host(
    call: Callable[[], None], tensors: list[Tensor], only_changed: bool = False, reports: Any = None, when: Any = None,
    who: str = "a final callback",
) -> None:
    """Run ``call()`` on the host at this point of the program, ``tensors`` showing their values and ``.grad``s then.

    The real tensors hold these concrete values while ``call`` runs; what it rebinds
    (an array or a ``.grad``) flows on in the program (``hook_on_host``'s ``state``).
    With ``only_changed``, an array the step has not rebound so far stays on the device:
    the real tensor holds that value already, and ``call`` must leave it alone.
    ``reports``: as for ``_on_host``; ``when``: a traced flag, the call is made only if it
    is set; ``who``: what the errors call ``call``.
    """
    rec = recording.current()
    state = [(t, *_traced_state(t, rec)) if only_changed else (t, t._array, _grad_array(t)) for t in tensors]
    # ``hook_on_host`` for its ``state``: ``call`` is a hook given one empty argument, nothing to replace. Its check
    # holds the state as the call leaves it: its values from before if it raised (``hook_on_host`` gives them back),
    # so the arrays from before the call are not outputs of the program too (each would be a copy).
    _on_host(reports, hook_on_host, lambda _: call(), ((),), state=state, who=who, when=when)


def _grad_array(t: Tensor) -> Any:
    return None if t._grad is None else t._grad._array


def function_on_host(node: FunctionNode, grads: list[Any]) -> list[Any] | None:
    """``node``'s backward on ``grads`` as an ordered host call of the program (NOTE [Functions in a compiled step]).

    ``None`` for a backward the step traces in: one marked ``pure_hook`` or one of xgrad's own.
    """
    function = node.function
    if function._traced_in_step or traced_function(function):
        return None
    if is_grad_enabled():  # create_graph: the engine runs backwards in grad mode only then
        raise NotCompilable(FALLBACK_CREATE_GRAPH.format(name=node.name()), call_site())
    if node.saved is None:
        node.unpack_saved()  # eager's error for a freed graph
    call = _FunctionOnHost(node, grads)
    shapes = [jax.ShapeDtypeStruct(m.shape, m.dtype) for m in call.into if m is not None]
    outs = iter(_on_host(call.graph_task, call_on_host, call.run, call.arrays, shapes))
    return [None if m is None else Tensor(next(outs)) for m in call.into]


class _FunctionOnHost:
    """A Function's backward run on the host: what it takes from the trace, and its run there (the node itself, as
    NOTE [Functions in a compiled step] says)."""

    __slots__ = ("arrays", "attr_names", "attrs", "edges", "graph_task", "has_grad", "into", "node", "saved", "state",
                 "swapped")

    def __init__(self, node: FunctionNode, grads: list[Any]) -> None:
        self.node = node
        self.saved = [None if s is None else _HostSaved(node, s) for s in node.saved or ()]
        attrs = {k: v for k, v in vars(node.ctx).items() if k not in _CTX_OWN}
        self.attr_names = tuple(attrs)
        self.attrs = _TracedLeaves(attrs)
        saved = [h for h in self.saved if h is not None]
        # Tensors that hold a traced value now: the call's concrete value stands in while the node runs.
        held = {id(t): t for t in [*(t for h in saved for t in h.tensors), *self.attrs.tensors]}
        self.swapped = list(held.values())
        self.has_grad = [g is not None for g in grads]
        self.arrays = [*(t._array for t in self.swapped), *(a for h in saved for a in h.arrays()), *self.attrs.arrays,
                       *(array_of(g) for g in grads if g is not None)]
        # Where each gradient goes: the metadata its value must fit (``None``: nowhere, dropped as eager drops it).
        self.into = [None if n is None else InputMetadata(*n.input_metadata[nr][:2], None) for n, nr in node.next_edges]
        # ``validate_outputs`` reads only the metadata of the node a gradient flows into: a stand-in holds it.
        self.edges = [Edge(None if m is None else types.SimpleNamespace(input_metadata=(m,)), 0)  # type: ignore[arg-type]
                      for m in self.into]
        self.graph_task = _host_graph_task()
        self.state = [weakref.ref(t) for t in _state_owners() if id(t) not in held]

    def run(self, *concrete: Any) -> list[Any]:
        """On the host: the node's backward on the call's values; the arrays of the gradients that flow on."""
        values = iter(concrete)
        held = [(next(values), None) for _ in self.swapped]
        copies = [None if h is None else h.copy(values) for h in self.saved]
        attrs = self.attrs.rebuilt(values)
        grads = [Tensor(next(values)) if has else None for has in self.has_grad]
        state = [t for t in (ref() for ref in self.state) if t is not None]
        with swapped_state([*self.swapped, *state], [*held, *(None for _ in state)]) as changed:
            results = self._compute(copies, attrs, grads)
        name = self.node.name()
        if changed:
            raise RuntimeError(ERR_STATE_FROM_HOST.format(name=name, shape=list(changed[0].shape)))
        validate_outputs(self.edges, results, name)
        pairs = list(zip(results, self.into, strict=True))
        missing = next((i for i, (g, m) in enumerate(pairs) if g is None and m is not None), None)
        if missing is not None:
            raise RuntimeError(ERR_NO_GRAD_FROM_HOST.format(name=name, i=missing))
        return [g._array for g, m in pairs if m is not None]

    def _compute(self, copies: list[SavedTensor | None], attrs: Any, grads: list[Tensor | None]) -> list[Any]:
        """The node's ``compute`` with ``copies`` as its saved tensors and ``attrs`` on its ctx; both its own after."""
        node = self.node
        ctx = node.ctx
        own_saved, own_node, own_attrs = node.saved, ctx._node, {k: getattr(ctx, k) for k in self.attr_names}
        node.saved, ctx._node = copies, node  # the engine's ctx reaches its saved tensors through its node
        if attrs is not None:
            vars(ctx).update(attrs)
        try:
            with no_grad():  # as the engine runs a backward without create_graph
                return call_in_backward(self.graph_task, node.compute, grads, UNPACK_ON_ACCESS)
        finally:
            node.saved, ctx._node = own_saved, own_node
            vars(ctx).update(own_attrs)


def _traced(value: Any) -> bool:
    return isinstance(value, jax.core.Tracer)


class _TracedLeaves:
    """A value a Function's backward reads (its ctx's attributes, a pack hook's result) whose leaves hold traced
    arrays: ``arrays``, the raw ones, a host call's arguments; ``tensors``, the Tensors holding one, swapped there."""

    __slots__ = ("arrays", "at", "leaves", "tensors", "tree")

    def __init__(self, value: Any) -> None:
        leaves, self.tree = jax.tree_util.tree_flatten(value, is_leaf=is_tensor)
        self.at = [i for i, leaf in enumerate(leaves) if _traced(leaf)]
        self.arrays = [leaves[i] for i in self.at]
        self.tensors = [leaf for leaf in leaves if isinstance(leaf, Tensor) and _traced(leaf._array)]
        self.leaves = [None if _traced(leaf) else leaf for leaf in leaves]  # the program keeps this: not the tracers

    def rebuilt(self, values: Iterator[Any]) -> Any:
        """On the host: the value with the call's arrays (taken from ``values``); ``None`` if none is traced."""
        if not self.at:
            return None
        leaves = list(self.leaves)
        for i in self.at:
            leaves[i] = next(values)
        return jax.tree_util.tree_unflatten(self.tree, leaves)


class _HostSaved:
    """One saved tensor of a Function run on the host: checked now, copied there with the call's values.

    ``tensors``: the tensors it reaches whose arrays are traced (an input saved as itself, a
    Tensor its pack hook returned), swapped on the host; ``value``: its own traced array (a
    saved output's), or ``None``; ``unpacked``: what a library's unpack hook gave when traced.
    """

    __slots__ = ("packed", "saved", "tensors", "unpacked", "value")

    def __init__(self, node: FunctionNode, saved: SavedTensor) -> None:
        original = saved.check_version(node)  # eager's check, made where eager unpacks: raised by the step
        self.saved = copy.copy(saved)  # as it is now: the traced backward releases the node's own
        self.tensors = [original] if original is not None and _traced(original._array) else []
        value = getattr(saved, "_array", None)  # slots a state does not use are unset
        self.value = value if _traced(value) else None
        hook = getattr(saved, "_unpack", None)
        # A library's unpack hook (a checkpoint's recomputation) reads the step's traced values: it is traced in
        # here, and on the host the copy hands out what it unpacked.
        self.unpacked = saved.unpack(node)._array if hook is not None and from_library(hook) else None
        self.packed = _TracedLeaves(None if self.unpacked is not None else getattr(saved, "_packed", None))
        self.tensors += self.packed.tensors

    def arrays(self) -> list[Any]:
        """The traced values ``copy`` takes on the host, in its order."""
        return [a for a in (self.value, self.unpacked) if a is not None] + self.packed.arrays

    def copy(self, values: Iterator[Any]) -> SavedTensor:
        """On the host: a copy holding this call's values, its version taken as the saved tensor's now.

        The step checked the version where eager would have; here only what changes during the call counts.
        """
        saved = copy.copy(self.saved)
        original = saved._current_tensor()
        if original is not None:
            saved._saved_version = original._version
        if self.value is not None:
            saved._array = next(values)
            if saved._state == "output":
                saved._state = "view_output"  # the value from ``_array``: the live output holds a tracer
        if self.unpacked is not None:
            unpacked = Tensor(next(values))
            saved._packed, saved._unpack = None, lambda _: unpacked
        packed = self.packed.rebuilt(values)
        if packed is not None:
            saved._packed = packed
        return saved


def _host_graph_task() -> HostGraphTask | None:
    """While tracing a backward: its host stand-in, whose callbacks run, on the host, when it ends."""
    graph_task = current_task.graph_task
    rec = recording.active()
    if graph_task is None or rec is None:
        return None
    key = id(graph_task)
    stand_in = rec.host_tasks.get(key)
    if stand_in is None:
        stand_in = rec.host_tasks[key] = HostGraphTask()

        def at_the_end() -> None:  # queued now, it runs where the traced backward runs its final callbacks
            del rec.host_tasks[key]  # the task is done: its id may come again
            _final_callbacks_on_host(stand_in)

        with graph_task.mutex:
            list.append(graph_task.final_callbacks, at_the_end)  # itself not a host call: not wrapped
    return stand_in


class TracedCallbacks(list):  # type: ignore[type-arg]
    """A traced backward's final callbacks: one queued while tracing runs on the host, once per call, in its place."""

    def append(self, callback: Callable[[], None]) -> None:
        def on_host() -> None:
            graph_task = HostGraphTask()
            graph_task.final_callbacks.append(callback)
            _run_final_callbacks(graph_task)

        super().append(lambda: state_on_host(on_host, _state_owners(), only_changed=True))


def _state_owners() -> list[Tensor]:
    """While tracing: the state tensors touched so far (a ``.grad`` comes with its owner)."""
    rec = recording.current()
    found = [(snap.ref(), snap.target) for snap in rec.snapshots.values()]
    return [t for t, target in found if t is not None and type(target) is not tuple]


def _final_callbacks_on_host(graph_task: HostGraphTask) -> None:
    """At the end of a traced backward: a host call that runs the callbacks its hooks queued during this call.

    They see the state's values at that point (``state_on_host``), as eager's do. The
    call is made only when a hook did queue one: each reports it (``_on_host``).
    """
    rec = recording.current()
    queued = rec.queued.pop(id(graph_task), None)
    if queued:
        rec.conditional_calls += 1
        when = jnp.stack(queued).any()
        state_on_host(lambda: _run_final_callbacks(graph_task), _state_owners(), only_changed=True, when=when)


def _run_final_callbacks(graph_task: HostGraphTask) -> None:
    """On the host: run ``graph_task``'s callbacks, as a backward's end does, and clear them for the next call."""
    try:
        run_final_callbacks(graph_task)
    finally:
        graph_task.final_callbacks.clear()


def _on_host(reports: HostGraphTask | None, host_call: Callable[..., tuple[Any, Any, Any]], *args: Any, **kwargs: Any) -> Any:
    """A host call of the step (NOTE [Host calls] in ``xgrad/engine/host_call.py``): ``host_call(*args, **kwargs)``
    (``call_on_host`` or ``hook_on_host``), given the step's ``skip``, ``errors`` and ``report``.

    It is skipped once a check traced before it failed: eager would have raised before
    reaching it (NOTE [Checks in a compiled step]). An exception it raises is kept and
    becomes a check of the program, so the call raises it, as eager would, with the state
    at this point. With ``reports`` (a ``HostGraphTask``), the call also says whether
    callbacks wait on it, a flag the end of the backward reads (``_final_callbacks_on_host``).
    Returns its results (what ``host_call`` returns first).
    """
    rec = recording.current()
    rec.host_calls += 1
    report = None if reports is None else functools.partial(bool, reports.final_callbacks)
    result, raised, reported = host_call(*args, **kwargs, skip=rec.failed_so_far(), errors=rec.host_errors, report=report)
    if reports is not None:
        rec.queued.setdefault(id(reports), []).append(reported)
    errors = rec.host_errors

    def kept(_: Any) -> BaseException:
        error = errors[0]
        errors.clear()  # one call raises one; the host calls after it were skipped
        return error

    if rec.check(raised, kept):
        rec.checks[-1].on_host = True
    return result
