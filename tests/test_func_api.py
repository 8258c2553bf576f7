"""torch.func's API beyond the transforms themselves: Tensor methods on traced Tensors, model
ensembling, ``linearize``, Functions under ``vmap``, the ops torch.func's tests use, and the
transforms composed with eager autograd, checked against JAX on the same math."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad import func

X = np.array([0.3, -1.2, 2.0])


def close(actual, expected, rtol=1e-6):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=1e-6)


# -- Tensor methods on traced Tensors ------------------------------------------------------


def with_factories(x):
    """A forward that makes new tensors from ``x`` by each of PyTorch's routes and reads its device."""
    assert x.device.platform == "cpu" and not x.is_cuda and x.is_cpu
    x = x.to(device=x.device).to(device="cpu").cpu()
    made = (
        x.new_zeros(x.shape) + x.new_empty(x.shape) + x.new_ones(x.shape) * 2 + x.new_full(x.shape, 3.0)
        + x.new_tensor([1.0, 2.0, 4.0]) + xgrad.zeros_like(x) + xgrad.ones_like(x) + xgrad.full_like(x, 0.5)
        + xgrad.empty_like(x) + xgrad.zeros(3, device=x.device)
    )
    return (x.sin() * made).sum()


def with_factories_ref(x):
    return jnp.sum(jnp.sin(x) * (2 + 3.0 + jnp.array([1.0, 2.0, 4.0]) + 1 + 0.5))


TRANSFORMS = {
    "grad": lambda f, x: func.grad(f)(x),
    "vjp": lambda f, x: (lambda out, vjp_fn: vjp_fn(xgrad.ones_like(out))[0])(*func.vjp(f, x)),
    "jvp": lambda f, x: func.jacfwd(f)(x),
    "jacrev": lambda f, x: func.jacrev(f)(x),
    "vmap_grad": lambda f, x: func.vmap(func.grad(f))(x.unsqueeze(0).expand(2, 3))[1],
    "compile": lambda f, x: xgrad.compile(func.grad(f))(x),
}


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_factories_device_and_to_work_on_traced_tensors(transform):
    close(TRANSFORMS[transform](with_factories, xgrad.tensor(X)).array, jax.grad(with_factories_ref)(X))


def test_factories_inside_compile_alone():
    step = xgrad.compile(lambda x: with_factories(x) * 1.0)
    close(step(xgrad.tensor(X)).array, with_factories_ref(X))


def test_tolist_and_item_read_values_under_grad_and_jvp_as_torch_func_allows():
    seen = []

    def f(x):
        seen.append((x.tolist(), x.sum().item(), float(x[0]), int(x[2]), bool(x[0] > 0)))
        return (x * x).sum()

    func.grad(f)(xgrad.tensor(X))
    func.jvp(f, (xgrad.tensor(X),), (xgrad.ones_like(xgrad.tensor(X)),))
    expected = (X.tolist(), float(X.sum()), X[0], 2, True)
    for row in seen:
        close(row[0], expected[0])
        close(row[1], expected[1])
        assert row[2:] == pytest.approx(expected[2:])


@pytest.mark.parametrize("read", [lambda t: t.tolist(), lambda t: t.sum().item(), lambda t: float(t.sum())])
def test_values_under_vmap_raise_torch_funcs_error(read):
    with pytest.raises(RuntimeError, match="vmap: It looks like you're calling"):
        func.vmap(lambda t: t * read(t))(xgrad.ones(2, 3))


# -- ops torch.func's tests use ------------------------------------------------------------


def test_conj_bit_under_grad_and_complex_gradient_convention():
    # torch.func's test_conj_bit: the bit shows inside grad, and the gradient is PyTorch's (sgn(x)).
    def foo(x):
        assert not x.is_conj()
        y = x.conj()
        assert y.is_conj() and not y.conj().is_conj() and not y.resolve_conj().is_conj()
        return y.abs()

    z = 1.0 + 1.0j
    res = func.grad(foo)(xgrad.tensor(z, dtype=jnp.complex128))
    close(res.array, z / abs(z))
    eager = xgrad.tensor(z, dtype=jnp.complex128, requires_grad=True)
    foo(eager).backward()
    close(eager.grad.array, res.array)
    assert not xgrad.tensor(X).conj().is_conj()


def test_take_vstack_cov_match_numpy():
    x = xgrad.tensor(np.arange(6.0).reshape(2, 3))
    close(xgrad.take(x, xgrad.tensor([[0, -1], [4, 2]])).array, np.take(np.arange(6.0), [[0, -1], [4, 2]]))
    close(x.take(xgrad.tensor(5)).array, 5.0)
    close(xgrad.vstack([xgrad.tensor(1.0 * np.ones(3)), x, xgrad.tensor(X)]).array, np.vstack([np.ones(3), np.arange(6.0).reshape(2, 3), X]))
    data = np.random.default_rng(0).normal(size=(3, 5))
    w = np.array([1, 2, 1, 3, 1])
    a = np.array([0.5, 1.0, 2.0, 1.0, 0.25])
    close(xgrad.cov(xgrad.tensor(data)).array, np.cov(data))
    close(xgrad.tensor(data).cov(correction=0).array, np.cov(data, bias=True))
    close(xgrad.cov(xgrad.tensor(data), fweights=xgrad.tensor(w), aweights=xgrad.tensor(a)).array, np.cov(data, fweights=w, aweights=a))
    close(xgrad.cov(xgrad.tensor(X)).array, np.cov(X))
    with pytest.raises(RuntimeError, match="Expected a long tensor"):
        xgrad.take(x, xgrad.tensor([0.0]))
    with pytest.raises(ValueError, match="same numel as there are observations"):
        xgrad.cov(xgrad.tensor(data), aweights=xgrad.ones(4))


def test_squeeze_in_place_keeps_history_and_refuses_views():
    x = xgrad.tensor(X.reshape(1, 3), requires_grad=True)
    y = x * 2
    assert y.squeeze_() is y and y.shape == (3,)
    (y * y).sum().backward()
    close(x.grad.array, 8 * X.reshape(1, 3))
    v = xgrad.zeros(1, 3)[:, :2]
    with pytest.raises(RuntimeError, match="squeeze_"):
        v.squeeze_()
    assert v.shape == (1, 2)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        xgrad.zeros(1, 3, requires_grad=True).squeeze_()
