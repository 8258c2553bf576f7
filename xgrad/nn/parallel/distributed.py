"""``nn.parallel.DistributedDataParallel``: gradients averaged over the processes of a job."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils

from xgrad.engine.engine import queue_callback
from xgrad.grad_mode import no_grad
from xgrad.nn.module import Module
from xgrad.tensor import Tensor

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(Module):
    """``DistributedDataParallel(module, device_ids=None, ..., find_unused_parameters=False, ...)``.

    Each process of a ``xgrad.distributed.initialize`` job (``jax.process_count()`` of them)
    runs ``module`` on its own batch; when a backward has accumulated the gradients, each
    parameter's gradient becomes their mean over the processes, as PyTorch's all-reduce
    leaves it, so every process steps to the same weights. In one process it is ``module``.
    Inside ``no_sync()``, or with ``require_backward_grad_sync = False`` (what ``no_sync``
    sets), backwards only accumulate, and the next synchronised backward averages the sum.
    Every process must give gradients to the same parameters (a parameter unused on some
    process but not others is not supported). ``device_ids``, ``output_device``,
    ``broadcast_buffers``, ``process_group``, ``bucket_cap_mb``, ``find_unused_parameters``,
    ``gradient_as_bucket_view``, ``static_graph`` and the other keywords are accepted: XLA
    places and communicates by itself. The wrapped module is ``.module``.
    """

    def __init__(self, module: Module, device_ids: Any = None, output_device: Any = None, dim: int = 0,
                 broadcast_buffers: bool = True, process_group: Any = None, bucket_cap_mb: Any = None,
                 find_unused_parameters: bool = False, **accepted: Any) -> None:
        super().__init__()
        self.module = module
        self.require_backward_grad_sync = True
        self._sync_queued = False
        if jax.process_count() > 1:
            for p in module.parameters():
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(self._queue_average)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backwards in the block accumulate gradients without averaging them over the processes."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def _queue_average(self, param: Tensor) -> None:
        if self.require_backward_grad_sync and not self._sync_queued:
            self._sync_queued = True
            queue_callback(self._average_grads)

    def _average_grads(self) -> None:
        self._sync_queued = False
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        # One host gather of every gradient: (processes, ...) per leaf, then the mean.
        gathered = multihost_utils.process_allgather([g.array for g in grads])
        with no_grad():
            for grad, stacked in zip(grads, gathered, strict=True):
                grad.copy_(Tensor(jnp.asarray(stacked.mean(axis=0), dtype=grad.dtype)))
