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

import jax
import jax.numpy as jnp

from xgrad import step_trace
from xgrad.engine import engine_ops
from xgrad.engine.anomaly import record_forward_trace
from xgrad.engine.dual import ERR_TANGENT_SIZE, LEVEL, set_tangent, tangent_of, tangents_off
from xgrad.engine.node import NO_EDGE, InputMetadata, Node, gradient_edge
from xgrad.engine.saved import ERR_FREED, SavedTensor
from xgrad.grad_mode import _state as _grad_state
from xgrad.grad_mode import graph_off, no_grad
from xgrad.step_trace import array_of
from xgrad.tensor import ERR_LEAF_INPLACE, Tensor

__all__ = ["Function", "FunctionCtx", "FunctionNode", "once_differentiable"]

ERR_NUM_GRADS = "function {name} returned an incorrect number of gradients (expected {expected}, got {got})"
ERR_GRAD_FOR_NON_TENSOR = (
    "function {name} returned a gradient different than None at position {i}, but the corresponding "
    "forward input was not a Tensor"
)
ERR_ONCE_DIFFERENTIABLE = "trying to differentiate twice a function that was marked with @once_differentiable"
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
        grads = list(result) if isinstance(result, tuple) else [result]
        expected = len(self.next_edges)
        if len(grads) > expected and all(g is None for g in grads[expected:]):
            del grads[expected:]
        if len(grads) != expected:
            raise RuntimeError(ERR_NUM_GRADS.format(name=self.name(), expected=expected, got=len(grads)))
        for i, g in enumerate(grads):
            if g is not None and not self.input_is_tensor[i]:
                raise RuntimeError(ERR_GRAD_FOR_NON_TENSOR.format(name=self.name(), i=i))
        return grads

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
        on_jax = _on_jax_trace(args)
        if on_jax and not cls._traced_in_step:
            return _apply_on_jax(cls, ctx, args, kwargs, separate_setup)
        record = _grad_state.enabled
        needs = tuple(record and isinstance(a, Tensor) and a.requires_grad for a in args)
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


def _on_jax_trace(args: tuple[Any, ...]) -> bool:
    """Whether ``apply`` runs on a plain JAX transformation's tracers (not an ``xgrad.compile`` step's)."""
    if step_trace.current() is not None:
        return False
    return any(isinstance(a, Tensor) and isinstance(a._array, jax.core.Tracer) for a in args)


ERR_DIRTY_ON_JAX = (
    "{name}.forward marked an input dirty (ctx.mark_dirty) under a JAX transformation (jax.grad, jax.jit, "
    "jax.vmap, xgrad.func): JAX arrays cannot be modified in place there. Return a new tensor instead of "
    "modifying the input, or run the step eagerly or under xgrad.compile."
)


# NOTE [Functions on JAX's AD]
# On a plain JAX transformation's tracers (``jax.grad(loss)(model)``, ``xgrad.func``,
# ``jax.jit``) a ``Function`` is a ``jax.custom_vjp``: JAX's AD calls the user's
# ``backward`` (after ``setup_context``/``forward``, with ``ctx.saved_tensors`` the
# residuals) instead of differentiating ``forward``, so a straight-through estimator
# gives eager's gradients on every route. A Function with ``jvp`` and no ``backward``
# is a ``jax.custom_jvp`` instead (forward mode, and reverse mode by JAX's transpose of
# it). The ``ctx`` stays on the Python side (its attributes are not JAX values); the
# tensors saved for backward are the residuals. ``needs_input_grad`` says which inputs
# JAX's AD is differentiating; an output no gradient reaches gives ``backward`` zeros,
# or ``None`` after ``ctx.set_materialize_grads(False)``; a ``None`` gradient is JAX's
# zero cotangent. The backward runs with recording off but JAX's AD on, so ``jax.grad``
# of ``jax.grad`` differentiates it as ``create_graph=True`` does, and
# ``once_differentiable`` raises there as in eager. Under ``jax.vmap``/``xgrad.func.vmap``
# JAX batches the forward and the backward (torch.func's ``generate_vmap_rule=True``).
# Non-differentiable outputs go through ``lax.stop_gradient``. Where xgrad records too
# (a tensor that requires grad, grad mode on), the outputs are one ``from_jax`` op
# whose backward is ``jax.vjp`` of the custom_vjp, so a ``backward()`` inside the
# trace runs the user's ``backward`` as well. xgrad's own Functions whose forward is
# the exact math (``_traced_in_step``: the reentrant checkpoint) are differentiated
# through their forward instead, as under ``xgrad.compile``.
def _overrides(cls: type[Function], name: str) -> bool:
    return getattr(cls, name) is not getattr(Function, name)


