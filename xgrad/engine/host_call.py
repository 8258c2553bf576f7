"""Calls from a traced program to the host, in program order (NOTE [Host calls]).

# NOTE [Host calls]
# A hook, a Function's backward or a final callback that cannot be traced in runs on the
# host at its point of the program, at every call of it: one ordered ``io_callback``. One
# mechanism serves every route that traces the engine: ``xgrad.compile``'s step
# (``compile_step/host.py``) and the engine under a plain ``jax.jit`` (``compile_step/jax_hooks.py``).
# ``backward(compiled=True)`` needs none of it: it splits its program at such a call and runs that
# node between programs, on the real tensors, through eager's own code (NOTE [Compiled backward]).
#
# - ``call_on_host(fn, arrays, results)``: the call itself, on arrays. What runs on the host
#   at every call is ``fn`` and one ``try``: the flattening, the trees, the shapes and dtypes
#   a result must have are read once, when traced (``hook_on_host``), so a hook's call adds
#   ~20-40 µs of Python to JAX's own ordered ``io_callback`` (benchmarks/RESULTS.md, "One
#   host-call mechanism").
# - An exception keeps its type and message. Given ``errors`` (a list: a step that raises
#   after its program, with its state as eager leaves it), the exception is kept there, the
#   call returns ``unchanged``'s results and its flag is set. Without, the program is the
#   user's own ``jax.jit``: JAX would report any exception as its ``JaxRuntimeError``, so the
#   exception is kept under a token, the callback raises the token, and where JAX raises its
#   error for it the exception itself is raised (``jax_internals.reraise_host_errors``: where
#   the program is run, which is where the CPU backend reports it; a backend that reports it
#   only when a result is read gives JAX's error there, its message naming the exception).
# - ``skip``: a traced flag; set, the call is not made and ``unchanged``'s results come back:
#   eager would have raised before reaching it. Nor is it made once a host call before it in
#   the run raised: ``errors`` holds that exception until the step raises it (decided on the
#   host, no flag in the program); JAX stops a plain ``jax.jit``'s program at a raising call.
# - ``hook_on_host(hook, args)``: a hook on Tensors (a tensor hook, a node's pre- or post-hook, a
#   module's backward hooks). Its non-``None`` result replaces its first argument; a tuple
#   result may hold ``None`` for an entry, which then has no gradient, as eagerly: zeros in the
#   program, whose layout is fixed when traced. Given ``state``, it sees the tensors it may
#   read as eager would at that point (``xgrad.compile`` passes the state's ``.grad``s, a
#   retained one included, and the step's tensors the hook holds), and what it rebinds
#   there flows on in the program.
# - ``swapped_state(tensors, values)``: on the host, the real tensors hold the call's concrete
#   values while it runs and get their own back after, whatever it raised: the host call
#   leaves Python state as it found it, and what it changed flows on in the program.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xgrad.jax_internals import io_callback, reraise_host_errors
from xgrad.tensor import Tensor, is_tensor

__all__ = ["HostCallFailed", "call_on_host", "hook_on_host", "swapped_state"]

ERR_HOOK_CHANGED_STATE = (
    "under xgrad.compile, {who} cannot change a tensor (shape {shape}) that the step had not changed before it: it "
    "runs on the host, where that tensor is not part of the program. Change it in the step, mark a hook "
    "xgrad.autograd.compiled.pure_hook if it is traceable, or run this step eagerly"
)
ERR_HOOK_SET_GRAD = (
    "under xgrad.compile, {who} cannot set a .grad to None or set one that was None: it runs on the host, in a "
    "program whose state was laid out when it was traced. Zero it instead, or run this step eagerly"
)
_FALSE = np.bool_(False)
_TRUE = np.bool_(True)


class HostCallFailed(Exception):
    """Raised on the host in place of a host call's own exception under a plain ``jax.jit``: its token, the key under
    which that exception waits to be raised again by whoever runs the program (NOTE [Host calls])."""


_kept: dict[str, BaseException] = {}  # token -> the exception a host call raised, until JAX reports it
_KEPT_AT_MOST = 64  # exceptions JAX never reported (a program whose error was read elsewhere) are not kept forever
_kept_lock = threading.Lock()
_tokens = itertools.count()


def _original(error: BaseException) -> BaseException | None:
    """The exception a host call raised behind JAX's ``error``, taken out of ``_kept``; ``None`` if none is."""
    text = str(error)
    with _kept_lock:
        for token in [t for t in _kept if t in text]:
            return _kept.pop(token)
    return None


