"""``xgrad.func``: ``torch.func``'s composable transforms over functions of Tensors, on JAX's.

# NOTE [Function transforms]
# Each transform turns the user's function of Tensors into a function of arrays (the
# Tensors it was given become Tensors around JAX's tracers inside, outside xgrad's
# graph: recording is off, JAX's AD is not, NOTE [Grad mode on JAX's AD]), hands that
# to the JAX transform of the same meaning
# (``jax.grad``, ``jax.vjp``, ``jax.jvp``, ``jax.vmap``, ``jax.jacrev``, ``jax.jacfwd``)
# and wraps the arrays that come back as Tensors. They compose (``vmap(grad(f))``,
# ``jacfwd(jacrev(f))``) because each one's result is again a function of Tensors.
# Called from outside any trace, ``grad``, ``grad_and_value``, ``vmap``, ``jacrev``,
# ``jacfwd`` and ``hessian`` run one cached XLA program per signature (NOTE [Transforms
# cached per signature]). Called on tensors with history, a transform keeps it (NOTE
# [Transforms keep history]); in-place writes follow torch.func (NOTE [In-place writes
# in xgrad.func]).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.experimental import checkify

from xgrad import generator, step_trace
from xgrad.bounded_cache import BoundedCache
from xgrad.dual import ERR_TANGENT_SIZE
from xgrad.engine import engine_ops
from xgrad.engine.function_vmap import FuncVmapAxis
from xgrad.engine.saved import disable_saved_tensors_hooks
from xgrad.func_state import TRACING_CACHED, debug_unwrap, replace_all_batch_norm_modules_, stack_module_state
from xgrad.grad_mode import graph_off, is_grad_enabled, stops_gradients
from xgrad.jax_capture import quiet_captures
from xgrad.jax_internals import (
    ClosedJaxpr,
    check_consts_keep_identity,
    get_opaque_trace_state,
    jaxpr_as_fun,
    loaded_names,
)
from xgrad.ops._util import canonical_dim, checks_as_values
from xgrad.step_trace import array_of
from xgrad.tensor import Tensor, is_tensor
from xgrad.tensor.inplace import ERR_MUTATE_CAPTURED

__all__ = [
    "debug_unwrap", "functional_call", "grad", "grad_and_value", "hessian", "jacfwd", "jacrev", "jvp", "linearize",
    "replace_all_batch_norm_modules_", "stack_module_state", "vjp", "vmap",
]


def _arrays(tree: Any) -> Any:
    """``tree`` with each Tensor replaced by its array."""
    return jax.tree_util.tree_map(lambda x: array_of(x) if isinstance(x, Tensor) else x, tree, is_leaf=is_tensor)


def _tensors(tree: Any) -> Any:
    """``tree`` with each array (or tracer) wrapped as a Tensor outside the graph."""
    return jax.tree_util.tree_map(lambda x: Tensor(x) if isinstance(x, jax.Array) else x, tree)


def _inside(tree: Any) -> Any:
    """The function's view of a tree of arguments: every Tensor a fresh one outside the graph."""
    return jax.tree_util.tree_map(lambda x: Tensor(array_of(x)) if isinstance(x, Tensor) else x, tree, is_leaf=is_tensor)


def _has_history(tree: Any) -> bool:
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
        modules: list[Any] = []
        tensors: list[Tensor] = []
        _reached(transformed, modules, tensors, set())
        reads.reach.extend((modules, tensors))
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


def _keeps_history(transformed: Callable[..., Any]) -> Callable[..., Any]:
    reads = _Reads()

    @functools.wraps(transformed)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_grad_enabled():
            out = transformed(*args, **kwargs)
            # ``no_grad`` entered inside an outer transform's function: its AD sees a constant, as for any op there
            if stops_gradients(_arrays(jax.tree_util.tree_leaves((args, kwargs), is_leaf=is_tensor))):
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
                out, structure = jax.tree_util.tree_flatten(_arrays(transformed(*call_args, **call_kwargs)))
            finally:
                for t, a in zip(lifted, held, strict=True):
                    t._array = a
            out_tree.append(structure)
            return tuple(out)

        if get_opaque_trace_state(convention="xgrad") == _NOT_TRACING and step_trace.current() is None:
            lifted.extend(_closed_over_history(transformed, reads, of_arrays, given, leaves, tree))
        if not lifted and not _has_history((args, kwargs)):
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
# and the ``training`` flags of the modules the function reaches (through closures,
# ``functools.partial``, a bound ``self`` and the globals its code loads).
# Staleness follows ``xgrad.compile``: a constant of the trace that is a tensor's array
# (a module's buffer, a closed-over weight) is read from that tensor at every call, so
# an optimizer step or an in-place update is seen, and one of another shape or dtype
# traces again. The tensor behind a constant is found by its array among what the function
# reaches: tensors in its closures and the globals it loads, and the modules' parameters,
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
_LIBRARIES = {"xgrad", "jax", "jaxlib", "numpy", "optax", "equinox", "flax", "functools", "operator", "builtins"}


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


