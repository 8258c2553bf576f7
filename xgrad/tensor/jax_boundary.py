"""Where a ``Tensor`` meets JAX: the pytree node, ``__jax_array__``, and the errors that
keep autograd history from crossing into JAX silently (NOTE [JAX boundary])."""

from __future__ import annotations

import copy
import inspect
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import jax

from xgrad import step_trace
from xgrad.grad_mode import graph_off, is_grad_enabled
from xgrad.jax_internals import abstractifying, get_opaque_trace_state
from xgrad.step_trace import array_of
from xgrad.tensor import core
from xgrad.tensor.dtypes import is_differentiable_dtype
from xgrad.tensor.hook_kinds import LEAF_KINDS, REPLACES_GRAD, leaf_has_hooks

__all__ = ["hook_on_jax", "identity_with_vjp", "jax_array", "tree_flatten", "tree_unflatten", "user_site", "user_stacklevel"]


def _in_compiled_step() -> bool:
    """Whether this context is tracing an ``xgrad.compile`` step (its tracers stand for eager values)."""
    return step_trace.current() is not None


def _converts_outside_jax(t: core.Tensor, array: Any) -> bool:
    """Whether converting ``t`` to an array would lose its gradient: JAX is not tracing it for
    the user (NOTE [Tensors that require grad become arrays])."""
    if not isinstance(array, jax.core.Tracer) or _in_compiled_step():
        return True
    # A jnp function is itself jitted: ``jnp.sin(t)`` converts ``t`` in the very trace
    # it entered from outside, where a user's transformation would have used it first.
    entered = getattr(t, "_entered_trace", None)
    return entered is not None and entered == get_opaque_trace_state(convention="xgrad")


def _is_library_frame(frame: FrameType) -> bool:
    module = frame.f_globals.get("__name__", "")
    return module.split(".")[0] in ("jax", "jaxlib", "xgrad") or module.startswith("numpy")


def _user_frame(frame: FrameType | None) -> tuple[int, FrameType] | None:
    """The innermost frame from ``frame`` outwards outside JAX, NumPy and xgrad, with its
    stack level (``frame`` is level 1), or ``None`` when there is none."""
    level = 1
    while frame is not None:
        if not _is_library_frame(frame):
            return level, frame
        frame = frame.f_back
        level += 1
    return None


def _caller_frame() -> FrameType | None:
    """The frame of whoever called the function that calls this one."""
    frame = inspect.currentframe()
    return None if frame is None or frame.f_back is None else frame.f_back.f_back


def user_site() -> str:
    """`` (at file:line)``: the innermost frame outside JAX, NumPy and xgrad, for messages."""
    found = _user_frame(_caller_frame())
    return "" if found is None else f" (at {found[1].f_code.co_filename}:{found[1].f_lineno})"


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the caller name the user's line
    (the innermost frame outside JAX, NumPy and xgrad), as ``user_site`` does."""
    found = _user_frame(_caller_frame())
    return 1 if found is None else found[0]


# NOTE [Hooks on JAX's AD]
# On a plain JAX transformation's tracers a tensor hook must see the cotangent JAX's AD
# computes, or ``jax.grad(loss)(model)`` would skip a gradient clamp that
# ``loss.backward()`` applies. ``hook_on_jax`` puts the tensor's array through an
# identity whose ``custom_vjp`` calls the tensor's hooks, in the order they were
# registered, on the cotangent (as a Tensor; a non-``None`` return replaces it), so
# every use of the tensor after that point is seen. A parameter's hooks ride in its
# pytree metadata, so the parameter a JAX transformation unflattens from a tracer gets
# them too, and keeps them: ``jax.jit(jax.grad(loss))`` unflattens it twice, and the
# innermost transformation is the one that differentiates. Hooks run with recording off and JAX's AD on, so a hook's ops are
# differentiated by an outer ``jax.grad`` as ``create_graph=True`` would. Under ``jax.jit`` a
# hook with Python effects runs at every call all the same (NOTE [Hooks under a plain JAX
# transformation] in ``step_trace``).
def identity_with_vjp(on_cotangents: Callable[[tuple[Any, ...]], Sequence[Any]]) -> Callable[..., tuple[Any, ...]]:
    """An identity on arrays whose ``custom_vjp`` gives ``on_cotangents(cotangents)`` as the
    cotangents of its inputs, run with recording off and JAX's AD on: what hooks (tensor,
    parameter, module) and ``once_differentiable`` become on JAX's AD."""

    @jax.custom_vjp
    def identity(*arrays: Any) -> tuple[Any, ...]:
        return arrays

    def fwd(*arrays: Any) -> tuple[tuple[Any, ...], None]:
        return arrays, None

    def bwd(_: None, cotangents: tuple[Any, ...]) -> tuple[Any, ...]:
        with graph_off():
            return tuple(on_cotangents(cotangents))

    identity.defvjp(fwd, bwd)
    return identity


