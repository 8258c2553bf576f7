"""How ``xgrad.func``'s transforms run: as one op of xgrad's graph when they are given or read tensors with
history (NOTE [Transforms keep history]), and as one cached program per signature (NOTE [Transforms cached per
signature])."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import jax
from jax.experimental import checkify

from xgrad import generator, step_trace
from xgrad.bounded_cache import BoundedCache
from xgrad.engine import engine_ops
from xgrad.engine.saved import disable_saved_tensors_hooks
from xgrad.func_state import TRACING_CACHED
from xgrad.grad_mode import is_grad_enabled, stops_gradients
from xgrad.jax_internals import (
    ClosedJaxpr,
    check_consts_keep_identity,
    get_opaque_trace_state,
    jaxpr_as_fun,
)
from xgrad.ops._util import checks_as_values
from xgrad.reach import reached
from xgrad.step_trace import array_of
from xgrad.tensor import Tensor, is_tensor


def arrays_of_tree(tree: Any) -> Any:
    """``tree`` with each Tensor replaced by its array."""
    return jax.tree_util.tree_map(lambda x: array_of(x) if isinstance(x, Tensor) else x, tree, is_leaf=is_tensor)


def has_history(tree: Any) -> bool:
    return any(
        isinstance(x, Tensor) and (x.requires_grad or x.grad_fn is not None)
        for x in jax.tree_util.tree_leaves(tree, is_leaf=is_tensor)
    )


# NOTE [Transforms keep history]
# ``torch.func``'s transforms compose with autograd: ``vmap(jacrev(f))(x)`` on an ``x``
# that requires grad gives a result that ``backward()`` differentiates (a force term in a
# loss, a MAML inner step). Called with grad mode on and a Tensor that requires grad (or
# has history) among its arguments or among the tensors the function reads from outside
# (a module's parameters it closes over, as torch.func's Lennard-Jones example's energy
# does), a transform here runs as one op of xgrad's graph over those tensors
# (``engine_ops.jax_function``): its result keeps the history, and its backward is JAX's
# vjp of the transformed function. A tensor read from outside is found among what the
# function reaches (``_reached``) as a constant of one abstract trace of it, and is an
# input of the op: while the op's function runs, that tensor holds the op's input (as
# ``functional_call`` swaps a module's parameters). The transform's own differentiation
# still treats it as a constant, as torch.func's does.
class _Reads:
    """Per transform: the modules and tensors its function reaches (found at the first call), and per
    signature the tensors with history one trace of it read from outside (NOTE [Transforms keep history])."""

    __slots__ = ("found", "reach")

    def __init__(self) -> None:
        self.reach: list[Any] = []
        self.found: BoundedCache[Any, tuple[weakref.ref[Tensor], ...]] = BoundedCache(_CACHE_SIZE)


def _closed_over_history(transformed: Callable[..., Any], reads: _Reads, run: Callable[..., Any],
                         given: list[Tensor], leaves: list[Any], tree: Any) -> list[Tensor]:
    """The tensors with history that ``transformed`` reads without being given them (NOTE [Transforms keep
    history]); per signature, as the cached transforms trace (Python in the function runs when it is traced)."""
    if not reads.reach:
        reads.reach.extend(_reached(transformed))
    candidates = {k: t for k, t in _candidates(*reads.reach).items() if t.requires_grad or t.grad_fn is not None}
    for t in given:
        candidates.pop(id(t._array), None)
    if not candidates:
        return []
    sig = _signature(leaves)
    key = None if sig is None else (tree, sig, _modes(reads.reach[0]), tuple(id(t) for t in candidates.values()))
    known = None if key is None else reads.found.get(key)
    if known is not None:
        lifted = [ref() for ref in known]
        if all(t is not None for t in lifted):
            return lifted  # type: ignore[return-value]

    def traced(key_data: Any, *arrays: Any) -> Any:
        with generator.default_key_threaded(key_data):  # its random ops draw from a traced key: the generator stays
            return run(*arrays)

    try:
        closed = jax.make_jaxpr(traced)(generator.default_key_data(), *[t._array for t in given])
    except Exception:  # a function that needs concrete values: every candidate is an input (unread ones get zeros)
        return list(candidates.values())
    found = {id(c): candidates[id(c)] for c in closed.consts if id(c) in candidates and candidates[id(c)]._array is c}
    if key is not None:
        reads.found[key] = tuple(weakref.ref(t) for t in found.values())
    return list(found.values())


def keeps_history(transformed: Callable[..., Any]) -> Callable[..., Any]:
    reads = _Reads()

    @functools.wraps(transformed)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_grad_enabled():
            out = transformed(*args, **kwargs)
            # ``no_grad`` entered inside an outer transform's function: its AD sees a constant, as for any op there
            if stops_gradients(arrays_of_tree(jax.tree_util.tree_leaves((args, kwargs), is_leaf=is_tensor))):
                out = jax.tree_util.tree_map(
                    lambda t: Tensor(jax.lax.stop_gradient(t._array)) if isinstance(t, Tensor) else t, out, is_leaf=is_tensor
                )
            return out
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs), is_leaf=is_tensor)
        positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, Tensor)]
        given = [leaves[i] for i in positions]
        lifted: list[Tensor] = []
        out_tree: list[Any] = []

        def of_arrays(*arrays: Any) -> tuple[Any, ...]:
            inner = list(leaves)
            for i, a in zip(positions, arrays[: len(positions)], strict=True):
                inner[i] = Tensor(a)
            held = [t._array for t in lifted]
            for t, a in zip(lifted, arrays[len(positions):], strict=True):
                t._array = a  # what the function reads from outside is this op's input while it runs
            try:
                call_args, call_kwargs = jax.tree_util.tree_unflatten(tree, inner)
                out, structure = jax.tree_util.tree_flatten(arrays_of_tree(transformed(*call_args, **call_kwargs)))
            finally:
                for t, a in zip(lifted, held, strict=True):
                    t._array = a
            out_tree.append(structure)
            return tuple(out)

        if get_opaque_trace_state(convention="xgrad") == _NOT_TRACING and step_trace.current() is None:
            lifted.extend(_closed_over_history(transformed, reads, of_arrays, given, leaves, tree))
        if not lifted and not has_history((args, kwargs)):
            return transformed(*args, **kwargs)
        outs = engine_ops.jax_function(of_arrays, [*given, *lifted])
        return jax.tree_util.tree_unflatten(out_tree[-1], list(outs))

    return wrapper


# NOTE [Transforms cached per signature]
# Traced afresh at every call, ``vmap(grad(loss))(params, x, y)`` costs far more than it
# computes. Called from outside any JAX trace and any ``xgrad.compile`` step, ``grad``,
# ``grad_and_value``, ``vmap``, ``jacrev``, ``jacfwd`` and ``hessian`` run one jitted
# program per signature instead, as ``jax.jit`` does. The signature is the arguments'
# pytree structure, their arrays' shapes and dtypes, the values of their other leaves,
# and the ``training`` flags of the modules the function reaches (through closures, defaults,
# ``functools.partial``, a bound ``self`` and the globals its code loads: NOTE [What a
# function reaches]).
# Staleness follows ``xgrad.compile``: a constant of the trace that is a tensor's array
# (a module's buffer, a closed-over weight) is read from that tensor at every call, so
# an optimizer step or an in-place update is seen, and one of another shape or dtype
# traces again. The tensor behind a constant is found by its array among what the function
# reaches: tensors in its closures, defaults and the globals it loads (and the containers
# among those, not other objects' attributes), and the modules' parameters,
# buffers and tensor attributes, looked for when the transform is first called.
# A Python name rebound to another Tensor object is not seen, as with ``jax.jit``, and
# Python in the function runs when it is traced, not at every call. A function that
# needs concrete values (``.item()`` of an argument) runs as before, traced at every
# call. The default generator's key is an input and an output of the program, so
# random ops without ``key=`` draw afresh at every call, as torch.func's do. A check of
# values (an index in range) is a ``checkify`` check of the program; when one fails, the
# call runs again uncached, which raises eager's error.
_NOT_TRACING = get_opaque_trace_state(convention="xgrad")  # the same in every thread outside any JAX trace
_RUN_UNCACHED = object()  # an entry for a signature whose trace needed concrete values
_CHECK_FAILED = object()  # what ``_run`` returns when a check of values failed in the program
_CACHE_SIZE = 64


class _Entry:
    """One signature's program and how its inputs and outputs map to Tensors."""

    __slots__ = ("consts", "draws", "dyn", "jitted", "n_out", "out_static", "out_tensors", "out_tree", "sources", "written")

    def __init__(self) -> None:
        self.consts: list[Any] = []
        self.sources: list[tuple[int, weakref.ref[Tensor]]] = []  # a const read from this tensor at every call
        self.dyn: list[int] = []  # the argument leaves that are program inputs
        self.out_tree: Any = None
        self.out_static: list[Any] = []  # the output leaves, the Tensors among them as placeholders
        self.out_tensors: list[int] = []
        self.n_out = 0
        self.written: list[int] = []  # argument leaves the function wrote in place
        self.draws = False
        self.jitted: Any = None


