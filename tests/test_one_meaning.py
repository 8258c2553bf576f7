"""One meaning for gradients: what changes a gradient in eager xgrad changes it on every route.

Each case is a function of one Tensor written once; each route computes its gradient
(eager ``backward()``, the compiled backward, ``xgrad.compile``, ``jax.grad``/``jax.vjp``
and ``jax.jit(jax.grad)`` over the same code, ``xgrad.func``'s transforms and
``eqx.filter_grad``), and every route must give the reference: the same math written
on ``jax.numpy`` with ``lax.stop_gradient``/``jax.custom_vjp``, as torch.func computes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xgrad
from xgrad import func, nn

X = np.array([0.7, -1.3, 2.1], dtype=np.float32)


def _np(t: Any) -> np.ndarray:
    """A gradient as NumPy (a grad tree from ``jax.grad`` keeps its parameter's flags)."""
    return np.asarray(t.detach().numpy() if isinstance(t, xgrad.Tensor) else t)


def _tensor(x: np.ndarray) -> xgrad.Tensor:
    return xgrad.tensor(x, requires_grad=True)


def _batched(f: Callable[[xgrad.Tensor], xgrad.Tensor], x: np.ndarray) -> np.ndarray:
    rows = func.vmap(func.grad(f))(xgrad.tensor(np.stack([x, 2 * x])))
    return _np(rows)[0]


def _compiled_step(f: Callable[[xgrad.Tensor], xgrad.Tensor], x: np.ndarray) -> np.ndarray:
    t = _tensor(x)

    @xgrad.compile
    def step(t: xgrad.Tensor) -> None:
        f(t).backward()

    step(t)
    return _np(t.grad)


def _eager(f: Callable[[xgrad.Tensor], xgrad.Tensor], x: np.ndarray, compiled: bool) -> np.ndarray:
    t = _tensor(x)
    f(t).backward(compiled=compiled)
    return t.grad.numpy()


ROUTES: dict[str, Callable[[Callable[[xgrad.Tensor], xgrad.Tensor], np.ndarray], Any]] = {
    "backward": lambda f, x: _eager(f, x, compiled=False),
    "compiled backward": lambda f, x: _eager(f, x, compiled=True),
    "xgrad.compile": _compiled_step,
    "jax.grad": lambda f, x: _np(jax.grad(lambda t: f(t).array)(_tensor(x))),
    "jax.jit(jax.grad)": lambda f, x: _np(jax.jit(jax.grad(lambda t: f(t).array))(_tensor(x))),
    "jax.vjp": lambda f, x: _np(jax.vjp(lambda t: f(t).array, _tensor(x))[1](jnp.float32(1.0))[0]),
    "func.grad": lambda f, x: _np(func.grad(f)(xgrad.tensor(x))),
    "func.vjp": lambda f, x: _np(func.vjp(f, xgrad.tensor(x))[1](xgrad.tensor(1.0))[0]),
    "func.jacrev": lambda f, x: _np(func.jacrev(f)(xgrad.tensor(x))),
    "func.vmap(func.grad)": _batched,
    "eqx.filter_grad": lambda f, x: _np(eqx.filter_grad(lambda t: f(t).array)(_tensor(x))),
}


# -- the cases: xgrad code, and the same math on jax.numpy --------------------------------------------


def detach_case(x: xgrad.Tensor) -> xgrad.Tensor:
    return (x * x.detach()).sum()


def detach_ref(x: jax.Array) -> jax.Array:
    return (x * jax.lax.stop_gradient(x)).sum()


def data_case(x: xgrad.Tensor) -> xgrad.Tensor:
    return (x.sin() * x.data).sum()


def data_ref(x: jax.Array) -> jax.Array:
    return (jnp.sin(x) * jax.lax.stop_gradient(x)).sum()


def _switched_off(switch: Callable[[], Any]) -> Callable[[xgrad.Tensor], xgrad.Tensor]:
    def case(x: xgrad.Tensor) -> xgrad.Tensor:
        with switch():
            baseline = (x * 2).exp()  # a target network, a baseline: a constant of the loss
        # Added, not multiplied: an inference tensor cannot be saved for backward (PyTorch's rule).
        return (x.sin() + baseline * baseline).sum()

    return case


def switched_off_ref(x: jax.Array) -> jax.Array:
    baseline = jax.lax.stop_gradient(jnp.exp(x * 2))
    return (jnp.sin(x) + baseline * baseline).sum()


class StraightThrough(xgrad.autograd.Function):
    # forward without ctx, as torch.func's transforms need (a forward(ctx, x) raises there, as in torch.func)
    @staticmethod
    def forward(x: xgrad.Tensor) -> xgrad.Tensor:
        return x.round()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        pass

    @staticmethod
    def backward(ctx: Any, g: xgrad.Tensor) -> xgrad.Tensor:
        return g


def function_case(x: xgrad.Tensor) -> xgrad.Tensor:
    return (StraightThrough.apply(x * 1.5) * x).sum()


def function_ref(x: jax.Array) -> jax.Array:
    y = x * 1.5
    return ((y + jax.lax.stop_gradient(jnp.round(y) - y)) * x).sum()


class ScaledSquare(xgrad.autograd.Function):
    """``setup_context``, a saved tensor, a non-tensor input and ``needs_input_grad``."""

    @staticmethod
    def forward(x: xgrad.Tensor, scale: float) -> xgrad.Tensor:
        return x * x * scale

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        x, scale = inputs
        ctx.save_for_backward(x)
        ctx.scale = scale

    @staticmethod
    def backward(ctx: Any, g: xgrad.Tensor) -> tuple[Any, None]:
        (x,) = ctx.saved_tensors
        assert ctx.needs_input_grad == (True, False)
        return 3 * ctx.scale * x * g, None  # deliberately not the derivative: the user's rule wins


def setup_context_case(x: xgrad.Tensor) -> xgrad.Tensor:
    return ScaledSquare.apply(x, 0.5).sum()


def setup_context_ref(x: jax.Array) -> jax.Array:
    @jax.custom_vjp
    def scaled_square(x: jax.Array) -> jax.Array:
        return x * x * 0.5

    scaled_square.defvjp(lambda x: (scaled_square(x), x), lambda x, g: (3 * 0.5 * x * g,))
    return scaled_square(x).sum()


def hook_case(x: xgrad.Tensor) -> xgrad.Tensor:
    y = x * 2
    y.register_hook(lambda g: g * 10)
    y.register_hook(lambda g: g + 1)  # after the first: (g * 10) + 1
    return (y * y).sum()


def hook_ref(x: jax.Array) -> jax.Array:
    @jax.custom_vjp
    def hooked(y: jax.Array) -> jax.Array:
        return y

    hooked.defvjp(lambda y: (y, None), lambda _, g: (g * 10 + 1,))
    y = hooked(x * 2)
    return (y * y).sum()


CASES = {
    "detach": (detach_case, detach_ref),
    ".data": (data_case, data_ref),
    "no_grad": (_switched_off(xgrad.no_grad), switched_off_ref),
    "inference_mode": (_switched_off(xgrad.inference_mode), switched_off_ref),
    "set_grad_enabled(False)": (_switched_off(lambda: xgrad.set_grad_enabled(False)), switched_off_ref),
    "Function (straight-through)": (function_case, function_ref),
    "Function (setup_context)": (setup_context_case, setup_context_ref),
    "tensor hooks": (hook_case, hook_ref),
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("case", CASES)
def test_every_route_gives_the_reference(case: str, route: str) -> None:
    f, ref = CASES[case]
    expected = np.asarray(jax.grad(ref)(jnp.asarray(X)))
    got = ROUTES[route](f, X)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6, err_msg=f"{case} on {route}")


def test_no_grad_around_a_transformation_does_not_reach_into_it() -> None:
    """As ``torch.func.grad`` ignores a ``no_grad`` around it, so do ``jax.grad`` and ``xgrad.func.grad``."""
    x = xgrad.tensor(X)
    with xgrad.no_grad():
        by_func = func.grad(lambda t: (t * t).sum())(x)
        by_jax = jax.grad(lambda t: (t * t).sum().array)(x)
    np.testing.assert_allclose(_np(by_func), 2 * X)
    np.testing.assert_allclose(_np(by_jax), 2 * X)


# -- models: parameter hooks, frozen parameters and buffers on jax.grad(loss)(model) ---------------------


def _model() -> nn.Module:
    model = nn.Sequential(nn.Linear(3, 4, key=0), nn.Tanh(), nn.Linear(4, 2, key=1))
    model[0].weight.register_hook(lambda g: g.clamp(-0.05, 0.05))
    model[2].bias.requires_grad_(False)
    return model


def _loss(model: nn.Module, x: xgrad.Tensor) -> xgrad.Tensor:
    return (model(x) ** 2).sum()


MODEL_ROUTES = {
    "jax.grad": lambda m, x: jax.grad(lambda m: _loss(m, x).array)(m),
    "jax.jit(jax.grad)": lambda m, x: jax.jit(jax.grad(lambda m, x: _loss(m, x).array))(m, x),
    "eqx.filter_grad": lambda m, x: eqx.filter_grad(lambda m: _loss(m, x).array)(m),
    "jax.vjp": lambda m, x: jax.vjp(lambda m: _loss(m, x).array, m)[1](jnp.float32(1.0))[0],
}


@pytest.mark.parametrize("route", MODEL_ROUTES)
def test_parameter_hooks_and_frozen_parameters_hold_for_a_model(route: str) -> None:
    x = xgrad.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    eager = _model()
    _loss(eager, x).backward()
    grads = MODEL_ROUTES[route](_model(), x)
    for (name, p), (_, g) in zip(eager.named_parameters(), grads.named_parameters(), strict=True):
        if p.grad is None:  # frozen: eager gives none, JAX's routes zeros (an optimizer leaves it as it is)
            np.testing.assert_array_equal(_np(g), 0.0, err_msg=name)
        else:
            np.testing.assert_allclose(_np(g), p.grad.numpy(), rtol=1e-5, atol=1e-7, err_msg=name)
    assert np.abs(_np(grads[0].weight)).max() <= 0.05 + 1e-7  # the clamp ran


def test_a_buffer_gets_no_gradient_on_jax_routes() -> None:
    """An eval-mode BatchNorm reads its running statistics: eager gives them no grad, nor may jax.grad."""
    model = nn.Sequential(nn.Linear(3, 3, key=0), nn.BatchNorm1d(3)).eval()
    x = xgrad.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    grads = eqx.filter_grad(lambda m: _loss(m, x).array)(model)
    np.testing.assert_array_equal(_np(grads[1].running_mean), 0.0)
    np.testing.assert_array_equal(_np(grads[1].running_var), 0.0)


# -- results of transformations used in an eager loss ----------------------------------------------------


class Product(xgrad.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: xgrad.Tensor, b: xgrad.Tensor) -> xgrad.Tensor:
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx: Any, g: xgrad.Tensor) -> tuple[xgrad.Tensor, xgrad.Tensor]:
        a, b = ctx.saved_tensors
        return g * b, g * a