def _reached(fn: Any, modules: list[Any], tensors: list[Tensor], seen: set[int]) -> None:
    """Add the modules and the tensors ``fn`` reaches: itself, ``partial`` arguments, a bound ``self``,
    closure cells, the globals its code loads, what the functions and containers among those reach."""
    if id(fn) in seen or isinstance(fn, (jax.Array, str, int, float, type(None))):
        return
    seen.add(id(fn))
    if isinstance(fn, Tensor):
        tensors.append(fn)
        return
    if hasattr(fn, "_modules") and callable(getattr(type(fn), "modules", None)):  # an nn.Module
        modules.append(fn)
        return
    if isinstance(fn, (list, tuple)):
        parts: list[Any] = list(fn)
    elif isinstance(fn, dict):
        parts = list(fn.values())
    elif isinstance(fn, functools.partial):
        parts = [fn.func, *fn.args, *fn.keywords.values()]
    else:
        parts = [getattr(fn, "__self__", None), getattr(fn, "__wrapped__", None)]
        code = getattr(fn, "__code__", None)
        fn_globals = getattr(fn, "__globals__", {})
        package = str(fn_globals.get("__name__", "")).split(".")[0]
        if code is not None and package not in _LIBRARIES:  # the user's function: what it reads
            for cell in fn.__closure__ or ():
                try:
                    parts.append(cell.cell_contents)
                except ValueError:  # an empty cell
                    continue
            parts.extend(fn_globals[name] for name in loaded_names(code) if name in fn_globals)
        elif code is not None and package == "xgrad":  # a transform's wrapper: the functions it calls
            parts.extend(c.cell_contents for c in fn.__closure__ or () if callable(c.cell_contents))
    for part in parts:
        if part is not None:
            _reached(part, modules, tensors, seen)


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


def _cached(transform: Callable[..., Any], func: Callable[..., Any], reverse_mode: bool = False) -> Callable[..., Any]:
    """``transform`` (a transform of ``func``) run as one program per signature (NOTE [Transforms cached per
    signature]). A ``reverse_mode`` one refuses saved tensor hooks active at the call, as torch.func does."""
    entries: BoundedCache[Any, Any] = BoundedCache(_CACHE_SIZE)
    reach: list[tuple[list[Any], list[Tensor]]] = []  # the modules and tensors ``func`` reaches, found at the first call

    @functools.wraps(transform)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if reverse_mode:
            _check_no_saved_hooks()
        if step_trace.current() is not None:  # xgrad.compile caches the step, and threads the generators
            return transform(*args, **kwargs)
        if get_opaque_trace_state(convention="xgrad") != _NOT_TRACING:
            return _uncached(transform, args, kwargs)
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs), is_leaf=is_tensor)
        sig = _signature(leaves)
        if sig is None:
            return _uncached(transform, args, kwargs)
        if not reach:
            modules: list[Any] = []
            tensors: list[Tensor] = []
            _reached(func, modules, tensors, set())
            reach.append((modules, tensors))
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


def _argnums_tuple(argnums: Any, nargs: int, name: str) -> tuple[int, ...]:
    """``argnums`` checked as torch.func checks it, each made non-negative."""
    if isinstance(argnums, int):
        nums: tuple[Any, ...] = (argnums,)
    elif isinstance(argnums, tuple):
        nums = argnums
        if not nums:
            raise RuntimeError(f"{name}: argnums must be non-empty")
    else:
        raise RuntimeError(f"{name}: argnums must be int or Tuple[int, ...], got: {type(argnums)}")
    for i in nums:
        if not isinstance(i, int):
            raise RuntimeError(f"{name}: argnum must be int, got: {type(i)}")
        if not -nargs <= i < nargs:
            raise RuntimeError(
                f"{name}: Got argnum={i}, but only {nargs} positional inputs. Please pass a valid argnums or pass "
                "more positional inputs."
            )
    wrapped = tuple(i % nargs for i in nums)
    if len(set(wrapped)) != len(wrapped):
        raise RuntimeError(f"{name}: argnums elements must be unique, got {argnums}")
    return wrapped


def _scalar_output(out: Any, name: str) -> Any:
    if not isinstance(out, Tensor):
        raise RuntimeError(f"{name}_and_value(f)(*args): Expected f(*args) to return a Tensor, got {type(out).__name__}")
    if out.ndim != 0:
        raise RuntimeError(
            f"{name}_and_value(f)(*args): Expected f(*args) to return a scalar Tensor, got tensor with "
            f"{out.ndim} dims. Maybe you wanted to use the vjp or jacrev APIs instead?"
        )
    return out._array


def _split_aux(out: Any, where: str) -> tuple[Any, Any]:
    """``(output, aux)`` of a function called with ``has_aux=True``; ``where`` names the call, as torch.func does."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise RuntimeError(f"{where}: output of function f should be a tuple: (output, aux) if has_aux is True")
    _only_tensors(out[1], f"{where}: aux")
    return out


def _only_tensors(tree: Any, what: str) -> None:
    """torch.func's error for a leaf of ``tree`` (an ``aux``) that is no Tensor (JAX's ``TypeError`` otherwise)."""
    for leaf in jax.tree_util.tree_leaves(tree, is_leaf=is_tensor):
        if not isinstance(leaf, (Tensor, jax.Array)):
            raise RuntimeError(f"{what}: Expected tensors, got unsupported type {type(leaf)}")


def _tensor_outputs(out: Any, where: str) -> None:
    """torch.func's errors for a function whose outputs are empty or not all Tensors."""
    if out is None or (isinstance(out, (tuple, list, dict)) and not jax.tree_util.tree_leaves(out, is_leaf=is_tensor)):
        raise RuntimeError(f"{where}: Expected f to be a function that has non-empty output (got output = {out})")
    for leaf in jax.tree_util.tree_leaves(out, is_leaf=is_tensor):
        if not isinstance(leaf, (Tensor, jax.Array)):
            raise RuntimeError(f"{where}: expected f(*primals) to return only tensors, got unsupported type {type(leaf)}")