def _signature(leaves: list[Any]) -> tuple[Any, ...] | None:
    """The cache key of these argument leaves; ``None`` when a leaf is traced or unhashable."""
    sig: list[Any] = []
    for leaf in leaves:
        array = leaf._array if isinstance(leaf, Tensor) else leaf
        if isinstance(array, jax.Array):
            if isinstance(array, jax.core.Tracer):
                return None
            sig.append((isinstance(leaf, Tensor), array.shape, array.dtype, array.weak_type))
            continue
        try:
            hash(leaf)
        except TypeError:
            return None
        sig.append((type(leaf), leaf))
    return tuple(sig)


def _reached(fn: Any) -> tuple[list[Any], list[Tensor]]:
    """The modules and the tensors ``fn`` reaches (NOTE [What a function reaches]): through any number of functions
    and containers, not into an object's attributes but a module's parameters, buffers and tensor attributes."""
    found = [value for value, _ in reached(fn, stop=lambda v: isinstance(v, Tensor) or _is_module(v))]
    return [v for v in found if _is_module(v)], [v for v in found if isinstance(v, Tensor)]


def _is_module(value: Any) -> bool:
    return hasattr(value, "_modules") and callable(getattr(type(value), "modules", None))  # nn sits above


def _modes(roots: list[Any]) -> tuple[bool, ...]:
    return tuple(m.training for root in roots for m in root.modules())


