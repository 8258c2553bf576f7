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


# -- models: ensembling, batch norm, functional_call ----------------------------------------


def mlp(key):
    return xgrad.nn.Sequential(xgrad.nn.Linear(3, 4, key=key), xgrad.nn.Tanh(), xgrad.nn.Linear(4, 2, key=key + 100))


def mlp_ref(p, x):
    return jnp.tanh(x @ p["0.weight"].T + p["0.bias"]) @ p["2.weight"].T + p["2.bias"]


def test_stack_module_state_ensembles_with_vmap_of_functional_call():
    # torch.func's ensembling tutorial: one template, stacked state, vmap over the model dim.
    models = [mlp(k) for k in range(3)]
    params, buffers = func.stack_module_state(models)
    assert all(p.is_leaf and p.requires_grad and p.shape[0] == 3 for p in params.values()) and buffers == {}
    x = xgrad.tensor(np.random.default_rng(1).normal(size=(5, 3)))

    def one(p, b, data):
        return func.functional_call(models[0], (p, b), (data,))

    out = func.vmap(one, in_dims=(0, 0, None))(params, buffers, x)
    arrays = {k: v.array for k, v in params.items()}
    close(out.array, jax.vmap(mlp_ref, in_axes=(0, None))(arrays, x.array))
    for i, m in enumerate(models):
        close(out.array[i], m(x).array)
    # Gradients reach the stacked leaves (not the models'), through eager backward.
    out.pow(2).sum().backward()
    expected = jax.jit(jax.grad(lambda p: jnp.sum(jax.vmap(mlp_ref, in_axes=(0, None))(p, x.array) ** 2)))(arrays)
    for k, p in params.items():
        close(p.grad.array, expected[k])
    assert models[0][0].weight.grad is None


def test_stack_module_state_errors_and_buffers():
    with pytest.raises(RuntimeError, match="Expected at least one model"):
        func.stack_module_state([])
    with pytest.raises(RuntimeError, match="same class"):
        func.stack_module_state([mlp(0), xgrad.nn.Linear(3, 2, key=0)])
    with pytest.raises(RuntimeError, match="same training/eval mode"):
        func.stack_module_state([mlp(0), mlp(1).eval()])
    frozen = mlp(1)
    frozen[0].weight.requires_grad_(False)
    with pytest.raises(RuntimeError, match="0.weight from each model to have the same .requires_grad"):
        func.stack_module_state([mlp(0), frozen])
    bns = [xgrad.nn.BatchNorm1d(2) for _ in range(2)]
    _, buffers = func.stack_module_state(bns)
    assert buffers["running_mean"].shape == (2, 2) and not buffers["running_mean"].requires_grad


def test_replace_all_batch_norm_modules_lets_vmap_run_batch_norm():
    net = xgrad.nn.Sequential(xgrad.nn.Linear(3, 2, key=0), xgrad.nn.BatchNorm1d(2))
    assert func.replace_all_batch_norm_modules_(net) is net
    bn = net[1]
    assert bn.running_mean is None and bn.running_var is None and bn.num_batches_tracked is None
    assert not bn.track_running_stats
    x = np.random.default_rng(2).normal(size=(4, 5, 3))
    out = func.vmap(net)(xgrad.tensor(x))
    w, b = net[0].weight.array, net[0].bias.array

    def ref(rows):
        h = rows @ w.T + b
        return (h - h.mean(0)) / jnp.sqrt(h.var(0) + 1e-5)

    close(out.array, jax.vmap(ref)(x), rtol=1e-5)
    net.eval()  # no running statistics: batch statistics in eval mode too, as PyTorch
    close(func.vmap(net)(xgrad.tensor(x)).array, jax.vmap(ref)(x), rtol=1e-5)


