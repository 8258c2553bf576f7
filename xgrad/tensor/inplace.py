"""In-place updates of a ``Tensor``: the checks, the alias an in-place op computes on,
and rebinding the result (version bump, views, detached aliases, tangents)."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import jax
import jax.numpy as jnp

from xgrad.dual import LEVEL
from xgrad.grad_mode import _state as _grad_state
from xgrad.grad_mode import is_grad_enabled, no_grad
from xgrad.step_trace import current as _current_step
from xgrad.tensor import core
from xgrad.tensor.dtypes import can_cast, torch_dtype_name
from xgrad.tensor.jax_boundary import ERR_STATE_WRITTEN_IN_JAX, user_site

__all__ = [
    "ERR_INFERENCE_INPLACE", "ERR_LEAF_INPLACE", "alias", "check_inplace", "detached_alias", "rebind", "take_tangent",
    "take_value", "write_to_source",
]

ERR_LEAF_INPLACE = "a leaf Variable that requires grad is being used in an in-place operation."
ERR_INFERENCE_INPLACE = (
    "Inplace update to inference tensor outside InferenceMode is not allowed.You can make a clone to get a normal "
    "tensor before doing inplace update.See https://github.com/pytorch/rfcs/pull/17 for more details."
)


def check_inplace(self: core.Tensor) -> None:
    if self._inference and not _grad_state.inference:
        raise RuntimeError(ERR_INFERENCE_INPLACE)
    if self._view is not None:
        self._view.check_writable(self)
    elif self.grad_fn is None and self._requires_grad and is_grad_enabled():
        raise RuntimeError(ERR_LEAF_INPLACE)


def alias(self: core.Tensor) -> core.Tensor:
    """A second handle on this tensor's value and graph position, for in-place ops.

    The out-of-place op runs on the alias, so what it saves keeps version 0 while
    ``self`` moves on; nodes that saved ``self`` itself see the bump and raise. A
    view whose base has a graph is made afresh from the base (``views.view_alias``).
    """
    view = self._view
    if view is not None and _grad_state.enabled and view.base.requires_grad:
        from xgrad.ops.views import view_alias

        return view_alias(self)
    trace = _current_step()
    if trace is not None:
        trace.read(self)
    t = core.Tensor(self._array)
    t._inference = self._inference
    t.grad_fn = self.grad_fn
    t._output_nr = self._output_nr
    t._requires_grad = self._requires_grad
    t._grad_accumulator = self._grad_accumulator
    # Its tangent is an alias too: the in-place op's forward rule saves it, and the
    # tangent itself is then updated in place (NOTE [Dual levels]).
    fw = self._fw_grad
    t._fw_grad = None if fw is None else (fw[0], fw[1]._alias())
    if self.grad_fn is None and self._requires_grad:
        from xgrad.engine.node import grad_accumulator

        t._grad_accumulator = weakref.ref(grad_accumulator(self))
    return t


def rebind(self: core.Tensor, result: core.Tensor) -> core.Tensor:
    """Take over ``result``'s value and history: the second half of an in-place op.

    On a view the new value is written through to its base, and every live view of
    that base is regenerated from it (NOTE [Views write through]).
    """
    if result._array.shape != self._array.shape:
        raise RuntimeError(
            f"output with shape {list(self._array.shape)} doesn't match the broadcast shape "
            f"{list(result._array.shape)}"
        )
    dtype = self._array.dtype
    if result._array.dtype != dtype:
        if not can_cast(result._array.dtype, dtype):
            raise RuntimeError(
                f"result type {torch_dtype_name(result._array.dtype)} can't be cast to the desired output "
                f"type {torch_dtype_name(dtype)}"
            )
        result = result.astype(dtype)
    if self._alias_of is not None and self._write_to_source(result):
        return self
    if self._view is not None:
        from xgrad.ops.views import write_through

        write_through(self, result)
        _follow(result, self)
        return self
    self._take_value(result)
    _follow(result, self)
    if self._views is not None:
        from xgrad.ops.views import regenerate_views

        regenerate_views(self)
    return self


def _follow(result: core.Tensor, tensor: core.Tensor) -> None:
    if result.grad_fn is not None:
        from xgrad.engine.saved import follow_inplace  # NOTE [In-place results are saved as the tensor]

        follow_inplace(result, tensor)


def write_to_source(self: core.Tensor, result: core.Tensor) -> bool:
    """Write a detached alias's new value into its source (NOTE [Detached aliases]).

    Returns False when the alias has parted from its source.
    """
    assert self._alias_of is not None
    get_source, shares_version, (source_array, alias_array) = self._alias_of
    source = get_source()
    if source is None or source._array is not source_array or self._array is not alias_array:
        self._alias_of = None
        return False
    version = source._version
    written = core.Tensor(result._array)
    written._fw_grad = source._fw_grad  # the source keeps its own tangent (NOTE [Dual levels])
    with no_grad():
        source._rebind(written)
    if not shares_version:
        source._version = version
    self._take_value(result)  # the alias's own history, if the written value has one
    self._array = source._array
    self._alias_of = (get_source, shares_version, (source._array, self._array))
    if shares_version:
        self._version = source._version
    return True


# NOTE [In-place writes in xgrad.func]
# As in torch.func: an in-place op inside ``vmap``/``jvp`` on a tensor passed to the
# transform changes the caller's tensor (``xgrad.func`` writes the new value back after
# the transform), and one on a tensor the function captured from outside, with a value
# computed from the transform's inputs, raises torch.func's error: JAX's tracer would
# otherwise be left in the caller's tensor.
ERR_MUTATE_CAPTURED = {
    "grad": (
        "During a grad (vjp, jvp, grad, etc) transform, the function provided attempted to call in-place operation "
        "that would mutate a captured Tensor. A 'captured' Tensor is one that is not passed as an input to the "
        "transform function. Please pass it as an input, or make a copy of it (tensor.clone()) before modifying it "
        "in place."
    ),
    "vmap": (
        "vmap: inplace arithmetic(self, *extra_args) is not possible because there exists a Tensor `other` in "
        "extra_args that has more elements than `self`. This happened due to `other` being vmapped over but `self` "
        "not being vmapped over in a vmap. Please try to use out-of-place operators instead of inplace arithmetic."
    ),
}


def take_value(self: core.Tensor, result: core.Tensor) -> None:
    """Hold ``result``'s array and, when it has one, its place in the graph; bump ``_version``."""
    trace = _current_step()
    if trace is not None:
        trace.write(self)
    elif getattr(self, "_entered_trace", None) is not None and isinstance(self._array, jax.core.Tracer):
        raise RuntimeError(ERR_STATE_WRITTEN_IN_JAX.format(where=user_site()))  # NOTE [State written inside a JAX transformation]
    elif _grad_state.transform is not None and isinstance(result._array, jax.core.Tracer) and not isinstance(self._array, jax.core.Tracer):
        # NOTE [In-place writes in xgrad.func]: a value of the transform written into a tensor from outside it
        raise RuntimeError(ERR_MUTATE_CAPTURED[_grad_state.transform])
    self._array = result._array
    self._version += 1
    if self._fw_grad is not None or result._fw_grad is not None:
        self._take_tangent(result)
    if result.grad_fn is not None:
        if self._retains_grad and self.grad_fn is not None:
            # The retains-grad hook moves to the new grad_fn, as in PyTorch: .grad is the
            # gradient of the latest value. Other hooks stay with the old value.
            old_hooks = self.grad_fn._retains_grad_hooks
            if old_hooks:
                old_hooks.pop(self._output_nr, None)
        self.grad_fn = result.grad_fn
        self._output_nr = result._output_nr
        if self._retains_grad:
            self._install_retains_grad_hook()


