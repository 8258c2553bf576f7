"""``torch.autograd.functional``: Jacobians, Hessians and their products for functions of tensors.

``vjp``, ``jvp``, ``jacobian``, ``hessian``, ``hvp`` and ``vhp`` take a function of
tensors and the point (a Tensor or a tuple of Tensors), with PyTorch's arguments,
input/output structure rules and messages. They are built on ``autograd.grad`` (the
eager or, when it is switched on, the compiled backward) and on ``forward_ad``:
``vectorize=True`` runs one batched backward (``grad(..., is_grads_batched=True)``, a
``jax.vmap``) instead of a backward per output element, and ``strategy="forward-mode"``
one ``jax.vmap`` of a forward pass with tangents over the standard basis.

>>> import xgrad
>>> from xgrad.autograd.functional import hessian, jacobian
>>> jacobian(lambda x: x ** 2, xgrad.tensor([1.0, 2.0])).tolist()
[[2.0, 0.0], [0.0, 4.0]]
>>> hessian(lambda x: (x ** 3).sum(), xgrad.tensor([1.0, 2.0])).tolist()
[[6.0, 0.0], [0.0, 12.0]]
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from xgrad.autograd import forward_ad
from xgrad.engine.api import grad as _grad
from xgrad.grad_mode import _state as _grad_state
from xgrad.grad_mode import enable_grad, is_grad_enabled, set_grad_enabled
from xgrad.jax_capture import quiet_captures
from xgrad.tensor import Tensor

__all__ = ["hessian", "hvp", "jacobian", "jvp", "vhp", "vjp"]

Fn = Callable[..., Any]


def _size(shape: Sequence[int]) -> str:
    return f"torch.Size({list(shape)})"  # PyTorch's spelling, which its messages and tests use


def _as_tuple(value: Any, arg_name: str, fn_name: str) -> tuple[bool, tuple[Tensor, ...]]:
    """``(was it a tuple, the tensors as a tuple)``; raises PyTorch's TypeError for anything else."""
    is_tuple = isinstance(value, tuple)
    values = value if is_tuple else (value,)
    for i, el in enumerate(values):
        if not isinstance(el, Tensor):
            where = f"the value at index {i} has type {type(el)}" if is_tuple else f"the given {arg_name} has type {type(el)}"
            raise TypeError(f"The {arg_name} given to {fn_name} must be either a Tensor or a tuple of Tensors but {where}.")
        if _grad_state.transform is not None and isinstance(el._array, jax.core.Tracer):
            raise RuntimeError(ERR_IN_FUNC_TRANSFORM.format(fn_name=fn_name))
    return is_tuple, values


ERR_IN_FUNC_TRANSFORM = (
    "xgrad.autograd.functional.{fn_name} was called inside a function being transformed by an xgrad.func transform "
    "(vmap, grad, jacrev, ...). This is unsupported: it needs eager autograd, which the transform replaces. Use the "
    "xgrad.func transforms (vjp, jvp, jacrev, jacfwd, hessian) there instead."
)


def _tuple_postprocess(res: Any, to_unpack: bool | tuple[bool, bool]) -> Any:
    """Unwrap the result's nesting where the user gave a single Tensor instead of a tuple."""
    if isinstance(to_unpack, tuple):
        if not to_unpack[1]:
            res = tuple(el[0] for el in res)
        if not to_unpack[0]:
            res = res[0]
    elif not to_unpack:
        res = res[0]
    return res


def _grad_preprocess(inputs: tuple[Tensor, ...], create_graph: bool, need_graph: bool) -> tuple[Tensor, ...]:
    """Fresh leaves to differentiate with respect to; under ``create_graph`` a differentiable view instead."""
    out = []
    for inp in inputs:
        if create_graph and inp.requires_grad:
            out.append(inp[...])  # a view: gradients flow on to inp's history
        else:
            out.append(inp.detach().requires_grad_(need_graph))
    return tuple(out)