def test_a_plain_jit_result_in_a_loss_that_requires_grad_raises_with_the_fix() -> None:
    t = xgrad.tensor([1.0, 2.0], requires_grad=True)
    piece = jax.jit(lambda a: (a * a).sum())(t)
    with pytest.raises(RuntimeError, match=r"plain JAX transformation .* xgrad\.compile\(fn\)"):
        piece + (t * 3).sum()
    with pytest.raises(RuntimeError, match=r"plain JAX transformation"):
        Product.apply(piece, t)  # through a Function's inputs too
    # As a value it is fine, and so is the same call under no_grad
    assert piece.item() == 5.0
    with xgrad.no_grad():
        piece = jax.jit(lambda a: (a * a).sum())(t)
    loss = piece + (t * 3).sum()
    loss.backward()
    np.testing.assert_allclose(t.grad.numpy(), [3.0, 3.0])  # the jitted piece is a constant, as asked


@pytest.mark.parametrize("compiled", [False, True], ids=["backward", "compiled backward"])
def test_func_transform_results_keep_their_history(compiled: bool) -> None:
    """torch.func's force-matching example: the force term's gradient reaches the positions."""
    r_np = np.array([[0.5, 1.0, 1.5], [1.0, 2.0, 0.3]], dtype=np.float32)

    def energy(x: Any) -> Any:
        return (x**3).sum() + (x[..., 0] * x[..., 1]).sum()

    r = xgrad.tensor(r_np, requires_grad=True)
    force = -func.vmap(func.jacrev(energy))(r)
    (energy(r) + (force**2).sum()).backward(compiled=compiled)

    def loss_ref(x: jax.Array) -> jax.Array:
        return energy(x) + ((-jax.vmap(jax.jacrev(energy))(x)) ** 2).sum()

    np.testing.assert_allclose(r.grad.numpy(), jax.grad(loss_ref)(jnp.asarray(r_np)), rtol=1e-5)


