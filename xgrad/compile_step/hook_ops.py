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
# dispatch seam, NOTE [Dispatch seam] in ``xgrad/ops/dispatch.py``): an op whose inputs
# are, by identity, the arrays the program computed it from gets the program's result,
# and anything else (another op, other inputs, a hook that changed) dispatches as usual.
# A primitive is a pure function of its inputs and params, so a served result is the
# one dispatching would give; the table holds its key objects, so no id in it is reused
# while it serves. Only jitted primitives are learned (the others move data between
# devices or must run eagerly), and of the inputs from elsewhere only small constants
# (scalar operands): an op on a large array the hook reads (a parameter) dispatches.
#
# One level up, a served op still paid its front-end (autocast's wrapper, ``norm``'s
# checks, ``bind``'s pass over its arguments) at every call, about as much as the table
# lookup and the result Tensor together. So the calls a hook made of the ops
# ``autocast_op`` wraps are learned whole too (``OpLog.op_call``, through ``OP_CALL``,
# NOTE [Dispatch seam]): the function, its non-Tensor arguments (plain values, compared
# with their types), each Tensor argument's place among the program's outputs and its
# result's, when every op it bound was learned and it returned a new Tensor without
# history. A later call of the same function on Tensors holding, by identity, those
# outputs (no history, not requiring grad) with equal other arguments gets a new Tensor
# of the served result (``Served.op_call``); any other call runs the op. Only ops whose
# front-end reads no values are learned so (``_VALUE_FREE``: reductions, norms, softmax;
# a loss checks its targets' or inputs' values, which a later call's values might fail):
# with the same function, arguments, shapes and dtypes, the front-end decides the same,
# and the ops it binds are pure, so the served Tensor is the one eager would make.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from xgrad.ops.registry import Primitive
from xgrad.tensor import Tensor

_MAX_CONSTANT = 16  # elements: a scalar operand is learned as a constant, a large array is not

# Where an op's input comes from: (0, i) the hook's i-th argument, (1, j, k) op j's k-th
# result, (2, value) a constant.
Source = tuple[Any, ...]
Op = tuple[Primitive, dict[str, Any], tuple[Source, ...]]
# An op computed in the observer variant: (its primitive, its params, where its inputs are:
# an output position, or ``~k`` the k-th of its constants, its constants, the position of
# its result, or of each of its results).
Planned = tuple[Primitive, dict[str, Any], tuple[int, ...], tuple[Any, ...], Any]
# An op's front-end call a hook made (NOTE [Hook ops in the program]): the function, each
# argument (a Tensor's ``Source``, or ``(3, value key)``), the keyword arguments' value
# keys, its result's ``Source``. Planned, the sources are output positions.
Call = tuple[Callable[..., Any], tuple[Any, ...], tuple[tuple[str, Any], ...], Any]

# The ops ``autocast_op`` wraps whose front-end checks arguments, shapes and dtypes, never values.
_VALUE_FREE = frozenset({"sum", "mean", "var", "std", "prod", "logsumexp", "cumsum", "norm", "softmax", "log_softmax"})
_PLAIN_VALUES = (type(None), bool, int, float, str)


def _value_key(value: Any) -> Any:
    """A plain argument as compared between calls, with its type (``1`` is not ``1.0``); ``None``: not plain."""
    if type(value) in _PLAIN_VALUES:
        return (type(value), value)
    if type(value) is tuple and all(type(v) is int for v in value):
        return (tuple, value)
    return None


