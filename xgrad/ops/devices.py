"""Whether an op's tensors sit on one device, as PyTorch checks (NOTE [One device, no device check])."""

from __future__ import annotations

from typing import Any

import jax

from xgrad.engine.node import sharding_of
from xgrad.tensor import Tensor

__all__ = ["ERR_DEVICES", "check_same_devices"]

ERR_DEVICES = "Expected all tensors to be on the same device, but found at least two devices, {a} and {b}!"

# NOTE [One device, no device check]
# An op of several tensors checks that they sit on one device (``check_same_devices``):
# each array's sharding read and compared in Python, since jit's outputs on one device
# carry distinct (equal) sharding objects, about 1.5 µs for a ``mul`` of two tensors. A
# process whose backends hold one device in all (JAX on the CPU alone) cannot mix devices,
# so it skips the check (and counts no tensors); the count is read once, at the first op
# of a tensor (every backend is running by then: the tensor's array exists).


def check_same_devices(args: tuple[Any, ...], tensors: list[Tensor], arrays: list[Any]) -> None:
    """Raise if the tensors among ``args`` sit on different devices; a 0-dim one is moved in ``arrays``,
    as PyTorch allows scalars."""
    first = None
    for t in tensors:
        # Traced values (the compiled backward) have no sharding: XLA places them.
        sharding = sharding_of(t._array)
        if sharding is not None and t._array.ndim:
            first = sharding
            break
    if first is None:
        return
    positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    for t, position in zip(tensors, positions, strict=True):
        sharding = sharding_of(t._array)
        if sharding is None or sharding is first or sharding == first or sharding.device_set == first.device_set:
            continue
        if t._array.ndim == 0:
            # A scalar joins the other operand's devices replicated: ``first``'s own spec
            # (``P('data')``) needs a rank it does not have.
            if isinstance(first, jax.sharding.NamedSharding):
                target = jax.sharding.NamedSharding(first.mesh, jax.sharding.PartitionSpec())
            elif len(first.device_set) == 1:
                target = first
            else:
                mesh = jax.sharding.Mesh(tuple(first._device_assignment), ("devices",))
                target = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            arrays[position] = jax.device_put(t._array, target)
            continue
        a = ",".join(str(d) for d in first.device_set)
        b = ",".join(str(d) for d in sharding.device_set)
        raise RuntimeError(ERR_DEVICES.format(a=a, b=b))
