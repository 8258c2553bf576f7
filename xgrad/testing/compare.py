"""``assert_grads_match``: one computation, run by xgrad (eager and compiled) and by JAX.

The function is written once against an array namespace (``fn(np, *xs)`` with ``np``
either ``xgrad`` or ``jax.numpy``), or given as an xgrad function plus a plain-array
``reference``. Every mode computes the forward values, a vector-Jacobian product
with one fixed random cotangent per output, and (``order=2``) the gradient of a
fixed random projection of that vjp: the same numbers, three ways.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import xgrad
from xgrad.bounded_cache import BoundedCache
from xgrad.tensor import Tensor, is_tensor
from xgrad.testing.functions import is_jax_function, jax_op, memoized, tensor_function

__all__ = ["DEFAULT_TOLERANCES", "GradientMismatch", "assert_grads_match", "tolerances"]

MODES = ("eager", "compiled", "jax")


class GradientMismatch(AssertionError):
    """Two ways of computing the same gradient disagree.

    >>> from xgrad.testing import GradientMismatch
    >>> issubclass(GradientMismatch, AssertionError)
    True
    """


def _float_leaves(tree: Any) -> list[Any]:
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=is_tensor)
    return [x for x in leaves if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]


def _random_like(rng: np.random.Generator, x: Any) -> np.ndarray:
    return np.asarray(rng.standard_normal(np.shape(x)), dtype=jnp.result_type(x))


# NOTE [The reference compiles once per function]
# The reference runs as one ``jax.jit`` program (compiling it once is faster than dispatching,
# and compiling, every primitive of the vjp on its own). That program is kept per reference
# function, differentiated positions, order, forward flag and non-differentiated inputs
# (closed over as constants, as a user's reference may read their values), and takes the
# differentiated arrays, cotangents, weights and tangents as arguments: a property test
# and its shrinking, which call the check again and again, compile it once per shape
# instead of once per call (see NOTE [One op per checked function]).
_JAX_RUNNERS: BoundedCache[Any, Callable[..., dict[str, list[Any]]]] = BoundedCache(256)


def _jax_runner(ref: Callable[..., Any], arrays: list[Any], diff: list[int], order: int,
                forward: bool) -> Callable[..., dict[str, list[Any]]]:
    constants = {i: a for i, a in enumerate(arrays) if i not in diff}
    key = (ref, tuple(diff), len(arrays), order, forward,
           tuple((i, np.asarray(a).dtype.str, np.shape(a), np.asarray(a).tobytes()) for i, a in constants.items()))
    return memoized(_JAX_RUNNERS, key, lambda: _make_jax_runner(ref, constants, len(arrays), diff, order, forward))


def _make_jax_runner(ref: Callable[..., Any], constants: dict[int, Any], n: int, diff: list[int], order: int,
                     forward: bool) -> Callable[..., dict[str, list[Any]]]:
    def of_diff(*d: Any) -> list[Any]:
        full = [constants.get(i) for i in range(n)]
        for i, a in zip(diff, d, strict=True):
            full[i] = a
        return _float_leaves(ref(*full))

    @jax.jit
    def run(primals: list[Any], cotangents: list[Any], weights: list[Any], tangents: list[Any]) -> dict[str, list[Any]]:
        outs, pullback = jax.vjp(of_diff, *primals)
        result = {"outputs": list(outs), "grads": list(pullback(list(cotangents)))}
        argnums = tuple(range(len(diff)))
        if order == 2:
            def projected(*d: Any) -> Any:
                _, pb = jax.vjp(of_diff, *d)
                return sum(jnp.vdot(g, w) for g, w in zip(pb(list(cotangents)), weights, strict=True))

            result["grads2"] = list(jax.grad(projected, argnums=argnums)(*primals))
        if forward:
            result["jvps"] = list(jax.jvp(of_diff, tuple(primals), tuple(tangents))[1])
            if order == 2:  # reverse over forward: the gradient of <jvp, cotangent>
                def jvp_projected(*d: Any) -> Any:
                    outs = jax.jvp(of_diff, d, tuple(tangents))[1]
                    return sum(jnp.vdot(c, o) for c, o in zip(cotangents, outs, strict=True))

                result["jvp_grads"] = list(jax.grad(jvp_projected, argnums=argnums)(*primals))
        return result

    return run


def _run_jax(ref: Callable[..., Any], arrays: list[Any], diff: list[int], cotangents: Any, weights: Any, order: int,
             tangents: list[Any] | None) -> dict[str, list[Any]]:
    run = _jax_runner(ref, arrays, diff, order, tangents is not None)
    return run([arrays[i] for i in diff], list(cotangents), list(weights), list(tangents or []))


def _run_xgrad(fn: Callable[..., Any], arrays: list[Any], diff: list[int], cotangents: Any, weights: Any, order: int,
               compiled: bool, tangents: list[Any] | None) -> dict[str, list[Any]]:
    tensors = [xgrad.tensor(a, requires_grad=i in diff) for i, a in enumerate(arrays)]
    wrt = [tensors[i] for i in diff]
    outs = _float_leaves(fn(*tensors))
    roots = [(o, Tensor(jax.device_put(c, o.sharding))) for o, c in zip(outs, cotangents, strict=True) if o.requires_grad]
    result: dict[str, list[Any]] = {"outputs": [o.array for o in outs]}
    if roots:
        grads = xgrad.autograd.grad(
            [o for o, _ in roots], wrt, [c for _, c in roots], create_graph=order == 2, allow_unused=True, compiled=compiled
        )
    else:
        grads = (None,) * len(wrt)
    result["grads"] = [jnp.zeros_like(t.array) if g is None else g.array for g, t in zip(grads, wrt, strict=True)]
    if order == 2:
        terms = [(g * xgrad.tensor(w)).sum() for g, w in zip(grads, weights, strict=True) if g is not None and g.requires_grad]
        grads2: Sequence[Any] = (None,) * len(wrt)
        if terms:
            total = terms[0]
            for t in terms[1:]:
                total = total + t
            grads2 = xgrad.autograd.grad(total, wrt, allow_unused=True, compiled=compiled)
        result["grads2"] = [jnp.zeros_like(t.array) if g is None else g.array for g, t in zip(grads2, wrt, strict=True)]
    if tangents is not None:
        result.update(_run_forward(fn, tensors, diff, cotangents, tangents, order, compiled))
    return result


def _run_forward(fn: Callable[..., Any], tensors: list[Tensor], diff: list[int], cotangents: Any, tangents: list[Any],
                 order: int, compiled: bool) -> dict[str, list[Any]]:
    """Forward mode: the outputs' tangents inside a dual level, and (order 2) their gradients."""
    from xgrad.autograd import forward_ad

    wrt = [tensors[i] for i in diff]
    with forward_ad.dual_level():
        duals = list(tensors)
        for i, t in zip(diff, tangents, strict=True):
            duals[i] = forward_ad.make_dual(tensors[i], xgrad.tensor(t))
        outs = [forward_ad.unpack_dual(o).tangent for o in _float_leaves(fn(*duals))]
    result = {"jvps": [jnp.zeros(np.shape(c), np.result_type(c)) if o is None else o.array for o, c in zip(outs, cotangents, strict=True)]}
    if order == 2:
        terms = [(o * Tensor(jax.device_put(c, o.sharding))).sum() for o, c in zip(outs, cotangents, strict=True)
                 if o is not None and o.requires_grad]
        grads: Sequence[Any] = (None,) * len(wrt)
        if terms:
            total = terms[0]
            for t in terms[1:]:
                total = total + t
            grads = xgrad.autograd.grad(total, wrt, allow_unused=True, compiled=compiled)
        result["jvp_grads"] = [jnp.zeros_like(t.array) if g is None else g.array for g, t in zip(grads, wrt, strict=True)]
    return result