ERR_SAVED_HOOKS = (
    "xgrad.func.{grad, vjp, jacrev, hessian} don't support saved tensor hooks: JAX's AD keeps its own residuals, "
    "which the hooks would never see. Enter the hooks outside the transformed function and its call, or use "
    "xgrad.func.jvp or vmap, which save nothing for a backward."
)


def _refuse_saved_hooks() -> disable_saved_tensors_hooks:
    """Inside it, saved tensor hooks raise torch.func's error; entering it with hooks active raises too."""
    return disable_saved_tensors_hooks(ERR_SAVED_HOOKS)


def _check_no_saved_hooks() -> None:
    """torch.func's error when saved tensor hooks are active around a reverse-mode transform's call."""
    with _refuse_saved_hooks():
        pass


def _call(func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], transform: str = "grad") -> Any:
    """``func`` on the function's view of its arguments, as the transforms run it."""
    return _call_tracking(func, args, kwargs, transform)[0]


def _call_tracking(
    func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], transform: str
) -> tuple[Any, list[Any]]:
    """``_call``, and per positional argument the new array it was given in place, else ``None``
    (NOTE [In-place writes in xgrad.func])."""
    inner = _inside(tuple(args))
    given = [t._array if isinstance(t, Tensor) else None for t in inner]
    with graph_off(transform), quiet_captures():
        out = func(*inner, **_inside(dict(kwargs)))
    written = [
        t._array if isinstance(t, Tensor) and t._array is not g else None for t, g in zip(inner, given, strict=True)
    ]
    return out, written


def _write_back(args: Sequence[Any], written: Sequence[Any]) -> None:
    """Give the caller's tensors the values the function wrote into them in place."""
    for a, new in zip(args, written, strict=True):
        if new is not None:
            a.copy_(Tensor(new))


def _with_args(args: tuple[Any, ...], nums: tuple[int, ...], values: Sequence[Any]) -> list[Any]:
    full = list(args)
    for i, v in zip(nums, values, strict=True):
        full[i] = _tensors(v)
    return full


