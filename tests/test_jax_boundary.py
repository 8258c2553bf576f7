"""Where xgrad meets plain JAX: transformations over Tensors, conversions to arrays, captured leaves.

These pin down behaviour that rests on JAX's public protocols (pytrees, ``__jax_array__``,
tracers): a JAX upgrade that changes any of it fails here.
"""

import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad import nn
from xgrad.jax_capture import CapturedLeafWarning

X = np.array([0.5, -1.0, 2.0])


def test_jax_transformations_of_xgrad_functions_take_and_return_tensors():
    for requires_grad in (False, True):
        t = xgrad.tensor(X, requires_grad=requires_grad)
        out = jax.jit(lambda x: x.sin() * x)(t)
        assert isinstance(out, xgrad.Tensor) and out.grad_fn is None and not out.requires_grad
        np.testing.assert_allclose(out.detach().detach().numpy(), np.sin(X) * X, rtol=1e-12)
        rows = xgrad.tensor(np.stack([X, 2 * X]), requires_grad=requires_grad)
        mapped = jax.vmap(lambda r: (r.exp() * 2).sum())(rows)
        assert isinstance(mapped, xgrad.Tensor) and mapped.grad_fn is None
        np.testing.assert_allclose(mapped.detach().detach().numpy(), (np.exp(np.stack([X, 2 * X])) * 2).sum(1), rtol=1e-12)
        # jax.grad wants an array out: the Tensor's .array
        g = jax.grad(lambda x: (x.sin() * x).sum().array)(t)
        assert isinstance(g, xgrad.Tensor) and g.grad_fn is None
        np.testing.assert_allclose(g.detach().detach().numpy(), jax.grad(lambda a: jnp.sum(jnp.sin(a) * a))(X), rtol=1e-12)
        assert t.grad is None  # nothing leaked into the eager graph


def test_a_tensor_with_history_raises_at_the_call_even_on_a_cache_hit():
    w = xgrad.tensor(X, requires_grad=True)
    f = jax.jit(lambda t: t * 2)
    assert f(w).tolist() == (2 * X).tolist()  # traced for a leaf
    with pytest.raises(RuntimeError, match="history was passed into a JAX function or transformation"):
        f(w * 1.0)  # same shapes: a cache hit would skip the trace


def test_jnp_on_a_tensor_that_requires_grad_raises_outside_a_trace():
    t = xgrad.tensor(X, requires_grad=True)
    np.testing.assert_allclose(jnp.sin(t.detach()), np.sin(X))  # jnp.sin is jitted: traced for a detached tensor
    for convert in (jnp.sin, jnp.asarray, lambda v: jnp.ones(3) * v, lambda v: jnp.sum(v)):
        for value in (t, t * 2):
            with pytest.raises(RuntimeError, match=r"gradient would.*xgrad\.sin\(t\).*xgrad\.from_jax.*detach"):
                convert(value)
    with xgrad.no_grad():
        np.testing.assert_allclose(jnp.sin(t), np.sin(X))
    assert isinstance(jnp.ones(3) * t.detach(), jax.Array)
    # inside a JAX transformation, JAX differentiates the array: no error
    g = jax.grad(lambda x: jnp.sum(jnp.sin(x)))(t)
    np.testing.assert_allclose(g.detach().detach().numpy(), np.cos(X), rtol=1e-12)
    # an xgrad.compile step raises as eager does
    step = xgrad.compile(lambda: jnp.sin(t).sum(), fallback="error")
    with pytest.raises(RuntimeError, match="requires grad to a jax.Array"):
        step()


def test_boundary_errors_and_the_captured_leaf_warning_name_the_users_line():
    # The message says "(at file:line)" of the innermost frame outside JAX and xgrad, and
    # the warning is attributed to that line too (its stacklevel reaches past both).
    w = xgrad.tensor(X, requires_grad=True)
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(RuntimeError, match="requires grad to a jax.Array") as converted:
        jnp.sin(w)
    assert f"(at {__file__}:{line})" in str(converted.value)
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(RuntimeError, match="history was passed into a JAX function") as crossed:
        jax.jit(lambda t: t * 2)(w * 1.0)
    assert f"(at {__file__}:{line})" in str(crossed.value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        jax.jit(lambda x: (w * xgrad.Tensor(x)).sum().array)(jnp.ones(3))
    (warning,) = [c for c in caught if issubclass(c.category, CapturedLeafWarning)]
    assert f"(at {__file__}:{line})" in str(warning.message)
    assert (warning.filename, warning.lineno) == (__file__, line)


def _captures(fn, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(*args)
    return [str(w.message) for w in caught if issubclass(w.category, CapturedLeafWarning)]


@pytest.mark.slow
def test_a_plain_jax_trace_capturing_requires_grad_leaves_warns_once_per_trace():
    model = nn.Linear(3, 2, key=0)
    x = jnp.ones((4, 3))
    forward = jax.jit(lambda x: model(x).sum().array)
    messages = _captures(forward, x)
    assert len(messages) == 2  # weight and bias, once each
    assert "the parameter Linear.weight of shape [2, 3]" in messages[0] and "test_jax_boundary.py" in messages[0]
    assert "as an argument" in messages[0] and "xgrad.compile" in messages[0]
    assert _captures(forward, x) == []  # a cache hit traces nothing
    assert len(_captures(forward, jnp.ones((5, 3)))) == 2  # a new trace warns again
    assert len(_captures(jax.vmap(lambda r: model(r)), x)) == 2
    assert len(_captures(jax.grad(lambda x: model(x).sum().array), x)) == 2
    # silent where the leaves are constants on purpose or not constants at all
    with xgrad.no_grad():
        assert _captures(jax.jit(lambda x: model(x).array), x) == []
    assert _captures(jax.jit(lambda w, x: (xgrad.Tensor(x) @ w.T).array), model.weight.detach(), x) == []
    assert _captures(jax.jit(lambda w, x: (xgrad.Tensor(x) @ w.T).array), model.weight, x) == []  # an argument: a tracer
    assert _captures(xgrad.func.grad(lambda x: model(x).sum()), xgrad.tensor(x)) == []
    step = xgrad.compile(lambda x: model(x).sum())
    assert _captures(step, xgrad.tensor(x)) == []
