"""Module hooks: forward pre-hooks, forward hooks and full backward (pre-)hooks, per module and global.

# NOTE [Module hooks]
# ``Module.__call__`` runs what PyTorch's ``Module._call_impl`` runs, in its order: the
# global forward pre-hooks, then the module's (each may replace the positional args, or
# with ``with_kwargs`` the ``(args, kwargs)``); then, when backward hooks exist, the
# positional Tensor args pass through ``BackwardHookFunction`` (an identity
# ``autograd.Function``) so that its node sees the gradients w.r.t. the module's inputs;
# ``forward``; the global and then the module's forward hooks (each may replace the
# output); and the output's Tensors pass through a second ``BackwardHookFunction``, whose
# node sees the gradients w.r.t. the module's outputs. A pre-hook on the output node runs
# the backward pre-hooks and keeps ``grad_output``; a post-hook on the input node runs the
# backward hooks with ``(module, grad_input, grad_output)``. That is PyTorch's
# ``torch.utils.hooks.BackwardHook``; because the hooks are node hooks, the compiled
# backward and ``xgrad.compile`` run them at their point on concrete values as any other
# node hook. Forward hooks are plain Python in the forward: under ``xgrad.compile``
# those marked ``pure_hook`` are traced in, and others make the step run eagerly (NOTE
# [Python state in a compiled step]), so they run at every call.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from xgrad import step_trace
from xgrad.engine import engine_ops
from xgrad.engine.compiled.switch import pure_hook
from xgrad.engine.function import Function, FunctionCtx
from xgrad.engine.function_on_jax import on_jax_trace
from xgrad.engine.hooks import RemovableHandle
from xgrad.grad_mode import is_grad_enabled
from xgrad.step_trace import array_of
from xgrad.tensor import Tensor
from xgrad.tensor.jax_boundary import identity_with_vjp

__all__ = [
    "BackwardHook", "ModuleHooks", "RemovableHandle", "register_module_forward_hook",
    "register_module_forward_pre_hook", "register_module_full_backward_hook", "register_module_full_backward_pre_hook",
]

HookDict = OrderedDict[int, Callable[..., Any]]

_global_forward_pre_hooks: HookDict = OrderedDict()
_global_forward_hooks: HookDict = OrderedDict()
_global_forward_hooks_with_kwargs: OrderedDict[int, bool] = OrderedDict()
_global_forward_hooks_always_called: OrderedDict[int, bool] = OrderedDict()
_global_backward_pre_hooks: HookDict = OrderedDict()
_global_backward_hooks: HookDict = OrderedDict()

# A module's hook dicts, PyTorch's attribute names, made for each module by ``Module.__new__``.
HOOK_DICTS = (
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called", "_backward_pre_hooks", "_backward_hooks",
)


class _Handle(RemovableHandle):
    """A ``RemovableHandle`` that also removes the hook's flags (``with_kwargs``, ``always_call``)."""

    __slots__ = ("_extra_dicts",)

    def __init__(self, hooks: dict[int, Any], extra_dicts: tuple[dict[int, Any], ...] = ()) -> None:
        super().__init__(hooks)
        self._extra_dicts = extra_dicts

    def remove(self) -> None:
        super().remove()
        for flags in self._extra_dicts:
            flags.pop(self.id, None)


def _add(hooks: HookDict, hook: Callable[..., Any], prepend: bool = False, flags: tuple[dict[int, Any], ...] = ()) -> _Handle:
    if not callable(hook):
        raise TypeError(f"hook must be callable, got {type(hook).__name__}")
    handle = _Handle(hooks, flags)
    hooks[handle.id] = hook
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    return handle


def register_module_forward_pre_hook(hook: Callable[..., Any]) -> RemovableHandle:
    """Register ``hook(module, args)`` run before every module's ``forward``, before the module's own pre-hooks.

    >>> import xgrad
    >>> from xgrad.nn.modules.module import register_module_forward_pre_hook
    >>> seen = []
    >>> with register_module_forward_pre_hook(lambda m, args: seen.append(type(m).__name__)):
    ...     _ = xgrad.nn.ReLU()(xgrad.ones(2))
    >>> seen
    ['ReLU']
    """
    return _add(_global_forward_pre_hooks, hook)


