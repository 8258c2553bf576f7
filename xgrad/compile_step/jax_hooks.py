"""Hooks called on a plain JAX transformation's tracers, outside ``xgrad.compile`` (NOTE [Hooks under jax.jit]).

# NOTE [Hooks under jax.jit]
# Outside a traced step a hook is still called on tracers when the engine runs inside a
# plain ``jax.jit`` (``loss.backward()`` in a jitted function, on ``from_jax(trace=True)``
# intermediates or any tensor), or when JAX's AD runs a tensor hook or a module's backward
# hooks under ``jax.jit`` (``jax.jit(jax.grad(...))``, a model passed to a jitted step;
# NOTE [Hooks on JAX's AD] in ``xgrad/tensor/jax_boundary.py``).
# Called as it is, its Python runs once, when traced: a hook that appends to a list would
# see the first call's values only, silently. So the rule of ``xgrad.compile`` decides
# (NOTE [Hooks traced in] in ``hook_purity.py``), stricter on what the hook reads: a plain
# trace keeps no guards, so a hook reading a value that can be rebound or changed in
# place (``SCALE``, ``cfg.scale``, a list's items) is not traced in. A hook traced in
# computes in the program. Any other (and one marked ``host_hook``) runs through
# ``io_callback(ordered=True)`` at its point of the program, at every call, on the
# gradients' values, and what it returns comes back into the program (gradients of the
# shapes and dtypes it was given; the ones it was given when it returns ``None``): eager's
# values and order. Two cases cannot be served so and raise, naming the hook and the fix:
# JAX refuses ordered effects under ``jax.vmap`` and has no derivative of a host call
# (``jax.grad`` over a backward), inside ``jax.jit``; a post-accumulate-grad hook changes its leaf's ``.grad``
# in place, which a host call's copy cannot reach. On concrete values a hook is called
# as it is, and so it is on the tracers of a transformation that runs Python at every call
# (``jax.grad``, ``jax.vmap`` outside ``jax.jit``): eager pays one check of its arguments.
"""

from __future__ import annotations

from typing import Any

import jax

from xgrad import step_trace
from xgrad.compile_step.hook_purity import trace_in
from xgrad.engine.compiled.switch import HostHook, PureHook
from xgrad.engine.host_call import hook_on_host
from xgrad.jax_internals import concrete_value
from xgrad.tensor import Tensor
from xgrad.tensor.hook_kinds import KINDS, RETURNS_NONE

ERR_NO_HOST_CALL = (
    "hook {hook!r} has Python effects (or reads Python state that can change), and it is called inside a JAX "
    "transformation that {where}: traced, its Python would run once rather than at every call. Mark it "
    "xgrad.autograd.compiled.pure_hook(hook) if it has no effects (it is then traced in as it is), or run this code "
    "under xgrad.compile or eagerly"
)
_VMAP = "cannot call the host in order (jax.vmap) or cannot differentiate a host call (jax.grad of a backward)"
_POST_ACCUMULATE = "changes a leaf's .grad in place, which a host call cannot reach (a post-accumulate-grad hook)"
# Where the hooks that see the tensor itself, not gradients, are kept (NOTE [Hook kinds]): what they change in
# place (its ``.grad``) a host call's copy cannot reach.
_ON_THE_TENSOR = tuple(kind.leaf_slot for kind in KINDS if kind.convention is RETURNS_NONE and kind.leaf_slot is not None)


def _staged(args: tuple[Any, ...]) -> bool:
    """Whether a Tensor in ``args`` (a hook's: Tensors and tuples of them) holds a tracer with no value under it: a
    trace that runs Python once. Walked by hand, not as a pytree: eager pays this at every hook call."""
    for arg in args:
        for t in arg if isinstance(arg, (tuple, list)) else (arg,):
            if isinstance(t, Tensor) and isinstance(t._array, jax.core.Tracer) and concrete_value(t._array) is None:
                return True
    return False


def plain_jax_hook(hook: Any) -> Any:
    """``hook`` as called outside a traced step (NOTE [Hooks under jax.jit])."""
    if isinstance(hook, tuple):  # a tensor hook: (input_nr, hook)
        return (hook[0], plain_jax_hook(hook[1]))
    if isinstance(hook, PureHook):
        return hook

    def call(*args: Any) -> Any:
        if not _staged(args):
            return hook(*args)
        if not isinstance(hook, HostHook):
            traced, result = trace_in(None, hook, args)
            if traced:
                return result
        first = args[0]
        if isinstance(first, Tensor) and any(hook in (getattr(first, slot) or {}).values() for slot in _ON_THE_TENSOR):
            raise RuntimeError(ERR_NO_HOST_CALL.format(hook=hook, where=_POST_ACCUMULATE))
        try:  # an ordered host call (NOTE [Host calls] in ``xgrad/engine/host_call.py``)
            return hook_on_host(hook, args)[0]
        except (ValueError, NotImplementedError) as exc:  # JAX's refusals of an ordered effect under vmap, of its JVP
            raise RuntimeError(ERR_NO_HOST_CALL.format(hook=hook, where=_VMAP)) from exc

    return call


step_trace.plain_jax_hook = plain_jax_hook
