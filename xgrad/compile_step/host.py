"""Hooks, final callbacks and custom Function backwards of a traced step as ordered host callbacks.

NOTE [Whole-step compile] and NOTE [Functions in a compiled step] in ``__init__``.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.compile_step import recording
from xgrad.compile_step.errors import NotCompilable
from xgrad.compile_step.hook_purity import nested_codes, trace_in
from xgrad.compile_step.observers import HookBox, HostGraphTask, Observer, call_in_backward
from xgrad.compile_step.recording import tracing
from xgrad.engine.compiled.cache import call_site
from xgrad.engine.compiled.key import traced_function
from xgrad.engine.function import UNPACK_ON_ACCESS, FunctionCtx, FunctionNode
from xgrad.engine.host_call import call_on_host, hook_on_host, swapped_state
from xgrad.engine.node import ERR_POST_ACCUMULATE_RESULT, Edge, InputMetadata, current_task
from xgrad.engine.saved import SavedTensor
from xgrad.engine.validate import validate_outputs
from xgrad.func_programs import LIBRARIES
from xgrad.grad_mode import is_grad_enabled, no_grad
from xgrad.nn.hooks import BackwardHook
from xgrad.step_trace import array_of
from xgrad.tensor import Tensor, is_tensor
from xgrad.tensor.hook_kinds import REPLACES_GRAD, RETURNS_NONE

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


def _struct(array: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(array.shape, array.dtype)


def hook_in_step(fn: Any, hooks: Any) -> Any:
    """``fn`` as called inside a traced step: traced in if it is pure, else through an ordered host call.

    Marked ``pure_hook``: traced in; marked ``host_hook``: on the host; neither: traced in
    when it touches no Python state (NOTE [Hooks traced in] in ``hook_purity.py``). On the
    host, ``hooks``'s kind says what its result means (NOTE [Hook kinds]): one that
    replaces gradients goes through ``hook_on_host``, one that returns ``None`` runs on
    the real tensor (``_returning_none_on_host``).
    """
    convention = hooks.kind.convention
    if convention is REPLACES_GRAD:  # kept as (input_nr, hook)
        return (fn[0], _in_step(fn[1], hooks, False))
    return _in_step(fn, hooks, convention is RETURNS_NONE)


def _in_step(fn: Any, hooks: Any, returns_none: bool) -> Any:
    from xgrad.autograd.compiled import HostHook, PureHook

    if isinstance(fn, PureHook) or not tracing():
        return fn

    def call(*args: Any) -> Any:
        rec = recording.active()
        assert rec is not None
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
        if group is not None:
            rec.hosted_groups.add(group)
        graph_task = _host_graph_task()
        if returns_none:
            return _returning_none_on_host(host_fn, args[0], graph_task, hooks)
        return _replacing_hook_on_host(host_fn, args, graph_task)

    return call


def _module_hooks_on_host(module_hooks: BackwardHook, grad_inputs: Any, grad_outputs: Any) -> Any:
    """A module's backward hooks on the host, given the ``grad_output`` its traced-in pre-hooks made."""
    module_hooks.grad_outputs = grad_outputs
    return module_hooks._input_hook(grad_inputs, None)


def _replacing_hook_on_host(fn: Any, args: tuple[Any, ...], graph_task: Any) -> Any:
    """A hook whose non-``None`` result replaces its first argument (tensor, pre and post hooks)."""
    rec = recording.active()
    assert rec is not None
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
    box = rec.hook_box

    def call(hook: Any, hook_args: tuple[Any, ...], arrays: list[Any]) -> Any:
        return box.call(graph_task, hook, hook_args, arrays)

    # What eager's hook would see at this point: the state's .grads (a retained one included) and the arrays the
    # step has rebound so far, and the tensors of the step the hook holds (in its closure or defaults).
    # A hook that reaches no tensor and never names ``grad`` reads none of it: it gets none (each costs a copy).
    state = []
    if _may_read_state(fn, 3):
        owners = _state_owners()
        state = [(t, *_traced_state(t, rec)) for t in owners]
        known = {id(t) for t in owners}
        state += [(t, t._array, None if t._grad is None else t._grad._array) for t in _held_step_tensors(fn, known)]
    return _on_host(lambda **kw: hook_on_host(fn, args, call=call, state=state, **kw), graph_task)[0]