def hook_on_jax(array: Any, hooks: tuple[Any, ...]) -> Any:
    """``array`` through an identity whose cotangent goes through ``hooks`` (NOTE [Hooks on JAX's AD])."""
    shape, dtype = array.shape, array.dtype

    def run_hooks(cotangents: tuple[Any, ...]) -> tuple[Any]:
        grad = core.Tensor(cotangents[0])
        for hook in hooks:
            result = step_trace.on_plain_jax(hook)(grad)
            if result is not None:
                if not isinstance(result, core.Tensor) or result.shape != shape:
                    got = getattr(result, "shape", type(result).__name__)
                    raise RuntimeError(f"hook returned a gradient of shape {got}, expected {tuple(shape)}")
                grad = result
        return (array_of(grad).astype(dtype),)

    return identity_with_vjp(run_hooks)(array)[0]


# A leaf's hooks ride in its pytree metadata, per kind it keeps (``LEAF_KINDS``, NOTE [Hook kinds]).
NO_LEAF_HOOKS: tuple[tuple[Any, ...], ...] = ((),) * len(LEAF_KINDS)
_LOWERED = tuple(kind.jax_ad for kind in LEAF_KINDS)


def _leaf_hooks(t: core.Tensor) -> tuple[tuple[Any, ...], ...]:
    """``t``'s hooks per leaf kind, the functions alone (a tensor hook is kept with its input number)."""
    found = []
    for kind in LEAF_KINDS:
        hooks = getattr(t, kind.leaf_slot)  # type: ignore[arg-type]
        values = tuple(hooks.values()) if hooks else ()
        found.append(tuple(fn for _, fn in values) if kind.convention is REPLACES_GRAD else values)
    return tuple(found)


def _lowered(leaf_hooks: tuple[tuple[Any, ...], ...]) -> tuple[Any, ...]:
    """The hooks JAX's AD calls on the cotangent, in PyTorch's order (``LEAF_KINDS`` is in rank order)."""
    return tuple(fn for lowered, fns in zip(_LOWERED, leaf_hooks, strict=True) if lowered for fn in fns)


def _keep_leaf_hooks(t: core.Tensor, leaf_hooks: tuple[tuple[Any, ...], ...]) -> None:
    from xgrad.engine.hooks import HookDict

    for kind, fns in zip(LEAF_KINDS, leaf_hooks, strict=True):
        if fns:
            pairs = ((0, fn) for fn in fns) if kind.convention is REPLACES_GRAD else iter(fns)
            setattr(t, kind.leaf_slot, HookDict(kind, enumerate(pairs)))  # type: ignore[arg-type]


