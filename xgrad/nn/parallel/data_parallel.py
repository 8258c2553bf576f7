"""``nn.DataParallel``: one module, its batch split over the local JAX devices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from xgrad.nn.module import Module
from xgrad.nn.module_placement import _replace_storage
from xgrad.tensor import Tensor

__all__ = ["DataParallel", "data_parallel"]


def _devices(device_ids: Sequence[Any] | None) -> list[Any]:
    local = jax.local_devices()
    if device_ids is None:
        return local
    chosen = []
    for d in device_ids:
        if isinstance(d, jax.Device):
            chosen.append(d)
            continue
        index = getattr(d, "index", d)
        index = int(str(index).rpartition(":")[2] or 0) if isinstance(index, str) else int(index or 0)
        if not 0 <= index < len(local):
            raise RuntimeError(f"DataParallel: device id {index} is out of range: JAX sees {len(local)} local devices")
        chosen.append(local[index])
    if not chosen:
        raise ValueError("DataParallel: device_ids must name at least one device")
    return chosen


class DataParallel(Module):
    """``nn.DataParallel(module, device_ids=None, output_device=None, dim=0)``.

    The module's parameters and buffers are replicated over ``device_ids`` (default: every
    local JAX device) at construction; each call splits its tensor arguments along ``dim``
    over those devices (a size the device count does not divide stays whole, computed on
    each), runs ``module`` once as an SPMD computation, and returns the outputs on
    ``output_device`` (default the first device), as PyTorch gathers them. XLA sums the
    replicated parameters' gradients over the devices, so a step equals the single-device
    step. The wrapped module is ``.module``; its state dict keys start with ``module.``.

    >>> import xgrad
    >>> model = xgrad.nn.DataParallel(xgrad.nn.Linear(3, 2, key=0))
    >>> model(xgrad.ones(4, 3)).shape, list(model.state_dict())
    ((4, 2), ['module.weight', 'module.bias'])
    """

    def __init__(self, module: Module, device_ids: Sequence[Any] | None = None, output_device: Any = None,
                 dim: int = 0) -> None:
        super().__init__()
        self.module = module
        self.device_ids = _devices(device_ids)
        self.output_device = self.device_ids[0] if output_device is None else _devices([output_device])[0]
        self.dim = dim
        self._mesh = Mesh(self.device_ids, ("batch",))
        replicated = NamedSharding(self._mesh, PartitionSpec())
        for t in (*module.parameters(), *module.buffers()):
            _replace_storage(t, jax.device_put(t.array, replicated))

    def _split(self, value: Any) -> Any:
        if not isinstance(value, Tensor) or value.ndim <= self.dim or value.shape[self.dim] % len(self.device_ids):
            return value.to(NamedSharding(self._mesh, PartitionSpec())) if isinstance(value, Tensor) else value
        spec = PartitionSpec(*([None] * self.dim), "batch")
        return value.to(NamedSharding(self._mesh, spec))

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        inputs = jax.tree_util.tree_map(self._split, inputs, is_leaf=lambda v: isinstance(v, Tensor))
        kwargs = jax.tree_util.tree_map(self._split, kwargs, is_leaf=lambda v: isinstance(v, Tensor))
        outputs = self.module(*inputs, **kwargs)
        gathered = SingleDeviceSharding(self.output_device)
        return jax.tree_util.tree_map(lambda v: v.to(gathered) if isinstance(v, Tensor) else v, outputs,
                                      is_leaf=lambda v: isinstance(v, Tensor))


def data_parallel(module: Module, inputs: Any, device_ids: Sequence[Any] | None = None, output_device: Any = None,
                  dim: int = 0, module_kwargs: dict[str, Any] | None = None) -> Any:
    """``nn.parallel.data_parallel``: ``DataParallel(module, ...)(*inputs, **module_kwargs)`` in one call."""
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    return DataParallel(module, device_ids, output_device, dim)(*inputs, **(module_kwargs or {}))
