"""What the engine knows of nodes whose backward is pure rules over saved values.

# NOTE [Rule nodes]
# The engine sits below the ops: it knows the ``Node`` interface and nothing of how
# ops are defined. Most nodes replay a primitive's backward rules (``PrimitiveNode``
# in ``ops/registry.py``, also the node of ``from_jax`` ops); the compiled backward
# traces those rules into a program. What it needs from such a node is declared here,
# as ``RuleNode``, and the op layer provides it: the rules (``prim``, a ``Rules``),
# the static parameters, the saved values, and the structure fragment the compiled
# backward caches on it (NOTE [Structure fragments]). ``ops/jaxop.py`` registers
# ``from_jax`` with ``register_jax_op``: under ``create_graph`` a compiled segment runs
# as one such differentiable op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from xgrad.bounded_cache import BoundedCache
from xgrad.engine.node import InputMetadata, Node
from xgrad.fast_compile import FastJit
from xgrad.tensor import Tensor

if TYPE_CHECKING:
    from xgrad.engine.saved import SavedTensor

__all__ = ["Aval", "RuleArgs", "RuleNode", "Rules", "incoming_grad", "jax_op", "made_grads", "register_jax_op"]


class Aval(NamedTuple):
    """Shape and dtype of an input a primitive did not save.

    >>> from xgrad.engine.rules import Aval
    >>> Aval((2, 3), "float32").ndim
    2
    """

    shape: tuple[int, ...]
    dtype: Any

    @property
    def ndim(self) -> int:
        return len(self.shape)


class RuleArgs(NamedTuple):
    """What a node's backward rules are applied to: the one call the eager node, the fused
    eager rules and the compiled lowering all make (``Rules.backward``).

    ``g`` is the incoming gradient (a tuple for several outputs), ``out`` the saved
    output(s) or their metadata, ``inputs`` the saved inputs (values, ``Aval``s or
    constants), ``params`` the static parameters and ``needed`` which inputs want a gradient.
    """

    g: Any
    out: Any
    inputs: Sequence[Any]
    params: dict[str, Any]
    needed: Sequence[bool]


class Rules(Protocol):
    """A primitive as its node's backward sees it: names, arity and the rules themselves."""

    name: str
    node_name: str
    num_outputs: int

    @property
    def host_only(self) -> bool:
        """Whether its backward must run on the host, outside any one XLA program (device moves)."""
        ...

    def backward(self, args: RuleArgs) -> list[Tensor | None]:
        """The rules applied to given values: one gradient (or ``None``) per input."""
        ...


class RuleNode(Node):
    """A node that replays pure backward rules over the values it saved.

    ``saved`` holds, per input, a ``SavedTensor``, an ``Aval``, ``None`` (a tensor no needed
    rule reads) or a constant;
    ``saved_out`` the saved outputs, if the rules read them; ``holds_tensors`` whether
    either holds a ``SavedTensor``.
    """

    __slots__ = ("holds_tensors", "params", "prim", "saved", "saved_out", "structure")

    prim: Rules
    params: dict[str, Any]
    saved: tuple[Any, ...]
    saved_out: tuple[SavedTensor, ...] | None
    holds_tensors: bool
    structure: tuple[int, tuple[int, ...], bool] | None  # NOTE [Structure fragments]

    runs_user_code: ClassVar[bool] = False  # pure rules (Node.runs_user_code)

    #: Called with each new rule node once a compiled backward has run in the process.
    on_record: ClassVar[Callable[[RuleNode], None] | None] = None


def incoming_grad(num_outputs: int, grads: list[Tensor | None], metadata: Any, unmade: bool = False) -> Any:
    """The rules' ``g``: the one gradient, or a tuple with missing ones as zeros; ``None`` if none arrived.

    ``unmade``: a missing one on one device stays its output's ``InputMetadata``, for fused
    rules that make the zeros in their own program (NOTE [Unmade zeros] in ``ops/fused_rules.py``).

    >>> from xgrad.engine.rules import incoming_grad
    >>> incoming_grad(1, [None], ()) is None
    True
    """
    if num_outputs == 1:
        return grads[0]
    if all(gi is None for gi in grads):
        return None
    return tuple(
        gi if gi is not None else m if unmade and _on_one_device(m) else Tensor(_zeros(m))
        for gi, m in zip(grads, metadata, strict=True)
    )


def made_grads(g: Any) -> Any:
    """``g`` with its unmade zeros made (NOTE [Unmade zeros]): what rules run op by op take."""
    if type(g) is not tuple:
        return g
    return tuple(Tensor(_zeros(gi)) if type(gi) is InputMetadata else gi for gi in g)


def _on_one_device(meta: Any) -> bool:
    sharding = meta.sharding
    return sharding is None or len(sharding.device_set) == 1


# Zeros for the outputs no grad reached, where rules run op by op or the outputs lie on
# several devices (fused rules make their own, NOTE [Unmade zeros] in ``ops/fused_rules.py``),
# one jitted maker per shape, dtype and placement: ``jnp.zeros(..., device=...)`` costs
# twenty times a jitted call (a node whose rules read a second output, as cross_entropy's
# log-probabilities, pays it at every backward).
# Compiled fast (NOTE [Fast compiles] in ``xgrad/fast_compile.py``). Small zeros are kept
# and handed out again (arrays are immutable, and ``xgrad.compile`` copies an array held
# elsewhere before donating it): on a small model even the jitted call is a tenth of a
# node's time (cross_entropy's three unreached outputs), while keeping large ones would
# hold their memory for good.
_ZEROS: BoundedCache[tuple[Any, ...], Callable[[], Any]] = BoundedCache(256)
_KEPT_ZEROS: BoundedCache[tuple[Any, ...], Any] = BoundedCache(256)
_KEEP_ZEROS_UP_TO = 1 << 14  # elements: at most 64 KiB of float32 each


def _zeros(meta: Any) -> Any:
    sharding = getattr(meta, "sharding", None)
    key = (meta.shape, meta.dtype, sharding)
    zeros = _KEPT_ZEROS.get(key)
    if zeros is not None:
        return zeros
    make = _ZEROS.get(key)
    if make is None:
        make = _ZEROS[key] = FastJit(functools.partial(jnp.zeros, meta.shape, meta.dtype), out_shardings=sharding)
    zeros = make()
    if zeros.size <= _KEEP_ZEROS_UP_TO and not isinstance(zeros, jax.core.Tracer):  # traced: part of that program only
        _KEPT_ZEROS[key] = zeros
    return zeros


_jax_op: Callable[..., Callable[..., Any]] | None = None


def register_jax_op(factory: Callable[..., Callable[..., Any]]) -> None:
    """Set the factory ``factory(fn, name=..., deps=...)`` that makes a differentiable op of a JAX function (``from_jax``)."""
    global _jax_op
    _jax_op = factory


def jax_op(fn: Callable[..., Any], name: str, deps: list[frozenset[int]]) -> Callable[..., Any]:
    """``fn`` (a function of arrays) as a differentiable op, by the registered factory.

    ``deps[k]`` are the inputs output ``k`` depends on as eager's ``requires_grad`` would
    see it, op by op; an output that depends on none requiring grad leaves the graph.
    """
    if _jax_op is None:
        raise RuntimeError("no JAX op factory is registered: import xgrad, which registers from_jax")
    return _jax_op(fn, name=name, deps=deps)
