"""``gradcheck`` and ``gradgradcheck``: analytical gradients against float64 finite differences.

Full mode builds both Jacobians, one column of central differences per input element
and one vjp per output element. Fast mode (the default for large inputs) compares a
single number per (input, output) pair: ``u^T J v`` for random unit ``u`` and ``v``,
numerically from one directional difference and analytically from one vjp; on a
mismatch it builds that pair's full Jacobian to name the worst element.

Around the Jacobians it checks what PyTorch's ``gradcheck`` checks: every vjp is
computed twice and must agree (a backward that is not reentrant, nondeterministic);
the outputs keep their shapes and dtypes when an input is perturbed; a zero
``grad_output`` gives zero gradients (a backward not multiplied by ``grad_output``);
the backward handles undefined (``None``) output gradients; a function with no
differentiable output has a zero numerical gradient.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import xgrad
from xgrad.engine.function import Function
from xgrad.tensor import Tensor
from xgrad.testing.functions import check_inputs, tensor_function

__all__ = ["GradcheckError", "gradcheck", "gradgradcheck"]

#: Above this many input-times-output elements, ``fast_mode=None`` picks fast mode.
FAST_MODE_THRESHOLD = 4096

class GradcheckError(RuntimeError):
    """A gradient check failed: an analytical gradient disagrees with finite differences,
    or the backward misbehaves (see the module notes). A ``RuntimeError``, as PyTorch's.

    >>> from xgrad.testing import GradcheckError
    >>> try:
    ...     raise GradcheckError("Jacobian mismatch")
    ... except RuntimeError as e:
    ...     print(type(e).__name__)
    GradcheckError
    """


ERR_NOT_REENTRANT = (
    "Backward is not reentrant, i.e., running backward with same input and grad_output multiple times gives "
    "different values, although analytical gradient matches numerical gradient. The tolerance for nondeterminism "
    "was {tol}. If the backward is meant to be nondeterministic, pass nondet_tol= the variation it may have."
)
ERR_NOT_MULTIPLIED = "backward not multiplied by grad_output"
ERR_UNDEFINED_RAISES = (
    "Expected backward function to handle undefined output grads: the backward raised when an output's gradient "
    "was undefined (None)"
)
ERR_UNDEFINED_NONZERO = (
    "Expected all input grads to be undefined or zero when all output grads are undefined or zero"
)
WARN_UNDEFINED = (
    "Backwards compatibility: New undefined gradient support checking feature is enabled by default, but it may "
    'break existing callers of this function. If this is true for you, you can call this function with '
    '"check_undefined_grad=False" to disable the feature'
)
ERR_NUMERICAL_NOT_ZERO = "Numerical gradient for function expected to be zero"
WARN_NOT_DOUBLE = (
    "Input #{i} requires gradient and is not a double precision floating point or complex. gradcheck checks it "
    "upcast to float64, not at its own dtype {dtype}."
)
ERR_PERTURBED = (
    "Expected `func` to return outputs with the same {what} when inputs are perturbed by {eps}, but got: "
    "{what}s {a} and {b}."
)


@contextlib.contextmanager
def _float64() -> Iterator[None]:
    """float64 for the duration of a check, leaving the process's x64 setting as it was.

    Turning ``jax_enable_x64`` on globally would make every later array of the user's
    program float64; the scoped switch changes only what runs inside the check.
    """
    if jax.config.jax_enable_x64:  # type: ignore[attr-defined]  # jax's Config stub declares no flags
        yield
        return
    scope: Callable[[bool], contextlib.AbstractContextManager[Any]] | None = getattr(jax, "enable_x64", None)
    if scope is None:  # jax before the top-level switch; newer jax has no jax.experimental.enable_x64
        from jax.experimental import enable_x64 as experimental_scope  # type: ignore[attr-defined]

        scope = experimental_scope
    with scope(True):
        yield


def _warn_non_double(inputs: Any) -> None:
    """PyTorch's warning for each input that requires grad in a precision below double."""
    items = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
    for i, x in enumerate(items):
        if isinstance(x, Tensor) and x.requires_grad and x.dtype not in (jnp.float64, jnp.complex128):
            warnings.warn(WARN_NOT_DOUBLE.format(i=i, dtype=x.dtype), UserWarning, stacklevel=3)


