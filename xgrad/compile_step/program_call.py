"""Running one cached entry of ``xgrad.compile``'s step: its checks first where they may run first, its donated
inputs gathered, the program called, then the state written back and the results built (NOTE [Donated state])."""

from __future__ import annotations

import functools
import operator
import threading
import weakref
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from xgrad.compile_step.signature import set_entries
from xgrad.compile_step.writeback import (
    apply_final_writes,
    apply_writes,
    check_on_host,
    drop_grads,
    own_donated,
    resolve_target,
    source_value,
)
from xgrad.jax_internals import Var
from xgrad.tensor import Tensor

if TYPE_CHECKING:
    from xgrad.compile_step.program import Entry

def _inputs_read(jaxpr: Any, outputs: list[int]) -> set[Any]:
    """The variables that ``jaxpr``'s outputs at ``outputs`` are computed from (an equation: from all its inputs)."""
    needed = {v for v in (jaxpr.outvars[i] for i in outputs) if isinstance(v, Var)}
    for eqn in reversed(jaxpr.eqns):
        if any(v in needed for v in eqn.outvars):
            needed.update(v for v in eqn.invars if isinstance(v, Var))
    return needed


def precheck(entry: Entry, program: Any, invars: list[Any], jaxpr: Any) -> Any:
    """The program's checks as a program of their own, when a call may run them first (NOTE [Donated state]).

    So they may when they read no state (only the arguments: targets viewed as a flat
    vector, say) and no host call runs in the program (hooks after a failed check must
    not run). Returns the checks' program and the whole program donating nothing: a
    failed check runs that for the state it leaves (a running statistic updated before
    it) and raises, before anything is donated; the checks no longer keep the state from donation.
    """
    if entry.flags is None or entry.has_host_calls:
        return None
    wanted = [entry.flags, *(detail for _, detail, _ in entry.checks if detail is not None)]
    read = _inputs_read(jaxpr, wanted)
    if any(kind != 0 and var in read for (kind, _), var in zip(entry.inputs, invars, strict=False)):  # state inputs come first
        return None
    return jax.jit(lambda *inputs: {i: out for i, out in enumerate(program(*inputs)) if i in wanted}), jax.jit(program)


def donating_program(program: Any, donated: tuple[tuple[int, Any, bool, int], ...], n_outputs: int) -> tuple[Any, Any]:
    """``program`` jitted donating ``donated``, with the outputs that replace them first, in their order.

    JAX pairs each donated input with the first output of its shape and dtype not yet
    paired, in order; an output it pairs with another input than the one it replaces
    (a parameter with its ``.grad``, a moment with the parameter) makes XLA copy the
    inputs it still reads (the demo step's program: 28 copies). A donating program keeps
    the inputs it does not read: ``jax.jit`` would drop them, and the next donated input
    of their shape would take their output. Returns the program and the getter that puts
    its outputs back in the program's order (``None``: they are).
    """
    first = list(dict.fromkeys(index for _, _, _, index in donated))
    taken = set(first)
    order = first + [i for i in range(n_outputs) if i not in taken]
    jit = functools.partial(
        jax.jit, donate_argnums=tuple(position for position, _, _, _ in donated), keep_unused=bool(donated)
    )
    if order == list(range(n_outputs)):
        return jit(program), None

    def reordered(*inputs: Any) -> list[Any]:
        outs = program(*inputs)
        return [outs[i] for i in order]

    where = {index: k for k, index in enumerate(order)}
    return jit(reordered), operator.itemgetter(*(where[i] for i in range(n_outputs)))


def gather_inputs(entry: Entry, leaves: list[Any]) -> list[Any]:
    # One comprehension, no calls for the common kinds: it runs every step.
    inputs = [
        source()._array if kind == 1 else source if kind == 0 else source_value(source, leaves)
        for kind, source in entry.inputs
    ]
    for i in entry.arg_tensor_slots:
        leaf = leaves[i]
        inputs.append(leaf._array if isinstance(leaf, Tensor) else leaf)
    if entry.donated:
        own_donated(entry.donated, inputs, leaves, entry.fresh)
    return inputs


#: Held by calls that donate, from reading their inputs to writing back (NOTE [Donated state]).
_DONATING = threading.Lock()


def run_program(entry: Entry, leaves: list[Any]) -> Any:
    if not (entry.donated or entry.dropped_grads):
        return _call_program(entry, leaves)
    with _DONATING:
        return _call_program(entry, leaves)


def _call_program(entry: Entry, leaves: list[Any]) -> Any:
    if entry.check_first:
        check_on_host(entry.host_checks, leaves)
    inputs = gather_inputs(entry, leaves)
    if entry.precheck is not None:
        checks, undonated = entry.precheck
        failed = np.asarray(checks(*inputs)[entry.flags])
        if failed.any():
            _raise_failed_check(entry, failed, undonated(*inputs), leaves)
    if entry.dropped_grads:
        drop_grads(entry.dropped_grads, leaves)
    outs = entry.jitted(*inputs)
    del inputs
    if entry.tracks_fresh:  # the outputs replacing the donated inputs come first, in their order (``donating_program``)
        entry.fresh = list(map(weakref.ref, outs[:len(entry.donated)]))
    if entry.in_order is not None:
        outs = entry.in_order(outs)
    if not entry.check_first:
        # While the program runs: if a check fails its outputs are dropped, as if it never ran.
        check_on_host(entry.host_checks, leaves)
    if entry.flags is not None and entry.precheck is None:
        # The one device-to-host read of a program with checks.
        _raise_failed_check(entry, np.asarray(outs[entry.flags]), outs, leaves)
    return finish(entry, outs, leaves)


def _raise_failed_check(entry: Entry, failed: Any, outs: Any, leaves: list[Any]) -> None:
    """Raise the first failed check's error, the state written as eager leaves it when the op raises."""
    if failed.any():
        make_error, detail, writes = entry.checks[int(np.argmax(failed))]
        apply_writes(writes, outs, leaves)
        raise make_error(None if detail is None else outs[detail])


def finish(entry: Entry, outs: Any, leaves: list[Any]) -> Any:
    """Write back a call's state and build its results."""
    apply_final_writes(entry.fast_writes, outs, leaves)
    if entry.entry_writes:  # NOTE [Param groups in a compiled step]
        set_entries(entry.entry_writes)
    for ref, training in entry.mode_writes:  # what ``train()``/``eval()`` in ``fn`` did
        module = ref()
        if module is not None:
            object.__setattr__(module, "training", training)
    for call, args_tree, kept, given in entry.effects:  # host effects that nothing in the program follows
        args = list(kept)
        for i, index in given:
            args[i] = Tensor(outs[index])
        call_args, call_kwargs = jax.tree_util.tree_unflatten(args_tree, args)
        call(*call_args, **call_kwargs)
    results = []
    for how, value, grad_index in entry.result_template:
        if how == "out":
            t = Tensor._from_program(outs[value])
            if grad_index is not None:
                t._grad = Tensor._from_program(outs[grad_index])
            results.append(t)
        elif how == "array":
            results.append(outs[value])
        elif how == "same":
            results.append(resolve_target(value, leaves))
        else:
            results.append(value)
    return results[0] if entry.returns_one_leaf else entry.result_tree.unflatten(results)