def test_functional_call_tie_weights_and_strict():
    class Tied(xgrad.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = xgrad.nn.Linear(2, 2, bias=False, key=0)
            self.b = xgrad.nn.Linear(2, 2, bias=False, key=1)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    m = Tied()
    w = xgrad.tensor(np.array([[1.0, 2.0], [0.0, 1.0]]))
    x = xgrad.tensor(np.array([[1.0, -1.0]]))
    close(func.functional_call(m, {"a.weight": w}, (x,)).array, x.array @ w.array.T @ w.array.T)
    untied = func.functional_call(m, {"a.weight": w}, (x,), tie_weights=False)
    close(untied.array, x.array @ w.array.T @ m.a.weight.array.T)
    with pytest.raises(ValueError, match="tied"):
        func.functional_call(m, {"a.weight": w, "b.weight": w * 2}, (x,))
    with pytest.raises(RuntimeError, match=r"Missing key\(s\): 'b.weight'"):
        func.functional_call(m, {"a.weight": w}, (x,), tie_weights=False, strict=True)
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\): 'c'"):
        func.functional_call(m, {"a.weight": w, "b.weight": w, "c": w}, (x,), strict=True)
    assert m.a.weight is m.b.weight and isinstance(m.a.weight, xgrad.nn.Parameter)


# -- linearize, debug_unwrap ---------------------------------------------------------------


def test_linearize_matches_jax_jvp():
    def f(x, y):
        return (x.sin() * y, (x * y).sum())

    x, y = xgrad.tensor(X), xgrad.tensor(X[::-1].copy())
    out, jvp_fn = func.linearize(f, x, y)
    tx, ty = xgrad.tensor(np.ones(3)), xgrad.tensor(np.array([0.5, 0.0, -1.0]))
    ref_out, ref_t = jax.jvp(lambda a, b: (jnp.sin(a) * b, jnp.sum(a * b)), (x.array, y.array), (tx.array, ty.array))
    for a, e in zip(out, ref_out, strict=True):
        close(a.array, e)
    for a, e in zip(jvp_fn(tx, ty), ref_t, strict=True):
        close(a.array, e)
    with pytest.raises(RuntimeError, match="must match"):
        jvp_fn(tx, xgrad.ones(2))
    with pytest.raises(RuntimeError, match="structure of the primals"):
        jvp_fn(tx)


def test_debug_unwrap_shows_the_batch_and_the_primal():
    seen = {}

    def f(x):
        seen["vmap"] = func.debug_unwrap(x)
        seen["once"] = func.debug_unwrap(x, recurse=False)
        return func.grad(lambda t: (seen.setdefault("grad", func.debug_unwrap(t, recurse=False)) * t).sum())(x)

    x = np.arange(6.0).reshape(2, 3)
    func.vmap(f)(xgrad.tensor(x))
    close(seen["vmap"].array, x)
    assert not isinstance(seen["vmap"].array, jax.core.Tracer)
    close(seen["once"].array, x)
    # One level under grad is vmap's lane: still a tracer, with the lane's values.
    assert isinstance(seen["grad"].array, jax.core.Tracer) and seen["grad"].shape == (3,)
    assert func.debug_unwrap(3) == 3


# -- autograd.Function under vmap -----------------------------------------------------------


class RoundST(xgrad.autograd.Function):
    """Round with a straight-through backward (scaled by 3, so the user's backward is seen), and a vmap rule."""

    calls = []

    @staticmethod
    def forward(x, scale):
        return (x * scale).round()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.scale = inputs[1]

    @staticmethod
    def backward(ctx, g):
        return 3 * g * ctx.scale, None

    @staticmethod
    def vmap(info, in_dims, x, scale):
        RoundST.calls.append((info.batch_size, info.randomness, in_dims, x.shape))
        return RoundST.apply(x.movedim(in_dims[0], 0), scale), 0


def test_function_vmap_rule_runs_on_the_whole_batch_and_composes_with_grad():
    RoundST.calls.clear()
    x = np.array([[0.4, 1.6], [-0.7, 2.2], [0.1, 0.9]])
    out = func.vmap(RoundST.apply, in_dims=(1, None), randomness="same")(xgrad.tensor(x.T.copy()), 2.0)
    close(out.array, np.round(x * 2))
    assert RoundST.calls == [(3, "same", (1, None), (2, 3))]
    # Reverse mode through the rule reaches the user's backward: 3 * g * scale, not round's zero.
    g = func.grad(lambda t: func.vmap(RoundST.apply, in_dims=(0, None))(t, 2.0).sum())(xgrad.tensor(x))
    close(g.array, np.full_like(x, 6.0))
    # Eager autograd of a vmap over the Function (a transform that keeps history).
    leaf = xgrad.tensor(x, requires_grad=True)
    func.vmap(RoundST.apply, in_dims=(0, None))(leaf, 2.0).sum().backward()
    close(leaf.grad.array, np.full_like(x, 6.0))


