"""``CompiledFunction``: a step's cache of programs, its guards, compiling it and running it."""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from xgrad.compile_step.errors import (
    ERR_FALLBACK,
    HOOK_KEPT,
    MODULE_ATTRIBUTE_TRACED,
    UNPRINTED,
    WARN_FALLBACK,
    WARN_RECOMPILE,
    CompileFallbackError,
    CompileFallbackWarning,
    NotCompilable,
    RecompileWarning,
)
from xgrad.compile_step.hook_purity import reads_hold
from xgrad.compile_step.intercept import Recorder
from xgrad.compile_step.miss_reasons import concrete_value_needed, describe_change, warn_rebinds
from xgrad.compile_step.observers import run_observers
from xgrad.compile_step.printing import intercepting_print, print_before_error, unprinted
from xgrad.compile_step.program_call import donating_program, finish, gather_inputs, precheck, run_program
from xgrad.compile_step.signature import (
    LastCall,
    entries_hold,
    guard_entry,
    hook_ids_hold,
    leaf_hook_versions,
    same_shape,
    signature_of,
)
from xgrad.compile_step.writeback import (
    check_on_host,
    collect_outputs,
    donation,
    remove_added_hooks,
    resolve_target,
    sort_writes,
    source_value,
)
from xgrad.engine.anomaly import ANOMALY
from xgrad.engine.compiled.cache import RECOMPILE_WARNING_LIMIT
from xgrad.engine.compiled.switch import TRACER_ERRORS
from xgrad.jax_internals import ClosedJaxpr, check_consts_keep_identity, get_opaque_trace_state, jaxpr_as_fun
from xgrad.nn.module import Module
from xgrad.step_trace import current as current_trace
from xgrad.step_trace import tracing_step
from xgrad.tensor import Tensor, is_tensor
from xgrad.tensor.hook_kinds import leaf_has_hooks

__all__ = ["CompiledFunction", "compile"]

#: Signatures kept per compiled function (least recently used dropped first).
CACHE_SIZE = 64
#: Programs kept per signature, traced under different guards (NOTE [Entries of one signature]).
ENTRIES_PER_SIGNATURE = 4


@dataclasses.dataclass(init=False, eq=False, slots=True)
class Entry:
    """One compiled signature: the program, where its inputs come from, where its outputs go."""

    aliased: list[Any]  # the sources sharing one array when traced: a tuple of weak references, else a list of targets
    arg_tensor_slots: tuple[int, ...]
    checks: tuple[tuple[Callable[[Any], BaseException], int | None, list[Any]], ...]  # error, detail's output, writes
    # The inputs a call donates: position, source, whether a new .grad Tensor replaces it, the output replacing
    # it (NOTE [Donated state]).
    donated: tuple[tuple[int, Any, bool, int], ...]
    check_first: bool  # whether a call checks its arguments' indices before the program runs
    dropped_grads: tuple[Any, ...]  # the targets whose .grad a call lets go of before its program runs
    effects: list[tuple[Any, Any, list[Any], list[tuple[int, int]]]]  # host effects run after the program
    fast_writes: tuple[list[Any], list[Any], list[Any], list[Any]]  # the state writes, as ``sort_writes`` makes them
    fresh: list[Any]  # the outputs that replaced the donated inputs at the last call, weakly (NOTE [Donated state])
    tracks_fresh: bool  # whether ``fresh`` is kept: the program forwards no input as an output
    in_order: Any  # puts ``jitted``'s outputs in the program's order, if it returns them in another (``donating_program``)
    # The state tensors' guards as ``guard_entry`` lays them out, plain state (a leaf with no hooks, its .grad not
    # read: parameters, optimizer state, buffers) apart.
    plain_guards: list[list[Any]]
    guards: list[list[Any]]
    host_checks: tuple[tuple[int, int, str, bool, int | None, list[Any]], ...]  # an argument's indices, checked first
    modes: list[tuple[Any, bool]]  # the modules the trace called or put in train/eval mode, and their modes then
    mode_writes: list[tuple[Any, bool]]  # the modules whose mode the trace changed, and their modes after it
    other: Any  # an older entry of the signature, whose guards failed when this one was traced (``None``: none)
    has_host_calls: bool  # hooks or callbacks run from inside the program
    hook_box: Any  # its hooks' ``HookBox`` if an observer variant may stand in for it, else ``None``
    hook_reads: list[tuple[Any, Any, Any]]  # what its traced-in hooks read, compared every call (NOTE [Hooks traced in])
    # The parameter-group entries its Python read, compared every call, and the ones it set, set again after every
    # call (NOTE [Param groups in a compiled step]): (group, key, value), key ``None`` for the update's options.
    entry_reads: list[tuple[Any, str | None, Any]]
    entry_writes: list[tuple[Any, str, Any]]
    observers: list[Any]  # the observer variant's hooks, run after it in program order
    observing: Any  # the observer variant once traced (``_NO_VARIANT``: none can be), else ``None``
    inputs: list[tuple[int, Any]]  # per constant of the jaxpr: (0, itself), (1, a weak reference), (2, another target)
    flags: int | None  # the output holding the checks' flags (NOTE [Checks in a compiled step])
    precheck: Any  # the program's checks alone, run before it, and it donating nothing (NOTE [Donated state]), or ``None``
    jitted: Any
    result_template: list[tuple[str, Any, Any]]
    result_tree: Any
    returns_one_leaf: bool  # ``fn`` returns one leaf itself (a Tensor, an array): no tree to rebuild around it