def _prepare(inputs: Any) -> tuple[list[Any], list[int]]:
    """Inputs as float64 tensors where floating, and the indices of those differentiated.

    A Tensor is differentiated when it requires grad; a plain floating array always is.
    """
    items = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
    prepared: list[Any] = []
    diff: list[int] = []
    for i, x in enumerate(items):
        if isinstance(x, Tensor):
            wants = x.requires_grad
            array = x.array
        elif isinstance(x, (np.ndarray, jax.Array, float, list)):
            array = jnp.asarray(x)
            wants = jnp.issubdtype(array.dtype, jnp.inexact)
        else:
            prepared.append(x)
            continue
        if jnp.issubdtype(array.dtype, jnp.floating):
            array = array.astype(jnp.float64)
        prepared.append(Tensor(array))
        if wants:
            diff.append(i)
    if not diff:
        raise ValueError("gradcheck expects at least one input tensor to require gradient")
    return prepared, diff


def _outputs(fn: Callable[..., Any], args: Sequence[Any]) -> list[Tensor]:
    result = fn(*args)
    leaves = jax.tree_util.tree_leaves(result, is_leaf=lambda x: isinstance(x, Tensor))
    return [t for t in leaves if isinstance(t, Tensor) and jnp.issubdtype(t.dtype, jnp.inexact)]


def _perturbed_outputs(fn: Callable[..., Any], args: list[Any], i: int, value: Any) -> list[Tensor]:
    """The floating outputs with input ``i`` replaced by ``value``."""
    probe = list(args)
    # Grad mode stays on and the probe requires grad as the input did: ``fn`` may itself
    # differentiate (gradgradcheck checks a function that calls ``autograd.grad``).
    probe[i] = Tensor(value).requires_grad_(args[i].requires_grad)
    return _outputs(fn, probe)


def _evaluate(fn: Callable[..., Any], args: list[Any], i: int, value: Any) -> list[np.ndarray]:
    """The outputs (as float64 NumPy) with input ``i`` replaced by ``value``."""
    return [np.asarray(o.array, dtype=np.float64) for o in _perturbed_outputs(fn, args, i, value)]


def _check_same_dtype_and_shape(plus: list[Tensor], minus: list[Tensor], eps: float) -> None:
    """Outputs whose shape or dtype depend on the input values have no Jacobian: an
    ``AssertionError``, as PyTorch raises (not a ``GradcheckError``: it is a misuse)."""
    for a, b in zip(plus, minus, strict=True):
        if a.shape != b.shape:
            raise AssertionError(ERR_PERTURBED.format(what="shape", eps=eps, a=tuple(a.shape), b=tuple(b.shape)))
        if a.dtype != b.dtype:
            raise AssertionError(ERR_PERTURBED.format(what="dtype", eps=eps, a=a.dtype, b=b.dtype))


def _numerical_column(fn: Callable[..., Any], args: list[Any], i: int, direction: Any, eps: float) -> list[np.ndarray]:
    """Central difference of every output along ``direction`` in input ``i``."""
    x = args[i].array
    plus = _perturbed_outputs(fn, args, i, x + eps * direction)
    minus = _perturbed_outputs(fn, args, i, x - eps * direction)
    if len(plus) != len(minus):
        raise AssertionError(ERR_PERTURBED.format(what="number of output", eps=eps, a=len(plus), b=len(minus)))
    _check_same_dtype_and_shape(plus, minus, eps)
    return [(np.asarray(p.array, np.float64) - np.asarray(m.array, np.float64)) / (2 * eps) for p, m in zip(plus, minus, strict=True)]


