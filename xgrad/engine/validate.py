"""``validate_outputs``: each gradient fitted to the input it flows into, or a clear error."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from xgrad.engine import engine_ops
from xgrad.engine.node import Edge, sharding_of
from xgrad.engine.threads import _devices
from xgrad.tensor import Tensor

__all__ = ["validate_outputs"]


def _is_expandable_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts to ``target`` (so a grad of ``target`` sums down to it)."""
    if len(shape) > len(target):
        return False
    for s, t in zip(reversed(shape), reversed(target), strict=False):
        if s != t and s != 1:
            return False
    return True


def _device_str(sharding: Any) -> str:
    return ",".join(str(d) for d in sorted(sharding.device_set, key=lambda d: d.id))


def _error_text(producer: Any, note: str, msg: str) -> str:
    """An error of ``validate_outputs``: about the node (or node name) ``producer``, or bare for root grads."""
    if producer is None:
        return msg
    name = producer if isinstance(producer, str) else producer.name()
    return f"Function {name} returned an {msg}{note}"


def validate_outputs(edges: tuple[Edge, ...] | list[Edge], grads: list[Any], producer: Any = None, note: str = "") -> None:
    """Check ``grads`` against the metadata of the inputs they flow into, fixing what PyTorch fixes.

    A grad that only broadcasts is summed down, a grad of another float dtype is cast,
    a 0-dim grad on another device is moved; anything else raises, naming ``producer``
    (the node or its name; ``None`` for root grads) and adding ``note``. The message is
    made only then: this runs for every node.
    """
    if len(grads) != len(edges):
        raise RuntimeError(_error_text(producer, note, f"invalid number of gradients - expected {len(edges)}, but got {len(grads)}"))
    single_device = _devices.single_device
    for i, grad in enumerate(grads):  # indexing, not a zip: half the cost for a node's few grads
        if grad is None:
            continue
        node, input_nr = edges[i]
        if node is None:
            continue
        meta = node.input_metadata[input_nr]
        # The common case, an array that already fits, in a few compares: ``aval`` is
        # where an array's ``.shape`` and ``.dtype`` properties read from, at a third
        # of their cost, and the dtype is the very object the metadata took from it.
        if type(grad) is Tensor:
            aval = getattr(grad._array, "aval", None)
            if (
                aval is not None
                and aval.shape == meta.shape
                and aval.dtype is meta.dtype
                and (single_device or meta.sharding is None)
            ):
                continue
        grads[i] = _fit_gradient(i, grad, meta, producer, note)


def _fit_gradient(i: int, grad: Any, meta: Any, producer: Any, note: str) -> Tensor:
    """``grads[i]`` fitted to ``meta`` (the slow path of ``validate_outputs``), or raise."""
    if not isinstance(grad, Tensor):
        raise TypeError(_error_text(producer, note, f"invalid gradient at index {i} - expected a Tensor or None, got {type(grad).__name__}"))
    array = grad._array
    if array.shape != meta.shape:
        if not _is_expandable_to(meta.shape, array.shape):
            raise RuntimeError(
                _error_text(
                    producer,
                    note,
                    f"invalid gradient at index {i} - got {list(array.shape)} but expected shape "
                    f"compatible with {list(meta.shape)}"
                )
            )
        grad = engine_ops.sum_to(grad, meta.shape)
    if grad._array.dtype != meta.dtype:
        if not jnp.issubdtype(grad._array.dtype, jnp.inexact):
            raise RuntimeError(
                _error_text(producer, note, f"invalid gradient at index {i} - expected dtype {meta.dtype} but got {grad._array.dtype}")
            )
        grad = grad.to(meta.dtype)
    sharding = meta.sharding
    # No sharding in the metadata: the compiled backward validates traced values,
    # which XLA places (and which have no .sharding to compare).
    if _devices.single_device or sharding is None:
        return grad
    # A traced gradient (``grad(..., is_grads_batched=True)`` under vmap, or a step
    # under ``xgrad.compile``) has no sharding to compare: XLA places it.
    grad_sharding = sharding_of(grad._array)
    if grad_sharding is None:
        return grad
    if grad_sharding is not sharding and grad_sharding != sharding and grad_sharding.device_set != sharding.device_set:
        if grad._array.ndim == 0 and len(sharding.device_set) == 1:
            return engine_ops.to_device(grad, next(iter(sharding.device_set)))
        raise RuntimeError(
            _error_text(
                producer,
                note,
                f"invalid gradient at index {i} - expected device {_device_str(sharding)} but got "
                f"{_device_str(grad_sharding)}"
            )
        )
    return grad