class _TensorMeta:
    """A Tensor node's pytree metadata (NOTE [Tensor as a pytree]): ``requires_grad``,
    whether it has history, whether its array was a tracer when it was flattened (an
    output of a traced function) and whether it is a gradient (a ``.grad``, or what optax
    or ``tree_map`` built from one).
    """

    __slots__ = (
        "compiled", "grad_enabled", "has_history", "hooked", "is_grad", "leaf_hooks", "placeholder", "requires_grad", "traced",
    )

    def __init__(
        self,
        requires_grad: bool,
        has_history: bool,
        traced: bool = False,
        is_grad: bool = False,
        leaf_hooks: tuple[tuple[Any, ...], ...] = NO_LEAF_HOOKS,
        hooked: tuple[Any, Any] | None = None,
    ) -> None:
        self.requires_grad = requires_grad
        # A leaf's hooks, per kind kept on leaves (``LEAF_KINDS``), each in order: JAX's AD calls those of the kinds
        # it lowers (NOTE [Hooks on JAX's AD]); the engine run on the tensor a trace unflattens (a model passed to
        # an ``xgrad.compile`` step or a ``jax.jit``) runs them all, as on the tensor it stands for.
        self.leaf_hooks = leaf_hooks
        self.hooked = hooked  # (array, that array through the hooks) when the tensor holds the latter
        self.placeholder = False  # a placeholder node's: it matches any Tensor node (NOTE [Tensor as a pytree])
        self.has_history = has_history
        self.traced = traced
        self.is_grad = is_grad
        # What a trace of it does depends on these (NOTE [Tensors that require grad become arrays]).
        self.grad_enabled = requires_grad and is_grad_enabled()
        self.compiled = self.grad_enabled and traced and _in_compiled_step()

    def _raises(self) -> bool:
        """Whether a trace that takes this tensor in raises (on its history, or converting it to an array)."""
        return self.compiled if self.traced else self.grad_enabled or self.has_history

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _TensorMeta):
            return False
        if self.placeholder or other.placeholder:
            return True
        if self.traced and other.traced:  # outputs and carries inside a trace (lax.scan, cond branches)
            return self.compiled == other.compiled
        if self.traced or other.traced:  # a jitted function called both inside and outside a trace
            return self._raises() == other._raises()
        if self.has_history != other.has_history or self.leaf_hooks != other.leaf_hooks:
            return False
        if self.is_grad or other.is_grad:
            return True
        return self.requires_grad == other.requires_grad and self.grad_enabled == other.grad_enabled

    def __hash__(self) -> int:
        return 0

    def same_as(self, other: _TensorMeta) -> bool:
        """Whether every field is the same (``==`` ignores some): one may stand for the other."""
        if (
            self.requires_grad != other.requires_grad
            or self.has_history != other.has_history
            or self.traced != other.traced
            or self.is_grad != other.is_grad
            or self.grad_enabled != other.grad_enabled
            or self.compiled != other.compiled
            or self.placeholder != other.placeholder
            or self.hooked is not other.hooked
            or any(len(mine) != len(theirs) for mine, theirs in zip(self.leaf_hooks, other.leaf_hooks, strict=True))
        ):
            return False
        return all(
            a is b for mine, theirs in zip(self.leaf_hooks, other.leaf_hooks, strict=True) for a, b in zip(mine, theirs, strict=True)
        )

    def __repr__(self) -> str:
        return f"Tensor(requires_grad={self.requires_grad})"