_WHAT = {
    "outputs": "forward output {k}", "grads": "gradient w.r.t. input {i}", "grads2": "second-order gradient w.r.t. input {i}",
    "jvps": "forward-mode tangent of output {k}", "jvp_grads": "gradient of the forward-mode tangents w.r.t. input {i}",
}


# NOTE [Tolerances by dtype]
# Two correct derivative rules (a hand-written custom_vjp and JAX's autodiff, an eager rule
# and XLA's fusion of it) round differently, and each element's rounding error follows the
# size of the terms it was computed from, which is the array's scale rather than the
# element's own: a correct float32 layer-norm rule on inputs of standard deviation 0.1
# (gradients up to about 10) differs from autodiff by up to 1.6e-5, also on elements near 0.
# So the default tolerance follows the compared dtype, its absolute part taken relative to
# the reference's largest magnitude (when above 1): float32 allows 1e-5 of that and rtol
# 1e-4 (about 800 ulps), float16 and bfloat16 more, float64 the 1e-6 and 1e-5 that were
# every dtype's default before. A wrong rule (a missing term, a factor off by 1%) is off
# by far more.
DEFAULT_TOLERANCES = {  # dtype name: (atol, rtol)
    "float64": (1e-6, 1e-5), "complex128": (1e-6, 1e-5),
    "float32": (1e-5, 1e-4), "complex64": (1e-5, 1e-4),
    "float16": (1e-3, 1e-2), "bfloat16": (1e-2, 5e-2),
}


