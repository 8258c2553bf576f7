"""Custom differentiable functions: ``Function``, its ``FunctionCtx`` and ``once_differentiable``.

# NOTE [Function nodes]
# ``Function.apply`` runs ``forward`` under ``no_grad`` and, when grad mode is on and
# an input requires grad, records one ``FunctionNode`` whose next edges are the
# forward's positional arguments (``NO_EDGE`` for non-tensors and tensors that do not
# require grad) and whose inputs are the forward's outputs. Tensors given to
# ``ctx.save_for_backward`` become ``SavedTensor``s once the outputs exist, so a saved
# output is saved as an output (a weak reference, no cycle), saved-tensor hooks apply
# and version checks run on unpack. As for ``PrimitiveNode``, ``apply`` is
# ``unpack_saved`` followed by the pure ``compute(grads, saved_values)``, which runs
# the user's ``backward`` on whatever values it is given (the compiled path may pass
# traced ones).
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from xgrad import step_trace
from xgrad.dual import ERR_TANGENT_SIZE, LEVEL, set_tangent, tangent_of, tangents_off
from xgrad.engine import engine_ops
from xgrad.engine.anomaly import record_forward_trace
from xgrad.engine.function_on_jax import (
    ERR_ONCE_DIFFERENTIABLE,
    apply_on_jax,
    checked_grads,
    on_jax_trace,
    raises_when_differentiated,
)
from xgrad.engine.function_vmap import NOT_HANDLED, apply_vmap_rule
from xgrad.engine.node import NO_EDGE, InputMetadata, Node, gradient_edge
from xgrad.engine.saved import ERR_FREED, SavedTensor
from xgrad.grad_mode import _state as _grad_state
from xgrad.grad_mode import graph_off, no_grad
from xgrad.step_trace import array_of
from xgrad.tensor import ERR_LEAF_INPLACE, Tensor
from xgrad.tensor.jax_boundary import ERR_CUT_BY_JAX

__all__ = ["Function", "FunctionCtx", "FunctionNode", "once_differentiable"]

ERR_DIRTY_NOT_OUTPUT = "Some elements marked as dirty during the forward method were not returned as output."
ERR_NOT_OUTPUT = "{what} only accepts tensors that are outputs of forward; argument {i} is not one"
ERR_LEGACY_FUNCTION = (
    "Legacy autograd function with non-static forward method is deprecated. Please use new-style autograd function "
    "with static forward method. (Example: https://pytorch.org/docs/stable/autograd.html#torch.autograd.Function)"
)
ERR_DIRTY_VIEW_MULTIPLE_OUTPUTS = (
    "If your Function modifies inplace an input that is a view of another Tensor, your Function cannot return "
    "more than one Tensor. This is not supported by the current autograd engine. You should either make sure the "
    "input is not a view (using .clone() for example) or make your Function only return one Tensor (potentially "
    "splitting it into two Functions: one doing the inplace that returns a single Tensor and a second one that "
    "does the other operations)."
)


# ``FunctionNode.compute``'s saved values in eager mode: ``ctx.saved_tensors`` unpacks
# the node's saved tensors at each access, as PyTorch's does.
UNPACK_ON_ACCESS: Any = object()



# torch.func's transforms need a Function's forward without ``ctx`` (``setup_context`` separate). On
# JAX's own routes (``jax.grad`` of xgrad code, ``eqx.filter_grad``) a ``forward(ctx, ...)`` runs as
# well (NOTE [Functions on JAX's AD]); inside ``xgrad.func``'s transforms xgrad raises torch.func's error.
ERR_SETUP_CONTEXT_UNDER_TRANSFORM = (
    "In order to use an autograd.Function with functorch transforms (vmap, grad, jvp, jacrev, ...), it must "
    "override the setup_context staticmethod: forward(*args) without ctx, and setup_context(ctx, inputs, output) "
    "saving what backward needs."
)

class FunctionCtx:
    """The ``ctx`` a custom ``Function``'s ``forward``/``setup_context`` and ``backward`` share.

    Any attribute may be set on it; the methods below are the ones autograd reads.

    >>> import xgrad
    >>> class Square(xgrad.autograd.Function):
    ...     @staticmethod
    ...     def forward(ctx, x):
    ...         ctx.save_for_backward(x)
    ...         return x * x
    ...     @staticmethod
    ...     def backward(ctx, g):
    ...         (x,) = ctx.saved_tensors
    ...         return 2 * x * g
    >>> x = xgrad.tensor([3.0], requires_grad=True)
    >>> Square.apply(x).sum().backward()
    >>> x.grad.tolist()
    [6.0]
    """

    def __init__(self) -> None:
        self.needs_input_grad: tuple[bool, ...] = ()
        self.materialize_grads = True
        self._to_save: tuple[Tensor | None, ...] = ()
        self._to_save_for_forward: tuple[Tensor | None, ...] = ()
        self._non_differentiable: tuple[Tensor, ...] = ()
        self._dirty: tuple[Tensor, ...] = ()
        self._node: FunctionNode | None = None
        # Set by ``FunctionNode.compute`` while ``backward`` runs: the values it was given.
        self._saved_values: Any = None  # a tuple, or UNPACK_ON_ACCESS
        self._on_jax = False  # the Function runs as JAX's custom_vjp (NOTE [Functions on JAX's AD])

    def save_for_backward(self, *tensors: Tensor | None) -> None:
        """Keep ``tensors`` for ``backward``, where ``ctx.saved_tensors`` returns them.

        Call it once, in ``forward`` or ``setup_context``; ``None`` entries are allowed.
        """
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward can only save Tensors or None, but argument {i} is {type(t).__name__}")
        self._to_save = tensors

    def save_for_forward(self, *tensors: Tensor | None) -> None:
        """Keep ``tensors`` for ``jvp``, where ``ctx.saved_tensors`` returns them (forward-mode AD)."""
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_forward expects all arguments to be tensors; but got {type(t).__name__} at {i}")
        self._to_save_for_forward = tensors

    @property
    def saved_tensors(self) -> tuple[Tensor | None, ...]:
        """The tensors given to ``save_for_backward``, checked against in-place changes.

        As in PyTorch, each access unpacks again: version checks and saved-tensor unpack
        hooks run per access (the compiled backward passes its values instead).
        """
        values = self._saved_values
        if values is not None and values is not UNPACK_ON_ACCESS:
            return values
        node = self._node
        if node is None:
            return self._to_save
        return node.unpack_saved()

    def mark_non_differentiable(self, *tensors: Tensor) -> None:
        """Declare outputs that get no gradient: they do not require grad, and their grad reaches ``backward`` as zeros (or ``None``)."""
        self._non_differentiable = tensors

    def mark_dirty(self, *tensors: Tensor) -> None:
        """Declare inputs that ``forward`` modified in place; they must be returned as outputs."""
        self._dirty = tensors

    def set_materialize_grads(self, value: bool) -> None:
        """Whether ``None`` output grads reach ``backward`` as zeros (the default) or as ``None``."""
        self.materialize_grads = bool(value)


class FunctionNode(Node):
    """The backward node of one ``Function.apply`` call; named ``<ClassName>Backward``."""

    __slots__ = ("ctx", "function", "input_is_tensor", "saved")

    def __init__(
        self,
        function: type[Function],
        ctx: FunctionCtx,
        next_edges: tuple[Any, ...],
        input_metadata: tuple[InputMetadata | None, ...],
        input_is_tensor: tuple[bool, ...],
    ) -> None:
        super().__init__(next_edges, input_metadata)  # type: ignore[arg-type]
        self.function = function
        self.ctx = ctx
        self.input_is_tensor = input_is_tensor
        self.saved: list[SavedTensor | None] | None = []
        record_forward_trace(self)

    def name(self) -> str:
        return f"{self.function.__name__}Backward"

    def unpack_saved(self) -> tuple[Tensor | None, ...]:
        """The saved tensors, version-checked and passed through saved-tensor hooks."""
        if self.saved is None:
            raise RuntimeError(ERR_FREED)
        return tuple(s.unpack(self) if s is not None else None for s in self.saved)

    def apply(self, grads: list[Tensor | None]) -> list[Tensor | None]:
        if self.ctx.materialize_grads:
            grads = [
                Tensor(jnp.zeros(m.shape, m.dtype, device=m.sharding)) if g is None and m is not None else g
                for g, m in zip(grads, self.input_metadata, strict=True)
            ]
        trace = step_trace.current()
        if trace is not None:  # an ``xgrad.compile`` step may run it on the host (NOTE [Functions in a compiled step])
            outputs = trace.function_backward(self, grads)
            if outputs is not None:
                return outputs
        return self.compute(grads, UNPACK_ON_ACCESS)

    def compute(self, grads: list[Any], saved_values: tuple[Any, ...]) -> list[Any]:
        """Run ``backward`` on ``grads`` with ``ctx.saved_tensors`` reading ``saved_values``.

        Pure in the node's state given the values: it never unpacks, so traced values
        work too. ``UNPACK_ON_ACCESS`` (eager) makes each access unpack instead.
        """
        ctx = self.ctx
        ctx._saved_values = saved_values
        try:
            result = self.function.backward(ctx, *grads)
        finally:
            ctx._saved_values = None
        return self._check_grads(result)

    def _check_grads(self, result: Any) -> list[Any]:
        return checked_grads(result, self.name(), self.input_is_tensor)

    def device(self) -> Any:
        # Non-tensor outputs have no metadata: the first tensor output decides.
        for meta in self.input_metadata:
            if meta is not None:
                if meta.sharding is None:
                    return None
                devices = meta.sharding.device_set
                return next(iter(devices)) if len(devices) == 1 else None
        return None

    def release_variables(self) -> None:
        if self.saved:
            for s in self.saved:
                if s is not None:
                    s.release()
            self.saved = None


ERR_VIEW_OF_LEAF = "a view of a leaf Variable that requires grad is being used in an in-place operation."


def _overrides_setup_context(cls: type[Function]) -> bool:
    return getattr(cls.setup_context, "__func__", cls.setup_context) is not _base_setup_context


class Function:
    """Base class for differentiable operations with a hand-written backward.

    Subclasses define ``forward`` and ``backward`` as static methods, and call
    ``apply``. ``forward(ctx, *args, **kwargs)`` computes the outputs (under
    ``no_grad``); alternatively ``forward(*args, **kwargs)`` plus
    ``setup_context(ctx, inputs, output)``. ``backward(ctx, *grads)`` receives one
    gradient per output and returns one per positional input (``None`` for inputs
    that need none).

    >>> import xgrad
    >>> class Cube(xgrad.autograd.Function):
    ...     @staticmethod
    ...     def forward(ctx, x):
    ...         ctx.save_for_backward(x)
    ...         return x ** 3
    ...     @staticmethod
    ...     def backward(ctx, g):
    ...         (x,) = ctx.saved_tensors
    ...         return 3 * x ** 2 * g
    >>> x = xgrad.tensor(2.0, requires_grad=True)
    >>> y = Cube.apply(x); y.grad_fn.name()
    'CubeBackward'
    >>> y.backward(); x.grad.item()
    12.0
    """

    # xgrad's own Functions (a reentrant checkpoint, ...) write the step's state from their backward: an
    # ``xgrad.compile`` step traces them in, where a user's backward runs on the host at every call
    # (NOTE [Functions in a compiled step]).
    _traced_in_step = False
    #: Under ``xgrad.func.vmap``: ``True`` lets JAX batch ``forward`` and ``backward``; else the ``vmap`` staticmethod runs.
    generate_vmap_rule = False

    @staticmethod
    def forward(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("You must implement the forward function for custom autograd.Function.")

    @staticmethod
    def setup_context(ctx: FunctionCtx, inputs: tuple[Any, ...], output: Any) -> None:
        raise NotImplementedError("setup_context is not implemented.")

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:
        raise NotImplementedError("You must implement either the backward or vjp method for your custom autograd.Function to use it with backward mode AD.")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(ERR_LEGACY_FUNCTION)

    @staticmethod
    def vmap(info: Any, in_dims: tuple[int | None, ...], *args: Any) -> Any:
        """The batched ``forward`` under ``xgrad.func.vmap`` (NOTE [Functions under vmap]): gets the whole batch,
        each input's batch dim (``None``: not batched) and ``info`` (``batch_size``, ``randomness``); returns
        ``(output, out_dims)``."""
        raise NotImplementedError(
            "To use autograd.Function with vmap, you must either override the vmap staticmethod or set "
            "generate_vmap_rule=True."
        )

    @staticmethod
    def jvp(ctx: FunctionCtx, *tangents: Any) -> Any:
        """Forward-mode AD: one tangent per forward input (zeros for a tensor without one,
        ``None`` for a non-tensor) to one tangent per output; ``ctx.saved_tensors`` holds
        what ``ctx.save_for_forward`` kept."""
        raise NotImplementedError("You must implement the jvp function for custom autograd.Function to use it with forward mode AD.")

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        """Run ``forward`` on ``args`` and record the backward node when a gradient is needed."""
        ctx = FunctionCtx()
        separate_setup = _overrides_setup_context(cls)
        if separate_setup:
            # setup_context sees the inputs as forward's signature binds them, defaults
            # filled in, as in PyTorch (they are the node's inputs too).
            args, kwargs = _bind_default_args(cls, args, kwargs)
        on_jax = on_jax_trace(args)
        if on_jax and not separate_setup and _grad_state.transform is not None and not cls._traced_in_step:
            raise RuntimeError(ERR_SETUP_CONTEXT_UNDER_TRANSFORM)  # torch.func's rule, in its transforms only
        if on_jax and not cls._traced_in_step:
            batched = apply_vmap_rule(cls, args, kwargs, has_vmap_rule=cls.vmap is not Function.vmap)
            if batched is not NOT_HANDLED:
                return batched
            uses_backward = cls.backward is not Function.backward or cls.jvp is Function.jvp
            return apply_on_jax(cls, ctx, args, kwargs, separate_setup, uses_backward)
        record = _grad_state.enabled
        needs = tuple(record and isinstance(a, Tensor) and a.requires_grad for a in args)
        if any(needs):
            for a in args:
                cut_site = getattr(a, "_cut_site", None) if isinstance(a, Tensor) else None
                if cut_site is not None:  # NOTE [Outputs of JAX transformations]
                    raise RuntimeError(ERR_CUT_BY_JAX.format(where=cut_site))
        ctx.needs_input_grad = needs
        # Edges point at the inputs' graph positions before forward: a dirty input moves.
        edges = tuple(gradient_edge(a) if need else NO_EDGE for a, need in zip(args, needs, strict=True))
        dual = LEVEL.current is not None and any(isinstance(a, Tensor) and tangent_of(a) is not None for a in args)
        # The forward sees plain values, as in PyTorch: its inputs show no tangent and its
        # ops compute none (``jvp`` gives the outputs theirs).
        stashed = [(a, a._fw_grad) for a in args if isinstance(a, Tensor) and a._fw_grad is not None] if dual else []
        for a, _ in stashed:
            a._fw_grad = None
        try:
            # xgrad's own Functions compute their exact math in the forward: on JAX's AD
            # it is differentiated as it is (NOTE [Functions on JAX's AD]).
            with graph_off() if on_jax else no_grad(), tangents_off():
                if separate_setup:
                    output = cls.forward(*args, **kwargs)
                    cls.setup_context(ctx, args, output)
                else:
                    output = cls.forward(ctx, *args, **kwargs)
        finally:
            for a, fw in stashed:
                a._fw_grad = fw
        if any(needs):
            output = _wrap_outputs(cls, ctx, args, edges, output)
        if dual:
            _forward_ad(cls, ctx, args, output)
        return output


_base_setup_context = Function.setup_context


_forward_signatures: weakref.WeakKeyDictionary[type[Function], inspect.Signature] = weakref.WeakKeyDictionary()


def _bind_default_args(cls: type[Function], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` bound to ``cls.forward``'s signature with its defaults applied."""
    signature = _forward_signatures.get(cls)
    if signature is None:
        signature = _forward_signatures[cls] = inspect.signature(cls.forward)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.args, bound.kwargs