class OpLog:
    """A dispatch for ``dispatching_through`` that runs each op and learns it (NOTE [Hook ops in the program])."""

    __slots__ = ("_depth", "_keep", "_unlearned", "_where", "calls", "fn", "ops")

    def __init__(self, fn: Any, args: list[Any]) -> None:
        self.fn = fn
        self.ops: list[Op] = []
        self.calls: list[Call] = []
        self._where: dict[int, Source] = {id(a): (0, i) for i, a in enumerate(args)}
        self._keep = list(args)  # what ``_where``'s ids name stays alive
        self._unlearned = 0  # ops run that were not learned
        self._depth = 0  # front-end calls under way: only the outermost is learned

    def __call__(self, prim: Primitive, arrays: list[Any], params: dict[str, Any]) -> Any:
        out = prim.dispatch(arrays, params)
        sources = self._sources(prim, arrays, params)
        if sources is None:
            self._unlearned += 1
        else:
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

    def op_call(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run an op's front-end call (``OP_CALL``) and learn it whole where it may be served so."""
        unlearned, first = self._unlearned, len(self.ops)
        self._depth += 1
        try:
            result = fn(*args, **kwargs)
        finally:
            self._depth -= 1
        value_free = fn.__name__ in _VALUE_FREE and fn.__module__.startswith("xgrad.ops.")
        if self._depth == 0 and self._unlearned == unlearned and value_free:
            call = self._call(fn, args, kwargs, result, first)
            if call is not None:
                self.calls.append(call)
        return result

    def _call(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], result: Any, first: int
    ) -> Call | None:
        """``fn``'s call as ``Call``, if it may be served whole; ``first``: the first op it bound."""
        if not (type(result) is Tensor and result.grad_fn is None and not result._requires_grad):
            return None
        made = self._where.get(id(result._array))
        if made is None or made[0] != 1 or made[1] < first:  # not a result of an op it bound
            return None
        if not args or type(args[0]) is not Tensor:  # ``Served`` finds a call by its first argument
            return None
        spec = []
        for a in args:
            if type(a) is Tensor:
                where = self._where.get(id(a._array))
                if where is None or a.grad_fn is not None or a._requires_grad:
                    return None
            else:
                key = _value_key(a)
                if key is None:
                    return None
                where = (3, key)
            spec.append(where)
        kw = tuple((name, _value_key(value)) for name, value in kwargs.items())
        if any(key is None for _, key in kw):
            return None
        return fn, tuple(spec), kw, made

    def learned(self) -> HookOps | None:
        return HookOps(self.fn, self.ops, self.calls) if self.ops else None


class HookPlan(NamedTuple):
    """What ``Served`` finds among the variant's outputs for one hook call: its ops, and its front-end calls."""

    ops: list[Planned]
    calls: list[Call]


class HookOps(NamedTuple):
    """The ops one hook call ran on its arguments, to compute in the observer variant."""

    fn: Any
    ops: list[Op]
    calls: list[Call]

    def trace(self, args: list[Any], output: Callable[[Any], int]) -> HookPlan:
        """Compute the ops from the traced ``args``; each planned as where ``Served`` finds its inputs and result."""
        results: list[tuple[Any, ...]] = []
        planned: list[Planned] = []

        def value(source: Source) -> Any:
            return args[source[1]] if source[0] == 0 else results[source[1]][source[2]] if source[0] == 1 else source[1]

        for prim, params, sources in self.ops:
            inputs = [value(source) for source in sources]
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
            planned.append((prim, params, tuple(where), tuple(constants), result))
        calls = [
            (fn, tuple(source if source[0] == 3 else output(value(source)) for source in spec), kw, output(value(made)))
            for fn, spec, kw, made in self.calls
        ]
        return HookPlan(planned, calls)


class ServedPlan:
    """The observers' plans as ``Served`` reads them, fixed once per observer variant.

    ``one``: per output position, the ops of that one input (``g.norm()``), each its
    primitive, params and result; ``many``: the other ops, params as items; ``calls``: per
    output position, the front-end calls learned whole whose first argument holds it.
    """

    __slots__ = ("calls", "many", "one")

    def __init__(self, plans: list[HookPlan | None]) -> None:
        one: dict[int, list[tuple[Primitive, dict[str, Any], Any]]] = {}
        self.many: list[tuple[Primitive, tuple[Any, ...], tuple[int, ...], tuple[Any, ...], Any]] = []
        calls: dict[int, list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Any, int]]] = {}
        for plan in plans:
            if plan is None:
                continue
            for fn, spec, kw, made in plan.calls:
                calls.setdefault(spec[0], []).append((fn, spec, dict(kw), _plain_keywords(kw), made))
            for prim, params, where, constants, result in plan.ops:
                if len(where) == 1 and where[0] >= 0:  # one input, an output
                    one.setdefault(where[0], []).append((prim, params, result))
                else:
                    self.many.append((prim, tuple(params.items()), where, constants, result))
        self.one = [(position, tuple(ops)) for position, ops in one.items()]
        self.calls = [(position, tuple(found)) for position, found in calls.items()]


