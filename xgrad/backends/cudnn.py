"""``torch.backends.cudnn``: its flags, which programs set and read back.

XLA runs convolutions through cuDNN on a GPU and picks their algorithms itself, so the flags
change nothing: ``benchmark`` (XLA autotunes anyway), ``deterministic`` (XLA's flag
``--xla_gpu_deterministic_ops`` in ``XLA_FLAGS`` is the switch), ``allow_tf32`` (float32
convolutions follow ``xgrad.set_float32_matmul_precision``, as matmuls do) and ``enabled``.
"""

from xgrad import cuda as _cuda

__all__ = ["allow_tf32", "benchmark", "deterministic", "enabled", "is_available"]

# PyTorch's defaults.
enabled = True
benchmark = False
deterministic = False
allow_tf32 = True


def is_available() -> bool:
    """Whether JAX sees a GPU (XLA's GPU convolutions run through cuDNN)."""
    return _cuda.is_available()
