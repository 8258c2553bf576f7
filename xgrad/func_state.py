"""``torch.func``'s helpers for models and for looking inside transforms: ``stack_module_state``,
``replace_all_batch_norm_modules_`` and ``debug_unwrap`` (``xgrad.func`` exports them).

# NOTE [Ensembles by stacked state]
# torch.func ensembles models by stacking each parameter and buffer of several models of
# one class into one tensor with a leading model dim (``stack_module_state``), then
# ``vmap(functional_call)`` over that dim on one of the models used as a template. The
# stacked parameters are new leaves (gradients reach them, not the models'), as in
# PyTorch; buffers are stacked as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

import jax

from xgrad.jax_internals import unwrap_tracer
from xgrad.ops import stack
from xgrad.tensor import Tensor

__all__ = ["debug_unwrap", "replace_all_batch_norm_modules_", "stack_module_state"]

#: Set while ``xgrad.func`` traces a transform into its cached program (NOTE [Transforms cached per
#: signature] in ``xgrad/func.py``): no values are under the tracers then, so ``debug_unwrap`` makes
#: that call run uncached, where they are.
TRACING_CACHED: ContextVar[bool] = ContextVar("xgrad_func_tracing_cached", default=False)


class NeedsValues(Exception):
    """Raised in a cached transform's trace by what needs the values under the tracers."""


def _stacked_leaf(tensors: Sequence[Tensor], name: str) -> Tensor:
    requires = [t.requires_grad for t in tensors]
    if any(requires) and not all(requires):
        raise RuntimeError(f"Expected {name} from each model to have the same .requires_grad")
    result = stack(list(tensors))
    return result.detach().requires_grad_() if all(requires) else result


def stack_module_state(models: Sequence[Any]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``torch.func.stack_module_state``: each parameter and buffer of ``models`` stacked along a new dim 0.

    Returns ``(params, buffers)``, dicts by ``named_parameters()``/``named_buffers()`` name,
    for ``vmap(functional_call)`` over an ensemble (NOTE [Ensembles by stacked state]). The
    models must be of one class and all in training or all in eval mode.

    >>> import xgrad
    >>> models = [xgrad.nn.Linear(3, 2, key=k) for k in range(4)]
    >>> params, buffers = xgrad.func.stack_module_state(models)
    >>> params["weight"].shape, params["weight"].is_leaf, params["weight"].requires_grad
    ((4, 2, 3), True, True)
    """
    models = list(models)
    if not models:
        raise RuntimeError("stack_module_state: Expected at least one model, got 0.")
    if len({m.training for m in models}) > 1:
        raise RuntimeError("stack_module_state: Expected all models to have the same training/eval mode.")
    if len({type(m) for m in models}) > 1:
        raise RuntimeError("stack_module_state: Expected all models to be of the same class.")
    stacked = []
    for named in ("named_parameters", "named_buffers"):
        per_model = [dict(getattr(m, named)()) for m in models]
        stacked.append({name: _stacked_leaf([d[name] for d in per_model], name) for name in per_model[0]})
    return stacked[0], stacked[1]


def replace_all_batch_norm_modules_(root: Any) -> Any:
    """``torch.func.replace_all_batch_norm_modules_``: batch norm in ``root`` stops tracking running statistics, in place.

    Every batch norm module (one with a ``running_mean`` buffer and ``track_running_stats``)
    gets ``running_mean``, ``running_var`` and ``num_batches_tracked`` set to ``None`` and
    ``track_running_stats=False``, so that it normalises with batch statistics and writes no
    buffer, which ``vmap`` over it needs. Returns ``root``.

    >>> import xgrad
    >>> net = xgrad.nn.Sequential(xgrad.nn.Linear(2, 2, key=0), xgrad.nn.BatchNorm1d(2))
    >>> _ = xgrad.func.replace_all_batch_norm_modules_(net)
    >>> net[1].running_mean is None, net[1].track_running_stats
    (True, False)
    """
    for module in root.modules():
        if "running_mean" in module._buffers and hasattr(module, "track_running_stats"):
            module.running_mean = None
            module.running_var = None
            module.num_batches_tracked = None
            module.track_running_stats = False
    return root


def debug_unwrap(tensor: Any, *, recurse: bool = True) -> Any:
    """``torch.func.debug_unwrap``: the values under a transform's tracers, for debugging.

    Inside ``vmap`` a Tensor is one lane of a batch; unwrapped, it is the whole batch (the
    batch dim where JAX keeps it). Inside ``grad``/``jvp`` it is the primal. ``recurse=False``
    unwraps one transform only. A Tensor with no values under it (``jax.jit``,
    ``xgrad.compile``), and anything not a Tensor, comes back as it is.

    >>> import xgrad
    >>> seen = []
    >>> _ = xgrad.func.vmap(lambda x: seen.append(xgrad.func.debug_unwrap(x).shape) or x)(xgrad.ones(4, 2))
    >>> seen
    [(4, 2)]
    """
    if not isinstance(tensor, Tensor):
        return tensor
    if TRACING_CACHED.get():
        raise NeedsValues("debug_unwrap needs the values under the transform")
    array = tensor.array
    while isinstance(array, jax.core.Tracer):
        inner = unwrap_tracer(array)
        if inner is None:
            return tensor
        array = inner
        if not recurse:
            break
    return Tensor(array)
