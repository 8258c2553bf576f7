"""The differentiable ops the engine itself applies to gradients, registered by ``xgrad.ops`` at import.

The engine sits below the op library (NOTE [Layers] in ``engine/README.md``): it never
imports ``xgrad.ops``. Where it must record an op on a gradient (summing a broadcast
gradient down, moving one to its input's device, stacking batched rows, writing a
view's in-place result through to its base, a ``Function`` on JAX's tracers) it calls the
function ``xgrad.ops`` registered here, once, when it was imported.

>>> import xgrad
>>> from xgrad.engine import engine_ops
>>> engine_ops.sum_to(xgrad.ones(2, 3), (3,)).tolist()
[2.0, 2.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from xgrad.tensor import Tensor

__all__ = ["jax_function", "register", "stack", "sum_to", "to_device", "write_through"]

ERR_UNREGISTERED = "xgrad internal error (the engine applied {name} before xgrad.ops registered it); please report a bug."


def _unregistered(name: str) -> Callable[..., Any]:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(ERR_UNREGISTERED.format(name=name))

    return missing


#: ``sum_to(grad, shape)``: a broadcast gradient summed down to ``shape``.
sum_to: Callable[[Tensor, tuple[int, ...]], Tensor] = _unregistered("sum_to")
#: ``to_device(grad, device_or_sharding)``: a gradient moved, differentiably.
to_device: Callable[[Tensor, Any], Tensor] = _unregistered("to_device")
#: ``stack(tensors)``: rows stacked along a new first dim.
stack: Callable[[Sequence[Tensor]], Tensor] = _unregistered("stack")
#: ``write_through(view, new)``: an in-place result of a view written through to its base (NOTE [Views write through]).
write_through: Callable[[Tensor, Tensor], None] = _unregistered("write_through")
#: ``jax_function(fn, tensors)``: ``fn``, a JAX function of the tensors' arrays returning a tuple
#: of arrays, as one op whose backward is ``jax.vjp(fn)`` (NOTE [Functions on JAX's AD]).
jax_function: Callable[[Callable[..., Any], Sequence[Tensor]], tuple[Tensor, ...]] = _unregistered("jax_function")


def register(
    *, sum_to: Callable[[Tensor, tuple[int, ...]], Tensor], to_device: Callable[[Tensor, Any], Tensor],
    stack: Callable[[Sequence[Tensor]], Tensor], write_through: Callable[[Tensor, Tensor], None],
    jax_function: Callable[[Callable[..., Any], Sequence[Tensor]], tuple[Tensor, ...]],
) -> None:
    """Called once by ``xgrad.ops`` at import: the ops the engine applies."""
    globals().update(sum_to=sum_to, to_device=to_device, stack=stack, write_through=write_through, jax_function=jax_function)
