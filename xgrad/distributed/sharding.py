"""``shard_module``: a module's parameters and buffers placed on a mesh by rules on their names."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from xgrad.nn.module import Module
from xgrad.nn.module_placement import _replace_storage
from xgrad.tensor import Tensor

Rule = Callable[[str, Tensor], "PartitionSpec | None"]


def fsdp(axis: str = "data") -> Rule:
    """The fully sharded rule: each tensor split over ``axis`` along its first dim that the axis divides.

    A tensor no dim of which divides (a scalar, a bias of odd length) stays replicated.
    Returns a rule for ``shard_module``; the mesh is ``shard_module``'s.

    >>> import jax, xgrad
    >>> from xgrad.distributed import fsdp, shard_module
    >>> mesh = jax.sharding.Mesh(jax.devices()[:1], ("data",))
    >>> model = shard_module(xgrad.nn.Linear(4, 3, key=0), mesh, fsdp("data"))
    >>> model.weight.sharding.spec
    P('data',)
    """

    def rule(name: str, t: Tensor, mesh: Mesh) -> PartitionSpec:
        size = mesh.shape[axis]
        for dim, length in enumerate(t.shape):
            if length % size == 0:
                return PartitionSpec(*([None] * dim), axis)
        return PartitionSpec()

    rule.needs_mesh = True  # type: ignore[attr-defined]
    return rule  # type: ignore[return-value]


def _spec_for(rules: Any, name: str, t: Tensor, mesh: Mesh, default: PartitionSpec) -> PartitionSpec:
    if callable(rules):
        spec = rules(name, t, mesh) if getattr(rules, "needs_mesh", False) else rules(name, t)
        return default if spec is None else spec
    for pattern, spec in rules:
        if re.search(pattern, name):
            return spec
    return default


def shard_module(
    module: Module,
    mesh: Mesh,
    rules: Sequence[tuple[str, PartitionSpec]] | Rule,
    *,
    default: PartitionSpec = PartitionSpec(),  # noqa: B008  (immutable)
) -> Module:
    """Place ``module``'s parameters and buffers on ``mesh``, each as the first rule matching its name says.

    Args:
        module: placed in place (each tensor's storage is rebound, its version moves on,
            as ``Module.to`` does) and returned.
        mesh: the ``jax.sharding.Mesh``.
        rules: ``(pattern, PartitionSpec)`` pairs, the first whose regular expression
            ``re.search``es a tensor's ``named_parameters()``/``named_buffers()`` name
            wins; or a function ``(name, tensor) -> PartitionSpec | None``; or
            ``fsdp(axis)``.
        default: the spec of a tensor no rule matches (replicated).

    An optimizer's state follows its parameters: it is placed like each parameter at its
    next step, whether it was built before or after this call. A spec that does not fit
    a tensor (more dims than it has, or an axis size that does not divide its dim)
    raises ``ValueError`` naming the tensor.

    >>> import jax, xgrad
    >>> from jax.sharding import PartitionSpec as P
    >>> mesh = jax.sharding.Mesh(jax.devices()[:1], ("model",))
    >>> model = xgrad.nn.Linear(4, 2, key=0)
    >>> model = xgrad.distributed.shard_module(model, mesh, [(r"weight$", P(None, "model"))])
    >>> model.weight.sharding.spec, model.bias.sharding.spec
    (P(None, 'model'), P())
    """
    named = [*module.named_parameters(), *module.named_buffers()]
    placed: list[tuple[Tensor, NamedSharding]] = []
    for name, t in named:
        spec = _spec_for(rules, name, t, mesh, default)
        if len(spec) > t.ndim:
            raise ValueError(f"shard_module: {name} has {t.ndim} dims, but its PartitionSpec {spec} names {len(spec)}")
        for dim, axes in enumerate(spec):
            parts = 1
            for axis in (axes,) if isinstance(axes, str) else axes or ():
                parts *= mesh.shape[axis]
            if t.shape[dim] % parts:
                raise ValueError(
                    f"shard_module: {name} has shape {list(t.shape)}; dim {dim} ({t.shape[dim]}) cannot be split "
                    f"into {parts} parts over mesh axes {axes!r}"
                )
        placed.append((t, NamedSharding(mesh, spec)))
    for t, sharding in placed:  # checked all first: a bad rule changes nothing
        _replace_storage(t, jax.device_put(t.array, sharding))
    return module
