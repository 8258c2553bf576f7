"""The kinds of autograd hook: one table that every route and tool reads.

# NOTE [Hook kinds]
# A hook runs in up to four routes (the eager engine, the compiled backward,
# ``xgrad.compile``, JAX's AD) and is shown or fuzzed by tools (``viz``,
# ``xgrad.testing``). Past its registration method and its run point in the eager
# engine, none of them names the kinds one by one: each reads ``KINDS``, once, at
# import, for what it needs of a kind: where its hooks are kept, what a hook's result
# means, when it runs and in which order, how a picture or a recompile reason names it,
# whether JAX's AD calls it. A new kind is then its row here, its registration method
# (``tensor/core.py`` or ``engine/node.py``, keeping the hooks in the slot the row
# names) and its run point in the eager engine (``engine/engine.py`` or
# ``engine/node.py``, through ``run_in_order``); ``tests/test_hook_kinds.py`` checks
# that every route covers every row. The table sits on the tensor floor because the
# JAX boundary (``jax_boundary.py``) reads it when a tensor is flattened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = [
    "ACCUMULATED", "AFTER", "BEFORE", "KINDS", "LEAF_KINDS", "POST", "POST_ACCUMULATE", "PRE", "RECORDS", "REPLACES_GRAD",
    "REPLACES_GRADS", "RETAIN_GRAD", "RETURNS_NONE", "TENSOR", "HookKind", "hooks_at", "leaf_has_hooks", "node_has_hooks",
]

# What a hook's result means: its calling convention.
REPLACES_GRAD = "replaces the gradient"  # hook(grad); kept as ``(input_nr, hook)``, a result replaces that input's gradient
REPLACES_GRADS = "replaces the gradients"  # hook(grads, ...); a result replaces its first argument, a tuple of gradients
RETURNS_NONE = "returns None"  # hook(tensor); every one runs, then eager raises if any returned a value
RECORDS = "records"  # xgrad's own (``retain_grad``): kept as ``{input_nr: hook}``, its result unused

# When it runs, for the node it sits on: before the node's rule (on the gradients the
# node receives), after it (on those it sends), or after a leaf's ``.grad`` is written.
BEFORE, AFTER, ACCUMULATED = "before the rule", "after the rule", "after .grad is written"


class HookKind(NamedTuple):
    """One kind of hook (NOTE [Hook kinds])."""

    name: str  # as ``xgrad.testing`` and the docs call it
    label: str  # in pictures (``viz``) and recompile reasons
    node_slot: str | None  # the ``Node`` attribute keeping the hooks that run at that node
    leaf_slot: str | None  # the ``Tensor`` attribute keeping a leaf's hooks (run by its ``AccumulateGrad``)
    register: tuple[str, str]  # ("tensor" or "grad_fn", the method that registers one)
    convention: str  # what its result means
    phase: str  # when it runs at its node
    rank: int  # PyTorch's order among the kinds that fire for one tensor
    jax_ad: bool  # JAX's AD calls a leaf's hooks on its cotangent (NOTE [Hooks on JAX's AD]); others ride along

    @property
    def replaces(self) -> bool:
        """Whether a hook's result may replace gradients."""
        return self.convention in (REPLACES_GRAD, REPLACES_GRADS)


TENSOR = HookKind("tensor", "tensor", "_tensor_pre_hooks", "_backward_hooks", ("tensor", "register_hook"),
                  REPLACES_GRAD, BEFORE, 0, True)
RETAIN_GRAD = HookKind("retain_grad", "retain_grad", "_retains_grad_hooks", None, ("tensor", "retain_grad"),
                       RECORDS, BEFORE, 1, False)
PRE = HookKind("prehook", "pre", "_pre_hooks", None, ("grad_fn", "register_prehook"), REPLACES_GRADS, BEFORE, 2, False)
POST = HookKind("posthook", "post", "_post_hooks", None, ("grad_fn", "register_hook"), REPLACES_GRADS, AFTER, 3, False)
POST_ACCUMULATE = HookKind("post_accumulate", "post_accumulate", None, "_post_accumulate_grad_hooks",
                           ("tensor", "register_post_accumulate_grad_hook"), RETURNS_NONE, ACCUMULATED, 4, False)
KINDS = (TENSOR, RETAIN_GRAD, PRE, POST, POST_ACCUMULATE)


def hooks_at(node: Any, kind: HookKind) -> Any:
    """The hooks of ``kind`` that run at ``node``: its own, or for an accumulator, its leaf's."""
    own = getattr(node, kind.node_slot) if kind.node_slot is not None else None
    if own or kind.leaf_slot is None:
        return own
    leaf = getattr(node, "variable", None)  # an ``AccumulateGrad``
    return None if leaf is None else getattr(leaf, kind.leaf_slot)


def _any_slot_set(slots: tuple[str, ...]) -> Callable[[Any], Any]:
    """``owner -> owner.<slot 0> or owner.<slot 1> or ...``: whether any of ``slots`` holds hooks.

    Built once from the table, as the inline ``or`` chain it replaces: the hit path asks it
    of every node (a loop or ``attrgetter`` costs 4-5 times as much).
    """
    if not slots or not all(slot.isidentifier() for slot in slots):
        raise ValueError(f"hook slots must be attribute names, got {slots!r}")
    test: Callable[[Any], Any] = eval("lambda owner: " + " or ".join(f"owner.{slot}" for slot in slots))
    return test


# The kinds a leaf keeps, in PyTorch's order; whether a leaf, or a node, keeps any hook.
LEAF_KINDS = tuple(sorted((kind for kind in KINDS if kind.leaf_slot is not None), key=lambda kind: kind.rank))
leaf_has_hooks = _any_slot_set(tuple(kind.leaf_slot for kind in LEAF_KINDS if kind.leaf_slot is not None))
node_has_hooks = _any_slot_set(tuple(kind.node_slot for kind in KINDS if kind.node_slot is not None))