def _wrap_outputs(cls: type[Function], ctx: FunctionCtx, args: tuple[Any, ...], edges: tuple[Any, ...], output: Any) -> Any:
    """Give ``output`` the new node as ``grad_fn``, and turn ``ctx``'s saved tensors into ``SavedTensor``s."""
    is_tuple = isinstance(output, tuple)
    raw = output if is_tuple else (output,)
    dirty = {id(t) for t in ctx._dirty}
    non_diff = {id(t) for t in ctx._non_differentiable}
    input_ids = {id(a) for a in args if isinstance(a, Tensor)}
    returned = {id(o) for o in raw if isinstance(o, Tensor)}
    for i, t in enumerate(ctx._non_differentiable):
        if id(t) not in returned:
            raise ValueError(ERR_NOT_OUTPUT.format(what="mark_non_differentiable", i=i))
    if not dirty <= returned:
        raise RuntimeError(ERR_DIRTY_NOT_OUTPUT)
    metadata = tuple(InputMetadata.of(o._array) if isinstance(o, Tensor) else None for o in raw)
    node = FunctionNode(cls, ctx, edges, metadata, tuple(isinstance(a, Tensor) for a in args))
    ctx._node = node
    wrapped: dict[int, Tensor] = {}
    outs = []
    for i, o in enumerate(raw):
        if not isinstance(o, Tensor):
            outs.append(o)
            continue
        differentiable = id(o) not in non_diff and jnp.issubdtype(o._array.dtype, jnp.inexact)
        if id(o) in dirty:
            if o._view is not None and sum(isinstance(r, Tensor) for r in raw) > 1:
                raise RuntimeError(ERR_DIRTY_VIEW_MULTIPLE_OUTPUTS)
            new = _rebase_history(o, node, i) if differentiable else o
        elif not differentiable:
            new = o if id(o) not in input_ids else Tensor(array_of(o))
        elif id(o) in input_ids:
            # A fresh tensor for each return of an input (PyTorch returns a view of it):
            # the input keeps its history.
            new = Tensor._from_graph(o._array, node, i)
        elif id(o) in wrapped:
            # The same tensor returned again is the same output object, as in PyTorch,
            # where each return sets its history again: the last position wins.
            new = wrapped[id(o)]
            new._output_nr = i
        else:
            new = Tensor._from_graph(o._array, node, i)
        wrapped.setdefault(id(o), new)
        outs.append(new)
    try:
        node.saved = [_save(t, wrapped, returned, node.function.__name__) for t in ctx._to_save]
    except BaseException:
        # A pack hook raised (a checkpoint's recomputation stops this way): nothing may
        # keep the tensors to save, and the ctx <-> node cycle must not outlive this call.
        ctx._node = None
        raise
    finally:
        ctx._to_save = ()
    return tuple(outs) if is_tuple else outs[0]


