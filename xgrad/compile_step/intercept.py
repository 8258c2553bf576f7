"""What one trace of a step touched, and what the engine and ops ask of it (NOTE [The step-trace seam])."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from xgrad import step_trace
from xgrad.compile_step import printing
from xgrad.compile_step.errors import MODULE_FORWARD_HOOKS, NotCompilable
from xgrad.compile_step.host import TracedCallbacks, function_on_host, hook_in_step, state_on_host
from xgrad.compile_step.recording import Snapshot, target_key
from xgrad.compile_step.signature import GroupEntries, set_entries
from xgrad.compile_step.writeback import state_writes
from xgrad.engine.compiled.cache import call_site
from xgrad.engine.compiled.switch import PureHook
from xgrad.engine.node import AccumulateGrad, Node, next_sequence_nr
from xgrad.jax_internals import get_opaque_trace_state
from xgrad.nn.hooks import forward_hooks
from xgrad.ops._util import IndexOutOfRangeError, first_out_of_range
from xgrad.step_trace import StepTrace
from xgrad.tensor import Tensor, is_tensor


class Recorder(StepTrace):
    """What one trace touched: snapshots, where concrete arrays came from, which ``.grad``s decided branches; and
    its step's answers to what the engine and the ops ask (``StepTrace``).

    The engine, the ops, the optimizer and ``Tensor`` report, through the step-trace
    seam, the tensors they are about to read or change (NOTE [Whole-step compile], 1).
    """

    wrap_hook = staticmethod(hook_in_step)
    printed_text = printing.printed_text
    printed_item = printing.printed_item

    def __init__(self, input_device: Any, learned: list[Any] | None, effects_in_program: bool) -> None:
        self.snapshots: dict[int, Snapshot] = {}
        # id(array) -> (the array, kept alive so that its id names it; the targets of the tensors holding it).
        self.sources: dict[int, tuple[Any, list[Any]]] = {}
        self.grad_owner: dict[int, weakref.ref[Tensor]] = {}
        self.read_grads: set[int] = set()  # ``.grad`` read before this trace rebound it
        self.grad_written: set[int] = set()
        # Tensors made during the trace: never state, their arrays stay constants.
        # (By id: a WeakSet would compare tensors with ``==``, an op.)
        self.born: dict[int, weakref.ref[Tensor]] = {}
        self.trace: Any = None  # the step's own trace level (set once ``fn`` is called)
        self.input_device = input_device  # the device of the step's first Tensor argument, if it has one
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
        self.observing = learned is not None  # tracing the observer variant: hooks become outputs and ``observers``
        self.observers: list[Any] = []
        self.learned = learned or []  # the ops each hook call ran last (NOTE [Hook ops in the program])
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
        self.first_sequence_nr = next_sequence_nr()  # nodes made by the trace number above it
        self.host_tasks: dict[int, Any] = {}  # id(a traced GraphTask still running) -> its stand-in
        self.queued: dict[int, list[Any]] = {}  # id(a stand-in) -> traced flags: callbacks wait on it
        # What host calls raised, kept until the call raises it again (NOTE [Checks in a compiled step]).
        self.host_errors: list[BaseException] = []
        # id(a module called or put in train/eval mode) -> (its weak reference, its mode before the trace, its
        # attributes then and the contents of those that are dicts (its buffers, children, hooks): a trace that
        # raises restores them (``restore_modules``)).
        self.modules: dict[int, tuple[weakref.ref[Any], bool, dict[str, tuple[Any, Any]]]] = {}
        # Host effects (an LR scheduler's step): traced first as run after the program, each as (its call, its
        # arguments' tree and leaves, the Tensors among them as (leaf, output)); once the step reads or
        # writes the state they rebind after them (``effect_crossed``), or a host call, check or observer
        # follows them, traced again with ``effects_in_program`` (NOTE [Python state in a compiled step]).
        self.effects_in_program = effects_in_program
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

    def traced_attribute(self) -> str | None:
        """A module attribute (or buffer, child) the trace set to a Tensor holding one of its tracers, named; else ``None``."""
        for ref, _, attrs in self.modules.values():
            module = ref()
            if module is None:
                continue
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
        for ref, _, attrs in self.modules.values():
            module = ref()
            if module is None:
                continue
            current = vars(module)
            for key in [k for k in current if k not in attrs]:
                del current[key]
            for key, (value, contents) in attrs.items():
                current[key] = value
                if contents is not None:
                    value.clear()
                    value.update(contents)

    # -- what the seam reports (``StepTrace``) -----------------------------------------
    def made(self, t: Tensor) -> None:
        self.born[id(t)] = weakref.ref(t)

    def entry_read(self, group: Any, key: str | None, value: Any) -> None:
        self.group_entries.read(group, key, value)

    def entry_written(self, group: Any, key: str, value: Any) -> None:
        self.group_entries.written(group, key, value)

    def module_mode(self, module: Any) -> None:
        if id(module) not in self.modules:
            attrs = {key: (value, dict(value) if isinstance(value, dict) else None) for key, value in vars(module).items()}
            self.modules[id(module)] = (weakref.ref(module), module.training, attrs)

    def read(self, t: Tensor) -> None:
        if id(t) in self.effect_state:
            self.effect_crossed = True
        array = t._array
        if isinstance(array, jax.core.Tracer) or self.is_born(t):
            return
        self.touch(t)
        source = self.snapshots[id(t)].target
        _, entries = self.sources.setdefault(id(array), (array, []))
        if target_key(source) not in [target_key(e) for e in entries]:
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

    def hook_added(self, hooks: Any, handle: Any, owner: Any) -> None:
        """Note the hook, and whether its owner outlives the call (then it would pile up, as in eager)."""
        if isinstance(owner, AccumulateGrad):
            owner = owner.variable
        if isinstance(owner, Tensor):
            outlives = not self.is_born(owner)
        else:
            outlives = isinstance(owner, Node) and owner.sequence_nr < self.first_sequence_nr
        self.added_hooks.append((weakref.ref(hooks), handle.id, call_site(), outlives))

    def module_called(self, module: Any) -> None:
        """Guard on the module's mode (NOTE [Python state in a compiled step]); refuse its forward hooks unless pure."""
        self.module_mode(module)
        if not all(isinstance(hook, PureHook) for hook in forward_hooks(module)):
            raise NotCompilable(MODULE_FORWARD_HOOKS.format(module=type(module).__name__), call_site())

    # -- what the engine and the ops ask (``StepTrace``) -------------------------------
    def device(self) -> Any:
        return self.input_device or step_trace.default_device()

    def function_backward(self, node: Any, grads: list[Any]) -> list[Any] | None:
        return function_on_host(node, grads) if self.at_step_level() else None

    def host_effect(self, call: Callable[..., None], args: tuple[Any, ...], kwargs: dict[str, Any], state: list[Any]) -> bool:
        """``call`` on the host at every call (NOTE [Python state in a compiled step]); under a nested JAX transformation, now."""
        if not self.at_step_level():
            return False
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs), is_leaf=is_tensor)
        given = [(i, leaf) for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor)]
        if self.effects_in_program:
            for t in state:
                self.read(t)  # a program input even if nothing in the step read it before
                self.write(t)
            entries = self.group_entries.flush()  # what the step set in parameter groups before it (a rate) it sees

            def effect() -> None:
                set_entries(entries)
                call(*args, **kwargs)

            state_on_host(effect, state + [t for _, t in given], who=f"effect {call!r}")
            return True
        # After the program: the Tensors it is given are outputs, and the trace keeps none of them.
        outputs = [(i, self.output(t._array)) for i, t in given]
        kept = [None if isinstance(leaf, Tensor) else leaf for leaf in leaves]
        self.effects.append((call, tree, kept, outputs))
        self.effect_state.update(id(t) for t in state)
        if len(self.effects) == 1:  # what follows the first effect follows them all: they run after the program
            self.effect_mark = self.progress()
        return True

    def final_callbacks(self) -> list[Callable[[], None]]:
        return TracedCallbacks()

    def at_step_level(self) -> bool:
        return get_opaque_trace_state(convention="xgrad") == self.trace

    def check(self, failed: Any, make_error: Callable[[Any], BaseException], detail: Any = None) -> bool:
        """A value check as a flag of the program (NOTE [Checks in a compiled step])."""
        if not self.at_step_level():
            return False  # a JAX transformation inside ``fn``: the caller's host callback
        self.checks.append(Check(failed, detail, make_error, state_writes(self, call_site())))
        return True

    def check_index(self, index: Any, size: int, message: str, negative: bool, ignore: int | None) -> bool:
        """``check_index_range`` on a traced index: on the host before the program when it can, else a flag."""
        if not self.at_step_level():
            return False
        if not jnp.issubdtype(index.dtype, jnp.integer):
            return True
        writes = state_writes(self, call_site())
        leaf = self.arg_leaves.get(id(index))
        if (
            leaf is not None
            and not self.checks
            and not self.host_calls
            and all(what == "requires_grad" or (what == "grad" and value is None) for _, what, value, _ in writes)
        ):
            self.host_checks.append((leaf, size, message, negative, ignore, writes))
            return True
        failed, first = first_out_of_range(index, size, negative=negative, ignore=ignore)
        self.checks.append(Check(failed, first, lambda i: IndexOutOfRangeError(message.format(index=int(i))), writes))
        return True


@dataclasses.dataclass(slots=True, eq=False)  # compared by identity: its fields are tracers
class Check:
    """One check traced into a step (NOTE [Checks in a compiled step])."""

    failed: Any  # traced: whether the check fails
    detail: Any  # traced (or ``None``), then its output position: what the message shows
    make_error: Callable[[Any], BaseException]  # the error to raise, given the detail's value
    writes: list[Any]  # the state writes as they stood at the check
    on_host: bool = False  # a host call's: whether it raised (the calls after it see that on the host)
