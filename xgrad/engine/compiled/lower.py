"""Lowering: a program's steps, and each node run by the eager engine's own code on traced or concrete values.

NOTE [Compiled backward], stage 3; ``Step`` and ``run_node`` say what each does, NOTE [Stand-in nodes] how.
"""

from __future__ import annotations

import contextlib
import functools
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.engine.compiled.key import HOOKS_FIELD, HOST, K_FUNC, KEYED, as_tensor, hashable_params, refill
from xgrad.engine.compiled.switch import TRACER_ERRORS, NotTraceable, state
from xgrad.engine.engine import call_function, call_post_hooks, call_pre_hooks, call_tensor_pre_hooks
from xgrad.engine.function import FunctionCtx, FunctionNode
from xgrad.engine.graph_task import InputBuffer
from xgrad.engine.node import NO_EDGE, AccumulateGrad, GraphRoot, InputMetadata, Node, current_task
from xgrad.engine.rules import RuleNode
from xgrad.grad_mode import _state as _grad_state
from xgrad.tensor import Tensor


def _traced_metadata(meta: tuple[Any, ...]) -> tuple[Any, ...]:
    """Input metadata without shardings: inside a program XLA places the values."""
    return tuple(None if m is None else InputMetadata(m.shape, m.dtype, None) for m in meta)


class Step:
    """One node of a program: what the program needs of it, none of the graph's values."""

    __slots__ = (
        "captures", "edges", "hooks", "host", "host_pre", "kind", "leaf", "leaf_sharding", "meta", "name", "pos",
        "runs", "saved_key", "targets",
    )

    def __init__(self, pos: int, node: Node, nkey: tuple[Any, ...], position: dict[Node, int]) -> None:
        self.pos = pos
        self.kind: int = nkey[0]
        self.name = node.name()
        self.meta = _traced_metadata(node.input_metadata)
        exec_key = nkey[-1]
        self.runs: bool = exec_key is None or exec_key[0]
        self.captures: tuple[tuple[int, int], ...] | None = None if exec_key is None else exec_key[1]
        hooks_field = HOOKS_FIELD.get(self.kind)
        # (pre, post): each a group of pure hooks, ``HOST`` or ``None``
        self.hooks = pre, post = (None if hooks_field is None else nkey[hooks_field]) or (None, None)
        # On the host: post hooks not all pure, a Function's backward (NOTE [Functions on the
        # host]), a primitive that moves values between devices, a captured node's hooks.
        # Pre-hooks not all pure run there alone (``host_pre``), the rest of the node traced.
        self.host = post is HOST or (pre is HOST and not self.runs) or self.runs and (
            (isinstance(node, RuleNode) and node.prim.host_only) or (self.kind == K_FUNC and nkey[3] is HOST)
        )
        self.host_pre = pre is HOST and not self.host
        self.saved_key: tuple[Any, ...] = nkey[4] if self.kind == K_FUNC else ()  # a traced Function's: which saved tensors require grad
        # A leaf accumulated in the program: its new ``.grad`` is an output, at its position; on several devices
        # (``leaf_sharding``) it takes its leaf's sharding.
        self.leaf = self.runs and not self.host and isinstance(node, AccumulateGrad)
        sharding = node.input_metadata[0].sharding if self.leaf else None
        spread = isinstance(sharding, jax.sharding.NamedSharding) and len(sharding.device_set) > 1
        self.leaf_sharding = sharding if spread else None
        # (position, input_nr, that node's number of inputs) per edge it sends a grad on, ``None`` where it leads out
        self.targets: list[tuple[int, int, int] | None] = []
        if self.runs:
            self.targets = [
                None if n is None or n not in position else (position[n], nr, len(n.input_metadata)) for n, nr in node.next_edges
            ]
        self.edges = tuple(None if n is None else (n.name(), _traced_metadata(n.input_metadata)[nr]) for n, nr in node.next_edges)


