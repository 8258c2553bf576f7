"""Recording the state a traced step touches (NOTE [Whole-step compile], 1, in ``__init__``)."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from xgrad import step_trace
from xgrad.compile_step.signature import GroupEntries
from xgrad.engine.node import _sequence
from xgrad.step_trace import StepTrace
from xgrad.tensor import Tensor


class Snapshot:
    """A tensor's autograd-visible state when a trace first touched it."""

    __slots__ = (
        "array", "grad", "grad_fn", "output_nr", "ref", "requires_grad", "retains_grad", "start", "target", "version",
    )

    def __init__(self, t: Tensor) -> None:
        self.ref = weakref.ref(t)
        # Where the tensor is found at a call (``resolve_target``): an argument's leaf index (a
        # new object each call), ``("grad", owner's target)``, or a weak reference.
        self.target: Any = self.ref
        self.array, self.grad, self.grad_fn, self.output_nr, self.version, self.requires_grad, self.retains_grad = (
            t._array, t._grad, t.grad_fn, t._output_nr, t._version, t._requires_grad, t._retains_grad)
        self.start = self.array  # what counts as unchanged (a tracer for an argument)

    def restore(self, t: Tensor) -> None:
        t._array, t._grad, t.grad_fn, t._output_nr, t._version, t._requires_grad, t._retains_grad = (
            self.array, self.grad, self.grad_fn, self.output_nr, self.version, self.requires_grad, self.retains_grad)


def _same_target(a: Any, b: Any) -> bool:
    """Whether two targets (``Snapshot.target``) name one tensor, without ``==`` on the tensors
    themselves (a weak reference compares its referents, and ``Tensor.__eq__`` is an op)."""
    if type(a) is weakref.ref or type(b) is weakref.ref:
        return type(a) is type(b) and a() is b()
    return bool(a == b)