@pytest.mark.parametrize("compiled", [False, True], ids=["backward", "compiled backward"])
def test_func_transform_results_keep_the_history_of_what_the_function_closes_over(compiled: bool) -> None:
    """torch.func's Lennard-Jones example: the energy model's parameters are closed over by the
    function under ``vmap(jacrev(...))``, and the force term's gradient reaches them too."""
    model = nn.Sequential(nn.Linear(1, 8, key=0), nn.Tanh(), nn.Linear(8, 1, key=1))
    d_np = np.linspace(0.8, 1.6, 5, dtype=np.float32).reshape(5, 1)

    def energy(d: Any) -> Any:
        return model(d).sum()

    d = xgrad.tensor(d_np)
    force = -func.vmap(func.jacrev(energy))(d)
    (model(d).pow(2).mean() + force.pow(2).mean()).backward(compiled=compiled)
    params = {n: p.detach().array for n, p in model.named_parameters()}

    def reference(p: dict[str, jax.Array]) -> jax.Array:
        def e(x: jax.Array) -> jax.Array:
            return (jnp.tanh(x @ p["0.weight"].T + p["0.bias"]) @ p["2.weight"].T + p["2.bias"]).sum()

        x = jnp.asarray(d_np)
        out = jnp.tanh(x @ p["0.weight"].T + p["0.bias"]) @ p["2.weight"].T + p["2.bias"]
        return (out**2).mean() + (jax.vmap(jax.jacrev(e))(x) ** 2).mean()

    expected = jax.grad(reference)(params)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), expected[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("compiled", [False, True], ids=["backward", "compiled backward"])
def test_maml_inner_step_differentiates_through_the_inner_gradient(compiled: bool) -> None:
    w = xgrad.tensor([1.0, -2.0], requires_grad=True)

    def inner(v: Any) -> Any:
        return ((v * 3.0 - 1.0) ** 2).sum()

    adapted = w - 0.1 * func.grad(inner)(w)
    (adapted**2).sum().backward(compiled=compiled)
    expected = jax.grad(lambda v: ((v - 0.1 * jax.grad(inner)(v)) ** 2).sum())(jnp.array([1.0, -2.0]))
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-6)


