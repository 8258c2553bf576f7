"""xgrad: PyTorch-style eager autograd on ``jax.Array``, with an optional compiled backward.

>>> import xgrad
>>> w = xgrad.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
>>> loss = (w @ xgrad.tensor([1.0, 1.0])).tanh().sum()
>>> loss.backward()
>>> w.grad.shape
(2, 2)
"""

# isort: off
# The op library first: importing it attaches the ops to Tensor, which the rest uses.
from xgrad import ops
from xgrad.ops import *  # noqa: F403  (the op library is re-exported at top level)
from xgrad.ops import __all__ as _ops_all

# isort: on
from xgrad import autograd, func, nn, optim, profiler, viz
from xgrad import compile_cache as _compile_cache
from xgrad.compile_cache import enable_compilation_cache
from xgrad.compile_step import compile
from xgrad.creation import arange, eye, full, manual_seed, ones, ones_like, rand, randn, tensor, zeros, zeros_like
from xgrad.grad_mode import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from xgrad.ops.jaxtrace import intermediates
from xgrad.serialization import load, save
from xgrad.tensor import Tensor

_compile_cache.setup()

__version__ = "0.1.0"

__all__ = [
    *_ops_all, "Tensor", "arange", "autograd", "compile", "enable_compilation_cache", "enable_grad", "eye", "full", "func",
    "inference_mode", "intermediates", "is_grad_enabled", "is_inference_mode_enabled",
    "load", "manual_seed", "nn", "no_grad", "ones", "ones_like", "ops", "optim", "profiler", "rand", "randn", "save",
    "set_grad_enabled", "tensor", "viz", "zeros", "zeros_like",
]
