"""What the engine and ops ask of a step being traced (NOTE [The step-trace seam])."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from xgrad.compile_step.host import _function_on_host, _host_hook, _TracedCallbacks
from xgrad.compile_step.recording import _Check, _Recorder
from xgrad.compile_step.writeback import _state_writes
from xgrad.engine.compiled.cache import call_site
from xgrad.engine.node import AccumulateGrad, Node
from xgrad.jax_internals import get_opaque_trace_state
from xgrad.ops._util import IndexOutOfRangeError, _first_out_of_range
from xgrad.tensor import Tensor


class _StepRecorder(_Recorder):
    """A ``_Recorder`` answering the engine's and the ops' questions (``StepTrace``) for its step."""

    def wrap_hook(self, fn: Any, hooks: Any) -> Any:
        return _host_hook(fn, hooks)

    def hook_added(self, hooks: Any, handle: Any, owner: Any) -> None:
        """Note the hook, and whether its owner outlives the call (then it would pile up, as in eager)."""
        if isinstance(owner, AccumulateGrad):
            owner = owner.variable
        if isinstance(owner, Tensor):
            outlives = not self.is_born(owner)
        else:
            outlives = isinstance(owner, Node) and owner.sequence_nr < self.first_sequence_nr
        self.added_hooks.append((weakref.ref(hooks), handle.id, call_site(), outlives))

    def function_backward(self, node: Any, grads: list[Any]) -> list[Any] | None:
        return _function_on_host(node, grads) if self.at_step_level() else None

    def final_callbacks(self) -> list[Callable[[], None]]:
        return _TracedCallbacks()

    def at_step_level(self) -> bool:
        return get_opaque_trace_state(convention="xgrad") == self.trace

    def check(self, failed: Any, make_error: Callable[[Any], BaseException], detail: Any = None) -> bool:
        """A value check as a flag of the program (NOTE [Checks in a compiled step])."""
        if not self.at_step_level():
            return False  # a JAX transformation inside ``fn``: the caller's host callback
        self.checks.append(_Check(failed, detail, make_error, _state_writes(self, call_site())))
        return True

    def check_index(self, index: Any, size: int, message: str, negative: bool, ignore: int | None) -> bool:
        """``check_index_range`` on a traced index: on the host before the program when it can, else a flag."""
        if not self.at_step_level():
            return False
        if not jnp.issubdtype(index.dtype, jnp.integer):
            return True
        writes = _state_writes(self, call_site())
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
        self.checks.append(_Check(failed, first, lambda i: IndexOutOfRangeError(message.format(index=int(i))), writes))
        return True