# -- module backward hooks --------------------------------------------------------------------------------


def _hooked_model() -> tuple[nn.Module, list[str]]:
    model = nn.Sequential(nn.Linear(3, 4, key=0), nn.Tanh(), nn.Linear(4, 2, key=1))
    calls: list[str] = []

    def pre_hook(module: Any, grad_output: tuple[Any, ...]) -> tuple[Any, ...]:
        calls.append("pre")
        return (grad_output[0] * 2,)

    def hook(module: Any, grad_input: tuple[Any, ...], grad_output: tuple[Any, ...]) -> tuple[Any, ...]:
        calls.append("hook")
        return (grad_input[0] * 0.5,)

    model[2].register_full_backward_pre_hook(pre_hook)
    model[2].register_full_backward_hook(hook)
    return model, calls


def _module_hooks_ref(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """The hooked model on arrays: the pre-hook doubles the output's cotangent, the hook halves the input's."""

    def scaled(factor: float) -> Callable[[jax.Array], jax.Array]:
        @jax.custom_vjp
        def identity(y: jax.Array) -> jax.Array:
            return y

        identity.defvjp(lambda y: (y, None), lambda _, g: (g * factor,))
        return identity

    h = jnp.tanh(x @ params["0.weight"].T + params["0.bias"])
    y = scaled(2.0)(scaled(0.5)(h) @ params["2.weight"].T + params["2.bias"])
    return (y**2).sum()


@pytest.mark.parametrize("route", ["backward", "compiled backward", "xgrad.compile", *MODEL_ROUTES, "func.grad"])
def test_module_backward_hooks_run_on_every_route(route: str) -> None:
    x = xgrad.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    model, calls = _hooked_model()
    if route == "func.grad":
        params = {name: p.detach() for name, p in model.named_parameters()}
        by_name = func.grad(lambda p: (func.functional_call(model, p, (x,)) ** 2).sum())(params)
        grads = {name: _np(g) for name, g in by_name.items()}
    elif route in MODEL_ROUTES:
        grads = {name: _np(g) for name, g in MODEL_ROUTES[route](model, x).named_parameters()}
    else:
        step = (lambda: _loss(model, x).backward()) if route == "backward" else (lambda: _loss(model, x).backward(compiled=True))
        (xgrad.compile(step) if route == "xgrad.compile" else step)()
        grads = {name: p.grad.numpy() for name, p in model.named_parameters()}
    arrays = {name: jnp.asarray(p.detach().numpy()) for name, p in model.named_parameters()}
    expected = jax.grad(_module_hooks_ref)(arrays, jnp.asarray(x.numpy()))
    for name, g in grads.items():
        np.testing.assert_allclose(g, expected[name], rtol=1e-5, atol=1e-7, err_msg=name)
    assert calls[:2] == ["pre", "hook"]


# -- shared parameters, foreign pytrees, state written in a trace -------------------------------------------


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3, key=0)
        self.body = nn.Linear(3, 3, key=1)
        self.head = nn.Linear(3, 5, bias=False, key=2)
        self.head.weight = self.emb.weight  # tied, as GPT-2's lm_head

    def forward(self, idx: xgrad.Tensor) -> xgrad.Tensor:
        return self.head(self.body(self.emb(idx)).tanh())


