"""The float32 matmul precision: PyTorch's names for JAX's ``jax_default_matmul_precision``."""

from __future__ import annotations

import warnings

import jax

__all__ = ["get_float32_matmul_precision", "set_float32_matmul_precision"]

# PyTorch's precision names and JAX's for the same float32 matmul: full float32, TF32, bfloat16.
_JAX_PRECISION = {"highest": "float32", "high": "tensorfloat32", "medium": "bfloat16"}
_PYTORCH_PRECISION = {
    "float32": "highest", "highest": "highest", "tensorfloat32": "high", "high": "high", "bfloat16_3x": "high",
    "bfloat16": "medium", "fastest": "medium", "default": "medium",
}
# What XLA's DEFAULT precision is on each platform (jax.lax.Precision): TF32 on GPUs that have it
# (every GPU PyTorch's "high" is about), one bfloat16 pass on TPU, float32 on CPU.
_PLATFORM_DEFAULT = {"gpu": "high", "tpu": "medium"}


def get_float32_matmul_precision() -> str:
    """``"highest"``, ``"high"`` or ``"medium"``: what float32 matmuls and convolutions run at now."""
    # A flag JAX's Config sets as an attribute at run time (no stub declares it).
    configured = jax.config.jax_default_matmul_precision  # type: ignore[attr-defined]
    if configured is None:
        return _PLATFORM_DEFAULT.get(jax.default_backend(), "highest")
    return _PYTORCH_PRECISION[str(configured)]


def set_float32_matmul_precision(precision: str) -> None:
    """Run float32 matmuls and convolutions at ``"highest"`` (float32), ``"high"`` (TF32) or
    ``"medium"`` (bfloat16) precision: JAX's ``jax_default_matmul_precision``."""
    if precision not in _JAX_PRECISION:
        warnings.warn(f"{precision} is not one of 'highest', 'high', or 'medium'; the current "
                      "set_float32_matmul_precision call has no effect.", UserWarning, stacklevel=2)
        return
    jax.config.update("jax_default_matmul_precision", _JAX_PRECISION[precision])
