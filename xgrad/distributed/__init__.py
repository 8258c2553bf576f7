"""Scaling out over several processes: starting a job, and checkpoints it resumes from when restarted."""

from xgrad.distributed.checkpoint import CheckpointManager
from xgrad.distributed.processes import initialize

__all__ = ["CheckpointManager", "initialize"]