# NOTE [JAX boundary]
# A Tensor is a pytree of its array, so JAX transformations and ``jax.device_put`` see
# the array. Autograd history cannot cross a JAX boundary, and never silently:
# * A Tensor with history going into a transformation (an argument of jax.jit, vmap,
#   grad) raises when the transformation traces it: the traced function could not
#   reach the graph behind it. Its metadata keeps it out of jit caches traced for a
#   leaf (``_TensorMeta.__eq__``), so a cache hit never skips the error.
# * What a traced function returns comes out as Tensors without history: the graph
#   recorded inside the trace (for a ``backward()`` there) belongs to the trace. Used
#   where a gradient is needed, such a Tensor raises (NOTE [Outputs of JAX
#   transformations]).
# * A Tensor with history that comes back concrete from ``jax.device_put`` or a
#   ``tree_map`` (flattened outside any trace) raises instead of becoming a leaf whose
#   gradients go nowhere.
ERR_HISTORY_CROSSES_JAX = (
    "a Tensor with autograd history came out of jax.device_put or a tree_map, which would cut its graph. "
    "Use tensor.to(device) to move a tensor differentiably, xgrad.compile(fn) to jit xgrad code that records "
    "autograd, or tensor.detach() to drop the history first."
)
ERR_HISTORY_INTO_JAX = (
    "a Tensor with autograd history was passed into a JAX function or transformation (jnp.sin, jax.jit, jax.vmap, "
    "...){where}: JAX computes with its value only, so the gradient would stop there. Use the xgrad op of the same "
    "name (xgrad.sin(t) for jnp.sin(t)), wrap a JAX function with xgrad.from_jax(fn) to make it differentiable, "
    "transform xgrad code with xgrad.func or jit it with xgrad.compile(fn); or pass t.detach() for the value only."
)
# NOTE [Tensors that require grad become arrays]
# ``jnp.sin(t)`` converts ``t`` through ``__jax_array__`` and returns a plain array: no
# graph. On a tensor that requires grad, with grad mode on, that would lose the gradient
# at one missing ``xgrad.`` prefix, so it raises, as PyTorch's ``numpy()`` does. Inside a
# plain JAX transformation (the array is a tracer) the conversion is JAX's to
# differentiate and goes through; inside an ``xgrad.compile`` step it raises as in eager.
# A ``jax.Array`` on the left of an operator (``jnp_array * t``) converts the Tensor the
# same way: JAX's public protocol has no way to defer to the Tensor's reflected operator.
# NOTE [Outputs of JAX transformations]
# A plain ``jax.jit``/``jax.vmap`` of xgrad code on tensors that require grad records
# xgrad's graph inside its trace, and that graph cannot reach the caller's tensors: what
# comes out has no history. Used as a value (inference, metrics) that is right; used in
# a graph that requires grad it would silently lose the gradient through the call
# (``jax.jit(f)(t) + (t * 3).sum()``). So such an output remembers where it was made,
# and recording an op that mixes it with tensors that require grad raises
# ``ERR_CUT_BY_JAX`` there, naming the fixes.
ERR_CUT_BY_JAX = (
    "a Tensor that came out of a plain JAX transformation (jax.jit, jax.vmap, ...) of xgrad code on tensors that "
    "require grad{where} is used in a computation that requires grad: its graph stayed inside the transformation, "
    "so the gradient through that call would be lost. Use xgrad.compile(fn) to jit xgrad code that records "
    "autograd, xgrad.from_jax(fn) for a JAX function, or xgrad.func's transforms (they keep the history); or "
    "call the transformation under xgrad.no_grad(), or .detach() its result, if you want its value only."
)
# NOTE [State written inside a JAX transformation]
# A Tensor passed into a plain JAX transformation (a module's buffer or parameter, an
# argument) is a new Tensor around a tracer inside it. Writing it in place there (a
# BatchNorm's running statistics in train mode, ``optimizer.step()``, ``t.add_(1)``)
# changes that inner Tensor only: JAX returns what the function returns, and the
# caller's tensor would keep its old value, silently. So that write raises, naming the
# ways that keep it: ``xgrad.compile``, which threads module and optimizer state
# through its program and writes it back, or an update kept functional.
ERR_STATE_WRITTEN_IN_JAX = (
    "a Tensor passed into a plain JAX transformation (jax.jit, jax.vmap, jax.grad, ...) was modified in place "
    "inside it{where}: the caller's tensor would keep its old value (a BatchNorm's running statistics in train "
    "mode, an optimizer step). Use xgrad.compile(fn), which writes module and optimizer state back after each "
    "call; or keep the update functional (return the new values, e.g. xgrad.func.functional_call with the buffers "
    "passed in); or call model.eval() for a forward that writes nothing."
)
ERR_REQUIRES_GRAD_TO_JAX = (
    "Can't convert a Tensor that requires grad to a jax.Array: JAX would compute with its value only and the "
    "gradient would be lost{where}. Use the xgrad op of the same name on the Tensor (xgrad.sin(t) for jnp.sin(t); "
    "t * a rather than a * t for a jax.Array a), wrap a JAX function with xgrad.from_jax(fn) to make it "
    "differentiable, or use t.detach() (or xgrad.no_grad()) if you want the value only."
)