_FALLBACK = object()
_NO_VARIANT = object()


class CompiledFunction:
    """``fn`` run as one cached ``jax.jit`` program per input signature (see ``xgrad.compile``)."""

    def __init__(self, fn: Callable[..., Any], fallback: str) -> None:
        if fallback not in ("eager", "error"):
            raise ValueError(f"fallback must be 'eager' or 'error', got {fallback!r}")
        self.fn = fn
        self.fallback = fallback
        self._cache: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._stats = {"compiles": 0, "hits": 0, "misses": 0, "fallbacks": 0, "variants": 0, "compile_seconds": 0.0}
        self._warned_sites: set[str] = set()
        self._last_signature: Any = None
        self._last_call: LastCall | None = None  # NOTE [The hit path]
        self._recompile_warned = False
        self._trace_lock = threading.RLock()
        functools.update_wrapper(self, fn)

    def stats(self) -> dict[str, Any]:
        """``{"compiles", "hits", "misses", "fallbacks", "variants", "compile_seconds"}`` for this function.

        ``variants``: observer variants traced (NOTE [Observer hooks] in ``xgrad/compile_step/__init__.py``).
        """
        return dict(self._stats)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_trace() is not None or ANOMALY.enabled:
            # Inside another compiled function the body is part of that trace; anomaly
            # mode records forward tracebacks per op, which only an eager run has.
            if ANOMALY.enabled and current_trace() is None:
                self._stats["fallbacks"] += 1
            return self.fn(*args, **kwargs)
        last = self._last_call  # NOTE [The hit path]
        if last is not None and not kwargs and len(args) == last.positional:
            leaves, tree = list(args), last.tree
            hit = last.matches(leaves)
            if not hit:
                leaves, tree = jax.tree_util.tree_flatten((args, kwargs), is_leaf=is_tensor)
        else:
            leaves, tree = jax.tree_util.tree_flatten((args, kwargs), is_leaf=is_tensor)
            hit = last is not None and tree == last.tree and last.matches(leaves)
        if hit and last is not None:
            entry = self._matching(last.head, leaves)
            if entry is not None:
                self._stats["hits"] += 1
                return self._run(entry, leaves, tree)
        if any(isinstance(leaf, jax.core.Tracer) or (isinstance(leaf, Tensor) and isinstance(leaf._array, jax.core.Tracer)) for leaf in leaves):
            return self.fn(*args, **kwargs)  # under a plain jax transformation: part of its trace
        signature = signature_of(leaves, tree)
        entry = self._cached(signature, leaves)
        if entry is None:
            with self._trace_lock:  # NOTE [One trace at a time]
                entry = self._cached(signature, leaves)  # traced by another thread meanwhile: a hit
                if entry is None:
                    self._note_miss(signature)
                    try:
                        entry = self._compile(leaves, tree)
                    except NotCompilable as exc:
                        self._cache[signature] = entry = _FALLBACK
                        self._last_call = None
                        self._fall_back(exc)
                    else:
                        self._keep(signature, entry)
        if entry is _FALLBACK:
            return self.fn(*args, **kwargs)
        return self._run(entry, leaves, tree)

    def _cached(self, signature: Any, leaves: list[Any]) -> Any:
        """The cached entry (or ``_FALLBACK``) this call runs, counted; ``None``: a miss."""
        entry = self._cache.get(signature)
        if entry is _FALLBACK:
            self._stats["fallbacks"] += 1
            return entry
        head = entry
        entry = self._matching(head, leaves)
        if entry is not None:
            self._cache.move_to_end(signature)
            self._stats["hits"] += 1
            self._last_call = LastCall.of(leaves, signature[0], signature, head)
        return entry

    def _matching(self, entry: Any, leaves: list[Any]) -> Any:
        """The first entry of a signature's chain (NOTE [Entries of one signature]) whose guards hold, else ``None``."""
        while entry is not None:
            if self._guards_hold(entry, leaves):
                return entry
            entry = entry.other
        return None

    def _keep(self, signature: Any, entry: Entry) -> None:
        """Cache ``entry`` for ``signature``, before the ones traced for it under other guards (NOTE [Entries of one signature])."""
        previous = self._cache.get(signature)
        entry.other = None if previous is _FALLBACK else previous
        last_kept = entry  # the chain keeps its first ENTRIES_PER_SIGNATURE entries
        for _ in range(ENTRIES_PER_SIGNATURE - 1):
            if last_kept.other is not None:
                last_kept = last_kept.other
        last_kept.other = None
        self._cache[signature] = entry
        self._last_call = None
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)

    def lower(self, *args: Any, **kwargs: Any) -> jax.stages.Lowered:
        """JAX's ``Lowered`` of the program a call with these arguments runs; nothing runs.

        ``step.lower(x, y).compile().as_text()`` is the optimized HLO (the collectives XLA
        inserts for sharded state), ``.cost_analysis()`` its costs. The call is traced if
        no program is cached for it, and the program is kept for the calls (a compile, not
        a call, in ``stats()``); one that cannot be compiled raises ``CompileFallbackError``.

        >>> import xgrad
        >>> w = xgrad.tensor([1.0, 2.0], requires_grad=True)
        >>> step = xgrad.compile(lambda x: (w * x).sum().backward())
        >>> "multiply" in step.lower(xgrad.tensor([3.0, 4.0])).as_text()
        True
        """
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs), is_leaf=is_tensor)
        signature = signature_of(leaves, tree)
        with self._trace_lock:
            cached = self._cache.get(signature)
            entry = None if cached is _FALLBACK else self._matching(cached, leaves)
            if entry is None:
                try:
                    entry = self._compile(leaves, tree)
                except NotCompilable as exc:
                    raise CompileFallbackError(ERR_FALLBACK.format(name=self._name(), reason=exc.reason, site=exc.site)) from exc
                self._keep(signature, entry)
        return entry.jitted.lower(*gather_inputs(entry, leaves))

    # -- hit path ----------------------------------------------------------------------
    @staticmethod
    def _guards_hold(entry: Entry, leaves: list[Any]) -> bool:
        return _plain_guards_hold(entry) and _guards_with_history_hold(entry) and _modes_and_aliases_hold(entry, leaves)

    def _run(self, entry: Entry, leaves: list[Any], tree: Any) -> Any:
        box = entry.hook_box
        if box is None:
            return run_program(entry, leaves)
        with box.lock:  # NOTE [Observer hooks]
            if box.observed:
                if entry.observing is None:
                    entry.observing = self._observer_variant(entry, leaves, tree)
                if entry.observing is not _NO_VARIANT:
                    variant = entry.observing
                    outs = variant.jitted(*gather_inputs(variant, leaves))
                    check_on_host(variant.host_checks, leaves)
                    checked = variant.flags is None or not np.asarray(outs[variant.flags]).any()
                    # A failed check: the exact program, which no hook has run for yet, raises it.
                    if checked and run_observers(variant.observers, outs, box):
                        return finish(variant, outs, leaves)
            box.observed = not box.replay  # what the hooks run live now say
            box.learned = []
            try:
                return run_program(entry, leaves)
            finally:
                box.replay.clear()

    def _observer_variant(self, entry: Entry, leaves: list[Any], tree: Any) -> Any:
        """``fn`` traced with its hooks as outputs of the program, run after it; ``_NO_VARIANT`` if a host call stays."""
        try:
            with self._trace_lock:
                variant = self._compile(leaves, tree, observing=entry.hook_box.learned)
        except Exception:  # ``fn``'s Python, traced once more, took another road: the exact program stays
            return _NO_VARIANT
        return _NO_VARIANT if variant.has_host_calls else variant

    # -- miss path ---------------------------------------------------------------------
    def _note_miss(self, signature: Any) -> None:
        """Count a miss: the first warns of the variables ``fn`` rebinds, the one past the limit of recompiling."""
        self._stats["misses"] += 1
        if self._stats["misses"] == 1:
            warn_rebinds(self.fn, self._name())
        previous, self._last_signature = self._last_signature, signature
        if self._stats["misses"] > RECOMPILE_WARNING_LIMIT and not self._recompile_warned:
            self._recompile_warned = True
            warnings.warn(
                WARN_RECOMPILE.format(
                    name=self._name(), count=self._stats["misses"], reason=describe_change(self.fn, previous, signature)
                ),
                RecompileWarning,
                stacklevel=3,
            )

    def _name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))

    def _fall_back(self, exc: NotCompilable) -> None:
        if self.fallback == "error":
            raise CompileFallbackError(ERR_FALLBACK.format(name=self._name(), reason=exc.reason, site=exc.site)) from exc
        self._stats["fallbacks"] += 1
        if exc.site not in self._warned_sites:
            self._warned_sites.add(exc.site)
            warnings.warn(
                WARN_FALLBACK.format(name=self._name(), reason=exc.reason, site=exc.site), CompileFallbackWarning, stacklevel=3
            )

    def _compile(
        self, leaves: list[Any], tree: Any, observing: list[Any] | None = None, effects_in_program: bool = False,
    ) -> Entry:
        """Trace ``fn`` into an entry; with ``observing`` (the ops its hooks ran), its observer variant."""
        start = time.perf_counter()
        check_consts_keep_identity()  # the program's inputs are found by it (xgrad/jax_internals.py)
        input_device = next((leaf.device for leaf in leaves if isinstance(leaf, Tensor)), None)
        recorder = Recorder(input_device, observing, effects_in_program)
        dyn_slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, (Tensor, jax.Array, np.ndarray))]
        dyn_values = [leaves[i]._array if isinstance(leaves[i], Tensor) else leaves[i] for i in dyn_slots]
        closed, layout = self._trace(recorder, leaves, tree, dyn_slots, dyn_values)
        if recorder.effects_need_program():
            return self._compile(leaves, tree, observing, effects_in_program=True)
        entry = _built_entry(recorder, closed, layout, leaves, dyn_slots, dyn_values)
        self._stats["variants" if recorder.observing else "compiles"] += 1
        self._stats["compile_seconds"] += time.perf_counter() - start
        return entry

    def _trace(
        self, recorder: Recorder, leaves: list[Any], tree: Any, dyn_slots: list[int], dyn_values: list[Any]
    ) -> tuple[Any, Any]:
        """``fn`` traced on the call's leaves, its arrays replaced by tracers: its jaxpr, and where its outputs go
        (``collect_outputs``'s layout). Nothing of a failed trace stays."""
        layout: Any = None

        def traced(*tracers: Any) -> Any:
            nonlocal layout
            recorder.trace = get_opaque_trace_state(convention="xgrad")
            call_leaves = list(leaves)
            for i, tracer in zip(dyn_slots, tracers, strict=True):
                recorder.arg_leaves[id(tracer)] = i
                leaf = leaves[i]
                if isinstance(leaf, Tensor):
                    if id(leaf) not in recorder.snapshots:  # the first of the arguments that are this tensor
                        recorder.touch(leaf)
                        snap = recorder.snapshots[id(leaf)]
                        snap.start = tracer
                        snap.target = i
                        leaf._array = tracer
                else:
                    call_leaves[i] = tracer
            call_args, call_kwargs = jax.tree_util.tree_unflatten(tree, call_leaves)
            layout = collect_outputs(recorder, self.fn(*call_args, **call_kwargs))
            return recorder.outputs

        for i in dyn_slots:
            leaf = leaves[i]
            if isinstance(leaf, Tensor) and leaf.grad_fn is not None:
                raise NotCompilable(
                    f"argument leaf {i} has autograd history from outside the function (detach it, or compute it inside)",
                    "the call",
                )
        # This context's trace: another thread may trace another step meanwhile.
        with tracing_step(recorder), intercepting_print():
            try:
                closed = jax.make_jaxpr(traced)(*dyn_values)
                leaked = recorder.traced_attribute()
                if leaked is not None:
                    raise NotCompilable(MODULE_ATTRIBUTE_TRACED.format(name=leaked), "the call")
                text = unprinted(recorder)
                if text is not None:
                    raise NotCompilable(UNPRINTED.format(construct=text.construct), text.site)
            except BaseException as exc:
                recorder.restore_modules()  # as the tensors below: nothing of a failed trace stays (NOTE [One trace at a time])
                if isinstance(exc, TRACER_ERRORS):
                    raise NotCompilable(*concrete_value_needed(exc)) from exc
                if not isinstance(exc, NotCompilable):  # the user's error (a fallback runs eagerly, printing it all)
                    print_before_error(recorder)
                raise
            finally:
                for snap in recorder.snapshots.values():
                    t = snap.ref()
                    if t is not None:
                        snap.restore(t)
                kept = remove_added_hooks(recorder)
                recorder.group_entries.restore()
            if kept is not None:
                raise NotCompilable(HOOK_KEPT, kept)
        return closed, layout


