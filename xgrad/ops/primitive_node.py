"""The one node class of every primitive (NOTE [Rule nodes]): made by ``registry.bind``, it replays the primitive's rules."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xgrad.dual import LEVEL
from xgrad.engine.anomaly import ANOMALY
from xgrad.engine.rules import RuleArgs, RuleNode, incoming_grad
from xgrad.engine.saved import SavedTensor
from xgrad.grad_mode import _state as _grad_state
from xgrad.tensor import Tensor

if TYPE_CHECKING:
    from collections.abc import Sequence

    from xgrad.ops.registry import Primitive

__all__ = ["PrimitiveNode"]

_new_tuple = tuple.__new__


class PrimitiveNode(RuleNode):
    """The one node class for every primitive: it replays the primitive's rules (NOTE [Rule nodes]).

    Made by ``bind`` alone, with ``Node``'s constructor, which then sets RuleNode's fields:
    one constructor's call less per recorded op (NOTE [Recording cost]).
    """

    __slots__ = ()  # the fields are RuleNode's

    prim: Primitive  # a RuleNode's ``Rules``, here always a registry primitive

    def name(self) -> str:
        return self.prim.node_name

    def apply(self, grads: list[Tensor | None]) -> list[Tensor | None]:
        prim = self.prim
        num_outputs = prim.num_outputs
        # Op by op where a graph is recorded, or where tangents must pass through the rules
        # (a dual level: forward over reverse); else fused (NOTE [Fused eager rules]).
        op_by_op = _grad_state.enabled or not prim.jit or ANOMALY.enabled or LEVEL.current is not None
        # One output, nearly every primitive: its grad is ``g`` as it is (spares the call).
        g = grads[0] if num_outputs == 1 else incoming_grad(num_outputs, grads, self.input_metadata, not op_by_op)
        if g is None:
            return [None] * len(self.next_edges)
        # The rules' arguments: the inputs (tensors, avals or constants) and the outputs,
        # which reach the rules as their InputMetadata (shape, dtype, ndim) when not saved.
        inputs: Sequence[Any] = self.saved
        if self.holds_tensors:
            inputs = [s.unpack(self) if type(s) is SavedTensor else s for s in inputs]
        out: Any = self.input_metadata if self.saved_out is None else tuple([s.unpack(self) for s in self.saved_out])
        if num_outputs == 1:
            out = out[0]
        args = _new_tuple(RuleArgs, (g, out, inputs, self.params, self.needed_outputs()))  # NOTE [Recording cost]
        if op_by_op:
            return prim.backward(args)
        return prim.eager_backward(args)

    def release_variables(self) -> None:
        # Avals and constants stay: a node that saved no tensor can run again, as in PyTorch.
        if not self.holds_tensors:
            return
        for s in self.saved:
            if type(s) is SavedTensor:
                s.release()
        if self.saved_out is not None:
            for s in self.saved_out:
                s.release()