def _candidates(modules: list[Any], tensors: list[Tensor]) -> dict[int, Tensor]:
    """The tensors a trace may have read constants from, by the id of their array now."""
    found = list(tensors)
    for root in modules:
        for m in root.modules():
            found.extend(v for v in vars(m).values() if isinstance(v, Tensor))
            found.extend(t for _, t in m.named_parameters(recurse=False))
            found.extend(t for _, t in m.named_buffers(recurse=False))
    return {id(t._array): t for t in found}


def cached_per_signature(transform: Callable[..., Any], func: Callable[..., Any], reverse_mode: bool = False) -> Callable[..., Any]:
    """``transform`` (a transform of ``func``) run as one program per signature (NOTE [Transforms cached per
    signature]). A ``reverse_mode`` one refuses saved tensor hooks active at the call, as torch.func does."""
    entries: BoundedCache[Any, Any] = BoundedCache(_CACHE_SIZE)
    reach: list[tuple[list[Any], list[Tensor]]] = []  # the modules and tensors ``func`` reaches, found at the first call

    @functools.wraps(transform)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if reverse_mode:
            check_no_saved_hooks()
        if step_trace.current() is not None:  # xgrad.compile caches the step, and threads the generators
            return transform(*args, **kwargs)
        if get_opaque_trace_state(convention="xgrad") != _NOT_TRACING:
            return _uncached(transform, args, kwargs)
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs), is_leaf=is_tensor)
        sig = _signature(leaves)
        if sig is None:
            return _uncached(transform, args, kwargs)
        if not reach:
            reach.append(_reached(func))
        key = (tree, sig, _modes(reach[0][0]))
        entry = entries.get(key)
        out = _run(entry, leaves) if isinstance(entry, _Entry) else None
        if out is None and entry is not _RUN_UNCACHED:  # a new signature, or a source tensor's shape changed
            try:
                entry = entries[key] = _trace(transform, leaves, tree, _candidates(*reach[0]))
            except Exception:  # it needs concrete values (or fails): the uncached run says which
                entry = entries[key] = _RUN_UNCACHED
            if isinstance(entry, _Entry):
                out = _run(entry, leaves)
        if out is None or out is _CHECK_FAILED:  # the uncached run raises eager's error
            return _uncached(transform, args, kwargs)
        return out[0]

    return wrapper