def _plain_guards_hold(entry: Entry) -> bool:
    """The guards of state without hooks whose ``.grad`` the trace did not read (NOTE [The hit path])."""
    # ``guard`` inlined, plain state apart: it runs every step, once per state tensor.
    for guard in entry.plain_guards:
        t = guard[0]()
        if t is None or t.grad_fn is not None or t._requires_grad != guard[4] or leaf_has_hooks(t):
            return False
        found_aval = t._array.aval
        if found_aval is not guard[1] and not same_shape(guard, found_aval):
            return False
    return True


def _guards_with_history_hold(entry: Entry) -> bool:
    """The other guards: history, the ``.grad`` read, hooks."""
    for guard in entry.guards:
        ref, _, _, _, grad_read, grad_fn, requires_grad, grad_shape, _, hook_versions = guard
        t = ref()
        if t is None or t.grad_fn is not grad_fn or t._requires_grad != requires_grad:
            return False
        if grad_read:
            g = t._grad
            if (None if g is None else g._array.shape) != grad_shape:
                return False
        if leaf_hook_versions(t) != hook_versions and not hook_ids_hold(guard, t):
            return False
        found_aval = t._array.aval
        if found_aval is not guard[1] and not same_shape(guard, found_aval):
            return False
    return True


def _modes_and_aliases_hold(entry: Entry, leaves: list[Any]) -> bool:
    """What traced-in hooks read, the modules' training modes, and the tensors that shared one array when traced."""
    if entry.hook_reads and not reads_hold(entry.hook_reads):  # NOTE [Hooks traced in]
        return False
    if entry.entry_reads and not entries_hold(entry.entry_reads):  # NOTE [Param groups in a compiled step]
        return False
    for ref, training in entry.modes:
        module = ref()
        if module is not None and module.training != training:
            return False
    for refs in entry.aliased:  # the tensors that shared one array when traced still do
        if type(refs) is tuple:  # tensors held by weak references
            first = refs[0]()
            array = None if first is None else first._array
            for ref in refs:
                t = ref()
                if t is None or t._array is not array:
                    return False
        else:
            values = [source_value(s, leaves) for s in refs]
            if any(v is not values[0] for v in values[1:]):
                return False
    return True


