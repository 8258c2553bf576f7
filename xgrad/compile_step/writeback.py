"""A traced step's outputs and where they go: the state it wrote, its results (NOTE [Whole-step compile], 2)."""

from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from xgrad.compile_step.errors import NotCompilable
from xgrad.compile_step.recording import target_key
from xgrad.engine.node import sharding_of
from xgrad.ops._util import IndexOutOfRangeError, check_index_range
from xgrad.tensor import Tensor, is_tensor

if TYPE_CHECKING:
    from xgrad.compile_step.intercept import Recorder

# Index arrays that passed a range check, by (id, size, negative, ignore): a jax.Array cannot
# change, so a check it passed need not run again. The weak reference tells a live array
# from a later one with the same id, and its callback drops the entry when the array dies.
_passed: dict[tuple[int, int, bool, int | None], weakref.ref[Any]] = {}


def check_on_host(host_checks: Any, leaves: list[Any]) -> None:
    """Eager's range checks of argument indices (NOTE [Checks in a compiled step]); raise as eager would."""
    for leaf, size, message, negative, ignore, writes in host_checks:
        index = leaves[leaf]
        if isinstance(index, Tensor):
            index = index._array
        key = (id(index), size, negative, ignore)
        ref = _passed.get(key)
        if ref is not None and ref() is index:
            continue
        try:
            check_index_range(index, size, message, negative, ignore)
        except IndexOutOfRangeError:
            apply_writes(writes, (), leaves)  # the state as eager leaves it when the op raises
            raise
        if isinstance(index, jax.Array):
            _passed[key] = weakref.ref(index, lambda _, key=key: _passed.pop(key, None))  # type: ignore[misc]


def remove_added_hooks(recorder: Recorder) -> str | None:
    """Take out the hooks the trace registered (a call's own effects are the program's).

    Returns the line that registered one that stayed on a tensor or node outliving the
    call: eager adds one more such hook every call, which one program cannot do.
    """
    kept = None
    for hooks_ref, handle_id, site, outlives in recorder.added_hooks:
        hooks = hooks_ref()
        if hooks is not None and hooks.pop(handle_id, None) is not None and outlives and kept is None:
            kept = site
    return kept


def resolve_target(target: Any, leaves: list[Any]) -> Any:
    """The tensor a target names at this call (``Snapshot.target``), ``None`` if it is gone."""
    if type(target) is int:
        return leaves[target]
    if type(target) is tuple:
        owner = resolve_target(target[1], leaves)
        return None if owner is None else owner._grad
    return target()


def source_value(target: Any, leaves: list[Any]) -> Any:
    t = resolve_target(target, leaves)
    if t is None:
        raise RuntimeError("xgrad.compile: a tensor the program reads was freed (internal error: please report it)")
    return t._array


def collect_outputs(recorder: Recorder, result: Any) -> tuple[Any, ...]:
    """Inside the trace, after ``fn``: where each of ``recorder.outputs`` goes (NOTE [Whole-step compile], 2)."""
    leaves, result_tree = jax.tree_util.tree_flatten(result, is_leaf=is_tensor)
    returned = [_returned(leaf) for leaf in leaves]
    del result, leaves
    writes = state_writes(recorder, "the end of the compiled function")
    # Arguments are keyed by the signature, grads by their owner.
    guards = [
        (snap.ref, key in recorder.read_grads) for key, snap in recorder.snapshots.items()
        if snap.ref() is not None and type(snap.target) is weakref.ref
    ]
    template: list[Any] = []
    for ref, value, grad in returned:
        t = ref() if ref is not None else None
        if t is not None and id(t) in recorder.snapshots:
            template.append(("same", recorder.snapshots[id(t)].target, None))
        elif ref is not None:
            template.append(("out", recorder.output(value), None if grad is None else recorder.output(grad)))
        elif isinstance(value, (jax.Array, jax.core.Tracer)):
            template.append(("array", recorder.output(value), None))
        else:
            template.append(("static", value, None))
    checks = tuple(
        (c.make_error, None if c.detail is None else recorder.output(c.detail), c.writes) for c in recorder.checks
    )
    flags = recorder.output(jnp.stack([c.failed for c in recorder.checks])) if checks else None
    return writes, template, result_tree, guards, checks, flags, tuple(recorder.host_checks)