def test_function_without_vmap_support_raises_torchs_errors():
    class NoRule(xgrad.autograd.Function):
        @staticmethod
        def forward(x):
            return x * 2

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, g):
            return g * 2

    x = xgrad.ones(3, 2)
    with pytest.raises(RuntimeError, match="You tried to vmap over NoRule, but it does not have vmap support"):
        func.vmap(NoRule.apply)(x)

    class Both(NoRule):
        generate_vmap_rule = True

        @staticmethod
        def vmap(info, in_dims, x):
            return x * 2, 0

    with pytest.raises(RuntimeError, match="has both generate_vmap_rule=True and an overridden vmap"):
        func.vmap(Both.apply)(x)

    class BadRule(NoRule):
        @staticmethod
        def vmap(info, in_dims, x):
            return x * 2

    with pytest.raises(RuntimeError, match="Expected the vmap staticmethod to have two returns"):
        func.vmap(BadRule.apply)(x)

    class Generated(NoRule):
        generate_vmap_rule = True

    close(func.vmap(Generated.apply)(x).array, 2 * np.ones((3, 2)))
    close(func.vmap(func.grad(lambda t: Generated.apply(t).sum()))(x).array, 2 * np.ones((3, 2)))
    # Nothing batched at the level: the Function runs as it is, no rule needed.
    close(func.vmap(lambda a, b: NoRule.apply(b) + a, in_dims=(0, None))(x, xgrad.ones(2)).array, 3 * np.ones((3, 2)))


# -- forward AD on and off -------------------------------------------------------------------


def test_set_fwd_grad_enabled_turns_tangents_off_and_back():
    import xgrad.autograd.forward_ad as fwAD

    assert fwAD._is_fwd_grad_enabled()
    x0 = xgrad.tensor(X)
    with fwAD.dual_level():
        x = fwAD.make_dual(x0, xgrad.ones_like(x0))
        with fwAD._set_fwd_grad_enabled(False):
            assert not fwAD._is_fwd_grad_enabled()
            assert fwAD.unpack_dual(x).tangent is None
            shift = x**2
        assert fwAD._is_fwd_grad_enabled()
        y = x**2 - shift
        close(fwAD.unpack_dual(y).tangent.array, 2 * X)  # torch.func's test_disable_fwd_grad_inside, in eager forward AD
        assert fwAD.unpack_dual(shift).tangent is None

        @fwAD._set_fwd_grad_enabled(False)
        def untracked(t):
            return t.sin()

        assert fwAD._is_fwd_grad_enabled()
        assert fwAD.unpack_dual(untracked(x)).tangent is None
        fwAD._set_fwd_grad_enabled(False)  # a plain call sets it, as PyTorch's
        assert not fwAD._is_fwd_grad_enabled()
        fwAD._set_fwd_grad_enabled(True)
    # func.jvp is JAX's: it works with forward grad off outside it (torch.func's test_disable_fwd_grad_outside).
    with fwAD._set_fwd_grad_enabled(False):
        _, t = func.jvp(lambda a: a.sin(), (x0,), (xgrad.ones_like(x0),))
    close(t.array, np.cos(X))


# -- composition with eager autograd --------------------------------------------------------

MODES = ["eager", "compiled_backward", "xgrad.compile"]


def run_backward(mode, step):
    """``step()`` (which calls ``backward()``) eagerly, with the backward compiled, or as one ``xgrad.compile`` program."""
    if mode == "xgrad.compile":
        return xgrad.compile(step)()
    with compiled_backward_mode(mode == "compiled_backward"):
        return step()


def compiled_backward_mode(on):
    import contextlib

    from xgrad.autograd import compiled

    return compiled.enable() if on else contextlib.nullcontext()


def maml_setup():
    model = xgrad.nn.Sequential(xgrad.nn.Linear(2, 8, key=3, dtype=jnp.float64), xgrad.nn.Tanh(),
                                xgrad.nn.Linear(8, 1, key=4, dtype=jnp.float64))
    rng = np.random.default_rng(3)
    tasks = [tuple(rng.normal(size=s) for s in ((5, 2), (5, 1), (4, 2), (4, 1))) for _ in range(1)]
    return model, tasks


