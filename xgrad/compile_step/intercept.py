"""What the engine and ops ask of a step being traced (NOTE [The step-trace seam])."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.compile_step import printing
from xgrad.compile_step.errors import MODULE_FORWARD_HOOKS, NotCompilable
from xgrad.compile_step.host import TracedCallbacks, function_on_host, hook_in_step, state_on_host
from xgrad.compile_step.recording import Check, Recorder
from xgrad.compile_step.signature import set_entries
from xgrad.compile_step.writeback import state_writes
from xgrad.engine.compiled.cache import call_site
from xgrad.engine.compiled.switch import PureHook
from xgrad.engine.node import AccumulateGrad, Node
from xgrad.jax_internals import get_opaque_trace_state
from xgrad.nn.hooks import _global_forward_hooks, _global_forward_pre_hooks
from xgrad.ops._util import IndexOutOfRangeError, _first_out_of_range
from xgrad.tensor import Tensor, is_tensor


class StepRecorder(Recorder):
    """A ``Recorder`` answering the engine's and the ops' questions (``StepTrace``) for its step."""

    wrap_hook = staticmethod(hook_in_step)

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
        hooks = (*module._forward_pre_hooks.values(), *module._forward_hooks.values(),
                 *_global_forward_pre_hooks.values(), *_global_forward_hooks.values())
        if not all(isinstance(hook, PureHook) for hook in hooks):
            raise NotCompilable(MODULE_FORWARD_HOOKS.format(module=type(module).__name__), call_site())

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

    printed_text = printing.printed_text
    printed_item = printing.printed_item

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
        failed, first = _first_out_of_range(index, size, negative=negative, ignore=ignore)
        self.checks.append(Check(failed, first, lambda i: IndexOutOfRangeError(message.format(index=int(i))), writes))
        return True