def _returned(leaf: Any) -> tuple[Any, Any, Any]:
    """A leaf ``fn`` returned: a weak reference to it if it is a Tensor, its array (or itself), its ``.grad``'s array."""
    if not isinstance(leaf, Tensor):
        return None, leaf, None
    return weakref.ref(leaf), leaf._array, None if leaf._grad is None else leaf._grad._array


def state_writes(recorder: Recorder, site: str) -> list[Any]:
    """How the state tensors differ from their snapshots now: what a call writes back (NOTE [Whole-step compile], 2).

    Each write is ``(target, what, value, version_delta)``; ``value`` is an output
    position (``None`` for a ``.grad`` set to ``None``), or the new ``requires_grad``.
    """
    writes: list[Any] = []
    for key, snap in recorder.snapshots.items():
        t = snap.ref()
        if t is None:
            continue
        array = t._array
        grad = t._grad
        if t.grad_fn is not snap.grad_fn:
            raise NotCompilable(
                f"an in-place op gave a tensor from outside the function (shape {list(array.shape)}) autograd history, "
                "which cannot leave the program", site,
            )
        if array is not snap.start:
            writes.append((snap.target, "array", recorder.output(_laid_out(array, snap.array)), t._version - snap.version))
        # A ``.grad`` set to ``None`` is written even if it was ``None`` when traced: unless
        # the trace read it, a call may find it set (``zero_grad()`` before a step's first backward).
        if grad is not snap.grad or (grad is None and key in recorder.grad_written):
            if grad is not None and grad.grad_fn is not None:
                raise NotCompilable(
                    "a .grad with autograd history (backward(create_graph=True)) cannot leave the program; use "
                    "autograd.grad(..., create_graph=True) inside the function instead", site,
                )
            writes.append((snap.target, "grad", None if grad is None else recorder.output(_laid_out(grad._array, snap.array)), 0))
        if t._requires_grad != snap.requires_grad:
            writes.append((snap.target, "requires_grad", t._requires_grad, 0))
    return writes


def _laid_out(value: Any, start: Any) -> Any:
    """A written value laid out as its tensor's array when the trace began (``start``), if that spans several devices:
    eager's in-place updates and ``.grad``s keep it, where XLA left alone may pick another (a replicated ``.grad`` of a
    sharded weight, N times the memory)."""
    sharding = sharding_of(start)
    if sharding is None or len(sharding.device_set) == 1:
        return value
    return jax.lax.with_sharding_constraint(value, sharding)


def apply_writes(writes: list[Any], outs: Any, leaves: list[Any]) -> None:
    """Rebind the state a call changed, on the same tensor objects."""
    for target, what, index, version_delta in writes:
        t = target() if type(target) is weakref.ref else resolve_target(target, leaves)
        if t is None:
            continue
        if what == "array":
            t._array = outs[index]
            t._version += version_delta
        elif what == "grad":
            t._grad = None if index is None else Tensor._from_program(outs[index])
        else:  # requires_grad
            t._requires_grad = index


def sort_writes(writes: list[Any]) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """``writes`` as ``apply_final_writes`` takes them, each one's kind decided once instead of at every call.

    The arrays of tensors held by weak references whose version the write moves, as
    ``(ref, output, version delta)``, and the others as ``(ref, output)``; such tensors'
    ``.grad``s as ``(ref, output)``; and ``writes`` themselves when any other write is
    among them (then they are applied in their order, by ``apply_writes``).
    """
    if not all(type(target) is weakref.ref and what in ("array", "grad") for target, what, _, _ in writes):
        return [], [], [], writes
    arrays = [(target, index, delta) for target, what, index, delta in writes if what == "array"]
    grads = [(target, index) for target, what, index, _ in writes if what == "grad"]
    return [a for a in arrays if a[2]], [(target, index) for target, index, delta in arrays if not delta], grads, []