def register_module_forward_hook(hook: Callable[..., Any], *, with_kwargs: bool = False, always_call: bool = False) -> RemovableHandle:
    """Register ``hook(module, args, output)`` (``hook(module, args, kwargs, output)`` with ``with_kwargs``) for every module.

    It runs after every module's ``forward``, before the module's own forward hooks; a
    non-``None`` return replaces the output. ``always_call`` runs it even when ``forward`` raises.
    """
    handle = _add(_global_forward_hooks, hook, flags=(_global_forward_hooks_with_kwargs, _global_forward_hooks_always_called))
    if with_kwargs:
        _global_forward_hooks_with_kwargs[handle.id] = True
    if always_call:
        _global_forward_hooks_always_called[handle.id] = True
    return handle


def register_module_full_backward_pre_hook(hook: Callable[..., Any]) -> RemovableHandle:
    """Register ``hook(module, grad_output)`` for every module, run before the module's own backward pre-hooks."""
    return _add(_global_backward_pre_hooks, hook)


def register_module_full_backward_hook(hook: Callable[..., Any]) -> RemovableHandle:
    """Register ``hook(module, grad_input, grad_output)`` for every module, run before the module's own backward hooks."""
    return _add(_global_backward_hooks, hook)


def forward_hooks(module: Any) -> tuple[Callable[..., Any], ...]:
    """The forward pre-hooks and forward hooks a call of ``module`` runs, global ones included."""
    return (*_global_forward_pre_hooks.values(), *module._forward_pre_hooks.values(),
            *_global_forward_hooks.values(), *module._forward_hooks.values())


def any_global_hook() -> bool:
    return bool(_global_forward_pre_hooks or _global_forward_hooks or _global_backward_pre_hooks or _global_backward_hooks)


class BackwardHookFunction(Function):
    """Identity on the Tensors it is given: its node is where a module's backward hooks sit."""

    generate_vmap_rule = True  # an identity: JAX batches it (NOTE [Functions under vmap])

    @staticmethod
    def forward(ctx: FunctionCtx, *args: Any) -> Any:
        ctx.mark_non_differentiable(*[a for a in args if not a.requires_grad])
        return args

    @staticmethod
    @pure_hook  # traced into a compiled backward: the identity has no effect of its own
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:  # type: ignore[override]
        return grads


# NOTE [Module hooks on JAX's AD]
# On a plain JAX transformation's tracers (``jax.grad(loss)(model)``, ``xgrad.func``) a
# module's backward hooks sit on identities whose ``custom_vjp`` runs the same
# ``BackwardHook`` methods the eager nodes run: the outputs' identity runs the backward
# pre-hooks on the cotangents of the outputs and keeps them, the inputs' identity runs
# the backward hooks with ``(module, grad_input, grad_output)``; JAX's AD reaches them
# in that order. The inputs get their identity where eager would give them a node: a
# tensor that requires grad, or, where xgrad records nothing (``xgrad.func``), any
# floating tensor on a tracer; otherwise the hooks run at the outputs with ``grad_input``
# all ``None``, as eager runs them.
def _identity_on_jax(
    on_grads: Callable[[tuple[Any, ...]], Any], args: tuple[Any, ...], index: list[int]
) -> tuple[tuple[Any, ...], list[int] | None]:
    recording = is_grad_enabled()
    hooked = [
        i for i in index
        if jnp.issubdtype(args[i]._array.dtype, jnp.inexact)
        and (args[i].requires_grad or (not recording and isinstance(args[i]._array, jax.core.Tracer)))
    ]
    if not hooked:
        return args, None

    def run_hooks(cotangents: tuple[Any, ...]) -> tuple[Any, ...]:
        grads = on_grads(tuple(Tensor(c) for c in cotangents))
        return tuple(c if g is None else array_of(g).astype(c.dtype) for g, c in zip(grads, cotangents, strict=True))

    identity = identity_with_vjp(run_hooks)
    tensors = [args[i] for i in hooked]
    if recording and any(t.requires_grad for t in tensors):  # one op of xgrad's graph too, for a backward() in the trace
        outs = list(engine_ops.jax_function(identity, tensors))
    else:
        outs = [Tensor(a) for a in identity(*[t._array for t in tensors])]
    replaced = list(args)
    for i, t in zip(hooked, outs, strict=True):
        replaced[i] = t
    return tuple(replaced), hooked