def tolerances(dtype: Any, atol: float | None = None, rtol: float | None = None, scale: float = 1.0) -> tuple[float, float]:
    """``(atol, rtol)`` for values of ``dtype`` whose largest magnitude is ``scale``.

    Those given, else the dtype's defaults, the default ``atol`` times ``max(1, scale)``
    (NOTE [Tolerances by dtype]).

    >>> from xgrad.testing.compare import tolerances
    >>> tolerances("float32"), tolerances("float32", scale=10.0), tolerances("float64", rtol=1e-9)
    ((1e-05, 0.0001), (0.0001, 0.0001), (1e-06, 1e-09))
    """
    default_atol, default_rtol = DEFAULT_TOLERANCES.get(np.dtype(dtype).name, DEFAULT_TOLERANCES["float64"])
    return (default_atol * max(1.0, scale) if atol is None else atol), (default_rtol if rtol is None else rtol)


def _compare(a: Any, b: Any, atol: float | None, rtol: float | None) -> str | None:
    """``None`` when ``a`` and ``b`` agree, else a description of the worst element."""
    a_np, b_np = np.asarray(a), np.asarray(b)
    if a_np.shape != b_np.shape:
        return f"shapes differ: {list(a_np.shape)} vs {list(b_np.shape)}"
    if a_np.dtype != b_np.dtype:
        return f"dtypes differ: {a_np.dtype} vs {b_np.dtype}"
    if a_np.size == 0:
        return None
    a64, b64 = a_np.astype(np.float64), b_np.astype(np.float64)
    finite = np.abs(b64[np.isfinite(b64)])
    atol, rtol = tolerances(b_np.dtype, atol, rtol, scale=float(finite.max()) if finite.size else 1.0)
    both_nan = np.isnan(a64) & np.isnan(b64)
    excess = np.where(both_nan, 0.0, np.abs(a64 - b64) - (atol + rtol * np.abs(b64)))
    excess = np.where(np.isnan(excess), np.inf, excess)
    if not (excess > 0).any():
        return None
    worst = np.unravel_index(int(np.argmax(excess)), a64.shape)
    return (
        f"worst element at index {tuple(int(w) for w in worst)}: {float(a64[worst])!r} vs {float(b64[worst])!r} "
        f"(|diff| {abs(a64[worst] - b64[worst]):.3g}, allowed {atol + rtol * abs(b64[worst]):.3g})"
    )