def apply_final_writes(writes: tuple[list[Any], list[Any], list[Any], list[Any]], outs: Any, leaves: list[Any]) -> None:
    """A call's final writes as ``sort_writes`` made them: every step, once per state tensor."""
    versioned, unversioned, grads, in_order = writes
    for ref, index, version_delta in versioned:
        t = ref()
        if t is not None:
            t._array = outs[index]
            t._version += version_delta
    for ref, index in unversioned:
        t = ref()
        if t is not None:
            t._array = outs[index]
    made = Tensor._from_program
    for ref, index in grads:
        t = ref()
        if t is not None:
            t._grad = None if index is None else made(outs[index])
    if in_order:
        apply_writes(in_order, outs, leaves)


# NOTE [Donated state]
# PyTorch's step updates parameters, optimizer state, accumulated ``.grad``s and buffers
# in place: the old and new values never coexist. A compiled step gets the same by
# donating (``jax.jit(donate_argnums=...)``) each input array that the call replaces,
# so XLA may write the new values into the old ones' memory (it pairs donated inputs
# with outputs of their shape and dtype). An input is donated when the program replaces
# one tensor's array (or ``.grad``) with an output of its shape and dtype, at its end and
# at every check (a failed check writes the state as it stood then: a tensor it leaves
# alone keeps its old array, which must still exist), and never in an observer variant
# (its outputs may be dropped for the exact program, which reads the same inputs) nor in
# a program with host calls. Calls that donate hold one lock from reading their inputs
# to writing back: another thread's call would read an array already donated (eager
# steps racing on one model read stale values; they must not crash). A host call may
# run a step of its own, which would wait on that lock forever.
# Arguments' own index checks then run before the program, not while it runs, and so
# do the program's checks when they read no state (targets viewed as a flat vector, as
# nanoGPT's are): as a program of their own, whose failure runs the program donating
# nothing for the state the check leaves. Then the checks do not hold donation back.
#
# A donated array must be one nobody else can see: the user may hold it (``w.array``, a
# ``jax.Array`` taken before the step, a ``detach()`` sharing it, an old ``.grad`` Tensor
# the call replaces). So each call counts references and passes a copy in place of one
# held elsewhere: the copy is consumed and the user's array lives on, at the memory a
# step without donation takes anyway. Two inputs that are distinct ``jax.Array``
# objects over one buffer are caught by their buffers' addresses; XLA itself does not
# donate a buffer NumPy views (``np.asarray(w.array)`` on CPU). What neither sees: a
# twin ``jax.Array`` the user made outside the step (``jax.device_put`` of ``w.array``
# to the device it is on), which the step consumes as ``jax.jit`` would.
#
# A ``.grad`` the program replaces without reading it (``zero_grad()`` first, PyTorch's
# ``set_to_none`` default) is let go of before the program runs, on the same condition,
# as PyTorch frees it at ``zero_grad()``: old and new grads never coexist either.
#
# Reading a buffer's address waits for the program that makes it, which would make every
# call wait for the last one. So a call whose donated inputs are all, by identity, the
# outputs that replaced them at the program's last call (weak references, ``Entry.fresh``)
# reads none: the outputs of one execution are distinct buffers (XLA shares none but a
# donated input's, and a program that forwards an input as an output keeps no such
# references), and a twin made since is another object. And JAX pairs donated inputs
# with outputs by shape and dtype in order, not by which output replaces which input: the
# program returns the outputs that replace donated inputs first, in the inputs' order
# (``donating_program`` in ``program_call.py``), or a parameter's buffer would take its
# ``.grad`` and XLA would copy what it still reads of the old values.


def _refcount_base(holders: int) -> int:
    """``sys.getrefcount`` of a local variable whose value ``holders`` more references hold (and nothing else)."""
    value = object()
    held = [[value] for _ in range(holders)]
    count = sys.getrefcount(value)
    del held
    return count


#: ``sys.getrefcount`` of an input in ``own_donated`` held by its tensor and the inputs alone, and of an old ``.grad``
#: Tensor held by its owner alone.
_HELD_BY_TENSOR_AND_INPUTS = _refcount_base(2)
_HELD_BY_OWNER = _refcount_base(1)


