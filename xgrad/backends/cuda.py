"""``torch.backends.cuda``: ``matmul.allow_tf32`` is ``xgrad.set_float32_matmul_precision``'s switch."""

from __future__ import annotations

from xgrad import cuda as _cuda
from xgrad.backends.precision import get_float32_matmul_precision, set_float32_matmul_precision

__all__ = ["is_built", "matmul"]


class _Matmul:
    """``torch.backends.cuda.matmul``: ``allow_tf32`` reads and sets the float32 matmul precision
    (``True``: ``"high"``, ``False``: ``"highest"``), as PyTorch's does."""

    @property
    def allow_tf32(self) -> bool:
        return get_float32_matmul_precision() != "highest"

    @allow_tf32.setter
    def allow_tf32(self, allowed: bool) -> None:
        set_float32_matmul_precision("high" if allowed else "highest")


matmul = _Matmul()


def is_built() -> bool:
    """Whether JAX sees a GPU (xgrad has no CUDA build of its own)."""
    return _cuda.is_available()