def _vjp(outs: list[Tensor], wrt: list[Tensor], j: int, cotangent: Any) -> list[np.ndarray]:
    """Analytical ``cotangent^T J`` of output ``j`` w.r.t. each of ``wrt`` (zeros where unused)."""
    out = outs[j]
    if not out.requires_grad:
        return [np.zeros(t.shape) for t in wrt]
    grads = xgrad.autograd.grad(out, wrt, Tensor(jax.device_put(cotangent, out.sharding)), retain_graph=True, allow_unused=True)
    result = []
    for g, t in zip(grads, wrt, strict=True):
        if g is not None and g.shape != t.shape:
            raise GradcheckError(f"the gradient w.r.t. input has shape {list(g.shape)}, but the input has shape {list(t.shape)}")
        result.append(np.zeros(t.shape) if g is None else np.asarray(g.array, dtype=np.float64))
    return result


def _reentrant_vjp(outs: list[Tensor], wrt: list[Tensor], j: int, cotangent: Any, nondet_tol: float) -> list[np.ndarray]:
    """``_vjp`` computed twice, which must agree within ``nondet_tol`` (PyTorch's reentrancy check).

    As in PyTorch, a NaN anywhere in the difference passes: NaN compares false.
    """
    first = _vjp(outs, wrt, j, cotangent)
    second = _vjp(outs, wrt, j, cotangent)
    for a, b in zip(first, second, strict=True):
        if a.size and np.max(np.abs(a - b)) > nondet_tol:
            raise GradcheckError(ERR_NOT_REENTRANT.format(tol=nondet_tol))
    return first


def _full_jacobians(fn: Callable[..., Any], args: list[Any], diff: list[int], outs: list[Tensor], eps: float,
                    pairs: Sequence[tuple[int, int]] | None = None,
                    nondet_tol: float = 0.0) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """``{(input, output): (numerical, analytical)}``, each of shape (output size, input size)."""
    wrt = [args[i] for i in diff]
    wanted = set(pairs) if pairs is not None else {(i, j) for i in diff for j in range(len(outs))}
    numerical: dict[tuple[int, int], np.ndarray] = {}
    for i in diff:
        if not any((i, j) in wanted for j in range(len(outs))):
            continue
        x = args[i].array
        cols: list[list[np.ndarray]] = []
        for k in range(x.size):
            basis = jnp.zeros(x.size, x.dtype).at[k].set(1).reshape(x.shape)
            cols.append(_numerical_column(fn, args, i, basis, eps))
        for j in range(len(outs)):
            numerical[(i, j)] = np.stack([c[j].ravel() for c in cols], axis=1) if cols else np.zeros((outs[j].array.size, 0))
    analytical: dict[tuple[int, int], np.ndarray] = {}
    for j, out in enumerate(outs):
        if not any((i, j) in wanted for i in diff):
            continue
        rows = []
        for k in range(out.array.size):
            basis = jnp.zeros(out.array.size, out.dtype).at[k].set(1).reshape(out.shape)
            rows.append(_reentrant_vjp(outs, wrt, j, basis, nondet_tol))
        for pos, i in enumerate(diff):
            analytical[(i, j)] = np.stack([r[pos].ravel() for r in rows]) if rows else np.zeros((0, args[i].array.size))
    return {p: (numerical[p], analytical[p]) for p in wanted}


def _worst(num: np.ndarray, ana: np.ndarray, atol: float, rtol: float) -> tuple[int, int] | None:
    excess = np.abs(num - ana) - (atol + rtol * np.abs(num))
    excess = np.where(np.isnan(excess), np.inf, excess)
    if not (excess > 0).any():
        return None
    return np.unravel_index(int(np.argmax(excess)), excess.shape)  # type: ignore[return-value]