def _replaced(writes: list[Any]) -> dict[Any, tuple[int | None, bool]]:
    """What ``writes`` replace, by their sources' keys (``target_key``): the output replacing each
    (``None``: a ``.grad`` set to ``None``), and whether it comes as a new ``.grad`` Tensor."""
    replaced: dict[Any, tuple[int | None, bool]] = {}
    for target, what, index, _ in writes:
        if what == "array":
            replaced[target_key(target)] = (index, False)
        elif what == "grad":
            replaced[target_key(("grad", target))] = (index, True)
    return replaced


def donation(
    writes: list[Any], checks: tuple[Any, ...], sources: list[Any], in_avals: list[Any], out_avals: list[Any],
) -> tuple[tuple[tuple[int, Any, bool, int], ...], tuple[Any, ...]]:
    """The inputs a call donates and the ``.grad``s it drops before the program runs (NOTE [Donated state]).

    ``sources``: each input's one source (``Snapshot.target``), ``None`` for an input
    that is no tensor's alone (a constant, an array several tensors share, a plain array
    argument). Returns ``(position, source, whether the .grad Tensor is replaced, the output replacing it)``
    for each donated input, and the targets whose ``.grad`` the program replaces without reading it.
    """
    replaced = _replaced(writes)
    for _, _, check_writes in checks:
        at_check = _replaced(check_writes)
        replaced = {key: value for key, value in replaced.items() if key in at_check}
    donated = []
    read = set()
    taken = set()  # an output goes into one donated input's memory at most (JAX warns of a donation left unused)
    for position, (source, aval) in enumerate(zip(sources, in_avals, strict=True)):
        key = None if source is None else target_key(source)
        read.add(key)
        index, new_tensor = replaced.get(key, (None, False))
        if index is not None and index not in taken and (out_avals[index].shape, out_avals[index].dtype) == (aval.shape, aval.dtype):
            taken.add(index)
            donated.append((position, source, new_tensor and type(source) is tuple, index))
    dropped = tuple(
        target for target, what, _, _ in writes
        if what == "grad" and target_key(("grad", target)) in replaced and target_key(("grad", target)) not in read
    )
    return tuple(donated), dropped


def own_donated(
    donated: tuple[tuple[int, Any, bool, int], ...], inputs: list[Any], leaves: list[Any], fresh: list[Any],
) -> None:
    """Put a copy in ``inputs`` in place of each donated array held by someone besides its tensor and ``inputs`` (or, a
    ``.grad`` the call gives a new Tensor, whose old Tensor someone besides its owner holds), and of each sharing an
    earlier one's buffer (NOTE [Donated state]).

    ``fresh``: ``Entry.fresh``; while every input is still the one it names, no buffer is read.
    """
    stale = len(fresh) != len(donated)
    getrefcount = sys.getrefcount
    for k, (position, source, new_tensor, _) in enumerate(donated):
        array = inputs[position]
        if not stale and fresh[k]() is not array:
            stale = True
        if getrefcount(array) > _HELD_BY_TENSOR_AND_INPUTS:
            inputs[position] = array.copy()
        elif new_tensor:
            grad = resolve_target(source, leaves)
            if getrefcount(grad) > _HELD_BY_OWNER:
                inputs[position] = array.copy()
            del grad
        del array
    if stale:  # a copy made above has a buffer of its own, which no other input shares
        buffers = set()
        for position, _, _, _ in donated:
            buffer = _buffer_of(inputs[position])
            if buffer in buffers:
                inputs[position] = inputs[position].copy()
            else:
                buffers.add(buffer)


def drop_grads(targets: tuple[Any, ...], leaves: list[Any]) -> None:
    """Let go of the ``.grad``s a call replaces unread, before its program runs (NOTE [Donated state])."""
    for target in targets:
        owner = target() if type(target) is weakref.ref else resolve_target(target, leaves)
        if owner is not None:
            owner._grad = None


def _buffer_of(array: jax.Array) -> int:
    """Where ``array``'s memory (its first shard's, if sharded) starts: two ``jax.Array`` objects may share it."""
    if len(array.sharding.device_set) == 1:
        return int(array.unsafe_buffer_pointer())
    return int(array.addressable_data(0).unsafe_buffer_pointer())
