"""Scaling out: placing a model's state on a mesh, starting a job of several processes, and checkpoints it resumes from.

A parameter is a Tensor whose storage is a ``jax.Array``, so it can live sharded over a
``jax.sharding.Mesh`` like any JAX array; eager ops, the compiled backward and
``xgrad.compile`` then run SPMD programs whose collectives XLA inserts. ``shard_module``
places a module's parameters and buffers by rules on their names; ``fsdp`` is the rule
that shards everything over one mesh axis (ZeRO-3: each weight is gathered where it is
used and its gradient reduced back onto its shards). ``xgrad.with_sharding_constraint``
constrains a value inside a step, in every mode, and ``collective_stats`` counts what a
compiled step communicates (``step.lower(*args).compile()``). ``initialize`` starts a
job over ``jax.distributed`` (``init_process_group`` is torchrun's form of it);
``CheckpointManager`` saves and restores sharded model and optimizer state atomically, so
a restarted job resumes where it left off.
"""

from xgrad.distributed.checkpoint import CheckpointManager
from xgrad.distributed.hlo import collective_stats
from xgrad.distributed.process_group import (
    destroy_process_group,
    get_rank,
    get_world_size,
    init_process_group,
    is_initialized,
)
from xgrad.distributed.processes import initialize
from xgrad.distributed.sharding import fsdp, shard_module

__all__ = [
    "CheckpointManager", "collective_stats", "destroy_process_group", "fsdp", "get_rank", "get_world_size",
    "init_process_group", "initialize", "is_initialized", "shard_module",
]
