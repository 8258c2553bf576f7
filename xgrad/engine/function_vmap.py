"""``autograd.Function`` under ``xgrad.func.vmap``: the class's own ``vmap`` rule, as in torch.func.

# NOTE [Functions under vmap]
# As torch.func does, ``xgrad.func.vmap`` over a ``Function`` whose inputs are batched at
# the innermost ``vmap`` runs the class's ``vmap`` staticmethod: ``vmap(info, in_dims,
# *args)`` gets the whole batch (each input with its batch dim, or ``None`` where it is
# not batched) one level down, returns ``(output, out_dims)``, and the outputs are
# batched at the level again (``jax_internals.batching_level``). ``jax.custom_vmap``
# would do the same but does not compose with JAX's AD; batching at xgrad's level does,
# since the rule's own ops (often the same ``Function.apply`` on the whole batch) are
# differentiated as any others. With ``generate_vmap_rule = True`` JAX batches the
# ``forward`` and ``backward`` instead (NOTE [Functions on JAX's AD]); with neither,
# torch.func's error. Under a ``grad`` inside ``vmap`` the innermost level is the
# ``grad``'s: JAX batches the ``custom_vjp`` it makes (torch runs the ``vmap`` rule there;
# values and gradients agree). Plain ``jax.vmap`` batches every Function as JAX does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax

from xgrad.jax_internals import batching_level
from xgrad.tensor import Tensor, is_tensor

__all__ = ["NOT_HANDLED", "FuncVmapAxis", "VmapInfo", "apply_vmap_rule"]

DOCS = "For more details, please see https://pytorch.org/docs/main/notes/extending.func.html"


@dataclass(frozen=True)
class FuncVmapAxis:
    """The axis name ``xgrad.func.vmap`` gives ``jax.vmap``: marks its levels, and carries ``randomness``."""

    randomness: str


class VmapInfo(NamedTuple):
    """What a ``Function``'s ``vmap`` staticmethod is told of the ``vmap`` it runs under."""

    batch_size: int
    randomness: str


NOT_HANDLED = object()


def apply_vmap_rule(cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any], has_vmap_rule: bool) -> Any:
    """``cls.apply(*args, **kwargs)`` by its ``vmap`` rule at the innermost ``xgrad.func.vmap`` level;
    ``NOT_HANDLED`` where JAX batches it or nothing is batched (NOTE [Functions under vmap])."""
    level = batching_level()
    if level is None or not isinstance(level.axis_name, FuncVmapAxis):
        return NOT_HANDLED
    unbatched = [level.unbatched(a._array) if isinstance(a, Tensor) else (a, None) for a in args]
    if all(dim is None for _, dim in unbatched):
        return NOT_HANDLED
    name = cls.__name__
    if any(isinstance(leaf, Tensor) for leaf in jax.tree_util.tree_leaves(kwargs, is_leaf=is_tensor)):
        raise NotImplementedError(
            "Run vmap on autograd.Function with kwarg-only Tensor args. Please do not pass kwarg-only Tensors to "
            f"autograd.Function. Got: {kwargs}"
        )
    if cls.generate_vmap_rule:
        if has_vmap_rule:
            raise RuntimeError(
                f"You tried to vmap over {name}, but it has both generate_vmap_rule=True and an overridden vmap "
                "staticmethod. Please set generate_vmap_rule=False or delete the overridden vmap staticmethod to "
                f"avoid ambiguity. {DOCS}"
            )
        return NOT_HANDLED
    if not has_vmap_rule:
        raise RuntimeError(
            f"You tried to vmap over {name}, but it does not have vmap support. Please override and implement the "
            f"vmap staticmethod or set generate_vmap_rule=True. {DOCS}"
        )
    inputs = [Tensor(value) if isinstance(a, Tensor) else a for a, (value, _) in zip(args, unbatched, strict=True)]
    in_dims = tuple(dim for _, dim in unbatched)
    with level.lower():
        result = cls.vmap(VmapInfo(level.size, level.axis_name.randomness), in_dims, *inputs, **kwargs)
    if not isinstance(result, tuple) or len(result) != 2:
        got = f"a {type(result)}" if not isinstance(result, tuple) else f"{len(result)} returns"
        raise RuntimeError(
            "Expected the vmap staticmethod to have two returns, an output and out_dims with pytree structure "
            f"compatible with the output. Got {got} instead"
        )
    output, out_dims = result
    outs = output if isinstance(output, tuple) else (output,)
    dims = out_dims if isinstance(out_dims, tuple) else (out_dims,) * len(outs)
    # out_dims is a pytree prefix of output, as torch.func reads it: one dim for one output, or one per output of a tuple
    prefix = isinstance(output, tuple) or not isinstance(out_dims, tuple)
    if not prefix or len(dims) != len(outs) or not all(d is None or isinstance(d, int) for d in dims):
        raise RuntimeError(
            f"The autograd.Function's vmap staticmethod returned an incompatible (output, out_dims) tuple. Expected "
            f"out_dims={out_dims} to be compatible with the structure of `output`: {len(outs)} outputs. {DOCS}"
        )
    originals = {id(inner): a for inner, a in zip(inputs, args, strict=True) if isinstance(a, Tensor)}
    wrapped = []
    for o, dim in zip(outs, dims, strict=True):
        if not isinstance(o, Tensor):
            wrapped.append(o)
        elif id(o) in originals:  # an input returned as it is: the caller's tensor, as torch.func gives it
            wrapped.append(originals[id(o)])
        else:
            if dim is not None and not -o.ndim <= dim < o.ndim:
                raise RuntimeError(f"{name}.vmap returned out_dims={dim} for an output of {o.ndim} dims")
            wrapped.append(Tensor(level.batched(o._array, None if dim is None else dim % o.ndim)))
    return tuple(wrapped) if isinstance(output, tuple) else wrapped[0]
