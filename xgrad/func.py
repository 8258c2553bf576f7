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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from xgrad import generator
from xgrad.dual import ERR_TANGENT_SIZE
from xgrad.engine.function_vmap import FuncVmapAxis
from xgrad.func_call import functional_call
from xgrad.func_programs import (
    arrays_of_tree,
    cached_per_signature,
    check_no_saved_hooks,
    has_history,
    keeps_history,
    refuse_saved_hooks,
)
from xgrad.func_state import debug_unwrap, replace_all_batch_norm_modules_, stack_module_state
from xgrad.grad_mode import graph_off, is_grad_enabled
from xgrad.jax_capture import quiet_captures
from xgrad.ops._util import canonical_dim
from xgrad.step_trace import array_of
from xgrad.tensor import Tensor, is_tensor
from xgrad.tensor.inplace import ERR_MUTATE_CAPTURED

__all__ = [
    "debug_unwrap", "functional_call", "grad", "grad_and_value", "hessian", "jacfwd", "jacrev", "jvp", "linearize",
    "replace_all_batch_norm_modules_", "stack_module_state", "vjp", "vmap",
]



def _tensors(tree: Any) -> Any:
    """``tree`` with each array (or tracer) wrapped as a Tensor outside the graph."""
    return jax.tree_util.tree_map(lambda x: Tensor(x) if isinstance(x, jax.Array) else x, tree)


def _inside(tree: Any) -> Any:
    """The function's view of a tree of arguments: every Tensor a fresh one outside the graph."""
    return jax.tree_util.tree_map(lambda x: Tensor(array_of(x)) if isinstance(x, Tensor) else x, tree, is_leaf=is_tensor)



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
            with refuse_saved_hooks():
                out = _call(func, _with_args(args, nums, diff), kwargs)
            aux = None
            if has_aux:
                out, aux = _split_aux(out, "grad_and_value(f)(*args)")
            value = _scalar_output(out, "grad")
            return value, (value, arrays_of_tree(aux))

        diff = [arrays_of_tree(args[i]) for i in nums]
        grads, (value, aux) = jax.grad(of_arrays, argnums=tuple(range(len(nums))), has_aux=True)(*diff)
        # A complex input's gradient is PyTorch's (dL/dRe + i dL/dIm): the conjugate of JAX's.
        grads = jax.tree_util.tree_map(lambda g: g.conj() if jax.numpy.iscomplexobj(g) else g, grads)
        grads = _tensors(grads if isinstance(argnums, tuple) else grads[0])
        return (grads, (Tensor(value), _tensors(aux))) if has_aux else (grads, Tensor(value))

    return keeps_history(cached_per_signature(wrapper, func, reverse_mode=True))


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
        with refuse_saved_hooks():
            out = _call(func, [_tensors(a) for a in arrays], {})
        if has_aux:
            out, aux = _split_aux(out, "vjp(f, *primals)")
            _tensor_outputs(out, "vjp(f, *primals)")
            return arrays_of_tree(out), arrays_of_tree(aux)
        _tensor_outputs(out, "vjp(f, *primals)")
        return arrays_of_tree(out)

    check_no_saved_hooks()
    arrays = [arrays_of_tree(p) for p in primals]
    if has_aux:
        out, pullback, aux = jax.vjp(of_arrays, *arrays, has_aux=True)
    else:
        out, pullback = jax.vjp(of_arrays, *arrays)

    def pulled_back(tensors: Any, cotangents: Any) -> tuple[Any, ...]:
        # NOTE [History of vjp's results]: the pullback recomputed on these tensors, as one op of the graph.
        _, again = jax.vjp(lambda *a: of_arrays(*a)[0] if has_aux else of_arrays(*a), *arrays_of_tree(tensors))
        return tuple(_tensors(again(arrays_of_tree(cotangents))))

    def vjp_fn(cotangents: Any) -> tuple[Any, ...]:
        given = arrays_of_tree(cotangents)
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
        if is_grad_enabled() and has_history((primals, cotangents)):
            return keeps_history(pulled_back)(primals, cotangents)  # type: ignore[no-any-return]
        return tuple(_tensors(pullback(given)))

    if is_grad_enabled() and has_history(primals):
        # NOTE [History of vjp's results]
        # As torch.func's: called on tensors with history (grad mode on), ``vjp``'s output
        # keeps it, and so does what ``vjp_fn`` returns when called with grad mode on (its
        # gradients are then differentiable w.r.t. the primals and the cotangents: an outer
        # ``autograd.grad`` of a vjp). Grad mode is read at each call, so ``no_grad``
        # around either one cuts that one's history only. Each such call runs the
        # function again, as one op of xgrad's graph (NOTE [Transforms keep history]).
        recorded = keeps_history(lambda *tensors: _tensors(of_arrays(*arrays_of_tree(tensors))))(*primals)
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
        return arrays_of_tree(out), (arrays_of_tree(aux), written)

    p, t = arrays_of_tree(primals), arrays_of_tree(tangents)
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
        return arrays_of_tree(_call(func, [_tensors(a) for a in arrays], {}))

    arrays = [arrays_of_tree(p) for p in primals]
    out, linear = jax.linearize(of_arrays, *arrays)

    def jvp_fn(*tangents: Any) -> Any:
        given = arrays_of_tree(tangents)
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
            return arrays_of_tree(out), written

        written_dims = [d if isinstance(d, int) else None for d in dims]
        batched = jax.vmap(of_arrays, in_axes=tuple(dims[i] for i in mapped), out_axes=(out_dims, written_dims),
                           axis_name=FuncVmapAxis(randomness))  # NOTE [Functions under vmap]
        arrays = [arrays_of_tree(args[i]) for i in mapped]
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

    return keeps_history(cached_per_signature(wrapper, func))


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
            with refuse_saved_hooks() if name == "jacrev" else contextlib.nullcontext():
                out = _call(func, _with_args(args, nums, diff), kwargs)
            aux = None
            if has_aux:
                out, aux = _split_aux(out, f"{name}(f)(*args)")
            _tensor_outputs(out, where)
            _real_only(out, name, "outputs")
            return (arrays_of_tree(out), arrays_of_tree(aux)) if has_aux else arrays_of_tree(out)

        positions = tuple(range(len(nums))) if isinstance(argnums, tuple) else 0
        result = jax_transform(of_arrays, argnums=positions, has_aux=has_aux)(*[arrays_of_tree(args[i]) for i in nums])
        return (_tensors(result[0]), _tensors(result[1])) if has_aux else _tensors(result)

    return keeps_history(cached_per_signature(wrapper, func, reverse_mode=name == "jacrev"))


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