IDX = np.array([0, 2, 4, 1])


def _tied_loss(model: nn.Module) -> jax.Array:
    return (model(xgrad.tensor(IDX)) ** 2).mean().array


@pytest.mark.parametrize("route", ["jax.grad", "jax.jit(jax.grad)", "eqx.filter_grad", "jax.vjp"])
def test_a_tied_weight_is_one_leaf_with_one_gradient(route: str) -> None:
    eager = TiedLM()
    (eager(xgrad.tensor(IDX)) ** 2).mean().backward()
    model = TiedLM()
    assert len(jax.tree_util.tree_leaves(model)) == len(list(model.parameters())) == 3
    transform = {
        "jax.grad": jax.grad, "jax.jit(jax.grad)": lambda f: jax.jit(jax.grad(f)), "eqx.filter_grad": eqx.filter_grad,
        "jax.vjp": lambda f: lambda m: jax.vjp(f, m)[1](jnp.float32(1.0))[0],
    }
    grads = transform[route](_tied_loss)(model)
    assert grads.head.weight is grads.emb.weight
    for (name, p), (_, g) in zip(eager.named_parameters(), grads.named_parameters(), strict=True):
        np.testing.assert_allclose(_np(g), p.grad.numpy(), rtol=1e-5, atol=1e-7, err_msg=name)


