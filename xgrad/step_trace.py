"""The one seam between ``xgrad.compile`` and the code it traces: the step being traced now.

# NOTE [The step-trace seam]
# While ``xgrad.compile`` traces a step, the engine and the ops meet cases that an eager
# run decides on values (a range check, a random draw) or that must reach the host (a
# hook). They ask ``current()``: ``None`` outside a traced step (the eager case, one
# context-variable read), else the ``StepTrace`` of the step this thread (this context)
# is tracing, whose methods decide. Nothing is patched while a step is traced: a trace
# is a value in a ``ContextVar``, so two threads trace two steps at once and a third
# thread running eagerly never sees either.
#
# The same seam carries what the step must learn about tensor state: ``Tensor`` reports
# each tensor made (``made``), and the code that reads a tensor's array into a
# computation or changes its state (``bind``, the engine's ``AccumulateGrad``, in-place
# ops, the optimizer, the random generator, ``.grad`` and ``requires_grad_``) reports it
# first (``read``, ``write``, ``grad_read``, ``grad_write``), so the step finds its
# parameters, buffers, optimizer state and ``.grad``s (NOTE [Whole-step compile], 1).
# Eagerly each report is the one ``current()`` read and a branch not taken. ``repr``,
# ``format`` and ``.item()`` of a tensor ask it too, for the text a traced step prints
# (NOTE [Print in a compiled step] in ``xgrad/compile_step/printing.py``).
#
# ``StepTrace`` lists what may be asked; ``xgrad.compile_step`` implements it. The
# defaults are eager's answers, so this module needs nothing above it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import jax

__all__ = ["StepTrace", "array_of", "current", "default_device", "on_plain_jax", "outside", "tracing_step"]


def default_device() -> Any:
    """The device JAX puts new arrays on (``jax.default_device``, else the first device)."""
    device = getattr(jax.config, "jax_default_device", None)
    return device if isinstance(device, jax.Device) else jax.devices()[0]


class StepTrace:
    """What the engine and the ops ask of a step being traced (NOTE [The step-trace seam])."""

    def wrap_hook(self, fn: Any, hooks: Any) -> Any:
        """``fn`` (a hook of ``hooks``, or an ``(input_nr, hook)`` pair) as the traced step calls it."""
        return fn

    def hook_added(self, hooks: Any, handle: Any, owner: Any) -> None:
        """A hook was registered on ``owner`` (a tensor or a node) while the step is traced."""

    def function_backward(self, node: Any, grads: list[Any]) -> list[Any] | None:
        """A custom Function's backward (of ``node``) on ``grads`` as the traced step runs it; ``None``: trace it in."""
        return None

    def check(self, failed: Any, make_error: Callable[[Any], BaseException], detail: Any = None) -> bool:
        """Make a value check part of the program: raise ``make_error(detail)`` when ``failed`` is set.

        ``failed`` is a traced boolean, ``detail`` a traced value the message shows (or
        ``None``). Returns whether the step took the check; ``False`` (a check under a
        JAX transformation nested in the step) leaves it to the caller (a host callback).
        """
        return False

    def check_index(self, index: Any, size: int, message: str, negative: bool, ignore: int | None) -> bool:
        """An index range check on a traced ``index``; ``False`` if the step did not take it (as ``check``)."""
        return False

    def host_effect(self, call: Callable[..., None], args: tuple[Any, ...], kwargs: dict[str, Any], state: list[Any]) -> bool:
        """Run ``call(*args, **kwargs)``, Python with effects on plain state (an LR scheduler's ``step``),
        on the host at this point of every call of the step, with the Tensors among its arguments and
        ``state`` (the Tensors it reads or rebinds) holding their values then; what it rebinds flows on.
        ``False``: the caller calls it now."""
        return False

    def final_callbacks(self) -> list[Callable[[], None]]:
        """The list a backward traced in the step queues its final callbacks on."""
        return []

    def printed_text(self, t: Any, format_spec: str | None, frame: Any) -> str | None:
        """The text of the tensor ``t`` (its ``repr`` for ``format_spec`` ``None``, else ``format(t, format_spec)``)
        as the step prints it at every call, made in ``frame`` (the caller's); ``None``: not printed there, the
        caller needs the value now."""
        return None

    def printed_item(self, t: Any, frame: Any) -> Any:
        """``t.item()``, called in ``frame``, as a value the step only prints (formats into a ``print``); ``None``: the
        caller needs the value now."""
        return None

    def device(self) -> Any:
        """The ``jax.Device`` a traced value's ``Tensor.device`` names (XLA places traced values)."""
        return default_device()

    def at_step_level(self) -> bool:
        """Whether the innermost JAX trace now is the step's own (not a ``jax.jit``/``vmap`` nested in it)."""
        return False

    def module_mode(self, module: Any) -> None:
        """``module.training`` is about to be read (the module is called) or set (``train()``/``eval()``)."""

    def module_called(self, module: Any) -> None:
        """``module`` is called: its mode is read, and its forward hooks and pre-hooks would run."""
        self.module_mode(module)

    def entry_read(self, group: Any, key: str | None, value: Any) -> None:
        """The step's own Python read ``group[key]`` (an optimizer's parameter group), ``value``; ``key`` ``None``: the
        update read the entries that choose its code, or the step which keys the group has, ``value`` the group's
        ``options_version`` then."""

    def entry_written(self, group: Any, key: str, value: Any) -> None:
        """``group[key]`` (an optimizer's parameter group) is about to be set to ``value``."""

    def made(self, t: Any) -> None:
        """The tensor ``t`` was made while the step is traced (it is none of the step's state)."""

    def read(self, t: Any) -> None:
        """``t``'s array is about to enter a computation of the step (or another tensor)."""

    def write(self, t: Any) -> None:
        """``t``'s array, version, history or ``requires_grad`` is about to change."""

    def grad_read(self, t: Any) -> None:
        """``t``'s ``.grad`` is about to be read (the step's Python may decide on it)."""

    def grad_write(self, t: Any) -> None:
        """``t``'s ``.grad`` is about to be rebound."""