def _built_entry(
    recorder: Recorder, closed: Any, layout: Any, leaves: list[Any], dyn_slots: list[int], dyn_values: list[Any]
) -> Entry:
    """The cache entry of a traced step: its guards, inputs, donation and compiled program."""
    entry = Entry()
    entry.arg_tensor_slots = tuple(dyn_slots)
    writes, entry.result_template, entry.result_tree, guard_refs, entry.checks, entry.flags, entry.host_checks = layout
    entry.fast_writes = sort_writes(writes)
    entry.returns_one_leaf = entry.result_tree.num_nodes == 1 and entry.result_tree.num_leaves == 1
    entry.effects = recorder.effects
    entry.other = None
    guards = [guard_entry(ref, grad_read) for ref, grad_read in guard_refs if ref() is not None]
    entry.plain_guards = [guard for guard in guards if len(guard) == 5]
    entry.guards = [guard for guard in guards if len(guard) > 5]
    entry.modes = [(ref, training) for ref, training, _ in recorder.modules.values() if ref() is not None]
    entry.hook_reads = recorder.hook_reads
    entry.entry_reads = list(recorder.group_entries.reads.values())
    entry.entry_writes = recorder.group_entries.flush()
    entry.mode_writes = [(ref, not training) for ref, training in entry.modes if ref().training != training]
    # A constant of the jaxpr that a tensor outliving the trace holds is read from that tensor at every call.
    entry.inputs, entry.aliased, sources = [], [], []
    for const in closed.consts:
        _, holders = recorder.sources.get(id(const), (None, []))
        live = [source for source in holders if resolve_target(source, leaves) is not None]
        entry.inputs.append((0, const) if not live else (1, live[0]) if type(live[0]) is weakref.ref else (2, live[0]))
        if len(live) > 1:
            entry.aliased.append(tuple(live) if all(type(source) is weakref.ref for source in live) else live)
        sources.append(live[0] if len(live) == 1 else None)
    sources += [i if isinstance(leaves[i], Tensor) else None for i in dyn_slots]
    _compile_program(entry, recorder, closed, writes, sources, leaves, dyn_values)
    return entry