def test_optax_keeps_tied_weights_tied() -> None:
    import optax

    model = TiedLM()
    tx = optax.adam(1e-2)
    state = tx.init(model)
    for _ in range(2):
        updates, state = tx.update(jax.grad(_tied_loss)(model), state, model)
        model = optax.apply_updates(model, updates)
    assert model.head.weight is model.emb.weight
    assert [n for n, _ in model.named_parameters()] == ["emb.weight", "body.weight", "body.bias"]


def test_a_shared_submodule_comes_back_shared() -> None:
    shared = nn.Linear(2, 2, key=0)
    model = nn.Sequential(shared, nn.Tanh(), shared)
    rebuilt = jax.tree_util.tree_map(lambda a: a * 2, model)
    assert rebuilt[0] is rebuilt[2]
    assert len(jax.tree_util.tree_leaves(model)) == 2


class HoldsEquinox(nn.Module):
    def __init__(self, mlp: Any) -> None:
        super().__init__()
        self.mlp = mlp
        self.scale = nn.Parameter(jnp.full((), 1.5, jnp.float32))

    def forward(self, x: xgrad.Tensor) -> xgrad.Tensor:
        return xgrad.from_jax(lambda m, x: jax.vmap(m)(x))(self.mlp, x) * self.scale


def test_a_foreign_pytree_is_a_child_trained_on_every_route() -> None:
    mlp = eqx.nn.MLP(3, 2, 8, 1, key=jax.random.key(0))
    as_parameters = jax.tree_util.tree_map(lambda a: nn.Parameter(a) if eqx.is_inexact_array(a) else a, mlp)
    x = xgrad.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    eager = HoldsEquinox(as_parameters)
    assert [n for n, _ in eager.named_parameters()] == [
        "mlp.layers.0.weight", "mlp.layers.0.bias", "mlp.layers.1.weight", "mlp.layers.1.bias", "scale",
    ]
    (eager(x) ** 2).sum().backward()  # eager optimizers see the Parameters inside it

    def reference(mlp: Any, scale: jax.Array) -> jax.Array:
        return ((jax.vmap(mlp)(jnp.asarray(x.numpy())) * scale) ** 2).sum()

    expected = eqx.filter_grad(lambda m: reference(m, jnp.float32(1.5)))(mlp)
    np.testing.assert_allclose(eager.mlp.layers[0].weight.grad.numpy(), expected.layers[0].weight, rtol=1e-5)
    # Plain arrays (not Parameters) are children too: JAX's routes differentiate and jit them.
    raw = HoldsEquinox(mlp)
    assert len(jax.tree_util.tree_leaves(raw)) == 5
    def loss(m: Any) -> jax.Array:
        return (m(x) ** 2).sum().array

    value, pullback = jax.vjp(loss, raw)
    for route, grads in {"jax.grad": jax.grad(loss)(raw), "jax.vjp": pullback(jnp.ones_like(value))[0]}.items():
        np.testing.assert_allclose(np.asarray(grads.mlp.layers[0].weight), expected.layers[0].weight, rtol=1e-5, err_msg=route)
    # Equinox's filters build trees leaf by leaf (masks of bools, partitions with Nones): both the
    # Parameters' placeholders and plain arrays keep the model's structure there.
    for held in (as_parameters, mlp):
        grads = eqx.filter_grad(loss)(HoldsEquinox(held))
        np.testing.assert_allclose(_np(grads.mlp.layers[0].weight), expected.layers[0].weight, rtol=1e-5)
        value, grads = eqx.filter_value_and_grad(loss)(HoldsEquinox(held))
        np.testing.assert_allclose(float(value), float(reference(mlp, jnp.float32(1.5))), rtol=1e-6)
        np.testing.assert_allclose(_np(grads.mlp.layers[1].bias), expected.layers[1].bias, rtol=1e-5)
    params, static = eqx.partition(raw, eqx.is_inexact_array)
    assert static.mlp.layers[0].weight is None and params.mlp.layers[0].weight is not None
    np.testing.assert_allclose(_np(eqx.combine(params, static)(x)), _np(raw(x)), rtol=1e-6)
    np.testing.assert_allclose(_np(eqx.filter_jit(lambda m, x: m(x))(raw, x)), _np(raw(x)), rtol=1e-6)
    np.testing.assert_allclose(_np(jax.jit(lambda m, x: m(x))(raw, x)), _np(raw(x)), rtol=1e-6)


