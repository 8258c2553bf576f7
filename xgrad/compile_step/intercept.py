"""What the engine and ops call while a step is traced, and installing it for one trace."""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jax.extend.core import get_opaque_trace_state

from xgrad.compile_step import recording
from xgrad.compile_step.host import _host_hook, _TracedCallbacks
from xgrad.compile_step.recording import (
    _ARRAY,
    _FINAL_CALLBACKS,
    _GRAD,
    _Check,
    _get_array,
    _get_grad,
    _Recorder,
    _set_array,
    _set_grad,
    _trace_lock,
)
from xgrad.compile_step.writeback import _state_writes
from xgrad.engine import hooks as hooks_module
from xgrad.engine.compiled.cache import call_site
from xgrad.engine.graph_task import GraphTask
from xgrad.engine.node import AccumulateGrad, Node
from xgrad.ops import _util as ops_util
from xgrad.ops._util import _first_out_of_range
from xgrad.tensor import Tensor


def _trace_check(index: Any, size: int, message: str, negative: bool, ignore: int | None) -> None:
    """``check_index_range`` on a tracer while a step is traced: a ``_Check`` of the program."""
    rec = recording.active()
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
    rec = recording.active()
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


def _set_final_callbacks(graph_task: GraphTask, value: list[Callable[[], None]]) -> None:
    rec = recording.active()
    if rec is not None and rec.thread == threading.get_ident():
        value = _TracedCallbacks(value)
    _FINAL_CALLBACKS.__set__(graph_task, value)


class _Recording:
    """Install the recording descriptors and the host-hook wrapper for one trace."""

    def __init__(self, recorder: _Recorder) -> None:
        self.recorder = recorder

    def __enter__(self) -> _Recorder:
        _trace_lock.acquire()
        self.outer = recording.active()
        recording.set_active(self.recorder)
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
        hooks_module.trace_wrapper = self.outer_wrap
        ops_util.traced_check = self.outer_check
        hooks_module.trace_added = self.outer_added
        if self.outer is None:
            setattr(Tensor, "_array", _ARRAY)  # noqa: B010
            setattr(Tensor, "_grad", _GRAD)  # noqa: B010
            setattr(GraphTask, "final_callbacks", _FINAL_CALLBACKS)  # noqa: B010
        recording.set_active(self.outer)
        _trace_lock.release()