def _apply_on_jax(cls: type[Function], ctx: FunctionCtx, args: tuple[Any, ...], kwargs: dict[str, Any], separate_setup: bool) -> Any:
    positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    ctx._on_jax = True
    layout: dict[str, Any] = {}  # what the forward returned besides its arrays (filled when it runs)

    def forward(arrays: tuple[Any, ...], perturbed: tuple[bool, ...]) -> tuple[Any, ...]:
        inner = list(args)
        needs = [False] * len(args)
        for i, array, p in zip(positions, arrays, perturbed, strict=True):
            t = Tensor(array)
            t._requires_grad = args[i]._requires_grad
            inner[i] = t
            needs[i] = p
        ctx.needs_input_grad = tuple(needs)
        with no_grad(), tangents_off():
            if separate_setup:
                output = cls.forward(*inner, **kwargs)
                cls.setup_context(ctx, tuple(inner), output)
            else:
                output = cls.forward(ctx, *inner, **kwargs)
        if ctx._dirty:
            raise RuntimeError(ERR_DIRTY_ON_JAX.format(name=cls.__name__))
        raw = output if isinstance(output, tuple) else (output,)
        non_diff = {id(t) for t in ctx._non_differentiable}
        layout["tuple"] = isinstance(output, tuple)
        layout["raw"] = [None if isinstance(o, Tensor) else o for o in raw]
        return tuple(
            jax.lax.stop_gradient(o._array) if id(o) in non_diff else o._array for o in raw if isinstance(o, Tensor)
        )

    def grads_in(results: Any) -> tuple[Any, ...]:
        """The user's gradients for the tensor inputs, checked as the eager node checks them."""
        results = list(results) if isinstance(results, tuple) else [results]
        name = f"{cls.__name__}Backward"
        if len(results) > len(args) and all(g is None for g in results[len(args):]):
            del results[len(args):]
        if len(results) != len(args):
            raise RuntimeError(ERR_NUM_GRADS.format(name=name, expected=len(args), got=len(results)))
        out: list[Any] = []
        for i, g in enumerate(results):
            if g is not None and not isinstance(args[i], Tensor):
                raise RuntimeError(ERR_GRAD_FOR_NON_TENSOR.format(name=name, i=i))
        for i in positions:
            g, array = results[i], args[i]._array
            if g is None or not jnp.issubdtype(array.dtype, jnp.inexact):
                out.append(None)
                continue
            g = array_of(g) if isinstance(g, Tensor) else jnp.asarray(g)
            if g.shape != array.shape:
                g = array_of(engine_ops.sum_to(Tensor(g), array.shape))
            out.append(g.astype(array.dtype))
        return tuple(out)

    def grads_out(cotangents: tuple[Any, ...], avals: tuple[Any, ...]) -> list[Any]:
        """One gradient per forward output, as ``backward`` takes them (``None`` for non-tensors)."""
        it = iter(zip(cotangents, avals, strict=True))
        grads: list[Any] = []
        for o in layout["raw"]:
            if o is not None:
                grads.append(None)
                continue
            c, aval = next(it)
            if isinstance(c, jax.custom_derivatives.SymbolicZero) or c.dtype == jax.dtypes.float0:
                grads.append(Tensor(jnp.zeros(aval.shape, aval.dtype)) if ctx.materialize_grads else None)
            else:
                grads.append(Tensor(c))
        return grads

    tensors = [args[i] for i in positions]
    fn: Callable[..., tuple[Any, ...]]
    if _overrides(cls, "backward") or not _overrides(cls, "jvp"):

        @jax.custom_vjp
        def fn_vjp(*arrays: Any) -> tuple[Any, ...]:
            return forward(arrays, (False,) * len(arrays))

        def fwd(*primals: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            outs = forward(tuple(p.value for p in primals), tuple(p.perturbed for p in primals))
            saved = tuple(None if t is None else array_of(t) for t in ctx._to_save)
            ctx._to_save = ()
            layout["avals"] = tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in outs)
            return outs, saved

        def bwd(saved: tuple[Any, ...], cotangents: tuple[Any, ...]) -> tuple[Any, ...]:
            grads = grads_out(cotangents, layout["avals"])
            ctx._saved_values = tuple(None if a is None else Tensor(a) for a in saved)
            try:
                with graph_off():
                    return grads_in(cls.backward(ctx, *grads))
            finally:
                ctx._saved_values = None

        fn_vjp.defvjp(fwd, bwd, symbolic_zeros=True)
        fn = fn_vjp
    else:

        @jax.custom_jvp
        def fn_jvp(*arrays: Any) -> tuple[Any, ...]:
            return forward(arrays, (False,) * len(arrays))

        def jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            outs = forward(primals, (True,) * len(primals))
            ctx._saved_values = ctx._to_save_for_forward
            try:
                with graph_off(), tangents_off():
                    result = cls.jvp(ctx, *_tangents_in(args, positions, tangents))
            finally:
                ctx._saved_values = None
            results = result if isinstance(result, tuple) else (result,)
            tensor_results = [r for r, o in zip(results, layout["raw"], strict=False) if o is None]
            return outs, tuple(
                jnp.zeros_like(o) if r is None else array_of(r).astype(o.dtype) for r, o in zip(tensor_results, outs, strict=True)
            )

        fn_jvp.defjvp(jvp)
        fn = fn_jvp
    if _grad_state.enabled and any(t.requires_grad for t in tensors):
        outs = list(engine_ops.jax_function(fn, tensors))
    else:
        outs = [Tensor(a) for a in fn(*[t._array for t in tensors])]
    it = iter(outs)
    result = [next(it) if o is None else o for o in layout["raw"]]
    return tuple(result) if layout["tuple"] else result[0]