class Values:
    """A run of steps' grads in flight (``buffers``; ``live``: those a segment or host step before gave back), what
    traced steps read besides them (the root grads, the leaves' old ``.grad``) and what a segment gives back."""

    __slots__ = ("buffers", "captures", "grads", "old", "retained", "roots")

    def __init__(self, live: dict[int, list[Any]], roots: list[Tensor] | None = None,
                 old: dict[int, Tensor] | None = None) -> None:
        self.buffers: dict[int, InputBuffer] = {}
        for pos, grads in live.items():
            buf = self.buffers[pos] = InputBuffer(0)
            buf.buffer = list(grads)
        self.roots = roots or []
        self.old = old or {}
        self.grads: dict[int, Tensor] = {}
        self.captures: dict[int, Tensor] = {}
        self.retained: dict[tuple[int, int], Tensor] = {}

    def live(self) -> dict[int, list[Any]]:
        """What flows on to the next segment, as a pytree with tensor (or ``None``) leaves."""
        return {pos: list(buf.buffer) for pos, buf in self.buffers.items()}


# NOTE [Stand-in nodes]
# A node runs in a program through eager's ``call_function`` on a copy of itself (the
# same class, hooks, edges and metadata) whose saved values are the program's inputs:
# a rule node's saved tensors, array params and saved outputs, a pure Function's
# ``ctx`` attributes and saved tensors, in the order the walk put them in the flat
# list. Traced, three things differ from eager's node: a leaf's new ``.grad``
# (``_TracedAccumulate``) and retained grads (``_record``) are program outputs, which
# the host writes, and the root grads are program inputs. A copy keeps its tensor
# pre-hooks itself (a leaf's taken from its tensor), so that a group of hooks that runs
# on the host (keyed ``HOST``) is taken off it. On the host a rule node runs on a copy
# with the walk's concrete values (its saved tensors were unpacked once, by the walk,
# in eager's order); Functions and leaves run as themselves. Two copies change
# ``apply`` (``_with_apply``): pre-hooks that are not pure run alone on the host
# through ``call_function`` on a copy that passes its grads on, its edges leading
# nowhere (the node then runs traced, without them); and before a program first runs,
# each host step runs traced on a copy that gives zeros, for the shapes of what it
# sends on and to trace its pure hooks once.


class _Given:
    """A saved value already unpacked: a stand-in's saved outputs (``PrimitiveNode.apply`` unpacks them) or a
    Function's saved tensors (``ctx.saved_tensors`` unpacks them)."""

    __slots__ = ("value",)

    def __init__(self, value: Tensor) -> None:
        self.value = value

    def unpack(self, node: Node) -> Tensor:
        return self.value


class _TracedAccumulate(AccumulateGrad):
    """A leaf's ``AccumulateGrad`` in a program: the new ``.grad`` is an output, written by the host."""

    __slots__ = ("step", "values")

    step: Step
    values: Values  # the leaf's old ``.grad`` in, its new one out

    tensor_pre_hooks = Node.tensor_pre_hooks  # those set on it, not its leaf's (NOTE [Stand-in nodes])

    def apply(self, grads: list[Tensor | None]) -> list[Tensor | None]:
        new = grads[0]
        if new is not None:
            old = self.values.old.get(self.step.pos)
            value = new._array if old is None else old._array + new._array
            if self.step.leaf_sharding is not None:
                value = jax.lax.with_sharding_constraint(value, self.step.leaf_sharding)
            self.values.grads[self.step.pos] = Tensor(value)
        return []


_FIELDS: dict[type[Node], tuple[str, ...]] = {}  # per node class, its slots


def _fields(cls: type[Node]) -> tuple[str, ...]:
    fields = _FIELDS.get(cls)
    if fields is None:
        slots = (name for klass in cls.__mro__ for name in klass.__dict__.get("__slots__", ()))
        fields = _FIELDS[cls] = tuple(name for name in slots if name != "__weakref__")
    return fields


def _copy(node: Node, cls: type[Node] | None = None) -> Any:
    """A new ``cls`` (``node``'s own class by default) with ``node``'s fields; no constructor runs."""
    new = (cls or type(node)).__new__(cls or type(node))
    for name in _fields(type(node)):
        if hasattr(node, name):
            setattr(new, name, getattr(node, name))
    return new