def maml_ref(p, tasks, lr=0.1, steps=2):
    def net(q, x):
        return jnp.tanh(x @ q["0.weight"].T + q["0.bias"]) @ q["2.weight"].T + q["2.bias"]

    def inner(q, x, y):
        return jnp.mean((net(q, x) - y) ** 2)

    total = 0.0
    for xs, ys, xq, yq in tasks:
        q = p
        for _ in range(steps):
            g = jax.grad(inner)(q, xs, ys)
            q = {k: q[k] - lr * g[k] for k in q}
        total = total + inner(q, xq, yq)
    return total


@pytest.mark.parametrize("mode", MODES)
def test_maml_inner_grad_steps_outer_backward_match_jax(mode):
    # torch.func's MAML: inner steps with func.grad on functional_call, outer loss.backward() to the model.
    model, tasks = maml_setup()
    params = dict(model.named_parameters())
    data = [tuple(xgrad.tensor(a) for a in task) for task in tasks]

    def inner_loss(p, x, y):
        return ((func.functional_call(model, p, (x,)) - y) ** 2).mean()

    def step():
        total = 0
        for xs, ys, xq, yq in data:
            fast = params
            for _ in range(2):
                grads = func.grad(inner_loss)(fast, xs, ys)
                fast = {k: fast[k] - 0.1 * grads[k] for k in fast}
            total = total + inner_loss(fast, xq, yq)
        total.backward()
        return total

    loss = run_backward(mode, step)
    arrays = {k: v.detach().array for k, v in params.items()}
    value, expected = jax.jit(jax.value_and_grad(maml_ref))(arrays, tasks)  # jitted: JAX op by op is slow here
    close(loss.detach().array, value, rtol=1e-10)
    for k, p in params.items():
        close(p.grad.array, expected[k], rtol=1e-8)


@pytest.mark.parametrize("mode", MODES)
def test_vjp_results_differentiated_by_outer_autograd(mode):
    x = xgrad.tensor(X, requires_grad=True)
    v = xgrad.tensor(np.array([1.0, -2.0, 0.5]), requires_grad=True)

    def step():
        out, vjp_fn = func.vjp(lambda t: t.sin() * t, x)
        (g,) = vjp_fn(v)
        gx, gv = xgrad.autograd.grad((g * g).sum() + out.sum(), (x, v), retain_graph=True)
        (g * g).sum().backward()
        return gx, gv

    gx, gv = run_backward(mode, step)

    def ref(a, b):
        out, pull = jax.vjp(lambda t: jnp.sin(t) * t, a)
        (g,) = pull(b)
        return jnp.sum(g * g) + jnp.sum(out)

    ex, ev = jax.grad(ref, argnums=(0, 1))(X, v.detach().array)
    close(gx.array, ex, rtol=1e-10)
    close(gv.array, ev, rtol=1e-10)
    gg = jax.grad(lambda a, b: jnp.sum(jax.vjp(lambda t: jnp.sin(t) * t, a)[1](b)[0] ** 2), argnums=(0, 1))(X, v.detach().array)
    close(x.grad.array, gg[0], rtol=1e-10)
    close(v.grad.array, gg[1], rtol=1e-10)


def test_no_grad_around_vjp_or_vjp_fn_as_torch_func():
    # torch.func's test_no_grad_outside_vjp, _vjp_fn and _vjp_only.
    def h(t):
        return t**2

    x = xgrad.tensor(3.0, requires_grad=True, dtype=jnp.float64)
    one = xgrad.tensor(1.0, dtype=jnp.float64)
    with xgrad.no_grad():
        out, vjp_fn = func.vjp(h, x)
        (y,) = vjp_fn(one)
    assert not out.requires_grad and not y.requires_grad
    close(y.array, 6.0)

    out, vjp_fn = func.vjp(h, x)
    with xgrad.no_grad():
        (y,) = vjp_fn(one)
    close(y.array, 6.0)
    assert not y.requires_grad and out.requires_grad
    (z,) = xgrad.autograd.grad(out, x)
    close(z.array, 6.0)

    with xgrad.no_grad():
        out, vjp_fn = func.vjp(h, x)
    (y,) = vjp_fn(one)
    assert not out.requires_grad and y.requires_grad
    (z,) = xgrad.autograd.grad(y, x)
    close(z.array, 2.0)
