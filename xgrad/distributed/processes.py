"""Starting a job of several processes over ``jax.distributed``, and what happens when one dies.

# NOTE [A dead peer]
# JAX's processes are joined by a coordination service that process 0 hosts; each
# process sends it heartbeats. Measured with gloo collectives on CPU (JAX 0.10, 2
# processes): when process 1 dies, process 0's collective in flight or next (a psum of
# the training step, a barrier of a checkpoint save) fails within a second with a
# ``JaxRuntimeError`` ("Gloo ... Connection closed by peer") when the dead process's
# sockets close; a peer that hangs or whose host vanishes closes none, and the
# survivor blocks until the coordination service declares it dead for missing
# heartbeats (``heartbeat_timeout_seconds``, 100 s by default). Either way the job
# cannot go on with fewer processes: the service then aborts the survivor from C++
# (SIGABRT, "Terminating process because the JAX distributed service detected fatal
# errors"), at the latest when it exits (its shutdown barrier waits for the dead
# peer for the heartbeat timeout), with no ``finally`` or ``atexit`` run. When
# process 0 dies, the coordination service goes with it and the others are aborted
# at once. So nothing in a surviving process can save or recover. The remedy is
# outside the processes: a launcher that restarts all of them when any exits, each
# resuming from the latest complete checkpoint (``CheckpointManager.latest_step``).
# A lower ``heartbeat_timeout_seconds`` makes survivors die sooner (so the restart
# comes sooner); too low, and a long pause (a slow compile, a swapped host) kills a
# healthy job.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

__all__ = ["initialize"]


def initialize(
    coordinator_address: str,
    num_processes: int,
    process_id: int,
    *,
    local_device_ids: int | Sequence[int] | None = None,
    initialization_timeout: int = 300,
    heartbeat_timeout_seconds: int = 100,
    shutdown_timeout_seconds: int = 300,
) -> None:
    """Join this process to a job of ``num_processes`` (``jax.distributed.initialize``, before any JAX work).

    Every process calls it with the same ``coordinator_address`` (process 0's host and
    a free port) and its own ``process_id`` in ``0 .. num_processes - 1``. Afterwards
    ``jax.devices()`` lists every process's devices, and arrays sharded over them make
    ``backward``, the optimizers and ``xgrad.save`` collective.

    When a process dies, the others cannot carry on: their next collective fails (or
    blocks, up to ``heartbeat_timeout_seconds``, when the dead peer's connections stay
    open), and JAX then aborts them from C++ (SIGABRT; no ``finally`` runs), at the
    latest when they exit. Restart all processes and resume from the latest complete
    checkpoint of a ``CheckpointManager`` (NOTE [A dead peer] in
    xgrad/distributed/processes.py).

    Args:
        coordinator_address: ``"host:port"`` of process 0, where it serves the
            coordination service.
        num_processes: how many processes the job has.
        process_id: this process's number.
        local_device_ids: the local devices this process uses (default: all).
        initialization_timeout: seconds to wait for every process to join before
            raising (JAX's default, 300).
        heartbeat_timeout_seconds: seconds without a heartbeat after which a process
            counts as dead, and the others are aborted (JAX's default, 100).
        shutdown_timeout_seconds: seconds a process that exits waits for the others
            to exit too (JAX's default, 300).
    """
    jax.distributed.initialize(
        coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id,
        local_device_ids=local_device_ids, initialization_timeout=initialization_timeout,
        heartbeat_timeout_seconds=heartbeat_timeout_seconds, shutdown_timeout_seconds=shutdown_timeout_seconds,
    )