def _uncached(transform: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``transform`` traced afresh, the default generator's key threaded through it as a cached program's is."""
    key = generator.default_key_data()
    if isinstance(key, jax.core.Tracer):  # an outer program threads it already
        return transform(*args, **kwargs)
    with generator.default_key_threaded(key) as key_after:
        out = transform(*args, **kwargs)
    if key_after[0] is not key:
        if isinstance(key_after[0], jax.core.Tracer):  # drawn under a jax.jit of the caller's: not threaded out
            raise RuntimeError(generator.ERR_DRAW_UNDER_JAX)
        generator.set_default_key_data(key_after[0])
    return out


def _trace(transform: Callable[..., Any], leaves: list[Any], tree: Any, candidates: dict[int, Tensor]) -> _Entry:
    check_consts_keep_identity()  # the tensors behind the constants are found by it
    entry = _Entry()
    entry.dyn = [i for i, leaf in enumerate(leaves) if isinstance(leaf, (Tensor, jax.Array))]

    def program(key: Any, *arrays: Any) -> tuple[list[Any], list[Any], Any]:
        call = list(leaves)
        given = []
        for i, a in zip(entry.dyn, arrays, strict=True):
            call[i] = Tensor(a) if isinstance(leaves[i], Tensor) else a
            given.append((i, call[i], a))
        args, kwargs = jax.tree_util.tree_unflatten(tree, call)
        with generator.default_key_threaded(key) as key_after, checks_as_values():
            out = transform(*args, **kwargs)
        out_leaves, entry.out_tree = jax.tree_util.tree_flatten(out, is_leaf=is_tensor)
        entry.out_tensors = [k for k, o in enumerate(out_leaves) if isinstance(o, Tensor)]
        entry.out_static = [None if isinstance(o, Tensor) else o for o in out_leaves]
        if any(isinstance(o, jax.core.Tracer) for o in entry.out_static):
            raise jax.errors.UnexpectedTracerError("a transform returned a traced array that is not a Tensor")
        written = [(i, t) for i, t, a in given if isinstance(t, Tensor) and t._array is not a]
        entry.written = [i for i, _ in written]
        entry.draws = key_after[0] is not key
        entry.n_out = len(entry.out_tensors)
        return [out_leaves[k]._array for k in entry.out_tensors], [t._array for _, t in written], key_after[0]

    inputs = [leaves[i]._array if isinstance(leaves[i], Tensor) else leaves[i] for i in entry.dyn]
    token = TRACING_CACHED.set(True)
    try:
        closed = jax.make_jaxpr(checkify.checkify(program))(generator.default_key_data(), *inputs)
    finally:
        TRACING_CACHED.reset(token)
    entry.consts = list(closed.consts)
    entry.sources = [
        (k, weakref.ref(candidates[id(c)])) for k, c in enumerate(entry.consts)
        if id(c) in candidates and candidates[id(c)]._array is c
    ]
    jaxpr = closed.jaxpr
    as_fun = jaxpr_as_fun(ClosedJaxpr(jaxpr.replace(constvars=[], invars=[*jaxpr.constvars, *jaxpr.invars]), []))
    entry.jitted = jax.jit(lambda consts, *flat: as_fun(*consts, *flat))
    return entry


def _run(entry: _Entry, leaves: list[Any]) -> Any:
    """``entry``'s program on these argument leaves, as a 1-tuple; ``None`` when a source tensor changed shape or
    dtype, ``_CHECK_FAILED`` when a check of values failed."""
    consts = entry.consts
    for k, ref in entry.sources:
        t = ref()
        if t is None or t._array is consts[k]:
            continue
        new, old = t._array, consts[k]
        if isinstance(new, jax.core.Tracer) or new.shape != old.shape or new.dtype != old.dtype:
            return None
        consts[k] = new
    inputs = [leaves[i]._array if isinstance(leaves[i], Tensor) else leaves[i] for i in entry.dyn]
    flat = entry.jitted(consts, generator.default_key_data(), *inputs)
    n_error = len(flat) - entry.n_out - len(entry.written) - 1
    if n_error and any(bool(e) for e in flat[:n_error] if e.dtype == bool):
        return _CHECK_FAILED
    flat = flat[n_error:]
    if entry.draws:
        generator.set_default_key_data(flat[-1])
    for i, new in zip(entry.written, flat[entry.n_out:-1], strict=True):
        leaves[i].copy_(Tensor(new))
    out = list(entry.out_static)
    for k, array in zip(entry.out_tensors, flat[: entry.n_out], strict=True):
        out[k] = Tensor(array)
    return (jax.tree_util.tree_unflatten(entry.out_tree, out),)

ERR_SAVED_HOOKS = (
    "xgrad.func.{grad, vjp, jacrev, hessian} don't support saved tensor hooks: JAX's AD keeps its own residuals, "
    "which the hooks would never see. Enter the hooks outside the transformed function and its call, or use "
    "xgrad.func.jvp or vmap, which save nothing for a backward."
)


def refuse_saved_hooks() -> disable_saved_tensors_hooks:
    """Inside it, saved tensor hooks raise torch.func's error; entering it with hooks active raises too."""
    return disable_saved_tensors_hooks(ERR_SAVED_HOOKS)


def check_no_saved_hooks() -> None:
    """torch.func's error when saved tensor hooks are active around a reverse-mode transform's call."""
    with refuse_saved_hooks():
        pass
