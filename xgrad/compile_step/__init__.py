"""``xgrad.compile``: a whole PyTorch-style training step as one cached XLA program.

The package: ``recording`` (a tensor's snapshot, the recorder of the step being traced),
``intercept`` (the ``Recorder``: the state a trace touches, and what the engine and ops call
while a step is traced), ``hook_purity`` (which hooks are traced in), ``host``
(hooks, final callbacks and custom Function backwards as ordered host callbacks),
``printing`` (``print`` at every call), ``observers`` and ``hook_ops`` (hooks that only
observe, run after the program, their ops computed in it), ``writeback`` (the program's
outputs and where they go) and ``program`` (``CompiledFunction``: the cache, the guards,
compiling and running).

# NOTE [Whole-step compile]
# ``xgrad.compile(fn)`` runs ``fn`` (forward, ``backward()``/``autograd.grad``,
# ``Optax.step()``, in-place updates) once under ``jax.make_jaxpr``, the eager engine
# running on tensors that wrap tracers, and caches the jaxpr as one ``jax.jit`` program
# per input signature. Three pieces make that the same as calling ``fn``:
#
# 1. Finding the state. While ``fn`` is traced, the step's ``Recorder`` is this
#    context's trace, told of every tensor made and of every tensor read into a
#    computation or changed, before it happens (NOTE [The step-trace seam] in
#    ``xgrad/step_trace.py``; ``.array`` reports too). Every tensor from before the
#    trace whose storage or ``.grad`` is read or rebound is snapshotted on first touch;
#    nothing global changes. A concrete array a traced op reads becomes a constant of the
#    jaxpr; one from a tensor that outlives the trace (a parameter, a ``.grad``, an
#    optimizer-state tensor, found through closures, attributes or globals alike) is
#    made a program input, read from that tensor at every call. Constants from tensors
#    made during the trace stay constants.
# 2. Writing back. A surviving tensor whose storage or ``.grad`` was rebound is an
#    output; after the call its new value is rebound on the same object and ``_version``
#    moves as it did while tracing. Every touched tensor is restored from its snapshot
#    when the trace ends, so tracing has no effect of its own. What cannot be written
#    back (a ``.grad`` or an in-place result carrying autograd history out of the
#    program) is not compiled. The arrays a call replaces are donated to the program, so
#    the new values take their memory, as PyTorch's in-place updates do (NOTE [Donated
#    state] in ``writeback.py``).
# 3. Guards. The trace took Python branches on the state it saw: a ``.grad`` ``None`` or
#    not (set or accumulate), ``requires_grad``, the hooks present, shapes and dtypes. An
#    entry keeps these per state tensor; a call whose state differs is a miss, traced
#    again. They run at every call, so each is a flat tuple read without building one,
#    and a state array whose aval is the one that passed last time (JAX interns avals)
#    skips its shape and dtype compares.
#
# "Not compiled" (Python needing a concrete value: ``.item()``, ``if t > 0``, ``.numpy()``;
# the cases below): the call runs eagerly after a one-time warning naming the user's line
# and the reason, or raises under ``fallback="error"``; a signature that fell back is
# remembered and runs eagerly without retracing. ``print`` prints at every call, with
# that call's values (NOTE [Print in a compiled step] in ``printing.py``).
#
# Hooks that touch no Python state outside their arguments, and those marked
# ``compiled.pure_hook``, are traced in (NOTE [Hooks traced in] in ``hook_purity.py``).
# The others (and those marked ``compiled.host_hook``) run with concrete tensors, in
# eager order, as ordered host calls at their point in the program (``host.hook_in_step``,
# NOTE [Host calls] in ``xgrad/engine/host_call.py``), or after it when they only
# observe (NOTE [Observer hooks]). Hooks registered while tracing are taken out when the
# trace ends; one that would stay on a tensor or node outliving the call is not compiled
# (eager adds one more per call, and all run). A host hook runs with a stand-in for its
# backward's ``GraphTask`` (``HostGraphTask``), so ``queue_callback`` works in it: where
# the traced backward ran its final callbacks, one more host call runs those queued
# during this call, in queue order, seeing the state as eager's would
# (``host.state_on_host``; one changing an array the step left alone raises). That call
# sits under a ``lax.cond`` on flags the host hooks return, so hooks that queue nothing
# cost one flag each. A callback queued by traced code (a pure hook, a traced Function's
# backward) is such a host call too, at its place in the traced backward's list
# (``TracedCallbacks``).
#
# Shared with the compiled backward (``xgrad/engine/compiled``): ``RecompileWarning``,
# ``RECOMPILE_WARNING_LIMIT``, ``TRACER_ERRORS`` (what means "needs a concrete value")
# and ``call_site`` (the user's line). Not shared, because the concern differs: how hooks
# reach the host (NOTE [Host calls]), the cache (the backward's is process-wide, locked
# and keyed by graph structure; a step's is per function and keyed by its arguments) and
# so the stats and recompile reasons (call sites and nodes there, argument leaves here).
#
# NOTE [What a step is]
# A compiled call keeps its autograd graph inside the program: the tensors it returns
# carry no history. That is right for a step (a function that runs its own backward, or
# no autograd: an evaluation under ``no_grad``, an optimizer update, a forward whose
# results are only read), wrong for a forward whose caller backpropagates through its
# results. A ``Module`` is such a forward by what it is for, so ``xgrad.compile`` returns
# it as it is (as ``torch.compile(model)``; the compiled backward,
# ``xgrad.autograd.compiled``, speeds up its backward); any other callable is taken for
# a step. Call a function whose results are backpropagated through later uncompiled
# (their ``backward()`` would raise that they do not require grad).
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
# (``StepTrace.host_effect``), run at every call. Where nothing after it in the program
# reads or writes the optimizer's hyperparameter Tensors, calls the host, checks or
# observes (``opt.step(); sched.step()``, the common order), it runs after the program,
# on the Tensors it was given (a plateau scheduler's metric) as outputs, and the rates it
# sets are the next call's inputs: no host call in the program keeps JAX's fast dispatch
# (a small MLP step: 57 us, 1 ms with a host call, 133 us so, of which the scheduler's
# own Python is 85 us). Otherwise ``fn`` is traced again with the effect as one ordered
# host call at its place, the hyperparameter Tensors and the given ones holding their
# values then, and the rates it sets flow on in the program to an ``opt.step()`` after
# it. A module's mode: ``Module.__call__`` and ``train()``/``eval()`` tell the trace
# (``module_mode``); each module's mode before the trace is a guard (``Entry.modes``:
# ``eval()`` between calls is a miss, NOTE [Entries of one signature]), and a mode
# ``fn`` itself changed is set again after every call (``Entry.mode_writes``). A
# module's forward hooks and pre-hooks would run only while traced, and their results
# may carry autograd history into the step, which a host call cannot: unless all are
# marked ``pure_hook`` (traced in), the call is not compiled. A post-accumulate-grad
# hook returning a value raises PyTorch's error from the host, after all the leaf's hooks
# ran, as eagerly. A module attribute (or buffer) the trace set to a Tensor of its own
# would hold a tracer once the trace ends: the call is not compiled, naming it.
#
# NOTE [One trace at a time]
# A trace rebinds the state it touches to tracers until it ends. Two threads tracing one
# function at once would each snapshot the other's tracers as the "old" values and
# restore them: a tracer left in every parameter, and every later call, eager ones too,
# failing. So a compiled function traces under its own lock (``_trace_lock``: a miss,
# ``lower``, an observer variant): a thread that misses waits, looks the cache up again
# and hits the first thread's entry when it was of its signature. A trace that raises
# restores, besides the tensors it touched, the attributes of the modules it saw
# (``restore_modules``: a traced output, a buffer, a mode set on them is undone). Traces
# of different functions still run at once; they must not share state being traced (as
# eager steps in two threads must not race on one model).
#
# NOTE [Functions in a compiled step]
# A custom Function's backward is user Python, so it runs as a host hook does: one
# ordered host call at its point in the program, every call (``function_on_host``), under
# ``no_grad`` and the backward's host stand-in (``queue_callback`` works). The node itself
# runs there, as the engine runs it: ``ctx.saved_tensors`` unpacks at each access (unpack
# hooks, version checks, the unpacked tensors' places in the graph) from copies of the
# saved tensors made when traced, holding the call's values, as the ctx's own tensors and
# the saved tensors' originals do while it runs. A library's unpack hook (a checkpoint's
# recomputation reads the step's traced values) is traced in instead, and the copy hands
# out what it unpacked. Its results are validated as the engine validates them, so they
# come back with the shapes and dtypes of the inputs they flow into; the program's layout
# is fixed when traced, so a ``None`` for an input that requires grad raises, naming the
# fix. The step's state is the program's while it runs: a backward changing a state
# tensor's storage or ``.grad`` on the host (accumulating into parameters by a backward of
# its own) is undone and raises. What it raises is kept as a hook's is. Traced in
# instead: a backward marked ``pure_hook`` (its body then runs once per trace, as under
# ``jax.jit``), xgrad's own Functions (``Function._traced_in_step``: a reentrant
# checkpoint accumulates into the step's parameters, which a host call cannot), and any
# backward under a JAX transformation nested in ``fn``. Under ``create_graph`` a
# backward's graph must be recorded, which a host call cannot do: the step is not
# compiled.
#
# NOTE [Checks in a compiled step]
# Eager ops raise ``IndexError`` for an out-of-range index (``check_index_range`` in
# ``xgrad/ops/_util.py``); JAX would clamp a read and drop a write. Other checks of values
# (``check_values``: a BCE input outside [0, 1], an integer to a negative power) and an
# exception a host call raised (a hook, a final callback: kept on the host, its flag
# returned to the program) take the same road. While a step is traced, a check whose
# values are tracers of this trace becomes a ``Check``: a flag (the check fails), a detail
# for the message (the first bad entry), the error to raise (eager's; for a host call the
# user's own exception, as itself), and the state writes as they stand at that point of
# ``fn`` (what eager did before raising: a ``zero_grad()`` that ran, an in-place
# update). The program returns the flags as one vector; a call reads it (one small
# device-to-host copy, only for programs with checks) and, when a flag is set, applies
# the writes of the first failed check instead of the final ones and raises its error.
# Host hooks after a failed check are skipped (they see on the host whether one failed
# before them), so hooks run as eagerly: up to the failing op. Checks under a
# ``jax.jit``/``vmap`` nested in ``fn`` run at another trace level and are host
# callbacks, as under plain ``jax.jit`` (NOTE [Checks under jax.jit] in
# ``xgrad/ops/_util.py``).
# Reading the flags waits for the whole program, which would cost a loop that never waits
# on its steps JAX's asynchronous dispatch. So the common check, of indices the call was
# given as they are (targets, token ids), reached before any state but cleared grads
# changed and before any hook ran, is eager's own ``check_index_range`` on the host (a
# NumPy read on CPU), raising with the state eager leaves; a ``jax.Array`` that passed is
# not read again (``writeback.check_on_host``). A program without host calls is
# dispatched first and checked while it runs (a failed check drops its outputs: nothing
# was written back, no hook ran); one with hooks is checked before it is dispatched. Only
# the other checks need the flags.
#
# NOTE [Observer hooks]
# One host call costs ~170 µs on CPU, and a program with host calls leaves JAX's C++
# dispatch path, so hooks that only look at gradients (``norms.append(g.norm())``) would
# cost more than the step. A hook call that returns ``None`` and queues no callback
# changes nothing in the program: its effects on Python state are the same inside the
# program or after it (the state tensors hold their values from before the call either
# way, until the call writes back). So an entry whose host calls are all such hooks
# (final callbacks only if a hook queues one) and whose hooks all observed on its last
# call is traced once more (``step.stats()["variants"]``; ``fn``'s Python runs a second
# time for that signature) with ``rec.observing`` set: each hook call becomes its
# arguments as outputs of the program (``Observer``), and the variant has no host call.
# A call runs the variant, checks (a failed one: the exact program runs instead, and
# raises, no hook having run), then calls the hooks in program order on the outputs, in
# the calling thread, with a stand-in ``GraphTask`` each and grad mode off, as the engine
# runs a backward's hooks (the exact program's host calls too). If all observe again, the
# variant's writes and results are the call's. Once hook ``k`` returns a value, raises
# or queues a callback, the variant's outputs are dropped and the exact program runs with
# the first ``k + 1`` hook calls replayed from what they did (``HookBox.replay``), not
# called again, and the rest live: each hook runs once per call, and the call is the
# exact one, which then serves the entry until its hooks all observe again. What the
# hooks compute from their arguments (``g.norm()``) is computed in the variant as well,
# learned from their last run in the exact program (NOTE [Hook ops in the program] in
# ``hook_ops.py``). An entry with other host calls (a Function's backward,
# post-accumulate hooks, callbacks queued by traced code) always runs exactly.
# ``HookBox.lock`` keeps one call of an entry at a time in this bookkeeping.
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
