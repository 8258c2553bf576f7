"""``DataParallel`` and ``DistributedDataParallel``: PyTorch's data-parallel wrappers, on JAX's devices.

# NOTE [Data parallel as one SPMD program]
# PyTorch's ``DataParallel`` copies the module onto each GPU, runs the replicas on
# chunks of the batch in threads and sums their gradients onto device 0. On JAX the
# same result comes from one program: the parameters and buffers are replicated over a
# 1-D mesh of the devices (as ``shard_module`` places them, here with every tensor
# replicated), each input is laid out split along ``dim`` over that mesh
# (``with_sharding_constraint``, differentiable), and every op then runs SPMD, in
# eager, in a compiled backward and inside ``xgrad.compile``. XLA inserts the
# all-reduce of the gradients, which come out replicated like their parameters, so an
# optimizer step needs nothing more. Each op sees the whole batch: a mean is over the
# whole batch, and so is ``BatchNorm``'s (PyTorch's replicas normalize each chunk by
# its own statistics and keep replica 0's running stats; here the result is the
# single-device one, as ``SyncBatchNorm`` would give). The output is moved onto
# ``output_device`` (differentiably), so a loss against labels there works as in
# PyTorch; inside ``xgrad.compile``, whose one program spans the mesh, it stays on the
# mesh, replicated.
#
# NOTE [DistributedDataParallel's all-reduce]
# Under ``jax.distributed`` each process runs its own eager program on its own batch,
# as PyTorch's DDP processes do, so the loss and the labels stay local. The wrapper
# broadcasts process 0's parameters and buffers at construction (and the buffers at
# every forward, ``broadcast_buffers``), and a forward whose backward must sync puts a
# hook on its outputs; the first one reached queues a callback that runs when that
# backward finishes and replaces every ``.grad`` by its mean over the processes: the
# local grads are stacked into one global array over a mesh of one device per process
# and averaged by a jitted sum, an all-reduce. Whether a parameter got a gradient in a
# process travels in the same all-reduce, so a parameter unused in some processes gets
# the mean with zeros for theirs and one unused everywhere keeps ``grad`` None; every
# process takes part in the same collective whatever its graph was, so
# ``find_unused_parameters`` is not needed (it is accepted). Inside ``no_sync()`` the
# forward puts no hook and the grads accumulate locally; the next synced backward
# averages the accumulated ``.grad``, as PyTorch's does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from xgrad.engine.engine import queue_callback
from xgrad.grad_mode import is_grad_enabled
from xgrad.jax_internals import single_device_sharding
from xgrad.nn.module import Module
from xgrad.nn.module_placement import _replace_storage
from xgrad.ops.elementwise import to_device, with_sharding_constraint
from xgrad.tensor import Tensor

__all__ = ["DataParallel", "DistributedDataParallel", "data_parallel"]


def _map_tensors(fn: Callable[[Tensor], Any], value: Any) -> Any:
    """``value`` with ``fn`` applied to each Tensor inside its tuples, lists and dicts (PyTorch's scatter walks these)."""
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, tuple | list):
        mapped = [_map_tensors(fn, v) for v in value]
        return type(value)(*mapped) if hasattr(value, "_fields") else type(value)(mapped)
    if isinstance(value, dict):
        return type(value)((k, _map_tensors(fn, v)) for k, v in value.items())
    return value


def _local_devices(device_ids: Sequence[Any] | None, owner: str) -> list[jax.Device]:
    """The local JAX devices ``device_ids`` names: indices into ``jax.local_devices()`` or ``jax.Device``s."""
    local = jax.local_devices()
    if device_ids is None:
        return local
    devices = []
    for device in device_ids:
        if isinstance(device, jax.Device):
            if device not in local:
                raise ValueError(f"{owner}: device_ids names {device}, which is not one of this process's devices {local}")
            devices.append(device)
        elif isinstance(device, int) and not isinstance(device, bool) and 0 <= device < len(local):
            devices.append(local[device])
        else:
            raise ValueError(
                f"{owner}: device_ids must be indices 0..{len(local) - 1} into jax.local_devices() or jax.Device objects, "
                f"got {device!r}"
            )
    if not devices:
        raise ValueError(f"{owner}: device_ids is empty; pass None for all of {local}")
    if len(set(devices)) != len(devices):
        raise ValueError(f"{owner}: device_ids names a device twice: {list(device_ids)}")
    return devices


