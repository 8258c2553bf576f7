"""Hook calls on the host: the backward's stand-in, and observer hooks run after the program (NOTE [Observer hooks]).

NOTE [Observer hooks] in ``__init__``.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from xgrad.compile_step.hook_ops import HookOps, HookPlan, OpLog, Served, ServedPlan
from xgrad.compile_step.program_call import donating_program
from xgrad.compile_step.writeback import donation, sort_writes
from xgrad.engine.node import current_task
from xgrad.grad_mode import enable_grad, graph_off, is_grad_enabled
from xgrad.ops.dispatch import DISPATCH, OP_CALL, dispatching_through
from xgrad.jax_internals import ClosedJaxpr, Var, jaxpr_as_fun
from xgrad.tensor import Tensor

if TYPE_CHECKING:
    from xgrad.compile_step.program import Entry


class HostGraphTask:
    """Stands in on the host for a traced backward's ``GraphTask``: what its hooks queue waits here."""

    __slots__ = ("final_callbacks", "mutex")

    # A backward started inside a host hook runs on the calling thread, as one inside a
    # single-device eager backward does (``engine.prepare`` reads its parent's queues).
    device_queues = None

    def __init__(self) -> None:
        self.final_callbacks: list[Callable[[], None]] = []
        self.mutex = threading.Lock()  # ``queue_callback`` takes it


def call_in_backward(graph_task: HostGraphTask | None, fn: Any, *args: Any) -> Any:
    """Call a hook on the host as the engine would: ``queue_callback`` inside it queues on ``graph_task``."""
    previous = current_task.graph_task
    current_task.graph_task = graph_task
    try:
        return fn(*args)
    finally:
        current_task.graph_task = previous


class _Outcome:
    """What one hook call did, to be replayed in the exact program instead of calling the hook again."""

    __slots__ = ("error", "queued", "result")

    def __init__(self, result: Any, error: BaseException | None, queued: tuple[Callable[[], None], ...]) -> None:
        self.result = result
        self.error = error
        self.queued = queued

    def replay(self, graph_task: HostGraphTask | None) -> Any:
        if self.queued:
            assert graph_task is not None  # it queued on a stand-in: it runs in a backward
            with graph_task.mutex:
                graph_task.final_callbacks.extend(self.queued)
        if self.error is not None:
            raise self.error
        return self.result


_OBSERVED = _Outcome(None, None, ())


class HookBox:
    """A traced step's hook calls at run time: whether they all observed, and the outcomes to replay.

    Shared by the exact program's hook calls (``_replacing_hook_on_host``) and the step's
    observer variant; ``lock`` keeps one call of the entry at a time using them.
    """

    __slots__ = ("learned", "lock", "observed", "plan", "replay")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.observed = False  # every hook call of the last run returned None and queued nothing
        self.replay: collections.deque[_Outcome] = collections.deque()
        # Per hook call of the last run of the exact program, in order: the ops it ran
        # (NOTE [Hook ops in the program]), ``None`` if none could be learned.
        self.learned: list[HookOps | None] = []
        # The observer variant's hooks and their plans as ``Served`` reads them, made at its first call.
        self.plan: tuple[list[Observer], ServedPlan] | None = None

    def call(self, graph_task: HostGraphTask | None, fn: Any, args: tuple[Any, ...], arrays: list[Any]) -> Any:
        """A hook call inside the exact program: the next outcome to replay if one waits, else the hook itself.

        ``arrays``: the arrays of the Tensors in ``args``, in order, from which its ops are learned.
        """
        if self.replay:
            self.learned.append(None)
            return self.replay.popleft().replay(graph_task)
        queued = None if graph_task is None else len(graph_task.final_callbacks)
        observed = False
        log = OpLog(fn, arrays)
        try:
            # In a backward, as the engine runs its hooks: no graph (a step with ``create_graph`` runs eagerly).
            with dispatching_through(log, log.op_call), graph_off() if graph_task is not None else contextlib.nullcontext():
                result = call_in_backward(graph_task, fn, *args)
            observed = result is None and (graph_task is None or len(graph_task.final_callbacks) == queued)
            return result
        finally:
            self.learned.append(log.learned())
            if not observed:
                self.observed = False