reraise_host_errors(_original)


def _keep(exc: BaseException) -> HostCallFailed:
    token = f"<xgrad host call {next(_tokens)}>"
    with _kept_lock:
        _kept[token] = exc
        if len(_kept) > _KEPT_AT_MOST:
            del _kept[next(iter(_kept))]
    return HostCallFailed(token)


def call_on_host(
    fn: Callable[..., Sequence[Any]], arrays: Sequence[Any], results: Sequence[jax.ShapeDtypeStruct], *,
    unchanged: Callable[..., Sequence[Any]] | None = None, skip: Any = None, errors: list[BaseException] | None = None,
    report: Callable[[], bool] | None = None, when: Any = None,
) -> tuple[tuple[Any, ...], Any, Any]:
    """``fn(*arrays)`` on the host at this point of the traced program, in program order, at every call of it.

    ``fn`` gets the arrays' concrete values and returns one value per entry of ``results``
    (their shapes and dtypes: what the program continues with). ``unchanged`` (same
    signature; default: zeros of ``results``) stands in for ``fn`` where the call is not
    made: when ``skip`` (a traced flag, or ``None``) is set, or a host call before it in
    this run raised; or when ``when`` (a traced flag, or ``None``) is unset, where the
    call sits under a ``lax.cond`` and the host is not called at all. With ``errors`` (a
    list), an exception ``fn`` raises is appended there and ``unchanged``'s results come
    back; without, it reaches the caller of the program with its own type. ``report``,
    called on the host after ``fn``, says something the program reads back (``False``
    where ``fn`` was not called).

    Returns the results, a traced flag set when ``fn`` raised (``None`` without ``errors``:
    a step raises ``errors[0]`` after its program when it is set) and ``report``'s traced
    flag (``None`` without ``report``).
    """
    results = tuple(results)
    if unchanged is None:
        zeros = tuple(np.zeros(r.shape, r.dtype) for r in results)

        def unchanged(*_: Any) -> Sequence[Any]:
            return zeros

    tail = (() if errors is None else (_FALSE,)) + (() if report is None else (_FALSE,))

    def host(skipped: Any, *concrete: Any) -> tuple[Any, ...]:
        if skipped or errors:
            return (*unchanged(*concrete), *tail)
        try:
            out = fn(*concrete)
        except BaseException as exc:  # the user's, whatever it is: it reaches them with its own type
            if errors is None:
                raise _keep(exc) from exc
            errors.append(exc)
            return (*unchanged(*concrete), _TRUE, *tail[1:])
        if report is None:
            return (*out, *tail)
        return (*out, *tail[:-1], np.bool_(report()))

    flag = jax.ShapeDtypeStruct((), np.bool_)
    shapes = (*results, *(flag for _ in tail))
    skipped = jnp.bool_(False) if skip is None else skip

    def called(*traced: Any) -> tuple[Any, ...]:
        return tuple(io_callback(host, shapes, skipped, *traced, ordered=True))

    if when is None:
        outs = called(*arrays)
    else:
        outs = jax.lax.cond(when, called, lambda *traced: (*unchanged(*traced), *tail), *arrays)
    values, flags = outs[: len(results)], iter(outs[len(results):])
    return values, None if errors is None else next(flags), None if report is None else next(flags)