# NOTE [Tensor as a pytree]
# A Tensor is a pytree node with one child, its array, so jax.tree_util, optax and
# jax.device_put see the array inside. Three choices make trees of Tensors behave:
# * ``requires_grad`` rides along as metadata (``_TensorMeta``), and two Tensor nodes
#   compare equal when their flags agree or one of them is a gradient (a ``.grad``,
#   or what was built from one). A tree of parameters and the tree of their grads or
#   optax updates then have one structure, so ``optax.apply_updates(params, updates)``
#   and ``tree_map(lambda p, g: ..., params, grads)`` work, and what they build takes
#   the first tree's flags: the new parameters are leaves that require grad, ready for
#   the next forward. A jit cache never serves a call on a tensor that requires grad
#   from a trace made for one that does not (``jnp.sin(t.detach())`` before
#   ``jnp.sin(t)``): NOTE [Tensors that require grad become arrays].
# * Unflattening wraps array-likes (anything with ``shape`` and ``dtype``: arrays,
#   tracers, ``ShapeDtypeStruct``) as Tensors. A tuple or list comes back bare, so
#   ``tree_map(lambda p: p.shape, state_dict)`` gives shapes. Any other value (a
#   string, a number, ``None``, a ``bool`` mask, a library's per-leaf object) stays in
#   a Tensor node as a placeholder, so that ``tree_map`` keeps the tree's structure:
#   libraries that build trees leaf by leaf and zip them together again
#   (``eqx.partition``/``combine``, orbax's names and save arguments) rely on it.
#   ``tree_leaves`` of such a tree gives the values themselves. A placeholder node
#   matches any Tensor node: ``eqx.combine`` zips the ``None``s of a partition made
#   outside a transformation with the tracers inside it (``eqx.filter_grad``).
# * History never crosses a JAX boundary silently: NOTE [JAX boundary].
# A placeholder stands for a module's Tensor attribute in a tree built leaf by leaf; its
# leaf is the module's child, not the placeholder (NOTE [Module as a pytree]), so
# ``eqx.tree_at`` cannot find it as a node and takes it for a sequence of nodes.
ERR_PLACEHOLDER_LEN = (
    "this Tensor stands for a module's Tensor attribute in a tree built leaf by leaf (eqx.tree_at, eqx.partition, "
    "a tree_map): eqx.tree_at cannot select a Tensor attribute of an xgrad module. Select its module and replace "
    "that (where=lambda m: m.layer, with the new layer), or set the attribute itself (model.layer.bias = ...)."
)


def tree_flatten(self: core.Tensor) -> tuple[tuple[Any], _TensorMeta]:
    array = array_of(self)
    placeholder_meta = getattr(self, "_placeholder_meta", None)
    if placeholder_meta is not None:
        return (array,), placeholder_meta
    jax_hooks = getattr(self, "_jax_hooks", None)
    meta = _TensorMeta(
        self.requires_grad,
        self.grad_fn is not None,
        isinstance(array, jax.core.Tracer),
        getattr(self, "_is_grad", False),
        NO_LEAF_HOOKS if self.grad_fn is not None or not leaf_has_hooks(self) else _leaf_hooks(self),
        None if jax_hooks is None or array is jax_hooks[0] else (jax_hooks[0], array),
    )
    return (array,), meta


