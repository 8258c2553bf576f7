"""xgrad: PyTorch-style eager autograd on ``jax.Array``, with an optional compiled backward.

>>> import xgrad
>>> w = xgrad.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
>>> loss = (w @ xgrad.tensor([1.0, 1.0])).tanh().sum()
>>> loss.backward()
>>> w.grad.shape
(2, 2)
"""

import builtins
import importlib
from typing import TYPE_CHECKING

# isort: off
# The op library first: importing it attaches the ops to Tensor, which the rest uses.
from xgrad import ops
from xgrad.ops import *  # noqa: F403  (the op library is re-exported at top level)
from xgrad.ops import __all__ as _ops_all

# isort: on
from xgrad import accelerator, amp, autograd, backends, cuda, jit, nn, onnx, optim, profiler, sparse, viz
from xgrad import compile_cache as _compile_cache
from xgrad.amp import GradScaler, autocast
from xgrad.backends import (
    get_float32_matmul_precision,
    get_num_interop_threads,
    get_num_threads,
    set_float32_matmul_precision,
    set_num_interop_threads,
    set_num_threads,
)
from xgrad.compile_cache import enable_compilation_cache
from xgrad.compile_step import compile
from xgrad.creation import (
    Generator,
    arange,
    bernoulli,
    device,
    empty,
    empty_like,
    eye,
    from_numpy,
    full,
    full_like,
    linspace,
    manual_seed,
    multinomial,
    ones,
    ones_like,
    rand,
    rand_like,
    randint,
    randint_like,
    randn,
    randn_like,
    randperm,
    tensor,
    zeros,
    zeros_like,
)
from xgrad.grad_mode import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from xgrad.missing_names import missing_attribute
from xgrad.ops.jaxtrace import intermediates
from xgrad.serialization import load, save
from xgrad.tensor import Tensor, is_tensor
from xgrad.tensor.dtypes import DTYPES as _DTYPES
from xgrad.tensor.dtypes import dtype, finfo, get_default_dtype, iinfo, set_default_dtype
from xgrad.tensor.legacy_types import (
    BFloat16Tensor,
    BoolTensor,
    ByteTensor,
    CharTensor,
    DoubleTensor,
    FloatTensor,
    HalfTensor,
    IntTensor,
    LongTensor,
    ShortTensor,
)

if TYPE_CHECKING:
    from xgrad import distributed, func, testing, utils

# NOTE [Lazy subpackages]
# ``xgrad.distributed``, ``xgrad.func``, ``xgrad.testing`` and ``xgrad.utils`` (with
# ``xgrad.utils.data``) are reachable after a plain ``import xgrad`` but imported on first
# use, so that ``import xgrad`` pays only for the tensor, the engine, the ops, ``nn`` and
# ``optim``. ``xgrad.testing`` sits above the rest of the library in the layers (it checks
# them); importing it from here at call time keeps the layering true at import.
_LAZY_SUBPACKAGES = frozenset({"distributed", "func", "testing", "utils"})


def __getattr__(name: str) -> object:
    if name in _LAZY_SUBPACKAGES:
        return importlib.import_module(f"xgrad.{name}")
    raise missing_attribute("torch", "module 'xgrad'", name)  # a PyTorch name xgrad lacks says so


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_SUBPACKAGES})


def is_floating_point(input: Tensor) -> builtins.bool:  # noqa: A002  (PyTorch's argument name)
    """Whether ``input``'s dtype is a real floating one."""
    return input.is_floating_point()


def is_complex(input: Tensor) -> builtins.bool:  # noqa: A002
    """Whether ``input``'s dtype is complex."""
    return input.is_complex()


def is_inference(input: Tensor) -> builtins.bool:  # noqa: A002
    """Whether ``input`` is an inference tensor, made inside ``inference_mode()`` (``Tensor.is_inference``).

    >>> import xgrad
    >>> with xgrad.inference_mode():
    ...     made_inside = xgrad.ones(2)
    >>> xgrad.is_inference(made_inside), xgrad.is_inference(xgrad.ones(2))
    (True, False)
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"is_inference(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    return input.is_inference()


# PyTorch's dtype names (the table in xgrad/tensor/dtypes.py), left out of ``__all__`` as torch's are:
# ``from xgrad import *`` must not shadow the builtins ``float``, ``int`` and ``bool``.
float16 = _DTYPES["float16"]
bfloat16 = _DTYPES["bfloat16"]
float32 = _DTYPES["float32"]
float64 = _DTYPES["float64"]
complex64 = _DTYPES["complex64"]
complex128 = _DTYPES["complex128"]
uint8 = _DTYPES["uint8"]
int8 = _DTYPES["int8"]
int16 = _DTYPES["int16"]
int32 = _DTYPES["int32"]
int64 = _DTYPES["int64"]
bool = _DTYPES["bool"]  # noqa: A001
half = _DTYPES["half"]
float = _DTYPES["float"]  # noqa: A001
double = _DTYPES["double"]
cfloat = _DTYPES["cfloat"]
cdouble = _DTYPES["cdouble"]
short = _DTYPES["short"]
int = _DTYPES["int"]  # noqa: A001
long = _DTYPES["long"]


_compile_cache.setup()

__version__ = "0.1.0"

__all__ = [
    *_ops_all, "BFloat16Tensor", "BoolTensor", "ByteTensor", "CharTensor", "DoubleTensor", "FloatTensor",
    "Generator", "GradScaler", "HalfTensor", "IntTensor", "LongTensor", "ShortTensor", "Tensor", "accelerator",
    "amp", "arange", "autocast", "autograd", "backends", "bernoulli", "compile", "cuda", "device", "distributed",
    "dtype", "empty", "empty_like", "enable_compilation_cache", "enable_grad", "eye", "finfo", "from_numpy",
    "full", "full_like", "func", "get_default_dtype", "get_float32_matmul_precision", "get_num_interop_threads",
    "get_num_threads", "iinfo", "inference_mode", "intermediates", "is_complex", "is_floating_point",
    "is_grad_enabled", "is_inference", "is_inference_mode_enabled", "is_tensor", "jit", "linspace", "load",
    "manual_seed", "multinomial", "nn", "no_grad", "ones", "ones_like", "onnx", "ops", "optim", "profiler", "rand",
    "rand_like", "randint", "randint_like", "randn", "randn_like", "randperm", "save", "set_default_dtype",
    "set_float32_matmul_precision", "set_grad_enabled", "set_num_interop_threads", "set_num_threads", "sparse",
    "tensor", "testing", "utils", "viz", "zeros", "zeros_like",
]