def _describe(i: int, j: int, num: np.ndarray, ana: np.ndarray, worst: tuple[int, int], in_shape: tuple[int, ...],
              out_shape: tuple[int, ...], prefix: str, mode: str = "") -> str:
    r, c = worst
    out_idx = tuple(int(v) for v in np.unravel_index(r, out_shape)) if out_shape else ()
    in_idx = tuple(int(v) for v in np.unravel_index(c, in_shape)) if in_shape else ()
    lines = [
        f"{prefix}Jacobian {mode}mismatch for output {j} with respect to input {i}: worst element "
        f"d output[{j}]{list(out_idx)} / d input[{i}]{list(in_idx)}: numerical {float(num[r, c])!r} vs analytical {float(ana[r, c])!r} "
        f"(analytical / numerical = {ana[r, c] / num[r, c] if num[r, c] else float('nan'):.4g})",
    ]
    if num.size <= 64:
        lines += ["numerical:", np.array2string(num, precision=5), "analytical:", np.array2string(ana, precision=5)]
    return "\n".join(lines)


def gradcheck(
    fn: Callable[..., Any],
    inputs: Any,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    fast_mode: bool | None = None,
    *,
    nondet_tol: float = 0.0,
    check_undefined_grad: bool = True,
    check_forward_ad: bool = False,
    check_backward_ad: bool = True,
    seed: int = 0,
    _prefix: str = "",
) -> bool:
    """Check ``fn``'s gradients against central finite differences in float64.

    Args:
        fn: takes xgrad tensors, returns a Tensor or a pytree of them; or a function of
            ``jax.Array``s (a ``jax.custom_vjp``), checked through ``xgrad.from_jax``,
            so that its JAX derivative (the custom rule) is what is checked.
        inputs: a Tensor or a sequence; Tensors that require grad (and plain floating
            arrays) are checked, others are passed through. Floating inputs are upcast
            to float64 (a Tensor that requires grad in a lower precision warns, as in
            PyTorch). The outputs that require grad are checked; when none does, the
            numerical gradient must be zero.
        eps: finite-difference step.
        atol, rtol: tolerance, ``|numerical - analytical| <= atol + rtol * |numerical|``.
        raise_exception: raise ``GradcheckError`` on a failed check (else return False).
            An output whose shape or dtype changes with a perturbed input raises
            ``AssertionError`` either way, and so does anything ``fn`` raises.
        fast_mode: compare one random direction per (input, output) pair instead of the
            full Jacobian; default: fast when the Jacobian has more than
            ``FAST_MODE_THRESHOLD`` elements.
        nondet_tol: how much two backwards with the same inputs and ``grad_output`` may
            differ (``0.0``: bit for bit).
        check_undefined_grad: also check that the backward handles undefined (``None``)
            output gradients.
        check_forward_ad: also check forward mode (``xgrad.autograd.forward_ad``): the
            outputs' tangents along each input direction against the same differences.
        check_backward_ad: check reverse mode (vector-Jacobian products), the default.
        seed: seeds the random directions of fast mode.

    Returns:
        True when every check passes.

    >>> import xgrad
    >>> from xgrad.testing import gradcheck
    >>> x = xgrad.tensor([0.5, -1.0, 2.0], dtype="float64", requires_grad=True)
    >>> gradcheck(lambda x: (x.sin() * x).sum(), (x,))
    True
    """
    fn = tensor_function(fn, "gradcheck")
    check_inputs(inputs, "gradcheck")
    _warn_non_double(inputs)
    with _float64():
        args, diff = _prepare(inputs)
        for i in diff:
            args[i] = Tensor(args[i].array).requires_grad_(True)
        all_outs = _outputs(fn, args)
        keep = [j for j, o in enumerate(all_outs) if o.requires_grad]
        outs = [all_outs[j] for j in keep]
        differentiable = _differentiable_outputs(fn, keep)
        n_in = sum(args[i].array.size for i in diff)
        n_out = sum(o.array.size for o in outs)
        if fast_mode is None:
            fast_mode = n_in * n_out > FAST_MODE_THRESHOLD
        try:
            if not outs:
                _check_no_differentiable_outputs(fn, args, diff, eps)
                return True
            if check_backward_ad:
                if fast_mode:
                    _check_fast(differentiable, args, diff, outs, eps, atol, rtol, seed, _prefix, nondet_tol)
                else:
                    _check_full(differentiable, args, diff, outs, eps, atol, rtol, _prefix, nondet_tol)
                _check_backward_mul_by_grad_output(outs, [args[i] for i in diff], _prefix)
                if check_undefined_grad:
                    _check_undefined_grad(differentiable, args, diff, len(outs), _prefix)
            if check_forward_ad:
                _check_forward(fn, args, diff, outs, eps, atol, rtol, seed, _prefix, fast_mode)
        except GradcheckError:
            if raise_exception:
                raise
            return False
        return True