ACCEPTED = (
    "assert_grads_match: fn must be fn(np, *xs), written once against an array namespace (np is xgrad or "
    "jax.numpy); an xgrad function of Tensors, with reference= the same function in plain JAX; or a function of "
    "jax.Arrays, such as a jax.custom_vjp, whose derivative is compared with JAX's autodiff of the function it "
    "wraps; got {what}"
)


def _accepts(fn: Callable[..., Any], n: int) -> bool | None:
    """Whether ``fn`` can be called with ``n`` positional arguments (``None``: no signature to tell)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*range(n))
    except TypeError:
        return False
    return True


def _functions(fn: Any, reference: Callable[..., Any] | None, n: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The xgrad function of Tensors and the plain-JAX reference that ``fn`` (and ``reference``) stand for."""
    if not callable(fn):
        raise TypeError(ACCEPTED.format(what=type(fn).__name__))
    if reference is not None:
        return tensor_function(fn, "assert_grads_match"), reference
    if is_jax_function(fn) or (_accepts(fn, n) and not _accepts(fn, n + 1)):
        # A function of arrays: xgrad runs it as one op (its own vjp, a custom rule included);
        # the reference is JAX's autodiff of what a custom_vjp/custom_jvp wraps.
        wrapped = fn.fun if isinstance(fn, (jax.custom_vjp, jax.custom_jvp)) else fn
        return jax_op(fn), wrapped
    if _accepts(fn, n + 1) is False:
        raise TypeError(ACCEPTED.format(what=f"a function that takes neither {n} nor {n + 1} positional arguments"))
    return _in_namespace(fn, xgrad), _in_namespace(fn, jnp)


# One partial per function and namespace: the reference's program is kept per function object.
_NAMESPACE_CALLS: BoundedCache[Any, Callable[..., Any]] = BoundedCache(256)


def _in_namespace(fn: Callable[..., Any], namespace: Any) -> Callable[..., Any]:
    """``fn(namespace, *xs)`` as a function of ``xs``, the same object for the same ``fn`` where it can be."""
    return memoized(_NAMESPACE_CALLS, (fn, namespace), lambda: functools.partial(fn, namespace))