def _grad_postprocess(values: Any, create_graph: bool) -> Any:
    if isinstance(values[0], Tensor):
        return values if create_graph else tuple(v.detach() for v in values)
    return tuple(_grad_postprocess(v, create_graph) for v in values)


def _validate_v(v: tuple[Tensor, ...], other: tuple[Tensor, ...], is_other_tuple: bool) -> None:
    if len(other) != len(v):
        if is_other_tuple:
            raise RuntimeError(f"v is a tuple of invalid length: should be {len(other)} but got {len(v)}.")
        raise RuntimeError("The given v should contain a single Tensor.")
    for idx, (el_v, el_other) in enumerate(zip(v, other, strict=True)):
        if el_v.shape != el_other.shape:
            prepend = f"Entry {idx} in " if is_other_tuple else ""
            raise RuntimeError(f"{prepend}v has invalid size: should be {_size(el_other.shape)} but got {_size(el_v.shape)}.")


_STRICT_NO_GRAD = {
    "hessian": (
        "The hessian of the user-provided function with respect to input {i} is independent of the input. This is not "
        "allowed in strict mode. You should ensure that your function is thrice differentiable and that the hessian "
        "depends on the inputs."
    ),
    "jacobian": (
        "While computing the hessian, found that the jacobian of the user-provided function with respect to input {i} "
        "is independent of the input. This is not allowed in strict mode. You should ensure that your function is twice "
        "differentiable and that the jacobian depends on the inputs (this would be violated by a linear function for "
        "example)."
    ),
    "grad_inputs": (
        "The gradient with respect to input {i} is independent of the inputs of the user-provided function. This is not "
        "allowed in strict mode."
    ),
    "outputs": (
        "Output {i} of the user-provided function does not require gradients. The outputs must be computed in a "
        "differentiable manner from the input when running in strict mode."
    ),
}


def _check_requires_grad(values: Sequence[Tensor | None], kind: str, strict: bool) -> None:
    if not strict:
        return
    for i, value in enumerate(values):
        if value is None:
            raise RuntimeError(
                f"The output of the user-provided function is independent of input {i}. This is not allowed in strict mode."
            )
        if not value.requires_grad:
            raise RuntimeError(_STRICT_NO_GRAD[kind].format(i=i))


def _autograd_grad(outputs: Sequence[Tensor | None], inputs: Sequence[Tensor], grad_outputs: Sequence[Any] | None = None,
                   create_graph: bool = False, retain_graph: bool | None = None,
                   is_grads_batched: bool = False) -> tuple[Tensor | None, ...]:
    """``autograd.grad`` over the outputs that require grad (``None`` for every input when none does)."""
    grad_outputs = (None,) * len(outputs) if grad_outputs is None else grad_outputs
    kept = [(o, g) for o, g in zip(outputs, grad_outputs, strict=True) if o is not None and o.requires_grad]
    if not kept:
        return (None,) * len(inputs)
    return _grad(
        [o for o, _ in kept], list(inputs), [g for _, g in kept], retain_graph=retain_graph,
        create_graph=create_graph, allow_unused=True, is_grads_batched=is_grads_batched,
    )


_STRICT_NONE = {
    "back": "The output of the user-provided function is independent of input {i}. This is not allowed in strict mode.",
    "back_trick": (
        "The gradient with respect to the input is independent of entry {i} in the grad_outputs when using the double "
        "backward trick to compute forward mode gradients. This is not allowed in strict mode."
    ),
    "double_back": "The jacobian of the user-provided function is independent of input {i}. This is not allowed in strict mode.",
    "double_back_trick": (
        "The hessian of the user-provided function is independent of entry {i} in the grad_jacobian. This is not allowed "
        "in strict mode as it prevents from using the double backward trick to replace forward mode AD."
    ),
}


