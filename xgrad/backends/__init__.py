"""``torch.backends`` and the precision and thread settings, answered by JAX and XLA.

``set_float32_matmul_precision`` sets JAX's ``jax_default_matmul_precision`` (for every JAX
computation in the process, as PyTorch's is process-wide); ``cuda.matmul.allow_tf32`` reads and
sets the same switch, as in PyTorch. The cuDNN flags are recorded for programs that read them
back: XLA chooses its convolution algorithms itself.

>>> import xgrad
>>> xgrad.backends.cudnn.benchmark = True
>>> xgrad.backends.mps.is_available()
False
"""

from __future__ import annotations

import logging
import os

from xgrad.backends import cpu, cuda, cudnn, mps
from xgrad.backends.precision import get_float32_matmul_precision, set_float32_matmul_precision

__all__ = [
    "cpu", "cuda", "cudnn", "get_float32_matmul_precision", "get_num_interop_threads", "get_num_threads", "mps",
    "set_float32_matmul_precision", "set_num_interop_threads", "set_num_threads",
]

logger = logging.getLogger(__name__)

def _check_threads(n: int, name: str) -> None:
    if not isinstance(n, int) or isinstance(n, bool):
        raise RuntimeError(f"{name} expects an int, but got {type(n).__name__}")
    if n < 1:
        raise RuntimeError(f"{name} expects a positive integer")


def get_num_threads() -> int:
    """The threads XLA's CPU backend computes with: the CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def set_num_threads(n: int) -> None:
    """Checked as PyTorch checks it; XLA sizes its CPU thread pool when JAX starts (the
    ``--xla_cpu_multi_thread_eigen`` and ``intra_op_parallelism_threads`` XLA flags), so it stays."""
    _check_threads(n, "set_num_threads")
    logger.debug("set_num_threads(%d): XLA's CPU thread pool keeps the size it started with (%d)", n, get_num_threads())


def get_num_interop_threads() -> int:
    """The threads XLA runs independent computations on: as ``get_num_threads``."""
    return get_num_threads()


def set_num_interop_threads(n: int) -> None:
    """Checked as PyTorch checks it; XLA's pools keep the size they started with (``set_num_threads``)."""
    _check_threads(n, "set_num_interop_threads")