def grad_and_value(func: Callable[..., Any], argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable[..., Any]:
    """``torch.func.grad_and_value``: the gradient of ``func`` w.r.t. ``args[argnums]`` and its value.

    Args:
        func: a function of Tensors (pytrees of them) returning a scalar Tensor, or
            ``(scalar, aux)`` with ``has_aux=True``.
        argnums: which positional argument(s) to differentiate; a tuple gives a tuple of grads.
        has_aux: whether ``func`` returns ``(output, aux)``; then the value is ``(output, aux)``.

    >>> import xgrad
    >>> g, v = xgrad.func.grad_and_value(lambda x: (x ** 2).sum())(xgrad.tensor([1.0, 2.0]))
    >>> g.tolist(), v.item()
    ([2.0, 4.0], 5.0)
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nums = _argnums_tuple(argnums, len(args), "grad_and_value")
        _check_differentiable([args[i] for i in nums])

        def of_arrays(*diff: Any) -> Any:
            with _refuse_saved_hooks():
                out = _call(func, _with_args(args, nums, diff), kwargs)
            aux = None
            if has_aux:
                out, aux = _split_aux(out, "grad_and_value(f)(*args)")
            value = _scalar_output(out, "grad")
            return value, (value, _arrays(aux))

        diff = [_arrays(args[i]) for i in nums]
        grads, (value, aux) = jax.grad(of_arrays, argnums=tuple(range(len(nums))), has_aux=True)(*diff)
        # A complex input's gradient is PyTorch's (dL/dRe + i dL/dIm): the conjugate of JAX's.
        grads = jax.tree_util.tree_map(lambda g: g.conj() if jax.numpy.iscomplexobj(g) else g, grads)
        grads = _tensors(grads if isinstance(argnums, tuple) else grads[0])
        return (grads, (Tensor(value), _tensors(aux))) if has_aux else (grads, Tensor(value))

    return _keeps_history(_cached(wrapper, func, reverse_mode=True))


def grad(func: Callable[..., Any], argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable[..., Any]:
    """``torch.func.grad``: the gradient of a scalar ``func`` w.r.t. ``args[argnums]``.

    With ``has_aux=True`` returns ``(grad, aux)``. Per-example gradients:
    ``vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)``.

    >>> import xgrad
    >>> xgrad.func.grad(lambda x: (x.sin() * x).sum())(xgrad.tensor([0.0, 1.0])).tolist()
    [0.0, 1.3817732334136963]
    """
    both = grad_and_value(func, argnums, has_aux)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        grads, value = both(*args, **kwargs)
        return (grads, value[1]) if has_aux else grads

    return wrapper


def vjp(func: Callable[..., Any], *primals: Any, has_aux: bool = False) -> Any:
    """``torch.func.vjp``: ``(output, vjp_fn)``, or ``(output, vjp_fn, aux)`` with ``has_aux``.

    ``vjp_fn(cotangents)`` takes cotangents shaped like the output and returns a tuple
    with one gradient per primal.

    >>> import xgrad
    >>> out, vjp_fn = xgrad.func.vjp(lambda x: x * 3, xgrad.tensor([1.0, 2.0]))
    >>> vjp_fn(xgrad.tensor([1.0, 10.0]))[0].tolist()
    [3.0, 30.0]
    """

    def of_arrays(*arrays: Any) -> Any:
        with _refuse_saved_hooks():
            out = _call(func, [_tensors(a) for a in arrays], {})
        if has_aux:
            out, aux = _split_aux(out, "vjp(f, *primals)")
            _tensor_outputs(out, "vjp(f, *primals)")
            return _arrays(out), _arrays(aux)
        _tensor_outputs(out, "vjp(f, *primals)")
        return _arrays(out)

    _check_no_saved_hooks()
    arrays = [_arrays(p) for p in primals]
    if has_aux:
        out, pullback, aux = jax.vjp(of_arrays, *arrays, has_aux=True)
    else:
        out, pullback = jax.vjp(of_arrays, *arrays)

    def pulled_back(tensors: Any, cotangents: Any) -> tuple[Any, ...]:
        # NOTE [History of vjp's results]: the pullback recomputed on these tensors, as one op of the graph.
        _, again = jax.vjp(lambda *a: of_arrays(*a)[0] if has_aux else of_arrays(*a), *_arrays(tensors))
        return tuple(_tensors(again(_arrays(cotangents))))

    def vjp_fn(cotangents: Any) -> tuple[Any, ...]:
        given = _arrays(cotangents)
        out_tree: Any = jax.tree_util.tree_structure(out)
        given_tree: Any = jax.tree_util.tree_structure(given)
        if out_tree != given_tree:
            raise RuntimeError(
                "Expected pytree structure of cotangents to be the same as pytree structure of outputs to the "
                f"function. cotangents: {given_tree}, primal output: {out_tree}"
            )
        for i, (o, g) in enumerate(zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(given), strict=False)):
            if o.shape != getattr(g, "shape", None):  # PyTorch's autograd.grad check, not JAX's TypeError
                raise RuntimeError(f"Mismatch in shape: grad_output[{i}] has a shape of {list(getattr(g, 'shape', ()))} "
                                   f"and output[{i}] has a shape of {list(o.shape)}.")
        if is_grad_enabled() and _has_history((primals, cotangents)):
            return _keeps_history(pulled_back)(primals, cotangents)  # type: ignore[no-any-return]
        return tuple(_tensors(pullback(given)))

    if is_grad_enabled() and _has_history(primals):
        # NOTE [History of vjp's results]
        # As torch.func's: called on tensors with history (grad mode on), ``vjp``'s output
        # keeps it, and so does what ``vjp_fn`` returns when called with grad mode on (its
        # gradients are then differentiable w.r.t. the primals and the cotangents: an outer
        # ``autograd.grad`` of a vjp). Grad mode is read at each call, so ``no_grad``
        # around either one cuts that one's history only. Each such call runs the
        # function again, as one op of xgrad's graph (NOTE [Transforms keep history]).
        recorded = _keeps_history(lambda *tensors: _tensors(of_arrays(*_arrays(tensors))))(*primals)
        if has_aux:
            return recorded[0], vjp_fn, recorded[1]
        return recorded, vjp_fn
    return (_tensors(out), vjp_fn, _tensors(aux)) if has_aux else (_tensors(out), vjp_fn)


def jvp(
    func: Callable[..., Any], primals: Any, tangents: Any, *, strict: bool = False, has_aux: bool = False
) -> Any:
    """``torch.func.jvp``: ``(output, jvp_out)``, or ``(output, jvp_out, aux)`` with ``has_aux``.

    >>> import xgrad
    >>> out, t = xgrad.func.jvp(lambda x: x ** 2, (xgrad.tensor([1.0, 3.0]),), (xgrad.tensor([1.0, 1.0]),))
    >>> t.tolist()
    [2.0, 6.0]
    """
    _check_jvp_inputs(primals, tangents, strict)

    def of_arrays(*arrays: Any) -> Any:
        out, written = _call_tracking(func, [_tensors(a) for a in arrays], {}, "grad")
        aux = None
        if has_aux:
            out, aux = _split_aux(out, "jvp(f, primals, tangents)")
        _tensor_outputs(out, "jvp(f, primals, tangents)")
        return _arrays(out), (_arrays(aux), written)

    p, t = _arrays(primals), _arrays(tangents)
    out, tangent_out, (aux, written) = jax.jvp(of_arrays, p, t, has_aux=True)
    _write_back(primals, written)
    if has_aux:
        return _tensors(out), _tensors(tangent_out), _tensors(aux)
    return _tensors(out), _tensors(tangent_out)


def _check_jvp_inputs(primals: Any, tangents: Any, strict: bool) -> None:
    """torch.func.jvp's checks of its arguments, in its order and words."""
    where = "jvp(f, primals, tangents)"
    if strict:
        raise RuntimeError(f"{where}: strict=True is not implemented")
    if not isinstance(primals, tuple):
        raise RuntimeError(f"{where}: Expected primals to be a tuple. E.g. it should be valid to call f(*primals).")
    primal_leaves, primal_tree = jax.tree_util.tree_flatten(primals, is_leaf=is_tensor)
    tangent_leaves, tangent_tree = jax.tree_util.tree_flatten(tangents, is_leaf=is_tensor)
    primal_tree, tangent_tree = str(primal_tree), str(tangent_tree)
    if not isinstance(tangents, tuple) or primal_tree != tangent_tree:
        raise RuntimeError(
            f"{where}: Expected primals and tangents to have the same python structure. For example, if primals is "
            f"a tuple of 3 tensors, tangents also must be. Got primals with structure {primal_tree} and tangents "
            f"with structure {tangent_tree}"
        )
    for name, leaves in (("primals", primal_leaves), ("tangents", tangent_leaves)):
        for leaf in leaves:
            if not isinstance(leaf, (Tensor, jax.Array)):
                raise RuntimeError(f"{where}: Expected {name} to only contain Tensors, got {type(leaf)}")
        if not leaves:
            raise RuntimeError(f"{where}: Expected {name} to contain at least one Tensor")
    for primal, tangent in zip(primal_leaves, tangent_leaves, strict=True):
        if primal.shape != tangent.shape:
            raise RuntimeError(ERR_TANGENT_SIZE.format(primal=list(primal.shape), tangent=list(tangent.shape)))