def _fill_in_zeros(grads: Sequence[Tensor | None], refs: Sequence[Tensor], strict: bool, create_graph: bool,
                   stage: str) -> tuple[Tensor, ...]:
    res = []
    for i, g in enumerate(grads):
        if g is None:
            if strict:
                raise RuntimeError(_STRICT_NONE[stage].format(i=i))
            g = _zeros_like(refs[i])
        elif strict and create_graph and not g.requires_grad:
            what = "hessian" if "double" in stage else "jacobian"
            raise RuntimeError(
                f"The {what} of the user-provided function is independent of input {i}. This is not allowed in strict "
                "mode when create_graph=True."
            )
        res.append(g)
    return tuple(res)


def _zeros_like(t: Tensor, requires_grad: bool = False) -> Tensor:
    return Tensor(jnp.zeros_like(t._array), requires_grad=requires_grad)


def _v_or_none(v: Any, fn_name: str, create_graph: bool, against: tuple[Tensor, ...], is_tuple: bool,
               none_message: str) -> tuple[Tensor, ...] | None:
    if v is not None:
        _, vs = _as_tuple(v, "v", fn_name)
        vs = _grad_preprocess(vs, create_graph=create_graph, need_graph=False)
        _validate_v(vs, against, is_tuple)
        return vs
    if len(against) != 1 or against[0].numel() != 1:
        raise RuntimeError(none_message)
    return None


_V_NONE_OUTPUT = "The vector v can only be None if the user-provided function returns a single Tensor with a single element."
_V_NONE_INPUT = "The vector v can only be None if the input to the user-provided function is a single Tensor with a single element."


def vjp(func: Fn, inputs: Any, v: Any = None, create_graph: bool = False, strict: bool = False) -> tuple[Any, Any]:
    """``(func(inputs), v^T J)``: the vector-Jacobian product at ``inputs``.

    Args:
        func: a function of Tensors returning a Tensor or a tuple of Tensors.
        inputs: a Tensor or a tuple of Tensors.
        v: the vector, shaped as ``func``'s outputs; may be omitted for a one-element output.
        create_graph: record the result for differentiating it again.
        strict: raise if an output does not depend on the inputs (instead of zeros).

    >>> import xgrad
    >>> from xgrad.autograd.functional import vjp
    >>> out, g = vjp(lambda x: x.exp().sum(dim=1), xgrad.zeros(2, 2), xgrad.ones(2))
    >>> g.tolist()
    [[1.0, 1.0], [1.0, 1.0]]
    """
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "vjp")
        inputs = _grad_preprocess(inputs, create_graph=create_graph, need_graph=True)
        outputs = func(*inputs)
        is_outputs_tuple, outputs = _as_tuple(outputs, "outputs of the user-provided function", "vjp")
        _check_requires_grad(outputs, "outputs", strict)
        vs = _v_or_none(v, "vjp", create_graph, outputs, is_outputs_tuple, _V_NONE_OUTPUT)
    with set_grad_enabled(True if create_graph else is_grad_enabled()):
        grad_res = _autograd_grad(outputs, inputs, vs, create_graph=create_graph)
        result = _fill_in_zeros(grad_res, inputs, strict, create_graph, "back")
    outputs = _grad_postprocess(outputs, create_graph)
    result = _grad_postprocess(result, create_graph)
    return _tuple_postprocess(outputs, is_outputs_tuple), _tuple_postprocess(result, is_inputs_tuple)