def test_a_buffer_written_in_a_plain_trace_raises_naming_xgrad_compile() -> None:
    model = nn.Sequential(nn.Linear(3, 3, key=0), nn.BatchNorm1d(3))
    x = xgrad.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    before = model[1].running_mean.numpy().copy()
    with pytest.raises(RuntimeError, match=r"modified in place inside it.*xgrad\.compile"):
        jax.jit(lambda m, x: m(x))(model, x)
    np.testing.assert_array_equal(model[1].running_mean.numpy(), before)

    @xgrad.compile
    def forward(x: xgrad.Tensor) -> xgrad.Tensor:
        return model(x)

    forward(x)  # xgrad.compile writes the running statistics back, as eager does
    eager = nn.Sequential(nn.Linear(3, 3, key=0), nn.BatchNorm1d(3))
    eager(x)
    np.testing.assert_allclose(model[1].running_mean.numpy(), eager[1].running_mean.numpy(), rtol=1e-6)


# -- Equinox's filtering conventions on xgrad modules --------------------------------------------------------


def test_equinox_filters_work_on_xgrad_modules() -> None:
    model = nn.Sequential(nn.Linear(3, 3, key=0), nn.BatchNorm1d(3)).eval()  # an integer buffer among the leaves
    x = xgrad.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    loss, grads = eqx.filter_value_and_grad(lambda m: _loss(m, x).array)(model)
    eager = nn.Sequential(nn.Linear(3, 3, key=0), nn.BatchNorm1d(3)).eval()
    eager_loss = _loss(eager, x)
    eager_loss.backward()
    np.testing.assert_allclose(float(loss), eager_loss.item(), rtol=1e-6)
    np.testing.assert_allclose(_np(grads[0].weight), eager[0].weight.grad.numpy(), rtol=1e-5)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    again = eqx.combine(params, static)
    np.testing.assert_allclose(_np(again(x)), _np(model(x)))
    new_layer = nn.Linear(3, 3, key=5)
    replaced = eqx.tree_at(lambda m: m[0], model, new_layer)
    np.testing.assert_array_equal(_np(replaced[0].weight), _np(new_layer.weight))
    assert [n for n, _ in replaced.named_parameters()] == [n for n, _ in model.named_parameters()]
    # A module's Tensor attribute is not a node of its tree (its array is): tree_at says what to do instead.
    with pytest.raises(TypeError, match=r"eqx\.tree_at cannot select a Tensor attribute of an xgrad module"):
        eqx.tree_at(lambda m: m[0].bias, model, xgrad.zeros(3))


# -- in-place writes inside xgrad.func, as torch.func -----------------------------------------------------------


def test_vmap_and_jvp_write_in_place_changes_back_to_the_inputs() -> None:
    x, y = xgrad.zeros(3, 2), xgrad.arange(6.0).reshape(3, 2)
    func.vmap(lambda a, b: a.add_(b))(x, y)
    np.testing.assert_array_equal(x.numpy(), y.numpy())
    chunked = xgrad.zeros(3, 2)
    func.vmap(lambda a, b: a.copy_(b * 2), chunk_size=2)(chunked, y)
    np.testing.assert_array_equal(chunked.numpy(), 2 * y.numpy())
    p = xgrad.tensor([1.0, 2.0])
    _, tangent = func.jvp(lambda a: a.mul_(3.0), (p,), (xgrad.ones(2),))
    np.testing.assert_array_equal(p.numpy(), [3.0, 6.0])
    np.testing.assert_array_equal(tangent.numpy(), [3.0, 3.0])