def assert_grads_match(
    fn: Callable[..., Any],
    *inputs: Any,
    reference: Callable[..., Any] | None = None,
    modes: Sequence[str] = MODES,
    order: int = 1,
    atol: float | None = None,
    rtol: float | None = None,
    seed: int = 0,
    forward: bool = False,
) -> None:
    """Check that xgrad eager, xgrad compiled and ``jax`` agree on ``fn``'s values and gradients.

    Args:
        fn: ``fn(np, *xs)`` written against an array namespace (``np`` is ``xgrad`` or
            ``jax.numpy``); with ``reference``, an xgrad function ``fn(*tensors)``; or a
            function of ``jax.Array``s (one positional argument per input, or a
            ``jax.custom_vjp``/``custom_jvp``/jitted function), which xgrad runs through
            ``xgrad.from_jax`` (its own vjp: a custom rule) and which is compared with
            JAX's autodiff of the function a ``custom_vjp``/``custom_jvp`` wraps
            (``fn.fun``), unless ``reference`` is given.
        inputs: arrays (or Tensors); the floating ones are differentiated.
        reference: ``reference(*arrays)`` in plain JAX, when ``fn`` is xgrad-only.
        modes: any of ``"eager"``, ``"compiled"`` (``autograd.grad(..., compiled=True)``)
            and ``"jax"``; every pair is compared.
        order: ``2`` also compares the gradient of a random projection of the vjp.
        atol, rtol: tolerance, ``|a - b| <= atol + rtol * |b|`` elementwise; by default set by
            the compared values' dtype (``DEFAULT_TOLERANCES``: 1e-5 and 1e-4 for float32,
            1e-6 and 1e-5 for float64, looser for float16 and bfloat16), the default
            ``atol`` times the reference's largest magnitude where that is above 1.
        seed: seeds the random cotangents and projections.
        forward: also compare forward mode: the outputs' tangents for one random tangent per
            input (``xgrad.autograd.forward_ad`` against ``jax.jvp``) and, with ``order=2``,
            the gradient of their projection on the cotangents (reverse over forward).

    Raises:
        GradientMismatch: naming the pair of modes, the output or input, and the worst element.

    >>> import numpy as np
    >>> from xgrad.testing import assert_grads_match
    >>> assert_grads_match(lambda np, x: np.sum(np.tanh(x) * x), np.linspace(-1, 1, 5), modes=("eager", "jax"))
    >>> import jax, jax.numpy as jnp
    >>> @jax.custom_vjp
    ... def softplus(x):
    ...     return jnp.logaddexp(x, 0.0)
    >>> softplus.defvjp(lambda x: (softplus(x), x), lambda x, g: (g * jax.nn.sigmoid(x),))
    >>> assert_grads_match(softplus, np.linspace(-3, 3, 7), modes=("eager", "jax"))  # the rule vs JAX's autodiff
    """
    unknown = [m for m in modes if m not in MODES]
    if unknown or len(modes) < 2:
        raise ValueError(f"modes must be at least two of {MODES}, got {tuple(modes)}")
    if order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, got {order}")
    bad = [type(x).__name__ for x in inputs if not isinstance(x, (Tensor, jax.Array, np.ndarray, np.generic, int, float, list))]
    if bad:
        raise TypeError(f"assert_grads_match: inputs must be arrays (jax.Array or NumPy), Tensors, Python numbers or lists; got {', '.join(bad)}")
    arrays = [x.array if isinstance(x, Tensor) else jnp.asarray(x) for x in inputs]
    diff = [i for i, a in enumerate(arrays) if jnp.issubdtype(a.dtype, jnp.inexact)]
    if not diff:
        raise ValueError("assert_grads_match needs at least one floating-point input to differentiate")
    xgrad_fn, ref_fn = _functions(fn, reference, len(inputs))

    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda *a: _float_leaves(ref_fn(*a)), *arrays)
    cotangents = [_random_like(rng, s) for s in shapes]
    weights = [_random_like(rng, arrays[i]) for i in diff]
    tangents = [_random_like(rng, arrays[i]) for i in diff] if forward else None

    results = {}
    for mode in modes:
        if mode == "jax":
            results[mode] = _run_jax(ref_fn, arrays, diff, cotangents, weights, order, tangents)
        elif mode == "compiled":
            from xgrad.engine.compiled import RecompileWarning

            # Each checked function is a new graph: recompiling is the point here, not a storm.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RecompileWarning)
                results[mode] = _run_xgrad(xgrad_fn, arrays, diff, cotangents, weights, order, True, tangents)
        else:
            results[mode] = _run_xgrad(xgrad_fn, arrays, diff, cotangents, weights, order, False, tangents)

    for pos, first in enumerate(modes):
        for second in modes[pos + 1 :]:
            a, b = results[first], results[second]
            for key in ("outputs", "grads", "grads2", "jvps", "jvp_grads"):
                if key not in a:
                    continue
                if len(a[key]) != len(b[key]):
                    raise GradientMismatch(f"{first} vs {second}: {len(a[key])} vs {len(b[key])} floating outputs")
                for k, (va, vb) in enumerate(zip(a[key], b[key], strict=True)):
                    problem = _compare(va, vb, atol, rtol)
                    if problem is not None:
                        where = _WHAT[key].format(k=k, i=diff[k] if key not in ("outputs", "jvps") else k)
                        raise GradientMismatch(f"{first} vs {second} disagree on the {where}: {problem}")