class DataParallel(Module):
    """``module`` run over several local devices, the batch split along ``dim`` (PyTorch's ``nn.DataParallel``).

    One program over all of them, not replicas in threads (NOTE [Data parallel as one
    SPMD program] in xgrad/nn/parallel.py): ``module``'s parameters and buffers are
    replicated over the devices in place, at construction; each Tensor input (inside
    tuples, lists and dicts too) is split along ``dim`` when the devices divide its
    length there, else replicated; gradients come out summed over the chunks, that is,
    as on one device. On one device it is ``module`` called.

    Args:
        module: the model, kept as ``.module`` (``state_dict`` keys start ``module.``, as
            PyTorch's do).
        device_ids: indices into ``jax.local_devices()`` or ``jax.Device``s (default: all
            local devices).
        output_device: where the output is gathered (default: the first device); one of
            ``device_ids``, given as they are. Inside ``xgrad.compile`` the output stays
            on all the devices, replicated.
        dim: the dimension the inputs are split along.

    >>> import xgrad
    >>> model = xgrad.nn.DataParallel(xgrad.nn.Linear(4, 2, key=0))
    >>> model(xgrad.ones(8, 4)).shape
    (8, 2)
    >>> list(model.state_dict())
    ['module.weight', 'module.bias']
    """

    def __init__(self, module: Module, device_ids: Sequence[Any] | None = None, output_device: Any = None,
                 dim: int = 0) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DataParallel: module must be an xgrad.nn.Module, got {type(module).__name__}")
        devices = _local_devices(device_ids, "DataParallel")
        output = devices[0] if output_device is None else _local_devices([output_device], "DataParallel")[0]
        if output not in devices:
            raise ValueError(f"DataParallel: output_device {output_device!r} is not one of device_ids {devices}")
        self.module = module
        self.dim = dim
        self.device_ids = devices
        self.output_device = output
        self._mesh = Mesh(np.array(devices), ("batch",)) if len(devices) > 1 else None
        if self._mesh is not None:
            replicated = NamedSharding(self._mesh, PartitionSpec())
            for t in [*module.parameters(), *module.buffers()]:
                _replace_storage(t, jax.device_put(t.array, replicated))

    def _scatter(self, t: Tensor) -> Tensor:
        assert self._mesh is not None
        dim = self.dim % t.ndim if t.ndim else 0
        if t.ndim and t.shape[dim] % self._mesh.size == 0:
            spec = PartitionSpec(*([None] * dim), "batch")
        else:  # a scalar, or a length the devices do not divide: every device gets all of it
            spec = PartitionSpec()
        return self._place(t, NamedSharding(self._mesh, spec))

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if self._mesh is None:
            return self.module(*inputs, **kwargs)
        output = self.module(*_map_tensors(self._scatter, inputs), **_map_tensors(self._scatter, kwargs))
        return _map_tensors(self._gather, output)

    def _gather(self, t: Tensor) -> Tensor:
        return self._place(t, single_device_sharding(self.output_device))

    def _place(self, t: Tensor, sharding: jax.sharding.Sharding) -> Tensor:
        if isinstance(t.array, jax.core.Tracer):
            # Inside xgrad.compile the step is one program over the mesh: a constraint lays
            # the value out, and the output stays on the mesh's devices, replicated.
            assert self._mesh is not None
            if not isinstance(sharding, NamedSharding):
                sharding = NamedSharding(self._mesh, PartitionSpec())
            return with_sharding_constraint(t, sharding)
        return to_device(t, sharding)


def data_parallel(module: Module, inputs: Any, device_ids: Sequence[Any] | None = None, output_device: Any = None,
                  dim: int = 0, module_kwargs: dict[str, Any] | None = None) -> Any:
    """``module(*inputs, **module_kwargs)`` run as ``DataParallel(module, device_ids, output_device, dim)`` runs it.

    As ``DataParallel``, it leaves ``module``'s parameters replicated over the devices.
    ``inputs`` is a tuple of arguments or one argument.

    >>> import xgrad
    >>> xgrad.nn.parallel.data_parallel(xgrad.nn.Linear(4, 2, key=0), xgrad.ones(8, 4)).shape
    (8, 2)
    """
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    return DataParallel(module, device_ids, output_device, dim)(*args, **(module_kwargs or {}))