class Observer:
    """A hook call of the observer variant: its arguments are outputs of the program, and it runs after it."""

    __slots__ = ("flat", "fn", "in_backward", "outputs", "planned", "tree")

    def __init__(self, fn: Any, tree: Any, outputs: list[int], in_backward: bool, planned: HookPlan | None) -> None:
        self.fn = fn
        self.tree = tree
        # Its arguments are the tensors themselves, in order (a tensor hook's ``(grad,)``): no tree to rebuild.
        self.flat = jax.tree_util.tree_unflatten(tree, range(len(outputs))) == tuple(range(len(outputs)))
        self.outputs = outputs
        self.in_backward = in_backward
        self.planned = planned  # the ops it ran last time, computed in the program (``HookOps.trace``)

    def run(self, outs: Any, graph_task: HostGraphTask) -> _Outcome | None:
        """Call the hook on the program's values; ``None`` if it observed, else what it did.

        ``graph_task``: an empty stand-in, for a hook called in a backward to queue on; the
        caller has made it the current one (``current_task.graph_task``) if ``in_backward``,
        else none.
        """
        tensors = [Tensor(outs[i]) for i in self.outputs]
        try:
            result = self.fn(*tensors) if self.flat else self.fn(*jax.tree_util.tree_unflatten(self.tree, tensors))
        except BaseException as exc:  # the user's, whatever it is: the exact program raises it again
            return _Outcome(None, exc, ())
        if result is None and not graph_task.final_callbacks:
            return None
        return _Outcome(result, None, tuple(graph_task.final_callbacks))


def run_observers(observers: list[Observer], outs: Any, box: HookBox) -> bool:
    """Run the observer variant's hooks in program order; ``False`` once one does more than observe.

    Its outcome, after the ones that observed, then waits in ``box`` for the exact program.
    """
    graph_task = HostGraphTask()  # stays empty while the hooks observe: one serves them all
    if box.plan is None or box.plan[0] is not observers:
        box.plan = (observers, ServedPlan([observer.planned for observer in observers]))
    served = Served(outs, box.plan[1])
    previous = current_task.graph_task
    grad_was_on = is_grad_enabled()
    token = DISPATCH.set(served)  # ``dispatching_through``, set once for all the hooks
    call_token = OP_CALL.set(served.op_call)
    try:
        with graph_off():  # in a backward, as the engine runs its hooks: no graph
            for k, observer in enumerate(observers):
                # As ``call_in_backward`` would, switched only where a hook runs outside a backward.
                current_task.graph_task = graph_task if observer.in_backward else None
                if observer.in_backward or not grad_was_on:
                    outcome = observer.run(outs, graph_task)
                else:
                    with enable_grad():
                        outcome = observer.run(outs, graph_task)
                if outcome is not None:
                    box.replay.extend([_OBSERVED] * k)
                    box.replay.append(outcome)
                    return False
    finally:
        OP_CALL.reset(call_token)
        DISPATCH.reset(token)
        current_task.graph_task = previous
    return True


class SplitVariant:
    """The observer variant as two programs, the second donating the state (NOTE [The observer variant split]).

    ``first``: the variant's inputs to the outputs its hooks and checks read (at ``observers``'
    and ``flags``' positions), the values the second reads of it (its first ``n_carried``) and
    the variant's outputs that the second does not make; ``second``: the variant's inputs at
    ``second_inputs`` and the carried values to the rest of its outputs, donating ``donated``
    as an exact program does (in its order by ``in_order``, as ``donating_program``). ``view``:
    the variant with its writes and results read from the first's outputs then the second's.
    """

    __slots__ = (
        "donated", "donated_outputs", "dropped_grads", "first", "flags", "fresh", "in_order", "n_carried", "observers",
        "second", "second_inputs", "view",
    )


def _positions_read(variant: Entry) -> list[int]:
    """The variant's outputs its hooks, their served ops and its checks read, in order."""
    read = {i for observer in variant.observers for i in observer.outputs}
    for observer in variant.observers:
        if observer.planned is not None:
            read |= observer.planned.positions()
    if variant.flags is not None:
        read.add(variant.flags)
    return sorted(read)