class Recorder(StepTrace):
    """What one trace touched: snapshots, where concrete arrays came from, which ``.grad``s decided branches.

    The engine, the ops, the optimizer and ``Tensor`` report, through the step-trace
    seam, the tensors they are about to read or change (NOTE [Whole-step compile], 1).
    """

    def __init__(self) -> None:
        self.snapshots: dict[int, Snapshot] = {}
        self.sources: dict[int, list[Any]] = {}  # id(array) -> targets of the tensors holding it
        self.keep: list[Any] = []  # the arrays whose ids key ``sources`` stay alive
        self.grad_owner: dict[int, weakref.ref[Tensor]] = {}
        self.read_grads: set[int] = set()  # ``.grad`` read before this trace rebound it
        self.grad_written: set[int] = set()
        # Tensors made during the trace: never state, their arrays stay constants.
        # (By id: a WeakSet would compare tensors with ``==``, an op.)
        self.born: dict[int, weakref.ref[Tensor]] = {}
        self.trace: Any = None  # the step's own trace level (set once ``fn`` is called)
        self.input_device: Any = None  # the device of the step's first Tensor argument, if it has one
        self.outputs: list[Any] = []  # the program's outputs, each once (``output``)
        self.output_index: dict[int, int] = {}
        self.checks: list[Check] = []
        # Checks of an argument's own index values, done on the host before the program runs
        # (NOTE [Checks in a compiled step]): (leaf, size, message, negative, ignore, writes).
        self.host_checks: list[tuple[int, int, str, bool, int | None, list[Any]]] = []
        self.arg_leaves: dict[int, int] = {}  # id(an argument's tracer) -> its leaf
        self.host_calls = 0  # ordered host calls traced so far (hooks)
        self.hook_calls = 0  # of which hooks whose result replaces their argument (``host._replacing_hook_on_host``)
        self.conditional_calls = 0  # and final callbacks made only when a hook queued one
        self.hook_box: Any = None  # the hooks' ``HookBox`` (NOTE [Observer hooks])
        self.observing = False  # tracing the observer variant: hooks become outputs and ``observers``
        self.observers: list[Any] = []
        self.learned: list[Any] = []  # the ops each hook call ran last (NOTE [Hook ops in the program])
        # What the hooks traced in read, guards of the program (NOTE [Hooks traced in] in ``hook_purity.py``).
        self.hook_reads: list[tuple[Any, Any, Any]] = []
        # The optimizer's parameter-group entries read and set (NOTE [Param groups in a compiled step] in ``signature.py``).
        self.group_entries = GroupEntries()
        # id(a module call's ``BackwardHook``, or a leaf's post-accumulate hooks) of which a hook runs on the host:
        # the group's later hooks follow it there (``host.hook_in_step``); a leaf's share a flag there, set when one
        # returned a value in this run.
        self.hosted_groups: dict[int, list[bool]] = {}
        # Hooks added while tracing: (their dict, handle id, the user's line, whether the owner outlives the call).
        self.added_hooks: list[tuple[Any, int, str, bool]] = []
        self.first_sequence_nr = _sequence.next()  # nodes made by the trace number above it
        self.host_tasks: dict[int, Any] = {}  # id(a traced GraphTask still running) -> its stand-in
        self.queued: dict[int, list[Any]] = {}  # id(a stand-in) -> traced flags: callbacks wait on it
        # What host calls raised, kept until the call raises it again (NOTE [Checks in a compiled step]).
        self.host_errors: list[BaseException] = []
        # id(a module called or put in train/eval mode) -> (its weak reference, its mode before the trace).
        self.modes: dict[int, tuple[weakref.ref[Any], bool]] = {}
        # id(such a module) -> its attributes before the trace, and the contents of those that are dicts
        # (its buffers, children, hooks): a trace that raises restores them (``restore_modules``).
        self.module_attrs: dict[int, dict[str, tuple[Any, Any]]] = {}
        # Host effects (an LR scheduler's step): traced first as run after the program, each as (its call, its
        # arguments' tree and leaves, the Tensors among them as (leaf, output)); once the step reads or
        # writes the state they rebind after them (``effect_crossed``), or a host call, check or observer
        # follows them, traced again with ``effects_in_program`` (NOTE [Python state in a compiled step]).
        self.effects_in_program = False
        self.effects: list[tuple[Any, Any, list[Any], list[tuple[int, int]]]] = []
        self.effect_state: set[int] = set()
        self.effect_mark: tuple[int, ...] = ()
        self.effect_crossed = False
        # Tensors' texts, each a mark a print fills in at every call (NOTE [Print in a compiled step]),
        # whether the step's print is making its text now (a tensor's text then goes into it), and the prints.
        self.printed: list[Any] = []
        self.printing = False
        self.prints: list[Any] = []  # the step's prints in order: each one's call if its text is all known, else None

    def output(self, value: Any) -> int:
        """The position of ``value`` among the program's outputs (added on first use)."""
        index = self.output_index.get(id(value))
        if index is None:
            index = self.output_index[id(value)] = len(self.outputs)
            self.outputs.append(value)
        return index

    def failed_so_far(self) -> Any:
        """A traced flag: whether a check of values traced before this point failed (``None``: no such check yet).

        A host call that raised is not among them: the calls after it see that on the host (NOTE [Host calls]).
        """
        flags = [check.failed for check in self.checks if not check.on_host]
        return jnp.stack(flags).any() if flags else None

    def is_born(self, t: Tensor) -> bool:
        ref = self.born.get(id(t))
        return ref is not None and ref() is t

    def touch(self, t: Tensor) -> None:
        """Snapshot ``t`` if it is state seen for the first time."""
        if id(t) not in self.snapshots and not self.is_born(t):
            snap = self.snapshots[id(t)] = Snapshot(t)
            ref = self.grad_owner.get(id(t))
            owner = ref() if ref is not None else None
            if owner is not None and owner._grad is t:
                # A ``.grad``: at the next call it is whatever tensor its owner holds then.
                snap.target = ("grad", self.snapshots[id(owner)].target)

    # -- what the seam reports (``StepTrace``) -----------------------------------------
    def device(self) -> Any:
        return self.input_device or step_trace.default_device()

    def made(self, t: Tensor) -> None:
        self.born[id(t)] = weakref.ref(t)

    def entry_read(self, group: Any, key: str | None, value: Any) -> None:
        self.group_entries.read(group, key, value)

    def entry_written(self, group: Any, key: str, value: Any) -> None:
        self.group_entries.written(group, key, value)

    def module_mode(self, module: Any) -> None:
        if id(module) not in self.modes:
            self.modes[id(module)] = (weakref.ref(module), module.training)
            self.module_attrs[id(module)] = {
                key: (value, dict(value) if isinstance(value, dict) else None) for key, value in vars(module).items()
            }

    def traced_attribute(self) -> str | None:
        """A module attribute (or buffer, child) the trace set to a Tensor holding one of its tracers, named; else ``None``."""
        for module_id, (ref, _) in self.modes.items():
            module = ref()
            if module is None:
                continue
            attrs = self.module_attrs[module_id]
            for key, value in vars(module).items():
                before, contents = attrs.get(key, (None, None))
                found = [(key, value)] if value is not before else []
                if isinstance(value, dict) and contents is not None:
                    found += [(k, v) for k, v in value.items() if contents.get(k) is not v]
                for name, new in found:
                    if isinstance(new, Tensor) and isinstance(new._array, jax.core.Tracer):
                        return f"{type(module).__name__}.{name}"
        return None

    def progress(self) -> tuple[int, ...]:
        """What an effect run after the program must not have after it: host calls, checks, observers."""
        return self.host_calls, len(self.checks), len(self.host_checks), len(self.observers)

    def effects_need_program(self) -> bool:
        """Whether the effects traced to run after the program must run inside it instead."""
        return bool(self.effects) and (self.effect_crossed or self.effect_mark != self.progress())

    def restore_modules(self) -> None:
        """Give the modules the trace saw their attributes from before it (a trace that raised leaves no tracer in them)."""
        for module_id, (ref, _) in self.modes.items():
            module = ref()
            if module is None:
                continue
            attrs = self.module_attrs[module_id]
            current = vars(module)
            for key in [k for k in current if k not in attrs]:
                del current[key]
            for key, (value, contents) in attrs.items():
                current[key] = value
                if contents is not None:
                    value.clear()
                    value.update(contents)

    def read(self, t: Tensor) -> None:
        if id(t) in self.effect_state:
            self.effect_crossed = True
        array = t._array
        if isinstance(array, jax.core.Tracer) or self.is_born(t):
            return
        self.touch(t)
        source = self.snapshots[id(t)].target
        entries = self.sources.setdefault(id(array), [])
        if not entries:
            self.keep.append(array)
        if not any(_same_target(source, e) for e in entries):
            entries.append(source)

    def write(self, t: Tensor) -> None:
        if id(t) in self.effect_state:
            self.effect_crossed = True
        self.touch(t)

    def grad_read(self, t: Tensor) -> None:
        if self.is_born(t):
            return
        self.touch(t)
        if id(t) not in self.grad_written:
            self.read_grads.add(id(t))
        grad = t._grad
        if grad is not None:
            self.grad_owner[id(grad)] = weakref.ref(t)

    def grad_write(self, t: Tensor) -> None:
        self.touch(t)
        self.grad_written.add(id(t))


@dataclasses.dataclass(slots=True, eq=False)  # compared by identity: its fields are tracers
class Check:
    """One check traced into a step (NOTE [Checks in a compiled step])."""

    failed: Any  # traced: whether the check fails
    detail: Any  # traced (or ``None``), then its output position: what the message shows
    make_error: Callable[[Any], BaseException]  # the error to raise, given the detail's value
    writes: list[Any]  # the state writes as they stood at the check
    on_host: bool = False  # a host call's: whether it raised (the calls after it see that on the host)


def active() -> Recorder | None:
    """The recorder of the step this context is tracing, ``None`` when none is."""
    trace = step_trace.current()
    return trace if isinstance(trace, Recorder) else None


def current() -> Recorder:
    """The recorder of the step this context is tracing; one is."""
    rec = active()
    assert rec is not None
    return rec


def tracing() -> bool:
    """Whether this context is tracing an ``xgrad.compile`` function."""
    return active() is not None