def linearize(func: Callable[..., Any], *primals: Any) -> tuple[Any, Callable[..., Any]]:
    """``torch.func.linearize``: ``(output, jvp_fn)``; ``jvp_fn(*tangents)`` is ``jvp``'s tangent output at ``primals``.

    ``func`` runs once; each ``jvp_fn`` call evaluates only the linear map (``jax.linearize``).

    >>> import xgrad
    >>> out, jvp_fn = xgrad.func.linearize(lambda x: x.sin(), xgrad.tensor([0.0, 1.0]))
    >>> jvp_fn(xgrad.tensor([2.0, 0.0])).tolist()
    [2.0, 0.0]
    """

    def of_arrays(*arrays: Any) -> Any:
        return _arrays(_call(func, [_tensors(a) for a in arrays], {}))

    arrays = [_arrays(p) for p in primals]
    out, linear = jax.linearize(of_arrays, *arrays)

    def jvp_fn(*tangents: Any) -> Any:
        given = _arrays(tangents)
        if len(tangents) != len(arrays) or len(jax.tree_util.tree_leaves(given)) != len(jax.tree_util.tree_leaves(arrays)):
            raise RuntimeError(
                f"linearize: expected tangents with the structure of the primals, {len(arrays)} of them; got "
                f"{len(tangents)} tangents"
            )
        for primal, tangent in zip(jax.tree_util.tree_leaves(arrays), jax.tree_util.tree_leaves(given), strict=True):
            if primal.shape != tangent.shape or primal.dtype != tangent.dtype:
                raise RuntimeError(
                    f"linearize: tangent of shape {list(tangent.shape)} and dtype {tangent.dtype} given for a primal of "
                    f"shape {list(primal.shape)} and dtype {primal.dtype}: they must match"
                )
        return _tensors(linear(*given))

    return _tensors(out), jvp_fn