def _tangents_in(args: tuple[Any, ...], positions: list[int], tangents: tuple[Any, ...]) -> list[Any]:
    """One tangent per forward input, as ``jvp`` takes them (``None`` for non-tensors)."""
    full: list[Any] = [None] * len(args)
    for i, t in zip(positions, tangents, strict=True):
        full[i] = Tensor(t)
    return full


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

    @staticmethod
    def forward(ctx: FunctionCtx, num_outputs: int, *tensors: Any) -> Any:
        return tuple(Tensor(array_of(t)) if isinstance(t, Tensor) else t for t in tensors[:num_outputs])

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:
        raise RuntimeError(ERR_ONCE_DIFFERENTIABLE)


@jax.custom_vjp
def _raises_when_differentiated(x: Any) -> Any:
    return x


def _raise_at_differentiation(_: None, g: Any) -> Any:
    raise RuntimeError(ERR_ONCE_DIFFERENTIABLE)


_raises_when_differentiated.defvjp(lambda x: (x, None), _raise_at_differentiation)


def _once_differentiable_on_jax(t: Tensor) -> Tensor:
    """``t``'s value, with an identity whose JAX derivative raises (as ``_DelayedError`` in eager)."""
    if not jnp.issubdtype(t._array.dtype, jnp.inexact):
        return t
    return Tensor(_raises_when_differentiated(t._array))


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
            marked = tuple(_once_differentiable_on_jax(o) if isinstance(o, Tensor) else o for o in outs)
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