def _forward_ad(cls: type[Function], ctx: FunctionCtx, args: tuple[Any, ...], output: Any) -> None:
    """Give ``output``'s tensors the tangents ``cls.jvp`` computes from the inputs' tangents."""
    tangents: list[Tensor | None] = []
    for a in args:
        if not isinstance(a, Tensor):
            tangents.append(None)
            continue
        t = tangent_of(a)
        tangents.append(t if t is not None else Tensor(jnp.zeros(a.shape, a.dtype)))
    ctx._saved_values = ctx._to_save_for_forward
    try:
        with tangents_off():
            result = cls.jvp(ctx, *tangents)
    finally:
        ctx._saved_values = None
    outs = output if isinstance(output, tuple) else (output,)
    results = result if isinstance(result, tuple) else (result,)
    if len(results) != len(outs):
        raise RuntimeError(
            f"{cls.__name__}.jvp returned an incorrect number of forward gradients (expected {len(outs)}, got {len(results)})"
        )
    for o, t in zip(outs, results, strict=True):
        if not isinstance(o, Tensor) or t is None or not jnp.issubdtype(o.dtype, jnp.inexact):
            continue
        if t.shape != o.shape:
            raise RuntimeError(ERR_TANGENT_SIZE.format(primal=list(o.shape), tangent=list(t.shape)))
        set_tangent(o, t)