def _differentiable_outputs(fn: Callable[..., Any], keep: list[int]) -> Callable[..., list[Tensor]]:
    """``fn`` returning only its floating outputs at positions ``keep`` (those that required grad)."""

    def selected(*args: Any) -> list[Tensor]:
        outs = _outputs(fn, args)
        return [outs[j] for j in keep if j < len(outs)]

    return selected


def _check_no_differentiable_outputs(fn: Callable[..., Any], args: list[Any], diff: list[int], eps: float) -> None:
    """No output requires grad: the function must then not depend on the inputs (PyTorch's check)."""
    for i in diff:
        x = args[i].array
        for k in range(x.size):
            basis = jnp.zeros(x.size, x.dtype).at[k].set(1).reshape(x.shape)
            if any(np.any(c != 0) for c in _numerical_column(fn, args, i, basis, eps)):
                raise GradcheckError(ERR_NUMERICAL_NOT_ZERO)


def _check_backward_mul_by_grad_output(outs: list[Tensor], wrt: list[Tensor], prefix: str) -> None:
    """A zero ``grad_output`` must give zero gradients of the inputs' dtype, shape and device."""
    zeros = [Tensor(jnp.zeros(o.shape, o.dtype, device=o.sharding)) for o in outs]
    grads = xgrad.autograd.grad(outs, wrt, zeros, allow_unused=True)
    for g, x in zip(grads, wrt, strict=True):
        if g is None:
            continue
        if not bool(jnp.all(g.array == 0)):
            raise GradcheckError(prefix + ERR_NOT_MULTIPLIED)
        if g.dtype != x.dtype:
            raise GradcheckError(f"{prefix}grad is incorrect type")
        if g.shape != x.shape:
            raise GradcheckError(f"{prefix}grad is incorrect size")
        if g.array.sharding.device_set != x.array.sharding.device_set:
            raise GradcheckError(f"{prefix}grad is incorrect device")


class _UndefinedGrad(Function):
    """Identity whose backward sends an undefined (``None``) gradient on: PyTorch's ``UndefinedGrad``."""

    _traced_in_step = True  # its ``None`` flows on as eager's (a host call returns arrays)

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return Tensor(x.array)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> None:
        return None


def _check_undefined_grad(fn: Callable[..., list[Tensor]], args: list[Any], diff: list[int], n_outs: int, prefix: str) -> None:
    """The backward must work when every output's gradient is undefined, and, with several
    outputs, when one at a time is; the input gradients must then be ``None`` or zero."""
    wrt = [args[i] for i in diff]
    cases = [set(range(n_outs))] + ([{k} for k in range(n_outs)] if n_outs > 1 else [])
    for undefined in cases:
        outs = [_UndefinedGrad.apply(o) if k in undefined else o for k, o in enumerate(fn(*args))]
        zeros = [Tensor(jnp.zeros(o.shape, o.dtype, device=o.sharding)) for o in outs]
        try:
            grads = xgrad.autograd.grad(outs, wrt, zeros, allow_unused=True)
        except RuntimeError as exc:
            warnings.warn(WARN_UNDEFINED, UserWarning, stacklevel=4)
            raise GradcheckError(f"{prefix}{ERR_UNDEFINED_RAISES}: {exc}") from exc
        if any(g is not None and not bool(jnp.all(g.array == 0)) for g in grads):
            warnings.warn(WARN_UNDEFINED, UserWarning, stacklevel=4)
            raise GradcheckError(prefix + ERR_UNDEFINED_NONZERO)