def test_writing_a_captured_tensor_inside_a_transform_raises_torch_funcs_error() -> None:
    buffer = xgrad.zeros(2)
    with pytest.raises(RuntimeError, match="would mutate a captured Tensor"):
        func.grad(lambda a: (buffer.copy_(a) * a).sum())(xgrad.ones(2))
    with pytest.raises(RuntimeError, match=r"vmap: inplace arithmetic\(self, \*extra_args\) is not possible"):
        func.vmap(lambda a, b: a.add_(b), in_dims=(None, 0))(xgrad.zeros(2), xgrad.ones(3, 2))
    np.testing.assert_array_equal(buffer.numpy(), 0.0)  # nothing of the trace is left in it


# -- Function: the rest of its protocol on JAX's AD ----------------------------------------------------------------


class TwoOutputs(xgrad.autograd.Function):
    @staticmethod
    def forward(x: xgrad.Tensor) -> tuple[xgrad.Tensor, xgrad.Tensor]:
        return x * 2, x * 3

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx: Any, g1: Any, g2: Any) -> xgrad.Tensor:
        assert g2 is None  # the second output reaches no loss: None, as materialize_grads=False says
        return g1 * 2


def test_set_materialize_grads_false_gives_none_for_an_unused_output() -> None:
    g = jax.grad(lambda t: TwoOutputs.apply(t)[0].sum().array)(_tensor(X))
    np.testing.assert_allclose(_np(g), 2.0)
    np.testing.assert_allclose(_np(func.grad(lambda t: TwoOutputs.apply(t)[0].sum())(xgrad.tensor(X))), 2.0)


class OnceSquare(xgrad.autograd.Function):
    @staticmethod
    def forward(x: xgrad.Tensor) -> xgrad.Tensor:
        return x * x

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(inputs[0])

    @staticmethod
    @xgrad.autograd.once_differentiable
    def backward(ctx: Any, g: xgrad.Tensor) -> xgrad.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * g


def test_once_differentiable_raises_when_jax_differentiates_its_backward() -> None:
    first = func.grad(lambda t: OnceSquare.apply(t).sum())(xgrad.tensor(X))
    np.testing.assert_allclose(_np(first), 2 * X, rtol=1e-6)
    with pytest.raises(RuntimeError, match="differentiate twice a function that was marked with @once_differentiable"):
        func.grad(lambda t: func.grad(lambda u: OnceSquare.apply(u).sum())(t).sum())(xgrad.tensor(X))


class CubeForward(xgrad.autograd.Function):
    """Forward mode only: a ``jvp``, no ``backward``."""

    @staticmethod
    def forward(x: xgrad.Tensor) -> xgrad.Tensor:
        return x**3

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def jvp(ctx: Any, t: xgrad.Tensor) -> xgrad.Tensor:
        (x,) = ctx.saved_tensors
        return 3 * x * x * t


def test_a_functions_jvp_gives_forward_mode_on_jax() -> None:
    _, tangent = func.jvp(CubeForward.apply, (xgrad.tensor(X),), (xgrad.ones(3),))
    np.testing.assert_allclose(tangent.numpy(), 3 * X**2, rtol=1e-6)
    _, tangent = jax.jvp(lambda a: CubeForward.apply(xgrad.tensor(a)).array, (jnp.asarray(X),), (jnp.ones(3, X.dtype),))
    np.testing.assert_allclose(np.asarray(tangent), 3 * X**2, rtol=1e-6)


def test_a_function_under_vmap_is_batched_as_generate_vmap_rule() -> None:
    rows = np.stack([X, 2 * X])
    grads = func.vmap(func.grad(function_case))(xgrad.tensor(rows))
    expected = jax.vmap(jax.grad(function_ref))(jnp.asarray(rows))
    np.testing.assert_allclose(_np(grads), expected, rtol=1e-6)


def test_jax_grad_of_a_function_returning_a_tensor_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"return loss\.array, or use xgrad\.func\.grad"):
        jax.grad(lambda t: (t * t).sum())(_tensor(X))