def _moved_outputs(variant: Entry, at: Callable[[int], int]) -> Entry:
    """``variant`` writing back and making its results from outputs it finds at ``at(i)`` instead of ``i``."""
    view = copy.copy(variant)
    view.writes = [
        (target, what, at(index) if what in ("array", "grad") and index is not None else index, delta)
        for target, what, index, delta in variant.writes
    ]
    view.fast_writes = sort_writes(view.writes)
    view.result_template = [
        (how, at(value) if how in ("out", "array") else value, None if grad is None else at(grad))
        for how, value, grad in variant.result_template
    ]
    view.effects = [(call, tree, kept, [(i, at(index)) for i, index in given]) for call, tree, kept, given in variant.effects]
    return view


def split_variant(variant: Entry, jaxpr: Any, sources: list[Any]) -> SplitVariant | None:
    """``variant``'s program (``jaxpr``, its constants made inputs) split where its hooks' arguments are made.

    ``sources``: each input's one source, as ``donation`` takes them. ``None`` when the second
    program would donate nothing: the variant stays one program.
    """
    if jaxpr.effects:
        return None
    read = _positions_read(variant)
    wanted = {v for v in (jaxpr.outvars[i] for i in read) if isinstance(v, Var)}
    first_eqns = []
    for eqn in reversed(jaxpr.eqns):
        if any(v in wanted for v in eqn.outvars):
            wanted.update(v for v in eqn.invars if isinstance(v, Var))
            first_eqns.append(eqn)
    first_eqns.reverse()
    in_first = {id(eqn) for eqn in first_eqns}
    second_eqns = [eqn for eqn in jaxpr.eqns if id(eqn) not in in_first]
    made_first = {v for eqn in first_eqns for v in eqn.outvars}
    made_second = {v for eqn in second_eqns for v in eqn.outvars}
    second_reads = list(dict.fromkeys(
        v for eqn in second_eqns for v in eqn.invars if isinstance(v, Var) and v not in made_second
    ))
    carried = [v for v in second_reads if v in made_first]
    position = {v: k for k, v in enumerate(jaxpr.invars)}
    from_inputs = [v for v in second_reads if v in position]
    first_outvars = list(dict.fromkeys(
        [*carried, *(jaxpr.outvars[i] for i in read), *(v for v in jaxpr.outvars if v not in made_second)]
    ))
    second_outvars = list(dict.fromkeys(v for v in jaxpr.outvars if v in made_second))
    in_first_outs = {v: k for k, v in enumerate(first_outvars)}
    in_second_outs = {v: k for k, v in enumerate(second_outvars)}
    second_writes = [
        (target, what, in_second_outs[jaxpr.outvars[index]], delta)
        for target, what, index, delta in variant.writes
        if what in ("array", "grad") and index is not None and jaxpr.outvars[index] in in_second_outs
    ]
    second_sources = [*(sources[position[v]] for v in from_inputs), *[None] * len(carried)]
    second_invars = [*from_inputs, *carried]
    donated, _ = donation(
        second_writes, (), second_sources, [v.aval for v in second_invars], [v.aval for v in second_outvars]
    )
    if not donated:
        return None
    split = SplitVariant()
    split.fresh = []
    split.donated = donated
    split.donated_outputs = tuple(index for _, _, _, index in donated)
    split.dropped_grads = donation(variant.writes, (), sources, [v.aval for v in jaxpr.invars], [v.aval for v in jaxpr.outvars])[1]
    split.second_inputs = tuple(position[v] for v in from_inputs)
    split.n_carried = len(carried)
    first_at = {i: in_first_outs[v] for i, v in enumerate(jaxpr.outvars) if v in in_first_outs}
    split.observers = [
        Observer(o.fn, o.tree, [first_at[i] for i in o.outputs], o.in_backward, None if o.planned is None else o.planned.moved(first_at))
        for o in variant.observers
    ]
    split.flags = None if variant.flags is None else first_at[variant.flags]
    n_first = len(first_outvars)
    split.view = _moved_outputs(
        variant, lambda i: n_first + in_second_outs[jaxpr.outvars[i]] if jaxpr.outvars[i] in in_second_outs else first_at[i]
    )
    split.first = jax.jit(jaxpr_as_fun(ClosedJaxpr(jaxpr.replace(outvars=first_outvars, eqns=first_eqns), [])))
    second = jaxpr.replace(invars=second_invars, outvars=second_outvars, eqns=second_eqns)
    split.second, split.in_order = donating_program(jaxpr_as_fun(ClosedJaxpr(second, [])), donated, len(second_outvars))
    return split