def _rule_stand_in(node: RuleNode, args: Iterator[Any]) -> RuleNode:
    stand = _copy(node)
    stand.saved = tuple(refill(s, args, saved=True) for s in node.saved)
    if node.saved_out is not None:
        stand.saved_out = tuple(_Given(as_tensor(next(args))) for _ in node.saved_out)
    if hashable_params(node.params) is None:  # keyed by ``freeze``, its arrays in the flat list after the saved values
        stand.params = refill(node.params, args)
    return stand  # type: ignore[no-any-return]


def _function_stand_in(node: FunctionNode, saved_key: tuple[Any, ...], args: Iterator[Any]) -> FunctionNode:
    stand = _copy(node)
    ctx = stand.ctx = FunctionCtx()
    ctx._node = stand
    ctx.needs_input_grad = node.ctx.needs_input_grad
    ctx.materialize_grads = node.ctx.materialize_grads
    for attr, value in node.ctx.__dict__.items():
        if attr not in ctx.__dict__:
            setattr(ctx, attr, refill(value, args))
    # The saved key holds shape, dtype and requires_grad per saved tensor, one entry per ``None``.
    stand.saved = []
    i = 0
    for s in node.saved or ():
        stand.saved.append(None if s is None else _Given(Tensor(next(args), requires_grad=saved_key[i + 2])))
        i += 1 if s is None else 3
    return stand  # type: ignore[no-any-return]


def _zeros_for_edges(self: Node, grads: list[Tensor | None]) -> list[Tensor | None]:
    return [None if n is None else Tensor(jnp.zeros(n.input_metadata[nr].shape, n.input_metadata[nr].dtype)) for n, nr in self.next_edges]


def _grads_as_they_are(self: Node, grads: list[Tensor | None]) -> list[Tensor | None]:
    return grads


_WITH_APPLY: dict[tuple[type[Node], Callable[..., Any]], type[Node]] = {}


def _with_apply(cls: type[Node], apply: Callable[[Node, list[Tensor | None]], list[Tensor | None]]) -> type[Node]:
    """``cls`` with another ``apply`` (NOTE [Stand-in nodes]), its tensor pre-hooks those set on it."""
    made = _WITH_APPLY.get((cls, apply))
    if made is None:
        attrs = {"__slots__": (), "apply": apply, "tensor_pre_hooks": Node.tensor_pre_hooks}
        made = _WITH_APPLY[(cls, apply)] = type(f"{cls.__name__}{apply.__name__.title()}", (cls,), attrs)
    return made


def _record(into: dict[tuple[int, int], Tensor], at: tuple[int, int], grad: Tensor | None) -> None:
    """A traced retains-grad hook: the grad becomes a program output, for the host to retain."""
    if grad is not None:
        into[at] = grad


# Where a node keeps the hooks run before and after its rule (NOTE [Hooks in the key]).
_BEFORE_SLOTS, _AFTER_SLOTS = (tuple(kind.node_slot for kind in kinds if kind.node_slot is not None) for kinds in KEYED)


def _traced_stand_in(node: Node, step: Step, values: Values, args: Iterator[Any] | None) -> Node:
    """What runs in ``node``'s place in a program (NOTE [Stand-in nodes]); ``args``: its flat values, ``None`` for a
    host step traced for the shapes of what it sends on and for its pure hooks."""
    stand: Any
    if args is None:
        stand = _copy(node, _with_apply(type(node), _zeros_for_edges))
    elif not step.runs:  # captured only: its hooks run, its saved values are not read
        stand = _copy(node)
    elif isinstance(node, RuleNode):
        stand = _rule_stand_in(node, args)
    elif isinstance(node, FunctionNode):
        stand = _function_stand_in(node, step.saved_key, args)
    elif isinstance(node, AccumulateGrad):
        stand = _copy(node, _TracedAccumulate)
        stand.step, stand.values = step, values
    else:
        stand = _copy(node)
        if isinstance(node, GraphRoot):
            stand.outputs = values.roots
    stand.input_metadata = step.meta
    stand._tensor_pre_hooks = node.tensor_pre_hooks()
    for hooks, slots in zip(step.hooks, (_BEFORE_SLOTS, _AFTER_SLOTS), strict=True):
        if hooks is HOST:  # they run on the host, not with it
            for slot in slots:
                setattr(stand, slot, None)
    retains = stand._retains_grad_hooks
    if retains:
        stand._retains_grad_hooks = {nr: functools.partial(_record, values.retained, (step.pos, nr)) for nr in retains}
    return stand  # type: ignore[no-any-return]


