"""``torch.nn.parallel``: data parallelism over the devices JAX sees.

``DataParallel`` replicates the module's parameters over the local devices and splits each
batch across them: one SPMD computation whose gradient XLA all-reduces, so a step trains to
the single-device result. ``DistributedDataParallel`` averages gradients over the processes
of a ``xgrad.distributed.initialize`` job as PyTorch's averages over its process group.
"""

from xgrad.nn.parallel.data_parallel import DataParallel, data_parallel
from xgrad.nn.parallel.distributed import DistributedDataParallel

__all__ = ["DataParallel", "DistributedDataParallel", "data_parallel"]