def _check_full(fn: Callable[..., Any], args: list[Any], diff: list[int], outs: list[Tensor], eps: float, atol: float,
                rtol: float, prefix: str, nondet_tol: float = 0.0) -> None:
    for (i, j), (num, ana) in sorted(_full_jacobians(fn, args, diff, outs, eps, nondet_tol=nondet_tol).items()):
        worst = _worst(num, ana, atol, rtol)
        if worst is not None:
            raise GradcheckError(_describe(i, j, num, ana, worst, args[i].shape, outs[j].shape, prefix))


def _check_fast(fn: Callable[..., Any], args: list[Any], diff: list[int], outs: list[Tensor], eps: float, atol: float,
                rtol: float, seed: int, prefix: str, nondet_tol: float = 0.0) -> None:
    rng = np.random.default_rng(seed)
    directions = {i: _unit(rng, args[i].shape) for i in diff}
    cotangents = [_unit(rng, o.shape) for o in outs]
    wrt = [args[i] for i in diff]
    analytical = [_reentrant_vjp(outs, wrt, j, jnp.asarray(u, outs[j].dtype), nondet_tol) for j, u in enumerate(cotangents)]
    for pos, i in enumerate(diff):
        columns = _numerical_column(fn, args, i, jnp.asarray(directions[i]), eps)
        for j, u in enumerate(cotangents):
            num = float(np.vdot(u, columns[j]))
            ana = float(np.vdot(analytical[j][pos], directions[i]))
            if abs(num - ana) <= atol + rtol * abs(num):
                continue
            # Locate the bad element: this pair's full Jacobian, when small enough to build.
            if args[i].array.size * outs[j].array.size <= 16 * FAST_MODE_THRESHOLD:
                (num_j, ana_j), = _full_jacobians(fn, args, diff, outs, eps, pairs=[(i, j)], nondet_tol=nondet_tol).values()
                worst = _worst(num_j, ana_j, atol, rtol)
                if worst is not None:
                    detail = _describe(i, j, num_j, ana_j, worst, args[i].shape, outs[j].shape, prefix)
                    raise GradcheckError(f"{detail}\n(found in fast mode: u^T J v numerical {num!r} vs analytical {ana!r})")
            raise GradcheckError(
                f"{prefix}Jacobian mismatch for output {j} with respect to input {i} in fast mode: "
                f"u^T J v numerical {num!r} vs analytical {ana!r}; rerun with fast_mode=False to see the worst element"
            )


def _jvp(fn: Callable[..., Any], args: list[Any], i: int, direction: Any) -> list[np.ndarray]:
    """Forward mode: every output's tangent along ``direction`` in input ``i`` (zeros where it has none)."""
    from xgrad.autograd import forward_ad

    with forward_ad.dual_level():
        probe = list(args)
        probe[i] = forward_ad.make_dual(args[i], Tensor(jnp.asarray(direction, args[i].dtype)))
        outs = _outputs(fn, probe)
        tangents = [forward_ad.unpack_dual(o).tangent for o in outs]
    return [np.zeros(o.shape) if t is None else np.asarray(t.array, dtype=np.float64) for o, t in zip(outs, tangents, strict=True)]


def _check_forward(fn: Callable[..., Any], args: list[Any], diff: list[int], outs: list[Tensor], eps: float, atol: float,
                   rtol: float, seed: int, prefix: str, fast_mode: bool) -> None:
    """Forward-mode Jacobian-vector products against central differences along the same directions."""
    rng = np.random.default_rng(seed + 1)
    for i in diff:
        x = args[i].array
        if fast_mode:
            directions = [_unit(rng, x.shape)]
        else:
            directions = [np.eye(x.size, 1, -k).reshape(x.shape) for k in range(x.size)]
        numerical = [_numerical_column(fn, args, i, jnp.asarray(d, x.dtype), eps) for d in directions]
        forward = [_jvp(fn, args, i, d) for d in directions]
        for j, out in enumerate(outs):
            num = np.stack([c[j].ravel() for c in numerical], axis=1)
            fwd = np.stack([c[j].ravel() for c in forward], axis=1)
            worst = _worst(num, fwd, atol, rtol)
            if worst is None:
                continue
            if fast_mode:
                raise GradcheckError(
                    f"{prefix}Jacobian computed with forward mode mismatch for output {j} with respect to input {i} "
                    f"in fast mode: J v numerical {num.ravel()!r} vs forward mode {fwd.ravel()!r}"
                )
            raise GradcheckError(_describe(i, j, num, fwd, worst, x.shape, out.shape, prefix, "computed with forward mode "))