def jvp(func: Fn, inputs: Any, v: Any = None, create_graph: bool = False, strict: bool = False) -> tuple[Any, Any]:
    """``(func(inputs), J v)``: the Jacobian-vector product at ``inputs``.

    As PyTorch's, computed by the double-backward trick (a vjp of a vjp), so
    ``create_graph`` works to any order; ``forward_ad`` computes it directly.

    >>> import xgrad
    >>> from xgrad.autograd.functional import jvp
    >>> jvp(lambda x: x ** 2, xgrad.tensor([1.0, 3.0]), xgrad.tensor([1.0, 1.0]))[1].tolist()
    [2.0, 6.0]
    """
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "jvp")
        inputs = _grad_preprocess(inputs, create_graph=create_graph, need_graph=True)
        vs = _v_or_none(v, "jvp", create_graph, inputs, is_inputs_tuple, _V_NONE_INPUT)
        outputs = func(*inputs)
        is_outputs_tuple, outputs = _as_tuple(outputs, "outputs of the user-provided function", "jvp")
        _check_requires_grad(outputs, "outputs", strict)
        grad_outputs = tuple(_zeros_like(out, requires_grad=True) for out in outputs)
        grad_inputs = _autograd_grad(outputs, inputs, grad_outputs, create_graph=True)
        _check_requires_grad(grad_inputs, "grad_inputs", strict)
    with enable_grad() if create_graph else contextlib.nullcontext():
        grad_res = _autograd_grad(grad_inputs, grad_outputs, vs, create_graph=create_graph)
        result = _fill_in_zeros(grad_res, outputs, strict, create_graph, "back_trick")
    outputs = _grad_postprocess(outputs, create_graph)
    result = _grad_postprocess(result, create_graph)
    return _tuple_postprocess(outputs, is_outputs_tuple), _tuple_postprocess(result, is_outputs_tuple)


def _standard_basis(tensors: tuple[Tensor, ...], numels: tuple[int, ...]) -> tuple[jax.Array, ...]:
    """One ``(sum(numels), numel_i)`` block per tensor, together the identity: row ``k`` is the
    ``k``-th basis vector of all the tensors flattened and concatenated (in each tensor's dtype)."""
    total = sum(numels)
    blocks = []
    start = 0
    for t, n in zip(tensors, numels, strict=True):
        blocks.append(jnp.eye(total, n, -start, dtype=t.dtype))
        start += n
    return tuple(blocks)


ERR_FORWARD_STRICT = (
    'torch.autograd.functional.jacobian: `strict=True` and `strategy="forward-mode"` are not supported together (yet). '
    'Please either set `strict=False` or `strategy="reverse-mode"`.'
)
ERR_FORWARD_NOT_VECTORIZED = (
    "Computing Jacobian using forward-AD or forward-over-reverse Hessian isonly implemented for `vectorize=True`."
)
ERR_FORWARD_CREATE_GRAPH = (
    'torch.autograd.functional.jacobian: `create_graph=True` and `strategy="forward-mode"` are not supported together '
    '(yet). Please either set `create_graph=False` or `strategy="reverse-mode"`.'
)
ERR_STRATEGY = (
    'Expected strategy to be either "forward-mode" or "reverse-mode". Hint: If your function has more outputs than '
    'inputs, "forward-mode" tends to be more performant. Otherwise, prefer to use "reverse-mode".'
)
ERR_STRICT_VECTORIZE = (
    "torch.autograd.functional.jacobian: `strict=True` and `vectorized=True` are not supported together. Please either "
    "set `strict=False` or `vectorize=False`."
)


def _jacfwd(func: Fn, inputs: Any, strict: bool, vectorize: bool) -> Any:
    """The Jacobian by forward mode: one ``jax.vmap`` of a dual forward pass over the standard basis."""
    if strict:
        raise RuntimeError(ERR_FORWARD_STRICT)
    is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "jacobian")
    if not vectorize:
        raise NotImplementedError(ERR_FORWARD_NOT_VECTORIZED)
    numels = tuple(t.numel() for t in inputs)
    output_info: list[Any] = []

    def jvp_of(tangents: tuple[Any, ...]) -> tuple[Any, ...]:
        with forward_ad.dual_level():
            duals = tuple(
                forward_ad.make_dual(t, Tensor(tangent.reshape(t.shape))) for t, tangent in zip(inputs, tangents, strict=True)
            )
            is_outputs_tuple, outs = _as_tuple(func(*duals), "outputs", "jacobian")
            output_info[:] = [is_outputs_tuple, [(o.shape, o.dtype) for o in outs]]
            jv = []
            for out in outs:
                tangent = forward_ad.unpack_dual(out).tangent
                jv.append(jnp.zeros(out.shape, out.dtype) if tangent is None else tangent._array)
            return tuple(jv)

    # The inputs are constants of the vmapped pass (forward mode records no graph through it),
    # whatever their requires_grad: not leaves captured by mistake.
    with quiet_captures():
        batched = jax.vmap(jvp_of)(_standard_basis(inputs, numels))
    is_outputs_tuple, out_meta = output_info
    jacobian_rows = []
    for jac, (out_shape, _) in zip(batched, out_meta, strict=True):
        row = []
        start = 0
        for inp, n in zip(inputs, numels, strict=True):
            part = jac[start:start + n]  # (numel_j, *out_shape)
            start += n
            row.append(Tensor(jnp.moveaxis(part, 0, -1).reshape((*out_shape, *inp.shape))))
        jacobian_rows.append(tuple(row))
    return _tuple_postprocess(tuple(jacobian_rows), (is_outputs_tuple, is_inputs_tuple))