def tree_unflatten(meta: _TensorMeta, children: tuple[Any]) -> Any:
    (child,) = children
    if isinstance(child, core.Tensor):
        return child
    if not (hasattr(child, "shape") and hasattr(child, "dtype")):
        if isinstance(child, (tuple, list)):
            return child
        placeholder = core.Tensor(None)  # in a tree a library builds leaf by leaf: it flattens as the original
        placeholder._array = child  # any leaf (an int too: never read as the legacy Tensor(size) constructor)
        placeholder_meta = copy.copy(meta)
        placeholder_meta.placeholder = True
        placeholder._placeholder_meta = placeholder_meta
        return placeholder
    if meta.has_history:
        if isinstance(child, jax.core.Tracer):
            if not meta.traced:
                raise RuntimeError(ERR_HISTORY_INTO_JAX.format(where=user_site()))
        elif not meta.traced:
            raise RuntimeError(ERR_HISTORY_CROSSES_JAX)
        out = core.Tensor(child)  # a traced function's output: its graph stayed in the trace
        if not _in_compiled_step():
            out._cut_site = user_site()  # NOTE [Outputs of JAX transformations]
        return out
    on_jax = isinstance(child, jax.core.Tracer) and not _in_compiled_step()
    jax_hooks = None
    lowered = _lowered(meta.leaf_hooks) if on_jax and meta.leaf_hooks is not NO_LEAF_HOOKS else ()
    if lowered:
        if meta.hooked is not None and child is meta.hooked[1]:  # already through them (a tree_map in the trace)
            jax_hooks = meta.hooked[0], list(lowered)
        else:
            jax_hooks = child, list(lowered)
            child = hook_on_jax(child, lowered)
    # JAX may unflatten with abstract leaves: no dtype checks beyond the flag's own.
    t = core.Tensor(child)
    t._requires_grad = meta.requires_grad and is_differentiable_dtype(child.dtype)
    if meta.is_grad:
        t._is_grad = True
    if meta.leaf_hooks is not NO_LEAF_HOOKS:
        # Kept: the model optax builds has them, and a nested transformation runs them on its cotangents.
        _keep_leaf_hooks(t, meta.leaf_hooks)
    if jax_hooks is not None:
        t._jax_hooks = jax_hooks
    if (t._requires_grad or on_jax) and not meta.traced:
        # An argument of the trace it is unflattened in, never a constant it captured.
        t._entered_trace = get_opaque_trace_state(convention="xgrad")
    return t


ERR_TENSOR_WHERE_JAX_WANTS_AN_ARRAY = (
    "a Tensor was given where JAX wants an array{where}: jax.grad needs the function to return a scalar jax.Array "
    "(return loss.array, or use xgrad.func.grad, which takes functions returning Tensors), and lax functions take "
    "arrays (pass tensor.array, or use the xgrad op of the same name)."
)


class JaxArrayProtocol:
    """``Tensor.__jax_array__``: ``jax_array`` for ``jnp`` functions; when JAX's abstractification
    looks it up (``jax.grad``'s check of its output) it raises ``ERR_TENSOR_WHERE_JAX_WANTS_AN_ARRAY``,
    whose text names the fix, instead of JAX's error about ``__jax_array__``."""

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return jax_array
        if abstractifying(sys._getframe(1)):
            raise ValueError(ERR_TENSOR_WHERE_JAX_WANTS_AN_ARRAY.format(where=user_site()))
        return jax_array.__get__(obj, objtype)


def jax_array(self: core.Tensor) -> jax.Array:
    """The array, for ``jnp`` functions: they see the value only, untracked.

    A tensor that requires grad raises instead while grad mode is on, outside a
    plain JAX transformation (NOTE [Tensors that require grad become arrays]).

    >>> import jax.numpy as jnp, xgrad
    >>> t = xgrad.tensor([1.0, 2.0], requires_grad=True)
    >>> type(jnp.sin(t.detach())).__name__
    'ArrayImpl'
    >>> jnp.sin(t)
    Traceback (most recent call last):
    ...
    RuntimeError: Can't convert a Tensor that requires grad to a jax.Array: ...
    """
    array = array_of(self)
    if self.requires_grad and is_grad_enabled() and _converts_outside_jax(self, array):
        raise RuntimeError(ERR_REQUIRES_GRAD_TO_JAX.format(where=user_site()))
    return array

