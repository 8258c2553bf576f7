"""The ops an observer hook runs on its arguments, computed in the program (NOTE [Hook ops in the program]).

# NOTE [Hook ops in the program]
# An observer hook usually computes something of its gradient (``norms.append(g.norm())``):
# an eager dispatch per op per hook per call, which costs about as much as a small step's
# whole program. So the ops a hook call ran are learned where it runs eagerly, in the
# exact program (``OpLog``: each op's primitive, params and where its inputs came from:
# the hook's arguments, an earlier op's results, or a small constant), and the observer
# variant computes them in the program from the hook's arguments (``HookOps.trace``).
# When the hook then runs after the program, its dispatches go through a table from
# (primitive, params, the very input objects) to those outputs (``Served``, through the
# dispatch seam, NOTE [Dispatch seam] in ``xgrad/ops/registry.py``): an op whose inputs
# are, by identity, the arrays the program computed it from gets the program's result,
# and anything else (another op, other inputs, a hook that changed) dispatches as usual.
# A primitive is a pure function of its inputs and params, so a served result is the
# one dispatching would give; the table holds its key objects, so no id in it is reused
# while it serves. Only jitted primitives are learned (the others move data between
# devices or must run eagerly), and of the inputs from elsewhere only small constants
# (scalar operands): an op on a large array the hook reads (a parameter) dispatches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from xgrad.ops.registry import Primitive

_MAX_CONSTANT = 16  # elements: a scalar operand is learned as a constant, a large array is not

# Where an op's input comes from: (0, i) the hook's i-th argument, (1, j, k) op j's k-th
# result, (2, value) a constant.
Source = tuple[Any, ...]
Op = tuple[Primitive, dict[str, Any], tuple[Source, ...]]
# An op computed in the observer variant: (its primitive and params' key, where its inputs
# are: an output position, or ``~k`` the k-th of its constants (one position alone for
# one input that is an output), its constants, the position of its result, or of each of
# its results).
Planned = tuple[tuple[Primitive, tuple[Any, ...]], int | tuple[int, ...], tuple[Any, ...], Any]


class OpLog:
    """A dispatch for ``dispatching_through`` that runs each op and learns it (NOTE [Hook ops in the program])."""

    __slots__ = ("_keep", "_where", "fn", "ops")

    def __init__(self, fn: Any, args: list[Any]) -> None:
        self.fn = fn
        self.ops: list[Op] = []
        self._where: dict[int, Source] = {id(a): (0, i) for i, a in enumerate(args)}
        self._keep = list(args)  # what ``_where``'s ids name stays alive

    def __call__(self, prim: Primitive, arrays: list[Any], params: dict[str, Any]) -> Any:
        out = prim.dispatch(arrays, params)
        sources = self._sources(prim, arrays, params)
        if sources is not None:
            j = len(self.ops)
            self.ops.append((prim, params, sources))
            for k, o in enumerate(out if prim.num_outputs > 1 else (out,)):
                self._where[id(o)] = (1, j, k)
                self._keep.append(o)
        return out

    def _sources(self, prim: Primitive, arrays: list[Any], params: dict[str, Any]) -> tuple[Source, ...] | None:
        if not prim.jit:
            return None
        try:
            hash(tuple(params.items()))
        except TypeError:
            return None
        sources = []
        for a in arrays:
            where = self._where.get(id(a))
            if where is None:
                small = isinstance(a, jax.Array) and a.size <= _MAX_CONSTANT
                if not (small or a is None or type(a) in (bool, int, float)):
                    return None
                where = (2, a)
            sources.append(where)
        return tuple(sources)

    def learned(self) -> HookOps | None:
        return HookOps(self.fn, self.ops) if self.ops else None


class HookOps:
    """The ops one hook call ran on its arguments, to compute in the observer variant."""

    __slots__ = ("fn", "ops")

    def __init__(self, fn: Any, ops: list[Op]) -> None:
        self.fn = fn
        self.ops = ops

    def trace(self, args: list[Any], output: Callable[[Any], int]) -> list[Planned]:
        """Compute the ops from the traced ``args``; each planned as where ``Served`` finds its inputs and result."""
        results: list[tuple[Any, ...]] = []
        planned: list[Planned] = []
        for prim, params, sources in self.ops:
            inputs = _inputs(sources, args, results)
            out = prim.dispatch(inputs, params)
            outs = tuple(out) if prim.num_outputs > 1 else (out,)
            results.append(outs)
            # An input is an output of the program (a hook's argument, an earlier op's result) or a constant.
            constants: list[Any] = []
            where = []
            for source, a in zip(sources, inputs, strict=True):
                if source[0] == 2:
                    where.append(~len(constants))
                    constants.append(a)
                else:
                    where.append(output(a))
            positions = tuple(output(o) for o in outs)
            result = positions if prim.num_outputs > 1 else positions[0]
            # One input, an output (``g.norm()``): its position alone, the key read without a loop.
            inputs_at = where[0] if len(where) == 1 and where[0] >= 0 else tuple(where)
            planned.append(((prim, tuple(params.items())), inputs_at, tuple(constants), result))
        return planned


def _inputs(sources: tuple[Source, ...], args: list[Any], results: list[tuple[Any, ...]]) -> list[Any]:
    return [args[s[1]] if s[0] == 0 else results[s[1]][s[2]] if s[0] == 1 else s[1] for s in sources]


class Served:
    """A dispatch for ``dispatching_through`` that finds a planned op's result among the program's outputs.

    Its table is built in one pass over the observers' plans, from output positions and
    constants fixed when the variant was traced: each key holds the ids of arrays that
    ``outs`` (held here) or the plans keep alive while it serves.
    """

    __slots__ = ("_outs", "_table")

    def __init__(self, outs: Any, plans: list[list[Planned]]) -> None:
        self._outs = outs
        self._table: dict[tuple[Any, ...], Any] = {}
        table = self._table
        for planned in plans:
            for head, where, constants, result in planned:
                key: tuple[Any, ...]
                if isinstance(where, int):
                    key = (*head, id(outs[where]))
                else:
                    key = (*head, *[id(outs[i]) if i >= 0 else id(constants[~i]) for i in where])
                table[key] = outs[result] if type(result) is int else tuple(outs[p] for p in result)

    def __call__(self, prim: Primitive, arrays: list[Any], params: dict[str, Any]) -> Any:
        try:
            out = self._table.get((prim, tuple(params.items()), *map(id, arrays)))
        except TypeError:  # params that cannot be hashed: never learned
            out = None
        return prim.dispatch(arrays, params) if out is None else out
