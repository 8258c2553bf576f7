"""What a traced step records of a tensor, and the recorder of the step this context traces (NOTE [Whole-step
compile], 1, in ``__init__``; the ``Recorder`` is in ``intercept.py``)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, cast

from xgrad import step_trace
from xgrad.tensor import Tensor

if TYPE_CHECKING:
    from xgrad.compile_step.intercept import Recorder


class Snapshot:
    """A tensor's autograd-visible state when a trace first touched it."""

    __slots__ = (
        "array", "grad", "grad_fn", "output_nr", "ref", "requires_grad", "retains_grad", "start", "target", "version",
    )

    def __init__(self, t: Tensor) -> None:
        self.ref = weakref.ref(t)
        # Where the tensor is found at a call (``resolve_target``): an argument's leaf index (a
        # new object each call), ``("grad", owner's target)``, or a weak reference.
        self.target: Any = self.ref
        self.array, self.grad, self.grad_fn, self.output_nr, self.version, self.requires_grad, self.retains_grad = (
            t._array, t._grad, t.grad_fn, t._output_nr, t._version, t._requires_grad, t._retains_grad)
        self.start = self.array  # what counts as unchanged (a tracer for an argument)

    def restore(self, t: Tensor) -> None:
        t._array, t._grad, t.grad_fn, t._output_nr, t._version, t._requires_grad, t._retains_grad = (
            self.array, self.grad, self.grad_fn, self.output_nr, self.version, self.requires_grad, self.retains_grad)


def target_key(target: Any) -> Any:
    """A target (``Snapshot.target``) as a hashable key naming its tensor, without comparing tensors."""
    if type(target) is weakref.ref:
        return ("ref", id(target()))
    if type(target) is tuple:
        return ("grad", target_key(target[1]))
    return ("arg", target)


def active() -> Recorder | None:
    """The recorder of the step this context is tracing, ``None`` when none is."""
    return cast("Recorder | None", step_trace.current())  # a ``Recorder`` is the only step trace


def current() -> Recorder:
    """The recorder of the step this context is tracing; one is."""
    rec = active()
    assert rec is not None
    return rec