def take_tangent(self: core.Tensor, result: core.Tensor) -> None:
    """The tangent follows the value of an in-place op (NOTE [Dual levels]).

    As in PyTorch, a dual tensor's tangent is updated in place (whoever holds it sees
    the new one), and one given a value without a tangent (``zero_``, ``copy_`` of a
    plain tensor) gets a zero tangent.
    """
    level = LEVEL.current
    old = self._fw_grad[1] if self._fw_grad is not None and self._fw_grad[0] is level else None
    new = result._fw_grad[1] if result._fw_grad is not None and result._fw_grad[0] is level else None
    if old is None or new is old:
        self._fw_grad = result._fw_grad if new is not None else None
        return
    if new is None:
        new = core.Tensor(jnp.zeros(old.shape, old.dtype))
    if old.grad_fn is None and old._requires_grad and is_grad_enabled():
        self._fw_grad = (level, new)  # a leaf that requires grad cannot be written in place
        return
    old._rebind(new)


# NOTE [Detached aliases]
# In PyTorch ``detach()`` and ``.data`` share storage with the tensor, so an in-place
# op on them (``p.data.mul_(0.5)``, ``p.detach().zero_()``, ``ema.data.copy_(w)``)
# changes the tensor itself, outside the graph; ``detach()``'s write bumps the shared
# version counter (a saved tensor then refuses backward), ``.data``'s does not. JAX
# arrays are immutable, so the alias remembers its source instead: an in-place op on
# an alias that still holds its source's array writes the new value into the source
# under ``no_grad`` (through the source's own views, if it is one) and then takes it
# itself. An alias whose source has since been given another value has parted from
# it (the write stays on the alias): JAX cannot make the two share a buffer.
def detached_alias(self: core.Tensor, shares_version: bool) -> core.Tensor:
    trace = _current_step()
    if trace is not None:
        trace.read(self)
    array = self._array
    # On JAX's tracers the alias stops JAX's AD too (NOTE [Grad mode on JAX's AD]); in an
    # ``xgrad.compile`` step xgrad's own engine differentiates, and the alias stays the array.
    t = core.Tensor(jax.lax.stop_gradient(array) if trace is None and isinstance(array, jax.core.Tracer) else array)
    # A view is held strongly (``m[1].data.fill_(7.0)``: nothing else keeps that view
    # alive, and it holds its base anyway); any other source weakly, so an alias of a
    # result never keeps that result's graph alive.
    source: Callable[[], core.Tensor | None] = weakref.ref(self) if self._view is None else (lambda: self)
    t._alias_of = (source, shares_version, (array, t._array))
    t._inference = self._inference
    if shares_version:
        t._version = self._version
    return t