def jacobian(func: Fn, inputs: Any, create_graph: bool = False, strict: bool = False, vectorize: bool = False,
             strategy: str = "reverse-mode") -> Any:
    """The Jacobian of ``func`` at ``inputs``: ``J[i][j]`` has shape ``outputs[i].shape + inputs[j].shape``.

    Args:
        func: a function of Tensors returning a Tensor or a tuple of Tensors.
        inputs: a Tensor or a tuple of Tensors (the nesting of the result follows both).
        create_graph: record the result for differentiating it again.
        strict: raise if an output does not depend on an input (instead of zeros).
        vectorize: one batched backward (a ``jax.vmap``) instead of one per output element.
        strategy: ``"reverse-mode"`` or ``"forward-mode"`` (needs ``vectorize=True``).

    >>> import xgrad
    >>> from xgrad.autograd.functional import jacobian
    >>> jacobian(lambda x: x.sin(), xgrad.zeros(2), vectorize=True, strategy="forward-mode").tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    if strategy not in ("forward-mode", "reverse-mode"):
        raise AssertionError(ERR_STRATEGY)
    if strategy == "forward-mode":
        if create_graph:
            raise NotImplementedError(ERR_FORWARD_CREATE_GRAPH)
        return _jacfwd(func, inputs, strict, vectorize)
    with enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "jacobian")
        inputs = _grad_preprocess(inputs, create_graph=create_graph, need_graph=True)
        outputs = func(*inputs)
        is_outputs_tuple, outputs = _as_tuple(outputs, "outputs of the user-provided function", "jacobian")
        _check_requires_grad(outputs, "outputs", strict)
        if vectorize:
            if strict:
                raise RuntimeError(ERR_STRICT_VECTORIZE)
            jac = _jacobian_vectorized(inputs, outputs, create_graph)
        else:
            jac = _jacobian_rows(inputs, outputs, create_graph, strict)
        jac = _grad_postprocess(jac, create_graph)
        return _tuple_postprocess(jac, (is_outputs_tuple, is_inputs_tuple))


def _jacobian_vectorized(inputs: tuple[Tensor, ...], outputs: tuple[Tensor, ...], create_graph: bool) -> Any:
    """All rows at once: one backward batched over the standard basis of the outputs."""
    numels = tuple(o.numel() for o in outputs)
    total = sum(numels)
    basis = tuple(Tensor(b) for b in _standard_basis(outputs, numels))
    flat = tuple(o.reshape(-1) for o in outputs)
    batched = _autograd_grad(flat, inputs, basis, create_graph=create_graph, is_grads_batched=True)
    grads = [_zeros_like(inp).expand((total, *inp.shape)) if g is None else g for g, inp in zip(batched, inputs, strict=True)]
    per_input = []
    for g, inp in zip(grads, inputs, strict=True):
        parts = []
        start = 0
        for n, out in zip(numels, outputs, strict=True):
            parts.append(g[start:start + n].reshape((*out.shape, *inp.shape)))
            start += n
        per_input.append(parts)
    return tuple(zip(*per_input, strict=True))


def _jacobian_rows(inputs: tuple[Tensor, ...], outputs: tuple[Tensor, ...], create_graph: bool, strict: bool) -> Any:
    """Row by row: one backward per output element."""
    from xgrad.ops import stack

    result = []
    for i, out in enumerate(outputs):
        rows: list[list[Tensor]] = [[] for _ in inputs]
        flat = out.reshape(-1)
        for j in range(out.numel()):
            vj = _autograd_grad((flat[j],), inputs, retain_graph=True, create_graph=create_graph)
            for k, (g, inp) in enumerate(zip(vj, inputs, strict=True)):
                if g is not None:
                    if strict and create_graph and not g.requires_grad:
                        raise RuntimeError(
                            f"The jacobian of the user-provided function is independent of input {i}. This is not "
                            "allowed in strict mode when create_graph=True."
                        )
                    rows[k].append(g)
                else:
                    if strict:
                        raise RuntimeError(
                            f"Output {i} of the user-provided function is independent of input {k}. This is not "
                            "allowed in strict mode."
                        )
                    rows[k].append(_zeros_like(inp))
        result.append(tuple(
            stack(r, dim=0).reshape((*out.shape, *inp.shape)) if r else Tensor(jnp.zeros((*out.shape, *inp.shape), inp.dtype))
            for r, inp in zip(rows, inputs, strict=True)
        ))
    return tuple(result)


ERR_STRATEGY_HESSIAN = 'Expected strategy to be either "forward-mode" or "reverse-mode".'


def _single_output(func: Fn, fn_name: str, strict: bool) -> Fn:
    def single(*inp: Tensor) -> Tensor:
        out = func(*inp)
        is_tuple, outs = _as_tuple(out, "outputs of the user-provided function", fn_name)
        _check_requires_grad(outs, "outputs", strict)
        if is_tuple or not isinstance(out, Tensor):
            raise RuntimeError(f"The function given to {fn_name} should return a single Tensor")
        if out.numel() != 1:
            raise RuntimeError(f"The Tensor returned by the function given to {fn_name} should contain a single element")
        return out.reshape(())

    return single


def hessian(func: Fn, inputs: Any, create_graph: bool = False, strict: bool = False, vectorize: bool = False,
            outer_jacobian_strategy: str = "reverse-mode") -> Any:
    """The Hessian of a scalar function: ``H[i][j]`` has shape ``inputs[i].shape + inputs[j].shape``.

    The Jacobian of the gradient: ``outer_jacobian_strategy="forward-mode"`` (with
    ``vectorize=True``) takes it by forward over reverse.

    >>> import xgrad
    >>> from xgrad.autograd.functional import hessian
    >>> hessian(lambda x: (x[0] * x[1]).sum(), xgrad.ones(2), vectorize=True, outer_jacobian_strategy="forward-mode").tolist()
    [[0.0, 1.0], [1.0, 0.0]]
    """
    is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "hessian")
    if outer_jacobian_strategy not in ("forward-mode", "reverse-mode"):
        raise AssertionError(ERR_STRATEGY_HESSIAN)
    single = _single_output(func, "hessian", strict)

    def jac_func(*inp: Tensor) -> Any:
        if outer_jacobian_strategy == "forward-mode":
            inp = tuple(t.requires_grad_(True) for t in inp)
        jac = jacobian(single, inp, create_graph=True)
        _check_requires_grad(jac, "jacobian", strict)
        return jac

    res = jacobian(jac_func, inputs, create_graph=create_graph, strict=strict, vectorize=vectorize,
                   strategy=outer_jacobian_strategy)
    return _tuple_postprocess(res, (is_inputs_tuple, is_inputs_tuple))


def _hessian_prep(func: Fn, inputs: Any, v: Any, create_graph: bool, strict: bool, fn_name: str) -> Any:
    """What ``vhp`` and ``hvp`` share: the checked inputs, ``v``, the output and its gradient (with a graph)."""
    is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", fn_name)
    inputs = _grad_preprocess(inputs, create_graph=create_graph, need_graph=True)
    vs = _v_or_none(v, fn_name, create_graph, inputs, is_inputs_tuple, _V_NONE_INPUT)
    outputs = func(*inputs)
    is_outputs_tuple, outputs = _as_tuple(outputs, "outputs of the user-provided function", fn_name)
    _check_requires_grad(outputs, "outputs", strict)
    if is_outputs_tuple or not isinstance(outputs[0], Tensor):
        raise RuntimeError(f"The function given to {fn_name} should return a single Tensor")
    if outputs[0].numel() != 1:
        raise RuntimeError(f"The Tensor returned by the function given to {fn_name} should contain a single element")
    jac = _autograd_grad(outputs, inputs, create_graph=True)
    _check_requires_grad(jac, "jacobian", strict)
    return is_inputs_tuple, inputs, vs, is_outputs_tuple, outputs, jac


def vhp(func: Fn, inputs: Any, v: Any = None, create_graph: bool = False, strict: bool = False) -> tuple[Any, Any]:
    """``(func(inputs), v^T H)`` for a scalar ``func``: a double backward.

    >>> import xgrad
    >>> from xgrad.autograd.functional import vhp
    >>> vhp(lambda x: (x ** 3).sum(), xgrad.tensor([1.0, 2.0]), xgrad.tensor([1.0, 1.0]))[1].tolist()
    [6.0, 12.0]
    """
    with enable_grad():
        is_inputs_tuple, inputs, vs, is_outputs_tuple, outputs, jac = _hessian_prep(func, inputs, v, create_graph, strict, "vhp")
    with set_grad_enabled(True if create_graph else is_grad_enabled()):
        grad_res = _autograd_grad(jac, inputs, vs, create_graph=create_graph)
        result = _fill_in_zeros(grad_res, inputs, strict, create_graph, "double_back")
    outputs = _grad_postprocess(outputs, create_graph)
    result = _grad_postprocess(result, create_graph)
    return _tuple_postprocess(outputs, is_outputs_tuple), _tuple_postprocess(result, is_inputs_tuple)


def hvp(func: Fn, inputs: Any, v: Any = None, create_graph: bool = False, strict: bool = False) -> tuple[Any, Any]:
    """``(func(inputs), H v)`` for a scalar ``func``, by PyTorch's double-backward trick.

    For a twice-differentiable ``func`` ``H`` is symmetric and this equals ``vhp``;
    ``forward_ad`` over ``autograd.grad`` computes it in one forward-over-reverse pass.

    >>> import xgrad
    >>> from xgrad.autograd.functional import hvp
    >>> hvp(lambda x: (x[0] * x[1] ** 2).sum(), xgrad.tensor([1.0, 2.0]), xgrad.tensor([1.0, 0.0]))[1].tolist()
    [0.0, 4.0]
    """
    with enable_grad():
        is_inputs_tuple, inputs, vs, is_outputs_tuple, outputs, jac = _hessian_prep(func, inputs, v, create_graph, strict, "hvp")
        grad_jac = tuple(_zeros_like(inp, requires_grad=True) for inp in inputs)
        double_back = _autograd_grad(jac, inputs, grad_jac, create_graph=True)
        _check_requires_grad(jac, "hessian", strict)
    with set_grad_enabled(True if create_graph else is_grad_enabled()):
        grad_res = _autograd_grad(double_back, grad_jac, vs, create_graph=create_graph)
        result = _fill_in_zeros(grad_res, inputs, strict, create_graph, "double_back_trick")
    outputs = _grad_postprocess(outputs, create_graph)
    result = _grad_postprocess(result, create_graph)
    return _tuple_postprocess(outputs, is_outputs_tuple), _tuple_postprocess(result, is_inputs_tuple)