def vmap(
    func: Callable[..., Any],
    in_dims: Any = 0,
    out_dims: Any = 0,
    randomness: str = "error",
    *,
    chunk_size: int | None = None,
) -> Callable[..., Any]:
    """``torch.func.vmap``: ``func`` mapped over a dimension of its inputs.

    Args:
        func: a function of Tensors (pytrees of them).
        in_dims: per positional argument, the dimension to map (an int, or ``None`` for an
            argument shared by every call; a pytree matching the argument for per-leaf
            dims). One int applies to all arguments. Keyword arguments are not mapped.
        out_dims: where the mapped dimension goes in each output.
        randomness: ``"error"`` (the default: a random op without ``key=`` raises torch's
            error) or ``"same"`` (one draw from the default generator for every example);
            ``"different"`` raises for such ops (pass each example its own ``key=``).
        chunk_size: how many examples to compute at once (``None``: all).

    >>> import xgrad
    >>> xgrad.func.vmap(lambda row, w: (row * w).sum(), in_dims=(0, None))(xgrad.ones(3, 2), xgrad.tensor([1.0, 2.0])).tolist()
    [3.0, 3.0, 3.0]
    """
    if randomness not in ("error", "different", "same"):
        raise RuntimeError(f"Only allowed values for randomness are 'error', 'different', or 'same'. Got {randomness}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size <= 0):
        raise ValueError(f"vmap: chunk_size should be None or greater than 0. (got {chunk_size})")

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        dims = in_dims if isinstance(in_dims, tuple) else (in_dims,) * len(args)
        if len(dims) != len(args):
            raise ValueError(
                f"vmap(func, in_dims={in_dims})(<inputs>): in_dims is not compatible with the structure of inputs. "
                f"in_dims has structure {len(dims)} but inputs has structure {len(args)}."
            )
        mapped = [i for i, d in enumerate(dims) if d is not None]
        _check_vmap_inputs(func, in_dims, [(args[i], dims[i]) for i in mapped])

        def of_arrays(*arrays: Any) -> Any:
            full = list(args)
            for i, a in zip(mapped, arrays, strict=True):
                full[i] = _tensors(a)
            key_before = generator.default_key_data()
            out, written = _call_tracking(func, full, kwargs, "vmap")
            if randomness != "same" and generator.default_key_data() is not key_before:
                raise RuntimeError(ERR_VMAP_RANDOMNESS[randomness])
            if isinstance(out_dims, int):
                _check_vmap_outputs(func, out, out_dims)
            return _arrays(out), written

        written_dims = [d if isinstance(d, int) else None for d in dims]
        batched = jax.vmap(of_arrays, in_axes=tuple(dims[i] for i in mapped), out_axes=(out_dims, written_dims),
                           axis_name=FuncVmapAxis(randomness))  # NOTE [Functions under vmap]
        arrays = [_arrays(args[i]) for i in mapped]
        try:
            if chunk_size is None:
                out, written = batched(*arrays)
            else:
                chunks = _in_chunks(batched, arrays, [dims[i] for i in mapped], chunk_size)
                out = _joined([o for o, _ in chunks], out_dims)
                written = [
                    None if w is None else _joined([c[1][k] for c in chunks], d) if d is not None else w
                    for k, (w, d) in enumerate(zip(chunks[-1][1], written_dims, strict=True))
                ]
        except ValueError as e:
            if "out_axes" in str(e) and any(w is not None for w in jax.tree_util.tree_leaves(written_dims)):
                raise RuntimeError(ERR_MUTATE_CAPTURED["vmap"]) from e
            raise
        _write_back(args, written)
        return _tensors(out)

    return _keeps_history(_cached(wrapper, func))


ERR_VMAP_RANDOMNESS = {
    "error": "vmap: called random operation while in randomness error mode. Please either use the 'same' or "
    "'different' randomness flags on vmap or perform the randomness operation out of vmap",
    "different": "vmap(randomness='different') is not supported for random ops without key= (they draw from the "
    "default generator, one draw for all examples): use randomness='same', or pass each example its own key= "
    "(jax.random.split(key, batch_size) as a mapped argument)",
}


def _vmap_name(func: Callable[..., Any]) -> str:
    return getattr(func, "__name__", repr(func))


def _check_vmap_inputs(func: Callable[..., Any], in_dims: Any, mapped: list[tuple[Any, Any]]) -> None:
    """PyTorch's ``ValueError``s for what ``vmap`` cannot map: no inputs, a non-Tensor or out-of-range
    ``in_dim``, mapped sizes that differ (JAX's ``vmap`` raises them in its words). Pytree ``in_dims`` are JAX's."""
    where = f"vmap({_vmap_name(func)}, in_dims={in_dims}, ...)(<inputs>)"
    if not mapped:
        raise ValueError(f"vmap({_vmap_name(func)})(<inputs>): got no inputs. Maybe you forgot to add inputs, or you "
                         "are trying to vmap over a function with no inputs. The latter is unsupported.")
    sizes = []
    for arg, dim in mapped:
        if not isinstance(dim, int):
            return
        for leaf in jax.tree_util.tree_leaves(arg, is_leaf=is_tensor):
            if not isinstance(leaf, (Tensor, jax.Array)):
                raise ValueError(f"{where}: Got in_dim={dim} for an input but the input is of type {type(leaf)}. We "
                                 "cannot vmap over non-Tensor arguments, please use None as the respective in_dim")
            if not -leaf.ndim <= dim < leaf.ndim:
                raise ValueError(f"{where}: Got in_dim={dim} for some input, but that input is a Tensor of "
                                 f"dimensionality {leaf.ndim} so expected in_dim to satisfy "
                                 f"-{leaf.ndim} <= in_dim < {leaf.ndim}.")
            sizes.append(leaf.shape[dim])
    if len(set(sizes)) > 1:
        raise ValueError(f"{where}: Expected all tensors to have the same size in the mapped dimension, got sizes "
                         f"{sizes} for the mapped dimension")


def _check_vmap_outputs(func: Callable[..., Any], out: Any, out_dim: int) -> None:
    """Every output a Tensor (``None`` would vanish from JAX's pytree) with a dim ``out_dim``, as PyTorch's ``vmap`` requires."""
    for leaf in jax.tree_util.tree_leaves(out, is_leaf=lambda x: x is None or is_tensor(x)):
        if not isinstance(leaf, (Tensor, jax.Array)):
            name = _vmap_name(func)
            raise ValueError(f"vmap({name}, ...): `{name}` must only return Tensors, got type {type(leaf)}. Did you "
                             "mean to set out_dims= to None for output?")
        canonical_dim(out_dim, leaf.ndim + 1)  # the batched output's dims


def _check_differentiable(inputs: list[Any]) -> None:
    """PyTorch's error for differentiating integer inputs (``requires_grad_`` refuses them), not JAX's ``TypeError``."""
    for leaf in jax.tree_util.tree_leaves(inputs, is_leaf=is_tensor):
        if isinstance(leaf, (Tensor, jax.Array)) and not jax.numpy.issubdtype(leaf.dtype, jax.numpy.inexact):
            raise RuntimeError("only Tensors of floating point and complex dtype can require gradients")


def _in_chunks(batched: Callable[..., Any], arrays: list[Any], dims: list[Any], chunk_size: int) -> list[Any]:
    """``batched(*arrays)`` computed ``chunk_size`` examples at a time: the chunks' results."""
    leaves, tree = jax.tree_util.tree_flatten(arrays)
    leaf_dims = jax.tree_util.tree_leaves(
        [jax.tree_util.tree_map(lambda _, d=d: d, a) if isinstance(d, int) else d for a, d in zip(arrays, dims, strict=True)]
    )
    size = leaves[0].shape[leaf_dims[0]]
    results = []
    for start in range(0, size, chunk_size):
        chunk = [jax.lax.slice_in_dim(x, start, min(start + chunk_size, size), axis=d) for x, d in zip(leaves, leaf_dims, strict=True)]
        results.append(batched(*jax.tree_util.tree_unflatten(tree, chunk)))
    return results


def _joined(results: list[Any], out_dims: Any) -> Any:
    """The chunks' results concatenated along their mapped dimensions."""
    import jax.numpy as jnp

    out_leaves = [jax.tree_util.tree_leaves(o) for o in results]
    out_tree = jax.tree_util.tree_structure(results[0])
    axes = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda _: out_dims, results[0])) if isinstance(out_dims, int) else (
        jax.tree_util.tree_leaves(out_dims)
    )
    joined = [jnp.concatenate([o[k] for o in out_leaves], axis=axes[k]) for k in range(len(out_leaves[0]))]
    return jax.tree_util.tree_unflatten(out_tree, joined)


