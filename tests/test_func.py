"""``xgrad.func``: torch.func's transforms over functions of Tensors, checked against JAX's on arrays."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad import func, nn

X = np.array([0.3, -1.2, 2.0])
Y = np.array([1.5, 0.5, -0.7])


def close(actual, expected, rtol=1e-6):
    for a, e in zip(jax.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected), strict=True):
        assert isinstance(a, jax.Array)
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=1e-6)


def arrays(tree):
    return jax.tree_util.tree_map(lambda t: t.array, tree, is_leaf=lambda t: isinstance(t, xgrad.Tensor))


def f_x(x, y):
    return (x.sin() * y).sum() + (x * x * y).sum()


def f_j(x, y):
    return jnp.sum(jnp.sin(x) * y) + jnp.sum(x * x * y)


def test_grad_and_grad_and_value_match_jax():
    x, y = xgrad.tensor(X), xgrad.tensor(Y)
    g = func.grad(f_x)(x, y)
    assert isinstance(g, xgrad.Tensor) and not g.requires_grad
    close(g.array, jax.grad(f_j)(X, Y))
    gx, gy = func.grad(f_x, argnums=(0, 1))(x, y)
    close((gx.array, gy.array), jax.grad(f_j, argnums=(0, 1))(X, Y))
    (g2, v) = func.grad_and_value(f_x, argnums=1)(x, y)
    close((g2.array, v.array), (jax.grad(f_j, argnums=1)(X, Y), f_j(X, Y)))
    g3, aux = func.grad(lambda x, y: (f_x(x, y), {"s": x.sum()}), has_aux=True)(x, y)
    close((g3.array, aux["s"].array), (jax.grad(f_j)(X, Y), X.sum()))
    g4, (v4, aux4) = func.grad_and_value(lambda x: ((x * x).sum(), x * 2), has_aux=True)(x)
    close((g4.array, v4.array, aux4.array), (2 * X, (X * X).sum(), 2 * X))
    # a grad of a grad: transforms compose
    close(func.grad(lambda x: func.grad(f_x)(x, y).sum())(x).array, jax.grad(lambda a: jax.grad(f_j)(a, Y).sum())(X))


def test_grad_errors_read_as_pytorchs():
    x = xgrad.tensor(X)
    with pytest.raises(RuntimeError, match="Expected f\\(\\*args\\) to return a scalar Tensor, got tensor with 1 dims"):
        func.grad(lambda x: x * 2)(x)
    with pytest.raises(RuntimeError, match="grad_and_value: Got argnum=2, but only 1 positional inputs"):
        func.grad(lambda x: x.sum(), argnums=2)(x)
    with pytest.raises(RuntimeError, match="should be a tuple: \\(output, aux\\)"):
        func.grad(lambda x: x.sum(), has_aux=True)(x)


def test_vjp_jvp_jacobians_and_hessian_match_jax():
    x, y = xgrad.tensor(X), xgrad.tensor(Y)
    out, vjp_fn = func.vjp(lambda a, b: a.sin() * b, x, y)
    ref_out, ref_fn = jax.vjp(lambda a, b: jnp.sin(a) * b, X, Y)
    grads = vjp_fn(xgrad.tensor(np.array([1.0, 2.0, 3.0])))
    assert isinstance(grads, tuple) and len(grads) == 2
    close((out.array, *arrays(grads)), (ref_out, *ref_fn(jnp.array([1.0, 2.0, 3.0]))))
    out, tangent = func.jvp(lambda a: a.exp() * 2, (x,), (y,))
    close((out.array, tangent.array), jax.jvp(lambda a: jnp.exp(a) * 2, (X,), (Y,)))
    out, tangent, aux = func.jvp(lambda a: (a * 3, a.sum()), (x,), (y,), has_aux=True)
    close((out.array, tangent.array, aux.array), (3 * X, 3 * Y, X.sum()))
    with pytest.raises(RuntimeError, match="Expected primals to be a tuple"):
        func.jvp(lambda a: a, x, y)
    g = lambda a, b: a.tanh() * b.sum()  # noqa: E731
    gj = lambda a, b: jnp.tanh(a) * jnp.sum(b)  # noqa: E731
    close(func.jacrev(g)(x, y).array, jax.jacrev(gj)(X, Y))
    close(arrays(func.jacfwd(g, argnums=(0, 1))(x, y)), jax.jacfwd(gj, argnums=(0, 1))(X, Y))
    close(func.hessian(f_x)(x, y).array, jax.hessian(f_j)(X, Y))
    jac, aux = func.jacrev(lambda a: (a * a, a.sum()), has_aux=True)(x)
    close((jac.array, aux.array), (jnp.diag(2 * X), X.sum()))


def test_vmap_in_dims_out_dims_kwargs_and_chunks():
    m = xgrad.tensor(np.arange(6.0).reshape(2, 3))
    w = xgrad.tensor(Y)

    def f(row, w, scale=1.0):
        return (row * w).sum() * scale, row * 2

    out, doubled = func.vmap(f, in_dims=(0, None))(m, w, scale=2.0)  # keyword arguments are not mapped
    close((out.array, doubled.array), jax.vmap(lambda r, w: (jnp.sum(r * w) * 2.0, r * 2), in_axes=(0, None))(m.array, Y))
    cols = func.vmap(lambda c: c * 10, in_dims=1, out_dims=1)(m)
    close(cols.array, m.array * 10)
    chunked = func.vmap(f, in_dims=(0, None), chunk_size=1)(m, w)
    close(arrays(chunked), arrays(func.vmap(f, in_dims=(0, None))(m, w)))
    tree = func.vmap(lambda d: d["a"] + d["b"], in_dims=({"a": 0, "b": None},))({"a": m, "b": w})
    close(tree.array, m.array + Y)
    with pytest.raises(ValueError, match="in_dims is not compatible"):
        func.vmap(f, in_dims=(0,))(m, w)
    with pytest.raises(RuntimeError, match="randomness"):
        func.vmap(f, randomness="sometimes")


def _mlp_loss(model, params, x, y):
    out = func.functional_call(model, params, (x[None],))
    return ((out - y[None]) ** 2).mean()


def _jax_loss(params, x, y):
    h = jnp.tanh(x @ params["0.weight"].T + params["0.bias"])
    out = h @ params["2.weight"].T + params["2.bias"]
    return jnp.mean((out - y) ** 2)


def test_per_example_grads_equal_jax_and_are_fresh_after_every_optimizer_step():
    model = nn.MLP([3, 4, 2], activation=nn.Tanh, key=0, dtype=jnp.float64)
    opt = xgrad.optim.SGD(model.parameters(), lr=0.5)
    rng = np.random.default_rng(0)
    x, y = xgrad.tensor(rng.normal(size=(5, 3))), xgrad.tensor(rng.normal(size=(5, 2)))
    per_example = func.vmap(func.grad(lambda p, x, y: _mlp_loss(model, p, x, y)), in_dims=(None, 0, 0))
    for _ in range(2):
        params = dict(model.named_parameters())
        grads = per_example(params, x, y)
        raw = {k: v.array for k, v in params.items()}
        expected = jax.vmap(jax.grad(_jax_loss), in_axes=(None, 0, 0))(raw, x.array, y.array)
        assert set(grads) == set(expected) and grads["0.weight"].shape == (5, 4, 3)
        close({k: grads[k].array for k in expected}, expected, rtol=1e-10)
        opt.zero_grad()
        xgrad.mse_loss(model(x), y).backward()
        opt.step()


def test_functional_call_swaps_and_restores_state():
    lin = nn.Linear(2, 2, key=0)
    weight = lin.weight
    new = {"weight": xgrad.tensor([[1.0, 0.0], [0.0, 2.0]], requires_grad=True), "bias": xgrad.tensor([0.0, 1.0])}
    out = func.functional_call(lin, new, xgrad.tensor([[3.0, 4.0]]))
    assert out.tolist() == [[3.0, 9.0]] and lin.weight is weight
    out.sum().backward()  # eager: the graph reaches the tensors passed in
    assert new["weight"].grad.tolist() == [[3.0, 4.0], [3.0, 4.0]] and weight.grad is None
    with pytest.raises(ValueError, match="appeared in multiple dictionaries"):
        func.functional_call(lin, ({"bias": new["bias"]}, {"bias": new["bias"]}), (xgrad.ones(1, 2),))
    with pytest.raises(RuntimeError, match="Missing key\\(s\\): 'bias'"):
        func.functional_call(lin, {"weight": new["weight"]}, (xgrad.ones(1, 2),), strict=True)

    class Tied(nn.Module):
        def __init__(self):
            self.a = nn.Linear(2, 2, key=1)
            self.b = nn.Linear(2, 2, key=2)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    tied = Tied()
    eye = xgrad.eye(2)
    out = func.functional_call(tied, {"a.weight": eye, "a.bias": xgrad.zeros(2), "b.bias": xgrad.zeros(2)}, (xgrad.ones(1, 2),))
    assert out.tolist() == [[1.0, 1.0]]  # b.weight is a.weight: the value given for one is used for both
    untied = func.functional_call(
        tied, {"a.weight": eye, "a.bias": xgrad.zeros(2), "b.bias": xgrad.zeros(2)}, (xgrad.ones(1, 2),), tie_weights=False
    )
    assert untied.tolist() != [[1.0, 1.0]] and tied.b.weight is tied.a.weight


class _Gate(nn.Module):
    """Doubles its input in training mode: a forward that branches on Python state."""

    def forward(self, x):
        return x * 2 if self.training else x


def test_transforms_run_one_program_per_signature_and_read_closed_over_tensors_at_every_call():
    traces = []
    scale = xgrad.tensor(np.array([1.0, 2.0, 3.0]))
    gate = _Gate()

    def loss(w, x):
        traces.append(1)  # Python in the function runs when it is traced
        return (gate(w * x) * scale).sum()

    per_example = func.vmap(func.grad(loss), in_dims=(None, 0))
    w, xs = xgrad.tensor(X), xgrad.tensor(np.arange(6.0).reshape(2, 3))

    def expected(train):
        factor = 2.0 if train else 1.0
        return jax.vmap(jax.grad(lambda w, x: jnp.sum(factor * w * x * scale.array)), in_axes=(None, 0))(w.array, xs.array)

    close(per_example(w, xs).array, expected(True))
    close(per_example(w, xs).array, expected(True))
    assert len(traces) == 1  # the second call ran the cached program
    scale.mul_(10.0)  # an in-place update of a tensor the function closes over: seen at the next call
    close(per_example(w, xs).array, expected(True))
    gate.eval()  # a module's mode is part of the signature
    close(per_example(w, xs).array, expected(False))
    assert len(traces) == 2
    xs = xgrad.tensor(np.ones((4, 3)))
    close(per_example(w, xs).array, expected(False))
    assert len(traces) == 3  # another shape: another program


def test_a_cached_transform_over_a_model_that_requires_grad_traces_once_per_signature():
    """torch.func's per-example recipe: the model (whose parameters require grad) is reached through
    functional_call, its parameters given detached. Finding that the function reads no tensor with
    history from outside (NOTE [Transforms keep history]) is done once per signature too."""
    traces = []
    model = nn.Linear(3, 2, key=0)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, x):
        traces.append(1)
        return func.functional_call(model, p, (x,)).pow(2).sum()

    per_example = func.vmap(func.grad(loss), in_dims=(None, 0))
    xs = xgrad.tensor(np.arange(6.0).reshape(2, 3))
    first = per_example(params, xs)
    assert first["weight"].grad_fn is None  # nothing with history was read: a plain result
    count = len(traces)
    again = per_example(params, xs)
    assert len(traces) == count  # neither the search nor the program traced again
    close(again["weight"].array, first["weight"].array)


def test_cached_transform_draws_afresh_from_the_default_generator_at_every_call():
    def f(x):
        return (x * xgrad.randn(3)).sum()

    g = func.grad(f)
    xgrad.manual_seed(7)
    draws = [g(xgrad.tensor(X)).array for _ in range(3)]  # the gradient is the noise drawn
    xgrad.manual_seed(7)
    eager = [xgrad.randn(3).array for _ in range(3)]
    close(draws, eager)
    assert not np.allclose(draws[0], draws[1])


def test_cached_transform_raises_eagers_index_error_and_writes_arguments_back():
    table = xgrad.tensor(np.arange(12.0).reshape(4, 3))
    pick = func.vmap(lambda i: table[i].sum())
    close(pick(xgrad.tensor([0, 3])).array, np.array([3.0, 30.0]))
    with pytest.raises(IndexError, match="out of bounds"):  # the program's check failed: eager's error
        pick(xgrad.tensor([0, 9]))

    def bump(x):
        x.add_(1.0)
        return x * 2

    bumped = func.vmap(bump)
    x = xgrad.tensor(np.zeros((2, 3)))
    for step in (1.0, 2.0):
        close(bumped(x).array, np.full((2, 3), 2 * step))
        close(x.array, np.full((2, 3), step))  # written back at every call, not only when traced


def test_vmap_randomness_modes_over_the_default_generator():
    noisy = lambda x: x + xgrad.randn(3)  # noqa: E731
    xs = xgrad.tensor(np.zeros((4, 3)))
    with pytest.raises(RuntimeError, match="vmap: called random operation while in randomness error mode"):
        func.vmap(noisy)(xs)
    with pytest.raises(RuntimeError, match=r"randomness='different'\) is not supported"):
        func.vmap(noisy, randomness="different")(xs)
    xgrad.manual_seed(3)
    same = func.vmap(noisy, randomness="same")(xs).array
    xgrad.manual_seed(3)
    close(same, np.broadcast_to(xgrad.randn(3).array, (4, 3)))  # one draw, as eager draws it, for every example
