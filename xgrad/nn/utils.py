"""``torch.nn.utils``: gradient clipping and flattening parameters to one vector.

They work eagerly and inside an ``xgrad.compile``d step (between ``backward()`` and
``optimizer.step()``): the grads are scaled in place, under ``no_grad``.

>>> import xgrad
>>> w = xgrad.nn.Parameter(xgrad.zeros(2))
>>> w.grad = xgrad.tensor([3.0, 4.0])
>>> float(xgrad.nn.utils.clip_grad_norm_([w], max_norm=1.0))
5.0
>>> [round(g, 4) for g in w.grad.tolist()]
[0.6, 0.8]
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import jax.numpy as jnp

from xgrad import ops
from xgrad.grad_mode import no_grad
from xgrad.ops._util import check_values
from xgrad.tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_", "parameters_to_vector", "vector_to_parameters"]

ERR_NONFINITE_NORM = (
    "The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it cannot be clipped. "
    "To disable this error and scale the gradients by the non-finite norm anyway, set `error_if_nonfinite=False`"
)


def _as_list(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
    return [parameters] if isinstance(parameters, Tensor) else list(parameters)


def clip_grad_norm_(
    parameters: Tensor | Iterable[Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """Scale the grads so that their joint ``norm_type``-norm is at most ``max_norm``; return that norm.

    As PyTorch: the norm is that of the per-grad norms, the grads are multiplied by
    ``min(max_norm / (total_norm + 1e-6), 1)``. ``foreach`` is accepted and ignored (one
    fused program either way).

    >>> import xgrad
    >>> w = xgrad.nn.Parameter(xgrad.zeros(2)); w.grad = xgrad.tensor([-3.0, 1.0])
    >>> float(clip_grad_norm_(w, 1.0, norm_type="inf"))
    3.0
    """
    del foreach
    grads = [p.grad for p in _as_list(parameters) if p.grad is not None]
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not grads:
        return Tensor(jnp.asarray(0.0, jnp.float32))
    with no_grad():
        total_norm = ops.norm(ops.stack([ops.norm(g, norm_type) for g in grads]), norm_type)
        if error_if_nonfinite:
            check_values(lambda a: ~(a == a) | (abs(a) == math.inf), total_norm,
                         lambda: RuntimeError(ERR_NONFINITE_NORM.format(norm_type=norm_type)))
        clip_coef = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(clip_coef.to(g.dtype))
    return total_norm


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every grad to ``[-clip_value, clip_value]`` in place.

    >>> import xgrad
    >>> w = xgrad.nn.Parameter(xgrad.zeros(2)); w.grad = xgrad.tensor([-3.0, 0.5])
    >>> clip_grad_value_(w, 1.0); w.grad.tolist()
    [-1.0, 0.5]
    """
    del foreach
    clip_value = float(clip_value)
    with no_grad():
        for p in _as_list(parameters):
            if p.grad is not None:
                p.grad.clamp_(min=-clip_value, max=clip_value)


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """The parameters flattened and joined into one vector.

    >>> import xgrad
    >>> parameters_to_vector([xgrad.ones(2, 2), xgrad.zeros(1)]).tolist()
    [1.0, 1.0, 1.0, 1.0, 0.0]
    """
    return ops.cat([p.reshape(-1) for p in parameters])


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copy consecutive slices of ``vec`` into the parameters, in place (the inverse of ``parameters_to_vector``).

    >>> import xgrad
    >>> a, b = xgrad.zeros(2), xgrad.zeros(1)
    >>> vector_to_parameters(xgrad.tensor([1.0, 2.0, 3.0]), [a, b]); a.tolist(), b.tolist()
    ([1.0, 2.0], [3.0])
    """
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
    offset = 0
    with no_grad():
        for p in parameters:
            n = p.numel()
            p.copy_(vec[offset:offset + n].reshape(p.shape))
            offset += n