def _jacobian(jax_transform: Callable[..., Any], func: Callable[..., Any], argnums: Any, has_aux: bool, name: str) -> Callable[..., Any]:
    """``func``'s Jacobian by ``jax.jacrev`` or ``jax.jacfwd``, PyTorch's way round: output dims first."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nums = _argnums_tuple(argnums, len(args), name)

        where = "vjp(f, *primals)" if name == "jacrev" else "jvp(f, primals, tangents)"
        _real_only([args[i] for i in nums], name, "inputs")

        def of_arrays(*diff: Any) -> Any:
            with _refuse_saved_hooks() if name == "jacrev" else contextlib.nullcontext():
                out = _call(func, _with_args(args, nums, diff), kwargs)
            aux = None
            if has_aux:
                out, aux = _split_aux(out, f"{name}(f)(*args)")
            _tensor_outputs(out, where)
            _real_only(out, name, "outputs")
            return (_arrays(out), _arrays(aux)) if has_aux else _arrays(out)

        positions = tuple(range(len(nums))) if isinstance(argnums, tuple) else 0
        result = jax_transform(of_arrays, argnums=positions, has_aux=has_aux)(*[_arrays(args[i]) for i in nums])
        return (_tensors(result[0]), _tensors(result[1])) if has_aux else _tensors(result)

    return _keeps_history(_cached(wrapper, func, reverse_mode=name == "jacrev"))


def _real_only(tree: Any, name: str, what: str) -> None:
    """torch.func's error for complex inputs or outputs of a Jacobian (JAX's ``TypeError`` otherwise)."""
    for i, leaf in enumerate(jax.tree_util.tree_leaves(tree, is_leaf=is_tensor)):
        array = leaf._array if isinstance(leaf, Tensor) else leaf
        if isinstance(array, jax.Array) and jax.numpy.issubdtype(array.dtype, jax.numpy.complexfloating):
            raise RuntimeError(
                f"{name}: Expected all {what} to be real but received complex tensor at flattened {what[:-1]} idx: {i}"
            )


def jacrev(
    func: Callable[..., Any], argnums: int | tuple[int, ...] = 0, *, has_aux: bool = False, chunk_size: int | None = None
) -> Callable[..., Any]:
    """``torch.func.jacrev``: the Jacobian of ``func`` w.r.t. ``args[argnums]`` by reverse mode.

    For an output of shape ``O`` and an input of shape ``I`` the Jacobian has shape
    ``O + I``; a tuple ``argnums`` gives a tuple, pytree outputs a pytree. ``chunk_size``
    is accepted for PyTorch's signature (JAX computes all rows at once).

    >>> import xgrad
    >>> xgrad.func.jacrev(lambda x: x ** 2)(xgrad.tensor([1.0, 2.0])).tolist()
    [[2.0, 0.0], [0.0, 4.0]]
    """
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size <= 0):
        raise ValueError("jacrev: `chunk_size` should be greater than 0.")
    return _jacobian(jax.jacrev, func, argnums, has_aux, "jacrev")


def jacfwd(
    func: Callable[..., Any], argnums: int | tuple[int, ...] = 0, has_aux: bool = False, *, randomness: str = "error"
) -> Callable[..., Any]:
    """``torch.func.jacfwd``: the Jacobian of ``func`` w.r.t. ``args[argnums]`` by forward mode.

    >>> import xgrad
    >>> xgrad.func.jacfwd(lambda x: x.sin())(xgrad.tensor([0.0])).tolist()
    [[1.0]]
    """
    if randomness not in ("error", "different", "same"):
        raise RuntimeError(f"Only allowed values for randomness are 'error', 'different', or 'same'. Got {randomness}")
    return _jacobian(jax.jacfwd, func, argnums, has_aux, "jacfwd")


def hessian(func: Callable[..., Any], argnums: int | tuple[int, ...] = 0) -> Callable[..., Any]:
    """``torch.func.hessian``: ``jacfwd(jacrev(func, argnums), argnums)``.

    >>> import xgrad
    >>> xgrad.func.hessian(lambda x: (x ** 3).sum())(xgrad.tensor([1.0, 2.0])).tolist()
    [[6.0, 0.0], [0.0, 12.0]]
    """
    return jacfwd(jacrev(func, argnums), argnums)


_MISSING = object()


def _merge(parameter_and_buffer_dicts: Any) -> dict[str, Any]:
    if isinstance(parameter_and_buffer_dicts, Mapping):
        return dict(parameter_and_buffer_dicts)
    if isinstance(parameter_and_buffer_dicts, (list, tuple)) and all(isinstance(d, Mapping) for d in parameter_and_buffer_dicts):
        merged: dict[str, Any] = {}
        for d in parameter_and_buffer_dicts:
            for key, value in d.items():
                if key in merged:
                    raise ValueError(f"{key} appeared in multiple dictionaries; behavior of functional call is ambiguous")
                merged[key] = value
        return merged
    raise ValueError(
        "Expected parameter_and_buffer_dicts to be a dict, or a list/tuple of dicts, but got "
        f"{type(parameter_and_buffer_dicts)}"
    )


def functional_call(
    module: Any,
    parameter_and_buffer_dicts: Any,
    args: Any = None,
    kwargs: dict[str, Any] | None = None,
    *,
    tie_weights: bool = True,
    strict: bool = False,
) -> Any:
    """``torch.func.functional_call``: call ``module`` with these parameters and buffers in place of its own.

    The module is left as it was afterwards. Names are ``named_parameters()``'s and
    ``named_buffers()``'s; values are Tensors (or arrays). With ``tie_weights`` a value
    given for one of several names of one tied tensor is used for all of them; with
    ``strict`` every parameter and buffer must be given, and nothing else.

    Args:
        module: the ``nn.Module`` to call.
        parameter_and_buffer_dicts: a dict of name -> value, or a tuple of such dicts.
        args: the positional arguments (one that is not a tuple is the only one).
        kwargs: keyword arguments.

    >>> import xgrad
    >>> lin = xgrad.nn.Linear(2, 1, key=0)
    >>> params = {"weight": xgrad.tensor([[1.0, 2.0]]), "bias": xgrad.tensor([0.5])}
    >>> xgrad.func.functional_call(lin, params, (xgrad.tensor([[1.0, 1.0]]),)).tolist()
    [[3.5]]
    """
    values = _merge(parameter_and_buffer_dicts)
    own: dict[str, Any] = {}
    for name, t in module.named_parameters(remove_duplicate=False):
        own[name] = t
    for name, t in module.named_buffers(remove_duplicate=False):
        own[name] = t
    if strict:
        missing = [k for k in own if k not in values]
        unexpected = [k for k in values if k not in own]
        if missing or unexpected:
            lines = [f"Error(s) in reparametrizing for {type(module).__name__}:"]
            if unexpected:
                lines.append("\tUnexpected key(s): " + ", ".join(f"'{k}'" for k in unexpected) + ".")
            if missing:
                lines.append("\tMissing key(s): " + ", ".join(f"'{k}'" for k in missing) + ".")
            raise RuntimeError("\n".join(lines))
    if tie_weights:
        tied: dict[int, list[str]] = {}
        for name, t in own.items():
            tied.setdefault(id(t), []).append(name)
        for names in tied.values():
            given = [n for n in names if n in values]
            if len(given) > 1 and any(values[n] is not values[given[0]] for n in given[1:]):
                raise ValueError(
                    f"functional_call got multiple values for keys {given}, which are tied. Consider using tie_weights=False"
                )
            if given:
                for n in names:
                    values.setdefault(n, values[given[0]])
    swapped: list[tuple[Any, str, Any]] = []
    try:
        for name, value in values.items():
            owner, attr = _owner(module, name)
            swapped.append((owner, attr, owner.__dict__.get(attr, _MISSING)))
            object.__setattr__(owner, attr, Tensor(value) if isinstance(value, jax.Array) else value)
        call_args = args if isinstance(args, tuple) else (() if args is None else (args,))
        return module(*call_args, **(kwargs or {}))
    finally:
        for owner, attr, old in reversed(swapped):
            if old is _MISSING:
                object.__delattr__(owner, attr)
            else:
                object.__setattr__(owner, attr, old)


def _owner(module: Any, name: str) -> tuple[Any, str]:
    """The module holding attribute ``name`` (dotted) directly, and the attribute."""
    *path, attr = name.split(".")
    owner = module
    for part in path:
        child = owner._modules.get(part) if part in owner._modules else owner.__dict__.get(part)
        if child is None or not hasattr(child, "_modules"):
            raise ValueError(
                f"functional_call: '{name}' does not name a parameter or buffer that a module holds as an attribute "
                f"('{part}' is not a submodule of {type(owner).__name__})"
            )
        owner = child
    if attr in owner._modules:
        raise ValueError(f"functional_call: '{name}' names a submodule, not a parameter or buffer")
    return owner, attr