def _rebase_history(tensor: Tensor, node: FunctionNode, output_nr: int) -> Tensor:
    """Make the in-place-modified input ``tensor`` an output of ``node`` (``mark_dirty``).

    A view's new value is written through to its base, so the base's history records
    it and the view (regenerated from the base) leads through ``node``.
    """
    if tensor._view is not None:
        base = tensor._view.base
        if base.grad_fn is None and base._requires_grad:
            raise RuntimeError(ERR_VIEW_OF_LEAF)
        engine_ops.write_through(tensor, Tensor._from_graph(tensor._array, node, output_nr))
        return tensor
    if tensor.grad_fn is None and tensor._requires_grad:
        raise RuntimeError(ERR_LEAF_INPLACE)
    tensor.grad_fn = node
    tensor._output_nr = output_nr
    if tensor._retains_grad:
        tensor._install_retains_grad_hook()
    return tensor


def _save(tensor: Tensor | None, wrapped: dict[int, Tensor], returned: set[int], saver: str) -> SavedTensor | None:
    if tensor is None:
        return None
    if id(tensor) in returned:
        return SavedTensor(wrapped[id(tensor)], is_output=True, saver=saver)
    return SavedTensor(tensor, is_output=False, saver=saver)


class _DelayedError(Function):
    """Aliases of a ``once_differentiable`` backward's results whose own backward raises.

    Its inputs are the results (as aliases) and the incoming grads that require grad,
    so a second differentiation reaches it from whatever those grads depend on.
    """

    generate_vmap_rule = True  # an identity: JAX batches it (NOTE [Functions under vmap])

    @staticmethod
    def forward(ctx: FunctionCtx, num_outputs: int, *tensors: Any) -> Any:
        return tuple(Tensor(array_of(t)) if isinstance(t, Tensor) else t for t in tensors[:num_outputs])

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:
        raise RuntimeError(ERR_ONCE_DIFFERENTIABLE)