def _unit(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    v = rng.standard_normal(shape)
    norm = np.linalg.norm(v)
    return v / norm if norm else v


def gradgradcheck(
    fn: Callable[..., Any],
    inputs: Any,
    grad_outputs: Any = None,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    raise_exception: bool = True,
    fast_mode: bool | None = None,
    *,
    nondet_tol: float = 0.0,
    check_undefined_grad: bool = True,
    seed: int = 0,
) -> bool:
    """Check second derivatives: ``gradcheck`` of the vjp of ``fn`` (``create_graph=True``).

    The vjp ``(inputs, grad_outputs) -> grad(fn(inputs), inputs, grad_outputs)`` is itself
    checked against finite differences, w.r.t. the inputs and the grad_outputs.

    Args:
        fn, inputs, eps, atol, rtol, raise_exception, fast_mode, nondet_tol,
        check_undefined_grad, seed: as in ``gradcheck``.
        grad_outputs: one cotangent per floating output (default: random, seeded).

    >>> import xgrad
    >>> from xgrad.testing import gradgradcheck
    >>> x = xgrad.tensor([0.5, -1.0], dtype="float64", requires_grad=True)
    >>> gradgradcheck(lambda x: x.exp() * x, (x,))
    True
    """
    fn = tensor_function(fn, "gradgradcheck")
    check_inputs(inputs, "gradgradcheck")
    _warn_non_double(inputs)
    with _float64():
        args, diff = _prepare(inputs)
        for i in diff:
            args[i] = Tensor(args[i].array).requires_grad_(True)
        outs = _outputs(fn, args)
        if grad_outputs is None:
            rng = np.random.default_rng(seed)
            cotangents = [Tensor(jnp.asarray(rng.standard_normal(o.shape), jnp.float64)) for o in outs]
        else:
            given = grad_outputs if isinstance(grad_outputs, (list, tuple)) else [grad_outputs]
            cotangents = [Tensor(jnp.asarray(g.array if isinstance(g, Tensor) else g, jnp.float64)) for g in given]
        # Each cotangent lives where its output does (an output may have moved device).
        cotangents = [Tensor(jax.device_put(c.array, o.sharding)) for c, o in zip(cotangents, outs, strict=True)]
        n = len(args)

        def first_derivative(*all_args: Tensor) -> tuple[Tensor, ...]:
            primal, cts = list(all_args[:n]), all_args[n:]
            rooted = [(o, c) for o, c in zip(_outputs(fn, primal), cts, strict=True) if o.requires_grad]
            wrt = [primal[i] for i in diff]
            if not rooted:
                return tuple(xgrad.zeros_like(t) for t in wrt)
            grads = xgrad.autograd.grad([o for o, _ in rooted], wrt, [c for _, c in rooted], create_graph=True, allow_unused=True)
            return tuple(xgrad.zeros_like(t) if g is None else g for g, t in zip(grads, wrt, strict=True))

        checked = [args[k].requires_grad_(True) if k in diff else args[k] for k in range(n)]
        checked += [c.requires_grad_(True) for c in cotangents]
        return gradcheck(first_derivative, checked, eps, atol, rtol, raise_exception, fast_mode, seed=seed,
                         nondet_tol=nondet_tol, check_undefined_grad=check_undefined_grad,
                         _prefix=f"second-order (gradgradcheck; inputs from {n} on are the grad_outputs): ")