def hook_on_host(
    hook: Callable[..., Any], args: tuple[Any, ...], *, call: Callable[..., Any] | None = None,
    state: Sequence[tuple[Tensor, Any, Any]] = (), who: str | None = None, **how: Any
) -> tuple[Any, Any, Any]:
    """``hook(*args)`` (Tensors, tuples of them and other values) on the host, where it is reached in the program.

    Its non-``None`` result replaces ``args[0]``, as the engine replaces a hook's argument;
    a tuple result may hold ``None`` for an entry (no gradient there, as eagerly: zeros), or
    a Tensor of another dtype (cast, as eagerly). ``call(hook, args, arrays)`` calls it on the
    host (default: ``hook(*args)``; ``arrays``: the concrete arrays of its Tensors, in order).
    ``how``: ``skip``, ``errors``, ``report`` and ``when``, as for ``call_on_host``. ``state``: tensors
    the hook may read, each with the traced array it holds at this point (``None``: its own)
    and the traced array of its ``.grad`` (``None``: no ``.grad``); on the host they hold
    those values while the hook runs (``swapped_state``), and what it rebinds there flows on
    in the program: the tensors hold it when this returns. It may not rebind an array given
    as its own, nor set a ``.grad`` to ``None`` or one that was ``None`` (its errors name it
    ``who``, default ``hook <hook>``). ``xgrad.compile`` runs a final callback or an effect
    through it too, with no Tensor arguments, for ``state``.
    Returns ``args[0]`` replaced and ``call_on_host``'s two flags.
    """
    tree: Any  # PyTreeDefs, compared with ``==``
    slot_tree: Any
    leaves, tree = jax.tree_util.tree_flatten(args, is_leaf=is_tensor)
    at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor)]
    # The first argument's entries, ``None`` ones too (a gradient that is not defined): what a result must match.
    slots, slot_tree = jax.tree_util.tree_flatten(args[0], is_leaf=_slot)
    if not all(_slot(x) for x in slots):
        raise TypeError(f"hook {hook!r} is called on {args[0]!r}, whose entries must be Tensors or None")
    # What each Tensor of the first argument (they lead ``leaves``) must be replaced with, read now: on the host,
    # a tracer's shape costs more than the call's own work.
    expected = [None if x is None else (x._array.shape, x._array.dtype) for x in slots]
    shapes = [jax.ShapeDtypeStruct(*e) for e in expected if e is not None]
    n_first = len(shapes)
    # Arguments that are Tensors alone (a tensor hook's ``(grad,)``): no tree to rebuild on the host.
    flat = len(at) == len(leaves) and tree == jax.tree_util.tree_structure(tuple(leaves), is_leaf=is_tensor)
    call = call or _call
    arrays = [leaves[i]._array for i in at]
    n_args = len(arrays)
    arrays += [a for _, array, grad in state for a in (array, grad) if a is not None]
    shown = [(t, array is not None, grad is not None) for t, array, grad in state]
    kept = [None if isinstance(leaf, Tensor) else leaf for leaf in leaves]  # the program keeps ``host``: no tracers

    def host(*concrete: Any) -> tuple[Any, ...]:
        if not shown:
            return host_args(*concrete)
        rest = iter(concrete[n_args:])
        held = [(next(rest) if sent else t._array, next(rest) if has_grad else None) for t, sent, has_grad in shown]
        new: list[Any] = []
        with swapped_state([t for t, _, _ in shown], held):
            out = host_args(*concrete[:n_args])
            for (t, sent, has_grad), (before, _) in zip(shown, held, strict=True):
                if sent:
                    new.append(t._array)
                elif t._array is not before:
                    raise RuntimeError(ERR_HOOK_CHANGED_STATE.format(who=who or f"hook {hook!r}", shape=list(t.shape)))
                if (t._grad is not None) != has_grad:
                    raise RuntimeError(ERR_HOOK_SET_GRAD.format(who=who or f"hook {hook!r}"))
                if has_grad:
                    new.append(t._grad._array)  # type: ignore[union-attr]
        return (*out, *(n if n.dtype == c.dtype else n.astype(c.dtype) for n, c in zip(new, concrete[n_args:], strict=True)))

    def host_args(*concrete: Any) -> tuple[Any, ...]:
        tensors = [Tensor(value if isinstance(value, jax.Array) else jnp.asarray(value)) for value in concrete]
        if flat:
            given: Any = tensors
        else:
            given = list(kept)
            for i, t in zip(at, tensors, strict=True):
                given[i] = t
            given = jax.tree_util.tree_unflatten(tree, given)
        result = call(hook, given, [t._array for t in tensors])
        if result is None:
            return concrete[:n_first]
        r_slots, r_tree = jax.tree_util.tree_flatten(tuple(result) if isinstance(result, list) else result, is_leaf=_slot)
        if r_tree != slot_tree:
            raise RuntimeError(f"hook {hook!r} returned a value shaped {r_tree}, but it replaces {slot_tree}")
        out = []
        for r, e in zip(r_slots, expected, strict=True):
            if e is None:
                continue  # no gradient there, and the program has none to replace
            shape, dtype = e
            if r is None:  # no gradient from here on: as zeros, for a program laid out when traced
                out.append(np.zeros(shape, dtype))
            elif isinstance(r, Tensor) and r._array.shape == shape:
                out.append(r._array if r._array.dtype == dtype else r._array.astype(dtype))
            else:
                raise RuntimeError(
                    f"hook {hook!r} returned {r!r} where a Tensor of shape {list(shape)} (or None) replaces a gradient"
                )
        return tuple(out)

    def unchanged(*concrete: Any) -> tuple[Any, ...]:
        return (*concrete[:n_first], *concrete[n_args:])

    shapes += [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays[n_args:]]
    outs, raised, reported = call_on_host(host, arrays, shapes, unchanged=unchanged, **how)
    new = iter(outs)
    replaced = [None if e is None else Tensor(next(new)) for e in expected]
    for t, sent, has_grad in shown:  # what the hook left in the state flows on in the program
        if sent:
            t._array = next(new)
        if has_grad:
            t._grad = Tensor(next(new))
    return jax.tree_util.tree_unflatten(slot_tree, replaced), raised, reported