def run_node(step: Step, node: Node, values: Values) -> None:
    """Run ``node`` (NOTE [Stand-in nodes]) as ``engine.evaluate_function`` does, and route its grads."""
    buf = values.buffers.pop(step.pos, None)
    inputs = [None] * len(step.meta) if buf is None else buf.buffer
    if not step.runs:  # captured only: eager runs its tensor pre-hooks and stops there
        inputs = call_tensor_pre_hooks(node, list(inputs))
    if not step.host_pre:  # else captured before its pre-hooks, on the host
        _capture(step, inputs, values)
    if not step.runs:
        return
    buffers = values.buffers  # its grads summed into the next nodes' buffers, in arrival order, as eager sums them
    for out, target in zip(call_function(current_task.graph_task, node, inputs), step.targets, strict=True):  # type: ignore[arg-type]
        if target is not None:
            buf = buffers.get(target[0])
            if buf is None:
                buf = buffers[target[0]] = InputBuffer(target[2])
            buf.add(target[1], out)


def _capture(step: Step, inputs: list[Any], values: Values) -> None:
    for input_idx, output_idx in step.captures or ():
        if inputs[input_idx] is not None:
            values.captures[output_idx] = inputs[input_idx]


def run_on_host(step: Step, node: Node, values: Values, saved: list[Any]) -> None:
    """A host step: the whole node on concrete values (``saved``: its own), or only its pre-hooks (``Step.host_pre``)."""
    if not step.host_pre:
        run_node(step, _rule_stand_in(node, iter(saved)) if step.runs and isinstance(node, RuleNode) else node, values)
        return
    buf = values.buffers[step.pos]
    _capture(step, buf.buffer, values)
    hooks = _copy(node, _with_apply(type(node), _grads_as_they_are))
    hooks._tensor_pre_hooks = node.tensor_pre_hooks()
    hooks.next_edges = (NO_EDGE,) * len(step.meta)  # its grads come back as they are
    for slot in _AFTER_SLOTS:  # they run with the rest of the node, not here
        setattr(hooks, slot, None)
    buf.buffer = call_function(current_task.graph_task, hooks, buf.buffer)


_HOOK_RUNNERS = frozenset(f.__code__ for f in (call_tensor_pre_hooks, call_pre_hooks, call_post_hooks))


def _in_hook(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside one of eager's hook runners."""
    return any(frame.f_code in _HOOK_RUNNERS for frame, _ in traceback.walk_tb(exc.__traceback__))


def trace_node(step: Step, node: Node, values: Values, args: Iterator[Any] | None) -> None:
    """``run_node`` on ``node``'s traced stand-in; what cannot be traced raises ``NotTraceable``, saying which hook or node."""
    try:
        run_node(step, _traced_stand_in(node, step, values, args), values)
    except TRACER_ERRORS as exc:
        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        if _in_hook(exc):
            raise NotTraceable(f"a hook marked pure_hook on {step.name} is not traceable ({detail})", "untraceable hook") from exc
        if isinstance(node, FunctionNode):
            raise NotTraceable(
                f"the backward of custom Function {node.function.__name__} is not traceable ({detail})", "untraceable Function"
            ) from exc
        raise NotTraceable(f"{step.name} is not traceable ({detail})", "untraceable node") from exc
    except NotTraceable as exc:
        if isinstance(node, FunctionNode) and exc.kind == "reentrant backward" and not _in_hook(exc):
            raise NotTraceable(f"the backward of custom Function {node.function.__name__} {exc}", exc.kind) from exc
        raise


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    """While tracing: record no graph, and send nested backwards to ``execute`` (which refuses them)."""
    prev = (state.tracing, state.enabled, _grad_state.enabled)
    state.tracing, state.enabled, _grad_state.enabled = True, True, False
    try:
        yield
    finally:
        state.tracing, state.enabled, _grad_state.enabled = prev