def _compile_program(
    entry: Entry, recorder: Recorder, closed: Any, writes: Any, sources: list[Any], leaves: list[Any],
    dyn_values: list[Any],
) -> None:
    """``entry``'s program: its checks made first, what it donates (``sources``: each input's state, if one), jitted
    and compiled for the call's values."""
    jaxpr = closed.jaxpr
    invars = [*jaxpr.constvars, *jaxpr.invars]
    program = jaxpr_as_fun(ClosedJaxpr(jaxpr.replace(constvars=[], invars=invars), []))
    entry.has_host_calls = bool(closed.effects)
    entry.precheck = None if recorder.observing else precheck(entry, program, invars, jaxpr)
    entry.donated, entry.dropped_grads = ((), ()) if recorder.observing or entry.has_host_calls else donation(
        writes, () if entry.precheck is not None else entry.checks, sources, [v.aval for v in invars], closed.out_avals,
    )
    # Arguments' indices are checked before the program when its hooks must not run after a failed check, when it
    # consumes the state (NOTE [Donated state]), or when its own checks run first (eager checks the arguments first).
    entry.check_first = entry.has_host_calls or bool(entry.donated or entry.dropped_grads) or entry.precheck is not None
    entry.jitted, entry.in_order = donating_program(program, entry.donated, len(closed.out_avals))
    entry.fresh = []
    entry.observers = recorder.observers
    entry.observing = None
    # Hooks that may only observe, and no other host call but final callbacks they would queue: an
    # observer variant may run instead (NOTE [Observer hooks]).
    only_hooks = 0 < recorder.hook_calls == recorder.host_calls - recorder.conditional_calls
    entry.hook_box = recorder.hook_box if only_hooks else None
    traced_program = entry.jitted.trace(
        *[source if kind == 0 else source_value(source, leaves) for kind, source in entry.inputs], *dyn_values
    )
    # An output that is an input of the jitted program is that input's array itself, no buffer of its own.
    run_jaxpr = traced_program.jaxpr.jaxpr
    entry.tracks_fresh = bool(entry.donated) and not set(run_jaxpr.invars).intersection(run_jaxpr.outvars)
    traced_program.lower().compile()