_CURRENT: ContextVar[StepTrace | None] = ContextVar("xgrad_step_trace", default=None)

#: The step being traced in this context, ``None`` when none is.
current: Callable[[], StepTrace | None] = _CURRENT.get


# NOTE [Hooks under a plain JAX transformation]
# Outside a traced step, a hook called on a plain JAX transformation's tracers (the engine
# run inside ``jax.jit``, or a tensor hook on JAX's AD under ``jax.jit(jax.grad)``) would
# run once, when traced. ``xgrad.compile_step`` sets ``plain_jax_hook`` to what such a
# hook becomes: traced in when it touches no Python state, else an ordered host call at
# every call (NOTE [Hooks under jax.jit] in ``xgrad/compile_step/jax_hooks.py``). On
# concrete values the hook is called as it is.
plain_jax_hook: Callable[[Any], Any] | None = None


def on_plain_jax(hook: Any) -> Any:
    """``hook`` as a hook outside a traced step calls it (NOTE [Hooks under a plain JAX transformation])."""
    return hook if plain_jax_hook is None else plain_jax_hook(hook)


def array_of(t: Any) -> Any:
    """The Tensor ``t``'s array, told first (``StepTrace.read``) to the step being traced, if any."""
    trace = _CURRENT.get()
    if trace is not None:
        trace.read(t)
    return t._array


@contextlib.contextmanager
def tracing_step(trace: StepTrace) -> Iterator[StepTrace]:
    """Make ``trace`` the step this context traces, for the body of the ``with``."""
    token = _CURRENT.set(trace)
    try:
        yield trace
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def outside() -> Iterator[None]:
    """Run the body as if no step were traced (to make state that outlives the step, from concrete values)."""
    token = _CURRENT.set(None)
    try:
        yield
    finally:
        _CURRENT.reset(token)