def _pack_with_none(indices: list[int], values: Any, size: int) -> tuple[Any, ...]:
    packed: list[Any] = [None] * size
    for i, v in zip(indices, values, strict=True):
        packed[i] = v
    return tuple(packed)


class BackwardHook:
    """One module call's backward hooks, as PyTorch's ``torch.utils.hooks.BackwardHook`` (NOTE [Module hooks])."""

    def __init__(self, module: Any, user_hooks: list[Callable[..., Any]], user_pre_hooks: list[Callable[..., Any]]) -> None:
        self.module = module
        self.user_hooks = user_hooks
        self.user_pre_hooks = user_pre_hooks
        self.grad_outputs: tuple[Any, ...] | None = None
        self.n_outputs = -1
        self.output_tensors_index: list[int] | None = None
        self.n_inputs = -1
        self.input_tensors_index: list[int] | None = None

    def _apply_on_tensors(
        self, on_node: Callable[[Any], None], on_jax: Callable[[tuple[Any, ...]], Any], args: tuple[Any, ...]
    ) -> tuple[tuple[Any, ...], list[int] | None]:
        index = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        tensors = [args[i] for i in index]
        if tensors and on_jax_trace(tensors):
            return _identity_on_jax(on_jax, args, index)
        if not (is_grad_enabled() and any(t.requires_grad for t in tensors)):
            return args, None
        new_tensors = BackwardHookFunction.apply(*tensors)
        on_node(next(t.grad_fn for t in new_tensors if t.grad_fn is not None))
        replaced = list(args)
        for i, t in zip(index, new_tensors, strict=True):
            replaced[i] = t
        return tuple(replaced), index

    def setup_input_hook(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        def on_node(node: Any) -> None:
            node.register_hook(self._input_hook)

        result, self.input_tensors_index = self._apply_on_tensors(
            on_node, lambda g: step_trace.on_plain_jax(self._input_hook)(g, None), args,
        )
        self.n_inputs = len(args)
        return result

    def setup_output_hook(self, output: Any) -> Any:
        def on_node(node: Any) -> None:
            node.register_hook(self._output_hook)

        outputs = output if isinstance(output, tuple) else (output,)
        # ``g`` twice: the first argument stands for what the result replaces, as a node's post hook is called.
        result, self.output_tensors_index = self._apply_on_tensors(
            on_node, lambda g: step_trace.on_plain_jax(self._output_hook)(g, g), outputs,
        )
        self.n_outputs = len(outputs)
        return result if isinstance(output, tuple) else result[0]

    def _input_hook(self, grad_inputs: Any, _grad_outputs: Any) -> Any:
        if self.grad_outputs is None:
            # The gradient reached the module's inputs without passing its outputs (a
            # double backward): PyTorch calls no hook then.
            return None
        assert self.input_tensors_index is not None
        result = _pack_with_none(self.input_tensors_index, grad_inputs, self.n_inputs)
        for hook in self.user_hooks:
            out = hook(self.module, result, self.grad_outputs)
            if out is None:
                continue
            if len(out) != len(result):
                raise RuntimeError(f"Backward hook returned an invalid number of grad_input, got {len(out)}, but expected {len(result)}")
            result = out
        self.grad_outputs = None
        return tuple(result[i] for i in self.input_tensors_index)

    def _output_hook(self, _grad_inputs: Any, grad_outputs: Any) -> Any:
        assert self.output_tensors_index is not None
        self.grad_outputs = _pack_with_none(self.output_tensors_index, grad_outputs, self.n_outputs)
        expected = len(self.grad_outputs)
        for hook in self.user_pre_hooks:
            new = hook(self.module, self.grad_outputs)
            if new is None:
                continue
            if len(new) != expected:
                raise RuntimeError(f"Backward pre hook returned an invalid number of grad_output, got {len(new)}, but expected {expected}")
            self.grad_outputs = new
        local_grad_outputs = self.grad_outputs
        if self.input_tensors_index is None and self.user_hooks:
            # No input requires grad: the backward hooks run here, with grad_input all None.
            warnings.warn(
                "Full backward hook is firing when gradients are computed with respect to module outputs since no inputs "
                "require gradients. See https://docs.pytorch.org/docs/main/generated/torch.nn.Module.html"
                "#torch.nn.Module.register_full_backward_hook for more details.", stacklevel=2,
            )
            grad_inputs = (None,) * self.n_inputs
            for hook in self.user_hooks:
                res = hook(self.module, grad_inputs, self.grad_outputs)
                if res is not None and not (isinstance(res, tuple) and all(el is None for el in res)):
                    raise RuntimeError(
                        "Backward hook for Modules where no input requires gradient should always return None or None for all gradients."
                    )
        if self.input_tensors_index is None:
            self.grad_outputs = None
        return tuple(local_grad_outputs[i] for i in self.output_tensors_index)


class ModuleHooks:
    """The hook half of ``nn.Module``: registering hooks and calling ``forward`` through them (NOTE [Module hooks])."""

    _forward_pre_hooks: HookDict
    _forward_pre_hooks_with_kwargs: OrderedDict[int, bool]
    _forward_hooks: HookDict
    _forward_hooks_with_kwargs: OrderedDict[int, bool]
    _forward_hooks_always_called: OrderedDict[int, bool]
    _backward_pre_hooks: HookDict
    _backward_hooks: HookDict
    forward: Callable[..., Any]

    def register_forward_pre_hook(self, hook: Callable[..., Any], *, prepend: bool = False, with_kwargs: bool = False) -> RemovableHandle:
        """Register ``hook(module, args)`` (``hook(module, args, kwargs)`` with ``with_kwargs``), run before ``forward``.

        A non-``None`` return replaces ``args`` (a single value is wrapped in a tuple),
        or with ``with_kwargs`` must be a new ``(args, kwargs)``. ``prepend`` runs it before
        the hooks already registered. Global pre-hooks run first.

        >>> import xgrad
        >>> layer = xgrad.nn.ReLU()
        >>> handle = layer.register_forward_pre_hook(lambda m, args: (-args[0],))
        >>> layer(xgrad.tensor([1.0, -2.0])).tolist()
        [0.0, 2.0]
        >>> handle.remove()
        """
        handle = _add(self._forward_pre_hooks, hook, prepend, (self._forward_pre_hooks_with_kwargs,))
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[handle.id] = True
        return handle

    def register_forward_hook(
        self, hook: Callable[..., Any], *, prepend: bool = False, with_kwargs: bool = False, always_call: bool = False,
    ) -> RemovableHandle:
        """Register ``hook(module, args, output)`` (``hook(module, args, kwargs, output)`` with ``with_kwargs``), run after ``forward``.

        A non-``None`` return replaces the output. ``always_call`` runs the hook even when
        ``forward`` raises (the error is raised after it). Global forward hooks run first.

        >>> import xgrad
        >>> layer = xgrad.nn.Linear(2, 3, key=0)
        >>> shapes = []
        >>> with layer.register_forward_hook(lambda m, args, out: shapes.append(out.shape)):
        ...     _ = layer(xgrad.ones(4, 2))
        >>> shapes
        [(4, 3)]
        """
        handle = _add(self._forward_hooks, hook, prepend, (self._forward_hooks_with_kwargs, self._forward_hooks_always_called))
        if with_kwargs:
            self._forward_hooks_with_kwargs[handle.id] = True
        if always_call:
            self._forward_hooks_always_called[handle.id] = True
        return handle

    def register_full_backward_pre_hook(self, hook: Callable[..., Any], prepend: bool = False) -> RemovableHandle:
        """Register ``hook(module, grad_output)``, run when the gradients w.r.t. the module's outputs are ready.

        ``grad_output`` is a tuple (``None`` for outputs that are not Tensors); a
        non-``None`` return replaces it. The module's forward sees, and its caller gets,
        new Tensors standing for its inputs and outputs (PyTorch gives views).
        """
        return _add(self._backward_pre_hooks, hook, prepend)

    def register_full_backward_hook(self, hook: Callable[..., Any], prepend: bool = False) -> RemovableHandle:
        """Register ``hook(module, grad_input, grad_output)``, run when the gradients w.r.t. the module's inputs are ready.

        ``grad_input`` has one entry per positional argument of the call (``None`` for
        non-Tensors; keyword arguments are not in it); a non-``None`` return replaces it.
        If no input requires grad the hook runs with ``grad_input`` all ``None`` once
        ``grad_output`` is known; if no output requires grad it does not run.

        >>> import xgrad
        >>> layer = xgrad.nn.Linear(2, 1, key=0)
        >>> grads = []
        >>> _ = layer.register_full_backward_hook(lambda m, gin, gout: grads.append((gin[0].shape, gout[0].tolist())))
        >>> layer(xgrad.ones(1, 2, requires_grad=True)).sum().backward()
        >>> grads
        [((1, 2), [[1.0]])]
        """
        return _add(self._backward_hooks, hook, prepend)

    def register_backward_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        raise NotImplementedError(
            "Module.register_backward_hook is deprecated in PyTorch and not provided: use register_full_backward_hook, "
            "which is called with the gradients w.r.t. the module's inputs and outputs"
        )

    def _has_hooks(self) -> bool:
        return bool(
            self._forward_pre_hooks or self._forward_hooks or self._backward_pre_hooks or self._backward_hooks
            or any_global_hook()
        )

    def _call_with_hooks(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """PyTorch's ``Module._call_impl`` when hooks exist (NOTE [Module hooks])."""
        result = None
        called_always: set[int] = set()
        try:
            backward_pre_hooks = [*_global_backward_pre_hooks.values(), *self._backward_pre_hooks.values()]
            backward_hooks = [*_global_backward_hooks.values(), *self._backward_hooks.values()]
            for hook_id, hook in (*_global_forward_pre_hooks.items(), *self._forward_pre_hooks.items()):
                if hook_id in self._forward_pre_hooks_with_kwargs:
                    new = hook(self, args, kwargs)
                    if new is not None:
                        if not (isinstance(new, tuple) and len(new) == 2):
                            raise RuntimeError(f"forward pre-hook must return None or a tuple of (new_args, new_kwargs), but got {new}.")
                        args, kwargs = new
                else:
                    new = hook(self, args)
                    if new is not None:
                        args = new if isinstance(new, tuple) else (new,)
            bw_hook = None
            if backward_hooks or backward_pre_hooks:
                bw_hook = BackwardHook(self, backward_hooks, backward_pre_hooks)
                args = bw_hook.setup_input_hook(args)
            result = self.forward(*args, **kwargs)
            for hook_id, hook in (*_global_forward_hooks.items(), *self._forward_hooks.items()):
                if hook_id in self._forward_hooks_always_called or hook_id in _global_forward_hooks_always_called:
                    called_always.add(hook_id)
                if hook_id in self._forward_hooks_with_kwargs or hook_id in _global_forward_hooks_with_kwargs:
                    new = hook(self, args, kwargs, result)
                else:
                    new = hook(self, args, result)
                if new is not None:
                    result = new
            if bw_hook is not None:
                if not isinstance(result, (Tensor, tuple)):
                    warnings.warn(
                        "For backward hooks to be called, module output should be a Tensor or a tuple of Tensors but "
                        f"received {type(result)}", stacklevel=3,
                    )
                    return result
                result = bw_hook.setup_output_hook(result)
            return result
        except Exception:
            self._run_always_called_hooks(args, kwargs, result, called_always)
            raise

    def _run_always_called_hooks(self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any, called: set[int]) -> None:
        """The ``always_call`` forward hooks not run yet, after ``forward`` (or a hook) raised; their errors only warn."""
        for hook_id, hook in _global_forward_hooks.items():
            if hook_id in _global_forward_hooks_always_called and hook_id not in called:
                try:
                    new = hook(self, args, kwargs, result) if hook_id in _global_forward_hooks_with_kwargs else hook(self, args, result)
                    if new is not None:
                        result = new
                except Exception as e:
                    warnings.warn(
                        "global module forward hook with ``always_call=True`` raised an exception that was silenced as "
                        f"another error was raised in forward: {e}", stacklevel=4,
                    )
        for hook_id, hook in self._forward_hooks.items():
            if hook_id in self._forward_hooks_always_called and hook_id not in called:
                try:
                    new = hook(self, args, kwargs, result) if hook_id in self._forward_hooks_with_kwargs else hook(self, args, result)
                    if new is not None:
                        result = new
                except Exception as e:
                    warnings.warn(
                        "module forward hook with ``always_call=True`` raised an exception that was silenced as another "
                        f"error was raised in forward: {e}", stacklevel=4,
                    )