def _slot(x: Any) -> bool:
    return x is None or isinstance(x, Tensor)


def _call(hook: Callable[..., Any], args: tuple[Any, ...], _arrays: Any) -> Any:
    return hook(*args)


@contextlib.contextmanager
def swapped_state(tensors: Sequence[Tensor], values: Sequence[tuple[Any, Any] | None]) -> Iterator[list[Tensor]]:
    """On the host: ``tensors`` hold ``values`` (each ``(array, grad array or None)``, or ``None``: its own) while the
    block runs.

    After it, whatever it raised, each tensor gets back its own array, ``.grad`` (and that
    one's array) and version: a host call leaves the Python state as it found it
    (NOTE [Host calls]); the block reads what it changed before it ends. The list it is
    given then holds the tensors whose array or ``.grad`` the block changed.
    """
    saved = [(*_storage(t), t._version) for t in tensors]
    for t, value in zip(tensors, values, strict=True):
        if value is not None:
            t._array = value[0]
            t._grad = None if value[1] is None else Tensor(value[1])
    held = [_storage(t) for t in tensors]
    changed: list[Tensor] = []
    try:
        yield changed
    finally:
        for t, (array, grad, grad_array, version), before in zip(tensors, saved, held, strict=True):
            if any(x is not y for x, y in zip(_storage(t), before, strict=True)):
                changed.append(t)
            t._array = array
            t._grad = grad
            if grad is not None:
                grad._array = grad_array
            t._version = version


def _storage(t: Tensor) -> tuple[Any, Any, Any]:
    """What a host call leaves as it found it on a tensor: its array, its ``.grad`` and that one's array."""
    grad = t._grad
    return t._array, grad, None if grad is None else grad._array
