"""The ``AttributeError`` for a PyTorch name xgrad does not have: it says so, and what to use.

``xgrad``, ``xgrad.nn``, ``xgrad.nn.functional`` and ``Tensor`` raise it from ``__getattr__``
(reached only when the name is missing), so a PyTorch program learns that ``torch.acos`` is
PyTorch's and not a typo, and how to run it anyway.

>>> import xgrad
>>> xgrad.acos
Traceback (most recent call last):
...
AttributeError: module 'xgrad' has no attribute 'acos': torch.acos is a PyTorch name xgrad does not have. JAX's jax.numpy.acos runs on tensors with gradients as xgrad.from_jax(jax.numpy.acos)(x).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from xgrad.pytorch_names import PYTORCH_NAMES

__all__ = ["missing_attribute"]

# Where xgrad has the thing under another name or place.
_INSTEAD = {
    ("torch", "Size"): "a tuple (a Tensor's .shape is one)",
    ("torch", "as_tensor"): "xgrad.tensor (or xgrad.from_numpy)",
    ("torch", "asarray"): "xgrad.tensor (or xgrad.from_numpy)",
    ("torch", "vmap"): "xgrad.func.vmap",
    ("torch", "set_default_tensor_type"): "xgrad.set_default_dtype",
    ("torch.Tensor", "data_ptr"): "tensor.array (the jax.Array; JAX exposes no raw pointer)",
    ("torch.Tensor", "get_device"): "tensor.device (a jax.Device)",
    ("torch.Tensor", "square"): "tensor ** 2",
    ("torch.Tensor", "itemsize"): "tensor.element_size()",
}


def _advice(namespace: str, name: str) -> str:
    instead = _INSTEAD.get((namespace, name))
    if instead is not None:
        return f" Use {instead}."
    if hasattr(jnp, name):
        call = "(x)" if namespace != "torch.Tensor" else "(tensor, ...)"
        return f" JAX's jax.numpy.{name} runs on tensors with gradients as xgrad.from_jax(jax.numpy.{name}){call}."
    return " docs/migrating_from_pytorch.md lists what xgrad covers."


def missing_attribute(namespace: str, owner: str, name: str, obj: Any = None) -> AttributeError:
    """The error for ``owner.name`` missing: PyTorch's name in ``namespace`` (``"torch"``,
    ``"torch.nn"``, ``"torch.nn.functional"``, ``"torch.Tensor"``) or plain Python's."""
    message = f"{owner} has no attribute '{name}'"
    if name in PYTORCH_NAMES[namespace]:
        message += f": {namespace}.{name} is a PyTorch name xgrad does not have.{_advice(namespace, name)}"
    return AttributeError(message, name=name, obj=obj)
