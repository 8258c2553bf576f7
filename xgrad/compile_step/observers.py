"""Hook calls on the host: the backward's stand-in, observer hooks after the program (NOTE [Observer hooks])."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from xgrad.compile_step.hook_ops import HookOps, HookPlan, OpLog, Served, ServedPlan
from xgrad.engine.node import current_task
from xgrad.grad_mode import enable_grad, graph_off, is_grad_enabled
from xgrad.ops.dispatch import DISPATCH, OP_CALL, dispatching_through
from xgrad.tensor import Tensor


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


class _Outcome(NamedTuple):
    """What one hook call did, to be replayed in the exact program instead of calling the hook again."""

    result: Any
    error: BaseException | None
    queued: tuple[Callable[[], None], ...]

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
        # As ``Tensor(array)``, without the type's call (NOTE [Op outputs made without the type's call]).
        tensors = [Tensor._fill(object.__new__(Tensor), outs[i]) for i in self.outputs]
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