def _may_read_state(fn: Any, depth: int) -> bool:
    """Whether ``fn`` may read a tensor's value or ``.grad`` beyond its arguments: it names ``grad``, or reaches
    (through its closure, defaults, the globals it names, the functions those are, ``depth`` deep) anything
    but plain values and functions that do not; a callable object may hold anything."""
    if isinstance(fn, functools.partial):
        return any(not _inert(v, depth) for v in (*fn.args, *fn.keywords.values())) or _may_read_state(fn.func, depth)
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    if not isinstance(fn, types.FunctionType) or depth == 0:
        return True
    codes = nested_codes(fn.__code__)
    if any("grad" in code.co_names or "grad" in code.co_consts for code in codes):
        return True
    held = [cell.cell_contents for cell in fn.__closure__ or () if cell.cell_contents is not None]
    held += [*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()]
    held += [fn.__globals__[name] for code in codes for name in code.co_names if name in fn.__globals__]
    return any(not _inert(v, depth) for v in held)


def _inert(value: Any, depth: int) -> bool:
    """Whether ``value`` leads to no tensor: a plain value, a class or module, a small container of such, a function
    that reads no state."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, type, types.ModuleType,
                                           types.BuiltinFunctionType, logging.Logger)):
        return True
    if isinstance(value, (types.FunctionType, types.MethodType, functools.partial)):
        return not _may_read_state(value, depth - 1)
    if isinstance(value, (list, tuple, set, frozenset, dict)) and len(value) <= 16:
        items = [v for pair in value.items() for v in pair] if isinstance(value, dict) else list(value)
        return all(_inert(v, depth - 1) for v in items) if depth > 0 else not items
    return False


def _held_step_tensors(fn: Any, known: set[int], depth: int = 3) -> list[Tensor]:
    """The tensors made in the step (their arrays traced) that ``fn`` holds in its closure or defaults, or the
    functions there hold, ``depth`` functions deep; once each."""
    fn = inspect.unwrap(fn.func if isinstance(fn, functools.partial) else getattr(fn, "__func__", fn))
    if not isinstance(fn, types.FunctionType) or depth == 0:
        return []
    held = [cell.cell_contents for cell in fn.__closure__ or () if cell.cell_contents is not None]
    held += [*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()]
    found = []
    for value in held:
        if isinstance(value, Tensor):
            if id(value) not in known and _traced(value._array):
                known.add(id(value))
                found.append(value)
        elif callable(value):
            found += _held_step_tensors(value, known, depth - 1)
    return found


def _traced_state(t: Tensor, rec: Any) -> tuple[Any, Any]:
    """``t``'s traced array where the step has rebound it so far (else ``None``), and its ``.grad``'s (or ``None``)."""
    snap = rec.snapshots.get(id(t))
    array = None if snap is not None and t._array is snap.start else t._array
    return array, None if t._grad is None else t._grad._array


def _returning_none_on_host(fn: Any, var: Tensor, graph_task: Any, hooks: Any) -> None:
    """A hook that returns ``None`` (a post-accumulate-grad hook): run on the real leaf with concrete values; what it
    rebinds flows on.

    As eagerly (``run_post_accumulate_grad_hooks``), every hook of ``var`` runs, then the
    last one raises if any returned a value: the hooks of one run share a flag on the host.
    """
    rec = recording.active()
    assert rec is not None
    # The first of them on the host (those before it were traced in, returning None) resets the flag.
    first = id(hooks) not in rec.post_accumulate_returned
    last = fn is list(hooks.values())[-1]
    returned = rec.post_accumulate_returned.setdefault(id(hooks), [False])

    def call() -> None:
        if first:
            returned[0] = False
        if call_in_backward(graph_task, fn, var) is not None:
            returned[0] = True
        if last and returned[0]:
            raise RuntimeError(ERR_POST_ACCUMULATE_RESULT)

    state_on_host(call, [var], reports=graph_task)


def state_on_host(
    call: Callable[[], Any], tensors: list[Tensor], only_changed: bool = False, reports: Any = None, when: Any = None
) -> None:
    """Run ``call()`` on the host at this point of the program, ``tensors`` showing their values and ``.grad``s then.

    The real tensors hold these concrete values while ``call`` runs; what it rebinds
    (an array or a ``.grad``) flows on in the program. With ``only_changed``, an array
    the step has not rebound so far stays on the device: the real tensor holds that
    value already, and ``call`` must leave it alone. ``reports``: as for ``_on_host``;
    ``when``: a traced flag, the call is made only if it is set.
    """
    rec = recording.active()
    assert rec is not None
    slots = []  # (tensor, whether its array goes to the host, whether it has a .grad)
    arrays = []
    for t in tensors:
        array, grad = t._array, t._grad
        snap = rec.snapshots.get(id(t))
        sent = not only_changed or snap is None or array is not snap.start
        slots.append((t, sent, grad is not None))
        if sent:
            arrays.append(array)
        if grad is not None:
            arrays.append(grad._array)
    shapes = [_struct(a) for a in arrays]

    def host(*concrete: Any) -> Any:
        values = iter(concrete)
        held = [(next(values) if sent else t._array, next(values) if has_grad else None) for t, sent, has_grad in slots]
        new = []
        with swapped_state([t for t, _, _ in slots], held):
            call()
            for (t, sent, has_grad), (before, _) in zip(slots, held, strict=True):
                array, grad = t._array, t._grad
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
        return [n if n.dtype == c.dtype else n.astype(c.dtype) for n, c in zip(new, concrete, strict=True)]

    def made(**kw: Any) -> Any:
        return call_on_host(host, arrays, shapes, unchanged=_same, **kw)

    if when is None:
        values, flag = _on_host(made, reports, register=False)
    else:  # the call's flag leaves the ``cond`` as an output: checks are registered at the step's own level
        def taken(_: Any) -> Any:
            outs, raised = _on_host(made, reports, register=False)
            return (*outs, raised)

        *values, flag = jax.lax.cond(when, taken, lambda arrays: (*arrays, jnp.bool_(False)), arrays)
    outs = iter(values)
    for t, sent, has_grad in slots:
        if sent:
            t._array = next(outs)
        if has_grad:
            t._grad = Tensor(next(outs))
    # Its check holds the state as the call leaves it: its values from before if it raised (``_same``), so the
    # arrays from before the call are not outputs of the program too (each would be one more copy).
    _host_raised(flag)


def _same(*concrete: Any) -> tuple[Any, ...]:
    return concrete


class _Into:
    """Stands in for the node a Function's gradient flows into: its input's metadata, all ``validate_outputs`` reads."""

    __slots__ = ("input_metadata",)

    def __init__(self, meta: InputMetadata) -> None:
        self.input_metadata = (meta,)


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
    outs = iter(_on_host(lambda **kw: call_on_host(call.run, call.arrays, shapes, **kw), call.graph_task)[0])
    return [None if m is None else Tensor(next(outs)) for m in call.into]


class _FunctionOnHost:
    """A Function's backward run on the host: what it takes from the trace, and its run there.

    The node itself runs, as the engine runs it: ``ctx.saved_tensors`` unpacks at each access
    (unpack hooks, version checks, the unpacked tensors' place in the graph) from copies of
    its saved tensors; they, the tensors they reach and the ctx's own tensors hold the call's
    values while it runs.
    """

    __slots__ = ("arrays", "attr_leaves", "attr_names", "attr_tree", "edges", "graph_task", "has_grad", "into", "node",
                 "saved", "state", "swapped", "traced_attrs")

    def __init__(self, node: FunctionNode, grads: list[Any]) -> None:
        self.node = node
        self.saved = [None if s is None else _HostSaved(node, s) for s in node.saved or ()]
        attrs = {k: v for k, v in vars(node.ctx).items() if k not in _CTX_OWN}
        self.attr_names = tuple(attrs)
        leaves, self.attr_tree = jax.tree_util.tree_flatten(attrs, is_leaf=is_tensor)
        self.traced_attrs = [i for i, leaf in enumerate(leaves) if _traced(leaf)]
        saved = [h for h in self.saved if h is not None]
        # Tensors that hold a traced value now: the call's concrete value stands in while the node runs.
        held = {id(t): t for h in saved for t in h.tensors}
        held.update((id(leaf), leaf) for leaf in leaves if isinstance(leaf, Tensor) and _traced(leaf._array))
        self.swapped = list(held.values())
        traced_attrs = [array_of(leaves[i]) for i in self.traced_attrs]
        for i in self.traced_attrs:  # the program keeps ``run``: not the tracers
            leaves[i] = None
        self.attr_leaves = leaves
        self.has_grad = [g is not None for g in grads]
        self.arrays = [*(t._array for t in self.swapped), *_saved_arrays(saved), *traced_attrs, *_grad_arrays(grads)]
        # Where each gradient goes: the metadata its value must fit (``None``: nowhere, dropped as eager drops it).
        self.into = [None if n is None else InputMetadata(*n.input_metadata[nr][:2], None) for n, nr in node.next_edges]
        self.edges = _edges_into(self.into)
        self.graph_task = _host_graph_task()
        self.state = [weakref.ref(t) for t in _state_owners() if id(t) not in held]

    def run(self, *concrete: Any) -> list[Any]:
        """On the host: the node's backward on the call's values; the arrays of the gradients that flow on."""
        values = iter(concrete)
        held = [(next(values), None) for _ in self.swapped]
        copies = [None if h is None else h.copy(values) for h in self.saved]
        attrs = self._attrs(values)
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

    def _attrs(self, values: Iterator[Any]) -> Any:
        """The ctx's own attributes with the call's values, or ``None`` where none holds a traced one."""
        if not self.traced_attrs:
            return None
        leaves = list(self.attr_leaves)
        for i in self.traced_attrs:
            leaves[i] = next(values)
        return jax.tree_util.tree_unflatten(self.attr_tree, leaves)

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


def _saved_arrays(saved: list[_HostSaved]) -> list[Any]:
    return [a for h in saved for a in h.arrays()]


def _grad_arrays(grads: list[Any]) -> list[Any]:
    return [array_of(g) for g in grads if g is not None]


def _edges_into(into: list[InputMetadata | None]) -> list[Edge]:
    """Edges that ``validate_outputs`` checks gradients against: into ``into``'s metadata, or nowhere."""
    return [Edge(None if m is None else _Into(m), 0) for m in into]  # type: ignore[arg-type]


class _HostSaved:
    """One saved tensor of a Function run on the host: checked now, copied there with the call's values.

    ``tensors``: the tensors it reaches whose arrays are traced (an input saved as itself, a
    Tensor its pack hook returned), swapped on the host; ``value``: its own traced array (a
    saved output's), or ``None``; ``unpacked``: what a library's unpack hook gave when traced.
    """

    __slots__ = ("packed_tree", "saved", "tensors", "traced_packed", "unpacked", "value")

    def __init__(self, node: FunctionNode, saved: SavedTensor) -> None:
        original = saved.check_version(node)  # eager's check, made where eager unpacks: raised by the step
        self.saved = copy.copy(saved)  # as it is now: the traced backward releases the node's own
        self.tensors: list[Tensor] = []
        if original is not None and _traced(original._array):
            self.tensors.append(original)
        value = getattr(saved, "_array", None)  # slots a state does not use are unset
        self.unpacked = None
        hook = getattr(saved, "_unpack", None)
        if hook is not None and getattr(hook, "__module__", "").partition(".")[0] in LIBRARIES:
            # A library's unpack hook (a checkpoint's recomputation) reads the step's traced values: it is traced
            # in here, and on the host the copy hands out what it unpacked.
            self.unpacked = saved.unpack(node)._array
        self.value = value if _traced(value) else None
        packed = None if self.unpacked is not None else getattr(saved, "_packed", None)
        leaves, self.packed_tree = jax.tree_util.tree_flatten(packed, is_leaf=is_tensor)
        self.tensors += [leaf for leaf in leaves if isinstance(leaf, Tensor) and _traced(leaf._array)]
        self.traced_packed = [i for i, leaf in enumerate(leaves) if _traced(leaf)]

    def arrays(self) -> list[Any]:
        """The traced values ``copy`` takes on the host, in its order."""
        packed = jax.tree_util.tree_leaves(getattr(self.saved, "_packed", None), is_leaf=is_tensor)
        return [
            *(() if self.value is None else (self.value,)),
            *(() if self.unpacked is None else (self.unpacked,)),
            *(packed[i] for i in self.traced_packed),
        ]

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
        if self.traced_packed:
            leaves = jax.tree_util.tree_leaves(saved._packed, is_leaf=is_tensor)
            for i in self.traced_packed:
                leaves[i] = next(values)
            saved._packed = jax.tree_util.tree_unflatten(self.packed_tree, leaves)
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
    rec = recording.active()
    assert rec is not None
    owners = []
    for snap in rec.snapshots.values():
        t = snap.ref()
        if t is not None and type(snap.target) is not tuple:
            owners.append(t)
    return owners


def _final_callbacks_on_host(graph_task: HostGraphTask) -> None:
    """At the end of a traced backward: a host call that runs the callbacks its hooks queued during this call.

    They see the state's values at that point (``state_on_host``), as eager's do. The
    call is made only when a hook did queue one: each reports it (``_on_host``).
    """
    rec = recording.active()
    assert rec is not None
    queued = rec.queued.pop(id(graph_task), None)
    if queued:
        rec.conditional_calls += 1
        when = jnp.stack(queued).any()
        state_on_host(lambda: _run_final_callbacks(graph_task), _state_owners(), only_changed=True, when=when)


def _run_final_callbacks(graph_task: HostGraphTask) -> None:
    """On the host: run and clear ``graph_task``'s callbacks, as ``GraphTask.exec_post_processing`` does."""
    callbacks = graph_task.final_callbacks
    try:
        i = 0
        while i < len(callbacks):  # callbacks may queue more: index, do not iterate
            call_in_backward(graph_task, callbacks[i])
            i += 1
    finally:
        callbacks.clear()


def _on_host(made: Callable[..., Any], reports: HostGraphTask | None, register: bool = True) -> tuple[Any, Any]:
    """A host call of the step (NOTE [Host calls] in ``xgrad/engine/host_call.py``): ``made(**how)`` makes it.

    It is skipped once a check traced before it failed: eager would have raised before
    reaching it (NOTE [Checks in a compiled step]). An exception it raises is kept and
    becomes a check of the program, so the call raises it, as eager would, with the state
    at this point; unless ``register`` is false: the caller, inside a ``lax.cond``, gets
    the check's flag to register outside it (``_host_raised``). With ``reports`` (a
    ``HostGraphTask``), the call also says whether callbacks wait on it, a flag the end
    of the backward reads (``_final_callbacks_on_host``). Returns what ``made`` returns
    first, and the flag.
    """
    rec = recording.active()
    assert rec is not None
    rec.host_calls += 1
    report = None if reports is None else functools.partial(bool, reports.final_callbacks)
    result, raised, reported = made(skip=rec.failed_so_far(), errors=rec.host_errors, report=report)
    if reports is not None:
        rec.queued.setdefault(id(reports), []).append(reported)
    if register:
        _host_raised(raised)
    return result, raised


def _host_raised(flag: Any) -> None:
    """Make an exception raised in a host call (``flag``: whether one was) a check of the program."""
    rec = recording.active()
    assert rec is not None
    errors = rec.host_errors

    def kept(_: Any) -> BaseException:
        error = errors[0]
        errors.clear()  # one call raises one; the host calls after it were skipped
        return error

    if rec.check(flag, kept):
        rec.checks[-1].on_host = True
