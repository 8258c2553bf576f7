"""``xgrad.compile``: a whole PyTorch-style training step as one cached XLA program.

The package: ``recording`` (the state a trace touches), ``intercept`` (what the engine and
ops call while a step is traced), ``hook_purity`` (which hooks are traced in), ``host`` (hooks, final callbacks and
custom Function backwards as ordered host callbacks), ``printing`` (``print`` at every call),
``observers`` and ``hook_ops`` (hooks that only observe, run after the program, their ops
computed in it), ``writeback`` (the program's outputs and where they go) and
``program`` (``CompiledFunction``: the cache, the guards, compiling and running).

# NOTE [Whole-step compile]
# ``xgrad.compile(fn)`` runs ``fn`` (forward, ``backward()``/``autograd.grad``,
# ``Optax.step()``, in-place updates) once under ``jax.make_jaxpr`` with the eager
# engine running on tensors that wrap tracers, and caches the jaxpr as one ``jax.jit``
# program per input signature. Three pieces make that the same as calling ``fn``:
#
# 1. Finding the state. While ``fn`` is traced, the step's ``Recorder`` is the trace of
#    this context (NOTE [The step-trace seam] in ``xgrad/step_trace.py``: hooks, checks,
#    random draws and a backward's final callbacks ask it). The code that reads a
#    tensor's array into a computation or changes a tensor's state tells it first
#    (``bind`` for every op, ``AccumulateGrad``, in-place ops, the optimizer, the random
#    generator, ``.grad``, ``requires_grad_``, ``.array``), and ``Tensor`` tells it of
#    each tensor made meanwhile: every tensor from before the trace whose storage or
#    ``.grad`` is read or rebound is snapshotted on first touch. Nothing global changes,
#    so two threads trace two steps at once. A concrete array
#    a traced op reads becomes a constant of the jaxpr (``ClosedJaxpr.consts``); each
#    constant that came from a tensor that outlives the trace (a parameter, a
#    ``.grad``, an optimizer-state tensor, found through closures, attributes or
#    globals alike) becomes a program input, read from that tensor at every call.
#    Constants from tensors made during the trace stay constants.
# 2. Writing back. A surviving tensor whose storage or ``.grad`` was rebound is an
#    output; after the call its new value is rebound on the same object and
#    ``_version`` moves as it did while tracing. Every touched tensor is restored from
#    its snapshot when the trace ends, so tracing has no effect of its own. What cannot
#    be written back (a ``.grad`` or an in-place result that carries autograd history
#    out of the program) is not compiled (below). The arrays a call replaces are donated
#    to the program, so the new values take the old ones' memory, as PyTorch's in-place
#    updates do (NOTE [Donated state] in ``writeback.py``).
# 3. Guards. The trace took Python branches on the state it saw: whether a ``.grad``
#    was ``None`` (set or accumulate), ``requires_grad``, the hooks present, shapes
#    and dtypes. A cache entry keeps these per state tensor and a call whose state
#    differs is a miss, traced again. They run every call, so each is a flat tuple read
#    without building one, and a state array whose aval is the very one that passed last
#    time (JAX interns avals) skips its shape and dtype compares.
#
# Hooks that touch no Python state outside their arguments, and those marked
# ``compiled.pure_hook``, are traced inline (NOTE [Hooks traced in] in ``hook_purity.py``).
# The others (and those marked ``compiled.host_hook``) run through
# ``io_callback(ordered=True)`` at their point in the program, with concrete tensors, in
# eager order (``host.hook_in_step``, NOTE [Host calls] in ``xgrad/engine/host_call.py``), or after it when they only observe (NOTE [Observer
# hooks]). Hooks registered while tracing are
# taken out again when the trace ends; one that would stay on a tensor or node that
# outlives the call is not compiled (eager adds one more per call, and all run).
# A host hook runs with a stand-in for its backward's ``GraphTask`` (``HostGraphTask``),
# so ``queue_callback`` inside it works; where the traced backward ran its final
# callbacks, one more host call runs the ones queued during this call, in queue order,
# with the state tensors showing their values at that point (``state_on_host``: the
# ``.grad``s and the arrays the step changed so far go to the host, and what a callback
# rebinds among them flows on; an array the step left alone stays on the device, and a
# callback that changes one raises). That call sits under a ``lax.cond`` on flags the
# host hooks return (whether callbacks wait), so hooks that queue nothing cost one
# flag each. A callback queued by traced code (a pure hook, a traced Function's
# backward) is such a host call too, at its place in the traced backward's
# list (``TracedCallbacks``: a ``GraphTask`` made while tracing takes one from the recorder).
# ``print`` is a host effect with the values of each call (NOTE [Print in a compiled
# step] in ``printing.py``). Python needing a concrete value
# (``.item()``, ``if t > 0``, ``.numpy()``) makes the call run eagerly after a
# one-time warning naming the user's line and the construct, or raises under ``fallback="error"``; a
# signature that fell back is remembered and runs eagerly without retracing.
#
# Shared with the compiled backward (``xgrad/engine/compiled``): ``RecompileWarning``
# and ``RECOMPILE_WARNING_LIMIT``, ``TRACER_ERRORS`` (what means "needs a concrete
# value") and ``call_site`` (the user's line). Not shared, because the concern differs:
# how hooks reach the host (the backward splits its program into segments and calls
# hooks between them; a step is one jaxpr traced by running user code, so hooks go
# through ``io_callback``), the cache (the backward's is process-wide, locked and
# keyed by graph structure; a step's is per function and keyed by its arguments) and
# so the stats and recompile reasons (call sites and nodes there, argument leaves here).
#
# NOTE [What a step is]
# A compiled call keeps its autograd graph inside the program: the tensors it returns carry
# no history. That is right for a step: a function that runs its own backward, or no
# autograd at all (an evaluation under ``no_grad``, an optimizer update, a forward whose
# results are only read). It is wrong for a forward whose caller backpropagates through
# what it returns. A ``Module`` is such a forward by what it is for, so ``xgrad.compile``
# returns it as it is (``torch.compile(model)``: its backward is what the compiled backward,
# ``xgrad.autograd.compiled``, speeds up); any other callable is taken for a step. A function
# whose results are backpropagated through later is a forward: call it uncompiled (its
# results' ``backward()`` would raise that they do not require grad).
#
# NOTE [Entries of one signature]
# A call whose guards fail (a mode, a ``.grad`` set or cleared, a hook) is traced again,
# and the new entry goes before the old ones of its signature (``Entry.other``, at most
# ``ENTRIES_PER_SIGNATURE``): a call tries them in turn, so a step that alternates
# between states (``train()`` for an epoch, ``eval()`` for a validation pass) traces
# each once. A call matching the newest entry costs what it did with one.
#
# NOTE [Python state in a compiled step]
# Python state that eager re-reads at every call must not be frozen at the trace. An LR
# scheduler's ``step()`` (``last_epoch``, its rates: plain Python) is a host effect
# (``StepTrace.host_effect``): it runs at every call. Where nothing in the program comes
# after it that reads or writes the optimizer's hyperparameter Tensors, calls the host,
# checks or observes (``opt.step(); sched.step()``, the common order), it runs after the
# program, on the Tensors it was given (a plateau scheduler's metric) as outputs, and the
# rates it sets are the next call's inputs: no host call in the program, which keeps
# JAX's fast dispatch (a small MLP step: 57 us, 1 ms with a host call, 133 us so, where
# the scheduler's own Python costs 85 us). Otherwise ``fn`` is traced again with the
# effect as one ordered host call at its place, the hyperparameter Tensors and the
# given ones holding their values then, and the rates it sets flow on in the program to
# an ``opt.step()`` after it. A module's mode: ``Module.__call__`` and ``train()``/
# ``eval()`` tell the trace (``module_mode``), which keeps each module's mode from before
# the trace as a guard (``Entry.modes``: ``eval()`` between calls is a miss, traced
# again once per mode, NOTE [Entries of one signature]) and, for the modes
# ``fn`` itself changed, the mode after it, set again after every call
# (``Entry.mode_writes``). A module's forward hooks and pre-hooks would run only while
# traced and their results may carry autograd history into the step, which a host call
# cannot: unless all are marked ``pure_hook`` (traced in), the call is not compiled (it
# runs eagerly after a warning, or raises under ``fallback="error"``). A post-accumulate-
# grad hook returning a value raises PyTorch's error from the host, after all the leaf's
# hooks ran, as eagerly. A module attribute (or buffer) the trace set to a Tensor of its
# own would hold a tracer once the trace ends: the call is not compiled, naming it.
#
# NOTE [One trace at a time]
# A trace rebinds the state it touches to tracers until it ends (then restores it from
# its snapshots). Two threads tracing one function at once would each snapshot the
# other's tracers as the "old" values and restore them: a tracer left in every
# parameter, and every later call, eager ones too, failing. So a compiled function
# traces under its own lock (``_trace_lock``: a miss, ``lower``, an observer variant):
# a thread that misses waits, looks the cache up again and, when the first thread's
# trace was of its signature, hits it. A trace that raises restores, besides the tensors
# it touched, the attributes of the modules it saw (``restore_modules``): what it set on
# them (a traced output, a buffer, a mode) is undone. Traces of different functions still run at
# once; they must not share state being traced (as eager steps in two threads must
# not race on one model).
#
# NOTE [Functions in a compiled step]
# A custom Function's backward is user Python, so it runs as a hook does: one ordered
# host call at its point in the program, every call (``function_on_host``), under
# ``no_grad`` and the backward's host stand-in (``queue_callback`` works). The node itself
# runs there, as the engine runs it: ``ctx.saved_tensors`` unpacks at each access (unpack
# hooks, version checks, the unpacked tensors' places in the graph), from copies of the
# saved tensors made when traced, which hold the call's values; the ctx's own tensors and
# the saved tensors' originals hold them too while it runs. A library's unpack hook (a
# checkpoint's recomputation reads the step's traced values) is traced in instead, and
# the copy hands out what it unpacked. Its results are validated there as the engine validates them, so they come
# back with the shapes and dtypes of the inputs they flow into; the program is laid out
# when traced, so a ``None`` for an input that requires grad raises, naming the fix.
# The step's state is the program's while it runs: a backward that changes a state
# tensor's storage or ``.grad`` on the host (a backward of its own accumulating into
# parameters) is undone and raises. What it raises is kept as a hook's is. Traced in instead: a backward marked
# ``pure_hook`` (its body then runs once per trace, as under ``jax.jit``), xgrad's own
# Functions (``Function._traced_in_step``: a reentrant checkpoint accumulates into the
# step's parameters, which a host call cannot), and any backward under a JAX
# transformation nested in ``fn``. Under ``create_graph`` a backward's graph must be
# recorded, which a host call cannot do: the step runs eagerly (a fallback).
#
# NOTE [Checks in a compiled step]
# Eager ops raise ``IndexError`` for an out-of-range index (``check_index_range`` in
# ``xgrad/ops/_util.py``); JAX would clamp a read and drop a write. Other checks of
# values (``check_values``: a BCE input outside [0, 1], an integer to a negative power)
# and an exception a host call raised (a hook, a final callback: kept on the host, its
# flag returned to the program) take the same road. While a step is
# traced, a check whose values are tracers of this trace becomes a ``Check``: a flag
# (the check fails), a detail for the message (the first bad entry), the error to
# raise (the eager one; the user's own exception, as itself, for a host call), and the state writes
# as they stand at that point of ``fn`` (what eager would have done before raising:
# a ``zero_grad()`` that ran, an in-place update). The program returns the flags as
# one vector; a call reads it (one small device-to-host copy, only for programs with
# checks) and, when a flag is set, applies the writes of the first failed check
# instead of the final ones and raises its error. Host hooks after a failed
# check are skipped (they see whether a check failed before them), so hooks run as
# eagerly: up to the failing op. Checks under a ``jax.jit``/``vmap`` nested in ``fn``
# run at another trace level and are host callbacks, as under plain ``jax.jit``
# (NOTE [Checks under jax.jit] in ``xgrad/ops/_util.py``).
# Reading the flags waits for the whole program, which costs a loop that never waits on
# its steps JAX's asynchronous dispatch. So the common check, of indices the call was
# given as they are (targets, token ids), reached before any state but cleared grads
# changed and before any hook ran, is done on the host by eager's own
# ``check_index_range`` (a NumPy read on CPU) and raises with the same state eager
# leaves; a ``jax.Array`` cannot change, so one that passed is not read again (a weak
# reference tells it from a later array with its id). A program without host calls is dispatched first and checked while it runs
# (a failed check drops its outputs: nothing was written back, no hook ran); one with
# hooks is checked before it is dispatched. Only the other checks need the flags.
#
# NOTE [Observer hooks]
# One host call costs ~170 µs on CPU, and a program with host calls leaves JAX's C++
# dispatch path, so hooks that only look at gradients (``norms.append(g.norm())``) would
# cost more than the step. A hook call that returns ``None`` and queues no callback
# changes nothing in the program: its effects on Python state are the same whether it
# runs inside the program or after it (the state tensors hold their values from before
# the call either way, until the call writes back). So an entry whose host calls are all
# such hooks (``_replacing_hook_on_host``; final callbacks only if a hook queues one) and
# whose hooks all observed on its last call is traced once more (``step.stats()["variants"]``;
# ``fn``'s Python runs a second time for that signature) with ``rec.observing`` set: each hook
# call becomes its arguments as outputs of the program (``Observer``) and the variant has no
# host call. A call runs the variant, checks (a failed one: the exact program runs instead,
# and raises, no hook having run), then calls the hooks in program order on the outputs,
# in the calling thread, with a stand-in ``GraphTask`` each and grad mode off (as the engine runs
# a backward's hooks; so do the exact program's host calls). If all observe again, the
# variant's writes and results are the call's. Once hook ``k`` returns a value, raises or
# queues a callback, the variant's outputs are dropped and the exact program runs with
# the first ``k + 1`` hook calls replayed from what they did (``HookBox.replay``: ``None``,
# then hook ``k``'s result, exception or queued callbacks), without calling them again,
# and the rest live: each hook runs once per call, and the call is the exact one. The exact
# program then serves the entry until its hooks all observe again. What the hooks compute
# from their arguments (``g.norm()``) is computed in the variant as well, learned from
# their last run in the exact program (NOTE [Hook ops in the program] in ``hook_ops.py``).
# An entry with other
# host calls (a Function's backward, post-accumulate hooks, callbacks queued by traced
# code) always runs exactly. ``HookBox.lock`` keeps one call of an entry at a time in
# this bookkeeping.
"""

from xgrad.compile_step.errors import (
    HOOK_KEPT,
    CompileFallbackError,
    CompileFallbackWarning,
    CompileSideEffectWarning,
    RecompileWarning,
)
from xgrad.compile_step.jax_hooks import plain_jax_hook
from xgrad.compile_step.program import CompiledFunction, compile

__all__ = [
    "HOOK_KEPT", "CompileFallbackError", "CompileFallbackWarning", "CompileSideEffectWarning", "CompiledFunction",
    "RecompileWarning", "compile", "plain_jax_hook",
]
