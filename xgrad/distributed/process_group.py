"""``torch.distributed``'s process-group calls, on ``jax.distributed``: a torchrun launch joins one job."""

from __future__ import annotations

import os
from typing import Any

import jax

from xgrad.distributed.processes import initialize

__all__ = ["destroy_process_group", "get_rank", "get_world_size", "init_process_group", "is_initialized"]


def _from_environment(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"Error initializing torch.distributed using env:// rendezvous: environment variable {name} "
                         "expected, but not set (torchrun sets it; or pass world_size=, rank= and init_method='tcp://host:port')")
    return value


def init_process_group(backend: str | None = None, init_method: str | None = None, timeout: Any = None,
                       world_size: int = -1, rank: int = -1, **accepted: Any) -> None:
    """Join this process to the job torchrun started: ``xgrad.distributed.initialize`` with the
    coordinator at ``MASTER_ADDR:MASTER_PORT`` (or ``init_method="tcp://host:port"``), ``WORLD_SIZE``
    processes and this one's ``RANK``, unless given as arguments. ``backend`` (``"nccl"``,
    ``"gloo"``) is accepted: JAX picks its own collectives."""
    if init_method is not None and init_method.startswith("tcp://"):
        address = init_method[len("tcp://"):]
    else:
        address = f"{_from_environment('MASTER_ADDR')}:{_from_environment('MASTER_PORT')}"
    world_size = int(_from_environment("WORLD_SIZE")) if world_size == -1 else world_size
    rank = int(_from_environment("RANK")) if rank == -1 else rank
    initialize(address, world_size, rank)


def destroy_process_group(group: Any = None) -> None:
    """Leave the job (``jax.distributed.shutdown``)."""
    jax.distributed.shutdown()


def is_initialized() -> bool:
    """Whether this process is one of a job of several (``jax.process_count() > 1``)."""
    return jax.process_count() > 1


def get_rank(group: Any = None) -> int:
    """This process's index in the job (``jax.process_index()``; 0 alone)."""
    return jax.process_index()


def get_world_size(group: Any = None) -> int:
    """The processes in the job (``jax.process_count()``; 1 alone)."""
    return jax.process_count()