def once_differentiable(backward: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a ``Function.backward`` that is not itself differentiable.

    It runs under ``no_grad``; under ``create_graph=True`` its results are recorded so
    that differentiating them raises a clear error instead of silently giving zeros.

    >>> import xgrad
    >>> class Square(xgrad.autograd.Function):
    ...     @staticmethod
    ...     def forward(ctx, x):
    ...         ctx.save_for_backward(x)
    ...         return x * x
    ...     @staticmethod
    ...     @xgrad.autograd.once_differentiable
    ...     def backward(ctx, g):
    ...         (x,) = ctx.saved_tensors
    ...         return 2 * x * g
    >>> x = xgrad.tensor(3.0, requires_grad=True)
    >>> Square.apply(x).backward(); x.grad.item()
    6.0
    """

    @functools.wraps(backward)
    def wrapper(ctx: FunctionCtx, *grads: Any) -> Any:
        if ctx._on_jax:
            # Recording is off already; JAX's AD must see the results' dependence to raise
            # where it differentiates them (NOTE [Functions on JAX's AD]).
            outputs = backward(ctx, *grads)
            outs = outputs if isinstance(outputs, tuple) else (outputs,)
            marked = tuple(raises_when_differentiated(o) if isinstance(o, Tensor) else o for o in outs)
            return marked if isinstance(outputs, tuple) else marked[0]
        with no_grad():
            outputs = backward(ctx, *grads)
        if not _grad_state.enabled or not any(isinstance(g, Tensor) and g.requires_grad for g in grads):
            return outputs
        outs = outputs if isinstance(outputs, tuple) else (outputs,)
        connected = [g for g in grads if isinstance(g, Tensor) and g.requires_grad]
        marked = _DelayedError.apply(len(outs), *outs, *connected)
        return marked if isinstance(outputs, tuple) else marked[0]

    return wrapper