class Served:
    """A dispatch for ``dispatching_through`` that finds a planned op's result among the program's outputs.

    Its tables are keyed by the ids of arrays that ``outs`` (held here) or the plans keep
    alive while it serves: an op of one input by that input's id alone, then its
    primitive and params compared; the others by (primitive, params, their inputs' ids).
    The ops' tables are made at the first op that reaches ``bind``: a hook whose ops are
    all served whole (``op_call``) reads only the calls' table.
    """

    __slots__ = ("_calls", "_many", "_one", "_outs", "_plan")

    def __init__(self, outs: Any, plan: ServedPlan) -> None:
        self._outs = outs
        self._plan = plan
        self._calls = {id(outs[position]): found for position, found in plan.calls}
        self._one: dict[int, Any] | None = None
        self._many: dict[tuple[Any, ...], Any] = {}

    def _make_op_tables(self) -> dict[int, Any]:
        outs, plan = self._outs, self._plan
        for prim, params, where, constants, result in plan.many:
            self._many[(prim, params, *[id(outs[i]) if i >= 0 else id(constants[~i]) for i in where])] = result
        self._one = {id(outs[position]): ops for position, ops in plan.one}
        return self._one

    def __call__(self, prim: Primitive, arrays: list[Any], params: dict[str, Any]) -> Any:
        one = self._one if self._one is not None else self._make_op_tables()
        result = None
        if len(arrays) == 1:
            for planned_prim, planned_params, at in one.get(id(arrays[0]), ()):
                try:
                    if planned_prim is prim and planned_params == params:
                        result = at
                        break
                except (TypeError, ValueError):  # params holding arrays: never learned
                    pass
        if result is None and self._many:
            try:
                result = self._many.get((prim, tuple(params.items()), *map(id, arrays)))
            except TypeError:  # params that cannot be hashed: never learned
                pass
        if result is None:
            return prim.dispatch(arrays, params)
        outs = self._outs
        return outs[result] if type(result) is int else tuple(outs[p] for p in result)

    def op_call(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An op's front-end call (``OP_CALL``): a new Tensor of its served result if it was learned whole, else run."""
        if args and type(args[0]) is Tensor:
            first = args[0]
            # Found by its array's id: the very output that the learned calls' first argument held (``outs`` keeps it).
            found = self._calls.get(id(first._array))
            if found is not None and first.grad_fn is None and not first._requires_grad:
                for planned_fn, spec, kw, plain_kw, made in found:
                    if (
                        planned_fn is fn and len(spec) == len(args) and (len(args) == 1 or self._same_rest(args, spec))
                        and _same_keywords(kwargs, kw, plain_kw)
                    ):
                        # NOTE [Op outputs made without the type's call] in xgrad/tensor/core.py
                        return Tensor._fill(object.__new__(Tensor), self._outs[made])
        return fn(*args, **kwargs)

    def _same_rest(self, args: tuple[Any, ...], spec: tuple[Any, ...]) -> bool:
        """Whether the arguments after the first are a learned call's: its outputs' Tensors, plain values equal to its."""
        outs = self._outs
        for a, where in zip(args[1:], spec[1:], strict=True):
            if type(where) is int:
                if not (type(a) is Tensor and a._array is outs[where] and a.grad_fn is None and not a._requires_grad):
                    return False
            elif _value_key(a) != where[1]:
                return False
        return True


def _same_keywords(kwargs: dict[str, Any], kw: dict[str, Any], plain_kw: Any) -> bool:
    """Whether ``kwargs`` are a learned call's (``kw``: their value keys by name); ``plain_kw``: ``_plain_keywords``,
    with which they are compared whole where it is not ``None``."""
    if plain_kw is not None:
        values, names, types = plain_kw
        return kwargs == values and tuple(kwargs) == names and tuple(map(type, kwargs.values())) == types
    return len(kw) == len(kwargs) and all(name in kwargs and _value_key(kwargs[name]) == key for name, key in kw.items())


def _plain_keywords(kw: tuple[tuple[str, Any], ...]) -> tuple[dict[str, Any], tuple[str, ...], tuple[type, ...]] | None:
    """A learned call's keywords (``_value_key``s, in the call's order) as their values, their names and their types
    in that order: a call whose keywords come in that order, equal and of those types, has their value keys (one in
    another order runs). ``None`` where a value is a tuple, whose elements' types only ``_value_key`` reads."""
    if any(key[0] is tuple for _, key in kw):
        return None
    return {name: key[1] for name, key in kw}, tuple(name for name, _ in kw), tuple(key[0] for _, key in kw)