class DistributedDataParallel(Module):
    """``module`` trained by several processes, each on its own batch, with gradients averaged (PyTorch's DDP).

    Under ``xgrad.distributed.initialize``: at construction every process takes process
    0's parameters and buffers; after a backward whose forward ran outside ``no_sync()``,
    each parameter's ``.grad`` is the mean of the processes' ``.grad`` (NOTE
    [DistributedDataParallel's all-reduce] in xgrad/nn/parallel.py), in eager and with
    the backward compiled; ``broadcast_buffers`` sends process 0's buffers at each
    forward. A parameter no process used keeps ``grad`` None, whatever
    ``find_unused_parameters`` says. In a single process it is ``module`` called.

    Args:
        module: the model, kept as ``.module`` (``state_dict`` keys start ``module.``).
        device_ids: None, or one local device (an index into ``jax.local_devices()`` or a
            ``jax.Device``) as PyTorch's single-device modules take; checked, the module
            stays where it is.
        output_device, dim, process_group, bucket_cap_mb, check_reduction,
        gradient_as_bucket_view, static_graph: accepted for PyTorch's programs; the
            all-reduce is one collective over every parameter, with no buckets or groups
            to tune.
        find_unused_parameters: accepted; unused parameters are always handled.
        broadcast_buffers: send process 0's buffers to the others at each forward.
    """

    def __init__(self, module: Module, device_ids: Sequence[Any] | None = None, output_device: Any = None,
                 dim: int = 0, broadcast_buffers: bool = True, process_group: Any = None, bucket_cap_mb: Any = None,
                 find_unused_parameters: bool = False, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: module must be an xgrad.nn.Module, got {type(module).__name__}")
        if device_ids is not None and len(_local_devices(device_ids, "DistributedDataParallel")) != 1:
            raise ValueError(
                f"DistributedDataParallel: device_ids must name one device (one process per device), got {list(device_ids)}"
            )
        if process_group is not None:
            raise ValueError("DistributedDataParallel: process_group must be None: the gradients are averaged over all "
                             "processes of xgrad.distributed.initialize")
        self.module = module
        self.device_ids = device_ids
        self.output_device = output_device
        self.dim = dim
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self._sync_queued = False
        if jax.process_count() > 1:
            # One device per process, the same list in every process: the all-reduce's mesh.
            firsts: dict[int, jax.Device] = {}
            for device in sorted(jax.devices(), key=lambda d: d.id):
                firsts.setdefault(device.process_index, device)
            self._mesh = Mesh(np.array([firsts[i] for i in sorted(firsts)]), ("process",))
            self._mean = jax.jit(lambda arrays: [a.sum(axis=0) / a.shape[0] for a in arrays],
                                 out_shardings=NamedSharding(self._mesh, PartitionSpec()))
            self._broadcast([*module.parameters(), *module.buffers()])

    @staticmethod
    def _broadcast(tensors: list[Tensor]) -> None:
        arrays = multihost_utils.broadcast_one_to_all([np.asarray(t.array) for t in tensors])
        for t, array in zip(tensors, arrays, strict=True):
            _replace_storage(t, jax.device_put(array, next(iter(t.array.devices()))))

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forwards inside it leave their backward's gradients local; the first synced backward after averages the sum."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if jax.process_count() == 1:
            return self.module(*inputs, **kwargs)
        if self.broadcast_buffers:
            buffers = list(self.module.buffers())
            if buffers:
                self._broadcast(buffers)
        output = self.module(*inputs, **kwargs)
        if self.require_backward_grad_sync and is_grad_enabled():
            self._sync_queued = False  # a backward that raised before its callback ran leaves no stale mark
            _map_tensors(self._hook_output, output)
        return output

    def _hook_output(self, t: Tensor) -> Tensor:
        if not t.requires_grad:
            return t
        if isinstance(t.array, jax.core.Tracer):
            raise RuntimeError(
                "DistributedDataParallel: a forward inside xgrad.compile cannot sync its gradients: each process "
                "compiles its own program. Compile the model's forward alone and call backward outside the step, run "
                "the forward inside ddp.no_sync(), or train one SPMD step over a global mesh (docs/scaling_out.md)"
            )
        t.register_hook(self._queue_sync)
        return t

    def _queue_sync(self, grad: Tensor) -> None:
        if not self._sync_queued:
            self._sync_queued = True
            queue_callback(self._average_grads)

    def _average_grads(self) -> None:
        self._sync_queued = False
        params = [p for p in self.module.parameters() if p.requires_grad]
        (device,) = [d for d in self._mesh.devices.flat if d.process_index == jax.process_index()]
        sharding = NamedSharding(self._mesh, PartitionSpec("process"))
        used = jnp.asarray([p.grad is not None for p in params], jnp.float32)
        local = [jnp.zeros(p.shape, p.dtype) if p.grad is None else p.grad.array for p in params] + [used]
        stacked = [
            jax.make_array_from_single_device_arrays((self._mesh.size, *a.shape), sharding, [jax.device_put(a[None], device)])
            for a in local
        ]
        *means, used_by = (m.addressable_data(0) for m in self._mean(stacked))
        for p, mean, count in zip(params, means, np.asarray(used_by), strict=True):
            if count > 0:
                p.grad = Tensor(jax.device_put(mean, next(iter(p.array.devices()))))