def compile(
    fn: Callable[..., Any] | None = None, *, fallback: str = "eager", fullgraph: bool = False, dynamic: bool | None = None,
    backend: Any = "inductor", mode: str | None = None, options: dict[str, Any] | None = None, disable: bool = False,
) -> Any:
    """Run ``fn`` — forward, ``backward()``, ``Optax.step()``, in-place updates — as one XLA program.

    Usable as ``@xgrad.compile`` or ``xgrad.compile(fn, fallback="error")``. Each input
    signature (shapes, dtypes and shardings of the Tensor and array arguments; other
    arguments are static and must be hashable) is traced once into a cached
    ``jax.jit`` program (NOTE [Whole-step compile] in ``xgrad/compile_step/__init__.py``).

    Calling it has the effects calling ``fn`` has: the same return values (returned
    Tensors come back without autograd history: the graph stays in the program),
    ``.grad`` on leaves (accumulated when not zeroed), and parameters and optimizer
    state updated in place on the same Tensor objects: the arrays a call replaces are
    donated to the program, which writes the new values into their memory, as PyTorch
    updates in place; an array taken from them before the call (``w.array``) stays
    valid (it is copied rather than donated). Tensors ``fn`` reads or
    rebinds through closures, attributes or globals are found by themselves: pass
    only the data.

    Args:
        fn: the step function.
        fallback: ``"eager"`` (default): a call that cannot be traced — Python needing
            a concrete value inside ``fn`` (``.item()``, ``if t > 0``, ``.numpy()``) —
            runs eagerly, after a one-time warning naming the line and the construct;
            ``"error"``: raise ``CompileFallbackError`` instead.
        fullgraph, dynamic, backend, mode, options, disable: ``torch.compile``'s. ``fullgraph=True``
            is ``fallback="error"`` (no part of ``fn`` may run eagerly); ``disable=True`` returns
            ``fn``; the others are accepted, as XLA compiles each signature its own way.

    ``fn`` is a step (NOTE [What a step is]): a ``Module`` is a forward and is returned as it
    is, so ``torch.compile(model)`` and ``torch.compile(train_step)`` both work as in PyTorch.

    Hooks registered on tensors or nodes (inside ``fn`` or before) and custom ``Function.backward``s run once
    per call with concrete values in eager order, through host callbacks; hooks that only observe (return
    ``None``, queue no callback) run right after the program, at no host round trip, the ops they ran on their
    arguments last time (``g.norm()``) computed in it (NOTE [Observer hooks]). A hook that touches no Python
    state outside its arguments, or one marked ``xgrad.autograd.compiled.pure_hook``, is traced into the program,
    the values it reads checked at every call (NOTE [Hooks traced in] in ``hook_purity.py``);
    ``xgrad.autograd.compiled.host_hook`` keeps one on the host. ``print`` in ``fn`` prints at every call with
    that call's values, in eager's format and order (NOTE [Print in a compiled step] in ``printing.py``). Other
    plain Python side effects in ``fn``'s body (appending to a list) run when ``fn`` is traced, as under
    ``jax.jit``: on the first call of each signature (and its observer variant's trace). Python state eager
    re-reads at every call is not frozen (NOTE [Python state in a compiled step]): an LR scheduler's ``step()``
    in ``fn`` runs at every call, each module's ``train()``/``eval()`` mode is guarded, and a module with
    forward hooks not marked ``pure_hook`` makes the call run eagerly. Calls from several threads trace a
    signature once. ``step.stats()`` returns ``{"compiles", "hits", "misses", "fallbacks", "variants",
    "compile_seconds"}``.

    >>> import optax, xgrad
    >>> w = xgrad.tensor([1.0, -2.0], requires_grad=True)
    >>> opt = xgrad.optim.Optax([w], optax.sgd(0.1))
    >>> @xgrad.compile
    ... def step(x):
    ...     opt.zero_grad()
    ...     loss = ((w * x).sum() - 1.0) ** 2
    ...     loss.backward()
    ...     opt.step()
    ...     return loss
    >>> [round(step(xgrad.tensor([1.0, 1.0])).item(), 4) for _ in range(3)]
    [4.0, 1.44, 0.5184]
    >>> [round(g, 4) for g in w.grad.tolist()], step.stats()["compiles"], step.stats()["hits"]
    ([-1.44, -1.44], 1, 2)
    """
    if fullgraph:
        fallback = "error"
    if fn is None:
        return functools.partial(compile, fallback=fallback, disable=disable)
    if disable or isinstance(fn, Module):
        return fn
    return CompiledFunction(fn, fallback)
