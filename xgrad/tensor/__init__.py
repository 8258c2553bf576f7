"""``Tensor`` and its helpers; ``core`` holds the class, each other module one concern of it."""

# isort: off
# The class first: the concern modules refer to it through ``core`` and are bound into it.
from xgrad.tensor.core import Tensor, is_tensor

# isort: on
# Pickles of tensors name ``xgrad.tensor._unpickle_tensor``.
from xgrad.tensor.conversion import _unpickle_tensor as _unpickle_tensor
from xgrad.tensor.dtypes import can_cast, is_differentiable_dtype, torch_dtype_name
from xgrad.tensor.inplace import ERR_LEAF_INPLACE
from xgrad.tensor.jax_boundary import user_site, user_stacklevel

__all__ = [
    "ERR_LEAF_INPLACE", "Tensor", "can_cast", "is_differentiable_dtype", "is_tensor", "torch_dtype_name", "user_site",
    "user_stacklevel",
]
